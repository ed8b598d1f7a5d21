"""The rotated codecs under `ndq_tf.MirroredStrategy` (issue #17).

Nested groups of rotated NDQSG senders, and rotated DQSG on both exchanges
of 4 replicas of one process; the codecs alone are tested in
codecs/test_bucketed.py, the transform in ops/test_rotation_ops.py, on
worker processes in test_rotation_multi_worker.py.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf import ops
from ndq_tf import theory
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import fusion
from ndq_tf.ops import rotation_ops

NUM_REPLICAS = 4
STRATEGY_SEED = 7


@pytest.mark.parametrize("adaptive", [False, True])
def test_nested_groups_count_a_rotated_nested_codec_in_its_rotated_domain(
    adaptive):
  """Overloads and noise scales of rotated NDQSG senders, rotated domain.

  Two DQSG reference replicas, two rotated NDQSG ones; the ground truth
  is rebuilt from the seeds: a coefficient of a nested bucket overloaded
  exactly when its rotated error exceeds half its fine step (α = 1), and
  every coefficient counts (a rotated bucket is sent whole, padding too).
  """
  d = 64
  codec = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                     bucket_size=d, rotation="hadamard")
  reference = ndq_tf.DitheredCodec(num_levels=3, bucket_size=d)
  cross = ndq_tf.distribute.CompressedAllReduce(
      codec, reference_codec=reference, reference_group=2,
      adaptive=adaptive, min_elements=64, seed=STRATEGY_SEED)
  strategy = ndq_tf.MirroredStrategy(cross_device_ops=cross,
                                     devices=_devices())
  rng = np.random.default_rng(11)
  common = rng.standard_t(3, size=8 * d - 20)  # a partial last bucket
  plan = fusion.FusionPlan.from_tensors([tf.constant(common, tf.float32)], d)
  noise = None
  for step in range(3 if adaptive else 1):
    grads = (common + rng.normal(size=[NUM_REPLICAS, common.size])
             ).astype(np.float32)
    if step:  # What the nested senders encode this call with.
      ((_, (scale, gain)),) = cross.engine.nested_state.items()
      noise = (scale.numpy() * gain.numpy())[2:]
    got = _reduce(strategy, grads)
    for g in got[1:]:
      np.testing.assert_array_equal(g, got[0])
  stats = cross.stats()
  base = tf.constant([STRATEGY_SEED, engine_lib.SEED_TAG], tf.int32)
  seeds = [fusion.derive_seed(base, step, k) for k in range(NUM_REPLICAS)]
  codecs = [reference] * 2 + [codec] * 2
  wires = [fusion.encode_fused(
      c, [tf.constant(g)], s, plan,
      noise_scale=None if noise is None or p < 2 else noise[p - 2])
           for p, (c, g, s) in enumerate(zip(codecs, grads, seeds))]
  decoded, side = fusion.decode_senders(codecs, wires, seeds, plan,
                                        return_side_information=True)
  fused = [plan.flatten([tf.constant(g)]) for g in grads]
  overloads, sigma = 0, []
  for p in (2, 3):
    signs = rotation_ops.rotation_signs(ops.fold_seed(seeds[p], 0),
                                        plan.total_size // d, d, tf.float32)
    rotated = [rotation_ops.rotate(tf.reshape(v, [-1, d]), signs).numpy()
               for v in (fused[p], side[p], decoded[p])]
    scales = fusion.wire_scales(codec, wires[p], plan).numpy()
    fine = scales[:, None] / codec.num_levels
    wrong = np.abs(rotated[2] - rotated[0]) > fine * (0.5 + 1e-3)
    overloads += int(np.sum(wrong[scales > 0]))  # Not the DQSG fallbacks.
    sigma.append(np.sqrt(np.mean((rotated[0] - rotated[1])**2, axis=1))
                 / rotation_ops.domain_gain(d))
  nested = sum(int(np.sum(fusion.wire_scales(codec, wires[p], plan).numpy()
                          > 0)) for p in (2, 3))
  assert stats["nested_elements"] == d * nested
  assert stats["overloads"] == overloads
  assert stats["fallback_fraction"] == 1 - nested / (2 * plan.total_size // d)
  print(f"adaptive={adaptive}: {nested} nested buckets, {overloads} "
        f"overloads, stats {stats}")
  if not adaptive:
    assert overloads > 0 and nested == 2 * plan.total_size // d
  else:
    assert nested > 0  # After the first call's DQSG fallback.
  ((_, (scale, _)),) = cross.engine.nested_state.items()
  if not adaptive:  # The adaptive mode keeps an envelope of them.
    np.testing.assert_allclose(scale.numpy()[2:], sigma, rtol=1e-5)
  # Orthogonal: the rotated RMS over a bucket is the unrotated one over d.
  z = [(fused[p] - side[p]).numpy().reshape(-1, d) for p in (2, 3)]
  np.testing.assert_allclose(sigma, np.sqrt(np.mean(np.square(z), axis=2)),
                             rtol=1e-5)


def _devices():
  return [d.name for d in tf.config.list_logical_devices("CPU")[:NUM_REPLICAS]]


def _reduce(strategy, grads):
  values = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(grads[ctx.replica_id_in_sync_group]))
  with ndq_tf.distribute.compressed():
    (out,) = strategy.extended.batch_reduce_to("sum", [(values, values)])
  return [v.numpy() for v in out.values]


def _api_sum(codec, grads, step):
  """The decoded sum by the public API, the signs shared; and its scales."""
  base = tf.constant([STRATEGY_SEED, engine_lib.SEED_TAG], tf.int32)
  seeds = [ops.fold_seed(fusion.derive_seed(base, step, k), 0)
           for k in range(NUM_REPLICAS)]
  shared = ops.fold_seed(
      fusion.derive_seed(base, step, engine_lib.ROTATION_SENDER), 0)
  flats = [tf.constant(g) for g in grads]
  scales = tf.reduce_max(tf.stack(
      [codec.bucket_scales(x, rotation_seed=shared) for x in flats]), axis=0)
  total = tf.add_n([tf.cast(codec.encode_symbols(
      x, s, scales, rotation_seed=shared), tf.int32)
                    for x, s in zip(flats, seeds)])
  return codec.decode_symbol_sum(total, scales, tf.stack(seeds),
                                 rotation_seed=shared).numpy(), scales.numpy()


@pytest.mark.parametrize("transport", ["all_gather", "all_reduce"])
def test_mirrored_rotated_dqsg_is_identical_unbiased_with_its_variance(
    transport):
  d, num_levels, steps = 128, 2, 6
  codec = ndq_tf.DitheredCodec(num_levels=num_levels, bucket_size=d,
                               rotation="hadamard")
  strategy = ndq_tf.MirroredStrategy(codec=codec, devices=_devices(),
                                     exchange=transport, seed=STRATEGY_SEED)
  rng = np.random.default_rng(8)
  grads = (rng.standard_t(3, size=[NUM_REPLICAS, 16 * d])
           * np.exp(rng.uniform(-1, 1, size=[NUM_REPLICAS, 1]))).astype(
               np.float32)
  exact = grads.astype(np.float64).sum(axis=0)
  errors, want = [], 0.0
  for step in range(steps):
    got = _reduce(strategy, grads)
    for g in got[1:]:
      np.testing.assert_array_equal(g, got[0])
    errors.append(got[0] - exact)
    if transport == "all_reduce":
      api, scales = _api_sum(codec, grads, step)
      np.testing.assert_array_equal(got[0], api)
      # P senders, the shared rotated scale: P·κ_b²Δ²/12 per element.
      kappa = np.array(theory.rotated_scales(scales, d))
      want += d * np.sum(theory.shared_scale_variance(
          num_levels, NUM_REPLICAS, kappa))
    else:
      # Every sender its own signs and scales: the sum of their energies.
      base = tf.constant([STRATEGY_SEED, engine_lib.SEED_TAG], tf.int32)
      for k in range(NUM_REPLICAS):
        seed = ops.fold_seed(fusion.derive_seed(base, step, k), 0)
        wire = codec.encode(grads[k], seed).scales.numpy()
        want += theory.rotated_dithered_total_mse(wire, d, num_levels)
  assert strategy.compression_stats()["transport"] == transport
  errors = np.array(errors)
  assert abs(np.sum(errors**2) / want - 1) < 6 * 0.894 / math.sqrt(
      errors.size)
  # Unbiased: the mean error projected on the exact sum, in standard units.
  per_element = want / errors.size
  z = np.sum(errors.mean(axis=0) * exact) / math.sqrt(
      per_element * np.sum(exact * exact) / steps)
  assert abs(z) < 6
