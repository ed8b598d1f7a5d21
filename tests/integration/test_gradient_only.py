"""Only gradient aggregation is compressed; every other all-reduce stays exact.

Real TensorFlow and Keras on 4 logical CPU devices (tests/conftest.py).
The references are TensorFlow's own `tf.distribute.MirroredStrategy` on the
same devices, data and initial weights.
"""

import functools
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
import ndq_tf.keras

import digits_recipe

NUM_REPLICAS = 4


def _devices(n=NUM_REPLICAS):
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  assert len(devices) >= n, devices
  return devices[:n]


def _tf_strategy():
  """TF's own MirroredStrategy, with the lossless all-reduce ndq_tf falls back
  to (its default on CPUs sums in another order: the variance of the
  synchronized BatchNormalization, E[x²] - E[x]², then differs by 1.5e-5
  relative between the two TF all-reduces themselves)."""
  return tf.distribute.MirroredStrategy(
      _devices(), cross_device_ops=tf.distribute.ReductionToOneDevice())


def _first(value):
  return value.values[0] if hasattr(value, "values") else value


def _digits(offset=0.0):
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  x = (data.data / 16.0 + offset).astype("float32")
  return model_selection.train_test_split(
      x, data.target, test_size=0.25, random_state=0, stratify=data.target)


def _bn_statistics(model):
  bn = model.layers[1]
  return (np.array(_first(bn.moving_mean.value).numpy()),
          np.array(_first(bn.moving_variance.value).numpy()))


@functools.lru_cache(maxsize=None)
def _tf_reference_statistics():
  """TF's strategy on the sync-BN model: the statistics after one step.

  Computed once for every parameter of the test below.
  """
  x_offset, _, y_offset, _ = _digits(offset=5.0)
  model = digits_recipe.sync_bn_model(_tf_strategy())
  model.fit(x_offset[:128], y_offset[:128], batch_size=128, epochs=1,
            shuffle=False, verbose=0)
  return _bn_statistics(model)


@pytest.mark.parametrize("num_levels", [1, 3])
def test_synchronized_batch_norm_statistics_match_tf_and_gradients_are_compressed(
    num_levels):
  """The statistics are TF's, and the gradients compressed, in one step.

  The accuracy after 8 epochs against TF's strategy (within 0.5 points) is
  a measurement: `make check-accuracy` (benchmarks/check_accuracy.py,
  sync_bn).
  """
  # The all-gather, whose wire bits per element the test bounds ("auto"
  # sums M=3 codes of 4 replicas in 5-bit lanes instead).
  strategy = ndq_tf.MirroredStrategy(
      codec=ndq_tf.DitheredCodec(num_levels=num_levels), devices=_devices(),
      exchange="all_gather")
  # An offset makes the per-channel means large against their spread, so a
  # quantized sum would show (the symptom: means off by several).
  x_offset, _, y_offset, _ = _digits(offset=5.0)
  model = digits_recipe.sync_bn_model(strategy)
  # One step from the same initial weights: the batch statistics come from
  # the forward pass alone, before any compressed gradient is applied.
  model.fit(x_offset[:128], y_offset[:128], batch_size=128, epochs=1,
            shuffle=False, verbose=0)
  for ours, theirs in zip(_bn_statistics(model), _tf_reference_statistics()):
    # The bound; the same lossless all-reduce gives the same floats.
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
  assert int(strategy.compression_step.numpy()) == 1
  stats = strategy.compression_stats()
  bits = stats["sent_bits_per_element"]
  assert bits < (2.0 if num_levels == 1 else 3.5), bits
  assert stats["compressed_elements"] == _compressible(model)


def _compressible(model):
  """Elements of the trainable variables of at least min_elements=256."""
  sizes = [v.shape.num_elements() for v in model.trainable_variables]
  return sum(n for n in sizes if n >= 256)


def test_metrics_and_strategy_reduce_equal_tf_bitwise():
  x_train, x_test, y_train, y_test = _digits()
  del x_train, y_train
  reference = digits_recipe.sync_bn_model(_tf_strategy())
  strategy = ndq_tf.MirroredStrategy(
      codec=ndq_tf.DitheredCodec(num_levels=1), devices=_devices())
  model = digits_recipe.sync_bn_model(strategy)
  model.set_weights(reference.get_weights())
  ours = model.evaluate(x_test, y_test, batch_size=64, verbose=0,
                        return_dict=True)
  theirs = reference.evaluate(x_test, y_test, batch_size=64, verbose=0,
                              return_dict=True)
  assert ours == theirs  # bitwise: the same floats

  def per_replica(s):
    return s.experimental_distribute_values_from_function(
        lambda ctx: tf.random.stateless_normal(
            [1000], [ctx.replica_id_in_sync_group, 3]))

  for op in ("SUM", "MEAN"):
    got = strategy.reduce(op, per_replica(strategy), axis=None).numpy()
    want = _tf_strategy().reduce(
        op, per_replica(strategy), axis=None).numpy()
    np.testing.assert_array_equal(got, want)
  assert int(strategy.compression_step.numpy()) == 0


class TestScopes:

  def _run(self, strategy, scope_fn):
    x = tf.random.stateless_normal([4096], [1, 2])
    small = tf.random.stateless_normal([10], [1, 3])

    @tf.function
    def step():
      def fn():
        ctx = tf.distribute.get_replica_context()
        scale = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
        with scope_fn():
          return ctx.all_reduce("sum", [x * scale, small * scale])
      return strategy.run(fn)

    big, little = step()
    return _first(big).numpy(), _first(little).numpy()

  def test_user_all_reduce_is_exact_by_default(self):
    strategy = ndq_tf.MirroredStrategy(codec="dqsg:num_levels=1",
                                       devices=_devices())
    import contextlib  # pylint: disable=g-import-not-at-top
    big, _ = self._run(strategy, contextlib.nullcontext)
    x = tf.random.stateless_normal([4096], [1, 2]).numpy()
    np.testing.assert_allclose(big, x * 10.0, rtol=1e-6)
    assert int(strategy.compression_step.numpy()) == 0

  def test_compressed_scope_opts_in_and_counts_elements_separately(self):
    strategy = ndq_tf.MirroredStrategy(codec="dqsg:num_levels=1",
                                       devices=_devices())
    big, little = self._run(strategy, ndq_tf.distribute.compressed)
    x = tf.random.stateless_normal([4096], [1, 2]).numpy()
    assert int(strategy.compression_step.numpy()) == 1
    error = big - x * 10.0
    assert np.abs(error).max() > 1e-3  # quantized
    # Unbiased ternary DQSG: |error| <= sum over senders of one step (the
    # bucket's max / num_levels) per element.
    assert np.abs(error).max() <= 4 * np.abs(x * 4.0).max() + 1e-5
    small = tf.random.stateless_normal([10], [1, 3]).numpy()
    np.testing.assert_allclose(little, small * 10.0, rtol=1e-6)  # lossless
    stats = strategy.compression_stats()
    assert stats["compressed_elements"] == 4096
    assert stats["lossless_elements"] == 10

  def test_uncompressed_scope_inside_compressed_wins(self):
    strategy = ndq_tf.MirroredStrategy(codec="dqsg:num_levels=1",
                                       devices=_devices())

    def both():
      import contextlib  # pylint: disable=g-import-not-at-top
      stack = contextlib.ExitStack()
      stack.enter_context(ndq_tf.distribute.compressed())
      stack.enter_context(ndq_tf.distribute.uncompressed())
      return stack

    big, _ = self._run(strategy, both)
    x = tf.random.stateless_normal([4096], [1, 2]).numpy()
    np.testing.assert_allclose(big, x * 10.0, rtol=1e-6)
    assert int(strategy.compression_step.numpy()) == 0


def _mlp(strategy, optimizer):
  keras.utils.set_random_seed(1)
  with strategy.scope():
    model = keras.Sequential([keras.Input((64,)),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer(),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


@pytest.mark.parametrize("name,optimizer,steps,exchanges", [
    ("fit", lambda: keras.optimizers.SGD(0.1), 4, 4),
    ("loss_scale", lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1)), 4, 4),
    ("ndq_loss_scale", lambda: ndq_tf.keras.LossScaleOptimizer(
        keras.optimizers.SGD(0.1)), 4, 4),
])
def test_gradient_aggregation_is_compressed_under_fit(name, optimizer, steps,
                                                      exchanges):
  del name
  strategy = ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec(),
                                     devices=_devices())
  model = _mlp(strategy, optimizer)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(steps * 64, 64)).astype("float32")
  y = rng.integers(0, 10, size=(steps * 64,))
  model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
  assert int(strategy.compression_step.numpy()) == exchanges
  assert strategy.compression_stats()["compressed_elements"] == _compressible(
      model) == 64 * 256 + 256 + 256 * 10


@pytest.mark.parametrize("make", ["tf", "ndq_tf"])
def test_gradient_accumulation_fails_under_mirrored_as_with_tf_own_strategy(
    make):
  # Keras 3.15 aggregates accumulated gradients inside a `cond`, where
  # MirroredStrategy cannot merge_call: TF's own strategy refuses it too. If
  # a Keras release lifts this, this test fails: then check that the
  # aggregation is compressed (it runs inside the optimizer's `apply`).
  strategy = (_tf_strategy() if make == "tf" else ndq_tf.MirroredStrategy(
      codec=ndq_tf.DitheredCodec(), devices=_devices()))
  model = _mlp(strategy, lambda: keras.optimizers.SGD(
      0.1, gradient_accumulation_steps=2))
  x = np.zeros((128, 64), "float32")
  y = np.zeros((128,), "int32")
  with pytest.raises(RuntimeError, match="merge_call` called while defining"):
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)


def test_custom_loop_apply_gradients_is_compressed():
  strategy = ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec(),
                                     devices=_devices())
  model = _mlp(strategy, lambda: keras.optimizers.SGD(0.1))
  optimizer = model.optimizer
  x = tf.random.stateless_normal([64, 64], [0, 1])
  y = tf.zeros([64], tf.int32)
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices((x, y)).batch(64))

  @tf.function
  def train_step(batch):
    def fn(features, labels):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model.loss(labels, model(features))) / 64.0
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      # The user's own all-reduce in the same step stays exact.
      ctx = tf.distribute.get_replica_context()
      return ctx.all_reduce("sum", tf.fill([1000], loss))
    return strategy.run(fn, args=batch)

  for batch in dataset:
    total = train_step(batch)
  assert int(strategy.compression_step.numpy()) == 1
  values = _first(total).numpy()
  assert np.all(values == values[0])  # exact: one value, summed exactly


@pytest.mark.parametrize("make", ["mirrored", "multi_worker"])
@pytest.mark.parametrize("codec,error", [
    (ndq_tf.DitheredCodec, TypeError),
    (None, (TypeError, ValueError)),
    (object(), TypeError),
    ("not a codec spec", ValueError),
    ("dqsg:levels=3", ValueError),
])
def test_bad_codec_arguments_name_codec(make, codec, error, monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(error, match="`?codec`?") as info:
    if make == "mirrored":
      ndq_tf.MirroredStrategy(codec=codec, devices=_devices(2))
    else:
      ndq_tf.MultiWorkerMirroredStrategy(codec=codec)
  assert "codec" in str(info.value)
  if codec is ndq_tf.DitheredCodec:
    assert "DitheredCodec()" in str(info.value)  # the suggested call


def test_compression_stats_does_not_warn_when_nothing_was_all_reduced():
  strategy = ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec(),
                                     devices=_devices(1))
  model = _mlp(strategy, lambda: keras.optimizers.SGD(0.1))
  x = np.zeros((128, 64), "float32")
  y = np.zeros((128,), "int32")
  with warnings.catch_warnings():
    warnings.filterwarnings("error", message="CompressionStats")
    history = model.fit(x, y, batch_size=64, epochs=1, verbose=0,
                        callbacks=[ndq_tf.keras.CompressionStats()])
  assert "sent_bits_per_element" not in history.history
  assert "wire_bits_per_element" not in history.history


def test_compression_stats_warns_when_gradients_went_lossless():
  strategy = ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec(),
                                     devices=_devices(), min_elements=10**6)
  model = _mlp(strategy, lambda: keras.optimizers.SGD(0.1))
  x = np.zeros((128, 64), "float32")
  y = np.zeros((128,), "int32")
  with pytest.warns(RuntimeWarning, match="all-reduced losslessly"):
    history = model.fit(x, y, batch_size=64, epochs=1, verbose=0,
                        callbacks=[ndq_tf.keras.CompressionStats()])
  assert history.history["sent_bits_per_element"] == [32.0]
  assert strategy.compression_stats()["uncompressed_gradient_reductions"] == 2
