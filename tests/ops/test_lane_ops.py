"""Tests of the integer lanes that let an integer all-reduce sum codes exactly."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from ndq_tf import ops

_WORKERS = (2, 3, 7, 8, 127, 128, 1000)
_LEVELS = (1, 3, 7)
_USABLE = {tf.int32: 31, tf.int64: 63}
_WORD_BITS = {tf.int32: 32, tf.int64: 64}


def _awkward_lengths(lanes):
  """0, 1, D-1, D, D+1, 2D+1 and two primes (one above 2**10)."""
  return sorted({0, 1, max(lanes - 1, 0), lanes, lanes + 1, 2 * lanes + 1, 97,
                 1031})


def _reference_words(codes, layout):
  """The documented planar layout with Python integers (no wrap-around).

  `W = ceil(n / D)` words; lane `j` of word `k` is code `j*W + k` (0 past
  `n`), and word `k` is `sum_j code * 2**(j*b)`.
  """
  n, lanes = len(codes), layout.lanes_per_word
  words = -(-n // lanes)
  out = []
  for k in range(words):
    value = 0
    for j in range(lanes):
      i = j * words + k
      if i < n:
        value += int(codes[i]) << (j * layout.lane_bits)
    out.append(value)
  return out


class LaneLayoutTest(tf.test.TestCase, parameterized.TestCase):

  def test_hand_values(self):
    # Ternary codes of 8 workers: sums up to 16, 5 bits; 6 lanes in an int32
    # and 12 in an int64 are equally dense: int32.
    layout = ops.lane_layout(3, 8, 1000)
    self.assertEqual(layout, ops.LaneLayout(tf.int32, 5, 6, 1000))
    self.assertEqual(layout.num_words, 167)
    self.assertEqual(layout.wire_bits, 167 * 32)
    self.assertEqual(layout.max_lane_value, 31)
    # Two workers: sums up to 4, 3 bits: 10 lanes per int32 (3.2 bits per
    # code) or 21 per int64 (3.05): int64 for many codes, int32 for few.
    self.assertEqual(ops.lane_layout(3, 2, 1000),
                     ops.LaneLayout(tf.int64, 3, 21, 1000))
    self.assertEqual(ops.lane_layout(3, 2, 10),
                     ops.LaneLayout(tf.int32, 3, 10, 10))
    # 1000 workers, 7 levels: sums up to 14000, 14 bits: 2 per int32 or 4
    # per int64, equally dense: int32. 128 workers: sums up to 1792, 11
    # bits: 2 per int32 (16 bits per code) or 5 per int64 (12.8): int64.
    self.assertEqual(ops.lane_layout(15, 1000, 1031),
                     ops.LaneLayout(tf.int32, 14, 2, 1031))
    self.assertEqual(ops.lane_layout(15, 128, 1031),
                     ops.LaneLayout(tf.int64, 11, 5, 1031))
    # A sum of 2**31 - 1 still fits one 31-bit lane of an int32.
    self.assertEqual(ops.lane_layout(2, 2**31 - 1, 5),
                     ops.LaneLayout(tf.int32, 31, 1, 5))

  def test_lane_holds_the_largest_sum_and_no_word_sets_its_sign_bit(self):
    for alphabet_size in (2, 3, 5, 7, 15, 16, 17, 255, 65536):
      for workers in _WORKERS + (1, 4, 1 << 14):
        for n in (0, 1, 1000, 10**6):
          layout = ops.lane_layout(alphabet_size, workers, n)
          max_sum = workers * (alphabet_size - 1)
          msg = f"L={alphabet_size}, P={workers}, n={n}: {layout}"
          self.assertLessEqual(max_sum, layout.max_lane_value, msg)
          # Narrowest such lane: one bit less would not hold the sum.
          self.assertGreater(max_sum, (1 << (layout.lane_bits - 1)) - 1, msg)
          self.assertLessEqual(layout.lanes_per_word * layout.lane_bits,
                               _USABLE[layout.dtype], msg)
          self.assertGreaterEqual(layout.lanes_per_word, 1, msg)

  def test_layout_is_the_densest_exact_one(self):
    # Brute force over every word type, lane width and lane count that
    # keeps the sign bit free and holds the largest sum.
    for alphabet_size in (2, 3, 5, 7, 9, 15, 17, 129):
      for workers in _WORKERS + (1, 4, 16, 1024):
        max_sum = workers * (alphabet_size - 1)
        for n in (0, 1, 2, 5, 11, 20, 21, 63, 97, 1031, 4096, 10**6 + 3):
          chosen = ops.lane_layout(alphabet_size, workers, n)
          best = {}
          for dtype, usable in _USABLE.items():
            for width in range(1, usable + 1):
              if max_sum >= 1 << width:
                continue
              for lanes in range(1, usable // width + 1):
                bits = -(-n // lanes) * _WORD_BITS[dtype]
                best[dtype] = min(best.get(dtype, bits), bits)
          msg = f"L={alphabet_size}, P={workers}, n={n}: {chosen}"
          fewest = min(best.values())
          self.assertEqual(chosen.wire_bits, fewest, msg)
          if best[tf.int32] == fewest:
            self.assertEqual(chosen.dtype, tf.int32, msg)

  def test_layout_is_immutable(self):
    layout = ops.lane_layout(3, 8, 10)
    with self.assertRaises(AttributeError):
      layout.lane_bits = 4

  @parameterized.parameters(
      ("alphabet_size", dict(alphabet_size=1)),
      ("alphabet_size", dict(alphabet_size=3.0)),
      ("alphabet_size", dict(alphabet_size=True)),
      ("num_summands", dict(num_summands=0)),
      ("num_summands", dict(num_summands=None)),
      ("num_codes", dict(num_codes=-1)),
      ("num_codes", dict(num_codes=2.5)))
  def test_bad_arguments_raise_naming_them(self, name, override):
    kwargs = dict(alphabet_size=3, num_summands=4, num_codes=10)
    kwargs.update(override)
    with self.assertRaisesRegex(ValueError,
                                f"`{name}`.*{name}={override[name]!r}"):
      ops.lane_layout(**kwargs)

  def test_sum_beyond_int32_raises(self):
    with self.assertRaisesRegex(ValueError, "below 2\\*\\*31.*num_summands"):
      ops.lane_layout(65535, 2**16, 10)


class LanePackingTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(workers=_WORKERS, num_levels=_LEVELS)
  def test_largest_sum_round_trips_without_overflow(self, workers, num_levels):
    alphabet_size = 2 * num_levels + 1
    top = 2 * num_levels
    lanes = ops.lane_layout(alphabet_size, workers, 1000).lanes_per_word
    for n in _awkward_lengths(lanes):
      layout = ops.lane_layout(alphabet_size, workers, n)
      msg = f"P={workers}, M={num_levels}, n={n}: {layout}"
      words = ops.pack_lanes(tf.fill([n], top), layout)
      self.assertEqual(words.dtype, layout.dtype, msg)
      self.assertEqual(words.shape, [layout.num_words], msg)
      # What a ring all-reduce computes: the sum of every worker's words,
      # all at the largest code.
      total = tf.reduce_sum(tf.stack([words] * workers), axis=0)
      self.assertTrue(np.all(total.numpy() >= 0), msg)
      self.assertAllEqual(
          total.numpy().tolist(),
          _reference_words([workers * top] * n, layout), msg)
      sums = ops.unpack_lanes(total, layout)
      self.assertEqual(sums.dtype, tf.int32, msg)
      self.assertAllEqual(sums, np.full([n], workers * top), msg)

  @parameterized.product(workers=_WORKERS, num_levels=_LEVELS)
  def test_random_codes_sum_exactly(self, workers, num_levels):
    alphabet_size = 2 * num_levels + 1
    rng = np.random.default_rng(1000 * workers + num_levels)
    pack = tf.function(ops.pack_lanes)
    lanes = ops.lane_layout(alphabet_size, workers, 1000).lanes_per_word
    for n in _awkward_lengths(lanes):
      layout = ops.lane_layout(alphabet_size, workers, n)
      codes = rng.integers(0, alphabet_size, size=[workers, n], dtype=np.int32)
      codes[0, :n // 2] = alphabet_size - 1
      words = [pack(tf.constant(c), layout) for c in codes]
      for w, c in zip(words[:3], codes):
        self.assertAllEqual(w.numpy().tolist(), _reference_words(c, layout))
        self.assertAllEqual(ops.unpack_lanes(w, layout), c)
      # Partial sums in a ring's order (worker 1's, then 1 + 2, ...) stay
      # non-negative and unpack to the partial sums of the codes.
      total = tf.zeros([layout.num_words], layout.dtype)
      for p, w in enumerate(words):
        total += w
        if p in (0, workers // 2):
          self.assertAllEqual(ops.unpack_lanes(total, layout),
                              codes[:p + 1].sum(axis=0))
      self.assertTrue(np.all(total.numpy() >= 0))
      self.assertAllEqual(ops.unpack_lanes(total, layout), codes.sum(axis=0))

  def test_int64_layouts_are_covered(self):
    # The round-trip tests above pack into int64 words too (P = 2, M = 1:
    # 21 three-bit lanes per int64; P = 128, M = 7: 5 eleven-bit lanes) and
    # into int32 words (P = 8, M = 1: 6 five-bit lanes).
    self.assertEqual(ops.lane_layout(3, 2, 1031).dtype, tf.int64)
    self.assertEqual(ops.lane_layout(15, 128, 1031).dtype, tf.int64)
    self.assertEqual(ops.lane_layout(3, 8, 1031).dtype, tf.int32)

  @parameterized.parameters((3, 2, 1031), (3, 8, 1031), (7, 127, 97),
                            (15, 1000, 1031), (15, 128, 4097))
  def test_eager_function_and_xla_are_bitwise_identical(self, alphabet_size,
                                                        workers, n):
    layout = ops.lane_layout(alphabet_size, workers, n)
    rng = np.random.default_rng(n)
    # Three partial sums of the P workers' codes (what a ring adds), each up
    # to a third of the largest sum, so the total reaches the top lanes.
    top = workers * (alphabet_size - 1) // 3
    codes = tf.constant(rng.integers(0, top + 1, size=[3, n], dtype=np.int32))
    codes = tf.concat([tf.fill([3, 1], top), codes[:, 1:]], axis=1)

    def round_trip(codes):
      packed = [ops.pack_lanes(codes[p], layout) for p in range(3)]
      total = tf.reduce_sum(tf.stack(packed), axis=0)
      return packed[0], total, ops.unpack_lanes(total, layout)

    eager = round_trip(codes)
    graph = tf.function(round_trip)(codes)
    xla = tf.function(round_trip, jit_compile=True)(codes)
    for e, g, x in zip(eager, graph, xla):
      self.assertAllEqual(e, g)
      self.assertAllEqual(e, x)
    self.assertAllEqual(eager[2], tf.reduce_sum(codes, axis=0))

  def test_accepts_uint8_symbols(self):
    layout = ops.lane_layout(7, 4, 9)
    symbols = tf.constant([0, 1, 2, 3, 4, 5, 6, 6, 0], tf.uint8)
    self.assertAllEqual(
        ops.unpack_lanes(ops.pack_lanes(symbols, layout), layout),
        tf.cast(symbols, tf.int32))

  def test_bad_inputs_raise(self):
    layout = ops.lane_layout(3, 4, 10)
    with self.assertRaisesRegex(ValueError, "num_codes=10.*shape \\(11,\\)"):
      ops.pack_lanes(tf.zeros([11], tf.int32), layout)
    with self.assertRaisesRegex(ValueError, "num_codes=10"):
      ops.pack_lanes(tf.zeros([2, 5], tf.int32), layout)
    with self.assertRaisesRegex(TypeError, "`codes`.*float32"):
      ops.pack_lanes(tf.zeros([10], tf.float32), layout)
    with self.assertRaisesRegex(TypeError, "`layout`.*tuple"):
      ops.pack_lanes(tf.zeros([10], tf.int32), (tf.int32, 3, 10, 10))
    words = ops.pack_lanes(tf.zeros([10], tf.int32), layout)
    with self.assertRaisesRegex(TypeError, "`words`.*int32.*int64"):
      ops.unpack_lanes(tf.cast(words, tf.int64), layout)
    with self.assertRaisesRegex(ValueError, "num_words=2"):
      ops.unpack_lanes(tf.zeros([3], tf.int32), layout)


if __name__ == "__main__":
  tf.test.main()
