"""Workers that disagree stop, naming the setting at fault (#21).

The real job, ONE for the file: two worker processes on 127.0.0.1 (started
here with their `TF_CONFIG`, not by the launcher, so that each one's exit
code is known), each running tests/multi_worker_scripts/agreement_worker.py
and going on after each expected error, which it catches and reports: worker
1 builds the strategy with one setting changed per case, which must raise on
both workers, naming it, when the strategy is built; then the options agree
but the all-reduced tensors' shapes do not (another fusion plan of the same
size), which the fingerprint in the all-gather's header stops at the first
exchange, with an error raised on both workers. Last, a mismatch (the seed)
built uncaught ends both processes, non-zero.

The rest checks the fingerprint and the transports' checks in one
process, with the transports' collectives replaced by a function that
concatenates (or maxes) this worker's row with a peer's built here.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import multi_worker_job
import ndq_tf
from ndq_tf.cluster import launch
from ndq_tf.core import fingerprint
from ndq_tf.core.transports import all_gather
from ndq_tf.core.transports import collective_sum
from ndq_tf.distribute import options as options_lib

WORKER = os.path.join(multi_worker_job.ROOT, "tests", "multi_worker_scripts",
                      "agreement_worker.py")
TIMEOUT = 180  # Seconds for the whole job.
#: Every case of agreement_worker.py and what its error must say.
CASES = {
    "seed": "`seed` is 7 on worker 0, 1 on worker 1",
    "codec": "`codec` is 'DitheredCodec' on worker 0, 'QSGDCodec' on worker 1",
    "num_levels": "`codec.num_levels` is 3 on worker 0, 1 on worker 1",
    "chunk_elements": "`chunk_elements` is 1048576 on worker 0, 1024 on "
                      "worker 1",
    "min_elements": "`min_elements` is 1000 on worker 0, 500 on worker 1",
    "reference_group": "`reference_group` is 1 on worker 0, 0.5 on "
                         "worker 1",
}


def _run_workers(out, *args):
  """Both workers' (exit code, output, seconds)."""
  addresses = [f"127.0.0.1:{p}" for p in launch.find_free_ports(2)]
  procs, logs = [], []
  start = time.time()
  for index in range(2):
    env = multi_worker_job.env()
    env["TF_CONFIG"] = launch.make_tf_config(addresses, index)
    logs.append(open(os.path.join(str(out), f"worker{index}.log"), "w+"))
    procs.append(subprocess.Popen(
        [sys.executable, WORKER, *args], env=env, cwd=multi_worker_job.ROOT,
        stdout=logs[-1], stderr=subprocess.STDOUT, text=True))
  results = []
  try:
    for proc, log in zip(procs, logs):
      try:
        code = proc.wait(timeout=max(1, TIMEOUT - (time.time() - start)))
      except subprocess.TimeoutExpired:
        code = "timeout"
      log.seek(0)
      results.append((code, log.read(), time.time() - start))
  finally:
    for proc, log in zip(procs, logs):
      if proc.poll() is None:
        proc.kill()
        proc.wait()
      log.close()
  return results


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  """Every case of agreement_worker.py, on two workers, started once."""
  return _run_workers(tmp_path_factory.mktemp("agreement"), "--uncaught",
                      "seed")


def test_a_mismatch_ends_every_worker_with_an_error(job):
  # The seed: without the check, the silent divergence of #21. Built
  # uncaught after the caught cases (whose report holds the same message).
  for code, output, seconds in job:
    assert code not in (0, "timeout"), output[-5000:]
    assert "uncaught case: seed" in output, output[-5000:]
    uncaught = output.split("uncaught case: seed", 1)[1]
    assert CASES["seed"] in uncaught, output[-5000:]
    assert "uncaught case: no error" not in output
    print(f"seed: exit code {code} after {seconds:.1f} s")


def _report(output):
  lines = [l for l in output.splitlines() if l.startswith("AGREEMENT ")]
  assert len(lines) == 1, output[-5000:]
  return json.loads(lines[0].split(" ", 1)[1])


@pytest.mark.parametrize("worker", [0, 1])
def test_every_mismatch_raises_on_every_worker_naming_it(job, worker):
  _, output, _ = job[worker]
  report = _report(output)
  assert report["worker"] == worker
  for case, message in CASES.items():
    result = report["results"][case]
    assert result["error"] is not None, (case, output[-5000:])
    assert "built with different compression options" in result["error"]
    assert message in result["error"], (case, result["error"])
    # Raised when the strategy is built, before any exchange.
    assert result["seconds"] < 60, (case, result)
    print(f"worker {worker}: {case}: {result['seconds']:.2f} s")


@pytest.mark.parametrize("worker", [0, 1])
def test_another_plan_stops_every_worker_at_the_first_exchange(job, worker):
  code, output, seconds = job[worker]
  # The process ends with the uncaught case's error, after the plan case.
  assert code not in (0, "timeout"), output[-5000:]
  plan = _report(output)["plan"]
  assert plan["error"] == "InvalidArgumentError", (plan, output[-5000:])
  assert "workers disagree on what they exchange" in plan["message"], plan
  assert "plan case: no error" not in output
  assert seconds < TIMEOUT
  print(f"worker {worker}: exit code {code} after {seconds:.1f} s; "
        + next(l for l in output.splitlines() if l.startswith("plan case")))


def _options(**kwargs):
  args = {"codec": ndq_tf.DitheredCodec(num_levels=3)}
  args.update(kwargs)
  return options_lib.CompressionOptions(**args)


@pytest.mark.parametrize("changes", [
    {"seed": 1},
    {"codec": ndq_tf.QSGDCodec(num_levels=3)},  # The same payload size.
    {"codec": ndq_tf.DitheredCodec(num_levels=1)},
    {"codec": ndq_tf.DitheredCodec(num_levels=3, bucket_size=256)},
    {"min_elements": 100},
    {"chunk_elements": 1024},
    {"chunk_elements": None},
    {"exchange": "all_gather"},
], ids=["seed", "codec", "num_levels", "bucket_size", "min_elements",
        "chunk_elements", "one_chunk", "exchange"])
def test_fingerprint_covers_every_option(changes):
  base = fingerprint.fingerprint(_options(), "plan_a", "all_gather")
  assert base == fingerprint.fingerprint(_options(), "plan_a", "all_gather")
  assert base != fingerprint.fingerprint(_options(**changes), "plan_a",
                                         "all_gather")
  assert -2**31 <= base < 2**31


def test_fingerprint_covers_the_nested_group_plan_and_kind():
  def nested(group, adaptive=False):
    return options_lib.CompressionOptions(
        ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3),
        reference_codec=ndq_tf.DitheredCodec(num_levels=1),
        reference_group=group, adaptive=adaptive)
  marks = {fingerprint.fingerprint(o, p, k) for o, p, k in [
      (nested(1), "plan_a", "all_gather"),
      (nested(0.5), "plan_a", "all_gather"),
      (nested(1, adaptive=True), "plan_a", "all_gather"),
      (nested(1), "plan_b", "all_gather"),
      (_options(), "plan_a", "all_gather"),
      (_options(), "plan_a", "all_reduce"),
  ]}
  assert len(marks) == 6


def test_describe_differences_names_settings_and_values():
  configs = [_options(seed=7).get_config(),
             _options(seed=7, codec=ndq_tf.DitheredCodec(
                 num_levels=1)).get_config()]
  assert fingerprint.describe_differences(configs[:1] * 2) is None
  assert fingerprint.describe_differences(configs) == (
      "`codec.num_levels` is 3 on worker 0, 1 on worker 1")
  nested = [options_lib.CompressionOptions(
      ndq_tf.NestedDitheredCodec(), reference_codec=ndq_tf.DitheredCodec(
          num_levels=1), reference_group=g).get_config() for g in (1, 2)]
  assert fingerprint.describe_differences(
      nested, {"reference_group": "reference_workers"}) == (
          "`reference_workers` is 1 on worker 0, 2 on worker 1")


def test_config_words_round_trip():
  options = _options(seed=-5)
  words = fingerprint.config_words(options)
  assert words.dtype == np.int32
  agreed = fingerprint.agreed_config(options)
  assert agreed == dict(options.get_config(),
                        decoded_bits=fingerprint.decode_digest(options),
                        tensorflow=tf.__version__)
  length = len(json.dumps(agreed, sort_keys=True, separators=(",", ":")))
  assert fingerprint._decode_words(  # pylint: disable=protected-access
      words, length) == agreed


def _config_gather(peer_options, settle_error=None):
  """An all-gather of two workers, the peer's rows built from its options."""
  calls = []
  peer_words = fingerprint.config_words(peer_options)
  peer_length = len(json.dumps(fingerprint.agreed_config(peer_options),
                               sort_keys=True, separators=(",", ":")))

  def gather(row, timeout=None):
    calls.append((row.size, timeout))
    if len(calls) == 1:
      peer = np.array([fingerprint.CONFIG_MAGIC, peer_length], np.int32)
    elif len(calls) == 2:
      peer = np.zeros_like(row)
      peer[:len(peer_words)] = peer_words
    else:
      if settle_error:
        raise settle_error
      peer = np.zeros_like(row)
    return np.concatenate([row, peer])
  return gather, calls


def test_a_worker_that_finds_a_mismatch_waits_for_its_peers_to_read():
  # Agreement: the two all-gathers, no third.
  gather, calls = _config_gather(_options(seed=7))
  fingerprint.check_agreement(gather, _options(seed=7), 2, "Test")
  assert len(calls) == 2
  # A mismatch: a third all-gather before the error, so that no worker
  # exits while a peer still reads its config.
  gather, calls = _config_gather(_options(seed=1))
  with pytest.raises(ValueError, match="`seed` is 7 on worker 0, 1 on "
                                       "worker 1"):
    fingerprint.check_agreement(gather, _options(seed=7), 2, "Test")
  # A bounded wait: a peer of an older version never joins it.
  assert calls[2] == (1, fingerprint.SETTLE_SECONDS) and len(calls) == 3
  # The peer that raised first may close the third: the error is the same.
  gather, calls = _config_gather(_options(seed=1), tf.errors.UnavailableError(
      None, None, "Socket closed"))
  with pytest.raises(ValueError, match="`seed` is 7 on worker 0, 1 on "
                                       "worker 1"):
    fingerprint.check_agreement(gather, _options(seed=7), 2, "Test")
  assert len(calls) == 3


def _peer_gather(peer_mark):
  """An all-gather of two workers: this row, then worker 1's own."""
  def gather(row):
    peer = tf.tensor_scatter_nd_update(row, [[1], [4]], [1, peer_mark])
    return tf.concat([row, peer], 0)
  return gather


@pytest.mark.parametrize("peer_mark", [5, -6])
def test_all_gather_header_carries_and_checks_the_fingerprint(peer_mark):
  transport = all_gather.CollectiveAllGatherTransport(
      _peer_gather(peer_mark), 2, 0, "/cpu:0")
  wire = tf.constant([11, 12, 13], tf.int32)

  @tf.function
  def exchange():
    (reception,) = transport.exchange([(0, "/cpu:0", wire)], [3, 3],
                                      tf.constant(4), fingerprint=5)
    with tf.control_dependencies(reception.checks):
      return tf.stack(reception.wires)

  if peer_mark == 5:
    np.testing.assert_array_equal(exchange(), [[11, 12, 13]] * 2)
  else:
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="workers disagree on what they exchange"):
      exchange()


def _peer_max(peer_mark):
  """A MAX all-reduce of two workers: this stamp and worker 1's."""
  def all_reduce(value, merge_op):
    assert merge_op == "Max"
    n = value.shape[0] - collective_sum.STAMP_WORDS
    unsigned = peer_mark & 0xFFFFFFFF
    stamp = tf.constant([4, 0, unsigned & 0xFFFF, unsigned >> 16],
                        tf.float32)
    peer = tf.concat([value[:n], stamp, -stamp], 0)
    return tf.maximum(value, peer)
  return all_reduce


@pytest.mark.parametrize("peer_mark", [-123456789, 123456789])
def test_all_reduce_stamp_carries_and_checks_the_fingerprint(peer_mark):
  transport = collective_sum.CollectiveSumTransport(_peer_max(peer_mark), 2,
                                                    0, "/cpu:0")
  scales = tf.constant([1.0, 2.0])

  @tf.function
  def reduce():
    (reduction,) = transport.all_reduce([(0, "/cpu:0", scales)], "Max",
                                        step=tf.constant(4),
                                        fingerprint=-123456789)
    return reduction.value

  if peer_mark == -123456789:
    np.testing.assert_array_equal(reduce(), [1.0, 2.0])
  else:
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="workers disagree on what they exchange"):
      reduce()
