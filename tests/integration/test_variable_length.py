"""Variable-length payloads (ECDQ) under ndq_tf.MirroredStrategy.

Real TensorFlow and Keras on 4 logical CPU devices (tests/conftest.py).
`EntropyCodedDitheredCodec`'s payloads travel as the words they use
(issue #35): every replica gets bitwise the same sum, equal to the sum of
each replica's own `decode(encode(...))` at the exchange's seeds, and the
telemetry counts the words used, not the static worst case. The worker
processes' checks are in the shared multi-worker jobs
(integration/test_multi_worker.py).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import fusion_codec
from ndq_tf.core import fusion_plan
from ndq_tf.core.scope import compressed

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


def _direct(codec, grads, step, chunk_elements=None):
  """Each replica's own encode and decode at the exchange's seeds, summed.

  Chunk by chunk as the exchange cuts the buffer, each chunk with the
  dither it has in the whole buffer (`dither_offset`).
  """
  base = tf.constant([SEED, engine_lib.SEED_TAG], tf.int32)
  plan = fusion_plan.FusionPlan([[N]], [tf.float32], D)
  total, bits = np.zeros([plan.total_size], np.float32), 0
  for k, g in enumerate(grads):
    # The fused buffer is one codec segment: its seed is segment 0's.
    seed = fusion_codec.derive_seed(base, step, k, segment=0)
    fused = np.pad(g, [0, plan.total_size - N])
    parts = []
    for chunk in plan.chunks(chunk_elements):
      a, b = chunk.start, chunk.start + chunk.length
      payload = codec.encode(tf.constant(fused[a:b]), seed, dither_offset=a)
      parts.append(codec.decode(payload, seed, dither_offset=a).numpy())
      bits += int(codec.payload_bits(payload))
    total = total + np.concatenate(parts)  # Sender order.
  return total[:N], bits


@pytest.mark.parametrize("exchange, chunk_elements", [
    ("all_gather", 3 * D)])
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
    want, payload_bits = _direct(codec, grads, step, chunk_elements)
    np.testing.assert_array_equal(_bits(sums[0]), _bits(want))
  stats = strategy.compression_stats()
  assert stats["transport"] == exchange
  # The words really used (the last step's), not the static worst case.
  assert stats["payload_bits"] == payload_bits
  assert stats["sent_bits"] == stats["payload_bits"]  # Nothing lossless.
  assert payload_bits < NUM_REPLICAS * codec.max_wire_bits(N) / 4
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
