"""Tests of `ndq_tf.codecs.entropy_coded`: ECDQ on rotated buckets.

What is its own: the error is uniform with variance `Δ²/12` whatever the
input (unbiased), the rate is the Gaussian model's, payloads vary in
length, and the edge buckets. The API every codec shares is tested in
test_base.py (codec_cases.CODECS holds an ECDQ codec).
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from codec_cases import ecdq_sigmas
import ndq_tf
from ndq_tf import theory
from ndq_tf.codecs import entropy_coded
from ndq_tf.ops import ecdq_tables
from ndq_tf.ops import rans_ops
from ndq_tf.ops import rotation_ops

SEED = tf.constant([5, 35], tf.int32)


def _gaussian(n, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  return tf.constant(scale * rng.standard_normal(n), tf.float32)


def test_error_is_unbiased_with_variance_step_squared_over_12():
  # Rotated coefficients' errors are iid uniform on [-Δ/2, Δ/2) (Theorem
  # 1), Δ = r·σ̂ per bucket; the rotation is c times orthonormal, so
  # ‖error‖² = Σ_b Σ_i e_i² / c². Var(e²) = Δ⁴/180: the sum's relative
  # standard deviation is √(N·Δ⁴/180)/(N·Δ²/12) = 0.894/√N for equal Δ.
  codec = ndq_tf.EntropyCodedDitheredCodec(step_ratio=2.0, bucket_size=256)
  n = 2**18
  rng = np.random.default_rng(1)
  # Heavy-tailed and uneven buckets: the error does not depend on the input.
  x = tf.constant(rng.standard_t(3, n) * np.repeat(
      rng.uniform(0.1, 10, n // 256), 256), tf.float32)
  payload = codec.encode(x, SEED)
  err = (codec.decode(payload, SEED) - x).numpy().astype(np.float64)
  c2 = rotation_ops.domain_gain(256)**2
  step = codec.step_ratio * ecdq_sigmas(codec, payload, n)
  want = np.repeat(step**2 / 12 / c2, 256)
  rel = (err**2).sum() / want.sum() - 1
  # Buckets differ in Δ: the sum's standard deviation from each term's.
  sd = math.sqrt((np.repeat(step**4 / 180 / c2**2, 256)).sum()) / want.sum()
  assert abs(rel) < 6 * sd, (rel, sd)
  # Unbiased: Σ e is a sum of n zero-mean terms of variance want_i.
  z = err.sum() / math.sqrt(want.sum())
  assert abs(z) < 6, z


def test_mean_over_seeds_converges_to_the_input():
  # E[x̂] = x: averaged over K seeds the error's energy falls as 1/K.
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0, bucket_size=64)
  x = _gaussian(4096, seed=3)
  k = 64
  total = tf.zeros_like(x)
  single = None
  for s in range(k):
    seed = tf.constant([s, 7])
    decoded = codec.decode(codec.encode(x, seed), seed)
    total += decoded
    if single is None:
      single = float(tf.reduce_sum((decoded - x)**2))
  mean_err = float(tf.reduce_sum((total / k - x)**2))
  # Expected ratio 1/K; the energies are sums of 4096 terms (rel. sd ~2%).
  assert mean_err / single == pytest.approx(1 / k, rel=0.25)


@pytest.mark.parametrize("step_ratio", [4.0, 2.0, 1.0])
def test_rate_on_a_gaussian_is_the_model_rate(step_ratio):
  # The coder within 3% of the continuous model's H(Q|U) (issue #35), plus
  # σ̂ (16 bits per bucket), the length word and the lanes' headers.
  codec = ndq_tf.EntropyCodedDitheredCodec(step_ratio=step_ratio)
  n = 2**20
  payload = codec.encode(_gaussian(n, seed=2), SEED)
  bits = int(codec.payload_bits(payload))
  lanes = n // entropy_coded.SYMBOLS_PER_LANE
  overhead = 32 + 16 * n / 512 + 32 * rans_ops.rans_header_words(n, lanes)
  ideal = theory.ecdq_conditional_rate(step_ratio) * n
  assert bits - overhead <= 1.03 * ideal
  assert bits - overhead >= 0.97 * ideal
  assert bits <= codec.max_wire_bits(n)
  assert codec.wire_bits(n) == pytest.approx(bits, rel=0.03)


def test_payload_words_past_the_used_length_are_zero_and_may_be_dropped():
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0)
  x = _gaussian(50_000, seed=4)
  payload = codec.encode(x, SEED)
  used = int(codec.payload_words(payload))
  words = payload.words.numpy()
  assert 0 < used < words.shape[0] == codec.num_words(50_000)
  assert (words[used:] == 0).all()
  trimmed = np.concatenate([words[:used], np.zeros(len(words) - used,
                                                   np.int32)])
  again = codec.decode(ndq_tf.Payload(words=tf.constant(trimmed),
                                      scales=payload.scales, shape=x.shape,
                                      dtype=x.dtype), SEED)
  np.testing.assert_array_equal(again.numpy(),
                                codec.decode(payload, SEED).numpy())


def test_zero_buckets_cost_nothing_and_nonfinite_buckets_decode_to_nan():
  codec = ndq_tf.EntropyCodedDitheredCodec(step_ratio=2.0, bucket_size=64)
  x = np.zeros(64 * 40, np.float32)
  zeros_payload = codec.encode(tf.constant(x), SEED)
  # The length word, σ̂ (16 bits per bucket) and the lane's header only.
  assert int(codec.payload_bits(zeros_payload)) <= (
      32 + 16 * 40 + 32 * rans_ops.rans_header_words(64 * 40, 1) + 32)
  np.testing.assert_array_equal(
      codec.decode(zeros_payload, SEED).numpy(), x)
  rng = np.random.default_rng(5)
  x = rng.standard_normal(64 * 40).astype(np.float32)
  x[64 * 3 + 5] = np.nan
  x[64 * 7 + 1] = np.inf
  x[64 * 9:64 * 10] = 0.0
  decoded = codec.decode(codec.encode(tf.constant(x), SEED), SEED).numpy()
  bad = np.zeros(40, bool)
  bad[[3, 7]] = True
  by_bucket = decoded.reshape(40, 64)
  assert np.isnan(by_bucket[bad]).all()
  assert np.isfinite(by_bucket[~bad]).all()
  np.testing.assert_array_equal(by_bucket[9], 0.0)


def test_same_bits_eagerly_in_tf_function_and_under_xla():
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=0.7, bucket_size=128)
  x = _gaussian(10_000, seed=6)

  def roundtrip(x):
    payload = codec.encode(x, SEED)
    return payload.words, codec.decode(payload, SEED)

  eager = roundtrip(x)
  for fn in (tf.function(roundtrip),
             tf.function(roundtrip, jit_compile=True)):
    for a, b in zip(eager, fn(x)):
      np.testing.assert_array_equal(
          tf.bitcast(a, tf.int32).numpy() if a.dtype != tf.int32
          else a.numpy(),
          tf.bitcast(b, tf.int32).numpy() if b.dtype != tf.int32
          else b.numpy())


def test_bits_target_maps_through_the_gaussian_formula():
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0)
  assert codec.step_ratio == theory.ecdq_step_ratio(1.0)
  assert ndq_tf.EntropyCodedDitheredCodec() == codec  # 1 bit by default.
  assert codec.get_config() == {"bits": 1.0, "bucket_size": 512,
                                "bins": 32, "precision": 15}
  again = ndq_tf.codecs.get("ecdq:bits=1.0")
  assert again == codec
  assert ndq_tf.codecs.get(ndq_tf.codecs.serialize(codec)) == codec
  assert codec.table_digest() == ecdq_tables.table_digest(
      codec.step_ratio, 512, 32, 15)
  assert codec.variable_length and not ndq_tf.DitheredCodec().variable_length
  assert codec.summed_form() is None


@pytest.mark.parametrize("kwargs, message", [
    ({"step_ratio": 1.0, "bits": 1.0}, r"not both.*step_ratio=1.0, "
                                        r"bits=1.0"),
    ({"step_ratio": 0.0}, r"`step_ratio`.*step_ratio=0.0"),
    ({"step_ratio": 40.0}, r"`step_ratio`.*step_ratio=40.0"),
    ({"bits": 0.1}, r"`bits`.*bits=0.1"),
    ({"bits": float("nan")}, r"`bits`.*bits=nan"),
    ({"bits": 1.0, "bucket_size": 500}, r"bucket_size.*500"),
    ({"bits": 1.0, "bins": 3}, r"`bins`.*bins=3"),
    ({"bits": 1.0, "precision": 16}, r"`precision`.*precision=16"),
])
def test_bad_arguments_name_the_argument_and_the_value(kwargs, message):
  with pytest.raises(ValueError, match=message):
    ndq_tf.EntropyCodedDitheredCodec(**kwargs)
