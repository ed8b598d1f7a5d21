"""Tests of `ndq_tf.codecs.registry`: `ndq_tf.codecs.get` and Keras.

Spec strings, codecs passed through, bad identifiers named, and every
codec's Keras serialization round trip. The shared codecs and helpers:
codec_cases.py.
"""

import json

from absl.testing import parameterized
import keras
import tensorflow as tf

from codec_cases import CODECS, codec_params
import ndq_tf
from ndq_tf import codecs


class RegistryTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*codec_params(CODECS))
  def test_keras_serialization_round_trip(self, name):
    codec = CODECS[name]
    serialized = keras.saving.serialize_keras_object(codec)
    serialized = json.loads(json.dumps(serialized))
    revived = keras.saving.deserialize_keras_object(serialized)
    self.assertIsInstance(revived, type(codec))
    self.assertEqual(revived.get_config(), codec.get_config())
    self.assertEqual(codecs.get(codecs.serialize(codec)), codec)

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
      ("bfloat16", ndq_tf.BFloat16Codec()),
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
                 "float32", "float16", "bfloat16"):
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
