"""The all-gather exchange: every sender's payload to every receiver.

Every receiver gets every sender's packed `int32` payload (a transport's
`exchange`: `transports.CollectiveAllGatherTransport` across workers,
`transports.DeviceCopyTransport` across devices) and decodes each in
sender order, with side information for the nested senders
(`fusion_codec.decode_senders`), then sums them
(`fusion_sum.sum_senders`). Every codec, nested ones included; a
variable-length codec's payloads (`Codec.variable_length`) travel as the
words they use (`fusion_codec.used_words`), which the telemetry counts.
Cost (docs/scaling.md): every worker sends its payload, framed by
`HEADER_WORDS` words and padded to the longest payload, through a ring
all-gather; every worker decodes every sender.
"""

import collections

import tensorflow as tf

from ndq_tf import theory
from ndq_tf.core import fusion_codec
from ndq_tf.core import fusion_sum
from ndq_tf.core import nested_state
from ndq_tf.core.exchanges import base
from ndq_tf.core.transports import all_gather as all_gather_transport

__all__ = [
    "EXCHANGE",
    "GatherExchange",
]


class GatherExchange(base.Exchange):
  """`exchange="all_gather"`: decode every sender's payload, then sum."""

  name = "all_gather"
  #: The header of every row of the collective all-gather (magic, sender,
  #: step, payload words, fingerprint).
  framing_words = all_gather_transport.HEADER_WORDS

  def bits(self, codecs, num_elements, num_workers):
    """`(P - 1)·32·(HEADER_WORDS + max_p wire_words_p)`: a ring all-gather.

    Rows are padded to the longest payload of the exchange (a nested
    group's codecs differ). A variable-length codec's rows are its
    expected payload (`wire_bits`, an expectation) after a length round
    of one more header: `(P - 1)·32·(2·HEADER_WORDS + wire_words)`, an
    expectation too (the rows are as long as the longest sender's).
    """
    distinct = {id(c): c for c in codecs}.values()
    row_words = self.framing_words + max(
        c.wire_bits(num_elements) // 32 for c in distinct)
    if any(getattr(c, "variable_length", False) for c in distinct):
      row_words += self.framing_words  # The length round.
    return theory.ring_all_gather_bits(32 * row_words, num_workers)

  def work(self, codecs, num_elements, num_workers, shared_memory=False):
    """Each worker encodes its payload and decodes every sender's.

    In one memory each sender is encoded and decoded once: `P` encodes,
    still `P` decodes.
    """
    n = num_elements
    encodes = num_workers if shared_memory else 1
    draws = sum(n for c in codecs[:encodes]
                if getattr(c, "needs_encode_seed", False))
    draws += sum(n for c in codecs if getattr(c, "decoder_needs_seed", False))
    return base.Work(dither_draws=draws, decodes=num_workers)

  def run(self, context, transport, codecs, plan, senders):
    """Every sender's payload to every receiver; decode each, then sum.

    Chunk by chunk (`FusionPlan.chunks`): chunk `k` is encoded, moved,
    decoded and summed by ops that depend on no other chunk's, so TF runs
    chunk `k`'s exchange while chunk `k + 1` is encoded and chunk `k - 1`
    decoded (a multi-worker transport's collectives keep program order).
    """
    options, step = context.options, context.step
    num_senders = transport.num_senders
    chunks = plan.chunks(options.chunk_elements)
    nested = [x.index for x in senders
              if codecs[x.index].needs_side_information]
    noise = variables = None
    if nested:
      variables = context.nested_state.variables_for(
          plan.signature, len(senders), plan.total_size // plan.bucket_size)
      if options.adaptive:
        with tf.device(context.device):
          # Each nested sender's own last noise, times its gain: known to
          # the sender alone; only the steps it picks travel (in the wire).
          noise = variables[0].read_value() * variables[1].read_value()

    local = [x.index for x in senders]
    # Variable-length payloads (one codec for every sender: nested groups
    # have fixed-length codes) travel as the words they use.
    variable = any(getattr(c, "variable_length", False) for c in codecs)
    totals = collections.defaultdict(list)  # Receiver -> one sum per chunk.
    # Receiver -> its transport's checks (headers, stamps). A chunk decodes
    # as soon as its payloads arrive, not behind the previous chunk's checks
    # (TF runs asserts in program order); the results, and a nested sender's
    # statistics, wait for every check.
    checks = collections.defaultdict(list)
    devices = {}
    # The local nested senders' own chunks, for their statistics.
    own = collections.defaultdict(lambda: collections.defaultdict(list))

    def keep_own(me, values, wire, side, decoded, chunk):
      own[me]["values"].append(values)
      own[me]["side"].append(side)
      own[me]["decoded"].append(decoded)
      own[me]["scales"].append(fusion_codec.wire_scales(codecs[me], wire,
                                                        plan, chunk))
    payload_words = framing_bits = link_bits = 0
    for k, chunk in enumerate(chunks):
      with base.chunk_scope(k, len(chunks)):
        fused, wires = {}, []
        for row, sender in enumerate(senders):
          with tf.device(sender.device), tf.name_scope("ndq_encode"):
            fused[sender.index] = plan.flatten(sender.tensors, chunk)
            wires.append(fusion_codec.encode_flat(
                codecs[sender.index], fused[sender.index],
                context.seed(sender.index), plan,
                noise_scale=(noise[row] if noise is not None
                             and sender.index in nested else None),
                chunk=chunk))

        words = [plan.chunk_wire_words(c, chunk) for c in codecs]
        local_wires = [(x.index, x.device, w) for x, w in zip(senders, wires)]
        with tf.name_scope("ndq_exchange"):
          if variable:
            # Only the words each payload uses travel, and count.
            used = []
            for x, w in zip(senders, wires):
              with tf.device(x.device):
                used.append(fusion_codec.used_words(codecs[x.index], w,
                                                    plan, chunk))
            receptions = transport.exchange(
                local_wires, words, step, fingerprint=context.fingerprint,
                used=used)
            payload_words += tf.add_n([tf.cast(u, tf.int64) for u in used])
            framing_bits += transport.framing_bits(
                words, local, lengths=receptions[0].lengths)
          else:
            receptions = transport.exchange(
                local_wires, words, step, fingerprint=context.fingerprint)
            payload_words += sum(words[i] for i in local)
            framing_bits += transport.framing_bits(words, local)
        link_bits += self.bits(codecs, chunk.length, num_senders)

        if transport.shared_memory:
          # One memory: every receiver would decode the same payloads into
          # the same bits, so each sender is decoded once, on its own
          # device, and every receiver gets the one sum.
          for r, reception in enumerate(receptions):
            devices[r] = reception.device
          first = receptions[0]
          checks[0].extend(first.checks)
          with tf.device(first.device), tf.name_scope("ndq_decode"), \
              tf.control_dependencies(first.checks if nested else []):
            seeds = [context.seed(i) for i in range(num_senders)]
            decoded, side = fusion_codec.decode_senders(
                codecs, first.wires, seeds, plan,
                return_side_information=True, chunk=chunk,
                devices=[x.device for x in sorted(senders,
                                                  key=lambda x: x.index)])
            for me in nested:
              keep_own(me, fused[me], first.wires[me], side[me],
                       decoded[me], chunk)
          with tf.device(first.device), tf.name_scope("ndq_sum"):
            totals[0].append(fusion_sum.sum_senders(
                decoded, mean=context.mean, divisor=context.divisor))
          continue
        for r, reception in enumerate(receptions):
          devices[r] = reception.device
          checks[r].extend(reception.checks)
          me = reception.local_sender
          with tf.device(reception.device), tf.name_scope("ndq_decode"), \
              tf.control_dependencies(reception.checks if me in nested
                                      else []):
            # A receiver derives every sender's seed from the step that
            # sender used (the transport reports it), never from its own
            # counter alone.
            steps = reception.steps
            seeds = [context.seed(i, None if steps is None else steps[i])
                     for i in range(num_senders)]
            if me in nested:
              decoded, side = fusion_codec.decode_senders(
                  codecs, reception.wires, seeds, plan,
                  return_side_information=True, chunk=chunk)
              # The nested sender on this device knows its true gradient:
              # its exact noise and real overloads (only [num_buckets]
              # floats and a few scalars leave the device).
              keep_own(me, fused[me], reception.wires[me], side[me],
                       decoded[me], chunk)
            else:
              decoded = fusion_codec.decode_senders(
                  codecs, reception.wires, seeds, plan, chunk=chunk)
          with tf.device(reception.device), tf.name_scope("ndq_sum"):
            totals[r].append(fusion_sum.sum_senders(
                decoded, mean=context.mean, divisor=context.divisor))

    results = base.split_results(plan, chunks, totals, devices, checks)
    if nested:
      statistics = {}
      for me, mine in own.items():
        row = local.index(me)
        with tf.device(senders[row].device), tf.name_scope("ndq_decode"):
          values, side, decoded, scales = (
              base.join(mine[key])
              for key in ("values", "side", "decoded", "scales"))
          statistics[me] = nested_state.sender_statistics(
              codecs[me], None, values, side, decoded, plan,
              noise_scale=None if noise is None else noise[row],
              scales=scales, seed=context.seed(me))
      context.update_nested_state(variables, senders, statistics, plan)
    context.record(self.name, num_senders, plan, len(senders),
                   payload_bits=32 * payload_words, framing_bits=framing_bits,
                   link_bits=len(senders) * link_bits)
    return results


EXCHANGE = GatherExchange()
