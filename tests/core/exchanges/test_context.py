"""Tests of `ndq_tf.core.exchanges.context.ExchangeContext`.

What an exchange gets from the engine for one call: its seeds are the
engine's, it divides a mean, and it is frozen. Real TensorFlow, no devices
beyond the CPU.
"""

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf.core import engine as engine_lib
from ndq_tf.core import exchanges
from ndq_tf.distribute import options as options_lib


def _engine(seed=3):
  return engine_lib.ExchangeEngine(
      options_lib.CompressionOptions("dqsg:num_levels=1", seed=seed))


def test_context_seeds_are_the_engines():
  engine = _engine(seed=11)
  context = exchanges.ExchangeContext(
      options=engine.options, step=tf.constant(4), fingerprint=0,
      base_seed=(11, engine_lib.SEED_TAG), device="/device:CPU:0",
      telemetry=engine.telemetry)
  for sender, step, segment in ((0, None, None), (2, 7, None),
                                (engine_lib.ROTATION_SENDER, None, 0),
                                (1, 3, 2)):
    np.testing.assert_array_equal(
        context.seed(sender, step, segment).numpy(),
        engine.seed(sender, 4 if step is None else step, segment).numpy())
  with pytest.raises(AttributeError):
    context.step = 5  # Frozen: one context per call.


def _context(**kwargs):
  engine = _engine()
  return exchanges.ExchangeContext(
      options=engine.options, step=tf.constant(0), fingerprint=0,
      base_seed=(3, engine_lib.SEED_TAG), device="/device:CPU:0",
      telemetry=engine.telemetry, **kwargs)


def test_finish_divides_a_mean_by_the_divisor_or_the_senders():
  total = tf.constant([6.0, -3.0])
  np.testing.assert_array_equal(_context().finish(total, 3).numpy(),
                                [6.0, -3.0])
  np.testing.assert_array_equal(
      _context(mean=True).finish(total, 3).numpy(), [2.0, -1.0])
  np.testing.assert_array_equal(
      _context(mean=True, divisor=2).finish(total, 3).numpy(), [3.0, -1.5])


def test_it_carries_no_state_stores_by_default():
  context = _context()
  assert context.nested_state is None and context.feedback is None
  assert context.lossless_elements == 0 and context.lossless_bits == 0
