"""Statistics of the codecs against the formulas of docs/algorithms.md / theory.

Every tolerance is derived, not tuned: for a mean of n i.i.d. terms it is six
standard errors computed from the distribution the theory predicts (a false
failure has probability ~2e-9), or the spec's explicit 3% where it gives one.
Seeds are fixed, so the tests are deterministic anyway; the derivation is
what makes a failure meaningful.

Signals are built with one element per bucket equal to 1.0 and the others
inside (-1, 1), so that every bucket's max-norm is exactly 1 and the
normalized units of the theory are the units of the tensor.
"""

import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf import theory

SEED = tf.constant([2024, 7], tf.int32)
BUCKET = 512
# >= 2**20 elements, and a multiple of neither the bucket nor 20 codes/word.
N_BIG = 1_048_583

# Shared instances: each compiles once per tensor size.
DQSG = {m: ndq_tf.DitheredCodec(num_levels=m, bucket_size=BUCKET)
        for m in (1, 3)}


def _num_buckets(n):
  return -(-n // BUCKET)


def _unit_scale(x):
  """Sets the first element of every bucket to 1.0: each bucket's κ is 1."""
  x = np.array(x, np.float32)
  x[::BUCKET] = 1.0
  return x


def _round_trip(codec, x, y=None):
  payload = codec.encode(tf.constant(x), SEED)
  if codec.needs_side_information:
    x_hat = codec.decode(payload, SEED, side_information=tf.constant(y))
  else:
    x_hat = codec.decode(payload, SEED)
  return payload, x_hat.numpy().astype(np.float64)


def _level_signal(levels, buckets_per_level):
  """Buckets of constant value (one bucket element at 1.0, for κ = 1).

  Returns the signal and, per level, a mask of the elements at that level.
  """
  per_level = buckets_per_level * BUCKET
  x = np.repeat(np.asarray(levels, np.float32), per_level)
  x = _unit_scale(x)
  not_first = np.arange(x.size) % BUCKET != 0
  masks = [(np.arange(x.size) // per_level == i) & not_first
           for i in range(len(levels))]
  return x, masks


class DitheredStatisticsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(1, 3)
  def test_error_variance_within_3_percent_of_formula(self, num_levels):
    codec = DQSG[num_levels]
    rng = np.random.default_rng(num_levels)
    nb = _num_buckets(N_BIG)
    # Bucket scales spread over two decades, so that the κ_b² weighting of
    # Lemma 3 matters.
    spread = np.repeat(10.0**rng.uniform(-1, 1, nb), BUCKET)[:N_BIG]
    g = (rng.standard_normal(N_BIG) * spread).astype(np.float32)
    payload, g_hat = _round_trip(codec, g)
    err = g_hat - g.astype(np.float64)
    kappa = payload.scales.numpy().astype(np.float64)
    sizes = [BUCKET] * (nb - 1) + [N_BIG - BUCKET * (nb - 1)]
    expected = theory.dithered_total_mse(kappa, sizes, num_levels)
    measured = float(np.sum(err**2))
    # err_i = κ_b e_i with e_i i.i.d. uniform on [-Δ/2, Δ/2]:
    # Var(e²) = (4/5) E[e²]², so Var(Σ err²) = (4/5)(Δ²/12)² Σ_b κ_b⁴ d_b.
    d = np.asarray(sizes, np.float64)
    rel_se = math.sqrt(0.8 * np.sum(kappa**4 * d)) / np.sum(kappa**2 * d)
    self.assertLess(6 * rel_se, 0.03)  # the 3% bound has power
    self.assertLessEqual(abs(measured / expected - 1), 0.03)
    self.assertLessEqual(abs(measured / expected - 1), 6 * rel_se)

  @parameterized.parameters(1, 3)
  def test_error_is_uncorrelated_with_signal_and_flat_across_its_range(
      self, num_levels):
    codec = DQSG[num_levels]
    rng = np.random.default_rng(10 + num_levels)
    nb = _num_buckets(N_BIG)
    kappa_true = np.repeat(10.0**rng.uniform(-1, 1, nb), BUCKET)[:N_BIG]
    g = (rng.uniform(-1, 1, N_BIG) * kappa_true).astype(np.float32)
    payload, g_hat = _round_trip(codec, g)
    kappa = np.repeat(payload.scales.numpy().astype(np.float64),
                      BUCKET)[:N_BIG]
    x = g.astype(np.float64) / kappa          # normalized signal in [-1, 1]
    e = (g_hat - g.astype(np.float64)) / kappa  # normalized error
    var = theory.dithered_variance(num_levels)  # Δ²/12
    # Sample correlation of independent variables: standard error 1/sqrt(n).
    self.assertLess(abs(np.corrcoef(x, e)[0, 1]), 6 / math.sqrt(N_BIG))
    self.assertLess(abs(np.corrcoef(x * x, e * e)[0, 1]),
                    6 / math.sqrt(N_BIG))
    # Per bin of the signal: E[e²] = Δ²/12 with relative standard error
    # sqrt((4/5)/n_bin), and E[e] = 0 with standard error sqrt(Δ²/12/n_bin).
    bins = np.clip(((x + 1) / 2 * 16).astype(np.int64), 0, 15)
    for b in range(16):
      e_bin = e[bins == b]
      n_bin = e_bin.size
      self.assertGreater(n_bin, 10_000)
      self.assertLessEqual(abs(np.mean(e_bin**2) / var - 1),
                           6 * math.sqrt(0.8 / n_bin), msg=f"bin {b}")
      self.assertLessEqual(abs(np.mean(e_bin)), 6 * math.sqrt(var / n_bin),
                           msg=f"bin {b}")
    # And the error never exceeds half a step.
    self.assertLessEqual(np.max(np.abs(e)),
                         0.5 / num_levels * (1 + 2.0**-20))


# --- Unbiasedness ----------------------------------------------------------

_LEVELS = [-0.77, -0.31, 0.0, 0.125, 0.5, 0.9]
_BUCKETS_PER_LEVEL = 64

# name -> (codec, Δ, c): per-element error variance at most c·(κΔ)².
_UNBIASED = {
    "dqsg_m1": (ndq_tf.DitheredCodec(1, BUCKET), 1.0, 1 / 12),
    "dqsg_m3": (ndq_tf.DitheredCodec(3, BUCKET), 1 / 3, 1 / 12),
    # Stochastic rounding: two outcomes a step apart, variance Δ²p(1-p).
    "half_order1": (ndq_tf.HalfDitheredCodec(1, BUCKET, 1), 1.0, 1 / 4),
    "half_order2": (ndq_tf.HalfDitheredCodec(1, BUCKET, 2), 1.0, 3 / 12),
    "half_order3": (ndq_tf.HalfDitheredCodec(2, BUCKET, 3), 1 / 2, 4 / 12),
    "qsgd": (ndq_tf.QSGDCodec(2, BUCKET), 1 / 2, 1 / 4),
    "terngrad": (ndq_tf.TernGradCodec(BUCKET), 1.0, 1 / 4),
    # α = 1 and no overload: the error is α·e, e uniform on [-Δ1/2, Δ1/2].
    "ndqsg_alpha1": (ndq_tf.NestedDitheredCodec(3, 3, 1.0, BUCKET), 1 / 3,
                     1 / 12),
}


class UnbiasednessTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*[(name,) for name in _UNBIASED])
  def test_rounding_is_unbiased(self, name):
    codec, step, c = _UNBIASED[name]
    x, masks = _level_signal(_LEVELS, _BUCKETS_PER_LEVEL)
    y = None
    if codec.needs_side_information:
      # |z| would need 1/3 - 1/6 = 1/6 = 6.7σ to overload.
      z = np.random.default_rng(5).normal(0, 0.025, x.size)
      y = (x - z).astype(np.float32)
    payload, x_hat = _round_trip(codec, x, y)
    kappa = np.repeat(payload.scales.numpy().astype(np.float64),
                      BUCKET)[:x.size]
    err = x_hat - x.astype(np.float64)
    for level, mask in zip(_LEVELS, masks):
      n = int(mask.sum())
      # Standard error of a mean of independent errors with variances at
      # most c·(κΔ)² each.
      se = math.sqrt(np.sum(c * (kappa[mask] * step)**2)) / n
      self.assertLessEqual(abs(np.mean(err[mask])), 6 * se,
                           msg=f"level {level}")


# --- Half-dithered variance --------------------------------------------------

_HALF_LEVELS = [-1.0, -0.8, -0.31, 0.0, 0.125, 0.5, 0.77, 1.0]
_HALF_BUCKETS_PER_LEVEL = 128


class HalfDitheredStatisticsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters((1, 2), (2, 3))
  def test_variance_is_order_plus_one_steps_squared_over_12_at_every_level(
      self, num_levels, dither_order):
    codec = ndq_tf.HalfDitheredCodec(num_levels, BUCKET, dither_order)
    x, masks = _level_signal(_HALF_LEVELS, _HALF_BUCKETS_PER_LEVEL)
    _, x_hat = _round_trip(codec, x)
    err = x_hat - x.astype(np.float64)
    step = 1.0 / num_levels
    var = theory.half_dithered_variance(num_levels, dither_order)
    self.assertAlmostEqual(var, (dither_order + 1) * step**2 / 12)
    # |ε| <= |u| + Δ/2 <= (m + 1)Δ/2, so E[ε⁴] <= ((m+1)Δ/2)² E[ε²] and
    # Var(ε²)/E[ε²]² <= ((m+1)Δ/2)²/var - 1 = 3(m + 1) - 1.
    rel_var = 3 * (dither_order + 1) - 1
    for level, mask in zip(_HALF_LEVELS, masks):
      e = err[mask]
      n = e.size
      self.assertLessEqual(abs(np.mean(e**2) / var - 1),
                           6 * math.sqrt(rel_var / n), msg=f"level {level}")
      self.assertLessEqual(abs(np.mean(e)), 6 * math.sqrt(var / n),
                           msg=f"level {level}")
      self.assertLessEqual(np.max(np.abs(e)),
                           (dither_order + 1) * step / 2 + 1e-6)

  def test_order_one_is_stochastic_rounding_with_signal_dependent_variance(
      self):
    codec = ndq_tf.HalfDitheredCodec(1, BUCKET, 1)
    x, masks = _level_signal(_HALF_LEVELS, _HALF_BUCKETS_PER_LEVEL)
    _, x_hat = _round_trip(codec, x)
    err = x_hat - x.astype(np.float64)
    for level, mask in zip(_HALF_LEVELS, masks):
      e = err[mask]
      level32 = float(np.float32(level))
      var = theory.half_dithered_variance(1, 1, x=level32)
      # ε is Δp w.p. 1-p and -Δ(1-p) w.p. p: Var(ε²) = Δ⁴p(1-p)(1-2p)².
      p = level32 - math.floor(level32)
      sd = math.sqrt(p * (1 - p) * (1 - 2 * p)**2 / e.size)
      self.assertLessEqual(abs(np.mean(e**2) - var), 6 * sd + 1e-12,
                           msg=f"level {level}")


# --- Nested quantization -----------------------------------------------------

_FINE_LEVELS = 4          # Δ1 = 1/4
_FINE = 1.0 / _FINE_LEVELS
_SIGMA_Z = _FINE / 2      # σ_z² = Δ1²/4 > Δ1²/12, so α² = 1 - Δ1²/(12σ_z²) > 0
_WIDE_RATIO = 9           # overload needs |z| > 4Δ1 = 8σ_z: never, in 2**20


def _equal_mse_alpha(sigma_z, fine):
  return math.sqrt(1 - fine**2 / (12 * sigma_z**2))


_NESTED_ALPHAS = {
    "alpha_one": 1.0,
    "alpha_equal_mse": _equal_mse_alpha(_SIGMA_Z, _FINE),
    "alpha_mmse": theory.mmse_alpha(_SIGMA_Z, _FINE),
}
_NESTED = {name: ndq_tf.NestedDitheredCodec(_FINE_LEVELS, _WIDE_RATIO, alpha,
                                            BUCKET)
           for name, alpha in _NESTED_ALPHAS.items()}


def _nested_errors(codec, sigma_z, seed):
  """Normalized decode errors and z for x in (-0.9, 0.9), y = x - z."""
  rng = np.random.default_rng(seed)
  x = _unit_scale(rng.uniform(-0.9, 0.9, N_BIG))
  y = (x - rng.normal(0, sigma_z, N_BIG)).astype(np.float32)
  z = x.astype(np.float64) - y.astype(np.float64)
  _, x_hat = _round_trip(codec, x, y)
  return x_hat - x.astype(np.float64), z


def _nested_mse_se(alpha, sigma_z, fine, n):
  # err = (α² - 1) z + α e, z Gaussian and e uniform, independent:
  # with A = (1-α²)²σ_z², B = α²Δ1²/12, E[err⁴] = 3A² + 6AB + (9/5)B², so
  # Var(err²) = 2A² + 4AB + (4/5)B².
  a = (1 - alpha**2)**2 * sigma_z**2
  b = alpha**2 * fine**2 / 12
  return math.sqrt((2 * a * a + 4 * a * b + 0.8 * b * b) / n)


class NestedStatisticsTest(tf.test.TestCase, parameterized.TestCase):

  def _measure(self, name):
    codec = _NESTED[name]
    alpha = codec.alpha
    # Precondition: overload is negligible over the whole tensor.
    self.assertLess(
        N_BIG * theory.overload_probability(alpha, _SIGMA_Z, _FINE,
                                            _WIDE_RATIO), 1e-3)
    err, _ = _nested_errors(codec, _SIGMA_Z, seed=3)
    mse = float(np.mean(err**2))
    return alpha, mse, _nested_mse_se(alpha, _SIGMA_Z, _FINE, N_BIG)

  @parameterized.parameters("alpha_one", "alpha_equal_mse")
  def test_mse_equals_dithered_variance_at_fine_step(self, name):
    alpha, mse, se = self._measure(name)
    d = theory.uniform_error_variance(_FINE)  # Δ1²/12
    self.assertAlmostEqual(theory.nested_mse(alpha, _SIGMA_Z, _FINE), d,
                           delta=1e-15)
    self.assertLessEqual(abs(mse - d), 6 * se)

  def test_mse_at_mmse_alpha_matches_theory_and_is_lower(self):
    alpha, mse, se = self._measure("alpha_mmse")
    self.assertAlmostEqual(alpha**2, 1 - _FINE**2 / (24 * _SIGMA_Z**2))
    self.assertLessEqual(abs(mse - theory.mmse_nested_mse(_SIGMA_Z, _FINE)),
                         6 * se)
    for other in ("alpha_one", "alpha_equal_mse"):
      _, other_mse, other_se = self._measure(other)
      # D²/(4σ_z²) = D/12 lower here: far more than the noise of both.
      self.assertLess(mse + 6 * (se + other_se), other_mse, msg=other)

  @parameterized.parameters((1.0, 3, 3), (0.8, 4, 4))
  def test_overload_rate_matches_theory(self, alpha, fine_levels,
                                        coarse_ratio):
    fine = 1.0 / fine_levels
    coarse = coarse_ratio * fine
    target = 1e-2

    def rate(sigma):
      return theory.overload_probability(alpha, sigma, fine, coarse_ratio)

    # σ_z with a 1% overload rate (the rate increases with σ_z): bisection.
    lo, hi = 1e-3, 10.0
    for _ in range(100):
      mid = (lo + hi) / 2
      lo, hi = (mid, hi) if rate(mid) < target else (lo, mid)
    sigma_z = (lo + hi) / 2
    p = rate(sigma_z)
    self.assertAlmostEqual(p, target, delta=1e-6)

    codec = ndq_tf.NestedDitheredCodec(fine_levels, coarse_ratio, alpha,
                                       BUCKET)
    err, z = _nested_errors(codec, sigma_z, seed=4)
    # err = (α² - 1) z + α(e - jΔ2), |e| <= Δ1/2: j = 0 unless overloaded,
    # and otherwise the result is off by exactly j·α·Δ2 (α·κ·Δ2, κ = 1).
    shifted = err - (alpha**2 - 1) * z
    j = np.round(shifted / (alpha * coarse))
    residual = shifted - j * alpha * coarse
    self.assertLessEqual(np.max(np.abs(residual)), alpha * fine / 2 + 1e-5)
    overloads = int(np.count_nonzero(j))
    # Binomial(n, p): six standard deviations.
    sd = math.sqrt(N_BIG * p * (1 - p))
    self.assertLessEqual(abs(overloads - N_BIG * p), 6 * sd,
                         msg=f"{overloads} overloads, expected {N_BIG * p:.0f}")


class AdaptiveNestedStatisticsTest(tf.test.TestCase, parameterized.TestCase):
  """Adaptive mode: Δ1 = r·σ from the receivers' σ per bucket, with r such
  that a Gaussian residual overloads with probability `overload_target`."""

  SIGMA = 0.02  # σ_z in the tensor's units; κ = 1, so nested always pays

  def _run(self, alpha, overload_target, seed):
    codec = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                       alpha=alpha, bucket_size=BUCKET,
                                       overload_target=overload_target)
    rng = np.random.default_rng(seed)
    x = _unit_scale(rng.uniform(-0.9, 0.9, N_BIG))
    y = (x - rng.normal(0, self.SIGMA, N_BIG)).astype(np.float32)
    z = x.astype(np.float64) - y.astype(np.float64)
    payload = codec.encode(tf.constant(x), SEED, noise_scale=self.SIGMA)
    x_hat = codec.decode(payload, SEED, side_information=tf.constant(y))
    err = x_hat.numpy().astype(np.float64) - x.astype(np.float64)
    scales = payload.scales.numpy().astype(np.float64)
    self.assertTrue(np.all(scales > 0))  # every bucket nested
    fine = scales / codec.num_levels  # Δ1 as the receivers see it
    self.assertAllClose(
        fine, np.full_like(fine, theory.auto_nested_fine_step(
            self.SIGMA, 3, overload_target, codec.adaptive_alpha)),
        rtol=2**-23, atol=0)
    return codec.adaptive_alpha, float(fine[0]), err, z

  @parameterized.parameters("mmse", 1.0)
  def test_mse_matches_theory(self, alpha):
    # A tiny overload target, so that overload adds nothing measurable: one
    # overload adds (αΔ2)²/n ≈ 200σ²/n to the MSE, about a quarter of its
    # standard error, and fewer than 0.1 are expected.
    target = 1e-8
    alpha, fine, err, _ = self._run(alpha, target, seed=6)
    p = theory.overload_probability(alpha, self.SIGMA, fine, 3)
    self.assertLess(N_BIG * p, 0.1)
    # The MSE at the step actually used (Δ1 went through a float32 scale,
    # a relative change of 2**-24: it moves the formula by ~1e-7).
    expected = theory.nested_mse(alpha, self.SIGMA, fine)
    self.assertAllClose(
        expected,
        self.SIGMA**2 * theory.auto_nested_mse_factor(3, target, alpha),
        rtol=1e-6, atol=0)
    se = _nested_mse_se(alpha, self.SIGMA, fine, N_BIG)
    self.assertLessEqual(abs(np.mean(err**2) - expected), 6 * se)

  def test_mmse_alpha_beats_alpha_one(self):
    target = 1e-8
    a_mmse, fine_mmse, err_mmse, _ = self._run("mmse", target, seed=6)
    a_one, fine_one, err_one, _ = self._run(1.0, target, seed=6)
    se = (_nested_mse_se(a_mmse, self.SIGMA, fine_mmse, N_BIG) +
          _nested_mse_se(a_one, self.SIGMA, fine_one, N_BIG))
    self.assertLess(np.mean(err_mmse**2) + 6 * se, np.mean(err_one**2))

  @parameterized.parameters("mmse", 1.0)
  def test_overload_rate_matches_theory_and_target(self, alpha):
    target = 1e-2
    alpha, fine, err, z = self._run(alpha, target, seed=8)
    coarse = 3 * fine
    shifted = err - (alpha**2 - 1) * z
    j = np.round(shifted / (alpha * coarse))
    residual = shifted - j * alpha * coarse
    self.assertLessEqual(np.max(np.abs(residual)),
                         alpha * fine / 2 * (1 + 1e-4) + 1e-6)
    overloads = int(np.count_nonzero(j))
    p = theory.overload_probability(alpha, self.SIGMA, fine, 3)
    sd = math.sqrt(N_BIG * p * (1 - p))
    self.assertLessEqual(abs(overloads - N_BIG * p), 6 * sd,
                         msg=f"{overloads} overloads, expected {N_BIG * p:.0f}")
    # The design point: P(overload) = overload_target, up to the float32
    # rounding of the step on the wire (relative 2**-24 of Δ1).
    self.assertAllClose(p, target, rtol=1e-4, atol=0)


if __name__ == "__main__":
  tf.test.main()
