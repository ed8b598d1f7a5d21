"""The cost model and the error of the reduce-scatter exchange (issue #18).

Plain Python, like `ndq_tf.theory` (which re-exports `reduce_scatter_bits`
and `reduce_scatter_total_mse`); kept apart so that it moves with the
exchange. The exchange itself is `ndq_tf.distribute.reduce_scatter`.

The buffer of `n` values (`B = n/d` whole buckets of `d`) is cut into `P`
shards of whole buckets, shard `j` the buckets `[⌊jB/P⌋, ⌊(j+1)B/P⌋)`
(`shard_buckets`; some are empty when `B < P`).

* Stage 1: worker `i` encodes shard `j` of its gradient and an all-to-all
  hands it to worker `j`, which decodes the `P` shards and sums them.
* Stage 2: worker `j` re-quantizes the sum with DQSG (the stage-2 codec)
  and an all-gather hands it to every worker; every worker decodes the `P`
  reduced shards with the same ops, so all end bitwise identical.
"""

import math

__all__ = [
    "REDUCE_SCATTER_HEADER_WORDS",
    "reduce_scatter_bits",
    "reduce_scatter_total_mse",
    "shard_buckets",
]

#: Words of the header of every stage-1 row (magic, sender, shard, step,
#: fingerprint), as `ndq_tf.distribute.transports.all_to_all` sends them;
#: stage 2's all-gather rows have `ALL_GATHER_HEADER_WORDS` (5) as well.
REDUCE_SCATTER_HEADER_WORDS = 5
_GATHER_HEADER_WORDS = 5


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


def _words(codec, elements):
  return codec.wire_bits(elements) // 32 if elements else 0


def reduce_scatter_bits(codecs, num_elements, num_workers, stage2_codec=None):
  """Bits each worker sends per step in the reduce-scatter exchange.

  `(P - 1)·32·(5 + W1) + (P - 1)·32·(5 + W2)`: stage 1's all-to-all sends
  `P - 1` rows of the longest shard wire `W1` (words, over senders and
  shards) and a header; stage 2's ring all-gather sends `P - 1` rows of
  the longest reduced-shard wire `W2`. About `2(P - 1)/P·b` bits per
  element for codes of `b` bits, flat in `P` while the shards hold many
  buckets.

  Args:
    codecs: one bucketed codec per worker, in sender order (or one codec).
    num_elements: `n` (whole buckets: `⌈n/d⌉`).
    num_workers: `P >= 1`.
    stage2_codec: the codec of the reduced shards; default `codecs[0]`
      (the exchange's default for `DitheredCodec` without rotation).

  Returns:
    A float (0 for `P = 1`).
  """
  if not isinstance(codecs, (list, tuple)):
    codecs = [codecs] * num_workers
  if len(codecs) != num_workers:
    raise ValueError(
        f"`codecs` must be one codec or one per worker ({num_workers}). "
        f"Received: {len(codecs)} codecs.")
  if any(getattr(c, "needs_side_information", False) for c in codecs):
    raise ValueError(
        f"The reduce-scatter exchange does not take nested codecs yet. "
        f"Received: codec={codecs!r}.")
  d = codecs[0].bucket_size
  if d is None:
    raise ValueError(
        f"The reduce-scatter exchange cuts the buffer into shards of whole "
        f"buckets: `codec` must have a `bucket_size`. Received: "
        f"codec={codecs[0]!r}.")
  stage2_codec = stage2_codec or codecs[0]
  if num_workers == 1:
    return 0.0
  shards = shard_buckets(-(-num_elements // d), num_workers)
  distinct = {id(c): c for c in codecs}.values()
  w1 = max(_words(c, m * d) for c in distinct for _, m in shards)
  w2 = max(_words(stage2_codec, m * d) for _, m in shards)
  return float(32 * (num_workers - 1) * (REDUCE_SCATTER_HEADER_WORDS + w1
                                          + _GATHER_HEADER_WORDS + w2))


def reduce_scatter_total_mse(stage1_scales, stage2_scales, bucket_size,
                             stage1_levels, stage2_levels):
  """`E‖ĝ - Σ_p g_p‖²` of the reduce-scatter sum of DQSG senders.

  `Σ_b d·(Σ_p κ_pb²·Δ1²/12 + κ̃_b²·Δ2²/12)`: the `P` senders' independent
  stage-1 errors (DQSG, Lemma 3), plus one dithered quantization of each
  bucket of the decoded sum, whose scale `κ̃_b` is the max of that sum (a
  subtractive dither's error is uniform on `κ̃_b·[-Δ2/2, Δ2/2]` and
  independent of what it quantizes, so the two add). Both stages are
  unbiased. Against the exact integer sum (`transport="all_reduce"`,
  stage-1 errors only) the price is the second term: `κ̃_b` grows like
  `P·κ` for correlated gradients, so it dominates for large `P`, unless
  stage 2 has about `√P` times the levels.

  Args:
    stage1_scales: `[[κ_pb for every bucket b] for every sender p]`.
    stage2_scales: `[κ̃_b for every bucket b]`.
    bucket_size: `d`.
    stage1_levels: `M1` of the senders' DQSG (`Δ1 = 1/M1`).
    stage2_levels: `M2` of the stage-2 DQSG.

  Returns:
    A float.
  """
  one = sum(k * k for scales in stage1_scales for k in scales)
  two = sum(k * k for k in stage2_scales)
  return bucket_size * (one / (12.0 * stage1_levels**2)
                        + two / (12.0 * stage2_levels**2))


def bits_per_element(codec, num_elements, num_workers, stage2_codec=None):
  """`reduce_scatter_bits / n`: what `docs/scaling.md` tabulates."""
  if num_elements <= 0:
    return math.nan
  return reduce_scatter_bits(codec, num_elements, num_workers,
                             stage2_codec) / num_elements
