"""Keras callbacks for compressed distributed training."""

import math
import warnings

import keras

from ndq_tf.distribute.cross_device_ops import CompressedAllReduce

__all__ = [
    "CompressionStats",
]


#: Fraction of nested elements overloading in one step above which
#: CompressionStats warns (once).
OVERLOAD_WARNING = 0.01

# What CompressionStats reads: CompressedAllReduce (MirroredStrategy) and the
# multi-worker strategy's cross-device ops both provide it.
_TELEMETRY = ("step", "min_elements", "wire_bits_per_element",
              "compression_ratio")


def _has_telemetry(ops):
  return ops is not None and all(hasattr(ops, a) for a in _TELEMETRY)


def find_compressed_all_reduce(strategy):
  """The compressing cross-device ops a strategy uses, or None.

  Args:
    strategy: a `tf.distribute.Strategy` (e.g. `model.distribute_strategy`).

  Returns:
    The `CompressedAllReduce` of an `ndq_tf.MirroredStrategy` (or of a
    `tf.distribute.MirroredStrategy(cross_device_ops=...)`), the cross-device
    ops of an `ndq_tf.MultiWorkerMirroredStrategy`, or None.
  """
  ops = getattr(strategy, "compressed_all_reduce", None)
  if _has_telemetry(ops):
    return ops
  # A plain tf.distribute.MirroredStrategy(cross_device_ops=...).
  extended = getattr(strategy, "extended", None)
  ops = getattr(extended, "_cross_device_ops", None)
  return ops if isinstance(ops, CompressedAllReduce) else None


@keras.saving.register_keras_serializable(package="ndq_tf")
class CompressionStats(keras.callbacks.Callback):
  """Adds the all-reduce's wire statistics to the Keras logs.

  After every training batch and epoch, adds to `logs`:
  * `wire_bits_per_element`: bits every replica sent per gradient element in
    the last step (codec payloads plus the small tensors sent losslessly);
    32 for plain float32.
  * `compression_ratio`: float32 bits / wire bits of the last step.
  * with a nested codec (NDQSG), when known: `overload_rate`, the elements
    of nested buckets that really decoded wrong in the last step (counted
    by their senders; under `ndq_tf.MultiWorkerMirroredStrategy` this
    worker's own payload, so only on nested workers), and
    `fallback_fraction`, the buckets sent as DQSG instead.

  They show on the progress bar, in `History`, and in
  `keras.callbacks.TensorBoard` / `CSVLogger` when this callback comes
  *before* those in the `callbacks` list (Keras passes one `logs` dict down
  the list in order; the progress bar and `History` always come last).

  If a training batch ends without any compressed all-reduce having run,
  a warning says so once: every gradient was below `min_elements`, or
  TensorFlow bypassed the cross-device ops. Another warns once when more
  than `OVERLOAD_WARNING` (1%) of the nested elements overloaded in a step
  of the fixed mode (the automatic mode adjusts its steps itself).

  Example:

  >>> strategy = ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec())
  >>> with strategy.scope():
  ...   model = make_model()
  ...   model.compile(optimizer="sgd", loss="mse")
  >>> model.fit(x, y, callbacks=[ndq_tf.CompressionStats(),
  ...                            keras.callbacks.TensorBoard("logs")])

  Args:
    cross_device_ops: the `CompressedAllReduce` to read; default: the one of
      the model's distribution strategy (`ndq_tf.MirroredStrategy` or
      `ndq_tf.MultiWorkerMirroredStrategy`).
    prefix: prepended to the log keys.

  Raises:
    ValueError: at the start of training, if no `CompressedAllReduce` is
      given or found on the model's strategy.
  """

  def __init__(self, cross_device_ops=None, prefix=""):
    super().__init__()
    if cross_device_ops is not None and not _has_telemetry(cross_device_ops):
      raise TypeError(
          f"`cross_device_ops` must be an ndq_tf.CompressedAllReduce (or the "
          f"cross-device ops of ndq_tf.MultiWorkerMirroredStrategy) or None. "
          f"Received: cross_device_ops={cross_device_ops!r}.")
    if not isinstance(prefix, str):
      raise ValueError(
          f"`prefix` must be a string. Received: prefix={prefix!r}.")
    self._given = cross_device_ops
    self._ops = cross_device_ops
    self._prefix = prefix
    self._start_step = None
    self._warned = False
    self._warned_overload = False

  @property
  def cross_device_ops(self):
    return self._ops

  def get_config(self):
    """The constructor arguments; an explicit `cross_device_ops` is not kept.

    A callback revived from its config finds the `CompressedAllReduce` of the
    model's strategy at the start of training.
    """
    return {"prefix": self._prefix}

  @classmethod
  def from_config(cls, config):
    return cls(**config)

  def on_train_begin(self, logs=None):
    if self._given is None:
      strategy = getattr(self.model, "distribute_strategy", None)
      self._ops = find_compressed_all_reduce(strategy)
      if self._ops is None:
        raise ValueError(
            f"CompressionStats needs a CompressedAllReduce: create the model "
            f"in the scope of ndq_tf.MirroredStrategy (or a strategy with "
            f"cross_device_ops=CompressedAllReduce(...)), or pass "
            f"`cross_device_ops`. Received: model strategy {strategy!r}.")
    self._start_step = None

  def on_train_batch_begin(self, batch, logs=None):
    # Read here rather than in on_train_begin: BackupAndRestore may restore
    # the counter in its own on_train_begin, after ours.
    if self._start_step is None:
      self._start_step = int(self._ops.step.numpy())

  def _add(self, logs):
    if logs is None or self._start_step is None:
      return
    ops = self._ops
    if int(ops.step.numpy()) == self._start_step:
      if not self._warned:
        self._warned = True
        warnings.warn(
            "CompressionStats: a training batch ended without a compressed "
            "all-reduce: every gradient had fewer than min_elements="
            f"{ops.min_elements} elements, or TensorFlow bypassed the "
            "cross-device ops (XLA on all-GPU devices). Gradients were "
            "reduced losslessly.", RuntimeWarning, stacklevel=2)
      bits, ratio = 32.0, 1.0
    else:
      bits, ratio = ops.wire_bits_per_element, ops.compression_ratio
    if not (math.isfinite(bits) and math.isfinite(ratio)):
      return
    logs[self._prefix + "wire_bits_per_element"] = bits
    logs[self._prefix + "compression_ratio"] = ratio
    # Nested codecs: the counted overload rate and the DQSG fallback.
    for key in ("overload_rate", "fallback_fraction"):
      value = getattr(ops, "last_" + key, math.nan)
      if math.isfinite(value):
        logs[self._prefix + key] = value
    rate = getattr(ops, "last_overload_rate", math.nan)
    # The automatic mode reacts to overloads itself (its first steps, and a
    # step whose noise jumps, overload more): warn about the fixed mode.
    if (rate > OVERLOAD_WARNING and not getattr(ops, "adaptive", False)
        and not self._warned_overload):
      self._warned_overload = True
      warnings.warn(
          f"CompressionStats: {rate:.1%} of the nested elements decoded "
          f"wrong in the last step (overload: off by a coarse step, silently "
          f"for the receivers). The coarse cell is too small for the spread "
          f"between replicas' gradients: use the automatic mode "
          f"(adaptive=True), a larger coarse_ratio or num_levels, or more "
          f"replicas in the reference group.", RuntimeWarning, stacklevel=2)

  def on_train_batch_end(self, batch, logs=None):
    self._add(logs)

  def on_epoch_end(self, epoch, logs=None):
    self._add(logs)
