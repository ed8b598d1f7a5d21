"""Tests of the radix / bit-field packing of codes into int32 words."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from ndq_tf import ops


def _reference_codes_per_word(alphabet_size):
  """The largest D with L**D <= 2**32, in exact integer arithmetic."""
  d = 0
  while alphabet_size**(d + 1) <= 2**32:
    d += 1
  return d


def _np_pack(codes, alphabet_size):
  """numpy reference of the documented planar layout.

  `n` codes take `W = ceil(n / D)` words; digit `j` of word `k` is code
  `j*W + k` (the symbol 0 past `n`), and word `k` is `sum_j digit_j * L**j`.
  The uint32 value travels as the int32 with the same bits.
  """
  d = _reference_codes_per_word(alphabet_size)
  codes = np.asarray(codes, np.uint64)
  num_words = -(-codes.size // d)
  digits = np.zeros(num_words * d, np.uint64)
  digits[:codes.size] = codes
  powers = np.uint64(alphabet_size)**np.arange(d, dtype=np.uint64)
  words = (digits.reshape(d, num_words) * powers[:, None]).sum(axis=0)
  assert np.all(words < 2**32)
  return words.astype(np.uint32).view(np.int32)


def _code_index(digit, word, num_words):
  """Position in the code sequence of digit `digit` of word `word`."""
  return digit * num_words + word


def _awkward_lengths(d):
  """0, 1, D-1, D, D+1, 2D+1 and two primes (one above 2**10)."""
  return sorted({0, 1, max(d - 1, 0), d, d + 1, 2 * d + 1, 97, 1031})


class CodesPerWordTest(tf.test.TestCase, parameterized.TestCase):

  def test_codes_per_word_is_the_largest_that_fits_32_bits(self):
    for alphabet_size in list(range(2, 300)) + [
        1023, 1024, 1025, 65535, 65536]:
      self.assertEqual(ops.codes_per_word(alphabet_size),
                       _reference_codes_per_word(alphabet_size),
                       msg=f"alphabet_size={alphabet_size}")

  @parameterized.parameters((2, 32), (3, 20), (4, 16), (5, 13), (16, 8),
                            (255, 4), (256, 4), (257, 3), (65536, 2))
  def test_codes_per_word_hand_values(self, alphabet_size, expected):
    self.assertEqual(ops.codes_per_word(alphabet_size), expected)

  @parameterized.parameters(1, 0, -3, 65537, 3.0, True, "3", None)
  def test_bad_alphabet_size_raises(self, alphabet_size):
    with self.assertRaisesRegex(
        ValueError, f"`alphabet_size`.*alphabet_size={alphabet_size!r}"):
      ops.codes_per_word(alphabet_size)

  def test_num_words_rounds_up(self):
    self.assertEqual(ops.num_words(0, 3), 0)
    self.assertEqual(ops.num_words(1, 3), 1)
    self.assertEqual(ops.num_words(20, 3), 1)
    self.assertEqual(ops.num_words(21, 3), 2)
    self.assertEqual(ops.num_words(64, 2), 2)
    self.assertEqual(ops.num_words(65, 2), 3)


class PackingRoundTripTest(tf.test.TestCase, parameterized.TestCase):

  def _check(self, codes, alphabet_size):
    n = len(codes)
    words = ops.pack_codes(tf.constant(codes, tf.int32), alphabet_size)
    msg = f"alphabet_size={alphabet_size}, n={n}"
    self.assertEqual(words.dtype, tf.int32, msg=msg)
    self.assertEqual(words.shape, [ops.num_words(n, alphabet_size)], msg=msg)
    self.assertAllEqual(words, _np_pack(codes, alphabet_size), msg=msg)
    back = ops.unpack_codes(words, alphabet_size, n)
    self.assertEqual(back.dtype, tf.int32, msg=msg)
    self.assertAllEqual(back, codes, msg=msg)

  def test_round_trip_every_alphabet_and_awkward_length(self):
    rng = np.random.default_rng(0)
    for alphabet_size in range(2, 256):
      d = ops.codes_per_word(alphabet_size)
      for n in _awkward_lengths(d):
        self._check(rng.integers(0, alphabet_size, n), alphabet_size)

  def test_round_trip_extreme_symbols_every_alphabet(self):
    # All L-1: every digit at its maximum, so full words are L**D - 1, the
    # largest packed value (top bit set for L = 2: the int32 word is -1).
    for alphabet_size in range(2, 256):
      d = ops.codes_per_word(alphabet_size)
      for symbol in (0, alphabet_size - 1):
        self._check(np.full(2 * d + 1, symbol), alphabet_size)

  def test_unpack_at_digit_boundaries_every_alphabet(self):
    # Words L**j - 1, L**j, L**j + 1 and the largest word L**D - 1: where a
    # floor(word / L**j) computed in floating point would be off by one.
    for alphabet_size in list(range(2, 256)) + [257, 1000, 65535, 65536]:
      d = ops.codes_per_word(alphabet_size)
      values = {alphabet_size**d - 1}
      for j in range(1, d):
        values |= {alphabet_size**j - 1, alphabet_size**j,
                   alphabet_size**j + 1}
      values = np.array(sorted(values), np.uint64)
      digits = (values[None, :] // np.uint64(alphabet_size)**np.arange(
          d, dtype=np.uint64)[:, None]) % np.uint64(alphabet_size)
      words = tf.constant(values.astype(np.uint32).view(np.int32))
      codes = ops.unpack_codes(words, alphabet_size, d * values.size)
      # Planar: digit j of word k is code j*W + k.
      self.assertAllEqual(codes, digits.reshape(-1),
                          msg=f"alphabet_size={alphabet_size}")

  @parameterized.parameters(256, 257, 1000, 65535, 65536)
  def test_round_trip_large_alphabets(self, alphabet_size):
    rng = np.random.default_rng(alphabet_size)
    codes = rng.integers(0, alphabet_size, 1031)
    codes[:7] = alphabet_size - 1
    self._check(codes, alphabet_size)


class WordLayoutTest(tf.test.TestCase, parameterized.TestCase):

  def test_binary_words_are_bit_fields(self):
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 2, 32 * 50 + 7)
    words = ops.pack_codes(tf.constant(codes, tf.int32), 2).numpy()
    self.assertEqual(words.dtype, np.int32)
    # bits[j, k] = bit j of word k = code j*W + k.
    bits = (words.view(np.uint32)[None, :]
            >> np.arange(32, dtype=np.uint32)[:, None]) & 1
    padded = np.zeros(words.size * 32, np.int64)
    padded[:codes.size] = codes
    self.assertAllEqual(bits.reshape(-1), padded)

  def test_binary_words_bit_patterns(self):
    # Hand-checked words: bit j of word k is code j*W + k; words are int32.
    w = 3
    codes = np.zeros(96, np.int32)
    codes[_code_index(np.arange(32), 0, w)] = 1  # word 0: all ones -> -1
    codes[_code_index(31, 1, w)] = 1             # word 1: top bit -> int32 min
    codes[_code_index(0, 2, w)] = 1              # word 2: bit 0 -> 1
    codes[_code_index(3, 2, w)] = 1              # ... and bit 3 -> 9
    words = ops.pack_codes(tf.constant(codes), 2)
    self.assertEqual(words.dtype, tf.int32)
    self.assertAllEqual(words, [-1, -2**31, 9])

  def test_ternary_words_bit_patterns(self):
    # 20 ternary digits per word, digit j (code j*W + k) weighted 3**j.
    w = 3
    codes = np.zeros(60, np.int32)
    codes[_code_index(np.arange(20), 0, w)] = 2  # 3**20 - 1 > 2**31
    codes[_code_index(0, 1, w)] = 1
    codes[_code_index(1, 1, w)] = 2              # 1 + 2*3 = 7
    codes[_code_index(19, 2, w)] = 1             # 3**19 = 1162261467
    words = ops.pack_codes(tf.constant(codes), 3)
    self.assertEqual(words.dtype, tf.int32)
    self.assertAllEqual(words, [3486784400 - 2**32, 7, 1162261467])
    self.assertAllEqual(words, _np_pack(codes, 3))

  @parameterized.parameters(4, 16, 256)
  def test_power_of_two_alphabets_are_bit_fields(self, alphabet_size):
    width = alphabet_size.bit_length() - 1
    d = 32 // width
    rng = np.random.default_rng(alphabet_size)
    codes = rng.integers(0, alphabet_size, 10 * d)
    words = ops.pack_codes(tf.constant(codes, tf.int32),
                           alphabet_size).numpy().view(np.uint32)
    shifts = np.arange(d, dtype=np.uint32)[:, None] * width
    # fields[j, k]: bits [j*width, (j+1)*width) of word k = code j*W + k.
    fields = (words[None, :] >> shifts) & np.uint32(alphabet_size - 1)
    self.assertAllEqual(fields.reshape(-1), codes)

  @parameterized.parameters(2, 3, 5, 255)
  def test_unpack_planar_codes_is_the_digit_by_word_array(self, alphabet_size):
    d = ops.codes_per_word(alphabet_size)
    rng = np.random.default_rng(alphabet_size)
    codes = rng.integers(0, alphabet_size, 3 * d + 2)
    words = ops.pack_codes(tf.constant(codes, tf.int32), alphabet_size)
    planar = ops.unpack_planar_codes(words, alphabet_size)
    self.assertEqual(planar.dtype, tf.int32)
    self.assertEqual(planar.shape, [d, 4])
    padded = np.zeros(4 * d, np.int64)
    padded[:codes.size] = codes
    # planar[j, k] is code j*W + k: the row-major flattening is the codes.
    self.assertAllEqual(planar, padded.reshape(d, 4))
    self.assertAllEqual(
        tf.reshape(planar, [-1])[:codes.size],
        ops.unpack_codes(words, alphabet_size, codes.size))

  def test_last_word_is_padded_with_symbol_zero(self):
    words = ops.pack_codes(tf.constant([1, 2, 1], tf.int32), 3)
    self.assertAllEqual(words, [1 + 2 * 3 + 1 * 9])
    self.assertAllEqual(ops.unpack_codes(words, 3, 20)[3:], np.zeros(17))

  @parameterized.parameters(2, 3, 7, 255, 65536)
  def test_eager_function_xla_bitwise_equal(self, alphabet_size):
    d = ops.codes_per_word(alphabet_size)
    rng = np.random.default_rng(alphabet_size)
    codes = rng.integers(0, alphabet_size, 5 * d + 3)
    codes[:d] = alphabet_size - 1  # a word with the sign bit set
    codes = tf.constant(codes, tf.int32)

    def round_trip(codes):
      words = ops.pack_codes(codes, alphabet_size)
      return words, ops.unpack_codes(words, alphabet_size, codes.shape[0])

    eager = round_trip(codes)
    for jit in (False, True):
      words, back = tf.function(round_trip, jit_compile=jit)(codes)
      self.assertAllEqual(words, eager[0])
      self.assertAllEqual(back, codes)

  def test_pack_needs_static_length(self):
    fn = tf.function(lambda c: ops.pack_codes(c, 3)).get_concrete_function
    with self.assertRaisesRegex(ValueError, "static length"):
      fn(tf.TensorSpec([None], tf.int32))


if __name__ == "__main__":
  tf.test.main()
