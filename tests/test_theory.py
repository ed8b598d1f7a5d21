"""Spot checks of `ndq_tf.theory` against hand values and numpy Monte Carlo.

The Monte Carlo checks draw from numpy's generator (not the codecs), so they
test the formulas themselves; tolerances are six standard errors of the
Monte Carlo estimate.
"""

import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf import theory
from ndq_tf.ops import rotation_ops

_MC = 1 << 21


class VarianceFormulaTest(tf.test.TestCase, parameterized.TestCase):

  def test_uniform_error_variance_hand_values(self):
    self.assertAlmostEqual(theory.uniform_error_variance(1.0), 1 / 12)
    self.assertAlmostEqual(theory.uniform_error_variance(0.5), 1 / 48)
    self.assertAlmostEqual(theory.uniform_error_variance(2.0), 4 / 12)

  @parameterized.parameters(1, 2, 3, 7)
  def test_dithered_variance_is_step_squared_over_12(self, m):
    self.assertAlmostEqual(theory.dithered_variance(m), 1 / (12 * m * m))

  def test_doubling_levels_quarters_the_variance(self):
    self.assertAlmostEqual(theory.dithered_variance(2) * 4,
                           theory.dithered_variance(1))

  def test_dithered_total_mse_hand_value(self):
    # Σ κ_b² d_b Δ²/12 with M = 2 (Δ = 1/2): (4·512 + 0.25·512 + 9·100)/48.
    expected = (4 * 512 + 0.25 * 512 + 9 * 100) / 48
    self.assertAlmostEqual(
        theory.dithered_total_mse([2.0, 0.5, 3.0], [512, 512, 100], 2),
        expected)
    self.assertAlmostEqual(
        theory.dithered_total_mse([2.0, 0.5], 512, 2),
        (4 + 0.25) * 512 / 48)
    self.assertEqual(theory.dithered_total_mse([], 512, 1), 0)

  def test_variance_factor_hand_value(self):
    self.assertAlmostEqual(theory.variance_factor(512, 1), 1 + 512 / 12)
    self.assertAlmostEqual(theory.variance_factor(64, 4), 1 + 64 / (12 * 16))

  def test_variance_factor_bounds_monte_carlo_second_moment(self):
    # E‖g̃‖² = ‖g‖² + κ²dΔ²/12 <= (1 + dΔ²/12)‖g‖² since κ² <= ‖g‖².
    rng = np.random.default_rng(0)
    d, m, trials = 64, 2, 20000
    g = rng.standard_normal(d)
    kappa = np.max(np.abs(g))
    step = 1 / m
    u = rng.uniform(-step / 2, step / 2, (trials, d))
    x = g / kappa
    g_hat = kappa * (step * np.round((x + u) / step) - u)
    second = np.mean(np.sum(g_hat**2, axis=1))
    exact = np.sum(g**2) + kappa**2 * d * step**2 / 12
    # Var of ‖g̃‖² per trial <= E[(Σ ...)²]; use its sample estimate.
    se = np.std(np.sum(g_hat**2, axis=1)) / math.sqrt(trials)
    self.assertLessEqual(abs(second - exact), 6 * se)
    self.assertLessEqual(exact,
                         theory.variance_factor(d, m) * np.sum(g**2) + 1e-9)

  @parameterized.parameters((1, 2), (1, 3), (2, 2), (3, 5))
  def test_half_dithered_variance_matches_monte_carlo(self, m, order):
    rng = np.random.default_rng(order)
    step = 1 / m
    x = rng.uniform(-1, 1, _MC)
    u = rng.uniform(-step / 2, step / 2, (order, _MC)).sum(axis=0)
    eps = x - step * np.round((x + u) / step)
    var = theory.half_dithered_variance(m, order)
    self.assertAlmostEqual(var, (order + 1) * step**2 / 12)
    # |ε| <= (order + 1)Δ/2 bounds Var(ε²) <= ((order+1)Δ/2)² E[ε²].
    se = math.sqrt(((order + 1) * step / 2)**2 * var / _MC)
    self.assertLessEqual(abs(np.mean(eps**2) - var), 6 * se)

  @parameterized.parameters(0.0, 0.1, 0.25, 0.5, 0.9, -0.3)
  def test_stochastic_rounding_variance_hand_values(self, x):
    p = x - math.floor(x)
    self.assertAlmostEqual(theory.half_dithered_variance(1, 1, x=x),
                           p * (1 - p))
    step = 0.25
    p = x / step - math.floor(x / step)
    self.assertAlmostEqual(theory.half_dithered_variance(4, 1, x=x),
                           step * step * p * (1 - p))

  def test_stochastic_rounding_variance_needs_the_signal(self):
    with self.assertRaisesRegex(ValueError, "`x`"):
      theory.half_dithered_variance(1, 1)


class NestedFormulaTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters((0.1, 0.25), (0.5, 0.25), (0.05, 0.1))
  def test_alpha_one_and_equal_mse_alpha_give_fine_step_variance(
      self, sigma_z, fine):
    d = fine**2 / 12
    self.assertAlmostEqual(theory.nested_mse(1.0, sigma_z, fine), d)
    a2 = 1 - fine**2 / (12 * sigma_z**2)
    if a2 > 0:
      self.assertAlmostEqual(
          theory.nested_mse(math.sqrt(a2), sigma_z, fine), d)

  @parameterized.parameters((1.0, 0.1, 0.25), (0.8, 0.2, 0.25),
                            (0.5, 0.05, 0.1))
  def test_nested_mse_matches_monte_carlo(self, alpha, sigma_z, fine):
    rng = np.random.default_rng(1)
    z = rng.normal(0, sigma_z, _MC)
    e = rng.uniform(-fine / 2, fine / 2, _MC)
    err = (alpha**2 - 1) * z + alpha * e
    mse = theory.nested_mse(alpha, sigma_z, fine)
    se = np.std(err**2) / math.sqrt(_MC)
    self.assertLessEqual(abs(np.mean(err**2) - mse), 6 * se)

  @parameterized.parameters((0.1, 0.25), (0.125, 0.25), (1.0, 0.5))
  def test_mmse_alpha_minimizes_nested_mse(self, sigma_z, fine):
    alpha = theory.mmse_alpha(sigma_z, fine)
    self.assertAlmostEqual(alpha**2, 1 - fine**2 / (24 * sigma_z**2))
    best = theory.nested_mse(alpha, sigma_z, fine)
    self.assertAlmostEqual(theory.mmse_nested_mse(sigma_z, fine), best)
    d = fine**2 / 12
    self.assertAlmostEqual(best, d - d * d / (4 * sigma_z**2))
    grid = np.linspace(0.01, 1.0, 991)
    self.assertLessEqual(
        best, min(theory.nested_mse(a, sigma_z, fine) for a in grid) + 1e-15)
    self.assertLess(best, d)

  def test_mmse_alpha_is_zero_when_side_information_is_better(self):
    fine = 0.25
    sigma_z = math.sqrt(fine**2 / 24) * 0.9
    self.assertEqual(theory.mmse_alpha(sigma_z, fine), 0.0)
    self.assertEqual(theory.mmse_alpha(0.0, fine), 0.0)
    self.assertAlmostEqual(theory.mmse_nested_mse(sigma_z, fine), sigma_z**2)

  def test_mmse_nested_mse_is_continuous_where_alpha_reaches_zero(self):
    fine = 0.25
    boundary = math.sqrt(fine**2 / 24)  # σ_z² = D/2
    below = theory.mmse_nested_mse(boundary * (1 - 1e-12), fine)
    above = theory.mmse_nested_mse(boundary * (1 + 1e-12), fine)
    self.assertAlmostEqual(below, above, delta=1e-13)


class OverloadFormulaTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(
      (1.0, 0.17, 1 / 3, 3),   # ~1e-2
      (0.8, 0.226, 0.25, 4),   # ~1e-2
      (1.0, 0.12, 1 / 3, 3),   # ~6e-4
      (0.9, 0.5, 0.25, 3),     # heavy overload
      (1.0, 0.05, 0.1, 2),
  )
  def test_overload_probability_matches_brute_force_monte_carlo(
      self, alpha, sigma_z, fine, coarse_ratio):
    rng = np.random.default_rng(7)
    n = 1 << 22
    z = rng.normal(0, sigma_z, n)
    e = rng.uniform(-fine / 2, fine / 2, n)
    rate = np.mean(np.abs(alpha * z + e) >= coarse_ratio * fine / 2)
    p = theory.overload_probability(alpha, sigma_z, fine, coarse_ratio)
    # Binomial standard error, six of them (plus a count of one for p ~ 0).
    se = math.sqrt(p * (1 - p) / n)
    self.assertLessEqual(abs(rate - p), 6 * se + 1 / n)

  @parameterized.parameters(
      (1.0, 0.17, 1 / 3, 3), (0.8, 0.226, 0.25, 4), (0.5, 1.0, 0.1, 5),
      (1.0, 0.01, 0.25, 9))
  def test_overload_probability_is_below_the_bound(self, alpha, sigma_z, fine,
                                                   coarse_ratio):
    p = theory.overload_probability(alpha, sigma_z, fine, coarse_ratio)
    bound = theory.overload_bound(alpha, sigma_z, fine, coarse_ratio)
    self.assertBetween(p, 0.0, 1.0)
    self.assertLessEqual(p, bound)
    # The bound is P(|z| > (k-1)Δ1/(2α)) for Gaussian z.
    threshold = (coarse_ratio - 1) * fine / (2 * alpha)
    self.assertAlmostEqual(bound, math.erfc(threshold / sigma_z / math.sqrt(2)))

  def test_overload_probability_grows_with_sigma(self):
    sigmas = np.linspace(0.01, 2.0, 200)
    probs = [theory.overload_probability(1.0, s, 0.25, 3) for s in sigmas]
    self.assertTrue(np.all(np.diff(probs) >= 0))

  def test_no_noise_never_overloads(self):
    self.assertEqual(theory.overload_probability(1.0, 0.0, 0.25, 3), 0.0)
    self.assertEqual(theory.overload_bound(1.0, 0.0, 0.25, 3), 0.0)


class AdaptiveFormulaTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters((0.025, 1.959963984540054),
                            (0.05, 1.6448536269514722),
                            (0.5e-4, 3.890591886413094),
                            (1e-9, 5.997807015007686))
  def test_gaussian_tail_quantile_hand_values(self, p, t):
    self.assertAlmostEqual(theory.gaussian_tail_quantile(p), t, places=9)
    self.assertAlmostEqual(
        0.5 * math.erfc(theory.gaussian_tail_quantile(p) / math.sqrt(2)) / p,
        1.0, places=9)

  @parameterized.parameters(0.0, 0.5, 0.7, -0.1)
  def test_gaussian_tail_quantile_rejects_bad_p(self, p):
    with self.assertRaisesRegex(ValueError, "`p`"):
      theory.gaussian_tail_quantile(p)

  @parameterized.parameters((3, 1e-4, 1.0), (3, 1e-2, 0.7), (5, 1e-3, 0.9))
  def test_auto_fine_step_puts_the_overload_probability_at_the_target(
      self, k, target, alpha):
    sigma = 0.03
    fine = theory.auto_nested_fine_step(sigma, k, target, alpha)
    self.assertAlmostEqual(
        theory.overload_probability(alpha, sigma, fine, k) / target, 1.0,
        places=9)
    # The cruder bound, which ignores the fine error's help, is above it.
    self.assertGreater(theory.overload_bound(alpha, sigma, fine, k), target)

  @parameterized.parameters((3, 1e-4, 1.0), (3, 1e-2, 0.7), (5, 1e-3, 0.9))
  def test_auto_mse_factor_is_nested_mse_at_the_auto_step(self, k, target,
                                                          alpha):
    sigma = 0.03
    fine = theory.auto_nested_fine_step(sigma, k, target, alpha)
    self.assertAlmostEqual(
        theory.auto_nested_mse_factor(k, target, alpha) * sigma**2,
        theory.nested_mse(alpha, sigma, fine), delta=1e-15)

  @parameterized.parameters((3, 1e-4), (3, 1e-2), (7, 1e-6))
  def test_auto_alpha_minimizes_the_mse_factor(self, k, target):
    alpha = theory.auto_nested_alpha(k, target)
    self.assertBetween(alpha, 0.0, 1.0)
    best = theory.auto_nested_mse_factor(k, target, alpha)
    grid = np.linspace(0.01, 1.0, 991)
    self.assertLessEqual(
        best,
        min(theory.auto_nested_mse_factor(k, target, a) for a in grid) + 1e-15)


class BitsFormulaTest(tf.test.TestCase, parameterized.TestCase):

  def test_bits_per_element_of_ternary_dqsg(self):
    codec = ndq_tf.DitheredCodec(num_levels=1, bucket_size=512)
    self.assertAlmostEqual(theory.bits_per_element(codec, 10240),
                           32 / 20 + 32 / 512)
    self.assertAlmostEqual(theory.bits_per_element(codec, 1), 64.0)

  def test_bits_per_element_of_float_codecs(self):
    self.assertEqual(theory.bits_per_element(ndq_tf.Float32Codec(), 1001),
                     32.0)
    self.assertEqual(theory.bits_per_element(ndq_tf.Float16Codec(), 1000),
                     16.0)
    self.assertEqual(theory.bits_per_element(ndq_tf.BFloat16Codec(), 1000),
                     16.0)

  def test_nested_codec_costs_log2_k_bits_plus_scales(self):
    codec = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=4,
                                       bucket_size=512)
    # 4 symbols: 16 per word, 2 bits each.
    self.assertAlmostEqual(theory.bits_per_element(codec, 512 * 16),
                           2 + 32 / 512)

  @parameterized.parameters(0, -1)
  def test_bits_per_element_rejects_empty(self, n):
    with self.assertRaisesRegex(ValueError, "`num_elements`"):
      theory.bits_per_element(ndq_tf.DitheredCodec(), n)


class RotationFormulaTest(tf.test.TestCase, parameterized.TestCase):

  def test_rotation_domain_gain_is_the_ops_own(self):
    for k in range(16):
      self.assertEqual(theory.rotation_domain_gain(2**k),
                       rotation_ops.domain_gain(2**k))

  def test_rotation_domain_gain_hand_values(self):
    self.assertEqual(theory.rotation_domain_gain(512), 2**-0.5)
    self.assertEqual(theory.rotation_domain_gain(256), 1.0)

  @parameterized.parameters(0, 3, 384)
  def test_rotation_domain_gain_rejects_other_sizes(self, d):
    with self.assertRaisesRegex(ValueError, f"bucket_size={d}"):
      theory.rotation_domain_gain(d)


class EcdqFormulaTest(tf.test.TestCase, parameterized.TestCase):
  """ECDQ of `N(0, 1)`: `q = round(x/r + u)`, decoded `r·(q - u)` (#35)."""

  # The issue's table: r, vNMSE, H(Q|U), H(Q), to its printed digits.
  @parameterized.parameters((4.0, 1.33, 0.65, 0.92),
                            (2.5, 0.52, 1.03, 1.23),
                            (2.0, 0.333, 1.25, 1.42),
                            (1.0, 0.083, 2.11, 2.16),
                            (0.5, 0.021, 3.06, 3.08))
  def test_rates_match_the_issue_table(self, r, vnmse, conditional,
                                       unconditional):
    self.assertAlmostEqual(theory.ecdq_vnmse(r), r * r / 12)
    self.assertAlmostEqual(theory.ecdq_vnmse(r), vnmse, delta=0.006)
    self.assertAlmostEqual(theory.ecdq_conditional_rate(r), conditional,
                           delta=0.006)
    self.assertAlmostEqual(theory.ecdq_unconditional_rate(r), unconditional,
                           delta=0.006)

  def test_rates_pinned(self):
    # Agrees with scipy's quad of H(Q|U=u) over u, and of P(q) = ∫P(q|u)du,
    # to 1e-14 bits (checked once when written; scipy is not a dependency).
    for r, conditional, unconditional in ((4.0, 0.6511435456, 0.9203910090),
                                          (1.0, 2.1048326604, 2.1582872201),
                                          (0.05, 6.3691739451,
                                           6.3693241789)):
      self.assertAlmostEqual(theory.ecdq_conditional_rate(r), conditional,
                             places=9)
      self.assertAlmostEqual(theory.ecdq_unconditional_rate(r),
                             unconditional, places=9)

  def test_rates_decrease_with_the_step_and_the_dither_helps(self):
    ratios = [2.0**(k / 4) for k in range(-20, 21)]
    conditional = [theory.ecdq_conditional_rate(r) for r in ratios]
    unconditional = [theory.ecdq_unconditional_rate(r) for r in ratios]
    for a, b in zip(conditional, conditional[1:]):
      self.assertGreater(a, b)
    for a, b in zip(unconditional, unconditional[1:]):
      self.assertGreater(a, b)
    for h_cond, h in zip(conditional, unconditional):
      self.assertGreaterEqual(h, h_cond - 1e-12)
    # I(Q; U) near one bit per element: about 0.2 bits.
    gap = (theory.ecdq_unconditional_rate(2.5)
           - theory.ecdq_conditional_rate(2.5))
    self.assertBetween(gap, 0.15, 0.25)

  @parameterized.parameters(0.01, 0.1, 0.5, 1.0, 2.0)
  def test_gap_to_the_unbiased_bound_is_a_quarter_bit(self, r):
    # H(Q|U) - ½log2(1 + σ²/D) -> ½log2(πe/6) = 0.2546 as r -> 0.
    limit = 0.5 * math.log2(math.pi * math.e / 6)
    self.assertAlmostEqual(limit, 0.254614, places=6)
    bound = 0.5 * math.log2(1 + 1 / theory.ecdq_vnmse(r))
    gap = theory.ecdq_conditional_rate(r) - bound
    self.assertAlmostEqual(gap, limit, delta=1e-3)
    self.assertLessEqual(gap, limit + 1e-9)

  @parameterized.parameters(0.01, 0.1, 0.5)
  def test_high_rate_is_a_gaussian_plus_the_dither(self, r):
    # H(Q|U) = h(x/r + u) (Zamir & Feder 1992), and x/r + u is nearly
    # N(0, 1/r² + 1/12) when r is small: h = ½log2(2πe(1 + r²/12)/r²).
    h = 0.5 * math.log2(2 * math.pi * math.e * (1 + r * r / 12) / (r * r))
    self.assertAlmostEqual(theory.ecdq_conditional_rate(r), h, places=7)

  @parameterized.parameters(0.05, 0.65, 1.0, 1.3, 2.0, 6.0, 12.0)
  def test_step_ratio_inverts_the_rate(self, bits):
    r = theory.ecdq_step_ratio(bits)
    self.assertEqual(r, float(f"{r:.6g}"))
    # 6 digits of r: a relative error <= 5e-6, and |dH/d ln r| <= 1/ln 2.
    self.assertAlmostEqual(theory.ecdq_conditional_rate(r), bits, delta=1e-5)

  def test_step_ratio_hand_value(self):
    self.assertEqual(theory.ecdq_step_ratio(1.0), 2.57225)

  @parameterized.parameters(0.0, -1.0, 0.001, 14.5, float("nan"),
                            float("inf"), True, "1")
  def test_step_ratio_rejects_bits_out_of_range(self, bits):
    with self.assertRaisesRegex(ValueError, f"`bits`.*bits={bits!r}"):
      theory.ecdq_step_ratio(bits)

  @parameterized.parameters(0.0, -1.0, 1e-5, 2000.0, float("nan"),
                            float("inf"), None)
  def test_formulas_reject_bad_step_ratios(self, r):
    for f in (theory.ecdq_vnmse, theory.ecdq_conditional_rate,
              theory.ecdq_unconditional_rate):
      with self.assertRaisesRegex(ValueError,
                                  f"`step_ratio`.*step_ratio={r!r}"):
        f(r)

  @parameterized.parameters(4.0, 2.5, 1.0, 0.5)
  def test_monte_carlo_rate_and_error(self, r):
    # x ~ N(0, 1), u ~ U[-1/2, 1/2): the mean code length -log2 P(q|u) is
    # H(Q|U); the error r(q - u) - x is uniform, mean 0, variance r²/12.
    rng = np.random.default_rng(35)
    x = rng.standard_normal(_MC)
    u = rng.uniform(-0.5, 0.5, _MC)
    q = np.round(x / r + u)
    a, b = r * (q - u - 0.5), r * (q - u + 0.5)
    # The tail on the side of the interval, so that nothing cancels.
    flip = a + b < 0
    a, b = np.where(flip, -b, a), np.where(flip, -a, b)
    erfc = lambda t: tf.math.erfc(t / math.sqrt(2)).numpy()
    p = 0.5 * (erfc(a) - erfc(b))
    length = -np.log2(p)
    se = np.std(length) / math.sqrt(_MC)
    self.assertAlmostEqual(np.mean(length), theory.ecdq_conditional_rate(r),
                           delta=6 * se)
    e = r * (q - u) - x
    self.assertLessEqual(np.max(np.abs(e)), r / 2 + 1e-12)
    var = theory.ecdq_vnmse(r)
    # A uniform error on [-r/2, r/2): Var(e) = r²/12, Var(e²) = r⁴/180.
    self.assertAlmostEqual(np.mean(e), 0.0, delta=6 * math.sqrt(var / _MC))
    self.assertAlmostEqual(np.mean(e * e), var,
                           delta=6 * r * r / math.sqrt(180 * _MC))

  def test_lloyd_max_distortions(self):
    self.assertAlmostEqual(theory.gaussian_lloyd_max_distortion(1),
                           1 - 2 / math.pi, places=12)
    # Max (1960) prints 0.3634, 0.1175, 0.03454, 0.009497; the last is
    # 0.0095010 at the optimum (levels 0.1284 .. 2.733, as Max's).
    for bits, d in ((1, 0.3634), (2, 0.1175), (3, 0.03455), (4, 0.009501)):
      self.assertAlmostEqual(theory.gaussian_lloyd_max_distortion(bits), d,
                             delta=d * 2e-4)

  def test_eden_vnmse(self):
    self.assertAlmostEqual(theory.eden_vnmse(1), math.pi / 2 - 1, places=12)
    self.assertAlmostEqual(theory.eden_vnmse(1), 0.5708, places=4)
    self.assertAlmostEqual(theory.eden_vnmse(2), 0.1331, places=4)
    # ECDQ at H(Q|U) = 2 bits has less error than EDEN at 2 bits.
    r = theory.ecdq_step_ratio(2.0)
    self.assertLess(theory.ecdq_vnmse(r), 0.75 * theory.eden_vnmse(2))

  @parameterized.parameters(0, 5, 1.5, True, None)
  def test_lloyd_max_rejects_other_bits(self, bits):
    with self.assertRaisesRegex(ValueError, f"`bits`.*bits={bits!r}"):
      theory.gaussian_lloyd_max_distortion(bits)


if __name__ == "__main__":
  tf.test.main()
