"""Tests of `ndq_tf.codecs.dithered`: DQSG and the half-dithered codec.

What is their own: the half-dithered alphabets the packer takes, and the
ternary DQSG's bits per element. The API every codec shares is tested in
test_base.py, their statistics in test_codec_statistics.py.
"""

from absl.testing import parameterized
import tensorflow as tf

from codec_cases import SEED, N, make_signal, encode_decode
import ndq_tf
from ndq_tf.codecs import bucketed


class HalfDitheredCodecTest(tf.test.TestCase, parameterized.TestCase):

  def test_half_dithered_constructor_accepts_only_packable_alphabets(self):
    # 2(M + ⌊m/2⌋) + 1 symbols must fit the packer (at most 65536): the
    # largest alphabet that fits is accepted and round-trips within its
    # error bound; one level more is refused, naming both arguments.
    order = 64
    largest = ndq_tf.HalfDitheredCodec(
        num_levels=bucketed.MAX_LEVELS - order // 2, dither_order=order)
    self.assertEqual(largest.alphabet_size, 2 * bucketed.MAX_LEVELS + 1)
    x = make_signal(N)
    _, decoded = encode_decode(largest, x)
    # |error| <= (M + ⌊m/2⌋)·Δ with Δ = κ/M, far below that here.
    scale = float(tf.reduce_max(tf.abs(x)))
    self.assertLess(float(tf.reduce_max(tf.abs(decoded - x))),
                    scale * (order / 2 + 1) / largest.num_levels)
    with self.assertRaisesRegex(
        ValueError, r"`num_levels` \+ `dither_order` // 2 must be at most "
        r"32767.*num_levels=32736, dither_order=64"):
      ndq_tf.HalfDitheredCodec(
          num_levels=bucketed.MAX_LEVELS - order // 2 + 1, dither_order=order)


class DitheredCodecTest(tf.test.TestCase, parameterized.TestCase):

  def test_ternary_dqsg_bucket_512_costs_at_most_1_70_bits_per_element(self):
    codec = ndq_tf.DitheredCodec(num_levels=1, bucket_size=512)
    # 20 ternary codes per word and a float32 per 512 values:
    # 32/20 + 32/512 = 1.6625 bits, exactly when n is a multiple of 10240.
    self.assertAlmostEqual(ndq_tf.theory.bits_per_element(codec, 10240),
                           1.6625, places=12)
    for n in (10240, 10**6, 2**20, 2**24 + 1):
      self.assertLessEqual(codec.wire_bits(n) / n, 1.70, msg=n)
      self.assertEqual(ndq_tf.theory.bits_per_element(codec, n),
                       codec.wire_bits(n) / n)
    n = 102_400 + 7
    wire = codec.to_wire(codec.encode(make_signal(n), SEED))
    self.assertEqual(wire.dtype, tf.int32)
    self.assertLessEqual(32 * wire.shape[0] / n, 1.70)
    self.assertEqual(32 * wire.shape[0], codec.wire_bits(n))
