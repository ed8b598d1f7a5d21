"""Sums inside one process: the all-reduce transport of `ndq_tf.MirroredStrategy`."""

import tensorflow as tf

from ndq_tf.core.transports import base

__all__ = [
    "DeviceSumTransport",
]

_MERGE_OPS = ("Add", "Max")


class DeviceSumTransport(base.SummingTransport):
  """Every replica is a sender and a receiver; the sum is made once.

  The senders' tensors are copied to the first device, reduced there with
  one `reduce_sum` (or `reduce_max`) over a stacked axis, and the result is
  copied to every device: one reduction, so every replica gets the same
  bits (integer sums are exact anyway; a float16/float32 sum is made once).

  On the host's CPU devices (`shared_memory`), nothing moves in either
  case and the engine decodes once for all replicas.

  Args:
    devices: the replicas' devices, in sender order.
  """

  name = "device_sum"

  def __init__(self, devices):
    self._devices = tuple(devices)
    self.shared_memory = base.shares_memory(self._devices)

  @property
  def num_senders(self):
    return len(self._devices)

  def all_reduce(self, local_values, merge_op, step=None, fingerprint=0):
    # One process, one counter, one options object: nothing to check.
    del step, fingerprint
    if merge_op not in _MERGE_OPS:
      raise ValueError(
          f"`merge_op` must be one of {_MERGE_OPS}. Received: "
          f"merge_op={merge_op!r}.")
    values = [v for _, _, v in sorted(local_values, key=lambda x: x[0])]
    if len(values) != len(self._devices):
      raise ValueError(
          f"Every replica sends one tensor. Received: {len(values)} tensors "
          f"for {len(self._devices)} replicas.")
    reduce = tf.reduce_sum if merge_op == "Add" else tf.reduce_max
    with tf.device(self._devices[0]):
      total = reduce(tf.stack([tf.identity(v) for v in values]), axis=0)
    reductions = []
    for index, device in enumerate(self._devices):
      with tf.device(device):
        reductions.append(base.Reduction(
            device=device, value=tf.identity(total), local_sender=index,
            checks=[]))
    return reductions
