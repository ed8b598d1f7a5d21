"""The reduce-scatter exchange (#18) inside one process, and its theory.

Real TensorFlow on 4 logical CPU devices (tests/conftest.py) under
`ndq_tf.MirroredStrategy(exchange="reduce_scatter")`: every replica is a
sender and the receiver of one shard. The multi-worker scenarios are in
integration/test_all_reduce_multi_worker.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf import theory
from ndq_tf.core import cost_model
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import fusion
from ndq_tf.core import nested_state
from ndq_tf.core import transports
from ndq_tf.core.exchanges import reduce_scatter
from ndq_tf.core.scope import compressed
from ndq_tf.distribute.mirrored import MirroredStrategy
from ndq_tf.distribute.options import CompressionOptions

NUM_REPLICAS = 4


def _devices():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  assert len(devices) >= NUM_REPLICAS, devices
  return devices[:NUM_REPLICAS]


def _bits(x):
  return np.asarray(x).view(np.uint32)


def _summer(strategy, values):
  """A function: `ctx.all_reduce("sum")` of replica `r`'s `values[r]`."""
  scale = tf.constant([1.0 + r for r in range(NUM_REPLICAS)])

  @tf.function
  def step():
    def fn():
      ctx = tf.distribute.get_replica_context()
      r = scale[ctx.replica_id_in_sync_group]
      with compressed():
        return ctx.all_reduce("sum", [v * r for v in values])
    return strategy.run(fn)

  return lambda: [strategy.experimental_local_results(t) for t in step()]


def _exchange(engine, values, devices):
  """One eager exchange of `values[r]` (lists of tensors) from replica `r`."""
  senders = []
  for r, device in enumerate(devices):
    with tf.device(device):
      senders.append(engine_lib.LocalSender(
          r, device, [tf.identity(v) for v in values[r]]))
  return engine.exchange(
      {"all_gather": transports.DeviceCopyTransport(devices),
       "reduce_scatter": transports.DeviceAllToAllTransport(devices)},
      senders, "sum")


@pytest.mark.parametrize("kwargs, match", [
    (dict(codec=ndq_tf.Float32Codec()), "must have a `bucket_size`"),
    (dict(codec="dqsg", reduce_scatter_levels=0), "reduce_scatter_levels"),
])
def test_refuses_what_it_cannot_take_naming_it(kwargs, match):
  with pytest.raises(ValueError, match=match):
    CompressionOptions(exchange="reduce_scatter", **kwargs)


def test_levels_option_round_trips_and_belongs_to_reduce_scatter():
  options = CompressionOptions("dqsg:num_levels=1", exchange="reduce_scatter",
                               reduce_scatter_levels=3)
  assert CompressionOptions.from_config(options.get_config()) == options
  assert reduce_scatter.stage2_codec(options).num_levels == 3
  # Default: the codec itself (a DitheredCodec keeps its levels).
  plain = CompressionOptions("dqsg:num_levels=2", exchange="reduce_scatter")
  assert reduce_scatter.stage2_codec(plain) is plain.codec
  assert "reduce_scatter_levels" not in plain.get_config()
  with pytest.raises(ValueError, match="only for exchange='reduce_scatter'"):
    CompressionOptions("dqsg", reduce_scatter_levels=2)


def test_shards_are_whole_buckets_some_empty():
  assert reduce_scatter.shard_buckets(3, 4) == [(0, 0), (0, 1), (1, 1),
                                                        (2, 1)]
  assert reduce_scatter.shard_buckets(8, 4) == [(0, 2), (2, 2), (4, 2),
                                                        (6, 2)]


def test_cost_model_is_flat_in_the_workers():
  """Ternary DQSG: ≤ 3.5 bits per element per worker up to 1024 workers
  with ternary re-quantization, ≤ 4.3 with the default two levels."""
  codec = ndq_tf.DitheredCodec(num_levels=1)
  ternary = reduce_scatter._stage2(codec, 1)
  default = reduce_scatter._stage2(codec)
  assert default.num_levels == reduce_scatter.MIN_STAGE2_LEVELS == 2
  n = 2**22
  for p in (2, 8, 64, 1024):
    # One shard of ⌈B/P⌉ buckets per row, both stages, 5-word headers.
    shard = -(-n // 512 // p) * 512
    words = codec.wire_bits(shard) // 32
    bits = reduce_scatter.reduce_scatter_bits(codec, n, p, stage2=ternary)
    assert bits == 32 * (p - 1) * 2 * (5 + words)
    assert bits / n <= 3.5
    bits = cost_model.exchange_bits(codec, n, p, "reduce_scatter")
    assert bits == 32 * (p - 1) * (
        10 + words + default.wire_bits(shard) // 32)
    assert bits / n <= 4.3
  # Nested codecs need a reference group decoded first.
  with pytest.raises(ValueError, match="nested codecs need side information"):
    cost_model.exchange_bits(ndq_tf.NestedDitheredCodec(), n, 4, "reduce_scatter")
  group = [codec, codec, ndq_tf.NestedDitheredCodec(coarse_ratio=3)] * 2
  shard = -(-n // 512 // 6) * 512
  w1 = max(c.wire_bits(shard) // 32 for c in group)
  assert cost_model.exchange_bits(group[:4], n, 4, "reduce_scatter") > 0
  assert cost_model.exchange_bits(group, n, 6, "reduce_scatter") == 32 * 5 * (
      10 + w1 + default.wire_bits(shard) // 32)


def test_replicas_end_bitwise_identical_with_the_models_bits():
  """Two tensors, 3 buckets for 4 replicas: one shard is empty."""
  strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=1),
                              devices=_devices(), min_elements=64,
                              exchange="reduce_scatter")
  rng = np.random.default_rng(3)
  base = [tf.constant(rng.normal(size=(1000,)), tf.float32),
          tf.constant(rng.normal(size=(30, 10)), tf.float32)]
  values = [[b * (1.0 + r) for b in base] for r in range(NUM_REPLICAS)]
  run = _summer(strategy, base)
  first = run()
  for replicas in first:
    for v in replicas[1:]:
      np.testing.assert_array_equal(_bits(replicas[0]), _bits(v))
  exact = [sum(v[k] for v in values) for k in range(2)]
  # Stage 1 errs by at most half a step of each sender's scale, stage 2 by
  # half a step of the sum's scale (at most the sum of theirs plus that).
  for k in range(2):
    kappa = sum(float(tf.reduce_max(tf.abs(v[k]))) for v in values)
    bound = kappa / 2 + (kappa * 1.5) / 2
    assert float(tf.reduce_max(tf.abs(first[k][0] - exact[k]))) <= bound
  second = run()
  assert not np.array_equal(first[0][0].numpy(), second[0][0].numpy())
  stats = strategy.compression_stats()
  assert stats["transport"] == "reduce_scatter"
  assert stats["exchange_count"] == 2
  assert stats["senders"] == stats["local_senders"] == NUM_REPLICAS
  codec = strategy.compressed_all_reduce.codec
  n = 1024 + 512
  # Every replica sends its 4 shard wires (one empty) and one reduced shard
  # (stage 2: two levels).
  shard_words = codec.wire_bits(512) // 32
  reduced_words = ndq_tf.DitheredCodec(num_levels=2).wire_bits(512) // 32
  assert stats["payload_bits"] == 32 * NUM_REPLICAS * 3 * shard_words + (
      32 * 3 * reduced_words)
  assert stats["sent_bits"] == stats["payload_bits"]  # Nothing framed.
  assert stats["model_link_bits"] == round(NUM_REPLICAS * cost_model.exchange_bits(
      codec, n, NUM_REPLICAS, "reduce_scatter"))
  assert stats["compressed_elements"] == 1300


@pytest.mark.parametrize("stage2_levels", [1, 4])
def test_sum_variance_matches_theory_within_3_percent(stage2_levels):
  """2^20 elements, 4 senders: `‖ĝ - Σg‖²` against the model.

  The model's stage-1 scales are the senders' bucket maxima; its stage-2
  scales are the maxima of the stage-1 sum, which this test decodes itself
  with the senders' seeds (stage 1's codes are the all-gather's). Eager
  calls of the engine over the replicas' devices (no tracing).
  """
  n = 2**20
  options = CompressionOptions(ndq_tf.DitheredCodec(num_levels=1), seed=11,
                               exchange="reduce_scatter",
                               reduce_scatter_levels=stage2_levels)
  engine = engine_lib.ExchangeEngine(options)
  rng = np.random.default_rng(7)
  common = rng.normal(size=n)
  values = [[tf.constant(common + rng.normal(size=n) * 0.5, tf.float32)]
            for _ in range(NUM_REPLICAS)]
  devices = _devices()
  results = _exchange(engine, values, devices)
  for r in results[1:]:
    np.testing.assert_array_equal(_bits(results[0][0]), _bits(r[0]))
  exact = np.sum([v[0].numpy().astype(np.float64) for v in values], axis=0)
  measured = float(np.sum((results[0][0].numpy().astype(np.float64)
                           - exact)**2))

  codec = options.codec
  d = codec.bucket_size
  plan = fusion.FusionPlan.from_tensors(values[0], d)
  seeds = [engine.seed(i, 0) for i in range(NUM_REPLICAS)]
  wires = [fusion.encode_fused(codec, v, s, plan) for v, s in zip(values,
                                                                   seeds)]
  stage1 = fusion.sum_senders(fusion.decode_senders(codec, wires, seeds, plan))
  scales1 = [np.abs(v[0].numpy()).reshape(-1, d).max(axis=1) for v in values]
  scales2 = np.abs(stage1.numpy()).reshape(-1, d).max(axis=1)
  expected = theory.reduce_scatter_total_mse(scales1, scales2, d, 1,
                                             stage2_levels)
  assert measured == pytest.approx(expected, rel=0.03)
  # The re-quantization is the price: more than the exact sum's stage 1.
  assert measured > theory.reduce_scatter_total_mse(scales1, [], d, 1, 1)


@pytest.mark.parametrize("codec", [
    ndq_tf.DitheredCodec(num_levels=3, bucket_size=64, rotation="hadamard"),
    ndq_tf.QSGDCodec(num_levels=2, bucket_size=64),
], ids=lambda c: type(c).__name__)
def test_other_bucketed_codecs_leave_identical_sums(codec):
  """Eager exchanges of 5 buckets among 4 replicas: the same bits on all.

  Stage 2 is a plain DQSG: a `DitheredCodec` keeps its levels (not its
  rotation), at least two; the others get two. Two steps, two dithers.
  """
  options = CompressionOptions(codec, exchange="reduce_scatter", seed=3)
  engine = engine_lib.ExchangeEngine(options)
  second = reduce_scatter.stage2_codec(options)
  assert type(second) is ndq_tf.DitheredCodec and second.rotation is None
  assert second.num_levels == (codec.num_levels if isinstance(
      codec, ndq_tf.DitheredCodec) else 2)
  rng = np.random.default_rng(5)
  values = [[tf.constant(rng.normal(size=(5, 64)), tf.float32)]
            for _ in range(NUM_REPLICAS)]
  exact = np.sum([v[0].numpy() for v in values], axis=0)
  devices = _devices()
  draws = []
  for _ in range(2):
    results = _exchange(engine, values, devices)
    for r in results[1:]:
      np.testing.assert_array_equal(_bits(results[0][0]), _bits(r[0]))
    draws.append(results[0][0].numpy())
    # Loose: QSGD with 2 levels alone errs by about 2x the norm here.
    assert np.linalg.norm(draws[-1] - exact) < 5 * np.linalg.norm(exact)
  assert not np.array_equal(draws[0], draws[1])


# -- Nested groups -------------------------------------------------------------


def _nested_options(transport, adaptive, rotation, d):
  return CompressionOptions(
      ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3, bucket_size=d,
                                 rotation=rotation),
      reference_codec=ndq_tf.DitheredCodec(num_levels=3, bucket_size=d),
      reference_group=2, adaptive=adaptive, exchange=transport, seed=13,
      min_elements=64)


def _correlated(step, shapes):
  """`g_p = c + 0.05·n_p` for every replica (lists of tensors)."""
  rng = np.random.default_rng(100 + step)
  common = [rng.normal(size=s) for s in shapes]
  return [[tf.constant(c + 0.05 * rng.normal(size=c.shape), tf.float32)
           for c in common] for _ in range(NUM_REPLICAS)]


_NESTED_STATS = ("overloads", "nested_elements", "overload_rate",
                 "overload_probability", "fallback_fraction")


@pytest.mark.parametrize("adaptive, rotation, shapes", [
    (False, None, ((13, 512), (300,))),   # 14 buckets: shards of 3 and 4
    (True, None, ((3, 512),)),            # 3: one empty, three of one
    (True, "hadamard", ((21, 64), (40,))),
], ids=["fixed", "adaptive", "adaptive-rotated"])
def test_nested_group_keeps_the_all_gathers_noise_state_bit_for_bit(
    adaptive, rotation, shapes):
  """Two DQSG reference replicas, two NDQSG ones; eager exchanges.

  Receiver `j` decodes the shards `j` with the all-gather's side
  information, so the nested senders' noise state (and the statistics in
  the telemetry) after every step is the all-gather's, bit for bit; in
  the adaptive mode the second step encodes with it (shards of one
  bucket: the codec's step must not depend on how many buckets it
  encodes at once). Every replica ends with bitwise the same sum.
  """
  d = 64 if rotation else 512
  devices = _devices()
  engines = {t: engine_lib.ExchangeEngine(_nested_options(t, adaptive,
                                                          rotation, d))
             for t in ("all_gather", "reduce_scatter")}
  for step in range(2 if adaptive else 1):
    values = _correlated(step, shapes)
    results = {t: _exchange(e, values, devices) for t, e in engines.items()}
    for r in results["reduce_scatter"][1:]:
      for a, b in zip(results["reduce_scatter"][0], r):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    (g_sig, (g_scale, g_gain)), = engines["all_gather"].nested_state.items()
    (r_sig, (r_scale, r_gain)), = engines["reduce_scatter"].nested_state.items()
    assert g_sig == r_sig
    np.testing.assert_array_equal(_bits(g_scale.numpy()),
                                  _bits(r_scale.numpy()))
    np.testing.assert_array_equal(_bits(g_gain.numpy()), _bits(r_gain.numpy()))
    assert np.all(np.isnan(r_scale.numpy()[:2]))  # The reference replicas.
    assert np.all(np.isfinite(r_scale.numpy()[2:]))
    stats = {t: e.stats() for t, e in engines.items()}
    assert stats["reduce_scatter"]["transport"] == "reduce_scatter"
    for key in _NESTED_STATS:
      np.testing.assert_equal(stats["reduce_scatter"][key],
                              stats["all_gather"][key], err_msg=key)
    # Both sums are near the exact one (the reduce-scatter's re-quantized
    # sum of correlated gradients errs by about 0.1-0.4 of its norm).
    exact = [sum(v[k].numpy() for v in values) for k in range(len(shapes))]
    for t in engines:
      err = sum(np.sum((r.numpy() - x)**2)
                for r, x in zip(results[t][0], exact))
      assert err < 0.5 * sum(np.sum(x**2) for x in exact), (t, err)
  if adaptive:  # The last steps encoded with the noise state: nested.
    assert stats["reduce_scatter"]["fallback_fraction"] < 0.5
  codecs = engines["reduce_scatter"].options.sender_codecs(NUM_REPLICAS)
  n = sum(-(-int(np.prod(s)) // d) * d for s in shapes)
  assert stats["reduce_scatter"]["model_link_bits"] == round(
      NUM_REPLICAS * cost_model.exchange_bits(codecs, n, NUM_REPLICAS,
                                          "reduce_scatter"))


@pytest.mark.parametrize("rotation", [None, "hadamard"])
def test_shard_statistics_add_up_to_the_whole_buffers(rotation):
  """What a worker counts over its own shard (multi-worker, fixed mode).

  The statistics of a nested sender over each shard alone
  (`sender_statistics(..., chunk=shard)`, a rotated codec's signs at the
  shard's place) add up to those over the whole buffer: the same counts,
  the same noise scale per bucket.
  """
  d = 64
  options = _nested_options("reduce_scatter", False, rotation, d)
  codecs = options.sender_codecs(NUM_REPLICAS)
  values = _correlated(0, ((21, 64), (40,)))
  plan = fusion.FusionPlan.from_tensors(values[0], d)
  base = tf.constant([13, engine_lib.SEED_TAG], tf.int32)
  seeds = [fusion.derive_seed(base, 0, s) for s in range(NUM_REPLICAS)]
  wires = [fusion.encode_fused(c, v, s, plan)
           for c, v, s in zip(codecs, values, seeds)]
  decoded, side = fusion.decode_senders(codecs, wires, seeds, plan,
                                        return_side_information=True)
  me = 3
  fused = plan.flatten(values[me])
  whole = nested_state.sender_statistics(codecs[me], wires[me], fused,
                                         side[me], decoded[me], plan,
                                         seed=seeds[me])
  parts = reduce_scatter.shards(plan, NUM_REPLICAS)
  scales = fusion.wire_scales(codecs[me], wires[me], plan)
  counted = {k: 0 for k in ("overloads", "nested_elements",
                            "fallback_buckets", "expected_overloads")}
  sigma = []
  for shard in parts:
    piece = slice(shard.start, shard.start + shard.length)
    mine = nested_state.sender_statistics(
        codecs[me], None, fused[piece], side[me][piece], decoded[me][piece],
        plan, scales=scales[shard.start // d:
                            (shard.start + shard.length) // d],
        seed=seeds[me], chunk=shard)
    for k in counted:
      counted[k] += mine[k].numpy()
    sigma.append(mine["noise_scale"].numpy())
  assert whole["nested_elements"].numpy() == counted["nested_elements"] > 0
  assert whole["overloads"].numpy() == counted["overloads"]
  assert whole["fallback_buckets"].numpy() == counted["fallback_buckets"]
  assert whole["expected_overloads"].numpy() == pytest.approx(
      counted["expected_overloads"], rel=1e-9)
  np.testing.assert_allclose(np.concatenate(sigma),
                             whole["noise_scale"].numpy(), rtol=1e-6)




def test_variable_length_shards_sum_alike_on_every_receiver():
  """ECDQ in both stages: each receiver decoding its copies of the used
  words (as on GPUs) gets the bits of the one decode in shared memory,
  and both count the words used."""
  codec = ndq_tf.EntropyCodedDitheredCodec(bits=1.0, bucket_size=64)
  options = CompressionOptions(codec, exchange="reduce_scatter",
                               min_elements=1, seed=3)
  assert reduce_scatter.stage2_codec(options) is options.codec
  devices = _devices()
  rng = np.random.default_rng(2)
  values = [[tf.constant(rng.normal(size=(40, 30)).astype(np.float32))]
            for _ in devices]
  results, stats = [], []
  for shared_memory in (True, False):
    engine = engine_lib.ExchangeEngine(options)
    scatter = transports.DeviceAllToAllTransport(devices)
    scatter.shared_memory = scatter.gather.shared_memory = shared_memory
    senders = [engine_lib.LocalSender(r, d, v)
               for r, (d, v) in enumerate(zip(devices, values))]
    results.append(engine.exchange(
        {"all_gather": transports.DeviceCopyTransport(devices),
         "reduce_scatter": scatter}, senders, "sum"))
    stats.append(engine.stats())
  for receiver in results[1]:
    np.testing.assert_array_equal(_bits(receiver[0]), _bits(results[0][0][0]))
  assert stats[0] == stats[1]
  assert stats[0]["transport"] == "reduce_scatter"
  # Stage 1's 4 shards per sender and stage 2's 4 reduced shards, at about
  # 1 bit per element: far below their static worst case.
  assert 0 < stats[0]["payload_bits"] < 8 * codec.max_wire_bits(1216 // 4) / 4
  assert stats[0]["sent_bits"] == stats[0]["payload_bits"]
