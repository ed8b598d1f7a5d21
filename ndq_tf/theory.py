"""Closed-form error, rate and overload formulas of the codecs.

All quantities are per element and, unless said otherwise, in max-normalized
units (a bucket's values divided by its max-norm `κ`); multiply by `κ²` for
the variance of the gradient itself. Plain Python (`math`), usable in tests,
benchmarks and to pick parameters; it imports nothing of ndq_tf (the
bottom of the layers, tests/test_layers.py). The exchanges' cost model
(`exchange_bits`, `auto`), which needs the exchanges, is
`ndq_tf.core.cost_model`; its old names here are deprecated aliases.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019.
  J. Ziv. On universal quantization. IEEE Trans. Inf. Theory 31(3), 1985.
  R. Zamir, M. Feder. On universal quantization by randomized
  uniform/lattice quantizers. IEEE Trans. Inf. Theory 38(2), 1992.
  S. Vargaftik et al. EDEN: Communication-Efficient and Robust Distributed
  Mean Estimation for Federated Learning. ICML 2022.
  docs/algorithms.md of this project writes the equations out (sections
  #dqsg-subtractive-dither, #half-dithered-quantization and
  #nested-dithered-quantization-ndqsg, #entropy-coded-dithered-quantization-ecdq);
  docs/scaling.md tabulates the exchange cost model.
"""

import functools
import math

from ndq_tf import _deprecation

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
    "shared_scale_variance",
    "rotated_scales",
    "rotation_domain_gain",
    "rotated_dithered_total_mse",
    "rotated_dithered_vnmse_bound",
    "rate_distortion_vnmse",
    "ring_all_reduce_bits",
    "ring_all_gather_bits",
    "codes_add_up",
    "summed_form",
    "reduce_scatter_total_mse",
    "ecdq_vnmse",
    "ecdq_conditional_rate",
    "ecdq_unconditional_rate",
    "ecdq_step_ratio",
    "gaussian_lloyd_max_distortion",
    "eden_vnmse",
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


# -- Shared scales, rotation and the bits of rings ----------------------------


def shared_scale_variance(num_levels, num_workers, kappa_max=1.0):
  """Error variance per element of the sum of `P` DQSG decodes, shared scale.

  When the `P` workers quantize bucket `b` with one shared scale, the
  largest of their own max-norms, `κ_max = max_p κ_p` (agreed on by a MAX
  all-reduce), each worker's DQSG error is uniform on `κ_max·Δ·[-1/2, 1/2]`
  with `Δ = 1/M` (`M = num_levels`, the step of `DitheredCodec` in
  max-normalized units, `κ_max·Δ` in the gradient's units), instead of
  `κ_p·Δ·[-1/2, 1/2]`: its variance is `κ_max²Δ²/12`. The workers' dithers
  are independent, so the errors of their decodes are too, and the sum of
  the `P` decodes (which is what decoding the integer sum of their codes
  gives, `ndq_tf.ops.dithered_sum_dequantize`) has the error variance

  `P·κ_max²·Δ²/12 = P·κ_max²/(12·M²)` per element.

  Sharing the scale costs a worker `(κ_max/κ_p)²` times its own variance.

  Args:
    num_levels: `M >= 1`.
    num_workers: `P >= 1`, the workers summed.
    kappa_max: the shared scale `κ_max` of the bucket (1 gives the variance
      in units of `κ_max²`).

  Returns:
    The variance, a float.
  """
  if num_workers < 1:
    raise ValueError(
        f"`num_workers` must be at least 1. Received: "
        f"num_workers={num_workers!r}.")
  return num_workers * kappa_max * kappa_max * dithered_variance(num_levels)


def rotated_scales(wire_scales, bucket_size):
  """`κ_b`, the max of each orthonormally rotated bucket, from a rotated wire.

  A rotated codec quantizes `c·R·g_b` (`R = H·D/√d`, `c =
  rotation_domain_gain(d)`, 1 or `1/√2`), so its wire scale is `c·κ_b`
  (docs/algorithms.md#randomized-hadamard-rotation). Returns floats.
  """
  gain = rotation_domain_gain(bucket_size)
  return [float(s) / gain for s in wire_scales]


def rotation_domain_gain(bucket_size):
  """`c = √d·2^-⌈k/2⌉` (`d = 2^k`): 1 for even `k`, `1/√2` for odd `k`.

  The rotation `ndq_tf.ops.rotate` is `c` times the orthonormal one
  (`ndq_tf.ops.rotation_ops.domain_gain`, the same number in the ops).
  """
  if bucket_size < 1 or bucket_size & (bucket_size - 1):
    raise ValueError(f"`bucket_size` must be a power of two. Received: "
                     f"bucket_size={bucket_size}.")
  k = bucket_size.bit_length() - 1
  return 2.0 ** (k / 2 - (k + 1) // 2)


def rotated_dithered_total_mse(wire_scales, bucket_size, num_levels):
  """`E‖g̃ - g‖² = Σ_b κ_b²·d·Δ²/12` of rotated DQSG, `κ_b` rotated.

  The rotated coefficients' errors are DQSG's; the inverse rotation is
  orthogonal, so it keeps their energy (spread evenly over the bucket).
  `wire_scales`: the payload's scales; `d = bucket_size`; `M = num_levels`.
  """
  return dithered_total_mse(rotated_scales(wire_scales, bucket_size),
                            bucket_size, num_levels)


def rotated_dithered_vnmse_bound(bucket_size, num_levels):
  """`(ln(2d) + 1)/(6M²)`: rotated DQSG's vNMSE bound for every gradient.

  Each `(R·g_b)_j = Σ_i ±g_i/√d` is sub-Gaussian with proxy `‖g_b‖²/d`
  (Hoeffding over the signs), so `E max_j y_j² <= 2(ln(2d) + 1)·‖g_b‖²/d`.
  Unrotated, the worst case is `d·Δ²/12` (42.7 against 1.32 for `d = 512`,
  `M = 1`); Suresh et al. 2017 have the same `log d`.
  """
  return (math.log(2.0 * bucket_size) + 1.0) / (6.0 * num_levels**2)


def rate_distortion_vnmse(bits_per_element):
  """`1/(4^R - 1)`: the least vNMSE of an unbiased code at `R` bits/element.

  Gaussian rate–distortion `D = σ²·4^-R`; an unbiased `g + e` shrunk
  optimally has MSE `σ²V/(σ² + V) >= D`, so `V/σ² >= 1/(4^R - 1)`.
  """
  return 1.0 / (4.0 ** bits_per_element - 1.0)


def _summable_kind(codec):
  form = getattr(codec, "summed_form", None)
  return form() if callable(form) else None


def ring_all_reduce_bits(buffer_bits, num_workers):
  """`2(P - 1)/P·B`: bits each worker sends in a ring all-reduce of `B` bits.

  A ring all-reduce is a reduce-scatter then an all-gather, each `P - 1`
  steps in which every worker sends one `1/P` chunk of the buffer to its
  neighbour (TF's `CollectiveReduceV2` ring on CPUs, NCCL's ring on GPUs).
  Every worker receives as many bits as it sends. Chunks are counted as
  exact fractions of the buffer.
  """
  if num_workers < 1:
    raise ValueError(
        f"`num_workers` must be at least 1. Received: "
        f"num_workers={num_workers!r}.")
  return 2.0 * (num_workers - 1) / num_workers * buffer_bits


def ring_all_gather_bits(row_bits, num_workers):
  """`(P - 1)·R`: bits each worker sends in a ring all-gather of `R`-bit rows.

  In `P - 1` steps every worker sends its neighbour one row: its own first,
  then the rows it received (TF's `CollectiveGatherV2` ring); it receives
  the `P - 1` rows of the others.
  """
  if num_workers < 1:
    raise ValueError(
        f"`num_workers` must be at least 1. Received: "
        f"num_workers={num_workers!r}.")
  return float((num_workers - 1) * row_bits)


def summed_form(codec):
  """How the integer all-reduce transport sums `codec`'s payloads, or None.

  `"codes"`: integer codes in lanes (`ndq_ops.pack_lanes`) with shared
  scales; `"float16"`, `"float32"`: the values, through TF's own ring of
  that dtype; `"bfloat16"`: the values rounded to bfloat16, through the
  float32 ring; None: the payloads do not add up (nested codecs, any other
  codec), so only the all-gather carries them.
  """
  return _summable_kind(codec)


def codes_add_up(codec):
  """Whether the sum of several workers' codes decodes to the sum of decodes.

  True for the codecs an integer all-reduce can sum, given one shared scale
  per bucket (the max over workers of their scales):

  * `DitheredCodec`: subtract the sum of every sender's dither
    (`ndq_tf.ops.dithered_sum_dequantize`);
  * `HalfDitheredCodec` and `TernGradCodec`: nothing to subtract
    (`ndq_tf.ops.scaled_sum_dequantize`);
  * `QSGDCodec`: likewise; its scale is an L2 norm per bucket, and the
    shared one is the largest of the workers' norms (then
    `s·|g_i|/κ <= s` still holds, so the codes stay in `{-s..s}`);
  * `Float16Codec` and `Float32Codec`: the values, through TF's own float
    ring of that dtype; `BFloat16Codec`: its bfloat16 values, through the
    float32 ring (TF's NCCL all-reduce takes no bfloat16).

  False for nested codecs (`needs_side_information`: each code is a residue
  that only its own side information decodes, and residues do not add up)
  and for any other codec, subclasses included.
  """
  return _summable_kind(codec) is not None


# -- The reduce-scatter exchange's error (issue #18) --------------------------
# The buffer of `n` values (`B = n/d` whole buckets of `d`) is cut into `P`
# shards of whole buckets. Stage 1: worker `i` encodes shard `j` of its
# gradient and an all-to-all hands it to worker `j`, which decodes the `P`
# shards and sums them. Stage 2: worker `j` re-quantizes the sum with DQSG
# (the stage-2 codec) and an all-gather hands it to every worker; every
# worker decodes the `P` reduced shards with the same ops, so all end
# bitwise identical. The exchange and its bits are
# `ndq_tf.core.exchanges.reduce_scatter`.


def reduce_scatter_total_mse(stage1_scales, stage2_scales, bucket_size,
                             stage1_levels, stage2_levels):
  """`E‖ĝ - Σ_p g_p‖²` of the reduce-scatter sum of DQSG senders.

  `Σ_b d·(Σ_p κ_pb²·Δ1²/12 + κ̃_b²·Δ2²/12)`: the `P` senders' independent
  stage-1 errors (DQSG, Lemma 3), plus one dithered quantization of each
  bucket of the decoded sum, whose scale `κ̃_b` is the max of that sum (a
  subtractive dither's error is uniform on `κ̃_b·[-Δ2/2, Δ2/2]` and
  independent of what it quantizes, so the two add). Both stages are
  unbiased. Against the exact integer sum (`exchange="all_reduce"`,
  stage-1 errors only) the price is the second term: `κ̃_b` grows like
  `P·κ` for correlated gradients, so it dominates for large `P`, unless
  stage 2 has about `√P` times the levels.

  Args:
    stage1_scales: `[[κ_pb for every bucket b] for every sender p]`.
    stage2_scales: `[κ̃_b for every bucket b]`.
    bucket_size: `d`.
    stage1_levels: `M1` of the senders' DQSG (`Δ1 = 1/M1`).
    stage2_levels: `M2` of the stage-2 DQSG.

  Returns:
    A float.
  """
  one = sum(k * k for scales in stage1_scales for k in scales)
  two = sum(k * k for k in stage2_scales)
  return bucket_size * (one / (12.0 * stage1_levels**2)
                        + two / (12.0 * stage2_levels**2))


# -- Entropy-coded dithered quantization (issue #35) --------------------------
# A Gaussian input `x ~ N(0, 1)` (a rotated bucket divided by its RMS `σ`),
# the step `Δ = r` (`r = Δ/σ`, the step ratio), a subtractive dither
# `u ~ U[-1/2, 1/2)` in units of the step and no clipping:
# `q = round(x/Δ + u)`, decoded as `Δ·(q - u)`. Then `q = k` exactly when
# `x ∈ [r(k - u - 1/2), r(k - u + 1/2))`, so
# `P(q = k | u) = Φ(r(k - u + 1/2)) - Φ(r(k - u - 1/2))`
# (docs/algorithms.md#entropy-coded-dithered-quantization-ecdq).

#: The step ratios `r = Δ/σ` the ECDQ formulas take, and the rates in bits
#: `ecdq_step_ratio` inverts (`H(Q|U)` is about 0.002 bits at the largest
#: ratio and 14.05 at the smallest).
ECDQ_STEP_RATIO_RANGE = (2.0**-12, 2.0**10)
ECDQ_BITS_RANGE = (0.01, 14.0)

# Beyond 39 standard deviations a Gaussian probability underflows a double.
_GAUSS_REACH = 39.0


def _check_step_ratio(step_ratio):
  low, high = ECDQ_STEP_RATIO_RANGE
  if (isinstance(step_ratio, bool)
      or not isinstance(step_ratio, (int, float))
      or not low <= step_ratio <= high):
    raise ValueError(
        f"`step_ratio` (Δ/σ) must be a number in [{low!r}, {high!r}]. "
        f"Received: step_ratio={step_ratio!r}.")
  return float(step_ratio)


def _gauss_interval(a, b):
  """`(P, 1 - P)` for `P = P(a <= Z < b)`, `Z ~ N(0, 1)`, `a <= b`.

  Each from the tails that do not cancel: two upper tails when `a >= 0`,
  two lower tails when `b <= 0`, and otherwise `1 - P` as the sum of the
  two outer tails.
  """
  if a >= 0.0:
    p = _q(a) - _q(b)
    return p, 1.0 - p
  if b <= 0.0:
    p = _q(-b) - _q(-a)
    return p, 1.0 - p
  outer = _q(-a) + _q(b)
  return 1.0 - outer, outer


def _eta(p, complement):
  """`-p·log2(p)`, from `p` and `1 - p` (exact near `p = 1` too)."""
  if p <= 0.0:
    return 0.0
  if complement < 0.5:
    return -p * math.log1p(-complement) / math.log(2.0)
  return -p * math.log2(p)


def ecdq_vnmse(step_ratio):
  """`r²/12`: ECDQ's error variance over `σ²` (the vNMSE of an element).

  With subtractive dither and an unbounded alphabet the error
  `Δ·(q - u) - x` is uniform on `[-Δ/2, Δ/2)` whatever `x` is
  (Schuchman's condition; Zamir & Feder 1992): there is no overload, the
  estimate is unbiased and its variance is `Δ²/12 = r²σ²/12`.
  """
  r = _check_step_ratio(step_ratio)
  return r * r / 12.0


def ecdq_conditional_rate(step_ratio):
  """`H(Q|U)` in bits per element: the rate of a coder that knows the dither.

  `H(Q|U) = ∫_{-1/2}^{1/2} H(Q | U = u) du`, with `P(q|u)` the Gaussian's
  mass on `[r(q - u - 1/2), r(q - u + 1/2))`. As `q` runs over the integers
  and `u` over one step, `t = q - u` runs over the real line once, so
  `H(Q|U) = ∫ η(p(t)) dt = (1/r)∫ η(Φ(s + r/2) - Φ(s - r/2)) ds`, with
  `η(p) = -p·log2 p`: one integral of a smooth, even, Gaussian-decaying
  function, which the trapezoidal rule on the real line computes to far
  below 1e-9 bits with the spacing 1/32 (halving it changes nothing).

  Tends to `h(N(0, 1)) - log2 r = ½·log2(2πe) - log2 r` as `r → 0` and
  exceeds `½·log2(1 + 12/r²)`, the rate the unbiased rate–distortion bound
  needs for the same error, by about 0.254 bits at every rate
  (`½·log2(πe/6)` as `r → 0`).

  Args:
    step_ratio: `r = Δ/σ`, in `ECDQ_STEP_RATIO_RANGE`.

  Returns:
    Bits per element, a float.
  """
  r = _check_step_ratio(step_ratio)
  spacing = 1.0 / 32.0
  steps = int(math.ceil((r / 2.0 + _GAUSS_REACH) / spacing))
  total = 0.0
  for k in range(steps + 1):
    s = k * spacing
    value = _eta(*_gauss_interval(s - r / 2.0, s + r / 2.0))
    total += value if k else value / 2.0
  # The integrand is even: twice the half line.
  return 2.0 * spacing * total / r


def _ecdq_symbol_probabilities(r):
  """`P(q)` for `q = 0, 1, 2, ...` (`P(-q) = P(q)`), dither averaged out.

  `x/Δ + u` has the density `f(t) = Φ(r(t + 1/2)) - Φ(r(t - 1/2))`, so
  `P(q) = ∫_{q-1/2}^{q+1/2} f = (G(r(q+1)) - 2G(rq) + G(r(q-1)))/r` with
  `G(s) = s·Φ(s) + φ(s)` (`G' = Φ`). Evaluated at `-q`, where every
  argument is `<= 0` and `G` is small, so the differences do not cancel.
  """
  def g(s):
    return s * _q(-s) + _phi(s)

  probabilities = []
  last = int(math.ceil(_GAUSS_REACH / r)) + 1
  for q in range(last + 1):
    m = -q
    probabilities.append(
        max((g(r * (m + 1)) - 2.0 * g(r * m) + g(r * (m - 1))) / r, 0.0))
  return probabilities


def ecdq_unconditional_rate(step_ratio):
  """`H(Q)` in bits per element: the rate of a coder that ignores the dither.

  `P(q) = ∫ P(q|u) du`, the mass of `x/Δ + u` on `[q - 1/2, q + 1/2)`
  (closed form, `_ecdq_symbol_probabilities`). `H(Q) - H(Q|U) = I(Q; U)`,
  about 0.2 bits near 1 bit per element, is what conditioning the coding
  model on the dither saves.
  """
  r = _check_step_ratio(step_ratio)
  p = _ecdq_symbol_probabilities(r)
  total = _eta(p[0], 1.0 - p[0])
  for value in p[1:]:
    total += 2.0 * _eta(value, 1.0 - value)
  return total


def ecdq_step_ratio(bits):
  """The step ratio `r = Δ/σ` whose `H(Q|U)` is `bits` (6 significant digits).

  Bisection on `log r` (`ecdq_conditional_rate` decreases in `r`), the
  result rounded to 6 significant digits. A float: codecs that take it
  should fingerprint the ratio itself, since another machine's `math`
  could round the last digit the other way.

  Args:
    bits: the target rate in bits per element, in `ECDQ_BITS_RANGE`.

  Returns:
    The step ratio, a float.
  """
  low_bits, high_bits = ECDQ_BITS_RANGE
  if (isinstance(bits, bool) or not isinstance(bits, (int, float))
      or not low_bits <= bits <= high_bits):
    raise ValueError(
        f"`bits` must be a number in [{low_bits!r}, {high_bits!r}]. "
        f"Received: bits={bits!r}.")
  low, high = (math.log(v) for v in ECDQ_STEP_RATIO_RANGE)
  while high - low > 1e-8:
    mid = 0.5 * (low + high)
    if ecdq_conditional_rate(math.exp(mid)) > bits:
      low = mid
    else:
      high = mid
  return float(f"{math.exp(0.5 * (low + high)):.6g}")


def gaussian_lloyd_max_distortion(bits):
  """The MSE of the Lloyd–Max quantizer of `N(0, 1)` with `2^bits` levels.

  Lloyd's algorithm (thresholds at midpoints, levels at the centroids
  `(φ(a) - φ(b))/(Φ(b) - Φ(a))`) from a uniform start, until the levels
  move less than 1e-13: 0.3634 (`1 - 2/π`), 0.1175, 0.03454, 0.009497
  for 1 to 4 bits (Max 1960).

  Args:
    bits: 1, 2, 3 or 4.

  Returns:
    The distortion `D`, a float.
  """
  if isinstance(bits, bool) or bits not in (1, 2, 3, 4):
    raise ValueError(
        f"`bits` must be 1, 2, 3 or 4. Received: bits={bits!r}.")
  return _lloyd_max(int(bits))


@functools.lru_cache(maxsize=None)
def _lloyd_max(bits):
  half = 2**(bits - 1)
  # The positive levels; the negative ones mirror them.
  levels = [(i + 0.5) * 4.0 / (2 * half) for i in range(half)]
  for _ in range(100000):
    edges = [0.0] + [(a + b) / 2.0 for a, b in zip(levels, levels[1:])]
    edges.append(math.inf)
    new = []
    for a, b in zip(edges, edges[1:]):
      mass = _q(a) - _q(b)
      new.append((_phi(a) - (_phi(b) if b < math.inf else 0.0)) / mass)
    moved = max(abs(a - b) for a, b in zip(levels, new))
    levels = new
    if moved < 1e-13:
      break
  edges = [0.0] + [(a + b) / 2.0 for a, b in zip(levels, levels[1:])]
  edges.append(math.inf)
  # At the centroids, D = E[x²] - E[Q(x)²].
  signal = 0.0
  for c, a, b in zip(levels, edges, edges[1:]):
    signal += 2.0 * (_q(a) - _q(b)) * c * c
  return 1.0 - signal


def eden_vnmse(bits):
  """EDEN's vNMSE at `bits` bits per element: `D/(1 - D)`.

  EDEN (Vargaftik et al., ICML 2022) rotates, quantizes with the Gaussian
  Lloyd–Max levels and rescales to unbiasedness, so its vNMSE is
  `D/(1 - D)`, `D = gaussian_lloyd_max_distortion(bits)`: 0.5708 at 1 bit
  (the paper's 0.571) and 0.1331 at 2 bits.
  """
  d = gaussian_lloyd_max_distortion(bits)
  return d / (1.0 - d)


# Old names, deprecated for one release: the cost model moved to the exchange
# core, the framing constants next to the code that sends them. Read by name
# when used, so that this module imports nothing above it.
__getattr__ = _deprecation.moved_attributes(__name__, {
    "TRANSPORTS": "ndq_tf.core.cost_model.TRANSPORTS",
    "exchange_bits": "ndq_tf.core.cost_model.exchange_bits",
    "auto_transport": "ndq_tf.core.cost_model.auto",
    "reduce_scatter_bits":
        "ndq_tf.core.exchanges.reduce_scatter.reduce_scatter_bits",
    "ALL_GATHER_HEADER_WORDS": "ndq_tf.core.transports.all_gather.HEADER_WORDS",
    "ALL_REDUCE_STAMP_WORDS":
        "ndq_tf.core.transports.collective_sum.STAMP_WORDS",
})
