"""Encoding a buffer in chunks with the whole buffer's dither (issue #12).

`encode(x[a:b], seed, dither_offset=a)` must draw the dither that
`encode(x, seed)` draws for `x[a:b]`, so that a chunked exchange decodes,
bit for bit, what the unchunked one decodes. Checked for every codec that
draws a dither, with chunks of whole buckets, eagerly (the codecs' stages
are XLA-compiled either way), with Python and tensor offsets.
"""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import ndq_tf

SEED = tf.constant([5, -9])

CODECS = {
    "dqsg1": ndq_tf.DitheredCodec(num_levels=1, bucket_size=64),
    "dqsg3": ndq_tf.DitheredCodec(num_levels=3, bucket_size=64),
    "half": ndq_tf.HalfDitheredCodec(num_levels=2, bucket_size=64,
                                     dither_order=3),
    "ndqsg": ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                        bucket_size=64),
    "terngrad": ndq_tf.TernGradCodec(bucket_size=64),
    "qsgd": ndq_tf.QSGDCodec(num_levels=2, bucket_size=64),
}


def _decode(codec, x, offset, side):
  kwargs = {"side_information": side} if codec.needs_side_information else {}
  payload = codec.encode(x, SEED, dither_offset=offset)
  return codec.decode(payload, SEED, dither_offset=offset, **kwargs).numpy()


class DitherOffsetTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*[(k, k) for k in CODECS])
  def test_chunks_decode_to_the_slices_of_the_whole_buffer(self, name):
    codec = CODECS[name]
    rng = np.random.default_rng(1)
    x = rng.normal(size=64 * 10).astype(np.float32)
    side = x + rng.normal(scale=0.05, size=x.shape).astype(np.float32)
    whole = _decode(codec, x, 0, side)
    for a, b in ((0, 192), (192, 256), (256, 640)):
      for offset in (a, tf.constant(a), tf.constant(a, tf.int64)):
        chunk = _decode(codec, x[a:b], offset, side[a:b])
        np.testing.assert_array_equal(
            chunk.view(np.int32), whole[a:b].view(np.int32),
            err_msg=f"{name} chunk {a}:{b}")

  def test_another_offset_draws_another_dither(self):
    codec = CODECS["dqsg1"]
    x = np.random.default_rng(2).normal(size=640).astype(np.float32)
    whole = _decode(codec, x, 0, None)
    shifted = _decode(codec, x[128:256], 64, None)
    self.assertGreater(np.mean(shifted != whole[128:256]), 0.3)

  @parameterized.parameters(-64, 32, 1)
  def test_offset_off_the_bucket_grid_raises_naming_it(self, offset):
    with self.assertRaisesRegex(
        ValueError, r"`dither_offset` must be a non-negative multiple of "
        rf"bucket_size=64. Received: dither_offset={offset}"):
      CODECS["dqsg1"].encode(tf.ones([64]), SEED, dither_offset=offset)

  @parameterized.parameters(1.0, True, "64")
  def test_offset_of_another_type_raises_naming_it(self, offset):
    with self.assertRaisesRegex(TypeError, "`dither_offset` must be an int"):
      CODECS["dqsg1"].encode(tf.ones([64]), SEED, dither_offset=offset)

  def test_float_codecs_ignore_the_offset(self):
    x = tf.constant(np.arange(10, dtype=np.float32))
    for codec in (ndq_tf.Float32Codec(), ndq_tf.Float16Codec()):
      payload = codec.encode(x, dither_offset=128)
      self.assertAllEqual(codec.decode(payload, dither_offset=128), x)


if __name__ == "__main__":
  tf.test.main()
