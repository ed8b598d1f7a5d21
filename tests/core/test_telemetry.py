"""Tests of `ndq_tf.core.telemetry` on its own (no strategies)."""

import pytest
import tensorflow as tf

from ndq_tf.core import exchanges
from ndq_tf.core import telemetry


def test_lossless_size_counts_dense_and_sparse_values():
  dense = tf.zeros([3, 4], tf.float16)
  sparse = tf.IndexedSlices(tf.zeros([2, 5], tf.float32),
                            tf.constant([0, 3], tf.int64),
                            tf.constant([10, 5], tf.int64))
  elements, bits = telemetry.lossless_size([dense, sparse])
  assert int(elements) == 12 + 10
  assert int(bits) == 12 * 16 + 10 * 32 + 2 * 64
  elements, bits = telemetry.lossless_size([])
  assert int(elements) == int(bits) == 0


def test_transport_names_are_the_exchanges():
  assert telemetry.TRANSPORT_NAMES == exchanges.NAMES


def test_record_names_the_valid_transports():
  t = telemetry.Telemetry("auto", nested=False)
  assert t.transport == "auto"
  with pytest.raises(ValueError, match="`transport` must be one of"):
    t.record("ring", senders=2)
  t.record("all_reduce", senders=4, local_senders=1, sent_bits=64,
           payload_bits=32, link_bits=48, compressed_elements=2,
           lossless_elements=0)
  assert t.transport == "all_reduce"
  result = t.result(7)
  assert result["exchange_count"] == 7
  assert result["sent_bits_per_element"] == 32
  assert set(telemetry.KEYS) <= set(result)


def test_old_keys_are_deprecated_aliases_of_the_new():
  t = telemetry.Telemetry("all_gather", nested=False)
  t.record("all_gather", senders=2, local_senders=2, sent_bits=640,
           payload_bits=600, link_bits=320, compressed_elements=10,
           lossless_elements=0)
  result = t.result(3)
  assert result["exchange_count"] == 3
  assert result["model_link_bits"] == 320
  assert result["sent_bits_per_element"] == 32
  for old, new in telemetry.DEPRECATED_KEYS.items():
    with pytest.warns(DeprecationWarning, match=f"'{new}'"):
      assert result[old] == result[new]
    with pytest.warns(DeprecationWarning):
      assert result.get(old) == result[new]
