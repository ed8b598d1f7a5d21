"""Integer lanes: codes packed so that an integer all-reduce sums them exactly.

Codes offset to symbols `{0 .. L-1}` (`L` the alphabet size; `L - 1 = 2M`
for DQSG with `M` levels) and summed over at most `P` senders add up to at
most `P·(L - 1)`. A *lane* of `b = ⌈log2(P·(L - 1) + 1)⌉` bits holds any such
sum, so `D` lanes side by side in one integer word add as `D` independent
sums: adding two words adds their lanes, and no lane ever carries into the
next one because none exceeds `2**b - 1`. TF's own integer all-reduce
(`CollectiveReduceV2` with `Add`, NCCL on GPUs) then sums several codes per
word, exactly, whatever order the ring adds the partial sums in (they are
all non-negative and no larger than the full sum).

No undefined behaviour: the words are signed (`int32` or `int64`, the
integer types TF's collectives carry) and signed overflow must never happen,
so the top (sign) bit of a word stays free: `D·b <= 31` for `int32` and
`D·b <= 63` for `int64`. With every lane at its maximum the word is
`2**(D·b) - 1 <= 2**31 - 1` (or `2**63 - 1`): the largest possible sum fits.

The layout is planar, as in `ndq_tf.ops.pack_codes`: `n` codes take
`W = ⌈n/D⌉` words; lane `j` of word `k` (bits `j·b .. (j+1)·b - 1`) holds
code `j·W + k`, and codes past `n` are 0. Packing and unpacking are shifts,
masks and a sum over `[D, W]`: integer ops, bitwise identical eagerly, in
`tf.function` and under XLA.

References:
  docs/scaling.md: the cost of an integer all-reduce of lanes against the
  all-gather of packed codes and against float rings.
"""

from typing import NamedTuple

import tensorflow as tf

__all__ = [
    "LaneLayout",
    "lane_layout",
    "pack_lanes",
    "unpack_lanes",
]

#: Bits of a signed word that a lane may use: all but the sign bit.
_USABLE_BITS = {tf.int32: 31, tf.int64: 63}
_WORD_BITS = {tf.int32: 32, tf.int64: 64}
#: Sums are returned as `int32`: the largest sum must stay below `2**31`.
_MAX_SUM = 2**31 - 1


class LaneLayout(NamedTuple):
  """How `num_codes` codes sit in lanes of integer words (immutable).

  Attributes:
    dtype: `tf.int32` or `tf.int64`, the word type.
    lane_bits: `b`, bits per lane; every lane value is below `2**b`.
    lanes_per_word: `D`, lanes per word, `D·b` at most 31 (`int32`) or 63
      (`int64`): the sign bit is never set.
    num_codes: `n`, codes (and sums) per vector.
  """
  dtype: tf.DType
  lane_bits: int
  lanes_per_word: int
  num_codes: int

  @property
  def word_bits(self):
    """32 or 64."""
    return _WORD_BITS[self.dtype]

  @property
  def num_words(self):
    """`W = ⌈n/D⌉`, the words of one packed vector."""
    return -(-self.num_codes // self.lanes_per_word)

  @property
  def wire_bits(self):
    """Bits of one packed vector: `W·word_bits`."""
    return self.num_words * self.word_bits

  @property
  def max_lane_value(self):
    """`2**b - 1`: the largest value a lane holds without a carry."""
    return (1 << self.lane_bits) - 1


def _check_int(name, value, low):
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise ValueError(
        f"`{name}` must be an integer >= {low}. Received: {name}={value!r}.")
  return value


def lane_layout(alphabet_size, num_summands, num_codes):
  """The densest exact lane layout for summing codes of `num_summands` senders.

  A lane needs `b = ⌈log2(P·(L - 1) + 1)⌉` bits (`P = num_summands`,
  `L = alphabet_size`). Of the word types, `int32` fits `⌊31/b⌋` lanes and
  `int64` `⌊63/b⌋`; the layout is the one with the fewest bits for
  `num_codes` codes (`⌈n/D⌉·word_bits`), `int32` on a tie. Every sender and
  receiver computes the same layout from the same static numbers.

  Example: ternary codes (`L = 3`) of 8 workers sum to at most 16, 5 bits:
  6 lanes in an `int32` (30 bits) or 12 in an `int64` (60 bits), equally
  dense, so `int32`, 5.33 bits per code.

  Args:
    alphabet_size: `L >= 2`; symbols are `0 .. L - 1` (`2M + 1` for DQSG
      with `M` levels).
    num_summands: `P >= 1`, the most vectors that will be added up.
    num_codes: `n >= 0`, codes per vector.

  Returns:
    A `LaneLayout`.

  Raises:
    ValueError: for an argument out of range, or if the largest sum
      `P·(L - 1)` does not fit an `int32` (`>= 2**31`).
  """
  _check_int("alphabet_size", alphabet_size, 2)
  _check_int("num_summands", num_summands, 1)
  _check_int("num_codes", num_codes, 0)
  max_sum = num_summands * (alphabet_size - 1)
  if max_sum > _MAX_SUM:
    raise ValueError(
        f"`num_summands` * (`alphabet_size` - 1), the largest sum, must be "
        f"below 2**31. Received: num_summands={num_summands}, "
        f"alphabet_size={alphabet_size}.")
  bits = max_sum.bit_length()  # ⌈log2(max_sum + 1)⌉
  best = None
  for dtype in (tf.int32, tf.int64):  # int32 first: it wins ties
    layout = LaneLayout(dtype, bits, _USABLE_BITS[dtype] // bits, num_codes)
    if best is None or layout.wire_bits < best.wire_bits:
      best = layout
  return best


def _check_layout(layout):
  if not isinstance(layout, LaneLayout):
    raise TypeError(
        f"`layout` must be a LaneLayout (from lane_layout). Received: "
        f"layout of type {type(layout).__name__}.")


def _shifts(layout):
  return tf.constant(
      [j * layout.lane_bits for j in range(layout.lanes_per_word)],
      layout.dtype)[:, None]


def pack_lanes(codes, layout):
  """Packs non-negative codes into lanes of `layout.dtype` words.

  Args:
    codes: 1-D integer tensor of static length `layout.num_codes`, values in
      `[0, 2**lane_bits)` (symbols, or partial sums of symbols). Values are
      not checked, as in `pack_codes`: one out of range corrupts its
      neighbours.
    layout: a `LaneLayout` from `lane_layout`.

  Returns:
    A 1-D tensor of `layout.num_words` words of `layout.dtype`, every word
    non-negative.

  Raises:
    TypeError: if `codes` is not an integer tensor or `layout` not a
      `LaneLayout`.
    ValueError: if `codes` is not 1-D of length `layout.num_codes`.
  """
  _check_layout(layout)
  codes = tf.convert_to_tensor(codes)
  if not codes.dtype.is_integer:
    raise TypeError(
        f"`codes` must be an integer tensor. Received: codes with dtype "
        f"{codes.dtype.name}.")
  n = layout.num_codes
  if codes.shape.rank != 1 or codes.shape[0] != n:
    raise ValueError(
        f"`codes` must be 1-D with layout.num_codes={n} elements. Received: "
        f"codes with shape {codes.shape}.")
  lanes, words = layout.lanes_per_word, layout.num_words
  codes = tf.pad(tf.cast(codes, layout.dtype), [[0, lanes * words - n]])
  codes = tf.reshape(codes, [lanes, words])
  # Disjoint bit fields: the sum is their bitwise or, below 2**(D·b), so
  # integer addition is exact in any order.
  return tf.reduce_sum(tf.bitwise.left_shift(codes, _shifts(layout)), axis=0)


def unpack_lanes(words, layout):
  """Inverse of `pack_lanes`, also for the sum of several packed vectors.

  If `words` is the sum of at most `P` vectors packed by `pack_lanes` with
  symbols in `0 .. L - 1` (the `num_summands` and `alphabet_size` of
  `layout`), the result is the elementwise sum of the codes, exactly.

  Args:
    words: 1-D tensor of `layout.num_words` words of `layout.dtype`.
    layout: the `LaneLayout` the words were packed with.

  Returns:
    A 1-D `int32` tensor of `layout.num_codes` lane values.

  Raises:
    TypeError: if `words` is not of `layout.dtype` or `layout` not a
      `LaneLayout`.
    ValueError: if `words` is not 1-D of length `layout.num_words`.
  """
  _check_layout(layout)
  words = tf.convert_to_tensor(words)
  if words.dtype != layout.dtype:
    raise TypeError(
        f"`words` must have the layout's dtype {layout.dtype.name}. "
        f"Received: words with dtype {words.dtype.name}.")
  if words.shape.rank != 1 or words.shape[0] != layout.num_words:
    raise ValueError(
        f"`words` must be 1-D with layout.num_words={layout.num_words} "
        f"elements. Received: words with shape {words.shape}.")
  mask = tf.constant(layout.max_lane_value, layout.dtype)
  # Words are non-negative, so the arithmetic right shift is a logical one.
  lanes = tf.bitwise.bitwise_and(
      tf.bitwise.right_shift(words[None, :], _shifts(layout)), mask)
  return tf.reshape(tf.cast(lanes, tf.int32), [-1])[:layout.num_codes]
