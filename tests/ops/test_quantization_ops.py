"""Tests of the paper's quantizer equations (`ndq_tf.ops.quantization_ops`)."""

import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from ndq_tf import ops

_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


_EPS = {tf.float16: 2.0**-10, tf.bfloat16: 2.0**-7, tf.float32: 2.0**-23,
        tf.float64: 2.0**-52}


def _eps(dtype):
  """Machine epsilon (spacing of floats at 1): twice the unit roundoff."""
  return _EPS[tf.as_dtype(dtype)]


class Fig3ExampleTest(tf.test.TestCase, parameterized.TestCase):
  """The worked example of the paper's Fig. 3 (docs/algorithms.md, "Nested encoder and decoder")."""

  def test_nested_quantize_fig3(self):
    code = ops.nested_quantize(-4.2, 0.3, 1.0, 3, 1.0)
    self.assertEqual(code.dtype, tf.int32)
    self.assertEqual(int(code), -1)

  def test_nested_dequantize_fig3(self):
    x_hat = ops.nested_dequantize(-1, 0.3, -3.4, 1.0, 3, 1.0)
    self.assertEqual(x_hat.dtype, tf.float32)
    self.assertAllClose(x_hat, -4.3, rtol=0, atol=4 * 2.0**-24 * 4.3)

  @parameterized.parameters(tf.float32, tf.float64)
  def test_fig3_as_tensors(self, dtype):
    x = tf.constant(-4.2, dtype)
    code = ops.nested_quantize(x, tf.constant(0.3, dtype), 1.0, 3, 1.0)
    self.assertEqual(int(code), -1)
    x_hat = ops.nested_dequantize(code, tf.constant(0.3, dtype),
                                  tf.constant(-3.4, dtype), 1.0, 3, 1.0)
    self.assertEqual(x_hat.dtype, dtype)
    self.assertAllClose(x_hat, -4.3, rtol=0, atol=8 * _eps(dtype) * 4.3)

  def test_fig3_side_information_off_by_a_coarse_step_overloads(self):
    # y = -1.9 is 2.3 from x: |z + e| = 2.4 > Δ2/2 = 1.5, so the decoder
    # lands one coarse step (3) away: -4.2 - 0.1 + 3 = -1.3.
    x_hat = ops.nested_dequantize(-1, 0.3, -1.9, 1.0, 3, 1.0)
    self.assertAllClose(x_hat, -1.3, rtol=0, atol=1e-6)


class DitheredOpsTest(tf.test.TestCase, parameterized.TestCase):

  def test_dithered_quantize_hand_values(self):
    x = tf.constant([0.0, 0.3, -0.3, 0.74, 1.0, -2.6])
    u = tf.constant([0.1, 0.1, -0.1, 0.01, -0.2, 0.0])
    codes = ops.dithered_quantize(x, u, 0.5)
    self.assertEqual(codes.dtype, tf.int32)
    # (x + u) / 0.5 = 0.2, 0.8, -0.8, 1.5, 1.6, -5.2
    self.assertAllEqual(codes, [0, 1, -1, 2, 2, -5])
    self.assertAllClose(ops.dithered_dequantize(codes, u, 0.5),
                        [-0.1, 0.4, -0.4, 0.99, 1.2, -2.5])

  def test_round_half_to_even(self):
    codes = ops.dithered_quantize(tf.constant([0.5, 1.5, 2.5, -0.5, -1.5]),
                                  0.0, 1.0)
    self.assertAllEqual(codes, [0, 2, 2, 0, -2])

  @parameterized.parameters(*_FLOAT_DTYPES)
  def test_dithered_error_is_within_half_a_step(self, dtype):
    step = 0.25
    x = tf.cast(tf.linspace(-3.0, 3.0, 4001), dtype)
    u = tf.cast(ops.uniform_dither([1, 2], 4001) * step, dtype)
    codes = ops.dithered_quantize(x, u, step)
    x_hat = ops.dithered_dequantize(codes, u, step)
    self.assertEqual(x_hat.dtype, dtype)
    err = np.abs(tf.cast(x_hat, tf.float64) - tf.cast(x, tf.float64))
    # Δ/2 plus the rounding of x + u, of the quotient and of Δq - u, each at
    # most eps/2 relative to values below |x| + Δ.
    self.assertLessEqual(err.max(), step / 2 + 3 * _eps(dtype) * (3 + step))

  def test_rounding_is_unbiased(self):
    # Subtractive dither: the error x - (Δq - u) is uniform on [-Δ/2, Δ/2]
    # whatever x, so the mean of n errors has standard error Δ/sqrt(12 n);
    # allow 6 of them.
    n, step = 1 << 16, 0.5
    u = ops.uniform_dither([7, 7], n) * step
    for value in (-0.8, -0.1, 0.0, 0.13, 0.25, 0.49):
      x = tf.fill([n], value)
      x_hat = ops.dithered_dequantize(ops.dithered_quantize(x, u, step), u,
                                      step)
      mean = float(tf.reduce_mean(tf.cast(x_hat, tf.float64) - value))
      self.assertLess(abs(mean), 6 * step / math.sqrt(12 * n), msg=value)

  def test_half_dithered_rounding_is_unbiased(self):
    # Stochastic rounding (order 1): the error takes two values, so its
    # variance is at most Δ²/4 and the mean's standard error Δ/(2 sqrt(n)).
    n, step = 1 << 16, 0.5
    u = ops.uniform_dither([8, 8], n) * step
    for value in (-0.8, -0.1, 0.13, 0.25, 0.49):
      x = tf.fill([n], value)
      codes = ops.half_dithered_quantize(x, u, step)
      x_hat = ops.half_dithered_dequantize(codes, step, tf.float64)
      mean = float(tf.reduce_mean(x_hat - value))
      self.assertLess(abs(mean), 6 * step / (2 * math.sqrt(n)), msg=value)

  @parameterized.parameters(*_FLOAT_DTYPES)
  def test_half_dithered_dequantize_has_requested_dtype(self, dtype):
    x_hat = ops.half_dithered_dequantize(tf.constant([-2, 0, 3]), 0.5, dtype)
    self.assertEqual(x_hat.dtype, dtype)
    self.assertAllEqual(tf.cast(x_hat, tf.float32), [-1.0, 0.0, 1.5])

  @parameterized.parameters(tf.int32, tf.int64, tf.bool)
  def test_integer_x_raises_type_error_naming_x(self, dtype):
    x = tf.zeros([3], dtype)
    with self.assertRaisesRegex(TypeError, "`x`"):
      ops.dithered_quantize(x, 0.0, 1.0)
    with self.assertRaisesRegex(TypeError, "`x`"):
      ops.nested_quantize(x, 0.0, 1.0, 3)

  def test_integer_dither_in_dequantize_raises_type_error(self):
    with self.assertRaisesRegex(TypeError, "`dither`"):
      ops.dithered_dequantize(tf.constant([1]), tf.constant([0]), 1.0)

  def test_integer_side_information_raises_type_error(self):
    with self.assertRaisesRegex(TypeError, "`side_information`"):
      ops.nested_dequantize(tf.constant([1]), 0.0, tf.constant([0]), 1.0, 3)


class NestedOpsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(2, 3, 4, 5, 8, 9)
  def test_centered_mod_is_the_residue_in_the_centered_range(self, k):
    c = tf.range(-50, 51)
    s = ops.centered_mod(c, k).numpy()
    self.assertTrue(np.all(s >= -(k // 2)))
    self.assertTrue(np.all(s < k - k // 2))
    self.assertAllEqual((c.numpy() - s) % k, np.zeros(101))

  @parameterized.product(k=[2, 3, 4, 7], alpha=[1.0, 0.8])
  def test_nested_codes_are_the_fine_index_modulo_k(self, k, alpha):
    rng = np.random.default_rng(k)
    fine = 0.25
    x = rng.uniform(-3, 3, 2000)
    u = rng.uniform(-fine / 2, fine / 2, 2000)
    codes = ops.nested_quantize(tf.constant(x), tf.constant(u), fine, k, alpha)
    self.assertEqual(codes.dtype, tf.int32)
    c = np.round((alpha * x + u) / fine).astype(np.int64)
    expected = (c + k // 2) % k - k // 2
    self.assertAllEqual(codes, expected)

  # alpha values exact in float32, so that these tests check the algebra
  # only (see test_python_float_parameters_keep_float64_precision).
  @parameterized.product(k=[2, 3, 4, 7], alpha=[1.0, 0.75])
  def test_nested_error_without_overload_matches_the_algebra(self, k, alpha):
    # x̂ = y + α(α z + e'), e' = Δ1 c - (αx + u) the fine rounding error, as
    # long as |α z + e'| < Δ2/2 (docs/algorithms.md, "Nested encoder and decoder").
    rng = np.random.default_rng(10 + k)
    fine = 0.25
    n = 4000
    x = rng.uniform(-3, 3, n)
    u = rng.uniform(-fine / 2, fine / 2, n)
    # |α z| + Δ1/2 stays below Δ2/2 = kΔ1/2: no overload by construction.
    z = rng.uniform(-1, 1, n) * 0.95 * (k - 1) * fine / 2 / alpha
    y = x - z
    codes = ops.nested_quantize(tf.constant(x), tf.constant(u), fine, k, alpha)
    x_hat = ops.nested_dequantize(codes, tf.constant(u), tf.constant(y), fine,
                                  k, alpha).numpy()
    e = fine * np.round((alpha * x + u) / fine) - (alpha * x + u)
    expected = y + alpha * (alpha * z + e)
    self.assertAllClose(x_hat, expected, rtol=0, atol=1e-12)
    self.assertLessEqual(
        np.max(np.abs(x_hat - x - (alpha**2 - 1) * z)),
        alpha * fine / 2 + 1e-12)

  @parameterized.parameters(1.0, 0.625)
  def test_overload_is_off_by_a_multiple_of_alpha_coarse_step(self, alpha):
    # Beyond the coarse cell the fold lands j coarse cells away; since
    # x̂ = y + α·w, the result is off by j·α·Δ2 (α·κ·Δ2 in a codec).
    rng = np.random.default_rng(3)
    fine, k = 0.25, 3
    coarse = k * fine
    n = 4000
    x = rng.uniform(-3, 3, n)
    u = rng.uniform(-fine / 2, fine / 2, n)
    z = rng.uniform(-4, 4, n)
    y = x - z
    codes = ops.nested_quantize(tf.constant(x), tf.constant(u), fine, k, alpha)
    x_hat = ops.nested_dequantize(codes, tf.constant(u), tf.constant(y), fine,
                                  k, alpha).numpy()
    e = fine * np.round((alpha * x + u) / fine) - (alpha * x + u)
    j = np.round((alpha * z + e) / coarse)
    self.assertGreater(np.mean(j != 0), 0.5)  # most are overloaded here
    expected = x + (alpha**2 - 1) * z + alpha * (e - j * coarse)
    self.assertAllClose(x_hat, expected, rtol=0, atol=1e-12)

  def test_python_float_parameters_keep_float64_precision(self):
    # With float64 tensors, a Python float step or alpha must be used at
    # float64 precision. tf.cast(0.8, tf.float64) goes through a float32
    # constant (0.800000011920929), which puts a 1e-8 relative error on
    # every float64 result.
    rng = np.random.default_rng(4)
    x = rng.uniform(-3, 3, 1000)
    u = rng.uniform(-0.05, 0.05, 1000)
    y = x + rng.uniform(-0.01, 0.01, 1000)
    fine, k, alpha = 0.1, 3, 0.8
    codes = ops.nested_quantize(tf.constant(x), tf.constant(u), fine, k, alpha)
    self.assertAllEqual(codes, (np.round((alpha * x + u) / fine) + 1) % 3 - 1)
    x_hat = ops.nested_dequantize(codes, tf.constant(u), tf.constant(y), fine,
                                  k, alpha).numpy()
    v = fine * codes.numpy() - u - alpha * y
    expected = y + alpha * (v - k * fine * np.round(v / (k * fine)))
    self.assertAllClose(x_hat, expected, rtol=0, atol=1e-13)
    q = ops.dithered_quantize(tf.constant(x), tf.constant(u), fine)
    self.assertAllClose(ops.dithered_dequantize(q, tf.constant(u), fine),
                        fine * q.numpy() - u, rtol=0, atol=1e-13)

  @parameterized.parameters(*_FLOAT_DTYPES)
  def test_nested_dequantize_returns_side_information_dtype(self, dtype):
    x = tf.constant([0.3, -0.6, 0.9], dtype)
    u = tf.constant([0.01, -0.02, 0.03], dtype)
    codes = ops.nested_quantize(x, u, 0.25, 4, 1.0)
    x_hat = ops.nested_dequantize(codes, u, x, 0.25, 4, 1.0)
    self.assertEqual(x_hat.dtype, dtype)
    self.assertAllClose(tf.cast(x_hat, tf.float64), tf.cast(x, tf.float64),
                        rtol=0, atol=0.125 + 8 * _eps(dtype))

  @parameterized.parameters(1, 0, -2, 3.0, True, "3", None)
  def test_bad_coarse_ratio_raises_value_error(self, coarse_ratio):
    pattern = f"`coarse_ratio`.*coarse_ratio={coarse_ratio!r}"
    with self.assertRaisesRegex(ValueError, pattern):
      ops.nested_quantize(tf.constant([0.5]), 0.0, 0.25, coarse_ratio)
    with self.assertRaisesRegex(ValueError, pattern):
      ops.nested_dequantize(tf.constant([0]), 0.0, tf.constant([0.5]), 0.25,
                            coarse_ratio)


if __name__ == "__main__":
  tf.test.main()
