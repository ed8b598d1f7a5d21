r"""Accuracy against bits per element, on workloads where compression costs.

docs/results.md's paper protocol (plain SGD, decayed step) leaves every codec
but the non-adaptive nested one within 0.1 point of float32, so it cannot
tell them apart. This benchmark
trains two workloads whose recipes (benchmarks/accuracy_workloads.py: Adam
1e-3, constant step, modest batch) were fixed on float32 alone, before any
codec ran, and never tuned on one:

* `vision`: the Fashion-MNIST LeNet-style CNN, 4 epochs of all 60,000
  images at batch 128; test accuracy on 10,000 images.
* `chars`: a small character-level transformer on the Python standard
  library's sources split by file; bits per character on 131,072 held-out
  characters.

Every run: 4 replicas of `ndq_tf.MirroredStrategy` on one CPU split into 4
logical devices, one row of `ROWS` (a codec and its strategy options), one
seed (weights, batch order, dither). Each run writes one JSON to --runs_dir
as soon as it ends, named by a digest of its whole configuration
(workload, data, recipe, row, exchange, seed, replicas) and of the code
(the last git commit of ndq_tf/ and of these scripts, plus a digest of
their uncommitted changes): a rerun skips what exists, so an interrupted
grid continues, and a change to the code or a recipe runs again.

Recorded per run: the metric (the report pairs it with float32's at the
same seed); bits per element on the wire (every step's `sent_bits` of
`strategy.compression_stats()`, compressed and lossless elements), the
exchange that ran, the measured median step time, and the exchange's time
per step by the project's cost model (`ndq_tf.core.cost_model.
exchange_seconds`: bits over the link plus the CPU's decode work) for 4
worker processes at 100 Mbit/s and 1 Gbit/s (float32 and fp16 priced as
TF's float ring, the exchange a multi-worker job would give them).

`--report` reads only the run files and writes docs/accuracy_vs_bits.md and
its plot (benchmarks/accuracy_report.py). The whole grid (10 rows, 2
workloads, 3 seeds: 60 runs) takes about 2 hours on this 2-core machine at
the pace of its smoke runs (`STEP_SECONDS`), up to 4 when another job
shares the cores; the script prints its own estimate first and a new one
after every run.

The entropy-coded rows (`ndq_tf.EntropyCodedDitheredCodec`, issue #35:
`ecdq07`, `ecdq10`, `ecdq13`, `ecdq20`, rate targets of 0.7 to 2 bits
per element) are not in the default `--rows` either; the report names the
lowest of their rates at least as accurate as unrotated ternary DQSG.

The low-rank rows (`ndq_tf.PowerSGD`, issue #34: `psgd1`, `psgd4` with
float32 factors, `psgd1_dq`, `psgd4_dq` with DQSG M=3 factors, ternary DQSG
for the vectors and the warm-up) are not in the default `--rows`: name
them. Their warm-up (`start_step`) is the first 10% of each run's steps
(`WARM_UP_FRACTION`: 234 of vision's 2,340, 100 of chars' 1,000) unless
the row sets its own (`psgd4_w50`: 50%); `psgd8`, `psgd16`, `psgd32` and
`psgd4_w50` ask what closes rank 4's gap to float32, and `psgd4_fp32`
(float32 for the fallback tensors) how much of it the fallback's error
is. Their runs also record the bits per element after the warm-up and
the cost model's exchange at the low rank (the factors all-reduced, as
PyTorch's hook).

Examples:

  # smoke: tiny models, seconds per run, numbers meaningless
  python benchmarks/accuracy_vs_bits.py --tiny --seeds=0 \
      --rows=float32,dqsg1 --runs_dir=/tmp/avb
  python benchmarks/accuracy_vs_bits.py --report --runs_dir=/tmp/avb \
      --report_dir=/tmp/avb
  python benchmarks/accuracy_vs_bits.py            # the grid, resumable
  python benchmarks/accuracy_vs_bits.py --rows=psgd1,psgd4,psgd1_dq,psgd4_dq
  python benchmarks/accuracy_vs_bits.py --report   # the docs, from the runs
"""

import collections
import dataclasses
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

# benchmarks/*.py, next to this script.
import accuracy_report
import accuracy_workloads as workloads
import common

__all__ = ["Row", "ROWS", "DEFAULT_ROWS", "NUM_REPLICAS", "LINKS_GBPS",
           "WARM_UP_FRACTION", "warm_up_steps", "code_version", "run_key",
           "run_grid", "estimate_seconds"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)


@dataclasses.dataclass(frozen=True)
class Row:
  """One row of the table: a codec and the strategy options it runs with.

  Attributes:
    name: the row's key (file names, --rows).
    label: what the table and the plot call it.
    codec: an `ndq_tf.codecs.get` spec string.
    options: more `ndq_tf.MirroredStrategy` keywords (JSON values; a
      `reference_codec` as a spec string). `transport` defaults to
      `"all_gather"`, the exchange `"auto"` picks on one machine's CPU.
    priced_as: the exchange the cost model prices (default: the one that
      ran).
    low_rank: for an `ndq_tf.PowerSGD` row (`codec` `"powersgd"`), its
      keywords as (name, value) pairs, codecs as spec strings, without
      `start_step` (`low_rank_kwargs` adds it).
    default: whether the grid runs it when `--rows` is not given.
    warm_up: a low-rank row's warm-up, the fraction of the run's steps
      before the low rank starts (`WARM_UP_FRACTION` unless set).
  """
  name: str
  label: str
  codec: str
  options: tuple = ()
  priced_as: str = ""
  low_rank: tuple = ()
  default: bool = True
  warm_up: float = 0.0

  def strategy_kwargs(self):
    kwargs = {"transport": "all_gather"}
    kwargs.update(dict(self.options))
    return kwargs

  def low_rank_kwargs(self, steps):
    """`ndq_tf.PowerSGD`'s keywords for a run of `steps` steps, or None."""
    if not self.low_rank:
      return None
    return dict(self.low_rank,
                start_step=warm_up_steps(steps,
                                         self.warm_up or WARM_UP_FRACTION))


#: The low-rank rows' warm-up: this fraction of a run's steps sends every
#: tensor with the fallback codec before the low rank starts (PyTorch's
#: `start_powerSGD_iter`; issue #34: low rank needs a warm-up).
WARM_UP_FRACTION = 0.1


def warm_up_steps(steps, fraction=WARM_UP_FRACTION):
  """A low-rank row's `start_step` for a run of `steps` steps (>= 1)."""
  return max(1, int(steps * fraction))


def _psgd(name, rank, factor_codec, label, warm_up=0.0, fallback="dqsg"):
  percent = round(100 * (warm_up or WARM_UP_FRACTION))
  return Row(name, f"PowerSGD r={rank}{label}, warm-up {percent}%",
             "powersgd", priced_as="all_reduce", default=False,
             low_rank=(("rank", rank), ("factor_codec", factor_codec),
                       ("fallback_codec", fallback)), warm_up=warm_up)


def _ecdq(name, bits):
  return Row(name, f"ECDQ {bits:g} bits",
             f"ecdq:bits={bits:g},bucket_size=512", default=False)


_NESTED = (("reference_codec", "dqsg:num_levels=3,bucket_size=512"),
           ("reference_replicas", 2), ("adaptive", True))

#: The rows, one line each; a later codec (low-rank, entropy-coded) is one
#: more line. float32 must stay: the paired differences are against it.
ROWS = (
    Row("float32", "float32", "float32", priced_as="all_reduce"),
    Row("fp16", "fp16", "float16", priced_as="all_reduce"),
    Row("terngrad", "TernGrad", "terngrad:bucket_size=512"),
    Row("qsgd1", "QSGD s=1", "qsgd:num_levels=1,bucket_size=512"),
    Row("dqsg1", "DQSG M=1", "dqsg:num_levels=1,bucket_size=512"),
    Row("dqsg1r", "DQSG M=1, rotated",
        "dqsg:num_levels=1,bucket_size=512,rotation=hadamard"),
    Row("dqsg2r", "DQSG M=2, rotated",
        "dqsg:num_levels=2,bucket_size=512,rotation=hadamard"),
    Row("dqsg3", "DQSG M=3", "dqsg:num_levels=3,bucket_size=512"),
    Row("ndqsg33a", "NDQSG (3,3) adaptive",
        "ndqsg:num_levels=3,coarse_ratio=3,bucket_size=512", _NESTED),
    Row("dqsg1_rs", "DQSG M=1, reduce-scatter",
        "dqsg:num_levels=1,bucket_size=512",
        (("transport", "reduce_scatter"),)),
    # Low rank (#34), named by --rows: float32 factors (PyTorch's), then
    # DQSG M=3 factors; ternary DQSG for the vectors and the warm-up.
    _psgd("psgd1", 1, "float32", ""),
    _psgd("psgd4", 4, "float32", ""),
    _psgd("psgd1_dq", 1, "dqsg:num_levels=3", ", DQSG M=3 factors"),
    _psgd("psgd4_dq", 4, "dqsg:num_levels=3", ", DQSG M=3 factors"),
    # What closes rank 4's gap to float32 (#34): higher ranks, then a
    # longer warm-up (float32 factors).
    _psgd("psgd8", 8, "float32", ""),
    _psgd("psgd16", 16, "float32", ""),
    _psgd("psgd32", 32, "float32", ""),
    _psgd("psgd4_w50", 4, "float32", "", warm_up=0.5),
    # ... or the fallback codec's own error (vectors, small kernels, the
    # warm-up): float32 there.
    _psgd("psgd4_fp32", 4, "float32", ", float32 fallback",
          fallback="float32"),
    # Entropy-coded dithered quantization (#35), named by --rows: rotated
    # buckets of 512, the rate targets of `bits=` (the measured bits add
    # the scales and the coder's headers).
    _ecdq("ecdq07", 0.7),
    _ecdq("ecdq10", 1.0),
    _ecdq("ecdq13", 1.3),
    _ecdq("ecdq20", 2.0),
)
_BY_NAME = {r.name: r for r in ROWS}
#: What the grid runs without --rows.
DEFAULT_ROWS = tuple(r.name for r in ROWS if r.default)

NUM_REPLICAS = 4
#: Link rates of the cost model's columns, Gbit/s.
LINKS_GBPS = (0.1, 1.0)
#: Seconds per training step on this machine (2 cores, another job running),
#: above the medians of 25-step smoke runs of float32 and ternary DQSG
#: (vision 37 ms, chars 80 ms): rotation, M=3, the nested codec and the
#: reduce-scatter cost more. Only the printed estimate uses them.
STEP_SECONDS = {"vision": 0.06, "chars": 0.11}
#: Seconds per run besides its steps: building, tracing, evaluation.
RUN_OVERHEAD_SECONDS = {"vision": 15.0, "chars": 15.0}

_WORKLOADS = flags.DEFINE_list(
    "workloads", list(workloads.WORKLOADS),
    f"Workloads, a subset of {list(workloads.WORKLOADS)}.")
_ROWS = flags.DEFINE_list(
    "rows", list(DEFAULT_ROWS),
    f"Rows, a subset of {[r.name for r in ROWS]} (the low-rank ones only "
    "when named).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"],
                           "Seeds (weights, batch order, dither).")
_TINY = flags.DEFINE_bool(
    "tiny", False, "The smoke recipes of accuracy_workloads.TINY_RECIPES "
    "(seconds per run, numbers meaningless).")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Folder of Fashion-MNIST's four IDX files (default: "
    "the Debian package's /usr/share/datasets/fashion-mnist).")
_CORPUS_DIR = flags.DEFINE_string(
    "corpus_dir", None, "Folder whose *.py files are the chars corpus "
    "(default: the running Python's standard library).")
_RUNS_DIR = flags.DEFINE_string(
    "runs_dir", os.path.join(_REPO, "docs", "accuracy_vs_bits_runs"),
    "Folder of the per-run JSON files (in the repository, so that a later "
    "session resumes where this one stopped).")
_REPORT = flags.DEFINE_bool(
    "report", False, "Write the report from the run files and train nothing.")
_REPORT_DIR = flags.DEFINE_string(
    "report_dir", os.path.join(_REPO, "docs"),
    "Where accuracy_vs_bits.md and its PNG go.")
_STOP_AFTER = flags.DEFINE_float(
    "stop_after", 0, "Start no new run after this many seconds (0: no "
    "limit); the running one finishes.")


# -- Keys ---------------------------------------------------------------------

_CODE_PATHS = ("ndq_tf", "benchmarks/accuracy_vs_bits.py",
               "benchmarks/accuracy_workloads.py", "benchmarks/common.py",
               "benchmarks/datasets.py")


def code_version(repo=_REPO):
  """The last commit of ndq_tf/ and these scripts, plus uncommitted changes.

  `"<commit>"`, or `"<commit>+<digest>"` when the files differ from it (a
  digest of `git diff HEAD` and of untracked files' contents), or
  `"unknown"` outside a git checkout.
  """
  def git(*args):
    return subprocess.run(("git", "-C", repo) + args, capture_output=True,
                          check=True).stdout
  try:
    commit = git("log", "-1", "--format=%H", "--", *_CODE_PATHS).decode(
    ).strip() or "none"
    diff = git("diff", "HEAD", "--", *_CODE_PATHS)
    untracked = git("ls-files", "--others", "--exclude-standard", "--",
                    *_CODE_PATHS).decode().split()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  h = hashlib.sha256(diff)
  for path in sorted(p for p in untracked if p.endswith(".py")):
    with open(os.path.join(repo, path), "rb") as f:
      h.update(path.encode() + b"\0" + f.read())
  if diff or untracked:
    return f"{commit[:12]}+{h.hexdigest()[:10]}"
  return commit[:12]


def run_key(workload, recipe, row, seed, code, data=None):
  """`(config, digest)`: a run's whole configuration and its file key.

  `data`: what identifies the data (`accuracy_workloads.data_source`). A
  low-rank row's key holds its `ndq_tf.PowerSGD` keywords, `start_step`
  included.
  """
  row_config = {"name": row.name, "codec": row.codec,
                "options": row.strategy_kwargs()}
  if row.low_rank:
    row_config["low_rank"] = row.low_rank_kwargs(
        workloads.steps_of(workload, recipe))
  config = {
      "workload": workload,
      "data": data or {},
      "recipe": dataclasses.asdict(recipe),
      "row": row_config,
      "exchange": row.strategy_kwargs()["transport"],
      "seed": seed,
      "replicas": NUM_REPLICAS,
      "code": code,
  }
  text = json.dumps(config, sort_keys=True)
  return config, hashlib.sha256(text.encode()).hexdigest()[:16]


def run_path(runs_dir, workload, row, seed, digest):
  return os.path.join(runs_dir,
                      f"{workload}__{row.name}__seed{seed}__{digest}.json")


# -- One run ------------------------------------------------------------------

def make_strategy(row, seed, devices, steps):
  """The row's `ndq_tf.MirroredStrategy` on `devices`, for `steps` steps."""
  import ndq_tf  # pylint: disable=g-import-not-at-top
  kwargs = row.strategy_kwargs()  # Recorded under the names of release 0.1.
  kwargs["exchange"] = kwargs.pop("transport")
  if "reference_replicas" in kwargs:
    kwargs["reference_group"] = kwargs.pop("reference_replicas")
  if "reference_codec" in kwargs:
    kwargs["reference_codec"] = ndq_tf.codecs.get(kwargs["reference_codec"])
  low_rank = row.low_rank_kwargs(steps)
  codec = (ndq_tf.PowerSGD(**low_rank) if low_rank
           else ndq_tf.codecs.get(row.codec))
  return ndq_tf.MirroredStrategy(codec=codec, devices=devices, seed=seed,
                                 **kwargs)


def _recorder(keras, strategy, first_step=None):
  """A callback summing every step's telemetry and timing the steps.

  Under a low-rank codec, `warm_up` sums the steps of the warm-up (the
  telemetry's `rank` 0: the fallback codec alone) and `steady` the others.
  `first_step(stats)`, if given, is called with the first step's telemetry
  (a check that fails the run there rather than at its end).
  """

  class Recorder(keras.callbacks.Callback):

    def __init__(self):
      super().__init__()
      self.sums = collections.Counter()
      self.warm_up = collections.Counter()
      self.steady = collections.Counter()
      self.step_seconds = []
      self.last = None
      self._t = None

    def on_train_begin(self, logs=None):
      self._t = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
      now = time.perf_counter()
      self.step_seconds.append(now - self._t)
      self._t = now
      s = strategy.compression_stats()
      if s["exchange_count"] != len(self.step_seconds):
        raise RuntimeError(
            f"{s['exchange_count']} compressed exchanges after "
            f"{len(self.step_seconds)} steps: the gradient aggregation was "
            "not compressed every step.")
      elements = s["compressed_elements"] + s["lossless_elements"]
      self.sums["sent_bits"] += s["sent_bits"]
      self.sums["element_sends"] += elements * s["local_senders"]
      if first_step is not None and len(self.step_seconds) == 1:
        first_step(s)
      if "rank" in s:
        part = self.steady if s["rank"] else self.warm_up
        part["steps"] += 1
        part["sent_bits"] += s["sent_bits"]
        part["element_sends"] += elements * s["local_senders"]
        if s["rank"]:
          self.steady["low_rank_fraction"] = s["low_rank_fraction"]
          self.steady["rank"] = s["rank"]
      self.last = s

  return Recorder()


def _rounds_ms(rounds, name, lossless_elements):
  """{link Gbit/s: ms} of exchanges `[(codecs, elements)]` named `name`."""
  from ndq_tf import theory  # pylint: disable=g-import-not-at-top
  from ndq_tf.core import cost_model  # pylint: disable=g-import-not-at-top
  out = {}
  for gbps in LINKS_GBPS:
    seconds = sum(cost_model.exchange_seconds(codecs, n, NUM_REPLICAS, name,
                                              link_gbps=gbps)
                  for codecs, n in rounds if n)
    # The small tensors travel beside the payload as a float32 ring.
    seconds += theory.ring_all_reduce_bits(
        32 * lossless_elements, NUM_REPLICAS) / (gbps * 1e9)
    out[f"{gbps:g}"] = 1e3 * seconds
  return out


def _low_rank_rounds(config, shapes, min_elements, compressed_elements):
  """`[(codec, elements)]` of a low-rank step: fallback, `P`, `Q` rounds.

  From `ndq_tf.core.low_rank.Layout` of the compressed tensors (those of
  at least `min_elements`); checked against the telemetry's count.
  """
  from ndq_tf.core import low_rank  # pylint: disable=g-import-not-at-top
  layout = low_rank.Layout(
      [s for s in shapes if math.prod(s) >= min_elements], config)
  if layout.num_elements != compressed_elements:
    raise RuntimeError(
        f"The low-rank layout counts {layout.num_elements} compressed "
        f"elements, the telemetry {compressed_elements}: the model's "
        "exchange would be mispriced.")
  return [
      (config.fallback_codec, layout.num_elements - layout.low_rank_elements),
      (config.factor_codec, sum(m.rows * m.rank for m in layout.matrices)),
      (config.factor_codec, sum(m.cols * m.rank for m in layout.matrices))]


def _model_exchange_ms(row, strategy, stats, rounds, warm_up_steps):
  """`(name, mean, steady)`: one step's exchange among NUM_REPLICAS workers.

  `mean` and `steady` are {link Gbit/s: ms}: `mean` over the run's steps;
  for a low-rank row (`rounds` from `_low_rank_rounds`), `steady` is a
  low-rank step's and the `warm_up_steps` are priced as the fallback codec
  on every tensor; otherwise (`rounds` None) `steady` is None.
  """
  options = strategy.compressed_all_reduce.options
  name = row.priced_as or stats["transport"]
  n = stats["compressed_elements"]
  lossless = stats["lossless_elements"]
  full = _rounds_ms([(options.sender_codecs(NUM_REPLICAS), n)], name,
                    lossless)
  if rounds is None:
    return name, full, None
  steady = _rounds_ms([([codec] * NUM_REPLICAS, elements)
                       for codec, elements in rounds], name, lossless)
  steps = stats["exchange_count"]
  mean = {k: (warm_up_steps * full[k] + (steps - warm_up_steps) * steady[k])
          / steps for k in full}
  return name, mean, steady


def train_one(workload, recipe, row, seed, devices, data):
  """Trains one run; returns what its JSON holds besides the key."""
  import keras  # pylint: disable=g-import-not-at-top
  keras.backend.clear_session()
  strategy = make_strategy(row, seed, devices,
                           workloads.steps_of(workload, recipe))
  keras.utils.set_random_seed(seed)
  with strategy.scope():
    model = workloads.build_model(keras, workload, recipe)
  options = strategy.compressed_all_reduce.options
  rounds = []  # A low-rank step's, priced from the first step's counts.

  def price_low_rank(stats):
    if options.low_rank is not None:
      rounds.extend(_low_rank_rounds(
          options.low_rank, [list(v.shape) for v in model.trainable_variables],
          options.min_elements, stats["compressed_elements"]))

  recorder = _recorder(keras, strategy, price_low_rank)
  start = time.perf_counter()
  workloads.fit(model, workload, recipe, data, seed, [recorder])
  train_seconds = time.perf_counter() - start
  metric = workloads.evaluate(model, workload, recipe, data)
  stats = recorder.last
  priced, model_ms, steady_ms = _model_exchange_ms(
      row, strategy, stats, rounds or None, recorder.warm_up["steps"])
  steps = recorder.step_seconds
  later = steps[len(steps) // 10:] or steps
  result = {
      "metric": metric,
      "metric_name": workloads.METRICS[workload][0],
      "label": row.label,
      "row_order": [r.name for r in ROWS].index(row.name),
      "transport": stats["transport"],
      "priced_as": priced,
      "bits_per_element": recorder.sums["sent_bits"] / recorder.sums[
          "element_sends"],
      "compressed_elements": stats["compressed_elements"],
      "lossless_elements": stats["lossless_elements"],
      "parameters": int(sum(math.prod(v.shape)
                            for v in model.trainable_variables)),
      "steps": len(steps),
      "median_step_ms": 1e3 * statistics.median(later),
      "train_seconds": train_seconds,
      "model_exchange_ms": model_ms,
  }
  if steady_ms is not None:  # Low rank: the warm-up, and what follows it.
    warm_up, steady = recorder.warm_up, recorder.steady

    def bits(sums):
      return (sums["sent_bits"] / sums["element_sends"]
              if sums["element_sends"] else None)

    result.update(
        warm_up_steps=warm_up["steps"],
        warm_up_bits_per_element=bits(warm_up),
        steady_bits_per_element=bits(steady),
        steady_model_exchange_ms=steady_ms,
        rank=steady["rank"], low_rank_fraction=steady["low_rank_fraction"])
  return result


def write_json(path, result):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(result, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


# -- The grid -----------------------------------------------------------------

def estimate_seconds(workload, recipe, runs):
  """Seconds `runs` runs of `workload` take by STEP_SECONDS' constants."""
  steps = workloads.steps_of(workload, recipe)
  return runs * (steps * STEP_SECONDS[workload]
                 + RUN_OVERHEAD_SECONDS[workload])


def load_data(workload, recipe, data_dir=None, corpus_dir=None):
  """The workload's data (`accuracy_workloads`) and a one-line description."""
  if workload == "vision":
    data = workloads.load_fashion_mnist(data_dir, recipe)
    return data, (f"Fashion-MNIST: {len(data[0][0]):,} training, "
                  f"{len(data[1][0]):,} test images")
  train, test, description = workloads.load_chars(corpus_dir, recipe)
  return (train, test), (f"{description}; {len(train):,} training, "
                         f"{len(test) - 1:,} test characters")


def run_grid(workload_names, row_names, seeds, devices, runs_dir, recipes,
             data_dir=None, corpus_dir=None, stop_after=0.0, log=print):
  """Trains every missing (workload, row, seed); one JSON each.

  Args:
    workload_names: keys of `recipes`.
    row_names: names of `ROWS`.
    seeds: ints.
    devices: NUM_REPLICAS device names.
    runs_dir: folder of the run files.
    recipes: {workload: recipe}, e.g. `accuracy_workloads.RECIPES`.
    data_dir, corpus_dir: see the flags.
    stop_after: start no run after this many seconds (0: no limit).
    log: a print function.

  Returns:
    `{"trained": [paths], "skipped": [paths], "not_started": int}`.

  Raises:
    ValueError: for an unknown workload or row, or not NUM_REPLICAS
      devices, naming the value received.
  """
  unknown = [w for w in workload_names if w not in recipes]
  if unknown:
    raise ValueError(f"`workloads` must be among {list(recipes)}. "
                     f"Received: {unknown}")
  unknown = [r for r in row_names if r not in _BY_NAME]
  if unknown:
    raise ValueError(f"`rows` must be among {list(_BY_NAME)}. Received: "
                     f"{unknown}")
  if len(devices) != NUM_REPLICAS:
    raise ValueError(f"`devices` must name {NUM_REPLICAS} devices. "
                     f"Received: devices={devices!r}")
  code = code_version()
  out = {"trained": [], "skipped": [], "not_started": 0}
  todo = collections.OrderedDict()
  for workload in workload_names:
    recipe = recipes[workload]
    todo[workload] = []
    for seed in seeds:
      for name in row_names:
        row = _BY_NAME[name]
        config, digest = run_key(
            workload, recipe, row, seed, code,
            workloads.data_source(workload, data_dir, corpus_dir))
        path = run_path(runs_dir, workload, row, seed, digest)
        if os.path.exists(path):
          out["skipped"].append(path)
        else:
          todo[workload].append((row, seed, config, path))
  guesses = {w: estimate_seconds(w, recipes[w], len(runs))
             for w, runs in todo.items()}
  log(f"Code {code}; runs in {runs_dir}: {len(out['skipped'])} found, "
      f"{sum(map(len, todo.values()))} to train, about "
      f"{sum(guesses.values()) / 3600:.1f} h ("
      + ", ".join(f"{w} {len(todo[w])} runs {guesses[w] / 60:.0f} min at "
                  f"{STEP_SECONDS[w] * 1e3:.0f} ms per step"
                  for w in todo)
      + "; the pace of this machine's smoke runs)")
  start = time.monotonic()
  for workload, runs in todo.items():
    if not runs:
      continue
    recipe = recipes[workload]
    data, description = load_data(workload, recipe, data_dir, corpus_dir)
    log(f"[{workload}] {description}")
    for i, (row, seed, config, path) in enumerate(runs):
      if stop_after and time.monotonic() - start > stop_after:
        out["not_started"] += len(runs) - i
        log(f"[{workload}] stop_after={stop_after:g}s reached: "
            f"{len(runs) - i} run(s) not started.")
        break
      t = time.monotonic()
      result = train_one(workload, recipe, row, seed, devices, data)
      result.update(config=config, finished_utc=time.strftime(
          "%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
      write_json(path, result)
      out["trained"].append(path)
      took = time.monotonic() - t
      left = len(runs) - i - 1
      log(f"[{workload} {row.name} seed {seed}] "
          f"{result['metric_name']} {result['metric']:.4f}, "
          f"{result['bits_per_element']:.3f} bits/element"
          + (f" ({result['steady_bits_per_element']:.3f} after the warm-up)"
             if result.get("steady_bits_per_element") is not None else "")
          + f" ({result['transport']}), {took:.0f} s; {left} left in this "
          f"workload, about {left * took / 60:.0f} min at this pace")
  return out


def main(argv):
  del argv  # Unused.
  logging.set_verbosity(logging.WARNING)
  if _REPORT.value:
    paths = accuracy_report.write_report(_RUNS_DIR.value, _REPORT_DIR.value)
    print("Wrote " + ", ".join(paths))
    return 0
  recipes = workloads.TINY_RECIPES if _TINY.value else workloads.RECIPES
  devices = common.split_cpu(NUM_REPLICAS)
  try:
    run_grid(_WORKLOADS.value, _ROWS.value, [int(s) for s in _SEEDS.value],
             devices, _RUNS_DIR.value, recipes, _DATA_DIR.value,
             _CORPUS_DIR.value, _STOP_AFTER.value,
             log=lambda m: print(m, flush=True))
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"Rebuild the report with: python {os.path.relpath(__file__)} "
        f"--report --runs_dir={_RUNS_DIR.value}")
  return 0


if __name__ == "__main__":
  app.run(main)
