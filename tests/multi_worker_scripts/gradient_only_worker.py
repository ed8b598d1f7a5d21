"""One worker of tests/integration/test_gradient_only_multi_worker.py.

Started by `ndq_tf.launch`.

Issue #13 on real worker processes: only gradient aggregation is compressed;
synchronized BatchNormalization statistics, metrics, `strategy.reduce` and
user all-reduces stay exact unless built inside
`ndq_tf.distribute.compressed()`.

`--strategies` lists the strategies this process builds, in turn (in the
same order on every worker); every check of a strategy runs under it, in
order, before the next strategy is built. TensorFlow's own strategy comes
first: it starts the collective server, which ndq_tf's strategies then
reuse (a stock one built later would restart it under its peer's
collectives). Every `MultiWorkerMirroredStrategy` of a process numbers its
collectives from the same keys (TF's `CollectiveKeys` start at group 1,
instance 100, unless the class attribute `_collective_key_base` is
changed): a second strategy's first collective would reuse the first's key,
which TF's runtime refuses when the two differ in kind or dtype
("Collective instance 100 expected type 1 ... but got type 0"). ndq_tf's
strategies each take keys of their own; TF's own takes
`STOCK_COLLECTIVE_KEY_BASE` (`StockStrategy`, nothing else changed).

* `ndq1`: `ndq_tf.MultiWorkerMirroredStrategy` with
  `DitheredCodec(num_levels=1)`: `batch_norm` (one `model.fit` step: the
  strategy's first compressed exchange), `metrics`, `strategy_reduce`,
  `scopes`, `custom_loop`, `loss_scale` (two new models in the same
  strategy's scope, not a second strategy).
* `ndq3`: the same with `DitheredCodec(num_levels=3)`: `batch_norm`.
* `tf`: TensorFlow's own `tf.distribute.MultiWorkerMirroredStrategy`, the
  control: `batch_norm`, `metrics`, `strategy_reduce`. Keras 3.15's
  `model.fit` and `model.evaluate` fail under it with two workers
  (keras-team/keras#20585: Keras' symbolic build calls `strategy.reduce` on
  the nested batch, which the stock strategy cannot convert), so its
  BatchNormalization step is a custom loop doing what `fit`'s train step
  does (forward with `training=True`, the loss scaled for distribution,
  `optimizer.apply_gradients`), and its metrics are a custom evaluation
  loop.

Each worker prints one line
`GRADIENT_ONLY {"worker": i, "results": {strategy: {check: ...}}}`.
Every check builds its model from `keras.utils.set_random_seed`, so every
strategy starts a check from the same initial weights. Each worker feeds its
own half of every global batch (`distribute_datasets_from_function`, by
`input_pipeline_id`): worker 0 the first half, worker 1 the second.
"""

import argparse
import contextlib
import hashlib
import json
import os
import sys
import traceback

import numpy as np

NUM_WORKERS = 2
GLOBAL_BATCH = 128
OFFSET = 5.0  # Added to the digits: per-channel means large against spread.
EVAL_BATCH = 64  # Global batch of the evaluations.
REDUCE_SIZE = 4096
LOSS_SCALE_STEPS = 3  # model.fit steps of each optimizer in `loss_scale`.
SMALL_SIZE = 10
# tf.random.stateless_normal seeds of the user all-reduces' values.
BIG_SEED, SMALL_SEED, REDUCE_SEED = (1, 2), (1, 3), 3
#: The strategies, in the order every worker builds them (`tf` first).
STRATEGIES = ("tf", "ndq1", "ndq3")
#: Collective group keys of TensorFlow's own strategy start past this, far
#: from ndq_tf's strategies' (1000 per strategy, from 0).
STOCK_COLLECTIVE_KEY_BASE = 1000000


def digits(offset=0.0):
  """Scikit-learn's digits, x / 16 + offset, split 75/25 as test_gradient_only."""
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  x = (data.data / 16.0 + offset).astype("float32")
  return model_selection.train_test_split(
      x, data.target, test_size=0.25, random_state=0, stratify=data.target)


def _halves(strategy, x, y, batch):
  """A distributed dataset: of each global batch of `batch` rows, worker w
  feeds the rows [w·batch/2, (w+1)·batch/2)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Whole global batches only: a worker with one batch fewer than the other
  # would leave the other waiting in a collective.
  assert len(x) % batch == 0, (len(x), batch)
  local = batch // NUM_WORKERS

  def dataset_fn(ctx):
    assert ctx.num_input_pipelines == NUM_WORKERS, ctx
    w = ctx.input_pipeline_id
    rows = np.concatenate([np.arange(start + w * local, start + (w + 1) * local)
                           for start in range(0, len(x), batch)])
    return tf.data.Dataset.from_tensor_slices((x[rows], y[rows])).batch(local)

  return strategy.distribute_datasets_from_function(dataset_fn)


def _sync_bn_model(strategy, seed=0):
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(seed)
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(256),
        keras.layers.BatchNormalization(synchronized=True, momentum=0.5),
        keras.layers.ReLU(),
        keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(4e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  return model


def _local(strategy, value):
  """This worker's value of a (distributed) variable or tensor."""
  value = getattr(value, "value", value)  # A Keras variable's TF variable.
  return np.asarray(strategy.experimental_local_results(value)[0])


def _step(strategy):
  if hasattr(strategy, "compression_step"):
    return int(strategy.compression_step.numpy())
  return None


def _stats(strategy):
  if hasattr(strategy, "compression_stats"):
    return strategy.compression_stats()
  return None


def _fit_one_step_in_a_custom_loop(strategy, model, dataset):
  """What `model.fit`'s train step does, for the stock strategy."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  @tf.function
  def train_step(x, y):
    def fn(x, y):
      with tf.GradientTape() as tape:
        # Already divided by the number of replicas (Keras'
        # scale_loss_for_distribution), as in `fit`.
        loss = loss_fn(y, model(x, training=True))
      grads = tape.gradient(loss, model.trainable_variables)
      model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss * strategy.num_replicas_in_sync
    return strategy.run(fn, args=(x, y))

  # The mean over replicas of their local mean losses, as `fit` logs it.
  return [float(strategy.reduce("MEAN", train_step(x, y), axis=None))
          for x, y in dataset]


def check_batch_norm(strategy, fit):
  """One training step on a global batch of 128; the BN moving statistics.

  Also the exact statistics of that batch's Dense(256) outputs, in float64
  from the initial weights.
  """
  x, _, y, _ = digits(offset=OFFSET)
  x, y = x[:GLOBAL_BATCH], y[:GLOBAL_BATCH]
  model = _sync_bn_model(strategy)
  kernel, bias = (_local(strategy, v) for v in model.layers[0].weights)
  h = x.astype(np.float64) @ kernel.astype(np.float64) + bias
  out = {"exact_mean": h.mean(axis=0).tolist(),
         "exact_variance": h.var(axis=0).tolist(),
         "step_before": _step(strategy)}
  dataset = _halves(strategy, x, y, GLOBAL_BATCH)
  if fit:
    out["loss"] = model.fit(dataset, epochs=1, verbose=0).history["loss"]
  else:
    out["loss"] = _fit_one_step_in_a_custom_loop(strategy, model, dataset)
  bn = model.layers[1]
  out["moving_mean"] = _local(strategy, bn.moving_mean).tolist()
  out["moving_variance"] = _local(strategy, bn.moving_variance).tolist()
  out["step"] = _step(strategy)
  out["stats"] = _stats(strategy)
  return out


def check_metrics(strategy, evaluate):
  """Keras metrics on the digits test split, from the seed's weights.

  A custom evaluation loop (a Keras `Mean` of each replica's mean loss
  weighted by its batch size, as `model.evaluate`'s loss tracker, and
  `SparseCategoricalAccuracy`; results read in cross-replica context), and,
  when `evaluate`, `model.evaluate` of the same data.
  """
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  _, x, _, y = digits()
  n = len(x) // EVAL_BATCH * EVAL_BATCH  # 448 of the 450.
  x, y = x[:n], y[:n]
  model = _sync_bn_model(strategy)
  before = _step(strategy)
  with strategy.scope():
    loss_metric = keras.metrics.Mean(name="loss")
    accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  @tf.function
  def eval_step(features, labels):
    def fn(features, labels):
      logits = model(features, training=False)
      # Keras divides a mean loss by the number of replicas (for gradients);
      # its test_step multiplies it back before the loss tracker.
      loss = loss_fn(labels, logits) * strategy.num_replicas_in_sync
      loss_metric.update_state(loss, sample_weight=tf.shape(features)[0])
      accuracy.update_state(labels, logits)
    strategy.run(fn, args=(features, labels))

  for features, labels in _halves(strategy, x, y, EVAL_BATCH):
    eval_step(features, labels)
  out = {"loop": {"loss": float(loss_metric.result()),
                  "accuracy": float(accuracy.result())}}
  if evaluate:
    logs = model.evaluate(_halves(strategy, x, y, EVAL_BATCH), verbose=0,
                          return_dict=True)
    out["evaluate"] = {k: float(v) for k, v in logs.items()}
  out["steps"] = None if before is None else _step(strategy) - before
  return out


def replica_value(replica, size=REDUCE_SIZE, seed=REDUCE_SEED):
  """The per-replica value of the `strategy.reduce` check."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.random.stateless_normal([size], [replica, seed])


def check_strategy_reduce(strategy):
  """`strategy.reduce` SUM and MEAN of per-replica 4096-float tensors."""
  per_replica = strategy.experimental_distribute_values_from_function(
      lambda ctx: replica_value(ctx.replica_id_in_sync_group))
  before = _step(strategy)
  out = {}
  for op in ("SUM", "MEAN"):
    out[op] = strategy.reduce(op, per_replica, axis=None).numpy().tolist()
  out["steps"] = None if before is None else _step(strategy) - before
  return out


def _scoped_all_reduce(strategy, scope_fn):
  """In `strategy.run`: one all_reduce("sum", [x·(r+1), small·(r+1)]) in scope."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x = tf.random.stateless_normal([REDUCE_SIZE], BIG_SEED)
  small = tf.random.stateless_normal([SMALL_SIZE], SMALL_SEED)

  @tf.function
  def step():
    def fn():
      ctx = tf.distribute.get_replica_context()
      scale = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
      with scope_fn():
        return ctx.all_reduce("sum", [x * scale, small * scale])
    return strategy.run(fn)

  before = _step(strategy)
  big, little = step()
  return {"big": _local(strategy, big).tolist(),
          "small": _local(strategy, little).tolist(),
          "steps": _step(strategy) - before,
          "stats": _stats(strategy)}


def check_scopes(strategy):
  """A user all-reduce: by default, in compressed(), in uncompressed()."""
  import ndq_tf  # pylint: disable=g-import-not-at-top

  def both():
    stack = contextlib.ExitStack()
    stack.enter_context(ndq_tf.distribute.compressed())
    stack.enter_context(ndq_tf.distribute.uncompressed())
    return stack

  return {
      "default": _scoped_all_reduce(strategy, contextlib.nullcontext),
      "compressed": _scoped_all_reduce(strategy, ndq_tf.distribute.compressed),
      "uncompressed_in_compressed": _scoped_all_reduce(strategy, both),
  }


def check_custom_loop(strategy):
  """`optimizer.apply_gradients` in a custom loop, and a user all-reduce."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(1)
  with strategy.scope():
    model = keras.Sequential([keras.Input((64,)),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(0.1)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                       reduction="sum")
  x, _, y, _ = digits()
  x, y = x[:GLOBAL_BATCH], y[:GLOBAL_BATCH]

  @tf.function
  def train_step(features, labels):
    def fn(features, labels):
      with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(features, training=True)) / GLOBAL_BATCH
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      # The user's own all-reduce in the same step, of a compressible size.
      ctx = tf.distribute.get_replica_context()
      return loss, ctx.all_reduce("sum", tf.fill([REDUCE_SIZE], loss))
    return strategy.run(fn, args=(features, labels))

  before = _step(strategy)
  for features, labels in _halves(strategy, x, y, GLOBAL_BATCH):
    loss, total = train_step(features, labels)
  return {"steps": _step(strategy) - before,
          "local_loss": float(_local(strategy, loss)),
          "total": _local(strategy, total).tolist(),
          "stats": _stats(strategy),
          "compressible": sum(v.shape.num_elements()
                              for v in model.trainable_variables
                              if v.shape.num_elements() >= 256)}


def _weights_hash(strategy, model):
  """SHA-256 of this worker's values of the model's weights, in order."""
  digest = hashlib.sha256()
  for v in model.weights:
    digest.update(np.ascontiguousarray(_local(strategy, v)).tobytes())
  return digest.hexdigest()


def check_loss_scale(strategy):
  """`model.fit` of an MLP with Keras' and ndq_tf's `LossScaleOptimizer`.

  For each (in that order) a new Dense(256) -> Dense(10) model from the same
  seed, in the scope of `strategy`, `LOSS_SCALE_STEPS` steps of a global
  batch of 128 (float32: the loss scale only scales and unscales).
  """
  import keras  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  x, _, y, _ = digits()
  n = LOSS_SCALE_STEPS * GLOBAL_BATCH
  x, y = x[:n], y[:n]
  out = {}
  for name, make in (("keras", keras.optimizers.LossScaleOptimizer),
                     ("ndq_tf", ndq_tf.keras.LossScaleOptimizer)):
    keras.utils.set_random_seed(2)
    with strategy.scope():
      model = keras.Sequential([keras.Input((64,)),
                                keras.layers.Dense(256, activation="relu"),
                                keras.layers.Dense(10)])
      model.compile(make(keras.optimizers.SGD(0.1)),
                    keras.losses.SparseCategoricalCrossentropy(
                        from_logits=True))
    initial = _weights_hash(strategy, model)
    before = _step(strategy)
    history = model.fit(_halves(strategy, x, y, GLOBAL_BATCH), epochs=1,
                        verbose=0).history
    optimizer = model.optimizer
    kind = type(optimizer)
    out[name] = {
        "optimizer": f"{kind.__module__}.{kind.__name__}",
        "steps": _step(strategy) - before,
        "step": _step(strategy),
        # Steps applied (not skipped for a non-finite gradient).
        "iterations": int(_local(strategy, optimizer.iterations)),
        "loss_scale": float(_local(strategy, optimizer.dynamic_scale)),
        "loss": history["loss"],
        "stats": _stats(strategy),
        "compressible": sum(v.shape.num_elements()
                            for v in model.trainable_variables
                            if v.shape.num_elements() >= 256),
        "initial_hash": initial,
        "hash": _weights_hash(strategy, model),
    }
  return out


def _checks(name):
  """The checks of strategy `name`, in order: {check: fn(strategy)}."""
  if name == "tf":
    return {"batch_norm": lambda s: check_batch_norm(s, fit=False),
            "metrics": lambda s: check_metrics(s, evaluate=False),
            "strategy_reduce": check_strategy_reduce}
  checks = {"batch_norm": lambda s: check_batch_norm(s, fit=True)}
  if name == "ndq1":
    checks.update(metrics=lambda s: check_metrics(s, evaluate=True),
                  strategy_reduce=check_strategy_reduce,
                  scopes=check_scopes, custom_loop=check_custom_loop,
                  loss_scale=check_loss_scale)
  return checks


def _make_strategy(name):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  if name == "tf":

    class StockStrategy(tf.distribute.MultiWorkerMirroredStrategy):
      """TensorFlow's own strategy, its collective keys apart from ndq_tf's."""
      _collective_key_base = STOCK_COLLECTIVE_KEY_BASE

    return StockStrategy()
  return ndq_tf.MultiWorkerMirroredStrategy(
      codec=ndq_tf.DitheredCodec(num_levels=int(name[-1])),
      cluster_timeout=60)


def main():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--strategies", default=",".join(STRATEGIES),
                 help="Comma-separated names of STRATEGIES, built in order.")
  args = p.parse_args()
  import keras  # pylint: disable=g-import-not-at-top
  keras.config.disable_traceback_filtering()  # Whole tracebacks in reports.

  out = {}
  failed = False
  for strategy_name in args.strategies.split(","):
    if failed:
      break
    strategy = _make_strategy(strategy_name)
    worker = strategy.cluster_resolver.task_id
    out[strategy_name] = results = {}
    for name, check in _checks(strategy_name).items():
      try:
        results[name] = check(strategy)
      except Exception as e:  # pylint: disable=broad-except
        # Reported, not raised: the test names the failing check. A
        # collective left half-done would stall the other worker, so stop
        # here.
        results[name] = {"error": f"{type(e).__name__}: {e}"[:2000],
                         "traceback": traceback.format_exc()[-8000:]}
        print(results[name]["traceback"], file=sys.stderr, flush=True)
        failed = True
        break
  print("GRADIENT_ONLY " + json.dumps({"worker": worker, "results": out}),
        flush=True)
  sys.stderr.flush()
  # TF's collective runtime takes seconds to shut down; every exchange is
  # done and every result printed.
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
