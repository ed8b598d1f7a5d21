r"""Step time of ndq_tf.MirroredStrategy per codec against float32, one run.

Trains an MLP with `strategy.run` + `optimizer.apply_gradients` on replicas
that are logical CPU devices (default 4), first with TensorFlow's own
float32 all-reduce (its default for CPUs, a collective ring, and
`ReductionToOneDevice`, the fallback of `CompressedAllReduce`), then through
`ndq_tf.MirroredStrategy` with each codec, and prints the median step time,
its ratio to float32, the wire bits per gradient element
(`sent_bits_per_element` of `strategy.compression_stats()`) and the
compressed exchanges counted (`exchange_count`). The optimizer's gradient
all-reduce is compressed by default, one exchange per step (warm-up
included); the script stops if a configuration did not compress every step.

On logical CPU devices bandwidth is free (a copy is a memcpy), so the ratio
measures the pure compute overhead of compression: encode on every sender,
decode of every sender on every replica. The issue's goal is <= 1.5x.

Example:

  python benchmarks/mirrored_step.py --steps=30 --codec=dqsg:num_levels=1
"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import tensorflow as tf

import common  # benchmarks/common.py, next to this script

_CODECS = flags.DEFINE_multi_string(
    "codec", ["float32", "dqsg:num_levels=1", "dqsg:num_levels=3", "qsgd",
              "terngrad"],
    "ndq_tf codec spec (repeatable), as for ndq_tf.codecs.get.")
_REPLICAS = flags.DEFINE_integer("replicas", 4, "Logical CPU replicas.")
_STEPS = flags.DEFINE_integer("steps", 30, "Timed steps per configuration.")
_WARMUP = flags.DEFINE_integer("warmup", 5,
                               "Untimed steps first (tracing, compilation).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Global batch size.")
_LAYERS = flags.DEFINE_list("layers", ["784", "1024", "512", "10"],
                            "MLP layer widths, input first.")
_STEPS_PER_ROUND = 5
_MIN_ELEMENTS = flags.DEFINE_integer(
    "min_elements", None, "CompressedAllReduce min_elements (default: its).")
_CHUNKS = flags.DEFINE_list(
    "chunk_elements", ["default"],
    "CompressedAllReduce chunk_elements to compare, each an integer, none "
    "(one chunk) or default (the library's); every codec runs with each.")
_TRANSPORT = flags.DEFINE_string(
    "transport", None, "CompressedAllReduce transport (default: its).")
_ADAPTIVE = flags.DEFINE_bool(
    "adaptive", False,
    "Nested codecs (ndqsg...): the automatic mode. They get half the "
    "replicas as reference group, sending dqsg:num_levels=3.")


def make_step(strategy, widths):
  """Builds the model on `strategy`; returns (run one step, parameters)."""
  model, optimizer, loss_fn, x, y = common.synthetic_mlp(
      strategy, widths, _BATCH_SIZE.value)
  dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
  iterator = iter(strategy.experimental_distribute_dataset(
      dataset.unbatch().batch(_BATCH_SIZE.value)))

  @tf.function
  def train_step(inputs):
    def replica_step(x, y):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x)) / _BATCH_SIZE.value
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    return strategy.reduce("sum", strategy.run(replica_step, args=inputs),
                           axis=None)

  def run_step():
    batch = next(iterator)
    start = time.perf_counter()
    train_step(batch).numpy()
    return time.perf_counter() - start

  return run_step, model.count_params()


def time_round_robin(steps):
  """Median step time of every configuration, measured interleaved.

  The machine is shared: timing the configurations one after the other
  would compare different background loads; rounds of a few steps each,
  alternating between configurations, spread the load evenly.
  """
  for step in steps:
    for _ in range(_WARMUP.value):
      step()
  times = [[] for _ in steps]
  rounds = max(1, _STEPS.value // _STEPS_PER_ROUND)
  for _ in range(rounds):
    for i, step in enumerate(steps):
      for _ in range(_STEPS_PER_ROUND):
        times[i].append(step())
  return [statistics.median(t) for t in times]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  devices = common.split_cpu(_REPLICAS.value)
  import ndq_tf  # pylint: disable=g-import-not-at-top
  import ndq_tf.distribute  # pylint: disable=g-import-not-at-top
  widths = [int(w) for w in _LAYERS.value]
  names, steps, strategies = [], [], []
  baselines = [
      ("tf float32 (default ring)", tf.distribute.MirroredStrategy(devices)),
      ("tf float32 (ReductionToOneDevice)", tf.distribute.MirroredStrategy(
          devices, cross_device_ops=tf.distribute.ReductionToOneDevice())),
  ]
  for name, strategy in baselines:
    step, params = make_step(strategy, widths)
    names.append(name)
    steps.append(step)
    strategies.append(None)
  kwargs = {}
  if _MIN_ELEMENTS.value is not None:
    kwargs["min_elements"] = _MIN_ELEMENTS.value
  if _TRANSPORT.value is not None:
    kwargs["exchange"] = _TRANSPORT.value
  chunk_options = []
  for value in _CHUNKS.value:
    if value == "default":
      chunk_options.append(("", {}))
    elif value == "none":
      chunk_options.append((" @none", {"chunk_elements": None}))
    else:
      chunk_options.append((f" @{int(value)}",
                            {"chunk_elements": int(value)}))
  configurations = [(spec, label, chunk) for spec in _CODECS.value
                    for label, chunk in chunk_options]
  for spec, label, chunk in configurations:
    codec = ndq_tf.codecs.get(spec)
    nested = {}
    if codec.needs_side_information:
      nested = {"reference_codec": ndq_tf.DitheredCodec(num_levels=3),
                "reference_group": 0.5, "adaptive": _ADAPTIVE.value}
    try:
      strategy = ndq_tf.distribute.MirroredStrategy(
          codec=codec, devices=devices, **kwargs, **nested, **chunk)
    except (TypeError, ValueError) as e:
      print(f"{spec}: skipped ({e})")
      continue
    step, _ = make_step(strategy, widths)
    names.append(f"ndq {spec}{label}")
    steps.append(step)
    strategies.append(strategy)
  medians = time_round_robin(steps)
  # Steps every configuration ran (warm-up and timed), as time_round_robin.
  total_steps = _WARMUP.value + _STEPS_PER_ROUND * max(
      1, _STEPS.value // _STEPS_PER_ROUND)
  rows = []
  for name, seconds, strategy in zip(names, medians, strategies):
    if strategy is None:
      rows.append((name, seconds, 32.0, None))
      continue
    # The optimizer's gradient all-reduce (inside `apply_gradients`) is
    # compressed by default: one compressed exchange per step, or this row
    # would have timed a lossless all-reduce.
    stats = strategy.compression_stats()
    if stats["exchange_count"] != total_steps:
      raise RuntimeError(
          f"{name}: {stats['exchange_count']} compressed exchanges in "
          f"{total_steps} steps; the gradient all-reduce was not compressed "
          "every step.")
    rows.append((f"{name} [{stats['transport']}]", seconds,
                 stats["sent_bits_per_element"], stats["exchange_count"]))
  reference = rows[0][1]
  print(f"\nMLP {widths} ({params} parameters), {len(devices)} logical CPU "
        f"replicas, global batch {_BATCH_SIZE.value}, median of "
        f"{len(rows) and _STEPS.value} steps each, interleaved in rounds of "
        f"{_STEPS_PER_ROUND}")
  print(f"{'all-reduce':42s} {'ms/step':>8s} {'x float32':>9s} "
        f"{'x R1D':>6s} {'bits/elt':>8s} {'exchanges':>9s}")
  for name, seconds, bits, exchanges in rows:
    print(f"{name:42s} {1e3 * seconds:8.1f} {seconds / reference:9.2f} "
          f"{seconds / rows[1][1]:6.2f} {bits:8.3f} "
          f"{'-' if exchanges is None else exchanges:>9}")


if __name__ == "__main__":
  app.run(main)
