"""Tests of `ndq_tf.core.transports.all_to_all` (the reduce-scatter's moves).

The exchange through it is tested under `ndq_tf.MirroredStrategy` in
core/exchanges/test_reduce_scatter.py and on real worker processes in
integration/test_all_reduce_multi_worker.py.
"""

import pytest
import tensorflow as tf

from ndq_tf.core import exchanges
from ndq_tf.core.transports import all_to_all
from ndq_tf.core.transports import device_copy


def test_the_reduce_scatter_exchange_frames_with_the_transports_header():
  assert (exchanges.get("reduce_scatter").framing_words ==
          all_to_all.SCATTER_HEADER_WORDS)


def test_names_say_what_they_move():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
  local = all_to_all.DeviceAllToAllTransport(devices)
  assert local.name == "device_all_to_all"
  assert local.shared_memory
  # Its stage 2 gathers the shards through device copies.
  assert isinstance(local.gather, device_copy.DeviceCopyTransport)
  assert all_to_all.CollectiveAllToAllTransport.name == "collective_all_to_all"


def test_a_worker_id_out_of_range_is_named():
  with pytest.raises(ValueError, match=r"`worker_id` must be in \[0, 3\). "
                     r"Received: worker_id=-1"):
    all_to_all.CollectiveAllToAllTransport(None, None, 3, -1, "/cpu:0")


def test_variable_length_shards_take_a_length_round_then_the_longest():
  # Worker 0 of 2: its shard wires, and worker 1's (word 0: words used),
  # of 5 static words each.
  ours = [[2, 5, 0, 0, 0], [4, 6, 7, 8, 0]]
  theirs = [[3, 9, 9, 0, 0], [1, 0, 0, 0, 0]]
  calls = []

  def exchange_rows(rows):  # Row i: from worker i, for worker 0.
    calls.append(rows)
    if len(calls) == 1:
      peer = [all_to_all.SCATTER_MAGIC, 1, 0, 7, 0, 3, 1]
      return tf.stack([rows[0], tf.constant(peer, tf.int32)])
    width = tf.shape(rows)[1]
    peer = tf.pad(tf.constant(theirs[0][:3], tf.int32), [[0, width - 3]])
    return tf.stack([rows[0], peer])

  transport = all_to_all.CollectiveAllToAllTransport(
      exchange_rows, None, 2, 0, "/cpu:0")
  (reception,) = transport.scatter(
      [(0, "/cpu:0", [tf.constant(w, tf.int32) for w in ours])],
      [[5, 5], [5, 5]], tf.constant(7),
      used=[[tf.constant(2), tf.constant(4)]])
  # Every row carries all of the sender's lengths.
  assert calls[0].numpy()[:, 5:].tolist() == [[2, 4], [2, 4]]
  assert calls[1].shape == [2, 4]  # The longest used length, not 5.
  assert [w.numpy().tolist() for w in reception.wires] == [ours[0],
                                                            theirs[0]]
  assert reception.lengths.numpy().tolist() == [[2, 4], [3, 1]]
  # The length round's rows, then 2 rows of 4 words, less the 6 used.
  assert int(transport.framing_bits(None, [0], reception.lengths)) == 32 * (
      2 * (all_to_all.SCATTER_HEADER_WORDS + 2) + 2 * 4 - 6)


def test_device_shards_of_variable_length_cross_as_their_used_words():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
  transport = all_to_all.DeviceAllToAllTransport(devices)
  transport.shared_memory = False  # As on GPUs: each receiver its copy.
  wires = {0: [[1, 0, 0], [2, 4, 0]], 1: [[3, 5, 6], [1, 0, 0]]}
  receptions = transport.scatter(
      [(k, devices[k], [tf.constant(w, tf.int32) for w in wires[k]])
       for k in (1, 0)], [[3, 3], [3, 3]], 0,
      used=[[tf.constant(w[0]) for w in wires[k]] for k in (1, 0)])
  for j, reception in enumerate(receptions):
    assert [w.numpy().tolist() for w in reception.wires] == [
        wires[0][j], wires[1][j]]
    assert reception.lengths.numpy().tolist() == [[1, 2], [3, 1]]
