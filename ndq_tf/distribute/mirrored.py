"""`ndq_tf.MirroredStrategy`: `tf.distribute.MirroredStrategy` with compressed gradients."""

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

try:
  # Keras' weights files (model.save_weights, BackupAndRestore) hold the
  # state of every `KerasSaveable` reachable from the model's attributes;
  # `model.distribute_strategy` is one. The class is not exported by the
  # public API (Keras 3.15); without it the counter is still saved by
  # tf.train.Checkpoint, only not in .weights.h5 files.
  from keras.src.saving.keras_saveable import KerasSaveable as _KerasSaveable
except ImportError:  # pragma: no cover
  _KerasSaveable = object

from ndq_tf.distribute.cross_device_ops import CompressedAllReduce

__all__ = [
    "MirroredStrategy",
]


def _is_gpu(device):
  return tf.DeviceSpec.from_string(device).device_type in ("GPU",)


def bypasses_cross_device_ops(devices, jit_compile):
  """Whether MirroredStrategy would skip its cross-device ops.

  TF's MirroredStrategy (2.21) does not call `merge_call`, and so never
  reaches the `CrossDeviceOps` it was given, when the replica function is
  compiled with XLA and every device is a GPU: it uses its own NCCL/ring
  collectives instead.

  Args:
    devices: the strategy's device strings.
    jit_compile: whether the replica function is XLA-compiled.

  Returns:
    bool.
  """
  return bool(jit_compile) and bool(devices) and all(
      _is_gpu(d) for d in devices)


class MirroredStrategy(tf.distribute.MirroredStrategy,
                       tf.__internal__.tracking.Trackable,
                       _KerasSaveable):
  """Synchronous data-parallel training on one machine with compressed gradients.

  A `tf.distribute.MirroredStrategy` whose cross-device ops are a
  `ndq_tf.CompressedAllReduce(codec, **kwargs)`: `model.fit`,
  `strategy.run` + `optimizer.apply_gradients` and
  `ReplicaContext.all_reduce` send quantized gradients between replicas,
  and every replica ends each step with bitwise identical variables.

  The dither counter (`compressed_all_reduce.step`) is saved with the model,
  with nothing to do for the user:
  * `tf.train.Checkpoint(model=model)` / `(optimizer=...)`: Keras models and
    optimizers created in `strategy.scope()` track their strategy, and this
    strategy tracks the counter (checkpoint key
    `model/_distribute_strategy/compressed_all_reduce/_step`).
  * `model.save_weights` / `keras.callbacks.BackupAndRestore`: the strategy is
    a Keras saveable reachable from the model (`model.distribute_strategy`),
    so the `.weights.h5` file holds the counter too.
  For a custom loop without a Keras model, checkpoint it explicitly:
  `tf.train.Checkpoint(..., all_reduce=strategy.compressed_all_reduce)`.

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
    cross_device_ops: a ready `CompressedAllReduce` (then `codec` and
      `**kwargs` must be omitted).
    **kwargs: passed to `CompressedAllReduce` (`min_elements`, `seed`,
      `compress_indexed_slices`, `fallback`, and for a nested `codec`
      `reference_codec`, `reference_replicas`, `adaptive`).

  Nested codecs (the paper's Algorithm 2):

  >>> strategy = ndq_tf.MirroredStrategy(
  ...     codec=ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3),
  ...     reference_codec=ndq_tf.DitheredCodec(num_levels=3),
  ...     reference_replicas=0.5)

  The reference group's size is checked against the replicas here. The
  nested senders' noise scales and gains
  (`compressed_all_reduce.noise_scale(n)`, `.noise_gain(n)`) are saved with
  the step counter (checkpoint and `.weights.h5` files).

  Raises:
    ValueError: if neither or both of `codec` and `cross_device_ops` are
      given, a `CompressedAllReduce` argument is invalid, or
      `reference_replicas` leaves no nested replica.
    TypeError: if `cross_device_ops` is not a `CompressedAllReduce`.
  """

  def __init__(self, codec=None, devices=None, cross_device_ops=None,
               **kwargs):
    if cross_device_ops is None:
      if codec is None:
        raise ValueError(
            "ndq_tf.MirroredStrategy needs `codec` (or a ready "
            "`cross_device_ops=CompressedAllReduce(...)`). Received: "
            "codec=None.")
      cross_device_ops = CompressedAllReduce(codec, **kwargs)
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
    super().__init__(devices=devices, cross_device_ops=cross_device_ops)
    if cross_device_ops.needs_reference:
      # Raises a clear error now rather than at the first all-reduce.
      cross_device_ops.reference_count(len(self.extended.worker_devices))
    self._maybe_initialize_trackable()
    self._track_trackable(cross_device_ops, name="compressed_all_reduce")
    self._ndq_all_reduce = cross_device_ops

  @property
  def compressed_all_reduce(self):
    """The `CompressedAllReduce` (step counter, telemetry) of this strategy."""
    return self._ndq_all_reduce

  def run(self, fn, args=(), kwargs=None, options=None):
    """`tf.distribute.Strategy.run`, refusing XLA-compiled replica functions.

    Raises:
      ValueError: if `fn` is (or runs inside) an XLA-compiled function. On
        all-GPU devices MirroredStrategy then skips cross-device ops and
        would all-reduce uncompressed float gradients; on other devices its
        merge_call-based all-reduce fails under XLA (also without ndq_tf,
        measured with TF 2.21: `model.compile(jit_compile=True)` under a
        plain MirroredStrategy of logical CPUs raises InvalidArgumentError).
    """
    jit = bool(getattr(fn, "_jit_compile", False)) or (
        control_flow_util.GraphOrParentsInXlaContext(
            tf.compat.v1.get_default_graph()))
    if jit:
      devices = self.extended.worker_devices
      if bypasses_cross_device_ops(devices, jit):
        reason = ("TensorFlow's MirroredStrategy then skips cross-device ops "
                  "on all-GPU devices and would all-reduce uncompressed "
                  "float gradients")
      else:
        reason = ("MirroredStrategy's merge_call-based all-reduce cannot "
                  "run inside XLA on these devices")
      raise ValueError(
          f"ndq_tf.MirroredStrategy cannot compress under XLA: {reason}. Do "
          f"not jit-compile the replica function (model.compile(jit_compile="
          f"False), the default 'auto' under a strategy, or tf.function "
          f"without jit_compile). Received: fn={fn!r} jit-compiled on "
          f"devices {devices}.")
    return super().run(fn, args=args, kwargs=kwargs, options=options)

  # -- Keras saving (model.save_weights, BackupAndRestore) -------------------

  def _obj_type(self):
    # Keras walks the attributes of saveables, skipping those of a reference
    # object of this type; any type it knows is fine here.
    return "Operation"

  def save_own_variables(self, store):
    store["step"] = np.asarray(self._ndq_all_reduce.step.numpy())
    ops = self._ndq_all_reduce
    for n, variable in sorted(ops.noise_scales().items()):
      store[f"noise_scale_{n}"] = np.asarray(variable.numpy())
      store[f"noise_gain_{n}"] = np.asarray(ops.noise_gain(n).numpy())

  def load_own_variables(self, store):
    try:
      value = store["step"]
    except (KeyError, ValueError):
      return  # Saved without a compressed strategy: keep the counter.
    self._ndq_all_reduce.step.assign(int(np.asarray(value)))
    if not self._ndq_all_reduce.needs_reference:
      return
    try:
      keys = list(store.keys())
    except AttributeError:  # pragma: no cover
      keys = []
    for key in keys:
      if key.startswith("noise_scale_"):
        sigma = np.asarray(store[key])
        gain = np.asarray(store["noise_gain_" + key[len("noise_scale_"):]])
        num_senders, num_buckets = sigma.shape
        sigma_variable, gain_variable = self._ndq_all_reduce.nested_state(
            num_buckets, num_senders)
        sigma_variable.assign(sigma)
        gain_variable.assign(gain)

  def __reduce__(self):
    # KerasSaveable pickles models through the Keras format; a strategy is
    # not picklable.
    raise TypeError("ndq_tf.MirroredStrategy cannot be pickled.")
