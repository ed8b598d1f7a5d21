"""`Codec.encode_and_decode`: a sender's payload and its own decode, one pass.

The engine decodes a sender's own payload from the pass that encodes it
(issue #12), so those bits must be the bits every other receiver decodes
from the wire: same payload, same decode, for every codec, NaN, Inf and
zero buckets, dither offsets, eagerly and inside `tf.function`.
"""

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf

SPECS = ["dqsg:num_levels=1", "dqsg:num_levels=3,bucket_size=128",
         "dqsg:num_levels=200", "half_dithered:num_levels=2,dither_order=3",
         "terngrad", "qsgd:num_levels=2", "float16", "float32"]


def _values(n, seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))
  x[:512] = 0.0  # a zero bucket
  x[700] = np.nan
  x[1500] = np.inf
  x[2100] = -np.inf
  return tf.constant(x.astype(np.float32))


def _same_bits(a, b):
  np.testing.assert_array_equal(np.asarray(a).view(np.uint32),
                                np.asarray(b).view(np.uint32))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dither_offset", [0, 1536])
@pytest.mark.parametrize("n", [3000, 1 << 17])
def test_own_decode_is_the_decode_of_the_payload(spec, dither_offset, n):
  codec = ndq_tf.codecs.get(spec)
  if dither_offset % (codec.bucket_size or 1):
    pytest.skip("offsets are whole buckets")
  x = _values(n, seed=n + dither_offset)
  seed = tf.constant([9, -4], tf.int32)
  payload, own = codec.encode_and_decode(x, seed, dither_offset=dither_offset)
  alone = codec.encode(x, seed, dither_offset=dither_offset)
  np.testing.assert_array_equal(payload.words.numpy(), alone.words.numpy())
  _same_bits(payload.scales.numpy(), alone.scales.numpy())
  _same_bits(own.numpy(), codec.decode(payload, seed,
                                       dither_offset=dither_offset).numpy())

  @tf.function(autograph=False)
  def in_graph(x):
    p, d = codec.encode_and_decode(x, seed, dither_offset=dither_offset)
    return d, codec.decode(p, seed, dither_offset=dither_offset)

  own_graph, decoded_graph = in_graph(x)
  _same_bits(own_graph.numpy(), decoded_graph.numpy())
  _same_bits(own_graph.numpy(), own.numpy())


def test_other_dtypes_and_shapes_fall_back_to_encode_then_decode():
  codec = ndq_tf.DitheredCodec(num_levels=2)
  seed = tf.constant([1, 2], tf.int32)
  x = tf.cast(tf.reshape(_values(4096, 1), [64, 64]), tf.float16)
  payload, own = codec.encode_and_decode(x, seed)
  assert own.dtype == tf.float16 and own.shape == [64, 64]
  _same_bits(tf.bitcast(own, tf.uint16).numpy().astype(np.uint32),
             tf.bitcast(codec.decode(payload, seed),
                        tf.uint16).numpy().astype(np.uint32))


def test_nested_codecs_say_they_need_the_other_senders():
  codec = ndq_tf.NestedDitheredCodec(coarse_ratio=3)
  with pytest.raises(ValueError, match="side information"):
    codec.encode_and_decode(tf.zeros([512]), tf.constant([1, 2]))
