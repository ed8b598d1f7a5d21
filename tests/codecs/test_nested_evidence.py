"""Issue 4's synthetic-correlation evidence for NDQSG, at the codec level.

The model of the paper's Algorithm 2: a sender holds `g_p = g + noise` and the
receiver holds side information `y`, either the clean gradient `g` itself or
the mean of the DQSG decodes of reference senders who hold `g + noise_r`
(the P1 group). `g` is gradient-like: "layers" of whole buckets whose scales
span two and a half decades, each Gaussian or heavy-tailed (Student t, 5
degrees of freedom), so the buckets' max-norms `κ_b` vary by 10x within a
layer and by 1000x across layers. The noise is Gaussian with one `σ` per
layer, set from the layer's smallest `κ_b` so that `max_b σ_b/κ_b` is the
stated ratio: the theory of docs/algorithms.md ("Nested dithered quantization") then applies bucket by
bucket, in units of that bucket's `κ_b`.

Overload is measured against ground truth: with `z = g_p - y` known to the
test, every decode error is `err = (α² - 1)·z + α·ε + α·Δ2·m` with
`|ε| <= Δ1/2` (Δs in the tensor's units) and `m` an integer, so
`m = round((err - (α²-1)z)/(αΔ2))` is exact and an element overloads iff
`m != 0`.

Tolerances are derived, never tuned: for a sum of independent terms, six
standard deviations computed from the distribution the theory predicts
(false-failure probability ~2e-9); for overload counts, which are sums of
independent Bernoullis (less spread than a Poisson of the same mean), the
Poisson quantile at 1e-7 on each side. Seeds are fixed, so the run is
deterministic anyway; the derivation is what makes a failure meaningful.
"""

import functools
import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf import theory

BUCKET = 512
# (buckets, scale) per layer: 2048 buckets; the last layer gets 300 more
# elements, a partial bucket at the end of the tensor.
_LAYERS = ((256, 1.0), (64, 0.05), (1024, 0.3), (128, 2.0), (512, 0.01),
           (64, 0.5))
N = sum(b for b, _ in _LAYERS) * BUCKET + 300  # 1_048_876 >= 2**20
NB = -(-N // BUCKET)
_BUCKET_SIZES = np.full(NB, BUCKET, np.float64)
_BUCKET_SIZES[-1] = N - (NB - 1) * BUCKET

SENDER_SEED = tf.constant([11, 7], tf.int32)
NUM_REFERENCES = 3  # |P1| for the Algorithm 2 side information
TAIL = 1e-7         # one-sided tail of the overload count bounds

# Shared instances: each compiles once for N elements.
NDQSG_33 = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                      alpha=1.0, bucket_size=BUCKET)
DQSG = {m: ndq_tf.DitheredCodec(num_levels=m, bucket_size=BUCKET)
        for m in (1, 3)}
ADAPTIVE = {a: ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                          alpha=a, bucket_size=BUCKET)
            for a in (1.0, "mmse")}


# --- Data --------------------------------------------------------------------


def _per_bucket_max(x):
  pad = np.zeros(NB * BUCKET, np.float64)
  pad[:x.size] = np.abs(x)
  return pad.reshape(NB, BUCKET).max(axis=1)


def _expand(per_bucket):
  """A per-bucket array as a per-element one."""
  return np.repeat(per_bucket, BUCKET)[:N]


@functools.lru_cache(maxsize=None)
def _gradient(kind):
  """Gradient-like float32 vector and each bucket's layer index."""
  rng = np.random.default_rng({"gaussian": 1, "student_t": 2}[kind])
  if kind == "gaussian":
    g = rng.standard_normal(N)
  else:  # unit variance, heavy tails
    g = rng.standard_t(5, N) / math.sqrt(5 / 3)
  layer = np.repeat(np.arange(len(_LAYERS)), [b for b, _ in _LAYERS])
  layer = np.append(layer, len(_LAYERS) - 1)  # the partial last bucket
  g *= _expand(np.array([s for _, s in _LAYERS])[layer])
  return g.astype(np.float32), layer


@functools.lru_cache(maxsize=None)
def _noisy(kind, ratio):
  """`g_p = g + noise`, Gaussian, std `σ_b` per layer, `max σ_b/κ_b <= ratio`.

  `κ_b` is the max-norm of `g_p` (what the sender sends) and depends on the
  noise: `σ` is set from the clean `g`, corrected once from `g_p`, then
  shrunk per layer until the bound holds. For small ratios the max is the
  ratio; a noise-dominated bucket has `κ_b ≈ 3.3σ_b`, so `σ_b/κ_b` stays
  below ~0.4 however large `ratio` is.

  Returns:
    (g, g_p, sigma_b): float32, float32, float64 per bucket.
  """
  g, layer = _gradient(kind)
  rng = np.random.default_rng(1000 + int(ratio * 1e4))
  xi = rng.standard_normal(N)
  kappa = _per_bucket_max(g)
  shrink = np.ones(len(_LAYERS))
  for step in range(12):
    if step < 2:
      layer_min = np.array([kappa[layer == i].min()
                            for i in range(len(_LAYERS))])
    sigma_b = ratio * (shrink * layer_min)[layer]
    g_p = (g + _expand(sigma_b) * xi).astype(np.float32)
    kappa = _per_bucket_max(g_p)
    worst = np.array([np.max((sigma_b / kappa)[layer == i])
                      for i in range(len(_LAYERS))])
    if step >= 1 and np.all(worst <= ratio):
      return g, g_p, sigma_b
    if step >= 1:
      shrink *= np.minimum(1.0, ratio / worst * (1 - 1e-4))
  raise AssertionError("noise construction did not converge")


@functools.lru_cache(maxsize=None)
def _side_information(kind, ratio, side):
  """`y` and the per-bucket std of `z = g_p - y`, in the tensor's units.

  side="clean": `y = g`, `σ_z = σ`.
  side="reference": `y` = mean of NUM_REFERENCES DQSG(num_levels=3) decodes of
  `g + noise_r`; `z = noise - mean_r(noise_r + q_r)`, `q_r` the references'
  uniform DQSG errors of variance `κ_r²Δ²/12`, so
  `σ_z² = σ²(1 + 1/R) + Σ_r κ_r²/(108 R²)`.
  """
  g, _, sigma_b = _noisy(kind, ratio)
  if side == "clean":
    return g, sigma_b
  rng = np.random.default_rng(2000 + int(ratio * 1e4))
  total = np.zeros(N, np.float64)
  var_q = np.zeros(NB, np.float64)
  for r in range(NUM_REFERENCES):
    ref = (g + _expand(sigma_b) * rng.standard_normal(N)).astype(np.float32)
    seed = tf.constant([101 + r, 7], tf.int32)
    payload = DQSG[3].encode(tf.constant(ref), seed)
    total += DQSG[3].decode(payload, seed).numpy().astype(np.float64)
    var_q += payload.scales.numpy().astype(np.float64)**2 / 108.0
  r = NUM_REFERENCES
  sigma_z = np.sqrt(sigma_b**2 * (1 + 1 / r) + var_q / r**2)
  return (total / r).astype(np.float32), sigma_z


# --- Measurements ------------------------------------------------------------


def _nested_round_trip(codec, g_p, y, noise_scale=None):
  """Encodes `g_p`, decodes with `y`: (payload, err, z) in float64."""
  kwargs = {} if noise_scale is None else {"noise_scale": noise_scale}
  payload = codec.encode(tf.constant(g_p), SENDER_SEED, **kwargs)
  g_hat = codec.decode(payload, SENDER_SEED, side_information=tf.constant(y))
  x = g_p.astype(np.float64)
  return payload, g_hat.numpy().astype(np.float64) - x, x - y.astype(
      np.float64)


def _dqsg_round_trip(codec, g_p):
  payload = codec.encode(tf.constant(g_p), SENDER_SEED)
  g_hat = codec.decode(payload, SENDER_SEED).numpy().astype(np.float64)
  return payload, g_hat, g_hat - g_p.astype(np.float64)


def _decompose(err, z, alpha, fine):
  """`err = r + α·Δ2·m`, `r = (α² - 1)z + αε`: returns (r, m, max |ε|/(Δ1/2)).

  Args:
    err, z: per element.
    alpha: α.
    fine: `Δ1` per element, in the tensor's units.
  """
  coarse = 3 * fine
  shifted = err - (alpha**2 - 1) * z  # α(ε - Δ2·m)
  m = np.round(shifted / (alpha * coarse))
  eps = shifted - m * alpha * coarse
  return err - m * alpha * coarse, m, np.max(np.abs(eps) / (alpha * fine / 2))


def _poisson_bounds(lam):
  """[lo, hi] holds a sum of independent Bernoullis of mean `lam` w.p. 1-2·TAIL.

  A Bernoulli sum is less spread than a Poisson of the same mean (it is
  smaller in the convex order), so Poisson quantiles are (approximately)
  conservative.
  """
  if lam > 200:  # Normal approximation, sd <= sqrt(lam); 5.2 sd ~ 1e-7
    half = 5.2 * math.sqrt(lam) + 1
    return lam - half, lam + half
  pmf = math.exp(-lam)
  cdf = pmf
  lo = 0 if cdf > TAIL else None
  c = 0
  while 1.0 - cdf > TAIL:
    c += 1
    pmf *= lam / c
    cdf += pmf
    if lo is None and cdf > TAIL:
      lo = c
  return lo, c


def _expected_overloads(alpha, sigma_z_b, fine_b, coarse_ratio, mask=None):
  """`Σ_b d_b·P_b`, `P_b` from theory.overload_probability per bucket.

  `sigma_z_b`, `fine_b` are given for the buckets of `mask` (default: all).
  """
  sizes = _BUCKET_SIZES if mask is None else _BUCKET_SIZES[mask]
  p = np.array([theory.overload_probability(alpha, s, f, coarse_ratio)
                for s, f in zip(sigma_z_b, fine_b)])
  return float(np.sum(sizes * p)), p


def _dqsg_sum_and_sd(kappa, num_levels):
  """E and sd of `Σ err²` for errors uniform on `κ_b·[-Δ/2, Δ/2]`, `Δ = 1/M`.

  Lemma 3: `E = Σ_b κ_b²·d_b·Δ²/12`; a uniform has `Var(e²) = Δ⁴/180`.
  """
  step = 1.0 / num_levels
  mean = theory.dithered_total_mse(kappa, [int(d) for d in _BUCKET_SIZES],
                                   num_levels)
  sd = math.sqrt(np.sum(kappa**4 * _BUCKET_SIZES) * step**4 / 180)
  return mean, sd


# --- (a) fixed mode: DQSG-7 error at ternary cost -----------------------------


class FixedNestedEvidenceTest(tf.test.TestCase, parameterized.TestCase):
  """NDQSG(num_levels=3, coarse_ratio=3, α=1): Δ1 = 1/3, Δ2 = 1 (units of κ)."""

  @parameterized.product(kind=("gaussian", "student_t"),
                         side=("clean", "reference"))
  def test_mse_is_fine_step_dqsg_at_ternary_bits(self, kind, side):
    ratio = 0.03
    _, g_p, _ = _noisy(kind, ratio)
    y, sigma_z = _side_information(kind, ratio, side)
    payload, err, z = _nested_round_trip(NDQSG_33, g_p, y)
    kappa = payload.scales.numpy().astype(np.float64)
    self.assertAllClose(kappa, _per_bucket_max(g_p), rtol=0, atol=0)

    # Overload: expected count from theory, observed count from ground truth.
    # (For side="reference", z is Gaussian plus uniforms; uniforms are
    # strictly sub-Gaussian, so the Gaussian formula at equal variance
    # overstates the tail.)
    lam, _ = _expected_overloads(1.0, sigma_z / kappa, np.full(NB, 1 / 3), 3)
    self.assertLess(lam, 0.1)  # precondition: overload is negligible
    _, m, eps_max = _decompose(err, z, 1.0, _expand(kappa) / 3)
    self.assertLessEqual(eps_max, 1 + 1e-4)
    overloads = int(np.count_nonzero(m))
    lo, hi = _poisson_bounds(lam)
    self.assertBetween(overloads, lo, hi)

    # MSE: Σ_b κ_b²·d_b·Δ1²/12, the DQSG variance at the fine step. A sum of
    # N independent terms: 6 sd of the sum (relative ~0.6%).
    expected, sd = _dqsg_sum_and_sd(kappa, 3)
    self.assertLessEqual(abs(np.sum(err**2) - expected), 6 * sd)

    # DQSG with the same fine step: same κ_b, same error law, 7 levels.
    dqsg_payload, _, dqsg_err = _dqsg_round_trip(DQSG[3], g_p)
    self.assertAllEqual(dqsg_payload.scales, payload.scales)
    self.assertLessEqual(abs(np.sum(dqsg_err**2) - expected), 6 * sd)

    # Bits: 20 ternary codes per word (1.6), 11 seven-level codes per word
    # (2.909), plus 32/512 bits of scale per element.
    nested_bits = theory.bits_per_element(NDQSG_33, N)
    dqsg_bits = theory.bits_per_element(DQSG[3], N)
    self.assertAllClose([nested_bits, dqsg_bits],
                        [32 / 20 + 32 / 512, 32 / 11 + 32 / 512], atol=2e-4)
    self.assertLess(nested_bits, 0.6 * dqsg_bits)
    self.assertLess(nested_bits, math.log2(3) + 0.1)
    self.assertGreater(dqsg_bits, math.log2(7))

  @parameterized.parameters((0.15, False), (0.2, True), (0.3, True))
  def test_overload_count_matches_theory_and_bites(self, ratio, bites):
    # Noise grows: |z + e| reaches Δ2/2 = κ/2 and decodes jump by ±κ.
    kind = "student_t"
    _, g_p, _ = _noisy(kind, ratio)
    y, sigma_z = _side_information(kind, ratio, "clean")
    payload, err, z = _nested_round_trip(NDQSG_33, g_p, y)
    kappa = payload.scales.numpy().astype(np.float64)
    lam, _ = _expected_overloads(1.0, sigma_z / kappa, np.full(NB, 1 / 3), 3)
    self.assertGreater(lam, 100)
    r, m, eps_max = _decompose(err, z, 1.0, _expand(kappa) / 3)
    self.assertLessEqual(eps_max, 1 + 1e-4)
    overloads = int(np.count_nonzero(m))
    lo, hi = _poisson_bounds(lam)
    self.assertBetween(overloads, lo, hi)
    # Without the jumps the error is still the fine-step DQSG error...
    expected, sd = _dqsg_sum_and_sd(kappa, 3)
    self.assertLessEqual(abs(np.sum(r**2) - expected), 6 * sd)
    # ...but each jump costs ~κ² (vs κ²/108 per element): measured here,
    # +0.9% MSE at max σ/κ = 0.15, +13% at 0.2, +160% at 0.3.
    if bites:
      self.assertGreater(np.sum(err**2), expected + 6 * sd)
    self.assertAllClose(np.sum(err**2) - np.sum(r**2),
                        np.sum(_expand(kappa)**2 * m**2
                               + 2 * _expand(kappa) * m * r), rtol=1e-6)


# --- (b) the ternary budget ---------------------------------------------------


class TernaryBudgetTest(tf.test.TestCase, parameterized.TestCase):
  """At log2(3)-ish bits, NDQSG(3, 3) against DQSG ternary (num_levels=1)."""

  @parameterized.product(ratio=(0.01, 0.03, 0.1),
                         side=("clean", "reference"))
  def test_nested_mse_at_least_3x_lower_when_noise_below_tenth_of_max(
      self, ratio, side):
    kind = "student_t"
    _, g_p, sigma_b = _noisy(kind, ratio)
    y, _ = _side_information(kind, ratio, side)
    kappa = _per_bucket_max(g_p)
    self.assertLessEqual(np.max(sigma_b / kappa), 0.1 * (1 + 1e-9))
    self.assertEqual(NDQSG_33.wire_bits(N), DQSG[1].wire_bits(N))

    _, err, _ = _nested_round_trip(NDQSG_33, g_p, y)
    _, _, dqsg_err = _dqsg_round_trip(DQSG[1], g_p)
    expected, sd = _dqsg_sum_and_sd(kappa, 1)
    self.assertLessEqual(abs(np.sum(dqsg_err**2) - expected), 6 * sd)
    # Theory says 9x without overload (Δ1² = 1/9 vs 1); the issue asks for 3x.
    # At ratio 0.1 with reference side information σ_z/κ reaches ~0.13 and
    # overload costs part of the gain, never two thirds of it.
    self.assertGreaterEqual(np.sum(dqsg_err**2) / np.sum(err**2), 3.0)


# --- (c) adaptive mode --------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _poor_side_information(kind, ratio, quality):
  """`y = g + η`, η Gaussian with std `τ_b = quality·min κ(g)` per layer.

  A receiver whose estimate of `g` is worse than the sender's own noise:
  `σ_z² = σ_b² + τ_b²` can then exceed `κ_b/3`, which the sender's noise
  alone cannot (see `_noisy`).
  """
  g, layer = _gradient(kind)
  _, _, sigma_b = _noisy(kind, ratio)
  kappa = _per_bucket_max(g)
  layer_min = np.array([kappa[layer == i].min() for i in range(len(_LAYERS))])
  tau_b = quality * layer_min[layer]
  rng = np.random.default_rng(3000 + int(quality * 100))
  y = (g + _expand(tau_b) * rng.standard_normal(N)).astype(np.float32)
  return y, np.sqrt(sigma_b**2 + tau_b**2)


def _adaptive(alpha, ratio, quality=None, kind="student_t"):
  """Adaptive round trip, noise_scale = the true std of z per bucket.

  `y = g` (quality None) or `_poor_side_information(kind, ratio, quality)`.
  """
  codec = ADAPTIVE[alpha]
  _, g_p, _ = _noisy(kind, ratio)
  if quality is None:
    y, sigma_z = _side_information(kind, ratio, "clean")
  else:
    y, sigma_z = _poor_side_information(kind, ratio, quality)
  payload, err, z = _nested_round_trip(
      codec, g_p, y, noise_scale=tf.constant(sigma_z, tf.float32))
  scales = payload.scales.numpy().astype(np.float64)
  return codec, g_p, y, sigma_z, payload, scales, err, z


def _auto_mse_sum_and_sd(alpha, sigma_b, target, mask=None):
  """E and sd of `Σ r²`, `r = (α²-1)z + αε`, Δ1 = auto_nested_fine_step.

  `E[r²] = σ²·auto_nested_mse_factor`; with `A = (1-α²)²σ²` and
  `B = α²Δ1²/12`, `Var(r²) = 2A² + 4AB + (4/5)B²` (Gaussian plus uniform).
  """
  mask = np.ones(NB, bool) if mask is None else mask
  d = _BUCKET_SIZES[mask]
  s = sigma_b[mask]
  fine = np.array([theory.auto_nested_fine_step(v, 3, target, alpha)
                   for v in s])
  a = (1 - alpha**2)**2 * s**2
  b = alpha**2 * fine**2 / 12
  mean = np.sum(d * s**2) * theory.auto_nested_mse_factor(3, target, alpha)
  sd = math.sqrt(np.sum(d * (2 * a * a + 4 * a * b + 0.8 * b * b)))
  return mean, sd


class AdaptiveEvidenceTest(tf.test.TestCase, parameterized.TestCase):
  """`encode(g_p, seed, noise_scale=σ)`, σ the true std of z = g_p - y."""

  RATIO = 0.1  # max σ/κ_b: below the fallback threshold 0.309 (α=1)

  @parameterized.parameters(1.0, "mmse")
  def test_overload_rate_below_target_and_mse_is_auto_factor(self, alpha):
    codec, _, _, sigma_b, _, scales, err, z = _adaptive(alpha, self.RATIO)
    a = codec.adaptive_alpha
    target = codec.overload_target
    self.assertTrue(np.all(scales > 0))  # every bucket nested
    fine = scales / codec.num_levels
    expected_fine = np.array([theory.auto_nested_fine_step(s, 3, target, a)
                              for s in sigma_b])
    self.assertAllClose(fine, expected_fine, rtol=4 * 2**-24, atol=0)

    # Overload rate: theory's, which the step was solved to put at the
    # design target 1e-4 (up to the float32 rounding of the wire scale);
    # the count stays within binomial tolerance of N·target.
    r, m, eps_max = _decompose(err, z, a, _expand(fine))
    self.assertLessEqual(eps_max, 1 + 1e-4)
    overloads = int(np.count_nonzero(m))
    lam, p = _expected_overloads(a, sigma_b, fine, 3)
    lo, hi = _poisson_bounds(lam)
    self.assertBetween(overloads, lo, hi)
    self.assertAllClose(p, np.full_like(p, target), rtol=1e-4, atol=0)
    self.assertLessEqual(overloads,
                         N * target + 6 * math.sqrt(N * target * (1 - target)))

    # MSE: Σ_b d_b·σ_b²·auto_nested_mse_factor(3, target, α), 6 sd; the
    # overloads add λ·(αΔ2)²-ish, ~0.1% here: allowed on top for the total.
    mean, sd = _auto_mse_sum_and_sd(a, sigma_b, target)
    self.assertLessEqual(abs(np.sum(r**2) - mean), 6 * sd)
    jump = np.sum(_BUCKET_SIZES * p * (a * 3 * fine)**2) * 3  # generous
    self.assertLessEqual(abs(np.sum(err**2) - mean), 6 * sd + jump)

  def test_mmse_alpha_beats_alpha_one(self):
    results = {}
    for alpha in (1.0, "mmse"):
      codec, _, _, sigma_b, _, _, err, _ = _adaptive(alpha, self.RATIO)
      results[alpha] = (np.sum(err**2),
                        _auto_mse_sum_and_sd(codec.adaptive_alpha, sigma_b,
                                             codec.overload_target)[1])
    # Factors 0.466 vs 0.873 (theory.auto_nested_mse_factor): 0.53 times.
    self.assertLess(results["mmse"][0] + 6 * (results["mmse"][1]
                                              + results[1.0][1]),
                    results[1.0][0])
    self.assertLess(results["mmse"][0], 0.6 * results[1.0][0])

  @parameterized.parameters((1.0, 0.6), ("mmse", 0.8))
  def test_falls_back_to_dqsg_ternary_where_noise_is_large(self, alpha,
                                                          quality):
    # Nested pays iff σ_z²·factor < κ_b²/12 (DQSG ternary's MSE), i.e.
    # σ_z/κ_b < 0.309 (α=1) or 0.423 (MMSE α). A poor y (τ = quality·min κ
    # per layer, κ_b spread 10x within a layer) puts buckets on both sides.
    codec, g_p, y, sigma_z, payload, scales, err, z = _adaptive(
        alpha, self.RATIO, quality=quality)
    a = codec.adaptive_alpha
    target = codec.overload_target
    kappa = _per_bucket_max(g_p)
    nested_mse = sigma_z**2 * theory.auto_nested_mse_factor(3, target, a)
    dqsg_mse = kappa**2 / 12
    predicted = nested_mse < dqsg_mse
    clear = np.abs(nested_mse / dqsg_mse - 1) > 1e-5  # float32 ties aside
    self.assertAllEqual((scales > 0)[clear], predicted[clear])
    fallback = scales < 0
    self.assertGreater(np.sum(fallback), 100)
    self.assertGreater(np.sum(~fallback), 100)
    self.assertAllEqual(-scales[fallback], kappa[fallback])

    # Fallback buckets are DQSG ternary, bit for bit, and ignore y.
    _, dqsg_hat, dqsg_err = _dqsg_round_trip(DQSG[1], g_p)
    fb = _expand(fallback)
    self.assertAllEqual(err[fb], dqsg_err[fb])
    no_side = codec.decode(payload, SENDER_SEED,
                           side_information=tf.zeros([N])).numpy()
    self.assertAllEqual(no_side[fb], dqsg_hat[fb].astype(np.float32))

    # MSE per part: κ_b²d_b/12 on fallback buckets (uniform errors:
    # Var(e²) = κ⁴/180), σ_z²·factor on the others; the total is below
    # both pure codecs' expectations, bucket by bucket.
    fb_mean = np.sum(_BUCKET_SIZES[fallback] * dqsg_mse[fallback])
    fb_sd = math.sqrt(np.sum(_BUCKET_SIZES[fallback]
                             * kappa[fallback]**4) / 180)
    self.assertLessEqual(abs(np.sum(err[fb]**2) - fb_mean), 6 * fb_sd)
    fine = np.where(fallback, 1.0, scales / codec.num_levels)
    r, m, _ = _decompose(err, z, a, _expand(fine))
    mean, sd = _auto_mse_sum_and_sd(a, sigma_z, target, ~fallback)
    self.assertLessEqual(abs(np.sum(r[~fb]**2) - mean), 6 * sd)
    lam, _ = _expected_overloads(a, sigma_z[~fallback],
                                 scales[~fallback] / codec.num_levels, 3,
                                 ~fallback)
    lo, hi = _poisson_bounds(lam)
    self.assertBetween(int(np.count_nonzero(m[~fb])), lo, hi)

  @parameterized.parameters(1.0, "mmse")
  def test_every_bucket_falls_back_when_side_information_is_useless(
      self, alpha):
    # τ = 10·min κ per layer: σ_z/κ_b >= ~1 everywhere.
    codec, g_p, _, _, _, scales, err, _ = _adaptive(alpha, self.RATIO,
                                                    quality=10.0)
    self.assertTrue(np.all(scales < 0))
    _, _, dqsg_err = _dqsg_round_trip(DQSG[1], g_p)
    self.assertAllEqual(err, dqsg_err)
    expected, sd = _dqsg_sum_and_sd(-scales, 1)
    self.assertLessEqual(abs(np.sum(err**2) - expected), 6 * sd)
    del codec

  def test_unknown_noise_scale_falls_back_everywhere(self):
    # σ = 0 or not finite (e.g. the first step): DQSG ternary.
    _, g_p, _ = _noisy("student_t", self.RATIO)
    g, _ = _side_information("student_t", self.RATIO, "clean")
    _, _, dqsg_err = _dqsg_round_trip(DQSG[1], g_p)
    for sigma in (0.0, math.inf, math.nan):
      payload, err, _ = _nested_round_trip(ADAPTIVE[1.0], g_p, g,
                                           noise_scale=sigma)
      self.assertTrue(np.all(payload.scales.numpy() < 0), msg=str(sigma))
      self.assertAllEqual(err, dqsg_err, msg=str(sigma))


if __name__ == "__main__":
  tf.test.main()
