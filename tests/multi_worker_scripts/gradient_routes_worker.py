"""Every route by which TensorFlow users aggregate gradients (issue #19).

Imported by tests/integration/test_gradient_routes.py (MirroredStrategy, in
the test process) and run as a script, in a fresh process, by
tests/integration/test_gradient_routes.py (MirroredStrategy with
`TF_USE_LEGACY_KERAS=1`) and
tests/integration/test_gradient_routes_multi_worker.py
(`ndq_tf.MultiWorkerMirroredStrategy`, two workers started by
`ndq_tf.launch`).

Routes, each on the same 64-256-10 MLP from the same seed, `STEPS` steps:

* `keras3`: Keras 3 `model.fit` (the reference of the bits per element);
* `tf_keras`: `import tf_keras`, `model.fit`;
* `legacy`: `tf.keras` with `TF_USE_LEGACY_KERAS=1` (set before TensorFlow
  is imported: only in a fresh process), `model.fit`;
* `low_level`: TF's documented loop: `tape.gradient`, then in `merge_call`
  `strategy.extended.batch_reduce_to(SUM, grads_and_vars)` and
  `strategy.extended.update`;
* `reduce_to`: the same loop with one `strategy.extended.reduce_to(SUM,
  grad, destinations=var)` per gradient;
* `all_reduce`: `ReplicaContext.all_reduce` of the gradients, then an
  update: not recognised (it travels losslessly, warned and counted);
* `all_reduce_compressed`, `all_reduce_uncompressed`: the same inside
  `ndq_tf.distribute.compressed()` / `uncompressed()`: the user's choice;
* `tf_keras_skip`: a tf_keras optimizer's `apply_gradients(...,
  skip_gradients_aggregation=True)` after a `ReplicaContext.all_reduce`:
  not recognised; the warning names the optimizer.

`run_route(strategy, route)` returns a dict of JSON numbers: the telemetry
after the route, the route's own compressed exchanges and counted steps,
whether every replica holds bitwise the same variables, and a SHA-256 of
the first replica's variables (compared across workers by the test).

As a script: `--strategy mirrored|multi_worker --transport T1,T2 --routes
a,b` runs the routes under a strategy of each transport in turn (built in
the same order on every worker; later multi-worker strategies reuse the
running collective server) and prints one line
`GRADIENT_ROUTES {"worker": i, "results": {transport: {route: ...}}}`.
"""

import argparse
import hashlib
import json
import logging
import os
import sys
import traceback

import numpy as np

INPUTS, HIDDEN, CLASSES = 64, 256, 10
GLOBAL_BATCH = 64
STEPS = 3
LEARNING_RATE = 1e-2
MARKER = "GRADIENT_ROUTES"
ROUTES = ("keras3", "tf_keras", "legacy", "low_level", "reduce_to",
          "all_reduce",
          "all_reduce_compressed", "all_reduce_uncompressed", "tf_keras_skip")
#: Routes nothing recognises: warned about and counted.
UNRECOGNISED = ("all_reduce", "tf_keras_skip")


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(GLOBAL_BATCH * STEPS, INPUTS)).astype(np.float32)
  y = (np.abs(x[:, :CLASSES]).argmax(axis=1)).astype(np.int64)
  return x, y


def _dataset():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x, y = _data()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.DATA)
  return dataset.with_options(options)


def _keras_module(route):
  """The Keras of a route: Keras 3, or tf_keras by one of its two imports."""
  if route == "keras3":
    import keras  # pylint: disable=g-import-not-at-top
    return keras
  if route == "legacy":
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if os.environ.get("TF_USE_LEGACY_KERAS") != "1":
      raise RuntimeError("The legacy route needs TF_USE_LEGACY_KERAS=1 set "
                         "before TensorFlow is imported.")
    return tf.keras
  import tf_keras  # pylint: disable=g-import-not-at-top
  return tf_keras


def _mlp(strategy, K):
  K.utils.set_random_seed(1)
  with strategy.scope():
    model = K.Sequential([
        K.Input((INPUTS,)),
        K.layers.Dense(HIDDEN, activation="relu"),
        K.layers.Dense(CLASSES),
    ])
    model.compile(K.optimizers.Adam(LEARNING_RATE),
                  K.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def _fit(strategy, route):
  import ndq_tf  # pylint: disable=g-import-not-at-top
  K = _keras_module(route)
  model = _mlp(strategy, K)
  history = model.fit(_dataset(), epochs=1, steps_per_epoch=STEPS, verbose=0,
                      shuffle=False, callbacks=[ndq_tf.CompressionStats()])
  logged = {k: float(v[-1]) for k, v in history.history.items()}
  return model.trainable_variables, logged


def _plain_variables(strategy):
  """The MLP's weights as `tf.Variable`s of the strategy, from seed 1."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    return [
        tf.Variable(tf.random.stateless_normal([INPUTS, HIDDEN], [1, 1]) * 0.1,
                    name="w1"),
        tf.Variable(tf.zeros([HIDDEN]), name="b1"),
        tf.Variable(tf.random.stateless_normal([HIDDEN, CLASSES], [1, 2]) *
                    0.1, name="w2"),
        tf.Variable(tf.zeros([CLASSES]), name="b2"),
    ]


def _loss(variables, x, y):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  w1, b1, w2, b2 = variables
  logits = tf.nn.relu(x @ w1 + b1) @ w2 + b2
  return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
      y, logits)) / GLOBAL_BATCH


def _custom_loop(strategy, route):
  """A custom training loop of `route` (every route but the fits)."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  variables = _plain_variables(strategy)
  optimizer = None
  if route == "tf_keras_skip":
    import tf_keras  # pylint: disable=g-import-not-at-top
    with strategy.scope():
      optimizer = tf_keras.optimizers.SGD(LEARNING_RATE)
  scope = {"all_reduce_compressed": ndq_tf.distribute.compressed,
           "all_reduce_uncompressed": ndq_tf.distribute.uncompressed}.get(
               route, contextlib.nullcontext)

  def sgd(var, grad):
    return var.assign_sub(LEARNING_RATE * grad)

  def merge_update(s, grads_and_vars):
    if route == "low_level":
      grads = s.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM,
                                         grads_and_vars)
    elif route == "reduce_to":
      grads = [s.extended.reduce_to(tf.distribute.ReduceOp.SUM, g,
                                    destinations=v)
               for g, v in grads_and_vars]
    else:
      grads = [g for g, _ in grads_and_vars]
    for g, (_, v) in zip(grads, grads_and_vars):
      s.extended.update(v, sgd, args=(g,))

  @tf.function
  def step(x, y):
    def fn(x, y):
      with tf.GradientTape() as tape:
        loss = _loss(variables, x, y)
      grads = tape.gradient(loss, variables)
      ctx = tf.distribute.get_replica_context()
      if route not in ("low_level", "reduce_to"):
        with scope():
          grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
      if optimizer is not None:
        optimizer.apply_gradients(zip(grads, variables),
                                  skip_gradients_aggregation=True)
      else:
        ctx.merge_call(merge_update, args=(list(zip(grads, variables)),))
      # The loss, all-reduced in the same step, stays exact.
      return ctx.all_reduce(tf.distribute.ReduceOp.SUM, loss)
    return strategy.run(fn, args=(x, y))

  for x, y in _batches(strategy):
    step(x, y)
  return variables, {}


def _batches(strategy):
  """The custom loops' `STEPS` global batches, split among the replicas.

  Not a distributed `tf.data` iterator: destroying one waits for its
  autotuning threads' next wake-up, up to minutes (TF 2.18 and 2.21, stock
  `tf.distribute.MirroredStrategy` too), and the routes are about the
  gradients, not the input pipeline.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x, y = _data()
  size = GLOBAL_BATCH // strategy.num_replicas_in_sync
  for step in range(STEPS):
    def value_fn(ctx, step=step):
      start = step * GLOBAL_BATCH + ctx.replica_id_in_sync_group * size
      return (tf.constant(x[start:start + size]),
              tf.constant(y[start:start + size]))
    yield strategy.experimental_distribute_values_from_function(value_fn)


def _counters(strategy):
  stats = strategy.compression_stats()
  return (int(strategy.compression_step.numpy()),
          stats["unrecognised_gradient_steps"],
          stats["uncompressed_gradient_reductions"])


def _bytes(tensor):
  return np.ascontiguousarray(np.asarray(tensor)).tobytes()


class _Warnings(logging.Handler):
  """The ndq_tf warnings absl logs while a route runs."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.messages = []

  def emit(self, record):
    message = record.getMessage()
    if message.startswith("ndq_tf:"):
      self.messages.append(message)


def run_route(strategy, route):
  """Trains `STEPS` steps by `route`; returns what the tests check."""
  before = _counters(strategy)
  handler = _Warnings()
  logger = logging.getLogger("absl")
  logger.addHandler(handler)
  try:
    if route in ("keras3", "tf_keras", "legacy"):
      variables, logged = _fit(strategy, route)
    else:
      variables, logged = _custom_loop(strategy, route)
  finally:
    logger.removeHandler(handler)
  after = _counters(strategy)
  identical = True
  digest = hashlib.sha256()
  for v in variables:
    v = v.value if hasattr(v, "value") and not callable(v.value) else v
    parts = [_bytes(p) for p in strategy.experimental_local_results(v)]
    identical &= all(p == parts[0] for p in parts)
    digest.update(parts[0])
  return {
      "stats": strategy.compression_stats(),
      "logged": logged,
      "exchanges": after[0] - before[0],
      "unrecognised_steps": after[1] - before[1],
      "uncompressed_reductions": after[2] - before[2],
      "replicas_identical": bool(identical),
      "sha256": digest.hexdigest(),
      "warnings": handler.messages,
  }


def _parse():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--strategy", choices=("mirrored", "multi_worker"),
                 required=True, help="The ndq_tf strategy of this process.")
  p.add_argument("--transport", default="all_gather",
                 help="Comma-separated transports (all_gather, all_reduce "
                      "or auto), each under its own strategy, in order.")
  p.add_argument("--routes", default=",".join(ROUTES),
                 help="Comma-separated routes to run, in order.")
  p.add_argument("--replicas", type=int, default=4,
                 help="MirroredStrategy: logical CPUs to split the CPU into.")
  return p.parse_args()


def main():
  args = _parse()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  worker = 0
  if args.strategy == "mirrored":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
  else:
    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  import ndq_tf  # pylint: disable=g-import-not-at-top
  from ndq_tf.core import engine as engine_lib  # pylint: disable=g-import-not-at-top
  from ndq_tf.distribute import gradient_detection  # pylint: disable=g-import-not-at-top
  codec = ndq_tf.DitheredCodec(num_levels=1)
  results = {}
  failed = False
  for transport in args.transport.split(","):
    if failed:
      break  # A worker that stops mid-route would leave the other waiting.
    # Warnings given once per process: each transport starts as a fresh
    # process would, so that its routes warn (or not) as in a job of its own.
    gradient_detection._WARNED.clear()  # pylint: disable=protected-access
    engine_lib._WARNED.clear()  # pylint: disable=protected-access
    if args.strategy == "mirrored":
      strategy = ndq_tf.MirroredStrategy(codec=codec, exchange=transport)
    else:
      strategy = ndq_tf.MultiWorkerMirroredStrategy(
          codec=codec, exchange=transport, cluster_timeout=120,
          communication_options=(
              tf.distribute.experimental.CommunicationOptions(
                  timeout_seconds=120)))
    results[transport] = {}
    for route in args.routes.split(","):
      try:
        results[transport][route] = run_route(strategy, route)
      except Exception as e:  # pylint: disable=broad-except
        results[transport][route] = {"error": repr(e),
                                     "traceback": traceback.format_exc()}
        failed = True
        break
  print(f"{MARKER} " + json.dumps({"worker": worker, "results": results}),
        flush=True)
  sys.stdout.flush()
  sys.stderr.flush()
  # A normal exit can hang in TF's coordination agent once the chief's
  # process has gone (tests/multi_worker_scripts/all_reduce_worker.py).
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
