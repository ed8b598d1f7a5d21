"""The exchange engine: everything about a compressed all-reduce but moving bytes.

`ExchangeEngine` is shared by `ndq_tf.CompressedAllReduce`
(MirroredStrategy) and the multi-worker strategy's cross-device ops. It
owns, for both alike:

* the rules of what is compressed (`split`): `SUM` or `MEAN` of dense
  floating tensors (and, when asked, `IndexedSlices` of a static dense
  shape) with a static shape, the same shape and dtype on every replica,
  at least `min_elements` elements, reduced to their own devices, across at
  least two senders, outside `ndq_tf.distribute.uncompressed()`;
* the fusion plan (`fusion_plan.FusionPlan`) of the call's tensors in the
  order the backward pass produces them (`ready_order`), and the seeds:
  sender `s` at step `t` draws its dither from
  `fold_seed(fold_seed([seed, SEED_TAG], t), s)`;
* the exchange's fingerprint (`fingerprint`: options, plan, kind), which
  the transports stamp and check beside the step;
* the senders' codecs (the reference group P1 first, then the nested
  senders P2), their noise state (`nested_state`) and the telemetry;
* the step counter, advanced once per compressed exchange.

The exchange algorithms (chosen per exchange by the option `transport`,
`CompressionOptions.resolve_transport`) are `ndq_tf.core.exchanges`; each
call hands the chosen one an `ExchangeContext` (the options, step,
fingerprint, seeds, state stores and telemetry), not the engine. A
*transport* (`ndq_tf.core.transports`) only moves bytes, knows no codecs,
and is named for what it moves.

Ops are built under the name scopes `ndq_encode`, `ndq_exchange`,
`ndq_decode` and `ndq_sum`, so profiles show where a step's time goes
(`benchmarks/step_breakdown.py`).
"""

import collections

import tensorflow as tf
from absl import logging

from ndq_tf.core import cost_model
from ndq_tf.core import exchanges
from ndq_tf.core import fingerprint
from ndq_tf.core import fusion_codec
from ndq_tf.core import fusion_plan
from ndq_tf.core import low_rank
from ndq_tf.core import nested_state
from ndq_tf.core import ready_order
from ndq_tf.core import scope
from ndq_tf.core import telemetry as telemetry_lib
from ndq_tf.core import tf_internals

__all__ = [
    "SEED_TAG",
    "ExchangeEngine",
    "LocalSender",
]

#: Second word of every exchange's base seed ("NDQT").
SEED_TAG = 0x4E445154

#: The sender index of a rotated codec's shared signs under the integer
#: all-reduce (`exchanges.sum_exchange.ROTATION_SENDER`).
ROTATION_SENDER = exchanges.sum_exchange.ROTATION_SENDER

#: One sender whose gradient this process holds: its index in decode order,
#: its device, and its tensors (in the order of the compressed values).
LocalSender = collections.namedtuple("LocalSender",
                                     ["index", "device", "tensors"])


_WARNED = set()


def _as_reduce_op(reduce_op):
  """A `tf.distribute.ReduceOp` from one or its name (`"sum"`, `"MEAN"`)."""
  if isinstance(reduce_op, str):
    return tf.distribute.ReduceOp(reduce_op.upper())
  return reduce_op


def _warn_once(key, message, *args):
  """Logs `message` the first time `key` comes up in this process.

  At WARNING level, so that it shows with absl's and TF's default
  verbosity (the choice of `exchange="auto"` included: users comparing
  step times need to see it).
  """
  if key not in _WARNED:
    _WARNED.add(key)
    logging.warning("ndq_tf: " + message, *args)


class ExchangeEngine(tf.Module):
  """Compresses, decodes and sums; checkpointable state of the exchange.

  Args:
    options: the `ndq_tf.distribute.CompressionOptions`.
    device: where the step counter, telemetry and noise state live.
    name: the module's name.
  """

  def __init__(self, options, device="/device:CPU:0", name="exchange"):
    super().__init__(name=name)
    self._options = options
    self._device = device
    with tf.init_scope(), tf.device(device):
      self.step = tf.Variable(0, dtype=tf.int32, trainable=False, name="step")
    self.telemetry = telemetry_lib.Telemetry(
        options.transport, options.nested, device=device,
        low_rank=options.low_rank is not None)
    self.nested_state = (nested_state.NestedStateStore(device)
                         if options.nested else None)
    self.feedback = (exchanges.feedback.FeedbackStore(device)
                     if options.reduce_scatter_error_feedback else None)
    self.low_rank = (low_rank.LowRankStore(device)
                     if options.low_rank is not None else None)

  @property
  def options(self):
    return self._options

  @property
  def device(self):
    return self._device

  def stats(self):
    """The telemetry of the last compressed exchange (`telemetry` keys)."""
    return self.telemetry.result(int(self.step.numpy()))

  # -- What is compressed -----------------------------------------------------

  def dense_values(self, value, destinations):
    """The per-replica dense tensors of `value` if it can be compressed.

    Args:
      value: a `PerReplica` (or a plain tensor: one local replica).
      destinations: where the result goes.

    Returns:
      `((tensors, devices), None)` if it can be compressed; else `(None,
      reason)`, where `reason` is None for values that are not compressed
      by rule (integers, small tensors, `IndexedSlices` unless asked) and a
      sentence for a floating value of at least `min_elements` elements
      that cannot be (the caller warns and counts).
    """
    options = self._options
    if isinstance(value, tf_internals.DistributedValues):
      parts = list(value.values)
      devices = tuple(tf_internals.get_devices_from(value))
      targets = tuple(tf_internals.get_devices_from(destinations))
    elif tf.is_tensor(value):
      parts = [value]
      devices = targets = (value.device,)
    else:
      return None, None
    tensors = []
    for v in parts:
      if isinstance(v, tf.IndexedSlices):
        if not options.compress_indexed_slices:
          return None, None
        shape = tf.TensorShape(tf.get_static_value(v.dense_shape))
        if shape.rank is None or not shape.is_fully_defined():
          return None, "IndexedSlices without a static dense shape"
        with tf.device(v.values.device):
          v = tf.scatter_nd(tf.expand_dims(v.indices, -1), v.values, shape)
      elif not isinstance(v, tf.Tensor):
        return None, None
      if not v.dtype.is_floating:
        return None, None
      n = v.shape.num_elements()
      if n is not None and n < options.min_elements:
        return None, None
      if n is None:
        return None, f"a tensor without a static shape ({v.shape})"
      tensors.append(v)
    if any(t.shape != tensors[0].shape or t.dtype != tensors[0].dtype
           for t in tensors):
      return None, "shapes or dtypes that differ between replicas"
    if devices != targets:
      return None, (f"destinations on other devices ({targets}) than the "
                    f"values ({devices})")
    return (tensors, devices), None

  def split(self, reduce_op, pairs, num_senders, gradient):
    """Sorts a `batch_reduce` call's values into compressed and lossless.

    A call is compressed when it is gradient aggregation (`gradient`, see
    `gradient_detection`) or built inside `ndq_tf.distribute.compressed()`,
    and not inside `uncompressed()`; then each value is compressed if
    `dense_values` accepts it. Values of a floating dtype that qualify by
    size but cannot be compressed for a structural reason (destinations or
    devices that differ, no static shape, shapes that differ between
    replicas) travel losslessly with a one-time warning, and are counted
    (`Telemetry`, `lossless_fallbacks`).

    Args:
      reduce_op: a `tf.distribute.ReduceOp` or its name.
      pairs: the `(value, destinations)` pairs of the call.
      num_senders: senders of the exchange (replicas or workers).
      gradient: whether the call is a Keras optimizer's gradient
        aggregation.

    Returns:
      `(compressed, lossless, devices)`: a list of `(index, dense
      per-replica tensors)`, a list of indices into `pairs`, and the devices
      of the compressed values (all of them live on the same devices).
    """
    reduce_op = _as_reduce_op(reduce_op)
    mode = scope.explicit_mode()
    wanted = mode == scope.COMPRESSED or (mode is None and gradient)
    if (not wanted or num_senders < 2 or
        reduce_op not in (tf.distribute.ReduceOp.SUM,
                          tf.distribute.ReduceOp.MEAN)):
      if gradient and mode is None and num_senders >= 2:
        self.telemetry.count(uncompressed_gradient_reductions=1)
      return [], list(range(len(pairs))), None
    compressed, lossless = [], []
    devices = None
    fallbacks = 0
    for index, (value, destinations) in enumerate(pairs):
      dense, reason = self.dense_values(value, destinations)
      if dense is not None:
        if devices is None:
          devices = dense[1]
        elif dense[1] != devices:
          dense, reason = None, (
              f"values on other devices ({dense[1]}) than the first "
              f"compressed one ({devices})")
      if dense is None:
        lossless.append(index)
        if reason:
          fallbacks += 1
          _warn_once(reason.split(" (")[0],
                     "a floating tensor of at least min_elements elements "
                     "travels losslessly: %s.", reason)
      else:
        compressed.append((index, dense[0]))
    if fallbacks:
      self.telemetry.count(lossless_fallbacks=fallbacks)
    if not compressed and gradient:
      self.telemetry.count(uncompressed_gradient_reductions=1)
    return compressed, lossless, devices

  # -- The exchange ------------------------------------------------------------

  def seed(self, sender, step, segment=None):
    """The `[2]` `int32` seed of `sender`'s payload at `step`.

    Args:
      sender: the sender's index (or `ROTATION_SENDER`).
      step: the step counter's value.
      segment: None: the payload's seed; an index: the seed of that codec
        segment of the payload (`fusion_codec.segment_seed`, as
        `fusion_codec.encode_flat` derives it).
    """
    return fusion_codec.derive_seed(
        tf.constant(self._base_seed(), tf.int32), step, sender, segment)

  def _base_seed(self):
    return (self._options.seed, SEED_TAG)

  def exchange(self, transports, senders, reduce_op, divisor=None,
               lossless_values=()):
    """Encodes the local senders, moves the payloads, decodes and sums.

    Args:
      transports: one transport per exchange name (`{"all_gather":
        Transport, ...}`, `ndq_tf.core.transports`) over the same
        senders and receivers; the options pick one (`resolve_transport`).
      senders: list of `LocalSender`, the senders this process encodes, in
        sender order; their tensors have the same shapes and dtypes.
      reduce_op: `SUM`, or `MEAN` (the sum divided by `divisor`), as a
        `tf.distribute.ReduceOp` or its name.
      divisor: what a `MEAN` divides by; default the number of senders.
      lossless_values: the values of the same call that travel losslessly
        (for the telemetry).

    Returns:
      One list of summed tensors (the senders' shapes and dtypes) per
      receiver of the transport, in its order.
    """
    mean = _as_reduce_op(reduce_op) == tf.distribute.ReduceOp.MEAN
    # Fused in the order the backward pass produces them: chunk 0 then
    # needs only the last layers' gradients (`ready_order`).
    order = ready_order.ready_order(len(senders[0].tensors))
    senders = [x._replace(tensors=ready_order.in_ready_order(x.tensors, order))
               for x in senders]
    with tf.device(self._device):
      step = self.step.read_value()
    if self._options.low_rank is not None:
      results = low_rank.exchange(self, transports, senders, step, mean,
                                  divisor, lossless_values)
    else:
      results = self.run_round(self._options, transports, senders, step,
                               mean=mean, divisor=divisor,
                               lossless_values=lossless_values)
    with tf.device(self._device):
      self.step.assign_add(1)
    return [ready_order.in_call_order(r, order) for r in results]

  def run_round(self, options, transports, senders, step, mean=False,
                divisor=None, lossless_values=(), round_tag=0,
                telemetry=None):
    """One exchange of the senders' tensors with `options`' codecs.

    Args:
      options: the options of this exchange (the engine's, or a low-rank
        round's, `CompressionOptions.round_options`).
      transports, senders, divisor, lossless_values: as for `exchange`.
      step: the step counter's value.
      mean: whether to divide the sum by `divisor` (or the senders).
      round_tag: 0, or the round of a low-rank exchange: added to the
        base seed's second word, and to the fingerprint.
      telemetry: what `ExchangeContext.record` records into (default the
        engine's telemetry).

    Returns:
      One list of summed tensors per receiver.
    """
    num_senders = transports["all_gather"].num_senders
    codecs = options.sender_codecs(num_senders)
    plan = fusion_plan.FusionPlan.from_tensors(senders[0].tensors,
                                               codecs[0].bucket_size)
    model = cost_model.time_model([x.device for x in senders],
                                 transports["all_gather"].shared_memory)
    kind = options.resolve_transport(num_senders, plan.total_size, **model)
    if options.transport == "auto":
      _warn_once(("auto", num_senders, kind), "exchange='auto' sums the "
                 "gradients of %d senders by %r (per sender and exchange of "
                 "%d values, ndq_tf.core.cost_model.auto: %s).", num_senders,
                 kind, plan.total_size, cost_model.summary(
                     codecs, plan.total_size, num_senders, **model))
    # What every receiver must agree on, checked by the transports; with
    # senders in other processes, also what their TensorFlow decodes. The
    # engine's options (a low-rank round's included).
    mark = fingerprint.fingerprint(
        self._options, plan.signature,
        kind + (f":round{round_tag}" if round_tag else ""),
        decoded_bits=num_senders > len(senders))
    lossless_elements, lossless_bits = telemetry_lib.lossless_size(
        lossless_values)
    base_seed = self._base_seed()
    context = exchanges.ExchangeContext(
        options=options, step=step, fingerprint=mark,
        base_seed=(base_seed[0], base_seed[1] + round_tag),
        device=self._device,
        telemetry=self.telemetry if telemetry is None else telemetry,
        nested_state=self.nested_state, feedback=self.feedback, mean=mean,
        divisor=divisor, lossless_elements=lossless_elements,
        lossless_bits=lossless_bits)
    return exchanges.get(kind).run(context, transports[kind], codecs,
                                   plan, senders)
