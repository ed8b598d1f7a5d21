"""Tests of the counter-based hash RNG (`ndq_tf.ops.random_ops`).

The dither is only useful if every receiver regenerates the sender's bits
exactly, so the generator is checked bit for bit against an independent numpy
reimplementation of the documented algorithm (two MurmurHash3 `fmix32` rounds
around a Weyl step), in every compilation mode, and statistically (chi-square
uniformity, no correlation between streams). Statistical thresholds are
derived from the null distribution of each statistic, with fixed seeds.
"""

import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from ndq_tf import ops

_MASK = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35

# ---------------------------------------------------------------------------
# Pure-numpy reference implementation. uint64 arithmetic masked to 32 bits, so
# that no numpy overflow rule is relied on.


def _np_fmix32(h):
  h = np.asarray(h, np.uint64) & _MASK
  h ^= h >> 16
  h = (h * _M1) & _MASK
  h ^= h >> 13
  h = (h * _M2) & _MASK
  h ^= h >> 16
  return h


def _np_hash(counter, key0, key1):
  """fmix32(fmix32(counter * golden + key0) ^ key1), all mod 2**32."""
  counter = np.asarray(counter, np.uint64)
  h = (counter * _GOLDEN + np.uint64(key0)) & _MASK
  h = _np_fmix32(h)
  h ^= np.uint64(key1)
  return _np_fmix32(h)


def _np_seed_keys(seed):
  """Keys of a seed from its value, whatever its integer dtype.

  Each value is taken as an int64; its high 32 bits are folded into its low
  32 bits (lo ^ fmix32(hi + golden)), and the two words are mixed into each
  other.
  """
  value = np.array([int(v) for v in seed], dtype=object)
  value = np.array([v - 2**64 if v >= 2**63 else v for v in value], np.int64)
  halves = value.view(np.uint32).reshape(2, 2).astype(np.uint64)  # lo, hi
  w = halves[:, 0] ^ _np_fmix32((halves[:, 1] + _GOLDEN) & _MASK)
  key0 = _np_fmix32((w[0] * _M1 + w[1]) & _MASK)
  key1 = _np_fmix32((((w[1] ^ _GOLDEN) * _M2) + key0) & _MASK)
  return int(key0), int(key1)


def _np_uniform_dither(seed, num_elements, stream=0, offset=0):
  key0, key1 = _np_seed_keys(seed)
  if stream:
    key1 = int(_np_fmix32((key1 + (stream * _GOLDEN & _MASK)) & _MASK))
  counter = np.arange(offset, offset + num_elements, dtype=np.uint64)
  bits = _np_hash(counter & _MASK, key0, key1)
  top = (bits >> 8).astype(np.float32)
  return top * np.float32(2.0**-24) - np.float32(0.5)


def _np_fold_seed(seed, value):
  key0, key1 = _np_seed_keys(seed)
  lo, hi = (int(p) for p in np.array([value], np.int64).view(np.uint32))
  counter = np.array([lo, lo ^ _GOLDEN], np.uint64)
  new = _np_hash(counter, key0 ^ hi, key1)
  return new.astype(np.uint32).view(np.int32)


# ---------------------------------------------------------------------------
# Statistics helpers.


def _chi_square(counts):
  counts = np.asarray(counts, np.float64).ravel()
  expected = counts.sum() / counts.size
  return float(np.sum((counts - expected)**2) / expected)


def _chi_square_bounds(num_cells):
  # Under uniformity the multinomial chi-square statistic has mean k - 1 and
  # variance 2(k - 1) (+ O(1/N)), and is close to normal for k in the
  # hundreds. Six standard deviations either side: a false alarm has
  # probability ~1e-9. The lower bound matters too: a sequence that is *too*
  # even (e.g. a bare Weyl counter without the mixing rounds) has a
  # chi-square near 0.
  dof = num_cells - 1
  sd = math.sqrt(2.0 * dof)
  return dof - 6.0 * sd, dof + 6.0 * sd


def _correlation_bound(n):
  # The sample correlation of n independent pairs has standard error
  # 1/sqrt(n); six standard errors.
  return 6.0 / math.sqrt(n)


_N_STAT = 1 << 20


class HashReferenceTest(tf.test.TestCase, parameterized.TestCase):
  """Bit-exactness against the numpy reference."""

  def test_hash_matches_numpy_reference(self):
    rng = np.random.default_rng(0)
    counter = rng.integers(0, 2**32, 4096, dtype=np.uint64)
    for key0, key1 in [(0, 0), (1, 2), (0xFFFFFFFF, 0x12345678),
                       (int(rng.integers(2**32)), int(rng.integers(2**32)))]:
      got = ops.hash_uint32(
          tf.constant(counter, tf.uint32), tf.constant(key0, tf.uint32),
          tf.constant(key1, tf.uint32))
      self.assertEqual(got.dtype, tf.uint32)
      self.assertAllEqual(got.numpy().astype(np.uint64),
                          _np_hash(counter, key0, key1))

  @parameterized.product(
      seed=[[0, 0], [1, 2], [2, 1], [-1, 7], [2**31 - 1, -2**31]],
      dtype=[tf.int32, tf.int64])
  def test_seed_keys_match_numpy_reference(self, seed, dtype):
    key0, key1 = ops.seed_keys(tf.constant(seed, dtype))
    self.assertEqual(key0.dtype, tf.uint32)
    self.assertEqual((int(key0.numpy()), int(key1.numpy())),
                     _np_seed_keys(seed))

  @parameterized.parameters([[2**40 + 3, -2**50]], [[2**63 - 1, -2**63]])
  def test_int64_seed_keys_use_every_bit(self, seed):
    key0, key1 = ops.seed_keys(tf.constant(seed, tf.int64))
    self.assertEqual((int(key0.numpy()), int(key1.numpy())),
                     _np_seed_keys(seed))
    low = [v & 0xFFFFFFFF for v in seed]
    self.assertNotEqual(
        (int(key0.numpy()), int(key1.numpy())),
        tuple(int(k) for k in ops.seed_keys(tf.constant(low, tf.int64))))

  @parameterized.product(stream=[0, 1, 7], seed=[[0, 0], [5, -3]])
  def test_uniform_dither_matches_numpy_reference(self, stream, seed):
    got = ops.uniform_dither(tf.constant(seed, tf.int32), 5000, stream)
    self.assertEqual(got.dtype, tf.float32)
    self.assertAllEqual(got.numpy(), _np_uniform_dither(seed, 5000, stream))

  def test_unsigned_seed_is_read_by_its_value(self):
    # uint32 3e9 is the int64 3e9 (not the int32 with the same bits).
    seed = [3_000_000_000, 17]
    expected = _np_uniform_dither(seed, 100)
    for dtype in (tf.uint32, tf.uint64, tf.int64):
      got = ops.uniform_dither(tf.constant(seed, dtype), 100)
      self.assertAllEqual(got.numpy(), expected, msg=dtype.name)

  @parameterized.parameters(0, 1, -5, 2**31 - 1, 2**32, 2**40 + 3, -2**63)
  def test_fold_seed_matches_numpy_reference(self, value):
    seed = [11, -22]
    got = ops.fold_seed(tf.constant(seed, tf.int32),
                        tf.constant(value, tf.int64))
    self.assertEqual(got.dtype, tf.int32)
    self.assertEqual(got.shape, [2])
    self.assertAllEqual(got.numpy(), _np_fold_seed(seed, value))

  def test_fold_seed_depends_on_value_not_its_dtype(self):
    seed = tf.constant([4, 5], tf.int32)
    expected = ops.fold_seed(seed, tf.constant(-9, tf.int64))
    for value in (-9, tf.constant(-9, tf.int32), tf.constant(-9, tf.int16)):
      self.assertAllEqual(ops.fold_seed(seed, value), expected)


class RngDeterminismTest(tf.test.TestCase, parameterized.TestCase):

  def test_identical_seed_yields_identical_output(self):
    a = ops.uniform_dither(tf.constant([3, 4]), 1000)
    b = ops.uniform_dither([3, 4], 1000)
    self.assertAllEqual(a, b)

  @parameterized.parameters(
      ([3, 4], 0, [3, 5], 0),
      ([3, 4], 0, [4, 3], 0),  # swapped halves
      ([0, 0], 0, [0, 1], 0),
      ([0, 0], 0, [1, 0], 0),
      ([3, 4], 0, [3, 4], 1),  # other stream, same seed
      ([3, 4], 1, [3, 4], 2),
  )
  def test_other_seed_or_stream_yields_other_output(self, seed_a, stream_a,
                                                    seed_b, stream_b):
    a = ops.uniform_dither(seed_a, 1000, stream_a).numpy()
    b = ops.uniform_dither(seed_b, 1000, stream_b).numpy()
    # Independent 24-bit uniforms coincide with probability 2**-24 each.
    self.assertLess(np.mean(a == b), 0.01)

  def test_prefix_of_longer_draw_is_shorter_draw(self):
    seed = tf.constant([8, 9])
    long = ops.uniform_dither(seed, 100_003, stream=2)
    for n in (0, 1, 2, 999, 65_536):
      self.assertAllEqual(ops.uniform_dither(seed, n, stream=2), long[:n])

  def test_draw_at_an_offset_is_the_slice_of_the_longer_draw(self):
    # A buffer encoded in chunks draws each chunk's dither at its offset.
    seed = tf.constant([8, 9])
    long = ops.uniform_dither(seed, 100_003, stream=1)
    for offset, n in ((0, 10), (1, 999), (512, 4096), (99_000, 1003)):
      for given in (offset, tf.constant(offset), tf.constant(offset, tf.int64)):
        self.assertAllEqual(
            ops.uniform_dither(seed, n, stream=1, offset=given),
            long[offset:offset + n])

  def test_draw_at_the_end_of_the_counter_matches_numpy_reference(self):
    seed = [3, -4]
    offset = 2**32 - 777
    self.assertAllEqual(
        ops.uniform_dither(tf.constant(seed), 777, offset=offset),
        _np_uniform_dither(seed, 777, offset=offset))

  def test_offset_past_the_counter_raises(self):
    with self.assertRaisesRegex(ValueError, r"`offset` must be in \[0, "
                                r"2\*\*32 - num_elements\]. Received: "
                                r"offset=4294967000, num_elements=300"):
      ops.uniform_dither(tf.constant([1, 2]), 300, offset=2**32 - 296)

  def test_values_are_multiples_of_2_pow_minus_24_in_half_open_range(self):
    u = ops.uniform_dither([1, 1], 100_000).numpy().astype(np.float64)
    self.assertGreaterEqual(u.min(), -0.5)
    self.assertLess(u.max(), 0.5)
    scaled = (u + 0.5) * 2**24
    self.assertAllEqual(scaled, np.floor(scaled))

  def test_empty_draw(self):
    u = ops.uniform_dither([1, 2], 0)
    self.assertEqual(u.shape, [0])
    self.assertEqual(u.dtype, tf.float32)

  def test_hash_is_a_bijection_of_the_counter(self):
    counter = tf.cast(tf.range(_N_STAT, dtype=tf.int64), tf.uint32)
    bits = ops.hash_uint32(counter, tf.constant(123, tf.uint32),
                           tf.constant(456, tf.uint32)).numpy()
    self.assertLen(np.unique(bits), _N_STAT)

  def test_fold_seed_gives_distinct_seeds_for_distinct_values(self):
    seed = tf.constant([1, 2])
    values = [0, 1, 2, 3, -1, 2**31, 2**32, 2**32 + 1, 2**63 - 1]
    folded = {tuple(ops.fold_seed(seed, tf.constant(v, tf.int64)).numpy())
              for v in values}
    self.assertLen(folded, len(values))

  def test_seed_value_not_its_dtype_selects_the_stream(self):
    # TF's stateless convention (tf.random.stateless_*): a seed [1, 2] gives
    # the same numbers whether it is an int32 or an int64 tensor. A sender
    # holding an int64 seed (e.g. from an int64 step counter) and a receiver
    # passing a Python list (int32) must draw the same dither.
    for seed in ([1, 2], [0, 0], [123456, 7]):
      expected = ops.uniform_dither(tf.constant(seed, tf.int32), 64)
      for dtype in (tf.int64, tf.uint32, tf.uint64):
        got = ops.uniform_dither(tf.constant(seed, dtype), 64)
        self.assertTrue(np.array_equal(got, expected),
                        msg=f"seed={seed} as {dtype.name} draws other "
                        "numbers than as int32")


class RngCompilationTest(tf.test.TestCase, parameterized.TestCase):
  """Eager, tf.function and XLA must produce the same bits."""

  @parameterized.parameters(tf.int32, tf.int64)
  def test_uniform_dither_eager_function_xla_bitwise_equal(self, dtype):
    seed = tf.constant([-7, 2**30 + 5], dtype)

    def draw(seed):
      return tf.stack([ops.uniform_dither(seed, 4099, stream)
                       for stream in (0, 3)]
                      + [ops.uniform_dither(seed, 4099, 3, tf.constant(
                          2**32 - 5000, tf.int64))])

    eager = draw(seed)
    graph = tf.function(draw)(seed)
    xla = tf.function(draw, jit_compile=True)(seed)
    self.assertAllEqual(tf.bitcast(graph, tf.int32),
                        tf.bitcast(eager, tf.int32))
    self.assertAllEqual(tf.bitcast(xla, tf.int32), tf.bitcast(eager, tf.int32))

  @parameterized.parameters(tf.int32, tf.int64)
  def test_fold_seed_eager_function_xla_bitwise_equal(self, dtype):
    seed = tf.constant([123, -456], dtype)
    values = tf.constant([0, 1, -1, 2**33 + 7, -2**40], tf.int64)

    def fold(seed, values):
      return tf.stack([ops.fold_seed(seed, values[i]) for i in range(5)])

    eager = fold(seed, values)
    graph = tf.function(fold)(seed, values)
    xla = tf.function(fold, jit_compile=True)(seed, values)
    self.assertAllEqual(graph, eager)
    self.assertAllEqual(xla, eager)


class RngStatisticsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(
      ([0, 0], 0), ([1, 2], 0), ([-1, 2**31 - 1], 0), ([1, 2], 5))
  def test_uniform_dither_is_uniform(self, seed, stream):
    u = ops.uniform_dither(seed, _N_STAT, stream).numpy()
    counts = np.bincount(((u + 0.5) * 256).astype(np.int64), minlength=256)
    low, high = _chi_square_bounds(256)
    chi2 = _chi_square(counts)
    self.assertBetween(chi2, low, high)

  def test_consecutive_pairs_are_uniform_on_the_square(self):
    # Serial test: (u_2i, u_2i+1) binned on a 32x32 grid. A counter hash
    # with poor avalanche would leave structure between neighbours.
    u = ops.uniform_dither([5, 6], _N_STAT).numpy()
    cells = ((u + 0.5) * 32).astype(np.int64).reshape(-1, 2)
    counts = np.bincount(cells[:, 0] * 32 + cells[:, 1], minlength=1024)
    low, high = _chi_square_bounds(1024)
    self.assertBetween(_chi_square(counts), low, high)

  def test_low_bits_of_the_hash_are_uniform(self):
    # The dither uses the top 24 bits; the low byte must be just as good
    # (it shows whether the final mixing round reaches every bit).
    counter = tf.cast(tf.range(_N_STAT, dtype=tf.int64), tf.uint32)
    bits = ops.hash_uint32(counter, tf.constant(99, tf.uint32),
                           tf.constant(0, tf.uint32)).numpy()
    counts = np.bincount((bits & 0xFF).astype(np.int64), minlength=256)
    low, high = _chi_square_bounds(256)
    self.assertBetween(_chi_square(counts), low, high)

  def test_hash_is_uniform_across_consecutive_keys(self):
    # Counter fixed, key0 = 0, 1, 2, ...: what neighbouring seeds see.
    keys = tf.cast(tf.range(_N_STAT, dtype=tf.int64), tf.uint32)
    bits = ops.hash_uint32(tf.zeros([_N_STAT], tf.uint32), keys,
                           tf.constant(0, tf.uint32)).numpy()
    counts = np.bincount((bits >> 24).astype(np.int64), minlength=256)
    low, high = _chi_square_bounds(256)
    self.assertBetween(_chi_square(counts), low, high)

  @parameterized.named_parameters(
      ("neighbour_seeds", [1, 2], 0, [1, 3], 0),
      ("swapped_seed", [1, 2], 0, [2, 1], 0),
      ("zero_seeds", [0, 0], 0, [0, 1], 0),
      ("streams_0_1", [1, 2], 0, [1, 2], 1),
      ("streams_1_2", [1, 2], 1, [1, 2], 2),
  )
  def test_distinct_seeds_and_streams_are_uncorrelated(self, seed_a, stream_a,
                                                       seed_b, stream_b):
    n = 1 << 18
    a = ops.uniform_dither(seed_a, n, stream_a).numpy().astype(np.float64)
    b = ops.uniform_dither(seed_b, n, stream_b).numpy().astype(np.float64)
    self.assertLess(abs(np.corrcoef(a, b)[0, 1]), _correlation_bound(n))
    # Joint uniformity on a 16x16 grid catches non-linear dependence too.
    cells = ((a + 0.5) * 16).astype(np.int64) * 16 + (
        (b + 0.5) * 16).astype(np.int64)
    low, high = _chi_square_bounds(256)
    self.assertBetween(_chi_square(np.bincount(cells, minlength=256)), low,
                       high)

  def test_folded_seeds_are_uncorrelated(self):
    n = 1 << 18
    base = tf.constant([10, 20])
    a = ops.uniform_dither(ops.fold_seed(base, 0), n).numpy()
    b = ops.uniform_dither(ops.fold_seed(base, 1), n).numpy()
    self.assertLess(abs(np.corrcoef(a, b)[0, 1]), _correlation_bound(n))

  def test_stream_has_no_lag_one_autocorrelation(self):
    u = ops.uniform_dither([3, 3], _N_STAT).numpy().astype(np.float64)
    self.assertLess(abs(np.corrcoef(u[:-1], u[1:])[0, 1]),
                    _correlation_bound(_N_STAT - 1))


class RngValidationTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters([[1, 2, 3]], [[[1, 2]]], [5])
  def test_seed_of_wrong_shape_raises(self, seed):
    with self.assertRaisesRegex(ValueError, "`seed`"):
      ops.uniform_dither(tf.constant(seed, tf.int32), 10)

  def test_float_seed_raises(self):
    with self.assertRaisesRegex(TypeError, "`seed`.*float32"):
      ops.uniform_dither(tf.constant([1.0, 2.0]), 10)

  def test_non_integer_fold_value_raises(self):
    with self.assertRaisesRegex(TypeError, "`value`"):
      ops.fold_seed([1, 2], 1.5)

  def test_too_many_elements_raises(self):
    with self.assertRaisesRegex(ValueError, "num_elements=4294967296"):
      ops.uniform_dither([1, 2], 2**32)


if __name__ == "__main__":
  tf.test.main()
