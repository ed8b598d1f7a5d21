r"""Step time and bytes of P workers on shaped links: every transport, one run.

For each `--num_workers` P (default 2 4 8) and each `--rates` (default
100 Mbit/s), P worker processes run in network namespaces of their own, each
joined to a bridge (in a namespace too) by a veth pair whose both ends are
limited with `tbf` (the kernel's token-bucket filter; `netns.Network` in
benchmarks/netns.py has the commands). Worker i has the address
10.77.0.(i+1); `ndq_tf.launch` starts the workers (`--hosts 10.77.0.1,...
--port ... --worker_prefix "ip netns exec ..."`), each running this script
with `--worker` (benchmarks/link_worker.py). Every method runs the same custom
training loop (`strategy.run` + `apply_gradients`, an MLP of `--layers`,
about 5M parameters by default) for `--warmup` + `--steps` steps:

* `float32`: TF's own `tf.distribute.MultiWorkerMirroredStrategy` with
  `CommunicationImplementation.RING` (the users' baseline): a float32 ring
  all-reduce of every gradient tensor;
* `float16`: `ndq_tf.MultiWorkerMirroredStrategy(codec="float16",
  exchange="all_reduce")`, TF's ring of float16 values;
* `dqsg_ag`: `codec="dqsg:num_levels=M"` (`M = --dqsg_levels`, default 1:
  ternary codes), `exchange="all_gather"`: every worker's packed codes
  all-gathered;
* `dqsg_ar`: the same codec, `exchange="all_reduce"`: a MAX all-reduce of
  the per-bucket scales, then the codes summed in integer lanes;
* `dqsg_rs` (not in the default list): the same codec,
  `exchange="reduce_scatter"`: shards by an all-to-all, each worker's
  reduced shard re-quantized and all-gathered (issue #18);
* `auto`: the same codec, `exchange="auto"` (the strategy picks by
  `ndq_tf.core.cost_model.auto`; the transport it used is reported);
* `ndqsg` (not in the default list): `NestedDitheredCodec(num_levels=3,
  coarse_ratio=3)` on workers 1 to P-1 and that DQSG on worker 0,
  all-gathered.
* `ecdq_ag`, `ecdq_rs` (not in the default list):
  `codec="ecdq:bits=B"` (`B = --ecdq_bits`, default 1), entropy-coded
  dithered quantization (issue #35), all-gathered or reduce-scattered:
  variable-length payloads after a round that announces their lengths;
* `psgd1`, `psgd4` (not in the default list): `ndq_tf.PowerSGD` of rank 1
  or 4 with float32 factors and float32 for the vectors (PyTorch
  PowerSGD's configuration, to compare bytes with `torch_psgd1`/`4`),
  `exchange="all_reduce"`;
* `psgd1_dq`, `psgd4_dq` (not in the default list): the same ranks with
  `factor_codec="dqsg:num_levels=3"` and ternary DQSG (`"dqsg"`) for the
  vectors.

  All four use `start_step=2` (`link_worker.START_STEP`, as the PyTorch
  runs' `start_powerSGD_iter=2`) and `min_compression_rate=2`: `--warmup`
  must be at least 3 so that every timed step is low rank. Their model
  bytes are the strategy's own count (`model_link_bits` of
  `compression_stats()`: each round, fallback tensors, `P` and `Q`, by the
  cost model of its codec and transport), as `cost_model` has no low-rank
  exchange;
* `torch_float32`, `torch_fp16`, `torch_psgd1`, `torch_psgd4` (optional,
  never in the default list; need PyTorch, skipped with a message without
  it): the same MLP, batch and SGD under PyTorch DDP over gloo in the same
  namespaces, with no hook, `fp16_compress_hook`, or `powerSGD_hook` at
  rank 1 or 4 with `start_powerSGD_iter=2`
  (benchmarks/torch_link_worker.py, which says what their model bytes
  count).

An ndq_tf method may carry the strategy's `chunk_elements` after an `@`:
`dqsg_ag@none` exchanges the fused gradients in one piece, `dqsg_ag@262144`
in chunks of about 2**18 elements (pipelined: one chunk travels while the
next is encoded); without `@`, the strategy's default.

What is measured, per (P, rate, method):

* **Step time**: the median of the timed steps on each worker, the
  slowest worker's.
* **Bytes on the link**: each worker reads the counters of its own veth
  end (`/sys/class/net/<dev>/statistics`) after the warm-up and after the
  timed steps; bytes per step = the difference / `--steps`. That is every
  frame the worker transmits: Ethernet, IPv4 and TCP headers (66 B per
  frame with TCP timestamps; the veths are set to `gso_max_segs 1` so that,
  as on a real Ethernet, every frame is at most one MTU: 1448 B of TCP
  payload behind 66 B of headers), the TCP ACKs of what it receives,
  retransmissions, gRPC's HTTP/2 and protobuf framing of every collective
  chunk, the RPC requests of the ring's receivers, and the control traffic
  (TF's coordination-service heartbeats, gRPC keep-alives) of the interval.
  Not included: Ethernet's preamble, FCS and inter-frame gap (24 B per
  frame on a wire; Linux counts no more than the frame, and `tbf` meters
  the same bytes).
* **Model bytes**: `ndq_tf.core.cost_model.exchange_bits` for the gradient elements
  the strategy compressed and the transport it used (`compressed_elements`
  and `transport` of `strategy.compression_stats()`), plus a float32 ring
  all-reduce (`theory.ring_all_reduce_bits`) of the elements it sent
  losslessly beside them (`lossless_elements`: here the 10-element output
  bias, below `min_elements=256`); for `float32`, `"float32_ring"` of every
  parameter. The loss's scalar `strategy.reduce` is in the measured bytes
  and not in the model.
* **Breakdown**: frame headers (`tx_packets` x 66 B), TCP retransmissions
  (`RetransSegs` of the worker's namespace), what remains above the model
  (gRPC framing, RPC requests, control traffic), the CPU seconds of every
  worker per step (all its threads: `time.process_time`; the progress line
  splits them by thread name into TF's op threads, gRPC's, the collective
  executor's and the rest, `link_worker.THREAD_GROUPS`) and their sum
  divided by the machine's cores (the step time the CPU alone would need
  if the workers never waited on each other), and the link's floor (the
  busiest worker's bytes at the link's rate).

With `--unlimited`, every method also runs without a bandwidth limit at
each P (compute, encode and decode only: what compression cannot remove).
A compressed method stops with an error if its step counter (`step` of
`compression_stats()`) did not advance once per step, i.e. if a timed
gradient all-reduce went uncompressed.

Needs root (network namespaces); everything it creates is removed after
each P (also on errors, Ctrl-C, SIGTERM and SIGHUP), and every launch is
bounded by `--timeout`. Run:

  python benchmarks/multi_worker_link.py                 # P = 2 4 8, 100mbit
  python benchmarks/multi_worker_link.py --num_workers 2 4 \
      --methods float32 dqsg_ag --steps 5
  python benchmarks/multi_worker_link.py --num_workers 8 --unlimited \
      --json /tmp/link.json
  python benchmarks/multi_worker_link.py --num_workers 2 \
      --rates 100mbit 1gbit --unlimited \
      --methods float32 psgd4 psgd4_dq torch_psgd4 torch_fp16

`--loopback` skips the namespaces (no root, no shaping, no link counters:
the workers listen on 127.0.0.1) to check the script:

  python benchmarks/multi_worker_link.py --loopback --num_workers 2 \
      --steps 2 --warmup 1
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

import link_worker  # benchmarks/link_worker.py, next to this script
import netns  # benchmarks/netns.py, next to this script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Run as a script rather than `python -m ndq_tf.launch`, which would import
# the ndq_tf package, and with it TensorFlow, into the launcher.
LAUNCH = os.path.join(ROOT, "ndq_tf", "launch.py")
METHODS = link_worker.METHODS
DEFAULT_METHODS = ("float32", "float16", "dqsg_ag", "dqsg_ar", "auto")
PORT = 23456
# Worker i is 10.77.0.(i+1), the bridge has no address: at most 254 workers.
MAX_WORKERS = 254
# Seconds the launcher gives a worker between SIGTERM and SIGKILL.
GRACE = 5
# 4.99M parameters: 1024-2048-1024-768-10.
LAYERS = (1024, 2048, 1024, 768, 10)
_RESULT = re.compile(r"^\[worker (\d+)\] RESULT (.*)$")


def _launch_command(args, method, num_workers, net):
  """The `ndq_tf.launch` command line of one method's workers."""
  cmd = [sys.executable, LAUNCH, "--timeout", str(args.timeout), "--grace",
         str(GRACE)]
  worker = [sys.executable, os.path.abspath(__file__), "--worker",
            "--method", method, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--batch_size", str(args.batch_size),
            "--threads", str(args.threads), "--timeout", str(args.timeout),
            "--dqsg_levels", str(args.dqsg_levels),
            "--ecdq_bits", str(args.ecdq_bits),
            "--layers", *map(str, args.layers)]
  if net is None:
    cmd += ["--num_workers", str(num_workers)]
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


class WorkerError(RuntimeError):
  """A launch whose workers did not all report."""


def _run_workers(args, method, num_workers, net):
  """Runs the workers of one method; returns their RESULT dicts by index."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.Popen(_launch_command(args, method, num_workers, net),
                          env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True, start_new_session=True)
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
  if args.log:
    with open(args.log, "a") as f:
      f.write(f"==== P={num_workers} {method}\n{output}\n")
  results = {}
  for line in output.splitlines():
    match = _RESULT.match(line)
    if match:
      results[int(match.group(1))] = json.loads(match.group(2))
  if proc.returncode != 0 or len(results) != num_workers:
    tail = "\n".join(output.splitlines()[-25:])
    raise WorkerError(
        f"{method}, {num_workers} workers: the launcher exited with "
        f"{proc.returncode} and {len(results)} of {num_workers} workers "
        f"reported:\n{tail}")
  return [results[i] for i in sorted(results)]


def _rate_bits_per_second(rate):
  """`"100mbit"` -> 1e8 (tc's decimal units); None for no limit."""
  match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate or "")
  if not match:
    return None
  return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6,
                                  "g": 1e9}[match.group(2)]


def _summarize(results, rate):
  """One table row from the workers' RESULT dicts."""
  first = results[0]
  per_step = [r["per_step"] for r in results]
  row = {
      "num_workers": first["num_workers"],
      "rate": rate,
      "method": first["method"],
      "transport": first["transport"],
      "auto_transport": first.get("auto_transport"),
      "params": first["params"],
      "compressed_elements": first["compressed_elements"],
      "lossless_elements": first["lossless_elements"],
      "sent_bits": first.get("sent_bits"),
      "link_bits": first.get("link_bits"),
      "step_s": max(r["median_step_s"] for r in results),
      "worker_median_step_s": [r["median_step_s"] for r in results],
      "model_bytes": first["model_bytes"],
      "cpu_s_per_worker": [p["cpu_s"] for p in per_step],
      "cpu_s_sum": sum(p["cpu_s"] for p in per_step),
      # Per thread group (`link_worker.THREAD_GROUPS`), the mean over the
      # workers.
      "cpu_split_s": {
          group: statistics.mean(p.get(f"cpu_{group}_s", 0.0)
                                 for p in per_step)
          for group in [g for g, _ in link_worker.THREAD_GROUPS] + ["other"]},
      "max_rss_mb": max(r["max_rss_mb"] for r in results),
      # The low-rank methods' (ndq_tf's telemetry, PyTorch's layout).
      "rank": first.get("rank"),
      "low_rank_fraction": first.get("low_rank_fraction"),
  }
  row["cpu_floor_s"] = row["cpu_s_sum"] / os.cpu_count()
  if (row["link_bits"] or -1) >= 0:
    row["telemetry_over_model"] = row["link_bits"] / 8 / row["model_bytes"]
  if "tx_bytes" in per_step[0]:
    tx = [p["tx_bytes"] for p in per_step]
    rx = [p["rx_bytes"] for p in per_step]
    headers = [p["tx_packets"] * first["header_bytes"] for p in per_step]
    row.update(
        tx_bytes=statistics.mean(tx), tx_bytes_per_worker=tx,
        tx_bytes_min=min(tx), tx_bytes_max=max(tx),
        rx_bytes=statistics.mean(rx),
        header_bytes=statistics.mean(headers),
        retrans_segs=statistics.mean(p["tcp_retrans_segs"] for p in per_step),
        out_segs=statistics.mean(p["tcp_out_segs"] for p in per_step),
        tx_packets=statistics.mean(p["tx_packets"] for p in per_step))
    # TCP payload beyond the model: gRPC framing, RPC requests, control.
    row["beyond_model_bytes"] = (row["tx_bytes"] - row["header_bytes"]
                                 - row["model_bytes"])
    row["measured_over_model"] = row["tx_bytes"] / row["model_bytes"]
    bps = _rate_bits_per_second(rate)
    if bps:
      row["link_floor_s"] = max(max(tx), max(rx)) * 8 / bps
  return row


# Per-run numbers that `_merge` averages over the repeats of a method.
_MEAN_KEYS = ("tx_bytes", "rx_bytes", "header_bytes", "retrans_segs",
              "out_segs", "tx_packets", "beyond_model_bytes",
              "measured_over_model", "link_floor_s", "cpu_s_sum",
              "cpu_floor_s", "tx_bytes_min", "tx_bytes_max")


def _merge(runs):
  """One row from the repeats of one method: the median of their step times.

  Bytes, CPU (and its split by thread) and floors are their means over the
  repeats; every repeat's step time is kept (`step_s_runs`).
  """
  good = [r for r in runs if not r.get("error")]
  if not good:
    return runs[0]
  row = dict(good[0])
  row["step_s_runs"] = [r["step_s"] for r in good]
  row["step_s"] = statistics.median(row["step_s_runs"])
  row["failed_runs"] = len(runs) - len(good)
  for key in _MEAN_KEYS:
    if key in row:
      row[key] = statistics.mean(r[key] for r in good)
  row["cpu_s_per_worker"] = [
      statistics.mean(c) for c in zip(*(r["cpu_s_per_worker"] for r in good))]
  row["cpu_split_s"] = {
      group: statistics.mean(r["cpu_split_s"][group] for r in good)
      for group in row["cpu_split_s"]}
  return row


def _torch_missing():
  """Why this Python cannot import torch (its error's last line), or None."""
  proc = subprocess.run([sys.executable, "-c", "import torch"],
                        capture_output=True, text=True, check=False)
  if proc.returncode == 0:
    return None
  lines = proc.stderr.strip().splitlines()
  return lines[-1] if lines else f"exit code {proc.returncode}"


def _raise_on_signal(signum, frame):
  del frame
  raise SystemExit(128 + signum)  # so that `finally` removes the namespaces


def _ms(seconds):
  return "–" if seconds is None else f"{seconds * 1000:.0f}"


def _times(ratio):
  return "–" if ratio is None else f"{ratio:.2f}×"


def _print_tables(table, args):
  nan = None
  print("\n| P | link | method | transport | median step (ms) | "
        "vs float32 | vs fp16 | measured B/worker/step | model B | "
        "measured / model |")
  print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|")
  for row in table:
    if row.get("error"):
      print(f"| {row['num_workers']} | {row['rate'] or 'none'} | "
            f"{row['method']} | error | – | – | – | – | – | – |")
      continue
    measured = row.get("tx_bytes")
    print(f"| {row['num_workers']} | {row['rate'] or 'none'} | "
          f"{row['method']} | {row['transport']} | {_ms(row['step_s'])}"
          + ("" if len(row.get("step_s_runs", ())) < 2 else
             " (" + " / ".join(map(_ms, row["step_s_runs"])) + ")")
          + f" | {_times(row.get('vs_float32', nan))} | "
          f"{_times(row.get('vs_float16', nan))} | "
          + ("–" if measured is None else f"{measured:,.0f}") +
          f" | {row['model_bytes']:,.0f} | "
          + ("–" if measured is None else f"{row['measured_over_model']:.3f}")
          + " |")
  print("\nBreakdown per worker and step (means over the workers): frame "
        "headers, retransmitted segments, TCP payload beyond the model "
        "(gRPC framing, RPC requests, control traffic), CPU seconds of one "
        f"worker and the CPU floor (all workers' CPU / {os.cpu_count()} "
        "cores), the link floor (busiest worker's bytes at the rate), the "
        "step without a bandwidth limit (--unlimited).\n")
  print("| P | method | headers B | retrans segs | beyond model B | "
        "CPU ms/worker | CPU floor ms | link floor ms | no-limit step ms | "
        "median step ms |")
  print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  unlimited = {(r["num_workers"], r["method"]): r["step_s"] for r in table
               if r["rate"] is None and not r.get("error")}
  for row in table:
    if row.get("error") or row["rate"] is None or "tx_bytes" not in row:
      continue
    print(f"| {row['num_workers']} | {row['method']} | "
          f"{row['header_bytes']:,.0f} | {row['retrans_segs']:.1f} | "
          f"{row['beyond_model_bytes']:,.0f} | "
          f"{_ms(statistics.mean(row['cpu_s_per_worker']))} | "
          f"{_ms(row['cpu_floor_s'])} | {_ms(row.get('link_floor_s'))} | "
          f"{_ms(unlimited.get((row['num_workers'], row['method'])))} | "
          f"{_ms(row['step_s'])} |")


def _check_goals(table):
  """The issue's goals, as lines to print: the largest P's speed-ups, bytes."""
  lines = []
  shaped = [r for r in table if r["rate"] is not None and not r.get("error")]
  if not shaped:
    return lines
  top = max(r["num_workers"] for r in shaped)
  for row in shaped:
    if row["method"] == "auto" and row["num_workers"] == top:
      for key, goal in (("vs_float32", 4.0), ("vs_float16", 2.0)):
        if row.get(key) is not None:
          lines.append(
              f"P={top} {row['rate']} auto {key}: {row[key]:.2f}x (goal "
              f">= {goal:g}x): {'met' if row[key] >= goal else 'MISSED'}")
  by_method = {(r["num_workers"], r["rate"], r["method"]): r
               for r in shaped if "tx_bytes" in r}
  for (p, rate, method), row in by_method.items():
    ours = method.split("@")[0]
    pairs = [(f"torch_{ours}", "within 10% of", 0.9, 1.1)
             ] if ours in ("psgd1", "psgd4") else []
    if ours in ("psgd1_dq", "psgd4_dq"):
      pairs.append(("torch_psgd4", "at most 1/4 of", 0.0, 0.25))
    for other, goal, low, high in pairs:
      ref = by_method.get((p, rate, other))
      if ref:
        ratio = row["tx_bytes"] / ref["tx_bytes"]
        lines.append(
            f"P={p} {rate} {method}: {ratio:.3f}x the bytes of {other} "
            f"(goal {goal} them): "
            f"{'met' if low <= ratio <= high else 'MISSED'}")
  for row in shaped:
    ratio = row.get("measured_over_model")
    if ratio is not None:
      lines.append(
          f"P={row['num_workers']} {row['rate']} {row['method']}: measured/"
          f"model {ratio:.3f} (goal within 10%): "
          f"{'met' if abs(ratio - 1) <= 0.10 else 'MISSED'}")
  return lines


def run_driver(args):
  """Runs every (P, rate, method), prints the tables; returns the exit code."""
  if not args.loopback and os.geteuid() != 0:
    print("multi_worker_link.py needs root for network namespaces; "
          "--loopback runs without them.", file=sys.stderr)
    return 2
  for signum in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, _raise_on_signal)
  torch_methods = [m for m in args.methods
                   if link_worker.split_method(m)[0]
                   in link_worker.TORCH_METHODS]
  if torch_methods:
    missing = _torch_missing()
    if missing:
      print(f"Skipping {' '.join(torch_methods)}: {sys.executable} cannot "
            f"import torch ({missing}); pip install torch (or the "
            f"project's `torch` extra) to compare with PyTorch DDP.",
            flush=True)
      args.methods = [m for m in args.methods if m not in torch_methods]
      if not args.methods:
        return 2
  rates = list(args.rates) if not args.loopback else ["loopback"]
  if args.unlimited and not args.loopback:
    rates.append(None)
  table, failed = [], False
  print(f"load average at start: {os.getloadavg()}", flush=True)
  for num_workers in args.num_workers:
    net = None if args.loopback else netns.Network(os.getpid() % 10000,
                                             num_workers)
    try:
      if net is not None:
        net.create()
      for rate in rates:
        if net is not None:
          net.shape(rate)
        runs = {}
        for repeat in range(args.repeats):
          # Alternate the order, so that a drift in the machine's load
          # does not favour the methods run first.
          order = args.methods if repeat % 2 == 0 else args.methods[::-1]
          for method in order:
            label = rate or "no limit"
            try:
              results = _run_workers(args, method, num_workers, net)
            except WorkerError as e:
              failed = True
              print(f"P={num_workers} {label:>8} {method:>8}: FAILED\n{e}",
                    flush=True)
              runs.setdefault(method, []).append(
                  dict(num_workers=num_workers, rate=rate, method=method,
                       error=str(e)))
              continue
            row = _summarize(results, rate)
            runs.setdefault(method, []).append(row)
            measured = row.get("tx_bytes")
            print(f"P={num_workers} {label:>8} {method:>8} "
                  f"({row['transport']}): median step "
                  f"{row['step_s'] * 1000:8.1f} ms, "
                  + ("" if measured is None else
                     f"tx {measured / 1e6:7.3f} MB/step/worker "
                     f"(model {row['model_bytes'] / 1e6:7.3f} MB, "
                     f"x{row['measured_over_model']:.3f}), ")
                  + f"CPU {statistics.mean(row['cpu_s_per_worker']):.3f} "
                  f"s/worker ("
                  + ", ".join(f"{g} {1000 * v:.0f}"
                              for g, v in row["cpu_split_s"].items())
                  + f" ms), load {os.getloadavg()[0]:.1f}", flush=True)
            agree = row.get("telemetry_over_model")
            if agree is not None and abs(agree - 1) > 1e-3:
              print(f"  NOTE: compression_stats()['model_link_bits'] / 8 = "
                    f"{row['link_bits'] / 8:,.0f} B, {agree:.4f}x the "
                    f"model's {row['model_bytes']:,.0f} B", flush=True)
        rows = {m: _merge(runs[m]) for m in args.methods if m in runs}
        for row in rows.values():
          for base in ("float32", "float16"):
            if (not row.get("error") and base in rows
                and not rows[base].get("error")):
              row[f"vs_{base}"] = rows[base]["step_s"] / row["step_s"]
          table.append(row)
    finally:
      if net is not None:
        net.remove()
    if args.json:  # after every P, so that a later failure keeps these
      _write_json(args, table)
  table.sort(key=lambda r: (r["num_workers"], r["rate"] is None))
  _print_tables(table, args)
  goals = _check_goals(table)
  if goals:
    print()
    print("\n".join(goals))
  if table:
    first = next((r for r in table if not r.get("error")), None)
    if first:
      print(f"\nmodel: {first['params']} parameters "
            f"({4 * first['params'] / 1e6:.2f} MB of float32 gradient), "
            f"layers {'-'.join(map(str, args.layers))}, global batch "
            f"{args.batch_size}; largest worker RSS "
            f"{max(r.get('max_rss_mb', 0) for r in table):.0f} MB.")
  print(f"load average at end: {os.getloadavg()}")
  if args.json:
    _write_json(args, table)
  return 1 if failed else 0


def _write_json(args, table):
  with open(args.json, "w") as f:
    json.dump(dict(args=vars(args), cores=os.cpu_count(),
                   load_average=os.getloadavg(), table=table), f, indent=1)


def main():
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--num_workers", type=int, nargs="+", default=[2, 4, 8],
                 help=f"Worker counts P to run, each 2 to {MAX_WORKERS} "
                      "(default: 2 4 8), each worker in its own namespace "
                      "on the bridge.")
  p.add_argument("--rates", nargs="+", default=["100mbit"],
                 help="tbf rates of every link (default: 100mbit).")
  p.add_argument("--unlimited", action="store_true",
                 help="Also run every method without a bandwidth limit.")
  p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS),
                 help=f"Methods to compare, of {', '.join(METHODS)}; an "
                      f"ndq_tf one may end in @CHUNK_ELEMENTS or @none "
                      f"(default: {' '.join(DEFAULT_METHODS)}).")
  p.add_argument("--repeats", type=int, default=1,
                 help="Launches of every method per (P, rate), in "
                      "alternating order; the table has the median of their "
                      "step times (default: 1).")
  p.add_argument("--steps", type=int, default=10, help="Timed steps.")
  p.add_argument("--warmup", type=int, default=3, help="Untimed steps.")
  p.add_argument("--batch_size", type=int, default=64, help="Global batch.")
  p.add_argument("--layers", type=int, nargs="+", default=list(LAYERS),
                 help="Widths of the MLP, input first (default: "
                      f"{' '.join(map(str, LAYERS))}: 4.99M parameters).")
  p.add_argument("--dqsg_levels", type=int, default=1,
                 help="DitheredCodec num_levels M (2M+1 symbols) of the "
                      "dqsg methods and of ndqsg's reference worker.")
  p.add_argument("--ecdq_bits", type=float, default=1.0,
                 help="EntropyCodedDitheredCodec's rate target (bits=) of "
                      "the ecdq methods.")
  p.add_argument("--threads", type=int, default=1,
                 help="TF intra/inter-op threads per worker (the workers "
                      "share the machine).")
  p.add_argument("--timeout", type=float, default=300,
                 help="Seconds the workers of one (P, rate, method) may run.")
  p.add_argument("--loopback", action="store_true",
                 help="No namespaces or shaping: 127.0.0.1, for testing.")
  p.add_argument("--json", default=None, help="Also write the table here.")
  p.add_argument("--log", default=None,
                 help="Append every launch's output to this file.")
  # Worker mode (internal).
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--method", default="float32", help=argparse.SUPPRESS)
  p.add_argument("--interface", default=None, help=argparse.SUPPRESS)
  args = p.parse_args()
  for n in args.num_workers:
    if not 2 <= n <= MAX_WORKERS:
      p.error(f"--num_workers must be in [2, {MAX_WORKERS}]. Received: {n}")
  if args.repeats < 1:
    p.error(f"--repeats must be >= 1. Received: {args.repeats}")
  for spec in args.methods + [args.method]:
    try:
      link_worker.split_method(spec)
    except ValueError as e:
      p.error(f"--methods: {e}")
  needed = max(link_worker.min_warmup(m)
               for m in args.methods + [args.method])
  if args.warmup < needed:
    p.error(f"--warmup must be at least {needed} for the low-rank methods "
            f"(start_step={link_worker.START_STEP}: the timed steps must all "
            f"be low rank). Received: {args.warmup}")
  if args.timeout <= 0:
    p.error(f"--timeout must be > 0. Received: {args.timeout:g}")
  if len(args.layers) < 2 or min(args.layers) < 1:
    p.error(f"--layers must be at least two positive widths. Received: "
            f"{args.layers}")
  if args.worker:
    return link_worker.run_worker(args)
  for rate in args.rates:
    if _rate_bits_per_second(rate) is None:
      p.error(f"--rates must be tc rates such as 100mbit or 1gbit. "
              f"Received: {rate}")
  if args.batch_size < max(args.num_workers):
    p.error(f"--batch_size must be at least the largest --num_workers "
            f"({max(args.num_workers)}). Received: {args.batch_size}")
  return run_driver(args)


if __name__ == "__main__":
  sys.exit(main())
