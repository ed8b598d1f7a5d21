"""The integer all-reduce transport (issue #11) inside one process.

`ndq_tf.MirroredStrategy(exchange="all_reduce")` on 4 logical CPU devices:
the strategy's result is, bit for bit, what the public codec API computes
from the same seeds (shared scales, symbols summed in lanes, one decode of
the sum); every replica gets the same bits; a bucket with a NaN decodes to
NaN and corrupts no other; float32 values (and BFloat16Codec's bfloat16
ones, in float32) summed by the float path equal the all-gather's; `"auto"` picks what the cost model says and logs it once; and
the options refuse what cannot be summed. Real processes:
tests/integration/test_all_reduce_multi_worker.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf import ops
from ndq_tf.core import cost_model
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import fusion
from ndq_tf.distribute import options as options_lib

NUM_REPLICAS = 4
SEED = 7


def _devices():
  return [d.name for d in tf.config.list_logical_devices("CPU")[:NUM_REPLICAS]]


def _gradients(n, seed=0):
  """Different gradients per replica, scales spread over replicas."""
  rng = np.random.default_rng(seed)
  spread = np.exp(rng.uniform(-1.5, 1.5, size=[NUM_REPLICAS, 1]))
  return (rng.standard_normal([NUM_REPLICAS, n]) * spread).astype(np.float32)


def _reduce(strategy, grads, reduce_op="sum"):
  """One compressed batch_reduce of the replicas' rows; per-replica numpy."""
  values = strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(grads[ctx.replica_id_in_sync_group]))
  with ndq_tf.distribute.compressed():
    (out,) = strategy.extended.batch_reduce_to(reduce_op, [(values, values)])
  return [v.numpy() for v in out.values]


def _expected(codec, grads, step):
  """The decoded sum by the public codec API, from the engine's seeds."""
  n = grads.shape[1]
  base = tf.constant([SEED, engine_lib.SEED_TAG], tf.int32)
  seeds = [ops.fold_seed(fusion.derive_seed(base, step, k), 0)
           for k in range(NUM_REPLICAS)]
  flats = [tf.constant(g) for g in grads]
  scales = tf.reduce_max(tf.stack([codec.bucket_scales(x) for x in flats]),
                         axis=0)
  layout = ops.lane_layout(codec.alphabet_size, NUM_REPLICAS, n)
  words = tf.reduce_sum(tf.stack([
      ops.pack_lanes(codec.encode_symbols(x, s, scales), layout)
      for x, s in zip(flats, seeds)]), axis=0)
  total = ops.unpack_lanes(words, layout)
  assert np.array_equal(total.numpy(), np.sum(
      [codec.encode_symbols(x, s, scales).numpy().astype(np.int64)
       for x, s in zip(flats, seeds)], axis=0))  # the lanes sum exactly
  return codec.decode_symbol_sum(total, scales, tf.stack(seeds)).numpy()


def _assert_identical(values):
  for v in values[1:]:
    np.testing.assert_array_equal(v, values[0])


@pytest.mark.parametrize("spec", [
    "dqsg:num_levels=1", "dqsg:num_levels=3,bucket_size=128",
    "half_dithered:num_levels=2,dither_order=3", "terngrad", "qsgd:num_levels=2"])
def test_strategy_result_is_the_codec_api_sum_bit_for_bit(spec):
  codec = ndq_tf.codecs.get(spec)
  strategy = ndq_tf.MirroredStrategy(codec=codec, devices=_devices(),
                                     exchange="all_reduce", seed=SEED)
  n = 4 * codec.bucket_size
  for step in range(2):
    grads = _gradients(n, seed=step)
    got = _reduce(strategy, grads)
    _assert_identical(got)
    np.testing.assert_array_equal(got[0], _expected(codec, grads, step))
  stats = strategy.compression_stats()
  assert stats["transport"] == "all_reduce"
  assert stats["exchange_count"] == 2
  layout = ops.lane_layout(codec.alphabet_size, NUM_REPLICAS, n)
  assert stats["payload_bits"] == NUM_REPLICAS * (
      layout.wire_bits + 32 * codec.num_scales(n))
  assert stats["model_link_bits"] == round(
      NUM_REPLICAS * cost_model.exchange_bits(codec, n, NUM_REPLICAS, "all_reduce"))


def test_mean_divides_the_decoded_sum_by_the_replicas():
  codec = ndq_tf.DitheredCodec(num_levels=2)
  grads = _gradients(1024, seed=5)
  total = _reduce(ndq_tf.MirroredStrategy(codec=codec, devices=_devices(),
                                          exchange="all_reduce", seed=SEED),
                  grads)
  mean = _reduce(ndq_tf.MirroredStrategy(codec=codec, devices=_devices(),
                                         exchange="all_reduce", seed=SEED),
                 grads, "mean")
  np.testing.assert_array_equal(mean[0], total[0] / np.float32(NUM_REPLICAS))


@pytest.mark.parametrize("spec", ["dqsg:num_levels=1", "terngrad", "qsgd"])
def test_a_nan_bucket_decodes_to_nan_and_spares_the_others(spec):
  codec = ndq_tf.codecs.get(spec)
  d = codec.bucket_size
  grads = _gradients(4 * d, seed=3)
  grads[2, d + 5] = np.nan  # replica 2, bucket 1
  grads[1, 3 * d] = np.inf  # replica 1, bucket 3
  got = _reduce(ndq_tf.MirroredStrategy(codec=codec, devices=_devices(),
                                        exchange="all_reduce", seed=SEED),
                grads)
  _assert_identical(got)
  assert np.isnan(got[0][d:2 * d]).all() and np.isnan(got[0][3 * d:]).all()
  # The other buckets: exactly what the same exchange without the bad values
  # gives (a NaN symbol would have spilled into neighbouring lanes).
  clean = grads.copy()
  clean[2, d + 5] = clean[1, 3 * d] = 0.0
  want = _expected(codec, clean, 0)
  for b in (0, 2):
    np.testing.assert_array_equal(got[0][b * d:(b + 1) * d],
                                  want[b * d:(b + 1) * d])


@pytest.mark.parametrize("transport", ["all_gather", "all_reduce"])
@pytest.mark.parametrize("spec,rounded", [("float32", tf.float32),
                                          ("bfloat16", tf.bfloat16)])
def test_float32_sums_equal_on_both_transports(transport, spec, rounded):
  # BFloat16Codec's values, rounded to bfloat16, are summed in float32 by
  # either exchange.
  grads = _gradients(3000, seed=9)
  got = _reduce(ndq_tf.MirroredStrategy(codec=spec, devices=_devices(),
                                        exchange=transport), grads)
  _assert_identical(got)
  values = tf.cast(tf.cast(tf.constant(grads), rounded), tf.float32)
  want = tf.reduce_sum(values, axis=0).numpy()
  np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("spec,rounded,summed", [
    ("float16", tf.float16, tf.float16),
    # TF's NCCL all-reduce takes no bfloat16: its values go through the
    # float32 ring, 32 bits each on the wire, and are counted so.
    ("bfloat16", tf.bfloat16, tf.float32)])
def test_float16_sums_the_half_precision_values(spec, rounded, summed):
  grads = _gradients(3000, seed=10)
  strategy = ndq_tf.MirroredStrategy(codec=spec, devices=_devices(),
                                     exchange="all_reduce")
  got = _reduce(strategy, grads)
  _assert_identical(got)
  values = tf.cast(tf.cast(grads, rounded), summed)
  want = tf.cast(tf.reduce_sum(values, axis=0), tf.float32).numpy()
  np.testing.assert_array_equal(got[0], want)
  stats = strategy.compression_stats()
  width = summed.size * 8
  assert stats["payload_bits"] == NUM_REPLICAS * width * 3000
  assert stats["link_compression_ratio"] == pytest.approx(32 / width)
  assert stats["model_link_bits"] == round(NUM_REPLICAS * (
      cost_model.exchange_bits(ndq_tf.codecs.get(spec), 3000, NUM_REPLICAS,
                               "all_reduce")))


@pytest.mark.parametrize("spec,elements", [
    ("dqsg:num_levels=1", 1 << 14), ("dqsg:num_levels=3", 1 << 14),
    ("float16", 4096), ("bfloat16", 4096)])
def test_auto_picks_what_the_cost_model_predicts_and_logs_it_once(
    spec, elements, caplog):
  codec = ndq_tf.codecs.get(spec)
  # Logical CPUs of one process: one memory, no bits on a link.
  want = cost_model.auto(codec, elements, NUM_REPLICAS,
                               shared_memory=True)
  strategy = ndq_tf.MirroredStrategy(codec=codec, devices=_devices())
  assert strategy.compression_stats()["transport"] == "auto"
  engine_lib._WARNED.clear()  # pylint: disable=protected-access
  with caplog.at_level("WARNING"):  # shown at the default verbosity
    for step in range(2):
      _reduce(strategy, _gradients(elements, seed=step))
  assert strategy.compression_stats()["transport"] == want
  notes = [r for r in caplog.records if "exchange='auto'" in r.getMessage()]
  assert len(notes) == 1, [r.getMessage() for r in caplog.records]
  assert repr(want) in notes[0].getMessage()


def test_shared_memory_gathers_codes_and_sums_float16():
  # The time model's choices the test above relies on, spelled out: in one
  # memory nothing crosses a link and the all-gather decodes least; float16
  # values need no decode at all in TF's float ring.
  n = 1 << 14
  for codec in (ndq_tf.DitheredCodec(1), ndq_tf.DitheredCodec(3)):
    for p in (4, 8):
      assert cost_model.auto(codec, n, p, shared_memory=True) == (
          "all_gather")
  for codec in (ndq_tf.Float16Codec(), ndq_tf.BFloat16Codec()):
    assert cost_model.auto(codec, 4096, 4, shared_memory=True) == (
        "all_reduce")


def test_model_fit_keeps_mirrored_variables_bitwise_identical():
  strategy = ndq_tf.MirroredStrategy(codec="dqsg:num_levels=1",
                                     devices=_devices(),
                                     exchange="all_reduce")
  rng = np.random.default_rng(0)
  x = rng.normal(size=(512, 32)).astype(np.float32)
  y = (x[:, :4].sum(axis=1) > 0).astype(np.int64)
  with strategy.scope():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((32,)),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  stats_callback = ndq_tf.CompressionStats()
  history = model.fit(x, y, batch_size=64, epochs=3, verbose=0,
                      callbacks=[stats_callback])
  assert stats_callback.transport == "all_reduce"
  # 4 senders: a float32 ring carries 1.5·32 bits per element.
  link = history.history["link_compression_ratio"][-1]
  assert link == pytest.approx(strategy.compression_stats()[
      "link_compression_ratio"])
  assert 1.5 * 32 / link == pytest.approx(
      strategy.compression_stats()["model_link_bits"] / (
          NUM_REPLICAS * (32 * 64 + 64 + 64 * 2 + 2)))
  losses = history.history["loss"]
  assert losses[-1] < losses[0]
  for variable in model.weights:
    copies = strategy.experimental_local_results(variable.value)
    assert len(copies) == NUM_REPLICAS
    _assert_identical([v.numpy() for v in copies])
  stats = strategy.compression_stats()
  assert stats["transport"] == "all_reduce"
  assert stats["exchange_count"] == 3 * 8


def test_all_reduce_refuses_nested_codecs_saying_why():
  with pytest.raises(ValueError, match="residues.*all_gather"):
    ndq_tf.CompressedAllReduce(
        ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3),
        reference_codec=ndq_tf.DitheredCodec(num_levels=3),
        exchange="all_reduce")


def test_unknown_transport_names_the_choices():
  with pytest.raises(ValueError, match=r"`exchange` must be one of 'auto', "
                     r"'all_gather', 'all_reduce', 'reduce_scatter'. "
                     r"Received: exchange='ring'"):
    ndq_tf.MirroredStrategy(codec="dqsg", devices=_devices(),
                            exchange="ring")


@pytest.mark.parametrize("transport", options_lib.EXCHANGES)
def test_transport_round_trips_through_the_config(transport):
  ops_ = ndq_tf.CompressedAllReduce("terngrad", exchange=transport)
  assert ops_.exchange == transport
  config = ops_.get_config()
  assert config["transport"] == transport
  assert ndq_tf.CompressedAllReduce.from_config(config).options == ops_.options
