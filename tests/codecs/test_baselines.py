"""Tests of `ndq_tf.codecs.baselines`: float32, float16, bfloat16, QSGD and
TernGrad.

What is each baseline's own: the float codecs' values, and the levels the
stochastic-rounding codecs decode to (TernGrad: `{-κ, 0, κ}` with κ the
bucket's max-norm; QSGD: multiples of `‖g_b‖₂/s`). The API every codec
shares is tested in test_base.py, their statistics in
test_codec_statistics.py.
"""

import numpy as np
import tensorflow as tf

import ndq_tf

SEED = tf.constant([3, 14], tf.int32)
D = 64  # Values per bucket.


def _signal(n=4 * D, seed=0):
  return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def _round_trip(codec, x):
  x = tf.constant(x)
  return codec.decode(codec.encode(x, SEED), SEED).numpy()


def test_float32_codec_sends_the_bits_it_is_given():
  x = _signal()
  x[:3] = [np.nan, np.inf, -0.0]
  y = _round_trip(ndq_tf.Float32Codec(), x)
  np.testing.assert_array_equal(y.view(np.int32), x.view(np.int32))


def test_float16_codec_rounds_to_half_precision():
  x = _signal(2 * D + 1)  # An odd count: the last word is half used.
  x[:2] = [70000.0, 1e-9]  # Beyond float16's range, below its subnormals.
  y = _round_trip(ndq_tf.Float16Codec(), x)
  np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))
  assert np.isinf(y[0]) and y[1] == 0.0


def _bfloat16_by_hand(x):
  """float32 -> bfloat16 -> float32, rounding to nearest even on the bits."""
  bits = x.view(np.uint32).astype(np.uint64)
  rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
  y = rounded.astype(np.uint32).view(np.float32)
  return np.where(np.isnan(x), x, y)


def test_bfloat16_codec_rounds_to_nearest_even():
  x = _signal(2 * D + 1)  # An odd count: the last word is half used.
  one = np.float32(1.0)
  x[:12] = [
      one + 2.0**-8,  # A tie: down to the even 1.0.
      one + 3 * 2.0**-8,  # A tie: up to the even 1 + 2**-6.
      one + 2.0**-8 + 2.0**-20,  # Just above a tie: up.
      -(one + 2.0**-8 - 2.0**-20),  # Just below a tie: down.
      np.finfo(np.float32).max,  # Beyond bfloat16's largest: Inf.
      3.38e38,  # Within it: finite.
      1e-30, -0.0, np.nan, np.inf, -np.inf, 70000.0]
  y = _round_trip(ndq_tf.BFloat16Codec(), x)
  want = _bfloat16_by_hand(x)
  np.testing.assert_array_equal(y, want)
  np.testing.assert_array_equal(y, tf.cast(tf.cast(x, tf.bfloat16),
                                           tf.float32).numpy())
  assert y[0] == 1.0 and y[1] == 1.0 + 2.0**-6 and y[2] == 1.0 + 2.0**-7
  assert np.isinf(y[4]) and np.isfinite(y[5]) and y[11] == 70144.0
  assert np.signbit(y[7]) and np.isnan(y[8]) and list(y[9:11]) == [
      np.inf, -np.inf]
  # Lossless for bfloat16 inputs; 16 bits per element.
  z = tf.cast(tf.constant(x), tf.bfloat16)
  codec = ndq_tf.BFloat16Codec()
  payload = codec.encode(z)
  assert codec.wire_bits(x.size) == 32 * (D + 1)
  np.testing.assert_array_equal(
      tf.bitcast(codec.decode(payload), tf.int16).numpy(),
      tf.bitcast(z, tf.int16).numpy())


def test_terngrad_decodes_to_zero_or_the_buckets_max_norm():
  x = _signal()
  y = _round_trip(ndq_tf.TernGradCodec(bucket_size=D), x)
  for xb, yb in zip(x.reshape(-1, D), y.reshape(-1, D)):
    kappa = np.abs(xb).max()
    assert set(np.unique(np.abs(yb))) <= {0.0, kappa}
    # The sign is the value's, when it is not rounded to zero.
    assert np.all(np.sign(yb[yb != 0]) == np.sign(xb[yb != 0]))


def test_qsgd_decodes_to_multiples_of_the_l2_norm_over_its_levels():
  levels = 4
  x = _signal()
  y = _round_trip(ndq_tf.QSGDCodec(num_levels=levels, bucket_size=D), x)
  for xb, yb in zip(x.reshape(-1, D), y.reshape(-1, D)):
    step = np.linalg.norm(xb) / levels
    codes = yb / step
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-4)
    # Rounded up or down: at most one step from the value.
    assert np.all(np.abs(yb - xb) <= step * (1 + 1e-5))
