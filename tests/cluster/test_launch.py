"""Tests of `python -m ndq_tf.launch` with tiny non-TF child programs.

The launcher runs as a script (`ndq_tf/launch.py`), so no test here imports
TensorFlow in a child; each test takes a few seconds on an idle machine.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ndq_tf.cluster import launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
LAUNCH = os.path.join(ROOT, "ndq_tf", "launch.py")

# Wall-clock bounds, loose enough for a loaded 2-core machine. Children that
# the launcher must stop sleep for CHILD_SLEEP seconds, so a launch that ends
# within STOPPED_WITHIN seconds stopped them rather than waited for them.
CHILD_SLEEP = 180
STOPPED_WITHIN = 90
SUBPROCESS_TIMEOUT = 150

# Child programs: the worker index comes from TF_CONFIG, as for real workers.
_INDEX = "import json, os; i = json.loads(os.environ['TF_CONFIG'])['task']['index']"
PRINT_CONFIG = f"{_INDEX}; print('CONFIG ' + os.environ['TF_CONFIG'])"
PRINT_PREFIX_ENV = (f"{_INDEX}; print('PREFIX', i, "
                    "os.environ.get('NDQ_TEST_PREFIX'))")
ONE_FAILS = (f"import sys, time; {_INDEX}\n"
             "if i == 1: print('failing', flush=True); sys.exit(5)\n"
             f"time.sleep({CHILD_SLEEP}); print('worker 0 finished')")
SLEEP = f"import time; print('sleeping', flush=True); time.sleep({CHILD_SLEEP})"
CATCH_SIGINT = ("import sys, time\n"
                "print('ready', flush=True)\n"
                f"try:\n  time.sleep({CHILD_SLEEP})\n"
                "except KeyboardInterrupt:\n"
                "  print('got SIGINT', flush=True); sys.exit(130)")
IGNORE_SIGTERM = ("import signal, time\n"
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                  f"print('stubborn', flush=True); time.sleep({CHILD_SLEEP})")


def _launch(code, *options, timeout=SUBPROCESS_TIMEOUT):
  cmd = [sys.executable, LAUNCH, *options, "--", sys.executable, "-c", code]
  start = time.monotonic()
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def test_success_prefixes_every_line_with_the_worker_index():
  code, output, _ = _launch(PRINT_CONFIG, "--num_workers", "3")
  assert code == 0, output
  lines = [l for l in output.splitlines() if l.startswith("[worker")]
  assert sorted(l.split("]")[0] + "]" for l in lines) == [
      "[worker 0]", "[worker 1]", "[worker 2]"]


def test_tf_config_names_all_workers_and_each_own_index():
  code, output, _ = _launch(PRINT_CONFIG, "--num_workers", "3")
  assert code == 0, output
  configs = {}
  for line in output.splitlines():
    if line.startswith("[worker") and " CONFIG " in line:
      prefix, config = line.split(" CONFIG ", 1)
      configs[int(prefix.split()[1].rstrip("]"))] = json.loads(config)
  assert sorted(configs) == [0, 1, 2]
  cluster = configs[0]["cluster"]
  assert list(cluster) == ["worker"] and len(cluster["worker"]) == 3
  ports = {a.split(":")[1] for a in cluster["worker"]}
  assert len(ports) == 3
  assert all(a.startswith("127.0.0.1:") for a in cluster["worker"])
  for index, config in configs.items():
    assert config["cluster"] == cluster
    assert config["task"] == {"type": "worker", "index": index}


def test_failing_worker_stops_the_others_and_gives_its_exit_code():
  code, output, elapsed = _launch(ONE_FAILS, "--num_workers", "2")
  assert code == 5, output
  assert "worker 1 failed with exit code 5" in output
  assert "[worker 0] worker 0 finished" not in output
  assert elapsed < STOPPED_WITHIN


def test_timeout_stops_all_workers_and_exits_124():
  code, output, elapsed = _launch(SLEEP, "--num_workers", "2", "--timeout",
                                  "1")
  assert code == launch.TIMEOUT_EXIT_CODE, output
  assert "timeout after 1 s" in output
  assert elapsed < STOPPED_WITHIN


def test_worker_ignoring_sigterm_is_killed_after_grace():
  code, output, elapsed = _launch(IGNORE_SIGTERM, "--num_workers", "2",
                                  "--timeout", "1", "--grace", "0.5")
  assert code == launch.TIMEOUT_EXIT_CODE, output
  assert elapsed < STOPPED_WITHIN


def test_sigint_is_forwarded_to_every_worker():
  cmd = [sys.executable, LAUNCH, "--num_workers", "2", "--", sys.executable,
         "-c", CATCH_SIGINT]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    ready = 0
    lines = []
    while ready < 2:
      line = proc.stdout.readline()
      assert line, "".join(lines)
      lines.append(line)
      ready += line.strip().endswith("ready")
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=STOPPED_WITHIN)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 128 + signal.SIGINT, output
  assert output.count("] got SIGINT\n") == 2, output


def test_missing_command_is_a_usage_error():
  proc = subprocess.run([sys.executable, LAUNCH, "--num_workers", "2"],
                        capture_output=True, text=True,
                        timeout=SUBPROCESS_TIMEOUT)
  assert proc.returncode == 2
  assert "give the worker command after `--`" in proc.stderr


def test_make_tf_config_rejects_out_of_range_index():
  with pytest.raises(ValueError, match=r"`index` must be an int in \[0, 2\)"):
    launch.make_tf_config(["127.0.0.1:1", "127.0.0.1:2"], 2)


def test_find_free_ports_are_distinct():
  ports = launch.find_free_ports(4)
  assert len(set(ports)) == 4


def test_launch_rejects_bad_arguments():
  with pytest.raises(ValueError, match="`num_workers` must be a positive int"):
    launch.launch(["true"], num_workers=0)
  with pytest.raises(ValueError, match="`timeout` must be positive"):
    launch.launch(["true"], num_workers=1, timeout=0)


def _configs(output):
  """`{index: TF_CONFIG dict}` from the children's `CONFIG ...` lines."""
  configs = {}
  for line in output.splitlines():
    if line.startswith("[worker") and " CONFIG " in line:
      prefix, config = line.split(" CONFIG ", 1)
      configs[int(prefix.split()[1].rstrip("]"))] = json.loads(config)
  return configs


def test_worker_prefix_is_formatted_with_each_worker_index():
  code, output, _ = _launch(PRINT_PREFIX_ENV, "--num_workers", "3",
                            "--worker_prefix", "env NDQ_TEST_PREFIX={index}")
  assert code == 0, output
  seen = sorted(line.split("] ", 1)[1] for line in output.splitlines()
                if line.startswith("[worker") and "] PREFIX " in line)
  assert seen == ["PREFIX 0 0", "PREFIX 1 1", "PREFIX 2 2"], output


def test_hosts_give_each_worker_its_address_and_the_worker_count():
  # All of 127.0.0.0/8 is this machine's; repeated addresses get distinct
  # free ports.
  hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.1"]
  code, output, _ = _launch(PRINT_CONFIG, "--hosts", ",".join(hosts))
  assert code == 0, output
  configs = _configs(output)
  assert sorted(configs) == [0, 1, 2]
  workers = configs[0]["cluster"]["worker"]
  assert [a.split(":")[0] for a in workers] == hosts
  assert workers[0] != workers[2]
  for index, config in configs.items():
    assert config["cluster"]["worker"] == workers
    assert config["task"] == {"type": "worker", "index": index}


def test_port_puts_worker_i_on_port_plus_i():
  # The children bind nothing: the ports need not be free.
  code, output, _ = _launch(PRINT_CONFIG, "--hosts", "127.0.0.1,127.0.0.1",
                            "--port", "23456")
  assert code == 0, output
  assert _configs(output)[1]["cluster"]["worker"] == [
      "127.0.0.1:23456", "127.0.0.1:23457"]


def test_free_ports_on_an_address_of_another_machine_is_an_error():
  # 192.0.2.0/24 is reserved for documentation (RFC 5737): never local.
  code, output, _ = _launch(PRINT_CONFIG, "--hosts", "192.0.2.1,192.0.2.2")
  assert code == 2, output
  assert "pass `port`" in output
  assert "[worker" not in output


def test_hosts_and_num_workers_must_agree():
  code, output, _ = _launch(PRINT_CONFIG, "--hosts", "127.0.0.1,127.0.0.1",
                            "--num_workers", "3")
  assert code == 2, output
  assert "--hosts must give one address per worker" in output


def test_launch_rejects_bad_addresses_and_prefixes():
  with pytest.raises(ValueError, match=re.escape(
      "`hosts` must give one non-empty address per worker (num_workers=2). "
      "Received: hosts=['127.0.0.1']")):
    launch.launch(["true"], num_workers=2, hosts=["127.0.0.1"])
  with pytest.raises(ValueError, match=re.escape(
      "`port` must be an int in [1, 65534] (worker i listens on port + i). "
      "Received: port=65535")):
    launch.launch(["true"], num_workers=2, port=65535)
  with pytest.raises(ValueError, match=re.escape(
      "`worker_prefix` may use no format field but `{index}`")):
    launch.launch(["true"], num_workers=1, worker_prefix=["env", "X={i}"])


def test_python_m_launch_imports_no_tensorflow():
  # `-m` imports the package `ndq_tf` first; its names load lazily, so the
  # launcher holds only the standard library while it runs a 2-worker job
  # (`-X importtime` lists every module the launcher's process imports).
  env = dict(os.environ, PYTHONPATH=ROOT)
  proc = subprocess.run(
      [sys.executable, "-X", "importtime", "-m", "ndq_tf.launch",
       "--num_workers", "2", "--", sys.executable, "-c", PRINT_CONFIG],
      capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT, env=env,
      cwd=ROOT)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert len(_configs(proc.stdout)) == 2, proc.stdout
  imported = [line.rsplit("|", 1)[1].strip() for line in
              proc.stderr.splitlines() if line.startswith("import time:")]
  assert "ndq_tf" in imported, proc.stderr
  heavy = [m for m in imported
           if m.split(".")[0] in ("tensorflow", "keras", "numpy", "absl")]
  assert not heavy, heavy
