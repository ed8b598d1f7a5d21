"""Closed-form error, rate and overload formulas of the codecs.

All quantities are per element and, unless said otherwise, in max-normalized
units (a bucket's values divided by its max-norm `κ`); multiply by `κ²` for
the variance of the gradient itself. Plain Python (`math`), usable in tests,
benchmarks and to pick parameters.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019.
  docs/algorithms.md of this project writes the equations out (sections
  #dqsg-subtractive-dither, #half-dithered-quantization and
  #nested-dithered-quantization-ndqsg).
"""

import math

__all__ = [
    "uniform_error_variance",
    "dithered_variance",
    "dithered_total_mse",
    "variance_factor",
    "half_dithered_variance",
    "nested_mse",
    "mmse_alpha",
    "mmse_nested_mse",
    "overload_probability",
    "overload_bound",
    "bits_per_element",
    "gaussian_tail_quantile",
    "auto_nested_alpha",
    "auto_nested_mse_factor",
    "auto_nested_fine_step",
    "auto_nested_step_ratio",
]


def uniform_error_variance(step):
  """`Δ²/12`: the variance of an error uniform on `[-Δ/2, Δ/2]`."""
  return step * step / 12.0


def dithered_variance(num_levels):
  """DQSG error variance per normalized element, `Δ²/12` with `Δ = 1/M`."""
  return uniform_error_variance(1.0 / num_levels)


def dithered_total_mse(scales, bucket_sizes, num_levels):
  """`E‖g̃ - g‖² = Σ_b κ_b²·d_b·Δ²/12` (Lemma 3).

  Args:
    scales: iterable of the buckets' max-norms `κ_b`.
    bucket_sizes: iterable of the buckets' sizes `d_b` (or one int for all).
    num_levels: `M`.
  """
  scales = list(scales)
  if isinstance(bucket_sizes, int):
    bucket_sizes = [bucket_sizes] * len(scales)
  d2 = dithered_variance(num_levels)
  return sum(k * k * d * d2 for k, d in zip(scales, bucket_sizes))


def variance_factor(bucket_size, num_levels):
  """`1 + d·Δ²/12`: the bound `E‖g̃‖² <= (1 + dΔ²/12)·‖g‖²`."""
  return 1.0 + bucket_size * dithered_variance(num_levels)


def half_dithered_variance(num_levels, dither_order, x=None):
  """Error variance of half-dithered quantization per normalized element.

  For `dither_order m >= 2`: `(m + 1)·Δ²/12`, independent of the signal. For
  `m = 1` (stochastic rounding) it depends on the signal: pass `x` (in
  normalized units) to get `Δ²·p(1 - p)`, `p` the fractional part of `x/Δ`.
  """
  step = 1.0 / num_levels
  if dither_order >= 2:
    return (dither_order + 1) * uniform_error_variance(step)
  if x is None:
    raise ValueError(
        "For `dither_order=1` the variance depends on the signal: pass `x`. "
        "Received: x=None.")
  p = x / step - math.floor(x / step)
  return step * step * p * (1.0 - p)


def nested_mse(alpha, sigma_z, fine_step):
  """NDQSG MSE without overload: `(1 - α²)²·σ_z² + α²·Δ1²/12`.

  Args:
    alpha: shrinkage `α`.
    sigma_z: standard deviation of `z = x - y` (normalized units).
    fine_step: `Δ1` (normalized units).
  """
  a2 = alpha * alpha
  return (1.0 - a2)**2 * sigma_z**2 + a2 * uniform_error_variance(fine_step)


def mmse_alpha(sigma_z, fine_step):
  """The `α` that minimizes `nested_mse`: `α² = 1 - Δ1²/(24σ_z²)`.

  Returns 0 when `σ_z² <= Δ1²/24` (then `y` alone is better than any code).
  """
  if sigma_z <= 0:
    return 0.0
  a2 = 1.0 - fine_step * fine_step / (24.0 * sigma_z * sigma_z)
  return math.sqrt(a2) if a2 > 0 else 0.0


def mmse_nested_mse(sigma_z, fine_step):
  """The minimum of `nested_mse`: `D - D²/(4σ_z²)`, `D = Δ1²/12`."""
  d = uniform_error_variance(fine_step)
  if sigma_z * sigma_z <= d / 2:
    return sigma_z * sigma_z
  return d - d * d / (4.0 * sigma_z * sigma_z)


def _q(x):
  """Gaussian tail `P(N(0,1) > x)`."""
  return 0.5 * math.erfc(x / math.sqrt(2.0))


def _phi(x):
  return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def overload_probability(alpha, sigma_z, fine_step, coarse_ratio):
  """Exact `P(|α·z + e| >= Δ2/2)` for Gaussian `z ~ N(0, σ_z²)`.

  `e ~ U[-Δ1/2, Δ1/2]` is the fine quantization error; `Δ2 = k·Δ1`. Uses
  `∫Q(t)dt = t·Q(t) - φ(t)`, so no numerical integration is needed
  (docs/algorithms.md#overload-probability).
  """
  half = coarse_ratio * fine_step / 2.0
  sigma = alpha * sigma_z
  if sigma <= 0:
    return 1.0 if half <= fine_step / 2.0 else 0.0

  def antiderivative(t):
    return t * _q(t) - _phi(t)

  # P = (2/Δ1) ∫_{-Δ1/2}^{Δ1/2} Q((h + e)/σ) de, by symmetry.
  upper = (half + fine_step / 2.0) / sigma
  lower = (half - fine_step / 2.0) / sigma
  p = 2.0 * sigma / fine_step * (antiderivative(upper) - antiderivative(lower))
  return min(max(p, 0.0), 1.0)


def overload_bound(alpha, sigma_z, fine_step, coarse_ratio):
  """`P(|z| > (k - 1)·Δ1/(2α))` for Gaussian `z`: an upper bound on overload.

  See docs/algorithms.md#overload-probability.
  """
  if alpha * sigma_z <= 0:
    return 0.0
  threshold = (coarse_ratio - 1) * fine_step / (2.0 * alpha)
  return 2.0 * _q(threshold / sigma_z)


def bits_per_element(codec, num_elements):
  """Wire bits per element, all included: `codec.wire_bits(n) / n`."""
  if num_elements <= 0:
    raise ValueError(
        f"`num_elements` must be positive. Received: "
        f"num_elements={num_elements}.")
  return codec.wire_bits(num_elements) / num_elements


def gaussian_tail_quantile(p):
  """`t` with `P(N(0,1) > t) = p`, for `0 < p < 1/2` (by bisection)."""
  if not 0.0 < p < 0.5:
    raise ValueError(f"`p` must be in (0, 0.5). Received: p={p!r}.")
  low, high = 0.0, 40.0
  for _ in range(200):
    mid = 0.5 * (low + high)
    if _q(mid) > p:
      low = mid
    else:
      high = mid
  return 0.5 * (low + high)


def auto_nested_step_ratio(coarse_ratio, overload_target, alpha):
  """`Δ1/σ_z` of adaptive NDQSG: the step whose overload rate is the target.

  Solves `overload_probability(α, 1, r, k) = overload_target` for `r` (the
  probability is a function of `Δ1/σ_z` alone, decreasing in it), so that a
  Gaussian `z` of any `σ_z` overloads with exactly that probability per
  element, counting the fine quantization error too. Sizing by the cruder
  `overload_bound` instead would give a larger step, hence more MSE
  (docs/algorithms.md#sizing-the-adaptive-step-by-the-overload-bound).
  See docs/algorithms.md#adaptive-nested-step.
  """
  if not 0.0 < overload_target < 0.5:
    raise ValueError(
        f"`overload_target` must be in (0, 0.5). Received: "
        f"overload_target={overload_target!r}.")
  low, high = 1e-9, 1e3
  for _ in range(200):
    mid = math.sqrt(low * high)
    if overload_probability(alpha, 1.0, mid, coarse_ratio) > overload_target:
      low = mid
    else:
      high = mid
  return high


def auto_nested_fine_step(sigma_z, coarse_ratio, overload_target, alpha):
  """Adaptive NDQSG's fine step `Δ1 = r·σ_z`, `r = auto_nested_step_ratio`.

  A Gaussian `z` then overloads with probability `overload_target` per
  element (`overload_probability`).
  """
  return sigma_z * auto_nested_step_ratio(coarse_ratio, overload_target,
                                          alpha)


def auto_nested_mse_factor(coarse_ratio, overload_target, alpha):
  """Adaptive NDQSG's MSE over `σ_z²`: `(1 - α²)² + α²·r²/12`.

  `nested_mse` with `Δ1 = auto_nested_fine_step(...)` (`r = Δ1/σ_z`).
  """
  r = auto_nested_step_ratio(coarse_ratio, overload_target, alpha)
  a2 = alpha * alpha
  return (1.0 - a2)**2 + a2 * r * r / 12.0


def auto_nested_alpha(coarse_ratio, overload_target):
  """The `α` in `(0, 1]` minimizing `auto_nested_mse_factor` (golden section).

  With `Δ1` tied to `α` by the overload target, the usual MMSE rule
  (`mmse_alpha`, for a fixed `Δ1`) does not apply: `r` grows with `α`.
  """
  def f(a):
    return auto_nested_mse_factor(coarse_ratio, overload_target, a)

  low, high = 1e-3, 1.0
  golden = (math.sqrt(5.0) - 1.0) / 2.0
  x1, x2 = high - golden * (high - low), low + golden * (high - low)
  f1, f2 = f(x1), f(x2)
  for _ in range(60):
    if f1 <= f2:
      high, x2, f2 = x2, x1, f1
      x1 = high - golden * (high - low)
      f1 = f(x1)
    else:
      low, x1, f1 = x1, x2, f2
      x2 = low + golden * (high - low)
      f2 = f(x2)
  best = 0.5 * (low + high)
  return 1.0 if f(1.0) <= f(best) else best
