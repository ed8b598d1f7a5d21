"""Tests of `ndq_tf.ops.rotation_ops`: the randomized Hadamard rotation.

The transform and its signs (issue #17); the rotated codecs are tested in
codecs/test_bucketed.py.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf import ops
from ndq_tf.ops import rotation_ops

SEED = tf.constant([2024, 7], tf.int32)


def _heavy(n, seed=0):
  """Heavy-tailed values (Student t, 2 degrees of freedom), like gradients."""
  return np.random.default_rng(seed).standard_t(2, size=n).astype(np.float32)


def _hadamard(d):
  h = np.ones([1, 1])
  while h.shape[0] < d:
    h = np.block([[h, h], [h, -h]])
  return h


@pytest.mark.parametrize("d", [1, 2, 4, 8, 32, 128, 512])
def test_hadamard_transform_is_numpys_matrix(d):
  x = np.random.default_rng(d).normal(size=[3, d])
  got = rotation_ops.hadamard_transform(tf.constant(x)).numpy()
  np.testing.assert_allclose(got, x @ _hadamard(d), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d", [16, 64, 2048])
def test_rotate_then_unrotate_is_the_identity_to_float_rounding(d):
  x = tf.constant(_heavy(4 * d).reshape(4, d))
  signs = rotation_ops.rotation_signs(SEED, 4, d, tf.float32)
  y = rotation_ops.rotate(x, signs)
  back = rotation_ops.unrotate(y, signs).numpy()
  # log2(d) roundings of sums of at most d terms: |err| <= log2(d)·eps·‖x‖.
  bound = math.log2(d) * 2**-23 * np.linalg.norm(x.numpy(), axis=1)
  assert np.all(np.abs(back - x.numpy()) <= bound[:, None])
  # Orthogonal up to the domain's gain c.
  np.testing.assert_allclose(
      np.linalg.norm(y.numpy(), axis=1),
      rotation_ops.domain_gain(d) * np.linalg.norm(x.numpy(), axis=1),
      rtol=1e-5)


def test_signs_are_balanced_and_not_the_dither():
  n = 2**16
  signs = rotation_ops.rotation_signs(SEED, n // 512, 512, tf.float32).numpy()
  assert set(np.unique(signs)) == {-1.0, 1.0}
  # A mean of n fair signs: standard error 1/sqrt(n); six of them.
  assert abs(signs.mean()) < 6 / math.sqrt(n)
  dither = ops.uniform_dither(SEED, n).numpy().reshape(signs.shape)
  # Uncorrelated with the sign of the same seed's dither.
  assert abs(np.mean(signs * np.sign(dither))) < 6 / math.sqrt(n)


@pytest.mark.parametrize("d", [4, 64])
def test_signs_of_a_chunk_are_its_slice_of_the_buffers(d):
  whole = rotation_ops.rotation_signs(SEED, 8, d, tf.float32).numpy()
  seed = tf.concat([tf.cast(SEED, tf.int64), tf.constant([3 * d], tf.int64)],
                   0)
  part = rotation_ops.rotation_signs(seed, 2, d, tf.float32).numpy()
  np.testing.assert_array_equal(part, whole[3:5])


def test_signs_and_transform_are_the_same_bits_in_every_mode():
  x = tf.constant(_heavy(8 * 128).reshape(8, 128))

  def run(x, seed):
    signs = rotation_ops.rotation_signs(seed, 8, 128, tf.float32)
    y = rotation_ops.rotate(x, signs)
    # (A product feeding the transform could be contracted into an FMA by
    # XLA; the codecs feed it exact power-of-two products only.)
    return signs, y, rotation_ops.unrotate(y + 0.125, signs)

  eager = [t.numpy() for t in run(x, SEED)]
  for jit in (False, True):
    got = tf.function(run, jit_compile=jit)(x, SEED)
    for a, b in zip(got, eager):
      np.testing.assert_array_equal(a.numpy(), b)
