"""One worker of tests/integration/test_rotation_multi_worker.py.

Started by `ndq_tf.launch`.

Issue #17 on real worker processes. For every scenario of `--scenarios` in
turn (`SCENARIOS`), under an `ndq_tf.MultiWorkerMirroredStrategy` of its
own (built in the same order on every worker; later ones reuse the running
collective server): its number of compressed all-reduces of a fixed
per-worker gradient with a rotated DQSG codec and its transport (when
nested: worker 0 a DQSG reference sender, worker 1 rotated adaptive NDQSG,
on correlated gradients). Then one line
`ROTATION {"worker": i, "results": {scenario: {...}}}` with every step's
decoded sum (the test compares the workers bit for bit and checks the
estimate against the theory) and the telemetry.
"""

import argparse
import json
import os
import sys

import numpy as np

CODEC = "dqsg:num_levels=2,bucket_size=128,rotation=hadamard"
SEED = 5
SIZE = 16 * 128
NESTED_CODEC = ("ndqsg:num_levels=3,coarse_ratio=3,bucket_size=128,"
                "rotation=hadamard")
REFERENCE_CODEC = "dqsg:num_levels=3,bucket_size=128"
#: {scenario: (transport, nested group, all-reduces)}.
SCENARIOS = {
    "all_gather": ("all_gather", False, 6),
    "all_reduce": ("all_reduce", False, 6),
    "nested": ("all_gather", True, 4),
}


def gradient(worker):
  """Worker `worker`'s gradient: heavy-tailed, its own scale."""
  rng = np.random.default_rng(100 + worker)
  return (rng.standard_t(3, size=SIZE) * (1.0 + worker)).astype(np.float32)


def nested_gradient(worker):
  """Worker `worker`'s gradient with `--nested`: a common part plus noise."""
  common = np.random.default_rng(99).standard_t(3, size=SIZE)
  noise = np.random.default_rng(100 + worker).normal(size=SIZE)
  return (common + 0.2 * noise).astype(np.float32)


def _parse():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--scenarios", default=",".join(SCENARIOS),
                 help="Comma-separated names of SCENARIOS, run in order.")
  return p.parse_args()


def _run(transport, nested, steps):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top

  codecs = ({"codec": NESTED_CODEC, "reference_codec": REFERENCE_CODEC,
             "reference_group": 1, "adaptive": True}
            if nested else {"codec": CODEC})
  strategy = ndq_tf.MultiWorkerMirroredStrategy(
      exchange=transport, seed=SEED,
      communication_options=tf.distribute.experimental.CommunicationOptions(
          timeout_seconds=120), **codecs)
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  g = tf.constant((nested_gradient if nested else gradient)(worker))

  @tf.function
  def step():
    def fn():
      ctx = tf.distribute.get_replica_context()
      with ndq_tf.distribute.compressed():
        return ctx.all_reduce("sum", g)
    return strategy.run(fn)

  sums, stats = [], []
  for _ in range(steps):
    out = strategy.experimental_local_results(step())[0]
    sums.append(np.asarray(out).tolist())
    stats.append(strategy.compression_stats())
  return {"sums": sums, "stats": stats[-1], "all_stats": stats,
          "step": int(strategy.compression_step.numpy())}


def main():
  args = _parse()
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  results = {name: _run(*SCENARIOS[name])
             for name in args.scenarios.split(",")}
  print("ROTATION " + json.dumps({"worker": worker, "results": results}),
        flush=True)
  sys.stdout.flush()
  sys.stderr.flush()
  # A normal exit can hang in TF's coordination agent once the chief's
  # process has gone.
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
