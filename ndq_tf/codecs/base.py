"""The codec interface: encode a tensor into a wire payload, decode it back.

A codec is configuration plus pure functions: it holds no random state; the
seed is an argument, and the same `(x, seed)` always gives the same payload.
Encoding and decoding run as XLA-compiled functions (one compilation per
shape), which fuses the hash RNG, the quantizer and the packing into a few
passes over memory and makes the results bitwise identical whether the
caller runs eagerly, in a `tf.function` or under XLA itself.
"""

import math

import keras
import tensorflow as tf

from ndq_tf.ops import checks
from ndq_tf.ops import random_ops

__all__ = [
    "Codec",
    "Payload",
]


# The codecs' Python control flow depends only on static shapes and
# configuration: AutoGraph has nothing to convert in them when a user's
# tf.function calls them, and converting costs tracing time.
_do_not_convert = tf.autograph.experimental.do_not_convert

# (codec type, config, method name) -> its XLA-compiled tf.function.
_COMPILED = {}


class Payload(tf.experimental.ExtensionType):
  """What a codec puts on the wire for one tensor.

  Attributes:
    words: 1-D `int32` tensor, the packed codes (or raw bits).
    scales: 1-D `float32` tensor, one scale per bucket (may be empty).
    shape: static shape of the encoded tensor (not sent: receivers know it).
    dtype: dtype of the encoded tensor (not sent either).
  """
  words: tf.Tensor
  scales: tf.Tensor
  shape: tf.TensorShape
  dtype: tf.DType


#: Validates an integer constructor argument; returns it as an `int`
#: (`ndq_tf.ops.checks.check_int`: the ops' rule and message).
check_int = checks.check_int


def check_float(name, value, low, high, low_inclusive=False):
  """Validates a float argument in `(low, high]` (or `[low, high]`)."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if ok:
    value = float(value)
    ok = (math.isfinite(value) and value <= high
          and (value >= low if low_inclusive else value > low))
  if not ok:
    left = "[" if low_inclusive else "("
    raise ValueError(
        f"`{name}` must be a number in {left}{low}, {high}]. Received: "
        f"{name}={value!r}.")
  return value


def check_fixed_length(codec, name, value):
  """Raises unless `codec`'s payloads have a fixed length.

  For the codecs that the exchanges carry only at a fixed length: PowerSGD's
  factor and fallback codecs and a nested group's reference codec (the
  all-gather carries a variable-length `codec` itself, trimmed to the words
  each payload uses). `name`, `value`: the argument and what the caller
  passed, for the message.
  """
  if getattr(codec, "variable_length", False):
    raise ValueError(
        f"`{name}` must have fixed-length payloads: this codec's vary in "
        f"length, and only the options' own `codec` may (the all-gather "
        f"trims each payload to the words it uses); PowerSGD's factors "
        f"and a nested group's reference codes stay fixed-length (issue "
        f"#35). Received: {name}={value!r}.")
  return codec


def compute_dtype(dtype):
  """Codecs compute in float64 for float64 inputs and in float32 otherwise."""
  return tf.float64 if dtype == tf.float64 else tf.float32


def to_buckets(x, bucket_size):
  """Pads the flat `x` with zeros to whole buckets: shape `[B, bucket_size]`."""
  n = x.shape[0]
  num_buckets = -(-n // bucket_size)
  x = tf.pad(x, [[0, num_buckets * bucket_size - n]])
  return tf.reshape(x, [num_buckets, bucket_size])


def from_buckets(xb, n):
  return tf.reshape(xb, [-1])[:n]


def float32_scale_up(value):
  """Rounds a non-negative scale to float32, upwards.

  The encoder normalizes by the scale the receivers will see (the float32
  on the wire); rounding up keeps the normalized values inside `[-1, 1]`.
  """
  if value.dtype == tf.float32:
    return value
  rounded = tf.cast(value, tf.float32)
  up = tf.math.nextafter(rounded, tf.constant(math.inf, tf.float32))
  return tf.where(tf.cast(rounded, value.dtype) < value, up, rounded)


def _max_abs(xb):
  """Per-row max of `|x|`, +Inf if the row holds a NaN or an Inf.

  Computed on the bits, exactly: a float's magnitude orders like its bits
  with the sign cleared, every NaN above +Inf, so the result does not depend
  on how a float max treats NaN (XLA's fast-min-max mode drops them). The
  max of the bits read as signed integers is the largest non-negative value
  (if any), read as unsigned integers the largest-magnitude negative one (if
  any); the larger of the two with the sign cleared is the max magnitude,
  and a NaN's bits become +Inf's.

  Both maxima reduce the input's bits as they are, over the middle axis of
  `[B, d/lanes, lanes]`: XLA:CPU compiles that to a vectorized loop reading
  `x` once, where masking first would make it write the magnitudes and read
  them back (docs/algorithms.md#max-norm-on-the-bits).
  """
  if xb.dtype == tf.float64:
    signed, unsigned, lanes = tf.int64, tf.uint64, 8
  elif xb.dtype == tf.float32:
    signed, unsigned, lanes = tf.int32, tf.uint32, 16
  else:
    inf = tf.constant(math.inf, xb.dtype)
    return tf.reduce_max(tf.where(tf.math.is_nan(xb), inf, tf.abs(xb)),
                         axis=1)
  num_buckets, d = xb.shape
  lanes = min(lanes, d)
  if d % lanes:
    # Zeros change neither maximum's magnitude.
    xb = tf.pad(xb, [[0, 0], [0, lanes - d % lanes]])
  xb = tf.reshape(xb, [num_buckets, -1, lanes])
  largest = tf.reduce_max(tf.bitcast(xb, signed), axis=1)
  most_negative = tf.bitcast(tf.reduce_max(tf.bitcast(xb, unsigned), axis=1),
                             signed)
  magnitude = tf.constant((1 << (xb.dtype.size * 8 - 1)) - 1, signed)
  top = tf.reduce_max(
      tf.maximum(tf.bitwise.bitwise_and(largest, magnitude),
                 tf.bitwise.bitwise_and(most_negative, magnitude)), axis=1)
  inf_bits = tf.bitcast(tf.constant(math.inf, xb.dtype), signed)
  return tf.bitcast(tf.minimum(top, inf_bits), xb.dtype)


def bucket_scales(xb, norm="max"):
  """Per-bucket scales as sent on the wire: `float32`, NaN for bad buckets.

  A bucket holding a NaN or an Inf gets the scale NaN, so that every value
  decoded from it is NaN: non-finite gradients stay visible to loss scaling
  and are never turned into finite garbage.

  Args:
    xb: `[B, d]` float tensor.
    norm: "max" (the ∞-norm, DQSG/TernGrad) or "l2" (QSGD).

  Returns:
    `float32` tensor of shape `[B]`.
  """
  if norm not in ("max", "l2"):
    raise ValueError(f"`norm` must be 'max' or 'l2'. Received: norm={norm!r}.")
  kappa = _max_abs(xb)
  finite = tf.math.is_finite(kappa)
  if norm == "l2":
    # Scaled by the max so that squares of large finite values cannot
    # overflow to Inf.
    safe = tf.where(finite & (kappa > 0), kappa, tf.ones_like(kappa))
    ratio = tf.where(finite[:, None], divide_rows(xb, safe),
                     tf.zeros_like(xb))
    kappa = safe * tf.sqrt(tf.reduce_sum(tf.square(ratio), axis=1))
  kappa = float32_scale_up(tf.where(finite, kappa, tf.zeros_like(kappa)))
  nan = tf.constant(math.nan, tf.float32)
  return tf.where(finite, kappa, nan)


def divide_rows(xb, divisor):
  """`xb / divisor[:, None]`, correctly rounded under XLA on every TF version.

  XLA in TF 2.22 compiles a division by a broadcast row value into a
  multiplication by its reciprocal, `x·(1/s)`, which is 1 ulp off the
  quotient for about a quarter of float32 elements; XLA up to TF 2.21, and
  TF's own kernels, divide. Rounding a float64 `x·(1/s)` to float32 gives
  the correctly rounded float32 quotient, the bits of the division: its
  relative error (< 2⁻⁵²) is below the distance (> 2⁻⁴⁹) from any quotient of
  two float32 values to a float32 rounding boundary, and both operations
  are exact IEEE operations that XLA does not rewrite. float64 values are
  divided (no wider type to round from).

  Args:
    xb: `[B, d]` floating tensor.
    divisor: `[B]` tensor of xb's dtype.

  Returns:
    `[B, d]` tensor of xb's dtype.
  """
  if xb.dtype == tf.float64:
    return xb / divisor[:, None]
  reciprocal = 1.0 / tf.cast(divisor, tf.float64)
  return tf.cast(tf.cast(xb, tf.float64) * reciprocal[:, None], xb.dtype)


def normalize(xb, step):
  """`xb / step` per bucket, and 0 where the step is 0 or not finite.

  The quotient is correctly rounded (`divide_rows`), the same bits on every
  TensorFlow, where a multiplication by a reciprocal would not be.

  Args:
    xb: `[B, d]` tensor.
    step: `[B]` tensor of xb's dtype.

  Returns:
    `[B, d]` tensor.
  """
  valid = tf.math.logical_and(tf.math.is_finite(step), step > 0)
  safe = tf.where(valid, step, tf.ones_like(step))
  return tf.where(valid[:, None], divide_rows(xb, safe), tf.zeros_like(xb))


class Codec:
  """Base class of all codecs.

  Subclasses set `decoder_needs_seed` / `needs_side_information` and implement
  `_num_words`, `_num_scales`, `_encode_flat` and `_decode_flat` as pure TF
  functions of flat tensors; this class handles validation, shapes, dtypes,
  compilation and the wire layout.
  """

  #: Whether `decode` needs the encoder's seed (to subtract the dither).
  decoder_needs_seed = False
  #: Whether `encode` uses randomness (and so needs a seed).
  needs_encode_seed = False
  #: Whether `decode` needs `side_information` (nested codecs).
  needs_side_information = False
  #: Whether a payload's length varies with the data: its `words` have the
  #: static worst-case length `num_words(n)`, the first word holds the
  #: words used and the rest are zeros (`EntropyCodedDitheredCodec`).
  variable_length = False
  #: How an integer all-reduce sums this codec's payloads (`summed_form`):
  #: `"codes"`, `"float16"`, `"bfloat16"`, `"float32"` or None. Declared by
  #: each class for
  #: itself: a subclass that does not declare it again is not summed (it
  #: may decode otherwise).
  SUMMED_FORM = None

  bucket_size = None
  alphabet_size = None

  # -- Subclass hooks ---------------------------------------------------------

  def _num_words(self, num_elements):
    raise NotImplementedError

  def _num_scales(self, num_elements):
    return 0

  def _encode_flat(self, x, seed):
    """Returns `(words, scales)` for the flat tensor `x` (compute dtype)."""
    raise NotImplementedError

  def _decode_flat(self, words, scales, num_elements, seed, side_information,
                   dtype):
    """Returns the flat decoded tensor in the compute dtype `dtype`."""
    raise NotImplementedError

  def get_config(self):
    return {}

  # -- Public API -------------------------------------------------------------

  @classmethod
  def from_config(cls, config):
    return cls(**config)

  def __repr__(self):
    args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
    return f"{type(self).__name__}({args})"

  def __eq__(self, other):
    return (type(self) is type(other)
            and self.get_config() == other.get_config())

  def __hash__(self):
    return hash((type(self).__name__,
                 tuple(sorted(self.get_config().items()))))

  def summed_form(self):
    """How the integer all-reduce sums this codec's payloads, or None.

    `"codes"`: integer codes in lanes (`ndq_tf.ops.pack_lanes`) with shared
    scales; `"float16"`, `"float32"`: the values, through TF's own ring of
    that dtype; `"bfloat16"`: the values rounded to bfloat16, through the
    float32 ring (`ndq_tf.core.exchanges.sum.FLOAT_FORMS`); None: the
    payloads do not add up (nested codecs: each code
    is a residue only its own side information decodes; any class that
    does not declare `SUMMED_FORM` itself, subclasses included).
    """
    if self.needs_side_information:
      return None
    return type(self).__dict__.get("SUMMED_FORM")

  def num_words(self, num_elements):
    """Number of `int32` code words in the payload of `num_elements` values."""
    return self._num_words(_check_count(num_elements))

  def num_scales(self, num_elements):
    """Number of `float32` scales in the payload of `num_elements` values."""
    return self._num_scales(_check_count(num_elements))

  def wire_bits(self, num_elements):
    """Exact bits on the wire for a tensor of `num_elements` elements.

    Equals `32 * (payload.words.shape[0] + payload.scales.shape[0])`.
    """
    return 32 * (self.num_words(num_elements) + self.num_scales(num_elements))

  @_do_not_convert
  def encode(self, x, seed=None, noise_scale=None, dither_offset=0):
    """Encodes a floating point tensor.

    Args:
      x: tensor of any static shape, dtype float16, bfloat16, float32 or
        float64.
      seed: shape-`[2]` integer tensor (TF's stateless convention); required
        by the codecs that draw random numbers.
      dither_offset: the index of `x`'s first element in a longer buffer
        whose dither `x` takes its part of: `encode(x[a:b], seed,
        dither_offset=a)` draws the dither `encode(x, seed)` draws for
        `x[a:b]`, so `decode(..., dither_offset=a)` of it is that slice of
        the whole buffer's decode, bit for bit. A multiple of
        `bucket_size` (chunks are whole buckets); an int or an integer
        scalar tensor.
      noise_scale: nested codecs only (`accepts_noise_scale`): the expected
        spread `σ_z` of `x - side_information`, per bucket (`[num_scales]`)
        or one scalar, known to the receivers too. Selects the adaptive mode
        of `NestedDitheredCodec`.

    Returns:
      A `Payload`.

    Raises:
      TypeError: if `x` is not floating point or `seed` not integer.
      ValueError: if `x` has no static shape, or a needed seed is missing.
    """
    x = _check_input(x)
    seed = self._check_seed(seed, self.needs_encode_seed, "encode")
    seed = self._offset_seed(seed, dither_offset)
    n = x.shape.num_elements()
    noise_scale = self._check_noise_scale(noise_scale, n)
    if n == 0:
      words = tf.zeros([0], tf.int32)
      scales = tf.zeros([0], tf.float32)
    else:
      flat = tf.reshape(tf.cast(x, compute_dtype(x.dtype)), [-1])
      if noise_scale is None:
        words, scales = self._encode_impl(flat, seed)
      else:
        words, scales = self._encode_impl(flat, seed, noise_scale)
    return Payload(words=words, scales=scales, shape=x.shape, dtype=x.dtype)

  #: Whether `encode` takes `noise_scale` (the adaptive nested codec).
  accepts_noise_scale = False

  def _check_noise_scale(self, noise_scale, n):
    if noise_scale is None:
      return None
    if not self.accepts_noise_scale:
      raise ValueError(
          f"{type(self).__name__}.encode does not take `noise_scale` (only "
          f"nested codecs do). Received: noise_scale={noise_scale!r}.")
    noise_scale = tf.convert_to_tensor(noise_scale)
    if not noise_scale.dtype.is_floating:
      raise TypeError(
          f"`noise_scale` must be floating point. Received: noise_scale with "
          f"dtype {noise_scale.dtype.name}.")
    num_scales = self.num_scales(n)
    if noise_scale.shape.rank == 0:
      noise_scale = tf.fill([num_scales], tf.cast(noise_scale, tf.float32))
    elif noise_scale.shape != [num_scales]:
      raise ValueError(
          f"`noise_scale` must be a scalar or have one value per bucket, "
          f"shape [{num_scales}]. Received: noise_scale with shape "
          f"{noise_scale.shape}.")
    return tf.cast(noise_scale, tf.float32)

  @_do_not_convert
  def decode(self, payload, seed=None, side_information=None,
             dither_offset=0):
    """Decodes a payload back to a tensor of the encoded shape and dtype.

    Args:
      payload: a `Payload` from `encode` (or `from_wire`).
      seed: the encoder's seed; required when `decoder_needs_seed`.
      side_information: the receiver's estimate of the tensor, of the same
        shape; required by nested codecs, rejected by the others.
      dither_offset: the `dither_offset` the payload was encoded with.

    Returns:
      A tensor of `payload.shape` and `payload.dtype`.

    Raises:
      TypeError, ValueError: for a missing or malformed argument.
    """
    if not isinstance(payload, Payload):
      raise TypeError(
          f"`payload` must be an ndq_tf Payload (from encode or from_wire). "
          f"Received: payload of type {type(payload).__name__}.")
    seed = self._check_seed(seed, self.decoder_needs_seed, "decode")
    seed = self._offset_seed(seed, dither_offset)
    cdtype = compute_dtype(payload.dtype)
    n = payload.shape.num_elements()
    if self.needs_side_information:
      if side_information is None:
        raise ValueError(
            f"{type(self).__name__}.decode needs `side_information`: the "
            f"receiver's estimate of the encoded tensor. Received: "
            f"side_information=None.")
      side_information = tf.convert_to_tensor(side_information)
      if not side_information.dtype.is_floating:
        raise TypeError(
            f"`side_information` must be floating point. Received: "
            f"side_information with dtype {side_information.dtype.name}.")
      if not side_information.shape.is_compatible_with(payload.shape):
        raise ValueError(
            f"`side_information` must have the encoded shape "
            f"{payload.shape}. Received: side_information with shape "
            f"{side_information.shape}.")
      side_information = tf.reshape(
          tf.cast(side_information, cdtype), [-1])
    elif side_information is not None:
      raise ValueError(
          f"{type(self).__name__} does not use `side_information` (only "
          f"nested codecs do). Received: side_information="
          f"{side_information!r}.")
    if n == 0:
      return tf.zeros(payload.shape, payload.dtype)
    flat = self._decode_impl(payload.words, payload.scales, n, seed,
                             side_information, cdtype)
    if payload.dtype == tf.float16:
      # A decoded value may exceed the bucket's max by half a step; saturate
      # at float16's largest finite value rather than invent an overflow
      # that loss scaling would take for a real one. NaN stays NaN.
      flat = tf.where(tf.math.is_finite(flat),
                      tf.clip_by_value(flat, -65504.0, 65504.0), flat)
    return tf.cast(tf.reshape(flat, payload.shape), payload.dtype)

  @_do_not_convert
  def to_wire(self, payload):
    """Flattens a payload into one `int32` tensor: words, then scales' bits."""
    return tf.concat(
        [payload.words, tf.bitcast(payload.scales, tf.int32)], axis=0)

  @_do_not_convert
  def from_wire(self, wire, shape, dtype):
    """Inverse of `to_wire`, given the static shape and dtype of the tensor.

    Args:
      wire: 1-D `int32` tensor of `num_words(n) + num_scales(n)` elements
        (`wire_bits(n) / 32`, unless the codec is `variable_length`).
      shape: the encoded tensor's static shape.
      dtype: the encoded tensor's dtype.

    Returns:
      A `Payload`.
    """
    shape = tf.TensorShape(shape)
    n = shape.num_elements()
    if n is None:
      raise ValueError(f"`shape` must be fully defined. Received: {shape}.")
    num_words = self.num_words(n)
    num_scales = self.num_scales(n)
    wire = tf.convert_to_tensor(wire)
    if wire.dtype != tf.int32:
      raise TypeError(
          f"`wire` must be int32. Received: wire with dtype {wire.dtype.name}.")
    expected = num_words + num_scales
    if wire.shape.rank != 1 or (wire.shape[0] is not None
                                and wire.shape[0] != expected):
      raise ValueError(
          f"`wire` must be 1-D with {expected} words for {n} elements. "
          f"Received: wire with shape {wire.shape}.")
    return Payload(
        words=wire[:num_words],
        scales=tf.bitcast(wire[num_words:num_words + num_scales], tf.float32),
        shape=shape,
        dtype=tf.as_dtype(dtype))

  # -- Internals --------------------------------------------------------------

  def _compiled(self, name):
    """`getattr(self, name)` as an XLA-compiled function.

    Shared by all codecs of equal configuration: they compute the same pure
    functions, so a codec rebuilt from its config (or made anew every step)
    reuses the compiled code instead of tracing and compiling again.
    """
    key = (type(self), tuple(sorted(self.get_config().items())), name)
    fn = _COMPILED.get(key)
    if fn is None:
      fn = tf.function(getattr(self, name), jit_compile=True, autograph=False)
      _COMPILED[key] = fn
    return fn

  def _encode_impl(self, flat, seed, noise_scale=None):
    del noise_scale  # Only nested codecs accept it.
    return self._compiled("_encode_flat")(flat, seed)

  def _decode_impl(self, words, scales, n, seed, side_information, dtype):
    return self._compiled("_decode_flat")(words, scales, n, seed,
                                          side_information, dtype)

  def _offset_seed(self, seed, dither_offset):
    """`seed`, or `[seed0, seed1, offset]` (`int64`) for a dither offset.

    The codecs' quantizers draw through `dither`, which reads a third seed
    word as the counter offset; offset 0 keeps the `[2]` seed, so the
    compiled functions and the bits of a whole-buffer encode are unchanged.
    """
    if isinstance(dither_offset, bool) or not (
        isinstance(dither_offset, int) or (
            tf.is_tensor(dither_offset) and dither_offset.dtype.is_integer
            and dither_offset.shape.rank == 0)):
      raise TypeError(
          f"`dither_offset` must be an int or an integer scalar tensor. "
          f"Received: dither_offset={dither_offset!r}.")
    if isinstance(dither_offset, int):
      if dither_offset < 0 or (self.bucket_size and
                               dither_offset % self.bucket_size):
        raise ValueError(
            f"`dither_offset` must be a non-negative multiple of bucket_size="
            f"{self.bucket_size}. Received: dither_offset={dither_offset}.")
      if dither_offset == 0:
        return seed
    if seed is None:  # This codec draws no dither here.
      return None
    return tf.concat([tf.cast(seed, tf.int64),
                      tf.reshape(tf.cast(dither_offset, tf.int64), [1])], 0)

  def _check_seed(self, seed, needed, method):
    if seed is None:
      if needed:
        raise ValueError(
            f"{type(self).__name__}.{method} needs `seed`, a shape-[2] "
            f"integer tensor. Received: seed=None.")
      return None
    seed = tf.convert_to_tensor(seed)
    if not seed.dtype.is_integer:
      raise TypeError(
          f"`seed` must be an integer tensor of shape [2]. Received: seed "
          f"with dtype {seed.dtype.name}.")
    if seed.shape.rank is None or seed.shape != [2]:
      raise ValueError(
          f"`seed` must have shape [2]. Received: seed with shape "
          f"{seed.shape}.")
    if not needed:
      # Not used: do not let a seed change the compiled function's signature.
      return None
    return seed


def _check_count(num_elements):
  if (isinstance(num_elements, bool) or not isinstance(num_elements, int)
      or num_elements < 0):
    raise ValueError(
        f"`num_elements` must be a non-negative integer. Received: "
        f"num_elements={num_elements!r}.")
  return num_elements


def _check_input(x):
  x = tf.convert_to_tensor(x)
  if not x.dtype.is_floating:
    raise TypeError(
        f"`x` must be a floating point tensor (float16, bfloat16, float32 "
        f"or float64). Received: x with dtype {x.dtype.name}.")
  if not x.shape.is_fully_defined():
    raise ValueError(
        f"`x` must have a fully defined static shape. Received: x with shape "
        f"{x.shape}.")
  if x.shape.num_elements() >= 2**31:
    raise ValueError(
        f"`x` must have fewer than 2**31 elements. Received: x with "
        f"{x.shape.num_elements()} elements.")
  return x


def register(cls):
  """Registers a codec class for Keras (de)serialization."""
  return keras.saving.register_keras_serializable(package="ndq_tf")(cls)


def dither(seed, num_buckets, bucket_size, dtype, stream=0):
  """The dither of a bucketed tensor, in units of the step: `[B, d]`.

  A seed of three words is `[seed0, seed1, counter offset]`
  (`Codec.encode(..., dither_offset=)`).
  """
  offset = 0
  if seed.shape[0] == 3:
    seed, offset = seed[:2], seed[2]
  u = random_ops.uniform_dither(seed, num_buckets * bucket_size, stream,
                                offset)
  return tf.cast(tf.reshape(u, [num_buckets, bucket_size]), dtype)
