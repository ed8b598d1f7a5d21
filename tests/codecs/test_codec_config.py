"""The codecs' configuration: `get_config`/`from_config` and Keras
serialization round trips, equality, properties, the public base class, the
seed flags, and `ndq_tf.codecs.get` (spec strings, codecs, bad identifiers).

The shared codecs and helpers: codec_cases.py.
"""

import json

from absl.testing import parameterized
import keras
import tensorflow as tf

from codec_cases import (
    CODECS,
    BUCKETED,
    N,
    codec_params,
    make_signal,
    side_information_of,
    encode_decode,
    bits_of)
import ndq_tf
from ndq_tf import codecs


class ConfigTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*codec_params(CODECS))
  def test_get_config_from_config_round_trip(self, name):
    codec = CODECS[name]
    config = codec.get_config()
    json.dumps(config)  # plain Python values only
    revived = type(codec).from_config(config)
    self.assertIsNot(revived, codec)
    self.assertEqual(revived, codec)
    self.assertEqual(hash(revived), hash(codec))
    self.assertEqual(revived.get_config(), config)
    self.assertEqual(repr(revived), repr(codec))
    # The revived codec encodes and decodes identically.
    x = make_signal(N)
    y = side_information_of(x)
    p1, d1 = encode_decode(codec, x, y=y)
    p2, d2 = encode_decode(revived, x, y=y)
    self.assertAllEqual(p1.words, p2.words)
    self.assertAllEqual(bits_of(d1), bits_of(d2))

  @parameterized.parameters(*codec_params(CODECS))
  def test_keras_serialization_round_trip(self, name):
    codec = CODECS[name]
    serialized = keras.saving.serialize_keras_object(codec)
    serialized = json.loads(json.dumps(serialized))
    revived = keras.saving.deserialize_keras_object(serialized)
    self.assertIsInstance(revived, type(codec))
    self.assertEqual(revived.get_config(), codec.get_config())
    self.assertEqual(codecs.get(codecs.serialize(codec)), codec)

  def test_codecs_with_other_parameters_are_not_equal(self):
    self.assertNotEqual(ndq_tf.DitheredCodec(1, 64),
                        ndq_tf.DitheredCodec(2, 64))
    self.assertNotEqual(ndq_tf.DitheredCodec(1, 64),
                        ndq_tf.HalfDitheredCodec(1, 64, dither_order=1))
    self.assertNotEqual(ndq_tf.NestedDitheredCodec(alpha=0.9),
                        ndq_tf.NestedDitheredCodec(alpha=1.0))

  def test_properties_reflect_constructor_arguments(self):
    codec = ndq_tf.NestedDitheredCodec(num_levels=4, coarse_ratio=5,
                                       alpha=0.5, bucket_size=128)
    self.assertEqual(codec.num_levels, 4)
    self.assertEqual(codec.coarse_ratio, 5)
    self.assertEqual(codec.alpha, 0.5)
    self.assertEqual(codec.bucket_size, 128)
    self.assertEqual(codec.fine_step, 0.25)
    self.assertEqual(codec.coarse_step, 1.25)
    self.assertTrue(codec.needs_side_information)
    codec = ndq_tf.DitheredCodec(num_levels=4, bucket_size=128)
    self.assertEqual(codec.step, 0.25)
    self.assertTrue(codec.decoder_needs_seed)
    self.assertFalse(ndq_tf.HalfDitheredCodec().decoder_needs_seed)

  def test_bucketed_codecs_share_the_public_base_class(self):
    for name in BUCKETED:
      self.assertIsInstance(CODECS[name], codecs.BucketedCodec, msg=name)
    for name in ("float32", "float16"):
      self.assertNotIsInstance(CODECS[name], codecs.BucketedCodec, msg=name)

  @parameterized.parameters(*codec_params(CODECS))
  def test_only_the_decoder_seed_flag_exists(self, name):
    # `needs_seed` was renamed before any release: no alias is kept.
    codec = CODECS[name]
    self.assertIsInstance(codec.decoder_needs_seed, bool)
    self.assertFalse(hasattr(codec, "needs_seed"))
    self.assertEqual(codec.decoder_needs_seed,
                     name.startswith(("dqsg", "ndqsg")))

  @parameterized.parameters(
      ("dqsg", ndq_tf.DitheredCodec()),
      ("dqsg:num_levels=3", ndq_tf.DitheredCodec(num_levels=3)),
      (" DQSG : num_levels = 3 , bucket_size=256 ",
       ndq_tf.DitheredCodec(num_levels=3, bucket_size=256)),
      ("half_dithered:dither_order=3",
       ndq_tf.HalfDitheredCodec(dither_order=3)),
      ("ndqsg:num_levels=3,coarse_ratio=5,alpha=0.9",
       ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=5, alpha=0.9)),
      ("qsgd:num_levels=4", ndq_tf.QSGDCodec(num_levels=4)),
      ("terngrad:bucket_size=128", ndq_tf.TernGradCodec(bucket_size=128)),
      ("float32", ndq_tf.Float32Codec()),
      ("float16", ndq_tf.Float16Codec()),
  )
  def test_get_with_spec_string(self, spec, expected):
    codec = codecs.get(spec)
    self.assertIsInstance(codec, type(expected))
    self.assertEqual(codec, expected)

  def test_get_passes_codecs_through(self):
    codec = CODECS["ndqsg_k4"]
    self.assertIs(codecs.get(codec), codec)

  def test_get_unknown_name_lists_valid_names(self):
    with self.assertRaises(ValueError) as cm:
      codecs.get("dqsq:num_levels=3")
    message = str(cm.exception)
    self.assertIn("dqsq", message)
    for name in ("dqsg", "half_dithered", "ndqsg", "qsgd", "terngrad",
                 "float32", "float16"):
      self.assertIn(name, message)

  @parameterized.parameters(
      ("dqsg:num_levels", "num_levels"),
      ("dqsg:num_levels=abc", "abc"),
      ("dqsg:levels=3", "levels"),
      ("dqsg:num_levels=0", "num_levels=0"),
      ("ndqsg:alpha=1.5", "alpha=1.5"),
  )
  def test_get_malformed_spec_raises_value_error(self, spec, shown):
    with self.assertRaisesRegex(ValueError, shown):
      codecs.get(spec)

  @parameterized.parameters((3,), (None,), ([("dqsg", 1)],),
                            ({"class_name": "Dense", "config": {}},))
  def test_get_rejects_other_identifiers(self, identifier):
    with self.assertRaises((ValueError, TypeError)):
      codecs.get(identifier)


if __name__ == "__main__":
  tf.test.main()
