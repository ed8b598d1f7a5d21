"""Every gradient route under `ndq_tf.MultiWorkerMirroredStrategy` (#19).

The multi-worker half of tests/integration/test_gradient_routes.py: ONE job
of 2 workers on 127.0.0.1 (one CPU device each), started once for the file
(`multi_worker_job.MultiWorkerJob` through `ndq_tf/launch.py`). Each worker
process builds one strategy per transport in turn and under each runs every
route of tests/multi_worker_scripts/gradient_routes_worker.py in order, with
`TF_USE_LEGACY_KERAS=1`: `tf.keras` is then tf_keras (the `legacy`
route), `import tf_keras` the same Keras (the `tf_keras` route), and
`import keras` still Keras 3 (the `keras3` route, the reference).
"""

import os

import pytest

import multi_worker_job

pytest.importorskip("tf_keras")

WORKER = os.path.join(multi_worker_job.ROOT, "tests", "multi_worker_scripts",
                      "gradient_routes_worker.py")
TRANSPORTS = ("all_gather", "all_reduce")
# Seconds for the launcher (the subprocess gets 30 more).
JOB_TIMEOUT = 500
ROUTES = ("keras3", "tf_keras", "legacy", "low_level", "reduce_to",
          "all_reduce", "all_reduce_compressed", "tf_keras_skip")


routes = multi_worker_job.load_script(WORKER, "gradient_routes_worker")
COMPRESSIBLE = routes.INPUTS * routes.HIDDEN + routes.HIDDEN + (
    routes.HIDDEN * routes.CLASSES)


class _LegacyJob(multi_worker_job.MultiWorkerJob):
  """A job whose workers import TF with `TF_USE_LEGACY_KERAS=1`."""

  def __init__(self, *args, **kwargs):
    saved = os.environ.get("TF_USE_LEGACY_KERAS")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # Read by env() at start.
    try:
      super().__init__(*args, **kwargs)
    finally:
      if saved is None:
        os.environ.pop("TF_USE_LEGACY_KERAS")
      else:
        os.environ["TF_USE_LEGACY_KERAS"] = saved


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
  job = _LegacyJob(
      WORKER, ["--strategy", "multi_worker", "--transport",
               ",".join(TRANSPORTS), "--routes", ",".join(ROUTES)],
      tmp_path_factory.mktemp("gradient_routes"), routes.MARKER,
      num_workers=2, timeout=JOB_TIMEOUT, name="gradient_routes")
  try:
    yield job
  finally:
    job.stop()


def _results(jobs, transport, route):
  out = []
  for i, by_transport in enumerate(jobs.results()):
    results = by_transport.get(transport, {})
    if route not in results:
      pytest.fail(f"{transport}, worker {i}: no result for {route!r}; an "
                  f"earlier route failed: {sorted(results)}, transports "
                  f"{sorted(by_transport)}")
    result = results[route]
    if "error" in result:
      pytest.fail(f"{transport}, worker {i}, {route}: {result['error']}\n"
                  f"{result['traceback']}")
    out.append(result)
  return out


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("route", ["keras3", "tf_keras", "legacy",
                                   "low_level"])
def test_route_compresses_and_workers_stay_identical(jobs, transport, route):
  reference = _results(jobs, transport, "keras3")
  results = _results(jobs, transport, route)
  for ref, r in zip(reference, results):
    stats = r["stats"]
    assert r["exchanges"] == routes.STEPS, r
    assert stats["transport"] == transport
    assert stats["compressed_elements"] == COMPRESSIBLE > 0
    bits, ref_bits = (stats["sent_bits_per_element"],
                      ref["stats"]["sent_bits_per_element"])
    assert abs(bits / ref_bits - 1.0) <= 0.10, (bits, ref_bits)
    assert r["unrecognised_steps"] == 0 and not r["warnings"], r["warnings"]
    assert r["uncompressed_reductions"] == 0
  # Bitwise the same variables on both workers.
  assert len({r["sha256"] for r in results}) == 1
  if route in ("tf_keras", "legacy"):
    for r in results:
      assert r["logged"]["sent_bits_per_element"] == pytest.approx(
          r["stats"]["sent_bits_per_element"])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_reduce_to_per_gradient_compresses(jobs, transport):
  # One `reduce_to` per gradient: a compressed exchange per variable of at
  # least `min_elements` (3 of the 4) and step; the last one is w2's.
  results = _results(jobs, transport, "reduce_to")
  for r in results:
    assert r["exchanges"] == 3 * routes.STEPS, r
    assert r["stats"]["compressed_elements"] == routes.HIDDEN * routes.CLASSES
    assert r["unrecognised_steps"] == 0 and not r["warnings"], r["warnings"]
  assert len({r["sha256"] for r in results}) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tf_keras_by_both_imports_is_one_keras(jobs, transport):
  direct = _results(jobs, transport, "tf_keras")
  legacy = _results(jobs, transport, "legacy")
  # The same model from the same seed: the same bits (the dither's step
  # differs, so only the counts compare, not the weights).
  for d, l in zip(direct, legacy):
    assert d["stats"]["sent_bits"] == l["stats"]["sent_bits"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("route", ["all_reduce", "tf_keras_skip"])
def test_unrecognised_routes_warn_and_are_counted(jobs, transport, route):
  results = _results(jobs, transport, route)
  for r in results:
    assert r["exchanges"] == 0
    assert r["unrecognised_steps"] == routes.STEPS
    warned = [m for m in r["warnings"] if "did not recognise" in m]
    assert len(warned) == 1, r["warnings"]
    assert "ndq_tf.distribute.compressed()" in warned[0]
    if route == "tf_keras_skip":
      assert "tf_keras" in warned[0]
  assert len({r["sha256"] for r in results}) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_compressed_scope_is_compressed_and_not_warned(jobs, transport):
  results = _results(jobs, transport, "all_reduce_compressed")
  for r in results:
    assert r["exchanges"] == routes.STEPS
    assert r["unrecognised_steps"] == 0 and not r["warnings"]
  assert len({r["sha256"] for r in results}) == 1
