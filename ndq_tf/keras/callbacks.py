"""Keras callbacks for compressed distributed training."""

import math
import warnings

from absl import logging
import keras

from ndq_tf.core import engine as engine_lib
from ndq_tf.core import tf_internals

__all__ = [
    "CompressionStats",
    "find_engine",
]

#: Fraction of nested elements overloading in one step above which
#: CompressionStats warns (once).
OVERLOAD_WARNING = 0.01


def _as_engine(obj):
  """The `ExchangeEngine` of an engine or of compressing cross-device ops."""
  if isinstance(obj, engine_lib.ExchangeEngine):
    return obj
  engine = getattr(obj, "engine", None)
  return engine if isinstance(engine, engine_lib.ExchangeEngine) else None


def find_engine(strategy):
  """The exchange engine a strategy compresses with, or None.

  Args:
    strategy: a `tf.distribute.Strategy` (e.g. `model.distribute_strategy`).

  Returns:
    The `ExchangeEngine` of an `ndq_tf.MirroredStrategy`, an
    `ndq_tf.MultiWorkerMirroredStrategy`, or a
    `tf.distribute.MirroredStrategy(cross_device_ops=CompressedAllReduce(...))`;
    None for other strategies.
  """
  engine = _as_engine(getattr(strategy, "compression_engine", None))
  if engine is None and strategy is not None:
    engine = _as_engine(tf_internals.cross_device_ops_of(strategy))
  return engine


@keras.saving.register_keras_serializable(package="ndq_tf")
class CompressionStats(keras.callbacks.Callback):
  """Adds the all-reduce's wire statistics to the Keras logs.

  After every training batch and epoch, adds to `logs`:
  * `sent_bits_per_element`: bits every replica sent per gradient element in
    the last step (codec payloads plus the small tensors sent losslessly);
    32 for plain float32. Also as `wire_bits_per_element`, its deprecated
    name, for one release.
  * `compression_ratio`: float32 bits / wire bits of the last step.
  * `link_compression_ratio`: what TF's float32 ring all-reduce would put
    on the links for the same elements / what this exchange's transport
    puts there, by the cost model (`ndq_tf.core.cost_model.exchange_bits`); it
    compares transports (`transport` says which one ran).
  * with a nested codec (NDQSG), when known: `overload_rate`, the elements
    of nested buckets that really decoded wrong in the last step (counted
    by their senders; under `ndq_tf.MultiWorkerMirroredStrategy` this
    worker's own payload, so only on nested workers), and
    `fallback_fraction`, the buckets sent as DQSG instead.

  One class for both Keras versions: it is a Keras 3 callback and also
  answers the hooks tf_keras (Keras 2: `import tf_keras`, or `tf.keras`
  with `TF_USE_LEGACY_KERAS=1`) asks of its callbacks, so it goes in the
  `callbacks` of either `fit`, with the same keys.

  They show on the progress bar, in `History`, and in
  `keras.callbacks.TensorBoard` / `CSVLogger` when this callback comes
  *before* those in the `callbacks` list (Keras passes one `logs` dict down
  the list in order; the progress bar and `History` always come last).

  If the gradients of a training batch were all-reduced without
  compression (every gradient below `min_elements`), a warning says so
  once and the batch logs 32 bits per element; a batch in which nothing
  was all-reduced (a step the loss-scale optimizer skipped, one replica)
  logs nothing and warns nothing. Another warning comes once when more
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
    cross_device_ops: the `CompressedAllReduce` (or the multi-worker
      strategy's cross-device ops, or their `ExchangeEngine`) to read;
      default: the one of the model's distribution strategy.
    prefix: prepended to the log keys.

  Raises:
    ValueError: at the start of training, if no `CompressedAllReduce` is
      given or found on the model's strategy.
  """

  def __init__(self, cross_device_ops=None, prefix=""):
    super().__init__()
    if cross_device_ops is not None and _as_engine(cross_device_ops) is None:
      raise TypeError(
          f"`cross_device_ops` must be an ndq_tf.CompressedAllReduce (or the "
          f"cross-device ops of ndq_tf.MultiWorkerMirroredStrategy) or None. "
          f"Received: cross_device_ops={cross_device_ops!r}.")
    if not isinstance(prefix, str):
      raise ValueError(
          f"`prefix` must be a string. Received: prefix={prefix!r}.")
    self._given = cross_device_ops
    self._engine = (None if cross_device_ops is None
                    else _as_engine(cross_device_ops))
    self._prefix = prefix
    self._start = None
    self._before = None
    self._warned = False
    self._warned_overload = False
    self._transport = None

  @property
  def engine(self):
    """The `ExchangeEngine` read (known once training started)."""
    return self._engine

  @property
  def transport(self):
    """How the last logged step's gradients travelled (`"all_gather"` or
    `"all_reduce"`; None before). Keras logs hold numbers only, so the
    transport is this property, and a log line whenever it changes."""
    return self._transport

  def get_config(self):
    """The constructor arguments; an explicit `cross_device_ops` is not kept.

    A callback revived from its config finds the `CompressedAllReduce` of the
    model's strategy at the start of training.
    """
    return {"prefix": self._prefix}

  @classmethod
  def from_config(cls, config):
    return cls(**config)

  # -- What tf_keras' CallbackList asks (Keras 3 asks nothing) ---------------

  # tf_keras hands this callback Python numbers, as Keras 3 does.
  _supports_tf_logs = False

  def _implements_train_batch_hooks(self):
    return True

  def _implements_test_batch_hooks(self):
    return False

  def _implements_predict_batch_hooks(self):
    return False

  # -- Hooks ------------------------------------------------------------------

  def on_train_begin(self, logs=None):
    if self._given is None:
      strategy = getattr(self.model, "distribute_strategy", None)
      self._engine = find_engine(strategy)
      if self._engine is None:
        raise ValueError(
            f"CompressionStats needs a CompressedAllReduce: create the model "
            f"in the scope of ndq_tf.MirroredStrategy (or a strategy with "
            f"cross_device_ops=CompressedAllReduce(...)), or pass "
            f"`cross_device_ops`. Received: model strategy {strategy!r}.")
    self._start = None

  def _counters(self):
    engine = self._engine
    return (int(engine.step.numpy()),
            engine.telemetry.counted("uncompressed_gradient_reductions"))

  def on_train_batch_begin(self, batch, logs=None):
    # Read here rather than in on_train_begin: BackupAndRestore may restore
    # the counter in its own on_train_begin, after ours.
    self._before = self._counters()
    if self._start is None:
      self._start = self._before

  def _add(self, logs, since):
    if logs is None or since is None:
      return
    engine = self._engine
    step, uncompressed = self._counters()
    if step == since[0]:
      if uncompressed == since[1]:
        # Nothing was all-reduced (a step the loss-scale optimizer skipped,
        # a single replica): nothing to report.
        return
      if not self._warned:
        self._warned = True
        warnings.warn(
            "CompressionStats: the gradients of a training batch were "
            "all-reduced losslessly: every gradient had fewer than "
            f"min_elements={engine.options.min_elements} elements, or was "
            "built inside ndq_tf.distribute.uncompressed().",
            RuntimeWarning, stacklevel=2)
      logs[self._prefix + "sent_bits_per_element"] = 32.0
      logs[self._prefix + "wire_bits_per_element"] = 32.0  # Deprecated.
      logs[self._prefix + "compression_ratio"] = 1.0
      return
    stats = engine.stats()
    if stats["transport"] != self._transport:
      self._transport = stats["transport"]
      logging.info("CompressionStats: gradients travel by %r.",
                   self._transport)
    for key in ("sent_bits_per_element", "compression_ratio",
                "link_compression_ratio", "overload_rate",
                "fallback_fraction"):
      if key in stats and math.isfinite(stats[key]):
        logs[self._prefix + key] = stats[key]
    if self._prefix + "sent_bits_per_element" in logs:  # Deprecated name.
      logs[self._prefix + "wire_bits_per_element"] = logs[
          self._prefix + "sent_bits_per_element"]
    rate = stats.get("overload_rate", 0.0)
    # The automatic mode reacts to overloads itself (its first steps, and a
    # step whose noise jumps, overload more): warn about the fixed mode.
    if (rate > OVERLOAD_WARNING and not engine.options.adaptive
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
    self._add(logs, self._before)

  def on_epoch_end(self, epoch, logs=None):
    self._add(logs, self._start)
