"""Offline image data sets through `keras.datasets`, for the benchmarks.

Nothing is downloaded. Keras' loaders look for their files in
`$KERAS_HOME/datasets/...` and only download when a file is missing; this
module links local copies there first (a private `KERAS_HOME`, so the user's
`~/.keras` is left alone) and refuses to call a loader whose files are not
all present.

* Fashion-MNIST: the four IDX files of the Debian package
  `dataset-fashion-mnist` (`/usr/share/datasets/fashion-mnist/`), or any
  folder holding `train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`,
  `t10k-images-idx3-ubyte.gz` and `t10k-labels-idx1-ubyte.gz` (the names
  `keras/src/datasets/fashion_mnist.py` asks for).
* MNIST: `mnist.npz` (the file `keras.datasets.mnist.load_data` reads), from
  `data_dir` or an existing Keras cache (`$KERAS_HOME` or `~/.keras`).

Importing this module does not import Keras; `prepare_keras_home` must run
before Keras is first imported, because Keras reads `KERAS_HOME` once at
import time.
"""

import os

__all__ = ["DATASETS", "DEFAULT_DATA_DIRS", "prepare_keras_home", "load"]

#: Files each data set needs, relative to `$KERAS_HOME/datasets/`.
DATASETS = {
    "fashion_mnist": ("fashion-mnist", (
        "train-labels-idx1-ubyte.gz",
        "train-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
    )),
    "mnist": ("", ("mnist.npz",)),
}

#: Files Keras checks by hash (and re-downloads when they differ).
_SHA256 = {
    "mnist": {"mnist.npz": "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc"
                           "48468fc17b673d1"},
}


def _sha256(path):
  import hashlib  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


#: Where the data sets' files are looked for when no `data_dir` is given.
DEFAULT_DATA_DIRS = {
    "fashion_mnist": "/usr/share/datasets/fashion-mnist",
    "mnist": "/usr/share/datasets/mnist",
}


def _candidate_dirs(dataset, data_dir):
  subdir, _ = DATASETS[dataset]
  dirs = []
  if data_dir:
    dirs.append(data_dir)
  else:
    dirs.append(DEFAULT_DATA_DIRS[dataset])
  # Existing Keras caches (read only: we link from them).
  for home in (os.environ.get("KERAS_HOME"),
               os.path.join(os.path.expanduser("~"), ".keras")):
    if home:
      dirs.append(os.path.join(home, "datasets", subdir))
  return dirs


def prepare_keras_home(dataset, data_dir, keras_home):
  """Links the data set's files into `keras_home` and sets `KERAS_HOME`.

  Args:
    dataset: "fashion_mnist" or "mnist".
    data_dir: folder with the files, or None for the default (the Debian
      package's folder for Fashion-MNIST; existing Keras caches for both).
    keras_home: the private Keras home to create/fill.

  Returns:
    The folder the files were taken from.

  Raises:
    ValueError: for an unknown data set.
    FileNotFoundError: if no candidate folder holds every file (with the
      command that installs them).
  """
  if dataset not in DATASETS:
    raise ValueError(f"Unknown dataset {dataset!r}; expected one of "
                     f"{sorted(DATASETS)}.")
  subdir, files = DATASETS[dataset]
  target = os.path.join(os.path.abspath(keras_home), "datasets", subdir)
  tried = []
  source = None
  for d in _candidate_dirs(dataset, data_dir):
    tried.append(d)
    if all(os.path.isfile(os.path.join(d, f)) for f in files):
      source = d
      break
  if source is None:
    hint = {
        "fashion_mnist": "apt-get install -y dataset-fashion-mnist (files in "
                         "/usr/share/datasets/fashion-mnist), or pass "
                         "--data_dir=FOLDER holding " + ", ".join(files),
        "mnist": "put mnist.npz (the file keras.datasets.mnist.load_data "
                 "reads) in --data_dir=FOLDER or in ~/.keras/datasets/; this "
                 "machine cannot download it",
    }[dataset]
    raise FileNotFoundError(
        f"{dataset}: none of {tried} holds all of {list(files)}. {hint}.")
  os.makedirs(target, exist_ok=True)
  for f in files:
    src = os.path.abspath(os.path.join(source, f))
    dst = os.path.join(target, f)
    if os.path.realpath(dst) == os.path.realpath(src):
      continue
    if os.path.lexists(dst):
      os.remove(dst)
    try:
      os.symlink(src, dst)
    except OSError:
      import shutil  # pylint: disable=g-import-not-at-top
      shutil.copyfile(src, dst)
  os.environ["KERAS_HOME"] = os.path.abspath(keras_home)
  return source


def load(dataset):
  """`(x_train, y_train), (x_test, y_test)`: float32 images in [0, 1], NHWC.

  Call `prepare_keras_home` first (before Keras is imported).
  """
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  home = os.environ.get("KERAS_HOME") or os.path.join(
      os.path.expanduser("~"), ".keras")
  subdir, files = DATASETS[dataset]
  missing = [f for f in files
             if not os.path.isfile(os.path.join(home, "datasets", subdir, f))]
  if missing:
    # keras would try to download them; this machine cannot.
    raise FileNotFoundError(
        f"{dataset}: {missing} not in the Keras cache {home}/datasets/"
        f"{subdir}; call prepare_keras_home before importing keras.")
  expected = _SHA256.get(dataset, {})
  for f, digest in expected.items():
    path = os.path.join(home, "datasets", subdir, f)
    if _sha256(path) != digest:
      # keras.datasets would delete it and try to download the real one.
      raise FileNotFoundError(
          f"{dataset}: {os.path.realpath(path)} is not the file Keras "
          f"expects (sha256 differs from {digest}), and this machine cannot "
          f"download it.")
  loader = getattr(keras.datasets, dataset)
  (x_train, y_train), (x_test, y_test) = loader.load_data()

  def prep(x):
    return (x.astype(np.float32) / 255.0)[..., None]

  return ((prep(x_train), y_train.astype(np.int32)),
          (prep(x_test), y_test.astype(np.int32)))
