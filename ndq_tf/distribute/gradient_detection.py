"""Which all-reduces are gradient aggregation: the only ones compressed by default.

A Keras optimizer aggregates gradients with
`tf.distribute.get_replica_context().all_reduce(SUM, grads)` inside its own
`apply` (under `model.fit`, in custom loops calling `apply_gradients`, and
in `LossScaleOptimizer` and gradient accumulation alike). Synchronized
BatchNormalization, metrics, losses and user code use the same
`all_reduce`; their statistics, counts and normalizers must stay exact.
Nothing in the values tells the two apart, but the context does: Keras
enters a name scope whose `caller` is the optimizer around `apply`, and
keeps that stack per thread.

`ReductionLabels` carries that fact from where it is known to where the
reduction happens. `ReplicaContext.all_reduce` first asks the strategy's
extended whether to use `merge_call` (`_use_merge_call`), in the replica
thread; `LabellingExtendedMixin` answers as TF does and notes, for that
thread, whether a Keras optimizer is applying gradients. Every replica
thread then blocks in `merge_call` while the main thread runs the
reduction, where the cross-device ops `consume()` the notes: the reduction
is gradient aggregation when every replica noted so. Notes are per replica
thread, overwritten by the next `all_reduce` of that thread, and dropped
when `strategy.run` returns, so a reduction made outside `strategy.run` is
never taken for one.

Limits, by construction: gradients aggregated outside a Keras 3
optimizer's `apply` (by hand, or by other optimizers) are not recognised:
build them inside `compressed()`. Extra all-reduces a custom Keras optimizer
makes inside its own `apply` are taken for gradients. A note is consumed by
the next reduction of the main thread, so a `merge_call` written by hand
right after a variable write made inside an optimizer's name scope would
be compressed; no path of Keras or TF does that. The labels are fixed when
a `tf.function` is traced, as for the scopes.

When this Keras hides its name-scope stack
(`tf_internals.keras_optimizer_in_scope` returns None), no reduction is
recognised: gradients stay lossless unless built in
`ndq_tf.distribute.compressed()`, and a warning says so once.
"""

import threading

import tensorflow as tf
from absl import logging

from ndq_tf.distribute import tf_internals

__all__ = [
    "LabellingExtendedMixin",
    "ReductionLabels",
]


class ReductionLabels:
  """Per replica thread: was its last `all_reduce` gradient aggregation?"""

  def __init__(self):
    self._lock = threading.Lock()
    self._notes = {}
    self._warned = False

  def note(self):
    """Called in a replica thread before each of its `merge_call`s."""
    if tf.distribute.in_cross_replica_context():
      return  # The main thread itself: not a replica's all_reduce.
    gradient = tf_internals.keras_optimizer_in_scope()
    if gradient is None:
      if not self._warned:
        self._warned = True
        logging.warning(
            "ndq_tf: this Keras version does not expose its name-scope "
            "stack, so gradient aggregation cannot be recognised; gradients "
            "travel losslessly unless all-reduced inside "
            "ndq_tf.distribute.compressed().")
      gradient = False
    with self._lock:
      self._notes[threading.get_ident()] = gradient

  def consume(self):
    """In the main thread, in a reduction: whether every replica noted a gradient.

    Clears the notes.
    """
    with self._lock:
      notes = list(self._notes.values())
      self._notes.clear()
    return bool(notes) and all(notes)

  def clear(self):
    with self._lock:
      self._notes.clear()


class LabellingExtendedMixin:
  """Mix into a `MirroredExtended` subclass (MirroredStrategy or MWMS).

  Provides `reduction_labels`, which the strategy hands to its compressing
  cross-device ops.
  """

  @property
  def reduction_labels(self):
    labels = self.__dict__.get("_ndq_reduction_labels")
    if labels is None:
      labels = self.__dict__.setdefault("_ndq_reduction_labels",
                                        ReductionLabels())
    return labels

  def _use_merge_call(self):
    self.reduction_labels.note()
    return super()._use_merge_call()

  def _call_for_each_replica(self, fn, args, kwargs):
    self.reduction_labels.clear()
    try:
      return super()._call_for_each_replica(fn, args, kwargs)
    finally:
      self.reduction_labels.clear()
