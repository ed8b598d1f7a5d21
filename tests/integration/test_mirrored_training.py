"""Training with ndq_tf.MirroredStrategy: model.fit, accuracy, resume, loss scaling.

Real TensorFlow and Keras on 4 logical CPU devices (tests/conftest.py);
small models and few steps, fixed seeds.
"""

import math
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
import ndq_tf.keras
from ndq_tf.distribute.mirrored import MirroredStrategy

import digits_recipe
import multi_worker_job

NUM_REPLICAS = 4
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _devices():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  assert len(devices) >= NUM_REPLICAS, devices
  return devices[:NUM_REPLICAS]


def _replica_bits(variable):
  """The raw bits of every replica's copy of a (mirrored) variable."""
  v = variable.value if isinstance(variable, keras.Variable) else variable
  copies = getattr(v, "values", None) or (v,)
  return [np.atleast_1d(c.numpy()).view(np.uint8) for c in copies]


def _assert_replicas_identical(variables):
  for variable in variables:
    copies = _replica_bits(variable)
    assert len(copies) == NUM_REPLICAS, variable.path
    for c in copies[1:]:
      np.testing.assert_array_equal(copies[0], c, err_msg=variable.path)


def test_fit_keeps_every_replica_bitwise_identical_and_counts_wire_bits():
  codec = ndq_tf.DitheredCodec(num_levels=3)
  strategy = MirroredStrategy(codec=codec, devices=_devices(), seed=11,
                              exchange="all_gather")
  ops = strategy.compressed_all_reduce
  keras.utils.set_random_seed(0)
  with strategy.scope():
    dense_in = keras.Input((20,))
    tokens = keras.Input((4,), dtype="int32")
    embedded = keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(50, 8)(tokens))  # IndexedSlices gradients
    h = keras.layers.Dense(96, activation="relu")(
        keras.layers.Concatenate()([dense_in, embedded]))
    out = keras.layers.Dense(3)(h)
    model = keras.Model([dense_in, tokens], out)
    model.compile(keras.optimizers.Adam(1e-2, clipnorm=1.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  rng = np.random.default_rng(0)
  steps, batch = 52, 32
  x = rng.normal(size=(steps * batch, 20)).astype("float32")
  t = rng.integers(0, 50, size=(steps * batch, 4)).astype("int32")
  y = rng.integers(0, 3, size=(steps * batch,))
  history = model.fit([x, t], y, batch_size=batch, epochs=1, shuffle=False,
                      verbose=0, callbacks=[ndq_tf.keras.CompressionStats()])

  assert int(ops.step.numpy()) == steps  # one compressed call per step
  _assert_replicas_identical(model.variables)
  _assert_replicas_identical(model.optimizer.variables)

  # Bytes on the wire: measured from the wires' sizes, against the codec.
  d = codec.bucket_size
  compressed = [v.shape.num_elements() for v in model.trainable_variables
                if v.shape.num_elements() >= ops.min_elements
                and "embedding" not in v.path]
  padded = sum(-(-n // d) * d for n in compressed)
  stats = strategy.compression_stats()
  assert stats["exchange_count"] == steps
  assert stats["compressed_elements"] == sum(compressed)
  assert stats["payload_bits"] == NUM_REPLICAS * codec.wire_bits(padded)
  # Lossless beside them: the small biases and the embedding's sparse
  # gradient (one row of 8 per token of the replica's 32 / 4 examples).
  small = [v.shape.num_elements() for v in model.trainable_variables
           if v.shape.num_elements() < ops.min_elements]
  assert stats["lossless_elements"] == sum(small) + (batch // NUM_REPLICAS
                                                     ) * 4 * 8
  assert stats["sent_bits"] > stats["payload_bits"]
  elements = stats["compressed_elements"] + stats["lossless_elements"]
  logs = history.history
  assert logs["compression_ratio"][-1] == pytest.approx(
      32 * NUM_REPLICAS * elements / stats["sent_bits"])
  assert logs["sent_bits_per_element"][-1] == pytest.approx(
      stats["sent_bits"] / (NUM_REPLICAS * elements))
  assert logs["sent_bits_per_element"][-1] < 32 / 4


def test_digits_mlp_sends_ten_times_fewer_bits():
  """DQSG M=3 on the digits recipe's MLP: at least 10x fewer gradient bits.

  All gradient bits count (the payloads and the small tensors sent
  losslessly); they are the same at every step, so two steps show them.
  The accuracy against float32 over the whole recipe is a measurement:
  `make check-accuracy` (benchmarks/check_accuracy.py, dqsg_vs_float32).
  """
  x_train, _, y_train, _ = digits_recipe.load()
  # The all-gather's payloads: "auto" would sum these codes in 5-bit lanes
  # (fewer bits on the links, more per payload;
  # tests/core/exchanges/test_sum.py).
  strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=3),
                              devices=_devices(), exchange="all_gather")
  model = digits_recipe.model(strategy)
  model.fit(x_train[:256], y_train[:256], batch_size=128, epochs=1,
            shuffle=False, verbose=0)
  stats = strategy.compression_stats()
  assert stats["exchange_count"] == 2
  assert stats["compression_ratio"] >= 10.0, stats
  _assert_replicas_identical(model.variables)


_RESUME_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    if __name__ == "__main__":
      cpu = tf.config.list_physical_devices("CPU")[0]
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    import keras
    import numpy as np
    import ndq_tf
    from ndq_tf.distribute.mirrored import MirroredStrategy


    def run(mode, work):
      devices = [d.name for d in tf.config.list_logical_devices("CPU")][:4]
      strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=1),
                                  devices=devices, seed=5)
      keras.utils.set_random_seed(3)
      with strategy.scope():
        model = keras.Sequential([keras.Input((16,)),
                                  keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(4)])
        model.compile(keras.optimizers.Adam(1e-2), "mse")
      rng = np.random.default_rng(0)
      x = rng.normal(size=(320, 16)).astype("float32")
      y = rng.normal(size=(320, 4)).astype("float32")
      fit = dict(x=x, y=y, batch_size=32, shuffle=False, verbose=0)
      backup = keras.callbacks.BackupAndRestore(os.path.join(work, "backup"),
                                                delete_checkpoint=False)

      class Interrupt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
          if epoch == 1:
            raise RuntimeError("interrupted")

      ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
      if mode == "straight":
        model.fit(epochs=2, **fit)
      elif mode == "first":
        try:
          model.fit(epochs=2, callbacks=[backup, Interrupt()], **fit)
        except RuntimeError:
          pass
        ckpt.save(os.path.join(work, "ckpt", "c"))
      elif mode == "resume_checkpoint":
        with strategy.scope():
          model.optimizer.build(model.trainable_variables)
        ckpt.restore(tf.train.latest_checkpoint(
            os.path.join(work, "ckpt"))).assert_existing_objects_matched()
        assert int(strategy.compressed_all_reduce.step.numpy()) == 10
        model.fit(epochs=2, initial_epoch=1, **fit)
      elif mode == "resume_backup":
        model.fit(epochs=2, callbacks=[backup], **fit)
      step = strategy.compressed_all_reduce.step.numpy()
      np.savez(os.path.join(work, mode + ".npz"), step=step,
               *[v.numpy() for v in model.weights])


    if __name__ == "__main__":
      # Started with TensorFlow still to load: it loads while the test's
      # interrupted run trains; "go" says that the checkpoint is written.
      if sys.stdin.readline().strip() != "go":
        sys.exit("no go: the interrupted run failed")
      for mode in sys.argv[2:]:
        run(mode, sys.argv[1])
""")


def test_resume_in_a_fresh_process_continues_bitwise(tmp_path):
  """Interrupted here, resumed in a fresh process from a checkpoint and from
  BackupAndRestore: the weights of the run that never stopped, to the bit.

  The interrupted and the uninterrupted runs share this test's process (its
  4 logical CPUs); the fresh process restores twice, once from each source,
  while the uninterrupted run trains here. It is started first, loads
  TensorFlow while the interrupted run trains, then waits to be told that
  the checkpoint is written: it shares nothing with that run.
  """
  script = tmp_path / "resume.py"
  script.write_text(_RESUME_SCRIPT)
  work = str(tmp_path)
  resume = multi_worker_job.load_script(str(script), "ndq_resume_script")
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  fresh = subprocess.Popen(
      [sys.executable, str(script), work, "resume_checkpoint",
       "resume_backup"], env=env, stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    resume.run("first", work)
    try:
      fresh.stdin.write("go\n")
      fresh.stdin.flush()  # `communicate` closes it.
    except BrokenPipeError:
      pass  # It has died: its output, below, says why.
    resume.run("straight", work)
  finally:
    try:
      out, _ = fresh.communicate(timeout=300)
    except subprocess.TimeoutExpired:
      fresh.kill()
      out, _ = fresh.communicate()
      pytest.fail(f"the fresh process timed out:\n{out[-3000:]}")
  assert fresh.returncode == 0, out[-3000:]
  straight = np.load(tmp_path / "straight.npz")
  for mode in ("resume_checkpoint", "resume_backup"):
    resumed = np.load(tmp_path / f"{mode}.npz")
    assert int(resumed["step"]) == int(straight["step"]) == 20, mode
    weights = [k for k in straight.files if k != "step"]
    assert weights
    for key in weights:
      np.testing.assert_array_equal(
          np.atleast_1d(straight[key]).view(np.uint8),
          np.atleast_1d(resumed[key]).view(np.uint8),
          err_msg=f"{mode}: {key}")


def _loss_scale_setup(optimizer_class):
  strategy = MirroredStrategy(codec=ndq_tf.DitheredCodec(num_levels=3),
                              devices=_devices(), min_elements=64)
  keras.utils.set_random_seed(2)
  with strategy.scope():
    # Mixed precision: float16 compute, float32 variables and gradients.
    model = keras.Sequential([keras.Input((32,)),
                              keras.layers.Dense(16, dtype="mixed_float16")])
    optimizer = optimizer_class(keras.optimizers.SGD(0.1))
    optimizer.build(model.trainable_variables)

  @tf.function
  def train_step(x, bad_replicas):
    def fn(x):
      ctx = tf.distribute.get_replica_context()
      bad = tf.reduce_any(
          tf.equal(bad_replicas, ctx.replica_id_in_sync_group))
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.cast(model(x), tf.float32)))
        loss = loss * tf.where(bad, math.nan, 1.0)
        scaled = optimizer.scale_loss(loss)
      grads = tape.gradient(scaled, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
    strategy.run(fn, args=(x,))

  x = tf.random.stateless_normal([32, 32], seed=[1, 2])
  return strategy, model, optimizer, train_step, x


@pytest.mark.parametrize("optimizer_class, bad_replicas", [
    (keras.optimizers.LossScaleOptimizer, [0, 1, 2, 3]),
    (ndq_tf.keras.LossScaleOptimizer, [1]),
])
def test_loss_scale_optimizer_skips_a_step_with_a_nan(optimizer_class,
                                                      bad_replicas):
  strategy, model, optimizer, train_step, x = _loss_scale_setup(
      optimizer_class)
  scale = float(optimizer.dynamic_scale.numpy())
  before = [v.numpy() for v in model.weights]
  train_step(x, tf.constant(bad_replicas, tf.int32))
  assert float(optimizer.dynamic_scale.numpy()) == scale / 2
  for b, v in zip(before, model.weights):
    np.testing.assert_array_equal(b, v.numpy())
  _assert_replicas_identical(model.weights)
  # A clean step is applied, identically everywhere.
  train_step(x, tf.constant([-1], tf.int32))
  assert not np.array_equal(before[0], model.weights[0].numpy())
  _assert_replicas_identical(model.weights)
  # The gradient all-reduce of Keras' LossScaleOptimizer runs only in the
  # branch that applies the step: the skipped step drew no dither.
  assert int(strategy.compressed_all_reduce.step.numpy()) == 1
