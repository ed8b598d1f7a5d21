"""Replicas on the host's CPU devices decode once for all (issue #12).

`DeviceCopyTransport` and `DeviceSumTransport` report `shared_memory` when
every replica is a CPU device of one task: nothing moves between such
replicas, so the engine decodes each sender (or the sum) once and hands
every replica the same tensors. On other devices (GPUs) every replica
decodes for itself. Both must give the same bits: these tests run the
engine with the flag on and off on the same logical CPU devices.
"""

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import transports
from ndq_tf.distribute import options as options_lib

NUM_REPLICAS = 4
SHAPES = [(3000,), (37, 41), (700,)]


def _devices():
  return [d.name for d in tf.config.list_logical_devices("CPU")[:NUM_REPLICAS]]


def _exchange(options, shared, steps=2):
  """The engine's sums over `steps` calls, per step and replica, flattened.

  One `tf.function`, traced once and called every step, as in training.
  """
  devices = _devices()
  engine = engine_lib.ExchangeEngine(options)
  rng = np.random.default_rng(3)

  @tf.function(autograph=False)
  def run(grads):
    copy = transports.DeviceCopyTransport(devices)
    total = transports.DeviceSumTransport(devices)
    copy.shared_memory = total.shared_memory = shared
    senders = []
    for r, device in enumerate(devices):
      with tf.device(device):
        senders.append(engine_lib.LocalSender(
            r, device, [tf.identity(g) for g in grads[r]]))
    return engine.exchange({"all_gather": copy, "all_reduce": total},
                           senders, "sum")

  out = []
  for _ in range(steps):
    grads = [[tf.constant(rng.standard_normal(s).astype(np.float32)
                          * (1 + r)) for s in SHAPES]
             for r in range(NUM_REPLICAS)]
    out.append([np.concatenate([t.numpy().ravel() for t in tensors])
                for tensors in run(grads)])
  assert run.experimental_get_tracing_count() == 1
  return out, engine


@pytest.mark.parametrize("transport, spec, chunk_elements", [
    ("all_gather", "dqsg:num_levels=1", None),
    ("all_gather", "dqsg:num_levels=1", 2048),
    ("all_gather", "terngrad", None),
    ("all_reduce", "dqsg:num_levels=3", None),
    ("all_reduce", "dqsg:num_levels=3", 1024),
    ("all_reduce", "qsgd", None),
    ("all_reduce", "float16", None),
])
def test_decoding_once_gives_every_replica_the_bits_of_decoding_each(
    transport, spec, chunk_elements):
  options = options_lib.CompressionOptions(
      spec, exchange=transport, chunk_elements=chunk_elements, seed=5)
  each, engine = _exchange(options, shared=False)
  once, _ = _exchange(options, shared=True)
  assert engine.stats()["transport"] == transport
  for step_each, step_once in zip(each, once):
    for replica in step_each + step_once:
      np.testing.assert_array_equal(replica.view(np.uint32),
                                    step_each[0].view(np.uint32))


@pytest.mark.parametrize("adaptive", [False, True])
def test_nested_senders_decoded_once_learn_what_they_learn_decoding_each(
    adaptive):
  options = options_lib.CompressionOptions(
      ndq_tf.NestedDitheredCodec(coarse_ratio=3),
      reference_codec=ndq_tf.DitheredCodec(num_levels=1), reference_group=2,
      adaptive=adaptive, seed=5)
  each, engine_each = _exchange(options, shared=False, steps=3)
  once, engine_once = _exchange(options, shared=True, steps=3)
  for step_each, step_once in zip(each, once):
    for replica in step_each + step_once:
      np.testing.assert_array_equal(replica.view(np.uint32),
                                    step_each[0].view(np.uint32))
  state_each = dict(engine_each.nested_state.items())
  state_once = dict(engine_once.nested_state.items())
  for key, (scale, gain) in state_each.items():
    np.testing.assert_array_equal(state_once[key][0].numpy(), scale.numpy())
    np.testing.assert_array_equal(state_once[key][1].numpy(), gain.numpy())
  for key in ("overloads", "nested_elements", "overload_probability"):
    np.testing.assert_array_equal(engine_once.stats()[key],
                                  engine_each.stats()[key])
