"""Tests of `ndq_tf.codecs.baselines`: float32, float16, QSGD and TernGrad.

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
