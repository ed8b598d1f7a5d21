"""The runs of the paper experiment, shared by its runner and its report.

benchmarks/paper_experiment.py trains them and writes one JSON per (run,
seed); benchmarks/paper_report.py lists them in this order and names the runs
a configuration lacks. This module imports neither TensorFlow nor ndq_tf.
"""

import collections

__all__ = ["RUNS", "ADAPTIVE_RUNS", "ONE_REFERENCE_RUNS", "reference_replicas"]

#: name -> (description, codec spec, reference codec spec or None)
RUNS = collections.OrderedDict([
    ("float32", ("float32", "float32", None)),
    ("fp16", ("fp16", "float16", None)),
    ("dqsg1", ("DQSG M=1", "dqsg:num_levels=1,bucket_size=512", None)),
    ("dqsg1r", ("DQSG M=1, rotated",
                "dqsg:num_levels=1,bucket_size=512,rotation=hadamard", None)),
    ("dqsg3", ("DQSG M=3", "dqsg:num_levels=3,bucket_size=512", None)),
    ("ndqsg33", ("NDQSG (3,3)",
                 "ndqsg:num_levels=3,coarse_ratio=3,bucket_size=512",
                 "dqsg:num_levels=3,bucket_size=512")),
    ("ndqsg33a", ("NDQSG (3,3) adaptive",
                  "ndqsg:num_levels=3,coarse_ratio=3,bucket_size=512",
                  "dqsg:num_levels=3,bucket_size=512")),
    ("ndqsg33a_p1", ("NDQSG (3,3) adaptive, P1 = 1",
                     "ndqsg:num_levels=3,coarse_ratio=3,bucket_size=512",
                     "dqsg:num_levels=3,bucket_size=512")),
    ("qsgd", ("QSGD s=1", "qsgd:num_levels=1,bucket_size=512", None)),
    ("terngrad", ("TernGrad", "terngrad:bucket_size=512", None)),
])

#: Runs whose nested senders use the automatic mode (`adaptive=True`).
ADAPTIVE_RUNS = frozenset({"ndqsg33a", "ndqsg33a_p1"})
#: Runs with one reference replica (the others: half the replicas).
ONE_REFERENCE_RUNS = frozenset({"ndqsg33a_p1"})


def reference_replicas(run, num_replicas):
  """Size of the reference group of a nested run (0 for the others).

  Args:
    run: a key of `RUNS`.
    num_replicas: replicas of the training.

  Returns:
    An int: 1 for `ONE_REFERENCE_RUNS`, half the replicas for the other
    nested runs, 0 for runs without a reference codec.

  Raises:
    ValueError: if `run` is not a key of `RUNS`.
  """
  if run not in RUNS:
    raise ValueError(f"`run` must be one of {list(RUNS)}. Received: "
                     f"run={run!r}")
  if RUNS[run][2] is None:
    return 0
  return 1 if run in ONE_REFERENCE_RUNS else num_replicas // 2
