"""The reduce-scatter exchange: bits and decode work flat in the senders.

`exchange="reduce_scatter"` (issue #18) over a reduce-scatter transport
(`ndq_tf.core.transports.all_to_all`). With `P` senders and a fused
buffer of `B` whole buckets (`shard_buckets`: shard `j` holds buckets
`[⌊jB/P⌋, ⌊(j+1)B/P⌋)`, some empty when `B < P`):

* Stage 1. Every sender encodes each shard of its buffer with its codec,
  with the seed and the dither that the shard's elements have in the
  whole buffer (`fusion_codec.encode_flat(..., chunk=shard)`; the codes are
  those the all-gather would send, slice by slice). The transport hands
  receiver `j` every sender's shard `j`; it decodes them in sender order
  (with the senders' steps, which the transport checks) and sums them
  deterministically (`fusion_sum.sum_senders`). `n/P` elements per sender:
  `n` dither draws per receiver whatever `P` is.
* Stage 2. Receiver `j` re-quantizes its reduced shard with DQSG
  (`stage2_codec`: `reduce_scatter_levels` levels, by default the codec's
  own for a `DitheredCodec` and at least `MIN_STAGE2_LEVELS`; a
  variable-length codec, ECDQ, re-codes it itself) and a seed
  derived from (base seed, step, `STAGE2_SENDER`) at the shard's place in
  the buffer; an all-gather hands every receiver every reduced shard and
  each decodes all of them with the same ops, so every receiver ends with
  bitwise the same sum.

Error: the senders' independent stage-1 errors plus one dithered
quantization of each bucket of the sum, both unbiased
(`ndq_tf.theory.reduce_scatter_total_mse`). Cost: about `2(P - 1)/P` codes
per element and worker (`reduce_scatter_bits`), against the integer
all-reduce's lanes of `⌈log2(P·(L - 1) + 1)⌉` bits, exact.

Nested groups (`nested_shards`): receiver `j` decodes the shards `j` in
sender order, the reference group P1 first, and a nested sender's side
information is the mean of the shards decoded before it: the all-gather's,
restricted to the shard. Its statistics and noise state are the
all-gather's bit for bit when every shard is decoded in its process
(`ndq_tf.MirroredStrategy`); across processes a nested sender counts them
over its own worker's shard, and the adaptive mode (which encodes every
bucket with the sender's own noise) is refused there
(`nested_shards.check_across_processes`). Stage 2 re-quantizes with the
reference codec's levels.

Codecs: bucketed codecs (`refusal`), the reference group's first. The
exchange is not cut into `chunk_elements` chunks: its shards are its
chunks. A variable-length codec's shard wires travel as the words they
use, in both stages (`transports.all_to_all`, `transports.all_gather`),
and the telemetry counts those words and the length rounds.
"""

import math

import tensorflow as tf

from ndq_tf import codecs as ndq_codecs
from ndq_tf.core import fusion_codec
from ndq_tf.core import fusion_plan
from ndq_tf.core import fusion_sum
from ndq_tf.core.exchanges import base
from ndq_tf.core.exchanges import feedback as feedback_lib
from ndq_tf.core.exchanges import nested_shards
from ndq_tf.core.transports import all_gather as all_gather_transport
from ndq_tf.core.transports import all_to_all

__all__ = [
    "EXCHANGE",
    "MIN_STAGE2_LEVELS",
    "ReduceScatterExchange",
    "STAGE2_SENDER",
    "bits_per_element",
    "reduce_scatter_bits",
    "shard_buckets",
    "shards",
    "stage2_codec",
]

#: The sender index whose seed stage 2 draws from (no real sender has it;
#: -1 is the rotation's, `sum.ROTATION_SENDER`).
STAGE2_SENDER = -2


def shard_buckets(num_buckets, num_shards):
  """`[(first bucket, buckets)]` of every shard, in shard order.

  Args:
    num_buckets: `B >= 0`, whole buckets in the buffer.
    num_shards: `P >= 1`.

  Returns:
    A list of `P` pairs; the counts differ by at most one.
  """
  if num_shards < 1:
    raise ValueError(f"`num_shards` must be at least 1. Received: "
                     f"num_shards={num_shards!r}.")
  bounds = [num_buckets * j // num_shards for j in range(num_shards + 1)]
  return [(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]


#: The fewest levels of the default stage-2 DQSG. The reduced shard is a
#: sum of `P` gradients, with a wider range than one: with one level
#: (ternary) its re-quantization errs 4-9 times the all-gather's (vNMSE of
#: the sum) and the digits MLP of docs/algorithms.md ends 0.6-0.7 points
#: below the all-gather; with two, 0.1-0.2 points below, for 0.6-0.9 more
#: bits per element and worker (4.27 at P = 1024, against the integer
#: all-reduce's 25.7). `reduce_scatter_levels=1` keeps ternary codes
#: (3.40 bits).
MIN_STAGE2_LEVELS = 2


def _stage2(codec, levels=None):
  if getattr(codec, "variable_length", False):
    # An entropy-coded codec re-codes the sums itself: with DQSG the gain
    # would shrink as `P` grows (issue #35).
    return codec
  own = (codec.num_levels if isinstance(codec, ndq_codecs.DitheredCodec)
         else None)
  levels = levels or max(own or 1, MIN_STAGE2_LEVELS)
  if (type(codec) is ndq_codecs.DitheredCodec  # pylint: disable=unidiomatic-typecheck
      and levels == own and getattr(codec, "rotation", None) is None):
    return codec
  return ndq_codecs.DitheredCodec(num_levels=levels,
                                  bucket_size=codec.bucket_size)


def stage2_codec(options):
  """The DQSG that re-quantizes the reduced shards, for these options.

  `options.reduce_scatter_levels` levels; by default the first sender's
  codec's own `num_levels` when it is a `DitheredCodec` (the codec, or the
  reference codec of a nested group), and at least `MIN_STAGE2_LEVELS`.
  A plain `DitheredCodec` with those levels is used as it is. A
  variable-length codec (`EntropyCodedDitheredCodec`) re-codes the sums
  itself, at its own configuration.
  """
  return _stage2(options.reference_codec or options.codec,
                 options.reduce_scatter_levels)


def _refusal(codec):
  """Why the reduce-scatter cannot carry `codec` (a sender's), or None."""
  if getattr(codec, "bucket_size", None) is None:
    return ("the reduce-scatter cuts the buffer into shards of whole "
            "buckets, so `codec` must have a `bucket_size`; use "
            "exchange='all_gather' or 'all_reduce'")
  return None


def _check_codecs(codecs):
  """Raises a ValueError naming the first codec the exchange cannot carry."""
  if getattr(codecs[0], "needs_side_information", False):
    raise ValueError(
        f"exchange='reduce_scatter' cannot carry codec={codecs[0]!r} "
        f"first: nested codecs need side information from a reference "
        f"group decoded before them; give one codec per worker, the "
        f"reference group's (without side information) first.")
  for codec in codecs:
    why = _refusal(codec)
    if why:
      raise ValueError(f"exchange='reduce_scatter' cannot carry "
                       f"codec={codec!r}: {why}.")


def _shard_words(codec, elements):
  return codec.wire_bits(elements) // 32 if elements else 0


def reduce_scatter_bits(codecs, num_elements, num_workers, stage2=None):
  """Bits each worker sends per step in the reduce-scatter exchange.

  `(P - 1)·32·(5 + W1) + (P - 1)·32·(5 + W2)`: stage 1's all-to-all sends
  `P - 1` rows of the longest shard wire `W1` (words, over senders and
  shards) and a header; stage 2's ring all-gather sends `P - 1` rows of
  the longest reduced-shard wire `W2`. About `2(P - 1)/P·b` bits per
  element for codes of `b` bits, flat in `P` while the shards hold many
  buckets. A variable-length codec's `W1`, `W2` are expectations
  (`wire_bits`), and each stage has a length round: stage 1's rows carry
  `P` more words (the sender's lengths), stage 2's a header more.

  Args:
    codecs: one bucketed codec per worker, in sender order (or one codec).
    num_elements: `n` (whole buckets: `⌈n/d⌉`).
    num_workers: `P >= 1`.
    stage2: the codec of the reduced shards; default the exchange's
      default for `codecs[0]` (`stage2_codec` without
      `reduce_scatter_levels`).

  Returns:
    A float (0 for `P = 1`).

  Raises:
    ValueError: for nested codecs, or codecs without buckets.
  """
  codecs = base.sender_codecs(codecs, num_workers)
  _check_codecs(codecs)
  d = codecs[0].bucket_size
  stage2 = stage2 or _stage2(codecs[0])
  if num_workers == 1:
    return 0.0
  parts = shard_buckets(-(-num_elements // d), num_workers)
  distinct = {id(c): c for c in codecs}.values()
  w1 = max(_shard_words(c, m * d) for c in distinct for _, m in parts)
  w2 = max(_shard_words(stage2, m * d) for _, m in parts)
  if getattr(codecs[0], "variable_length", False):
    # Expectations (`wire_bits`), after each stage's length round.
    w1 += num_workers
    w2 += all_gather_transport.HEADER_WORDS
  return float(32 * (num_workers - 1) * (
      all_to_all.SCATTER_HEADER_WORDS + w1
      + all_gather_transport.HEADER_WORDS + w2))


def bits_per_element(codec, num_elements, num_workers, stage2=None):
  """`reduce_scatter_bits / n`: what `docs/scaling.md` tabulates."""
  if num_elements <= 0:
    return math.nan
  return reduce_scatter_bits(codec, num_elements, num_workers,
                             stage2) / num_elements


def shards(plan, num_shards):
  """The `fusion_plan.Chunk` of every shard of `plan`'s buffer (some empty).

  Each draws the dither its elements have in the whole buffer.
  """
  d = plan.bucket_size
  if d is None or len(plan.segments) > 1:
    raise ValueError(
        f"The reduce-scatter exchange needs a bucketed codec (shards of "
        f"whole buckets). Received: a plan with bucket_size={d}.")
  out = []
  for first, count in shard_buckets(plan.total_size // d, num_shards):
    start, length = first * d, count * d
    out.append(fusion_plan.Chunk(start, length, ((0, start, length, start),)))
  return out


def _words(codec, plan, shard):
  return plan.chunk_wire_words(codec, shard) if shard.length else 0


def _nothing():
  return tf.zeros([0], tf.int32)


class ReduceScatterExchange(base.Exchange):
  """Shards reduced by their receivers, re-quantized, then all-gathered."""

  name = "reduce_scatter"
  #: The header of every stage-1 row (magic, sender, shard, step,
  #: fingerprint); stage 2's all-gather rows add its own header.
  framing_words = all_to_all.SCATTER_HEADER_WORDS
  #: `exchange="auto"` picks it where the time model says it is fastest
  #: (from 3 worker processes on CPUs with the default stage 2; never in
  #: one shared memory, where its stage 1 decodes `P` buffers): its one
  #: extra re-quantization is the price (docs/algorithms.md).
  automatic = True

  def refusal(self, codec, nested):
    del nested  # Nested groups too (their reference codec is bucketed).
    return _refusal(codec)

  def bits(self, codecs, num_elements, num_workers):
    """`reduce_scatter_bits` with the default stage-2 codec."""
    return reduce_scatter_bits(codecs, num_elements, num_workers)

  def work(self, codecs, num_elements, num_workers, shared_memory=False):
    """Stage 1 decodes `P` shards of `n/P`, stage 2 as many: two buffers.

    `decodes` counts whole buffers; the dither draws are the senders'
    encode and the shards' decode of stage 1, plus stage 2's DQSG (its
    encode of one shard and its decode of all of them). In one memory the
    process encodes `P` buffers, decodes `P` shards for each of its `P`
    receivers (`P` buffers), encodes every reduced shard (one buffer) and
    decodes stage 2 once.
    """
    n, p = num_elements, num_workers
    copies = p if shared_memory else 1
    draws = copies * n if getattr(codecs[0], "needs_encode_seed", False) else 0
    # Every sender's shard of `n/P`, at every receiver (a nested group's
    # codecs differ).
    draws += copies * round(n * sum(getattr(c, "decoder_needs_seed", False)
                                    for c in codecs) / p)
    draws += (n if shared_memory else -(-n // p)) + n
    return base.Work(dither_draws=draws, decodes=copies + 1)

  def run(self, context, transport, codecs, plan, senders):
    """Encodes shards, reduces them, re-quantizes and gathers the sums.

    The local nested senders' statistics and noise state come from their
    own shards' decodes (`nested_shards.OwnShards`).
    """
    options, step = context.options, context.step
    mark = context.fingerprint
    num_senders = transport.num_senders
    _check_codecs(codecs)
    second = stage2_codec(options)
    parts = shards(plan, num_senders)
    words = [[_words(c, plan, s) for s in parts] for c in codecs]
    words2 = [_words(second, plan, s) for s in parts]
    feedback = (context.feedback.variable_for(plan.signature,
                                              plan.total_size)
                if options.reduce_scatter_error_feedback else None)
    sums = {}  # Shard -> the re-quantized sum (with feedback: s_t).
    nested = [x.index for x in senders
              if codecs[x.index].needs_side_information]
    noise = variables = None
    if nested:
      if len(senders) < num_senders:  # Other senders in other processes.
        nested_shards.check_across_processes(options)
      variables = context.nested_state.variables_for(
          plan.signature, len(senders), plan.total_size // plan.bucket_size)
      if options.adaptive:
        with tf.device(context.device):
          # As the all-gather's: each nested sender's own noise and gain.
          noise = variables[0].read_value() * variables[1].read_value()
    own = nested_shards.OwnShards(codecs, plan, parts)

    rows, fused = [], {}
    for row, x in enumerate(senders):
      with tf.device(x.device), tf.name_scope("ndq_encode"):
        fused[x.index] = plan.flatten(x.tensors)
        seed = context.seed(x.index)
        scale = noise[row] if noise is not None and x.index in nested else None
        rows.append((x.index, x.device, [
            fusion_codec.encode_flat(
                codecs[x.index], fused[x.index][s.start:s.start + s.length],
                seed, plan, noise_scale=scale, chunk=s)
            if s.length else _nothing() for s in parts]))
    variable = getattr(codecs[0], "variable_length", False)
    used = None
    with tf.name_scope("ndq_exchange"):
      if variable:  # Only the words each shard wire uses travel.
        used = []
        for x, (_, _, wires) in zip(senders, rows):
          with tf.device(x.device):
            used.append([fusion_codec.used_words(codecs[x.index], w, plan, s)
                         for w, s in zip(wires, parts)])
        receptions = transport.scatter(rows, words, step, fingerprint=mark,
                                       used=used)
      else:
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
        seeds = [context.seed(i, None if r.steps is None else r.steps[i])
                 for i in range(num_senders)]
        decoded, side = fusion_codec.decode_senders(
            codecs, r.wires, seeds, plan, return_side_information=True,
            chunk=shard)
        for me in nested:
          # Its side information of this shard exists only here.
          own.keep(me, r.local_sender,
                   fused[me][shard.start:shard.start + shard.length],
                   r.wires[me], side[me], decoded[me])
        total = fusion_sum.sum_senders(decoded)
        if feedback is not None:
          total = feedback_lib.add_residual(feedback, shard, total, r.device)
          sums[r.local_sender] = total
      with tf.device(r.device), tf.name_scope("ndq_encode"):
        reduced.append((r.local_sender, r.device, fusion_codec.encode_flat(
            second, total, context.seed(STAGE2_SENDER), plan,
            chunk=shard)))
    with tf.name_scope("ndq_exchange"):
      if variable:
        used2 = []
        for j, device, wire in reduced:
          with tf.device(device):
            used2.append(fusion_codec.used_words(second, wire, plan,
                                                 parts[j]))
        gathered = transport.gather.exchange(reduced, words2, step,
                                             fingerprint=mark, used=used2)
      else:
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
            seed = context.seed(STAGE2_SENDER,
                                None if g.steps is None else g.steps[j])
            pieces.append(fusion_codec.decode_senders(
                [second], [g.wires[j]], [seed], plan, chunk=shard)[0])
        total = tf.concat(pieces, axis=0) if len(pieces) > 1 else pieces[0]
        if feedback is not None and k == 0:
          # e_t = s_t − x̂_t of every local shard, from the first decode.
          decoded = dict(zip((j for j, s in enumerate(parts) if s.length),
                             pieces))
          feedback_lib.store_residuals(
              feedback, parts,
              {j: sums[j] - decoded[j] for j in sums}, context.device)
      with tf.device(g.device), tf.name_scope("ndq_sum"):
        results.append(plan.split(context.finish(total, num_senders)))

    local = [x.index for x in senders]
    if nested:
      statistics = {}
      for me in nested:
        row = local.index(me)
        with tf.device(senders[row].device), tf.name_scope("ndq_decode"):
          mine = own.statistics(me, None if noise is None else noise[row],
                                seed=context.seed(me))
        if mine is not None:
          statistics[me] = mine
      context.update_nested_state(variables, senders, statistics, plan)
    if variable:  # The words used, and the lengths rounds' framing.
      payload_words = tf.add_n(
          [tf.cast(u, tf.int64) for mine in used for u in mine]
          + [tf.cast(u, tf.int64) for u in used2])
      framing_bits = (
          transport.framing_bits(words, local,
                                 lengths=receptions[0].lengths)
          + transport.gather.framing_bits(words2, local,
                                          lengths=gathered[0].lengths))
    else:
      payload_words = sum(sum(words[i]) + words2[i] for i in local)
      framing_bits = (transport.framing_bits(words, local)
                      + transport.gather.framing_bits(words2, local))
    context.record(
        self.name, num_senders, plan, len(senders),
        payload_bits=32 * payload_words, framing_bits=framing_bits,
        link_bits=len(senders) * reduce_scatter_bits(
            codecs, plan.total_size, num_senders, second))
    return results


EXCHANGE = ReduceScatterExchange()
