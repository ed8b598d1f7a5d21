"""The codecs and helpers shared by the codec tests (codecs/test_base.py,
test_nested.py, test_dithered.py, test_bucketed.py, test_registry.py,
test_entropy_coded.py).

Every codec is configured once, here, and the tests reuse a few tensor
sizes: a codec compiles its encoder and decoder with XLA once per (size,
compute dtype), and those compilations dominate the run time.

Most codecs send fixed-length payloads: `32 * (words + scales)` is their
`wire_bits(n)`. A `variable_length` codec (ECDQ) pads its words to the
worst case, `max_wire_bits(n)`, uses `payload_bits(payload)` of them, and
sends no float scales (its `σ̂` travel in the words).
"""

import math

import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf.ops import rotation_ops

# name -> codec. Bucket sizes are small so that a 1001-element tensor spans
# many buckets, and neither 1001 nor the bucket sizes are multiples of the
# codes per word (20 for ternary, 10 for 9 symbols, 32 for binary...).
CODECS = {
    "float32": ndq_tf.Float32Codec(),
    "float16": ndq_tf.Float16Codec(),
    "bfloat16": ndq_tf.BFloat16Codec(),
    "dqsg_ternary": ndq_tf.DitheredCodec(num_levels=1, bucket_size=64),
    "dqsg_m4": ndq_tf.DitheredCodec(num_levels=4, bucket_size=100),
    "half_order1": ndq_tf.HalfDitheredCodec(num_levels=1, bucket_size=64,
                                            dither_order=1),
    "half_order2": ndq_tf.HalfDitheredCodec(num_levels=2, bucket_size=64,
                                            dither_order=2),
    "half_order3": ndq_tf.HalfDitheredCodec(num_levels=1, bucket_size=50,
                                            dither_order=3),
    "ndqsg_k3": ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                           alpha=1.0, bucket_size=64),
    "ndqsg_k4": ndq_tf.NestedDitheredCodec(num_levels=4, coarse_ratio=4,
                                           alpha=0.75, bucket_size=64),
    "qsgd": ndq_tf.QSGDCodec(num_levels=2, bucket_size=64),
    "terngrad": ndq_tf.TernGradCodec(bucket_size=64),
    "ecdq": ndq_tf.EntropyCodedDitheredCodec(bits=1.0, bucket_size=64),
}
# Codecs whose encoder draws random numbers.
SEEDED = [name for name, c in CODECS.items() if c.needs_encode_seed]
BUCKETED = [name for name, c in CODECS.items() if c.bucket_size is not None]
# Bucketed codecs that send a float32 scale per bucket (all but ECDQ).
SCALED = [name for name in BUCKETED if CODECS[name].num_scales(1)]

SEED = tf.constant([12, 34], tf.int32)
OTHER_SEED = tf.constant([12, 35], tf.int32)
N = 1001  # the shared size: 7 * 11 * 13
FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
EPS = {tf.float16: 2.0**-10, tf.bfloat16: 2.0**-7, tf.float32: 2.0**-23,
        tf.float64: 2.0**-52}


def codec_params(names):
  return [(name,) for name in names]


def make_signal(n, dtype=tf.float32, seed=0):
  rng = np.random.default_rng(seed)
  return tf.cast(rng.standard_normal(n), dtype)


def side_information_of(x, seed=1):
  """An estimate of x, off by much less than a coarse cell (no overload).

  The noise is 0.5% of x's rms, a few thousandths of a bucket's max-norm
  against a coarse half-cell of Δ2/2 >= 1/2 in normalized units.
  """
  rng = np.random.default_rng(seed)
  x64 = tf.cast(x, tf.float64).numpy()
  finite = x64[np.isfinite(x64)]
  rms = math.sqrt(np.mean(finite**2)) if finite.size else 0.0
  return tf.cast(x64 + 0.005 * rms * rng.standard_normal(x64.shape), x.dtype)


def decode_with(codec, payload, seed=SEED, side_information=None):
  if codec.needs_side_information:
    return codec.decode(payload, seed, side_information=side_information)
  return codec.decode(payload, seed)


def encode_decode(codec, x, seed=SEED, y=None):
  if codec.needs_side_information and y is None:
    y = side_information_of(x)
  payload = codec.encode(x, seed)
  return payload, decode_with(codec, payload, seed, y)


def bits_of(t):
  """The bits of a tensor as an integer array (NaN-safe bitwise compare)."""
  t = tf.convert_to_tensor(t)
  if t.dtype.is_floating:
    width = {2: tf.int16, 4: tf.int32, 8: tf.int64}[t.dtype.size]
    return tf.bitcast(t, width).numpy()
  return t.numpy()


def ecdq_sigmas(codec, payload, n):
  """The `σ̂` of every bucket of an ECDQ payload (float64).

  Words 1 to `ceil(B/2)`, two bfloat16 per word (the first in the low half).
  """
  b = -(-n // codec.bucket_size)
  words = payload.words.numpy()[1:1 + -(-b // 2)].view(np.uint32)
  halves = np.stack([words & 0xFFFF, words >> 16], axis=1).reshape(-1)[:b]
  return (halves.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def static_wire_bits(codec, n):
  """The bits of a payload's tensors, `32 * (words + scales)`.

  `wire_bits(n)` for a fixed-length codec; for a variable-length one its
  worst case, `max_wire_bits(n)` (`wire_bits` is then an expectation).
  """
  if codec.variable_length:
    return codec.max_wire_bits(n)
  return codec.wire_bits(n)


def per_element_scale(codec, payload, n):
  """Each element's bucket scale as float64 (all 1 for unbucketed codecs).

  ECDQ's is `√d·σ̂/c`, at least the bucket's L2 norm (`σ̂ ≥` the rotated
  bucket's RMS, and the rotation is `c` times orthonormal), so at least
  every `|x|` of the bucket.
  """
  if codec.bucket_size is None:
    return np.ones(n)
  if isinstance(codec, ndq_tf.EntropyCodedDitheredCodec):
    d = codec.bucket_size
    norm = math.sqrt(d) / rotation_ops.domain_gain(d)
    return np.repeat(norm * ecdq_sigmas(codec, payload, n), d)[:n]
  return np.repeat(payload.scales.numpy().astype(np.float64),
                   codec.bucket_size)[:n]


def error_bound(codec, x, y, payload):
  """Per-element bound on |x̂ - x| before rounding to the output dtype."""
  n = int(np.prod(x.shape))
  x64 = tf.reshape(tf.cast(x, tf.float64), [-1]).numpy()
  kappa = per_element_scale(codec, payload, n)
  if isinstance(codec, ndq_tf.Float32Codec):
    return np.abs(x64) * 2.0**-24
  if isinstance(codec, ndq_tf.Float16Codec):
    return np.abs(x64) * 2.0**-11 + 2.0**-25  # + half the subnormal spacing
  if isinstance(codec, ndq_tf.BFloat16Codec):
    return np.abs(x64) * 2.0**-8 + 2.0**-134  # 8 significant bits
  if isinstance(codec, ndq_tf.DitheredCodec):
    return kappa * codec.step / 2
  if isinstance(codec, ndq_tf.HalfDitheredCodec):
    # |u| <= mΔ/2 plus the rounding's Δ/2.
    return kappa * codec.step * (codec.dither_order + 1) / 2
  if isinstance(codec, ndq_tf.NestedDitheredCodec):
    # (α² - 1) z + α e, |e| <= Δ1/2 (no overload by construction of y).
    z = x64 - tf.reshape(tf.cast(y, tf.float64), [-1]).numpy()
    a = codec.alpha
    return (1 - a * a) * np.abs(z) + a * kappa * codec.fine_step / 2
  if isinstance(codec, ndq_tf.QSGDCodec):
    return kappa / codec.num_levels  # one level of the L2 norm
  if isinstance(codec, ndq_tf.TernGradCodec):
    return kappa
  if isinstance(codec, ndq_tf.EntropyCodedDitheredCodec):
    # Rotated errors |e_j| <= Δ/2 = r·σ̂/2; unrotated, an element's is
    # |Σ_j R_ji e_j|/c <= √d·(Δ/2)/c = kappa·r/2 (R orthonormal).
    return kappa * codec.step_ratio / 2
  raise AssertionError(f"no bound for {codec}")
