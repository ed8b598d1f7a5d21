"""PowerSGD (`ndq_tf.PowerSGD`) in ndq_tf.MirroredStrategy and TF's own loop.

Real TensorFlow and Keras on 4 logical CPU devices (tests/conftest.py):
model.fit keeps the replicas bitwise identical, a checkpoint restored into
a new strategy continues bitwise, and TF's low-level `batch_reduce_to`
loop is compressed too.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
import ndq_tf.keras
from ndq_tf.distribute.cross_device_ops import CompressedAllReduce
from ndq_tf.distribute.mirrored import MirroredStrategy

NUM_REPLICAS = 4
STEPS, BATCH = 8, 32
# Float codecs: no XLA-compiled decode to wait for (the dithered factors
# are tested in tests/core/test_low_rank.py).
CONFIG = ndq_tf.PowerSGD(rank=2, factor_codec="float16",
                         fallback_codec="float32", start_step=3)


def _devices():
  return [d.name for d in tf.config.list_logical_devices("CPU")
          ][:NUM_REPLICAS]


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(STEPS * BATCH, 24)).astype("float32")
  y = rng.integers(0, 5, size=(STEPS * BATCH,))
  return x, y


def _model(strategy):
  keras.utils.set_random_seed(1)
  with strategy.scope():
    model = keras.Sequential([keras.Input((24,)),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(5)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def _bits(variable):
  v = variable.value if isinstance(variable, keras.Variable) else variable
  return [np.atleast_1d(c.numpy()).view(np.uint8)
          for c in (getattr(v, "values", None) or (v,))]


def _fit(model, x, y, **kwargs):
  return model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                   verbose=0, **kwargs)


def test_fit_keeps_replicas_identical_and_a_restore_continues_bitwise(
    tmp_path):
  x, y = _data()
  strategy = MirroredStrategy(codec=CONFIG, devices=_devices(),
                              min_elements=64)
  model = _model(strategy)
  # Interrupted after 5 steps (3 warm-up, 2 low rank), saved, continued.
  _fit(model, x[:5 * BATCH], y[:5 * BATCH])
  path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
      str(tmp_path / "ckpt"))
  history = _fit(model, x[5 * BATCH:], y[5 * BATCH:],
                 callbacks=[ndq_tf.keras.CompressionStats()])
  for variable in model.variables + model.optimizer.variables:
    copies = _bits(variable)
    for c in copies[1:]:
      np.testing.assert_array_equal(copies[0], c, err_msg=variable.path)
  stats = strategy.compression_stats()
  assert stats["exchange_count"] == STEPS
  assert stats["rank"] == 2
  # The two kernels go low rank (24x64 and 64x5 at rank 2), the first
  # bias with the fallback codec, the second losslessly (5 < min_elements).
  assert stats["low_rank_fraction"] == (1536 + 320) / (1536 + 320 + 64)
  assert history.history["sent_bits_per_element"][-1] < 8
  residuals = strategy.compression_engine.low_rank.residuals
  assert len(residuals) == 2 * NUM_REPLICAS  # Two matrices per replica.
  assert len({v.device for v in residuals.values()}) == NUM_REPLICAS

  # Restored into a new strategy and model: the same weights at the end.
  second = MirroredStrategy(codec=CONFIG, devices=_devices(), min_elements=64)
  resumed = _model(second)
  with second.scope():
    resumed.optimizer.build(resumed.trainable_variables)
  tf.train.Checkpoint(model=resumed, optimizer=resumed.optimizer).read(
      path).assert_existing_objects_matched()
  _fit(resumed, x[5 * BATCH:], y[5 * BATCH:])
  assert int(second.compression_step.numpy()) == STEPS
  for a, b in zip(model.weights, resumed.weights):
    np.testing.assert_array_equal(_bits(a)[0], _bits(b)[0], err_msg=a.path)


def test_tf_low_level_loop_is_compressed_low_rank():
  ops = CompressedAllReduce(ndq_tf.PowerSGD(rank=1, start_step=0),
                            min_elements=16)
  strategy = tf.distribute.MirroredStrategy(_devices(), cross_device_ops=ops)
  with strategy.scope():
    kernel = tf.Variable(tf.zeros([32, 16]))

  @tf.function
  def step():
    def fn():
      ctx = tf.distribute.get_replica_context()
      r = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
      grad = tf.ones([32, 1]) * (r + tf.range(16, dtype=tf.float32))
      return grad
    grads = strategy.run(fn)
    return strategy.extended.batch_reduce_to(
        tf.distribute.ReduceOp.SUM, [(grads, kernel)])

  (summed,) = step()
  # A rank-one gradient: its rank-one approximation is exact.
  want = np.ones([32, 1]) * (6 + 4 * np.arange(16))
  for value in strategy.experimental_local_results(summed):
    np.testing.assert_allclose(value.numpy(), want, rtol=1e-5)
  assert ops.engine.stats()["rank"] == 1


def test_strategies_refuse_a_nested_factor_codec_by_name():
  with pytest.raises(ValueError, match="factor_codec"):
    MirroredStrategy(codec=ndq_tf.PowerSGD(factor_codec="ndqsg"),
                     devices=_devices())
  # Every round takes `exchange=`: the reduce-scatter carries no float32.
  with pytest.raises(ValueError, match="exchange='reduce_scatter'"):
    MirroredStrategy(codec=ndq_tf.PowerSGD(factor_codec="float32"),
                     devices=_devices(), exchange="reduce_scatter")


def test_residuals_are_in_unscaled_units_under_loss_scaling():
  """Keras unscales before the all-reduce: the residuals do not see 2**10."""
  x, y = _data()
  residuals = []
  for scaled in (False, True):
    strategy = MirroredStrategy(
        codec=ndq_tf.PowerSGD(rank=1, factor_codec="float32",
                              fallback_codec="float32", start_step=0),
        devices=_devices()[:2], min_elements=64)
    keras.utils.set_random_seed(1)
    with strategy.scope():
      model = keras.Sequential([keras.Input((24,)),
                                keras.layers.Dense(64, activation="relu"),
                                keras.layers.Dense(5)])
      optimizer = keras.optimizers.SGD(0.01)
      if scaled:
        optimizer = ndq_tf.keras.LossScaleOptimizer(optimizer,
                                                    initial_scale=2.0**10)
      model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(
          from_logits=True))
    _fit(model, x[:2 * BATCH], y[:2 * BATCH])
    store = strategy.compression_engine.low_rank
    residuals.append([store.residuals[k].numpy()
                      for k in sorted(store.residuals)])
  assert any(np.abs(r).max() > 0 for r in residuals[0])
  for a, b in zip(*residuals):
    np.testing.assert_array_equal(a, b)
