"""`ndq_tf.MirroredStrategy`: `tf.distribute.MirroredStrategy` with compressed gradients."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from ndq_tf.core import tf_internals
from ndq_tf.distribute import arguments as arguments_lib
from ndq_tf.distribute import cross_device_ops as cross_device_ops_lib
from ndq_tf.distribute import gradient_detection
from ndq_tf.distribute import options as options_lib
from ndq_tf.distribute import strategy_state
from ndq_tf.distribute.cross_device_ops import CompressedAllReduce

__all__ = [
    "MirroredStrategy",
]


class _MirroredExtended(gradient_detection.LabellingExtendedMixin,
                        tf_internals.MirroredExtended):
  """`MirroredExtended` that notes which all-reduces aggregate gradients."""

  _ndq_who = "ndq_tf.MirroredStrategy"


class MirroredStrategy(tf.distribute.MirroredStrategy,
                       strategy_state.StrategyState):
  """Synchronous data-parallel training on one machine with compressed gradients.

  A `tf.distribute.MirroredStrategy` whose cross-device ops are a
  `ndq_tf.CompressedAllReduce(codec, ...)`. Gradient aggregation travels
  quantized between replicas: Keras 3 and tf_keras `model.fit`,
  `strategy.run` + `optimizer.apply_gradients`, and TF's low-level
  `strategy.extended.batch_reduce_to(SUM, grads_and_vars)`
  (`ndq_tf.distribute.gradient_detection`). Every other reduction is
  exact, your own `ReplicaContext.all_reduce` included unless built inside
  `ndq_tf.distribute.compressed()`; a step whose gradients were all-reduced
  that way without it logs a warning once and is counted
  (`unrecognised_gradient_steps`). Every replica ends each step with
  bitwise identical variables. With one replica nothing is compressed (a
  warning says so once).

  The dither counter (`compression_step`) and the nested senders' noise
  state are saved with the model, with nothing to do for the user:
  * `tf.train.Checkpoint(model=model)` / `(optimizer=...)`: Keras models and
    optimizers created in `strategy.scope()` track their strategy, and this
    strategy tracks its exchange engine (checkpoint key
    `model/_distribute_strategy/compression/step`).
  * `model.save_weights` / `keras.callbacks.BackupAndRestore`: the strategy is
    a Keras saveable reachable from the model (`model.distribute_strategy`),
    so the `.weights.h5` file holds them too.
  For a custom loop without a Keras model, checkpoint them explicitly:
  `tf.train.Checkpoint(..., compression=strategy.compression_engine)`.

  Mixed precision: Keras 3.15's `LossScaleOptimizer` checks only replica
  0's local gradients for overflow; use `ndq_tf.keras.LossScaleOptimizer`,
  which skips the step on every replica when any replica overflowed.
  Opting a `ReplicaContext.all_reduce` out of compression:
  `with ndq_tf.distribute.uncompressed(): ...`.

  XLA: when every device is a GPU and the replica function is jit-compiled
  (`model.compile(jit_compile=True)`, `tf.function(jit_compile=True)`),
  TensorFlow skips cross-device ops entirely; `run` raises instead of
  silently training uncompressed (and on other devices, where XLA with
  MirroredStrategy fails anyway, it raises a clear error first). Keras'
  default `jit_compile="auto"` turns XLA off under a distribution strategy.

  Example:

  >>> strategy = ndq_tf.MirroredStrategy(
  ...     codec=ndq_tf.DitheredCodec(num_levels=3))
  >>> with strategy.scope():
  ...   model = make_model()
  ...   model.compile(optimizer="adam", loss="mse")
  >>> model.fit(x, y, callbacks=[ndq_tf.CompressionStats()])

  Nested codecs (the paper's Algorithm 2):

  >>> strategy = ndq_tf.MirroredStrategy(
  ...     codec=ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3),
  ...     reference_codec=ndq_tf.DitheredCodec(num_levels=3),
  ...     reference_group=0.5)

  The reference group's size is checked against the replicas here.

  The compression settings are the fields of
  `ndq_tf.distribute.CompressionOptions` (passed on to
  `CompressedAllReduce`), one by one or all at once as `options`.

  Raises:
    ValueError: if neither or both of `codec` (or `options`) and
      `cross_device_ops` are given, a `CompressedAllReduce` argument is
      invalid, or `reference_group` leaves no nested replica.
    TypeError: if `cross_device_ops` is not a `CompressedAllReduce`.
  """

  def __init__(self, *args, **kwargs) -> None:
    # The signature and the Args section: `_ARGUMENTS`, below the class.
    values, given = _ARGUMENTS.bind(self, args, kwargs)
    cross_device_ops = values.pop("cross_device_ops")
    devices = values.pop("devices")
    if cross_device_ops is None:
      if values["codec"] is None and values["options"] is None:
        raise ValueError(
            "ndq_tf.MirroredStrategy needs `codec` (or `options`, or a ready "
            "`cross_device_ops=CompressedAllReduce(...)`). Received: "
            "codec=None.")
      cross_device_ops = CompressedAllReduce(
          fallback=values["fallback"], options=options_lib.from_arguments(
              "ndq_tf.MirroredStrategy", values, given, values["options"]))
    else:
      # Arguments at their defaults may be given too, as always.
      kwargs = sorted(k for k, v in given.items() if k not in (
          "codec", "devices", "cross_device_ops") and not (
              v is _DEFAULTS[k] or v == _DEFAULTS[k]))
      if values["codec"] is not None or kwargs:
        raise ValueError(
            f"Pass either `codec` (and CompressedAllReduce arguments) or "
            f"`cross_device_ops`, not both. Received: codec="
            f"{values['codec']!r}, kwargs={kwargs} and cross_device_ops="
            f"{cross_device_ops!r}.")
      if not isinstance(cross_device_ops, CompressedAllReduce):
        raise TypeError(
            f"`cross_device_ops` must be an ndq_tf.CompressedAllReduce (use "
            f"tf.distribute.MirroredStrategy for other ones). Received: "
            f"{type(cross_device_ops).__name__}.")
    # tf.distribute.MirroredStrategy's constructor hard-codes its extended;
    # build ours (the same, plus gradient detection) instead.
    tf_internals.Strategy.__init__(self, _MirroredExtended(
        self, devices=devices, cross_device_ops=cross_device_ops))
    cross_device_ops.attach_labels(self.extended.reduction_labels)
    if cross_device_ops.needs_reference:
      # Raises a clear error now rather than at the first all-reduce.
      cross_device_ops.reference_count(len(self.extended.worker_devices))
    self._ndq_all_reduce = cross_device_ops
    self._track_engine(cross_device_ops.engine)
    gradient_detection.warn_if_single_sender(
        "ndq_tf.MirroredStrategy", self.num_replicas_in_sync)

  @property
  def compressed_all_reduce(self) -> CompressedAllReduce:
    """The `CompressedAllReduce` of this strategy."""
    return self._ndq_all_reduce

  @property
  def compression_engine(self):
    """The exchange engine: step counter, telemetry, nested noise state."""
    return self._ndq_all_reduce.engine

  def run(self, fn, args=(), kwargs=None, options=None) -> Any:
    """`tf.distribute.Strategy.run`, refusing XLA-compiled replica functions.

    Raises:
      ValueError: if `fn` is (or runs inside) an XLA-compiled function. On
        all-GPU devices MirroredStrategy then skips cross-device ops and
        would all-reduce uncompressed float gradients; on other devices its
        merge_call-based all-reduce fails under XLA (also without ndq_tf;
        docs/distribute.md, "XLA").
    """
    if tf_internals.is_jit_compiled(fn) or tf_internals.in_xla_context():
      raise strategy_state.xla_bypass_error(
          "ndq_tf.MirroredStrategy", self.extended.worker_devices, fn)
    return super().run(fn, args=args, kwargs=kwargs, options=options)


_ARGUMENTS = options_lib.arguments(
    "ndq_tf.MirroredStrategy", options_lib.CODEC_OR_OPTIONS,
    arguments_lib.Argument(
        "devices", "Sequence[str] | None", None,
        "device strings, as for `tf.distribute.MirroredStrategy` (default: "
        "all local GPUs, else the CPU)."),
    arguments_lib.Argument(
        "cross_device_ops", "CompressedAllReduce | None", None,
        "a ready `CompressedAllReduce` (then `codec`, `options` and the "
        "arguments below must be left at their defaults)."),
    "min_elements", "seed", "compress_indexed_slices",
    cross_device_ops_lib.FALLBACK, "reference_codec", "reference_group",
    "adaptive", "exchange", "chunk_elements", "reduce_scatter_levels",
    "reduce_scatter_error_feedback", options_lib.OPTIONS,
    keyword_only="min_elements", renamed=("transport", "reference_replicas"))
_ARGUMENTS.apply(MirroredStrategy)
_DEFAULTS = {name: parameter.default for name, parameter
             in _ARGUMENTS.signature.parameters.items()}
