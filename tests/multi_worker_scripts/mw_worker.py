"""One worker of the multi-worker tests (started by `ndq_tf.launch`).

Trains a tiny MLP with `ndq_tf.MultiWorkerMirroredStrategy` and writes what the
test checks to `<out_dir>/worker<i>.npz`: the weights, the compression step
before and after training, and the telemetry of the last exchange
(`strategy.compression_stats()`) with the nested sender's noise gains.

Modes: `fit` (model.fit, optionally with BackupAndRestore and a worker that
dies at a given global step) and `ctl` (a custom training loop with
`strategy.run`). `--step_offset` shifts one worker's compression step to
provoke the step-mismatch error.

`--scenarios '{"name": [args...], ...}'` (JSON) runs several such runs one
after the other in this process, in the given order (the same on every
worker), each with its own strategy, model and optimizer, from
`keras.utils.set_random_seed`, into `<out_dir>/<name>/worker<i>.npz`; then
the worker prints one line `MW {"worker": i, "results": [names...]}` (for
tests/multi_worker_job.py). A run with `--expect_error CLASS` (a class of
`tf.errors`, e.g. the step-mismatch error) must raise that error: the worker
catches TF's errors for that run only and writes `{"error": the class name,
"message": its text}` (both null if nothing was raised) to
`<out_dir>/<name>/worker<i>.json` instead of the results, then goes on (the
test checks the class: another error fails that test, not the others').
"""

import argparse
import contextlib
import json
import os
import sys

import numpy as np

# Only the gradient all-reduce goes through the codec, and only the first
# kernel (64 x 32 = 2048 elements) reaches MIN_ELEMENTS.
MIN_ELEMENTS = 1000
INPUTS, HIDDEN, CLASSES = 64, 32, 10
GLOBAL_BATCH = 32


def _parser():
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--mode", choices=["fit", "ctl"], default="fit",
                 help="model.fit or a custom training loop.")
  p.add_argument("--out_dir", required=True, help="Where results go.")
  p.add_argument("--steps", type=int, default=20, help="Steps per epoch.")
  p.add_argument("--epochs", type=int, default=1, help="Epochs (fit only).")
  p.add_argument("--backup_dir", default=None,
                 help="BackupAndRestore directory (a subdirectory per worker).")
  p.add_argument("--save_freq", default="5",
                 type=lambda v: v if v == "epoch" else int(v),
                 help="BackupAndRestore save_freq: batches, or 'epoch'.")
  p.add_argument("--die_at_step", type=int, default=None,
                 help="Global step at which --die_worker exits with code 3.")
  p.add_argument("--die_worker", type=int, default=1,
                 help="Worker that dies at --die_at_step.")
  p.add_argument("--step_offset", type=int, default=0,
                 help="Added to worker 1's compression step before training.")
  p.add_argument("--num_levels", type=int, default=3,
                 help="DitheredCodec levels.")
  p.add_argument("--eager", action="store_true",
                 help="ctl: run the train step eagerly (no tf.function).")
  p.add_argument("--nested", action="store_true",
                 help="Worker 1 sends NestedDitheredCodec(coarse_ratio=3), "
                      "worker 0 the reference DitheredCodec(num_levels=1).")
  p.add_argument("--adaptive", action="store_true",
                 help="With --nested: the automatic mode (adaptive=True).")
  p.add_argument("--powersgd", type=int, default=0,
                 help="A rank: ndq_tf.PowerSGD with DQSG M=3 factors, "
                      "from step 3.")
  p.add_argument("--chunk_elements", type=int, default=None,
                 help="The strategy's chunk_elements (default: its own).")
  p.add_argument("--scenarios", type=json.loads, default=None,
                 help="JSON {name: [arguments]}: runs each, in order, into "
                      "<out_dir>/<name> (the other arguments are ignored).")
  p.add_argument("--expect_error", default=None,
                 help="With --scenarios, in a run's arguments: the class of "
                      "tf.errors the run must raise; TF's errors are caught "
                      "and recorded in <out_dir>/worker<i>.json.")
  return p


def _data(worker):
  rng = np.random.RandomState(1234)
  x = rng.randn(512, INPUTS).astype("float32")
  w = rng.randn(INPUTS, CLASSES).astype("float32")
  y = np.argmax(x @ w, axis=1).astype("int32")
  return x, y


def main():
  parser = _parser()
  args = parser.parse_args()
  if args.scenarios is None:
    _run(args)
    return 0
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  for name, scenario in args.scenarios.items():
    print(f"scenario {name}", flush=True)
    run_args = parser.parse_args(
        list(scenario) + ["--out_dir", os.path.join(args.out_dir, name)])
    if run_args.expect_error is None:
      _run(run_args)
    else:
      _run_expecting_error(run_args, worker)
  print("MW " + json.dumps({"worker": worker,
                            "results": list(args.scenarios)}), flush=True)
  return 0


def _run_expecting_error(args, worker):
  """Runs `args`, which must raise `tf.errors.<args.expect_error>`.

  Writes the class name and text of the `tf.errors.OpError` it raised
  (`None` for both if it raised none) to `<args.out_dir>/worker<worker>.json`
  for the test to check. Any other exception propagates.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  expected = getattr(tf.errors, args.expect_error)
  try:
    _run(args)
    outcome = {"error": None, "message": None}
  except tf.errors.OpError as e:
    outcome = {"error": type(e).__name__, "message": str(e)}
    print(f"{'expected' if isinstance(e, expected) else 'UNEXPECTED'} "
          f"{outcome['error']} caught", flush=True)
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, f"worker{worker}.json"), "w") as f:
    json.dump(outcome, f)


def _run(args):
  """One run: its strategy, model and training; returns the worker's index.

  Writes the results to `<args.out_dir>/worker<i>.npz`.
  """
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  from ndq_tf.distribute import multi_worker  # pylint: disable=g-import-not-at-top

  if args.nested:
    codecs = [ndq_tf.DitheredCodec(num_levels=1),
              ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)]
    strategy = multi_worker.MultiWorkerMirroredStrategy(
        codec=codecs[1], reference_codec=codecs[0], reference_group=1,
        adaptive=args.adaptive, min_elements=MIN_ELEMENTS, seed=7,
        cluster_timeout=60)
  elif args.powersgd:
    codecs = [ndq_tf.PowerSGD(rank=args.powersgd,
                              factor_codec="dqsg:num_levels=3",
                              start_step=3)] * 2
    strategy = multi_worker.MultiWorkerMirroredStrategy(
        codec=codecs[0], min_elements=MIN_ELEMENTS, seed=7,
        cluster_timeout=60)
  else:
    codecs = [ndq_tf.DitheredCodec(num_levels=args.num_levels)] * 2
    chunks = ({} if args.chunk_elements is None
              else {"chunk_elements": args.chunk_elements})
    strategy = multi_worker.MultiWorkerMirroredStrategy(
        codec=codecs[0], min_elements=MIN_ELEMENTS, seed=7,
        cluster_timeout=60, **chunks)
  worker = strategy.cluster_resolver.task_id
  codec = codecs[worker]
  os.makedirs(args.out_dir, exist_ok=True)
  keras.utils.set_random_seed(42)  # Same on every worker; weights broadcast.

  x, y = _data(worker)
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((INPUTS,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    model.compile(optimizer,
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  if worker == 1 and args.step_offset:
    strategy.compression_step.assign_add(args.step_offset)

  engine = strategy.compression_engine
  record = {"step_before": None}

  if args.mode == "fit":
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        GLOBAL_BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA)
    ds = ds.with_options(options)

    class Probe(keras.callbacks.Callback):
      """Records the step the first exchange uses; dies when asked."""

      def on_train_batch_begin(self, batch, logs=None):
        if record["step_before"] is None:
          record["step_before"] = int(strategy.compression_step.numpy())
          record["iterations_before"] = int(optimizer.iterations.numpy())
          print(f"first batch: compression step {record['step_before']}",
                flush=True)

      def on_train_batch_end(self, batch, logs=None):
        step = int(optimizer.iterations.numpy())
        if args.die_at_step is not None and worker == args.die_worker and (
            step >= args.die_at_step):
          print(f"worker {worker} dies at step {step}", flush=True)
          os._exit(3)  # pylint: disable=protected-access

    callbacks = []
    if args.backup_dir:
      callbacks.append(keras.callbacks.BackupAndRestore(
          os.path.join(args.backup_dir, f"worker{worker}"),
          save_freq=args.save_freq, delete_checkpoint=False))
    callbacks.append(Probe())
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps, verbose=2,
              callbacks=callbacks)
  else:
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        GLOBAL_BATCH)
    dist = iter(strategy.experimental_distribute_dataset(ds))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum")

    def train_step(iterator):
      def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
          logits = model(features, training=True)
          loss = loss_fn(labels, logits) / GLOBAL_BATCH
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        # A user all-reduce big enough to be compressed and asked to be
        # (`compressed()`, where it exists), opted out by the innermost
        # scope: exact, and no compressed exchange.
        ctx = tf.distribute.get_replica_context()
        ones = tf.fill([INPUTS * HIDDEN],
                       tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0)
        compressed = getattr(ndq_tf.distribute, "compressed",
                             contextlib.nullcontext)
        with compressed(), ndq_tf.distribute.uncompressed():
          exact = ctx.all_reduce("SUM", ones)
        return loss, tf.reduce_max(tf.abs(exact - 3.0))
      loss, error = strategy.run(step_fn, args=(next(iterator),))
      return (strategy.reduce("SUM", loss, axis=None),
              strategy.reduce("SUM", error, axis=None))

    if not args.eager:
      train_step = tf.function(train_step)
    record["step_before"] = int(strategy.compression_step.numpy())
    record["uncompressed_error"] = 0.0
    record["fallback"] = []
    for i in range(args.steps):
      loss, error = train_step(dist)
      record["fallback"].append(
          strategy.compression_stats()["fallback_fraction"]
          if args.nested else float("nan"))
      record["uncompressed_error"] = max(record["uncompressed_error"],
                                         float(error))
      if i % 5 == 0:
        print(f"step {i} loss {float(loss):.4f}", flush=True)

  stats = strategy.compression_stats()
  # The nested sender's own noise state: one plan (the gradients), one row
  # (this worker); none on a reference worker.
  noise = (engine.nested_state.items() if engine.nested_state is not None
           else [])
  noise_gain = (noise[0][1][1].numpy()[0] if noise else np.full([1], np.nan))
  np.savez(
      os.path.join(args.out_dir, f"worker{worker}.npz"),
      *[v.numpy() for v in model.weights],
      step_before=np.int64(record["step_before"]),
      step_after=np.int64(strategy.compression_step.numpy()),
      iterations=np.int64(optimizer.iterations.numpy()),
      stats_step=np.int64(stats["exchange_count"]),
      senders=np.int64(stats["senders"]),
      local_senders=np.int64(stats["local_senders"]),
      sent_bits=np.int64(stats["sent_bits"]),
      payload_bits=np.int64(stats["payload_bits"]),
      compressed_elements=np.int64(stats["compressed_elements"]),
      lossless_elements=np.int64(stats["lossless_elements"]),
      compression_ratio=np.float64(stats["compression_ratio"]),
      # Chunks of whole buckets (`--chunk_elements` a multiple of 512, a
      # divisor of the kernel's 2048) each pay their own word padding.
      rank=np.int64(stats.get("rank", -1)),
      low_rank_fraction=np.float64(stats.get("low_rank_fraction", np.nan)),
      residual_norm=np.float64(sum(
          float(np.linalg.norm(v.numpy()))
          for v in engine.low_rank.residuals.values())
                               if engine.low_rank is not None else np.nan),
      expected_wire_bits=np.int64(
          -1 if args.powersgd else
          codec.wire_bits(INPUTS * HIDDEN) if args.chunk_elements is None
          else INPUTS * HIDDEN // args.chunk_elements
          * codec.wire_bits(args.chunk_elements)),
      num_weights=np.int64(len(model.weights)),
      ordering_chains=np.int64(getattr(strategy.compressed_all_reduce,
                                       "ordering_chains", 1)),
      uncompressed_error=np.float64(record.get("uncompressed_error", 0.0)),
      fallback=np.asarray(record.get("fallback", []), np.float64),
      overloads=np.int64(stats.get("overloads", -1)),
      nested_elements=np.int64(stats.get("nested_elements", -1)),
      overload_rate=np.float64(stats.get("overload_rate", np.nan)),
      overload_probability=np.float64(
          stats.get("overload_probability", np.nan)),
      num_noise_plans=np.int64(len(noise)),
      noise_gain=noise_gain)
  print("RESULT " + json.dumps({
      "worker": worker,
      "step_after": int(strategy.compression_step.numpy()),
      "sent_bits": stats["sent_bits"]}), flush=True)
  return worker


if __name__ == "__main__":
  exit_code = main()
  sys.stdout.flush()
  sys.stderr.flush()
  # Every exchange is done and every result printed. A normal exit can hang in
  # TF's coordination agent when the chief's process has already gone (its
  # heartbeat fails and the runtime aborts instead of exiting): CI hit it once,
  # worker 1 hanging after its RESULT line until the launcher's timeout.
  os._exit(exit_code)  # pylint: disable=protected-access
