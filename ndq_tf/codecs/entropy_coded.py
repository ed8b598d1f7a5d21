"""Entropy-coded dithered quantization (ECDQ) of rotated buckets.

References:
  J. Ziv. On universal quantization. IEEE Trans. Inf. Theory, 1985.
  R. Zamir, M. Feder. On universal quantization by randomized
  uniform/lattice quantizers. IEEE Trans. Inf. Theory, 1992.
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019 (Theorem 1).
  docs/algorithms.md#entropy-coded-dithered-quantization-ecdq writes the
  equations, the coding model and the coder out.
"""

import functools
import math
from typing import Optional

import tensorflow as tf

from ndq_tf import theory
from ndq_tf.codecs import base
from ndq_tf.codecs import bucketed
from ndq_tf.ops import ecdq_tables
from ndq_tf.ops import rans_ops

__all__ = ["EntropyCodedDitheredCodec"]

#: Coded symbols per rANS lane: a tensor of `n` coded values runs
#: `ceil(n / SYMBOLS_PER_LANE)` lanes in lock step (each lane's header, its
#: final state and word count, costs 48 bits: about 0.012 bits per element).
SYMBOLS_PER_LANE = 4096

#: The rate without `step_ratio` or `bits`: bits per element.
DEFAULT_BITS = 1.0
#: The bits target's range (`bits=`): from well below one bit to the rates
#: where a fixed-length code does as well.
MIN_BITS, MAX_BITS = 0.3, 8.0
#: The step ratio's range (`step_ratio=`, `Δ/σ`).
MIN_STEP_RATIO = ecdq_tables.MIN_STEP_RATIO
MAX_STEP_RATIO = ecdq_tables.MAX_STEP_RATIO


@functools.lru_cache(maxsize=None)
def _conditional_rate(step_ratio):
  """`theory.ecdq_conditional_rate`, computed once per step ratio.

  A numerical integral of about 3 ms, which the cost model asks for once
  per shard: 1024 times for a reduce-scatter of 1024 workers.
  """
  return theory.ecdq_conditional_rate(step_ratio)


@base.register
class EntropyCodedDitheredCodec(bucketed.RotatedBuckets, base.Codec):
  """Dithered quantization with an unbounded alphabet, entropy coded.

  Each bucket of `bucket_size` values is rotated (the randomized Hadamard
  rotation of `DitheredCodec(rotation="hadamard")`), and its RMS `σ` is
  sent as a bfloat16 rounded up, `σ̂ ≥ σ`. The bucket is quantized with the
  step `Δ = step_ratio·σ̂` and a subtractive dither `u ~ U[-1/2, 1/2)`:
  `q = round(y/Δ + u)`, with no clipping (`|q| ≤ ⌈√d/step_ratio⌉ + 1`
  always), and decoded as `Δ(q - u)`. The error is uniform on
  `[-Δ/2, Δ/2)` whatever the input (the paper's Theorem 1), so the
  estimate is unbiased with a variance `Δ²/12` per rotated coefficient:
  a vNMSE of `step_ratio²/12` (with `σ̂ = σ`).

  The codes are coded by multi-lane rANS (`ndq_tf.ops.rans_ops`) with a
  coding model that both ends know: a Gaussian of the bucket's `σ̂`,
  conditioned on the dither's bin, as an integer table
  (`ndq_tf.ops.ecdq_tables`) fixed by the configuration. Its rate is about
  `theory.ecdq_conditional_rate(step_ratio)` bits per element (0.254 bits
  above the unbiased bound on a Gaussian), plus 16 bits per bucket for
  `σ̂`. A bucket of zeros costs next to nothing and decodes to zeros; a
  bucket holding a NaN or an Inf decodes to NaN.

  The payload's length varies with the data: its `words` have the static
  length `num_words(n)`, a worst case, and the first word holds how many
  are used (`payload_words`); the rest are zeros. `wire_bits(n)` is the
  expected length for Gaussian buckets, documented as such
  (`variable_length` is True). The all-gather and the reduce-scatter
  exchanges of `ndq_tf.MirroredStrategy` and
  `ndq_tf.MultiWorkerMirroredStrategy` send each payload's used words only
  (across workers after a round that announces the lengths), and their
  telemetry counts them; the integer all-reduce cannot sum these codes,
  and PowerSGD's factors and a nested group's reference codes stay
  fixed-length.

  Example:

  >>> codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0)
  >>> payload = codec.encode(g, seed=[1, 2])
  >>> g_hat = codec.decode(payload, seed=[1, 2])

  Args:
    step_ratio: `Δ/σ`, in `[1/64, 16]`; the vNMSE is `step_ratio²/12`.
    bits: instead of `step_ratio`, the target rate in bits per element,
      in `[0.3, 8]`, mapped to a step ratio by the Gaussian formula
      (`theory.ecdq_step_ratio`; σ̂'s 16 bits per bucket are not in it);
      1 when neither is given.
    bucket_size: values per `σ̂`, a power of two `>= 4` (the rotation's).
    bins: dither bins of the coding model, a power of two in `[1, 256]`.
    precision: bits of the model's integer frequencies, in `[8, 15]`.

  Raises:
    ValueError: for an argument out of range, or both `step_ratio` and
      `bits`.
  """

  decoder_needs_seed = True
  needs_encode_seed = True
  #: The payload's length varies with the data (see the class docstring).
  variable_length = True

  def __init__(self, step_ratio: Optional[float] = None,
               bits: Optional[float] = None, bucket_size: int = 512,
               bins: int = 32, precision: int = 15):
    if step_ratio is not None and bits is not None:
      raise ValueError(
          f"Pass one of `step_ratio` and `bits`, not both. Received: "
          f"step_ratio={step_ratio!r}, bits={bits!r}.")
    if step_ratio is None and bits is None:
      bits = DEFAULT_BITS
    if bits is not None:
      self._bits = base.check_float("bits", bits, MIN_BITS, MAX_BITS,
                                    low_inclusive=True)
      self._step_ratio = theory.ecdq_step_ratio(self._bits)
    else:
      self._bits = None
      self._step_ratio = base.check_float(
          "step_ratio", step_ratio, MIN_STEP_RATIO, MAX_STEP_RATIO,
          low_inclusive=True)
    self._bucket_size = base.check_int("bucket_size", bucket_size, 4)
    # Always rotated: the model is a Gaussian of rotated buckets.
    self._set_rotation("hadamard")
    self._bins = base.check_int("bins", bins, 1, 256)
    if self._bins & (self._bins - 1):
      raise ValueError(
          f"`bins` must be a power of two in [1, 256]. Received: "
          f"bins={bins!r}.")
    self._precision = base.check_int("precision", precision, 8, 15)
    self._table = self._slots = self._max_bits = None

  # -- Configuration ----------------------------------------------------------

  @property
  def step_ratio(self):
    """`Δ/σ`: the step in units of the bucket's RMS."""
    return self._step_ratio

  @property
  def bits(self):
    """The `bits=` target, or None when built from `step_ratio`."""
    return self._bits

  @property
  def bins(self):
    return self._bins

  @property
  def precision(self):
    return self._precision

  @property
  def max_abs_code(self):
    """`A`: every code is in `[-A, A]`."""
    return ecdq_tables.max_abs_symbol(self._step_ratio, self._bucket_size)

  @property
  def alphabet_size(self):
    return 2 * self.max_abs_code + 1

  def get_config(self):
    if self._bits is not None:
      config = {"bits": self._bits}
    else:
      config = {"step_ratio": self._step_ratio}
    config.update(bucket_size=self._bucket_size, bins=self._bins,
                  precision=self._precision)
    return config

  def table_digest(self):
    """The SHA-256 of the coding model's table (the options fingerprint)."""
    return ecdq_tables.table_digest(self._step_ratio, self._bucket_size,
                                    self._bins, self._precision)

  # -- Sizes ------------------------------------------------------------------

  def _num_buckets(self, num_elements):
    return -(-num_elements // self._bucket_size)

  def _num_lanes(self, num_elements):
    coded = self._num_buckets(num_elements) * self._bucket_size
    return max(1, -(-coded // SYMBOLS_PER_LANE))

  def _sigma_words(self, num_elements):
    return -(-self._num_buckets(num_elements) // 2)

  def _num_words(self, num_elements):
    """The worst case: the length word, `σ̂`'s words, the coder's capacity."""
    if num_elements == 0:
      return 0
    coded = self._num_buckets(num_elements) * self._bucket_size
    return 1 + self._sigma_words(num_elements) + rans_ops.rans_capacity_words(
        coded, self._num_lanes(num_elements), self._code_bound(),
        self._precision)

  def wire_bits(self, num_elements):
    """The *expected* bits of a payload of `num_elements` values.

    For Gaussian buckets: the length word, `σ̂`'s 16 bits per bucket, the
    lanes' headers (`rans_ops.rans_header_words`), and
    `theory.ecdq_conditional_rate` bits per coded value. A payload's real
    length is `payload_bits(payload)`; its worst case
    `max_wire_bits(num_elements)`.
    """
    n = base._check_count(num_elements)  # pylint: disable=protected-access
    if n == 0:
      return 0
    coded = self._num_buckets(n) * self._bucket_size
    lanes = self._num_lanes(n)
    bits = (32 + 32 * self._sigma_words(n)
            + 32 * rans_ops.rans_header_words(coded, lanes)
            + _conditional_rate(float(self._step_ratio)) * coded)
    return 32 * math.ceil(bits / 32)

  def max_wire_bits(self, num_elements):
    """The longest payload of `num_elements` values, in bits."""
    return 32 * self.num_words(num_elements)

  @staticmethod
  def payload_words(payload):
    """The words a payload uses (a scalar `int32` tensor): its first word."""
    words = payload.words if isinstance(payload, base.Payload) else payload
    if words.shape[0] == 0:
      return tf.constant(0, tf.int32)
    return words[0]

  def payload_bits(self, payload):
    """The bits a payload uses: `32 * payload_words(payload)`."""
    return 32 * self.payload_words(payload)

  # -- Coding -----------------------------------------------------------------

  def _cdf(self):
    if self._table is None:
      self._table = ecdq_tables.ecdq_cdf_table(
          self._step_ratio, self._bucket_size, self._bins, self._precision)
    return self._table

  def _code_bound(self):
    """`rans_ops.rans_max_bits` of the table: the coder's capacity."""
    if self._max_bits is None:
      self._max_bits = rans_ops.rans_max_bits(self._cdf(), self._precision)
    return self._max_bits

  def _slot_table(self):
    """The decoder's `rans_ops.slot_table`, built once, eagerly.

    Outside any graph (`tf.init_scope`), so that every `tf.function` that
    decodes captures the same tensor instead of building it again.
    """
    if self._slots is None:
      with tf.init_scope():
        self._slots = rans_ops.slot_table(self._cdf(), self._precision)
    return self._slots

  def _rows(self, u, sigma):
    """The model's row of every code: its dither's bin, or a special row."""
    # Exact in float32 (`ecdq_tables.dither_bin`): u + 1/2 is a multiple of
    # 2**-24 below 1, and `bins` a power of two, so the bin is below `bins`.
    ubin = tf.cast(tf.floor((u + 0.5) * self._bins), tf.int32)
    special = tf.where(sigma == 0, ecdq_tables.zero_bucket_row(self._bins),
                       ecdq_tables.nonfinite_bucket_row(self._bins))
    ok = tf.logical_and(tf.math.is_finite(sigma), sigma > 0)
    return tf.where(ok[:, None], ubin, special[:, None])

  def _encode_flat(self, x, seed):
    d, r = self._bucket_size, self._step_ratio
    xb = base.to_buckets(x, d)
    num_buckets = xb.shape[0]
    yb = self._rotate(xb, seed)
    sigma = _bfloat16_up(_rms(yb))                        # [B] float32
    step = tf.cast(sigma, yb.dtype) * r
    u = base.dither(seed, num_buckets, d, yb.dtype)
    a = self.max_abs_code
    t = base.normalize(yb, step)
    q = tf.clip_by_value(tf.cast(tf.round(t + u), tf.int32), -a, a)
    rows = self._rows(tf.cast(u, tf.float32), sigma)
    q = tf.where(rows < self._bins, q, 0)
    stream, used = rans_ops.rans_encode(
        tf.reshape(q + a, [-1]), tf.reshape(rows, [-1]),
        self._cdf(), self._num_lanes(x.shape[0]), self._precision,
        max_bits=self._code_bound())
    sigma_words = _pack_bfloat16(sigma)
    head = 1 + sigma_words.shape[0]
    words = tf.concat([tf.reshape(head + used, [1]), sigma_words, stream], 0)
    return words, tf.zeros([0], tf.float32)

  def _decode_flat(self, words, scales, n, seed, side_information, dtype):
    del scales, side_information
    d, r = self._bucket_size, self._step_ratio
    num_buckets = self._num_buckets(n)
    num_sigma = self._sigma_words(n)
    sigma = _unpack_bfloat16(words[1:1 + num_sigma], num_buckets)
    u = base.dither(seed, num_buckets, d, dtype)
    rows = self._rows(tf.cast(u, tf.float32), sigma)
    a = self.max_abs_code
    symbols = rans_ops.rans_decode(
        words[1 + num_sigma:], tf.reshape(rows, [-1]),
        self._cdf(), num_buckets * d, self._num_lanes(n), self._precision,
        table=self._slot_table())
    q = tf.cast(tf.reshape(symbols, [num_buckets, d]) - a, dtype)
    step = tf.cast(sigma, dtype) * r
    # Δ(q - u): zero for a bucket of zeros, NaN for a non-finite one.
    yb = tf.where((sigma > 0)[:, None], (q - u) * step[:, None],
                  tf.zeros_like(u))
    yb = tf.where(tf.math.is_finite(sigma)[:, None], yb,
                  tf.fill(tf.shape(u), tf.constant(math.nan, dtype)))
    xb = self._unrotate(yb, seed)
    return base.from_buckets(xb, n)


def _rms(yb):
  """Each row's RMS, NaN if it holds a NaN or an Inf (no overflow)."""
  m = tf.reduce_max(tf.abs(yb), axis=1)
  finite = tf.reduce_all(tf.math.is_finite(yb), axis=1)
  safe = tf.where(m > 0, m, tf.ones_like(m))
  z = yb / safe[:, None]
  rms = m * tf.sqrt(tf.reduce_mean(z * z, axis=1))
  return tf.where(finite, tf.cast(rms, tf.float32),
                  tf.constant(math.nan, tf.float32))


def _bfloat16_up(value):
  """A non-negative float32 rounded up to a bfloat16 (as float32); NaN stays."""
  bits = tf.bitcast(value, tf.int32)
  low = tf.bitwise.bitwise_and(bits, 0xFFFF)
  high = tf.bitwise.bitwise_and(bits, -65536)
  up = tf.where(low > 0, high + 65536, high)
  rounded = tf.bitcast(up, tf.float32)
  return tf.where(tf.math.is_finite(value), rounded, value)


def _pack_bfloat16(sigma):
  """Two bfloat16 `σ̂` (the float32's high halves) per `int32` word."""
  high = tf.bitwise.right_shift(tf.bitcast(sigma, tf.uint32), 16)
  high = tf.pad(high, [[0, sigma.shape[0] % 2]])
  pairs = tf.reshape(high, [-1, 2])
  word = tf.bitwise.bitwise_or(pairs[:, 0],
                               tf.bitwise.left_shift(pairs[:, 1], 16))
  return tf.bitcast(word, tf.int32)


def _unpack_bfloat16(words, num_buckets):
  w = tf.bitcast(words, tf.uint32)
  low = tf.bitwise.left_shift(tf.bitwise.bitwise_and(w, 0xFFFF), 16)
  high = tf.bitwise.left_shift(tf.bitwise.right_shift(w, 16), 16)
  both = tf.reshape(tf.stack([low, high], axis=1), [-1])[:num_buckets]
  return tf.bitcast(both, tf.float32)
