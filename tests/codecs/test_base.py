"""Tests of `ndq_tf.codecs.base`: the API every codec shares.

Determinism, compilation modes, shapes, dtypes, bad inputs, wire format,
configs and equality, and encoding in chunks with the whole buffer's dither
(`dither_offset`, issue #12), for every codec. What is a codec's own is in
test_dithered.py, test_baselines.py, test_bucketed.py and test_nested.py,
`ndq_tf.codecs.get` in test_registry.py, the statistical properties in
test_codec_statistics.py; the codecs and helpers they share in
codec_cases.py.

Every codec is configured once at module level and shared by the tests, and
the tests reuse a few tensor sizes: a codec compiles its encoder and decoder
with XLA once per (size, compute dtype), and those compilations dominate the
run time.
"""

import json
import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from codec_cases import (
    CODECS,
    SEEDED,
    BUCKETED,
    SEED,
    OTHER_SEED,
    N,
    FLOAT_DTYPES,
    EPS,
    codec_params,
    make_signal,
    side_information_of,
    decode_with,
    encode_decode,
    bits_of,
    per_element_scale,
    static_wire_bits,
    error_bound)
import ndq_tf
from ndq_tf.codecs import base


class DeterminismTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*codec_params(CODECS))
  def test_identical_seed_yields_identical_output(self, name):
    codec = CODECS[name]
    x = make_signal(N)
    p1, d1 = encode_decode(codec, x, tf.constant([12, 34]))
    p2, d2 = encode_decode(codec, x, [12, 34])
    self.assertAllEqual(p1.words, p2.words)
    self.assertAllEqual(bits_of(p1.scales), bits_of(p2.scales))
    self.assertAllEqual(bits_of(d1), bits_of(d2))

  @parameterized.parameters(*codec_params(SEEDED))
  def test_other_seed_yields_other_output(self, name):
    codec = CODECS[name]
    x = make_signal(N)
    p1, d1 = encode_decode(codec, x, SEED)
    p2, d2 = encode_decode(codec, x, OTHER_SEED)
    self.assertNotAllEqual(p1.words, p2.words)
    self.assertNotAllEqual(d1, d2)
    # The scales do not depend on the seed.
    self.assertAllEqual(p1.scales, p2.scales)

  @parameterized.parameters("dqsg_ternary", "dqsg_m4", "ndqsg_k3", "ecdq")
  def test_decoding_with_another_seed_gives_another_result(self, name):
    codec = CODECS[name]
    x = make_signal(N)
    y = side_information_of(x)
    payload = codec.encode(x, SEED)
    self.assertNotAllEqual(decode_with(codec, payload, SEED, y),
                           decode_with(codec, payload, OTHER_SEED, y))

  @parameterized.parameters("half_order2", "qsgd", "terngrad")
  def test_decode_needs_no_seed(self, name):
    codec = CODECS[name]
    self.assertFalse(codec.decoder_needs_seed)
    x = make_signal(N)
    payload = codec.encode(x, SEED)
    self.assertAllEqual(codec.decode(payload), codec.decode(payload, SEED))

  @parameterized.parameters("float32", "float16", "bfloat16")
  def test_unseeded_codecs_need_no_seed(self, name):
    codec = CODECS[name]
    x = make_signal(N)
    payload = codec.encode(x)
    self.assertAllEqual(bits_of(codec.decode(payload)), bits_of(encode_decode(
        codec, x)[1]))

  @parameterized.parameters("dqsg_ternary", "ndqsg_k3", "half_order2", "ecdq")
  def test_seed_value_not_its_dtype_selects_the_dither(self, name):
    # A sender with an int64 seed (e.g. derived from an int64 step counter)
    # and a receiver passing the same values as a Python list (int32) must
    # agree, as TF's own stateless ops do (tf.random.stateless_uniform gives
    # the same numbers for int32 and int64 seeds of equal value).
    codec = CODECS[name]
    x = make_signal(N)
    p64 = codec.encode(x, tf.constant([12, 34], tf.int64))
    p32 = codec.encode(x, [12, 34])
    differ = np.mean(p64.words.numpy() != p32.words.numpy())
    self.assertEqual(differ, 0.0,
                     msg=f"{differ:.0%} of the words differ between the "
                     "int64 seed [12, 34] and the int32 seed [12, 34]")
    y = side_information_of(x)
    decoded = decode_with(codec, p64, [12, 34], y).numpy()
    error = np.max(np.abs(decoded - x.numpy()))
    self.assertAllEqual(decoded, decode_with(codec, p32, [12, 34], y),
                        msg=f"max decode error {error}")


class CompilationTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*codec_params(CODECS))
  def test_eager_function_and_xla_are_bitwise_equal(self, name):
    codec = CODECS[name]
    x = make_signal(N)
    y = side_information_of(x)

    def encode(x, seed):
      p = codec.encode(x, seed)
      return p.words, p.scales

    def decode(words, scales, seed, y):
      payload = ndq_tf.Payload(words=words, scales=scales, shape=x.shape,
                               dtype=x.dtype)
      return decode_with(codec, payload, seed, y)

    eager_words, eager_scales = encode(x, SEED)
    eager_decoded = decode(eager_words, eager_scales, SEED, y)
    for jit in (False, True):
      words, scales = tf.function(encode, jit_compile=jit)(x, SEED)
      self.assertAllEqual(words, eager_words, msg=f"jit_compile={jit}")
      self.assertAllEqual(bits_of(scales), bits_of(eager_scales))
      decoded = tf.function(decode, jit_compile=jit)(eager_words, eager_scales,
                                                     SEED, y)
      self.assertAllEqual(bits_of(decoded), bits_of(eager_decoded),
                          msg=f"jit_compile={jit}")

  def test_payload_passes_through_tf_function(self):
    codec = CODECS["dqsg_ternary"]
    x = make_signal(N)
    payload = codec.encode(x, SEED)
    decode = tf.function(lambda p, s: codec.decode(p, s))
    self.assertAllEqual(decode(payload, SEED), codec.decode(payload, SEED))

  def test_bucket_division_is_correctly_rounded_under_xla(self):
    # XLA in TF 2.22 turns `x / s[:, None]` into `x * (1/s)[:, None]`, 1 ulp
    # off for about a quarter of the elements: the scaled values, hence the
    # codes and the nested decode, would differ from TF <= 2.21's.
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((8, 512)) *
         np.exp2(rng.integers(-40, 40, (8, 512)))).astype(np.float32)
    step = (rng.uniform(0.5, 1.0, 8) *
            np.exp2(rng.integers(-40, 40, 8))).astype(np.float32)
    expected = x / step[:, None]  # NumPy's IEEE division, correctly rounded.
    for jit in (False, True):
      normalized = tf.function(base.normalize, jit_compile=jit,
                               autograph=False)(tf.constant(x),
                                                tf.constant(step))
      self.assertAllEqual(bits_of(normalized), bits_of(expected),
                          msg=f"jit_compile={jit}")

class ShapeAndDtypeTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(name=list(CODECS), dtype=FLOAT_DTYPES)
  def test_decode_has_input_dtype_and_error_within_bound(self, name, dtype):
    codec = CODECS[name]
    x = make_signal(N, dtype)
    y = side_information_of(x)
    payload, x_hat = encode_decode(codec, x, y=y)
    self.assertEqual(x_hat.dtype, dtype)
    self.assertEqual(x_hat.shape, x.shape)
    self.assertEqual(payload.words.dtype, tf.int32)
    self.assertEqual(payload.scales.dtype, tf.float32)
    self.assertTrue(np.all(np.isfinite(tf.cast(x_hat, tf.float64))))
    err = np.abs(tf.cast(x_hat, tf.float64).numpy() -
                 tf.cast(x, tf.float64).numpy())
    bound = error_bound(codec, x, y, payload)
    # Plus the rounding to the output dtype (half an eps of |x̂| <= |x| +
    # bound) and float32 arithmetic inside the codec (a few float32 eps of
    # the bucket's scale).
    kappa = per_element_scale(codec, payload, N)
    x_abs = np.abs(tf.cast(x, tf.float64).numpy())
    slack = (EPS[dtype] * (x_abs + bound) + 8 * 2.0**-24 * kappa)
    self.assertTrue(np.all(err <= bound + slack),
                    msg=f"max excess {np.max(err - bound - slack)}")

  @parameterized.product(
      name=list(CODECS), shape=[[], [0], [2, 0, 3], [1], [7], [3, 5, 7]])
  def test_any_shape_round_trips_with_its_shape(self, name, shape):
    codec = CODECS[name]
    n = int(np.prod(shape))
    x = tf.reshape(make_signal(n), shape)
    y = side_information_of(x)
    payload, x_hat = encode_decode(codec, x, y=y)
    self.assertEqual(x_hat.shape, shape)
    self.assertEqual(x_hat.dtype, tf.float32)
    self.assertEqual(payload.shape, shape)
    real_bits = 32 * (payload.words.shape[0] + payload.scales.shape[0])
    self.assertEqual(real_bits, static_wire_bits(codec, n))
    if codec.variable_length:
      self.assertBetween(int(codec.payload_bits(payload)), 0, real_bits)
    err = np.abs(tf.reshape(x_hat - x, [-1]).numpy())
    bound = error_bound(codec, x, y, payload)
    kappa = per_element_scale(codec, payload, n)
    self.assertTrue(np.all(err <= bound + 8 * 2.0**-24 * (kappa + np.abs(
        tf.reshape(x, [-1]).numpy()))))

  @parameterized.product(name=[n for n in CODECS if n != "float16"],
                         magnitude=[1e30, 1e-30])
  def test_extreme_finite_magnitudes_decode_finite_within_bound(
      self, name, magnitude):
    # Scales are computed without squaring overflow (QSGD's L2 norm of
    # values near 1e30 would overflow float32 if squared directly).
    codec = CODECS[name]
    x = make_signal(N) * magnitude
    y = side_information_of(x)
    payload, x_hat = encode_decode(codec, x, y=y)
    self.assertTrue(np.all(np.isfinite(payload.scales.numpy())))
    x_hat = x_hat.numpy().astype(np.float64)
    self.assertTrue(np.all(np.isfinite(x_hat)))
    x64 = x.numpy().astype(np.float64)
    kappa = per_element_scale(codec, payload, N)
    bound = error_bound(codec, x, y, payload)
    self.assertTrue(np.all(np.abs(x_hat - x64) <= bound + 8 * 2.0**-24 * (
        kappa + np.abs(x64))))

  @parameterized.parameters(*codec_params(BUCKETED))
  def test_scalar_is_its_own_bucket(self, name):
    codec = CODECS[name]
    payload = codec.encode(tf.constant(-2.5), SEED)
    self.assertEqual(payload.scales.shape, [codec.num_scales(1)])
    # The one bucket's scale: a float32 scale on the wire, or ECDQ's σ̂ in
    # the words (the bucket's L2 norm, 2.5, back from σ̂ = 2.5·c/√d).
    self.assertAllEqual(per_element_scale(codec, payload, 1), [2.5])


class SpecialValuesTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*codec_params(CODECS))
  def test_bucket_of_zeros_decodes_to_exact_zeros(self, name):
    codec = CODECS[name]
    bucket = codec.bucket_size or 64
    x = make_signal(N).numpy()
    zero_buckets = [2, 5, (N - 1) // bucket]  # the last one is partial
    for b in zero_buckets:
      x[b * bucket:(b + 1) * bucket] = 0.0
    x = tf.constant(x)
    # Side information far from zero in those buckets: it must not leak.
    y = side_information_of(x) + 0.3
    x_hat = encode_decode(codec, x, y=y)[1].numpy()
    for b in zero_buckets:
      self.assertAllEqual(x_hat[b * bucket:(b + 1) * bucket],
                          np.zeros_like(x_hat[b * bucket:(b + 1) * bucket]))

  @parameterized.parameters(*codec_params(CODECS))
  def test_all_zero_tensor_decodes_to_exact_zeros(self, name):
    codec = CODECS[name]
    x = tf.zeros([N])
    x_hat = encode_decode(codec, x, y=tf.fill([N], 0.7))[1]
    self.assertAllEqual(x_hat, np.zeros(N))

  @parameterized.product(name=list(CODECS),
                         # -nan: a NaN with the sign bit set.
                         bad=[math.nan, -math.nan, math.inf, -math.inf],
                         index=[197, N - 1])
  def test_non_finite_value_poisons_its_bucket_only(self, name, bad, index):
    codec = CODECS[name]
    clean = make_signal(N).numpy()
    dirty = clean.copy()
    dirty[index] = bad
    y = side_information_of(tf.constant(clean))
    x_hat = encode_decode(codec, tf.constant(dirty), y=y)[1].numpy()
    reference = encode_decode(codec, tf.constant(clean), y=y)[1].numpy()
    if codec.bucket_size is None:
      poisoned = np.zeros(N, bool)
      poisoned[index] = True
    else:
      bucket = index // codec.bucket_size
      poisoned = np.arange(N) // codec.bucket_size == bucket
    self.assertFalse(np.any(np.isfinite(x_hat[poisoned])),
                     msg="finite values decoded from a non-finite bucket")
    self.assertAllEqual(bits_of(x_hat[~poisoned]),
                        bits_of(reference[~poisoned]))

  @parameterized.parameters(*codec_params(BUCKETED))
  def test_nan_in_float64_bucket_decodes_to_non_finite(self, name):
    codec = CODECS[name]
    x = make_signal(N, tf.float64).numpy()
    x[3] = math.nan
    x_hat = encode_decode(codec, tf.constant(x))[1].numpy()
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

  @parameterized.parameters(*codec_params(SEEDED))
  def test_missing_seed_raises_value_error(self, name):
    with self.assertRaisesRegex(ValueError, "`seed`"):
      CODECS[name].encode(make_signal(N))

  @parameterized.parameters("dqsg_ternary", "dqsg_m4", "ndqsg_k3", "ecdq")
  def test_missing_decode_seed_raises_value_error(self, name):
    codec = CODECS[name]
    x = make_signal(N)
    payload = codec.encode(x, SEED)
    with self.assertRaisesRegex(ValueError, "`seed`"):
      decode_with(codec, payload, None, side_information_of(x))

  @parameterized.product(
      name=SEEDED,
      seed=[[1, 2, 3], [[1, 2]], 5, [1]])
  def test_seed_of_wrong_shape_raises_value_error(self, name, seed):
    with self.assertRaisesRegex(ValueError, "`seed`"):
      CODECS[name].encode(make_signal(N), tf.constant(seed, tf.int32))

  @parameterized.product(name=SEEDED, dtype=[tf.float32, tf.float64])
  def test_seed_of_float_dtype_raises_type_error(self, name, dtype):
    with self.assertRaisesRegex(TypeError, "`seed`"):
      CODECS[name].encode(make_signal(N), tf.constant([1, 2], dtype))

  @parameterized.parameters("dqsg_ternary", "ndqsg_k3")
  def test_decode_seed_of_wrong_shape_or_dtype_raises(self, name):
    codec = CODECS[name]
    x = make_signal(N)
    payload = codec.encode(x, SEED)
    y = side_information_of(x)
    with self.assertRaisesRegex(ValueError, "`seed`"):
      decode_with(codec, payload, tf.constant([1, 2, 3]), y)
    with self.assertRaisesRegex(TypeError, "`seed`"):
      decode_with(codec, payload, tf.constant([1.0, 2.0]), y)

  @parameterized.parameters(
      *[(n,) for n in CODECS if not CODECS[n].needs_side_information])
  def test_side_information_given_to_other_codecs_raises(self, name):
    codec = CODECS[name]
    x = make_signal(N)
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
    payload = codec.encode(make_signal(N), SEED)
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
    payload = codec.encode(make_signal(n), SEED)
    self.assertEqual(payload.words.dtype, tf.int32)
    self.assertEqual(payload.scales.dtype, tf.float32)
    self.assertEqual(payload.words.shape.rank, 1)
    self.assertEqual(payload.scales.shape.rank, 1)
    real_bits = 32 * (payload.words.shape[0] + payload.scales.shape[0])
    self.assertEqual(static_wire_bits(codec, n), real_bits)
    self.assertEqual(
        real_bits, 32 * (codec.num_words(n) + codec.num_scales(n)))
    self.assertEqual(codec.to_wire(payload).shape, [real_bits // 32])
    if codec.variable_length:
      used = int(codec.payload_words(payload))
      self.assertEqual(32 * used, int(codec.payload_bits(payload)))
      self.assertBetween(used, 0, payload.words.shape[0])
      self.assertAllEqual(payload.words[used:],
                          np.zeros(payload.words.shape[0] - used))

  @parameterized.parameters(*codec_params(CODECS))
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
          static_wire_bits(codec, n),
          32 * (payload.words.shape[0] + payload.scales.shape[0]), msg=n)

  @parameterized.parameters(*codec_params(CODECS))
  def test_wire_bits_formula(self, name):
    # Codes: ceil(n / D) words, D codes of the alphabet per word; one float32
    # scale per bucket. Float codecs: 32 or 16 bits per value. A
    # variable-length codec: an expectation of whole words, at most the
    # padded payload, growing with n.
    codec = CODECS[name]
    previous = 0
    for n in list(range(0, 70)) + [511, 512, 513, 1000, 10**6, 2**24 + 3]:
      if codec.variable_length:
        bits = codec.wire_bits(n)
        self.assertEqual(bits % 32, 0, msg=n)
        self.assertBetween(bits, previous, codec.max_wire_bits(n), msg=n)
        self.assertEqual(codec.max_wire_bits(n),
                         32 * (codec.num_words(n) + codec.num_scales(n)))
        previous = bits
        continue
      if isinstance(codec, ndq_tf.Float32Codec):
        expected = 32 * n
      elif isinstance(codec, (ndq_tf.Float16Codec, ndq_tf.BFloat16Codec)):
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

  @parameterized.parameters(*codec_params(CODECS))
  def test_to_wire_from_wire_round_trip(self, name):
    codec = CODECS[name]
    x = tf.reshape(make_signal(N), [7, 11, 13])
    y = side_information_of(x)
    payload = codec.encode(x, SEED)
    wire = codec.to_wire(payload)
    self.assertEqual(wire.dtype, tf.int32)
    self.assertEqual(wire.shape, [static_wire_bits(codec, N) // 32])
    revived = codec.from_wire(wire, [7, 11, 13], tf.float32)
    self.assertIsInstance(revived, ndq_tf.Payload)
    self.assertAllEqual(revived.words, payload.words)
    self.assertAllEqual(bits_of(revived.scales), bits_of(payload.scales))
    decoded = bits_of(decode_with(codec, payload, SEED, y))
    self.assertAllEqual(bits_of(decode_with(codec, revived, SEED, y)),
                        decoded)
    if codec.variable_length:
      # Only the used words matter: a receiver may pad a trimmed payload
      # with anything.
      used = int(codec.payload_words(payload))
      garbage = np.full(wire.shape[0] - used, 0x5A5A5A5A, np.int32)
      trimmed = tf.concat([wire[:used], garbage], 0)
      revived = codec.from_wire(trimmed, [7, 11, 13], tf.float32)
      self.assertAllEqual(bits_of(decode_with(codec, revived, SEED, y)),
                          decoded)

  def test_to_wire_keeps_nan_scales(self):
    codec = CODECS["dqsg_ternary"]
    x = make_signal(N).numpy()
    x[0] = math.nan
    payload = codec.encode(x, SEED)
    revived = codec.from_wire(codec.to_wire(payload), [N], tf.float32)
    self.assertTrue(np.isnan(revived.scales.numpy()[0]))
    self.assertAllEqual(bits_of(revived.scales), bits_of(payload.scales))

  def test_from_wire_rejects_wrong_length_dtype_and_shape(self):
    codec = CODECS["dqsg_ternary"]
    wire = codec.to_wire(codec.encode(make_signal(N), SEED))
    with self.assertRaisesRegex(ValueError, "`wire`"):
      codec.from_wire(wire[:-1], [N], tf.float32)
    with self.assertRaisesRegex(TypeError, "`wire`"):
      codec.from_wire(tf.cast(wire, tf.float32), [N], tf.float32)
    with self.assertRaisesRegex(ValueError, "`shape`"):
      codec.from_wire(wire, [None], tf.float32)


OFFSET_SEED = tf.constant([5, -9])


OFFSET_CODECS = {
    "dqsg1": ndq_tf.DitheredCodec(num_levels=1, bucket_size=64),
    "dqsg3": ndq_tf.DitheredCodec(num_levels=3, bucket_size=64),
    "half": ndq_tf.HalfDitheredCodec(num_levels=2, bucket_size=64,
                                     dither_order=3),
    "ndqsg": ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                        bucket_size=64),
    "terngrad": ndq_tf.TernGradCodec(bucket_size=64),
    "qsgd": ndq_tf.QSGDCodec(num_levels=2, bucket_size=64),
}


def _decode(codec, x, offset, side):
  kwargs = {"side_information": side} if codec.needs_side_information else {}
  payload = codec.encode(x, OFFSET_SEED, dither_offset=offset)
  return codec.decode(payload, OFFSET_SEED, dither_offset=offset,
                      **kwargs).numpy()


class DitherOffsetTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*[(k, k) for k in OFFSET_CODECS])
  def test_chunks_decode_to_the_slices_of_the_whole_buffer(self, name):
    codec = OFFSET_CODECS[name]
    rng = np.random.default_rng(1)
    x = rng.normal(size=64 * 10).astype(np.float32)
    side = x + rng.normal(scale=0.05, size=x.shape).astype(np.float32)
    whole = _decode(codec, x, 0, side)
    for a, b in ((0, 192), (192, 256), (256, 640)):
      for offset in (a, tf.constant(a), tf.constant(a, tf.int64)):
        chunk = _decode(codec, x[a:b], offset, side[a:b])
        np.testing.assert_array_equal(
            chunk.view(np.int32), whole[a:b].view(np.int32),
            err_msg=f"{name} chunk {a}:{b}")

  def test_another_offset_draws_another_dither(self):
    codec = OFFSET_CODECS["dqsg1"]
    x = np.random.default_rng(2).normal(size=640).astype(np.float32)
    whole = _decode(codec, x, 0, None)
    shifted = _decode(codec, x[128:256], 64, None)
    self.assertGreater(np.mean(shifted != whole[128:256]), 0.3)

  @parameterized.parameters(-64, 32, 1)
  def test_offset_off_the_bucket_grid_raises_naming_it(self, offset):
    with self.assertRaisesRegex(
        ValueError, r"`dither_offset` must be a non-negative multiple of "
        rf"bucket_size=64. Received: dither_offset={offset}"):
      OFFSET_CODECS["dqsg1"].encode(tf.ones([64]), OFFSET_SEED,
                                    dither_offset=offset)

  @parameterized.parameters(1.0, True, "64")
  def test_offset_of_another_type_raises_naming_it(self, offset):
    with self.assertRaisesRegex(TypeError, "`dither_offset` must be an int"):
      OFFSET_CODECS["dqsg1"].encode(tf.ones([64]), OFFSET_SEED,
                                    dither_offset=offset)

  def test_float_codecs_ignore_the_offset(self):
    x = tf.constant(np.arange(10, dtype=np.float32))
    for codec in (ndq_tf.Float32Codec(), ndq_tf.Float16Codec(),
                  ndq_tf.BFloat16Codec()):
      payload = codec.encode(x, dither_offset=128)
      self.assertAllEqual(codec.decode(payload, dither_offset=128), x)


class ConfigTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*codec_params(CODECS))
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
    x = make_signal(N)
    y = side_information_of(x)
    p1, d1 = encode_decode(codec, x, y=y)
    p2, d2 = encode_decode(revived, x, y=y)
    self.assertAllEqual(p1.words, p2.words)
    self.assertAllEqual(bits_of(d1), bits_of(d2))

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

  @parameterized.parameters(*codec_params(CODECS))
  def test_only_the_decoder_seed_flag_exists(self, name):
    # `needs_seed` was renamed before any release: no alias is kept.
    codec = CODECS[name]
    self.assertIsInstance(codec.decoder_needs_seed, bool)
    self.assertFalse(hasattr(codec, "needs_seed"))
    self.assertEqual(codec.decoder_needs_seed,
                     name.startswith(("dqsg", "ndqsg", "ecdq")))


if __name__ == "__main__":
  tf.test.main()
