"""The nested codec's adaptive mode: `encode(x, seed, noise_scale=σ)`.

Its API: a scalar or per-bucket noise scale, bitwise the same codes eager,
in a function and under XLA, the error bound and the unchanged wire size,
the fallback to DQSG, zero and non-finite buckets, bad inputs, and its
config. The shared codecs and helpers: codec_cases.py.
"""

import json
import math

from absl.testing import parameterized
import keras
import numpy as np
import tensorflow as tf

from codec_cases import (
    CODECS,
    SEED,
    N,
    FLOAT_DTYPES,
    EPS,
    codec_params,
    make_signal,
    side_information_of,
    bits_of)
import ndq_tf
from ndq_tf import codecs


class AdaptiveNestedTest(tf.test.TestCase, parameterized.TestCase):
  """The nested codec's adaptive mode: `encode(x, seed, noise_scale=σ)`."""

  BUCKET = 64
  NUM_BUCKETS = -(-N // 64)

  def _codec(self, alpha="mmse", coarse_ratio=3):
    return ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=coarse_ratio,
                                      alpha=alpha, bucket_size=self.BUCKET,
                                      overload_target=1e-4)

  def _noise_scales(self, x):
    """Per-bucket σ: the rms of the side information's noise (0.5% of x)."""
    x64 = x.numpy().astype(np.float64)
    return tf.fill([self.NUM_BUCKETS],
                   0.005 * math.sqrt(np.mean(x64**2))).numpy()

  def test_scalar_noise_scale_equals_one_per_bucket(self):
    codec = self._codec()
    x = make_signal(N)
    sigma = self._noise_scales(x)
    a = codec.encode(x, SEED, noise_scale=float(sigma[0]))
    b = codec.encode(x, SEED, noise_scale=tf.constant(sigma))
    self.assertAllEqual(a.words, b.words)
    self.assertAllEqual(a.scales, b.scales)

  @parameterized.parameters("mmse", 1.0)
  def test_eager_function_and_xla_are_bitwise_equal(self, alpha):
    codec = self._codec(alpha)
    x = make_signal(N)
    y = side_information_of(x)
    sigma = tf.constant(self._noise_scales(x))

    def round_trip(x, seed, sigma, y):
      payload = codec.encode(x, seed, noise_scale=sigma)
      return (payload.words, payload.scales,
              codec.decode(payload, seed, side_information=y))

    eager = round_trip(x, SEED, sigma, y)
    for jit in (False, True):
      got = tf.function(round_trip, jit_compile=jit)(x, SEED, sigma, y)
      for a, b in zip(got, eager):
        self.assertAllEqual(bits_of(a), bits_of(b), msg=f"jit_compile={jit}")

  @parameterized.parameters(*FLOAT_DTYPES)
  def test_error_within_bound_and_wire_size_unchanged(self, dtype):
    codec = self._codec()
    x = make_signal(N, dtype)
    y = side_information_of(x)
    sigma = self._noise_scales(x)
    payload = codec.encode(x, SEED, noise_scale=sigma)
    self.assertEqual(
        32 * (payload.words.shape[0] + payload.scales.shape[0]),
        codec.wire_bits(N))
    x_hat = codec.decode(payload, SEED, side_information=y)
    self.assertEqual(x_hat.dtype, dtype)
    # Nested buckets send num_levels·Δ1 > 0: without overload the error is
    # (α² - 1) z + α e, |e| <= Δ1/2.
    scales = payload.scales.numpy().astype(np.float64)
    self.assertTrue(np.all(scales > 0))
    fine = np.repeat(scales / codec.num_levels, self.BUCKET)[:N]
    x64 = tf.cast(x, tf.float64).numpy()
    z = x64 - tf.cast(y, tf.float64).numpy()
    a = codec.adaptive_alpha
    bound = (1 - a * a) * np.abs(z) + a * fine / 2
    err = np.abs(tf.cast(x_hat, tf.float64).numpy() - x64)
    slack = EPS[dtype] * (np.abs(x64) + bound) + 1e-6 * np.max(np.abs(x64))
    self.assertTrue(np.all(err <= bound + slack),
                    msg=f"max excess {np.max(err - bound - slack)}")

  def test_unknown_or_useless_noise_scale_falls_back_to_dqsg(self):
    # σ = 0, NaN, Inf: unknown; σ large: nested would not beat DQSG. Those
    # buckets go as DQSG with k symbols (negated scale) and ignore y.
    codec = self._codec()
    x = make_signal(N)
    y = side_information_of(x)
    sigma = self._noise_scales(x)
    fallback = [1, 2, 3, 4]
    sigma[fallback] = [0.0, math.nan, math.inf, 100.0]
    payload = codec.encode(x, SEED, noise_scale=sigma)
    scales = payload.scales.numpy()
    mask = np.zeros(self.NUM_BUCKETS, bool)
    mask[fallback] = True
    self.assertTrue(np.all(scales[mask] < 0))
    self.assertTrue(np.all(scales[~mask] > 0))
    x_hat = codec.decode(payload, SEED, side_information=y).numpy()
    other_y = codec.decode(payload, SEED, side_information=y * 3.0).numpy()
    elements = np.repeat(mask, self.BUCKET)[:N]
    self.assertAllEqual(x_hat[elements], other_y[elements])
    # DQSG with ⌊k/2⌋ = 1 level: error at most κ/2.
    kappa = np.repeat(-scales.astype(np.float64), self.BUCKET)[:N]
    err = np.abs(x_hat - x.numpy())
    self.assertTrue(np.all(err[elements] <= kappa[elements] / 2 * (1 + 1e-6)))

  def test_bucket_of_zeros_decodes_to_exact_zeros(self):
    codec = self._codec()
    x = make_signal(N).numpy()
    x[64:128] = 0.0
    y = side_information_of(tf.constant(x)).numpy()
    y[64:128] = 0.4
    payload = codec.encode(x, SEED, noise_scale=self._noise_scales(
        tf.constant(x)))
    x_hat = codec.decode(payload, SEED, side_information=y).numpy()
    self.assertAllEqual(x_hat[64:128], np.zeros(64))

  @parameterized.parameters(math.nan, math.inf)
  def test_non_finite_value_poisons_its_bucket_only(self, bad):
    codec = self._codec()
    clean = make_signal(N).numpy()
    dirty = clean.copy()
    dirty[200] = bad  # bucket 3
    y = side_information_of(tf.constant(clean))
    sigma = self._noise_scales(tf.constant(clean))
    x_hat = codec.decode(codec.encode(dirty, SEED, noise_scale=sigma), SEED,
                         side_information=y).numpy()
    reference = codec.decode(codec.encode(clean, SEED, noise_scale=sigma),
                             SEED, side_information=y).numpy()
    poisoned = np.arange(N) // self.BUCKET == 3
    self.assertFalse(np.any(np.isfinite(x_hat[poisoned])))
    self.assertAllEqual(x_hat[~poisoned], reference[~poisoned])

  @parameterized.parameters(*codec_params(
      [n for n in CODECS if not CODECS[n].accepts_noise_scale]))
  def test_other_codecs_reject_noise_scale(self, name):
    with self.assertRaisesRegex(ValueError, "`noise_scale`"):
      CODECS[name].encode(make_signal(N), SEED, noise_scale=0.1)

  def test_adaptive_mode_needs_odd_coarse_ratio(self):
    with self.assertRaisesRegex(ValueError, "`coarse_ratio`.*coarse_ratio=4"):
      self._codec(alpha=1.0, coarse_ratio=4).encode(make_signal(N), SEED,
                                                    noise_scale=0.1)

  def test_mmse_alpha_needs_noise_scale(self):
    with self.assertRaisesRegex(ValueError, "`noise_scale`"):
      self._codec().encode(make_signal(N), SEED)

  def test_noise_scale_of_wrong_shape_or_dtype_raises(self):
    codec = self._codec()
    with self.assertRaisesRegex(ValueError, "`noise_scale`"):
      codec.encode(make_signal(N), SEED,
                   noise_scale=tf.fill([self.NUM_BUCKETS + 1], 0.1))
    with self.assertRaisesRegex(TypeError, "`noise_scale`"):
      codec.encode(make_signal(N), SEED,
                   noise_scale=tf.ones([self.NUM_BUCKETS], tf.int32))

  @parameterized.parameters(0, 0.0, 0.5, 1.0, -1e-3, math.nan, "0.01", True,
                            None)
  def test_bad_overload_target_raises_value_error(self, value):
    with self.assertRaises(ValueError) as cm:
      ndq_tf.NestedDitheredCodec(overload_target=value)
    message = str(cm.exception)
    self.assertIn("`overload_target`", message)
    shown = [f"overload_target={value!r}"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      shown.append(f"overload_target={float(value)!r}")
    self.assertTrue(any(s in message for s in shown), msg=message)

  @parameterized.parameters("MMSE", "auto", "")
  def test_unknown_alpha_string_raises_value_error(self, value):
    with self.assertRaisesRegex(ValueError, f"`alpha`.*alpha={value!r}"):
      ndq_tf.NestedDitheredCodec(alpha=value)

  def test_adaptive_alpha_resolves_mmse(self):
    codec = self._codec()
    self.assertEqual(codec.alpha, "mmse")
    self.assertAlmostEqual(codec.adaptive_alpha,
                           ndq_tf.theory.auto_nested_alpha(3, 1e-4))
    self.assertEqual(self._codec(alpha=0.9).adaptive_alpha, 0.9)

  def test_config_round_trip_of_adaptive_codec(self):
    codec = ndq_tf.NestedDitheredCodec(num_levels=2, coarse_ratio=5,
                                       alpha="mmse", bucket_size=128,
                                       overload_target=1e-3)
    config = codec.get_config()
    self.assertEqual(config["alpha"], "mmse")
    self.assertEqual(config["overload_target"], 1e-3)
    self.assertEqual(type(codec).from_config(config), codec)
    serialized = json.loads(json.dumps(
        keras.saving.serialize_keras_object(codec)))
    self.assertEqual(keras.saving.deserialize_keras_object(serialized), codec)
    self.assertEqual(
        codecs.get("ndqsg:num_levels=2,coarse_ratio=5,alpha='mmse',"
                   "bucket_size=128,overload_target=0.001"), codec)


class SideInformationTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters("ndqsg_k3", "ndqsg_k4")
  def test_nested_decode_without_side_information_raises(self, name):
    codec = CODECS[name]
    payload = codec.encode(make_signal(N), SEED)
    with self.assertRaisesRegex(ValueError, "`side_information`"):
      codec.decode(payload, SEED)

  def test_nested_side_information_of_wrong_shape_raises(self):
    codec = CODECS["ndqsg_k3"]
    payload = codec.encode(make_signal(N), SEED)
    with self.assertRaisesRegex(ValueError, "`side_information`"):
      codec.decode(payload, SEED, side_information=tf.zeros([N + 1]))

  def test_integer_side_information_raises_type_error(self):
    codec = CODECS["ndqsg_k3"]
    payload = codec.encode(make_signal(N), SEED)
    with self.assertRaisesRegex(TypeError, "`side_information`"):
      codec.decode(payload, SEED, side_information=tf.zeros([N], tf.int32))


if __name__ == "__main__":
  tf.test.main()
