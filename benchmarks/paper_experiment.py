r"""Abdi & Fekri's experiment (arXiv 1904.01197) on ndq_tf.MirroredStrategy.

A LeNet-style CNN (5x5 conv 32 -> 2x2 max-pool -> 5x5 conv 64 -> 2x2
max-pool -> dense 512 -> softmax 10) trained on Fashion-MNIST (or MNIST)
with a total batch of 200 split over 4 replicas (logical CPU devices when
there is no GPU), 5 epochs of plain SGD at learning rate 0.01 decayed x0.9
per epoch, once per gradient codec:

  float32    Float32Codec (the uncompressed reference, same code path)
  fp16       Float16Codec
  dqsg1      DitheredCodec(num_levels=1, bucket_size=512)  (ternary codes)
  dqsg3      DitheredCodec(num_levels=3, bucket_size=512)  (7 symbols)
  ndqsg33    NestedDitheredCodec(num_levels=3, coarse_ratio=3), half of the
             replicas in the reference group sending DQSG num_levels=3
  ndqsg33a   the same in the automatic mode (adaptive=True): steps from
             each nested sender's own noise, DQSG fallback where nesting
             would not pay
  ndqsg33a_p1  the automatic mode with one replica in the reference group
  qsgd       QSGDCodec(num_levels=1, bucket_size=512)
  terngrad   TernGradCodec(bucket_size=512)

Each (run, seed) writes one JSON to --output_dir (default
docs/results_runs/) as soon as it finishes; with --resume, those that exist
(same data set, epochs and train subset) are skipped, so an interrupted sweep
continues where it stopped. benchmarks/paper_report.py aggregates the JSONs
into docs/results.md and the plots docs/results_accuracy_vs_step.png and
docs/results_accuracy_vs_bits.png; this script only trains.

Recorded per run: test accuracy after every epoch (full test set) and every
--eval_every steps (the first --eval_examples test images), final test
accuracy, wire bits per gradient element and wire bytes relative to float32
from the telemetry of every step's gradient exchange
(`strategy.compression_stats()`: `sent_bits`, `payload_bits`,
`compressed_elements`, `lossless_elements`), each sender's payload bits
(`sender_bits_last_step`: the fusion plan's `wire_words` for the sender's
codec, checked against `payload_bits`), with nested codecs the means over
the steps of `overload_probability`, `fallback_fraction` and
`overload_rate` (this one over the steps that sent some element nested),
training wall time (evaluation excluded) and median step time. The script
stops if a step's gradient aggregation was not compressed.

Nothing is downloaded: the data set files are linked into a private
KERAS_HOME (see benchmarks/datasets.py) before Keras is imported.

Examples:

  # smoke test: 2,000 images, 1 epoch, two codecs
  python benchmarks/paper_experiment.py --train_subset=2000 --epochs=1 \
      --runs=float32,dqsg1 --output_dir=/tmp/paper_smoke
  # the protocol, one seed, resumable
  python benchmarks/paper_experiment.py --seeds=0 --resume
  # then rebuild docs/results.md and the plots from the JSONs
  python benchmarks/paper_report.py
"""

import collections
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import numpy as np

# benchmarks/*.py, next to this script.
import common
import datasets
import paper_runs
from paper_runs import RUNS

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_RUNS = flags.DEFINE_list("runs", list(RUNS),
                          f"Runs, a subset of {list(RUNS)}.")
_SEEDS = flags.DEFINE_list(
    "seeds", ["0"], "Seeds (weights, shuffling and dither), e.g. 0,1,2.")
_EPOCHS = flags.DEFINE_integer("epochs", 5, "Training epochs.")
_TRAIN_SUBSET = flags.DEFINE_integer(
    "train_subset", 0,
    "Train on this many training images (a fixed random subset, the same for "
    "every run and seed); 0: all of them.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 200, "Total batch size, split over the replicas.")
_REPLICAS = flags.DEFINE_integer("replicas", 4, "Replicas.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.01, "SGD step size.")
_DECAY = flags.DEFINE_float("decay", 0.9,
                            "Learning rate factor applied after each epoch.")
_PADDING = flags.DEFINE_enum(
    "padding", "valid", ["valid", "same"],
    "Padding of the two conv layers (valid: LeNet-5's; 3.3M fewer dense "
    "weights than same).")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every", 50, "Test accuracy on --eval_examples images every this "
    "many steps (for the accuracy-vs-step plot); 0: only per epoch.")
_EVAL_EXAMPLES = flags.DEFINE_integer(
    "eval_examples", 2000, "Test images of the per-step evaluations.")
_DATASET = flags.DEFINE_enum("dataset", "fashion_mnist",
                             ["fashion_mnist", "mnist"], "Data set.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None,
    "Folder with the data set's files (default: the Debian package's "
    "/usr/share/datasets/fashion-mnist; for MNIST, mnist.npz in an existing "
    "Keras cache).")
_KERAS_HOME = flags.DEFINE_string(
    "keras_home", None,
    "Private KERAS_HOME the files are linked into (default: a folder in "
    "the system's temporary directory).")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir",
    os.path.join(_REPO, "docs", "results_runs"),
    "Folder of the per-(run, seed) JSON files (in the repository, so that a "
    "later session resumes where this one stopped).")
_RESUME = flags.DEFINE_bool(
    "resume", False, "Skip (run, seed) pairs whose JSON already exists.")
_STOP_AFTER = flags.DEFINE_float(
    "stop_after", 0, "Launch no new run after this many seconds (0: no "
    "limit); the running one finishes.")


# -- Configuration -------------------------------------------------------------

def config_key():
  """The part of a result's identity besides run and seed."""
  n = _TRAIN_SUBSET.value or "all"
  key = f"{_DATASET.value}_e{_EPOCHS.value}_n{n}"
  if _PADDING.value != "valid":
    key += f"_{_PADDING.value}"
  return key


def result_path(run, seed):
  return os.path.join(_OUTPUT_DIR.value,
                      f"{config_key()}__{run}__seed{seed}.json")


def split_devices(replicas):
  """GPUs when there are enough, else logical CPU devices.

  Must run before TF initializes.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_physical_devices("GPU")
  if len(gpus) >= replicas:
    return [f"/gpu:{i}" for i in range(replicas)]
  return common.split_cpu(replicas)


def make_strategy(run, seed, devices):
  """The `ndq_tf.MirroredStrategy` of one run of `RUNS`."""
  import ndq_tf  # pylint: disable=g-import-not-at-top
  _, spec, reference = RUNS[run]
  kwargs = {"seed": seed}
  if reference is not None:
    kwargs["reference_codec"] = ndq_tf.codecs.get(reference)
    kwargs["reference_group"] = paper_runs.reference_replicas(
        run, len(devices))
    kwargs["adaptive"] = run in paper_runs.ADAPTIVE_RUNS
  return ndq_tf.MirroredStrategy(codec=ndq_tf.codecs.get(spec),
                                 devices=devices, **kwargs)


def build_model(keras, input_shape):
  pad = _PADDING.value
  return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Conv2D(32, 5, padding=pad, activation="relu"),
      keras.layers.MaxPooling2D(2),
      keras.layers.Conv2D(64, 5, padding=pad, activation="relu"),
      keras.layers.MaxPooling2D(2),
      keras.layers.Flatten(),
      keras.layers.Dense(512, activation="relu"),
      keras.layers.Dense(10, activation="softmax"),
  ])


# -- One run -------------------------------------------------------------------

def _make_recorder(keras, model, strategy, x_eval, y_eval, x_test, y_test,
                   eval_every):
  """A callback recording accuracy, telemetry and step times."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from ndq_tf.core import fusion  # pylint: disable=g-import-not-at-top

  options = strategy.compressed_all_reduce.options

  def sender_bits(stats):
    """Payload bits of every sender, in sender order (reference group first).

    From the fusion plan of the gradients that were compressed (floating, at
    least `min_elements` elements: the trainable variables' shapes) and each
    sender's codec; checked against the telemetry of the same exchange.
    """
    codecs = options.sender_codecs(stats["senders"])
    compressed = [v for v in model.trainable_variables
                  if tf.as_dtype(v.dtype).is_floating
                  and int(np.prod(v.shape)) >= options.min_elements]
    plan = fusion.FusionPlan.from_tensors(compressed, codecs[0].bucket_size)
    bits = [32 * plan.wire_words(c) for c in codecs]
    if (plan.num_elements != stats["compressed_elements"]
        or sum(bits) != stats["payload_bits"]):
      raise RuntimeError(
          f"Per-sender payloads {bits} of {plan.num_elements} elements do "
          f"not match the telemetry: payload_bits={stats['payload_bits']}, "
          f"compressed_elements={stats['compressed_elements']}.")
    return bits

  @tf.function
  def predict(x):
    return tf.argmax(model(x, training=False), axis=-1, output_type=tf.int32)

  def accuracy(x, y):
    correct = 0
    for i in range(0, len(x), 1000):
      correct += int(np.sum(predict(x[i:i + 1000]).numpy() == y[i:i + 1000]))
    return correct / len(x)

  class Recorder(keras.callbacks.Callback):
    """Records everything the JSON holds, timing evaluation apart."""

    def __init__(self):
      super().__init__()
      self.step = 0
      self.eval_seconds = 0.0
      self.step_seconds = []
      self.step_curve = []   # (step, accuracy on the eval subset)
      self.epoch_curve = []  # (epoch, step, test accuracy, train loss)
      self.sums = collections.Counter()
      self.sender_bits = None
      self._t = None

    def _eval(self, x, y):
      t = time.perf_counter()
      acc = accuracy(x, y)
      self.eval_seconds += time.perf_counter() - t
      return acc

    def on_train_begin(self, logs=None):
      if eval_every:
        self.step_curve.append((0, self._eval(x_eval, y_eval)))
      self._t = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
      # Step time: from the end of one step to the end of the next, the
      # evaluations left out. (Measured from on_train_batch_begin it would
      # miss the work TF still runs asynchronously after the call returns.)
      now = time.perf_counter()
      self.step_seconds.append(now - self._t)
      self.step += 1
      # The telemetry of this step's gradient exchange (one per step:
      # ndq_tf.core.telemetry): bits sent by all replicas (payloads
      # and the small tensors sent losslessly, once per replica).
      s = strategy.compression_stats()
      if s["exchange_count"] != self.step:
        raise RuntimeError(
            f"{s['exchange_count']} compressed exchanges after "
            f"{self.step} steps: the gradient aggregation was not "
            "compressed every step.")
      element_sends = ((s["compressed_elements"] + s["lossless_elements"])
                       * s["local_senders"])
      self.sums["wire_bits"] += s["sent_bits"]
      self.sums["float32_bits"] += 32 * element_sends
      self.sums["compressed_bits"] += s["payload_bits"]
      self.sums["element_sends"] += element_sends
      self.sums["compressed_element_sends"] += (
          s["compressed_elements"] * s["local_senders"])
      self.sums["steps"] += 1
      if "overload_probability" in s:  # nested codecs
        for key in ("overload_probability", "fallback_fraction"):
          if math.isfinite(s[key]):
            self.sums[key] += s[key]
            self.sums[key + "_n"] += 1
        # overload_rate is 0 when no element was sent nested: such steps
        # (every bucket fell back to DQSG) do not enter its mean.
        if s["nested_elements"] and math.isfinite(s["overload_rate"]):
          self.sums["overload_rate"] += s["overload_rate"]
          self.sums["overload_rate_n"] += 1
      if self.sender_bits is None:  # static: shapes and codecs
        self.sender_bits = sender_bits(s)
      if eval_every and self.step % eval_every == 0:
        self.step_curve.append((self.step, self._eval(x_eval, y_eval)))
        now = time.perf_counter()
      self._t = now

    def on_epoch_end(self, epoch, logs=None):
      acc = self._eval(x_test, y_test)
      self._t = time.perf_counter()
      loss = float((logs or {}).get("loss", float("nan")))
      self.epoch_curve.append((epoch + 1, self.step, acc, loss))
      print(f"  epoch {epoch + 1}: test accuracy {acc:.4f}, train loss "
            f"{loss:.4f}, step {self.step}", flush=True)

  return Recorder()


def train_one(run, seed, devices, data):
  """Trains one (run, seed); returns its result dict."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top

  (x_train, y_train), (x_test, y_test) = data
  keras.backend.clear_session()
  strategy = make_strategy(run, seed, devices)
  keras.utils.set_random_seed(seed)
  steps_per_epoch = len(x_train) // _BATCH_SIZE.value
  with strategy.scope():
    model = build_model(keras, x_train.shape[1:])
    schedule = keras.optimizers.schedules.ExponentialDecay(
        _LEARNING_RATE.value, decay_steps=steps_per_epoch,
        decay_rate=_DECAY.value, staircase=True)
    model.compile(keras.optimizers.SGD(schedule),
                  keras.losses.SparseCategoricalCrossentropy(),
                  metrics=["accuracy"])
  num_params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
  recorder = _make_recorder(
      keras, model, strategy, x_test[:_EVAL_EXAMPLES.value],
      y_test[:_EVAL_EXAMPLES.value], x_test, y_test, _EVAL_EVERY.value)
  start = time.perf_counter()
  model.fit(x_train, y_train, batch_size=_BATCH_SIZE.value,
            epochs=_EPOCHS.value, shuffle=True, verbose=0,
            callbacks=[ndq_tf.CompressionStats(), recorder])
  total = time.perf_counter() - start
  sums = recorder.sums
  steps = recorder.step_seconds
  later = steps[steps_per_epoch:] or steps[1:] or steps
  description, spec, reference = RUNS[run]
  return {
      "run": run,
      "description": description,
      "codec": spec,
      "reference_codec": reference,
      "reference_replicas": paper_runs.reference_replicas(run, len(devices)),
      "seed": seed,
      "config": config_key(),
      "dataset": _DATASET.value,
      "train_examples": int(len(x_train)),
      "test_examples": int(len(x_test)),
      "epochs": _EPOCHS.value,
      "batch_size": _BATCH_SIZE.value,
      "replicas": len(devices),
      "devices": list(devices),
      "learning_rate": _LEARNING_RATE.value,
      "decay": _DECAY.value,
      "padding": _PADDING.value,
      "parameters": num_params,
      "steps": recorder.step,
      "steps_per_epoch": steps_per_epoch,
      "eval_every": _EVAL_EVERY.value,
      "eval_examples": min(_EVAL_EXAMPLES.value, len(x_test)),
      "epoch_curve": [
          {"epoch": e, "step": s, "test_accuracy": a, "train_loss": l}
          for e, s, a, l in recorder.epoch_curve],
      "step_curve": [{"step": s, "eval_accuracy": a}
                     for s, a in recorder.step_curve],
      "final_test_accuracy": recorder.epoch_curve[-1][2],
      "wire_bits_per_element": (sums["wire_bits"] / sums["element_sends"]
                                if sums["element_sends"] else float("nan")),
      "compressed_bits_per_element": (
          sums["compressed_bits"] / sums["compressed_element_sends"]
          if sums["compressed_element_sends"] else float("nan")),
      "compressed_fraction": (sums["compressed_element_sends"] /
                              sums["element_sends"]
                              if sums["element_sends"] else float("nan")),
      "relative_wire_bytes": (sums["wire_bits"] / sums["float32_bits"]
                              if sums["float32_bits"] else float("nan")),
      "sender_bits_last_step": recorder.sender_bits,
      "mean_overload_probability": (
          sums["overload_probability"] / sums["overload_probability_n"]
          if sums["overload_probability_n"] else None),
      "mean_fallback_fraction": (
          sums["fallback_fraction"] / sums["fallback_fraction_n"]
          if sums["fallback_fraction_n"] else None),
      # Counted by the nested senders (ground truth), mean over the steps
      # with at least one nested bucket.
      "mean_overload_rate": (
          sums["overload_rate"] / sums["overload_rate_n"]
          if sums["overload_rate_n"] else None),
      "adaptive": run in paper_runs.ADAPTIVE_RUNS,
      "wire_bytes_per_step_per_replica": (
          sums["wire_bits"] / 8 / max(sums["steps"], 1) / len(devices)),
      "wall_seconds_total": total,
      "eval_seconds": recorder.eval_seconds,
      "train_seconds": total - recorder.eval_seconds,
      "median_step_ms": 1000 * statistics.median(later),
      "first_step_seconds": steps[0],
      "p90_step_ms": 1000 * float(np.percentile(later, 90)),
      "mean_step_ms": 1000 * statistics.mean(later),
      "tensorflow": tf.__version__,
      "keras": keras.__version__,
      "host": platform.node(),
      "cpus": os.cpu_count(),
      "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }


def write_json(path, result):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(result, f, indent=1)
  os.replace(tmp, path)


def load_data():
  (x_train, y_train), (x_test, y_test) = datasets.load(_DATASET.value)
  if _TRAIN_SUBSET.value:
    rng = np.random.default_rng(1234)
    keep = np.sort(rng.permutation(len(x_train))[:_TRAIN_SUBSET.value])
    x_train, y_train = x_train[keep], y_train[keep]
  n = len(x_train) // _BATCH_SIZE.value * _BATCH_SIZE.value
  return (x_train[:n], y_train[:n]), (x_test, y_test)


def train_all():
  """Trains every requested (seed, run) pair, writing one JSON each."""
  unknown = [r for r in _RUNS.value if r not in RUNS]
  if unknown:
    raise app.UsageError(f"Unknown runs {unknown}; choose from {list(RUNS)}.")
  if _BATCH_SIZE.value % _REPLICAS.value:
    raise app.UsageError("--batch_size must be a multiple of --replicas.")
  keras_home = _KERAS_HOME.value or os.path.join(tempfile.gettempdir(),
                                                 "ndq_tf_keras_home")
  source = datasets.prepare_keras_home(_DATASET.value, _DATA_DIR.value,
                                       keras_home)
  devices = split_devices(_REPLICAS.value)
  data = load_data()
  print(f"{_DATASET.value} (from {source}): {len(data[0][0])} train / "
        f"{len(data[1][0])} test images; {len(devices)} replicas "
        f"{devices}; batch {_BATCH_SIZE.value}; {_EPOCHS.value} epochs; "
        f"config {config_key()}; results in {_OUTPUT_DIR.value}", flush=True)
  start = time.time()
  for seed in [int(s) for s in _SEEDS.value]:
    for run in _RUNS.value:
      path = result_path(run, seed)
      if _RESUME.value and os.path.exists(path):
        print(f"[{run} seed {seed}] done already ({path}); skipped.",
              flush=True)
        continue
      if _STOP_AFTER.value and time.time() - start > _STOP_AFTER.value:
        print(f"[{run} seed {seed}] not started: --stop_after="
              f"{_STOP_AFTER.value:g}s reached.", flush=True)
        continue
      print(f"[{run} seed {seed}] training ...", flush=True)
      result = train_one(run, seed, devices, data)
      write_json(path, result)
      print(f"[{run} seed {seed}] test accuracy "
            f"{result['final_test_accuracy']:.4f}, "
            f"{result['wire_bits_per_element']:.3f} bits/element, "
            f"{result['relative_wire_bytes']:.4f} x float32 bytes, "
            f"train {result['train_seconds']:.0f} s "
            f"({result['median_step_ms']:.0f} ms/step) -> {path}", flush=True)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  try:
    train_all()
  except FileNotFoundError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"Rebuild the report with: python benchmarks/paper_report.py "
        f"--runs_dir={_OUTPUT_DIR.value}")
  return 0


if __name__ == "__main__":
  app.run(main)
