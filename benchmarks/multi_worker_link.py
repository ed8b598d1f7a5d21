r"""Step time of N workers on shaped links: float32 ring vs DQSG vs NDQSG.

`--num_workers` worker processes (default 2) run in network namespaces of
their own, each joined to a bridge (in a namespace too) by a veth pair whose
both ends are limited with `tbf` (the kernel's token-bucket filter; the
`Network` class below has the commands), at each `--rates` (default 100
Mbit/s and 1 Gbit/s). Worker i
has the address 10.77.0.(i+1); `ndq_tf.launch` starts the workers
(`--hosts 10.77.0.1,... --port ... --worker_prefix "ip netns exec ..."`). For
each rate and method the same custom training loop (`strategy.run` +
`apply_gradients`, an MLP of about 5M parameters) runs `--warmup` + `--steps`
steps:

* `float32`: TF's own `tf.distribute.MultiWorkerMirroredStrategy`, ring
  all-reduce of float32 gradients;
* `dqsg`: `ndq_tf.MultiWorkerMirroredStrategy(DitheredCodec(num_levels=M))`,
  `M = --dqsg_levels` (default 1: ternary codes, 1.66 bits per element);
* `ndqsg`: `NestedDitheredCodec(num_levels=3, coarse_ratio=3)` (1.66 bits) on
  workers 1 to N-1 and that DQSG on worker 0 (the reference group). One
  all-gather needs one payload size, so reference and nested codecs of the
  same rate avoid padding.

Reported per (rate, method): median step time of the timed steps (the
slowest worker's), bytes sent per step per worker (the veth's tx counter, so
TCP/gRPC overhead included, mean over the workers), the bytes ratio (float32
bytes / compressed bytes on the wire), the speed-up over float32, and the
ideal speed-up given the bytes ratio: the float32 step measured first without
a bandwidth limit (compute, which compression cannot shorten) plus the shaped
float32 communication time divided by the ratio. The bytes of the
compressed exchange per worker and step are `sent_bits` of
`strategy.compression_stats()` / 8 (header, payload and the small tensors
sent losslessly beside it: 40 B of biases here); the optimizer's gradient
all-reduce is compressed by default, and a worker stops with an error if its
step counter (`step`) did not advance once per step.

Needs root (network namespaces); everything it creates is removed at the end
(also on errors, Ctrl-C and SIGTERM), and every launch is bounded by
`--timeout`. Run:

  python benchmarks/multi_worker_link.py                      # full table
  python benchmarks/multi_worker_link.py --rates 100mbit --steps 5
  python benchmarks/multi_worker_link.py --num_workers 4 --rates 100mbit

`--loopback` skips the namespaces (no root, no shaping: the workers listen on
127.0.0.1) to check the script:

  python benchmarks/multi_worker_link.py --loopback --steps 2 --warmup 1
"""

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Run as a script rather than `python -m ndq_tf.launch`, which would import
# the ndq_tf package, and with it TensorFlow, into the launcher.
LAUNCH = os.path.join(ROOT, "ndq_tf", "launch.py")
METHODS = ("float32", "dqsg", "ndqsg")
SUBNET = "10.77.0"
PORT = 23456
# Worker i is 10.77.0.(i+1), the bridge has no address: at most 254 workers.
MAX_WORKERS = 254
# Seconds the launcher gives a worker between SIGTERM and SIGKILL.
GRACE = 5
# 4.99M parameters: 1024-2048-1024-768-10.
LAYERS = (1024, 2048, 1024, 768, 10)
_RESULT = re.compile(r"^\[worker (\d+)\] RESULT (.*)$")


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
  compressed = args.method != "float32"
  if not compressed:
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=args.timeout))
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

  # Every worker gets the same command line: its interface is named after
  # its task index.
  task_id = strategy.cluster_resolver.task_id
  interface = args.interface and args.interface.format(index=task_id)
  for _ in range(args.warmup):
    float(train_step())
  times = []
  tx0 = _tx_bytes(interface)
  for _ in range(args.steps):
    start = time.perf_counter()
    float(train_step())
    times.append(time.perf_counter() - start)
  tx = _tx_bytes(interface) - tx0
  result = {
      "method": args.method,
      "worker": task_id,
      "params": params,
      "median_step_s": statistics.median(times),
      "step_times_s": [round(t, 4) for t in times],
      "tx_bytes_per_step": tx / args.steps,
      "float32_bytes": 4 * params,
  }
  if compressed:
    # This worker's last exchange (ndq_tf.distribute.telemetry): its framed
    # payload and the small tensors it sent losslessly beside it. The
    # optimizer's gradient all-reduce is compressed by default, one
    # exchange per step: fewer would mean a timed lossless all-reduce.
    stats = strategy.compression_stats()
    if stats["step"] != args.warmup + args.steps:
      raise RuntimeError(
          f"{stats['step']} compressed exchanges in "
          f"{args.warmup + args.steps} steps: the gradient all-reduce was "
          "not compressed every step.")
    result["compressed_exchanges"] = stats["step"]
    result["payload_bytes"] = stats["sent_bits"] // 8
  print("RESULT " + json.dumps(result), flush=True)
  return 0


# -- Driver -------------------------------------------------------------------


def _sh(*cmd, check=True):
  """Runs `cmd`; with `check`, a failure raises with the command's stderr."""
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if check and proc.returncode != 0:
    raise RuntimeError(f"`{shlex.join(cmd)}` exited with {proc.returncode}: "
                       f"{proc.stderr.strip()}")
  return proc


class Network:
  """N worker namespaces on a bridge, each link shaped with tbf at both ends.

  Namespaces and interfaces carry `tag` (e.g. the driver's pid) so that two
  runs on one machine do not collide. Worker i lives in namespace
  `ndq{tag}w{i}` with the address 10.77.0.(i+1) on `vw{tag}_{i}`; its peer
  `vb{tag}_{i}` is a port of the bridge `br0` in namespace `ndq{tag}br`.
  Both ends of each pair are shaped, so each worker's link is limited in
  both directions, as NETWORK_BENCH.md sets it up.

  `create` may fail half-way (e.g. on a name another run holds); `remove`
  deletes what `create` made, only that, and never raises: call it in a
  `finally`.
  """

  def __init__(self, tag, num_workers):
    self.bridge_ns = f"ndq{tag}br"
    self.worker_ns = [f"ndq{tag}w{i}" for i in range(num_workers)]
    self.worker_dev = [f"vw{tag}_{i}" for i in range(num_workers)]
    self.bridge_dev = [f"vb{tag}_{i}" for i in range(num_workers)]
    self.addresses = [f"{SUBNET}.{i + 1}" for i in range(num_workers)]
    # Per-worker names as `ndq_tf.launch` and the workers format them.
    self.ns_pattern = f"ndq{tag}w{{index}}"
    self.dev_pattern = f"vw{tag}_{{index}}"
    self._namespaces = []  # created, so to delete
    self._pairs = []

  def create(self):
    _sh("ip", "netns", "add", self.bridge_ns)
    self._namespaces.append(self.bridge_ns)
    _sh("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
    _sh("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")
    for ns, vw, vb, addr in zip(self.worker_ns, self.worker_dev,
                                self.bridge_dev, self.addresses):
      _sh("ip", "netns", "add", ns)
      self._namespaces.append(ns)
      _sh("ip", "link", "add", vw, "type", "veth", "peer", "name", vb)
      self._pairs.append(vw)
      _sh("ip", "link", "set", vw, "netns", ns)
      _sh("ip", "link", "set", vb, "netns", self.bridge_ns)
      _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", vw)
      _sh("ip", "-n", ns, "link", "set", "lo", "up")
      _sh("ip", "-n", ns, "link", "set", vw, "up")
      _sh("ip", "-n", self.bridge_ns, "link", "set", vb, "master", "br0")
      _sh("ip", "-n", self.bridge_ns, "link", "set", vb, "up")

  def _ends(self):
    """(namespace, device) of both ends of every worker's link."""
    return (list(zip(self.worker_ns, self.worker_dev)) +
            [(self.bridge_ns, dev) for dev in self.bridge_dev])

  def shape(self, rate):
    """Limits every link end to `rate` (a tc rate), or removes the limit."""
    for ns, dev in self._ends():
      if rate is None:
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev,
            "root", check=False)
        continue
      burst = "256kb" if rate.endswith("gbit") else "32kb"
      _sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev,
          "root", "tbf", "rate", rate, "burst", burst, "latency", "50ms")

  def remove(self):
    # Deleting a namespace deletes the veth ends in it, and so their peers;
    # a pair still in this namespace (`create` failed before moving it) is
    # deleted by name (an error, ignored, for the pairs that moved).
    for ns in reversed(self._namespaces):
      _sh("ip", "netns", "del", ns, check=False)
    for dev in self._pairs:
      _sh("ip", "link", "del", dev, check=False)
    self._namespaces, self._pairs = [], []


def _launch_command(args, method, net):
  """The `ndq_tf.launch` command line of one method's workers."""
  cmd = [sys.executable, LAUNCH, "--timeout", str(args.timeout), "--grace",
         str(GRACE)]
  worker = [sys.executable, os.path.abspath(__file__), "--worker",
            "--method", method, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch_size", str(args.batch_size),
            "--threads", str(args.threads), "--timeout", str(args.timeout),
            "--dqsg_levels", str(args.dqsg_levels)]
  if net is None:
    cmd += ["--num_workers", str(args.num_workers)]
  else:
    cmd += ["--hosts", ",".join(net.addresses), "--port", str(PORT),
            "--worker_prefix",
            shlex.join(["ip", "netns", "exec", net.ns_pattern])]
    worker += ["--interface", net.dev_pattern]
  return cmd + ["--"] + worker


def _stop(proc):
  """Stops the launcher: SIGTERM, which it forwards to the workers."""
  if proc.poll() is not None:
    return
  proc.terminate()
  try:
    proc.wait(timeout=2 * GRACE + 10)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


def _run_workers(args, method, net):
  """Runs the workers of one method; returns their RESULT dicts by index."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.Popen(_launch_command(args, method, net), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, text=True)
  try:
    # The launcher stops the workers after --timeout; this bounds the
    # launcher itself.
    output, _ = proc.communicate(timeout=args.timeout + 2 * GRACE + 30)
  except subprocess.TimeoutExpired:
    _stop(proc)
    output, _ = proc.communicate()
  except BaseException:  # Ctrl-C, SIGTERM: stop the workers first.
    _stop(proc)
    raise
  results = {}
  for line in output.splitlines():
    match = _RESULT.match(line)
    if match:
      results[int(match.group(1))] = json.loads(match.group(2))
  if proc.returncode != 0 or len(results) != args.num_workers:
    tail = "\n".join(output.splitlines()[-30:])
    raise RuntimeError(
        f"{method}: the launcher exited with {proc.returncode} and "
        f"{len(results)} of {args.num_workers} workers reported:\n{tail}")
  return [results[i] for i in sorted(results)]


def _raise_on_sigterm(signum, frame):
  del frame
  raise SystemExit(128 + signum)  # so that `finally` removes the namespaces


def run_driver(args):
  """Runs every (rate, method), prints the table; returns the exit code."""
  if not args.loopback and os.geteuid() != 0:
    print("multi_worker_link.py needs root for network namespaces; "
          "--loopback runs without them.", file=sys.stderr)
    return 2
  signal.signal(signal.SIGTERM, _raise_on_sigterm)
  rates = args.rates if not args.loopback else ["loopback"]
  table = []
  net = None if args.loopback else Network(os.getpid() % 10000,
                                           args.num_workers)
  free_step = None
  try:
    if net is not None:
      net.create()
    # The float32 step without a bandwidth limit: compute and framework time,
    # the part of a step that compression cannot shorten.
    if "float32" in args.methods and net is not None:
      net.shape(None)
      free = _run_workers(args, "float32", net)
      free_step = max(r["median_step_s"] for r in free)
      print(f"{'unlimited':>8}  float32: median step {free_step * 1000:8.1f} "
            "ms", flush=True)
    for rate in rates:
      if net is not None:
        net.shape(rate)
      rows = {}
      for method in args.methods:
        results = _run_workers(args, method, net)
        step = max(r["median_step_s"] for r in results)
        tx = statistics.mean(r["tx_bytes_per_step"] for r in results)
        rows[method] = dict(step=step, tx=tx, params=results[0]["params"],
                            payload=results[0].get("payload_bytes"),
                            float32_bytes=results[0]["float32_bytes"])
        exchanges = results[0].get("compressed_exchanges")
        print(f"{rate:>8} {method:>8}: median step {step * 1000:8.1f} ms, "
              f"tx {tx / 1e6:8.3f} MB/step/worker"
              + ("" if exchanges is None else
                 f", {exchanges} compressed exchanges"), flush=True)
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
    if net is not None:
      net.remove()
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
        f"gradient), {args.num_workers} workers; compressed exchange per "
        f"worker and step (framed payload and the small tensors sent "
        f"losslessly: sent_bits / 8): {payloads}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(table, f, indent=1)
  return 0


def main():
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"],
                 help="tbf rates of the link (default: 100mbit 1gbit).")
  p.add_argument("--num_workers", type=int, default=2,
                 help=f"Worker processes, 2 to {MAX_WORKERS} (default: 2), "
                      "each in its own namespace on the bridge.")
  p.add_argument("--methods", nargs="+", default=list(METHODS),
                 choices=METHODS, help="Methods to compare.")
  p.add_argument("--steps", type=int, default=10, help="Timed steps.")
  p.add_argument("--warmup", type=int, default=3, help="Untimed steps.")
  p.add_argument("--batch_size", type=int, default=64, help="Global batch.")
  p.add_argument("--dqsg_levels", type=int, default=1,
                 help="DitheredCodec num_levels M (2M+1 symbols) of dqsg and "
                      "of ndqsg's reference worker.")
  p.add_argument("--threads", type=int, default=1,
                 help="TF intra/inter-op threads per worker (the workers "
                      "share the machine).")
  p.add_argument("--timeout", type=float, default=300,
                 help="Seconds the workers of one (rate, method) may run.")
  p.add_argument("--loopback", action="store_true",
                 help="No namespaces or shaping: 127.0.0.1, for testing.")
  p.add_argument("--json", default=None, help="Also write the table here.")
  # Worker mode (internal).
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--method", default="float32", help=argparse.SUPPRESS)
  p.add_argument("--interface", default=None, help=argparse.SUPPRESS)
  args = p.parse_args()
  if not 2 <= args.num_workers <= MAX_WORKERS:
    p.error(f"--num_workers must be in [2, {MAX_WORKERS}]. Received: "
            f"{args.num_workers}")
  if args.timeout <= 0:
    p.error(f"--timeout must be > 0. Received: {args.timeout:g}")
  if args.worker:
    return run_worker(args)
  return run_driver(args)


if __name__ == "__main__":
  sys.exit(main())
