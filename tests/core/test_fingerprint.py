"""What this TensorFlow decodes is part of what the workers agree on.

`fingerprint.decode_digest` hashes the decodes of fixed payloads (made
without float arithmetic), so two workers whose TensorFlow decode the same
payload to other bits differ in it (TF 2.22's XLA did, for NDQSG, until
`codecs.base.divide_rows`). The options check names it, with each worker's
TensorFlow; the exchanges' fingerprint covers it when senders run in other
processes. Single process: the options check's all-gather is a function
that appends a peer's row built here.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.codecs import dithered
from ndq_tf.core import fingerprint
from ndq_tf.distribute import options as options_lib

O = options_lib.CompressionOptions

#: `decode_digest` of each configuration, recorded on TF 2.18.1, 2.21.0 and
#: 2.22.0rc0 (x86-64): every supported TensorFlow decodes these codecs to the
#: same bits. (NDQSG with `alpha` != 1 and a rotation does not: TF 2.18.1
#: decodes 310 of the 1024 values of its digest to other bits under XLA.)
DIGESTS = {
    "dqsg3": (lambda: O(ndq_tf.DitheredCodec(num_levels=3)), "b8d0cb1f"),
    "dqsg1_rotated": (lambda: O(ndq_tf.DitheredCodec(
        num_levels=1, bucket_size=256, rotation="hadamard")), "1fbe9bf1"),
    "half_dithered2": (lambda: O(ndq_tf.HalfDitheredCodec(
        num_levels=2, dither_order=3)), "71a17a9b"),
    "ndqsg33_reference_dqsg1": (lambda: O(
        ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3),
        reference_codec=ndq_tf.DitheredCodec(num_levels=1)),
                                "bffacfbc,06a76776"),
    "qsgd2": (lambda: O(ndq_tf.QSGDCodec(num_levels=2)), "7febc1b2"),
    "terngrad": (lambda: O(ndq_tf.TernGradCodec()), "2b80902b"),
    "float16": (lambda: O(ndq_tf.Float16Codec()), "Float16Codec"),
    "bfloat16": (lambda: O(ndq_tf.BFloat16Codec()), "BFloat16Codec"),
}


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_decode_digest_is_the_same_on_every_supported_tensorflow(name):
  make, digest = DIGESTS[name]
  assert fingerprint.decode_digest(make()) == digest


class _UlpOffCodec(dithered.DitheredCodec):
  """DQSG whose decode is one ulp up: what another TensorFlow might do."""

  def _dequantize(self, q, scales, seed, side_information):
    decoded = super()._dequantize(q, scales, seed, side_information)
    return tf.math.nextafter(decoded, tf.fill(tf.shape(decoded), np.inf))


def test_decode_digest_reveals_a_decode_one_ulp_off():
  assert (fingerprint.decode_digest(O(_UlpOffCodec(num_levels=3))) !=
          fingerprint.decode_digest(O(ndq_tf.DitheredCodec(num_levels=3))))


def test_fingerprint_covers_decoded_bits_when_asked():
  options = O(ndq_tf.QSGDCodec(num_levels=5))
  with_bits = fingerprint.fingerprint(options, "plan", "all_gather")
  assert with_bits != fingerprint.fingerprint(options, "plan", "all_gather",
                                              decoded_bits=False)
  # Traced in a function (as the exchanges compute it), the digest's
  # decodes run eagerly, outside the graph.
  traced = tf.function(lambda: tf.constant(fingerprint.fingerprint(
      options, "plan", "all_gather")))()
  assert int(traced) == with_bits


def _gather_with_peer(peer_config):
  """The options check's all-gather of two workers, the peer's row given."""
  data = json.dumps(peer_config, sort_keys=True,
                    separators=(",", ":")).encode()
  length = len(data)
  data += b"\0" * (-len(data) % 4)
  peer_words = np.frombuffer(data, dtype="<i4").astype(np.int32)
  calls = []

  def gather(row, timeout=None):
    del timeout
    calls.append(row.size)
    if len(calls) == 1:
      peer = np.array([fingerprint.CONFIG_MAGIC, length], np.int32)
    else:
      peer = np.zeros(max(row.size, peer_words.size), np.int32)
      peer[:peer_words.size] = peer_words
      peer = peer[:row.size]
    return np.concatenate([row, peer])
  return gather, calls


def test_check_agreement_names_each_workers_tensorflow_if_decodes_differ():
  options = O(ndq_tf.DitheredCodec(num_levels=3))
  agreed = fingerprint.agreed_config(options)
  # Another TensorFlow that decodes alike works with this one.
  gather, calls = _gather_with_peer(dict(agreed, tensorflow="2.99.0"))
  fingerprint.check_agreement(gather, options, 2, "Test")
  assert len(calls) == 2
  gather, calls = _gather_with_peer(dict(agreed, tensorflow="2.99.0",
                                         decoded_bits="0badc0de"))
  with pytest.raises(ValueError) as error:
    fingerprint.check_agreement(gather, options, 2, "Test")
  message = str(error.value)
  assert (f"`decoded_bits` is '{agreed['decoded_bits']}' with TensorFlow "
          f"{tf.__version__} on worker 0, '0badc0de' with TensorFlow 2.99.0 "
          f"on worker 1") in message
  assert "Install the same TensorFlow on every worker" in message
  assert len(calls) == 3  # The settle all-gather before the error.


class _OtherTableCodec(ndq_tf.EntropyCodedDitheredCodec):
  """ECDQ whose coding table differs, its config the same."""

  def table_digest(self):
    return "0" * 64


def test_fingerprint_covers_the_entropy_coders_step_ratio_and_table():
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.3)
  options = O(codec)
  # `bits=` is in the config; the ratio it maps to, and the table, are not.
  assert "step_ratio" not in codec.get_config()
  assert fingerprint.coding_tables(options) == [
      [float(codec.step_ratio).hex(), codec.table_digest()]]
  assert fingerprint.coding_tables(O(ndq_tf.DitheredCodec())) == []
  assert (fingerprint.fingerprint(options, "plan", "all_gather",
                                  decoded_bits=False)
          != fingerprint.fingerprint(O(_OtherTableCodec(bits=1.3)), "plan",
                                     "all_gather", decoded_bits=False))


def test_decode_digest_of_a_variable_length_codec_is_stable():
  options = O(ndq_tf.EntropyCodedDitheredCodec(bits=1.0, bucket_size=64))
  digest = fingerprint.decode_digest(options)
  assert len(digest) == 8 and int(digest, 16) >= 0
  fingerprint._DIGESTS.clear()  # pylint: disable=protected-access
  assert fingerprint.decode_digest(options) == digest
