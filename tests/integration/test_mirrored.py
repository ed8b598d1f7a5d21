"""Tests of CompressedAllReduce and ndq_tf.MirroredStrategy.

Real TensorFlow on 4 logical CPU devices (split by tests/conftest.py). The
training tests (model.fit, accuracy, resume, loss scaling) are in
test_mirrored_training.py. Only gradient aggregation is compressed by
default (test_gradient_only.py); the all-reduces these tests make themselves
are built inside `compressed()`.
"""

import copy
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
import ndq_tf.keras
from ndq_tf.core.scope import compressed
from ndq_tf.core.scope import uncompressed
from ndq_tf.distribute.cross_device_ops import CompressedAllReduce
from ndq_tf.distribute.mirrored import MirroredStrategy

NUM_REPLICAS = 4
M = 3  # DitheredCodec(num_levels=3): 7 levels, step 1/3.


def _devices():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  assert len(devices) >= NUM_REPLICAS, devices
  return devices[:NUM_REPLICAS]


def _bits(x):
  x = np.asarray(x)
  return x.view(np.uint8 if x.dtype.itemsize == 1 else
                {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def _assert_bitwise_equal(values):
  first = _bits(values[0].numpy())
  for v in values[1:]:
    np.testing.assert_array_equal(first, _bits(v.numpy()))


def _local(strategy, value):
  return strategy.experimental_local_results(value)


def _replica_values(strategy, fn):
  """PerReplica value with `fn(replica_id)` on every replica."""
  return strategy.experimental_distribute_values_from_function(
      lambda ctx: fn(ctx.replica_id_in_sync_group))


# -- CompressedAllReduce -------------------------------------------------------


class TestCompressedAllReduce:

  def test_config_round_trips(self):
    ops = CompressedAllReduce(ndq_tf.DitheredCodec(num_levels=2),
                              min_elements=7, seed=3,
                              compress_indexed_slices=True)
    back = CompressedAllReduce.from_config(ops.get_config())
    assert back.get_config() == ops.get_config()
    assert back.codec == ops.codec

  def test_config_refuses_a_custom_fallback(self):
    ops = CompressedAllReduce(ndq_tf.DitheredCodec(),
                              fallback=tf.distribute.ReductionToOneDevice())
    with pytest.raises(NotImplementedError, match="fallback"):
      ops.get_config()

  def test_codec_can_be_a_spec_string(self):
    ops = CompressedAllReduce("dqsg:num_levels=2")
    assert ops.codec == ndq_tf.DitheredCodec(num_levels=2)

  @pytest.mark.parametrize("kwargs, error, match", [
      ({"codec": 3}, TypeError, "codec"),
      ({"codec": "nonsense"}, ValueError, "nonsense"),
      ({"min_elements": 0}, ValueError, "min_elements"),
      ({"seed": 2**40}, ValueError, "seed"),
      ({"fallback": 3}, TypeError, "fallback"),
  ])
  def test_invalid_arguments_name_the_argument(self, kwargs, error, match):
    kwargs.setdefault("codec", ndq_tf.DitheredCodec())
    with pytest.raises(error, match=match):
      CompressedAllReduce(**kwargs)

  def test_nested_codec_alone_is_refused(self):
    with pytest.raises(ValueError, match="side information"):
      CompressedAllReduce(ndq_tf.NestedDitheredCodec())

  def test_creation_inside_a_strategy_scope_raises(self):
    strategy = tf.distribute.MirroredStrategy(_devices())
    with strategy.scope(), pytest.raises(ValueError, match="outside"):
      CompressedAllReduce(ndq_tf.DitheredCodec())

  def test_step_is_a_plain_host_variable_and_deepcopy_shares_it(self):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(),
                                devices=_devices())
    ops = strategy.compressed_all_reduce
    assert type(ops.step).__name__ == "ResourceVariable"
    assert "CPU:0" in ops.step.device
    assert copy.deepcopy(ops) is ops

  @pytest.mark.parametrize("transport", ["all_gather", "all_reduce"])
  def test_all_reduce_is_bitwise_identical_on_every_replica(self, transport):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=M),
                                devices=_devices(), min_elements=64,
                                exchange=transport)
    ops = strategy.compressed_all_reduce
    rng = np.random.default_rng(1)
    base = tf.constant(rng.normal(size=(1000,)), tf.float32)

    @tf.function
    def step():
      def fn():
        ctx = tf.distribute.get_replica_context()
        r = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
        with compressed():
          return ctx.all_reduce("sum", base * (1.0 + r))
      return strategy.run(fn)

    first = _local(strategy, step())
    _assert_bitwise_equal(first)
    exact = base * 10.0
    if transport == "all_gather":
      # Each replica's error is at most half a step of its own scale.
      bound = sum(float(tf.reduce_max(tf.abs(base))) * (1 + r)
                  for r in range(NUM_REPLICAS)) / (2 * M)
    else:
      # Every replica quantizes with the largest scale (the last replica's).
      bound = (NUM_REPLICAS * float(tf.reduce_max(tf.abs(base)))
               * NUM_REPLICAS / (2 * M))
    assert float(tf.reduce_max(tf.abs(first[0] - exact))) <= bound * 1.0001
    assert int(ops.step.numpy()) == 1
    second = _local(strategy, step())
    _assert_bitwise_equal(second)
    assert int(ops.step.numpy()) == 2
    # A new step draws a new dither.
    assert not np.array_equal(first[0].numpy(), second[0].numpy())
    stats = strategy.compression_stats()
    assert stats["exchange_count"] == 2
    assert stats["transport"] == transport
    assert stats["senders"] == stats["local_senders"] == NUM_REPLICAS
    if transport == "all_gather":
      assert stats["payload_bits"] == NUM_REPLICAS * ops.codec.wire_bits(1024)
    else:
      layout = ndq_tf.ops.lane_layout(2 * M + 1, NUM_REPLICAS, 1024)
      assert stats["payload_bits"] == NUM_REPLICAS * (
          layout.wire_bits + 32 * ops.codec.num_scales(1024))
    assert stats["sent_bits"] == stats["payload_bits"]  # nothing lossless
    assert stats["model_link_bits"] == round(
        NUM_REPLICAS * ndq_tf.core.cost_model.exchange_bits(ops.codec, 1024,
                                                   NUM_REPLICAS, transport))
    # The float32 bits of the same elements: 1000 per replica.
    assert stats["compressed_elements"] == 1000
    assert stats["lossless_elements"] == 0
    assert stats["compression_ratio"] == pytest.approx(
        NUM_REPLICAS * 32 * 1000 / stats["sent_bits"])

  def test_stock_mirrored_strategy_accepts_it(self):
    ops = CompressedAllReduce(ndq_tf.DitheredCodec(num_levels=M),
                              min_elements=16)
    strategy = tf.distribute.MirroredStrategy(_devices(),
                                              cross_device_ops=ops)
    value = _replica_values(
        strategy, lambda r: tf.fill([64], tf.cast(r + 1, tf.float32)))
    # It cannot tell gradients apart: only compressed() scopes compress.
    exact = strategy.extended.batch_reduce_to("mean", [(value, value)])[0]
    for e in _local(strategy, exact):
      np.testing.assert_array_equal(e.numpy(), np.full([64], 2.5))
    assert int(ops.step.numpy()) == 0
    with compressed():
      out = strategy.extended.batch_reduce_to("mean", [(value, value)])[0]
    _assert_bitwise_equal(_local(strategy, out))
    assert int(ops.step.numpy()) == 1
    assert ndq_tf.keras.callbacks.find_engine(strategy) is ops.engine

  def test_uncompressed_scope_opts_a_replica_all_reduce_out(self):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=1),
                                devices=_devices(), min_elements=16)
    ops = strategy.compressed_all_reduce
    x = tf.constant(np.arange(512) / 7.0, tf.float32)

    @tf.function
    def step():
      def fn():
        ctx = tf.distribute.get_replica_context()
        x_r = x * tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
        with compressed():
          with uncompressed():  # the innermost scope wins
            exact = ctx.all_reduce("sum", x_r)
          approx = ctx.all_reduce("sum", x_r)
        return exact, approx
      return strategy.run(fn)

    exact, approx = step()
    expected = tf.add_n([x * float(r + 1) for r in range(NUM_REPLICAS)])
    for e in _local(strategy, exact):
      np.testing.assert_array_equal(e.numpy(), expected.numpy())
    assert not np.array_equal(_local(strategy, approx)[0].numpy(),
                              expected.numpy())
    assert int(ops.step.numpy()) == 1  # only the compressed call counts

  def test_one_call_mixing_lossless_and_compressed_values(self):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=M),
                                devices=_devices())
    ops = strategy.compressed_all_reduce
    rng = np.random.default_rng(2)
    kernels = [tf.constant(rng.normal(size=(64, 32)), tf.float32)
               for _ in range(NUM_REPLICAS)]
    counter = tf.constant(2**40 + 5, tf.int64)

    def slices(r):
      return tf.IndexedSlices(
          values=tf.fill([2, 8], tf.cast(r + 1, tf.float32)),
          indices=tf.stack([r, r + 1]),
          dense_shape=tf.constant([10, 8], tf.int64))

    @tf.function
    def step():
      values = [
          _replica_values(strategy,
                          lambda r: tf.cast(r + 1, tf.float32) / 3.0),
          _replica_values(strategy,
                          lambda r: tf.fill([5], tf.cast(r, tf.float32))),
          _replica_values(strategy, lambda r: tf.gather(kernels, r)),
          _replica_values(strategy, lambda r: tf.cast(r, tf.int64) * 2**33),
          _replica_values(strategy, slices),
      ]
      with compressed():
        reduced = strategy.extended.batch_reduce_to(
            "sum", [(v, v) for v in values])
      # What the optimizer's int64 step goes through: our broadcast hook.
      broadcast = ops.broadcast(counter, values[2])
      return reduced, broadcast

    with strategy.scope():
      out = step()
    (scalar, bias, kernel, big_int, sparse), broadcast = out
    for b in _local(strategy, broadcast):
      assert b.dtype == tf.int64 and int(b.numpy()) == 2**40 + 5
    exact_scalar = tf.add_n([tf.constant(r + 1.0) / 3.0
                             for r in range(NUM_REPLICAS)])
    for s in _local(strategy, scalar):
      assert s.numpy() == exact_scalar.numpy()
    for b in _local(strategy, bias):
      np.testing.assert_array_equal(b.numpy(), np.full([5], 6.0))
    for i in _local(strategy, big_int):
      assert i.dtype == tf.int64 and int(i.numpy()) == 6 * 2**33
    dense = np.zeros([10, 8], np.float32)
    for r in range(NUM_REPLICAS):
      dense[r] += r + 1
      dense[r + 1] += r + 1
    for s in _local(strategy, sparse):
      np.testing.assert_array_equal(tf.convert_to_tensor(s).numpy(), dense)
    results = _local(strategy, kernel)
    _assert_bitwise_equal(results)
    exact = tf.add_n(kernels)
    bound = sum(float(tf.reduce_max(tf.abs(k))) for k in kernels) / (2 * M)
    assert float(tf.reduce_max(tf.abs(results[0] - exact))) <= bound * 1.0001
    stats = ops.stats()
    assert stats["compressed_elements"] == 64 * 32
    # Scalar, bias, int64 and the sparse values (2 x 8) went losslessly.
    assert stats["lossless_elements"] == 1 + 5 + 1 + 2 * 8
    assert int(ops.step.numpy()) == 1

  def test_indexed_slices_can_be_compressed(self):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=M),
                                devices=_devices(), min_elements=16,
                                compress_indexed_slices=True)
    ops = strategy.compressed_all_reduce

    def slices(r):
      return tf.IndexedSlices(
          values=tf.fill([2, 8], tf.cast(r + 1, tf.float32)),
          indices=tf.stack([r, r + 1]),
          dense_shape=tf.constant([10, 8], tf.int64))

    @tf.function
    def step():
      v = _replica_values(strategy, slices)
      with compressed():
        return strategy.extended.batch_reduce_to("sum", [(v, v)])[0]

    results = _local(strategy, step())
    _assert_bitwise_equal(results)
    assert ops.stats()["compressed_elements"] == 80
    assert results[0].shape == [10, 8]

  def test_nan_on_one_replica_reaches_every_replica(self):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=M),
                                devices=_devices(), min_elements=16)
    ops = strategy.compressed_all_reduce
    x = tf.ones([2048])

    @tf.function
    def step():
      def fn():
        ctx = tf.distribute.get_replica_context()
        bad = tf.equal(ctx.replica_id_in_sync_group, 1)
        g = tf.tensor_scatter_nd_update(
            x, [[700]], tf.where(bad, math.nan, 1.0)[None])
        with compressed():
          return ctx.all_reduce("sum", g)
      return strategy.run(fn)

    results = _local(strategy, step())
    assert int(ops.step.numpy()) == 1  # it went through the codec
    for r in results:
      values = r.numpy()
      assert np.isnan(values[700])            # the poisoned bucket
      assert np.isfinite(values[:512]).all()  # other buckets intact

  def test_run_refuses_a_jit_compiled_replica_function(self):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=M),
                                devices=_devices(), min_elements=16,
                                exchange="all_gather")
    ops = strategy.compressed_all_reduce
    x = tf.ones([64])

    def fn():
      ctx = tf.distribute.get_replica_context()
      r = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
      with compressed():
        return ctx.all_reduce("sum", x * (1.0 + r))

    with pytest.raises(ValueError, match="cannot compress under XLA"):
      strategy.run(tf.function(fn, jit_compile=True))
    # `run` called while an XLA-compiled function is traced: refused too.
    outer = tf.function(lambda: strategy.run(fn), jit_compile=True)
    with pytest.raises(ValueError, match="cannot compress under XLA"):
      outer()
    assert int(ops.step.numpy()) == 0  # nothing ran
    # Without XLA the same replica function is compressed.
    out = _local(strategy, strategy.run(tf.function(fn)))
    _assert_bitwise_equal(out)
    assert int(ops.step.numpy()) == 1
    bound = sum(1.0 + r for r in range(NUM_REPLICAS)) / (2 * M)
    assert float(tf.reduce_max(tf.abs(out[0] - 10.0 * x))) <= bound * 1.0001


class TestMirroredStrategy:

  def test_works_as_a_tf_mirrored_strategy(self):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(),
                                devices=_devices(), seed=4)
    assert strategy.num_replicas_in_sync == NUM_REPLICAS
    assert strategy.compressed_all_reduce.seed == 4

    def local(devices):  # (type, index): job and task names vary.
      return [(tf.DeviceSpec.from_string(d).device_type,
               tf.DeviceSpec.from_string(d).device_index) for d in devices]

    # The stock strategy API: variables mirrored on every device, `run` on
    # every replica, lossless `reduce` (scalars are never compressed).
    assert local(strategy.extended.worker_devices) == local(_devices())
    with strategy.scope():
      v = tf.Variable(2.0)
    assert local(c.device for c in strategy.experimental_local_results(v)) == (
        local(_devices()))
    ids = strategy.run(lambda: tf.cast(
        tf.distribute.get_replica_context().replica_id_in_sync_group,
        tf.float32))
    assert float(strategy.reduce("sum", ids, axis=None)) == sum(
        range(NUM_REPLICAS))
    assert int(strategy.compression_step.numpy()) == 0

  def test_needs_exactly_one_of_codec_and_cross_device_ops(self):
    with pytest.raises(ValueError, match="codec"):
      MirroredStrategy(devices=_devices())
    ops = CompressedAllReduce(ndq_tf.DitheredCodec())
    with pytest.raises(ValueError, match="not both"):
      MirroredStrategy(codec=ndq_tf.DitheredCodec(), devices=_devices(),
                       cross_device_ops=ops)
    with pytest.raises(TypeError, match="CompressedAllReduce"):
      MirroredStrategy(devices=_devices(),
                       cross_device_ops=tf.distribute.ReductionToOneDevice())

  def test_step_counter_is_saved_with_checkpoint_and_weights(self, tmp_path):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(),
                                devices=_devices())
    ops = strategy.compressed_all_reduce
    with strategy.scope():
      model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    ops.step.assign(17)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert any("_distribute_strategy/compression/step" in n
               for n in names), names
    model.save_weights(str(tmp_path / "m.weights.h5"))
    ops.step.assign(0)
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    assert int(ops.step.numpy()) == 17
    ops.step.assign(0)
    model.load_weights(str(tmp_path / "m.weights.h5"))
    assert int(ops.step.numpy()) == 17


class TestCompressionStats:

  def _fit(self, min_elements, callbacks):
    strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=1),
                                devices=_devices(), min_elements=min_elements)
    keras.utils.set_random_seed(0)
    with strategy.scope():
      model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(32)])
      model.compile("sgd", "mse")
    x = np.ones((64, 32), np.float32)
    return strategy, model.fit(x, x, batch_size=32, epochs=1, verbose=0,
                               callbacks=callbacks)

  def test_adds_bits_and_ratio_to_the_logs(self):
    strategy, history = self._fit(64, [ndq_tf.keras.CompressionStats()])
    ops = strategy.compressed_all_reduce
    # 1024 kernel elements in 2 ternary buckets, 32 bias elements lossless.
    expected = (ops.codec.wire_bits(1024) + 32 * 32) / 1056
    assert history.history["sent_bits_per_element"] == [
        pytest.approx(expected)]
    assert history.history["compression_ratio"] == [
        pytest.approx(32 / expected)]
    assert "overload_rate" not in history.history  # nested codecs only

  def test_warns_when_nothing_was_compressed(self):
    with pytest.warns(RuntimeWarning, match="min_elements"):
      _, history = self._fit(10**6, [ndq_tf.keras.CompressionStats()])
    assert history.history["compression_ratio"] == [1.0]

  def test_needs_a_compressed_strategy(self):
    with tf.distribute.MirroredStrategy(_devices()).scope():
      model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
      model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="CompressedAllReduce"):
      model.fit(np.ones((8, 2)), np.ones((8, 2)), verbose=0,
                callbacks=[ndq_tf.keras.CompressionStats()])


def test_keras_objects_round_trip_through_their_configs():
  opt = ndq_tf.keras.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                        initial_scale=64.0)
  back = keras.saving.deserialize_keras_object(
      keras.saving.serialize_keras_object(opt))
  assert type(back) is ndq_tf.keras.LossScaleOptimizer
  assert back.get_config() == opt.get_config()
  stats = ndq_tf.keras.CompressionStats(prefix="ndq_")
  back = ndq_tf.keras.CompressionStats.from_config(stats.get_config())
  assert back.get_config() == {"prefix": "ndq_"}
