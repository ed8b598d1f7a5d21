"""Which all-reduces are gradient aggregation: the only ones compressed by default.

Gradients are aggregated in two ways, and both are recognised:

* **By destination.** `strategy.extended.batch_reduce_to(SUM,
  grads_and_vars)` reduces each gradient *to its variable*: every
  destination is a trainable `tf.Variable`. tf_keras (Keras 2, imported as
  `tf_keras` or as `tf.keras` with `TF_USE_LEGACY_KERAS=1`) aggregates so,
  in its optimizers' `merge_call` (`optimizers/utils.py`,
  `_all_reduce_sum_fn`), and so does TF's documented low-level loop
  (`merge_call`, `batch_reduce_to`, `extended.update`). The signal is public
  API (a destination that is a trainable variable), so it survives private
  renames. Synchronized BatchNormalization, metrics and losses reduce to
  their own values (`ReplicaContext.all_reduce`) or to non-trainable
  variables, and `strategy.reduce` never reaches `batch_reduce`.
* **By context.** A Keras 3 optimizer aggregates with
  `tf.distribute.get_replica_context().all_reduce(SUM, grads)` inside its
  own `apply` (under `model.fit`, in custom loops calling
  `apply_gradients`, and in `LossScaleOptimizer` and gradient accumulation
  alike). Nothing in the values tells those from the other all-reduces,
  but the context does: Keras enters a name scope whose `caller` is the
  optimizer around `apply`, and keeps that stack per thread.

`ReductionLabels` carries the second fact from where it is known to where
the reduction happens. `ReplicaContext.all_reduce` first asks the
strategy's extended whether to use `merge_call` (`_use_merge_call`), in
the replica thread; `LabellingExtendedMixin` answers as TF does and notes,
for that thread, whether a Keras optimizer is applying gradients. Every
replica thread then blocks in `merge_call` while the main thread runs the
reduction, where the cross-device ops `consume()` the notes: the reduction
is gradient aggregation when every replica noted so. Notes are per replica
thread, overwritten by the next `all_reduce` of that thread, and dropped
when `strategy.run` returns, so a reduction made outside `strategy.run` is
never taken for one.

**Never silent.** What neither signal recognises (a
`ReplicaContext.all_reduce` of gradients by hand, then an update; an
optimizer that aggregates in another way) travels losslessly. The strategy
watches for it: when, within one `strategy.run`, a trainable variable is
updated (`extended.update`, `var.assign_sub` in a `merge_call`) after an
all-reduce that would have been compressed had it been recognised, and no
gradient aggregation was recognised in that run, it logs a warning once
(naming the optimizer if it finds one, and what to do:
`ndq_tf.distribute.compressed()`) and counts the step in the telemetry
(`unrecognised_gradient_steps`). All-reduces inside
`compressed()`/`uncompressed()` are the user's choice and never warned
about.

Limits, by construction: extra all-reduces a custom Keras 3 optimizer
makes inside its own `apply` are taken for gradients, and so is any
`batch_reduce_to` whose destinations are all trainable variables. A note
is consumed by the next reduction of the main thread, so a `merge_call`
written by hand right after a variable write made inside an optimizer's
name scope would be compressed; no path of Keras or TF does that. The
labels are fixed when a `tf.function` is traced, as for the scopes.
`extended.reduce_to(SUM, grad, destinations=var)` of one gradient to its
trainable variable is sent as a `batch_reduce_to` of that one pair (TF
would send it to a `ReductionToOneDevice` of its own on CPUs, past the
cross-device ops), and so is recognised by its destination.

When this Keras hides its name-scope stack
(`tf_internals.keras_optimizer_in_scope` returns None), Keras 3's
reductions are not recognised: gradients stay lossless unless built in
`ndq_tf.distribute.compressed()`, and a warning says so once.
"""

import inspect
import threading

import tensorflow as tf
from absl import logging

from ndq_tf.core import scope
from ndq_tf.core import tf_internals

__all__ = [
    "LabellingExtendedMixin",
    "ReductionLabels",
    "destinations_are_trainable_variables",
    "warn_if_single_sender",
    "would_compress",
]

# Warnings given once per process (a key per kind); tests may clear it.
_WARNED = set()


def _warn_once(key, message, *args):
  if key not in _WARNED:
    _WARNED.add(key)
    logging.warning("ndq_tf: " + message, *args)


def _as_reduce_op(reduce_op):
  if isinstance(reduce_op, str):
    return tf.distribute.ReduceOp(reduce_op.upper())
  return reduce_op


def destinations_are_trainable_variables(pairs):
  """Whether every destination of a `batch_reduce` is a trainable variable.

  `batch_reduce_to(SUM, grads_and_vars)` (tf_keras' optimizers, TF's
  low-level loop) reduces each gradient to its variable.

  Args:
    pairs: the `(value, destinations)` pairs of the call.
  """
  return bool(pairs) and all(
      isinstance(d, tf.Variable) and bool(getattr(d, "trainable", False))
      for _, d in pairs)


def would_compress(reduce_op, pairs, num_senders, min_elements):
  """Whether a gradient label would make this call compress something.

  A cheap, op-free version of `ExchangeEngine.split`'s rules for dense
  values: SUM or MEAN, at least two senders, a floating per-replica value
  of a static shape with at least `min_elements` elements.
  """
  if num_senders < 2 or _as_reduce_op(reduce_op) not in (
      tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN):
    return False
  for value, _ in pairs:
    parts = (value.values if isinstance(value, tf_internals.DistributedValues)
             else (value,))
    if all(isinstance(v, tf.Tensor) and v.dtype.is_floating and
           (v.shape.num_elements() or 0) >= min_elements for v in parts):
      return True
  return False


def _optimizer_of(fn):
  """`module.Class` of the optimizer an update function belongs to, or None."""
  fn = inspect.unwrap(fn)  # TF wraps it for autograph (functools.wraps).
  candidates = [getattr(fn, "__self__", None)]
  for cell in getattr(fn, "__closure__", None) or ():
    try:
      candidates.append(cell.cell_contents)
    except ValueError:  # An empty cell.
      pass
  for obj in candidates:
    if (obj is not None and not isinstance(obj, type) and
        callable(getattr(obj, "apply_gradients", None))):
      cls = type(obj)
      return f"{cls.__module__}.{cls.__qualname__}"
  return None


def warn_if_single_sender(who, num_senders, unit="replica"):
  """Warns once per process that a strategy of one sender compresses nothing.

  Args:
    who: the strategy's name.
    num_senders: its replicas (MirroredStrategy) or workers (MWMS).
    unit: `"replica"` or `"worker"`.
  """
  if num_senders != 1:
    return
  if unit == "replica":
    hint = ("To try it on one machine, split the CPU into logical devices "
            "before TensorFlow initializes: "
            "tf.config.set_logical_device_configuration("
            "tf.config.list_physical_devices('CPU')[0], "
            "[tf.config.LogicalDeviceConfiguration()] * 4).")
  else:
    hint = ("Its local devices are summed losslessly; on one machine use "
            "ndq_tf.MirroredStrategy.")
  _warn_once(("single", unit),
             "%s has one %s, so it compresses nothing: no gradient travels "
             "between %ss. %s", who, unit, unit, hint)


class ReductionLabels:
  """Per replica thread: was its last `all_reduce` gradient aggregation?

  Also, per `strategy.run`, whether gradients may have travelled
  uncompressed because nothing recognised them (`record`, `check_update`).
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._notes = {}
    self._warned = False
    self._end_run()

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
            "stack, so Keras 3's gradient aggregation cannot be recognised; "
            "gradients travel losslessly unless all-reduced inside "
            "ndq_tf.distribute.compressed() or reduced to their variables "
            "(strategy.extended.batch_reduce_to).")
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

  def is_gradient(self, reduce_op, pairs, num_senders, min_elements):
    """In the main thread, in a `batch_reduce`: is it gradient aggregation?

    Consumes the notes (Keras 3's optimizers) and looks at the
    destinations (tf_keras, TF's low-level loop); records the answer for
    `check_update`.

    Args:
      reduce_op: the call's `ReduceOp`.
      pairs: its `(value, destinations)` pairs.
      num_senders: senders of the exchange (replicas or workers).
      min_elements: the compression's `min_elements`.
    """
    noted = self.consume()
    gradient = noted or destinations_are_trainable_variables(pairs)
    if self._in_run:
      if gradient or scope.explicit_mode() is not None:
        self._run_recognised = True
      elif would_compress(reduce_op, pairs, num_senders, min_elements):
        self._run_unrecognised += 1
    return gradient

  def begin_run(self):
    """A `strategy.run` starts (main thread)."""
    self.clear()
    self._in_run = True
    self._run_recognised = False
    self._run_unrecognised = 0
    self._run_reported = False

  def _end_run(self):
    self._in_run = False
    self._run_recognised = False
    self._run_unrecognised = 0
    self._run_reported = False

  def end_run(self):
    """The `strategy.run` returned (main thread)."""
    self.clear()
    self._end_run()

  def check_update(self, var, fn, telemetry, who):
    """Before `extended.update(var, fn, ...)`: warns and counts a step whose
    gradients were not recognised (see the module doc).

    Args:
      var: the variable updated.
      fn: the update function (its optimizer is named, if found).
      telemetry: the engine's `Telemetry`, or None.
      who: the strategy's name, for the message.
    """
    if (not self._in_run or self._run_reported or self._run_recognised or
        not self._run_unrecognised or
        not bool(getattr(var, "trainable", False))):
      return
    self._run_reported = True
    optimizer = _optimizer_of(fn)
    by = (f", applied by the optimizer {optimizer}, whose gradient "
          f"aggregation was not recognised" if optimizer else "")
    _warn_once(
        ("unrecognised", optimizer),
        "a step of %s updated trainable variables from all-reduced values it "
        "did not recognise as gradient aggregation, so those gradients "
        "travelled uncompressed%s. All-reduce them inside `with "
        "ndq_tf.distribute.compressed():`, reduce them to their variables "
        "with `strategy.extended.batch_reduce_to(ReduceOp.SUM, "
        "grads_and_vars)`, or apply them with a Keras 3 or tf_keras "
        "optimizer. Such steps are counted in the telemetry "
        "(`unrecognised_gradient_steps`).", who, by)
    if telemetry is not None:
      telemetry.count(unrecognised_gradient_steps=1)


class LabellingExtendedMixin:
  """Mix into a `MirroredExtended` subclass (MirroredStrategy or MWMS).

  Provides `reduction_labels`, which the strategy hands to its compressing
  cross-device ops, and watches variable updates for gradients that
  travelled unrecognised.
  """

  _ndq_who = "ndq_tf"

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
    self.reduction_labels.begin_run()
    try:
      return super()._call_for_each_replica(fn, args, kwargs)
    finally:
      self.reduction_labels.end_run()

  def _reduce_to(self, reduce_op, value, destinations, options):
    # A gradient reduced to its own trainable variable alone is gradient
    # aggregation as much as a `batch_reduce_to` of the pair: send it that
    # way, so that it is recognised and compressed (TF would otherwise send
    # it to a `ReductionToOneDevice` of its own when the variable has a CPU
    # copy, past the cross-device ops, losslessly and in silence).
    # With one device per worker, a multi-worker `merge_call` hands over
    # each worker's gradient as a plain tensor (TF's own `_reduce_to` then
    # reduces it across workers).
    one_per_worker = (isinstance(value, tf.Tensor) and
                      getattr(self, "_num_workers", 1) > 1 and
                      len(getattr(self, "worker_devices", ())) == 1)
    if ((isinstance(value, tf_internals.PerReplica) or one_per_worker) and
        destinations_are_trainable_variables([(value, destinations)])):
      return self._batch_reduce_to(reduce_op, [(value, destinations)],
                                   options)[0]
    return super()._reduce_to(reduce_op, value, destinations, options)

  def _update(self, var, fn, args, kwargs, group):
    engine = getattr(self.__dict__.get("_cross_device_ops"), "engine", None)
    self.reduction_labels.check_update(
        var, fn, getattr(engine, "telemetry", None), self._ndq_who)
    return super()._update(var, fn, args, kwargs, group)
