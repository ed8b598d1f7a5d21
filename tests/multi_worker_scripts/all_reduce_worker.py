"""One worker of tests/integration/test_all_reduce_multi_worker.py.

Started by `ndq_tf.launch`.

Issue #11 on real worker processes: `model.fit` for `--steps` steps under
`ndq_tf.MultiWorkerMirroredStrategy(codec, exchange=...)` on a small
model, then one line `ALL_REDUCE {"worker": i, "results": {...}}` with a
SHA-256 of every weight after training and before it (bitwise identity
across workers and scenarios is compared by the test), the shapes of the
trainable weights (the test computes the cost model's bits from them),
the telemetry of the last exchange and the final loss.

`--scenarios '[[name, [arguments]], ...]'` (JSON): the process runs each
scenario in turn, in that order on every worker, each with its own
strategy (later strategies reuse the running collective server), a fresh
model and the same seeds, its arguments added to the command line's (a
later value wins); `results` is then `{name: that scenario's results}`.

`--die_at_step k`: worker `--die_worker` ends its process (exit 3) at the
start of step `k`, in the middle of the job, after printing the time
(`time.time()`): the others are then blocked in the step's collectives
until the launcher stops them.

`--step_offset k`: worker 1 adds `k` to its compression step before
training, so the workers' steps disagree at the first exchange.

`--expect_error Name`: the training must raise `tf.errors.Name` (the test
checks the workers'); the worker catches it, or the `CancelledError` of a
collective of the same step that the error aborted, and the scenario's
results are `{"error": its class name, "message": its message}` (an
error of another class still ends the process). A failed step may leave
the process's collectives aborted, so such a scenario must be the last of
`--scenarios`; this script checks it.

`--reference_codec spec`: a nested group (`--codec` nested, fixed mode).
`--error_feedback`: `reduce_scatter_error_feedback=True`.

`--ecdq_checks`: after training, `ECDQ_STEPS` exchanges of `ecdq_gradient`
with `EntropyCodedDitheredCodec` (variable-length payloads, issue #35)
under each of `ECDQ_EXCHANGES`, through the strategy's own collective
launcher (its exchange engine holds the training's codec): the results
get `"ecdq"`, per exchange the
SHA-256 of every step's sum and the telemetry of the last, and the
seconds they took (about 10 per worker, mostly tracing and XLA compiles:
the second step of each takes 0.01-0.05 s).
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

INPUTS = 32
HIDDEN = 64
CLASSES = 2
BATCH_PER_WORKER = 16
#: `--ecdq_checks`: the codec's config, the seed, values per worker, steps.
ECDQ_CONFIG = {"bits": 1.0, "bucket_size": 128}
ECDQ_SEED = 21
ECDQ_ELEMENTS = 250  # 2 buckets: the shape of `decode_digest`, compiled already.
ECDQ_STEPS = 2
ECDQ_EXCHANGES = ("all_gather", "reduce_scatter")


def ecdq_gradient(worker):
  """Worker `worker`'s values of the ECDQ checks (scales apart by 10x)."""
  rng = np.random.default_rng(100 + worker)
  return (rng.standard_t(4, size=ECDQ_ELEMENTS)
          * 10.0 ** (worker - 1)).astype(np.float32)


def _parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--codec", default="dqsg:num_levels=1",
                 help="Codec spec (ndq_tf.codecs.get).")
  p.add_argument("--transport", default="auto",
                 help="all_gather, all_reduce or auto.")
  p.add_argument("--steps", type=int, default=10, help="model.fit steps.")
  p.add_argument("--die_at_step", type=int, default=None,
                 help="Step at whose start --die_worker exits.")
  p.add_argument("--die_worker", type=int, default=1,
                 help="The worker that dies.")
  p.add_argument("--step_offset", type=int, default=0,
                 help="Added to worker 1's compression step before fit.")
  p.add_argument("--chunk_elements", type=int, default=None,
                 help="The strategy's chunk_elements (default: its own).")
  p.add_argument("--error_feedback", action="store_true",
                 help="reduce_scatter_error_feedback=True.")
  p.add_argument("--ecdq_checks", action="store_true",
                 help="Also exchange ECDQ payloads after training.")
  p.add_argument("--reference_codec", default=None,
                 help="A nested --codec's reference codec (spec); the "
                 "first half of the workers send it (fixed mode).")
  p.add_argument("--expect_error", default=None,
                 help="The tf.errors class (its name) the training must "
                 "raise: caught and reported as the results.")
  p.add_argument("--scenarios", default=None,
                 help="JSON list of [name, [arguments]]: run each in turn "
                 "(the module's doc).")
  return p.parse_args(argv)


def _train(args, worker):
  """Trains a fresh model under a new strategy; returns the results."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top

  start = time.time()
  extra = ({} if args.chunk_elements is None
           else {"chunk_elements": args.chunk_elements})
  if args.reference_codec:
    extra.update(reference_codec=args.reference_codec, adaptive=False)
  if args.error_feedback:
    extra["reduce_scatter_error_feedback"] = True
  strategy = ndq_tf.MultiWorkerMirroredStrategy(
      codec=args.codec, exchange=args.transport, seed=5, **extra,
      communication_options=tf.distribute.experimental.CommunicationOptions(
          timeout_seconds=120))
  num_workers = strategy.num_replicas_in_sync
  keras.utils.set_random_seed(1)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(BATCH_PER_WORKER * num_workers * args.steps,
                       INPUTS)).astype(np.float32)
  y = (x[:, :4].sum(axis=1) > 0).astype(np.int64)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
      BATCH_PER_WORKER * num_workers).repeat()
  with strategy.scope():
    model = keras.Sequential([
        keras.Input((INPUTS,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  initial = _digests(model)
  if worker == 1 and args.step_offset:
    strategy.compression_step.assign_add(args.step_offset)

  class Die(keras.callbacks.Callback):

    def on_train_batch_begin(self, batch, logs=None):
      if batch == args.die_at_step and worker == args.die_worker:
        print(f"worker {worker} dies at step {batch} at {time.time():.3f}",
              flush=True)
        os._exit(3)  # pylint: disable=protected-access

  history = model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0,
                      callbacks=[Die()])
  ecdq = _ecdq_checks(strategy, worker) if args.ecdq_checks else None
  return {
      "ecdq": ecdq,
      "weights": _digests(model),
      "initial_weights": initial,
      "shapes": [list(w.shape) for w in model.trainable_weights],
      "stats": strategy.compression_stats(),
      "loss": float(history.history["loss"][-1]),
      "step": int(strategy.compression_step.numpy()),
      "seconds": time.time() - start,  # From the strategy to the results.
  }


def _run(args, worker):
  """`_train`'s results, or the error it was expected to raise."""
  if args.expect_error is None:
    return _train(args, worker)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    results = _train(args, worker)
  except (getattr(tf.errors, args.expect_error),
          tf.errors.CancelledError) as e:
    # Or a collective of the same step that the error cancelled.
    return {"error": type(e).__name__, "message": str(e)}
  return dict(results, error=None)  # Nothing raised: the test fails.


def _digests(model):
  """The SHA-256 of each of `model`'s weights."""
  return [hashlib.sha256(np.ascontiguousarray(w)).hexdigest()
          for w in model.get_weights()]


def _ecdq_checks(strategy, worker):
  """ECDQ's exchanges over the strategy's launcher (the module's doc)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import ndq_tf  # pylint: disable=g-import-not-at-top
  from ndq_tf.core import engine as engine_lib  # pylint: disable=g-import-not-at-top
  from ndq_tf.core import tf_internals  # pylint: disable=g-import-not-at-top
  from ndq_tf.core import transports  # pylint: disable=g-import-not-at-top

  # pylint: disable=protected-access
  ops = strategy.compressed_all_reduce
  launcher, device, comm = ops._launcher, ops._exchange_device, ops._options
  # pylint: enable=protected-access
  num_workers = ops.num_workers
  gather = transports.CollectiveAllGatherTransport(
      lambda row: tf_internals.all_gather(launcher, row, comm), num_workers,
      worker, device)
  scatter = transports.CollectiveAllToAllTransport(
      lambda rows: tf_internals.all_to_all(launcher, rows, comm), gather,
      num_workers, worker, device)
  start, out = time.time(), {}
  for exchange in ECDQ_EXCHANGES:
    engine = engine_lib.ExchangeEngine(ndq_tf.distribute.CompressionOptions(
        ndq_tf.EntropyCodedDitheredCodec(**ECDQ_CONFIG), exchange=exchange,
        seed=ECDQ_SEED, min_elements=1), device=device)
    with tf.device(device):
      value = tf.constant(ecdq_gradient(worker))

    def run(engine=engine, value=value):
      (summed,) = engine.exchange(
          {"all_gather": gather, "reduce_scatter": scatter},
          [engine_lib.LocalSender(worker, device, [value])], "sum")
      return summed[0]

    run = tf.function(run, autograph=False)
    sums = [hashlib.sha256(run().numpy().tobytes()).hexdigest()
            for _ in range(ECDQ_STEPS)]
    out[exchange] = {"sums": sums, "stats": engine.stats()}
  out["seconds"] = time.time() - start
  return out


def main():
  args = _parse()
  worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  if args.scenarios is None:
    results = _run(args, worker)
  else:
    scenarios = [(name, _parse(sys.argv[1:] + extra))
                 for name, extra in json.loads(args.scenarios)]
    raising = [name for name, a in scenarios if a.expect_error]
    if raising not in ([], [scenarios[-1][0]]):
      raise ValueError(f"Only the last scenario may expect an error: {raising}")
    results = {name: _run(a, worker) for name, a in scenarios}
  print("ALL_REDUCE " + json.dumps({"worker": worker, "results": results}),
        flush=True)
  sys.stdout.flush()
  sys.stderr.flush()
  # Every exchange is done and every result printed; a normal exit can hang in
  # TF's coordination agent once the chief's process has gone.
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
