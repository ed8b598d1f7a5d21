"""A randomized Hadamard rotation of buckets, the same bits everywhere.

Max-norm scaling spends its step on a bucket's largest value; on
heavy-tailed gradients every other value is quantized far too coarsely. A
random orthogonal rotation of each bucket before quantization spreads the
outliers over the bucket, so that its max comes close to its RMS
(Suresh et al. 2017; DRIVE/EDEN; THC; QuIP#). Per bucket of `d = 2^k`
values the rotation is `R = H·D/√d` with `D` a diagonal of random `±1`
signs and `H` the Walsh–Hadamard matrix (`H·H = d·I`); `R` is orthogonal,
so the error a quantizer makes in the rotated domain has the same energy
back in the original domain.

Exactness. The transform is computed in a fixed order of additions and
subtractions (radix-4 butterflies, then one radix-2 stage when `k` is odd),
no multiplication: every result is one correctly rounded float operation,
which no compiler may reorder or contract, so it is the same bits in eager
mode, in a `tf.function` and under XLA. The normalization `1/√d` is split
into two exact powers of two: the forward transform scales by
`2^-⌈k/2⌉`, the inverse by `2^-⌊k/2⌋` (their product is `1/d`). The
forward transform is thus `c·R` with `c = 1` for even `k` and `c = 1/√2`
for odd `k`; the codecs' scales are taken in that domain, so `c` cancels.

Signs. The `±1` signs come from the counter-based hash of
`ndq_tf.ops.random_ops` under a key of their own (not the dither's
streams): bit `j mod 32` of `hash((j) div 32)` for element `j` of the
stream, one hash per 32 elements. Element `j` depends only on the seed and
`j`, so a chunk of a longer buffer takes its slice of the signs with a
counter offset, as the dither does.

References:
  A. T. Suresh, F. X. Yu, S. Kumar, H. B. McMahan. Distributed Mean
  Estimation with Limited Communication. ICML 2017.
  S. Vargaftik et al. DRIVE: One-bit Distributed Mean Estimation. NeurIPS
  2021; EDEN: Communication-Efficient and Robust Distributed Mean
  Estimation for Federated Learning. ICML 2022.
  docs/algorithms.md#randomized-hadamard-rotation writes it out.
"""

import tensorflow as tf

from ndq_tf.ops import random_ops

__all__ = [
    "ROTATIONS",
    "check_rotation",
    "domain_gain",
    "hadamard_transform",
    "rotation_signs",
    "rotate",
    "unrotate",
]

#: The accepted values of the codecs' `rotation` argument.
ROTATIONS = (None, "hadamard")

# Mixed into the seed's second key: the signs' stream is none of the
# dither's (`uniform_dither` mixes `stream * golden`, stream < 64).
_SIGN_KEY = 0x524F5441  # "ROTA"


def check_rotation(rotation, bucket_size):
  """Validates a codec's `rotation` and its `bucket_size`; returns rotation.

  Raises:
    ValueError: for a `rotation` not in `ROTATIONS`, or a `bucket_size`
      that is not a power of two with `rotation="hadamard"`.
  """
  if not (rotation is None or (isinstance(rotation, str)
                               and rotation in ROTATIONS)):
    raise ValueError(
        f"`rotation` must be None or 'hadamard'. Received: "
        f"rotation={rotation!r}.")
  if rotation is not None and (bucket_size < 4
                               or bucket_size & (bucket_size - 1)):
    raise ValueError(
        f"`bucket_size` must be a power of two >= 4 with rotation="
        f"{rotation!r} "
        f"(the Walsh-Hadamard transform of a bucket). Received: "
        f"bucket_size={bucket_size!r}.")
  return rotation


def _log2(d):
  k = d.bit_length() - 1
  if d != 1 << k:
    raise ValueError(
        f"`bucket_size` must be a power of two. Received: bucket_size={d}.")
  return k


def hadamard_transform(xb):
  """`xb·H` per row, unnormalized (`H·H = d·I`), in a fixed butterfly order.

  Args:
    xb: `[B, d]` floating tensor, `d` a power of two.

  Returns:
    `[B, d]` tensor of `xb`'s dtype: row `b` is `H·xb[b]`.
  """
  num_buckets, d = xb.shape
  _log2(d)
  y = xb
  h = 1
  # Radix-4 stages: each reads and writes the buffer once; two radix-2
  # butterflies of strides h and 2h, written out.
  while 4 * h <= d:
    y = tf.reshape(y, [num_buckets, d // (4 * h), 4, h])
    a, b, c, e = (y[:, :, i, :] for i in range(4))
    s0, s1, s2, s3 = a + b, a - b, c + e, c - e
    y = tf.stack([s0 + s2, s1 + s3, s0 - s2, s1 - s3], axis=2)
    h *= 4
  if h < d:  # k odd: one radix-2 stage.
    y = tf.reshape(y, [num_buckets, 2, h])
    a, b = y[:, 0, :], y[:, 1, :]
    y = tf.stack([a + b, a - b], axis=1)
  return tf.reshape(y, [num_buckets, d])


def rotation_signs(seed, num_buckets, bucket_size, dtype):
  """The `±1` signs of `num_buckets` buckets, `[B, d]` of `dtype`.

  Args:
    seed: shape-`[2]` integer tensor, or `[3]`: `[seed0, seed1, offset]`
      with `offset` the index of the first element in a longer buffer (a
      multiple of `bucket_size`), as the codecs' dither takes it.
    num_buckets: Python int `B`.
    bucket_size: Python int `d`.
    dtype: floating dtype of the result.
  """
  offset = 0
  seed = tf.convert_to_tensor(seed)
  if seed.shape[0] == 3:
    seed, offset = seed[:2], seed[2]
  key0, key1 = random_ops.seed_keys(seed)
  key1 = random_ops.stream_key(key1, _SIGN_KEY)
  n = num_buckets * bucket_size
  one = tf.constant(1, tf.uint32)
  if n % 32 == 0 and (isinstance(offset, int) or bucket_size % 32 == 0):
    # One hash per 32 signs: word w of the stream covers elements 32w..32w+31.
    words = tf.bitcast(tf.range(n // 32, dtype=tf.int32), tf.uint32)
    if not (isinstance(offset, int) and offset == 0):
      # Counting from w0 = offset/32 is adding w0·golden to key0 (mod 2**32),
      # as `uniform_dither` does for its offset.
      key0 = key0 + random_ops.counter_shift(
          tf.bitwise.right_shift(tf.cast(offset, tf.int64), 5))
    bits = random_ops.hash_uint32(words, key0, key1)
    shifts = tf.bitcast(tf.range(32, dtype=tf.int32), tf.uint32)
    bit = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(bits[:, None], shifts[None, :]), one)
    bit = tf.reshape(bit, [n])
  else:
    # Small or unaligned buckets: the same stream, element by element.
    index = tf.range(n, dtype=tf.int64)
    if not (isinstance(offset, int) and offset == 0):
      index = index + tf.cast(offset, tf.int64)
    low = tf.bitwise.bitwise_and(index, 0xFFFFFFFF)
    words = tf.cast(tf.bitwise.right_shift(low, 5), tf.int32)
    shifts = tf.cast(tf.bitwise.bitwise_and(index, 31), tf.int32)
    bits = random_ops.hash_uint32(tf.bitcast(words, tf.uint32), key0, key1)
    bit = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(bits, tf.bitcast(shifts, tf.uint32)), one)
  signs = 1.0 - 2.0 * tf.cast(bit, dtype)
  return tf.reshape(signs, [num_buckets, bucket_size])


def domain_gain(bucket_size):
  """`c`: `rotate` is `c` times the orthonormal rotation `H·D/√d`.

  `√d·2^-⌈k/2⌉`: 1 for even `k = log2 d`, `1/√2` for odd `k`.
  """
  k = _log2(bucket_size)
  return 2.0 ** (k / 2 - (k + 1) // 2)


def _power_of_two(exponent, dtype):
  return tf.constant(2.0 ** exponent, dtype)


def rotate(xb, signs):
  """The forward rotation `H·D·xb·2^-⌈k/2⌉` of `[B, d]` buckets.

  The power of two is applied first (with the signs: one exact product),
  so the butterflies' partial sums stay below `2^⌊k/2⌋·max|x|` and
  overflow only for values within a factor 45 (d = 2048) of float's max.

  Args:
    xb: `[B, d]` floating tensor, `d` a power of two.
    signs: `[B, d]` `±1` of `xb`'s dtype (`rotation_signs`).
  """
  k = _log2(xb.shape[1])
  return hadamard_transform(
      xb * (signs * _power_of_two(-((k + 1) // 2), xb.dtype)))


def unrotate(yb, signs):
  """The inverse of `rotate`: `D·H·(yb·2^-⌊k/2⌋)`, exact to the adds' rounding."""
  k = _log2(yb.shape[1])
  return hadamard_transform(yb * _power_of_two(-(k // 2), yb.dtype)) * signs
