"""Tests of `ndq_tf.core.engine.ExchangeEngine` on its own: its seeds, and
the context it hands an exchange.

The exchange end to end is tested through the strategies
(integration/test_mirrored.py, core/exchanges/test_sum.py,
integration/test_chunked_exchange.py, integration/test_decode_once.py).
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf import ops
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import exchanges
from ndq_tf.core import fusion
from ndq_tf.core import transports
from ndq_tf.distribute import options as options_lib


def _engine(seed=3):
  return engine_lib.ExchangeEngine(
      options_lib.CompressionOptions("dqsg:num_levels=1", seed=seed))


def test_seed_is_the_payload_seed_of_fusion():
  engine = _engine()
  base = tf.constant([3, engine_lib.SEED_TAG], tf.int32)
  for step, sender in ((0, 0), (5, 2), (7, engine_lib.ROTATION_SENDER)):
    np.testing.assert_array_equal(
        engine.seed(sender, step).numpy(),
        fusion.derive_seed(base, step, sender).numpy())


def test_segment_seed_is_the_one_encode_flat_draws_from():
  engine = _engine()
  for segment in (0, 1, 4):
    np.testing.assert_array_equal(
        engine.seed(1, 2, segment=segment).numpy(),
        ops.fold_seed(engine.seed(1, 2), segment).numpy())


def test_other_step_sender_or_segment_gives_another_seed():
  engine = _engine()
  seeds = {tuple(engine.seed(s, t, segment=k).numpy())
           for s in range(3) for t in range(3) for k in (None, 0, 1)}
  assert len(seeds) == 27


def test_rotation_sender_is_the_sum_exchanges():
  assert (engine_lib.ROTATION_SENDER ==
          exchanges.sum_exchange.ROTATION_SENDER == -1)


def test_step_counter_starts_at_zero_and_stats_report_the_option():
  engine = _engine()
  assert int(engine.step.numpy()) == 0
  stats = engine.stats()
  assert stats["exchange_count"] == 0 and stats["transport"] == "auto"
  assert isinstance(engine.options.codec, ndq_tf.DitheredCodec)


def test_an_exchange_gets_a_context_not_the_engine():
  parameters = list(inspect.signature(
      exchanges.base.Exchange.run).parameters)
  assert parameters == ["self", "context", "transport", "codecs", "plan",
                        "senders"]
  for exchange in exchanges.EXCHANGES:
    assert list(inspect.signature(exchange.run).parameters) == (
        parameters[1:])


def test_segment_seed_is_the_one_fold_of_encode_and_decode():
  seed = fusion.derive_seed(tf.constant([5, 6]), 3, 1)
  for segment in (0, 2):
    np.testing.assert_array_equal(
        fusion.segment_seed(seed, segment).numpy(),
        ops.fold_seed(seed, segment).numpy())
    np.testing.assert_array_equal(
        fusion.derive_seed(tf.constant([5, 6]), 3, 1, segment).numpy(),
        ops.fold_seed(seed, segment).numpy())


@pytest.mark.parametrize("transport, transport_name", [
    ("all_gather", "device_copy"),
    ("all_reduce", "device_sum"),
    ("reduce_scatter", "device_all_to_all"),
])
def test_telemetry_reports_the_exchange_not_the_transport(transport,
                                                          transport_name):
  devices = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
  engine = engine_lib.ExchangeEngine(options_lib.CompressionOptions(
      "dqsg:num_levels=1", transport=transport, min_elements=1, seed=3))
  moves = {"all_gather": transports.DeviceCopyTransport(devices),
           "all_reduce": transports.DeviceSumTransport(devices),
           "reduce_scatter": transports.DeviceAllToAllTransport(devices)}
  assert moves[transport].name == transport_name
  senders = []
  for r, device in enumerate(devices):
    with tf.device(device):
      senders.append(engine_lib.LocalSender(
          r, device, [tf.fill([600], float(r + 1))]))
  engine.exchange(moves, senders, "sum")
  stats = engine.stats()
  assert stats["transport"] == transport
  assert stats["exchange_count"] == 1 and stats["senders"] == 2
