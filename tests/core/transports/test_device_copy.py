"""Tests of `ndq_tf.core.transports.device_copy` (replicas of one process).

The exchange through it is tested end to end under `ndq_tf.MirroredStrategy`
(integration/test_mirrored.py, integration/test_decode_once.py).
"""

import pytest
import tensorflow as tf

from ndq_tf.core import transports


def _devices(n=2):
  return [d.name for d in tf.config.list_logical_devices("CPU")[:n]]


def test_the_host_cpu_devices_share_memory_and_gpus_do_not():
  assert transports.DeviceCopyTransport(_devices()).shared_memory
  assert not transports.DeviceCopyTransport(
      ["/job:localhost/replica:0/task:0/device:GPU:0",
       "/job:localhost/replica:0/task:0/device:GPU:1"]).shared_memory


def test_every_replica_sends():
  assert transports.DeviceCopyTransport(_devices(3)).num_senders == 3
  assert transports.DeviceCopyTransport(_devices()).name == "device_copy"


def test_every_receiver_gets_every_payload_in_sender_order():
  devices = _devices(3)
  transport = transports.DeviceCopyTransport(devices)
  wires = [(k, devices[k], tf.constant([k, 10 * k], tf.int32))
           for k in (2, 0, 1)]
  receptions = transport.exchange(wires, words=[2] * 3, step=0)
  assert [r.device for r in receptions] == devices
  for index, reception in enumerate(receptions):
    assert reception.local_sender == index
    assert reception.steps is None and reception.checks == []
    assert [w.numpy().tolist() for w in reception.wires] == [
        [0, 0], [1, 10], [2, 20]]
    assert all(w.device.endswith(devices[index]) for w in reception.wires)


def test_a_missing_payload_is_named():
  devices = _devices(3)
  with pytest.raises(ValueError, match="Received: 2 payloads for 3"):
    transports.DeviceCopyTransport(devices).exchange(
        [(k, devices[k], tf.zeros([1], tf.int32)) for k in (0, 1)],
        words=[1] * 3, step=0)


@pytest.mark.parametrize("shared_memory", [True, False])
def test_variable_length_payloads_come_back_at_their_static_length(
    shared_memory):
  devices = _devices(3)
  transport = transports.DeviceCopyTransport(devices)
  transport.shared_memory = shared_memory  # False: as on GPUs.
  payloads = [[2, 7, 0, 0], [3, 5, 6, 0], [2, 9, 0, 0]]  # Used, then zeros.
  wires = [(k, devices[k], tf.constant(payloads[k], tf.int32))
           for k in (1, 2, 0)]
  used = [tf.constant(payloads[k][0]) for k in (1, 2, 0)]
  receptions = transport.exchange(wires, words=[4] * 3, step=0, used=used)
  for reception in receptions:
    assert [w.numpy().tolist() for w in reception.wires] == payloads
    assert all(w.shape == [4] for w in reception.wires)
    assert reception.lengths.numpy().tolist() == [2, 3, 2]
  assert transport.framing_bits([4] * 3, [0, 1, 2],
                                lengths=receptions[0].lengths) == 0
