"""The exchange engine: everything about a compressed all-reduce but moving bytes.

`ExchangeEngine` is shared by `ndq_tf.CompressedAllReduce`
(MirroredStrategy) and the multi-worker strategy's cross-device ops. It
owns, for both alike:

* the rules of what is compressed (`split`): `SUM` or `MEAN` of dense
  floating tensors (and, when asked, `IndexedSlices` of a static dense
  shape) with a static shape, the same shape and dtype on every replica,
  at least `min_elements` elements, reduced to their own devices, across at
  least two senders, outside `ndq_tf.distribute.uncompressed()`;
* the fusion plan (`fusion.FusionPlan`) of the call's tensors in the order
  the backward pass produces them (`ready_order`), and the seeds: sender `s` at step
  `t` draws its dither from `fold_seed(fold_seed([seed, SEED_TAG], t), s)`;
* the exchange's fingerprint (`fingerprint`: options, plan, kind), which
  the transports stamp and check beside the step;
* the senders' codecs (the reference group P1 first, then the nested
  senders P2);
* encoding on each local sender's device;
* decoding every sender in sender order with side information
  (`fusion.decode_senders`) and the deterministic sum
  (`fusion.sum_decoded`), so every receiver obtains the same bits;
* the nested senders' own statistics and their noise state
  (`nested_state`), and the telemetry (`telemetry`);
* the step counter, advanced once per compressed exchange.

A *transport* (`ndq_tf.distribute.transports`) only moves bytes and knows
nothing of codecs. Two kinds, chosen per exchange by the option
`transport` (`CompressionOptions.resolve_transport`):

* `"all_gather"`: every receiver gets every sender's packed `int32`
  payload and decodes each in sender order (`Transport`);
* `"all_reduce"`: for codecs whose payloads add up
  (`ndq_tf.theory.summed_form`), the senders agree on one scale per bucket
  (a MAX all-reduce), encode with it, and their integer codes, packed in
  lanes that cannot carry into each other (`ndq_tf.ops.lane_layout`), are
  summed exactly by an integer all-reduce (`SummingTransport`); every
  receiver decodes the sum once, subtracting every sender's dither
  (`codec.decode_symbol_sum`). Float16/Float32 values go through a float
  ring instead. docs/scaling.md has the cost model and the choice.

Ops are built under the name scopes `ndq_encode`, `ndq_exchange`,
`ndq_decode` and `ndq_sum`, so profiles show where a step's time goes
(`benchmarks/step_breakdown.py`).
"""

import collections
import contextlib

import tensorflow as tf
from absl import logging

from ndq_tf import ops as ndq_ops
from ndq_tf import theory
from ndq_tf.distribute import fingerprint
from ndq_tf.distribute import fusion
from ndq_tf.distribute import nested_state
from ndq_tf.distribute import ready_order
from ndq_tf.distribute import scope
from ndq_tf.distribute import telemetry as telemetry_lib
from ndq_tf.distribute import tf_internals

__all__ = [
    "SEED_TAG",
    "ExchangeEngine",
    "LocalSender",
]

#: Second word of every exchange's base seed ("NDQT").
SEED_TAG = 0x4E445154

#: The sender index whose seed a rotated codec's shared signs take under
#: the integer all-reduce (no real sender has it): the same for every
#: sender of a step, a new pattern every step.
ROTATION_SENDER = -1

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
  verbosity (the choice of `transport="auto"` included: users comparing
  step times need to see it).
  """
  if key not in _WARNED:
    _WARNED.add(key)
    logging.warning("ndq_tf: " + message, *args)


def _chunk_scope(index, count):
  """The name scope `ndq_chunk<index>` of a chunk, if there are several."""
  if count > 1:
    return tf.name_scope(f"ndq_chunk{index}")
  return contextlib.nullcontext()


def _join(parts):
  """One 1-D tensor from a chunk's parts (the part itself if only one)."""
  return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]


def _split_results(plan, chunks, totals, devices):
  """Every receiver's list of summed tensors from its chunks' sums.

  `totals` maps a receiver to its sum per chunk; receivers without sums of
  their own (on a transport with `shared_memory`) get the first one's
  tensors, handed over on their devices.
  """
  results = []
  for r in sorted(devices):
    with tf.device(devices[r]), tf.name_scope("ndq_sum"):
      if r in totals:
        results.append(plan.split_chunks(chunks, totals[r]))
      else:
        results.append([tf.identity(t) for t in results[0]])
  return results


def _model_bits(codecs, num_elements, num_senders):
  """`all_gather` and `all_reduce` bits by the cost model, for the log."""
  parts = []
  for kind in ("all_gather", "all_reduce"):
    try:
      bits = theory.exchange_bits(codecs, num_elements, num_senders, kind)
    except ValueError:
      continue
    parts.append(f"{kind} {bits:.0f}")
  return ", ".join(parts)


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
    self.telemetry = telemetry_lib.Telemetry(options.transport, options.nested,
                                             device=device)
    self.nested_state = (nested_state.NestedStateStore(device)
                         if options.nested else None)

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

  def seed(self, sender, step):
    """The `[2]` `int32` seed of `sender`'s payload at `step`."""
    base = tf.constant([self._options.seed, SEED_TAG], tf.int32)
    return fusion.derive_seed(base, step, sender)

  def exchange(self, transports, senders, reduce_op, divisor=None,
               lossless_values=()):
    """Encodes the local senders, moves the payloads, decodes and sums.

    Args:
      transports: `{"all_gather": Transport, "all_reduce":
        SummingTransport}` (`ndq_tf.distribute.transports`) over the same
        senders and receivers; the exchange uses the one the options pick
        (`CompressionOptions.resolve_transport`).
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
    options = self._options
    mean = _as_reduce_op(reduce_op) == tf.distribute.ReduceOp.MEAN
    num_senders = transports["all_gather"].num_senders
    # Fused in the order the backward pass produces them: chunk 0 then
    # needs only the last layers' gradients (`ready_order`).
    order = ready_order.ready_order(len(senders[0].tensors))
    senders = [x._replace(tensors=ready_order.in_ready_order(x.tensors, order))
               for x in senders]
    codecs = options.sender_codecs(num_senders)
    plan = fusion.FusionPlan.from_tensors(senders[0].tensors,
                                          codecs[0].bucket_size)
    with tf.device(self._device):
      step = self.step.read_value()
    kind = options.resolve_transport(num_senders, plan.total_size)
    if options.transport == "auto":
      _warn_once(("auto", num_senders, kind), "transport='auto' sums the "
                 "gradients of %d senders by %r (%s bits per sender and "
                 "exchange of %d values by the cost model, "
                 "ndq_tf.theory.exchange_bits).", num_senders, kind,
                 _model_bits(codecs, plan.total_size, num_senders),
                 plan.total_size)
    # What every receiver must agree on, checked by the transports.
    mark = fingerprint.fingerprint(options, plan.signature, kind)
    if kind == "all_reduce":
      results = self._exchange_sum(transports["all_reduce"], codecs[0], plan,
                                   senders, step, mean, divisor,
                                   lossless_values, mark)
    else:
      results = self._exchange_gather(transports["all_gather"], codecs, plan,
                                      senders, step, mean, divisor,
                                      lossless_values, mark)
    with tf.device(self._device):
      self.step.assign_add(1)
    return [ready_order.in_call_order(r, order) for r in results]

  def _exchange_gather(self, transport, codecs, plan, senders, step, mean,
                       divisor, lossless_values, mark):
    """Every sender's payload to every receiver; decode each, then sum.

    Chunk by chunk (`FusionPlan.chunks`): chunk `k` is encoded, moved,
    decoded and summed by ops that depend on no other chunk's, so TF runs
    chunk `k`'s exchange while chunk `k + 1` is encoded and chunk `k - 1`
    decoded (a multi-worker transport's collectives keep program order).
    """
    options = self._options
    num_senders = transport.num_senders
    chunks = plan.chunks(options.chunk_elements)
    nested = [x.index for x in senders
              if codecs[x.index].needs_side_information]
    noise = variables = None
    if nested:
      variables = self.nested_state.variables_for(
          plan.signature, len(senders), plan.total_size // plan.bucket_size)
      if options.adaptive:
        with tf.device(self._device):
          # Each nested sender's own last noise, times its gain: known to
          # the sender alone; only the steps it picks travel (in the wire).
          noise = variables[0].read_value() * variables[1].read_value()

    local = [x.index for x in senders]
    totals = collections.defaultdict(list)  # Receiver -> one sum per chunk.
    devices = {}
    # The local nested senders' own chunks, for their statistics.
    own = collections.defaultdict(lambda: collections.defaultdict(list))

    def keep_own(me, values, wire, side, decoded, chunk):
      own[me]["values"].append(values)
      own[me]["side"].append(side)
      own[me]["decoded"].append(decoded)
      own[me]["scales"].append(fusion.wire_scales(codecs[me], wire, plan,
                                                  chunk))
    payload_words = framing_bits = link_bits = 0
    for k, chunk in enumerate(chunks):
      with _chunk_scope(k, len(chunks)):
        fused, wires = {}, []
        for row, sender in enumerate(senders):
          with tf.device(sender.device), tf.name_scope("ndq_encode"):
            fused[sender.index] = plan.flatten(sender.tensors, chunk)
            wires.append(fusion.encode_flat(
                codecs[sender.index], fused[sender.index],
                self.seed(sender.index, step), plan,
                noise_scale=(noise[row] if noise is not None
                             and sender.index in nested else None),
                chunk=chunk))

        words = [plan.chunk_wire_words(c, chunk) for c in codecs]
        with tf.name_scope("ndq_exchange"):
          receptions = transport.exchange(
              [(x.index, x.device, w) for x, w in zip(senders, wires)],
              words, step, fingerprint=mark)
        payload_words += sum(words[i] for i in local)
        framing_bits += transport.framing_bits(words, local)
        link_bits += theory.exchange_bits(codecs, chunk.length, num_senders,
                                          "all_gather")

        if transport.shared_memory:
          # One memory: every receiver would decode the same payloads into
          # the same bits, so each sender is decoded once, on its own
          # device, and every receiver gets the one sum.
          for r, reception in enumerate(receptions):
            devices[r] = reception.device
          first = receptions[0]
          with tf.device(first.device), tf.name_scope("ndq_decode"), \
              tf.control_dependencies(first.checks):
            seeds = [self.seed(i, step) for i in range(num_senders)]
            decoded, side = fusion.decode_senders(
                codecs, first.wires, seeds, plan,
                return_side_information=True, chunk=chunk,
                devices=[x.device for x in sorted(senders,
                                                  key=lambda x: x.index)])
            for me in nested:
              keep_own(me, fused[me], first.wires[me], side[me],
                       decoded[me], chunk)
          with tf.device(first.device), tf.name_scope("ndq_sum"):
            totals[0].append(fusion.sum_senders(decoded, mean=mean,
                                                divisor=divisor))
          continue
        for r, reception in enumerate(receptions):
          devices[r] = reception.device
          with tf.device(reception.device), tf.name_scope("ndq_decode"), \
              tf.control_dependencies(reception.checks):
            # A receiver derives every sender's seed from the step that
            # sender used (the transport reports it), never from its own
            # counter alone.
            steps = reception.steps
            seeds = [self.seed(i, step if steps is None else steps[i])
                     for i in range(num_senders)]
            me = reception.local_sender
            if me in nested:
              decoded, side = fusion.decode_senders(
                  codecs, reception.wires, seeds, plan,
                  return_side_information=True, chunk=chunk)
              # The nested sender on this device knows its true gradient:
              # its exact noise and real overloads (only [num_buckets]
              # floats and a few scalars leave the device).
              keep_own(me, fused[me], reception.wires[me], side[me],
                       decoded[me], chunk)
            else:
              decoded = fusion.decode_senders(codecs, reception.wires, seeds,
                                              plan, chunk=chunk)
          with tf.device(reception.device), tf.name_scope("ndq_sum"):
            totals[r].append(fusion.sum_senders(decoded, mean=mean,
                                                divisor=divisor))

    results = _split_results(plan, chunks, totals, devices)
    if nested:
      statistics = {}
      for me, mine in own.items():
        row = local.index(me)
        with tf.device(senders[row].device), tf.name_scope("ndq_decode"):
          values, side, decoded, scales = (
              _join(mine[key])
              for key in ("values", "side", "decoded", "scales"))
          statistics[me] = nested_state.sender_statistics(
              codecs[me], None, values, side, decoded, plan,
              noise_scale=None if noise is None else noise[row],
              scales=scales)
      self._update_nested_state(variables, senders, statistics, plan)
    self._record(transport, plan, senders, lossless_values,
                 payload_bits=32 * payload_words, framing_bits=framing_bits,
                 link_bits=len(senders) * link_bits)
    return results

  def _exchange_sum(self, transport, codec, plan, senders, step, mean,
                    divisor, lossless_values, mark):
    """Shared scales, codes summed as integers, one decode of the sum.

    One MAX all-reduce shares the scales of the whole buffer; then chunk by
    chunk (`FusionPlan.chunks`), each with the dither it has in the whole
    buffer: encode, integer all-reduce, decode, so chunk `k`'s all-reduce
    runs while chunk `k + 1` is encoded and chunk `k - 1` decoded.
    """
    form = theory.summed_form(codec)
    num_senders = transport.num_senders
    chunks = plan.chunks(self._options.chunk_elements)

    def finish(total):
      if mean:
        total = total / float(divisor or num_senders)
      return total

    totals = collections.defaultdict(list)  # Receiver -> one sum per chunk.
    devices = {}
    payload_bits = framing_bits = 0
    if form in ("float16", "float32"):
      # TF's own float ring: the values themselves, summed in their dtype.
      dtype = tf.float16 if form == "float16" else tf.float32
      for k, chunk in enumerate(chunks):
        with _chunk_scope(k, len(chunks)):
          values = []
          for x in senders:
            with tf.device(x.device), tf.name_scope("ndq_encode"):
              values.append((x.index, x.device, tf.cast(
                  plan.flatten(x.tensors, chunk), dtype)))
          with tf.name_scope("ndq_exchange"):
            reductions = transport.all_reduce(values, "Add")
          for r, reduction in enumerate(reductions):
            devices[r] = reduction.device
            with tf.device(reduction.device), tf.name_scope("ndq_sum"):
              totals[r].append(finish(tf.cast(reduction.value, tf.float32)))
      payload_bits = len(senders) * dtype.size * 8 * plan.total_size
    else:
      if len(plan.segments) != 1:
        raise ValueError(f"{codec!r} is not a bucketed codec.")
      d = plan.bucket_size
      # The seed encode_flat gives the buffer's one segment: a sender's
      # dither is the same under either transport.
      seeds = [ndq_ops.fold_seed(self.seed(i, step), 0)
               for i in range(num_senders)]
      all_seeds = tf.stack(seeds)
      # A rotated codec: the senders share the signs (so the sum of their
      # rotated codes is the rotated sum), each keeps its dither
      # (docs/algorithms.md#rotation-and-the-integer-all-reduce).
      rotation = ({"rotation_seed": ndq_ops.fold_seed(
          self.seed(ROTATION_SENDER, step), 0)}
                  if getattr(codec, "rotation", None) else {})
      fused, own = collections.defaultdict(list), []
      for x in senders:
        with tf.device(x.device), tf.name_scope("ndq_encode"):
          for chunk in chunks:
            fused[x.index].append(plan.flatten(x.tensors, chunk))
          own.append((x.index, x.device, _join(
              [codec.bucket_scales(part, dither_offset=chunk.start,
                                   **rotation)
               for part, chunk in zip(fused[x.index], chunks)])))
      with tf.name_scope("ndq_exchange"):
        shared = {r.local_sender: r
                  for r in transport.all_reduce(own, "Max", step=step,
                                                fingerprint=mark)}
      for k, chunk in enumerate(chunks):
        first, count = chunk.start // d, codec.num_scales(chunk.length)
        layout = ndq_ops.lane_layout(codec.alphabet_size, num_senders,
                                     chunk.length)
        with _chunk_scope(k, len(chunks)):
          lanes = []
          for x in senders:
            scales = shared[x.index]
            with tf.device(x.device), tf.name_scope("ndq_encode"), \
                tf.control_dependencies(scales.checks):
              symbols = codec.encode_symbols(
                  fused[x.index][k], seeds[x.index],
                  scales.value[first:first + count],
                  dither_offset=chunk.start, **rotation)
              lanes.append((x.index, x.device,
                            ndq_ops.pack_lanes(symbols, layout)))
          with tf.name_scope("ndq_exchange"):
            sums = transport.all_reduce(lanes, "Add")
          for r, reduction in enumerate(sums):
            devices[r] = reduction.device
            if transport.shared_memory and r > 0:
              continue  # One memory: the first receiver's decode serves all.
            with tf.device(reduction.device), tf.name_scope("ndq_decode"):
              total = codec.decode_symbol_sum(
                  ndq_ops.unpack_lanes(reduction.value, layout),
                  shared[reduction.local_sender].value[first:first + count],
                  all_seeds, tf.float32, dither_offset=chunk.start,
                  **rotation)
            with tf.device(reduction.device), tf.name_scope("ndq_sum"):
              totals[r].append(finish(total))
        payload_bits += len(senders) * layout.wire_bits
      payload_bits += len(senders) * 32 * codec.num_scales(plan.total_size)
      framing_bits = len(senders) * transport.framing_bits(True)
    # The cost model of the whole buffer: chunks add at most one lane word
    # each.
    link_bits = theory.exchange_bits(codec, plan.total_size, num_senders,
                                     "all_reduce")
    results = _split_results(plan, chunks, totals, devices)
    self._record(transport, plan, senders, lossless_values,
                 payload_bits=payload_bits, framing_bits=framing_bits,
                 link_bits=len(senders) * link_bits)
    return results

  def _update_nested_state(self, variables, senders, statistics, plan):
    """Stores the local nested senders' noise state and telemetry."""
    scale_variable, gain_variable = variables
    num_buckets = plan.total_size // plan.bucket_size
    target = float(self._options.codec.overload_target)
    with tf.device(self._device):
      scales = scale_variable.read_value()
      gains = gain_variable.read_value()
      rows = []
      for row, sender in enumerate(senders):
        if sender.index in statistics:
          rows.append(nested_state.update(
              nested_state.NoiseState(scales[row], gains[row]),
              statistics[sender.index], plan, target, self._options.adaptive))
        else:  # A reference sender: no noise of its own.
          rows.append(nested_state.NoiseState(
              tf.fill([num_buckets], float("nan")), gains[row]))
      scale_variable.assign(tf.stack([r.scale for r in rows]))
      gain_variable.assign(tf.stack([r.gain for r in rows]))
      self.telemetry.record_nested(
          [dict(statistics[p], num_buckets=num_buckets)
           for p in sorted(statistics)])

  def _record(self, transport, plan, senders, lossless_values, payload_bits,
              framing_bits, link_bits):
    """Assigns the telemetry of this exchange.

    `link_bits` is the cost model's bits on the local senders' links for
    the compressed buffer; the lossless values add a float ring's.
    """
    lossless_elements = tf.zeros([], tf.int64)
    lossless_bits = tf.zeros([], tf.int64)
    for value in lossless_values:
      v = value.values[0] if isinstance(
          value, tf_internals.DistributedValues) else value
      if isinstance(v, tf.IndexedSlices):
        # Sparse values and their indices, at their runtime size.
        n = tf.size(v.values, out_type=tf.int64)
        lossless_elements += n
        lossless_bits += (n * v.values.dtype.size * 8
                          + tf.size(v.indices, out_type=tf.int64)
                          * v.indices.dtype.size * 8)
        continue
      v = tf.convert_to_tensor(v)
      n = tf.size(v, out_type=tf.int64)
      lossless_elements += n
      lossless_bits += n * v.dtype.size * 8
    num_senders = transport.num_senders
    ring = 2.0 * (num_senders - 1) / num_senders
    with tf.device(self._device):
      self.telemetry.record(
          transport=transport.name,
          senders=num_senders,
          local_senders=len(senders),
          payload_bits=payload_bits,
          sent_bits=(payload_bits + framing_bits
                     + lossless_bits * len(senders)),
          link_bits=(tf.constant(round(link_bits), tf.int64) + tf.cast(
              tf.round(tf.cast(lossless_bits, tf.float64) * ring
                       * len(senders)), tf.int64)),
          compressed_elements=plan.num_elements,
          lossless_elements=lossless_elements)
