"""Nested dithered quantization (NDQSG): `log2 k` bits with side information.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019. Section on
  nested quantization; Algorithm 2.
  docs/algorithms.md#nested-dithered-quantization-ndqsg writes the
  equations out (overload, MMSE `α`, the adaptive step).
"""

from typing import Optional, Union

import tensorflow as tf

from ndq_tf import theory
from ndq_tf.codecs import base
from ndq_tf.codecs import bucketed
from ndq_tf.ops import quantization_ops

__all__ = ["NestedDitheredCodec"]


@base.register
class NestedDitheredCodec(bucketed.BucketedCodec):
  """Nested dithered quantization: only the fine bin inside a coarse cell.

  In max-normalized units (`x = g/κ`, one `κ` per bucket) the fine step is
  `Δ1 = 1/num_levels` and the coarse step `Δ2 = coarse_ratio·Δ1`. The
  encoder sends `s = ((c + ⌊k/2⌋) mod k) - ⌊k/2⌋` with
  `c = round((α·x + u)/Δ1)`: `k = coarse_ratio` symbols, `log2 k` bits. The
  decoder resolves the coarse cell with side information `y` (an estimate of
  `g`, e.g. the mean of the gradients already decoded):
  `v = Δ1·s - u - α·y`, `w = v - Δ2·round(v/Δ2)`, `ĝ = κ·(y + α·w)`.

  While `|α·(x - y) + e| < Δ2/2` (no overload) the error per element is
  `(α² - 1)(x - y) + α·e`, `e ~ U[-Δ1/2, Δ1/2]`: for `α = 1` the DQSG error
  at step `Δ1`, for `log2 k` instead of `log2(2·num_levels + 1)` bits.
  Outside that range the result is off by a multiple of `α·κ·Δ2`, silently:
  choose `Δ2` to cover the spread of `x - y` (see `ndq_tf.theory`).

  A bucket of zeros decodes to exact zeros whatever `y` is; a bucket with a
  NaN or Inf decodes to NaN.

  Adaptive mode: `encode(x, seed, noise_scale=σ)`, with `σ` the sender's
  estimate of the spread of `x - y` per bucket (e.g. its own exact noise of
  the previous step, as the compressed all-reduces use; the receivers need
  not know it: the step travels in the bucket's scale), sets the fine
  step from the noise instead of the max: `Δ1 = r·σ`, with `r` solved so
  that a Gaussian `z` overloads with probability `overload_target` per
  element (`ndq_tf.theory.auto_nested_step_ratio`). A bucket where that would not beat
  DQSG with the same `k` symbols (`M = ⌊k/2⌋` levels of step `κ/M`), or
  whose `σ` is unknown (not finite or 0), falls back to DQSG: its scale goes
  on the wire negated, and its decoding ignores `y`. The wire format and
  size do not change. `alpha="mmse"` then picks the `α` that minimizes the
  MSE `σ²·((1 - α²)² + α²·r(α)²/12)` under that constraint
  (`ndq_tf.theory.auto_nested_alpha`; `r` grows with `α`, so this is not the
  fixed-step MMSE rule of `ndq_tf.theory.mmse_alpha`). Needs an odd
  `coarse_ratio` (the DQSG fallback is symmetric).

  Example:

  >>> codec = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
  >>> payload = codec.encode(g, seed=[1, 2])
  >>> g_hat = codec.decode(payload, seed=[1, 2], side_information=y)

  Args:
    num_levels: `>= 1`; the fine step is `1/num_levels` of the bucket's max.
    coarse_ratio: integer `k >= 2`, `Δ2 = k·Δ1`; `k` symbols on the wire.
    alpha: shrinkage `0 < α <= 1` (`1` needs no knowledge of the noise),
      or `"mmse"` (adaptive mode only, see above).
    bucket_size: values per scale.
    overload_target: adaptive mode: the overload probability per element
      the fine step is chosen for, in `(0, 0.5)`.
    rotation: `None` (default) or `"hadamard"`: each bucket is multiplied
      by random signs and Walsh–Hadamard transformed before quantization,
      and transformed back after decoding; the side information is
      rotated with the same signs (needs a power-of-two
      `bucket_size >= 4`; docs/algorithms.md#randomized-hadamard-rotation).

  Raises:
    ValueError: for an argument out of range.
  """

  _decode_uses_seed = True
  needs_encode_seed = True
  needs_side_information = True

  accepts_noise_scale = True

  def __init__(self, num_levels: int = 3, coarse_ratio: int = 3,
               alpha: Union[float, str] = 1.0, bucket_size: int = 512,
               overload_target: float = 1e-4, rotation: Optional[str] = None):
    self._num_levels = base.check_int("num_levels", num_levels, 1,
                                      bucketed.MAX_LEVELS)
    self._coarse_ratio = base.check_int("coarse_ratio", coarse_ratio, 2, 65536)
    if alpha != "mmse":
      if isinstance(alpha, str):
        raise ValueError(
            f"`alpha` must be a number in (0, 1] or 'mmse'. Received: "
            f"alpha={alpha!r}.")
      alpha = base.check_float("alpha", alpha, 0.0, 1.0)
    self._alpha = alpha
    self._bucket_size = base.check_int("bucket_size", bucket_size, 1)
    self._overload_target = base.check_float(
        "overload_target", overload_target, 0.0, 0.5)
    if self._overload_target >= 0.5:
      raise ValueError(
          f"`overload_target` must be in (0, 0.5). Received: "
          f"overload_target={overload_target!r}.")
    self._set_rotation(rotation)

  @property
  def num_levels(self):
    return self._num_levels

  @property
  def coarse_ratio(self):
    return self._coarse_ratio

  @property
  def alpha(self):
    return self._alpha

  @property
  def fine_step(self):
    """`Δ1` in max-normalized units."""
    return 1.0 / self._num_levels

  @property
  def coarse_step(self):
    """`Δ2 = coarse_ratio·Δ1` in max-normalized units."""
    return self._coarse_ratio / self._num_levels

  @property
  def alphabet_size(self):
    return self._coarse_ratio

  @property
  def overload_target(self):
    return self._overload_target

  @property
  def adaptive_alpha(self):
    """The `α` of the adaptive mode (resolves `"mmse"`)."""
    if self._alpha == "mmse":
      return theory.auto_nested_alpha(self._coarse_ratio,
                                      self._overload_target)
    return self._alpha

  def get_config(self):
    return {"num_levels": self._num_levels,
            "coarse_ratio": self._coarse_ratio,
            "alpha": self._alpha,
            "bucket_size": self._bucket_size,
            "overload_target": self._overload_target,
            "rotation": self._rotation}

  def _check_noise_scale(self, noise_scale, n):
    if noise_scale is not None and self._coarse_ratio % 2 == 0:
      raise ValueError(
          f"The adaptive mode (`noise_scale`) needs an odd `coarse_ratio`, "
          f"for its symmetric DQSG fallback. Received: coarse_ratio="
          f"{self._coarse_ratio}.")
    if noise_scale is None and self._alpha == "mmse":
      raise ValueError(
          "`alpha='mmse'` needs `noise_scale` (the adaptive mode): without "
          "the spread of x - side_information the MMSE alpha is unknown. "
          "Received: noise_scale=None.")
    return super()._check_noise_scale(noise_scale, n)

  @property
  def _offset(self):
    return self._coarse_ratio // 2

  def _quantize(self, xb, scales, seed):
    step = tf.cast(scales, xb.dtype) / self._num_levels
    u = base.dither(seed, xb.shape[0], self._bucket_size, xb.dtype)
    return quantization_ops.nested_quantize(
        base.normalize(xb, step), u, 1.0, self._coarse_ratio, self._alpha)

  def _quantize_adaptive(self, xb, scales, seed, noise_scale):
    k = self._coarse_ratio
    levels = k // 2
    alpha = self.adaptive_alpha
    ratio = theory.auto_nested_step_ratio(k, self._overload_target, alpha)
    kappa = tf.cast(scales, xb.dtype)
    sigma = tf.cast(noise_scale, xb.dtype)
    # The step the receivers will see: rounded through the float32 scale.
    # One product with one constant: XLA reassociated `ratio·σ·levels`
    # differently for one bucket than for several, so a bucket's step
    # depended on how many were encoded with it (a chunk, a shard).
    wire_fine = tf.cast(sigma * (ratio * self._num_levels), tf.float32)
    fine = tf.cast(wire_fine, xb.dtype) / self._num_levels
    mse_nested = sigma * sigma * theory.auto_nested_mse_factor(
        k, self._overload_target, alpha)
    mse_dqsg = tf.square(kappa / levels) / 12.0
    nested = (tf.math.is_finite(fine) & (fine > 0) & tf.math.is_finite(kappa)
              & (mse_nested < mse_dqsg))
    u = base.dither(seed, xb.shape[0], self._bucket_size, xb.dtype)
    s = quantization_ops.nested_quantize(
        base.normalize(xb, fine), u, 1.0, k, alpha)
    q = quantization_ops.dithered_quantize(
        base.normalize(xb, kappa / levels), u, 1.0)
    q = tf.clip_by_value(q, -levels, levels)
    codes = tf.where(nested[:, None], s, q)
    # The wire scale: num_levels·Δ1 (> 0) for nested buckets, -κ for DQSG.
    wire = tf.where(nested, wire_fine, -scales)
    return codes, wire

  def _dequantize(self, q, scales, seed, side_information):
    u = base.dither(seed, q.shape[0], self._bucket_size, q.dtype)
    step = scales / self._num_levels
    x_hat = quantization_ops.nested_dequantize(
        q, u, base.normalize(side_information, step), 1.0,
        self._coarse_ratio, self.adaptive_alpha)
    # κΔ1 = 0 (a bucket of zeros) gives exact zeros; NaN gives NaN.
    nested = x_hat * step[:, None]
    # Negative scales: buckets the adaptive encoder sent as DQSG.
    levels = max(self._coarse_ratio // 2, 1)
    dqsg = (quantization_ops.dithered_dequantize(q, u, 1.0)
            * (tf.abs(scales) / levels)[:, None])
    return tf.where((scales < 0)[:, None], dqsg, nested)
