"""The rotated codecs' exchange on real worker processes (issue #17).

ONE 2-worker job on 127.0.0.1 (one device each), started once for the file
(`multi_worker_job.MultiWorkerJob`, through `ndq_tf/launch.py`). Every
worker runs tests/multi_worker_scripts/rotation_worker.py, which takes the
scenarios in turn, each under a strategy of its own. One per transport:
6 compressed all-reduces of its fixed gradient with rotated DQSG
(`num_levels=2`, `bucket_size=128`). Checked: the workers' sums are bit for
bit the same; under the integer all-reduce they are the public codec API's
sum with the signs shared (`engine.ROTATION_SENDER`'s seed); the estimate
is unbiased and its error energy is the theory's, within six standard
errors. The third (`nested`, 4 all-reduces): a nested group with a rotated
adaptive NDQSG sender; the workers' sums are bit for bit the same and the
nested worker counts its overloads over whole rotated buckets.
"""

import importlib.util
import math
import os

import numpy as np
import pytest
import tensorflow as tf

import multi_worker_job
import ndq_tf
from ndq_tf import ops
from ndq_tf import theory
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import fusion

WORKER = os.path.join(multi_worker_job.ROOT, "tests", "multi_worker_scripts",
                      "rotation_worker.py")
MARKER = "ROTATION"
NUM_WORKERS = 2
JOB_TIMEOUT = 400
TRANSPORTS = ("all_gather", "all_reduce")


def _load_worker():
  spec = importlib.util.spec_from_file_location("rotation_worker", WORKER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


worker = _load_worker()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  started = multi_worker_job.MultiWorkerJob(
      WORKER, ["--scenarios", ",".join(worker.SCENARIOS)],
      tmp_path_factory.mktemp("rotation"), MARKER, num_workers=NUM_WORKERS,
      timeout=JOB_TIMEOUT, name="rotation")
  try:
    yield started
  finally:
    started.stop()


def _results(job, scenario):
  """Every worker's results of `scenario`, in worker order."""
  return [r[scenario] for r in job.results()]


def _seed(step, sender):
  base = tf.constant([worker.SEED, engine_lib.SEED_TAG], tf.int32)
  return ops.fold_seed(fusion.derive_seed(base, step, sender), 0)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_workers_identical_unbiased_with_the_theorys_variance(job, transport):
  results = _results(job, transport)
  sums = [np.array(r["sums"], np.float32) for r in results]
  np.testing.assert_array_equal(sums[0], sums[1])
  steps = sums[0].shape[0]
  assert all(r["step"] == steps for r in results)
  assert results[0]["stats"]["transport"] == transport
  codec = ndq_tf.codecs.get(worker.CODEC)
  d, m = codec.bucket_size, codec.num_levels
  grads = [worker.gradient(w) for w in range(NUM_WORKERS)]
  exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
  want = 0.0
  for step in range(steps):
    if transport == "all_reduce":
      shared = _seed(step, engine_lib.ROTATION_SENDER)
      seeds = [_seed(step, w) for w in range(NUM_WORKERS)]
      scales = tf.reduce_max(tf.stack(
          [codec.bucket_scales(g, rotation_seed=shared) for g in grads]), 0)
      total = tf.add_n([tf.cast(codec.encode_symbols(
          g, s, scales, rotation_seed=shared), tf.int32)
                        for g, s in zip(grads, seeds)])
      api = codec.decode_symbol_sum(total, scales, tf.stack(seeds),
                                    rotation_seed=shared).numpy()
      np.testing.assert_array_equal(sums[0][step], api)
      kappa = np.array(theory.rotated_scales(scales.numpy(), d))
      want += d * np.sum(theory.shared_scale_variance(m, NUM_WORKERS, kappa))
    else:
      for w in range(NUM_WORKERS):
        wire = codec.encode(grads[w], _seed(step, w)).scales.numpy()
        want += theory.rotated_dithered_total_mse(wire, d, m)
  errors = sums[0].astype(np.float64) - exact
  # Sums of uniform squares: relative standard error 0.894/sqrt(n).
  assert abs(np.sum(errors**2) / want - 1) < 6 * 0.894 / math.sqrt(
      errors.size)
  z = np.sum(errors.mean(axis=0) * exact) / math.sqrt(
      want / errors.size * np.sum(exact * exact) / steps)
  assert abs(z) < 6


def test_nested_group_with_a_rotated_codec_is_identical_on_workers(job):
  results = _results(job, "nested")
  sums = [np.array(r["sums"], np.float32) for r in results]
  np.testing.assert_array_equal(sums[0], sums[1])
  d = ndq_tf.codecs.get(worker.NESTED_CODEC).bucket_size
  exact = np.sum([worker.nested_gradient(w) for w in range(NUM_WORKERS)], 0)
  # Worker 1 is the nested sender: its own counts, whole rotated buckets.
  stats = results[1]["all_stats"]
  print("nested worker per step: " + "; ".join(
      f"overload_rate {s['overload_rate']}, fallback {s['fallback_fraction']}"
      for s in stats))
  assert stats[0]["fallback_fraction"] == 1.0  # No noise known yet.
  nested = [s["nested_elements"] for s in stats[1:]]
  assert all(n % d == 0 for n in nested) and max(nested) > 0
  # Nested codes of correlated gradients beat the first call's fallback.
  errors = np.mean((sums[0] - exact)**2, axis=1)
  assert errors[-1] < errors[0]
