r"""A custom training loop with compressed gradients, two ways.

1. `--mode=strategy`: `ndq_tf.MirroredStrategy` + `strategy.run` +
   `optimizer.apply_gradients`: the optimizer's gradient all-reduce is
   compressed by the strategy's `CompressedAllReduce`, nothing else changes.
2. `--mode=manual`: the codec used directly inside the replica step, with a
   plain `tf.distribute.MirroredStrategy`: every replica fuses and encodes its
   gradients (`ndq_tf.distribute.encode_fused`), the int32 wires are
   all-gathered (lossless), and every replica decodes all of them in replica
   order (`decode_sum`), so all replicas apply bitwise the same update. This
   is what `CompressedAllReduce` does for you, spelled out.

Both print the loss, the test accuracy, and check that the replicas' weights
are bitwise identical.

Example:

  python examples/custom_training_loop.py --mode=manual --codec=dqsg:num_levels=2
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

_MODE = flags.DEFINE_enum(
    "mode", "strategy", ["strategy", "manual"],
    "strategy: ndq_tf.MirroredStrategy does the compression; manual: the "
    "codec is called in the replica step.")
_CODEC = flags.DEFINE_string(
    "codec", "dqsg:num_levels=3",
    "Codec spec for ndq_tf.codecs.get (name[:key=value,...]); codecs needing "
    "side information (ndqsg) are not supported here.")
_REPLICAS = flags.DEFINE_integer(
    "replicas", 4, "Replicas: logical CPU devices when there is no GPU.")
_STEPS = flags.DEFINE_integer("steps", 200, "Training steps.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 128, "Global batch size.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.3, "SGD step size.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the dither.")


def split_cpu(replicas):
  gpus = tf.config.list_physical_devices("GPU")
  if len(gpus) >= replicas:
    return [f"/gpu:{i}" for i in range(replicas)]
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
  return [d.name for d in tf.config.list_logical_devices("CPU")][:replicas]


def load_digits(seed):
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  x = (data.data / 16.0).astype("float32")
  return model_selection.train_test_split(
      x, data.target.astype("int32"), test_size=0.25, random_state=seed,
      stratify=data.target)


def manual_all_reduce(codec, grads, step, num_replicas):
  """Compressed all-reduce (mean) written with the codec, in replica context.

  Each replica encodes its own gradients with its own seed; the int32 wires
  are all-gathered; every replica decodes every wire in replica order.

  Args:
    codec: an ndq_tf codec.
    grads: this replica's list of dense gradients.
    step: int32 scalar, the same on every replica, new at every step.
    num_replicas: number of replicas.

  Returns:
    The list of mean gradients, bitwise identical on every replica.
  """
  from ndq_tf.core import fusion  # pylint: disable=g-import-not-at-top
  ctx = tf.distribute.get_replica_context()
  plan = fusion.FusionPlan.from_tensors(grads, codec.bucket_size)
  base_seed = tf.constant([_SEED.value, 1], tf.int32)
  seeds = [fusion.derive_seed(base_seed, step, r)
           for r in range(num_replicas)]
  my_seed = tf.gather(tf.stack(seeds), ctx.replica_id_in_sync_group)
  wire = fusion.encode_fused(codec, grads, my_seed, plan)
  # int32 all-gather: lossless; [num_replicas * words] in replica order.
  gathered = ctx.all_gather(wire[None], axis=0)
  wires = tf.unstack(gathered, num=num_replicas, axis=0)
  return fusion.decode_sum(codec, wires, seeds, plan, mean=True)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  devices = split_cpu(_REPLICAS.value)
  import keras  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  import ndq_tf.distribute  # pylint: disable=g-import-not-at-top

  codec = ndq_tf.codecs.get(_CODEC.value)
  if _MODE.value == "strategy":
    strategy = ndq_tf.distribute.MirroredStrategy(
        codec=codec, devices=devices, seed=_SEED.value)
  else:
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
  num_replicas = strategy.num_replicas_in_sync

  x_train, x_test, y_train, y_test = load_digits(_SEED.value)
  dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
             .shuffle(len(x_train), seed=_SEED.value).repeat()
             .batch(_BATCH_SIZE.value, drop_remainder=True))
  iterator = iter(strategy.experimental_distribute_dataset(dataset))

  keras.utils.set_random_seed(_SEED.value)
  with strategy.scope():
    model = keras.Sequential([keras.Input((64,)),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(_LEARNING_RATE.value)
    optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction="sum")

  @tf.function
  def train_step(inputs, step):
    def replica_step(x, y):
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True)) / _BATCH_SIZE.value
      grads = tape.gradient(loss, model.trainable_variables)
      if _MODE.value == "strategy":
        # The optimizer all-reduces (SUM) through CompressedAllReduce.
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
      else:
        # Per-replica gradients of loss / global batch: their sum is the
        # gradient of the mean loss.
        mean = manual_all_reduce(codec, grads, step, num_replicas)
        apply_sgd(model.trainable_variables,
                  [g * num_replicas for g in mean], _LEARNING_RATE.value)
      return loss
    losses = strategy.run(replica_step, args=inputs)
    return strategy.reduce("sum", losses, axis=None)

  for step in range(_STEPS.value):
    loss = train_step(next(iterator), tf.constant(step, tf.int32))
    if step % 50 == 0 or step == _STEPS.value - 1:
      print(f"step {step:4d}  loss {float(loss):.4f}")

  logits = model(x_test, training=False)
  accuracy = float(np.mean(np.argmax(logits, -1) == y_test))
  identical = all(
      all(np.array_equal(c.numpy().view(np.uint8),
                         v.value.values[0].numpy().view(np.uint8))
          for c in v.value.values)
      for v in model.trainable_variables)
  print(f"mode={_MODE.value} codec={codec!r}")
  print(f"test accuracy {accuracy:.4f}; replicas bitwise identical: "
        f"{identical}")
  if _MODE.value == "strategy":
    stats = strategy.compression_stats()
    print(f"wire bits/element {stats['sent_bits_per_element']:.3f}, "
          f"compression ratio {stats['compression_ratio']:.2f}")
  else:
    from ndq_tf.core import fusion  # pylint: disable=g-import-not-at-top
    plan = fusion.FusionPlan.from_tensors(model.trainable_variables,
                                          codec.bucket_size)
    print(f"wire bits/element {plan.wire_bits(codec) / plan.num_elements:.3f}"
          f" (codec payload per replica per step)")
  return 0 if identical else 1


def apply_sgd(variables, grads, learning_rate):
  """Plain SGD with gradients that are already reduced (identical everywhere).

  Mirrored variables are updated in cross-replica context (`merge_call` +
  `extended.update`), each device's copy with that device's gradient.
  """
  def update(strategy, grads):
    for variable, grad in zip(variables, grads):
      strategy.extended.update(
          variable.value, lambda var, g: var.assign_sub(learning_rate * g),
          args=(grad,), group=False)
  tf.distribute.get_replica_context().merge_call(update, args=(grads,))


if __name__ == "__main__":
  app.run(main)
