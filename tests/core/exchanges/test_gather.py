"""Tests of `ndq_tf.core.exchanges.gather.GatherExchange` (`"all_gather"`).

Through the engine on the CPU's logical devices, with the device copies of
`ndq_tf.MirroredStrategy`; under the strategies it is tested in
integration/test_mirrored.py, on worker processes in
integration/test_multi_worker.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import exchanges
from ndq_tf.core import transports
from ndq_tf.core.exchanges import gather
from ndq_tf.distribute import options as options_lib

M = 3  # DitheredCodec(num_levels=3): |error| <= κ/(2·3) per sender.


def _exchange(reduce_op, num_senders=3, codec=None, shared_memory=True):
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  devices = devices[:num_senders]
  engine = engine_lib.ExchangeEngine(options_lib.CompressionOptions(
      codec or ndq_tf.DitheredCodec(num_levels=M), exchange="all_gather",
      min_elements=1, seed=5))
  rng = np.random.default_rng(0)
  values = [[rng.normal(size=(40, 30)).astype(np.float32),
             rng.normal(size=(70,)).astype(np.float32)]
            for _ in devices]
  senders = []
  for r, device in enumerate(devices):
    with tf.device(device):
      senders.append(engine_lib.LocalSender(
          r, device, [tf.constant(v) for v in values[r]]))
  transport = transports.DeviceCopyTransport(devices)
  transport.shared_memory = shared_memory  # False: each receiver decodes.
  results = engine.exchange({"all_gather": transport}, senders, reduce_op)
  return values, results, engine


def test_it_is_the_exchange_named_all_gather():
  assert exchanges.get("all_gather") is gather.EXCHANGE
  assert isinstance(gather.EXCHANGE, gather.GatherExchange)
  assert gather.EXCHANGE.refusal(ndq_tf.NestedDitheredCodec(),
                                 nested=True) is None


@pytest.mark.parametrize("reduce_op, divisor", [("sum", 1), ("mean", 3)])
def test_every_receiver_gets_the_same_bits_within_the_bound(reduce_op,
                                                            divisor):
  values, results, engine = _exchange(reduce_op)
  assert len(results) == len(values)
  for t, shape in enumerate([(40, 30), (70,)]):
    want = sum(v[t] for v in values) / divisor
    kappa = max(float(np.abs(v[t]).max()) for v in values)
    first = results[0][t].numpy()
    assert first.shape == shape
    for receiver in results[1:]:
      np.testing.assert_array_equal(receiver[t].numpy(), first)
    bound = len(values) * kappa / (2 * M) / divisor
    assert np.abs(first - want).max() <= bound * (1 + 1e-5)
  assert engine.stats()["transport"] == "all_gather"


def test_variable_length_payloads_sum_alike_and_count_the_words_used():
  # Each receiver decoding its copies of the used words (as on GPUs) gets
  # the bits of the one decode in shared memory.
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0, bucket_size=64)
  _, shared, engine = _exchange("sum", codec=codec)
  values, results, engine_apart = _exchange("sum", codec=codec,
                                            shared_memory=False)
  for receiver in results:
    for got, want in zip(receiver, shared[0]):
      np.testing.assert_array_equal(got.numpy(), want.numpy())
  stats = engine_apart.stats()
  assert stats == engine.stats()
  # What the payloads use: far below their static worst case.
  padded = 40 * 30 + 128  # Every tensor starts on a bucket.
  assert 0 < stats["payload_bits"] < 3 * codec.max_wire_bits(padded) / 4
  assert stats["sent_bits"] == stats["payload_bits"]
  assert len(values) == 3
