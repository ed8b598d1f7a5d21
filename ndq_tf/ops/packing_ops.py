"""Packing of small integer codes into `int32` words.

An alphabet of `L` symbols packs `D = max{D : L**D <= 2**32}` codes per
32-bit word: by radix (`sum_j c_j * L**j`, e.g. 20 ternary codes in a word,
1.6 bits each) or, when `L` is a power of two, the same sum is a set of bit
fields. `n` codes take `W = ceil(n / D)` words, laid out planar: digit `j`
of word `k` is code `j·W + k` (codes past `n` are the symbol 0). That keeps
packing and unpacking loops over contiguous words, which XLA vectorizes.
Words are `int32` on the wire (the bits of the `uint32` value), because that
is what TF's collectives carry.

The arithmetic is done in `uint32`: every partial sum of Horner's scheme is
below `2**32`, so nothing wraps, and division by the (compile-time constant)
unpacking divides exact float64 integers (see `unpack_codes`). The wire
format as a whole: docs/algorithms.md#wire-format.
"""

import tensorflow as tf

__all__ = [
    "codes_per_word",
    "num_words",
    "pack_codes",
    "unpack_codes",
    "unpack_planar_codes",
]

_MAX_ALPHABET = 2**16


def codes_per_word(alphabet_size):
  """Returns how many codes of an alphabet of that size fit a 32-bit word.

  Args:
    alphabet_size: Python int in `[2, 65536]`.

  Returns:
    The largest `D` with `alphabet_size**D <= 2**32`.

  Raises:
    ValueError: for an alphabet size out of range.
  """
  if (not isinstance(alphabet_size, int) or isinstance(alphabet_size, bool)
      or not 2 <= alphabet_size <= _MAX_ALPHABET):
    raise ValueError(
        f"`alphabet_size` must be an integer in [2, {_MAX_ALPHABET}]. "
        f"Received: alphabet_size={alphabet_size!r}.")
  d = 1
  while alphabet_size**(d + 1) <= 2**32:
    d += 1
  return d


def num_words(num_codes, alphabet_size):
  """Number of `int32` words that `num_codes` codes pack into."""
  d = codes_per_word(alphabet_size)
  return -(-num_codes // d)


def pack_codes(codes, alphabet_size):
  """Packs symbols `0 <= codes < alphabet_size` into `int32` words.

  Args:
    codes: 1-D integer tensor of static length `n`, values in
      `[0, alphabet_size)`. Values outside are not checked (the codecs
      produce only valid ones); they would corrupt neighbouring codes.
    alphabet_size: Python int `L`.

  Returns:
    A 1-D `int32` tensor of `num_words(n, L)` words.
  """
  d = codes_per_word(alphabet_size)
  n = codes.shape[0]
  if n is None:
    raise ValueError("`codes` must have a static length.")
  w = -(-n // d)
  # Planar layout: word k holds codes k, k + W, k + 2W, ... (digit j is code
  # j·W + k), so packing is Horner's scheme over whole rows: an elementwise
  # loop over words that XLA vectorizes. Every partial sum stays below
  # L**d <= 2**32, so uint32 arithmetic is exact. The rows are slices of the
  # codes as they come (only the last one padded): a padded `[d, W]` copy
  # would be written in uint32 before the loop reads it.
  radix = tf.constant(alphabet_size, tf.uint32)

  def row(j):
    piece = codes[j * w:min((j + 1) * w, n)]
    if piece.shape[0] < w:
      piece = tf.pad(piece, [[0, w - piece.shape[0]]])
    return tf.cast(piece, tf.uint32)

  word = row(d - 1)
  for j in range(d - 2, -1, -1):
    word = word * radix + row(j)
  return tf.bitcast(word, tf.int32)


def unpack_codes(words, alphabet_size, num_codes):
  """Inverse of `pack_codes`.

  Args:
    words: 1-D `int32` tensor.
    alphabet_size: Python int `L`.
    num_codes: Python int, the number of codes to return.

  Returns:
    A 1-D `int32` tensor of `num_codes` symbols in `[0, L)`.
  """
  codes = unpack_planar_codes(words, alphabet_size)
  return tf.reshape(codes, [-1])[:num_codes]


def unpack_planar_codes(words, alphabet_size):
  """Every code of the words as a `[D, W]` array: `codes[j, k]` is code `j·W+k`.

  Flattened, `unpack_codes` is a prefix of this. Left two-dimensional, the
  unpacking is a loop over `[D, W]` that XLA vectorizes (a flat output would
  need a division per element to find its word); the consumer can flatten
  and slice as part of its own loop.
  """
  d = codes_per_word(alphabet_size)
  words = tf.convert_to_tensor(words, tf.int32)
  # The word's unsigned value, exact in float64 (below 2**32). Converted
  # from int32 (not uint32, which x86 cannot convert in vector registers).
  signed = tf.cast(words, tf.float64)
  value = tf.where(signed < 0.0, signed + 2.0**32, signed)[None, :]
  # floor(w / c) == floor((w + 1/2) * fl(1/c)) exactly: (w + 1/2)/c is at
  # least 1/(2c) away from every integer, while the float64 product is
  # within (w/c)·2**-52 <= 2**-20/c of it (w < 2**32). One elementwise
  # expression over [d, words], no per-digit intermediates: XLA fuses it
  # into the decoder that consumes the codes.
  value = value + 0.5
  inverse = [1.0 / float(alphabet_size**j) for j in range(d + 1)]
  high = tf.floor(value * tf.constant(inverse[1:], tf.float64)[:, None])
  low = tf.floor(value * tf.constant(inverse[:-1], tf.float64)[:, None])
  digits = low - float(alphabet_size) * high
  return tf.cast(digits, tf.int32)
