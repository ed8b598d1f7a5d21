"""A multi-lane rANS entropy coder in integer TF ops, the same bits everywhere.

Entropy-coded dithered quantization (issue #35) sends quantization codes at
close to their entropy under a model both sides know. This module is the
coder: range asymmetric numeral systems (rANS; Duda 2013) with a static
model, written in `uint32` TF ops only (no float, no Python loop over
elements), so that it runs eagerly, in a `tf.function` and under XLA
(`jit_compile=True`) with bitwise the same output.

Model. An integer table `cdf` of shape `[R, A + 1]`: row `r` is a
non-decreasing cumulative frequency table from `0` to `M = 2**p`
(`p = precision <= 15`), so symbol `s` of row `r` has the frequency
`f = cdf[r, s + 1] - cdf[r, s]` (probability `f / M`) and the start
`c = cdf[r, s]`. Element `i` is coded with row `rows[i]`, which the
decoder must know too (ECDQ derives it from the shared dither). A symbol
of frequency 0 cannot be coded: its elements would not decode (eagerly,
`rans_encode` raises; in a graph it is coded as if its frequency were 1
and decodes as another symbol).

Coder. The state `x` of a lane is a `uint32` in `[2**16, 2**32)`, output
in 16-bit words. To code `s` (frequency `f`, start `c`):

  1. renormalize: if `x >= f·2**(32-p)`, emit `x & 0xFFFF` and
     `x >>= 16`. Once is enough: `x < 2**32` gives `x >> 16 < 2**16 <=
     f·2**(32-p)` for `f >= 1`, `p <= 16`; and afterwards
     `x >= f·2**(16-p)` (unchanged, `x >= 2**16 >= f·2**(16-p)`; shifted,
     `x >= f·2**(32-p)·2**-16`).
  2. `x = (x // f)·M + x % f + c`, computed as `x + c + (x // f)·(M - f)`;
     it is below `2**32` because `x // f < 2**(32-p)`, and at least
     `(x // f)·M >= 2**16`.

The decoder inverts it: `slot = x % M` names the symbol and the slot's
offset `slot - c` in it (one lookup in `slot_table`), `x = f·(x >> p) +
slot - c`, and a state below `2**16`
reads the next word: `x = (x << 16) | word`. A lane's encoder runs over
its elements backwards and starts from `x = 2**16`; the decoder runs
forwards, reading the words in the reverse order of their emission.

Lanes. Element `i` belongs to lane `i mod L`: the `L` lanes advance in
lock step, one row of `L` elements per step of a `tf.while_loop`
(`T = ceil(n/L)` steps), the ops vectorized across the lanes. Positions
past `n` in the last row leave their lane's state as it is (the encoder
codes them with `f = M, c = 0`, which emits nothing).

Wire format, in `int32` words (the bits of `uint32` values):

  * `[0, L)`: the lanes' final encoder states;
  * `[L, L + H)`: each lane's number of 16-bit words, two per word (lane
    `2j` in the low half) when `T < 2**16` (`H = ceil(L/2)`), one per
    word otherwise (`H = L`);
  * then the 16-bit words, two per `int32` (the first in the low half):
    lane 0's words in the order its decoder reads them, then lane 1's...

`rans_encode` returns the words padded with zeros to a capacity that
depends only on `n`, `L`, `p` and the table, and the number of words used.
The header costs `48·L` bits (`64·L` when `T >= 2**16`); the coder's own
overhead over `-Σ log2(f_i/M)` is a fraction of a percent (tested).

Capacity. A lane's state satisfies `x' <= (M/f)·(x + f·(M - f)/M)` at
each coding step (`x' - x·M/f = c - (x % f)·(M - f)/f <= M - f`), and
`x >= f·2**(16-p)` there, so a symbol adds at most
`b(f) = p - log2(f) + log2(1 + 2**(p-16))` bits to `16·(words) + log2(x)`,
while a renormalization does not increase it. The lane starts at
`log2(x) = 16` and ends with `log2(x) >= 16`: it emits at most
`Σ b(f_i) / 16` words, hence `n` elements at most `floor(n·B/16)` words with
`B = max b(f)` over the symbols of non-zero frequency below `M`
(`rans_max_bits`), and never more than one word per element.

Throughput. The loops carry only the lanes' states (and the decoder the
table entries it looks up); the words, their positions and the symbols
are computed from that history outside the loop, with vectorized ops.
Rows are not unrolled: under XLA an unrolled step recomputes its
predecessors' elementwise work in every fusion (two or four rows per
iteration measured slower than one). `benchmarks/rans_throughput.py`
measures it.

References:
  J. Duda. Asymmetric numeral systems: entropy coding combining speed of
  Huffman coding with compression rate of arithmetic coding.
  arXiv:1311.2540, 2013.
  F. Giesen. Interleaved entropy coders. arXiv:1402.3392, 2014.
  docs/algorithms.md#entropy-coded-dithered-quantization-ecdq.
"""

import math

import numpy as np
import tensorflow as tf

from ndq_tf.ops import checks

__all__ = [
    "MAX_PRECISION",
    "rans_capacity_words",
    "rans_decode",
    "rans_encode",
    "rans_header_words",
    "rans_max_bits",
    "slot_table",
]

#: The largest supported `precision`: a slot's offset (below `2**p`) sits
#: under the symbol in `slot_table`'s `int32`, and a frequency (up to
#: `2**p`) under the start in the encoder's `uint32`.
MAX_PRECISION = 15
#: The lower end of a lane's state interval, also its initial state.
_STATE_LOW = 2**16
#: Row indices are scaled by `2**p` in `int32`.
_MAX_TABLE_SIZE = 2**31 - 1
#: `slot_table` holds a symbol above a slot's offset (below `2**15`).
_OFFSET_BITS = 15
_MAX_ALPHABET = 2**16


def _u32(value):
  return tf.constant(value, tf.uint32)


def _check_precision(precision):
  return checks.check_int("precision", precision, 1, MAX_PRECISION)


def _cdf_tensor(cdf, precision):
  """The table as an `int32` tensor, validated as far as it is known.

  The shape must be static. When the values are known (a constant, a
  NumPy array, an eager tensor), every row must go from 0 to `2**p` without
  decreasing.
  """
  m = 2**precision
  static = tf.get_static_value(cdf) if tf.is_tensor(cdf) else np.asarray(cdf)
  if static is not None:
    static = np.asarray(static)
    if not np.issubdtype(static.dtype, np.integer):
      raise ValueError(f"`cdf` must hold integers. Received: cdf with dtype "
                       f"{static.dtype}.")
  tensor = tf.convert_to_tensor(cdf if static is None else static)
  if not tensor.dtype.is_integer:
    raise ValueError(f"`cdf` must be an integer tensor. Received: cdf with "
                     f"dtype {tensor.dtype.name}.")
  shape = tensor.shape
  if shape.rank != 2 or shape[0] is None or shape[1] is None:
    raise ValueError(f"`cdf` must have a static shape [num_rows, alphabet + "
                     f"1]. Received: cdf with shape {shape}.")
  if shape[0] < 1 or shape[1] < 2:
    raise ValueError(f"`cdf` needs at least one row and one symbol. "
                     f"Received: cdf with shape {shape}.")
  if shape[1] - 1 > _MAX_ALPHABET:
    raise ValueError(f"`cdf` may have at most {_MAX_ALPHABET} symbols. "
                     f"Received: cdf with shape {shape}.")
  if (shape[0] + 1) * m > _MAX_TABLE_SIZE:
    raise ValueError(f"`cdf` has too many rows for precision={precision}: "
                     f"(num_rows + 1)·2**precision must stay below 2**31. "
                     f"Received: cdf with shape {shape}.")
  if static is not None:
    if np.any(static[:, 0] != 0) or np.any(static[:, -1] != m):
      raise ValueError(f"Every row of `cdf` must start at 0 and end at "
                       f"2**precision = {m}. Received: first column "
                       f"{static[:, 0].tolist()[:8]}, last column "
                       f"{static[:, -1].tolist()[:8]} (first 8 rows).")
    if np.any(np.diff(static, axis=1) < 0):
      raise ValueError("Every row of `cdf` must be non-decreasing. Received: "
                       f"a decrease in row "
                       f"{int(np.nonzero(np.diff(static, axis=1) < 0)[0][0])}.")
  return tf.cast(tensor, tf.int32), static


def rans_max_bits(cdf, precision=15):
  """An upper bound on the bits one element can cost under the table.

  `max (p - log2 f + log2(1 + 2**(p-16)))` over the symbols with
  `0 < f < 2**p` (the module docstring derives it; the last term bounds what
  the rounding of the state adds per symbol), rounded up to a multiple of
  `2**-20`; 0 when every row has a single symbol of frequency `2**p`.

  Args:
    cdf: the table, `[num_rows, alphabet + 1]`, with known values (NumPy,
      a constant or an eager tensor).
    precision: Python int `p` in `[1, 15]`.

  Returns:
    A Python float.

  Raises:
    ValueError: for an invalid table or precision, or a table whose values
      are not known.
  """
  precision = _check_precision(precision)
  _, static = _cdf_tensor(cdf, precision)
  if static is None:
    raise ValueError("`cdf` must have known values to bound the code length "
                     "(a NumPy array, a constant or an eager tensor). "
                     "Received: a symbolic cdf.")
  freq = np.diff(static.astype(np.int64), axis=1)
  coded = freq[(freq > 0) & (freq < 2**precision)]
  if coded.size == 0:
    return 0.0
  bits = (precision - math.log2(int(coded.min()))
          + math.log2(1.0 + 2.0**(precision - 16)))
  # Rounded up past any float error of log2 (below 2**-40 here).
  return math.ceil(bits * 2**20 + 1e-3) / 2**20


def _num_steps(num_elements, num_lanes):
  return -(-num_elements // num_lanes)


def _wide_counts(num_elements, num_lanes):
  """Whether lane word counts take 32 bits (a lane may emit 2**16 words)."""
  return _num_steps(num_elements, num_lanes) >= 2**16


def rans_header_words(num_elements, num_lanes):
  """The `int32` words of the header: `L` states and the `L` word counts."""
  num_elements = checks.check_int("num_elements", num_elements, 0)
  num_lanes = checks.check_int("num_lanes", num_lanes, 1)
  if _wide_counts(num_elements, num_lanes):
    return 2 * num_lanes
  return num_lanes + -(-num_lanes // 2)


def _max_words16(num_elements, max_bits):
  """At most `floor(n·B/16)` 16-bit words, and one per element."""
  if not isinstance(max_bits, (int, float)) or isinstance(max_bits, bool) or (
      not 0 <= max_bits <= 16) or math.isnan(max_bits):
    raise ValueError(f"`max_bits` must be a number in [0, 16]. Received: "
                     f"max_bits={max_bits!r}.")
  scaled = math.ceil(max_bits * 2**20)  # exact for rans_max_bits' values
  return min(num_elements, num_elements * scaled // (16 * 2**20))


def rans_capacity_words(num_elements, num_lanes, cdf_or_max_bits,
                        precision=15):
  """The static length, in `int32` words, of `rans_encode`'s output.

  The header (`rans_header_words`) plus `ceil(W/2)` words for the at most
  `W = min(n, floor(n·B/16))` 16-bit words of the lanes, `B` the bound of
  `rans_max_bits`. Every lane starts and ends with a state of at least 16
  bits, so no per-lane slack is needed (module docstring).

  Args:
    num_elements: Python int `n >= 0`.
    num_lanes: Python int `L >= 1`.
    cdf_or_max_bits: the table (with known values), or a Python number
      `B` in `[0, 16]` as returned by `rans_max_bits` for it.
    precision: Python int `p` in `[1, 15]`, the table's.

  Returns:
    A Python int.

  Raises:
    ValueError: for an invalid argument.
  """
  header = rans_header_words(num_elements, num_lanes)
  if isinstance(cdf_or_max_bits, (int, float)) and not isinstance(
      cdf_or_max_bits, bool):
    max_bits = float(cdf_or_max_bits)
  else:
    max_bits = rans_max_bits(cdf_or_max_bits, precision)
  words16 = _max_words16(num_elements, max_bits)
  return header + -(-words16 // 2)


def slot_table(cdf, precision=15):
  """The decoder's lookup table: the symbol and offset of every slot.

  `table[r, k] = s·2**15 + (k - cdf[r, s])` for the symbol `s` with
  `cdf[r, s] <= k < cdf[r, s + 1]` (so `table >> 15` is the symbol, and
  the low 15 bits the slot's offset in it). Symbols of frequency 0 own no
  slot. Build it once per table and pass it to `rans_decode` (`table=`):
  decoding is then one lookup per element, not a search.

  Args:
    cdf: `[num_rows, alphabet + 1]` integer table (see the module).
    precision: Python int `p` in `[1, 15]`.

  Returns:
    An `int32` tensor of shape `[num_rows, 2**p]`.
  """
  precision = _check_precision(precision)
  cdf, _ = _cdf_tensor(cdf, precision)
  return _slot_table(cdf, precision)


def _slot_table(cdf, precision):
  slots = tf.range(2**precision, dtype=tf.int32)[None, :]
  symbol = tf.zeros([cdf.shape[0], 2**precision], tf.int32)
  start = tf.zeros_like(symbol)
  # One comparison per symbol boundary (a loop over the alphabet, not over
  # elements): the symbol is the number of interior boundaries at or below
  # the slot, its start the last of them. Under XLA this is one fused pass.
  for k in range(1, cdf.shape[1] - 1):
    below = cdf[:, k:k + 1] <= slots
    symbol += tf.cast(below, tf.int32)
    start = tf.where(below, cdf[:, k:k + 1], start)
  return tf.bitwise.bitwise_or(tf.bitwise.left_shift(symbol, _OFFSET_BITS),
                               slots - start)


def _check_elements(name, values, num_elements):
  values = tf.convert_to_tensor(values)
  if not values.dtype.is_integer:
    raise ValueError(f"`{name}` must be an integer tensor. Received: {name} "
                     f"with dtype {values.dtype.name}.")
  if values.shape.rank != 1 or values.shape[0] is None:
    raise ValueError(f"`{name}` must be 1-D with a static length. Received: "
                     f"{name} with shape {values.shape}.")
  if num_elements is not None and values.shape[0] != num_elements:
    raise ValueError(f"`{name}` must have {num_elements} elements. Received: "
                     f"{name} with shape {values.shape}.")
  return tf.cast(values, tf.int32)


def _eager_values(tensor):
  """The NumPy value of an eager tensor, None in a graph."""
  if tf.executing_eagerly():
    return tensor.numpy()
  return None


def _check_rows(rows, num_rows):
  values = _eager_values(rows)
  if values is not None and values.size and (values.min() < 0
                                             or values.max() >= num_rows):
    bad = values[(values < 0) | (values >= num_rows)][0]
    raise ValueError(f"`rows` must be in [0, {num_rows}) (the rows of "
                     f"`cdf`). Received: a row {int(bad)}.")


def _check_symbols(symbols, rows, cdf):
  """Eagerly: every symbol in range and of non-zero frequency in its row."""
  values = _eager_values(symbols)
  if values is None or not values.size:
    return
  alphabet = cdf.shape[1] - 1
  bad = (values < 0) | (values >= alphabet)
  if np.any(bad):
    raise ValueError(f"`symbols` must be in [0, {alphabet}). Received: a "
                     f"symbol {int(values[bad][0])}.")
  row_values = _eager_values(rows)
  freq = _eager_values(cdf[:, 1:] - cdf[:, :-1])[row_values, values]
  if np.any(freq == 0):
    i = int(np.nonzero(freq == 0)[0][0])
    raise ValueError(f"`symbols` must have a non-zero frequency in their "
                     f"row. Received: symbol {int(values[i])} of row "
                     f"{int(row_values[i])} (frequency 0) at element {i}.")


def rans_encode(symbols, rows, cdf, num_lanes, precision=15, max_bits=None):
  """Entropy-codes `symbols` with rANS in `num_lanes` interleaved lanes.

  Args:
    symbols: 1-D integer tensor of static length `n`, `symbols[i]` in
      `[0, alphabet)` with a non-zero frequency in row `rows[i]`.
    rows: 1-D integer tensor of length `n`, `rows[i]` in `[0, num_rows)`:
      the table row of element `i`, known to the decoder too.
    cdf: `[num_rows, alphabet + 1]` integer table (see the module), static
      shape; values known (NumPy, constant, eager) unless `max_bits` is
      given.
    num_lanes: Python int `L >= 1`, the number of interleaved coders
      (element `i` goes to lane `i mod L`). More lanes decode faster, each
      costs 48 header bits.
    precision: Python int `p` in `[1, 15]`: every row sums to `2**p`.
    max_bits: None, or a Python number `B` in `[0, 16]` bounding the bits
      of one element (`rans_max_bits(cdf)`); the output's capacity is
      computed from it. Default: from `cdf` when its values are known,
      else 16 (one 16-bit word per element).

  Returns:
    `(words, used)`: a 1-D `int32` tensor of
    `rans_capacity_words(n, L, B, p)` words, zero past the first `used`,
    and `used`, an `int32` scalar tensor. Only the first `used` words need
    to reach the decoder (any zero padding after them is fine).

  Raises:
    ValueError: for an invalid argument; eagerly, also for a row or symbol
      out of range or a symbol of frequency 0.
  """
  precision = _check_precision(precision)
  num_lanes = checks.check_int("num_lanes", num_lanes, 1)
  cdf, static = _cdf_tensor(cdf, precision)
  symbols = _check_elements("symbols", symbols, None)
  n = symbols.shape[0]
  rows = _check_elements("rows", rows, n)
  num_rows, alphabet = cdf.shape[0], cdf.shape[1] - 1
  if max_bits is None:
    max_bits = 16.0 if static is None else rans_max_bits(static, precision)
  words16 = _max_words16(n, max_bits)
  header = rans_header_words(n, num_lanes)
  capacity = header + -(-words16 // 2)
  _check_rows(rows, num_rows)
  _check_symbols(symbols, rows, cdf)
  if n == 0:
    return _empty_stream(num_lanes, capacity), tf.constant(header, tf.int32)
  return _encode(symbols, rows, cdf, num_lanes, precision, words16,
                 capacity)


def _empty_stream(num_lanes, capacity):
  states = tf.fill([num_lanes], tf.constant(_STATE_LOW, tf.int32))
  return tf.pad(states, [[0, capacity - num_lanes]])


def _encode(symbols, rows, cdf, num_lanes, precision, words16, capacity):
  n = symbols.shape[0]
  lanes, m = num_lanes, 2**precision
  steps = _num_steps(n, lanes)
  padded = steps * lanes
  num_rows, alphabet = cdf.shape[0], cdf.shape[1] - 1
  # Each symbol's frequency and start in one word (`f | c << 16`), and one
  # more entry, the identity (f = M, c = 0), for the padding. A frequency 0
  # (never valid) becomes 1, so that no mode divides by zero.
  coder = tf.bitwise.bitwise_or(
      tf.maximum(cdf[:, 1:] - cdf[:, :-1], 1),
      tf.bitwise.left_shift(cdf[:, :-1], 16))
  coder = tf.cast(tf.concat([tf.reshape(coder, [-1]), [m]], 0), tf.uint32)
  index = tf.reshape(
      tf.pad(rows * alphabet + symbols, [[0, padded - n]],
             constant_values=num_rows * alphabet), [steps, lanes])
  top = _u32(32 - precision)
  high = tf.constant(32, tf.uint64)

  # The loop carries each lane's state and its number of words emitted so
  # far, packed in a uint64 (`x | count << 32`); the words and their
  # positions are computed from the states' history afterwards, over all
  # elements at once. In a graph the history is a TensorArray: under XLA
  # each step is then one in-place dynamic-update-slice.
  def step(t, packed):
    x = tf.cast(packed, tf.uint32)
    count = tf.cast(tf.bitwise.right_shift(packed, high), tf.uint32)
    fc = tf.gather(coder, index[t])
    f = tf.bitwise.bitwise_and(fc, _u32(0xFFFF))
    emit = tf.bitwise.right_shift(x, top) >= f
    x = tf.where(emit, tf.bitwise.right_shift(x, _u32(16)), x)
    x = (x + tf.bitwise.right_shift(fc, _u32(16))
         + (x // f) * (_u32(m) - f))
    count += tf.cast(emit, tf.uint32)
    return tf.bitwise.bitwise_or(
        tf.cast(x, tf.uint64),
        tf.bitwise.left_shift(tf.cast(count, tf.uint64), high))

  initial = tf.fill([lanes], tf.constant(_STATE_LOW, tf.uint64))
  history, _ = _history(step, initial, steps, lanes, reverse=True)
  # Row t emitted the low half of the state it started from iff its count
  # went up.
  before = history[1:]
  emitted = tf.cast(tf.bitwise.right_shift(before, high), tf.int32)
  emit = tf.cast(tf.bitwise.right_shift(history[:-1], high),
                 tf.int32) > emitted
  x = tf.cast(before, tf.uint32)
  counts = tf.cast(tf.bitwise.right_shift(history[0], high), tf.int32)
  total = tf.reduce_sum(counts)
  # A lane's words go in decoding order: the word emitted when `emitted`
  # words had been emitted before it is the lane's word
  # `counts - 1 - emitted`.
  first = tf.cumsum(counts, exclusive=True)
  position = tf.where(emit, (first + counts - 1)[None, :] - emitted, words16)
  words = tf.bitwise.bitwise_and(x, _u32(0xFFFF))
  stream = tf.tensor_scatter_nd_update(
      tf.zeros([words16 + 1], tf.uint32), tf.reshape(position, [-1, 1]),
      tf.reshape(words, [-1]))
  stream = tf.pad(stream[:words16], [[0, words16 % 2]])
  stream = tf.reshape(stream, [-1, 2])
  body = tf.bitwise.bitwise_or(stream[:, 0],
                               tf.bitwise.left_shift(stream[:, 1], _u32(16)))
  states = tf.cast(history[0], tf.uint32)
  header = [states, _pack_counts(counts, n, lanes)]
  out = tf.bitcast(tf.concat(header + [body], 0), tf.int32)
  used = rans_header_words(n, lanes) + (total + 1) // 2
  return out, used


def _pack_counts(counts, num_elements, num_lanes):
  counts = tf.cast(counts, tf.uint32)
  if _wide_counts(num_elements, num_lanes):
    return counts
  pairs = tf.reshape(tf.pad(counts, [[0, num_lanes % 2]]), [-1, 2])
  return tf.bitwise.bitwise_or(pairs[:, 0],
                               tf.bitwise.left_shift(pairs[:, 1], _u32(16)))


def _unpack_counts(words, num_elements, num_lanes):
  if _wide_counts(num_elements, num_lanes):
    return tf.cast(words, tf.int32)
  halves = tf.stack([tf.bitwise.bitwise_and(words, _u32(0xFFFF)),
                     tf.bitwise.right_shift(words, _u32(16))], axis=1)
  return tf.cast(tf.reshape(halves, [-1])[:num_lanes], tf.int32)


def rans_decode(words, rows, cdf, num_elements, num_lanes, precision=15,
                table=None):
  """Decodes what `rans_encode` coded: the exact symbols.

  Args:
    words: 1-D `int32` tensor of static length, at least the header and
      the `used` words of `rans_encode` (any padding after them is
      ignored).
    rows: 1-D integer tensor of length `num_elements`: the rows the
      encoder used.
    cdf: the encoder's table (static shape).
    num_elements: Python int `n`.
    num_lanes: Python int `L`, the encoder's.
    precision: Python int `p`, the encoder's.
    table: optional `slot_table(cdf, precision)`, built once and reused;
      built here when None.

  Returns:
    A 1-D `int32` tensor of the `n` symbols.

  Raises:
    ValueError: for an invalid argument (eagerly, also for rows out of
      range). A stream that `rans_encode` did not produce (truncated or
      corrupted) decodes to garbage without an error.
  """
  precision = _check_precision(precision)
  n = checks.check_int("num_elements", num_elements, 0)
  num_lanes = checks.check_int("num_lanes", num_lanes, 1)
  cdf, _ = _cdf_tensor(cdf, precision)
  rows = _check_elements("rows", rows, n)
  words = tf.convert_to_tensor(words)
  if words.dtype != tf.int32 or words.shape.rank != 1 or words.shape[0] is None:
    raise ValueError(f"`words` must be a 1-D int32 tensor of static length. "
                     f"Received: words with dtype {words.dtype.name} and "
                     f"shape {words.shape}.")
  header = rans_header_words(n, num_lanes)
  if words.shape[0] < header:
    raise ValueError(f"`words` must hold at least the {header} header words "
                     f"of {num_lanes} lanes. Received: words with shape "
                     f"{words.shape}.")
  num_rows, m = cdf.shape[0], 2**precision
  if table is None:
    table = _slot_table(cdf, precision)
  else:
    table = tf.convert_to_tensor(table)
    if table.shape != [num_rows, m] or not table.dtype.is_integer:
      raise ValueError(f"`table` must be slot_table(cdf, precision), an "
                       f"integer tensor of shape {[num_rows, m]}. Received: "
                       f"table with dtype {table.dtype.name} and shape "
                       f"{table.shape}.")
    table = tf.cast(table, tf.int32)
  _check_rows(rows, num_rows)
  if n == 0:
    return tf.zeros([0], tf.int32)
  return _decode(words, rows, cdf, table, n, num_lanes, precision)


def _decode(words, rows, cdf, table, n, lanes, precision):
  alphabet = cdf.shape[1] - 1
  m = 2**precision
  steps = _num_steps(n, lanes)
  padded = steps * lanes
  table = tf.reshape(table, [-1])
  freq = tf.reshape(cdf[:, 1:] - cdf[:, :-1], [-1])
  # The padding of the last row looks row 0 up; its state is kept.
  base = tf.reshape(tf.pad(rows * m, [[0, padded - n]]), [steps, lanes])

  words = tf.bitcast(words, tf.uint32)
  header = rans_header_words(n, lanes)
  states = words[:lanes]
  counts = _unpack_counts(words[lanes:header], n, lanes)
  body = words[header:]
  if body.shape[0] == 0:
    body = tf.zeros([1], tf.uint32)
  last = 2 * body.shape[0] - 1
  first = tf.cumsum(counts, exclusive=True)
  high = tf.constant(32, tf.uint64)
  shift = _u32(precision)
  lane = tf.range(lanes)

  # The loop carries each lane's state and its read position, packed in a
  # uint64 (`x | position << 32`); the symbols are the table entries it
  # looked up (`_history` returns them).
  def step(t, packed, lookup):
    x = tf.cast(packed, tf.uint32)
    position = tf.cast(tf.bitwise.right_shift(packed, high), tf.int32)
    slot = tf.cast(tf.bitwise.bitwise_and(x, _u32(m - 1)), tf.int32)
    entry = lookup(t, base[t] + slot)
    row = tf.bitwise.right_shift(base[t], precision)
    f = tf.gather(freq, row * alphabet
                  + tf.bitwise.right_shift(entry, _OFFSET_BITS))
    offset = tf.bitwise.bitwise_and(entry, 2**_OFFSET_BITS - 1)
    new = (tf.cast(f, tf.uint32) * tf.bitwise.right_shift(x, shift)
           + tf.cast(offset, tf.uint32))
    read = new < _u32(_STATE_LOW)
    if padded > n:
      valid = t * lanes + lane < n
      new = tf.where(valid, new, x)
      read = tf.logical_and(read, valid)
    at = tf.minimum(position, last)
    word = tf.bitwise.right_shift(
        tf.gather(body, tf.bitwise.right_shift(at, 1)),
        tf.cast(tf.bitwise.bitwise_and(at, 1) * 16, tf.uint32))
    word = tf.bitwise.bitwise_and(word, _u32(0xFFFF))
    new = tf.where(read, tf.bitwise.bitwise_or(
        tf.bitwise.left_shift(new, _u32(16)), word), new)
    position += tf.cast(read, tf.int32)
    return tf.bitwise.bitwise_or(
        tf.cast(new, tf.uint64),
        tf.bitwise.left_shift(tf.cast(position, tf.uint64), high))

  initial = tf.bitwise.bitwise_or(
      tf.cast(states, tf.uint64),
      tf.bitwise.left_shift(tf.cast(first, tf.uint64), high))
  _, entries = _history(step, initial, steps, lanes, reverse=False,
                        table=table)
  entries = tf.reshape(entries, [-1])[:n]
  return tf.bitwise.right_shift(entries, _OFFSET_BITS)


def _history(step, initial, steps, lanes, reverse, table=None):
  """Runs `steps` steps of a lane-state recurrence; returns every state.

  `step(t, state)` (with `table`: `step(t, state, lookup)`, `lookup(t,
  index)` being `tf.gather(table, index)`, called once per step) maps the
  `[lanes]` `uint64` state before row `t` to the state after it. Forward,
  row `t` starts from `history[t]` and ends in `history[t + 1]`; in
  reverse, from `history[t + 1]` to `history[t]`. Returns the
  `[steps + 1, lanes]` history and, with `table`, the `[steps, lanes]`
  values looked up (else None).

  Eagerly the loop is a Python loop over the rows (TF 2.21's eager
  TensorArray loses elements written out of order). In a graph it is a
  `tf.while_loop` writing a TensorArray, which XLA turns into one in-place
  dynamic-update-slice per step. The lookups also go through a TensorArray
  there: XLA then emits the gather into an in-place update too, which it
  never splits across threads, whereas a plain gather from a table this
  large is split in two tasks whose hand-off costs more than the gather of
  one row (measured 39.6 against 16.5 ms of CPU to decode 2**20 elements
  in 256 lanes).
  """
  order = range(steps - 1, -1, -1) if reverse else range(steps)
  if tf.executing_eagerly():
    states, looked_up = [initial], []

    def lookup(t, index):
      del t
      looked_up.append(tf.gather(table, index))
      return looked_up[-1]

    for t in order:
      args = (t, states[-1]) + ((lookup,) if table is not None else ())
      states.append(step(*args))
    if reverse:
      states, looked_up = states[::-1], looked_up[::-1]
    return tf.stack(states), tf.stack(looked_up) if looked_up else None

  history = tf.TensorArray(tf.uint64, size=steps + 1, element_shape=[lanes])
  history = history.write(steps if reverse else 0, initial)
  looked_up = tf.TensorArray(tf.int32 if table is None else table.dtype,
                             size=steps, element_shape=[lanes])

  def body(t, history, looked_up):
    state = history.read(t + 1 if reverse else t)
    if table is None:
      new = step(t, state)
    else:
      def lookup(t, index):
        nonlocal looked_up
        looked_up = looked_up.write(t, tf.gather(table, index))
        return looked_up.read(t)
      new = step(t, state, lookup)
    history = history.write(t if reverse else t + 1, new)
    return t + (-1 if reverse else 1), history, looked_up

  start = steps - 1 if reverse else 0
  cond = (lambda t, *_: t >= 0) if reverse else (lambda t, *_: t < steps)
  _, history, looked_up = tf.while_loop(
      cond, body, (tf.constant(start), history, looked_up))
  return history.stack(), looked_up.stack() if table is not None else None
