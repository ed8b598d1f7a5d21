"""The quantizers of Abdi & Fekri (arXiv 1904.01197) as pure TF functions.

These are the paper's equations one to one, with the dither passed in (see
`ndq_tf.ops.uniform_dither` for a generator that gives the same bits on every
device). They work elementwise on tensors of any shape; `step`, `fine_step`,
`alpha` and the dither broadcast against `x`. Codes are returned as `int32`.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019.
  docs/algorithms.md writes the equations out, with their error formulas.
"""

import numpy as np
import tensorflow as tf

__all__ = [
    "dithered_quantize",
    "dithered_dequantize",
    "half_dithered_quantize",
    "half_dithered_dequantize",
    "nested_quantize",
    "nested_dequantize",
    "centered_mod",
]


def _as(value, dtype):
  """`value` cast to `dtype`, Python floats going through float64.

  `tf.cast(0.1, tf.float64)` would first make a float32 constant and lose
  precision; a NumPy array keeps Python's float64.
  """
  if not tf.is_tensor(value):
    value = tf.constant(np.asarray(value))
  return tf.cast(value, dtype)


def _float(x, name):
  x = tf.convert_to_tensor(x)
  if not x.dtype.is_floating:
    raise TypeError(
        f"`{name}` must be a floating point tensor. Received: {name} with "
        f"dtype {x.dtype.name}.")
  return x


def dithered_quantize(x, dither, step):
  """Subtractively dithered quantization: `q = round((x + u) / step)`.

  The error of `dithered_dequantize(q, u, step)` is uniform on
  `[-step/2, step/2]` and independent of `x` when `u ~ U[-step/2, step/2]`
  (the paper's Theorem 1).

  Args:
    x: floating point tensor.
    dither: tensor of `x`'s dtype, broadcastable to `x`; normally uniform on
      `[-step/2, step/2]`.
    step: quantization step `Δ`, a positive scalar or broadcastable tensor.

  Returns:
    `int32` codes of the broadcast shape. `round` is round-half-to-even.
  """
  x = _float(x, "x")
  t = (x + _as(dither, x.dtype)) / _as(step, x.dtype)
  return tf.cast(tf.round(t), tf.int32)


def dithered_dequantize(codes, dither, step):
  """Reconstruction of subtractive dither: `x̃ = step * q - u`.

  Args:
    codes: integer codes from `dithered_quantize`.
    dither: the same dither the encoder used (floating point).
    step: the same step.

  Returns:
    A tensor of `dither`'s dtype.
  """
  dither = _float(dither, "dither")
  return (_as(step, dither.dtype) * _as(codes, dither.dtype)
          - dither)


def half_dithered_quantize(x, dither, step):
  """Half-dithered quantization: `q = round((x + u) / step)`.

  The same code as `dithered_quantize`; only the reconstruction differs
  (the receiver does not subtract the dither).
  """
  return dithered_quantize(x, dither, step)


def half_dithered_dequantize(codes, step, dtype=tf.float32):
  """Reconstruction without the dither: `x̃_h = step * q`."""
  return _as(step, dtype) * _as(codes, dtype)


def centered_mod(c, k):
  """`((c + ⌊k/2⌋) mod k) - ⌊k/2⌋`: the residue of `c` in `[-⌊k/2⌋, k-⌊k/2⌋)`."""
  half = k // 2
  return tf.math.floormod(c + half, k) - half


def nested_quantize(x, dither, fine_step, coarse_ratio, alpha=1.0):
  """Nested dithered quantization (encoder), with nested steps `Δ2 = k·Δ1`.

  Computes the fine index `c = round((α·x + u) / Δ1)` and sends only its
  position inside the coarse cell, `s = ((c + ⌊k/2⌋) mod k) - ⌊k/2⌋`: one of
  `k` values, `log2 k` bits. For odd `k` this is `Q1(t) - Q2(t)` with
  `t = α·x + u` in the paper's notation.

  Example (the paper's Fig. 3): `nested_quantize(-4.2, 0.3, 1.0, 3, 1.0)`
  is `-1`.

  Args:
    x: floating point tensor.
    dither: uniform on `[-Δ1/2, Δ1/2]`, broadcastable to `x`.
    fine_step: `Δ1 > 0`.
    coarse_ratio: Python int `k >= 2`.
    alpha: shrinkage `0 < α <= 1`.

  Returns:
    `int32` codes in `[-⌊k/2⌋, k - ⌊k/2⌋)`.
  """
  x = _float(x, "x")
  _check_ratio(coarse_ratio)
  t = _as(alpha, x.dtype) * x + _as(dither, x.dtype)
  c = tf.cast(tf.round(t / _as(fine_step, x.dtype)), tf.int32)
  return centered_mod(c, coarse_ratio)


def nested_dequantize(codes, dither, side_information, fine_step, coarse_ratio,
                      alpha=1.0):
  """Nested dithered quantization (decoder) with side information `y`.

  `v = Δ1·s - u - α·y`; `w = v - Δ2·round(v/Δ2)`; `x̂ = y + α·w`. Without
  overload (`|α(x - y) + e| < Δ2/2`) the error is
  `(α² - 1)(x - y) + α·e` with `e ~ U[-Δ1/2, Δ1/2]`.

  Example (the paper's Fig. 3): `nested_dequantize(-1, 0.3, -3.4, 1.0, 3,
  1.0)` is `-4.3`.

  Args:
    codes: integer codes from `nested_quantize`.
    dither: the encoder's dither.
    side_information: `y`, the receiver's estimate of `x`.
    fine_step: `Δ1`.
    coarse_ratio: Python int `k`.
    alpha: shrinkage `α`.

  Returns:
    `x̂`, a tensor of `side_information`'s dtype.
  """
  y = _float(side_information, "side_information")
  _check_ratio(coarse_ratio)
  dtype = y.dtype
  fine = _as(fine_step, dtype)
  coarse = fine * coarse_ratio
  alpha = _as(alpha, dtype)
  v = fine * _as(codes, dtype) - _as(dither, dtype) - alpha * y
  w = v - coarse * tf.round(v / coarse)
  return y + alpha * w


def _check_ratio(coarse_ratio):
  if (not isinstance(coarse_ratio, int) or isinstance(coarse_ratio, bool)
      or coarse_ratio < 2):
    raise ValueError(
        f"`coarse_ratio` must be an integer >= 2. Received: "
        f"coarse_ratio={coarse_ratio!r}.")
