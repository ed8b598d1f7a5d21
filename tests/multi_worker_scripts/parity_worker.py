"""The checks of tests/integration/test_strategy_parity.py, for either strategy.

`run_checks(make_strategy, out_dir)` runs every parity check with strategies
built by `make_strategy(codec, **kwargs)` and returns a JSON-able dict.
tests/integration/test_strategy_parity.py calls it in its own process with
`ndq_tf.MirroredStrategy` on two logical CPUs; run as a script (on every
worker of a 2-worker job started by `ndq_tf/launch.py`), it calls it with
`ndq_tf.MultiWorkerMirroredStrategy` and prints one line
`PARITY {"worker": i, ...}`.

Every replica (a logical CPU of the MirroredStrategy, or a worker) draws its
own inputs from its `replica_id_in_sync_group`, so both strategies see the
same two senders with the same data, the same dither seeds and the same
codecs: results that do not depend on the transport are compared across
strategies by the test.

Weights are reported as one SHA-256 digest per local replica (of the raw
bytes of every weight), so the test compares replicas and workers bitwise.
"""

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time

# Tensors with fewer elements travel losslessly. The MLP's first kernel
# (64 x 32 = 2048 elements) is compressed; its other weights are not.
MIN_ELEMENTS = 1000
INPUTS, HIDDEN, CLASSES = 64, 32, 10
# The embedding model: VOCAB x EMBED = 8000 elements in its IndexedSlices
# gradient (compressed only with compress_indexed_slices=True); its
# TOKENS·EMBED x HIDDEN kernel (4096 elements) is always compressed.
VOCAB, EMBED, TOKENS = 500, 16, 8
BATCH = 16  # Per replica.
STEPS = 3
SEED = 7
# A worker that builds a strategy seconds after its peer: worker 0 waits this
# long before the multi-worker job's strategy of this index (the spec-string
# codec's is 1, the config dict's 2).
LAGGED_STRATEGY, LAG_SECONDS = 2, 2.0



class NoEncode:
  """Has every codec method but `encode`: not a codec."""

  def decode(self, *args):
    del args

  def to_wire(self, *args):
    del args

  def from_wire(self, *args):
    del args

  def wire_bits(self, *args):
    del args


def _digest(arrays):
  h = hashlib.sha256()
  for a in arrays:
    h.update(a.tobytes())
  return h.hexdigest()


def _replica_digests(strategy, variables):
  """One digest per local replica of all `variables`' values."""
  # A Keras variable's `value` is the strategy's distributed variable.
  per_variable = [
      [v.numpy() for v in strategy.experimental_local_results(var.value)]
      for var in variables]
  num_local = len(per_variable[0])
  return [_digest([values[r] for values in per_variable])
          for r in range(num_local)]


def _state_bits(engine):
  """The engine's step and noise state, bitwise (NaN rows included)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  noise = {}
  if engine.nested_state is not None:
    for signature, (scale, gain) in engine.nested_state.items():
      noise[signature] = {
          "shape": list(scale.shape),
          "scale": scale.numpy().view(np.uint32).tolist(),
          "gain": gain.numpy().view(np.uint32).tolist(),
      }
  return {"step": int(engine.step.numpy()), "noise": noise}


def _mlp(keras):
  return keras.Sequential([
      keras.Input((INPUTS,)),
      keras.layers.Dense(HIDDEN, activation="relu"),
      keras.layers.Dense(CLASSES),
  ])


def _embedding_model(keras):
  return keras.Sequential([
      keras.Input((TOKENS,), dtype="int32"),
      keras.layers.Embedding(VOCAB, EMBED),
      keras.layers.Flatten(),
      keras.layers.Dense(HIDDEN, activation="relu"),
      keras.layers.Dense(CLASSES),
  ])


def _inputs(tf, embedding, replica, step):
  """A replica's batch at a step: its own data, the same in both strategies."""
  seed = tf.stack([tf.cast(replica, tf.int32) + 100, tf.cast(step, tf.int32)])
  if embedding:
    x = tf.random.stateless_uniform([BATCH, TOKENS], seed=seed, maxval=VOCAB,
                                    dtype=tf.int32)
  else:
    x = tf.random.stateless_normal([BATCH, INPUTS], seed=seed)
  y = tf.random.stateless_uniform([BATCH], seed=seed + 1, maxval=CLASSES,
                                  dtype=tf.int32)
  return x, y


def _train(strategy, embedding=False, steps=STEPS):
  """Builds and trains a model with a custom loop; returns (model, record)."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(42)
  with strategy.scope():
    model = _embedding_model(keras) if embedding else _mlp(keras)
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    optimizer.build(model.trainable_variables)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                       reduction="sum")
  global_batch = BATCH * strategy.num_replicas_in_sync
  sparse = []

  @tf.function
  def train_step(step):
    def step_fn():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      x, y = _inputs(tf, embedding, replica, step)
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True)) / global_batch
      grads = tape.gradient(loss, model.trainable_variables)
      sparse[:] = [isinstance(g, tf.IndexedSlices) for g in grads]
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    return strategy.reduce("SUM", strategy.run(step_fn), axis=None)

  losses = [float(train_step(tf.constant(i))) for i in range(steps)]
  return model, {
      "losses": losses,
      "any_sparse_gradient": any(sparse),
      "stats": strategy.compression_stats(),
      "digests": _replica_digests(strategy, model.weights),
  }


def check_bad_codecs(make_strategy):
  """Not-a-codec arguments: the error type and message of each."""
  import ndq_tf  # pylint: disable=g-import-not-at-top
  cases = {
      "class": ndq_tf.DitheredCodec,
      "none": None,
      "no_encode": NoEncode(),
      "not_a_spec": "not a codec spec",
  }
  out = {}
  for name, codec in cases.items():
    try:
      make_strategy(codec)
      out[name] = {"error": None}
    except Exception as e:  # pylint: disable=broad-except
      out[name] = {"error": type(e).__name__, "message": str(e)}
  return out


def _compressed_scope():
  """`ndq_tf.distribute.compressed()`: makes user all-reduces candidates.

  With gradient detection only gradient aggregation and all-reduces built
  in this scope are compressed; without it (no such scope), every SUM or
  MEAN all-reduce was a candidate.
  """
  import ndq_tf  # pylint: disable=g-import-not-at-top
  return getattr(ndq_tf.distribute, "compressed", contextlib.nullcontext)()


def check_error_policy(strategy):
  """What travels losslessly (exact, no compressed exchange), and controls.

  Six all-reduces, one of two values, in one `tf.function` (one
  trace), all asked to be compressed (`compressed()`; the innermost scope
  wins, so `uncompressed()` inside it opts out): the engine splits each
  call into lossless and compressed values, and the step counter advances
  once per call with a compressed value.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  engine = strategy.compression_engine
  n = 2 * MIN_ELEMENTS
  # call: (reduce op, inside uncompressed(), {case: (size, dtype)}); the
  # last call's telemetry is reported. One dtype per call: TF refuses
  # others (MirroredStrategy keeps int32 on the host, the collective
  # all-reduce concatenates the values it reduces).
  calls = {
      "opted_out": ("SUM", True, {
          "float_uncompressed_sum": (n, tf.float32)}),
      "int32_sum": ("SUM", False, {"int32_sum": (n, tf.int32)}),
      "int32_mean": ("MEAN", False, {"int32_mean": (n, tf.int32)}),
      "int64_sum": ("SUM", False, {"int64_sum": (n, tf.int64)}),
      "sum": ("SUM", False, {
          "float_below_min_elements": (MIN_ELEMENTS - 1, tf.float32),
          "float_compressed_sum": (n, tf.float32)}),
      "mean": ("MEAN", False, {
          "float_compressed_mean": (n, tf.float32)}),
  }

  def replica_value(replica, size, dtype):
    if dtype.is_integer:
      # The mean over the two replicas is an integer too.
      return tf.cast(tf.range(size) * (2 * replica + 1) - 6 * replica, dtype)
    # Values that DQSG cannot reproduce exactly (not one magnitude).
    base = tf.range(size, dtype=tf.float32) / size - 0.3
    return base * tf.cast(replica + 1, tf.float32) + 0.01 * tf.cast(
        replica, tf.float32)

  @tf.function
  def reduce_all():
    def fn():
      ctx = tf.distribute.get_replica_context()
      out = {}
      with _compressed_scope():
        for op, opt_out, cases in calls.values():
          values = {name: replica_value(ctx.replica_id_in_sync_group, *spec)
                    for name, spec in cases.items()}
          if opt_out:
            with ndq_tf.distribute.uncompressed():
              out.update(ctx.all_reduce(op, values))
          else:
            out.update(ctx.all_reduce(op, values))
      return out
    return strategy.run(fn)

  before = int(engine.step.numpy())
  reduced = reduce_all()
  out = {"steps": int(engine.step.numpy()) - before,
         "stats": strategy.compression_stats()}
  for op, _, cases in calls.values():
    for name, (size, dtype) in cases.items():
      results = [r.numpy() for r in
                 strategy.experimental_local_results(reduced[name])]
      values = [replica_value(tf.constant(r), size, dtype).numpy()
                for r in range(2)]
      want = values[0] + values[1]
      if op == "MEAN":
        want = want // 2 if dtype.is_integer else want / 2
      out[name] = {
          "dtype": results[0].dtype.name,
          # By value: TF's MEAN of integers is float64.
          "exact": all(r.shape == want.shape and np.array_equal(r, want)
                       for r in results),
          "max_error": max(
              float(np.max(np.abs(r.astype(np.float64) - want)))
              for r in results),
          "max_value": float(np.max(np.abs(want))),
          "digests": [_digest([r]) for r in results],
      }
  return out


def _nested_kwargs(adaptive=True):
  import ndq_tf  # pylint: disable=g-import-not-at-top
  return dict(
      reference_codec=ndq_tf.DitheredCodec(num_levels=1), reference_group=0.5,
      adaptive=adaptive, min_elements=MIN_ELEMENTS, seed=SEED)


def _nested_codec():
  import ndq_tf  # pylint: disable=g-import-not-at-top
  return ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)


def check_nested_and_checkpoint(make_strategy, out_dir):
  """A nested adaptive run; its engine saved and restored two ways."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = make_strategy(_nested_codec(), **_nested_kwargs())
  model, record = _train(strategy, steps=STEPS + 1)
  engine = strategy.compression_engine
  saved = _state_bits(engine)
  out = {"train": record, "saved": saved}

  path = tf.train.Checkpoint(compression=engine).write(
      os.path.join(out_dir, "engine", "ckpt"))
  weights = os.path.join(out_dir, "model.weights.h5")
  model.save_weights(weights)

  # tf.train.Checkpoint into a new strategy's engine, before any exchange.
  fresh = make_strategy(_nested_codec(), **_nested_kwargs())
  fresh_engine = fresh.compression_engine
  # The noise-state variables are made on first use: their restore waits.
  tf.train.Checkpoint(compression=fresh_engine).read(
      path).assert_existing_objects_matched()
  out["checkpoint_before_use"] = _state_bits(fresh_engine)
  # The noise state of the saved plan, asked for as the next exchange would.
  for signature, noise in saved["noise"].items():
    fresh_engine.nested_state.variables_for(signature, *noise["shape"])
  out["checkpoint"] = _state_bits(fresh_engine)

  # model.save_weights / load_weights (.weights.h5) into a new model.
  import keras  # pylint: disable=g-import-not-at-top
  fresh = make_strategy(_nested_codec(), **_nested_kwargs())
  with fresh.scope():
    restored = _mlp(keras)
  restored.load_weights(weights)
  out["weights_h5"] = _state_bits(fresh.compression_engine)
  out["weights_h5_model_equal"] = (
      _replica_digests(fresh, restored.weights) ==
      _replica_digests(strategy, model.weights))
  return out


def run_checks(make_strategy, out_dir):
  """Every parity check; a JSON-able dict.

  Strategies are few (each costs a trace): the spec-string codec trains the
  embedding model with its `IndexedSlices` lossless (the default), then
  runs the error policy; the config-dict codec trains it with
  `compress_indexed_slices=True`; the nested codec trains the MLP and is
  checkpointed.
  """
  import ndq_tf  # pylint: disable=g-import-not-at-top
  out = {"bad_codecs": check_bad_codecs(make_strategy)}
  spec = make_strategy("dqsg:num_levels=3", min_elements=MIN_ELEMENTS,
                       seed=SEED)
  _, out["spec"] = _train(spec, embedding=True)
  out["spec"]["codec"] = repr(spec.compression_engine.options.codec)
  out["error_policy"] = check_error_policy(spec)
  config = ndq_tf.codecs.serialize(ndq_tf.DitheredCodec(num_levels=3))
  as_dict = make_strategy(config, min_elements=MIN_ELEMENTS, seed=SEED,
                          compress_indexed_slices=True)
  _, out["dict"] = _train(as_dict, embedding=True)
  out["dict"]["codec"] = repr(as_dict.compression_engine.options.codec)
  out["nested"] = check_nested_and_checkpoint(make_strategy, out_dir)
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--out_dir", required=True,
                 help="Checkpoints go to <out_dir>/worker<i>.")
  args = p.parse_args()
  import ndq_tf  # pylint: disable=g-import-not-at-top

  made = []  # The task ids of the strategies built so far.

  def make_strategy(codec, reference_group=None, **kwargs):
    if reference_group is not None:
      kwargs["reference_group"] = reference_group
    if len(made) == LAGGED_STRATEGY and made[0] == 0:
      # Worker 1 builds this strategy first and starts its agreement check
      # before worker 0 builds its own: worker 0 must not restart the
      # collective server under it (tf_internals.collective_server_serves).
      time.sleep(LAG_SECONDS)
    strategy = ndq_tf.MultiWorkerMirroredStrategy(
        codec=codec, cluster_timeout=60, **kwargs)
    made.append(strategy.cluster_resolver.task_id)
    return strategy

  # The first strategy forms the cluster; later ones reuse it.
  worker = make_strategy("dqsg").cluster_resolver.task_id
  out_dir = os.path.join(args.out_dir, f"worker{worker}")
  os.makedirs(out_dir, exist_ok=True)
  results = run_checks(make_strategy, out_dir)
  print("PARITY " + json.dumps({"worker": worker, "results": results}),
        flush=True)
  sys.stderr.flush()
  # TF's collective runtime takes seconds to shut down; every exchange is
  # done and every result printed.
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
