"""Decoding the sum of several senders' codes at once (shared scales).

When every sender quantizes bucket `b` with the same scale `κ_b` (the
largest of the senders' own scales, agreed on by a MAX all-reduce), the
decodes of the codecs whose codes add up are linear in the codes, so the
sum of `P` senders' decodes is one decode of the sum of their symbols
`S = Σ_p s_p` (`s_p = q_p + offset`, integers that `ndq_tf.ops.pack_lanes`
lets an integer all-reduce add exactly):

* DQSG (`DitheredCodec`, `M` levels, step `Δ = 1/M` in max-normalized
  units, dither `u_p ∈ [-1/2, 1/2)` in units of the step, offset `M`): each
  sender decodes to `κ_b·Δ·(q_p - u_p)`, so the sum is

  `Σ_p g̃_p = κ_b·Δ·(S - P·M - Σ_p u_p)`

  (the issue's `Δκ(S - PM) - κΣ_p u_p` with `u_p` in normalized units):
  `dithered_sum_dequantize`. Every sender's dither is regenerated from its
  seed with the codecs' own generator (`uniform_dither`, stream 0).
* Codecs that subtract nothing (`HalfDitheredCodec`: `κΔq`, offset
  `M + ⌊m/2⌋`; `TernGradCodec`: `κq`, one level, offset 1; `QSGDCodec`:
  `κq/s`, offset `s`, `κ` an L2 norm): `Σ_p g̃_p = (κ_b/levels)·(S -
  P·offset)`, `scaled_sum_dequantize`.

Precision: the dithers are multiples of `2**-24` in `[-1/2, 1/2)`, so their
sum over `P < 2**28` senders and `S - P·offset - Σ_p u_p` are exact in
`float64`; the only roundings are the step `κ_b/levels` and the product
(then the cast to `dtype`). The sum of the senders' separate decodes (each
rounded in `float32`) agrees to float rounding.

Scales: a zero scale decodes to exact zeros; a non-finite scale (a NaN or
Inf anywhere in that bucket, on any sender) decodes to NaN, as the codecs
do.

References:
  docs/algorithms.md#dqsg-subtractive-dither (the single-sender decode),
  docs/scaling.md (why the sum is sent instead of every payload).
"""

import tensorflow as tf

from ndq_tf.ops import random_ops

__all__ = [
    "dither_sum",
    "dithered_sum_dequantize",
    "scaled_sum_dequantize",
]


def _check_seeds(seeds):
  seeds = tf.convert_to_tensor(seeds)
  if not seeds.dtype.is_integer:
    raise TypeError(
        f"`seeds` must be an integer tensor of shape [P, 2]. Received: seeds "
        f"with dtype {seeds.dtype.name}.")
  if (seeds.shape.rank != 2 or seeds.shape[1] not in (2, 3)
      or seeds.shape[0] is None or seeds.shape[0] < 1):
    raise ValueError(
        f"`seeds` must have a static shape [P, 2], P >= 1 (one seed per "
        f"sender), or [P, 3] with a dither offset. Received: seeds with "
        f"shape {seeds.shape}.")
  return seeds


def _check_positive_int(name, value):
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(
        f"`{name}` must be an integer >= 1. Received: {name}={value!r}.")


def dither_sum(seeds, num_elements, stream=0):
  """`Σ_p uniform_dither(seeds[p], num_elements, stream)`, exact, `float64`.

  Args:
    seeds: `[P, 2]` integer tensor, one shape-`[2]` seed per sender (the
      seeds the senders encoded with), static `P`; or `[P, 3]`, the third
      word the dither offset (`uniform_dither(seed, n, stream, offset)`,
      a chunk of a longer buffer; `Codec.encode(..., dither_offset=)`).
    num_elements: Python int `n`.
    stream: the dither stream (0 for DQSG).

  Returns:
    A `float64` tensor of shape `[n]`: every term is a multiple of `2**-24`
    below `1/2` in magnitude, so the sum is exact.
  """
  seeds = _check_seeds(seeds)
  with_offset = seeds.shape[1] == 3

  def add(total, seed):
    offset = seed[2] if with_offset else 0
    return total + tf.cast(
        random_ops.uniform_dither(seed[:2], num_elements, stream, offset),
        tf.float64)

  # A loop over senders (a while loop under XLA), not P unrolled hashes.
  return tf.foldl(add, seeds, initializer=tf.zeros([num_elements], tf.float64))


def _scaled(t, scales, num_levels, bucket_size, dtype):
  """`t·κ_b/levels` per bucket, in float64, NaN where the scale is not finite."""
  _check_positive_int("num_levels", num_levels)
  _check_positive_int("bucket_size", bucket_size)
  n = t.shape[0]
  num_buckets = -(-n // bucket_size)
  scales = tf.convert_to_tensor(scales)
  if scales.shape.rank != 1 or scales.shape[0] != num_buckets:
    raise ValueError(
        f"`scales` must be 1-D with one scale per bucket of {bucket_size}, "
        f"{num_buckets} for {n} elements. Received: scales with shape "
        f"{scales.shape}.")
  step = tf.cast(scales, tf.float64) / float(num_levels)
  t = tf.reshape(tf.pad(t, [[0, num_buckets * bucket_size - n]]),
                 [num_buckets, bucket_size])
  finite = tf.math.is_finite(step)[:, None]
  out = tf.where(finite, t * step[:, None], tf.constant(float("nan"),
                                                        tf.float64))
  return tf.cast(tf.reshape(out, [-1])[:n], dtype)


def _check_sum(symbol_sum):
  symbol_sum = tf.convert_to_tensor(symbol_sum)
  if not symbol_sum.dtype.is_integer:
    raise TypeError(
        f"`symbol_sum` must be an integer tensor. Received: symbol_sum with "
        f"dtype {symbol_sum.dtype.name}.")
  if symbol_sum.shape.rank != 1 or symbol_sum.shape[0] is None:
    raise ValueError(
        f"`symbol_sum` must be 1-D with a static length. Received: "
        f"symbol_sum with shape {symbol_sum.shape}.")
  return tf.cast(symbol_sum, tf.float64)


def dithered_sum_dequantize(symbol_sum, scales, seeds, num_levels,
                            bucket_size, dtype=tf.float32):
  """Decodes the sum of `P` DQSG senders' symbols: `κΔ(S - P·M - Σ_p u_p)`.

  Equals the sum of `DitheredCodec(num_levels, bucket_size).decode` of every
  sender's payload when all of them carry the same `scales`, to float
  rounding.

  Example:

  >>> layout = ops.lane_layout(2 * m + 1, len(seeds), n)
  >>> total = tf.add_n([ops.pack_lanes(s, layout) for s in symbols])
  >>> g_sum = ops.dithered_sum_dequantize(
  ...     ops.unpack_lanes(total, layout), shared_scales, seeds, m, 512)

  Args:
    symbol_sum: 1-D integer tensor `S` of `n` sums of symbols `q_p + M`.
    scales: `[⌈n/bucket_size⌉]` float scales `κ_b`, the same for every
      sender (the max over senders of their max-norms).
    seeds: `[P, 2]` integer tensor: the seed each sender encoded with, in
      any order (`[P, 3]` with a dither offset, see `dither_sum`).
    num_levels: `M`; the step is `Δ = 1/M` in max-normalized units.
    bucket_size: `d`, values per scale.
    dtype: the floating dtype of the result.

  Returns:
    A tensor of shape `[n]` and dtype `dtype`.
  """
  t = _check_sum(symbol_sum)
  seeds = _check_seeds(seeds)
  _check_positive_int("num_levels", num_levels)
  num_senders = seeds.shape[0]
  n = t.shape[0]
  t = t - float(num_senders * num_levels) - dither_sum(seeds, n)
  return _scaled(t, scales, num_levels, bucket_size, dtype)


def scaled_sum_dequantize(symbol_sum, scales, num_senders, num_levels, offset,
                          bucket_size, dtype=tf.float32):
  """Decodes the sum of `P` senders' symbols without a dither: `κ(S - P·o)/M`.

  For the codecs whose decode is `κ_b·q/levels` (`HalfDitheredCodec`:
  levels `M`, offset `M + ⌊m/2⌋`; `TernGradCodec`: levels 1, offset 1;
  `QSGDCodec`: levels `s`, offset `s`).

  Args:
    symbol_sum: 1-D integer tensor `S` of `n` sums of symbols
      `q_p + offset`.
    scales: `[⌈n/bucket_size⌉]` float scales shared by every sender.
    num_senders: `P`, the number of senders summed.
    num_levels: the codec's levels (the decode's divisor of `κ`).
    offset: the codec's offset from codes to symbols.
    bucket_size: `d`, values per scale.
    dtype: the floating dtype of the result.

  Returns:
    A tensor of shape `[n]` and dtype `dtype`.
  """
  t = _check_sum(symbol_sum)
  _check_positive_int("num_senders", num_senders)
  if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
    raise ValueError(
        f"`offset` must be an integer >= 0. Received: offset={offset!r}.")
  return _scaled(t - float(num_senders * offset), scales, num_levels,
                 bucket_size, dtype)
