"""The integer all-reduce (#11) and reduce-scatter (#18) on worker processes.

`ndq_tf.MultiWorkerMirroredStrategy(codec, exchange=...)` in local jobs of
2 and 3 workers on 127.0.0.1 (one CPU device each), started through
`ndq_tf/launch.py` by `multi_worker_job.MultiWorkerJob` and bounded by the
launcher's `--timeout`. Every worker runs
tests/multi_worker_scripts/all_reduce_worker.py: `model.fit` of a
32-64-2 MLP whose only compressed gradient is the 32x64 kernel, 4 buckets
(the others are below `min_elements` and travel losslessly beside it; at
3 workers the reduce-scatter's shards are 2, 1 and 1 buckets; empty
shards are tests/core/exchanges/test_reduce_scatter.py's).

Jobs, all started at once for the file (7 TensorFlow processes): the
scenarios not expected to end a process share ONE job per number of
workers, whose worker processes run them in turn, each under its own
strategy (`--scenarios`; later strategies reuse the running collective
server), from the same initial weights: `p3` and `rs_p3` on 3 workers;
`p2`, `auto2`, `chunks_ag`, `chunks_ar`, `rs_p2`, `nested2`, `feedback2`
and, last, `step_offset` on 2. `step_offset` is expected to raise on
every worker: each catches the error (`--expect_error`) and reports it as
the scenario's results; last, since a failed step may leave the process's
collectives aborted. `die`, whose worker ends its process, is a job of its
own.

The integer all-reduce (`exchange="all_reduce"`):

* `p2`, `p3`: 10 steps on 2 and 3 workers (jobs of 4 and 8 workers were
  dropped for time, issue #31: the lane widths of every P are
  tests/ops/test_lane_ops.py's, and 8 TensorFlow processes cost about as
  much CPU as the rest of the file);
* `auto2`: 3 steps with `exchange="auto"` on 2 workers, where the time
  model picks the all-gather (`rs_p3` asks for `"auto"` on 3, where it
  picks the reduce-scatter);
* `die`: worker 1 exits with code 3 at the start of step 5;
* `step_offset`: worker 1's compression step starts `STEP_OFFSET` ahead,
  past the 24 bits of a float32 stamp word: the first step raises on
  both workers, naming both steps;
* `chunks_ag`, `chunks_ar`: `auto2` and `p2` exchanging the compressed
  kernel (2048 values) in chunks of one bucket (issue #12): the same
  weights.

The reduce-scatter (`exchange="reduce_scatter"`):

* `rs_p3`, `rs_p2`: 10 steps; identical SHA-256 weights on every worker,
  the telemetry's transport and the cost model's link bits. `rs_p3` asks
  for `exchange="auto"`, which the time model resolves to the
  reduce-scatter on 3 or more worker processes on CPUs
  (`cost_model.auto`). After its training `rs_p2` exchanges ECDQ's
  variable-length payloads (issue #35) by the all-gather and the
  reduce-scatter, 2 steps each, over its strategy's collectives
  (`--ecdq_checks`; a few seconds, no new process): both workers' sums are
  bitwise those of the codec's own encode and decode (`ecdq_reference`),
  and the telemetry counts the words used, the length rounds and the
  padding;
* `nested2`: a nested group in the fixed mode (worker 0 sends DQSG,
  worker 1 NDQSG decoded with worker 0's shard as side information), 5
  steps: identical weights, and worker 1 counts its statistics over its
  own shard (2 of the 4 buckets); `feedback2`: `rs_p2` with
  `reduce_scatter_error_feedback=True`: identical weights, the same bits
  on the link, and weights other than `rs_p2`'s (the residual is fed
  back).

Reduce-scatter jobs of 4 and 8 workers and a reduce-scatter `die` were
dropped for time (issue #31): the launcher ends a job whose worker dies
whatever the exchange (`die`).

The expected telemetry is computed here from the shapes the workers report,
with `ndq_tf.theory` and the fusion plan, as `engine._record` does: the
cost model's bits for the compressed buffer plus a float32 ring's for the
lossless values.
"""

import hashlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import ecdq_reference
import multi_worker_job
import ndq_tf
from ndq_tf.core import cost_model
from ndq_tf.core import fusion
from ndq_tf.distribute import options as options_lib

WORKER = os.path.join(multi_worker_job.ROOT, "tests", "multi_worker_scripts",
                      "all_reduce_worker.py")
MARKER = "ALL_REDUCE"
CODEC = "dqsg:num_levels=1"
STEPS = 10
_STEPS = ["--steps", str(STEPS)]
AUTO_STEPS = 3
DIE_AT_STEP = 5
# Worker 1's head start: the stamp splits a step into its low 24 bits and
# the rest, so both halves differ here.
STEP_OFFSET = 2**24 + 3
# The reduce-scatter scenarios'.
TRANSPORT = "reduce_scatter"
NESTED_CODEC = "ndqsg:num_levels=3,coarse_ratio=3"
REFERENCE_CODEC = "dqsg:num_levels=1"
NESTED_STEPS = 5
JOB_TIMEOUT = 300  # Seconds, for each launcher.
# Seconds a failing job may take from the worker's death to the launcher's
# exit: it stops the others at once (2 s of grace); a worker left waiting
# in a collective would wait 120 s (the workers' collective timeout).
STOP_WITHIN = 30


def _load_worker():
  spec = importlib.util.spec_from_file_location("all_reduce_worker", WORKER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


worker = _load_worker()

# name: (workers, transport, worker arguments); the order in which a job's
# workers run its scenarios.
# The exchange in chunks of one bucket (issue #12): the compressed kernel
# (2048 values) travels as 4 chunks; the weights must be those of the
# unchunked `auto2` (the all-gather, 3 steps) and `p2` (all-reduce).
CHUNK = 512
SCENARIOS = {
    "p3": (3, "all_reduce", _STEPS),
    "rs_p3": (3, "auto", _STEPS),
    "p2": (2, "all_reduce", _STEPS),
    "auto2": (2, "auto", ["--steps", str(AUTO_STEPS)]),
    "chunks_ag": (2, "all_gather", ["--steps", str(AUTO_STEPS),
                                    "--chunk_elements", str(CHUNK)]),
    "chunks_ar": (2, "all_reduce", _STEPS + ["--chunk_elements", str(CHUNK)]),
    "rs_p2": (2, TRANSPORT, _STEPS + ["--ecdq_checks"]),
    "nested2": (2, TRANSPORT, [
        "--steps", str(NESTED_STEPS), "--codec", NESTED_CODEC,
        "--reference_codec", REFERENCE_CODEC]),
    "feedback2": (2, TRANSPORT, _STEPS + ["--error_feedback"]),
    # Raises on every worker, which reports the error: its job's last.
    "step_offset": (2, "all_reduce", [
        "--steps", "3", "--step_offset", str(STEP_OFFSET),
        "--expect_error", "InvalidArgumentError"]),
    "die": (2, "all_reduce", ["--steps", str(STEPS), "--die_at_step",
                              str(DIE_AT_STEP), "--die_worker", "1"]),
}
FAILING = ("die",)  # A worker ends its process: a job of its own.
AUTO_JOBS = ("auto2",)


class _FailingRun:
  """A launcher run expected to fail: its exit code, output and end time.

  Like `multi_worker_job.MultiWorkerJob` (output to a file, SIGTERM to
  stop), but it keeps a failing job's exit code and log for the test and
  notes the wall-clock time the launcher exited (a thread waits for it).
  """

  def __init__(self, args, out_dir, num_workers, timeout):
    self._timeout = timeout
    cmd = [sys.executable, multi_worker_job.LAUNCH, "--num_workers",
           str(num_workers), "--timeout", str(timeout), "--grace", "2", "--",
           sys.executable, WORKER] + list(args)
    self._log_path = os.path.join(str(out_dir), "job.log")
    self.started = time.time()
    with open(self._log_path, "w") as log:
      self._proc = subprocess.Popen(cmd, env=multi_worker_job.env(),
                                    cwd=multi_worker_job.ROOT, text=True,
                                    stdout=log, stderr=subprocess.STDOUT)
    self.ended = None
    self._waiter = threading.Thread(target=self._wait, daemon=True)
    self._waiter.start()

  def _wait(self):
    self._proc.wait()
    self.ended = time.time()

  def result(self):
    """(exit code, output); the job is stopped if it outlives its timeout."""
    self._waiter.join(self._timeout + 30)
    if self._proc.poll() is None:
      self.stop()
      self._waiter.join(30)
    with open(self._log_path) as log:
      return self._proc.returncode, log.read()

  def stop(self):
    if self._proc.poll() is None:
      self._proc.terminate()
      try:
        self._proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait(timeout=30)


class _Scenario:
  """One scenario of a job that runs several: its results on every worker."""

  def __init__(self, job, name):
    self._job = job
    self._name = name

  def results(self):
    """Every worker's results of this scenario, in worker order."""
    return [r[self._name] for r in self._job.results()]


class _Jobs:
  """Every job of the file, all started at construction.

  The scenarios whose worker processes all run to their end share one job
  per number of workers, whose workers run them in the order of
  `scenarios`, each under its own strategy (the worker's `--scenarios`; a
  scenario whose workers catch the error they expect, `--expect_error`,
  must be its job's last); each scenario expected to end a process is a
  job of its own. `jobs[name]` is a scenario's `_Scenario`, or its
  `_FailingRun`.

  Args:
    tmp_path_factory: pytest's, for the jobs' directories.
    scenarios: `{name: (num_workers, transport, args)}`.
    failing: the names of the scenarios expected to end a process.
    prefix: the start of the jobs' directory names.
  """

  def __init__(self, tmp_path_factory, scenarios=SCENARIOS, failing=FAILING,
               prefix="all_reduce"):
    self._scenarios = {}
    self._jobs = []
    shared = {}  # num_workers: [[name, args]]
    for name, (num_workers, transport, args) in scenarios.items():
      args = ["--codec", CODEC, "--transport", transport] + args
      if name not in failing:
        shared.setdefault(num_workers, []).append([name, args])
    for num_workers, runs in shared.items():
      names = [name for name, _ in runs]
      job = multi_worker_job.MultiWorkerJob(
          WORKER, ["--scenarios", json.dumps(runs)],
          tmp_path_factory.mktemp(f"{prefix}_{num_workers}_workers"), MARKER,
          num_workers=num_workers, timeout=JOB_TIMEOUT,
          name=f"of {num_workers} workers ({', '.join(names)})")
      self._jobs.append(job)
      for name in names:
        self._scenarios[name] = _Scenario(job, name)
    for name in failing:
      num_workers, transport, args = scenarios[name]
      args = ["--codec", CODEC, "--transport", transport] + args
      run = _FailingRun(args, tmp_path_factory.mktemp(f"{prefix}_{name}"),
                        num_workers, JOB_TIMEOUT)
      self._jobs.append(run)
      self._scenarios[name] = run

  def __getitem__(self, name):
    return self._scenarios[name]

  def stop(self):
    for job in self._jobs:
      job.stop()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
  started = _Jobs(tmp_path_factory)
  try:
    yield started
  finally:
    started.stop()


def _expected(shapes, num_workers, transport):
  """(buffer length n, link bits) of one exchange of gradients of `shapes`.

  The gradients of at least `min_elements` values are fused into one
  buffer of whole buckets; the others (float32) cost a float ring's
  `2(P - 1)/P` of their bits.
  """
  options = options_lib.CompressionOptions(CODEC)
  sizes = [int(np.prod(s)) for s in shapes]
  compressed = [tf.zeros(s) for s, k in zip(shapes, sizes)
                if k >= options.min_elements]
  lossless = sum(k for k in sizes if k < options.min_elements)
  n = fusion.FusionPlan.from_tensors(compressed,
                                     options.codec.bucket_size).total_size
  ring = 2.0 * (num_workers - 1) / num_workers
  codecs = options.sender_codecs(num_workers)
  codec = codecs if transport == "all_gather" else options.codec
  bits = (round(cost_model.exchange_bits(codec, n, num_workers, transport))
          + round(32 * lossless * ring))
  return n, bits


def _auto_transport(shapes, num_workers):
  """What `exchange="auto"` should pick for gradients of `shapes`."""
  options = options_lib.CompressionOptions(CODEC)
  n, _ = _expected(shapes, num_workers, "all_gather")
  return cost_model.auto(options.sender_codecs(num_workers), n,
                               num_workers)


def _check_training(results, num_workers, transport, steps):
  """One strategy's results on every worker: identical weights, telemetry."""
  shapes = _shapes()
  n, link_bits = _expected(shapes, num_workers, transport)
  assert n == worker.INPUTS * worker.HIDDEN  # Whole buckets already.
  for i, r in enumerate(results):
    assert r["shapes"] == shapes
    # Bitwise the same weights on every worker (SHA-256 of each array).
    assert r["weights"] == results[0]["weights"], f"worker {i}"
    assert math.isfinite(r["loss"]), r["loss"]
    assert r["step"] == steps
    stats = r["stats"]
    assert stats["transport"] == transport
    assert stats["exchange_count"] == steps
    assert stats["senders"] == num_workers and stats["local_senders"] == 1
    assert stats["compressed_elements"] == n
    assert stats["lossless_elements"] == (
        sum(int(np.prod(s)) for s in shapes) - n)
    assert stats["uncompressed_gradient_reductions"] == 0
    assert stats["lossless_fallbacks"] == 0
    assert stats["model_link_bits"] == link_bits, (stats, link_bits)


def _shapes():
  """The worker's trainable weights: Dense(32 -> 64), Dense(64 -> 2)."""
  return [[worker.INPUTS, worker.HIDDEN], [worker.HIDDEN],
          [worker.HIDDEN, worker.CLASSES], [worker.CLASSES]]


@pytest.mark.parametrize("name", ["p2", "p3"])
def test_fit_all_reduce_keeps_workers_bitwise_identical(jobs, name):
  """10 `model.fit` steps summed as integer codes: the same weights.

  Every worker decodes the same integer sum with the same shared scales,
  so the weights agree to the bit; the telemetry reports the all-reduce
  on every step and the cost model's link bits.
  """
  num_workers = SCENARIOS[name][0]
  results = jobs[name].results()
  assert len(results) == num_workers
  _check_training(results, num_workers, "all_reduce", STEPS)


@pytest.mark.parametrize("name", AUTO_JOBS)
def test_auto_picks_the_cost_models_transport(jobs, name):
  num_workers, transport, _ = SCENARIOS[name]
  assert transport == "auto"
  results = jobs[name].results()
  _check_training(results, num_workers,
                  _auto_transport(results[0]["shapes"], num_workers),
                  AUTO_STEPS)


def test_time_model_picks_the_all_gather_on_two_workers():
  """What `auto2` relies on (3 workers: the reduce-scatter's `rs_p3`)."""
  assert _auto_transport(_shapes(), 2) == "all_gather"
  for num_workers in (3, 4, 8):
    assert _auto_transport(_shapes(), num_workers) == "reduce_scatter"


def test_dying_worker_stops_the_job_with_its_exit_code(jobs):
  """Worker 1 exits mid-job; worker 0, in the step's collectives, is stopped."""
  run = jobs["die"]
  code, output = run.result()
  assert code == 3, output  # The dying worker's code.
  assert f"worker 1 dies at step {DIE_AT_STEP}" in output, output
  assert "[launch] worker 1 failed with exit code 3" in output, output
  assert f"] {MARKER} {{" not in output, output  # Nobody finished.
  assert run.ended is not None
  # Well before the launcher's timeout: shortly after the death.
  died = _died_at(output)
  assert run.ended - died < STOP_WITHIN, (run.ended - died, output[-5000:])
  assert run.ended - run.started < JOB_TIMEOUT - STOP_WITHIN


def _died_at(output):
  """When the dying worker printed its last line (its `time.time()`)."""
  match = re.search(r"worker 1 dies at step \d+ at ([0-9.]+)", output)
  assert match, output[-5000:]
  return float(match.group(1))


def test_workers_at_different_steps_fail_naming_both_steps(jobs):
  """Worker 1 starts `STEP_OFFSET` steps ahead: the first step raises.

  The check of the stamps reduced with the scales fails alike on every
  worker (each sees the same reduction), naming the largest and the
  smallest step; each worker catches the error and reports it. A worker
  may report instead the cancellation of a collective of the same step that
  the error aborted on its peer; at least one names the steps.
  """
  results = jobs["step_offset"].results()
  assert len(results) == 2
  for i, r in enumerate(results):
    assert "weights" not in r, (i, r)  # Nobody finished its training.
    assert r["error"] in ("InvalidArgumentError", "CancelledError"), (i, r)
  named = [r["message"] for r in results
           if r["error"] == "InvalidArgumentError"]
  assert named, results
  for message in named:
    assert "workers disagree on the compression step" in message, message
    assert (f"the largest step is] [{STEP_OFFSET}] [and the smallest] [0]"
            in message), message


@pytest.mark.parametrize("name, unchunked", [("chunks_ag", "auto2"),
                                             ("chunks_ar", "p2")])
def test_chunked_exchange_leaves_the_weights_of_one_exchange(jobs, name,
                                                             unchunked):
  """Chunks of one bucket, on both transports: the unchunked job's bits."""
  num_workers, transport, _ = SCENARIOS[name]
  steps = AUTO_STEPS if name == "chunks_ag" else STEPS
  results = jobs[name].results()
  for r in results:
    assert r["stats"]["transport"] == transport
    assert r["stats"]["exchange_count"] == steps
  reference = jobs[unchunked].results()
  assert [r["weights"] for r in results] == [r["weights"] for r in reference]
  if transport == "all_gather":  # Every chunk's row has its own header.
    assert (results[0]["stats"]["sent_bits"]
            > reference[0]["stats"]["sent_bits"])


@pytest.mark.parametrize("name", ["rs_p2", "rs_p3"])
def test_fit_keeps_workers_bitwise_identical_with_the_models_bits(jobs, name):
  """10 `model.fit` steps: the same weights, the telemetry, the model's bits.

  Every worker decodes the same re-quantized shards with the same ops, so
  the weights agree to the bit.
  """
  num_workers, transport, _ = SCENARIOS[name]
  if transport == "auto":
    assert _auto_transport(_shapes(), num_workers) == TRANSPORT
  results = jobs[name].results()
  assert len(results) == num_workers
  _check_training(results, num_workers, TRANSPORT, STEPS)


def test_nested_group_keeps_workers_bitwise_identical(jobs):
  """A nested group in the fixed mode across 2 worker processes.

  Worker 1's NDQSG shard is decoded on each receiver with the reference
  worker's shard as side information; both decode the same re-quantized
  shards, so the weights agree to the bit. Worker 1 sees the side
  information of its own shard only, so its statistics count that shard
  (2 of the kernel's 4 buckets, all nested in the fixed mode).
  """
  results = jobs["nested2"].results()
  assert len(results) == 2
  options = options_lib.CompressionOptions(
      NESTED_CODEC, reference_codec=REFERENCE_CODEC, adaptive=False)
  shapes = _shapes()
  sizes = [int(np.prod(s)) for s in shapes]
  compressed = [tf.zeros(s) for s, k in zip(shapes, sizes)
                if k >= options.min_elements]
  n = fusion.FusionPlan.from_tensors(compressed,
                                     options.codec.bucket_size).total_size
  lossless = sum(sizes) - n
  link_bits = (round(cost_model.exchange_bits(options.sender_codecs(2), n, 2,
                                              TRANSPORT))
               + round(32 * lossless * 1.0))  # A float ring: 2(P - 1)/P = 1.
  for i, r in enumerate(results):
    assert r["weights"] == results[0]["weights"], f"worker {i}"
    assert math.isfinite(r["loss"]), r["loss"]
    stats = r["stats"]
    assert stats["transport"] == TRANSPORT
    assert stats["exchange_count"] == NESTED_STEPS
    assert stats["senders"] == 2 and stats["local_senders"] == 1
    assert stats["compressed_elements"] == n
    assert stats["model_link_bits"] == link_bits, (stats, link_bits)
  assert results[0]["stats"]["nested_elements"] == 0  # The reference worker.
  nested = results[1]["stats"]
  assert nested["nested_elements"] == n // 2  # Its own shard's.
  assert nested["fallback_fraction"] == 0.0
  assert 0.0 <= nested["overload_rate"] < 0.5


def test_error_feedback_keeps_workers_bitwise_identical(jobs):
  """Stage 2's residual across 2 worker processes.

  Each worker keeps the residual of the shard it reduces; every worker
  decodes the same re-quantized shards, so the weights agree to the bit,
  and they differ from the same scenario without feedback.
  """
  results = jobs["feedback2"].results()
  _check_training(results, 2, TRANSPORT, STEPS)
  plain = jobs["rs_p2"].results()
  # From the same weights (the same job's processes), to others.
  assert results[0]["initial_weights"] == plain[0]["initial_weights"]
  assert results[0]["weights"] != plain[0]["weights"]
  assert (results[0]["stats"]["model_link_bits"]
          == plain[0]["stats"]["model_link_bits"])


def test_ecdq_payloads_keep_workers_bitwise_identical(jobs):
  """ECDQ by the all-gather and the reduce-scatter across 2 processes.

  Every worker's sum is bitwise the codec's own encode and decode at the
  exchange's seeds, summed in sender order (both stages ECDQ for the
  reduce-scatter), and the telemetry counts the words each payload uses,
  the length rounds and the padding to the longest payload.
  """
  results = jobs["rs_p2"].results()
  codec = ndq_tf.EntropyCodedDitheredCodec(**worker.ECDQ_CONFIG)
  p = len(results)
  grads = [worker.ecdq_gradient(k) for k in range(p)]
  header = 5  # Both transports' header words.
  for exchange in worker.ECDQ_EXCHANGES:
    for step in range(worker.ECDQ_STEPS):
      if exchange == "all_gather":
        want, used = ecdq_reference.direct_all_gather(
            codec, grads, worker.ECDQ_SEED, step)
      else:
        want, used, used2 = ecdq_reference.direct_reduce_scatter(
            codec, grads, worker.ECDQ_SEED, step)
      digest = hashlib.sha256(
          np.ascontiguousarray(want, np.float32).tobytes()).hexdigest()
      for k, r in enumerate(results):
        assert r["ecdq"][exchange]["sums"][step] == digest, (exchange, k)
    for k, r in enumerate(results):  # The last step's telemetry.
      stats = r["ecdq"][exchange]["stats"]
      assert stats["transport"] == exchange
      if exchange == "all_gather":
        payload = used[k]
        framing = header + max(used) - used[k]
      else:
        longest = max(max(u) for u in used)
        payload = sum(used[k]) + used2[k]
        framing = (p * (header + p) + p * longest - sum(used[k])
                   + header + max(used2) - used2[k])
      assert stats["payload_bits"] == 32 * payload, (exchange, k)
      assert stats["sent_bits"] == 32 * (payload + framing), (exchange, k)
