"""The reduce-scatter exchange: bits and decode work flat in the senders.

`transport="reduce_scatter"` (issue #18), run by
`ExchangeEngine.exchange` over a reduce-scatter transport
(`ndq_tf.distribute.transports.all_to_all`). With `P` senders and a fused
buffer of `B` whole buckets (`ndq_tf.reduce_scatter_theory.shard_buckets`:
shard `j` holds buckets `[⌊jB/P⌋, ⌊(j+1)B/P⌋)`):

* Stage 1. Every sender encodes each shard of its buffer with its codec,
  with the seed and the dither that the shard's elements have in the
  whole buffer (`fusion.encode_flat(..., chunk=shard)`; the codes are those
  the all-gather would send, slice by slice). The transport hands receiver
  `j` every sender's shard `j`; it decodes them in sender order (with the
  senders' steps, which the transport checks) and sums them
  deterministically (`fusion.sum_senders`). `n/P` elements per sender: `n`
  dither draws per receiver whatever `P` is.
* Stage 2. Receiver `j` re-quantizes its reduced shard with DQSG
  (`stage2_codec`: `reduce_scatter_levels` levels, by default the codec's
  own for a `DitheredCodec`) and a seed derived from (base seed, step,
  `STAGE2_SENDER`) at the shard's place in the buffer; an all-gather hands
  every receiver every reduced shard and each decodes all of them with the
  same ops, so every receiver ends with bitwise the same sum.

Error: the senders' independent stage-1 errors plus one dithered
quantization of each bucket of the sum, both unbiased
(`ndq_tf.theory.reduce_scatter_total_mse`). Cost: about `2(P - 1)/P` codes
per element and worker (`ndq_tf.theory.reduce_scatter_bits`), against the
integer all-reduce's lanes of `⌈log2(P·(L - 1) + 1)⌉` bits, exact.

Codecs: bucketed codecs without side information (`CompressionOptions`
refuses the others with a ValueError). The exchange is not cut into
`chunk_elements` chunks: its shards are its chunks.
"""

import tensorflow as tf

from ndq_tf import codecs as ndq_codecs
from ndq_tf import reduce_scatter_theory
from ndq_tf.distribute import fusion

__all__ = [
    "STAGE2_SENDER",
    "exchange",
    "shards",
    "stage2_codec",
]

#: The sender index whose seed stage 2 draws from (no real sender has it;
#: -1 is the rotation's, `engine.ROTATION_SENDER`).
STAGE2_SENDER = -2


def stage2_codec(options):
  """The DQSG that re-quantizes the reduced shards, for these options.

  `options.reduce_scatter_levels` levels; by default the codec's own
  `num_levels` when it is a `DitheredCodec`, else 1. A plain
  `DitheredCodec` with those levels is used as it is.
  """
  codec = options.codec
  own = (codec.num_levels if isinstance(codec, ndq_codecs.DitheredCodec)
         else None)
  levels = options.reduce_scatter_levels or own or 1
  if (type(codec) is ndq_codecs.DitheredCodec  # pylint: disable=unidiomatic-typecheck
      and levels == own and getattr(codec, "rotation", None) is None):
    return codec
  return ndq_codecs.DitheredCodec(num_levels=levels,
                                  bucket_size=codec.bucket_size)


def shards(plan, num_shards):
  """The `fusion.Chunk` of every shard of `plan`'s buffer (some may be empty).

  Each draws the dither its elements have in the whole buffer.
  """
  d = plan.bucket_size
  if d is None or len(plan.segments) > 1:
    raise ValueError(
        f"The reduce-scatter exchange needs a bucketed codec (shards of "
        f"whole buckets). Received: a plan with bucket_size={d}.")
  out = []
  for first, count in reduce_scatter_theory.shard_buckets(
      plan.total_size // d, num_shards):
    start, length = first * d, count * d
    out.append(fusion.Chunk(start, length, ((0, start, length, start),)))
  return out


def _words(codec, plan, shard):
  return plan.chunk_wire_words(codec, shard) if shard.length else 0


def _nothing():
  return tf.zeros([0], tf.int32)


def exchange(engine, transport, codecs, plan, senders, step, mean, divisor,
             lossless_values, mark):
  """Encodes shards, reduces them, re-quantizes and gathers the sums.

  The arguments of `ExchangeEngine._exchange_gather`, plus the engine
  (its `seed` and `_record`).

  Args:
    engine: the `ExchangeEngine`.
    transport: a reduce-scatter transport (`scatter`, `gather`).
    codecs: every sender's codec, in sender order.
    plan: the `fusion.FusionPlan` of the senders' tensors.
    senders: the `LocalSender`s of this process.
    step: the `int32` step of this exchange.
    mean: divide the sum by `divisor` (default the number of senders).
    divisor: see `mean`.
    lossless_values: the call's values that travel losslessly (telemetry).
    mark: the exchange's fingerprint.

  Returns:
    One list of summed tensors per receiver of the transport, in its order.

  Raises:
    ValueError: for a codec that needs side information or has no buckets.
  """
  num_senders = transport.num_senders
  for c in codecs:
    if c.needs_side_information or c.bucket_size is None:
      raise ValueError(
          f"transport='reduce_scatter' takes bucketed codecs without side "
          f"information. Received: codec={c!r}.")
  second = stage2_codec(engine.options)
  parts = shards(plan, num_senders)
  words = [[_words(c, plan, s) for s in parts] for c in codecs]
  words2 = [_words(second, plan, s) for s in parts]

  rows = []
  for x in senders:
    with tf.device(x.device), tf.name_scope("ndq_encode"):
      fused = plan.flatten(x.tensors)
      seed = engine.seed(x.index, step)
      rows.append((x.index, x.device, [
          fusion.encode_flat(codecs[x.index],
                             fused[s.start:s.start + s.length], seed, plan,
                             chunk=s) if s.length else _nothing()
          for s in parts]))
  with tf.name_scope("ndq_exchange"):
    receptions = transport.scatter(rows, words, step, fingerprint=mark)

  reduced = []
  for r in receptions:
    shard = parts[r.local_sender]
    with tf.device(r.device), tf.name_scope("ndq_decode"), \
        tf.control_dependencies(r.checks):
      if not shard.length:
        reduced.append((r.local_sender, r.device, _nothing()))
        continue
      # Every sender's seed from the step it stamped (checked equal).
      seeds = [engine.seed(i, step if r.steps is None else r.steps[i])
               for i in range(num_senders)]
      total = fusion.sum_senders(fusion.decode_senders(
          codecs, r.wires, seeds, plan, chunk=shard))
    with tf.device(r.device), tf.name_scope("ndq_encode"):
      reduced.append((r.local_sender, r.device, fusion.encode_flat(
          second, total, engine.seed(STAGE2_SENDER, step), plan,
          chunk=shard)))
  with tf.name_scope("ndq_exchange"):
    gathered = transport.gather.exchange(reduced, words2, step,
                                         fingerprint=mark)

  results = []
  for k, g in enumerate(gathered):
    if transport.shared_memory and k > 0:
      # One memory: the first receiver's decode serves all.
      with tf.device(g.device), tf.name_scope("ndq_sum"):
        results.append([tf.identity(t) for t in results[0]])
      continue
    with tf.device(g.device), tf.name_scope("ndq_decode"), \
        tf.control_dependencies(g.checks):
      pieces = []
      for j, shard in enumerate(parts):
        if shard.length:
          seed = engine.seed(STAGE2_SENDER,
                             step if g.steps is None else g.steps[j])
          pieces.append(fusion.decode_senders(
              [second], [g.wires[j]], [seed], plan, chunk=shard)[0])
      total = tf.concat(pieces, axis=0) if len(pieces) > 1 else pieces[0]
    with tf.device(g.device), tf.name_scope("ndq_sum"):
      if mean:
        total = total / float(divisor or num_senders)
      results.append(plan.split(total))

  local = [x.index for x in senders]
  payload_words = sum(sum(words[i]) + words2[i] for i in local)
  engine._record(  # pylint: disable=protected-access
      transport, plan, senders, lossless_values,
      payload_bits=32 * payload_words,
      framing_bits=(transport.framing_bits(words, local)
                    + transport.gather.framing_bits(words2, local)),
      link_bits=len(senders) * reduce_scatter_theory.reduce_scatter_bits(
          codecs, plan.total_size, num_senders, second))
  return results
