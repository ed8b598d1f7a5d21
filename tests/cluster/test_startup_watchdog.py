"""Tests of `ndq_tf.cluster.startup_watchdog` with real processes, no TF.

Every guarded process is a child Python program in isolated mode (`-I`) that
loads the module by path, so neither it nor its watcher imports TensorFlow;
each test takes a few seconds. The watcher kills its *parent*, so no watcher
here ever has the pytest process as the process to stop.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow as tf

from ndq_tf.cluster import startup_watchdog

FOLDER = os.path.dirname(os.path.abspath(startup_watchdog.__file__))
TASK1 = "/job:worker/task:1"
# Generous: a loaded 2-core machine, a Python start-up or two per test.
BOUND = 30.0

needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/stat"),
                                reason="reads /proc/<pid>/stat (Linux)")

# Preamble of every child program.
_HEADER = f"""\
import json, os, signal, socket, subprocess, sys, time
sys.path.insert(0, {FOLDER!r})
import startup_watchdog as sw


def start_time(pid):
  with open(f"/proc/{{pid}}/stat") as f:
    return f.read().rpartition(")")[2].split()[19]


def wait_for(path, text, bound={BOUND}):
  deadline = time.monotonic() + bound
  while time.monotonic() < deadline:
    if os.path.exists(path) and text in open(path).read():
      return
    time.sleep(0.05)
  raise TimeoutError(f"no {{text!r}} in {{path}}")
"""


def _free_port():
  """A TCP port of 127.0.0.1 on which nothing listens."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_child(tmp_path, body, env=None, **params):
  """Runs `body` in a child Python (no TF); `params` become its globals.

  Returns:
    `(completed process, seconds it took)`.
  """
  lines = [f"{name} = {value!r}" for name, value in params.items()]
  script = tmp_path / "child.py"
  script.write_text(_HEADER + "\n".join(lines) + "\n" +
                    textwrap.dedent(body) +
                    "\nassert 'tensorflow' not in sys.modules\n")
  start = time.monotonic()
  proc = subprocess.run([sys.executable, "-I", str(script)],
                        capture_output=True, text=True, timeout=BOUND * 2,
                        env=env, cwd=tmp_path)
  return proc, time.monotonic() - start


def _stat(pid):
  """`(state, start time)` of process `pid`, or None if there is none."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rpartition(")")[2].split()
  except (FileNotFoundError, ProcessLookupError):
    return None
  return fields[0], fields[19]


def _is_running(pid, start_time):
  """Whether the process `pid` started at `start_time` still runs."""
  stat = _stat(pid)
  # A zombie has ended (its new parent may not reap it); another start time
  # is another process with a recycled pid.
  return stat is not None and stat[0] != "Z" and stat[1] == start_time


def _wait_gone(pid, start_time, bound=BOUND):
  deadline = time.monotonic() + bound
  while _is_running(pid, start_time):
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)
  return True


def _kill(pid):
  try:
    os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def _read_pids(path):
  return [line.split() for line in path.read_text().splitlines()]


# -- cluster_addresses and validation ------------------------------------------


def test_cluster_addresses_lists_every_task_sorted_by_job():
  spec = tf.train.ClusterSpec({
      "worker": ["127.0.0.1:3", "127.0.0.1:4"],
      "chief": ["127.0.0.1:2"],
  }).as_dict()
  assert startup_watchdog.cluster_addresses(spec) == [
      ("/job:chief/task:0", "127.0.0.1:2"),
      ("/job:worker/task:0", "127.0.0.1:3"),
      ("/job:worker/task:1", "127.0.0.1:4"),
  ]


def test_cluster_addresses_keeps_the_indices_of_a_sparse_job():
  spec = tf.train.ClusterSpec({"worker": {2: "h2:1", 0: "h0:1"}}).as_dict()
  assert startup_watchdog.cluster_addresses(spec) == [
      ("/job:worker/task:0", "h0:1"), ("/job:worker/task:2", "h2:1")]


def test_cluster_addresses_of_no_cluster_is_empty():
  assert startup_watchdog.cluster_addresses({}) == []


@pytest.mark.parametrize("spec, text", [
    (["127.0.0.1:1"], "`cluster_spec` must be a dict"),
    ({"worker": "127.0.0.1:1"},
     "`cluster_spec['worker']` must be a list of addresses"),
])
def test_cluster_addresses_rejects_other_types(spec, text):
  with pytest.raises(TypeError, match="Received") as info:
    startup_watchdog.cluster_addresses(spec)
  assert text in str(info.value)


@pytest.mark.parametrize("timeout", [0, -1.0, True, "5", float("inf"), None])
def test_timeout_must_be_positive_and_finite(timeout):
  with pytest.raises(ValueError) as info:
    startup_watchdog.StartupWatchdog([], timeout)
  assert "`timeout` must be a positive, finite number of seconds" in str(
      info.value)
  assert f"Received: timeout={timeout!r}" in str(info.value)


@pytest.mark.parametrize("addresses", [
    "127.0.0.1:1",
    [("127.0.0.1:1",)],
    [("task", "no_port")],
    [("task", 2222)],
    {"task": "127.0.0.1:1"},
])
def test_addresses_must_be_name_address_pairs(addresses):
  with pytest.raises(ValueError) as info:
    startup_watchdog.StartupWatchdog(addresses, 1)
  assert "`addresses` must be a list of (task name, 'host:port') pairs" in str(
      info.value)
  assert f"Received: addresses={addresses!r}" in str(info.value)


def test_description_must_be_a_string():
  with pytest.raises(TypeError, match=r"Received: description=1"):
    startup_watchdog.StartupWatchdog([], 1, description=1)


def test_properties_and_no_watcher_outside_the_block():
  watchdog = startup_watchdog.StartupWatchdog([[TASK1, "h:1"]], 2, "me")
  assert watchdog.addresses == [(TASK1, "h:1")]
  assert watchdog.timeout == 2.0
  assert watchdog.description == "me"
  assert watchdog.watcher_pid is None


def test_watcher_does_not_import_tensorflow():
  command = startup_watchdog.watcher_command(
      os.getpid(), [(TASK1, "127.0.0.1:1")], timeout=5)
  # Exactly the command StartupWatchdog runs, with import timing on. stdin
  # at end of file: the watcher ends at once (start-up over).
  command = [command[0], "-X", "importtime", *command[1:]]
  proc = subprocess.run(command, stdin=subprocess.DEVNULL,
                        capture_output=True, text=True, timeout=BOUND)
  assert proc.returncode == 0, proc.stderr
  imported = [line.rsplit("|", 1)[-1].strip()
              for line in proc.stderr.splitlines() if "|" in line]
  assert "socket" in imported  # The timing output is there.
  assert not [m for m in imported if m.split(".")[0] in ("tensorflow",
                                                           "ndq_tf", "keras")]


# -- The watcher kills, or does not ---------------------------------------------


@pytest.mark.parametrize("listening", [False, True],
                         ids=["unreachable", "up_but_not_joined"])
def test_kills_a_start_up_that_does_not_end(tmp_path, listening):
  port = _free_port()
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    up = f"127.0.0.1:{server.getsockname()[1]}"
    addresses = [("/job:worker/task:0", up)]
    if not listening:
      addresses.append((TASK1, f"127.0.0.1:{port}"))
    tf_config = json.dumps({"cluster": {"worker": [a for _, a in addresses]},
                            "task": {"type": "worker", "index": 0}})
    proc, seconds = _run_child(
        tmp_path, """
        with sw.StartupWatchdog(ADDRESSES, timeout=1, description="my_job"):
          print("waiting", flush=True)
          time.sleep(60)
        print("not killed")
        """, env={**os.environ, "TF_CONFIG": tf_config}, ADDRESSES=addresses)
  assert proc.returncode == -signal.SIGKILL, proc.stderr
  assert seconds < BOUND
  assert proc.stdout == "waiting\n"
  message = proc.stderr
  assert message.startswith("my_job: the cluster did not form within "
                            "cluster_timeout=1 s; stopping this worker (pid ")
  assert "SIGKILL" in message
  if listening:
    assert "Unreachable workers: none (they are up but did not join)." in (
        message)
  else:
    assert f"Unreachable workers: {TASK1} (127.0.0.1:{port})." in message
  assert up not in message.split("Unreachable workers:")[1].split(".")[0]
  assert ("Check that every worker was started with the same TF_CONFIG "
          "'cluster' and its own 'task.index'.") in message
  assert f"TF_CONFIG here: {tf_config!r}" in message


def test_message_says_when_tf_config_is_not_set(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  proc, _ = _run_child(tmp_path, """
      with sw.StartupWatchdog([], timeout=0.5):
        time.sleep(60)
      """, env=env)
  assert proc.returncode == -signal.SIGKILL, proc.stderr
  assert proc.stderr.startswith("ndq_tf: the cluster did not form")
  assert "TF_CONFIG is not set here." in proc.stderr


def test_leaving_the_block_in_time_is_not_killed(tmp_path):
  proc, seconds = _run_child(tmp_path, """
      watchdog = sw.StartupWatchdog(ADDRESSES, timeout=2)
      with watchdog:
        pid, started = watchdog.watcher_pid, start_time(watchdog.watcher_pid)
        time.sleep(0.2)
      assert watchdog.watcher_pid is None
      # __exit__ waited for (and reaped) the watcher.
      assert not os.path.exists(f"/proc/{pid}") or start_time(pid) != started
      time.sleep(4)  # Well past the timeout.
      print("alive")
      """, ADDRESSES=[(TASK1, f"127.0.0.1:{_free_port()}")])
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "alive\n"
  assert proc.stderr == ""
  assert seconds < BOUND


def test_an_exception_in_the_block_propagates_and_ends_the_watcher(tmp_path):
  proc, seconds = _run_child(tmp_path, """
      start = time.monotonic()
      try:
        with sw.StartupWatchdog([], timeout=120):
          raise KeyError("start-up failed")
      except KeyError as e:
        print("propagated", e, round(time.monotonic() - start))
      """)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith("propagated 'start-up failed'")
  assert seconds < BOUND  # Not the 120 s timeout.


def test_cannot_be_entered_twice_at_once(tmp_path):
  proc, _ = _run_child(tmp_path, """
      watchdog = sw.StartupWatchdog([], timeout=120)
      with watchdog:
        try:
          with watchdog:
            pass
        except RuntimeError as e:
          print(e)
      """)
  assert proc.returncode == 0, proc.stderr
  assert "already active" in proc.stdout


# -- The watcher never outlives its parent ---------------------------------------


@needs_proc
def test_watcher_ends_when_its_parent_is_killed(tmp_path):
  pids = tmp_path / "pids"
  proc, _ = _run_child(tmp_path, """
      with sw.StartupWatchdog([], timeout=120) as watchdog:
        with open(PIDS, "w") as f:
          f.write(f"{watchdog.watcher_pid} {start_time(watchdog.watcher_pid)}")
        os.kill(os.getpid(), signal.SIGKILL)
      """, PIDS=str(pids))
  assert proc.returncode == -signal.SIGKILL, proc.stderr
  [(watcher, started)] = _read_pids(pids)
  assert _wait_gone(int(watcher), started), "the watcher outlived its parent"


@needs_proc
def test_watcher_ends_when_its_parent_exits_while_a_fork_holds_the_pipe(
    tmp_path):
  pids = tmp_path / "pids"
  holder_file = tmp_path / "holder"
  proc, _ = _run_child(tmp_path, """
      with sw.StartupWatchdog([], timeout=120) as watchdog:
        if os.fork() == 0:  # Holds a copy of the pipe to the watcher.
          null = os.open(os.devnull, os.O_RDWR)
          for fd in (0, 1, 2):
            os.dup2(null, fd)
          with open(HOLDER, "w") as f:
            f.write(f"{os.getpid()} {start_time(os.getpid())}")
          time.sleep(60)
          os._exit(0)
        wait_for(HOLDER, " ")
        with open(PIDS, "w") as f:
          f.write(f"{watchdog.watcher_pid} {start_time(watchdog.watcher_pid)}")
        os._exit(0)  # Without leaving the block.
      """, PIDS=str(pids), HOLDER=str(holder_file))
  [(holder, holder_started)] = _read_pids(holder_file)
  try:
    assert proc.returncode == 0, proc.stderr
    [(watcher, started)] = _read_pids(pids)
    assert _wait_gone(int(watcher), started), "the watcher outlived its parent"
    assert _is_running(int(holder), holder_started)  # The pipe stayed open.
  finally:
    _kill(int(holder))


# -- The last checks, between probing and killing ---------------------------------

# The child starts a watcher itself (as StartupWatchdog does), with
# `--probe_delay` to widen the probing phase and `--verbose` to know when it
# begins, its stderr in a file that the test reads.
_START_WATCHER = """
log = open(LOG, "w")
watcher = subprocess.Popen(
    sw.watcher_command(os.getpid(), ADDRESSES, timeout=0.5, probe_delay=3,
                       verbose=True),
    stdin=subprocess.PIPE, stderr=log)
wait_for(LOG, "probing")
"""


@pytest.mark.parametrize("ends_while_probing", [True, False])
def test_start_up_ending_while_probing_is_not_killed(tmp_path,
                                                     ends_while_probing):
  log = tmp_path / "watcher.log"
  proc, seconds = _run_child(tmp_path, _START_WATCHER + textwrap.dedent("""
      if ENDS_WHILE_PROBING:
        watcher.stdin.close()  # The start-up ends during the probes.
      print("watcher exit", watcher.wait(timeout=30), flush=True)
      """), LOG=str(log), ENDS_WHILE_PROBING=ends_while_probing,
                             ADDRESSES=[(TASK1, f"127.0.0.1:{_free_port()}")])
  watcher_log = log.read_text()
  assert seconds < BOUND
  if ends_while_probing:
    assert proc.returncode == 0, proc.stderr + watcher_log
    assert proc.stdout == "watcher exit 0\n"
    assert "start-up ended while probing; not stopping pid" in watcher_log
    assert "stopping this worker" not in watcher_log
  else:  # The control: the same watcher kills.
    assert proc.returncode == -signal.SIGKILL, proc.stderr + watcher_log
    assert proc.stdout == ""
    assert "sleeping 3 s (--probe_delay)" in watcher_log
    assert "stopping this worker" in watcher_log


@needs_proc
def test_parent_gone_while_probing_is_not_killed_nor_reported(tmp_path):
  log = tmp_path / "watcher.log"
  holder_file = tmp_path / "holder"
  # The parent dies during the probes while a forked child keeps the pipe
  # open: only the parent check stops the watcher from acting on a dead
  # (possibly recycled) pid.
  proc, _ = _run_child(tmp_path, _START_WATCHER + textwrap.dedent("""
      if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
          os.dup2(null, fd)
        with open(HOLDER, "w") as f:
          f.write(f"{os.getpid()} {start_time(os.getpid())}")
        time.sleep(60)
        os._exit(0)
      wait_for(HOLDER, " ")
      with open(HOLDER + ".watcher", "w") as f:
        f.write(f"{watcher.pid} {start_time(watcher.pid)}")
      os._exit(0)
      """), LOG=str(log), HOLDER=str(holder_file),
                       ADDRESSES=[(TASK1, f"127.0.0.1:{_free_port()}")])
  [(holder, holder_started)] = _read_pids(holder_file)
  try:
    assert proc.returncode == 0, proc.stderr
    [(watcher, started)] = _read_pids(tmp_path / "holder.watcher")
    assert _wait_gone(int(watcher), started)
    watcher_log = log.read_text()
    assert "is gone; not stopping it" in watcher_log, watcher_log
    assert "stopping this worker" not in watcher_log
    assert _is_running(int(holder), holder_started)  # The pipe stayed open.
  finally:
    _kill(int(holder))


def test_watcher_refuses_a_pid_that_is_not_its_parent(tmp_path):
  sleeper = subprocess.Popen([sys.executable, "-I", "-c",
                              "import time; time.sleep(60)"])
  try:
    # Run by this test: its parent is pytest, not the sleeper.
    # stdin stays open (start-up not over) until the watcher has answered.
    with subprocess.Popen(
        startup_watchdog.watcher_command(sleeper.pid, [], timeout=0.1),
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as watcher:
      returncode = watcher.wait(timeout=BOUND)
      stderr = watcher.stderr.read()
    assert returncode == 2, stderr
    assert (f"`--pid` must be the watcher's parent (the process to stop). "
            f"Received: --pid={sleeper.pid}, but the parent is "
            f"{os.getpid()}") in stderr
    time.sleep(0.2)
    assert sleeper.poll() is None
  finally:
    sleeper.kill()
    sleeper.wait()


@pytest.mark.parametrize("flag, text", [
    ("--timeout=0", "argument --timeout: `--timeout` must be a positive"),
    ("--timeout=nan", "argument --timeout"),
    ("--addresses=[[1]]", "argument --addresses: must be a JSON list"),
    ("--probe_delay=-1", "argument --probe_delay: must be a non-negative"),
])
def test_watcher_rejects_malformed_flags(flag, text):
  command = startup_watchdog.watcher_command(os.getpid(), [], timeout=1)
  name = flag.split("=")[0]
  command = [c for c in command if not c.startswith(name + "=")] + [flag]
  proc = subprocess.run(command, stdin=subprocess.PIPE, capture_output=True,
                        text=True, timeout=BOUND)
  assert proc.returncode == 2
  assert text in proc.stderr
