"""The two workloads of benchmarks/accuracy_vs_bits.py: data, models, recipes.

Each recipe was fixed before any codec ran, from what float32 needs, and is
never tuned on a codec (issue: an accuracy benchmark that tells codecs
apart). Both use Adam at 1e-3 with no decay and a modest batch: Adam divides
by a running second moment that quantization noise inflates, and a constant
step keeps that noise in the last weights, so the codecs' differences show
in the final number instead of being annealed away (with plain SGD and a
decayed step, docs/results.md, every codec but the non-adaptive nested one
lands within 0.1 point of float32).

* `vision`: Fashion-MNIST, the LeNet-style CNN of docs/results.md and
  benchmarks/paper_experiment.py (5x5 conv 32 -> 2x2 max-pool -> 5x5 conv
  64 -> 2x2 max-pool -> dense 512 -> 10, valid padding, 582,026
  parameters), all 60,000 training images, total batch 128 (32 per
  replica), 5 epochs (2,340 steps). Fixed on float32 alone: at 4 epochs
  float32 reached 0.9048, 0.9022 and 0.8929 on seeds 0-2 (code ceac77f,
  the first 12 runs), one seed under the 90% floor, so a fifth epoch was
  added; that decision looked at float32 alone (unrotated ternary had run
  at 4 epochs too: -1.05 points). A training subset would cap it near
  90%. Metric: accuracy on the 10,000 test images.
  The four IDX files of the Debian package `dataset-fashion-mnist` are read
  directly (benchmarks/datasets.py names them): its Keras loader needs
  `KERAS_HOME` set before Keras is imported, which a test process that
  imported Keras long before cannot do.
* `chars`: a character-level transformer (2 pre-LayerNorm blocks, width
  96, 4 heads, feed-forward 384, context 64, about 250,000 parameters) on
  the Python standard library's own sources (every `*.py` under the running
  interpreter's stdlib folder, without site-packages, test suites and
  idlelib), split by file: in the sorted list of relative paths, every
  `test_every`-th file (the 10th, 20th, ...) is held out. 1,000 steps of 32
  random windows (2M characters seen, a subset of the 10.5M of the 607
  training files of Python 3.11.7; the corpus's folder and Python's version
  enter the runs' key). Metric: bits per character on the first 131,072 held-out
  characters (2,048 windows of 64, each scored on all its positions).
  Tokens are embedded by a one-hot product, not `keras.layers.Embedding`,
  whose gradient is an `IndexedSlices` of one row per token that the
  strategies send losslessly (README, "What is compressed"): it would
  count more float32 bits than the whole model has weights.

Importing this module imports neither TensorFlow nor Keras.
"""

import dataclasses
import gzip
import math
import os
import sysconfig

import numpy as np

import datasets  # benchmarks/datasets.py, next to this script

__all__ = ["VisionRecipe", "CharRecipe", "RECIPES", "TINY_RECIPES",
           "WORKLOADS", "METRICS", "VOCAB", "FASHION_MNIST_TRAIN",
           "load_fashion_mnist", "data_source", "stdlib_dir", "corpus_files",
           "encode_text", "load_chars", "build_model", "steps_of", "fit",
           "evaluate"]


@dataclasses.dataclass(frozen=True)
class VisionRecipe:
  """Fashion-MNIST CNN recipe; every field enters the runs' key."""
  train_subset: int = 0  # 0: all 60,000 training images.
  test_examples: int = 10000
  batch_size: int = 128
  epochs: int = 5
  learning_rate: float = 1e-3
  conv_filters: tuple = (32, 64)
  dense_units: int = 512


@dataclasses.dataclass(frozen=True)
class CharRecipe:
  """Character transformer recipe; every field enters the runs' key."""
  context: int = 64
  width: int = 96
  heads: int = 4
  blocks: int = 2
  ffn: int = 384
  batch_size: int = 32
  steps: int = 1000
  learning_rate: float = 1e-3
  test_chars: int = 131072
  test_every: int = 10


#: The recipes of the grid, fixed before any codec ran.
RECIPES = {"vision": VisionRecipe(), "chars": CharRecipe()}

#: A smoke configuration: seconds, numbers meaningless (tests, --tiny).
TINY_RECIPES = {
    "vision": VisionRecipe(train_subset=256, test_examples=128,
                           batch_size=32, epochs=1, conv_filters=(4, 8),
                           dense_units=16),
    "chars": CharRecipe(context=16, width=16, heads=2, blocks=1, ffn=32,
                        batch_size=8, steps=3, test_chars=512, test_every=2),
}

WORKLOADS = tuple(RECIPES)

#: workload -> (metric name, True when higher is better).
METRICS = {"vision": ("test accuracy", True),
           "chars": ("bits per character", False)}


# -- Fashion-MNIST ------------------------------------------------------------

def _read_idx(path):
  """The array of one gzipped IDX file (magic: 2 zero bytes, type, rank)."""
  with gzip.open(path, "rb") as f:
    raw = f.read()
  rank = raw[3]
  shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
           for i in range(rank)]
  return np.frombuffer(raw, np.uint8, offset=4 + 4 * rank).reshape(shape)


def load_fashion_mnist(data_dir, recipe):
  """`((x_train, y_train), (x_test, y_test))`, NHWC float32 in [0, 1].

  Args:
    data_dir: folder with the four IDX files, or None for the Debian
      package's.
    recipe: a `VisionRecipe`: its `train_subset` (a fixed random subset,
      the same for every row and seed) and `test_examples` (the first ones).

  Raises:
    FileNotFoundError: naming the folder, the missing files and how to
      install them.
  """
  folder = data_dir or datasets.DEFAULT_DATA_DIRS["fashion_mnist"]
  _, files = datasets.DATASETS["fashion_mnist"]
  missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
  if missing:
    raise FileNotFoundError(
        f"fashion_mnist: {folder} lacks {missing}. Install them with "
        f"`apt-get install -y dataset-fashion-mnist`, or pass "
        f"--data_dir=FOLDER holding {list(files)}.")
  arrays = {f: _read_idx(os.path.join(folder, f)) for f in files}

  def images(name):
    return (arrays[name].astype(np.float32) / 255.0)[..., None]

  x_train = images("train-images-idx3-ubyte.gz")
  y_train = arrays["train-labels-idx1-ubyte.gz"].astype(np.int32)
  x_test = images("t10k-images-idx3-ubyte.gz")[:recipe.test_examples]
  y_test = arrays["t10k-labels-idx1-ubyte.gz"].astype(np.int32)[
      :recipe.test_examples]
  if recipe.train_subset:
    keep = np.sort(np.random.default_rng(1234).permutation(
        len(x_train))[:recipe.train_subset])
    x_train, y_train = x_train[keep], y_train[keep]
  return (x_train, y_train), (x_test, y_test)


# -- The standard library as a corpus -----------------------------------------

#: Folders left out of the corpus: not the standard library (site-packages),
#: or mostly generated strings and data rather than code (test suites).
_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test",
                            "tests", "idlelib", "__pycache__"})


def data_source(workload, data_dir=None, corpus_dir=None):
  """What identifies a workload's data in the runs' key (no file is read)."""
  import platform  # pylint: disable=g-import-not-at-top
  if workload == "vision":
    return {"dir": data_dir or datasets.DEFAULT_DATA_DIRS["fashion_mnist"]}
  return {"dir": corpus_dir or stdlib_dir(),
          "python": platform.python_version()}


def stdlib_dir():
  """The running interpreter's standard library folder (the venv's base)."""
  return sysconfig.get_paths()["stdlib"]


def corpus_files(root):
  """Sorted relative paths of the corpus's `*.py` files under `root`."""
  found = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in _EXCLUDED_DIRS)
    for name in files:
      if name.endswith(".py"):
        found.append(os.path.relpath(os.path.join(folder, name), root))
  return sorted(found)


#: Token ids: 0 for any other byte, then printable ASCII, newline and tab.
VOCAB = 98


def encode_text(raw):
  """Byte string -> uint8 token ids in `[0, VOCAB)`."""
  b = np.frombuffer(raw, np.uint8)
  ids = np.zeros(len(b), np.uint8)
  printable = (b >= 32) & (b <= 126)
  ids[printable] = b[printable] - 31
  ids[b == 10] = 96
  ids[b == 9] = 97
  return ids


def load_chars(corpus_dir, recipe):
  """`(train_ids, test_ids, description)` of the corpus split by file.

  File `i` of the sorted list is held out iff `i % test_every ==
  test_every - 1`; the test text is the held-out files concatenated in
  order, cut to `recipe.test_chars` (a whole number of windows).

  Raises:
    ValueError: if `recipe.test_every < 2`, or the corpus gives no test
      file or too few test characters, naming the folder and the counts.
  """
  root = corpus_dir or stdlib_dir()
  if recipe.test_every < 2:
    raise ValueError(f"`test_every` must be at least 2. Received: "
                     f"test_every={recipe.test_every!r}")
  files = corpus_files(root)
  train, test = [], []
  for i, name in enumerate(files):
    with open(os.path.join(root, name), "rb") as f:
      raw = f.read()
    (test if i % recipe.test_every == recipe.test_every - 1 else train).append(
        raw)
  test_ids = encode_text(b"".join(test))
  need = recipe.test_chars // recipe.context * recipe.context
  if not train or len(test_ids) < need + 1:
    raise ValueError(
        f"The corpus {root} ({len(files)} *.py files, every "
        f"{recipe.test_every}th held out) has {len(test_ids)} test "
        f"characters; test_chars={recipe.test_chars} needs {need + 1}.")
  description = (f"{len(files)} files under {root}: {len(train)} training "
                 f"files, {len(test)} held out")
  return encode_text(b"".join(train)), test_ids[:need + 1], description


def _char_windows(ids, starts, context):
  index = starts[:, None] + np.arange(context)[None, :]
  return ids[index].astype(np.int32), ids[index + 1].astype(np.int32)


# -- Models -------------------------------------------------------------------

def _vision_model(keras, recipe):
  f1, f2 = recipe.conv_filters
  return keras.Sequential([
      keras.Input((28, 28, 1)),
      keras.layers.Conv2D(f1, 5, activation="relu"),
      keras.layers.MaxPooling2D(2),
      keras.layers.Conv2D(f2, 5, activation="relu"),
      keras.layers.MaxPooling2D(2),
      keras.layers.Flatten(),
      keras.layers.Dense(recipe.dense_units, activation="relu"),
      keras.layers.Dense(10),
  ])


def _char_model(keras, recipe):
  """Pre-LayerNorm causal transformer; logits for every position."""

  class OneHotEmbedding(keras.layers.Layer):
    """Token (one-hot product: a dense gradient) plus learned position."""

    def build(self, input_shape):
      self.tokens = self.add_weight(
          shape=(VOCAB, recipe.width), name="tokens",
          initializer=keras.initializers.RandomNormal(stddev=0.02))
      self.positions = self.add_weight(
          shape=(recipe.context, recipe.width), name="positions",
          initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, ids):
      one_hot = keras.ops.one_hot(ids, VOCAB, dtype=self.tokens.dtype)
      return keras.ops.matmul(one_hot, self.tokens) + self.positions

  ids = keras.Input((recipe.context,), dtype="int32")
  x = OneHotEmbedding()(ids)
  for _ in range(recipe.blocks):
    h = keras.layers.LayerNormalization()(x)
    h = keras.layers.MultiHeadAttention(
        recipe.heads, recipe.width // recipe.heads)(h, h, use_causal_mask=True)
    x = x + h
    h = keras.layers.LayerNormalization()(x)
    h = keras.layers.Dense(recipe.ffn, activation="gelu")(h)
    x = x + keras.layers.Dense(recipe.width)(h)
  x = keras.layers.LayerNormalization()(x)
  return keras.Model(ids, keras.layers.Dense(VOCAB)(x))


def build_model(keras, workload, recipe):
  """The workload's model, compiled with Adam; call in a strategy's scope."""
  model = (_vision_model if workload == "vision" else _char_model)(
      keras, recipe)
  model.compile(keras.optimizers.Adam(recipe.learning_rate),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


#: Fashion-MNIST's training images.
FASHION_MNIST_TRAIN = 60000


def steps_of(workload, recipe):
  """Training steps of one run (known before its data is loaded)."""
  if workload == "vision":
    images = min(recipe.train_subset or FASHION_MNIST_TRAIN,
                 FASHION_MNIST_TRAIN)
    return images // recipe.batch_size * recipe.epochs
  return recipe.steps


def fit(model, workload, recipe, data, seed, callbacks):
  """Trains `model`; the seed also draws the char windows."""
  if workload == "vision":
    (x, y), _ = data
    n = len(x) // recipe.batch_size * recipe.batch_size
    model.fit(x[:n], y[:n], batch_size=recipe.batch_size,
              epochs=recipe.epochs, shuffle=True, verbose=0,
              callbacks=callbacks)
    return
  train, _ = data
  rng = np.random.default_rng([seed, 0x43484152])
  starts = rng.integers(0, len(train) - recipe.context - 1,
                        size=recipe.steps * recipe.batch_size)
  x, y = _char_windows(train, starts, recipe.context)
  model.fit(x, y, batch_size=recipe.batch_size, epochs=1, shuffle=False,
            verbose=0, callbacks=callbacks)


def evaluate(model, workload, recipe, data):
  """Test accuracy (vision) or bits per character (chars)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def logits(x):
    return model(x, training=False)

  if workload == "vision":
    _, (x, y) = data
    correct = 0
    for i in range(0, len(x), 1000):
      predicted = np.argmax(logits(x[i:i + 1000]).numpy(), axis=-1)
      correct += int(np.sum(predicted == y[i:i + 1000]))
    return correct / len(x)
  _, test = data
  starts = np.arange(0, len(test) - 1, recipe.context)
  x, y = _char_windows(test, starts, recipe.context)
  nats = 0.0
  for i in range(0, len(x), 256):
    nats += float(tf.reduce_sum(
        tf.nn.sparse_softmax_cross_entropy_with_logits(
            y[i:i + 256], logits(x[i:i + 256]))))
  return nats / y.size / math.log(2)
