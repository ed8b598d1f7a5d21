"""Dithered quantization codecs: DQSG (subtractive) and half-dithered.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019. Sections on
  dithered and half-dithered quantization; Algorithm 1.
  docs/algorithms.md#dqsg-subtractive-dither and
  docs/algorithms.md#half-dithered-quantization write the equations out.
"""

from typing import Optional

import tensorflow as tf

from ndq_tf.codecs import base
from ndq_tf.codecs import bucketed
from ndq_tf.ops import quantization_ops
from ndq_tf.ops import sum_decode_ops

__all__ = [
    "DitheredCodec",
    "HalfDitheredCodec",
]


@base.register
class DitheredCodec(bucketed.BucketedCodec):
  """Dithered quantization with subtractive dither (DQSG).

  Each bucket of `bucket_size` values is scaled by its max-norm `κ`, and
  `x = g/κ ∈ [-1, 1]` is coded as `q = round((x + u)/Δ)`, `Δ = 1/M`,
  `q ∈ {-M..M}` (`M = num_levels`), with a dither `u ~ U[-Δ/2, Δ/2)` drawn
  from the seed. The receiver regenerates `u` and decodes
  `g̃ = κ·(Δq - u)`: unbiased, with an error uniform on `κ·[-Δ/2, Δ/2]`
  independent of `g`, so `E‖g̃ - g‖² = Σ_b κ_b² d_b Δ²/12`.

  Wire: codes radix-packed (`2M + 1` symbols; 20 per word for ternary) plus
  one float32 scale per bucket: about 1.66 bits per element for `M = 1`,
  `bucket_size = 512`.

  Example:

  >>> codec = ndq_tf.DitheredCodec(num_levels=1, bucket_size=512)
  >>> payload = codec.encode(g, seed=[1, 2])
  >>> g_hat = codec.decode(payload, seed=[1, 2])

  Args:
    num_levels: `M >= 1`; `2M + 1` levels, step `1/M` in max-normalized units.
    bucket_size: values per scale, `>= 1`.
    rotation: `None` (default) or `"hadamard"`: each bucket is multiplied
      by random signs and Walsh–Hadamard transformed before quantization,
      and transformed back after decoding (needs a power-of-two
      `bucket_size >= 4`; docs/algorithms.md#randomized-hadamard-rotation).

  Raises:
    ValueError: for an argument out of range.
  """

  _decode_uses_seed = True
  needs_encode_seed = True
  SUMMED_FORM = "codes"

  def __init__(self, num_levels: int = 1, bucket_size: int = 512,
               rotation: Optional[str] = None):
    self._num_levels = base.check_int("num_levels", num_levels, 1,
                                      bucketed.MAX_LEVELS)
    self._bucket_size = base.check_int("bucket_size", bucket_size, 1)
    self._set_rotation(rotation)

  @property
  def num_levels(self):
    return self._num_levels

  @property
  def alphabet_size(self):
    return 2 * self._num_levels + 1

  @property
  def step(self):
    """The quantization step `Δ = 1/M` in max-normalized units."""
    return 1.0 / self._num_levels

  def get_config(self):
    return {"num_levels": self._num_levels, "bucket_size": self._bucket_size,
            "rotation": self._rotation}

  @property
  def _offset(self):
    return self._num_levels

  def _quantize(self, xb, scales, seed):
    m = self._num_levels
    # Work in units of the step: t = g / (κΔ), dither in [-1/2, 1/2).
    step = tf.cast(scales, xb.dtype) / m
    u = base.dither(seed, xb.shape[0], self._bucket_size, xb.dtype)
    q = quantization_ops.dithered_quantize(base.normalize(xb, step), u, 1.0)
    return tf.clip_by_value(q, -m, m)

  def _dequantize(self, q, scales, seed, side_information):
    u = base.dither(seed, q.shape[0], self._bucket_size, q.dtype)
    # (q - u) * κΔ: a difference then a product, each correctly rounded.
    return (quantization_ops.dithered_dequantize(q, u, 1.0)
            * (scales / self._num_levels)[:, None])

  def _decode_symbol_sum(self, symbol_sum, scales, seeds, dtype):
    # κΔ(S - P·M - Σ_p u_p): every sender's dither is subtracted.
    return sum_decode_ops.dithered_sum_dequantize(
        symbol_sum, scales, seeds, self._num_levels, self._bucket_size,
        dtype)


@base.register
class HalfDitheredCodec(bucketed.BucketedCodec):
  """Half-dithered quantization: dither at the encoder only.

  `q = round((x + u)/Δ)` with `u` the sum of `dither_order` independent
  `U[-Δ/2, Δ/2)`; the receiver decodes `κ·Δ·q` without any seed. Unbiased
  for every order; for `dither_order >= 2` the error variance is
  `(dither_order + 1)·Δ²/12` whatever the signal (`dither_order = 1` is
  stochastic rounding, whose variance depends on the signal).

  Codes lie in `{-(M + ⌊m/2⌋) .. M + ⌊m/2⌋}` (`m = dither_order`); they are
  clipped to that range only in the measure-zero case where `x + u` falls
  exactly on its lower edge (a tie of probability below `2**-24`).

  Args:
    num_levels: `M >= 1`, step `1/M`.
    bucket_size: values per scale.
    dither_order: `m >= 1`, the number of uniforms summed into the dither.
    rotation: `None` (default) or `"hadamard"`: each bucket is multiplied
      by random signs and Walsh–Hadamard transformed before quantization,
      and transformed back after decoding (needs a power-of-two
      `bucket_size >= 4`; docs/algorithms.md#randomized-hadamard-rotation).
  """

  needs_encode_seed = True
  SUMMED_FORM = "codes"

  def __init__(self, num_levels: int = 1, bucket_size: int = 512,
               dither_order: int = 2, rotation: Optional[str] = None):
    self._num_levels = base.check_int("num_levels", num_levels, 1,
                                      bucketed.MAX_LEVELS)
    self._bucket_size = base.check_int("bucket_size", bucket_size, 1)
    self._dither_order = base.check_int("dither_order", dither_order, 1, 64)
    self._set_rotation(rotation)
    if self.alphabet_size > bucketed.MAX_LEVELS * 2 + 1:
      raise ValueError(
          f"`num_levels` + `dither_order` // 2 must be at most "
          f"{bucketed.MAX_LEVELS} (the codes' alphabet must pack into int32 "
          f"words). Received: "
          f"num_levels={num_levels!r}, dither_order={dither_order!r}.")

  @property
  def num_levels(self):
    return self._num_levels

  @property
  def dither_order(self):
    return self._dither_order

  @property
  def step(self):
    return 1.0 / self._num_levels

  @property
  def _max_code(self):
    return self._num_levels + self._dither_order // 2

  @property
  def alphabet_size(self):
    return 2 * self._max_code + 1

  def get_config(self):
    return {"num_levels": self._num_levels, "bucket_size": self._bucket_size,
            "dither_order": self._dither_order, "rotation": self._rotation}

  @property
  def _offset(self):
    return self._max_code

  def _quantize(self, xb, scales, seed):
    step = tf.cast(scales, xb.dtype) / self._num_levels
    num_buckets = xb.shape[0]
    u = base.dither(seed, num_buckets, self._bucket_size, xb.dtype)
    for stream in range(1, self._dither_order):
      u += base.dither(seed, num_buckets, self._bucket_size, xb.dtype, stream)
    q = quantization_ops.half_dithered_quantize(
        base.normalize(xb, step), u, 1.0)
    return tf.clip_by_value(q, -self._max_code, self._max_code)

  def _dequantize(self, q, scales, seed, side_information):
    return (quantization_ops.half_dithered_dequantize(q, 1.0, q.dtype)
            * (scales / self._num_levels)[:, None])

  def _decode_symbol_sum(self, symbol_sum, scales, seeds, dtype):
    return sum_decode_ops.scaled_sum_dequantize(
        symbol_sum, scales, seeds.shape[0], self._num_levels, self._max_code,
        self._bucket_size, dtype)
