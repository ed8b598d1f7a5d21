"""Tests of `ndq_tf.core.transports.all_to_all` (the reduce-scatter's moves).

The exchange through it is tested under `ndq_tf.MirroredStrategy` in
core/exchanges/test_reduce_scatter.py and on real worker processes in
integration/test_reduce_scatter_multi_worker.py.
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
