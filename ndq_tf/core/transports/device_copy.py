"""Device copies inside one process: the transport of `ndq_tf.MirroredStrategy`."""

import tensorflow as tf

from ndq_tf.core.transports import base

__all__ = [
    "DeviceCopyTransport",
]


class DeviceCopyTransport(base.Transport):
  """Every replica is a sender and a receiver; payloads are device copies.

  Only the packed `int32` payloads cross devices: each receiver gets a
  copy (`tf.identity` on its device) of every replica's payload.

  On the host's CPU devices (`shared_memory`), nothing moves in either
  case and the engine decodes once for all replicas.

  Args:
    devices: the replicas' devices, in sender order.
  """

  name = "device_copy"

  def __init__(self, devices):
    self._devices = tuple(devices)
    self.shared_memory = base.shares_memory(self._devices)

  @property
  def num_senders(self):
    return len(self._devices)

  def exchange(self, local_wires, words, step, fingerprint=0):
    # One process, one counter, one options object: nothing to frame.
    del words, step, fingerprint
    wires = [w for _, _, w in sorted(local_wires, key=lambda x: x[0])]
    if len(wires) != len(self._devices):
      raise ValueError(
          f"Every replica sends one payload. Received: {len(wires)} payloads "
          f"for {len(self._devices)} replicas.")
    receptions = []
    for index, device in enumerate(self._devices):
      with tf.device(device):
        receptions.append(base.Reception(
            device=device, wires=[tf.identity(w) for w in wires], steps=None,
            local_sender=index, checks=[]))
    return receptions
