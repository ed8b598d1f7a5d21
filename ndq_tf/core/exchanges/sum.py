"""The all-reduce exchange: codes that add up, summed as integers.

For codecs whose payloads add up (`Codec.summed_form`), the senders agree
on one scale per bucket (a MAX all-reduce), encode with it, and their
integer codes, packed in lanes that cannot carry into each other
(`ndq_tf.ops.lane_layout`), are summed exactly by an integer all-reduce
(`transports.SummingTransport`); every receiver decodes the sum once,
subtracting every sender's dither (`codec.decode_symbol_sum`).
Float16/Float32 values go through a float ring instead, and BFloat16
values, rounded to bfloat16, through the float32 ring (`FLOAT_FORMS`).
docs/scaling.md has the cost model.
"""

import collections

import tensorflow as tf

from ndq_tf import ops as ndq_ops
from ndq_tf import theory
from ndq_tf.core.exchanges import base
from ndq_tf.core.transports import collective_sum

__all__ = [
    "EXCHANGE",
    "FLOAT_FORMS",
    "ROTATION_SENDER",
    "SumExchange",
]

#: `{summed form: (the dtype the values are rounded to, the ring's dtype)}`
#: of the codecs whose values a float ring sums (`Codec.summed_form`).
#: bfloat16 values are summed in float32: TF's NCCL all-reduce takes no
#: bfloat16 (its CPU ring would), and a ring must run on every device.
FLOAT_FORMS = {
    "float16": (tf.float16, tf.float16),
    "bfloat16": (tf.bfloat16, tf.float32),
    "float32": (tf.float32, tf.float32),
}

#: The sender index whose seed a rotated codec's shared signs take under
#: the integer all-reduce (no real sender has it): the same for every
#: sender of a step, a new pattern every step.
ROTATION_SENDER = -1

_NESTED_REFUSAL = ("nested codes are residues that only their own side "
                   "information decodes, so they do not add up; use "
                   "exchange='all_gather' (or 'auto')")


_VARIABLE_LENGTH_REFUSAL = (
    "its payloads are entropy-coded streams of varying length, not codes "
    "in lanes, so they do not add up; use exchange='all_gather' or "
    "'reduce_scatter' (or 'auto', which never picks 'all_reduce' for it)")


class SumExchange(base.Exchange):
  """`exchange="all_reduce"`: shared scales, an integer sum, one decode."""

  name = "all_reduce"
  #: Extra float32 words of the MAX all-reduce of the scales: the step and
  #: the exchange's fingerprint, stamped so that workers whose steps or
  #: options disagree stop with an error.
  framing_words = collective_sum.STAMP_WORDS

  def refusal(self, codec, nested):
    if nested:
      return _NESTED_REFUSAL
    if getattr(codec, "variable_length", False):
      return _VARIABLE_LENGTH_REFUSAL
    if codec.summed_form() is None:
      return ("only the codes of DitheredCodec, HalfDitheredCodec, "
              "TernGradCodec and QSGDCodec add up (and Float16Codec, "
              "BFloat16Codec and Float32Codec values, through a float "
              "ring); use "
              "exchange='all_gather' (or 'auto')")
    return None

  def bits(self, codecs, num_elements, num_workers):
    """A ring all-reduce of the lanes plus the MAX of the stamped scales.

    `2(P - 1)/P·(W·word_bits + 32·(⌈n/d⌉ + framing_words))` for codes in
    `W` lane words (`ndq_tf.ops.lane_layout`); `2(P - 1)/P·16n` for
    `Float16Codec`, `2(P - 1)/P·32n` for `Float32Codec` and
    `BFloat16Codec` (its bfloat16 values go through the float32 ring).
    """
    first = codecs[0]
    if any(c is not first and c != first for c in codecs[1:]):
      raise ValueError(
          f"`codec` must be the same for every worker under exchange="
          f"'all_reduce' (codes of different codecs do not add up). "
          f"Received: {codecs!r}.")
    form = first.summed_form()
    if getattr(first, "variable_length", False):
      raise ValueError(
          f"`codec` cannot be summed by exchange='all_reduce': "
          f"{_VARIABLE_LENGTH_REFUSAL}. Received: codec={first!r}.")
    if form is None:
      why = ("nested codes are residues that only their own side "
             "information decodes, and they do not add up; use 'all_gather'"
             if getattr(first, "needs_side_information", False) else
             "only DitheredCodec, HalfDitheredCodec, TernGradCodec, "
             "QSGDCodec, Float16Codec, BFloat16Codec and Float32Codec have "
             "codes that add up")
      raise ValueError(
          f"`codec` cannot be summed by exchange='all_reduce': {why}. "
          f"Received: codec={first!r}.")
    n, p = num_elements, num_workers
    if form in FLOAT_FORMS:
      ring = FLOAT_FORMS[form][1]
      return theory.ring_all_reduce_bits(ring.size * 8 * n, p)
    layout = ndq_ops.lane_layout(first.alphabet_size, p, n)
    return theory.ring_all_reduce_bits(
        layout.wire_bits + 32 * (first.num_scales(n) + self.framing_words),
        p)

  def work(self, codecs, num_elements, num_workers, shared_memory=False):
    """One encode, and one decode of the sum, which draws every dither.

    The codes are packed into lanes once per encode and unpacked once; in
    one memory there are `P` encodes and still one decode.
    """
    codec, n = codecs[0], num_elements
    if codec.summed_form() != "codes":
      return base.Work(dither_draws=0, decodes=0)
    encodes = num_workers if shared_memory else 1
    draws = encodes * n if getattr(codec, "needs_encode_seed", False) else 0
    if getattr(codec, "decoder_needs_seed", False):
      draws += num_workers * n
    return base.Work(dither_draws=draws, decodes=1,
                     lane_codes=(encodes + 1) * n)

  def run(self, context, transport, codecs, plan, senders):
    """Shared scales, codes summed as integers, one decode of the sum.

    One MAX all-reduce shares the scales of the whole buffer; then chunk by
    chunk (`FusionPlan.chunks`), each with the dither it has in the whole
    buffer: encode, integer all-reduce, decode, so chunk `k`'s all-reduce
    runs while chunk `k + 1` is encoded and chunk `k - 1` decoded.
    """
    codec = codecs[0]
    form = codec.summed_form()
    num_senders = transport.num_senders
    chunks = plan.chunks(context.options.chunk_elements)

    def finish(total):
      return context.finish(total, num_senders)

    totals = collections.defaultdict(list)  # Receiver -> one sum per chunk.
    devices = {}
    payload_bits = framing_bits = 0
    if form in FLOAT_FORMS:
      # TF's own float ring: the values rounded to the codec's dtype, summed
      # in the ring's (bfloat16 values exactly widened to float32).
      rounded, dtype = FLOAT_FORMS[form]
      for k, chunk in enumerate(chunks):
        with base.chunk_scope(k, len(chunks)):
          values = []
          for x in senders:
            with tf.device(x.device), tf.name_scope("ndq_encode"):
              values.append((x.index, x.device, tf.cast(tf.cast(
                  plan.flatten(x.tensors, chunk), rounded), dtype)))
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
      seeds = [context.seed(i, segment=0) for i in range(num_senders)]
      all_seeds = tf.stack(seeds)
      # A rotated codec: the senders share the signs (so the sum of their
      # rotated codes is the rotated sum), each keeps its dither
      # (docs/algorithms.md#rotation-and-the-integer-all-reduce).
      rotation = ({"rotation_seed": context.seed(ROTATION_SENDER,
                                                 segment=0)}
                  if getattr(codec, "rotation", None) else {})
      fused, own = collections.defaultdict(list), []
      for x in senders:
        with tf.device(x.device), tf.name_scope("ndq_encode"):
          for chunk in chunks:
            fused[x.index].append(plan.flatten(x.tensors, chunk))
          own.append((x.index, x.device, base.join(
              [codec.bucket_scales(part, dither_offset=chunk.start,
                                   **rotation)
               for part, chunk in zip(fused[x.index], chunks)])))
      with tf.name_scope("ndq_exchange"):
        shared = {r.local_sender: r
                  for r in transport.all_reduce(
                      own, "Max", step=context.step,
                      fingerprint=context.fingerprint)}
      for k, chunk in enumerate(chunks):
        first, count = chunk.start // d, codec.num_scales(chunk.length)
        layout = ndq_ops.lane_layout(codec.alphabet_size, num_senders,
                                     chunk.length)
        with base.chunk_scope(k, len(chunks)):
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
    link_bits = self.bits(codecs, plan.total_size, num_senders)
    results = base.split_results(plan, chunks, totals, devices)
    context.record(self.name, num_senders, plan, len(senders),
                   payload_bits=payload_bits, framing_bits=framing_bits,
                   link_bits=len(senders) * link_bits)
    return results


EXCHANGE = SumExchange()
