"""Device copies inside one process: the transport of `ndq_tf.MirroredStrategy`."""

import tensorflow as tf

from ndq_tf.core.transports import base

__all__ = [
    "DeviceCopyTransport",
]


class DeviceCopyTransport(base.Transport):
  """Every replica is a sender and a receiver; payloads are device copies.

  Only the packed `int32` payloads cross devices: each receiver gets a
  copy (`tf.identity` on its device) of every replica's payload; of a
  variable-length payload, only the words it uses (`used`), zero-padded
  back on the receiver.

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

  def exchange(self, local_wires, words, step, fingerprint=0, used=None):
    # One process, one counter, one options object: nothing to frame.
    del step, fingerprint
    order = sorted(range(len(local_wires)), key=lambda i: local_wires[i][0])
    wires = [local_wires[i][2] for i in order]
    if len(wires) != len(self._devices):
      raise ValueError(
          f"Every replica sends one payload. Received: {len(wires)} payloads "
          f"for {len(self._devices)} replicas.")
    lengths = moved = None
    if used is not None:
      used = [used[i] for i in order]
      with tf.device(self._devices[0]):
        lengths = tf.stack([tf.cast(u, tf.int32) for u in used])
      if not self.shared_memory:
        # Only the used words cross devices.
        moved = []
        for (_, device, wire), u in zip(
            (local_wires[i] for i in order), used):
          with tf.device(device):
            moved.append(wire[:u])
    receptions = []
    for index, device in enumerate(self._devices):
      with tf.device(device):
        if moved is None:
          got = [tf.identity(w) for w in wires]
        else:
          got = [base.restore(tf.identity(m), words[k])
                 for k, m in enumerate(moved)]
        receptions.append(base.Reception(
            device=device, wires=got, steps=None, local_sender=index,
            checks=[], lengths=lengths))
    return receptions
