"""Tests of ndq_tf.core.low_rank: PowerSGD on the exchange engine.

Real TensorFlow on logical CPU devices (tests/conftest.py): the engine with
the replicas' transports, against the NumPy reference of
tests/powersgd_reference.py.
"""

import logging as std_logging

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import low_rank
from ndq_tf.core import transports
from ndq_tf.distribute.options import CompressionOptions
from ndq_tf.ops import low_rank_ops
from ndq_tf.ops import random_ops

import powersgd_reference

# A matrix, a vector, a kernel viewed as (6, 8), a matrix of low rate.
SHAPES = [(12, 10), (7,), (3, 2, 8), (2, 3)]


def _devices(count):
  return [d.name for d in tf.config.list_logical_devices("CPU")][:count]


def _engine(config, num, seed=0):
  options = CompressionOptions(codec=config, min_elements=1, seed=seed)
  engine = engine_lib.ExchangeEngine(options)
  devices = _devices(num)
  table = {"all_gather": transports.DeviceCopyTransport(devices),
           "all_reduce": transports.DeviceSumTransport(devices),
           "reduce_scatter": transports.DeviceAllToAllTransport(devices)}
  return engine, devices, table


def _run(engine, devices, table, grads, reduce_op="sum"):
  senders = []
  for s, device in enumerate(devices):
    with tf.device(device):
      senders.append(engine_lib.LocalSender(
          s, device, [tf.constant(g) for g in grads[s]]))
  return engine.exchange(table, senders, reduce_op)


def _grads(rng, num, shapes=SHAPES, scale=1.0):
  return [[(scale * rng.standard_normal(s)).astype(np.float32)
           for s in shapes] for _ in range(num)]


def _initial_q(config, shapes, seed=0):
  """The first `Q` of each low-rank tensor, by its index in the call."""
  base = tf.constant([seed, 0x50534744], tf.int32)
  out = {}
  layout = low_rank.Layout(list(reversed(shapes)), config)
  for m in layout.matrices:
    call_index = len(shapes) - 1 - m.index  # The engine's ready order.
    out[call_index] = low_rank_ops.initial_factor(
        random_ops.fold_seed(base, m.index), m.cols, m.rank).numpy()
  return out


@pytest.mark.parametrize("num", [1, 2, 4])
def test_agrees_with_the_numpy_reference_for_five_steps(num):
  config = ndq_tf.PowerSGD(rank=2, factor_codec="float32",
                           fallback_codec="float32", start_step=2)
  engine, devices, table = _engine(config, num)
  reference = powersgd_reference.PowerSGDReference(
      2, 2, 2.0, _initial_q(config, SHAPES))
  rng = np.random.default_rng(num)
  for step in range(5):
    grads = _grads(rng, num)
    got = _run(engine, devices, table, grads)
    want = reference.step(grads)
    for r in range(num):
      for t, (a, b) in enumerate(zip(got[r], want)):
        np.testing.assert_allclose(
            a.numpy(), b, rtol=0, atol=2e-5 * np.abs(b).max() + 1e-6,
            err_msg=f"step {step}, receiver {r}, tensor {t}")
  # The residuals are the reference's (unscaled, per sender).
  stats = engine.stats()
  assert stats["rank"] == 2
  # The (6, 8) kernel's rate at rank 2 is 1.7 < 2: it is not low rank.
  assert stats["low_rank_fraction"] == pytest.approx(120 / 181)


def test_replicas_end_every_step_bitwise_identical_with_dithered_factors():
  config = ndq_tf.PowerSGD(rank=3, factor_codec="dqsg:num_levels=3",
                           start_step=1)
  engine, devices, table = _engine(config, 4)
  rng = np.random.default_rng(7)
  for _ in range(3):
    got = _run(engine, devices, table, _grads(rng, 4))
    for t in range(len(SHAPES)):
      first = got[0][t].numpy().view(np.uint32)
      for r in range(1, 4):
        np.testing.assert_array_equal(first, got[r][t].numpy().view(np.uint32))
  stats = engine.stats()
  assert stats["exchange_count"] == 3
  assert 0 < stats["sent_bits_per_element"] < 32


def test_a_non_finite_step_leaves_residuals_and_q_as_they_were():
  config = ndq_tf.PowerSGD(rank=2, factor_codec="float32",
                           fallback_codec="float32", start_step=0)
  engine, devices, table = _engine(config, 2)
  rng = np.random.default_rng(3)
  _run(engine, devices, table, _grads(rng, 2))
  store = engine.low_rank
  before = [v.numpy().copy() for v in list(store.residuals.values())
            + list(store.factors.values())]
  grads = _grads(rng, 2)
  grads[1][0][0, 0] = np.inf
  got = _run(engine, devices, table, grads)
  assert not np.isfinite(got[0][0].numpy()).all()
  after = [v.numpy() for v in list(store.residuals.values())
           + list(store.factors.values())]
  for a, b in zip(before, after):
    np.testing.assert_array_equal(a, b)


def test_a_zero_gradient_sums_to_zeros_without_nan():
  config = ndq_tf.PowerSGD(rank=4, factor_codec="float32", start_step=0)
  engine, devices, table = _engine(config, 2)
  grads = [[np.zeros(s, np.float32) for s in SHAPES[:1]] for _ in range(2)]
  got = _run(engine, devices, table, grads)
  np.testing.assert_array_equal(got[0][0].numpy(), 0.0)


def test_mean_divides_the_low_rank_sum():
  config = ndq_tf.PowerSGD(rank=2, factor_codec="float32",
                           fallback_codec="float32", start_step=0)
  grads = _grads(np.random.default_rng(5), 2)
  summed = _run(*_engine(config, 2), grads)
  mean = _run(*_engine(config, 2), grads, reduce_op="mean")
  for a, b in zip(summed[0], mean[0]):
    np.testing.assert_array_equal(a.numpy() / 2, b.numpy())


def test_state_saves_and_resets_for_another_sender_count(caplog):
  config = ndq_tf.PowerSGD(rank=2, factor_codec="float32", start_step=0)
  engine, devices, table = _engine(config, 2)
  rng = np.random.default_rng(11)
  _run(engine, devices, table, _grads(rng, 2))
  saved = {}
  engine.low_rank.save(saved)  # Before the step below.
  assert any(k.startswith("lowrank_residual_") for k in saved)
  # Into a fresh engine of 2 senders: the next step continues bitwise.
  grads = _grads(rng, 2)
  want = _run(engine, devices, table, grads)
  other, _, _ = _engine(config, 2)
  other.low_rank.load(saved)
  other.step.assign(engine.step - 1)  # The strategy saves the step.
  got = _run(other, devices, table, grads)
  for a, b in zip(want[0], got[0]):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  # Into 4 senders: the residuals were made for 2, so they restart.
  four, devices4, table4 = _engine(config, 4)
  four.low_rank.load({k: v for k, v in saved.items()
                      if not k.startswith("lowrank_residual_")})
  with caplog.at_level(std_logging.WARNING):
    _run(four, devices4, table4, _grads(rng, 4))
  assert "made for 2 senders" in caplog.text


@pytest.mark.parametrize("kwargs, name", [
    ({"rank": 0}, "rank"),
    ({"start_step": -1}, "start_step"),
    ({"factor_codec": "ndqsg"}, "factor_codec"),
    ({"factor_codec": "powersgd"}, "factor_codec"),
    ({"fallback_codec": ndq_tf.NestedDitheredCodec()}, "fallback_codec"),
    ({"min_compression_rate": -1.0}, "min_compression_rate"),
])
def test_bad_arguments_name_the_argument_and_value(kwargs, name):
  with pytest.raises(ValueError, match=f"`{name}`.*Received: {name}="):
    ndq_tf.PowerSGD(**kwargs)


def test_spec_strings_and_configs_round_trip():
  config = ndq_tf.codecs.get("powersgd:rank=4,factor_codec=float16")
  assert config == ndq_tf.PowerSGD(rank=4, factor_codec="float16")
  assert ndq_tf.codecs.get(ndq_tf.codecs.serialize(config)) == config
  options = CompressionOptions(codec="powersgd:rank=2")
  assert options.low_rank.rank == 2
  assert CompressionOptions.from_config(options.get_config()).low_rank == (
      options.low_rank)
  assert options.sender_codecs(3) == [ndq_tf.DitheredCodec()] * 3
