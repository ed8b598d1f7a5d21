"""One worker of tests/integration/test_steps_per_execution.py.

Started by `ndq_tf.launch`.

For every scenario of `--scenarios` in turn (`SCENARIOS`: the exchange,
and whether worker 1 sends nested codes), builds its own
`ndq_tf.MultiWorkerMirroredStrategy` (in the same order on every worker;
later ones reuse the running collective server) and trains the same tiny
MLP twice with `model.fit`: once with `steps_per_execution=4`, once with 1,
from the same initial weights, data and compression step (reset to 0 in
between, so both runs draw the same dithers). Prints one line
`SPE {"worker": i, "results": {scenario: {...}}}` with, per scenario, the
weights of both runs as hex of their float32 bits, the compression steps
and the transport used.
"""

import argparse
import json
import os
import sys

import numpy as np

MIN_ELEMENTS = 1000
INPUTS, HIDDEN, CLASSES = 64, 32, 10
GLOBAL_BATCH = 32
#: {scenario: (the strategy's exchange, NestedDitheredCodec on worker 1)}.
SCENARIOS = {
    "all_gather": ("all_gather", False),
    "all_reduce": ("all_reduce", False),
    "nested": ("all_gather", True),
}


def _parse():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--steps", type=int, default=8, help="Steps of each run.")
  p.add_argument("--scenarios", default=",".join(SCENARIOS),
                 help="Comma-separated names of SCENARIOS, run in order.")
  return p.parse_args()


def _scenario(exchange, nested, steps):
  """Both fits of one scenario, under a strategy of its own."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top

  if nested:
    strategy = ndq_tf.MultiWorkerMirroredStrategy(
        codec=ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3),
        reference_codec=ndq_tf.DitheredCodec(num_levels=1),
        reference_group=1, min_elements=MIN_ELEMENTS, seed=7,
        exchange=exchange, cluster_timeout=60)
  else:
    strategy = ndq_tf.MultiWorkerMirroredStrategy(
        codec=ndq_tf.DitheredCodec(num_levels=3), min_elements=MIN_ELEMENTS,
        seed=7, exchange=exchange, cluster_timeout=60)
  rng = np.random.RandomState(1234)
  x = rng.randn(512, INPUTS).astype("float32")
  y = np.argmax(x @ rng.randn(INPUTS, CLASSES), axis=1).astype("int32")

  def dataset():
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        GLOBAL_BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA)
    return ds.with_options(options)

  results = {}
  for spe in (4, 1):
    strategy.compression_step.assign(0)
    keras.utils.set_random_seed(42)
    with strategy.scope():
      model = keras.Sequential([
          keras.Input((INPUTS,)),
          keras.layers.Dense(HIDDEN, activation="relu"),
          keras.layers.Dense(CLASSES),
      ])
      model.compile(
          keras.optimizers.SGD(learning_rate=0.1),
          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
          steps_per_execution=spe)
    model.fit(dataset(), epochs=1, steps_per_epoch=steps, verbose=2)
    results[f"spe{spe}"] = {
        "weights": [np.asarray(w.numpy(), "<f4").tobytes().hex()
                    for w in model.weights],
        "step": int(strategy.compression_step.numpy()),
        "iterations": int(model.optimizer.iterations.numpy()),
        "transport": strategy.compression_stats()["transport"],
    }
  return strategy.cluster_resolver.task_id, results


def main():
  args = _parse()
  results = {}
  for name in args.scenarios.split(","):
    worker, results[name] = _scenario(*SCENARIOS[name], args.steps)
  print("SPE " + json.dumps({"worker": worker, "results": results}),
        flush=True)
  return 0


if __name__ == "__main__":
  exit_code = main()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(exit_code)  # As mw_worker.py: a normal exit can hang in TF.
