"""Synchronized BatchNormalization under ndq_tf.MultiWorkerMirroredStrategy: accuracy.

Issue #13: only gradient aggregation is compressed, so the synchronized
statistics stay exact and a sync-BN model trains as with a lossless
all-reduce. One worker of a job (digits, Dense(256) + BatchNormalization
(synchronized=True) + Dense(10), Adam, 8 epochs, global batch 128); run
once per codec and compare (Float32Codec is the lossless control: TF's own
MultiWorkerMirroredStrategy cannot run Keras 3.15's model.fit on two workers,
keras-team/keras#20585):

  for c in float32 dqsg:num_levels=1 dqsg:num_levels=3; do
    python ndq_tf/launch.py --num_workers 2 --timeout 600 -- \
        python benchmarks/sync_bn_multi_worker.py "$c" | grep RESULT
  done
"""
import json, os, sys
import numpy as np
import keras, tensorflow as tf
import ndq_tf
from sklearn import datasets, model_selection
codec = sys.argv[1]
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = ndq_tf.MultiWorkerMirroredStrategy(codec=codec)
data = datasets.load_digits()
x = (data.data / 16.0).astype("float32")
xtr, xte, ytr, yte = model_selection.train_test_split(x, data.target, test_size=0.25, random_state=0, stratify=data.target)
keras.utils.set_random_seed(0)
with strategy.scope():
  model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
      keras.layers.BatchNormalization(synchronized=True, momentum=0.5),
      keras.layers.ReLU(), keras.layers.Dense(10)])
  model.compile(keras.optimizers.Adam(4e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
opts = tf.data.Options(); opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
ds = tf.data.Dataset.from_tensor_slices((xtr, ytr)).batch(128).with_options(opts)
model.fit(ds, epochs=8, verbose=0)
logits = model.predict(xte, verbose=0)
acc = float(np.mean(np.argmax(logits, 1) == yte))
print("RESULT", json.dumps({"codec": codec, "worker": task, "accuracy": acc, "bits": strategy.compression_stats()["sent_bits_per_element"], "step": strategy.compression_stats()["exchange_count"]}), flush=True)
