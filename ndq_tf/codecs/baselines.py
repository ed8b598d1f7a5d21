"""Baseline codecs under the same interface: float32, float16, bfloat16,
QSGD, TernGrad.

References:
  D. Alistarh et al. QSGD: Communication-Efficient SGD via Gradient
  Quantization and Encoding. NeurIPS 2017.
  W. Wen et al. TernGrad: Ternary Gradients to Reduce Communication in
  Distributed Deep Learning. NeurIPS 2017.
  docs/algorithms.md#baselines-qsgd-and-terngrad: how they are computed here.
"""

from typing import Optional

import tensorflow as tf

from ndq_tf.codecs import base
from ndq_tf.codecs import bucketed
from ndq_tf.ops import sum_decode_ops

__all__ = [
    "Float32Codec",
    "Float16Codec",
    "BFloat16Codec",
    "QSGDCodec",
    "TernGradCodec",
]


@base.register
class Float32Codec(base.Codec):
  """Sends float32 values as they are (32 bits per element).

  Lossless for float32, float16 and bfloat16 inputs; float64 inputs are
  rounded to float32.
  """

  SUMMED_FORM = "float32"

  def _num_words(self, num_elements):
    return num_elements

  def _encode_flat(self, x, seed):
    return (tf.bitcast(tf.cast(x, tf.float32), tf.int32),
            tf.zeros([0], tf.float32))

  def _decode_flat(self, words, scales, n, seed, side_information, dtype):
    return tf.cast(tf.bitcast(words, tf.float32), dtype)


class _HalfWidthCodec(base.Codec):
  """Sends the values cast to a 16-bit float `_HALF`, two per `int32` word."""

  _HALF = None

  def _num_words(self, num_elements):
    return -(-num_elements // 2)

  def _encode_flat(self, x, seed):
    n = x.shape[0]
    half = tf.pad(tf.cast(x, self._HALF), [[0, n % 2]])
    return (tf.bitcast(tf.reshape(half, [-1, 2]), tf.int32),
            tf.zeros([0], tf.float32))

  def _decode_flat(self, words, scales, n, seed, side_information, dtype):
    half = tf.reshape(tf.bitcast(words, self._HALF), [-1])[:n]
    return tf.cast(half, dtype)


@base.register
class Float16Codec(_HalfWidthCodec):
  """Sends IEEE half precision values, two per `int32` word.

  Values beyond float16's range (65504) become Inf, values below its
  subnormals flush to zero; NaN and Inf pass through.
  """

  SUMMED_FORM = "float16"
  _HALF = tf.float16


@base.register
class BFloat16Codec(_HalfWidthCodec):
  """Sends bfloat16 values (float32's range, 8 significant bits), two per word.

  Each value is rounded to the nearest bfloat16, ties to even (TF's cast;
  float64 values through float32, as TF casts them): relative error at
  most `2**-8` (normal values), float32's range kept (only values within
  `2**-9` of float32's largest round up to Inf). NaN and Inf pass
  through. Lossless for bfloat16 inputs. 16 bits per element.

  Under `exchange="all_reduce"` the senders' bfloat16 values are summed in
  TF's float32 ring (`summed_form()` is `"bfloat16"`): TF's NCCL
  all-reduce takes no bfloat16, so a bfloat16 ring would not run on GPUs.
  Each value is rounded to bfloat16, cast back to float32 exactly and the
  sum made in float32, so 32 bits per element go on the wire, as a
  float32 ring's, and are counted so; the all-gather sends the 16.
  """

  SUMMED_FORM = "bfloat16"
  _HALF = tf.bfloat16


class _StochasticRoundingCodec(bucketed.BucketedCodec):
  """Scale per bucket, then unbiased stochastic rounding to `{-s..s}`."""

  needs_encode_seed = True
  _norm = "max"
  _levels = 1

  @property
  def alphabet_size(self):
    return 2 * self._levels + 1

  @property
  def _offset(self):
    return self._levels

  def _quantize(self, xb, scales, seed):
    s = self._levels
    r = tf.abs(base.normalize(xb, tf.cast(scales, xb.dtype) / s))
    low = tf.floor(r)
    # Round up with probability r - floor(r); v ~ U[0, 1) in steps of 2**-24.
    v = base.dither(seed, xb.shape[0], self._bucket_size, xb.dtype) + 0.5
    level = low + tf.cast(v < r - low, xb.dtype)
    level = tf.clip_by_value(level, 0.0, float(s))
    return tf.cast(tf.sign(xb) * level, tf.int32)

  def _dequantize(self, q, scales, seed, side_information):
    return q * (scales / self._levels)[:, None]

  def _decode_symbol_sum(self, symbol_sum, scales, seeds, dtype):
    # Nothing to subtract: κ(S - P·s)/s. With the shared scale (the largest
    # of the senders' max-norms, or L2 norms for QSGD) `s·|g|/κ <= s`
    # still holds, so every code stays in {-s..s}.
    return sum_decode_ops.scaled_sum_dequantize(
        symbol_sum, scales, seeds.shape[0], self._levels, self._levels,
        self._bucket_size, dtype)


@base.register
class QSGDCodec(_StochasticRoundingCodec):
  """QSGD (Alistarh et al. 2017): L2 norm per bucket, `s` levels.

  `ĝ_i = ‖g_b‖₂ · sign(g_i) · ξ_i / s` with `ξ_i` the stochastic rounding of
  `s·|g_i|/‖g_b‖₂` to an integer in `[0, s]`: unbiased, with variance at most
  `min(d/s², √d/s)·‖g‖²`. Codes in `{-s..s}` are radix-packed (the paper's
  Elias coding of sparse codes is not used) plus one float32 norm per bucket.

  Args:
    num_levels: `s >= 1`.
    bucket_size: values per norm.
    rotation: `None` (default) or `"hadamard"`: each bucket is multiplied
      by random signs and Walsh–Hadamard transformed before quantization,
      and transformed back after decoding (needs a power-of-two
      `bucket_size >= 4`; docs/algorithms.md#randomized-hadamard-rotation).
  """

  SUMMED_FORM = "codes"

  _norm = "l2"

  def __init__(self, num_levels: int = 1, bucket_size: int = 512,
               rotation: Optional[str] = None):
    self._levels = base.check_int("num_levels", num_levels, 1,
                                  bucketed.MAX_LEVELS)
    self._bucket_size = base.check_int("bucket_size", bucket_size, 1)
    self._set_rotation(rotation)

  @property
  def num_levels(self):
    return self._levels

  def get_config(self):
    return {"num_levels": self._levels, "bucket_size": self._bucket_size,
            "rotation": self._rotation}


@base.register
class TernGradCodec(_StochasticRoundingCodec):
  """TernGrad (Wen et al. 2017): `ĝ = s·sign(g)·b`, `b ~ Bernoulli(|g|/s)`.

  `s` is the bucket's max-norm (the paper uses one scale per layer; buckets
  make it comparable to the other codecs). Ternary codes, 20 per word. The
  paper's optional gradient clipping is left to the optimizer.

  Args:
    bucket_size: values per scale.
    rotation: `None` (default) or `"hadamard"`: each bucket is multiplied
      by random signs and Walsh–Hadamard transformed before quantization,
      and transformed back after decoding (needs a power-of-two
      `bucket_size >= 4`; docs/algorithms.md#randomized-hadamard-rotation).
  """

  SUMMED_FORM = "codes"

  _norm = "max"

  def __init__(self, bucket_size: int = 512, rotation: Optional[str] = None):
    self._bucket_size = base.check_int("bucket_size", bucket_size, 1)
    self._set_rotation(rotation)

  def get_config(self):
    return {"bucket_size": self._bucket_size, "rotation": self._rotation}

