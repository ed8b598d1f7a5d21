"""Accuracy of every gradient route against TF's own MirroredStrategy (#19).

Scikit-learn's digits (benchmarks/common.py's split), the 64-256-10 MLP,
4 logical CPU replicas, `--epochs` epochs at batch 128, per route and
seed: TF's `tf.distribute.MirroredStrategy` (lossless, the reference) and
`ndq_tf.MirroredStrategy(codec=--codec)` on the same data, seed and
route. Routes:

* `keras3`: Keras 3 `model.fit`, Adam(4e-3);
* `tf_keras`: `import tf_keras`, `model.fit`, Adam(4e-3);
* `legacy`: `tf.keras` with `TF_USE_LEGACY_KERAS=1` (this script re-runs
  itself in a fresh process for it), Adam(4e-3);
* `low_level`: TF's documented loop, `tape.gradient`, then in
  `merge_call` `strategy.extended.batch_reduce_to(SUM, grads_and_vars)`
  and `strategy.extended.update` (plain SGD, `--low_level_lr`).

Prints one row per route and seed (test accuracies, their difference in
points, the telemetry's `compressed_elements` and wire bits per element)
and the mean difference per route.

Usage:
  python benchmarks/gradient_routes_digits.py [--seeds=1,2,3] [--epochs=8]
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags
import numpy as np

FLAGS = flags.FLAGS
flags.DEFINE_string("routes", "keras3,tf_keras,legacy,low_level",
                    "Comma-separated routes.")
flags.DEFINE_string("seeds", "1,2,3", "Comma-separated seeds.")
flags.DEFINE_integer("epochs", 8, "Training epochs.")
flags.DEFINE_string("codec", "dqsg:num_levels=1", "ndq_tf codec spec.")
flags.DEFINE_string("transport", "auto", "ndq_tf transport.")
flags.DEFINE_integer("reduce_scatter_levels", None,
                     "Stage-2 levels of transport=reduce_scatter (default: "
                     "the codec's).")
flags.DEFINE_bool("reduce_scatter_error_feedback", False,
                  "Stage 2 of transport=reduce_scatter feeds its residual "
                  "back.")
flags.DEFINE_float("low_level_lr", 0.5, "SGD learning rate of low_level.")
flags.DEFINE_bool("json", False, "Print the rows as JSON lines (used by the "
                  "script itself for the legacy route).")

REPLICAS = 4
BATCH = 128


def _common():
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "common.py")
  spec = importlib.util.spec_from_file_location("ndq_benchmarks_common", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _levels():
  """The reduce-scatter's keywords whose flags are set."""
  out = {}
  if FLAGS.reduce_scatter_levels is not None:
    out["reduce_scatter_levels"] = FLAGS.reduce_scatter_levels
  if FLAGS.reduce_scatter_error_feedback:
    out["reduce_scatter_error_feedback"] = True
  return out


def _strategies():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:REPLICAS]
  return {
      "tf": lambda: tf.distribute.MirroredStrategy(
          devices, cross_device_ops=tf.distribute.ReductionToOneDevice()),
      "ndq": lambda: ndq_tf.MirroredStrategy(
          codec=FLAGS.codec, devices=devices, exchange=FLAGS.transport,
          **_levels()),
  }


def _keras(route):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if route == "keras3":
    import keras  # pylint: disable=g-import-not-at-top
    return keras
  if route == "legacy":
    return tf.keras
  import tf_keras  # pylint: disable=g-import-not-at-top
  return tf_keras


def _fit(strategy, route, data, seed):
  K = _keras(route)
  x_train, x_test, y_train, y_test = data
  K.utils.set_random_seed(seed)
  with strategy.scope():
    model = K.Sequential([K.Input((64,)),
                          K.layers.Dense(256, activation="relu"),
                          K.layers.Dense(10)])
    model.compile(K.optimizers.Adam(4e-3),
                  K.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  model.fit(x_train, y_train, batch_size=BATCH, epochs=FLAGS.epochs,
            shuffle=True, verbose=0)
  return float(model.evaluate(x_test, y_test, verbose=0,
                              return_dict=True)["accuracy"])


def _low_level(strategy, data, seed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x_train, x_test, y_train, y_test = data
  tf.random.set_seed(seed)  # The shuffle's order, whatever ran before.

  def glorot(shape, k):
    limit = np.sqrt(6.0 / sum(shape))
    return tf.random.stateless_uniform(shape, [seed, k], -limit, limit)

  with strategy.scope():
    variables = [
        tf.Variable(glorot([64, 256], 0)), tf.Variable(tf.zeros([256])),
        tf.Variable(glorot([256, 10], 1)), tf.Variable(tf.zeros([10]))]
  lr = FLAGS.low_level_lr

  def logits(x):
    w1, b1, w2, b2 = variables
    return tf.nn.relu(x @ w1 + b1) @ w2 + b2

  def merge_fn(s, grads_and_vars):
    reduced = s.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM,
                                         grads_and_vars)
    for g, (_, v) in zip(reduced, grads_and_vars):
      s.extended.update(v, lambda v, g: v.assign_sub(lr * g), args=(g,))

  @tf.function
  def step(x, y):
    def fn(x, y):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
            y, logits(x))) / BATCH
      grads = tape.gradient(loss, variables)
      tf.distribute.get_replica_context().merge_call(
          merge_fn, args=(list(zip(grads, variables)),))
    strategy.run(fn, args=(x, y))

  dataset = tf.data.Dataset.from_tensor_slices(
      (x_train, y_train.astype("int32"))).shuffle(
          len(x_train), seed=seed).batch(BATCH)
  for _ in range(FLAGS.epochs):
    for x, y in strategy.experimental_distribute_dataset(dataset):
      step(x, y)
  predicted = np.argmax(logits(tf.constant(x_test)).numpy(), axis=1)
  return float(np.mean(predicted == y_test))


def _rows(route, data, seeds):
  strategies = _strategies()
  for seed in seeds:
    row = {"route": route, "seed": seed}
    for name, make in strategies.items():
      strategy = make()
      if route == "low_level":
        row[name] = _low_level(strategy, data, seed)
      else:
        row[name] = _fit(strategy, route, data, seed)
      if name == "ndq":
        stats = strategy.compression_stats()
        row["compressed_elements"] = stats["compressed_elements"]
        row["bits"] = stats["sent_bits_per_element"]
        row["transport"] = stats["transport"]
        row["unrecognised"] = stats["unrecognised_gradient_steps"]
    yield row


def _legacy_rows(seeds):
  """The legacy route in a fresh process (TF reads the variable at import)."""
  env = dict(os.environ, TF_USE_LEGACY_KERAS="1")
  cmd = [sys.executable, os.path.abspath(__file__), "--routes=legacy",
         f"--seeds={','.join(map(str, seeds))}", f"--epochs={FLAGS.epochs}",
         f"--codec={FLAGS.codec}", f"--transport={FLAGS.transport}",
         "--json"] + [f"--{k}={v}" for k, v in _levels().items()]
  out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                       check=True)
  return [json.loads(line.split(" ", 1)[1])
          for line in out.stdout.splitlines() if line.startswith("ROW ")]


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
  seeds = [int(s) for s in FLAGS.seeds.split(",")]
  data = _common().load_digits()
  legacy_here = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
  if not FLAGS.json:
    print(f"codec {FLAGS.codec}, transport {FLAGS.transport}, {REPLICAS} "
          f"replicas, {FLAGS.epochs} epochs; accuracy on 450 test images")
    print(f"{'route':10} {'seed':>4} {'tf':>7} {'ndq_tf':>7} {'diff pt':>8} "
          f"{'compressed':>10} {'bits/el':>8}")
  by_route = {}
  for route in FLAGS.routes.split(","):
    if route == "legacy" and not legacy_here:
      rows = _legacy_rows(seeds)
    else:
      rows = _rows(route, data, seeds)
    for row in rows:
      if FLAGS.json:
        print("ROW " + json.dumps(row), flush=True)
        continue
      diff = 100 * (row["ndq"] - row["tf"])
      by_route.setdefault(route, []).append(diff)
      print(f"{route:10} {row['seed']:4d} {row['tf']:7.4f} {row['ndq']:7.4f} "
            f"{diff:+8.2f} {row['compressed_elements']:10d} "
            f"{row['bits']:8.3f}", flush=True)
  for route, diffs in by_route.items():
    print(f"{route}: mean difference {np.mean(diffs):+.2f} points over "
          f"{len(diffs)} seeds")


if __name__ == "__main__":
  app.run(main)
