r"""Step time of 2-worker training over a shaped link: float32 ring vs DQSG vs NDQSG.

Two workers run in their own network namespaces joined by a veth pair whose
both ends are limited with `tbf` (../shared/docs/NETWORK_BENCH.md), at each
`--rates` (default 100 Mbit/s and 1 Gbit/s). For each rate and method the same
custom training loop (`strategy.run` + `apply_gradients`, an MLP of about 5M
parameters) runs `--warmup` + `--steps` steps:

* `float32`: TF's own `tf.distribute.MultiWorkerMirroredStrategy`, ring
  all-reduce of float32 gradients;
* `dqsg`: `ndq_tf.MultiWorkerMirroredStrategy(DitheredCodec(num_levels=M))`,
  `M = --dqsg_levels` (default 1: ternary codes, 1.66 bits per element);
* `ndqsg`: `NestedDitheredCodec(num_levels=3, coarse_ratio=3)` (1.66 bits) on
  worker 1 and that DQSG on worker 0 (the reference group). One all-gather
  needs one payload size, so reference and nested codecs of the same rate
  avoid padding.

Reported per (rate, method): median step time of the timed steps, bytes sent
per step per worker (the veth's tx counter, so TCP/gRPC overhead included),
the bytes ratio (float32 bytes / compressed bytes on the wire), the speed-up
over float32, and the ideal speed-up given the bytes ratio: the float32 step
measured first without a bandwidth limit (compute, which compression cannot
shorten) plus the shaped float32 communication time divided by the ratio.

Needs root (network namespaces); everything it creates is removed at the end,
and every worker is bounded by `--timeout`. Run:

  python benchmarks/multi_worker_link.py                      # full table
  python benchmarks/multi_worker_link.py --rates 100mbit --steps 5

`--loopback` skips the namespaces (no root, no shaping) to check the script.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("float32", "dqsg", "ndqsg")
SUBNET = "10.77.0"
PORT = 23456
# 4.99M parameters: 1024-2048-1024-768-10.
LAYERS = (1024, 2048, 1024, 768, 10)


# -- Worker -------------------------------------------------------------------


def _tx_bytes(interface):
  if not interface:
    return 0
  with open(f"/sys/class/net/{interface}/statistics/tx_bytes") as f:
    return int(f.read())


def run_worker(args):
  """One worker: builds the strategy, trains, prints one RESULT line."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(args.threads)
  tf.config.threading.set_inter_op_parallelism_threads(args.threads)
  if args.method == "float32":
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=args.timeout))
    ops = None
  else:
    import ndq_tf  # pylint: disable=g-import-not-at-top
    from ndq_tf.distribute import multi_worker  # pylint: disable=g-import-not-at-top
    kwargs = {}
    dqsg = ndq_tf.DitheredCodec(num_levels=args.dqsg_levels)
    if args.method == "dqsg":
      codec = dqsg
    else:
      codec = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
      kwargs = dict(reference_codec=dqsg, reference_workers=1)
    strategy = multi_worker.MultiWorkerMirroredStrategy(
        codec=codec, min_elements=256, cluster_timeout=args.timeout,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=args.timeout), **kwargs)
    ops = strategy.compressed_all_reduce
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  per_replica = args.batch_size // strategy.num_replicas_in_sync
  x = tf.random.stateless_normal([per_replica, LAYERS[0]], seed=[1, 2])
  y = tf.random.stateless_uniform([per_replica], seed=[3, 4], maxval=10,
                                  dtype=tf.int32)
  with strategy.scope():
    model = keras.Sequential(
        [keras.Input((LAYERS[0],))] +
        [keras.layers.Dense(n, activation="relu") for n in LAYERS[1:-1]] +
        [keras.layers.Dense(LAYERS[-1])])
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction="sum")
  params = sum(int(tf.size(v)) for v in model.trainable_variables)

  @tf.function
  def train_step():
    def step_fn():
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True)) / args.batch_size
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    return strategy.reduce("SUM", strategy.run(step_fn), axis=None)

  for _ in range(args.warmup):
    float(train_step())
  times = []
  tx0 = _tx_bytes(args.interface)
  for _ in range(args.steps):
    start = time.perf_counter()
    float(train_step())
    times.append(time.perf_counter() - start)
  tx = _tx_bytes(args.interface) - tx0
  result = {
      "method": args.method,
      "worker": strategy.cluster_resolver.task_id,
      "params": params,
      "median_step_s": statistics.median(times),
      "step_times_s": [round(t, 4) for t in times],
      "tx_bytes_per_step": tx / args.steps,
      "float32_bytes": 4 * params,
  }
  if ops is not None:
    result["payload_bytes"] = int(ops.sent_bits.numpy()) // 8
  print("RESULT " + json.dumps(result), flush=True)
  return 0


# -- Driver -------------------------------------------------------------------


def _sh(*cmd, check=True):
  return subprocess.run(cmd, check=check, capture_output=True, text=True)


class Link:
  """Two namespaces joined by a veth pair, shaped with tbf on both ends."""

  def __init__(self, tag):
    self.ns = [f"ndqmw{tag}a", f"ndqmw{tag}b"]
    self.dev = [f"vmw{tag}a", f"vmw{tag}b"]
    self.addr = [f"{SUBNET}.1", f"{SUBNET}.2"]

  def __enter__(self):
    for ns in self.ns:
      _sh("ip", "netns", "add", ns)
    _sh("ip", "link", "add", self.dev[0], "type", "veth", "peer", "name",
        self.dev[1])
    for ns, dev, addr in zip(self.ns, self.dev, self.addr):
      _sh("ip", "link", "set", dev, "netns", ns)
      _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
      _sh("ip", "-n", ns, "link", "set", "lo", "up")
      _sh("ip", "-n", ns, "link", "set", dev, "up")
    return self

  def shape(self, rate):
    """Limits both ends to `rate` (a tc rate), or removes the limit (None)."""
    for ns, dev in zip(self.ns, self.dev):
      if rate is None:
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev,
            "root", check=False)
        continue
      burst = "256kb" if rate.endswith("gbit") else "32kb"
      _sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev,
          "root", "tbf", "rate", rate, "burst", burst, "latency", "50ms")

  def __exit__(self, *exc):
    for ns in self.ns:
      _sh("ip", "netns", "del", ns, check=False)
    return False


def _run_pair(args, method, link):
  """Runs both workers of one method; returns their RESULT dicts."""
  if link is None:
    hosts = ["127.0.0.1", "127.0.0.1"]
    import socket  # pylint: disable=g-import-not-at-top
    ports = []
    socks = []
    for _ in range(2):
      s = socket.socket()
      s.bind(("127.0.0.1", 0))
      socks.append(s)
      ports.append(s.getsockname()[1])
    for s in socks:
      s.close()
  else:
    hosts, ports = link.addr, [PORT, PORT]
  cluster = [f"{h}:{p}" for h, p in zip(hosts, ports)]
  procs = []
  for i in range(2):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": cluster},
                                   "task": {"type": "worker", "index": i}})
    cmd = [sys.executable, os.path.abspath(__file__), "--worker",
           "--method", method, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--batch_size", str(args.batch_size),
           "--threads", str(args.threads), "--timeout", str(args.timeout),
           "--dqsg_levels", str(args.dqsg_levels)]
    if link is not None:
      cmd = ["ip", "netns", "exec", link.ns[i]] + cmd + [
          "--interface", link.dev[i]]
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True))
  results, outputs = [], []
  deadline = time.monotonic() + args.timeout
  try:
    for proc in procs:
      out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
      outputs.append(out)
  except subprocess.TimeoutExpired:
    outputs.append("timeout")
  finally:
    for proc in procs:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  for out in outputs:
    for line in out.splitlines():
      if line.startswith("RESULT "):
        results.append(json.loads(line[len("RESULT "):]))
  if len(results) != 2:
    tail = "\n".join("\n".join(o.splitlines()[-15:]) for o in outputs)
    raise RuntimeError(f"{method}: workers failed:\n{tail}")
  return results


def run_driver(args):
  rates = args.rates if not args.loopback else ["loopback"]
  table = []
  link_ctx = None if args.loopback else Link(os.getpid() % 10000)
  try:
    if link_ctx is not None:
      link_ctx.__enter__()
    # The float32 step without a bandwidth limit: compute and framework time,
    # the part of a step that compression cannot shorten.
    free_step = None
    if "float32" in args.methods and not args.loopback:
      link_ctx.shape(None)
      free = _run_pair(args, "float32", link_ctx)
      free_step = max(r["median_step_s"] for r in free)
      print(f"{'unlimited':>8}  float32: median step {free_step * 1000:8.1f} "
            "ms", flush=True)
    for rate in rates:
      if link_ctx is not None:
        link_ctx.shape(rate)
      rows = {}
      for method in args.methods:
        results = _run_pair(args, method, link_ctx)
        step = max(r["median_step_s"] for r in results)
        tx = statistics.mean(r["tx_bytes_per_step"] for r in results)
        rows[method] = dict(step=step, tx=tx, params=results[0]["params"],
                            payload=results[0].get("payload_bytes"),
                            float32_bytes=results[0]["float32_bytes"])
        print(f"{rate:>8} {method:>8}: median step {step * 1000:8.1f} ms, "
              f"tx {tx / 1e6:8.3f} MB/step/worker", flush=True)
      base = rows.get("float32")
      for method, row in rows.items():
        row.update(rate=rate, method=method)
        if base:
          row["speedup"] = base["step"] / row["step"]
          if row["tx"] > 0:
            ratio = base["tx"] / row["tx"]
            row["bytes_ratio"] = ratio
            if free_step is not None:
              # Communication time shrinks by the bytes ratio, the rest stays.
              comm = max(base["step"] - free_step, 0.0)
              row["ideal_speedup"] = base["step"] / (free_step + comm / ratio)
        table.append(row)
  finally:
    if link_ctx is not None:
      link_ctx.__exit__(None, None, None)
  print()
  print("| link | method | median step (ms) | bytes sent / step / worker | "
        "bytes ratio | speed-up vs float32 | ideal speed-up |")
  print("|---|---|---:|---:|---:|---:|---:|")
  nan = float("nan")
  for row in table:
    print(f"| {row['rate']} | {row['method']} | {row['step'] * 1000:.1f} | "
          f"{row['tx'] / 1e6:.3f} MB | {row.get('bytes_ratio', nan):.1f}x | "
          f"{row.get('speedup', nan):.2f}x | "
          f"{row.get('ideal_speedup', nan):.2f}x |")
  if free_step is not None:
    print(f"\nfloat32 step without a bandwidth limit: {free_step * 1000:.1f} ms."
          " Ideal speed-up: float32 step / (that + (float32 step - that) / "
          "bytes ratio), i.e. communication shrunk by the bytes ratio.")
  params = table[0]["params"] if table else 0
  payloads = ", ".join(
      "%s=%d B" % (r["method"], r["payload"]) for r in table
      if r["payload"] and r["rate"] == table[0]["rate"])
  print(f"\nmodel: {params} parameters ({4 * params / 1e6:.1f} MB of float32 "
        f"gradient); compressed payload per worker and step: {payloads}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(table, f, indent=1)
  return 0


def main():
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"],
                 help="tbf rates of the link (default: 100mbit 1gbit).")
  p.add_argument("--methods", nargs="+", default=list(METHODS),
                 choices=METHODS, help="Methods to compare.")
  p.add_argument("--steps", type=int, default=10, help="Timed steps.")
  p.add_argument("--warmup", type=int, default=3, help="Untimed steps.")
  p.add_argument("--batch_size", type=int, default=64, help="Global batch.")
  p.add_argument("--dqsg_levels", type=int, default=1,
                 help="DitheredCodec num_levels M (2M+1 symbols) of dqsg and "
                      "of ndqsg's reference worker.")
  p.add_argument("--threads", type=int, default=1,
                 help="TF intra/inter-op threads per worker (2 workers share "
                      "the machine).")
  p.add_argument("--timeout", type=float, default=300,
                 help="Seconds any one pair of workers may run.")
  p.add_argument("--loopback", action="store_true",
                 help="No namespaces or shaping: 127.0.0.1, for testing.")
  p.add_argument("--json", default=None, help="Also write the table here.")
  # Worker mode (internal).
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--method", default="float32", help=argparse.SUPPRESS)
  p.add_argument("--interface", default=None, help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker:
    return run_worker(args)
  return run_driver(args)


if __name__ == "__main__":
  sys.exit(main())
