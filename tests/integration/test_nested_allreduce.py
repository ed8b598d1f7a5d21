"""NDQSG across replicas: CompressedAllReduce with a reference group (Algorithm 2).

Real TensorFlow on 4 logical CPU devices (tests/conftest.py), fixed seeds.
Replicas 0 .. |P1| - 1 send DQSG (`reference_codec`), the others nested codes
decoded with the mean of everything decoded before them as side information.
"""

import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf import theory
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import fusion
from ndq_tf.core import nested_state
from ndq_tf.core import ready_order
from ndq_tf.distribute.cross_device_ops import CompressedAllReduce
from ndq_tf.distribute.mirrored import MirroredStrategy

import digits_recipe

NUM_REPLICAS = 4
D = 512  # bucket size of both codecs


def _devices():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  assert len(devices) >= NUM_REPLICAS, devices
  return devices[:NUM_REPLICAS]


def _nested(**kwargs):
  kwargs.setdefault("num_levels", 3)
  kwargs.setdefault("coarse_ratio", 3)
  return ndq_tf.NestedDitheredCodec(**kwargs)


def _reference():
  return ndq_tf.DitheredCodec(num_levels=3)


def _bits(x):
  return np.asarray(x).view(np.uint32)


def _assert_bitwise_equal(values):
  first = _bits(values[0].numpy())
  for v in values[1:]:
    np.testing.assert_array_equal(first, _bits(v.numpy()))


def _correlated(noise, seed=0, shapes=((128, 256), (300,))):
  """`g_p = g + noise·n_p` for every replica: list (replicas) of lists."""
  rng = np.random.default_rng(seed)
  common = [rng.normal(size=s).astype(np.float32) for s in shapes]
  return [[(c + noise * rng.normal(size=c.shape)).astype(np.float32)
           for c in common] for _ in range(NUM_REPLICAS)]


def _reduce(strategy, per_replica):
  """Eager compressed `batch_reduce_to` (MEAN) of the replicas' tensors.

  Built inside `compressed()`: by default only a Keras optimizer's gradient
  aggregation is compressed.
  """
  values = []
  for k in range(len(per_replica[0])):
    stacked = tf.constant(np.stack([r[k] for r in per_replica]))
    values.append(strategy.experimental_distribute_values_from_function(
        lambda ctx, s=stacked: s[ctx.replica_id_in_sync_group]))
  with ndq_tf.distribute.compressed():
    out = strategy.extended.batch_reduce_to("mean",
                                            [(v, v) for v in values])
  return [strategy.experimental_local_results(o) for o in out]


def _replay(ops, per_replica, step, noise_scale=None):
  """The senders' wires and decodes of one call, rebuilt from the seeds.

  The engine fuses the call's tensors in ready order (`ready_order`).
  """
  codecs = ops.options.sender_codecs(NUM_REPLICAS)
  order = ready_order.ready_order(len(per_replica[0]))
  tensors = [[tf.constant(t) for t in ready_order.in_ready_order(r, order)]
             for r in per_replica]
  plan = fusion.FusionPlan.from_tensors(tensors[0], D)
  base = tf.constant([ops.seed, engine_lib.SEED_TAG], tf.int32)
  seeds = [fusion.derive_seed(base, step, s) for s in range(NUM_REPLICAS)]
  wires = [fusion.encode_fused(
      c, t, s, plan,
      noise_scale=noise_scale if c.needs_side_information else None)
           for c, t, s in zip(codecs, tensors, seeds)]
  decoded, side = fusion.decode_senders(codecs, wires, seeds, plan,
                                        return_side_information=True)
  fused = [plan.flatten(t).numpy() for t in tensors]
  return codecs, plan, wires, [x.numpy() for x in decoded], side, fused


def _noise_state(ops):
  """The only plan's `(signature, scale, gain)` (NumPy), rows = replicas."""
  ((signature, (scale, gain)),) = ops.engine.nested_state.items()
  return signature, scale.numpy(), gain.numpy()


def _real_mask(plan):
  mask = np.zeros(plan.total_size, bool)
  for offset, size in zip(plan.offsets, plan.sizes):
    mask[offset:offset + size] = True
  return mask


# -- Arguments -----------------------------------------------------------------


class TestArguments:

  def test_config_round_trips_the_reference_group(self):
    ops = CompressedAllReduce(_nested(), reference_codec=_reference(),
                              reference_group=0.25, seed=3)
    config = ops.get_config()
    back = CompressedAllReduce.from_config(config)
    assert back.get_config() == config
    assert back.reference_codec == _reference()
    assert back.reference_group == 0.25
    assert back.adaptive is False
    mmse = CompressedAllReduce(_nested(alpha="mmse"),
                               reference_codec="dqsg:num_levels=3",
                               reference_group=1)
    assert mmse.adaptive is True  # alpha="mmse" implies the automatic mode
    assert CompressedAllReduce.from_config(
        mmse.get_config()).get_config() == mmse.get_config()

  def test_default_reference_group_is_half_the_replicas(self):
    ops = CompressedAllReduce(_nested(), reference_codec=_reference())
    assert ops.reference_group == 0.5
    assert ops.reference_count(4) == 2
    codecs = ops.options.sender_codecs(4)
    assert codecs == [_reference()] * 2 + [_nested()] * 2

  @pytest.mark.parametrize("kwargs, error, match", [
      ({}, ValueError, "side information"),
      ({"reference_codec": _nested()}, ValueError, "reference_codec"),
      ({"reference_codec": ndq_tf.DitheredCodec(num_levels=3,
                                                bucket_size=256)},
       ValueError, "bucket_size=256 and codec.bucket_size=512"),
      ({"reference_codec": 3}, TypeError, "reference_codec"),
      ({"reference_codec": _reference(), "reference_group": 0},
       ValueError, "reference_group"),
      ({"reference_codec": _reference(), "reference_group": 1.0},
       ValueError, "reference_group"),
      ({"reference_codec": _reference(), "reference_group": True},
       ValueError, "reference_group"),
      ({"reference_codec": _reference(), "adaptive": "yes"},
       ValueError, "adaptive"),
  ])
  def test_invalid_reference_arguments(self, kwargs, error, match):
    with pytest.raises(error, match=match):
      CompressedAllReduce(_nested(), **kwargs)

  def test_mmse_needs_the_automatic_mode_and_an_odd_ratio(self):
    with pytest.raises(ValueError, match="adaptive"):
      CompressedAllReduce(_nested(alpha="mmse"), reference_codec=_reference(),
                          adaptive=False)
    with pytest.raises(ValueError, match="odd"):
      CompressedAllReduce(_nested(coarse_ratio=4),
                          reference_codec=_reference(), adaptive=True)

  def test_reference_arguments_need_a_nested_codec(self):
    with pytest.raises(ValueError, match="only for a nested"):
      CompressedAllReduce(_reference(), reference_codec=_reference())
    with pytest.raises(ValueError, match="only for a nested"):
      CompressedAllReduce(_reference(), adaptive=True)

  def test_count_is_checked_against_the_replicas(self):
    with pytest.raises(ValueError, match="at least one nested sender"):
      MirroredStrategy(codec=_nested(), reference_codec=_reference(),
                       reference_group=4, devices=_devices())
    strategy = MirroredStrategy(codec=_nested(), reference_codec=_reference(),
                                reference_group=3, devices=_devices())
    assert strategy.compressed_all_reduce.reference_count(4) == 3


# -- One all-reduce on synthetic correlated gradients --------------------------


@pytest.mark.parametrize("noise", [0.05, 0.5])
def test_batch_reduce_is_identical_everywhere_and_within_the_bound(noise):
  ops = CompressedAllReduce(_nested(), reference_codec=_reference(),
                            reference_group=0.5, min_elements=64, seed=7)
  strategy = MirroredStrategy(cross_device_ops=ops, devices=_devices())
  per_replica = _correlated(noise)
  results = _reduce(strategy, per_replica)
  for copies in results:
    _assert_bitwise_equal(copies)

  # Ground truth per sender: the same wires, rebuilt from the same seeds.
  codecs, plan, wires, decoded, side, fused = _replay(ops, per_replica,
                                                     step=0)
  mean = np.concatenate([c[0].numpy().ravel() for c in
                         ready_order.in_ready_order(
                             results, ready_order.ready_order(len(results)))])
  real = _real_mask(plan)
  np.testing.assert_allclose(mean, np.mean(decoded, axis=0)[real],
                             rtol=0, atol=1e-5)

  # Per-element bound: every sender's error is within kappa_{p,b}·Δ1/2
  # (DQSG num_levels=3 for P1; NDQSG Δ1 = κ/3 for P2 without overload).
  kappa = [np.repeat(np.abs(f).reshape(-1, D).max(axis=1), D) for f in fused]
  half_step = [k / 6 for k in kappa]
  errors = [dec - f for dec, f in zip(decoded, fused)]
  for p in range(2):  # DQSG: never out of the bound
    assert np.all(np.abs(errors[p])[real] <= half_step[p][real] * (1 + 1e-5))
  overloaded = np.zeros(plan.total_size, bool)
  for p in range(2, NUM_REPLICAS):
    overloaded |= np.abs(errors[p]) > half_step[p] * (1 + 1e-5) + 1e-6
  overloaded &= real
  truth = np.mean([f for f in fused], axis=0)[real]
  bound = np.mean(half_step, axis=0)[real] * (1 + 1e-5)
  ok = ~overloaded[real]
  assert np.all(np.abs(mean - truth)[ok] <= bound[ok])

  # Measured overload rate against the Gaussian theory at the true σ_z:
  # z_p = g_p - mean(decoded before p) = n_p - mean(n_q) - mean(e_q).
  expected = []
  for p in range(2, NUM_REPLICAS):
    kappa_b = np.abs(fused[p]).reshape(-1, D).max(axis=1)
    before = np.stack([np.abs(fused[q]).reshape(-1, D).max(axis=1)
                       for q in range(p)])
    var = noise**2 * (1 + 1 / p) + np.sum((before / 3)**2 / 12, axis=0) / p**2
    expected += [theory.overload_probability(1.0, math.sqrt(v) / k, 1 / 3, 3)
                 for v, k in zip(var, kappa_b)]
  n = 2 * int(real.sum())
  expected_count = float(np.mean(expected)) * n
  measured = int(np.sum(
      [np.abs(errors[p])[real] > half_step[p][real] * (1 + 1e-5) + 1e-6
       for p in range(2, NUM_REPLICAS)]))
  stats = ops.stats()
  estimate = stats["overload_probability"]
  print(f"noise {noise}: overloads measured {measured} / {n} = "
        f"{measured / n:.2e}, theory at the true sigma {expected_count / n:.2e},"
        f" telemetry estimate {estimate:.2e}, telemetry count "
        f"{stats['overloads']}")
  # The senders' own count (exact, from the residual's coarse cell) is the
  # ground truth this test computes from the error's size.
  assert stats["overloads"] == measured
  assert stats["nested_elements"] == n  # the fixed mode nests every bucket
  assert stats["overload_rate"] == measured / n
  # The noise scales: each nested sender's exact RMS of g_p - y_p per
  # bucket over the real elements (float32 sums: relative 1e-5). One state
  # entry, of this call's plan; one row per replica.
  signature, sigma, _ = _noise_state(ops)
  assert signature == plan.signature
  assert sigma.shape == (NUM_REPLICAS, plan.total_size // D)
  assert np.all(np.isnan(sigma[:2]))
  for p in range(2, NUM_REPLICAS):
    z = np.where(real, fused[p] - side[p].numpy(), 0.0).reshape(-1, D)
    count = real.reshape(-1, D).sum(axis=1)
    np.testing.assert_allclose(sigma[p], np.sqrt((z**2).sum(axis=1) / count),
                               rtol=1e-5)
    # What the adaptive step at a given noise scale would overload, on
    # average over the dither, from the exact z (the gains' feedback).
    used = np.linspace(0.02, 0.5, sigma.shape[1]).astype(np.float32)
    got = nested_state.sender_statistics(
        codecs[p], wires[p], fused[p], side[p], decoded[p], plan,
        noise_scale=used)["bucket_overloads"].numpy()
    step = theory.auto_nested_step_ratio(3, 1e-4, 1.0) * used[:, None]
    want = np.clip((np.abs(z) - step) / step, 0, 1).sum(axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert want.max() > 10  # the small scales really overload
  # The Gaussian model ignores one effect, so the measured rate may exceed
  # it a little: an overloaded P2 sender is off by ±κ and corrupts the side
  # information of the senders decoded after it (measured at noise 0.5:
  # 1012 against 900 expected).
  tolerance = 4 * math.sqrt(expected_count) + 2
  assert expected_count - tolerance <= measured
  assert measured <= 1.25 * expected_count + tolerance
  if noise < 0.1:
    # σ_z is then mostly the reference group's quantization noise.
    assert measured == 0 and expected_count < 0.05 and estimate < 1e-5
  else:
    assert expected_count > 20  # the regime is really tested
    assert 0.5 < estimate / (expected_count / n) < 2.0
  assert stats["fallback_fraction"] == 0.0  # fixed mode never falls back

  # Wire bits: each sender's real payload, P1 and P2 differ.
  total = plan.total_size
  want = [_reference().wire_bits(total)] * 2 + [_nested().wire_bits(total)] * 2
  assert want[0] != want[2]
  assert [32 * plan.wire_words(c) for c in codecs] == want
  assert [32 * int(tf.size(w)) for w in wires] == want
  # The telemetry sums every replica's payload; nothing went losslessly.
  assert stats["payload_bits"] == sum(want)
  assert stats["sent_bits"] == sum(want)
  assert stats["lossless_elements"] == 0
  assert stats["compressed_elements"] == plan.num_elements


# -- Automatic mode ---------------------------------------------------------------


def test_automatic_mode_falls_back_first_then_nests_and_restores(tmp_path):
  ops = CompressedAllReduce(_nested(), reference_codec=_reference(),
                            reference_group=2, adaptive=True,
                            min_elements=64, seed=5)
  strategy = MirroredStrategy(cross_device_ops=ops, devices=_devices())
  fallback, mse = [], []
  for step in range(4):
    per_replica = _correlated(0.05, seed=step)
    results = _reduce(strategy, per_replica)
    for copies in results:
      _assert_bitwise_equal(copies)
    truth = np.concatenate([np.mean([r[k] for r in per_replica], axis=0).ravel()
                            for k in range(2)])
    got = np.concatenate([c[0].numpy().ravel() for c in results])
    fallback.append(ops.stats()["fallback_fraction"])
    mse.append(float(np.mean((got - truth)**2)))
  num_buckets = 65  # 64 + 1 (300 elements padded to a bucket)
  signature, sigma, gain = _noise_state(ops)
  assert sigma.shape == gain.shape == (NUM_REPLICAS, num_buckets)
  stats = ops.stats()
  print(f"fallback fraction per step {fallback}, MSE {mse}, "
        f"sigma {sigma[2:, :3]}, gain {gain}, overload "
        f"{stats['overload_probability']} (counted {stats['overloads']})")
  assert fallback[0] == 1.0
  assert all(f <= 0.05 for f in fallback[1:])
  assert mse[-1] < 0.5 * mse[0]  # nested codes beat the ternary fallback
  # Rows of the reference senders stay NaN (their exact values are checked
  # in the fixed-mode test above).
  assert np.all(np.isnan(sigma[:2]))
  assert np.all(np.isfinite(sigma[2:]) & (sigma[2:] > 0))
  # Gains: the reference rows never move; the nested ones fell at most
  # 0.8x per call over the 3 calls after the first, and Gaussian z at the
  # target step overloads too rarely to raise them far.
  assert np.all(gain[:2] == 1.0)
  assert np.all((gain[2:] >= 0.8**3 * 0.999) & (gain[2:] <= 4.0))
  assert stats["overload_probability"] < 10 * ops.codec.overload_target

  # Step counter and noise scales restore through tf.train.Checkpoint, also
  # into an object that has not created its noise variable yet.
  path = tf.train.Checkpoint(ops=ops).save(str(tmp_path / "ckpt"))
  names = [n for n, _ in tf.train.list_variables(path)]
  assert sum(signature in n for n in names) == 2, names  # scale and gain
  fresh = CompressedAllReduce(_nested(), reference_codec=_reference(),
                              reference_group=2, adaptive=True,
                              min_elements=64, seed=5)
  tf.train.Checkpoint(ops=fresh).restore(path).assert_existing_objects_matched()
  assert int(fresh.step.numpy()) == 4
  fresh.engine.nested_state.variables_for(signature, NUM_REPLICAS,
                                          num_buckets)
  restored = fresh.engine.nested_state.read(signature)
  np.testing.assert_array_equal(restored.scale.numpy(), sigma)
  np.testing.assert_array_equal(restored.gain.numpy(), gain)
  # ... and the next call continues bitwise as the original would.
  per_replica = _correlated(0.05, seed=9)
  a = _reduce(strategy, per_replica)
  b = _reduce(MirroredStrategy(cross_device_ops=fresh, devices=_devices()),
              per_replica)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(_bits(x[0].numpy()), _bits(y[0].numpy()))


def test_buffers_with_as_many_buckets_keep_separate_noise_states():
  """The noise state is keyed by the fusion plan, not by its bucket count."""
  ops = CompressedAllReduce(_nested(), reference_codec=_reference(),
                            reference_group=2, adaptive=True,
                            min_elements=64, seed=5)
  strategy = MirroredStrategy(cross_device_ops=ops, devices=_devices())
  two_tensors = ((128, 256), (300,))  # 64 + 1 buckets
  one_tensor = ((65 * D,),)           # 65 buckets
  for step in range(2):
    _reduce(strategy, _correlated(0.05, seed=step, shapes=two_tensors))
  # The second call of that plan knew its noise: it nested its buckets.
  assert ops.stats()["fallback_fraction"] <= 0.05
  signature, sigma, gain = _noise_state(ops)
  _reduce(strategy, _correlated(0.05, seed=2, shapes=one_tensor))
  # A new plan starts from no noise knowledge (falls back everywhere), not
  # from the state of the other buffer of 65 buckets ...
  assert ops.stats()["fallback_fraction"] == 1.0
  entries = dict(ops.engine.nested_state.items())
  other = fusion.FusionPlan([(65 * D,)], [tf.float32], D).signature
  assert sorted(entries) == sorted([signature, other]) and other != signature
  assert entries[other][0].shape == (NUM_REPLICAS, 65)
  # ... and leaves that state alone.
  np.testing.assert_array_equal(entries[signature][0].numpy(), sigma)
  np.testing.assert_array_equal(entries[signature][1].numpy(), gain)
  assert not np.array_equal(entries[other][0].numpy()[2:], sigma[2:])


def test_noise_scales_are_saved_with_the_model(tmp_path):
  def build():
    strategy = MirroredStrategy(codec=_nested(), reference_codec=_reference(),
                                adaptive=True, devices=_devices())
    with strategy.scope():
      model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    return strategy.compressed_all_reduce, model

  # The state of a 3-bucket plan.
  signature = fusion.FusionPlan([(3 * D,)], [tf.float32], D).signature
  ops, model = build()
  ops.step.assign(3)
  scale, gain = ops.engine.nested_state.variables_for(signature,
                                                      NUM_REPLICAS, 3)
  sigma = [[np.nan] * 3] * 2 + [[0.5, np.nan, 2.0], [1.0, 2.0, 3.0]]
  scale.assign(sigma)
  gains = [[1.0] * 3] * 2 + [[2.5, 0.5, 1.0], [1.0, 1.25, 0.8]]
  gain.assign(gains)
  model.save_weights(str(tmp_path / "m.weights.h5"))
  path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
  for load in ("h5", "checkpoint"):
    fresh_ops, fresh = build()  # no noise variable yet
    assert fresh_ops.engine.nested_state.items() == []
    if load == "h5":
      fresh.load_weights(str(tmp_path / "m.weights.h5"))
    else:
      tf.train.Checkpoint(model=fresh).restore(path).expect_partial()
    assert int(fresh_ops.step.numpy()) == 3, load
    fresh_ops.engine.nested_state.variables_for(signature, NUM_REPLICAS, 3)
    restored = fresh_ops.engine.nested_state.read(signature)
    np.testing.assert_array_equal(restored.scale.numpy(), sigma)
    np.testing.assert_array_equal(restored.gain.numpy(),
                                  np.asarray(gains, np.float32))


def test_compression_stats_logs_the_counted_overload_rate():
  strategy = MirroredStrategy(codec=_nested(), reference_codec=_reference(),
                              adaptive=True, devices=_devices())
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(32)])
    model.compile("sgd", "mse")
  x = np.random.default_rng(0).normal(size=(128, 32)).astype(np.float32)
  with warnings.catch_warnings():
    # No overload warning in this mode.
    warnings.filterwarnings("error", message="CompressionStats")
    history = model.fit(x, x, batch_size=32, epochs=2, verbose=0,
                        callbacks=[ndq_tf.keras.CompressionStats()])
  stats = strategy.compression_stats()
  assert history.history["fallback_fraction"][-1] == stats["fallback_fraction"]
  assert history.history["overload_rate"][-1] == stats["overload_rate"]
  if stats["nested_elements"] == 0:  # every bucket fell back: none counted
    assert stats["overload_rate"] == 0.0 and stats["overloads"] == 0
    assert stats["fallback_fraction"] == 1.0


def test_compression_stats_warns_once_about_frequent_overload():
  # Fixed mode, replicas' gradients far apart: Δ2 = κ is too small.
  strategy = MirroredStrategy(codec=_nested(), reference_codec=_reference(),
                              devices=_devices())
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(32)])
    model.compile("sgd", "mse")
  x = np.random.default_rng(0).normal(size=(128, 32)).astype(np.float32)
  with pytest.warns(RuntimeWarning, match="adaptive=True") as record:
    history = model.fit(x, x, batch_size=32, epochs=2, verbose=0,
                        callbacks=[ndq_tf.keras.CompressionStats()])
  assert min(history.history["overload_rate"]) > 0.01
  assert sum("overload" in str(w.message) for w in record) == 1


# -- Training ----------------------------------------------------------------------


def _fit_digits_steps(strategy, seed=1, steps=3):
  """`steps` steps of the digits recipe's model (tests/digits_recipe.py);
  checks that the replicas end bitwise identical and the loss finite."""
  x_train, _, y_train, _ = digits_recipe.load()
  model = digits_recipe.model(strategy, seed)
  history = model.fit(x_train[:128 * steps], y_train[:128 * steps],
                      batch_size=128, epochs=1, shuffle=False, verbose=0)
  for variable in model.variables:
    copies = [np.atleast_1d(c.numpy()).view(np.uint8)
              for c in variable.value.values]
    for c in copies[1:]:
      np.testing.assert_array_equal(copies[0], c, err_msg=variable.path)
  assert all(math.isfinite(v) for v in history.history["loss"])
  return strategy.compression_stats()


def test_digits_nested_half_reference_sends_a_fifth_fewer_bits():
  """NDQSG (3,3), half the replicas in P1, on the digits recipe's MLP.

  The fixed mode, whose nested senders send every bucket nested: with the
  reference senders' ~2.97 bits per element and the nested ones' ~1.66,
  all gradient bits (the small tensors' lossless ones too) are at most 0.8
  of DQSG M=3 on every replica, and the replicas stay bitwise identical.
  The accuracy over seeds, in the automatic mode, is a measurement: `make
  check-accuracy` (benchmarks/check_accuracy.py, nested_half) and
  benchmarks/nested_digits.py (docs/nested_digits.md).
  """
  dqsg = _fit_digits_steps(MirroredStrategy(codec=_reference(),
                                            devices=_devices()))
  nested = _fit_digits_steps(MirroredStrategy(
      codec=_nested(), reference_codec=_reference(), reference_group=2,
      devices=_devices()))
  assert nested["exchange_count"] == dqsg["exchange_count"] == 3
  assert nested["nested_elements"] > 0
  assert nested["sent_bits"] <= 0.8 * dqsg["sent_bits"], (nested, dqsg)
