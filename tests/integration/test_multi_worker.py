"""Tests of `ndq_tf.distribute.multi_worker` with real worker processes.

Every multi-worker job has two workers on 127.0.0.1 and free ports, started
through `ndq_tf/launch.py` (run as a script, so the launcher itself does not
import TF), bounded by the launcher's `--timeout` and, behind it, the
subprocess timeout. The workers run `tests/multi_worker_scripts/mw_worker.py`,
a tiny MLP whose only compressed tensor is its 64x32 kernel, and write their
results (telemetry from `strategy.compression_stats()`) to `worker<i>.npz`.

The runs that the worker processes survive share ONE job, started once for
the file in the background (`shared`, through
`multi_worker_job.MultiWorkerJob`): each worker process runs every run of
`SCENARIOS` one after the other, each with its own strategy, model and
results directory, and each test reads its run's results. The last run,
workers at different steps (`DIFFERENT_STEPS`), must fail: its step
raises on every worker, the step-mismatch error
(`tf.errors.InvalidArgumentError`) or, on a peer, the cancellation of a
collective of the same step; the worker catches TF's errors (for that run
only) and records their class and message as the run's result. The killed
worker of the backup test is a job of its own (then resumed in another,
against the shared job's uninterrupted run), as are the bad-`TF_CONFIG` and
missing-worker processes and the example (run as users run it).

The dither's base seed is `[seed, engine.SEED_TAG]` since the exchange engine
is shared with MirroredStrategy (#10); nothing here hard-codes bits of the
multi-worker path, so that change of bits needs no update here.
"""

import inspect
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import multi_worker_job
from ndq_tf.core.transports import all_gather
from ndq_tf.distribute import multi_worker
from ndq_tf.distribute import options as options_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "multi_worker_scripts")
LAUNCH = os.path.join(ROOT, "ndq_tf", "launch.py")
WORKER = os.path.join(SCRIPTS, "mw_worker.py")
JOB_TIMEOUT = 90  # seconds, for the launcher; the subprocess gets 30 more.
# What travels losslessly beside the compressed 64x32 kernel: the biases and
# the 32x10 kernel (below mw_worker.MIN_ELEMENTS), float32.
LOSSLESS_ELEMENTS = 32 + 32 * 10 + 10
# A nested group in the automatic mode, 2 epochs of 16 steps, backed up every
# epoch: the interrupted and the uninterrupted run of the backup test. Keras
# 3.15's BackupAndRestore resumes at the start of the epoch it saved (it
# ignores the batch), so it saves every epoch; 16 steps are one pass over the
# data, so a restarted epoch sees the batches it saw.
RESUME = ("--mode", "fit", "--steps", "16", "--epochs", "2", "--save_freq",
          "epoch", "--nested", "--adaptive")
# The runs of the shared job, in the order every worker runs them (the
# uninterrupted run of the backup test, `straight`, and `DIFFERENT_STEPS`
# are added by `shared`).
SCENARIOS = {
    "fit": ["--mode", "fit", "--steps", "20"],
    "powersgd": ["--mode", "fit", "--steps", "8", "--powersgd", "2"],
    "ctl_tf_function": ["--mode", "ctl", "--steps", "10",
                        "--chunk_elements", "512"],
    "ctl_eager": ["--mode", "ctl", "--steps", "4", "--eager"],
    "nested_fixed": ["--mode", "ctl", "--steps", "10", "--nested"],
    "nested_adaptive": ["--mode", "ctl", "--steps", "10", "--nested",
                        "--adaptive"],
}
# The shared job's last run: worker 1's compression step 5 ahead, which must
# raise the step-mismatch error on every worker at the first exchange.
DIFFERENT_STEPS = ["--mode", "ctl", "--steps", "3", "--step_offset", "5",
                   "--expect_error", "InvalidArgumentError"]
SHARED_TIMEOUT = 400  # seconds, for the launcher of the shared job.


def _env():
  env = dict(os.environ)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  env.pop("TF_CONFIG", None)
  return env


def _run_job(*worker_args, num_workers=2):
  """Runs mw_worker.py on `num_workers` workers; returns (exit code, output)."""
  cmd = [sys.executable, LAUNCH, "--num_workers", str(num_workers),
         "--timeout", str(JOB_TIMEOUT), "--grace", "2", "--",
         sys.executable, WORKER, *worker_args]
  proc = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True,
                        text=True, timeout=JOB_TIMEOUT + 30)
  return proc.returncode, proc.stdout + proc.stderr


def _results(out_dir, num_workers=2):
  return [dict(np.load(os.path.join(out_dir, f"worker{i}.npz")))
          for i in range(num_workers)]


def _weights(result):
  return [result[f"arr_{i}"] for i in range(int(result["num_weights"]))]


def _assert_bitwise_identical(results):
  first = _weights(results[0])
  for other in results[1:]:
    for a, b in zip(first, _weights(other)):
      np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def _errors(out_dir, num_workers=2):
  """Every worker's `{"error", "message"}` of a run with `--expect_error`."""
  outcomes = []
  for i in range(num_workers):
    with open(os.path.join(out_dir, f"worker{i}.json")) as f:
      outcomes.append(json.load(f))
  return outcomes


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  """`shared(name)`: every worker's results of the shared job's run `name`.

  The results of `different_steps` are the errors each worker caught.
  """
  out_dir = tmp_path_factory.mktemp("mw_shared")
  scenarios = dict(SCENARIOS, straight=[
      *RESUME, "--backup_dir", str(out_dir / "straight_backup")])
  scenarios["different_steps"] = DIFFERENT_STEPS  # Last: its run fails.
  job = multi_worker_job.MultiWorkerJob(
      WORKER, ["--out_dir", str(out_dir), "--scenarios",
               json.dumps(scenarios)], out_dir, "MW",
      timeout=SHARED_TIMEOUT, name="shared")

  def results(name):
    # Every worker ran every run (or `results()` fails the test).
    assert job.results() == [list(scenarios)] * 2
    if name == "different_steps":
      return _errors(str(out_dir / name))
    return _results(str(out_dir / name))

  yield results
  job.stop()


def test_strategy_is_a_multi_worker_mirrored_strategy():
  assert issubclass(multi_worker.MultiWorkerMirroredStrategy,
                    tf.distribute.MultiWorkerMirroredStrategy)


@pytest.mark.parametrize("kwargs, message", [
    ({"codec": "not a codec"},
     r"`codec` is not a codec spec .*Received: codec='not a codec'"),
    ({"codec": "class"},
     r"`codec` must be a codec instance, not a class. Received: "
     r"codec=ndq_tf.codecs.dithered.DitheredCodec"),
    ({"codec": None}, r"`codec` must be an ndq_tf codec .*Received: codec=None"),
    ({"min_elements": 0},
     r"`min_elements` must be an integer >= 1. Received: min_elements=0\."),
    ({"seed": 2**40}, r"`seed` must be an integer .*Received: seed=1099511627776"),
    ({"cluster_timeout": -1},
     r"`cluster_timeout` must be a positive .*Received: cluster_timeout=-1\."),
    ({"reference_group": 1},
     r"only for a nested `codec`.*reference_group=1"),
    ({"adaptive": True}, r"only for a nested `codec`.*adaptive=True"),
], ids=["codec_spec", "codec_class", "codec_none", "min_elements", "seed",
        "cluster_timeout", "reference_group", "adaptive"])
def test_invalid_arguments_name_the_argument_and_value(kwargs, message):
  import ndq_tf  # pylint: disable=g-import-not-at-top
  args = {"codec": ndq_tf.DitheredCodec(num_levels=3)}
  args.update(kwargs)
  if args["codec"] == "class":
    args["codec"] = ndq_tf.DitheredCodec
  with pytest.raises((TypeError, ValueError), match=message):
    multi_worker.MultiWorkerMirroredStrategy(**args)


def test_nested_codec_needs_reference_group():
  import ndq_tf  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="pass `reference_codec`"):
    multi_worker.MultiWorkerMirroredStrategy(
        codec=ndq_tf.NestedDitheredCodec())


def test_mmse_alpha_needs_the_automatic_mode():
  import ndq_tf  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="only defined in the adaptive mode"):
    multi_worker.MultiWorkerMirroredStrategy(
        codec=ndq_tf.NestedDitheredCodec(alpha="mmse"),
        reference_codec=ndq_tf.DitheredCodec(num_levels=1), adaptive=False)


def _two_local_replicas(compression, group_key_start):
  """`(devices, ops)`: one worker's exchange over two local CPU replicas.

  MultiWorkerMirroredStrategy uses one CPU device per worker, so this path
  (several GPUs per worker) is built directly, with one worker.
  """
  from tensorflow.python.distribute import collective_util  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import cross_device_utils  # pylint: disable=g-import-not-at-top
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
  # Gradient detection's `labels`, where the constructor takes them, are
  # not used by `_exchange`.
  labels = ({"labels": None} if "labels" in inspect.signature(
      multi_worker.MultiWorkerCompressedAllReduce).parameters else {})
  ops = multi_worker.MultiWorkerCompressedAllReduce(
      devices=devices, group_size=2, options=collective_util.Options(),
      collective_keys=cross_device_utils.CollectiveKeys(
          group_key_start=group_key_start),
      compression=compression, num_workers=1, worker_id=0, **labels)
  return devices, ops


def test_several_devices_per_worker_sum_locally_and_encode_once():
  """Two local replicas: one lossless sum, one payload, one sender.

  MultiWorkerMirroredStrategy uses one CPU device per worker, so this path
  (several GPUs per worker) is exercised here directly, with one worker. The
  exchange needs two senders to be chosen by `ExchangeEngine.split`, so the
  worker's exchange (`_exchange`: local sum, encode, all-gather, decode) is
  called directly.
  """
  import ndq_tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import collective_util  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import reduce_util  # pylint: disable=g-import-not-at-top
  codec = ndq_tf.DitheredCodec(num_levels=3)
  devices, ops = _two_local_replicas(
      options_lib.CompressionOptions(codec, min_elements=10),
      group_key_start=7000)
  values = []
  for i, device in enumerate(devices):
    with tf.device(device):
      values.append(tf.random.stateless_normal([3000], seed=[i, 1]))

  @tf.function
  def reduce():
    return ops._exchange(  # pylint: disable=protected-access
        reduce_util.ReduceOp.MEAN, [(0, values)], collective_util.Options(),
        [])

  (summed,) = reduce()
  summed = summed.numpy()
  local_sum = values[0].numpy() + values[1].numpy()
  # DQSG bound per bucket of the *local sum*: |error| <= kappa * step / 2,
  # step = 1 / num_levels, then halved by MEAN over the 2 replicas.
  padded = np.pad(local_sum, (0, 3072 - 3000)).reshape(-1, 512)
  bound = np.repeat(np.abs(padded).max(axis=1), 512)[:3000] / 3 / 2 / 2
  assert np.all(np.abs(summed - local_sum / 2) <= bound * (1 + 1e-5) + 1e-7)
  stats = ops.engine.stats()
  assert int(ops.engine.step.numpy()) == stats["exchange_count"] == 1
  # One sender (the worker), however many local devices.
  assert stats["senders"] == stats["local_senders"] == 1
  assert stats["transport"] == "all_gather"
  # The fused buffer pads the tensor to whole buckets (3072 elements): one
  # payload, plus the header.
  assert stats["payload_bits"] == codec.wire_bits(3072)
  assert stats["sent_bits"] == (
      codec.wire_bits(3072) + 32 * all_gather.HEADER_WORDS)
  assert stats["compressed_elements"] == 3000


def _one_worker_exchange(chunk_elements, group_key_start):
  """A one-worker `MultiWorkerCompressedAllReduce` and its traced `_exchange`.

  Returns the exchange's compressed all-reduce, the `tf.function` of one
  exchange of a 3000-value tensor (DQSG, 6 chunks of 512) and its graph.
  """
  import ndq_tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import collective_util  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import cross_device_utils  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import reduce_util  # pylint: disable=g-import-not-at-top
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:1]
  ops = multi_worker.MultiWorkerCompressedAllReduce(
      devices=devices, group_size=1, options=collective_util.Options(),
      collective_keys=cross_device_utils.CollectiveKeys(
          group_key_start=group_key_start),
      compression=options_lib.CompressionOptions(
          ndq_tf.DitheredCodec(num_levels=1), min_elements=10,
          exchange="all_gather", chunk_elements=chunk_elements),
      num_workers=1, worker_id=0, labels=None)
  with tf.device(devices[0]):
    value = tf.random.stateless_normal([3000], seed=[3, 1])

  @tf.function
  def reduce():
    return ops._exchange(  # pylint: disable=protected-access
        reduce_util.ReduceOp.SUM, [(0, [value])], collective_util.Options(),
        [])

  return ops, reduce, reduce.get_concrete_function().graph


def _ancestors(op):
  """Every op `op` depends on, through data and control edges."""
  seen, stack = set(), [op]
  while stack:
    current = stack.pop()
    for parent in [t.op for t in current.inputs] + list(
        current.control_inputs):
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


def test_chunks_take_the_ordering_chains_in_turn_on_a_cpu(monkeypatch):
  """Chunk k's all-gather is on chain k % 3; the bits are one chain's.

  With one ordering token, chunk k + 1's collective waits for chunk k's
  (auto control dependencies chain the users of one resource), and on one
  inter-op thread behind chunk k's decode (issue #20).
  """
  ops, reduce, graph = _one_worker_exchange(512, group_key_start=7100)
  chains = multi_worker.EXCHANGES_IN_FLIGHT
  assert ops.ordering_chains == chains == 3
  gathers = {}
  for op in graph.get_operations():
    if op.type == "CollectiveGatherV2":
      gathers[int(re.search(r"ndq_chunk(\d+)/", op.name).group(1))] = op
  assert sorted(gathers) == list(range(6))
  # Inputs: value, group size, group key, instance key, ordering token.
  tokens = [gathers[k].inputs[4] for k in range(6)]
  assert len({id(t) for t in tokens[:chains]}) == chains
  for k in range(6):
    assert tokens[k] is tokens[k % chains]
  for k in range(6):
    for later in range(k + 1, min(k + chains, 6)):
      assert gathers[k] not in _ancestors(gathers[later])
  for k in range(6 - chains):
    assert gathers[k] in _ancestors(gathers[k + chains])
  several_chains = reduce()[0].numpy()

  monkeypatch.setattr(multi_worker, "EXCHANGES_IN_FLIGHT", 1)
  ops, reduce, graph = _one_worker_exchange(512, group_key_start=7200)
  assert ops.ordering_chains == 1
  gathers = [op for op in graph.get_operations()
             if op.type == "CollectiveGatherV2"]
  assert len({id(op.inputs[4]) for op in gathers}) == 1
  one_chain = reduce()[0].numpy()
  np.testing.assert_array_equal(several_chains.view(np.uint32),
                                one_chain.view(np.uint32))


def test_one_ordering_chain_off_a_cpu():
  """NCCL needs every worker to launch collectives in one order."""
  assert multi_worker.ordering_chains(
      "/job:worker/replica:0/task:0/device:CPU:0") == 3
  assert multi_worker.ordering_chains(
      "/job:worker/replica:0/task:0/device:GPU:0") == 1


def test_fit_two_workers_bitwise_identical_and_wire_bits(shared):
  results = shared("fit")
  _assert_bitwise_identical(results)
  for r in results:
    # One compressed exchange per step, from step 0.
    assert int(r["step_before"]) == 0
    assert int(r["step_after"]) == 20 == int(r["iterations"])
    # Exactly the codec's bits for the one compressed kernel, plus the
    # header, plus the lossless tensors of the same call.
    assert int(r["payload_bits"]) == int(r["expected_wire_bits"])
    assert int(r["lossless_elements"]) == LOSSLESS_ELEMENTS
    assert int(r["sent_bits"]) == (int(r["expected_wire_bits"]) +
                                   32 * all_gather.HEADER_WORDS +
                                   32 * LOSSLESS_ELEMENTS)
    assert int(r["compressed_elements"]) == 64 * 32
    assert int(r["senders"]) == 2 and int(r["local_senders"]) == 1
    # The compressed kernel's share of the wire: 8x under float32.
    compressed_bits = int(r["sent_bits"]) - 32 * LOSSLESS_ELEMENTS
    assert compressed_bits * 8 < 32 * int(r["compressed_elements"])


def test_powersgd_two_workers_bitwise_identical(shared):
  """model.fit with PowerSGD: 3 warm-up steps, then rank 2 with DQSG factors."""
  results = shared("powersgd")
  _assert_bitwise_identical(results)
  for r in results:
    assert int(r["step_after"]) == 8
    assert int(r["rank"]) == 2
    # The one compressed kernel (32x64) goes low rank.
    assert float(r["low_rank_fraction"]) == 1.0
    assert float(r["residual_norm"]) > 0  # Each worker's own residual.
  assert float(results[0]["residual_norm"]) != float(
      results[1]["residual_norm"])


@pytest.mark.parametrize("scenario", ["ctl_tf_function", "ctl_eager"],
                         ids=["tf_function", "eager"])
def test_custom_training_loop_two_workers(shared, scenario):
  """The `tf.function` run exchanges in 4 chunks on three ordering chains."""
  args = SCENARIOS[scenario]
  steps = int(args[args.index("--steps") + 1])
  results = shared(scenario)
  _assert_bitwise_identical(results)
  for r in results:
    assert int(r["ordering_chains"]) == multi_worker.EXCHANGES_IN_FLIGHT
    # One compressed exchange per step: the user's all_reduce inside
    # `uncompressed()` was not compressed, and it is exact.
    assert int(r["step_after"]) == steps == int(r["iterations"])
    assert float(r["uncompressed_error"]) == 0.0
    assert int(r["payload_bits"]) == int(r["expected_wire_bits"])
    assert int(r["compressed_elements"]) == 64 * 32


@pytest.mark.parametrize("adaptive", [False, True])
def test_nested_group_two_workers_bitwise_identical(shared, adaptive):
  results = shared("nested_adaptive" if adaptive else "nested_fixed")
  _assert_bitwise_identical(results)
  for r in results:
    assert int(r["step_after"]) == 10
    # Worker 0 sends DQSG ternary, worker 1 nested codes: the same rate (so
    # no padding in the all-gather).
    assert int(r["payload_bits"]) == int(r["expected_wire_bits"])
    assert int(r["sent_bits"]) == (int(r["expected_wire_bits"]) +
                                   32 * all_gather.HEADER_WORDS +
                                   32 * LOSSLESS_ELEMENTS)
  assert (int(results[0]["expected_wire_bits"]) ==
          int(results[1]["expected_wire_bits"]))
  # Telemetry is the worker's own: none on the reference worker (zeros in
  # the telemetry, no noise state).
  assert np.all(results[0]["fallback"] == 0.0)
  assert int(results[0]["nested_elements"]) == 0
  assert int(results[0]["overloads"]) == 0
  assert int(results[0]["num_noise_plans"]) == 0
  assert np.all(np.isnan(results[0]["noise_gain"]))
  assert int(results[1]["num_noise_plans"]) == 1
  assert results[1]["noise_gain"].shape == (64 * 32 // 512,)
  fallback = results[1]["fallback"]
  print(f"adaptive={adaptive}: fallback per step {fallback}, overload rate "
        f"{float(results[1]['overload_rate']):.2e} (Gaussian "
        f"{float(results[1]['overload_probability']):.2e}), gain "
        f"{results[1]['noise_gain']}")
  if adaptive:
    # No noise known at the first exchange: every bucket falls back; then
    # the worker's own measured noise lets some buckets nest.
    assert fallback[0] == 1.0 and min(fallback[1:]) < 1.0
    gain = results[1]["noise_gain"]  # one per bucket
    # Within NOISE_GAIN_RANGE, and at most 0.8x down per exchange over the
    # 9 exchanges after the first.
    assert np.all((gain >= 0.8**9 * 0.999) & (gain <= 16.0))
  else:
    assert np.all(fallback == 0.0)  # the fixed mode never falls back
    assert np.isfinite(float(results[1]["overload_rate"]))
    # Every bucket of the nested worker was sent nested.
    assert int(results[1]["nested_elements"]) == 64 * 32


def test_workers_with_different_steps_fail_naming_both_steps(shared):
  """The step fails on every worker, with the error naming both steps.

  Every worker's training raises (caught by the worker); a worker may see
  the error, or the cancellation of a collective of the same step that the
  error aborted on its peer.
  """
  outcomes = shared("different_steps")
  for outcome in outcomes:
    assert outcome["error"] in ("InvalidArgumentError", "CancelledError"), (
        outcome)
  named = [o["message"] for o in outcomes
           if o["error"] == "InvalidArgumentError"]
  assert named, outcomes
  for message in named:
    assert "workers disagree on the compression step" in message, message
    assert "[sent step] [0] [but worker] [1] [sent step] [5]" in message, (
        message)


def test_killed_worker_resumes_exactly_with_backup_and_restore(tmp_path,
                                                               shared):
  """A nested group in the automatic mode: the state to restore is the
  step counter, as for DQSG, and the nested worker's noise scales.

  DQSG alone (the step counter only) is a subset of this case; its three
  jobs were dropped for time (issue #31). The uninterrupted run is the
  shared job's `straight` (`RESUME` too, its own backup directory).
  """
  out, backup = str(tmp_path / "out"), str(tmp_path / "backup")
  common = (*RESUME, "--backup_dir", backup, "--out_dir", out)
  code, output = _run_job(*common, "--die_at_step", "20")
  assert code == 3, output  # The dying worker's; the other was stopped.
  assert "worker 1 dies at step 20" in output
  assert not os.path.exists(os.path.join(out, "worker0.npz"))

  code, output = _run_job(*common)
  assert code == 0, output
  results = _results(out)
  _assert_bitwise_identical(results)
  for r in results:
    # Restored at the last backup (step 16): the dither sequence continues
    # there instead of restarting at 0.
    assert int(r["step_before"]) == 16
    assert int(r["step_after"]) == int(r["iterations"]) == 32
  # Exact resume: the weights of the run that never stopped (after other
  # runs in its worker processes).
  _assert_bitwise_identical([results[0], shared("straight")[0]])


# bad_tf_config.py's cases: the entry the error must name, and the value
# received as the message quotes it.
BAD_TF_CONFIG = {
    "not_json": ("`TF_CONFIG` must be JSON", "TF_CONFIG='{cluster: worker}'"),
    "no_task": ("`TF_CONFIG['task']` must be set",
                "Received: nothing (missing)"),
    "index_out_of_range": ("`TF_CONFIG['task']['index']` must be an int in "
                           "[0, 2)", "Received: 2 in TF_CONFIG="),
    "unknown_job": ("`TF_CONFIG['task']['type']` must be a job of "
                    "`TF_CONFIG['cluster']`", 'Received: "ps" in TF_CONFIG='),
    "empty_worker_list": ("`TF_CONFIG['cluster']['worker']` must be a "
                          "non-empty list", "Received: [] in TF_CONFIG="),
    "bad_port": ("`TF_CONFIG['cluster']['worker'][1]` must be a 'host:port' "
                 "string", 'Received: "127.0.0.1:http" in TF_CONFIG='),
}


def test_bad_tf_config_gives_clear_error():
  proc = subprocess.run(
      [sys.executable, os.path.join(SCRIPTS, "bad_tf_config.py")],
      env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  outcomes = {o["case"]: o for o in (
      json.loads(line) for line in proc.stdout.splitlines()
      if line.startswith("{"))}
  assert sorted(outcomes) == sorted(BAD_TF_CONFIG), proc.stdout
  for case, (entry, received) in BAD_TF_CONFIG.items():
    outcome = outcomes[case]
    assert outcome["error"] == "ValueError", outcome
    # Raised by the validation (ndq_tf.cluster.tf_config), not by TF.
    assert outcome["origin"] == "tf_config.py", outcome
    assert entry in outcome["message"], outcome
    assert received in outcome["message"], outcome


def test_missing_worker_fails_clearly_instead_of_hanging():
  from ndq_tf.cluster import launch  # pylint: disable=g-import-not-at-top
  ports = launch.find_free_ports(2)
  env = _env()
  # Worker 1 is never started.
  env["TF_CONFIG"] = launch.make_tf_config(
      [f"127.0.0.1:{p}" for p in ports], 0)
  code = ("import ndq_tf; from ndq_tf.distribute import multi_worker; "
          "multi_worker.MultiWorkerMirroredStrategy("
          "codec=ndq_tf.DitheredCodec(num_levels=3), cluster_timeout=3)")
  proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode != 0
  assert "the cluster did not form within cluster_timeout=3 s" in proc.stderr
  assert f"/job:worker/task:1 (127.0.0.1:{ports[1]})" in proc.stderr


def test_example_fits_on_two_workers_with_identical_weights(tmp_path):
  example = os.path.join(ROOT, "examples", "multi_worker.py")
  cmd = [sys.executable, LAUNCH, "--num_workers", "2", "--timeout",
         str(JOB_TIMEOUT), "--grace", "2", "--", sys.executable, example,
         "--epochs", "1", "--backup_dir", str(tmp_path / "backup"),
         "--verbosity", "-1"]
  proc = subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True,
                        text=True, timeout=JOB_TIMEOUT + 30)
  output = proc.stdout + proc.stderr
  assert proc.returncode == 0, output
  reports = [json.loads(line.split("] ", 1)[1]) for line in
             proc.stdout.splitlines() if '] {"worker"' in line]
  assert sorted(r["worker"] for r in reports) == [0, 1], output
  assert reports[0]["weights_checksum"] == reports[1]["weights_checksum"]
  assert reports[0]["test_accuracy"] > 0.5
  assert reports[0]["compression_ratio"] > 5


def test_several_devices_per_worker_chunk_zero_needs_only_the_last_tensor():
  """Ready order with a local sum per tensor: no barrier across tensors.

  Two local replicas (the several-GPUs-per-worker path, here on logical
  CPUs, called directly as above), three tensors of two chunks' worth each:
  chunk 0's encode and all-gather depend on the last tensor's replicas only,
  not on the first tensor's (whose gradients the backward pass produces
  last); the last chunk's encode does depend on the first tensor. Graph
  only: the overlap itself is measured by benchmarks/step_breakdown.py.
  """
  import ndq_tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import collective_util  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import reduce_util  # pylint: disable=g-import-not-at-top
  devices, ops = _two_local_replicas(
      options_lib.CompressionOptions(
          ndq_tf.DitheredCodec(num_levels=1), min_elements=10,
          chunk_elements=1024),
      group_key_start=7300)
  sources = []  # Per tensor, the ops that make its replicas' values.

  @tf.function
  def reduce():
    compressed = []
    for i in range(3):
      parts = []
      for r, device in enumerate(devices):
        with tf.device(device):
          parts.append(tf.random.stateless_normal([2048], seed=[i, r]) * 2.0)
      sources.append([p.op for p in parts])
      compressed.append((i, parts))
    return ops._exchange(  # pylint: disable=protected-access
        reduce_util.ReduceOp.MEAN, compressed, collective_util.Options(), [])

  graph = reduce.get_concrete_function().graph
  chunks = {}
  for op in graph.get_operations():
    match = re.search(r"/ndq_chunk(\d+)(?:_\d+)?/", op.name)
    if match and ("/ndq_encode" in op.name
                  or op.type == "CollectiveGatherV2"):
      chunks.setdefault(int(match.group(1)), []).append(op)
  assert len(chunks) == 6, sorted(chunks)
  assert any(o.type == "CollectiveGatherV2" for o in chunks[0])
  first_chunk = set().union(*map(_ancestors, chunks[0]))
  last_chunk = set().union(*map(_ancestors, chunks[max(chunks)]))
  assert not set(sources[0]) & first_chunk
  assert set(sources[2]) <= first_chunk
  assert set(sources[0]) <= last_chunk
  # And it runs: the mean of the two replicas, within DQSG's bound.
  for i, result in enumerate(reduce()):
    local_sum = sum(
        tf.random.stateless_normal([2048], seed=[i, r]).numpy() * 2.0
        for r in range(2))
    bound = np.repeat(np.abs(local_sum.reshape(-1, 512)).max(axis=1),
                      512) / 1 / 2 / 2
    assert np.all(np.abs(result.numpy() - local_sum / 2)
                  <= bound * (1 + 1e-5) + 1e-7)
