"""Tests of `ndq_tf.codecs.bucketed`: what the bucketed codecs share.

The public base class, and the randomized Hadamard rotation (issue #17):
every bucketed codec with `rotation="hadamard"` decodes identically in
every mode, chunks, padding, zeros and NaN buckets, unbiasedness and the
error energy of `ndq_tf.theory` (fixed seeds, tolerances derived from the
theory), bad arguments, configs. The transform itself:
ops/test_rotation_ops.py; under `ndq_tf.MirroredStrategy`:
integration/test_rotation.py; worker processes:
integration/test_rotation_multi_worker.py.
"""

import math

from absl.testing import parameterized
import keras
import numpy as np
import pytest
import tensorflow as tf

from codec_cases import CODECS, SCALED
import ndq_tf
from ndq_tf import codecs
from ndq_tf import ops
from ndq_tf import theory
from ndq_tf.ops import rotation_ops

SEED = tf.constant([2024, 7], tf.int32)

ROTATED = {
    "dqsg": ndq_tf.DitheredCodec(num_levels=2, bucket_size=64,
                                 rotation="hadamard"),
    "half_dithered": ndq_tf.HalfDitheredCodec(bucket_size=128,
                                              rotation="hadamard"),
    "ndqsg": ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                        bucket_size=64, rotation="hadamard"),
    "terngrad": ndq_tf.TernGradCodec(bucket_size=32, rotation="hadamard"),
    "qsgd": ndq_tf.QSGDCodec(num_levels=2, bucket_size=256,
                             rotation="hadamard"),
}


def _heavy(n, seed=0):
  """Heavy-tailed values (Student t, 2 degrees of freedom), like gradients."""
  return np.random.default_rng(seed).standard_t(2, size=n).astype(np.float32)


def _side(codec, x):
  if codec.needs_side_information:
    return {"side_information": x + np.float32(0.01)}
  return {}


# -- The transform ----------------------------------------------------------


# -- Codecs -----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ROTATED))
def test_decode_is_the_same_bits_eager_in_a_function_and_under_xla(name):
  codec = ROTATED[name]
  x = tf.constant(_heavy(1000, seed=1))
  kwargs = _side(codec, x)

  def round_trip(x, seed):
    payload = codec.encode(x, seed)
    return payload.words, payload.scales, codec.decode(payload, seed,
                                                       **kwargs)

  eager = [t.numpy() for t in round_trip(x, SEED)]
  for jit in (False, True):
    got = tf.function(round_trip, jit_compile=jit)(x, SEED)
    for a, b in zip(got, eager):
      np.testing.assert_array_equal(a.numpy(), b, err_msg=f"jit={jit}")


@pytest.mark.parametrize("name", sorted(ROTATED))
def test_a_partial_last_bucket_is_padded_and_sent_whole(name):
  codec = ROTATED[name]
  d = codec.bucket_size
  n = 3 * d + 5
  x = _heavy(n, seed=2)
  payload = codec.encode(x, SEED)
  assert payload.words.shape[0] == ops.num_words(4 * d, codec.alphabet_size)
  assert codec.wire_bits(n) == 32 * (payload.words.shape[0] + 4)
  y = codec.decode(payload, SEED, **_side(codec, x)).numpy()
  assert y.shape == (n,) and np.all(np.isfinite(y))
  # Zeros decode to zeros, a NaN spoils its bucket only.
  zeros = codec.decode(codec.encode(np.zeros(n, np.float32), SEED), SEED,
                       **_side(codec, np.zeros(n, np.float32))).numpy()
  np.testing.assert_array_equal(zeros, np.zeros(n, np.float32))
  bad = x.copy()
  bad[d + 1] = np.nan
  got = codec.decode(codec.encode(bad, SEED), SEED,
                     **_side(codec, bad)).numpy()
  assert np.isnan(got[d:2 * d]).all()
  assert np.isfinite(np.delete(got, np.s_[d:2 * d])).all()


@pytest.mark.parametrize("name", ["dqsg", "terngrad", "ndqsg"])
def test_a_chunk_decodes_to_its_slice_of_the_whole_buffer(name):
  codec = ROTATED[name]
  d = codec.bucket_size
  x = _heavy(6 * d, seed=3)
  whole = codec.decode(codec.encode(x, SEED), SEED, **_side(codec, x)).numpy()
  part = x[2 * d:4 * d]
  got = codec.decode(codec.encode(part, SEED, dither_offset=2 * d), SEED,
                     dither_offset=2 * d, **_side(codec, part)).numpy()
  np.testing.assert_array_equal(got, whole[2 * d:4 * d])


def test_rotation_spreads_an_outlier():
  """One spike per bucket: unrotated DQSG's worst case, d·Δ²/12 per ‖g‖²."""
  d, m = 512, 1
  x = np.zeros(64 * d, np.float32)
  x[::d] = 1.0
  plain = ndq_tf.DitheredCodec(num_levels=m, bucket_size=d)
  rotated = ndq_tf.DitheredCodec(num_levels=m, bucket_size=d,
                                 rotation="hadamard")
  energy = float(np.sum(x * x))
  err = {}
  for codec in (plain, rotated):
    y = codec.decode(codec.encode(x, SEED), SEED).numpy()
    err[codec.rotation] = float(np.sum((y - x)**2)) / energy
  # 64·512 uniform errors: relative standard error 0.894/sqrt(n), six of them.
  tol = 6 * 0.894 / math.sqrt(x.size)
  assert abs(err[None] / (d / 12 / m**2) - 1) < tol
  # A spike's rotation is flat: every |coefficient| is 1/sqrt(d).
  assert abs(err["hadamard"] / (1 / 12 / m**2) - 1) < tol
  assert err["hadamard"] < theory.rotated_dithered_vnmse_bound(d, m)


def _errors(codec, x, num_seeds):
  """The decode errors over seeds, `[S, n]` float64, and the wire scales."""
  errors, scales = [], []
  for s in range(num_seeds):
    seed = tf.constant([s, 99], tf.int32)
    payload = codec.encode(x, seed)
    y = codec.decode(payload, seed, **_side(codec, x)).numpy()
    errors.append(y.astype(np.float64) - x)
    scales.append(payload.scales.numpy())
  return np.array(errors), np.array(scales)


@pytest.mark.parametrize("num_levels", [1, 2])
def test_rotated_dqsg_is_unbiased_with_the_rotated_error_energy(num_levels):
  d = 256
  codec = ndq_tf.DitheredCodec(num_levels=num_levels, bucket_size=d,
                               rotation="hadamard")
  x = _heavy(64 * d, seed=4)
  errors, scales = _errors(codec, x, num_seeds=8)
  # Per seed, the theory's energy from that seed's rotated scales.
  want = sum(theory.rotated_dithered_total_mse(s, d, num_levels)
             for s in scales)
  got = float(np.sum(errors**2))
  # Sums of n uniform squares: relative standard error 0.894/sqrt(n).
  assert abs(got / want - 1) < 6 * 0.894 / math.sqrt(errors.size)
  # Unbiased: the projection of the mean error on x is N(0, 1) in units of
  # its standard deviation (the per-element variance is the bucket's).
  var = np.repeat(np.mean([(np.array(theory.rotated_scales(s, d)) /
                            num_levels)**2 / 12 for s in scales], axis=0), d)
  mean = errors.mean(axis=0)
  z = np.sum(mean * x) / math.sqrt(np.sum(x * x * var) / len(errors))
  assert abs(z) < 6


def _stochastic_rounding_moments(y, step):
  """`E e²` and `Var e²` of stochastic rounding of `y` to multiples of `step`.

  `e = step·(1 - p)` with probability `p`, `-step·p` otherwise, `p` the
  fractional part of `|y|/step`.
  """
  t = np.abs(y) / step
  p = t - np.floor(t)
  mean = step**2 * p * (1 - p)
  fourth = step**4 * (p * (1 - p)**4 + (1 - p) * p**4)
  return mean, fourth - mean**2


@pytest.mark.parametrize("name", ["terngrad", "qsgd", "half_dithered"])
def test_rotated_stochastic_codecs_are_unbiased_with_their_variance(name):
  """The rotated coefficients' variances, summed: the error energy.

  The codec quantizes `y = c·R·x` (`c = domain_gain`); its error `e` there
  comes back as `Rᵀe/c`: energy `‖e‖²/c²` per bucket, and `x·(Rᵀe/c) =
  y·e/c²`, whose variance `Σ_j Var(e_j)·y_j²/c⁴` tests the mean.
  """
  codec = ROTATED[name]
  d = codec.bucket_size
  x = _heavy(32 * d, seed=5)
  errors, scales = _errors(codec, x, num_seeds=8)
  gain = rotation_ops.domain_gain(d)
  want = spread = projection = 0.0
  for s, wire in enumerate(scales):
    signs = rotation_ops.rotation_signs(tf.constant([s, 99], tf.int32),
                                        len(wire), d, tf.float64)
    y = rotation_ops.rotate(tf.constant(x.reshape(-1, d), tf.float64),
                            signs).numpy()
    step = wire[:, None].astype(np.float64) / codec.num_levels if hasattr(
        codec, "num_levels") else wire[:, None].astype(np.float64)
    if name == "half_dithered":
      # Order m: (m + 1)·Δ²/12 whatever the signal; |e| <= 1.5Δ bounds
      # Var e² by E e⁴ <= (1.5Δ)²·E e².
      mean = np.broadcast_to(
          step**2 * (codec.dither_order + 1) / 12, y.shape)
      var = (1.5 * step)**2 * mean
    else:  # TernGrad: steps of κ (one level); QSGD: of ‖y‖/s.
      mean, var = _stochastic_rounding_moments(y, step)
    want += np.sum(mean) / gain**2
    spread += np.sum(var) / gain**4
    projection += np.sum(mean * y * y) / gain**4
  got = float(np.sum(errors**2))
  assert abs(got - want) < 6 * math.sqrt(spread)
  z = np.sum(errors.mean(axis=0) * x) / math.sqrt(projection / len(errors)**2)
  assert abs(z) < 6


def test_rotated_nested_codec_has_dqsgs_error_at_the_fine_step():
  """With side information close to x (no overload): κΔ1 errors, rotated."""
  codec = ROTATED["ndqsg"]
  d = codec.bucket_size
  x = _heavy(64 * d, seed=6)
  errors, scales = _errors(codec, x, num_seeds=4)
  want = sum(theory.rotated_dithered_total_mse(s, d, codec.num_levels)
             for s in scales)
  assert abs(float(np.sum(errors**2)) / want - 1) < (
      6 * 0.894 / math.sqrt(errors.size))


def test_adaptive_nested_rotated_is_within_its_overload_target():
  """Gaussian noise stays Gaussian rotated: overloads at most the target.

  Counted in the rotated domain, where an element either has the fine
  step's error (at most `Δ1/2`) or is off by a coarse step `k·Δ1`.
  """
  d, k, target = 256, 5, 1e-3
  codec = ndq_tf.NestedDitheredCodec(num_levels=1, coarse_ratio=k,
                                     bucket_size=d, overload_target=target,
                                     rotation="hadamard")
  x = _heavy(64 * d, seed=7)
  noise = np.random.default_rng(7).normal(size=x.shape) * 0.01
  side = (x + noise).astype(np.float32)
  payload = codec.encode(x, SEED, noise_scale=0.01)
  got = codec.decode(payload, SEED, side_information=side).numpy()
  fine = payload.scales.numpy()  # num_levels = 1: the fine step itself.
  assert np.all(fine > 0)  # Every bucket nested.
  signs = rotation_ops.rotation_signs(SEED, 64, d, tf.float64)
  err = rotation_ops.rotate(
      tf.constant((got - x).astype(np.float64).reshape(-1, d)), signs).numpy()
  overloads = np.sum(np.abs(err) > fine[:, None])
  n = x.size
  assert overloads <= n * target + 6 * math.sqrt(n * target)
  assert overloads > 0 or n * target < 5  # The count can see overloads.


# -- Arguments and configs --------------------------------------------------


@pytest.mark.parametrize("cls", [
    ndq_tf.DitheredCodec, ndq_tf.HalfDitheredCodec,
    ndq_tf.NestedDitheredCodec, ndq_tf.TernGradCodec, ndq_tf.QSGDCodec])
def test_bad_rotation_and_bucket_size_are_named(cls):
  with pytest.raises(ValueError, match=r"rotation='fourier'"):
    cls(rotation="fourier")
  with pytest.raises(ValueError, match=r"rotation=True"):
    cls(rotation=True)
  with pytest.raises(ValueError, match=r"bucket_size=500"):
    cls(bucket_size=500, rotation="hadamard")
  cls(bucket_size=500)  # Without rotation any size is fine.


@pytest.mark.parametrize("name", sorted(ROTATED))
def test_rotation_round_trips_through_configs_specs_and_keras(name):
  codec = ROTATED[name]
  config = codec.get_config()
  assert config["rotation"] == "hadamard"
  assert type(codec).from_config(config) == codec
  revived = keras.saving.deserialize_keras_object(
      keras.saving.serialize_keras_object(codec))
  assert revived == codec and revived.rotation == "hadamard"
  assert ndq_tf.codecs.get(ndq_tf.codecs.serialize(codec)) == codec
  assert codec.decoder_needs_seed
  spec = f"{name}:bucket_size={codec.bucket_size},rotation=hadamard"
  assert ndq_tf.codecs.get(spec).rotation == "hadamard"


def test_spec_string_of_the_issue():
  codec = ndq_tf.codecs.get("dqsg:num_levels=1,rotation=hadamard")
  assert codec == ndq_tf.DitheredCodec(num_levels=1, rotation="hadamard")
  assert ndq_tf.codecs.get("dqsg").rotation is None


def test_summing_methods_need_a_shared_rotation_seed():
  codec = ROTATED["dqsg"]
  x = tf.constant(_heavy(128))
  with pytest.raises(ValueError, match="rotation_seed=None"):
    codec.bucket_scales(x)
  scales = codec.bucket_scales(x, rotation_seed=SEED)
  with pytest.raises(ValueError, match="rotation_seed=None"):
    codec.encode_symbols(x, SEED, scales)
  with pytest.raises(ValueError, match="bucket_size=64"):
    codec.bucket_scales(x[:100], rotation_seed=SEED)
  plain = ndq_tf.DitheredCodec(num_levels=2, bucket_size=64)
  with pytest.raises(ValueError, match="rotation=None"):
    plain.bucket_scales(x, rotation_seed=SEED)


# -- The integer all-reduce under MirroredStrategy --------------------------


class BaseClassTest(tf.test.TestCase, parameterized.TestCase):

  def test_bucketed_codecs_share_the_public_base_class(self):
    for name in SCALED:
      self.assertIsInstance(CODECS[name], codecs.BucketedCodec, msg=name)
    for name in ("float32", "float16", "bfloat16"):
      self.assertNotIsInstance(CODECS[name], codecs.BucketedCodec, msg=name)
