"""What both compressed strategies share: saving their state, refusing XLA.

`StrategyState` is a mixin for `ndq_tf.MirroredStrategy` and
`ndq_tf.MultiWorkerMirroredStrategy`. Each tracks its exchange engine (the
dither's step counter, the nested senders' noise state, the error
feedback's and the low-rank exchange's residuals and factors), so
`tf.train.Checkpoint(model=...)` saves it, and is a Keras saveable, so
`model.save_weights` and `keras.callbacks.BackupAndRestore` save it too
(Keras walks the model's attributes, and `model.distribute_strategy` is
one).
"""

import numpy as np

from ndq_tf.core import tf_internals

__all__ = [
    "StrategyState",
    "xla_bypass_error",
]


def xla_bypass_error(who, devices, fn=None):
  """The error for an all-reduce that TF would run outside the cross-device ops.

  TensorFlow's mirrored strategies skip `merge_call`, and so the
  cross-device ops that compress, when the replica function is compiled
  with XLA on all-GPU devices: they would all-reduce uncompressed float
  gradients without a word. Both strategies refuse instead.
  """
  return ValueError(
      f"{who} cannot compress under XLA: TensorFlow then bypasses the "
      f"cross-device ops (all-GPU devices) or cannot run their merge_call "
      f"inside XLA (other devices). Do not jit-compile the replica function "
      f"(model.compile(jit_compile=False), the default 'auto' under a "
      f"strategy, or tf.function without jit_compile). Received: "
      f"fn={fn!r} jit-compiled on devices {tuple(devices)}.")


class StrategyState(tf_internals.Trackable, tf_internals.KerasSaveable):
  """Checkpointing and Keras saving of a compressed strategy's engine.

  Subclasses call `_track_engine(engine)` once built and provide
  `compression_engine`.
  """

  def _track_engine(self, engine):
    self._maybe_initialize_trackable()
    self._track_trackable(engine, name="compression")

  @property
  def compression_engine(self):
    raise NotImplementedError

  @property
  def compression_step(self):
    """`int32` variable, the dither's step (one per compressed exchange).

    Saved with the model: `model.save_weights`,
    `keras.callbacks.BackupAndRestore` and `tf.train.Checkpoint(model=model)`
    (Keras models track their strategy). Without a Keras model:
    `tf.train.Checkpoint(..., compression=strategy.compression_engine)`.
    """
    return self.compression_engine.step

  def compression_stats(self):
    """The telemetry of the last compressed exchange of this process.

    The keys of `ndq_tf.core.telemetry`, the same for both strategies.
    """
    return self.compression_engine.stats()

  def _obj_type(self):
    # Keras walks the attributes of saveables, skipping those of a reference
    # object of this type; any type it knows is fine here, and which types
    # it knows depends on the Keras version.
    return tf_internals.keras_saveable_obj_type()

  def save_own_variables(self, store):
    engine = self.compression_engine
    store["step"] = np.asarray(engine.step.numpy())
    if engine.nested_state is not None:
      engine.nested_state.save(store)
    if engine.feedback is not None:
      engine.feedback.save(store)
    if engine.low_rank is not None:
      engine.low_rank.save(store)

  def load_own_variables(self, store):
    try:
      value = store["step"]
    except (KeyError, ValueError):
      return  # Saved without a compressed strategy: keep the counter.
    engine = self.compression_engine
    engine.step.assign(int(np.asarray(value)))
    if engine.nested_state is not None:
      engine.nested_state.load(store)
    if engine.feedback is not None:
      engine.feedback.load(store)
    if engine.low_rank is not None:
      engine.low_rank.load(store)

  def __reduce__(self):
    # KerasSaveable pickles models through the Keras format; a strategy is
    # not picklable.
    raise TypeError(f"{type(self).__name__} cannot be pickled.")
