"""Summing real encodes in integer lanes, and decoding the sum once.

The workers encode with one shared scale per bucket (the max over workers of
their own scales), through the codecs' public `bucket_scales` and
`encode_symbols`, as the all-reduce transport does.
"""

import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf import ops
from ndq_tf import theory

_BASE_SEED = [7, 0x4E445154]


def _seeds(num_workers, step=3):
  """Each worker's seed, derived as the distribution layer derives it."""
  step_seed = ops.fold_seed(_BASE_SEED, step)
  return tf.stack([ops.fold_seed(step_seed, p) for p in range(num_workers)])


def _gradients(num_workers, n, seed=0):
  """Different gradients per worker, with scales spread over buckets and
  workers (so the shared scale is often another worker's)."""
  rng = np.random.default_rng(seed)
  spread = np.exp(rng.uniform(-2.0, 2.0, size=[num_workers, 1]))
  ramp = np.exp(np.linspace(-3.0, 3.0, n))[None, :]
  g = rng.standard_normal([num_workers, n]) * spread * ramp
  return g.astype(np.float32)


def _encode_shared(codec, grads, seeds):
  """Every worker's symbols with the shared scales; and those scales.

  Returns:
    `(scales, symbols)`: `[B]` float32 shared scales (max over workers of
    their `bucket_scales`) and a list of `[n]` symbol vectors
    (codes + offset).
  """
  flats = [tf.constant(g) for g in grads]
  scales = tf.reduce_max(
      tf.stack([codec.bucket_scales(x) for x in flats]), axis=0)
  symbols = [tf.cast(codec.encode_symbols(x, seeds[p], scales), tf.int32)
             for p, x in enumerate(flats)]
  return scales, symbols


def _decode_each(codec, symbols, scales, seeds):
  """The sum of the workers' own decodes, through the public codec API."""
  n = symbols[0].shape[0]
  total = tf.zeros([n], tf.float32)
  for p, s in enumerate(symbols):
    payload = ndq_tf.Payload(
        words=ops.pack_codes(s, codec.alphabet_size), scales=scales,
        shape=tf.TensorShape([n]), dtype=tf.float32)
    total += codec.decode(payload, seed=seeds[p])
  return total


def _lane_sum(symbols, alphabet_size):
  """What the all-reduce transport computes: the sum of packed lanes."""
  layout = ops.lane_layout(alphabet_size, len(symbols), symbols[0].shape[0])
  total = tf.reduce_sum(
      tf.stack([ops.pack_lanes(s, layout) for s in symbols]), axis=0)
  return ops.unpack_lanes(total, layout)


def _rounding_tolerance(scales, bucket_size, n, num_workers):
  """Per element: `P·κ_b·2**-20`, 16 float32 roundings of `κ_b` per worker.

  Each worker's decode is below `κ_b(1 + Δ/2)` and rounded two or three
  times in float32 (unit roundoff `2**-24`), then summed in float32; the
  largest difference seen is about `1.5·P·κ_b·2**-24`.
  """
  kappa = np.repeat(scales.numpy(), bucket_size)[:n]
  return num_workers * kappa * 2.0**-20


class LaneSumOfEncodesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(num_levels=(1, 3), num_workers=(2, 3, 8),
                         bucket_size=(64, 512))
  def test_dqsg_lane_sum_and_decoded_sum(self, num_levels, num_workers,
                                         bucket_size):
    codec = ndq_tf.DitheredCodec(num_levels=num_levels,
                                 bucket_size=bucket_size)
    n = 3001
    grads = _gradients(num_workers, n, seed=num_workers)
    seeds = _seeds(num_workers)
    scales, symbols = _encode_shared(codec, grads, seeds)
    expected = np.sum([s.numpy() for s in symbols], axis=0)
    self.assertAllEqual(_lane_sum(symbols, codec.alphabet_size), expected)

    decoded = ops.dithered_sum_dequantize(
        _lane_sum(symbols, codec.alphabet_size), scales, seeds, num_levels,
        bucket_size)
    each = _decode_each(codec, symbols, scales, seeds)
    self.assertEqual(decoded.dtype, tf.float32)
    tolerance = _rounding_tolerance(scales, bucket_size, n, num_workers)
    self.assertTrue(np.all(np.abs(decoded.numpy() - each.numpy())
                           <= tolerance))
    # Forgetting one worker's dither is far outside that tolerance.
    wrong = ops.dithered_sum_dequantize(
        _lane_sum(symbols, codec.alphabet_size), scales, seeds[1:],
        num_levels, bucket_size)
    self.assertGreater(np.mean(np.abs(wrong.numpy() - each.numpy())
                               > tolerance), 0.9)

  @parameterized.parameters(
      (ndq_tf.HalfDitheredCodec(num_levels=1, bucket_size=128), 1),
      (ndq_tf.HalfDitheredCodec(num_levels=3, bucket_size=128,
                                dither_order=3), 3),
      (ndq_tf.TernGradCodec(bucket_size=128), 1),
      (ndq_tf.QSGDCodec(num_levels=1, bucket_size=128), 1),
      (ndq_tf.QSGDCodec(num_levels=4, bucket_size=128), 4))
  def test_undithered_codecs_lane_sum_and_decoded_sum(self, codec, levels):
    num_workers, n = 5, 1000
    grads = _gradients(num_workers, n, seed=11)
    seeds = _seeds(num_workers)
    scales, symbols = _encode_shared(codec, grads, seeds)
    total = _lane_sum(symbols, codec.alphabet_size)
    self.assertAllEqual(total, np.sum([s.numpy() for s in symbols], axis=0))
    decoded = ops.scaled_sum_dequantize(total, scales, num_workers, levels,
                                        codec._offset, codec.bucket_size)
    each = _decode_each(codec, symbols, scales, seeds)
    tolerance = _rounding_tolerance(scales, codec.bucket_size, n, num_workers)
    self.assertTrue(np.all(np.abs(decoded.numpy() - each.numpy())
                           <= tolerance))

  def test_eager_function_and_xla_are_bitwise_identical(self):
    codec = ndq_tf.DitheredCodec(num_levels=3, bucket_size=64)
    grads = _gradients(4, 777, seed=5)
    seeds = _seeds(4)
    scales, symbols = _encode_shared(codec, grads, seeds)
    total = _lane_sum(symbols, codec.alphabet_size)

    def decode(total, scales, seeds):
      return ops.dithered_sum_dequantize(total, scales, seeds, 3, 64)

    eager = decode(total, scales, seeds)
    graph = tf.function(decode)(total, scales, seeds)
    xla = tf.function(decode, jit_compile=True)(total, scales, seeds)
    self.assertAllEqual(tf.bitcast(eager, tf.int32),
                        tf.bitcast(graph, tf.int32))
    self.assertAllEqual(tf.bitcast(eager, tf.int32), tf.bitcast(xla, tf.int32))

  def test_dither_sum_is_the_exact_sum_of_the_workers_dithers(self):
    seeds = _seeds(6)
    got = ops.dither_sum(seeds, 1000)
    self.assertEqual(got.dtype, tf.float64)
    expected = np.sum([ops.uniform_dither(s, 1000).numpy().astype(np.float64)
                       for s in seeds], axis=0)
    self.assertAllEqual(got, expected)
    # Stream 1 (the half-dithered codec's second uniform) is another stream.
    self.assertNotAllClose(ops.dither_sum(seeds, 1000, stream=1), got)

  def test_zero_scale_gives_zeros_and_non_finite_scale_gives_nan(self):
    seeds = _seeds(3)
    total = tf.constant([3, 4, 5, 2, 6, 0], tf.int32)  # sums of 3 symbols of 7
    scales = tf.constant([0.0, math.nan, math.inf], tf.float32)
    got = ops.dithered_sum_dequantize(total, scales, seeds, 3, 2).numpy()
    self.assertAllEqual(got[:2], [0.0, 0.0])
    self.assertTrue(np.all(np.isnan(got[2:])))
    got = ops.scaled_sum_dequantize(total, scales, 3, 3, 3, 2).numpy()
    self.assertAllEqual(got[:2], [0.0, 0.0])
    self.assertTrue(np.all(np.isnan(got[2:])))

  def test_bad_arguments_raise(self):
    total = tf.zeros([10], tf.int32)
    scales = tf.ones([2], tf.float32)
    with self.assertRaisesRegex(ValueError, "`seeds`.*\\[P, 2\\]"):
      ops.dithered_sum_dequantize(total, scales, tf.zeros([2], tf.int32), 1, 5)
    with self.assertRaisesRegex(TypeError, "`seeds`"):
      ops.dithered_sum_dequantize(total, scales, tf.zeros([2, 2]), 1, 5)
    with self.assertRaisesRegex(ValueError, "`scales`.*2 for 10"):
      ops.dithered_sum_dequantize(total, tf.ones([3]), _seeds(2), 1, 5)
    with self.assertRaisesRegex(TypeError, "`symbol_sum`"):
      ops.scaled_sum_dequantize(tf.zeros([10]), scales, 2, 1, 1, 5)
    with self.assertRaisesRegex(ValueError, "`num_levels`.*num_levels=0"):
      ops.scaled_sum_dequantize(total, scales, 2, 0, 1, 5)
    with self.assertRaisesRegex(ValueError, "`offset`.*offset=-1"):
      ops.scaled_sum_dequantize(total, scales, 2, 1, -1, 5)


class SharedScaleStatisticsTest(tf.test.TestCase, parameterized.TestCase):
  """The decoded sum is unbiased, with variance `P·κ_max²Δ²/12` per element.

  Tolerances. Per element, the error of the decoded sum over `κ_b` (the
  shared scale of its bucket) is `Y = Δ·Σ_p ε_p`, `ε_p` independent and
  uniform on `[-1/2, 1/2]` (Theorem 1: independent of the gradients; the
  dithers of distinct workers and elements are independent draws). So
  `E[Y] = 0`, `σ² = E[Y²] = P·Δ²/12 = theory.shared_scale_variance(M, P)`
  and, from `E[ε²] = 1/12`, `E[ε⁴] = 1/80`,
  `E[Y⁴] = Δ⁴·(P/80 + 3P(P - 1)/144)`.
  Over `N` elements the estimate `V = mean(Y²)` (the mean is known to be 0)
  has `Var(V) = (E[Y⁴] - σ⁴)/N`, a relative standard deviation of
  `sqrt(E[Y⁴]/σ⁴ - 1)/sqrt(N) = sqrt(2 - 1.2/P)/sqrt(N)` (`sqrt(0.8/N)` for
  `P = 1`): 0.12% for `P = 2` and 0.13% for `P = 8` at `N = 2**20`. The
  test allows six of them (below 0.8%, false alarms about 2e-9), well inside
  the issue's 3%, which it checks too. The mean's standard deviation is
  `σ/sqrt(N)`; six of them are allowed. The `2**-24` grid of the dither
  changes `E[ε²]` by about `2**-48`, far below either.
  """

  @parameterized.product(num_levels=(1, 3), num_workers=(2, 8))
  def test_unbiased_with_shared_scale_variance(self, num_levels, num_workers):
    n, bucket_size = 2**20, 512
    codec = ndq_tf.DitheredCodec(num_levels=num_levels,
                                 bucket_size=bucket_size)
    grads = _gradients(num_workers, n, seed=100 + num_workers)
    seeds = _seeds(num_workers, step=num_levels)
    scales, symbols = _encode_shared(codec, grads, seeds)
    decoded = ops.dithered_sum_dequantize(
        _lane_sum(symbols, codec.alphabet_size), scales, seeds, num_levels,
        bucket_size, dtype=tf.float64)
    kappa = np.repeat(scales.numpy().astype(np.float64), bucket_size)[:n]
    y = (decoded.numpy() - grads.astype(np.float64).sum(axis=0)) / kappa

    variance = theory.shared_scale_variance(num_levels, num_workers)
    self.assertAllClose(variance, num_workers / (12 * num_levels**2))
    relative_std = math.sqrt((2 - 1.2 / num_workers) / n)
    ratio = np.mean(y * y) / variance
    self.assertLess(abs(ratio - 1), 6 * relative_std)
    self.assertLess(abs(ratio - 1), 0.03)
    self.assertLess(abs(np.mean(y)), 6 * math.sqrt(variance / n))

  def test_shared_scale_is_the_workers_largest(self):
    # Sharing costs each worker (κ_max/κ_p)² of its own variance: with
    # workers whose scales differ 4x, the decoded sum's error follows
    # κ_max, not the workers' own scales.
    n, m = 2**16, 1
    codec = ndq_tf.DitheredCodec(num_levels=m, bucket_size=n)
    rng = np.random.default_rng(3)
    base_g = rng.uniform(-1, 1, n).astype(np.float32)
    grads = np.stack([base_g, base_g / 4])
    seeds = _seeds(2)
    scales, symbols = _encode_shared(codec, grads, seeds)
    self.assertAllClose(scales, [np.max(np.abs(base_g))])
    decoded = ops.dithered_sum_dequantize(
        _lane_sum(symbols, 3), scales, seeds, m, n, dtype=tf.float64)
    err = decoded.numpy() - grads.astype(np.float64).sum(axis=0)
    kappa = float(scales[0])
    own = theory.dithered_variance(m) * kappa**2 * (1 + 1 / 16)
    shared = theory.shared_scale_variance(m, 2, kappa)
    measured = np.mean(err * err)
    # Relative std sqrt(1.4/2**16) = 0.5%; allow 6 of them.
    self.assertLess(abs(measured / shared - 1), 0.03)
    self.assertGreater(measured / own, 1.8)


if __name__ == "__main__":
  tf.test.main()
