"""Tests of `ndq_tf.core.transports.device_sum` (replicas of one process).

The integer sum through it is tested end to end under
`ndq_tf.MirroredStrategy` (core/exchanges/test_sum.py,
integration/test_decode_once.py).
"""

import pytest
import tensorflow as tf

from ndq_tf.core import transports


def _devices(n=2):
  return [d.name for d in tf.config.list_logical_devices("CPU")[:n]]


def test_the_cpus_of_one_task_share_memory_and_of_two_tasks_do_not():
  assert transports.DeviceSumTransport(_devices()).shared_memory
  assert not transports.DeviceSumTransport(
      ["/job:worker/replica:0/task:0/device:CPU:0",
       "/job:worker/replica:0/task:1/device:CPU:0"]).shared_memory


@pytest.mark.parametrize("merge_op, expected", [
    ("Add", [6.0, -3.0]), ("Max", [3.0, 0.0])])
def test_every_receiver_gets_the_reduction(merge_op, expected):
  devices = _devices(3)
  values = [(k, devices[k], tf.constant([k + 1.0, -float(k)]))
            for k in (1, 2, 0)]
  reductions = transports.DeviceSumTransport(devices).all_reduce(
      values, merge_op)
  assert [r.device for r in reductions] == devices
  for index, reduction in enumerate(reductions):
    assert reduction.local_sender == index and reduction.checks == []
    assert reduction.value.numpy().tolist() == expected
    assert reduction.value.device.endswith(devices[index])


def test_an_unknown_merge_op_and_a_missing_tensor_are_named():
  devices = _devices()
  transport = transports.DeviceSumTransport(devices)
  values = [(k, devices[k], tf.zeros([1])) for k in (0, 1)]
  with pytest.raises(ValueError, match="`merge_op` must be one of.*"
                     "Received: merge_op='Mean'"):
    transport.all_reduce(values, "Mean")
  with pytest.raises(ValueError, match="Received: 1 tensors for 2"):
    transport.all_reduce(values[:1], "Add")
