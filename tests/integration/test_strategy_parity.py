"""One suite, both transports: `ndq_tf.MirroredStrategy` and the multi-worker one.

The checks live in `tests/multi_worker_scripts/parity_worker.py`
(`run_checks`), run twice:

* `device_copy`: in this process, `ndq_tf.MirroredStrategy` on the first two
  of the logical CPUs that tests/conftest.py made;
* `all_gather`: `ndq_tf.MultiWorkerMirroredStrategy` on two real worker
  processes on 127.0.0.1, ONE job for the whole file (started through
  `ndq_tf/launch.py` as a script, bounded by its `--timeout` and the
  subprocess timeout); it starts before the MirroredStrategy half runs, so
  the two overlap. Each worker prints one `PARITY {json}` line. The workers
  build several strategies in one process, and worker 0 builds one of them
  seconds after worker 1 (`LAG_SECONDS`): later strategies must reuse the
  running collective server, or the job fails or hangs.

Every test below takes `transport` and the list of results of every process
of that transport (one for MirroredStrategy, one per worker), and asserts the
same behaviour on both; the last tests compare the two transports with each
other: both run one exchange engine with the same seeds, so the same two
senders with the same data give bitwise the same weights, sums and noise
state.
"""

import importlib.util
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core import telemetry
import multi_worker_job as job_lib
from ndq_tf.core.transports import all_gather

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "multi_worker_scripts")
WORKER = os.path.join(SCRIPTS, "parity_worker.py")
# Seconds, for the launcher; the subprocess gets 30 more. A guard against a
# hang, not a budget: the job takes 37-58 s at load 1-5 and 110 s at load
# 10, and under the load of an 8-worker wave beside it (load 18) it was
# still training, not hung, after 200 s (py-spy stacks of both workers).
JOB_TIMEOUT = 600
TRANSPORTS = ["device_copy", "all_gather"]


def _load_checks():
  spec = importlib.util.spec_from_file_location("parity_worker", WORKER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


checks = _load_checks()


@pytest.fixture(scope="module")
def multi_worker_job(tmp_path_factory):
  out_dir = tmp_path_factory.mktemp("parity_workers")
  job = job_lib.MultiWorkerJob(
      WORKER, ["--out_dir", str(out_dir)], out_dir, "PARITY",
      timeout=JOB_TIMEOUT, name="parity")
  yield job
  job.stop()


_MIRRORED = []


def _mirrored_results(out_dir):
  if not _MIRRORED:
    devices = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
    assert len(devices) == 2, devices

    def make_strategy(codec, reference_group=None, **kwargs):
      if reference_group is not None:
        kwargs["reference_group"] = reference_group
      return ndq_tf.MirroredStrategy(codec=codec, devices=devices, **kwargs)

    # Through JSON, as the workers' results are.
    _MIRRORED.append(json.loads(json.dumps(
        checks.run_checks(make_strategy, str(out_dir)))))
  return list(_MIRRORED)


@pytest.fixture(scope="module")
def all_results(request, tmp_path_factory):
  """A function `transport -> results of its processes`.

  The multi-worker job starts at the first use (if any selected test needs
  it), before the MirroredStrategy half runs in this process.
  """
  job = None
  if any("all_gather" in item.nodeid or "across_transports" in item.nodeid
         for item in request.session.items
         if getattr(item, "module", None) is request.module):
    job = request.getfixturevalue("multi_worker_job")
  out_dir = tmp_path_factory.mktemp("parity_mirrored")

  def get(transport):
    if transport == "device_copy":
      return _mirrored_results(out_dir)
    return job.results()
  return get


@pytest.fixture(params=TRANSPORTS)
def transport(request):
  return request.param


@pytest.fixture
def results(all_results, transport):
  """The results of every process of `transport` (1 or 2 dicts)."""
  return all_results(transport)


def _num_processes(transport):
  return 1 if transport == "device_copy" else 2


def _digests(results, *keys):
  """Every replica's digest of `results[...keys]["digests"]`, all processes."""
  out = []
  for r in results:
    for key in keys:
      r = r[key]
    out.extend(r["digests"])
  return out


def _assert_stats_of_transport(stats, transport):
  # Two senders: "auto" gathers on both (ndq_tf.core.cost_model.auto).
  assert stats["transport"] == "all_gather"
  assert stats["senders"] == 2
  assert stats["local_senders"] == (2 if transport == "device_copy" else 1)


def test_each_process_reports(results, transport):
  assert len(results) == _num_processes(transport)


@pytest.mark.parametrize("form", ["spec", "dict"])
def test_codec_spec_string_and_config_dict_train_compressed(
    results, transport, form):
  want = repr(ndq_tf.DitheredCodec(num_levels=3))
  for r in results:
    run = r[form]
    assert run["codec"] == want
    assert all(math.isfinite(x) for x in run["losses"])
    stats = run["stats"]
    _assert_stats_of_transport(stats, transport)
    # One compressed exchange a step.
    assert stats["exchange_count"] == checks.STEPS
    assert stats["compressed_elements"] > 0
    assert stats["payload_bits"] > 0


@pytest.mark.parametrize("case", ["class", "none", "no_encode", "not_a_spec"])
def test_bad_codec_raises_naming_codec(results, case):
  for r in results:
    outcome = r["bad_codecs"][case]
    assert outcome["error"] in ("TypeError", "ValueError"), outcome
    assert "`codec`" in outcome["message"], outcome
    if case in ("class", "no_encode"):
      assert outcome["error"] == "TypeError", outcome
    if case == "class":
      assert "not a class" in outcome["message"], outcome
    if case == "not_a_spec":
      assert outcome["error"] == "ValueError", outcome
      assert "'not a codec spec'" in outcome["message"], outcome


@pytest.mark.parametrize("codec", [
    ndq_tf.DitheredCodec, None, checks.NoEncode(), "not a codec spec"],
                         ids=["class", "none", "no_encode", "not_a_spec"])
def test_multi_worker_strategy_checks_codec_before_tf_config(
    monkeypatch, codec):
  """No cluster needed: the codec is validated before TF_CONFIG is read."""
  monkeypatch.setenv("TF_CONFIG", "{malformed")
  with pytest.raises((TypeError, ValueError), match="`codec`") as info:
    ndq_tf.MultiWorkerMirroredStrategy(codec=codec, cluster_timeout=5)
  assert "TF_CONFIG" not in str(info.value)
  # A good codec gets as far as TF_CONFIG, and fails there (no cluster).
  with pytest.raises(ValueError, match=r"`TF_CONFIG` must be JSON"):
    ndq_tf.MultiWorkerMirroredStrategy(codec="dqsg", cluster_timeout=5)


def test_indexed_slices_lossless_by_default_compressed_when_asked(
    results, transport):
  dense_kernel = checks.TOKENS * checks.EMBED * checks.HIDDEN
  embedding = checks.VOCAB * checks.EMBED
  # Biases and the 32 x 10 kernel are below min_elements.
  small = checks.HIDDEN + checks.HIDDEN * checks.CLASSES + checks.CLASSES
  for r in results:
    default, compressed = r["spec"], r["dict"]
    assert default["any_sparse_gradient"] and compressed["any_sparse_gradient"]
    # Default: the embedding's IndexedSlices travel losslessly (their
    # values, at runtime size), beside the compressed dense kernel.
    stats = default["stats"]
    _assert_stats_of_transport(stats, transport)
    assert stats["lossless_elements"] > 0
    assert stats["lossless_elements"] == (
        checks.BATCH * checks.TOKENS * checks.EMBED + small)
    assert stats["compressed_elements"] == dense_kernel
    # compress_indexed_slices=True: densified and compressed.
    stats = compressed["stats"]
    _assert_stats_of_transport(stats, transport)
    assert stats["compressed_elements"] == dense_kernel + embedding
    assert stats["lossless_elements"] == small


@pytest.mark.parametrize("case", [
    "int32_sum", "int32_mean", "int64_sum", "float_uncompressed_sum",
    "float_below_min_elements"])
def test_lossless_all_reduces_are_exact(results, case):
  for r in results:
    outcome = r["error_policy"][case]
    assert outcome["exact"], outcome
    assert outcome["max_error"] == 0.0, outcome
  assert len(set(_digests(results, "error_policy", case))) == 1


def test_only_the_compressed_controls_advance_the_step(results, transport):
  for r in results:
    policy = r["error_policy"]
    # Six all-reduces in one function: only the two with a compressed
    # control made a compressed exchange (the SUM one beside a tensor
    # below min_elements).
    assert policy["steps"] == 2
    stats = policy["stats"]
    _assert_stats_of_transport(stats, transport)
    assert stats["exchange_count"] == checks.STEPS + 2
    assert stats["compressed_elements"] == 2 * checks.MIN_ELEMENTS
    for case in ("float_compressed_sum", "float_compressed_mean"):
      outcome = policy[case]
      assert not outcome["exact"], outcome
      assert 0.0 < outcome["max_error"] < outcome["max_value"], outcome
  for case in ("float_compressed_sum", "float_compressed_mean"):
    assert len(set(_digests(results, "error_policy", case))) == 1


def test_sent_bits_follow_the_transport(results, transport):
  """The telemetry's wire accounting (module doc of `telemetry`)."""
  for r in results:
    # The error policy's last call: one compressed tensor alone.
    stats = r["error_policy"]["stats"]
    assert stats["lossless_elements"] == 0
    if transport == "device_copy":
      assert stats["sent_bits"] == stats["payload_bits"]
    else:
      assert stats["sent_bits"] == (stats["payload_bits"] +
                                    32 * all_gather.HEADER_WORDS)
    # The MLP's step: its dense lossless tensors once per local sender.
    stats = r["nested"]["train"]["stats"]
    lossless_bits = 32 * stats["lossless_elements"] * stats["local_senders"]
    extra = stats["sent_bits"] - stats["payload_bits"] - lossless_bits
    if transport == "device_copy":
      assert extra == 0
    else:
      # The header, and the reference worker's padding to the longest row.
      assert extra >= 32 * all_gather.HEADER_WORDS


@pytest.mark.parametrize("run", ["spec", "dict", "nested"])
def test_weights_bitwise_identical_on_every_replica(results, transport, run):
  digests = _digests(results, *((run, "train") if run == "nested" else
                                (run,)))
  assert len(digests) == 2  # Two replicas in both strategies.
  assert len(set(digests)) == 1, digests


def test_nested_noise_state_checkpoint_round_trip(results, transport):
  nested_rows = 0
  for r in results:
    nested = r["nested"]
    stats = nested["train"]["stats"]
    _assert_stats_of_transport(stats, transport)
    saved = nested["saved"]
    assert saved["step"] == checks.STEPS + 1
    # tf.train.Checkpoint(compression=engine) into a new strategy: the step
    # at once; the noise state (made on first use) when its plan comes up.
    assert nested["checkpoint_before_use"]["step"] == saved["step"]
    assert nested["checkpoint"] == saved
    # model.save_weights / load_weights (.weights.h5).
    assert nested["weights_h5"] == saved
    assert nested["weights_h5_model_equal"]
    for state in saved["noise"].values():
      scale = np.asarray(state["scale"], np.uint32).view(np.float32)
      gain = np.asarray(state["gain"], np.uint32).view(np.float32)
      assert list(scale.shape) == state["shape"]
      # One row per local sender; the nested sender's row is measured.
      finite = np.all(np.isfinite(scale), axis=1)
      nested_rows += int(finite.sum())
      assert np.all(scale[finite] > 0)
      assert np.all((gain > 0) & np.isfinite(gain))
  # Replica/worker 1 is the one nested sender (reference group 0.5 of 2).
  assert nested_rows == 1
  if transport == "all_gather":
    # The reference worker has no noise state of its own.
    assert results[0]["nested"]["saved"]["noise"] == {}


def test_telemetry_keys_equal_across_transports(all_results):
  mirrored, workers = all_results("device_copy"), all_results("all_gather")
  dqsg = {frozenset(r["spec"]["stats"]) for r in mirrored + workers}
  keys = telemetry.KEYS + tuple(telemetry.DEPRECATED_KEYS)
  assert dqsg == {frozenset(keys)}
  nested = {frozenset(r["nested"]["train"]["stats"])
            for r in mirrored + workers}
  assert nested == {frozenset(keys + telemetry.NESTED_KEYS)}


def test_same_bits_across_transports(all_results):
  """One engine, the same seeds: the transport does not change a bit."""
  mirrored, workers = all_results("device_copy"), all_results("all_gather")
  for keys in [("spec",), ("dict",), ("nested", "train"),
               ("error_policy", "float_compressed_sum"),
               ("error_policy", "float_compressed_mean")]:
    assert set(_digests(mirrored, *keys)) == set(_digests(workers, *keys)), (
        keys)
  for run in ("spec", "dict"):
    assert mirrored[0][run]["losses"] == workers[0][run]["losses"]
    # Per sender, the payloads are the same size.
    assert (mirrored[0][run]["stats"]["payload_bits"] ==
            2 * workers[0][run]["stats"]["payload_bits"])
  # The nested sender's noise state: MirroredStrategy's row 1 (row 0 is the
  # reference replica's NaN row) is worker 1's only row.
  (signature, state), = mirrored[0]["nested"]["saved"]["noise"].items()
  worker_state = workers[1]["nested"]["saved"]["noise"][signature]
  assert state["scale"][1] == worker_state["scale"][0]
  assert state["gain"][1] == worker_state["gain"][0]
