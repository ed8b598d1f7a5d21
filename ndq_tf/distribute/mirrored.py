"""`ndq_tf.MirroredStrategy`: `tf.distribute.MirroredStrategy` with compressed gradients."""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from ndq_tf.core import tf_internals
from ndq_tf.distribute import gradient_detection
from ndq_tf.distribute import options as options_lib
from ndq_tf.distribute import strategy_state
from ndq_tf.distribute.cross_device_ops import CodecLike
from ndq_tf.distribute.cross_device_ops import CompressedAllReduce

__all__ = [
    "MirroredStrategy",
]

_DEFAULTS = dict(
    min_elements=options_lib.DEFAULT_MIN_ELEMENTS, seed=0,
    compress_indexed_slices=False, fallback=None, reference_codec=None,
    reference_replicas=None, adaptive=None, transport="auto",
    chunk_elements=options_lib.DEFAULT_CHUNK_ELEMENTS,
    reduce_scatter_levels=None, reduce_scatter_error_feedback=False)


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

  Args:
    codec: the `ndq_tf` codec of the gradients; or pass
      `cross_device_ops=CompressedAllReduce(...)` instead.
    devices: device strings, as for `tf.distribute.MirroredStrategy`
      (default: all local GPUs, else the CPU).
    cross_device_ops: a ready `CompressedAllReduce` (then `codec` and the
      arguments below must be left at their defaults).
    min_elements, seed, compress_indexed_slices, fallback,
      reference_codec, reference_replicas, adaptive, transport,
      chunk_elements, reduce_scatter_levels,
      reduce_scatter_error_feedback: passed to
      `CompressedAllReduce` (see there);
      `reference_codec`, `reference_replicas` and `adaptive` for a nested
      `codec` only.

  Nested codecs (the paper's Algorithm 2):

  >>> strategy = ndq_tf.MirroredStrategy(
  ...     codec=ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3),
  ...     reference_codec=ndq_tf.DitheredCodec(num_levels=3),
  ...     reference_replicas=0.5)

  The reference group's size is checked against the replicas here.

  Raises:
    ValueError: if neither or both of `codec` and `cross_device_ops` are
      given, a `CompressedAllReduce` argument is invalid, or
      `reference_replicas` leaves no nested replica.
    TypeError: if `cross_device_ops` is not a `CompressedAllReduce`.
  """

  def __init__(
      self,
      codec: CodecLike | None = None,
      devices: Sequence[str] | None = None,
      cross_device_ops: CompressedAllReduce | None = None,
      *,
      min_elements: int = options_lib.DEFAULT_MIN_ELEMENTS,
      seed: int = 0,
      compress_indexed_slices: bool = False,
      fallback: tf.distribute.CrossDeviceOps | None = None,
      reference_codec: CodecLike | None = None,
      reference_replicas: int | float | None = None,
      adaptive: bool | None = None,
      transport: str = "auto",
      chunk_elements: int | None = options_lib.DEFAULT_CHUNK_ELEMENTS,
      reduce_scatter_levels: int | None = None,
      reduce_scatter_error_feedback: bool = False,
  ) -> None:
    given = dict(min_elements=min_elements, seed=seed,
                 compress_indexed_slices=compress_indexed_slices,
                 fallback=fallback, reference_codec=reference_codec,
                 reference_replicas=reference_replicas, adaptive=adaptive,
                 transport=transport, chunk_elements=chunk_elements,
                 reduce_scatter_levels=reduce_scatter_levels,
                 reduce_scatter_error_feedback=reduce_scatter_error_feedback)
    kwargs = {k: v for k, v in given.items() if v is not _DEFAULTS[k] and
              v != _DEFAULTS[k]}
    if cross_device_ops is None:
      if codec is None:
        raise ValueError(
            "ndq_tf.MirroredStrategy needs `codec` (or a ready "
            "`cross_device_ops=CompressedAllReduce(...)`). Received: "
            "codec=None.")
      cross_device_ops = CompressedAllReduce(codec, **given)
    else:
      if codec is not None or kwargs:
        raise ValueError(
            f"Pass either `codec` (and CompressedAllReduce arguments) or "
            f"`cross_device_ops`, not both. Received: codec={codec!r}, "
            f"kwargs={sorted(kwargs)} and cross_device_ops="
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
