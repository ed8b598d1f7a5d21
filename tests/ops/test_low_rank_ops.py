"""Tests of ndq_tf.ops.low_rank_ops: the same bits everywhere."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf.ops import low_rank_ops

import powersgd_reference


def _bits(x):
  return np.asarray(x).view(np.uint32)


def _cases():
  rng = np.random.default_rng(0)
  p = rng.standard_normal((3, 300, 4)).astype(np.float32)
  p[1, :, 2] = 0.0  # A zero column.
  p[2] = 0.0  # A zero matrix.
  q = rng.standard_normal((77, 4)).astype(np.float32)
  return p, q


def _compute(p, q):
  ortho = low_rank_ops.orthogonalize(p)
  return ortho, low_rank_ops.outer_product(ortho[0], q)


def test_orthogonalize_matches_gram_schmidt_and_keeps_zero_columns():
  p, _ = _cases()
  got = low_rank_ops.orthogonalize(p).numpy()
  for b in range(p.shape[0]):
    np.testing.assert_allclose(
        got[b], powersgd_reference.orthogonalize(p[b]), atol=2e-6)
  assert np.isfinite(got).all()
  np.testing.assert_array_equal(got[1, :, 2], 0.0)
  np.testing.assert_array_equal(got[2], 0.0)
  gram = got[0].T.astype(np.float64) @ got[0]
  np.testing.assert_allclose(gram, np.eye(4), atol=1e-6)


def _fixed_sum(x):
  """NumPy's transcription of `low_rank_ops.fixed_sum` over axis 0."""
  width = 1 << (x.shape[0] - 1).bit_length()
  x = np.concatenate([x, np.zeros((width - x.shape[0],) + x.shape[1:])])
  while width > 1:
    width //= 2
    x = x[:width] + x[width:]
  return x[0]


def _column_by_column(p):
  """Modified Gram–Schmidt one column after the other, the module's ops."""
  columns = [p[:, j].copy() for j in range(p.shape[1])]
  for i in range(len(columns)):
    wide = columns[i].astype(np.float64)
    norm = np.sqrt(_fixed_sum(wide * wide))
    columns[i] = (wide / (norm if norm > 0 else 1.0)).astype(np.float32)
    for j in range(i + 1, len(columns)):
      dot = _fixed_sum(columns[i].astype(np.float64)
                       * columns[j].astype(np.float64)).astype(np.float32)
      columns[j] = (columns[j].astype(np.float64) - np.float64(dot)
                    * columns[i].astype(np.float64)).astype(np.float32)
  return np.stack(columns, axis=1)


def test_orthogonalize_at_rank_32_is_column_by_column_gram_schmidt_bitwise():
  # The loop handles every later column at once; each value goes through
  # the ops of the column-by-column algorithm, so the bits are its bits.
  rng = np.random.default_rng(32)
  p = rng.standard_normal((2, 200, 32)).astype(np.float32)
  p[1, :, 5] = 0.0
  want = np.stack([_column_by_column(m) for m in p])
  for got in (low_rank_ops.orthogonalize(p),
              low_rank_ops.orthogonalize_compiled(p)):
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_outer_product_is_the_float64_product_rounded_once():
  rng = np.random.default_rng(1)
  p = rng.standard_normal((50, 3)).astype(np.float32)
  q = rng.standard_normal((40, 3)).astype(np.float32)
  want = (p.astype(np.float64)[:, 0:1] * q.astype(np.float64)[:, 0]
          + p.astype(np.float64)[:, 1:2] * q.astype(np.float64)[:, 1]
          + p.astype(np.float64)[:, 2:3] * q.astype(np.float64)[:, 2])
  np.testing.assert_array_equal(
      low_rank_ops.outer_product(p, q).numpy(), want.astype(np.float32))


def test_same_bits_in_eager_tf_function_and_xla():
  p, q = _cases()
  eager = _compute(p, q)
  graph = tf.function(_compute)(p, q)
  xla = tf.function(_compute, jit_compile=True)(p, q)
  for a, b, c in zip(eager, graph, xla):
    np.testing.assert_array_equal(_bits(a), _bits(b))
    np.testing.assert_array_equal(_bits(a), _bits(c))


def _digests():
  """sha256 of every output, eager and under XLA."""
  p, q = _cases()
  return [hashlib.sha256(np.asarray(x).tobytes()).hexdigest()
          for fn in (_compute, tf.function(_compute, jit_compile=True))
          for x in fn(p, q)]


_ONE_THREAD = """
import sys
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import test_low_rank_ops
print(" ".join(test_low_rank_ops._digests()))
"""


def test_same_bits_at_one_and_two_intra_op_threads():
  tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = [os.path.join(tests, "ops"), tests, os.path.dirname(tests)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
      path + [os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run([sys.executable, "-c", _ONE_THREAD], env=env,
                       capture_output=True, text=True, timeout=120,
                       check=True)
  assert tf.config.threading.get_intra_op_parallelism_threads() != 1
  assert out.stdout.split() == _digests()


def test_initial_factor_is_signs_drawn_from_the_seed():
  a = low_rank_ops.initial_factor(tf.constant([1, 2]), 100, 4).numpy()
  b = low_rank_ops.initial_factor(tf.constant([1, 2]), 100, 4).numpy()
  c = low_rank_ops.initial_factor(tf.constant([1, 3]), 100, 4).numpy()
  np.testing.assert_array_equal(a, b)
  assert set(np.unique(a)) == {-1.0, 1.0}
  assert (a != c).any()
  assert abs(a.mean()) < 0.2
  xla = tf.function(low_rank_ops.initial_factor, jit_compile=True)
  np.testing.assert_array_equal(a, xla(tf.constant([1, 2]), 100, 4))


@pytest.mark.parametrize("shape, view", [
    ((5,), None), ((3, 4), (3, 4)), ((3, 3, 2, 8), (18, 8)), ((), None)])
def test_matrix_shape_views_kernels_as_inputs_by_outputs(shape, view):
  assert low_rank_ops.matrix_shape(shape) == view


def test_compression_rate_and_effective_rank():
  assert low_rank_ops.effective_rank(768, 10, 16) == 10
  assert low_rank_ops.compression_rate(1024, 2048, 4) == pytest.approx(
      1024 * 2048 / (3072 * 4))
  assert low_rank_ops.compression_rate(0, 5, 4) == 0.0
