r"""model.fit with ndq_tf.MirroredStrategy: compressed gradients, same accuracy.

Trains a small MLP on scikit-learn's digits (installed offline) on several
replicas, once per codec, and prints test accuracy and the gradient wire bits
per element for each. With no flags this is `make demo`: 4 replicas, float32,
DQSG and NDQSG.

NDQSG (the paper's Algorithm 2) needs a reference group: the first
`--reference_replicas` replicas (default half of them) send DQSG with
`num_levels=3`, the others nested codes (`log2 coarse_ratio` bits per
element), decoded with the mean of the gradients decoded before them as side
information, in the automatic mode unless `--noadaptive` (see the README).
Its bits per element average both groups; the overload rate
of the last step (the fraction of nested elements decoded off by a coarse
step, silently for the receivers, but counted by their senders) is printed
too, next to what a Gaussian noise of the measured size would give.

Examples:

  python examples/fit_mirrored.py
  python examples/fit_mirrored.py --quick     # 2 epochs: a quick look
  python examples/fit_mirrored.py --codec=dqsg:num_levels=1 --replicas=2
  python examples/fit_mirrored.py --codec=qsgd --codec=terngrad --epochs=5
  python examples/fit_mirrored.py --codec=ndqsg:coarse_ratio=3 \
      --reference_replicas=1
  python examples/fit_mirrored.py --codec=ndqsg --noadaptive  # fixed mode

Without GPUs, the CPU is split into `--replicas` logical devices (data
parallelism is simulated on one machine; the bytes counted are those that
would cross the devices).
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

_CODECS = flags.DEFINE_multi_string(
    "codec", ["float32", "dqsg:num_levels=3", "ndqsg:num_levels=3,coarse_ratio=3"],
    "Codec spec, repeatable: a name (float32, float16, dqsg, half_dithered, "
    "ndqsg, qsgd, terngrad) optionally followed by ':key=value,...' "
    "constructor arguments, as in ndq_tf.codecs.get.")
_REPLICAS = flags.DEFINE_integer(
    "replicas", 4,
    "Number of replicas: logical CPU devices when there is no GPU (else the "
    "first N GPUs).")
_EPOCHS = flags.DEFINE_integer("epochs", 12, "Training epochs.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 128, "Global batch size (split across the replicas).")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Width of the hidden layer.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 4e-3, "Adam's step size.")
_MIN_ELEMENTS = flags.DEFINE_integer(
    "min_elements", None,
    "Gradients with fewer elements travel losslessly (default: "
    "CompressedAllReduce's).")
_REFERENCE_REPLICAS = flags.DEFINE_float(
    "reference_replicas", 0.5,
    "Nested codecs only: replicas (a count, or a fraction if < 1) that send "
    "the reference codec (DQSG num_levels=3) decoded first.")
_ADAPTIVE = flags.DEFINE_bool(
    "adaptive", True,
    "Nested codecs only: the automatic mode (CompressedAllReduce(adaptive="
    "True)): each nested replica sizes its fine step per bucket from its own "
    "measured noise, or sends the bucket as DQSG. --noadaptive: the paper's "
    "fixed parameters.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the dither.")
_QUICK = flags.DEFINE_bool(
    "quick", False,
    "Short mode: 2 epochs (instead of --epochs), about a minute on a loaded "
    "machine; the accuracies are then those of barely trained models.")


def _epochs():
  return 2 if _QUICK.value else _EPOCHS.value


def split_cpu(replicas):
  """Splits the CPU into logical devices unless there are enough GPUs."""
  gpus = tf.config.list_physical_devices("GPU")
  if len(gpus) >= replicas:
    return [f"/gpu:{i}" for i in range(replicas)]
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
  return [d.name for d in tf.config.list_logical_devices("CPU")][:replicas]


def load_digits(seed):
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  x = (data.data / 16.0).astype("float32")
  return model_selection.train_test_split(
      x, data.target, test_size=0.25, random_state=seed, stratify=data.target)


def make_strategy(spec, devices):
  """An ndq_tf.MirroredStrategy for a codec spec, or None if unsupported."""
  import ndq_tf  # pylint: disable=g-import-not-at-top
  codec = ndq_tf.codecs.get(spec)
  kwargs = {"seed": _SEED.value}
  if _MIN_ELEMENTS.value is not None:
    kwargs["min_elements"] = _MIN_ELEMENTS.value
  if codec.needs_side_information:
    reference = _REFERENCE_REPLICAS.value
    kwargs["reference_codec"] = ndq_tf.DitheredCodec(
        num_levels=3, bucket_size=codec.bucket_size)
    kwargs["reference_group"] = (int(reference) if reference >= 1
                                 else reference)
    if _ADAPTIVE.value:
      kwargs["adaptive"] = True
  try:
    return ndq_tf.distribute.MirroredStrategy(codec=codec, devices=devices,
                                              **kwargs)
  except (TypeError, ValueError) as e:
    print(f"  {spec}: invalid here ({e}); skipped.")
    return None


def _progress(spec):
  """A callback printing one line per epoch, so that a slow run shows life."""
  import keras  # pylint: disable=g-import-not-at-top
  start = time.time()

  def on_epoch_end(epoch, logs):
    print(f"  {spec}: epoch {epoch + 1}/{_epochs()}, loss "
          f"{logs['loss']:.4f}, {time.time() - start:.0f} s", flush=True)

  return keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end)


def fit_one(spec, devices, data, index, count):
  import keras  # pylint: disable=g-import-not-at-top
  import ndq_tf.keras  # pylint: disable=g-import-not-at-top
  x_train, x_test, y_train, y_test = data
  print(f"[{index}/{count}] {spec}: training {_epochs()} epochs...",
        flush=True)
  strategy = make_strategy(spec, devices)
  if strategy is None:
    return None
  keras.utils.set_random_seed(_SEED.value)
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((x_train.shape[1],)),
        keras.layers.Dense(_HIDDEN.value, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(_LEARNING_RATE.value),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  start = time.time()
  history = model.fit(x_train, y_train, batch_size=_BATCH_SIZE.value,
                      epochs=_epochs(), verbose=0,
                      callbacks=[ndq_tf.keras.CompressionStats(),
                                 _progress(spec)])
  seconds = time.time() - start
  accuracy = model.evaluate(x_test, y_test, verbose=0)[1]
  print(f"[{index}/{count}] {spec}: test accuracy {accuracy:.4f}, "
        f"{history.history['sent_bits_per_element'][-1]:.3f} bits per "
        f"element, {seconds:.0f} s", flush=True)
  ops = strategy.compressed_all_reduce
  label = spec
  if ops.needs_reference:
    from ndq_tf.core import fusion  # pylint: disable=g-import-not-at-top
    stats = strategy.compression_stats()
    p1 = ops.reference_count(len(devices))
    mode = ", adaptive" if ops.adaptive else ""
    label = f"{spec} (P1 {p1}/{len(devices)} dqsg:num_levels=3{mode})"
    # Every sender's payload: its codec's wire for the fused gradients that
    # were compressed (those of at least min_elements elements).
    plan = fusion.FusionPlan.from_tensors(
        [v for v in model.trainable_variables
         if np.prod(v.shape) >= ops.min_elements], ops.codec.bucket_size)
    print(f"  {label}: last step: overloaded elements (counted by the "
          f"senders) {stats['overload_rate']:.2e}, Gaussian prediction "
          f"{stats['overload_probability']:.2e}, fallback fraction "
          f"{stats['fallback_fraction']:.2f}, compressed bits/elt per "
          f"sender " + " ".join(
              f"{plan.wire_bits(c) / stats['compressed_elements']:.2f}"
              for c in ops.options.sender_codecs(len(devices))))
  return {
      "codec": label,
      "accuracy": accuracy,
      "bits": history.history["sent_bits_per_element"][-1],
      "ratio": history.history["compression_ratio"][-1],
      "transport": strategy.compression_stats()["transport"],
      "link": history.history["link_compression_ratio"][-1],
      "seconds": seconds,
  }


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  devices = split_cpu(_REPLICAS.value)
  data = load_digits(_SEED.value)
  print(f"digits: {len(data[0])} train / {len(data[1])} test samples, "
        f"{len(devices)} replicas, {_epochs()} epochs, global batch "
        f"{_BATCH_SIZE.value}", flush=True)
  specs = _CODECS.value
  rows = [r for r in (fit_one(spec, devices, data, i + 1, len(specs))
                      for i, spec in enumerate(specs)) if r is not None]
  print()
  print(f"{'codec':62s} {'test acc':>8s} {'bits/elt':>9s} {'ratio':>7s} "
        f"{'transport':>10s} {'link x':>7s} {'fit s':>6s}")
  for r in rows:
    print(f"{r['codec']:62s} {r['accuracy']:8.4f} {r['bits']:9.3f} "
          f"{r['ratio']:7.2f} {r['transport']:>10s} {r['link']:7.2f} "
          f"{r['seconds']:6.1f}")
  print("\nbits/elt: gradient bits each replica puts into the exchange per "
        "gradient element per step (codes, scales and the small tensors sent "
        "losslessly; for all_reduce, its lanes of codes, which are summed).\n"
        "link x: what a float32 ring all-reduce would carry on the links / "
        "what this transport carries (the cost model), the number to compare "
        "between transports.")
  return 0 if rows else 1


if __name__ == "__main__":
  np.set_printoptions(precision=4)
  app.run(main)
