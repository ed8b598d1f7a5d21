"""Tests of `ndq_tf.core.engine.ExchangeEngine` on its own: its seeds.

The exchange end to end is tested through the strategies (test_mirrored,
test_all_reduce, test_chunked_exchange, test_decode_once).
"""

import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf import ops
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import exchanges
from ndq_tf.core import fusion
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
