r"""What the wire fingerprint (#21) costs in step time: two source trees, one run.

Runs the same 2-worker job (through `ndq_tf/launch.py`, on 127.0.0.1) with
each tree in `--trees` first on `PYTHONPATH` (e.g. this branch and the
commit before the fingerprint), alternating trees `--repeats` times, for
each transport. Every worker times `--steps` calls of a `tf.function` whose
only collective is one compressed all-reduce of `--num_elements` float32
values (`ndq_tf.distribute.compressed()`), after `--warmup` untimed calls;
a job's step time is the slower worker's median. Printed: the median over
the repeats per (tree, transport), and the ratio of every tree to the
first. On trees that have it, each worker also times the options check
(`MultiWorkerCompressedAllReduce.check_agreement`, run once more after the
strategy is built).

  python benchmarks/fingerprint_cost.py --trees "$PWD" /work/main \
      --repeats 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "FINGERPRINT_COST"


def _worker(args):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  strategy = ndq_tf.MultiWorkerMirroredStrategy(
      codec=ndq_tf.DitheredCodec(num_levels=1), exchange=args.transport,
      cluster_timeout=120)
  worker = strategy.cluster_resolver.task_id
  ops = strategy.compressed_all_reduce
  check = None
  if hasattr(ops, "check_agreement"):
    start = time.perf_counter()
    ops.check_agreement()
    check = time.perf_counter() - start
  value = tf.random.stateless_normal([args.num_elements], seed=[worker, 1])

  @tf.function
  def step():
    def replica_fn():
      with ndq_tf.distribute.compressed():
        return tf.distribute.get_replica_context().all_reduce("SUM", value)
    return strategy.run(replica_fn)

  times = []
  for i in range(args.warmup + args.steps):
    start = time.perf_counter()
    step().numpy()
    if i >= args.warmup:
      times.append(time.perf_counter() - start)
  print(MARKER + " " + json.dumps({
      "worker": worker, "step": statistics.median(times), "check": check,
      "transport": strategy.compression_stats()["transport"]}), flush=True)
  sys.stdout.flush()
  os._exit(0)  # pylint: disable=protected-access


def _job(tree, transport, args):
  env = dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="2")
  env.pop("TF_CONFIG", None)
  cmd = [sys.executable, os.path.join(tree, "ndq_tf", "launch.py"),
         "--num_workers", "2", "--timeout", str(args.timeout), "--",
         sys.executable, os.path.abspath(__file__), "--worker",
         "--transport", transport, "--num_elements", str(args.num_elements),
         "--steps", str(args.steps), "--warmup", str(args.warmup)]
  proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True,
                        text=True, timeout=args.timeout + 30)
  reports = [json.loads(line.split(MARKER + " ", 1)[1])
             for line in proc.stdout.splitlines() if MARKER + " {" in line]
  if proc.returncode != 0 or len(reports) != 2:
    raise RuntimeError(f"The job on {tree} failed:\n{proc.stdout[-3000:]}"
                       f"{proc.stderr[-3000:]}")
  checks = [r["check"] for r in reports if r["check"] is not None]
  return (max(r["step"] for r in reports), max(checks) if checks else None,
          reports[0]["transport"])


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--trees", nargs="+", default=[ROOT],
                 help="Source trees to compare; the first is the reference.")
  p.add_argument("--transports", nargs="+",
                 default=["all_gather", "all_reduce"])
  p.add_argument("--repeats", type=int, default=3,
                 help="Jobs per (tree, transport), alternating trees.")
  p.add_argument("--num_elements", type=int, default=2**20)
  p.add_argument("--steps", type=int, default=30, help="Timed steps.")
  p.add_argument("--warmup", type=int, default=5, help="Untimed steps.")
  p.add_argument("--timeout", type=int, default=300)
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--transport", default="all_gather", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker:
    _worker(args)
    return
  steps, checks = {}, {}
  for _ in range(args.repeats):
    for transport in args.transports:
      for tree in args.trees:
        step, check, used = _job(tree, transport, args)
        steps.setdefault((tree, transport), []).append(step)
        if check is not None:
          checks.setdefault(tree, []).append(check)
        print(f"{tree} {transport} ({used}): step {1e3 * step:.2f} ms",
              flush=True)
  print(f"\n{args.num_elements} elements, 2 workers, median of "
        f"{args.repeats} jobs of {args.steps} steps:")
  for transport in args.transports:
    reference = statistics.median(steps[(args.trees[0], transport)])
    for tree in args.trees:
      median = statistics.median(steps[(tree, transport)])
      print(f"  {transport:10s} {tree}: {1e3 * median:.2f} ms "
            f"(x{median / reference:.3f} of the first tree)")
  for tree, values in checks.items():
    print(f"  options check on {tree}: {1e3 * statistics.median(values):.1f} "
          "ms (median, slower worker)")


if __name__ == "__main__":
  main()
