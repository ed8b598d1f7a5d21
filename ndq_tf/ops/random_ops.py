"""Counter-based random numbers that are the same bits everywhere.

Dithered quantization needs the sender and every receiver to draw *the same*
dither. TensorFlow's stateless RNG does not promise that:
`tf.random.stateless_uniform` gives other numbers under `jit_compile=True`
than without XLA (docs/algorithms.md#tfrandom-under-xla), and its output is
only stable within one TF version. A sender and a receiver compiled
differently would then decode garbage.

This module therefore draws random numbers with a counter-based integer hash
written in plain `uint32` TF ops (multiply, xor, shift): element `i` of a
stream keyed by `seed` is `hash(seed, i)`. Integer ops are exact, so the bits
are identical in eager mode, in `tf.function`, under XLA and on any device.
The hash is two rounds of the MurmurHash3 finalizer `fmix32` around a Weyl
step; for a fixed key it is a bijection of the 32-bit counter, so a stream
never repeats a value within 2**32 elements.

Uniform floats are taken from the top 24 bits of the hash: they are exact
multiples of 2**-24, so their sums and differences used by the codecs are
exact in float32.

References:
  docs/algorithms.md#dither-generator and docs/algorithms.md#seeds write the
  hash, the uniforms and the seed derivation out.
"""

import tensorflow as tf

__all__ = [
    "counter_shift",
    "hash_uint32",
    "fold_seed",
    "seed_keys",
    "stream_key",
    "uniform_dither",
]

_GOLDEN = 0x9E3779B9
# The inverse of _GOLDEN modulo 2**32 (it is odd, so invertible).
_GOLDEN_INVERSE = pow(_GOLDEN, -1, 2**32)
_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35


def _u32(value):
  return tf.constant(value, dtype=tf.uint32)


def _fmix32(h):
  """MurmurHash3's 32-bit finalizer: a bijection with full avalanche."""
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _u32(16)))
  h = h * _u32(_M1)
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _u32(13)))
  h = h * _u32(_M2)
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _u32(16)))
  return h


def hash_uint32(counter, key0, key1):
  """Hashes a `uint32` counter under a 64-bit key into 32 random bits.

  For fixed keys the map `counter -> hash` is a bijection of the 32-bit
  integers, so distinct counters never collide.

  Args:
    counter: `uint32` tensor of any shape.
    key0: `uint32` scalar (or broadcastable) tensor, first half of the key.
    key1: `uint32` scalar (or broadcastable) tensor, second half of the key.

  Returns:
    A `uint32` tensor of the shape of `counter`.
  """
  # `counter·G + key0` written as `(counter + key0·G⁻¹)·G`: the same value
  # modulo 2**32, but no longer a function of the counter alone. Otherwise
  # XLA constant-folds `iota·G` into an array as large as the draw, which
  # then costs a read of 4 bytes per element (and a copy in the executable).
  h = (counter + key0 * _u32(_GOLDEN_INVERSE)) * _u32(_GOLDEN)
  h = _fmix32(h)
  h = tf.bitwise.bitwise_xor(h, key1)
  return _fmix32(h)


def _seed_tensor(seed):
  """`seed` as a tensor, checked to be an integer tensor of shape `[2]`."""
  seed = tf.convert_to_tensor(seed)
  if not seed.dtype.is_integer:
    raise TypeError(
        f"`seed` must be an integer tensor of shape [2]. Received: "
        f"seed with dtype {seed.dtype.name}.")
  if seed.shape.rank is not None and seed.shape != [2]:
    raise ValueError(
        f"`seed` must have shape [2]. Received: seed with shape {seed.shape}.")
  return seed


def seed_keys(seed):
  """Turns a shape-`[2]` integer seed into two `uint32` keys.

  Args:
    seed: shape-`[2]` tensor of dtype `int32`, `int64`, `uint32` or `uint64`
      (TF's stateless convention).

  Returns:
    Two `uint32` scalar tensors.

  Raises:
    TypeError: if `seed` is not an integer tensor.
    ValueError: if `seed` does not have shape `[2]`.
  """
  seed = _seed_tensor(seed)
  # The seed's *value* selects the stream, whatever its integer dtype: a
  # sender passing int32 and a receiver passing int64 draw the same dither.
  seed = tf.cast(seed, tf.int64)
  parts = tf.bitcast(seed, tf.uint32)  # [2, 2]: low and high halves
  # Fold the high half into the low half so that every bit matters.
  words = tf.bitwise.bitwise_xor(parts[:, 0],
                                 _fmix32(parts[:, 1] + _u32(_GOLDEN)))
  # Mix the two halves into each other so that seeds [a, b] and [b, a] differ.
  key0 = _fmix32(words[0] * _u32(_M1) + words[1])
  key1 = _fmix32(tf.bitwise.bitwise_xor(words[1], _u32(_GOLDEN)) * _u32(_M2)
                 + key0)
  return key0, key1


def fold_seed(seed, value):
  """Derives a new shape-`[2]` `int32` seed from `seed` and an integer.

  Used to derive per-(step, sender, tensor) seeds from a base seed: distinct
  `value`s give unrelated streams. Pure integer ops, so bit-exact everywhere.

  Args:
    seed: shape-`[2]` integer tensor.
    value: integer scalar (Python int or tensor of any integer dtype).

  Returns:
    A shape-`[2]` `int32` tensor.
  """
  seed = _seed_tensor(seed)
  value = tf.convert_to_tensor(value)
  if not value.dtype.is_integer:
    raise TypeError(
        f"`value` must be an integer. Received: value with dtype "
        f"{value.dtype.name}.")
  return _FOLD_SEED(seed, value)


def _fold_seed(seed, value):
  key0, key1 = seed_keys(seed)
  value = tf.cast(value, tf.int64)
  parts = tf.bitcast(value, tf.uint32)  # [lo, hi]
  counter = tf.stack([parts[0], tf.bitwise.bitwise_xor(parts[0], _u32(_GOLDEN))])
  new = hash_uint32(counter, tf.bitwise.bitwise_xor(key0, parts[1]), key1)
  return tf.bitcast(new, tf.int32)


# One call op in a graph instead of about 70 integer ops and constants: an
# exchange folds a seed per step, sender, segment and receiver, and adding
# those ops one by one took 10 of the 14 s that tracing a chunked
# all-gather on 4 replicas took. Traced once per pair of dtypes (and seed
# shape); the same ops run, so the same bits, also inlined under XLA.
_FOLD_SEED = tf.function(_fold_seed, autograph=False)


def counter_shift(offset):
  """What `hash_uint32`'s key0 gains when its counter starts at `offset`.

  `hash_uint32` starts from `counter·G + key0`, so counting from `offset`
  is adding `offset·G` to key0 (mod 2**32).
  """
  offset = tf.cast(tf.convert_to_tensor(offset), tf.int64)
  return tf.cast(tf.bitwise.bitwise_and(offset, 0xFFFFFFFF),
                 tf.uint32) * _u32(_GOLDEN)


def stream_key(key1, value):
  """Mixes the integer `value` into a seed's second key: another stream.

  `uniform_dither`'s stream `s` is `stream_key(key1, s·golden mod 2**32)`;
  the rotation's signs use a constant of their own.
  """
  return _fmix32(key1 + _u32(value & 0xFFFFFFFF))


def uniform_dither(seed, num_elements, stream=0, offset=0):
  """Draws `num_elements` uniforms in `[-1/2, 1/2)`, multiples of `2**-24`.

  Element `i` is `(hash(seed, offset + i) >> 8) * 2**-24 - 1/2`, so it
  depends only on the seed, the stream and its index: any slice of a longer
  draw is the shorter draw with that slice's `offset`, on any device and in
  any compilation mode (what lets a buffer be encoded in chunks with the
  dither of the whole buffer).

  Args:
    seed: shape-`[2]` integer tensor.
    num_elements: Python int, the number of values.
    stream: Python int, selects an independent stream under the same seed
      (used for the several uniforms of a higher-order dither).
    offset: the index of the first element, an integer `>= 0` (Python int
      or integer scalar tensor); `offset + num_elements <= 2**32` when
      static.

  Returns:
    A `float32` tensor of shape `[num_elements]`.
  """
  if num_elements >= 2**32:
    raise ValueError(
        f"`num_elements` must be below 2**32. Received: "
        f"num_elements={num_elements}.")
  if isinstance(offset, int) and not 0 <= offset <= 2**32 - num_elements:
    raise ValueError(
        f"`offset` must be in [0, 2**32 - num_elements]. Received: "
        f"offset={offset}, num_elements={num_elements}.")
  key0, key1 = seed_keys(seed)
  if stream:
    key1 = stream_key(key1, stream * _GOLDEN)
  if not (isinstance(offset, int) and offset == 0):
    # hash_uint32 starts from counter·G + key0, so counting from `offset`
    # is the same as adding offset·G to key0 (mod 2**32): the counter, and
    # its compiled form, stay those of a draw from 0.
    key0 = key0 + counter_shift(offset)
  if num_elements < 2**31:
    counter = tf.bitcast(tf.range(num_elements, dtype=tf.int32), tf.uint32)
  else:
    counter = tf.cast(tf.range(num_elements, dtype=tf.int64), tf.uint32)
  bits = hash_uint32(counter, key0, key1)
  top = tf.bitwise.right_shift(bits, _u32(8))
  # Exact: a 24-bit integer fits a float32 mantissa, and the scaling and
  # the shift by 1/2 are exact too.
  return tf.cast(tf.cast(top, tf.int32), tf.float32) * (2.0**-24) - 0.5
