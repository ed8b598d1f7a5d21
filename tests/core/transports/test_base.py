"""Tests of `ndq_tf.core.transports.base`: what every transport declares.

Real TensorFlow devices (the CPU's logical devices of tests/conftest.py), no
strategies: the names the transports are known by, and the helpers every
transport shares.
"""

import pytest
import tensorflow as tf

from ndq_tf.core import exchanges
from ndq_tf.core import telemetry
from ndq_tf.core import transports
from ndq_tf.core.transports import base


def test_transports_are_named_for_what_they_move_not_for_an_exchange():
  names = {t.name: t for t in (
      transports.DeviceCopyTransport, transports.DeviceSumTransport,
      transports.DeviceAllToAllTransport,
      transports.CollectiveAllGatherTransport,
      transports.CollectiveSumTransport,
      transports.CollectiveAllToAllTransport)}
  assert sorted(names) == [
      "collective_all_gather", "collective_all_to_all", "collective_sum",
      "device_all_to_all", "device_copy", "device_sum"]
  assert not set(names) & set(exchanges.NAMES)
  assert not set(names) & set(telemetry.TRANSPORT_NAMES)


def test_cpu_devices_of_one_task_share_memory():
  local = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
  assert base.shares_memory(local)
  # Another task's CPU, or a GPU: another memory.
  assert not base.shares_memory(
      ["/job:worker/replica:0/task:0/device:CPU:0",
       "/job:worker/replica:0/task:1/device:CPU:0"])
  assert not base.shares_memory(
      ["/job:localhost/replica:0/task:0/device:CPU:0",
       "/job:localhost/replica:0/task:0/device:GPU:0"])
  assert not base.shares_memory([])


def test_worker_id_is_checked_against_the_number_of_workers():
  assert base.check_worker_id(0, 2) == 0
  assert base.check_worker_id(1, 2) == 1
  for worker_id in (-1, 2):
    with pytest.raises(ValueError, match=r"`worker_id` must be in \[0, 2\). "
                       r"Received: worker_id=%d" % worker_id):
      base.check_worker_id(worker_id, 2)


def test_transports_are_abstract_until_they_move_something():
  for abstract in (base.Transport, base.SummingTransport):
    with pytest.raises(TypeError, match="abstract"):
      abstract()
