"""Nested dithered quantization (NDQSG): `log2 k` bits with side information.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019. Section on
  nested quantization; Algorithm 2.
"""

import tensorflow as tf

from ndq_tf.codecs import base
from ndq_tf.codecs import dithered
from ndq_tf.ops import quantization_ops

__all__ = ["NestedDitheredCodec"]


@base.register
class NestedDitheredCodec(dithered._BucketedCodec):  # pylint: disable=protected-access
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
  Outside that range the result is off by a multiple of `κ·Δ2`, silently:
  choose `Δ2` to cover the spread of `x - y` (see `ndq_tf.theory`).

  A bucket of zeros decodes to exact zeros whatever `y` is; a bucket with a
  NaN or Inf decodes to NaN.

  Example:

  >>> codec = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
  >>> payload = codec.encode(g, seed=[1, 2])
  >>> g_hat = codec.decode(payload, seed=[1, 2], side_information=y)

  Args:
    num_levels: `>= 1`; the fine step is `1/num_levels` of the bucket's max.
    coarse_ratio: integer `k >= 2`, `Δ2 = k·Δ1`; `k` symbols on the wire.
    alpha: shrinkage `0 < α <= 1` (`1` needs no knowledge of the noise).
    bucket_size: values per scale.

  Raises:
    ValueError: for an argument out of range.
  """

  needs_seed = True
  needs_encode_seed = True
  needs_side_information = True

  def __init__(self, num_levels=3, coarse_ratio=3, alpha=1.0, bucket_size=512):
    self._num_levels = base.check_int("num_levels", num_levels, 1,
                                      dithered._MAX_LEVELS)  # pylint: disable=protected-access
    self._coarse_ratio = base.check_int("coarse_ratio", coarse_ratio, 2, 65536)
    self._alpha = base.check_float("alpha", alpha, 0.0, 1.0)
    self._bucket_size = base.check_int("bucket_size", bucket_size, 1)

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
  def bucket_size(self):
    return self._bucket_size

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

  def get_config(self):
    return {"num_levels": self._num_levels,
            "coarse_ratio": self._coarse_ratio,
            "alpha": self._alpha,
            "bucket_size": self._bucket_size}

  @property
  def _offset(self):
    return self._coarse_ratio // 2

  def _quantize(self, xb, scales, seed):
    step = tf.cast(scales, xb.dtype) / self._num_levels
    u = base.dither(seed, xb.shape[0], self._bucket_size, xb.dtype)
    return quantization_ops.nested_quantize(
        base.normalize(xb, step), u, 1.0, self._coarse_ratio, self._alpha)

  def _dequantize(self, q, scales, seed, side_information):
    u = base.dither(seed, q.shape[0], self._bucket_size, q.dtype)
    step = scales / self._num_levels
    x_hat = quantization_ops.nested_dequantize(
        q, u, base.normalize(side_information, step), 1.0,
        self._coarse_ratio, self._alpha)
    # κΔ1 = 0 (a bucket of zeros) gives exact zeros; NaN gives NaN.
    return x_hat * step[:, None]
