"""A multi-lane rANS entropy coder from TF integer ops, the same bits everywhere.

rANS (J. Duda, "Asymmetric numeral systems", 2009/2013; the interleaved
form of F. Giesen's ryg_rans, 2014) codes symbol `s` of frequency `f` and
cumulative frequency `c` (out of `M = 2^precision`) into a state `x` as
`x ← ⌊x/f⌋·M + x mod f + c`, and decodes it back as `slot = x mod M`,
`s` the symbol whose `[c, c + f)` holds `slot`, `x ← f·⌊x/M⌋ + slot - c`:
a stack, so the encoder runs backwards over the symbols.

Here the state is a `uint32` in `[2^16, 2^32)`, renormalized by 16-bit
words: before coding a symbol, the encoder emits the state's low 16 bits
if `x ≥ f·2^(32 - precision)` (one word always suffices, since then
`x >> 16 < 2^16 ≤ f·2^(32 - precision)`); after decoding one, the decoder
reads a word when `x < 2^16`. Every operation is an integer one, so every
device, thread count and compilation gives the same bits.

Lanes: element `i` belongs to lane `i mod L`, and the `L` lanes code in
lock step, one row of `L` elements per step, vectorized. The words the
lanes emit at one step are interleaved in lane order, and the steps
follow each other in the decoder's order (the reverse of the encoder's),
so the decoder finds every lane's next word by a prefix sum over the lanes
that read at that step. The stream is `[L final states (32 bits each),
the 16-bit words, two per int32 word (low half first)]`, padded with
zeros to a static capacity (`capacity_words`) so that shapes stay static
for XLA; `rans_encode` also returns the words it used.

The model is a static integer table `cdf[rows, alphabet + 1]`, each row
non-decreasing from 0 to `2^precision`; element `i` is coded with row
`rows[i]`, which both ends know (ECDQ: the bin of its dither). A symbol of
frequency 0 in its row cannot be coded (`rans_encode` checks it when run
eagerly). A row with one symbol of frequency `2^precision` costs nothing.

References:
  J. Duda. Asymmetric numeral systems: entropy coding combining speed of
  Huffman coding with compression rate of arithmetic coding.
  arXiv:1311.2540, 2013.
  F. Giesen. Interleaved entropy coders. arXiv:1402.3392, 2014.
  docs/algorithms.md#entropy-coded-dithered-quantization-ecdq.
"""

import numpy as np
import tensorflow as tf

__all__ = [
    "HEADER_BITS_PER_LANE",
    "MAX_PRECISION",
    "capacity_words",
    "rans_decode",
    "rans_encode",
    "slot_table",
]

#: Each lane's final state travels in the stream's header.
HEADER_BITS_PER_LANE = 32
#: The largest model precision: ECDQ's tables' 15 bits (the state's
#: arithmetic stays below 2^32 up to 16).
MAX_PRECISION = 15
#: The state's lower bound, `2^16` (the encoder's initial state).
_LOW = 1 << 16
#: Steps per loop iteration (unrolled): fewer, larger iterations.
_UNROLL = 4


def _check(name, value, low, high=None):
  if (isinstance(value, bool) or not isinstance(value, int) or value < low
      or (high is not None and value > high)):
    rule = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ValueError(
        f"`{name}` must be an integer {rule}. Received: {name}={value!r}.")
  return value


def _steps(num_elements, num_lanes):
  """Rows of `num_lanes` elements, rounded up to the unrolled iterations."""
  steps = -(-num_elements // num_lanes)
  return -(-steps // _UNROLL) * _UNROLL


def capacity_words(num_elements, num_lanes):
  """The `int32` words of a stream of `num_elements` symbols, at most.

  The header's `num_lanes` words, and one 16-bit word per symbol: a step
  emits at most one word per lane (module docstring).
  """
  _check("num_elements", num_elements, 0)
  _check("num_lanes", num_lanes, 1)
  return num_lanes + -(-num_elements // 2)


def slot_table(cdf, precision=MAX_PRECISION):
  """`table[row, slot]`: the symbol whose `[c, c + f)` holds `slot`.

  Symbols of frequency 0 never appear. Built once per model, in NumPy.

  Args:
    cdf: `int` array `[rows, alphabet + 1]`, rows from 0 to
      `2^precision`, non-decreasing.
    precision: in `[1, MAX_PRECISION]`.

  Returns:
    `np.int16` (`np.int32` beyond 32767 symbols) `[rows, 2^precision]`.
  """
  cdf = np.asarray(cdf)
  _check_cdf(cdf, precision)
  slots = np.arange(1 << precision)
  table = np.stack([np.searchsorted(row[1:], slots, side="right")
                    for row in cdf])
  dtype = np.int16 if cdf.shape[1] <= 32768 else np.int32
  return table.astype(dtype)


def _check_cdf(cdf, precision):
  _check("precision", precision, 1, MAX_PRECISION)
  if cdf.ndim != 2 or cdf.shape[1] < 2 or cdf.shape[0] < 1:
    raise ValueError(
        f"`cdf` must be a [rows, alphabet + 1] table with alphabet >= 1. "
        f"Received: cdf with shape {cdf.shape}.")
  if (cdf[:, 0] != 0).any() or (cdf[:, -1] != 1 << precision).any() or (
      np.diff(cdf, axis=1) < 0).any():
    raise ValueError(
        f"Every row of `cdf` must rise from 0 to 2**precision = "
        f"{1 << precision} without falling. Received: cdf with rows "
        f"starting at {sorted(set(cdf[:, 0].tolist()))[:4]} and ending at "
        f"{sorted(set(cdf[:, -1].tolist()))[:4]}.")


def _layout(flat, num_elements, num_lanes, pad_value):
  """`[T, L]` rows of `flat`, padded with `pad_value`."""
  steps = _steps(num_elements, num_lanes)
  flat = tf.pad(flat, [[0, steps * num_lanes - num_elements]],
                constant_values=pad_value)
  return tf.reshape(flat, [steps, num_lanes])


def _model(cdf, rows, symbols):
  """Each element's cumulative frequency and frequency, `uint32`."""
  width = cdf.shape[1]
  flat = tf.reshape(cdf, [-1])
  index = rows * width + symbols
  start = tf.gather(flat, index)
  freq = tf.gather(flat, index + 1) - start
  return tf.cast(start, tf.uint32), tf.cast(freq, tf.uint32)


def rans_encode(symbols, rows, cdf, num_lanes, precision=MAX_PRECISION):
  """Codes `symbols` with the model rows `rows` of `cdf`.

  Args:
    symbols: 1-D `int32` tensor of static length `n`, each in
      `[0, alphabet)` with a nonzero frequency in its row.
    rows: 1-D `int32` tensor of length `n`, each in `[0, cdf rows)`.
    cdf: `int32` tensor or array `[rows, alphabet + 1]` (module docstring).
    num_lanes: `L >= 1`, a Python int.
    precision: the table's total is `2^precision`, in `[1, 15]`.

  Returns:
    `(words, used)`: the `int32` stream of `capacity_words(n, L)` words,
    zeros after the first `used` (a scalar `int32` tensor).

  Raises:
    ValueError: for an argument out of range, or (eagerly) a symbol of
      frequency 0.
  """
  n = _check_length(symbols, rows)
  _check("num_lanes", num_lanes, 1)
  _check("precision", precision, 1, MAX_PRECISION)
  cdf = tf.convert_to_tensor(cdf, tf.int32)
  capacity = capacity_words(n, num_lanes)
  if n == 0:
    return tf.zeros([capacity], tf.int32), tf.constant(capacity, tf.int32)
  start, freq = _model(cdf, tf.cast(rows, tf.int32),
                       tf.cast(symbols, tf.int32))
  if tf.executing_eagerly() and bool(tf.reduce_any(freq == 0)):
    raise ValueError(
        "`symbols` holds a symbol of frequency 0 in its row of `cdf`: it "
        "cannot be coded. Received: symbols at indices "
        f"{tf.where(freq == 0)[:4, 0].numpy().tolist()}.")
  # Padding: frequency 2^precision from 0, which leaves the state as it is.
  start = _layout(start, n, num_lanes, 0)
  freq = _layout(freq, n, num_lanes, 1 << precision)
  steps = start.shape[0]
  shift = tf.constant(32 - precision, tf.uint32)
  p = tf.constant(precision, tf.uint32)
  s16 = tf.constant(16, tf.uint32)

  def body(t, x, words, emits):
    # Steps t-1, ..., t-_UNROLL (backwards), one row of lanes each.
    for k in range(1, _UNROLL + 1):
      f, c = freq[t - k], start[t - k]
      # x >= f·2^(32 - precision), without overflowing f = 2^precision.
      emit = tf.bitwise.right_shift(x, shift) >= f
      words = words.write(t - k, tf.bitwise.bitwise_and(x, 0xFFFF))
      emits = emits.write(t - k, emit)
      x = tf.where(emit, tf.bitwise.right_shift(x, s16), x)
      x = (tf.bitwise.left_shift(x // f, p) + x % f) + c
    return t - _UNROLL, x, words, emits

  x0 = tf.fill([num_lanes], tf.constant(_LOW, tf.uint32))
  words0 = tf.TensorArray(tf.uint32, size=steps, element_shape=[num_lanes])
  emits0 = tf.TensorArray(tf.bool, size=steps, element_shape=[num_lanes])
  _, x, words, emits = tf.while_loop(
      lambda t, *_: t > 0, body, (tf.constant(steps), x0, words0, emits0),
      maximum_iterations=steps // _UNROLL)
  words, emits = words.stack(), emits.stack()
  # The decoder reads step 0's words first, lanes in order.
  emits = tf.reshape(emits, [-1])
  count = tf.reduce_sum(tf.cast(emits, tf.int32))
  position = tf.cumsum(tf.cast(emits, tf.int32), exclusive=True)
  slots = 2 * (capacity - num_lanes)
  # Words that were not emitted go to one slot past the end, then dropped.
  position = tf.where(emits, position, slots)
  halves = tf.tensor_scatter_nd_add(
      tf.zeros([slots + 1], tf.uint32), position[:, None],
      tf.where(emits, tf.reshape(words, [-1]), 0))[:slots]
  halves = tf.reshape(halves, [-1, 2])
  packed = tf.bitwise.bitwise_or(
      halves[:, 0], tf.bitwise.left_shift(halves[:, 1], s16))
  stream = tf.concat([tf.bitcast(x, tf.int32), tf.bitcast(packed, tf.int32)],
                     0)
  used = num_lanes + (count + 1) // 2
  return stream, used


def rans_decode(words, rows, cdf, num_elements, num_lanes,
                precision=MAX_PRECISION, slots=None):
  """Decodes `num_elements` symbols from a `rans_encode` stream.

  Args:
    words: 1-D `int32` stream of `capacity_words(num_elements, num_lanes)`
      words (its words past the used ones are not read).
    rows: 1-D `int32` tensor, the encoder's `rows`.
    cdf: the encoder's table.
    num_elements: `n`, a Python int.
    num_lanes: the encoder's `L`.
    precision: the encoder's precision.
    slots: `slot_table(cdf, precision)`, if already built.

  Returns:
    `int32` symbols `[num_elements]`.
  """
  _check("num_elements", num_elements, 0)
  _check("num_lanes", num_lanes, 1)
  _check("precision", precision, 1, MAX_PRECISION)
  n = num_elements
  capacity = capacity_words(n, num_lanes)
  if words.shape[0] != capacity:
    raise ValueError(
        f"`words` must hold capacity_words({n}, {num_lanes}) = {capacity} "
        f"words. Received: words with shape {words.shape}.")
  if n == 0:
    return tf.zeros([0], tf.int32)
  if slots is None:
    slots = slot_table(tf.get_static_value(cdf) if tf.is_tensor(cdf)
                       else cdf, precision)
  cdf = tf.convert_to_tensor(cdf, tf.int32)
  width = cdf.shape[1]
  flat_cdf = tf.reshape(cdf, [-1])
  flat_slots = tf.reshape(tf.cast(tf.convert_to_tensor(slots), tf.int32),
                          [-1])
  rows = _layout(tf.cast(rows, tf.int32), n, num_lanes, 0)
  steps = rows.shape[0]
  words = tf.bitcast(words, tf.uint32)
  x0 = words[:num_lanes]
  body_words = words[num_lanes:]
  s16 = tf.constant(16, tf.uint32)
  halves = tf.reshape(tf.stack(
      [tf.bitwise.bitwise_and(body_words, 0xFFFF),
       tf.bitwise.right_shift(body_words, s16)], axis=1), [-1])
  last = halves.shape[0] - 1
  valid = _layout(tf.ones([n], tf.bool), n, num_lanes, False)
  mask = tf.constant((1 << precision) - 1, tf.uint32)
  p = tf.constant(precision, tf.uint32)
  low = tf.constant(_LOW, tf.uint32)
  table_rows = tf.constant(1 << precision, tf.int32)

  def body(t, x, base, out):
    for k in range(_UNROLL):
      row = rows[t + k]
      slot = tf.bitwise.bitwise_and(x, mask)
      s = tf.gather(flat_slots, row * table_rows + tf.cast(slot, tf.int32))
      index = row * width + s
      c = tf.cast(tf.gather(flat_cdf, index), tf.uint32)
      f = tf.cast(tf.gather(flat_cdf, index + 1), tf.uint32) - c
      x = f * tf.bitwise.right_shift(x, p) + slot - c
      # Padding (past the n-th element) was coded as the identity.
      need = tf.logical_and(x < low, valid[t + k])
      need_i = tf.cast(need, tf.int32)
      position = base + tf.cumsum(need_i, exclusive=True)
      word = tf.gather(halves, tf.minimum(position, last))
      x = tf.where(need, tf.bitwise.bitwise_or(
          tf.bitwise.left_shift(x, s16), word), x)
      base += tf.reduce_sum(need_i)
      out = out.write(t + k, s)
    return t + _UNROLL, x, base, out

  out0 = tf.TensorArray(tf.int32, size=steps, element_shape=[num_lanes])
  _, _, _, out = tf.while_loop(
      lambda t, *_: t < steps, body,
      (tf.constant(0), x0, tf.constant(0), out0),
      maximum_iterations=steps // _UNROLL)
  return tf.reshape(out.stack(), [-1])[:n]


def _check_length(symbols, rows):
  if symbols.shape.rank != 1 or rows.shape.rank != 1 or (
      symbols.shape[0] != rows.shape[0]) or symbols.shape[0] is None:
    raise ValueError(
        f"`symbols` and `rows` must be 1-D of one static length. Received: "
        f"symbols with shape {symbols.shape}, rows with shape "
        f"{rows.shape}.")
  return symbols.shape[0]
