"""Only gradient aggregation is compressed, on real worker processes (#13).

The multi-worker half of tests/integration/test_gradient_only.py: under
`ndq_tf.MultiWorkerMirroredStrategy`, synchronized BatchNormalization
statistics, Keras metrics, `strategy.reduce` and user
`ReplicaContext.all_reduce` stay exact; gradient aggregation (the all-reduce
a Keras optimizer makes in `apply`, under `model.fit` or `apply_gradients`)
is compressed, and so are the all-reduces built inside
`ndq_tf.distribute.compressed()` (not inside `uncompressed()`).

ONE 2-worker job on 127.0.0.1 (one device per worker), started in the
background once for the file (`multi_worker_job.MultiWorkerJob`, through
`ndq_tf/launch.py`); each worker process builds three strategies in turn
and runs the checks of each under it
(tests/multi_worker_scripts/gradient_only_worker.py):

* `ndq1`: `DitheredCodec(num_levels=1)`, every check;
* `ndq3`: `DitheredCodec(num_levels=3)`, the BatchNormalization check;
* `tf`: TensorFlow's own `tf.distribute.MultiWorkerMirroredStrategy` (built
  first, its collective keys apart from ndq_tf's), the control. Keras
  3.15's `model.fit` / `model.evaluate` fail under it with two workers
  (keras-team/keras#20585), so its training step and its evaluation are
  custom loops doing what `fit` and `evaluate` do; the BatchNormalization
  statistics are also checked against float64 numpy, and `strategy.reduce`
  against numpy's float32 sums.
"""

import importlib.util
import os

import numpy as np
import pytest
import tensorflow as tf

import multi_worker_job

WORKER = os.path.join(multi_worker_job.ROOT, "tests", "multi_worker_scripts",
                      "gradient_only_worker.py")
# Seconds for the launcher (the subprocess gets 30 more). Each strategy's
# checks took about 45 s on a quiet machine in a job of their own; 150 s
# timed out with 16 other TF processes on the 2 cores.
JOB_TIMEOUT = 500
MARKER = "GRADIENT_ONLY"


def _load_worker():
  spec = importlib.util.spec_from_file_location("gradient_only_worker",
                                                WORKER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


worker = _load_worker()
NUM_WORKERS = worker.NUM_WORKERS
STRATEGIES = worker.STRATEGIES


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
  """The job, started once; `jobs.results()` waits for it."""
  job = multi_worker_job.MultiWorkerJob(
      WORKER, ["--strategies", ",".join(STRATEGIES)],
      tmp_path_factory.mktemp("gradient_only"), MARKER,
      num_workers=NUM_WORKERS, timeout=JOB_TIMEOUT, name="gradient_only")
  try:
    yield job
  finally:
    job.stop()


def _check(jobs, strategy, check):
  """Every worker's result of `check` under `strategy`."""
  out = []
  for i, by_strategy in enumerate(jobs.results()):
    results = by_strategy.get(strategy, {})
    if check not in results:
      pytest.fail(f"{strategy}, worker {i}: no result for {check!r}; an "
                  f"earlier check failed: {sorted(results)}, strategies "
                  f"{sorted(by_strategy)}")
    result = results[check]
    if "error" in result:
      pytest.fail(f"{strategy}, worker {i}, {check}: {result['error']}\n"
                  f"{result['traceback']}")
    out.append(result)
  return out


def _f32(values):
  return np.asarray(values, np.float32)


# -- 1. Synchronized BatchNormalization --------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_synchronized_batch_norm_statistics_are_the_global_batch_s(
    jobs, strategy):
  """One step from the seed's weights: moving statistics of the whole batch.

  momentum=0.5 from (0, 1): moving_mean = mean / 2, moving_variance =
  (1 + variance) / 2, of the global batch's Dense(256) outputs (each worker
  fed its own half). The offset makes the channel means large against their
  spread, so a quantized sum of the statistics would be off by whole units
  (the symptom of #13); float32 sums of 128 values against float64: 1e-5.
  """
  for r in _check(jobs, strategy, "batch_norm"):
    mean = np.asarray(r["exact_mean"])
    variance = np.asarray(r["exact_variance"])
    np.testing.assert_allclose(r["moving_mean"], 0.5 * mean, rtol=1e-5)
    np.testing.assert_allclose(r["moving_variance"], 0.5 + 0.5 * variance,
                               rtol=1e-5)
    assert np.all(np.isfinite(r["loss"])), r["loss"]


@pytest.mark.parametrize("strategy", ["ndq1", "ndq3"])
def test_batch_norm_model_fit_compresses_gradients(jobs, strategy):
  results = _check(jobs, strategy, "batch_norm")
  for r in results:
    assert r["step_before"] == 0
    assert r["step"] == 1  # One model.fit step: one compressed exchange.
    stats = r["stats"]
    assert stats["exchange_count"] == 1
    assert stats["senders"] == NUM_WORKERS and stats["local_senders"] == 1
    assert stats["compressed_elements"] > 0
    # Every trainable variable of at least min_elements=256 elements: the
    # Dense(256) kernel and bias, BN's gamma and beta, the Dense(10) kernel;
    # the Dense(10) bias travels losslessly beside them.
    assert stats["compressed_elements"] == 64 * 256 + 3 * 256 + 256 * 10
    assert stats["lossless_elements"] == 10
  # Both workers saw the same global statistics.
  assert results[0]["moving_mean"] == results[1]["moving_mean"]
  assert results[0]["moving_variance"] == results[1]["moving_variance"]


@pytest.mark.parametrize("strategy", ["ndq1", "ndq3"])
def test_batch_norm_statistics_equal_tf_strategy(jobs, strategy):
  """The same forward pass, the same lossless sums: TF's own strategy's bits.

  TF's strategy ran fit's train step as a custom loop (keras#20585); the
  statistics come from the forward pass, before any gradient is applied,
  and two workers' float32 sums round once whatever the order.
  """
  ours = _check(jobs, strategy, "batch_norm")
  theirs = _check(jobs, "tf", "batch_norm")
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(_f32(a["moving_mean"]),
                                  _f32(b["moving_mean"]))
    np.testing.assert_array_equal(_f32(a["moving_variance"]),
                                  _f32(b["moving_variance"]))
    # The loss of the step comes from the same forward pass.
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-6)


# -- 2. Metrics and strategy.reduce -------------------------------------------


def test_keras_metrics_equal_tf_strategy_bitwise(jobs):
  ours = _check(jobs, "ndq1", "metrics")
  theirs = _check(jobs, "tf", "metrics")
  for a, b in zip(ours, theirs):
    # The same Keras metrics in the same evaluation loop: the same floats.
    assert a["loop"] == b["loop"]
    # model.evaluate (which TF's own strategy cannot run here, keras#20585)
    # gives those same floats under ndq_tf's strategy.
    assert a["evaluate"] == b["loop"]
    assert a["steps"] == 0  # No compressed exchange.
  n = len(worker.digits()[1]) // worker.EVAL_BATCH * worker.EVAL_BATCH
  correct = ours[0]["loop"]["accuracy"] * n
  assert abs(correct - round(correct)) < 1e-3  # A count over both workers.
  assert ours[0] == ours[1]


def test_strategy_reduce_equals_tf_strategy_and_numpy_bitwise(jobs):
  ours = _check(jobs, "ndq1", "strategy_reduce")
  theirs = _check(jobs, "tf", "strategy_reduce")
  values = [worker.replica_value(tf.constant(r)).numpy()
            for r in range(NUM_WORKERS)]
  # Two float32 addends: one rounding, whatever the order.
  want = {"SUM": values[0] + values[1]}
  want["MEAN"] = want["SUM"] / np.float32(NUM_WORKERS)
  for a, b in zip(ours, theirs):
    for op in ("SUM", "MEAN"):
      np.testing.assert_array_equal(_f32(a[op]), _f32(b[op]))
      np.testing.assert_array_equal(_f32(a[op]), want[op])
    assert a["steps"] == 0


# -- 3. The opt-in scopes ------------------------------------------------------


def _scoped_inputs():
  """Worker r all-reduced x·(r+1) and small·(r+1): the exact sums."""
  x = tf.random.stateless_normal([worker.REDUCE_SIZE], worker.BIG_SEED).numpy()
  small = tf.random.stateless_normal([worker.SMALL_SIZE],
                                     worker.SMALL_SEED).numpy()
  scales = [np.float32(r + 1) for r in range(NUM_WORKERS)]
  senders = [x * s for s in scales]
  return (senders[0] + senders[1], small * scales[0] + small * scales[1],
          senders)


def test_user_all_reduce_is_exact_by_default(jobs):
  big, small, _ = _scoped_inputs()
  for r in _check(jobs, "ndq1", "scopes"):
    default = r["default"]
    np.testing.assert_array_equal(_f32(default["big"]), big)
    np.testing.assert_array_equal(_f32(default["small"]), small)
    assert default["steps"] == 0


def test_compressed_scope_quantizes_within_the_dqsg_bound(jobs):
  big, small, senders = _scoped_inputs()
  num_levels = 1
  results = _check(jobs, "ndq1", "scopes")
  for r in results:
    compressed = r["compressed"]
    assert compressed["steps"] == 1
    error = _f32(compressed["big"]) - big
    assert np.abs(error).max() > 1e-3  # Quantized.
    # Unbiased DQSG: each sender's error is at most one step, its bucket's
    # max / num_levels, per element.
    bound = NUM_WORKERS * max(np.abs(s).max() for s in senders) / num_levels
    assert np.abs(error).max() <= bound + 1e-5
    # The 10-element tensor of the same call travelled losslessly.
    np.testing.assert_array_equal(_f32(compressed["small"]), small)
    stats = compressed["stats"]
    assert stats["compressed_elements"] == worker.REDUCE_SIZE
    assert stats["lossless_elements"] == worker.SMALL_SIZE
  # Every worker decoded the same payloads in the same order.
  assert results[0]["compressed"]["big"] == results[1]["compressed"]["big"]


def test_uncompressed_scope_inside_compressed_wins(jobs):
  big, small, _ = _scoped_inputs()
  for r in _check(jobs, "ndq1", "scopes"):
    inner = r["uncompressed_in_compressed"]
    np.testing.assert_array_equal(_f32(inner["big"]), big)
    np.testing.assert_array_equal(_f32(inner["small"]), small)
    assert inner["steps"] == 0


# -- 4. A custom loop ---------------------------------------------------------


def test_custom_loop_apply_gradients_compressed_user_all_reduce_exact(jobs):
  results = _check(jobs, "ndq1", "custom_loop")
  losses = [np.float32(r["local_loss"]) for r in results]
  for r in results:
    assert r["steps"] == 1  # apply_gradients: one compressed exchange.
    assert r["stats"]["compressed_elements"] == r["compressible"] > 0
    # The user's all-reduce of the same step: the exact sum of the losses.
    np.testing.assert_array_equal(
        _f32(r["total"]), np.full([worker.REDUCE_SIZE], losses[0] + losses[1]))


# -- 5. LossScaleOptimizer under model.fit ----------------------------------


@pytest.mark.parametrize("optimizer", ["keras", "ndq_tf"])
def test_loss_scale_optimizer_fit_compresses_each_step_once(jobs, optimizer):
  """Keras' and ndq_tf's `LossScaleOptimizer` under `model.fit`, 3 steps each.

  The gradients the wrapped optimizer aggregates in its `apply` are
  compressed, once per step (ndq_tf's overflow flag travels losslessly);
  every worker applied the same decoded sum, so the weights agree bitwise.
  """
  results = [r[optimizer] for r in _check(jobs, "ndq1", "loss_scale")]
  steps = worker.LOSS_SCALE_STEPS
  for r in results:
    assert r["optimizer"].endswith(".LossScaleOptimizer")
    assert r["optimizer"].startswith(optimizer + "."), r["optimizer"]
    assert r["steps"] == steps  # One compressed exchange per step.
    assert r["iterations"] == steps  # No step skipped.
    assert r["loss_scale"] == 2.0 ** 15  # Never lowered (nor grown).
    assert np.all(np.isfinite(r["loss"])), r["loss"]
    stats = r["stats"]
    # The last exchange was the last step.
    assert stats["exchange_count"] == r["step"]
    assert stats["senders"] == NUM_WORKERS and stats["local_senders"] == 1
    # The Dense(256) kernel and bias and the Dense(10) kernel; the Dense(10)
    # bias travels losslessly beside them.
    assert (stats["compressed_elements"] == r["compressible"] ==
            64 * 256 + 256 + 256 * 10)
    assert stats["lossless_elements"] == 10
    # Since the strategy was built: no gradient aggregation went uncompressed
    # (ndq_tf's overflow flag, in uncompressed(), is not one), no fallback.
    assert stats["uncompressed_gradient_reductions"] == 0
    assert stats["lossless_fallbacks"] == 0
    assert r["hash"] != r["initial_hash"]  # Trained.
  assert results[0]["initial_hash"] == results[1]["initial_hash"]
  assert results[0]["hash"] == results[1]["hash"]
