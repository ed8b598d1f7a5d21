"""One worker of the agreement tests (tests/integration/test_agreement.py).

Worker 1 builds `ndq_tf.MultiWorkerMirroredStrategy` with one setting
changed per case (`CASES`); each case must fail on every worker when the
strategy is built, before any exchange. The worker records every case's
error message and seconds to the error. Then the plan case: the options
agree but the workers all-reduce tensors of another shape (hence another
fusion plan, of the same size), which only the fingerprint on the wire can
catch, at the first exchange, with TF's `InvalidArgumentError`; the worker
catches that error too and records its class, message and seconds. It
prints one line `AGREEMENT {"worker": i, "results": {...}, "plan": {...}}`.
With `--uncaught CASE`, it then builds that case's strategy uncaught (after
printing `uncaught case: CASE`): its error ends the process, non-zero.
"""

import argparse
import json
import os
import sys
import time
import traceback

MIN_ELEMENTS = 1000


def _cases(ndq_tf):
  """`{name: (worker 0's kwargs, worker 1's kwargs)}`."""
  dqsg = {"codec": ndq_tf.DitheredCodec(num_levels=3)}

  def nested(group):
    return {"codec": ndq_tf.NestedDitheredCodec(num_levels=3,
                                                coarse_ratio=3),
            "reference_codec": ndq_tf.DitheredCodec(num_levels=1),
            "reference_group": group}
  return {
      "seed": (dict(dqsg, seed=7), dict(dqsg, seed=1)),
      "codec": (dqsg, {"codec": ndq_tf.QSGDCodec(num_levels=3)}),
      "num_levels": (dqsg, {"codec": ndq_tf.DitheredCodec(num_levels=1)}),
      "chunk_elements": (dqsg, dict(dqsg, chunk_elements=1024)),
      "min_elements": (dqsg, dict(dqsg, min_elements=500)),
      "reference_group": (nested(1), nested(0.5)),
  }


def _parse():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--cases", default="",
                 help="Comma-separated names of CASES to run (all if empty).")
  p.add_argument("--transport", default="all_gather",
                 help="The transport of the last (plan) case.")
  p.add_argument("--uncaught", default=None,
                 help="At the end, build the strategy of this case, "
                      "uncaught: the process exits with its error.")
  return p.parse_args()


def main():
  args = _parse()
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top

  cases = _cases(ndq_tf)
  names = [c for c in args.cases.split(",") if c] or list(cases)
  results = {}
  for name in names:
    kwargs = dict(min_elements=MIN_ELEMENTS, cluster_timeout=60)
    kwargs.update(cases[name][worker])
    start = time.time()
    try:
      ndq_tf.MultiWorkerMirroredStrategy(**kwargs)
      results[name] = {"error": None}
    except ValueError as e:
      results[name] = {"error": str(e), "seconds": time.time() - start}

  # The same options, tensors of another shape: 64 x 32 against 32 x 64.
  strategy = ndq_tf.MultiWorkerMirroredStrategy(
      codec=ndq_tf.DitheredCodec(num_levels=3), min_elements=MIN_ELEMENTS,
      exchange=args.transport, cluster_timeout=60)
  shape = [64, 32] if worker == 0 else [32, 64]

  @tf.function
  def step():
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      with ndq_tf.distribute.compressed():
        return ctx.all_reduce("SUM", tf.ones(shape))
    return strategy.run(replica_fn)

  start = time.time()
  try:
    step()
    plan = {"error": None, "message": None}
    print("plan case: no error", flush=True)
  except tf.errors.InvalidArgumentError as e:
    plan = {"error": type(e).__name__, "message": str(e)}
  plan["seconds"] = time.time() - start
  print(f"plan case: {plan['seconds']:.1f} s to the error", flush=True)
  print("AGREEMENT " + json.dumps({"worker": worker, "results": results,
                                   "plan": plan}), flush=True)

  if args.uncaught:
    print(f"uncaught case: {args.uncaught}", flush=True)
    ndq_tf.MultiWorkerMirroredStrategy(
        min_elements=MIN_ELEMENTS, cluster_timeout=60,
        **cases[args.uncaught][worker])
    print("uncaught case: no error", flush=True)


if __name__ == "__main__":
  try:
    main()
    code = 0
  except Exception:  # pylint: disable=broad-except
    traceback.print_exc()
    code = 1
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # As mw_worker.py: a normal exit can hang in TF.
