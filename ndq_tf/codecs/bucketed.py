"""The base class of the codecs that scale buckets and radix-pack codes.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019. Section on
  dithered quantization (the scale factor and the partition of the gradient
  into `K` sub-vectors). docs/algorithms.md#buckets-and-scales and
  docs/algorithms.md#wire-format write the equations out.
"""

import tensorflow as tf

from ndq_tf.codecs import base
from ndq_tf.ops import packing_ops
from ndq_tf.ops import rotation_ops

__all__ = [
    "BucketedCodec",
    "MAX_LEVELS",
    "RotatedBuckets",
]

#: The largest `num_levels` of a bucketed codec: its `2M + 1` symbols must
#: fit the packer's alphabet (at most 65536 symbols).
MAX_LEVELS = 32767


class RotatedBuckets:
  """The randomized Hadamard rotation of a codec's buckets, when it rotates.

  A mixin of the codecs that rotate their `[B, bucket_size]` buckets
  (`rotation="hadamard"`, docs/algorithms.md#randomized-hadamard-rotation):
  `BucketedCodec` and `EntropyCodedDitheredCodec`. The codec sets
  `_bucket_size`, then `_set_rotation(rotation)`; the signs come from the
  encoder's seed, so the decoder needs it.
  """

  _rotation = None

  @property
  def bucket_size(self):
    """Values per scale."""
    return self._bucket_size

  @property
  def rotation(self):
    """`None`, or `"hadamard"`: buckets rotated before quantization."""
    return self._rotation

  def _set_rotation(self, rotation):
    """Validates and sets `rotation` (after `_bucket_size`)."""
    self._rotation = rotation_ops.check_rotation(rotation, self._bucket_size)

  def _signs(self, seed, num_buckets, dtype):
    return rotation_ops.rotation_signs(seed, num_buckets, self.bucket_size,
                                       dtype)

  def _rotate(self, xb, seed):
    """`xb`, rotated with the signs of `seed` when the codec rotates."""
    if self._rotation is None:
      return xb
    return rotation_ops.rotate(xb, self._signs(seed, xb.shape[0], xb.dtype))

  def _unrotate(self, yb, seed):
    if self._rotation is None:
      return yb
    return rotation_ops.unrotate(yb, self._signs(seed, yb.shape[0],
                                                 yb.dtype))


class BucketedCodec(RotatedBuckets, base.Codec):
  """A codec with one float32 scale per bucket and radix-packed codes.

  A *bucket* is a run of `bucket_size` consecutive elements of the flattened
  tensor (the last one is padded with zeros): the paper's partition of the
  gradient into `K` sub-vectors. Each bucket `b` gets one scale `κ_b`, its
  max-norm `max_i |g_i|` (or its L2 norm, for `_norm = "l2"`), rounded up to
  float32 and sent on the wire; the quantizer sees `x = g/κ_b ∈ [-1, 1]`. A
  bucket of zeros has `κ_b = 0` and decodes to zeros; a bucket holding a NaN
  or an Inf gets the scale NaN and decodes to NaN. Smaller buckets mean
  smaller scales, so smaller errors, for 32 more bits each.

  The codes of all buckets are shifted to symbols `[0, alphabet_size)` and
  radix-packed into `int32` words (`ndq_tf.ops.pack_codes`); the payload is
  those words plus the scales (docs/algorithms.md#wire-format).

  A subclass plugs in by setting `alphabet_size`, `_offset` (the code that
  maps to symbol 0 is `-_offset`), `_norm` (`"max"` or `"l2"`), and
  `_bucket_size`, and by implementing, on `[B, bucket_size]` buckets in the
  compute dtype:

  * `_quantize(xb, scales, seed)`: `int32` codes in
    `[-_offset, alphabet_size - _offset)`, with `scales` the `[B]` float32
    scales the receivers will see;
  * `_dequantize(q, scales, seed, side_information)`: the decoded values
    (`side_information` is `None` unless `needs_side_information`, then
    bucketed like `q`);
  * optionally `_quantize_adaptive(xb, scales, seed, noise_scale)`, returning
    `(codes, wire_scales)`, for a codec with `accepts_noise_scale`.

  Encoding and decoding run as two XLA computations each (quantize, pack;
  unpack, dequantize) with the codes as bytes in between: each then compiles
  to a vectorized loop on XLA:CPU, where one fused computation compiles to
  scalar loops, which are slower
  (docs/algorithms.md#two-xla-computations-per-direction).
  """

  _norm = "max"
  #: Whether `_dequantize` reads the seed (to subtract the dither).
  _decode_uses_seed = False

  # -- Subclass hooks ---------------------------------------------------------

  def _quantize(self, xb, scales, seed):
    """Returns the `int32` codes of the `[B, d]` buckets `xb`."""
    raise NotImplementedError

  def _dequantize(self, q, scales, seed, side_information):
    """Returns the `[B, d]` decoded buckets of the codes `q`."""
    raise NotImplementedError

  def _quantize_adaptive(self, xb, scales, seed, noise_scale):
    """Returns `(codes, wire_scales)`; codecs with `accepts_noise_scale`."""
    raise NotImplementedError

  # -- Shared implementation --------------------------------------------------

  @property
  def decoder_needs_seed(self):
    """Whether `decode` needs the encoder's seed (dither or rotation signs)."""
    return self._decode_uses_seed or self._rotation is not None

  def _num_scales(self, num_elements):
    return -(-num_elements // self.bucket_size)

  def _coded_length(self, num_elements):
    """Codes on the wire: one per element, or whole buckets when rotated.

    A rotated bucket's `d` coefficients all carry the values of the bucket,
    so a last bucket that the tensor does not fill is padded with zeros,
    rotated and sent whole (docs/algorithms.md#randomized-hadamard-rotation).
    """
    if self._rotation is None:
      return num_elements
    return self._num_scales(num_elements) * self.bucket_size

  def _num_words(self, num_elements):
    return packing_ops.num_words(self._coded_length(num_elements),
                                 self.alphabet_size)

  @property
  def _symbol_dtype(self):
    return tf.uint8 if self.alphabet_size <= 256 else tf.int32

  def _quantize_stage(self, x, seed, noise_scale=None):
    xb = self._rotate(base.to_buckets(x, self.bucket_size), seed)
    scales = base.bucket_scales(xb, self._norm)
    if noise_scale is None:
      q = self._quantize(xb, scales, seed)
    else:
      if self._rotation is not None:
        # The spread of the residual in the rotated domain, whose scale
        # differs from the orthonormal one by `rotation_ops.domain_gain`.
        noise_scale = noise_scale * rotation_ops.domain_gain(
            self.bucket_size)
      q, scales = self._quantize_adaptive(xb, scales, seed, noise_scale)
    symbols = base.from_buckets(q, self._coded_length(x.shape[0]))
    return tf.cast(symbols + self._offset, self._symbol_dtype), scales

  def _pack_stage(self, symbols):
    return packing_ops.pack_codes(symbols, self.alphabet_size)

  def _unpack_stage(self, words):
    symbols = packing_ops.unpack_planar_codes(words, self.alphabet_size)
    return tf.cast(symbols, self._symbol_dtype)

  def _dequantize_stage(self, symbols, scales, n, seed, side_information,
                        dtype):
    length = self._coded_length(n)
    q = tf.cast(tf.reshape(symbols, [-1])[:length], dtype) - self._offset
    q = base.to_buckets(q, self.bucket_size)
    if side_information is not None:
      side_information = self._rotate(
          base.to_buckets(side_information, self.bucket_size), seed)
    decoded = self._dequantize(q, tf.cast(scales, dtype), seed,
                               side_information)
    return base.from_buckets(self._unrotate(decoded, seed), n)

  def _encode_impl(self, flat, seed, noise_scale=None):
    symbols, scales = self._compiled("_quantize_stage")(flat, seed,
                                                        noise_scale)
    return self._compiled("_pack_stage")(symbols), scales

  def _decode_impl(self, words, scales, n, seed, side_information, dtype):
    symbols = self._compiled("_unpack_stage")(words)
    return self._compiled("_dequantize_stage")(symbols, scales, n, seed,
                                               side_information, dtype)

  # The one-computation forms, for callers that compile a whole step.
  def _encode_flat(self, x, seed):
    symbols, scales = self._quantize_stage(x, seed)
    return self._pack_stage(symbols), scales

  def _decode_flat(self, words, scales, n, seed, side_information, dtype):
    symbols = self._unpack_stage(words)
    return self._dequantize_stage(symbols, scales, n, seed, side_information,
                                  dtype)

  # -- Shared scales: summing several senders' codes --------------------------
  #
  # Used by the integer all-reduce transport (`ndq_tf.distribute`,
  # docs/scaling.md). The codecs whose codes add up
  # (`ndq_tf.theory.codes_add_up`) implement `_decode_symbol_sum`.

  def bucket_scales(self, x, rotation_seed=None, dither_offset=0):
    """The `float32` scales `encode` would send for the 1-D tensor `x`.

    Args:
      x: 1-D floating tensor with a static length.
      rotation_seed: with `rotation`, the shape-`[2]` seed of the signs that
        every sender of the sum shares (required then; see
        `encode_symbols`): the scales are those of the rotated buckets.
      dither_offset: with `rotation_seed`, as for `encode_symbols`: the
        offset of `x` in a longer buffer, whose signs it takes.

    Returns:
      `float32` `[⌈n/bucket_size⌉]`: one scale per bucket, NaN for a bucket
      holding a NaN or an Inf.
    """
    x = _check_flat("x", x)
    rotation_seed = self._check_rotation_seed(rotation_seed, x,
                                              dither_offset, "bucket_scales")
    return self._compiled("_scales_stage")(x, rotation_seed)

  def encode_symbols(self, x, seed, scales, dither_offset=0,
                     rotation_seed=None):
    """Quantizes the 1-D `x` with given per-bucket scales; returns symbols.

    With `scales` the same for every sender (each bucket's largest scale
    over the senders), the symbols of several senders add up: the sum of
    their decodes is `decode_symbol_sum` of the sum of their symbols.

    Args:
      x: 1-D floating tensor of `n` values.
      seed: shape-`[2]` integer tensor, this sender's seed.
      scales: `float32` `[⌈n/bucket_size⌉]`, each at least the bucket's own
        scale (`bucket_scales`), or non-finite: such a bucket (a NaN or an
        Inf on some sender) is sent as code 0 and decodes to NaN.
      dither_offset: as for `encode`: `x` is the part of a longer buffer
        starting at this element (a multiple of `bucket_size`), and takes
        that part of the longer buffer's dither.
      rotation_seed: with `rotation` (required then): the shape-`[2]` seed
        of the rotation's signs, the same for every sender of the sum (each
        keeps its own `seed` for its dither), so that the sum of the
        rotated codes decodes to the rotated sum. `n` must then be a
        multiple of `bucket_size`.

    Returns:
      Integer symbols `code + offset` in `[0, alphabet_size)`, shape `[n]`
      (`uint8` for alphabets up to 256 symbols, else `int32`).
    """
    x = _check_flat("x", x)
    seed = self._check_seed(seed, self.needs_encode_seed, "encode_symbols")
    seed = self._offset_seed(seed, dither_offset)
    rotation_seed = self._check_rotation_seed(rotation_seed, x,
                                              dither_offset, "encode_symbols")
    scales = self._check_scales(scales, x.shape[0])
    return self._compiled("_shared_scale_stage")(x, seed, scales,
                                                 rotation_seed)

  def decode_symbol_sum(self, symbol_sum, scales, seeds, dtype=tf.float32,
                        dither_offset=0, rotation_seed=None):
    """The sum of the decodes of `P` senders, from the sum of their symbols.

    Args:
      symbol_sum: 1-D integer tensor: the elementwise sum of the senders'
        `encode_symbols`, all made with the same `scales`.
      scales: the shared `float32` scales.
      seeds: `[P, 2]` integer tensor, the seeds the senders encoded with
        (any order; only their dithers' sum matters).
      dtype: the floating dtype of the result.
      dither_offset: the `dither_offset` the senders encoded with.
      rotation_seed: with `rotation` (required then), the senders' shared
        `rotation_seed`: the sum is decoded in the rotated domain and
        inverse-rotated once.

    Returns:
      A tensor of `symbol_sum`'s shape and `dtype`: equal, to float
      rounding, to the sum of the senders' decodes with those scales.

    Raises:
      TypeError: if this codec's codes do not add up.
    """
    symbol_sum = tf.convert_to_tensor(symbol_sum)
    if symbol_sum.shape.rank != 1 or symbol_sum.shape[0] is None:
      raise ValueError(
          f"`symbol_sum` must be 1-D with a static length. Received: "
          f"symbol_sum with shape {symbol_sum.shape}.")
    scales = self._check_scales(scales, symbol_sum.shape[0])
    rotation_seed = self._check_rotation_seed(
        rotation_seed, symbol_sum, dither_offset, "decode_symbol_sum")
    seeds = tf.convert_to_tensor(seeds)
    # `[P, 3]`: every sender's seed with the offset, as `_offset_seed`
    # makes it (which also checks the offset); offset 0 keeps `[P, 2]`.
    checked = self._offset_seed(tf.zeros([2], tf.int32), dither_offset)
    if checked.shape[0] == 3:
      seeds = tf.concat([
          tf.cast(seeds, tf.int64),
          tf.fill([tf.shape(seeds)[0], 1],
                  tf.cast(dither_offset, tf.int64))], axis=1)
    return self._compiled("_symbol_sum_stage")(symbol_sum, scales, seeds,
                                               tf.as_dtype(dtype),
                                               rotation_seed)

  def _check_rotation_seed(self, rotation_seed, x, dither_offset, method):
    """`rotation_seed` with the offset, or None without rotation."""
    if self._rotation is None:
      if rotation_seed is not None:
        raise ValueError(
            f"{type(self).__name__}.{method} takes `rotation_seed` only with "
            f"a rotation. Received: rotation_seed={rotation_seed!r} for "
            f"rotation=None.")
      return None
    if rotation_seed is None:
      raise ValueError(
          f"{type(self).__name__}.{method} with rotation={self._rotation!r} "
          f"needs `rotation_seed`, the signs' seed every sender of the sum "
          f"shares. Received: rotation_seed=None.")
    if x.shape[0] % self.bucket_size:
      raise ValueError(
          f"With rotation={self._rotation!r}, the summed buffers must be "
          f"whole buckets of bucket_size={self.bucket_size}. Received: "
          f"{x.shape[0]} values.")
    rotation_seed = self._check_seed(rotation_seed, True, method)
    return self._offset_seed(rotation_seed, dither_offset)

  def _decode_symbol_sum(self, symbol_sum, scales, seeds, dtype):
    raise TypeError(
        f"The codes of {self!r} do not add up (see "
        f"ndq_tf.theory.codes_add_up): decode every sender instead.")

  def _check_scales(self, scales, n):
    scales = tf.convert_to_tensor(scales)
    if scales.dtype != tf.float32 or scales.shape != [self._num_scales(n)]:
      raise ValueError(
          f"`scales` must be float32 with one scale per bucket, shape "
          f"[{self._num_scales(n)}] for {n} values. Received: scales with "
          f"dtype {scales.dtype.name} and shape {scales.shape}.")
    return scales

  def _scales_stage(self, x, rotation_seed=None):
    return base.bucket_scales(
        self._rotate(base.to_buckets(x, self.bucket_size), rotation_seed),
        self._norm)

  def _shared_scale_stage(self, x, seed, scales, rotation_seed=None):
    xb = self._rotate(base.to_buckets(x, self.bucket_size), rotation_seed)
    q = self._quantize(xb, scales, seed)
    # A non-finite shared scale (NaN or Inf in that bucket on some sender)
    # decodes to NaN whatever the codes; code 0 keeps every symbol in its
    # lane (a NaN cast to an integer is not).
    q = tf.where(tf.math.is_finite(scales)[:, None], q, tf.zeros_like(q))
    symbols = base.from_buckets(q, x.shape[0]) + self._offset
    return tf.cast(symbols, self._symbol_dtype)

  def _symbol_sum_stage(self, symbol_sum, scales, seeds, dtype,
                        rotation_seed=None):
    total = self._decode_symbol_sum(symbol_sum, scales, seeds, dtype)
    if self._rotation is None:
      return total
    # The sum of the rotated decodes is the rotated sum: one inverse.
    return tf.reshape(self._unrotate(
        tf.reshape(total, [-1, self.bucket_size]), rotation_seed), [-1])


def _check_flat(name, x):
  x = tf.convert_to_tensor(x)
  if not x.dtype.is_floating:
    raise TypeError(
        f"`{name}` must be a floating point tensor. Received: {name} with "
        f"dtype {x.dtype.name}.")
  if x.shape.rank != 1 or x.shape[0] is None:
    raise ValueError(
        f"`{name}` must be 1-D with a static length. Received: {name} with "
        f"shape {x.shape}.")
  return x
