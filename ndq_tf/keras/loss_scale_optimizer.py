"""A `LossScaleOptimizer` that skips the step when *any* replica overflowed."""

import math

import keras
import tensorflow as tf

from ndq_tf.core import tf_internals
from ndq_tf.core.scope import uncompressed

__all__ = [
    "LossScaleOptimizer",
]


def _poison(grad, flag):
  """`grad` with every value NaN where the scalar bool `flag` is True."""
  if grad is None:
    return None
  if isinstance(grad, tf.IndexedSlices):
    return tf.IndexedSlices(_poison(grad.values, flag), grad.indices,
                            grad.dense_shape)
  nan = tf.constant(math.nan, grad.dtype)
  return tf.where(flag, nan, grad)


@keras.saving.register_keras_serializable(package="ndq_tf")
class LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
  """`keras.optimizers.LossScaleOptimizer` whose overflow check sees every replica.

  Keras 3.15's `LossScaleOptimizer`, under `tf.distribute.MirroredStrategy`,
  decides whether to skip a step from replica 0's *local* gradients only, so
  a NaN on another replica alone is applied to the weights, with TF's own
  all-reduce as with ours
  (docs/algorithms.md#loss-scaling-under-mirroredstrategy). This subclass
  first all-reduces one flag "my local gradients are not finite" (a
  lossless scalar all-reduce) and, if any replica raised it, turns every
  replica's gradients into NaN, so that the stock check skips the step and
  lowers the scale on every replica.
  Nothing is patched globally; outside a multi-replica context it behaves
  exactly like the Keras class.

  Pass it to `compile` yourself (Keras wraps only plain optimizers):

  >>> with strategy.scope():
  ...   keras.mixed_precision.set_dtype_policy("mixed_float16")
  ...   model = make_model()
  ...   model.compile(
  ...       optimizer=ndq_tf.keras.LossScaleOptimizer(keras.optimizers.SGD()),
  ...       loss="mse")

  Args:
    inner_optimizer, initial_scale, dynamic_growth_steps, **kwargs: as for
      `keras.optimizers.LossScaleOptimizer`.
  """

  def __init__(self, inner_optimizer, *args, **kwargs):
    if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
      keras2 = tf_internals.keras2_version()
      what = (f"a Keras 2 (tf_keras {keras2}) optimizer" if keras2 and
              type(inner_optimizer).__module__.startswith("tf_keras")
              else f"a {type(inner_optimizer).__name__}")
      raise TypeError(
          f"`inner_optimizer` must be a Keras 3 optimizer: "
          f"ndq_tf.keras.LossScaleOptimizer is a Keras 3 feature (Keras "
          f"{keras.__version__}). Received: {what}, inner_optimizer="
          f"{inner_optimizer!r}. With tf_keras, use "
          f"tf_keras.mixed_precision.LossScaleOptimizer, whose gradients "
          f"ndq_tf compresses too.")
    super().__init__(inner_optimizer, *args, **kwargs)

  def apply(self, grads, trainable_variables=None):
    grads = list(grads)
    ctx = tf.distribute.get_replica_context()
    if (ctx is not None and ctx.num_replicas_in_sync > 1
        and not tf.distribute.in_cross_replica_context()):
      bad = tf.cast(tf.logical_not(self.check_finite(grads)), tf.float32)
      with uncompressed():
        any_bad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, bad) > 0
      grads = [_poison(g, any_bad) for g in grads]
    return super().apply(grads, trainable_variables)
