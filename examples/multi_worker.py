r"""model.fit on several workers with ndq_tf.MultiWorkerMirroredStrategy.

Every worker runs this same program; `TF_CONFIG` tells each who it is. On one
machine, `ndq_tf.launch` starts the workers with a `TF_CONFIG` each:

  python -m ndq_tf.launch --num_workers 2 --timeout 600 -- \
      python examples/multi_worker.py --codec=dqsg:num_levels=3

Trains an MLP on scikit-learn's digits (installed offline). Gradients cross
workers as one compressed all-gather per step; every worker ends with the same
weights. `BackupAndRestore` saves the model (and the dither's step counter)
every `--save_freq` batches: kill a worker, start the job again with the
same `--backup_dir`, and training resumes where the backup left it. Without
`--backup_dir`, each worker backs up in a new temporary directory of its
own (printed), which no other job reads.

On several hosts, start the program on each with a `TF_CONFIG` naming all of
them (same "cluster", own "task.index"). TF's gRPC transport is neither
authenticated nor encrypted: use a trusted network only.
"""

import json
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np

_CODEC = flags.DEFINE_string(
    "codec", "dqsg:num_levels=3",
    "Codec spec: a name (float32, float16, dqsg, half_dithered, ndqsg, qsgd, "
    "terngrad) optionally followed by ':key=value,...' constructor "
    "arguments, as in ndq_tf.codecs.get.")
_REFERENCE_WORKERS = flags.DEFINE_float(
    "reference_workers", 0.5,
    "Nested codecs (ndqsg) only: workers (a count, or a fraction if < 1) that "
    "send the reference codec DQSG num_levels=3, decoded first.")
_EPOCHS = flags.DEFINE_integer("epochs", 5, "Training epochs.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 64, "Global batch size (split across the workers).")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Width of the hidden layer.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 4e-3, "Adam's step size.")
_MIN_ELEMENTS = flags.DEFINE_integer(
    "min_elements", 256, "Gradients with fewer elements travel losslessly.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the dither.")
_BACKUP_DIR = flags.DEFINE_string(
    "backup_dir", None,
    "BackupAndRestore directory; each worker uses its own subdirectory. "
    "Default: a new temporary directory of this job (printed; pass it again "
    "to resume), never one shared with other jobs or users. Empty to "
    "disable.")
_SAVE_FREQ = flags.DEFINE_integer(
    "save_freq", 10, "Back up every this many batches.")
_CLUSTER_TIMEOUT = flags.DEFINE_float(
    "cluster_timeout", 120.0,
    "Seconds to wait for all workers at start-up before failing.")
_COLLECTIVE_TIMEOUT = flags.DEFINE_float(
    "collective_timeout", 300.0,
    "Seconds a collective may wait for a lost worker before failing.")


def load_digits(seed):
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  x = (data.data / 16.0).astype("float32")
  return model_selection.train_test_split(
      x, data.target.astype("int32"), test_size=0.25, random_state=seed,
      stratify=data.target)


def make_strategy():
  import ndq_tf  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from ndq_tf.distribute import multi_worker  # pylint: disable=g-import-not-at-top
  codec = ndq_tf.codecs.get(_CODEC.value)
  kwargs = {}
  if codec.needs_side_information:
    reference = _REFERENCE_WORKERS.value
    kwargs["reference_codec"] = ndq_tf.DitheredCodec(num_levels=3)
    kwargs["reference_group"] = (int(reference) if reference >= 1
                                 else reference)
  return multi_worker.MultiWorkerMirroredStrategy(
      codec=codec, min_elements=_MIN_ELEMENTS.value, seed=_SEED.value,
      cluster_timeout=_CLUSTER_TIMEOUT.value,
      communication_options=tf.distribute.experimental.CommunicationOptions(
          timeout_seconds=_COLLECTIVE_TIMEOUT.value),
      **kwargs)


def main(argv):
  del argv
  strategy = make_strategy()  # First: MWMS must start before other TF calls.
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  worker = strategy.cluster_resolver.task_id or 0
  x_train, x_test, y_train, y_test = load_digits(_SEED.value)
  keras.utils.set_random_seed(_SEED.value)

  # Each worker reads its shard of every global batch.
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.DATA)
  train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(
      len(x_train), seed=_SEED.value).batch(
          _BATCH_SIZE.value, drop_remainder=True).with_options(options)
  test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(
      _BATCH_SIZE.value).with_options(options)

  with strategy.scope():
    model = keras.Sequential([
        keras.Input((x_train.shape[1],)),
        keras.layers.Dense(_HIDDEN.value, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(keras.optimizers.Adam(_LEARNING_RATE.value),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

  import ndq_tf  # pylint: disable=g-import-not-at-top
  # Adds wire_bits_per_element and compression_ratio to the logs.
  callbacks = [ndq_tf.CompressionStats()]
  if _BACKUP_DIR.value is None:
    # A fixed path under /tmp would be shared by every job and user of the
    # host: a second job could resume from someone else's backup.
    worker_dir = tempfile.mkdtemp(prefix=f"ndq_tf_backup_worker{worker}_")
    print(f"worker {worker}: backups in {worker_dir} (this job only; pass "
          f"--backup_dir to make a job that can be resumed)", flush=True)
  elif _BACKUP_DIR.value:
    # Keras 3's BackupAndRestore is not multi-worker aware: one directory per
    # worker avoids two writers on one file.
    worker_dir = os.path.join(_BACKUP_DIR.value, f"worker{worker}")
  else:
    worker_dir = None
  if worker_dir:
    callbacks.append(keras.callbacks.BackupAndRestore(
        worker_dir, save_freq=_SAVE_FREQ.value))
  start = time.time()
  model.fit(train, epochs=_EPOCHS.value, verbose=2, callbacks=callbacks)
  seconds = time.time() - start
  _, accuracy = model.evaluate(test, verbose=0)
  # This worker's last compressed exchange (ndq_tf.core.telemetry):
  # its framed payload and the small tensors it sent losslessly beside it.
  stats = strategy.compression_stats()
  weights = np.concatenate([v.numpy().ravel() for v in model.weights])
  sent = stats["sent_bits"]
  float32 = 32 * stats["local_senders"] * (stats["compressed_elements"]
                                           + stats["lossless_elements"])
  ratio = stats["compression_ratio"]
  print(json.dumps({
      "worker": worker,
      "codec": _CODEC.value,
      "test_accuracy": round(float(accuracy), 4),
      "train_seconds": round(seconds, 2),
      "compression_step": int(strategy.compression_step.numpy()),
      "sent_bits_per_step": sent,
      "float32_bits_per_step": float32,
      "compression_ratio": round(ratio, 2) if sent else None,
      # Equal on every worker: the weights are bitwise identical.
      "weights_checksum": float(np.sum(weights.astype(np.float64))),
  }))


if __name__ == "__main__":
  app.run(main)
