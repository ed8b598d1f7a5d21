"""Helpers shared by the benchmarks: logical CPU devices, the digits recipe,
timing.

* `split_cpu`: one CPU as N logical devices, the replicas of a
  `MirroredStrategy` on a machine without accelerators.
* `load_digits`, `digits_mlp` and `fit_digits_mlp`: the digits MLP recipe
  (scikit-learn's digits, MLP 64-256-10, Adam 4e-3, batch 128, 8 epochs,
  Keras seed 1 unless told); `sync_bn_mlp`, the same MLP with a synchronized
  BatchNormalization. benchmarks/nested_digits.py trains it, and the training tests
  (tests/integration/test_mirrored_training.py, tests/integration/test_nested_allreduce.py) assert
  accuracies with it through tests/digits_recipe.py, so every change to the
  model, the split or the seeds changes those tests' numbers.
* `median_seconds`: the median wall and CPU time of a function.

Importing this module imports neither TensorFlow nor Keras: TF accepts a
device split only before its runtime starts, and benchmarks/datasets.py needs
`KERAS_HOME` set before Keras is first imported.

Example:

  devices = common.split_cpu(4)
  data = common.load_digits()
  model, history = common.fit_digits_mlp(
      ndq_tf.MirroredStrategy(codec=ndq_tf.DitheredCodec(), devices=devices),
      data)
"""

import glob
import json
import os
import statistics
import time

__all__ = ["split_cpu", "load_digits", "digits_mlp", "sync_bn_mlp",
           "fit_digits_mlp", "synthetic_mlp", "read_json_files",
           "median_seconds"]


def median_seconds(fn, repeats, warm_up=True):
  """Median wall and CPU seconds of `fn()` over `repeats` calls.

  With `warm_up`, one call first, untimed, to trace, compile and warm up.
  CPU seconds are those of every thread of this process
  (`time.process_time`).

  Returns:
    `(wall, cpu)`, Python floats.
  """
  if warm_up:
    fn()
  wall, cpu = [], []
  for _ in range(repeats):
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  return float(statistics.median(wall)), float(statistics.median(cpu))


def read_json_files(folder):
  """Every `*.json` of `folder`, sorted by file name, as parsed objects.

  The run files of the benchmarks that keep one JSON per run
  (paper_experiment.py, accuracy_vs_bits.py).
  """
  out = []
  for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
    with open(path) as f:
      out.append(json.load(f))
  return out


def split_cpu(num_devices):
  """Splits the first CPU into `num_devices` logical devices.

  Must run before TensorFlow's runtime initializes (before the first op or
  device listing of the process).

  Args:
    num_devices: positive int.

  Returns:
    The names of the first `num_devices` logical CPU devices, e.g.
    `["/job:localhost/replica:0/task:0/device:CPU:0", ...]`.

  Raises:
    ValueError: if `num_devices` is not a positive int.
  """
  if not isinstance(num_devices, int) or num_devices < 1:
    raise ValueError("`num_devices` must be a positive int. "
                     f"Received: num_devices={num_devices!r}")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
  return [d.name for d in tf.config.list_logical_devices("CPU")][:num_devices]


def load_digits():
  """Scikit-learn's digits as `(x_train, x_test, y_train, y_test)`.

  Pixels scaled to [0, 1] as float32; a fixed stratified 75/25 split
  (`random_state=0`): 1,347 training and 450 test images.
  """
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  x = (data.data / 16.0).astype("float32")
  return model_selection.train_test_split(
      x, data.target, test_size=0.25, random_state=0, stratify=data.target)


def digits_mlp(strategy, seed=1):
  """The digits recipe's MLP (64-256-10, Adam 4e-3), compiled in `strategy`.

  Args:
    strategy: a `tf.distribute.Strategy`; the model is built in its scope.
    seed: Keras' seed (initial weights, batch order).

  Returns:
    The compiled `keras.Sequential`, with the metric "accuracy".
  """
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(seed)
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(4e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  return model


def sync_bn_mlp(strategy, seed=0):
  """The digits MLP with a synchronized BatchNormalization, compiled.

  64-256-10 with `BatchNormalization(synchronized=True, momentum=0.5)` and a
  ReLU after the hidden layer, Adam 4e-3: the model whose statistics must be
  the global batch's (tests/integration/test_gradient_only.py, and `make
  check-accuracy`'s sync_bn check).

  Args:
    strategy: a `tf.distribute.Strategy`; the model is built in its scope.
    seed: Keras' seed (initial weights).

  Returns:
    The compiled `keras.Sequential`, with the metric "accuracy".
  """
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(seed)
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(256),
        keras.layers.BatchNormalization(synchronized=True, momentum=0.5),
        keras.layers.ReLU(),
        keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(4e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  return model


def fit_digits_mlp(strategy, data, seed=1, callbacks=None):
  """Trains the digits MLP (`digits_mlp`) under `strategy`.

  Args:
    strategy: a `tf.distribute.Strategy`; the model is built in its scope.
    data: the tuple of `load_digits`.
    seed: Keras' seed (initial weights, batch order).
    callbacks: list of `keras.callbacks.Callback` for `model.fit`, or None.

  Returns:
    `(model, history)` after 8 epochs of Adam(4e-3) at batch 128.
  """
  x_train, _, y_train, _ = data
  model = digits_mlp(strategy, seed)
  history = model.fit(x_train, y_train, batch_size=128, epochs=8,
                      shuffle=True, verbose=0, callbacks=callbacks)
  return model, history


def synthetic_mlp(strategy, widths, batch_size):
  """The step-time benchmarks' MLP on `strategy`, and one synthetic batch.

  Args:
    strategy: a `tf.distribute.Strategy`; the model and the optimizer's
      slots are built in its scope.
    widths: layer widths, input first (ReLU between, logits last).
    batch_size: rows of the batch.

  Returns:
    `(model, optimizer, loss_fn, x, y)`: SGD(0.01), a summed sparse
    cross-entropy on logits, and a fixed normal batch with random labels.
  """
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = keras.Sequential(
        [keras.Input((widths[0],))]
        + [keras.layers.Dense(w, activation="relu") for w in widths[1:-1]]
        + [keras.layers.Dense(widths[-1])])
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                       reduction="sum")
  rng = np.random.default_rng(0)
  x = rng.normal(size=(batch_size, widths[0])).astype("float32")
  y = rng.integers(0, widths[-1], size=(batch_size,)).astype("int32")
  return model, optimizer, loss_fn, x, y
