"""Variable-length payloads (ECDQ) under ndq_tf.MirroredStrategy.

Real TensorFlow and Keras on 4 logical CPU devices (tests/conftest.py).
`EntropyCodedDitheredCodec`'s payloads travel as the words they use
(issue #35): every replica gets bitwise the same sum, equal to the sum of
each replica's own `decode(encode(...))` at the exchange's seeds, and the
telemetry counts the words used, not the static worst case. The worker
processes' checks run in a shared multi-worker job
(integration/test_all_reduce_multi_worker.py's `rs_p2`); both compare with
`ecdq_reference`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core.scope import compressed

import ecdq_reference

NUM_REPLICAS = 4
SEED = 13
D = 128
N = 1000  # Elements per replica: 8 buckets of D, the last one padded.


def _devices():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  assert len(devices) >= NUM_REPLICAS, devices
  return devices[:NUM_REPLICAS]


def _bits(x):
  x = np.asarray(x, np.float32)
  return np.where(x == 0, np.float32(0), x).view(np.uint32)


def _grads():
  rng = np.random.default_rng(4)
  # Per-replica scales apart by 10x, heavy tails: lengths differ a lot.
  return (rng.standard_t(4, size=[NUM_REPLICAS, N])
          * np.array([[0.1], [1.0], [3.0], [0.01]])).astype(np.float32)


def _strategy_sums(strategy, grads, steps):
  values = tf.constant(grads)

  @tf.function
  def step():
    def fn():
      ctx = tf.distribute.get_replica_context()
      with compressed():
        return ctx.all_reduce("sum", values[ctx.replica_id_in_sync_group])
    return strategy.run(fn)

  return [[v.numpy() for v in strategy.experimental_local_results(step())]
          for _ in range(steps)]


@pytest.mark.parametrize("exchange, chunk_elements", [
    ("all_gather", 3 * D), ("reduce_scatter", None)])
def test_replicas_are_bitwise_identical_and_sum_the_direct_decodes(
    exchange, chunk_elements):
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0, bucket_size=D)
  strategy = ndq_tf.MirroredStrategy(codec=codec, devices=_devices(),
                                     min_elements=64, exchange=exchange,
                                     seed=SEED, chunk_elements=chunk_elements)
  grads = _grads()
  for step, sums in enumerate(_strategy_sums(strategy, grads, steps=2)):
    for other in sums[1:]:
      np.testing.assert_array_equal(_bits(other), _bits(sums[0]))
    if exchange == "all_gather":
      want, used = ecdq_reference.direct_all_gather(codec, grads, SEED, step,
                                                    chunk_elements)
    else:
      want, used, used2 = ecdq_reference.direct_reduce_scatter(
          codec, grads, SEED, step)
      used = [sum(u) for u in used] + used2
    np.testing.assert_array_equal(_bits(sums[0]), _bits(want))
    payload_bits = 32 * sum(used)
  stats = strategy.compression_stats()
  assert stats["transport"] == exchange
  # The words really used (the last step's), not the static worst case.
  assert stats["payload_bits"] == payload_bits
  assert stats["sent_bits"] == stats["payload_bits"]  # Nothing lossless.
  assert payload_bits < 2 * NUM_REPLICAS * codec.max_wire_bits(N) / 4
  assert stats["compressed_elements"] == N


def test_model_fit_keeps_the_replicas_identical():
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0)
  strategy = ndq_tf.MirroredStrategy(codec=codec, devices=_devices(),
                                     exchange="all_gather", seed=3)
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = keras.Sequential([keras.Input((20,)),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
  rng = np.random.default_rng(0)
  steps, batch = 6, 32
  x = rng.normal(size=(steps * batch, 20)).astype("float32")
  y = (x[:, 0] > 0).astype("int32") + (x[:, 1] > 1).astype("int32")
  history = model.fit(x, y, batch_size=batch, epochs=2, shuffle=False,
                      verbose=0)
  assert np.all(np.isfinite(history.history["loss"]))
  assert history.history["loss"][-1] < history.history["loss"][0]
  for variable in model.variables:
    copies = [np.atleast_1d(c.numpy()).view(np.uint8)
              for c in variable.value.values]
    assert len(copies) == NUM_REPLICAS, variable.path
    for c in copies[1:]:
      np.testing.assert_array_equal(c, copies[0], err_msg=variable.path)
  stats = strategy.compression_stats()
  assert stats["exchange_count"] == 2 * steps
  # The 20×64 kernel is compressed (3 buckets of 512 at about 1 bit per
  # element); the rest is below `min_elements`.
  assert stats["compressed_elements"] == 20 * 64
  assert 0 < stats["payload_bits"] < NUM_REPLICAS * 2 * 1536
  assert stats["sent_bits"] > stats["payload_bits"]  # The biases.
