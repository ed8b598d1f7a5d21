"""Low-rank factors with a fixed order of additions (PowerSGD's math).

PowerSGD (Vogels et al., NeurIPS 2019) approximates a gradient matrix `M`
of shape `(n, m)` by `P Qᵀ`, `P` of shape `(n, k)` and `Q` of shape
`(m, k)`, `k` the rank: `P = M Q`, summed over the replicas and
orthogonalized, then `Q = Mᵀ P`, averaged. Every replica must compute the
same orthogonal `P` and the same product `P Q̄ᵀ` to the bit, or the
replicas' weights drift apart. A BLAS, Eigen or XLA chooses its own order
of additions (blocked, threaded, fused into FMAs), so those two steps are
written here as elementwise ops whose order is fixed:

* a product of two `float32` values is exact in `float64` (24 + 24 < 53
  significant bits), so every product is taken in `float64` from `float32`
  operands: a fused multiply-add then rounds exactly as a multiply followed
  by an add, and XLA's contraction of the two cannot change a bit;
* sums run in `float64` in a fixed pairwise tree (`fixed_sum`), or one term
  after the other for the rank's `k` terms (`outer_product`);
* results are rounded to `float32` once, where the text says.

The two large products, `M Q` and `Mᵀ P`, are each replica's own
contribution to a sum that the exchange makes identical everywhere, so
they use `tf.linalg.matmul`.

The initial `Q` is `±1` from the project's counter-based hash
(`random_ops.hash_uint32`): the same bits everywhere, no transcendental
function.

References:
  T. Vogels, S. P. Karimireddy, M. Jaggi. PowerSGD: Practical Low-Rank
  Gradient Compression for Distributed Optimization. NeurIPS 2019.
  docs/algorithms.md#low-rank-powersgd.
"""

import math

import tensorflow as tf

from ndq_tf.ops import random_ops

__all__ = [
    "compression_rate",
    "effective_rank",
    "fixed_sum",
    "initial_factor",
    "matrix_shape",
    "orthogonalize",
    "orthogonalize_compiled",
    "outer_product",
    "reconstruct",
]

#: The stream of the initial factors' signs (`random_ops.stream_key`).
_SIGN_STREAM = 0x51A7F00D


def matrix_shape(shape):
  """`(rows, cols)` of a tensor viewed as a matrix, or None for a vector.

  TF kernels are `[..., inputs, outputs]` (Dense `(in, out)`, Conv HWIO), so
  the view is `(prod(shape[:-1]), shape[-1])`.

  Args:
    shape: a static shape (list, tuple or `tf.TensorShape`).
  """
  dims = list(tf.TensorShape(shape).as_list())
  if len(dims) < 2 or any(d is None for d in dims):
    return None
  return math.prod(dims[:-1]), dims[-1]


def effective_rank(rows, cols, rank):
  """The rank used for a `rows × cols` matrix: `min(rank, rows, cols)`."""
  return max(0, min(int(rank), int(rows), int(cols)))


def compression_rate(rows, cols, rank):
  """`rows·cols / ((rows + cols)·k)`: float32 values per factor value.

  `k = effective_rank(rows, cols, rank)`; 0 for an empty matrix.
  """
  k = effective_rank(rows, cols, rank)
  if not k:
    return 0.0
  return rows * cols / ((rows + cols) * k)


def initial_factor(seed, rows, rank):
  """A `[rows, rank]` `float32` matrix of `±1` drawn from `seed`.

  Element `(i, j)` is the sign of hash bit 31 of counter `i·rank + j` in
  the stream of the initial factors, so every replica, worker and
  compilation draws the same matrix from the same seed.

  Args:
    seed: shape-`[2]` integer seed.
    rows: `n >= 0` (Python int).
    rank: `k >= 1` (Python int).
  """
  key0, key1 = random_ops.seed_keys(seed)
  key1 = random_ops.stream_key(key1, _SIGN_STREAM)
  counter = tf.range(rows * rank, dtype=tf.int64)
  bits = random_ops.hash_uint32(tf.cast(counter, tf.uint32), key0, key1)
  top = tf.bitwise.right_shift(bits, tf.constant(31, tf.uint32))
  signs = 1.0 - 2.0 * tf.cast(top, tf.float32)
  return tf.reshape(signs, [rows, rank])


def fixed_sum(x):
  """Sums `x` over axis 1 in a fixed pairwise tree, in `float64`.

  The axis is padded with zeros to a power of two, then halved: element
  `i` plus element `i + h`, until one is left. The order of additions
  depends only on the static length.

  Args:
    x: a `float64` tensor `[B, n, ...]` with a static `n`.

  Returns:
    `[B, ...]`.
  """
  n = x.shape[1]
  if n == 0:
    return tf.zeros_like(x[:, 0])
  width = 1 << (n - 1).bit_length()
  if width != n:
    pad = [[0, 0], [0, width - n]] + [[0, 0]] * (x.shape.rank - 2)
    x = tf.pad(x, pad)
  while width > 1:
    width //= 2
    x = x[:, :width] + x[:, width:]
  return x[:, 0]


def _exact_product(a, b):
  """`a·b` of two `float32` tensors, exact in `float64`."""
  return tf.cast(a, tf.float64) * tf.cast(b, tf.float64)


def orthogonalize(x, epsilon=0.0):
  """Orthonormal columns of each matrix of `x` (modified Gram–Schmidt).

  Column by column: divide by its norm, then take its component out of
  every later column. A column of zeros (a zero gradient, or a rank above
  the matrix's) stays zeros: no division by zero. Bitwise the same in
  eager mode, in `tf.function`, under XLA and at any number of threads.

  Args:
    x: `float32` `[B, n, k]` (or `[n, k]`): B matrices, padded with zero
      rows to a common `n` if need be (padding changes nothing).
    epsilon: added to every nonzero norm (PyTorch's
      `orthogonalization_epsilon`); 0 by default.

  Returns:
    `float32`, the shape of `x`.
  """
  x = tf.convert_to_tensor(x, tf.float32)
  if x.shape.rank == 2:
    return orthogonalize(x[tf.newaxis], epsilon)[0]
  # Step i finishes column i, and every later column loses its component
  # along it at once: elementwise the ops of column-by-column Gram–Schmidt,
  # so the same bits, in a loop whose body XLA compiles once (unrolled,
  # a rank of 32 compiled for minutes and took gigabytes).
  k = x.shape[2]
  index = tf.range(k)

  def body(i, x):
    mask = tf.equal(index, i)
    wide = tf.cast(tf.reduce_sum(tf.where(mask, x, 0.0), axis=2), tf.float64)
    norm = tf.sqrt(fixed_sum(wide * wide))[:, tf.newaxis]
    divisor = tf.where(norm > 0.0, norm + epsilon, tf.ones_like(norm))
    column = tf.cast(wide / divisor, tf.float32)[:, :, tf.newaxis]
    dots = tf.cast(fixed_sum(_exact_product(column, x)), tf.float32)
    later = tf.cast(tf.cast(x, tf.float64)
                    - _exact_product(dots[:, tf.newaxis, :], column),
                    tf.float32)
    x = tf.where(mask, column, tf.where(index > i, later, x))
    return i + 1, x

  _, x = tf.while_loop(lambda i, x: i < k, body, (tf.constant(0), x),
                       maximum_iterations=k)
  return x


def orthogonalize_compiled(x, epsilon=0.0):
  """`orthogonalize`, compiled by XLA (one kernel; the same bits)."""
  return _ORTHOGONALIZE(tf.convert_to_tensor(x, tf.float32),
                        tf.constant(epsilon, tf.float64))


def outer_product(p, q):
  """`P Qᵀ` with a fixed order of additions, as `float32`.

  `Σ_j P[:, j] Q[:, j]ᵀ`, the rank's `k` terms added one after the other
  in `float64` (every product exact), rounded to `float32` once.

  Args:
    p: `float32` `[n, k]`.
    q: `float32` `[m, k]`.

  Returns:
    `float32` `[n, m]`.
  """
  p = tf.convert_to_tensor(p, tf.float32)
  q = tf.convert_to_tensor(q, tf.float32)
  total = None
  for j in range(p.shape[1]):
    term = _exact_product(p[:, j:j + 1], q[tf.newaxis, :, j])
    total = term if total is None else total + term
  if total is None:
    return tf.zeros([p.shape[0], q.shape[0]], tf.float32)
  return tf.cast(total, tf.float32)


_ORTHOGONALIZE = tf.function(orthogonalize, jit_compile=True,
                             autograph=False)


def _reconstruct(m, p, q, scale):
  approx = outer_product(p, q)
  return approx * scale, m - approx


# One fused pass per matrix: `P Qᵀ`'s float64 terms, its rounding, the
# scaled sum and the residual never leave the registers. The same bits as
# without XLA (the module doc; tests/ops/test_low_rank_ops.py).
_RECONSTRUCT = tf.function(_reconstruct, jit_compile=True, autograph=False)


def reconstruct(m, p, q, scale):
  """`(scale · P Qᵀ, M − P Qᵀ)`, `P Qᵀ` from `outer_product`, compiled by XLA.

  Args:
    m: `float32` `[n, m]`.
    p: `float32` `[n, k]`.
    q: `float32` `[m, k]`.
    scale: a `float32` scalar.
  """
  return _RECONSTRUCT(tf.convert_to_tensor(m, tf.float32),
                      tf.convert_to_tensor(p, tf.float32),
                      tf.convert_to_tensor(q, tf.float32),
                      tf.convert_to_tensor(scale, tf.float32))
