"""Tests of `ndq_tf.core.transports.all_gather` (one sender per worker).

The exchange through it runs on real worker processes in
integration/test_multi_worker.py and integration/test_strategy_parity.py.
"""

import pytest
import tensorflow as tf

from ndq_tf.core import exchanges
from ndq_tf.core.transports import all_gather


def test_the_all_gather_exchange_frames_with_the_transports_header():
  assert exchanges.get("all_gather").framing_words == all_gather.HEADER_WORDS


def test_framing_pads_every_row_to_the_longest_payload():
  transport = all_gather.CollectiveAllGatherTransport(None, 3, 1, "/cpu:0")
  assert transport.num_senders == 3
  # This worker's row: the header and its padding to the longest payload.
  assert transport.framing_bits([4, 9, 6], [1]) == 32 * all_gather.HEADER_WORDS
  assert transport.framing_bits([4, 9, 6], [0]) == 32 * (
      all_gather.HEADER_WORDS + 5)


def test_a_worker_id_out_of_range_is_named():
  with pytest.raises(ValueError, match=r"`worker_id` must be in \[0, 2\). "
                     r"Received: worker_id=2"):
    all_gather.CollectiveAllGatherTransport(None, 2, 2, "/cpu:0")


def _with_peer(peer_header, peer_wire):
  """Worker 0's all-gather of 2 workers, worker 1's rows given.

  The first call is the length round (worker 1's header), the second the
  rows padded to the longest used length (worker 1's used words, padded
  like this worker's row).
  """
  calls = []

  def gather(row):
    calls.append(row)
    if len(calls) == 1:
      return tf.concat([row, tf.constant(peer_header, tf.int32)], 0)
    used = peer_header[3]
    peer = tf.pad(tf.constant(peer_wire[:used], tf.int32),
                  [[0, tf.shape(row)[0] - used]])
    return tf.concat([row, peer], 0)
  return gather, calls


def test_variable_length_payloads_take_a_length_round_then_the_longest():
  ours = [3, 11, 12, 0, 0, 0]  # Word 0: the words used.
  theirs = [5, 21, 22, 23, 24, 0]
  gather, calls = _with_peer([all_gather.MAGIC, 1, 7, 5, -4], theirs)
  transport = all_gather.CollectiveAllGatherTransport(gather, 2, 0, "/cpu:0")
  (reception,) = transport.exchange(
      [(0, "/cpu:0", tf.constant(ours, tf.int32))], [6, 6], tf.constant(7),
      fingerprint=-4, used=[tf.constant(3)])
  assert [int(x) for x in calls[0]] == [all_gather.MAGIC, 0, 7, 3, -4]
  assert calls[1].shape == [5]  # The longest used length, not 6.
  assert [w.numpy().tolist() for w in reception.wires] == [ours, theirs]
  assert reception.lengths.numpy().tolist() == [3, 5]
  assert reception.steps.numpy().tolist() == [7, 7]
  # Its header, and its row padded from 3 to 5 words.
  assert int(transport.framing_bits([6, 6], [0], reception.lengths)) == 32 * (
      all_gather.HEADER_WORDS + 2)


def test_a_length_beyond_the_static_words_stops_the_exchange():
  gather, _ = _with_peer([all_gather.MAGIC, 1, 7, 9, 0], [9] + [1] * 8)
  transport = all_gather.CollectiveAllGatherTransport(gather, 2, 0, "/cpu:0")
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="malformed compressed payload"):
    transport.exchange([(0, "/cpu:0", tf.constant([1, 0, 0], tf.int32))],
                       [3, 3], tf.constant(7), used=[tf.constant(1)])
