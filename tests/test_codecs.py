"""Behaviour of the codecs' public API: determinism, compilation modes, shapes,
dtypes, bad inputs, wire format and (de)serialization.

The statistical properties (unbiasedness, variances, overload) are in
test_codec_statistics.py.

Every codec is configured once at module level and shared by the tests, and
the tests reuse a few tensor sizes: a codec compiles its encoder and decoder
with XLA once per (size, compute dtype), and those compilations dominate the
run time.
"""

import json
import math

from absl.testing import parameterized
import keras
import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf import codecs
from ndq_tf.codecs import bucketed

# name -> codec. Bucket sizes are small so that a 1001-element tensor spans
# many buckets, and neither 1001 nor the bucket sizes are multiples of the
# codes per word (20 for ternary, 10 for 9 symbols, 32 for binary...).
CODECS = {
    "float32": ndq_tf.Float32Codec(),
    "float16": ndq_tf.Float16Codec(),
    "dqsg_ternary": ndq_tf.DitheredCodec(num_levels=1, bucket_size=64),
    "dqsg_m4": ndq_tf.DitheredCodec(num_levels=4, bucket_size=100),
    "half_order1": ndq_tf.HalfDitheredCodec(num_levels=1, bucket_size=64,
                                            dither_order=1),
    "half_order2": ndq_tf.HalfDitheredCodec(num_levels=2, bucket_size=64,
                                            dither_order=2),
    "half_order3": ndq_tf.HalfDitheredCodec(num_levels=1, bucket_size=50,
                                            dither_order=3),
    "ndqsg_k3": ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                           alpha=1.0, bucket_size=64),
    "ndqsg_k4": ndq_tf.NestedDitheredCodec(num_levels=4, coarse_ratio=4,
                                           alpha=0.75, bucket_size=64),
    "qsgd": ndq_tf.QSGDCodec(num_levels=2, bucket_size=64),
    "terngrad": ndq_tf.TernGradCodec(bucket_size=64),
}
# Codecs whose encoder draws random numbers.
SEEDED = [name for name, c in CODECS.items() if c.needs_encode_seed]
BUCKETED = [name for name, c in CODECS.items() if c.bucket_size is not None]

SEED = tf.constant([12, 34], tf.int32)
OTHER_SEED = tf.constant([12, 35], tf.int32)
N = 1001  # the shared size: 7 * 11 * 13
FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
_EPS = {tf.float16: 2.0**-10, tf.bfloat16: 2.0**-7, tf.float32: 2.0**-23,
        tf.float64: 2.0**-52}


def _codec_params(names):
  return [(name,) for name in names]


def _signal(n, dtype=tf.float32, seed=0):
  rng = np.random.default_rng(seed)
  return tf.cast(rng.standard_normal(n), dtype)


def _side_information(x, seed=1):
  """An estimate of x, off by much less than a coarse cell (no overload).

  The noise is 0.5% of x's rms, a few thousandths of a bucket's max-norm
  against a coarse half-cell of Δ2/2 >= 1/2 in normalized units.
  """
  rng = np.random.default_rng(seed)
  x64 = tf.cast(x, tf.float64).numpy()
  finite = x64[np.isfinite(x64)]
  rms = math.sqrt(np.mean(finite**2)) if finite.size else 0.0
  return tf.cast(x64 + 0.005 * rms * rng.standard_normal(x64.shape), x.dtype)


def _decode(codec, payload, seed=SEED, side_information=None):
  if codec.needs_side_information:
    return codec.decode(payload, seed, side_information=side_information)
  return codec.decode(payload, seed)


def _round_trip(codec, x, seed=SEED, y=None):
  if codec.needs_side_information and y is None:
    y = _side_information(x)
  payload = codec.encode(x, seed)
  return payload, _decode(codec, payload, seed, y)


def _bits(t):
  """The bits of a tensor as an integer array (NaN-safe bitwise compare)."""
  t = tf.convert_to_tensor(t)
  if t.dtype.is_floating:
    width = {2: tf.int16, 4: tf.int32, 8: tf.int64}[t.dtype.size]
    return tf.bitcast(t, width).numpy()
  return t.numpy()


def _per_element_scale(codec, payload, n):
  """Each element's bucket scale as float64 (all 1 for unbucketed codecs)."""
  if codec.bucket_size is None:
    return np.ones(n)
  return np.repeat(payload.scales.numpy().astype(np.float64),
                   codec.bucket_size)[:n]


def _error_bound(codec, x, y, payload):
  """Per-element bound on |x̂ - x| before rounding to the output dtype."""
  n = int(np.prod(x.shape))
  x64 = tf.reshape(tf.cast(x, tf.float64), [-1]).numpy()
  kappa = _per_element_scale(codec, payload, n)
  if isinstance(codec, ndq_tf.Float32Codec):
    return np.abs(x64) * 2.0**-24
  if isinstance(codec, ndq_tf.Float16Codec):
    return np.abs(x64) * 2.0**-11 + 2.0**-25  # + half the subnormal spacing
  if isinstance(codec, ndq_tf.DitheredCodec):
    return kappa * codec.step / 2
  if isinstance(codec, ndq_tf.HalfDitheredCodec):
    # |u| <= mΔ/2 plus the rounding's Δ/2.
    return kappa * codec.step * (codec.dither_order + 1) / 2
  if isinstance(codec, ndq_tf.NestedDitheredCodec):
    # (α² - 1) z + α e, |e| <= Δ1/2 (no overload by construction of y).
    z = x64 - tf.reshape(tf.cast(y, tf.float64), [-1]).numpy()
    a = codec.alpha
    return (1 - a * a) * np.abs(z) + a * kappa * codec.fine_step / 2
  if isinstance(codec, ndq_tf.QSGDCodec):
    return kappa / codec.num_levels  # one level of the L2 norm
  if isinstance(codec, ndq_tf.TernGradCodec):
    return kappa
  raise AssertionError(f"no bound for {codec}")


class DeterminismTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*_codec_params(CODECS))
  def test_identical_seed_yields_identical_output(self, name):
    codec = CODECS[name]
    x = _signal(N)
    p1, d1 = _round_trip(codec, x, tf.constant([12, 34]))
    p2, d2 = _round_trip(codec, x, [12, 34])
    self.assertAllEqual(p1.words, p2.words)
    self.assertAllEqual(_bits(p1.scales), _bits(p2.scales))
    self.assertAllEqual(_bits(d1), _bits(d2))

  @parameterized.parameters(*_codec_params(SEEDED))
  def test_other_seed_yields_other_output(self, name):
    codec = CODECS[name]
    x = _signal(N)
    p1, d1 = _round_trip(codec, x, SEED)
    p2, d2 = _round_trip(codec, x, OTHER_SEED)
    self.assertNotAllEqual(p1.words, p2.words)
    self.assertNotAllEqual(d1, d2)
    # The scales do not depend on the seed.
    self.assertAllEqual(p1.scales, p2.scales)

  @parameterized.parameters("dqsg_ternary", "dqsg_m4", "ndqsg_k3")
  def test_decoding_with_another_seed_gives_another_result(self, name):
    codec = CODECS[name]
    x = _signal(N)
    y = _side_information(x)
    payload = codec.encode(x, SEED)
    self.assertNotAllEqual(_decode(codec, payload, SEED, y),
                           _decode(codec, payload, OTHER_SEED, y))

  @parameterized.parameters("half_order2", "qsgd", "terngrad")
  def test_decode_needs_no_seed(self, name):
    codec = CODECS[name]
    self.assertFalse(codec.decoder_needs_seed)
    x = _signal(N)
    payload = codec.encode(x, SEED)
    self.assertAllEqual(codec.decode(payload), codec.decode(payload, SEED))

  @parameterized.parameters("float32", "float16")
  def test_unseeded_codecs_need_no_seed(self, name):
    codec = CODECS[name]
    x = _signal(N)
    payload = codec.encode(x)
    self.assertAllEqual(_bits(codec.decode(payload)), _bits(_round_trip(
        codec, x)[1]))

  @parameterized.parameters("dqsg_ternary", "ndqsg_k3", "half_order2")
  def test_seed_value_not_its_dtype_selects_the_dither(self, name):
    # A sender with an int64 seed (e.g. derived from an int64 step counter)
    # and a receiver passing the same values as a Python list (int32) must
    # agree, as TF's own stateless ops do (tf.random.stateless_uniform gives
    # the same numbers for int32 and int64 seeds of equal value).
    codec = CODECS[name]
    x = _signal(N)
    p64 = codec.encode(x, tf.constant([12, 34], tf.int64))
    p32 = codec.encode(x, [12, 34])
    differ = np.mean(p64.words.numpy() != p32.words.numpy())
    self.assertEqual(differ, 0.0,
                     msg=f"{differ:.0%} of the words differ between the "
                     "int64 seed [12, 34] and the int32 seed [12, 34]")
    y = _side_information(x)
    decoded = _decode(codec, p64, [12, 34], y).numpy()
    error = np.max(np.abs(decoded - x.numpy()))
    self.assertAllEqual(decoded, _decode(codec, p32, [12, 34], y),
                        msg=f"max decode error {error}")


class CompilationTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*_codec_params(CODECS))
  def test_eager_function_and_xla_are_bitwise_equal(self, name):
    codec = CODECS[name]
    x = _signal(N)
    y = _side_information(x)

    def encode(x, seed):
      p = codec.encode(x, seed)
      return p.words, p.scales

    def decode(words, scales, seed, y):
      payload = ndq_tf.Payload(words=words, scales=scales, shape=x.shape,
                               dtype=x.dtype)
      return _decode(codec, payload, seed, y)

    eager_words, eager_scales = encode(x, SEED)
    eager_decoded = decode(eager_words, eager_scales, SEED, y)
    for jit in (False, True):
      words, scales = tf.function(encode, jit_compile=jit)(x, SEED)
      self.assertAllEqual(words, eager_words, msg=f"jit_compile={jit}")
      self.assertAllEqual(_bits(scales), _bits(eager_scales))
      decoded = tf.function(decode, jit_compile=jit)(eager_words, eager_scales,
                                                     SEED, y)
      self.assertAllEqual(_bits(decoded), _bits(eager_decoded),
                          msg=f"jit_compile={jit}")

  def test_payload_passes_through_tf_function(self):
    codec = CODECS["dqsg_ternary"]
    x = _signal(N)
    payload = codec.encode(x, SEED)
    decode = tf.function(lambda p, s: codec.decode(p, s))
    self.assertAllEqual(decode(payload, SEED), codec.decode(payload, SEED))


class ShapeAndDtypeTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(name=list(CODECS), dtype=FLOAT_DTYPES)
  def test_decode_has_input_dtype_and_error_within_bound(self, name, dtype):
    codec = CODECS[name]
    x = _signal(N, dtype)
    y = _side_information(x)
    payload, x_hat = _round_trip(codec, x, y=y)
    self.assertEqual(x_hat.dtype, dtype)
    self.assertEqual(x_hat.shape, x.shape)
    self.assertEqual(payload.words.dtype, tf.int32)
    self.assertEqual(payload.scales.dtype, tf.float32)
    self.assertTrue(np.all(np.isfinite(tf.cast(x_hat, tf.float64))))
    err = np.abs(tf.cast(x_hat, tf.float64).numpy() -
                 tf.cast(x, tf.float64).numpy())
    bound = _error_bound(codec, x, y, payload)
    # Plus the rounding to the output dtype (half an eps of |x̂| <= |x| +
    # bound) and float32 arithmetic inside the codec (a few float32 eps of
    # the bucket's scale).
    kappa = _per_element_scale(codec, payload, N)
    x_abs = np.abs(tf.cast(x, tf.float64).numpy())
    slack = (_EPS[dtype] * (x_abs + bound) + 8 * 2.0**-24 * kappa)
    self.assertTrue(np.all(err <= bound + slack),
                    msg=f"max excess {np.max(err - bound - slack)}")

  @parameterized.product(
      name=list(CODECS), shape=[[], [0], [2, 0, 3], [1], [7], [3, 5, 7]])
  def test_any_shape_round_trips_with_its_shape(self, name, shape):
    codec = CODECS[name]
    n = int(np.prod(shape))
    x = tf.reshape(_signal(n), shape)
    y = _side_information(x)
    payload, x_hat = _round_trip(codec, x, y=y)
    self.assertEqual(x_hat.shape, shape)
    self.assertEqual(x_hat.dtype, tf.float32)
    self.assertEqual(payload.shape, shape)
    self.assertEqual(32 * (payload.words.shape[0] + payload.scales.shape[0]),
                     codec.wire_bits(n))
    err = np.abs(tf.reshape(x_hat - x, [-1]).numpy())
    bound = _error_bound(codec, x, y, payload)
    kappa = _per_element_scale(codec, payload, n)
    self.assertTrue(np.all(err <= bound + 8 * 2.0**-24 * (kappa + np.abs(
        tf.reshape(x, [-1]).numpy()))))

  @parameterized.product(name=[n for n in CODECS if n != "float16"],
                         magnitude=[1e30, 1e-30])
  def test_extreme_finite_magnitudes_decode_finite_within_bound(
      self, name, magnitude):
    # Scales are computed without squaring overflow (QSGD's L2 norm of
    # values near 1e30 would overflow float32 if squared directly).
    codec = CODECS[name]
    x = _signal(N) * magnitude
    y = _side_information(x)
    payload, x_hat = _round_trip(codec, x, y=y)
    self.assertTrue(np.all(np.isfinite(payload.scales.numpy())))
    x_hat = x_hat.numpy().astype(np.float64)
    self.assertTrue(np.all(np.isfinite(x_hat)))
    x64 = x.numpy().astype(np.float64)
    kappa = _per_element_scale(codec, payload, N)
    bound = _error_bound(codec, x, y, payload)
    self.assertTrue(np.all(np.abs(x_hat - x64) <= bound + 8 * 2.0**-24 * (
        kappa + np.abs(x64))))

  @parameterized.parameters(*_codec_params(BUCKETED))
  def test_scalar_is_its_own_bucket(self, name):
    codec = CODECS[name]
    payload = codec.encode(tf.constant(-2.5), SEED)
    self.assertEqual(payload.scales.shape, [1])
    self.assertAllEqual(payload.scales, [2.5])


class SpecialValuesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*_codec_params(CODECS))
  def test_bucket_of_zeros_decodes_to_exact_zeros(self, name):
    codec = CODECS[name]
    bucket = codec.bucket_size or 64
    x = _signal(N).numpy()
    zero_buckets = [2, 5, (N - 1) // bucket]  # the last one is partial
    for b in zero_buckets:
      x[b * bucket:(b + 1) * bucket] = 0.0
    x = tf.constant(x)
    # Side information far from zero in those buckets: it must not leak.
    y = _side_information(x) + 0.3
    x_hat = _round_trip(codec, x, y=y)[1].numpy()
    for b in zero_buckets:
      self.assertAllEqual(x_hat[b * bucket:(b + 1) * bucket],
                          np.zeros_like(x_hat[b * bucket:(b + 1) * bucket]))

  @parameterized.parameters(*_codec_params(CODECS))
  def test_all_zero_tensor_decodes_to_exact_zeros(self, name):
    codec = CODECS[name]
    x = tf.zeros([N])
    x_hat = _round_trip(codec, x, y=tf.fill([N], 0.7))[1]
    self.assertAllEqual(x_hat, np.zeros(N))

  @parameterized.product(name=list(CODECS),
                         # -nan: a NaN with the sign bit set.
                         bad=[math.nan, -math.nan, math.inf, -math.inf],
                         index=[197, N - 1])
  def test_non_finite_value_poisons_its_bucket_only(self, name, bad, index):
    codec = CODECS[name]
    clean = _signal(N).numpy()
    dirty = clean.copy()
    dirty[index] = bad
    y = _side_information(tf.constant(clean))
    x_hat = _round_trip(codec, tf.constant(dirty), y=y)[1].numpy()
    reference = _round_trip(codec, tf.constant(clean), y=y)[1].numpy()
    if codec.bucket_size is None:
      poisoned = np.zeros(N, bool)
      poisoned[index] = True
    else:
      bucket = index // codec.bucket_size
      poisoned = np.arange(N) // codec.bucket_size == bucket
    self.assertFalse(np.any(np.isfinite(x_hat[poisoned])),
                     msg="finite values decoded from a non-finite bucket")
    self.assertAllEqual(_bits(x_hat[~poisoned]), _bits(reference[~poisoned]))

  @parameterized.parameters(*_codec_params(BUCKETED))
  def test_nan_in_float64_bucket_decodes_to_non_finite(self, name):
    codec = CODECS[name]
    x = _signal(N, tf.float64).numpy()
    x[3] = math.nan
    x_hat = _round_trip(codec, tf.constant(x))[1].numpy()
    self.assertFalse(np.any(np.isfinite(x_hat[:codec.bucket_size])))
    self.assertTrue(np.all(np.isfinite(x_hat[codec.bucket_size:])))


class ValidationTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(name=list(CODECS),
                         dtype=[tf.int32, tf.int64, tf.uint8, tf.bool])
  def test_integer_input_raises_type_error_naming_x(self, name, dtype):
    with self.assertRaisesRegex(TypeError, "`x`.*" + dtype.name):
      CODECS[name].encode(tf.zeros([5], dtype), SEED)

  @parameterized.parameters(
      (ndq_tf.DitheredCodec, "num_levels", 0),
      (ndq_tf.DitheredCodec, "num_levels", -1),
      (ndq_tf.DitheredCodec, "num_levels", 1.5),
      (ndq_tf.DitheredCodec, "num_levels", 2.0),
      (ndq_tf.DitheredCodec, "num_levels", "3"),
      (ndq_tf.DitheredCodec, "num_levels", True),
      (ndq_tf.DitheredCodec, "num_levels", None),
      (ndq_tf.DitheredCodec, "bucket_size", 0),
      (ndq_tf.DitheredCodec, "bucket_size", 512.0),
      (ndq_tf.DitheredCodec, "bucket_size", False),
      (ndq_tf.HalfDitheredCodec, "num_levels", 0),
      (ndq_tf.HalfDitheredCodec, "bucket_size", 0),
      (ndq_tf.HalfDitheredCodec, "dither_order", 0),
      (ndq_tf.HalfDitheredCodec, "dither_order", 2.0),
      (ndq_tf.HalfDitheredCodec, "dither_order", True),
      (ndq_tf.NestedDitheredCodec, "num_levels", 0),
      (ndq_tf.NestedDitheredCodec, "coarse_ratio", 1),
      (ndq_tf.NestedDitheredCodec, "coarse_ratio", 0),
      (ndq_tf.NestedDitheredCodec, "coarse_ratio", 3.0),
      (ndq_tf.NestedDitheredCodec, "coarse_ratio", True),
      (ndq_tf.NestedDitheredCodec, "alpha", 0),
      (ndq_tf.NestedDitheredCodec, "alpha", 0.0),
      (ndq_tf.NestedDitheredCodec, "alpha", -0.5),
      (ndq_tf.NestedDitheredCodec, "alpha", 1.5),
      (ndq_tf.NestedDitheredCodec, "alpha", math.nan),
      (ndq_tf.NestedDitheredCodec, "alpha", "0.5"),
      (ndq_tf.NestedDitheredCodec, "alpha", True),
      (ndq_tf.NestedDitheredCodec, "alpha", None),
      (ndq_tf.NestedDitheredCodec, "bucket_size", 0),
      (ndq_tf.QSGDCodec, "num_levels", 0),
      (ndq_tf.QSGDCodec, "bucket_size", 0),
      (ndq_tf.QSGDCodec, "bucket_size", "512"),
      (ndq_tf.TernGradCodec, "bucket_size", 0),
      (ndq_tf.TernGradCodec, "bucket_size", True),
  )
  def test_bad_constructor_argument_raises_value_error(self, cls, arg, value):
    with self.assertRaises(ValueError) as cm:
      cls(**{arg: value})
    message = str(cm.exception)
    self.assertIn(f"`{arg}`", message)
    # The value received, as given (or as the float it was read as).
    shown = [f"{arg}={value!r}"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      shown.append(f"{arg}={float(value)!r}")
    self.assertTrue(any(s in message for s in shown),
                    msg=f"{message!r} does not show the value {value!r}")

  def test_half_dithered_constructor_accepts_only_packable_alphabets(self):
    # 2(M + ⌊m/2⌋) + 1 symbols must fit the packer (at most 65536): the
    # largest alphabet that fits is accepted and round-trips within its
    # error bound; one level more is refused, naming both arguments.
    order = 64
    largest = ndq_tf.HalfDitheredCodec(
        num_levels=bucketed.MAX_LEVELS - order // 2, dither_order=order)
    self.assertEqual(largest.alphabet_size, 2 * bucketed.MAX_LEVELS + 1)
    x = _signal(N)
    _, decoded = _round_trip(largest, x)
    # |error| <= (M + ⌊m/2⌋)·Δ with Δ = κ/M, far below that here.
    scale = float(tf.reduce_max(tf.abs(x)))
    self.assertLess(float(tf.reduce_max(tf.abs(decoded - x))),
                    scale * (order / 2 + 1) / largest.num_levels)
    with self.assertRaisesRegex(
        ValueError, r"`num_levels` \+ `dither_order` // 2 must be at most "
        r"32767.*num_levels=32736, dither_order=64"):
      ndq_tf.HalfDitheredCodec(
          num_levels=bucketed.MAX_LEVELS - order // 2 + 1, dither_order=order)

  @parameterized.parameters(*_codec_params(SEEDED))
  def test_missing_seed_raises_value_error(self, name):
    with self.assertRaisesRegex(ValueError, "`seed`"):
      CODECS[name].encode(_signal(N))

  @parameterized.parameters("dqsg_ternary", "dqsg_m4", "ndqsg_k3")
  def test_missing_decode_seed_raises_value_error(self, name):
    codec = CODECS[name]
    x = _signal(N)
    payload = codec.encode(x, SEED)
    with self.assertRaisesRegex(ValueError, "`seed`"):
      _decode(codec, payload, None, _side_information(x))

  @parameterized.product(
      name=SEEDED,
      seed=[[1, 2, 3], [[1, 2]], 5, [1]])
  def test_seed_of_wrong_shape_raises_value_error(self, name, seed):
    with self.assertRaisesRegex(ValueError, "`seed`"):
      CODECS[name].encode(_signal(N), tf.constant(seed, tf.int32))

  @parameterized.product(name=SEEDED, dtype=[tf.float32, tf.float64])
  def test_seed_of_float_dtype_raises_type_error(self, name, dtype):
    with self.assertRaisesRegex(TypeError, "`seed`"):
      CODECS[name].encode(_signal(N), tf.constant([1, 2], dtype))

  @parameterized.parameters("dqsg_ternary", "ndqsg_k3")
  def test_decode_seed_of_wrong_shape_or_dtype_raises(self, name):
    codec = CODECS[name]
    x = _signal(N)
    payload = codec.encode(x, SEED)
    y = _side_information(x)
    with self.assertRaisesRegex(ValueError, "`seed`"):
      _decode(codec, payload, tf.constant([1, 2, 3]), y)
    with self.assertRaisesRegex(TypeError, "`seed`"):
      _decode(codec, payload, tf.constant([1.0, 2.0]), y)

  @parameterized.parameters("ndqsg_k3", "ndqsg_k4")
  def test_nested_decode_without_side_information_raises(self, name):
    codec = CODECS[name]
    payload = codec.encode(_signal(N), SEED)
    with self.assertRaisesRegex(ValueError, "`side_information`"):
      codec.decode(payload, SEED)

  def test_nested_side_information_of_wrong_shape_raises(self):
    codec = CODECS["ndqsg_k3"]
    payload = codec.encode(_signal(N), SEED)
    with self.assertRaisesRegex(ValueError, "`side_information`"):
      codec.decode(payload, SEED, side_information=tf.zeros([N + 1]))

  def test_integer_side_information_raises_type_error(self):
    codec = CODECS["ndqsg_k3"]
    payload = codec.encode(_signal(N), SEED)
    with self.assertRaisesRegex(TypeError, "`side_information`"):
      codec.decode(payload, SEED, side_information=tf.zeros([N], tf.int32))

  @parameterized.parameters(
      *[(n,) for n in CODECS if not CODECS[n].needs_side_information])
  def test_side_information_given_to_other_codecs_raises(self, name):
    codec = CODECS[name]
    x = _signal(N)
    payload = codec.encode(x, SEED)
    with self.assertRaisesRegex(ValueError, "`side_information`"):
      codec.decode(payload, SEED, side_information=x)

  def test_input_without_static_shape_raises_value_error(self):
    codec = CODECS["dqsg_ternary"]
    encode = tf.function(lambda x: codec.encode(x, SEED).words)
    with self.assertRaisesRegex(ValueError, "`x`"):
      encode.get_concrete_function(tf.TensorSpec([None], tf.float32))

  def test_decode_rejects_what_is_not_a_payload(self):
    codec = CODECS["dqsg_ternary"]
    payload = codec.encode(_signal(N), SEED)
    with self.assertRaisesRegex(TypeError, "`payload`"):
      codec.decode(payload.words, SEED)

  @parameterized.parameters(-1, 2.0, True, None)
  def test_wire_bits_rejects_bad_counts(self, n):
    with self.assertRaisesRegex(ValueError, "`num_elements`"):
      CODECS["dqsg_ternary"].wire_bits(n)


class WireFormatTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(name=list(CODECS), n=[0, 1, 7, 105, N])
  def test_wire_bits_equals_bits_of_real_payload(self, name, n):
    codec = CODECS[name]
    payload = codec.encode(_signal(n), SEED)
    self.assertEqual(payload.words.dtype, tf.int32)
    self.assertEqual(payload.scales.dtype, tf.float32)
    self.assertEqual(payload.words.shape.rank, 1)
    self.assertEqual(payload.scales.shape.rank, 1)
    real_bits = 32 * (payload.words.shape[0] + payload.scales.shape[0])
    self.assertEqual(codec.wire_bits(n), real_bits)
    self.assertEqual(
        real_bits, 32 * (codec.num_words(n) + codec.num_scales(n)))
    self.assertEqual(codec.to_wire(payload).shape, [real_bits // 32])

  @parameterized.parameters(*_codec_params(CODECS))
  def test_wire_bits_equals_bits_of_traced_payloads_of_many_sizes(self, name):
    # Tracing (without running) gives the payload's static shapes, which an
    # XLA-compiled encoder must produce: checks many sizes without compiling
    # each.
    codec = CODECS[name]
    encode = tf.function(lambda x: codec.encode(x, SEED))
    for n in (2, 20, 21, 65, 513, 65537):
      payload = encode.get_concrete_function(
          tf.TensorSpec([n], tf.float32)).structured_outputs
      self.assertEqual(
          codec.wire_bits(n),
          32 * (payload.words.shape[0] + payload.scales.shape[0]), msg=n)

  @parameterized.parameters(*_codec_params(CODECS))
  def test_wire_bits_formula(self, name):
    # Codes: ceil(n / D) words, D codes of the alphabet per word; one float32
    # scale per bucket. Float codecs: 32 or 16 bits per value.
    codec = CODECS[name]
    for n in list(range(0, 70)) + [511, 512, 513, 1000, 10**6, 2**24 + 3]:
      if isinstance(codec, ndq_tf.Float32Codec):
        expected = 32 * n
      elif isinstance(codec, ndq_tf.Float16Codec):
        expected = 32 * -(-n // 2)
      else:
        d = ndq_tf.ops.codes_per_word(codec.alphabet_size)
        expected = 32 * (-(-n // d) + -(-n // codec.bucket_size))
      self.assertEqual(codec.wire_bits(n), expected, msg=n)

  @parameterized.parameters(
      (ndq_tf.DitheredCodec(1), 3), (ndq_tf.DitheredCodec(2), 5),
      (ndq_tf.HalfDitheredCodec(1, dither_order=1), 3),
      (ndq_tf.HalfDitheredCodec(1, dither_order=2), 5),
      (ndq_tf.HalfDitheredCodec(3, dither_order=5), 11),
      (ndq_tf.NestedDitheredCodec(coarse_ratio=3), 3),
      (ndq_tf.NestedDitheredCodec(coarse_ratio=4), 4),
      (ndq_tf.QSGDCodec(2), 5), (ndq_tf.TernGradCodec(), 3))
  def test_alphabet_sizes(self, codec, expected):
    self.assertEqual(codec.alphabet_size, expected)

  def test_ternary_dqsg_bucket_512_costs_at_most_1_70_bits_per_element(self):
    codec = ndq_tf.DitheredCodec(num_levels=1, bucket_size=512)
    # 20 ternary codes per word and a float32 per 512 values:
    # 32/20 + 32/512 = 1.6625 bits, exactly when n is a multiple of 10240.
    self.assertAlmostEqual(ndq_tf.theory.bits_per_element(codec, 10240),
                           1.6625, places=12)
    for n in (10240, 10**6, 2**20, 2**24 + 1):
      self.assertLessEqual(codec.wire_bits(n) / n, 1.70, msg=n)
      self.assertEqual(ndq_tf.theory.bits_per_element(codec, n),
                       codec.wire_bits(n) / n)
    n = 102_400 + 7
    wire = codec.to_wire(codec.encode(_signal(n), SEED))
    self.assertEqual(wire.dtype, tf.int32)
    self.assertLessEqual(32 * wire.shape[0] / n, 1.70)
    self.assertEqual(32 * wire.shape[0], codec.wire_bits(n))

  @parameterized.parameters(*_codec_params(CODECS))
  def test_to_wire_from_wire_round_trip(self, name):
    codec = CODECS[name]
    x = tf.reshape(_signal(N), [7, 11, 13])
    y = _side_information(x)
    payload = codec.encode(x, SEED)
    wire = codec.to_wire(payload)
    self.assertEqual(wire.dtype, tf.int32)
    self.assertEqual(wire.shape, [codec.wire_bits(N) // 32])
    revived = codec.from_wire(wire, [7, 11, 13], tf.float32)
    self.assertIsInstance(revived, ndq_tf.Payload)
    self.assertAllEqual(revived.words, payload.words)
    self.assertAllEqual(_bits(revived.scales), _bits(payload.scales))
    self.assertAllEqual(_bits(_decode(codec, revived, SEED, y)),
                        _bits(_decode(codec, payload, SEED, y)))

  def test_to_wire_keeps_nan_scales(self):
    codec = CODECS["dqsg_ternary"]
    x = _signal(N).numpy()
    x[0] = math.nan
    payload = codec.encode(x, SEED)
    revived = codec.from_wire(codec.to_wire(payload), [N], tf.float32)
    self.assertTrue(np.isnan(revived.scales.numpy()[0]))
    self.assertAllEqual(_bits(revived.scales), _bits(payload.scales))

  def test_from_wire_rejects_wrong_length_dtype_and_shape(self):
    codec = CODECS["dqsg_ternary"]
    wire = codec.to_wire(codec.encode(_signal(N), SEED))
    with self.assertRaisesRegex(ValueError, "`wire`"):
      codec.from_wire(wire[:-1], [N], tf.float32)
    with self.assertRaisesRegex(TypeError, "`wire`"):
      codec.from_wire(tf.cast(wire, tf.float32), [N], tf.float32)
    with self.assertRaisesRegex(ValueError, "`shape`"):
      codec.from_wire(wire, [None], tf.float32)


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
    x = _signal(N)
    sigma = self._noise_scales(x)
    a = codec.encode(x, SEED, noise_scale=float(sigma[0]))
    b = codec.encode(x, SEED, noise_scale=tf.constant(sigma))
    self.assertAllEqual(a.words, b.words)
    self.assertAllEqual(a.scales, b.scales)

  @parameterized.parameters("mmse", 1.0)
  def test_eager_function_and_xla_are_bitwise_equal(self, alpha):
    codec = self._codec(alpha)
    x = _signal(N)
    y = _side_information(x)
    sigma = tf.constant(self._noise_scales(x))

    def round_trip(x, seed, sigma, y):
      payload = codec.encode(x, seed, noise_scale=sigma)
      return (payload.words, payload.scales,
              codec.decode(payload, seed, side_information=y))

    eager = round_trip(x, SEED, sigma, y)
    for jit in (False, True):
      got = tf.function(round_trip, jit_compile=jit)(x, SEED, sigma, y)
      for a, b in zip(got, eager):
        self.assertAllEqual(_bits(a), _bits(b), msg=f"jit_compile={jit}")

  @parameterized.parameters(*FLOAT_DTYPES)
  def test_error_within_bound_and_wire_size_unchanged(self, dtype):
    codec = self._codec()
    x = _signal(N, dtype)
    y = _side_information(x)
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
    slack = _EPS[dtype] * (np.abs(x64) + bound) + 1e-6 * np.max(np.abs(x64))
    self.assertTrue(np.all(err <= bound + slack),
                    msg=f"max excess {np.max(err - bound - slack)}")

  def test_unknown_or_useless_noise_scale_falls_back_to_dqsg(self):
    # σ = 0, NaN, Inf: unknown; σ large: nested would not beat DQSG. Those
    # buckets go as DQSG with k symbols (negated scale) and ignore y.
    codec = self._codec()
    x = _signal(N)
    y = _side_information(x)
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
    x = _signal(N).numpy()
    x[64:128] = 0.0
    y = _side_information(tf.constant(x)).numpy()
    y[64:128] = 0.4
    payload = codec.encode(x, SEED, noise_scale=self._noise_scales(
        tf.constant(x)))
    x_hat = codec.decode(payload, SEED, side_information=y).numpy()
    self.assertAllEqual(x_hat[64:128], np.zeros(64))

  @parameterized.parameters(math.nan, math.inf)
  def test_non_finite_value_poisons_its_bucket_only(self, bad):
    codec = self._codec()
    clean = _signal(N).numpy()
    dirty = clean.copy()
    dirty[200] = bad  # bucket 3
    y = _side_information(tf.constant(clean))
    sigma = self._noise_scales(tf.constant(clean))
    x_hat = codec.decode(codec.encode(dirty, SEED, noise_scale=sigma), SEED,
                         side_information=y).numpy()
    reference = codec.decode(codec.encode(clean, SEED, noise_scale=sigma),
                             SEED, side_information=y).numpy()
    poisoned = np.arange(N) // self.BUCKET == 3
    self.assertFalse(np.any(np.isfinite(x_hat[poisoned])))
    self.assertAllEqual(x_hat[~poisoned], reference[~poisoned])

  @parameterized.parameters(*_codec_params(
      [n for n in CODECS if not CODECS[n].accepts_noise_scale]))
  def test_other_codecs_reject_noise_scale(self, name):
    with self.assertRaisesRegex(ValueError, "`noise_scale`"):
      CODECS[name].encode(_signal(N), SEED, noise_scale=0.1)

  def test_adaptive_mode_needs_odd_coarse_ratio(self):
    with self.assertRaisesRegex(ValueError, "`coarse_ratio`.*coarse_ratio=4"):
      self._codec(alpha=1.0, coarse_ratio=4).encode(_signal(N), SEED,
                                                    noise_scale=0.1)

  def test_mmse_alpha_needs_noise_scale(self):
    with self.assertRaisesRegex(ValueError, "`noise_scale`"):
      self._codec().encode(_signal(N), SEED)

  def test_noise_scale_of_wrong_shape_or_dtype_raises(self):
    codec = self._codec()
    with self.assertRaisesRegex(ValueError, "`noise_scale`"):
      codec.encode(_signal(N), SEED,
                   noise_scale=tf.fill([self.NUM_BUCKETS + 1], 0.1))
    with self.assertRaisesRegex(TypeError, "`noise_scale`"):
      codec.encode(_signal(N), SEED,
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


class ConfigTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*_codec_params(CODECS))
  def test_get_config_from_config_round_trip(self, name):
    codec = CODECS[name]
    config = codec.get_config()
    json.dumps(config)  # plain Python values only
    revived = type(codec).from_config(config)
    self.assertIsNot(revived, codec)
    self.assertEqual(revived, codec)
    self.assertEqual(hash(revived), hash(codec))
    self.assertEqual(revived.get_config(), config)
    self.assertEqual(repr(revived), repr(codec))
    # The revived codec encodes and decodes identically.
    x = _signal(N)
    y = _side_information(x)
    p1, d1 = _round_trip(codec, x, y=y)
    p2, d2 = _round_trip(revived, x, y=y)
    self.assertAllEqual(p1.words, p2.words)
    self.assertAllEqual(_bits(d1), _bits(d2))

  @parameterized.parameters(*_codec_params(CODECS))
  def test_keras_serialization_round_trip(self, name):
    codec = CODECS[name]
    serialized = keras.saving.serialize_keras_object(codec)
    serialized = json.loads(json.dumps(serialized))
    revived = keras.saving.deserialize_keras_object(serialized)
    self.assertIsInstance(revived, type(codec))
    self.assertEqual(revived.get_config(), codec.get_config())
    self.assertEqual(codecs.get(codecs.serialize(codec)), codec)

  def test_codecs_with_other_parameters_are_not_equal(self):
    self.assertNotEqual(ndq_tf.DitheredCodec(1, 64),
                        ndq_tf.DitheredCodec(2, 64))
    self.assertNotEqual(ndq_tf.DitheredCodec(1, 64),
                        ndq_tf.HalfDitheredCodec(1, 64, dither_order=1))
    self.assertNotEqual(ndq_tf.NestedDitheredCodec(alpha=0.9),
                        ndq_tf.NestedDitheredCodec(alpha=1.0))

  def test_properties_reflect_constructor_arguments(self):
    codec = ndq_tf.NestedDitheredCodec(num_levels=4, coarse_ratio=5,
                                       alpha=0.5, bucket_size=128)
    self.assertEqual(codec.num_levels, 4)
    self.assertEqual(codec.coarse_ratio, 5)
    self.assertEqual(codec.alpha, 0.5)
    self.assertEqual(codec.bucket_size, 128)
    self.assertEqual(codec.fine_step, 0.25)
    self.assertEqual(codec.coarse_step, 1.25)
    self.assertTrue(codec.needs_side_information)
    codec = ndq_tf.DitheredCodec(num_levels=4, bucket_size=128)
    self.assertEqual(codec.step, 0.25)
    self.assertTrue(codec.decoder_needs_seed)
    self.assertFalse(ndq_tf.HalfDitheredCodec().decoder_needs_seed)

  def test_bucketed_codecs_share_the_public_base_class(self):
    for name in BUCKETED:
      self.assertIsInstance(CODECS[name], codecs.BucketedCodec, msg=name)
    for name in ("float32", "float16"):
      self.assertNotIsInstance(CODECS[name], codecs.BucketedCodec, msg=name)

  @parameterized.parameters(*_codec_params(CODECS))
  def test_only_the_decoder_seed_flag_exists(self, name):
    # `needs_seed` was renamed before any release: no alias is kept.
    codec = CODECS[name]
    self.assertIsInstance(codec.decoder_needs_seed, bool)
    self.assertFalse(hasattr(codec, "needs_seed"))
    self.assertEqual(codec.decoder_needs_seed,
                     name.startswith(("dqsg", "ndqsg")))

  @parameterized.parameters(
      ("dqsg", ndq_tf.DitheredCodec()),
      ("dqsg:num_levels=3", ndq_tf.DitheredCodec(num_levels=3)),
      (" DQSG : num_levels = 3 , bucket_size=256 ",
       ndq_tf.DitheredCodec(num_levels=3, bucket_size=256)),
      ("half_dithered:dither_order=3",
       ndq_tf.HalfDitheredCodec(dither_order=3)),
      ("ndqsg:num_levels=3,coarse_ratio=5,alpha=0.9",
       ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=5, alpha=0.9)),
      ("qsgd:num_levels=4", ndq_tf.QSGDCodec(num_levels=4)),
      ("terngrad:bucket_size=128", ndq_tf.TernGradCodec(bucket_size=128)),
      ("float32", ndq_tf.Float32Codec()),
      ("float16", ndq_tf.Float16Codec()),
  )
  def test_get_with_spec_string(self, spec, expected):
    codec = codecs.get(spec)
    self.assertIsInstance(codec, type(expected))
    self.assertEqual(codec, expected)

  def test_get_passes_codecs_through(self):
    codec = CODECS["ndqsg_k4"]
    self.assertIs(codecs.get(codec), codec)

  def test_get_unknown_name_lists_valid_names(self):
    with self.assertRaises(ValueError) as cm:
      codecs.get("dqsq:num_levels=3")
    message = str(cm.exception)
    self.assertIn("dqsq", message)
    for name in ("dqsg", "half_dithered", "ndqsg", "qsgd", "terngrad",
                 "float32", "float16"):
      self.assertIn(name, message)

  @parameterized.parameters(
      ("dqsg:num_levels", "num_levels"),
      ("dqsg:num_levels=abc", "abc"),
      ("dqsg:levels=3", "levels"),
      ("dqsg:num_levels=0", "num_levels=0"),
      ("ndqsg:alpha=1.5", "alpha=1.5"),
  )
  def test_get_malformed_spec_raises_value_error(self, spec, shown):
    with self.assertRaisesRegex(ValueError, shown):
      codecs.get(spec)

  @parameterized.parameters((3,), (None,), ([("dqsg", 1)],),
                            ({"class_name": "Dense", "config": {}},))
  def test_get_rejects_other_identifiers(self, identifier):
    with self.assertRaises((ValueError, TypeError)):
      codecs.get(identifier)


if __name__ == "__main__":
  tf.test.main()
