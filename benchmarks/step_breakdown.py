r"""Where one training step's time goes: a profiler timeline, by phase.

Trains an MLP with `strategy.run` + `optimizer.apply_gradients` on logical
CPU replicas (default 4, as benchmarks/mirrored_step.py), traces `--steps`
steps with TensorFlow's profiler (`tf.profiler.experimental.start`/`stop`),
reads the `.xplane.pb` it writes, and draws the step of median length as a
timeline (`--out`, a PNG): one row per device (a device's ops that run at the
same time, on several of TF's threads, get a lane each), every op a bar
coloured by its phase:

* `forward`, `backward` (ops under `gradient_tape/` or `gradients/`),
  `optimizer update` (under the optimizer's name scope, e.g. `sgd/`);
* `encode`, `exchange`, `decode`, `sum`: the compressed all-reduce, from the
  engine's name scopes `ndq_encode`, `ndq_exchange`, `ndq_decode`, `ndq_sum`,
  each optionally inside `ndq_chunk<k>` when the exchange is split in chunks
  (the chunk index is written on the bars and hatched). Without those scopes
  the codec's XLA functions (`_quantize_stage`, `_pack_stage` /
  `_unpack_stage`, `_dequantize_stage`) still count as encode and decode,
  TF's collectives (`CollectiveReduceV2`, `CollectiveGatherV2`, NCCL) as
  exchange;
* `other`: everything else (input pipeline, loss reduction, step counters).

A profiler trace holds ops by name and thread, not by device: the device of
each op comes from the partitioned graphs of the step function (run metadata
of its first call, when TF places and partitions it).

Below it, on the same time axis, one row for the backward pass and one per
chunk with that chunk's encode, exchange, decode and sum (issue #20: with
the chunks in ready order, chunk 0's exchange runs during the backward).

Printed: ms per phase per device of the drawn step (sums of op durations:
ops of one device overlap when TF runs them on several threads, so a row can
exceed the step), the fraction of the exchange's time that overlaps the
encoding or decoding of another chunk (0 when the exchange is not split),
the link time (the gradient exchange's collectives and transfers, launch
to completion)
and the fraction of it that overlaps the backward pass, and each chunk's
span per phase.

`--strategy=multi_worker` starts `--num_workers` one-CPU workers through
`ndq_tf.launch` (the script again, in each); worker 0 traces and draws, the
others run the same steps. With `--rate` (root only) they run in network
namespaces, each link shaped to that rate as benchmarks/multi_worker_link.py
does (`netns.Network`).

Example:

  python benchmarks/step_breakdown.py --codec=dqsg:num_levels=1 \
      --out=docs/step_breakdown_mirrored_dqsg.png
  python benchmarks/step_breakdown.py --codec=tf \
      --out=docs/step_breakdown_mirrored_tf.png
  python benchmarks/step_breakdown.py --strategy=multi_worker \
      --out=docs/step_breakdown_multi_worker_dqsg.png
"""

import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

import common  # benchmarks/common.py, next to this script
import trace_parser  # benchmarks/trace_parser.py, next to this script
import step_phases  # benchmarks/step_phases.py, next to this script
from trace_parser import op_events  # pylint: disable=g-importing-member
from trace_parser import op_placement  # pylint: disable=g-importing-member
from trace_parser import read_xspace  # pylint: disable=g-importing-member
from trace_parser import step_windows  # pylint: disable=g-importing-member

_STRATEGY = flags.DEFINE_enum(
    "strategy", "mirrored", ["mirrored", "multi_worker"],
    "mirrored: ndq_tf.MirroredStrategy (or TF's, --codec=tf) on --replicas "
    "logical CPU devices. multi_worker: ndq_tf.MultiWorkerMirroredStrategy "
    "(or TF's) on --num_workers local worker processes of one CPU each, "
    "started by ndq_tf.launch; worker 0 traces and draws.")
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", 2, "--strategy=multi_worker: worker processes.")
_RATE = flags.DEFINE_string(
    "rate", None, "--strategy=multi_worker: a tc rate (e.g. 100mbit): the "
    "workers run in network namespaces on a bridge, every link shaped with "
    "tbf (benchmarks/netns.py; needs root). Default: the loopback.")
_TIMEOUT = flags.DEFINE_float(
    "timeout", 600, "--strategy=multi_worker: seconds before the launcher "
    "stops the job.")
_CODEC = flags.DEFINE_string(
    "codec", "dqsg:num_levels=1",
    "ndq_tf codec spec, as for ndq_tf.codecs.get (float32 is ndq_tf's "
    "Float32Codec through the engine), or 'tf': TensorFlow's own "
    "MirroredStrategy with its default all-reduce, the baseline.")
_TRANSPORT = flags.DEFINE_string(
    "transport", None,
    "ndq_tf strategies' transport= ('auto', 'all_gather', 'all_reduce'); "
    "default the strategy's.")
_REPLICAS = flags.DEFINE_integer("replicas", 4, "Logical CPU replicas.")
_STEPS = flags.DEFINE_integer(
    "steps", 5, "Traced steps; the one of median length is drawn.")
_WARMUP = flags.DEFINE_integer(
    "warmup", 3, "Untraced steps first (tracing, compilation).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Global batch size.")
_LAYERS = flags.DEFINE_list("layers", ["784", "1024", "512", "10"],
                            "MLP layer widths, input first.")
_OUT = flags.DEFINE_string(
    "out", os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                        "docs", "step_breakdown_mirrored_dqsg.png"),
    "Where the PNG timeline goes.")
_LOGDIR = flags.DEFINE_string(
    "logdir", None,
    "Where the profiler writes its trace (also for TensorBoard); default a "
    "temporary directory, removed at the end.")

#: Phases in drawing order, with their colours (`step_phases.classify`).
PHASES = step_phases.PHASES
_STEP_MARKER = trace_parser.STEP_MARKER


# -- The picture ----------------------------------------------------------------


def _lanes(ops):
  """Assigns each op of one device the first lane free at its start."""
  lane_ends, lanes = [], []
  for op in sorted(ops, key=lambda o: o.start):
    for i, lane_end in enumerate(lane_ends):
      if lane_end <= op.start:
        lane_ends[i] = op.end
        lanes.append((i, op))
        break
    else:
      lane_ends.append(op.end)
      lanes.append((len(lane_ends) - 1, op))
  return len(lane_ends), lanes


def render(ops, step_ms, title, path):
  """Draws the timeline of `ops` to the PNG `path`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import patches  # pylint: disable=g-import-not-at-top
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  devices = sorted({o.device for o in ops}, key=step_phases.device_key)
  rows = []  # (label, [(start, width, phase, chunk)])
  for device in devices:
    count, lanes = _lanes([o for o in ops if o.device == device])
    for lane in range(count):
      label = device if lane == 0 else f"{device} ·{lane + 1}"
      rows.append((label, [op for i, op in lanes if i == lane]))
  lower = step_phases.chunk_rows(ops)
  top = 0.32 * len(rows) + 0.6
  bottom = 0.36 * len(lower) + 0.6
  fig, (ax, ax2) = plt.subplots(
      2, 1, figsize=(13, max(3.6, top + bottom + 1.9)), sharex=True,
      gridspec_kw={"height_ratios": [top, bottom]})
  for y, (_, row_ops) in enumerate(rows):
    for op in row_ops:
      width = max(op.end - op.start, 1e-3)
      hatch = None if op.chunk is None else ("//" if op.chunk % 2 else "..")
      ax.add_patch(patches.Rectangle(
          (op.start, y - 0.4), width, 0.8, facecolor=PHASES[op.phase],
          edgecolor="black" if op.chunk is not None else "none",
          linewidth=0.3, hatch=hatch))
      if op.chunk is not None and width > step_ms / 60:
        ax.text(op.start + width / 2, y, str(op.chunk), ha="center",
                va="center", fontsize=6)
  ax.set_xlim(0, step_ms)
  ax.set_ylim(len(rows) - 0.5, -0.5)
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels([label for label, _ in rows], fontsize=8)
  # The lower panel: the backward pass and each chunk's phases, one strip
  # per phase, on the same time axis.
  strips = ("encode", "exchange", "decode", "sum")
  for y, (_, phases) in enumerate(lower):
    for phase, intervals in phases.items():
      if phase == "backward":
        y0, h = y - 0.4, 0.8
      else:
        h = 0.8 / len(strips)
        y0 = y - 0.4 + strips.index(phase) * h
      for a, b in intervals:
        ax2.add_patch(patches.Rectangle((a, y0), max(b - a, 1e-3), h,
                                        facecolor=PHASES[phase],
                                        edgecolor="none"))
  link_ms, overlapped_ms = step_phases.backward_overlap(ops)
  ax2.set_ylim(len(lower) - 0.5, -0.5)
  ax2.set_yticks(range(len(lower)))
  ax2.set_yticklabels([label for label, _ in lower], fontsize=8)
  ax2.set_title(
      f"each chunk: encode, exchange, decode, sum (top to bottom); link "
      f"time {link_ms:.1f} ms, {overlapped_ms / link_ms if link_ms else 0:.0%}"
      " of it during the backward pass", fontsize=8)
  ax2.grid(axis="x", alpha=0.3)
  ax2.set_xlabel("ms from the step's start (top: a row per device; ·2, ·3: "
                 "its ops running at the same time on other threads)")
  present = [p for p in PHASES if any(o.phase == p for o in ops)]
  ax.legend(handles=[patches.Patch(color=PHASES[p], label=p) for p in present],
            loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(present),
            fontsize=8, frameon=False)
  ax.set_title(title, fontsize=10, pad=22)
  ax.grid(axis="x", alpha=0.3)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


# -- The run --------------------------------------------------------------------


def make_step(strategy, widths, batch_size):
  """Builds the MLP on `strategy`.

  Returns:
    `(step, scopes)`: a function running one step, and a dict of the name
    scopes of its phases: `optimizer` (the optimizer's), `forward` (the
    model's and the loss's), and `parameters`, the model's size.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  model, optimizer, loss_fn, x, y = common.synthetic_mlp(strategy, widths,
                                                         batch_size)
  options = tf.data.Options()
  # Every worker reads the same global batch and keeps its replicas' part.
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.OFF)
  iterator = iter(strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensors((x, y)).repeat().with_options(options)))

  @tf.function
  def train_step(inputs):
    def replica_step(x, y):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x)) / batch_size
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    return strategy.reduce("sum", strategy.run(replica_step, args=inputs),
                           axis=None)

  scopes = {"optimizer": optimizer.name.lower(),
            "forward": [model.name, loss_fn.name, "compile_loss"],
            "parameters": model.count_params()}
  return lambda: train_step(next(iterator)).numpy(), scopes


def traced_steps(step, warmup, steps, logdir):
  """Runs `step` untraced, then traced.

  Args:
    step: runs one training step.
    warmup: untraced steps first; the first one records the placement.
    steps: untraced steps timed, then as many traced.
    logdir: where the profiler writes.

  Returns:
    `(placement, space, untraced)`: the map of `op_placement`, the trace's
    `XSpace`, and the untraced steps' times in ms.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  # The first call places and partitions the step's graph: its run metadata
  # says which device each op runs on (the trace does not).
  ctx = context.context()
  ctx.enable_run_metadata()
  step()
  placement = op_placement(ctx.export_run_metadata())
  ctx.disable_run_metadata()
  for _ in range(max(0, warmup - 1)):
    step()
  untraced = []
  for _ in range(steps):
    start = time.perf_counter()
    step()
    untraced.append(1e3 * (time.perf_counter() - start))
  tf.profiler.experimental.start(logdir)
  try:
    for i in range(steps):
      with tf.profiler.experimental.Trace(_STEP_MARKER, step_num=i, _r=1):
        step()
  finally:
    tf.profiler.experimental.stop()
  return placement, read_xspace(logdir), untraced


def make_strategy(devices):
  """The strategy of `--strategy` and `--codec`, and a name for titles.

  Args:
    devices: the replicas' devices (`mirrored`), or None (`multi_worker`,
      whose strategy must be built before any other TF call).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  multi_worker = _STRATEGY.value == "multi_worker"
  if _CODEC.value == "tf":
    if multi_worker:
      return (tf.distribute.MultiWorkerMirroredStrategy(),
              "TF MultiWorkerMirroredStrategy, default all-reduce (float32)")
    return (tf.distribute.MirroredStrategy(devices),
            "TF MirroredStrategy, default all-reduce (float32)")
  import ndq_tf  # pylint: disable=g-import-not-at-top
  codec = ndq_tf.codecs.get(_CODEC.value)
  kwargs = {}
  if _TRANSPORT.value is not None:
    kwargs["exchange"] = _TRANSPORT.value
  if multi_worker:
    return (ndq_tf.MultiWorkerMirroredStrategy(codec=codec, **kwargs),
            f"ndq_tf.MultiWorkerMirroredStrategy, {_CODEC.value}")
  strategy = ndq_tf.MirroredStrategy(codec=codec, devices=devices, **kwargs)
  return strategy, f"ndq_tf.MirroredStrategy, {_CODEC.value}"


def launch_workers():
  """Runs this script as `--num_workers` workers through `ndq_tf.launch`."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
  # The workers run from the repository's root: the output path is made
  # absolute here, where a relative one was meant.
  args = []
  skip = False
  for a in sys.argv[1:]:
    if skip or a.startswith("--out"):
      skip = a == "--out"  # Its value is the next argument.
      continue
    args.append(a)
  worker = [sys.executable, os.path.abspath(__file__)] + args
  worker.append(f"--out={os.path.abspath(_OUT.value)}")
  launch = [sys.executable, "-m", "ndq_tf.launch", "--timeout",
            str(_TIMEOUT.value)]
  if _RATE.value is None:
    return subprocess.call(
        launch + ["--num_workers", str(_NUM_WORKERS.value), "--"] + worker,
        cwd=root)
  import shlex  # pylint: disable=g-import-not-at-top
  import netns  # pylint: disable=g-import-not-at-top
  net = netns.Network(os.getpid() % 10000, _NUM_WORKERS.value)
  try:
    net.create()
    net.shape(_RATE.value)
    return subprocess.call(
        launch + ["--hosts", ",".join(net.addresses), "--port", "23456",
                  "--worker_prefix",
                  shlex.join(["ip", "netns", "exec", net.ns_pattern]), "--"]
        + worker, cwd=root)
  finally:
    net.remove()


def analyze(space, placement, scopes):
  """The drawn step's `Op`s, its length in ms, and every step's length."""
  windows = step_windows(space)
  if not windows:
    raise ValueError("No step markers in the trace.")
  lengths = [(b - a) / 1e9 for a, b in windows]
  median = statistics.median_low(lengths)
  window = windows[lengths.index(median)]
  ops = step_phases.build_ops(op_events(space, window, placement), window,
                  scopes["optimizer"], scopes["forward"])
  return ops, median, lengths


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  worker = None
  if _STRATEGY.value == "multi_worker":
    if "TF_CONFIG" not in os.environ:
      return launch_workers()
    import json  # pylint: disable=g-import-not-at-top
    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy, description = make_strategy(None)
    devices = strategy.extended.worker_devices
    replicas = f"{_NUM_WORKERS.value} workers of 1 CPU, drawn: worker 0"
  else:
    devices = common.split_cpu(_REPLICAS.value)
    strategy, description = make_strategy(devices)
    replicas = f"{len(devices)} logical CPU replicas"
  widths = [int(w) for w in _LAYERS.value]
  step, scopes = make_step(strategy, widths, _BATCH_SIZE.value)
  if worker:
    # The other workers run the same steps (the collectives need them),
    # untraced.
    for _ in range(_WARMUP.value + 2 * _STEPS.value + 1):
      step()
    return 0
  with tempfile.TemporaryDirectory() as tmp:
    placement, space, untraced = traced_steps(
        step, _WARMUP.value, _STEPS.value, _LOGDIR.value or tmp)
  ops, step_ms, lengths = analyze(space, placement, scopes)
  if hasattr(strategy, "compression_stats"):
    stats = strategy.compression_stats()
    # What exchange="auto" picked, and what one sender puts on the wire.
    description += (f" ({stats['transport']}, "
                    f"{stats['sent_bits_per_element']:.2f} bits/element)")
  table = step_phases.phase_table(ops)
  overlap = step_phases.exchange_overlap(ops)
  chunks = sorted({o.chunk for o in ops if o.chunk is not None})
  params = scopes["parameters"]
  title = (f"{description}: one step of {step_ms:.1f} ms (median of "
           f"{len(lengths)} traced)\nMLP {'-'.join(map(str, widths))} "
           f"({params / 1e6:.2f}M parameters), {replicas}, batch "
           f"{_BATCH_SIZE.value}")
  render(ops, step_ms, title, _OUT.value)
  print("\n" + title.replace("\n", ", "))
  print("traced steps (ms): " + ", ".join(f"{t:.1f}" for t in lengths))
  print("the same steps untraced (ms): " + ", ".join(
      f"{t:.1f}" for t in untraced) + f"; median {statistics.median(untraced):.1f}"
      f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
  print(step_phases.format_table(table, step_ms))
  print(f"exchange chunks: {len(chunks) or 'not split'}; exchange time "
        f"overlapped with other chunks' encode/decode: {overlap:.1%}")
  link_ms, overlapped_ms = step_phases.backward_overlap(ops)
  backward_ms = step_phases.length(step_phases.union(
      [(o.start, o.end) for o in ops if o.phase == "backward"]))
  print(f"link time (the gradient exchange's collectives, launch to "
        f"completion): "
        f"{link_ms:.2f} ms, of which {overlapped_ms:.2f} ms "
        f"({overlapped_ms / link_ms if link_ms else 0:.1%}) during the "
        f"backward pass ({backward_ms:.2f} ms)")
  for label, phases in step_phases.chunk_rows(ops)[1:]:
    print(f"  {label}: " + ", ".join(
        f"{p} {min(a for a, _ in v):.1f}-{max(b for _, b in v):.1f} ms "
        f"({step_phases.length(v):.1f} busy)" for p, v in phases.items() if v))
  print(f"wrote {_OUT.value}")
  if worker is not None:
    # One more step with the others, which wait in it meanwhile: a worker
    # leaving the job first makes TF's coordination service fail the rest.
    step()
  return 0


if __name__ == "__main__":
  app.run(main)
