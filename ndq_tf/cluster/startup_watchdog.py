"""Stops a worker whose cluster does not form in time, naming missing workers.

TensorFlow's multi-worker strategies wait for every worker at start-up inside
C++, with no deadline and holding the GIL: no Python thread of the waiting
process runs, and it does not act on SIGTERM. A worker started with a wrong
`TF_CONFIG` (another worker's `task.index`, a different cluster) then hangs in
silence. `StartupWatchdog` guards such a start-up with a watcher in a separate
process: if the start-up has not ended within `timeout` seconds, the watcher
probes every worker's address, prints which are unreachable and what to check,
and kills the waiting process with SIGKILL (the only signal it acts upon).

Protocol between the two processes: the watcher's stdin is a pipe from the
guarded process. When the start-up ends, `StartupWatchdog.__exit__` writes a
byte and closes the pipe; when the guarded process dies, the pipe closes
too. Either makes stdin readable, and the watcher exits 0. The watcher also
exits once its parent is gone (its parent pid changes), in case a forked
child keeps the pipe open. Past the timeout it probes the addresses, then
checks again that stdin is still not readable (start-up may have ended while
it probed) and that its parent is still the process to stop (so a recycled
pid is never killed), and only then prints the message and kills.

The watcher imports the standard library only. It runs as a script,
`python -I .../startup_watchdog.py` (`watcher_command`), rather than
`python -m ndq_tf.cluster.startup_watchdog`: `-m` first imports the
package `ndq_tf` (and, by the old path `ndq_tf.distribute.startup_watchdog`,
`ndq_tf.distribute`, hence TensorFlow: seconds, and hundreds of MB per
worker). `-I` (isolated mode) keeps the script's folder,
`PYTHONPATH` and the user's site-packages out of its imports. `-m` works too,
only slowly.

Example:

```python
addresses = cluster_addresses(cluster_resolver.cluster_spec().as_dict())
with StartupWatchdog(addresses, timeout=300,
                     description="ndq_tf.MultiWorkerMirroredStrategy"):
  ...  # The start-up that may hang (e.g. joining the cluster).
```
"""

import argparse
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = [
    "StartupWatchdog",
    "cluster_addresses",
    "watcher_command",
    "main",
    "CONNECT_TIMEOUT",
]

# Seconds the watcher waits for a connection to each address.
CONNECT_TIMEOUT = 1.0
# Extra seconds for all probes together, e.g. for name resolution (which has
# no timeout of its own): past it, an unanswered address counts as
# unreachable.
_PROBE_GRACE = 2.0
# Seconds between the watcher's checks that its parent is alive.
_PARENT_POLL = 0.5
# Seconds `__exit__` waits for the watcher (it needs at most the probe time
# plus `--probe_delay`) before killing it.
_EXIT_WAIT = 60.0
# Watcher exit codes.
_EXIT_DONE = 0  # Start-up ended, or the parent is gone: nothing to do.
_EXIT_KILLED = 1  # The parent was killed.
_EXIT_USAGE = 2  # Bad arguments (as argparse).


def cluster_addresses(cluster_spec):
  """Lists the tasks of a cluster as `(task name, "host:port")` pairs.

  Args:
    cluster_spec: a dict mapping job names to lists of addresses, or to dicts
      `{task index: address}` (sparse jobs), as returned by
      `cluster_resolver.cluster_spec().as_dict()`.

  Returns:
    A list of `("/job:<job>/task:<index>", address)`, jobs sorted by name and
    tasks by index; a sparse job's tasks keep their own indices.

  Raises:
    TypeError: if `cluster_spec` is not a dict of lists or dicts.

  Example:

  >>> cluster_addresses({"worker": ["h0:2222", "h1:2222"]})
  [('/job:worker/task:0', 'h0:2222'), ('/job:worker/task:1', 'h1:2222')]
  """
  if not isinstance(cluster_spec, dict):
    raise TypeError(
        "`cluster_spec` must be a dict mapping job names to lists (or dicts "
        "{index: address}) of 'host:port' addresses, e.g. "
        "`cluster_resolver.cluster_spec().as_dict()`. "
        f"Received: cluster_spec={cluster_spec!r}")
  addresses = []
  for job in sorted(cluster_spec):
    tasks = cluster_spec[job]
    if isinstance(tasks, dict):
      tasks = sorted(tasks.items())
    elif isinstance(tasks, (list, tuple)):
      tasks = enumerate(tasks)
    else:
      raise TypeError(
          f"`cluster_spec[{job!r}]` must be a list of addresses or a dict "
          f"{{index: address}}. Received: {tasks!r} in "
          f"cluster_spec={cluster_spec!r}")
    for index, address in tasks:
      addresses.append((f"/job:{job}/task:{index}", address))
  return addresses


def _check_addresses(addresses):
  """`addresses` as a list of `(name, "host:port")` tuples, or raises."""
  pairs = None
  if isinstance(addresses, (list, tuple)) and all(
      isinstance(pair, (list, tuple)) for pair in addresses):
    pairs = [tuple(pair) for pair in addresses]
  if pairs is None or not all(
      len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], str)
      and ":" in pair[1] for pair in pairs):
    raise ValueError(
        "`addresses` must be a list of (task name, 'host:port') pairs of "
        "strings, e.g. cluster_addresses(cluster_spec). "
        f"Received: addresses={addresses!r}")
  return pairs


def _check_timeout(timeout, name="timeout"):
  if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or
      not 0 < timeout < math.inf):
    raise ValueError(
        f"`{name}` must be a positive, finite number of seconds. "
        f"Received: {name}={timeout!r}")
  return float(timeout)


def watcher_command(pid, addresses, timeout, description="", probe_delay=0.0,
                    verbose=False):
  """The command that starts a watcher of process `pid`.

  `StartupWatchdog` runs it with a pipe on its stdin; tests and debugging
  can run it themselves (with `probe_delay` and `verbose`).

  Args:
    pid: the process to stop; it must be the watcher's parent (the process
      that runs the command).
    addresses: list of `(task name, "host:port")`, see `cluster_addresses`.
    timeout: seconds to wait for the end of start-up.
    description: who waits for the cluster, named at the start of the
      message (e.g. `"ndq_tf.MultiWorkerMirroredStrategy"`; default
      `"ndq_tf"`).
    probe_delay: for tests only: seconds the watcher sleeps after probing,
      before its last checks, which widens the window in which the start-up
      can end while it probes.
    verbose: log each phase of the watcher to stderr.

  Returns:
    The argv list: `[sys.executable, "-I", <this file>, ...flags]`.
  """
  command = [
      sys.executable, "-I", os.path.abspath(__file__),
      f"--pid={int(pid)}",
      f"--timeout={float(timeout)!r}",
      f"--addresses={json.dumps([list(pair) for pair in addresses])}",
      f"--description={description}",
  ]
  if probe_delay:
    command.append(f"--probe_delay={float(probe_delay)!r}")
  if verbose:
    command.append("--verbose")
  return command


class StartupWatchdog:
  """Kills this process with a clear message if a start-up does not end in time.

  A context manager: `__enter__` starts the watcher process (see the module
  docstring), `__exit__` tells it that the start-up ended and waits for it.
  If the block has not been left within `timeout` seconds, the watcher probes
  `addresses` (`CONNECT_TIMEOUT` seconds each, concurrently), prints to
  stderr which are unreachable, this process's `TF_CONFIG` and the remedy
  (the same `'cluster'` on every worker, each its own `'task.index'`), and
  kills this process with SIGKILL. The watcher never outlives this process.

  Args:
    addresses: list of `(task name, "host:port")` pairs to probe, e.g.
      `cluster_addresses(cluster_resolver.cluster_spec().as_dict())`.
    timeout: seconds (a positive, finite number) the block may take.
    description: who waits for the cluster, named at the start of the
      message (e.g. `"ndq_tf.MultiWorkerMirroredStrategy"`; default
      `"ndq_tf"`).

  Raises:
    ValueError: if `addresses` or `timeout` is invalid.
    TypeError: if `description` is not a str.

  Example:

  ```python
  with StartupWatchdog([("/job:worker/task:1", "10.0.0.2:2222")], timeout=60):
    server_start_that_may_hang()
  ```
  """

  def __init__(self, addresses, timeout, description=""):
    self._addresses = _check_addresses(addresses)
    self._timeout = _check_timeout(timeout)
    if not isinstance(description, str):
      raise TypeError(
          f"`description` must be a str. Received: description={description!r}")
    self._description = description
    self._process = None

  @property
  def addresses(self):
    """The `(task name, "host:port")` pairs probed past the timeout."""
    return list(self._addresses)

  @property
  def timeout(self):
    """Seconds the guarded block may take."""
    return self._timeout

  @property
  def description(self):
    return self._description

  @property
  def watcher_pid(self):
    """Process id of the running watcher, `None` outside the `with` block."""
    return None if self._process is None else self._process.pid

  def __enter__(self):
    if self._process is not None:
      raise RuntimeError("This StartupWatchdog is already active; a "
                         "StartupWatchdog cannot be entered twice at once.")
    self._process = subprocess.Popen(
        watcher_command(os.getpid(), self._addresses, self._timeout,
                        self._description),
        stdin=subprocess.PIPE)
    return self

  def __exit__(self, *exc_info):
    process, self._process = self._process, None
    # A byte, not only the end of file: a child forked inside the block may
    # hold a copy of the pipe open.
    try:
      process.stdin.write(b"\n")
      process.stdin.flush()
    except OSError:  # The watcher is gone already.
      pass
    try:
      process.stdin.close()
    except OSError:
      pass
    try:
      process.wait(timeout=_EXIT_WAIT)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
    return False


# -- The watcher process -------------------------------------------------------


def _readable(fd, timeout):
  """Whether `fd` becomes readable (data or end of file) within `timeout`."""
  try:
    return bool(select.select([fd], [], [], timeout)[0])
  except (OSError, ValueError):  # Closed or invalid: no parent to wait for.
    return True


def _open_pidfd(pid):
  """A pidfd of `pid` where the OS offers one, else None.

  Signalling through a pidfd can never reach another process that got the
  same pid after `pid` exited.
  """
  if not hasattr(os, "pidfd_open"):
    return None
  try:
    return os.pidfd_open(pid)
  except OSError:  # Old kernel, seccomp, or `pid` gone.
    return None


def _probe(addresses, connect_timeout=CONNECT_TIMEOUT):
  """Returns `"name (address)"` of every address that accepts no connection."""
  reachable = [False] * len(addresses)

  def probe(i, address):
    host, _, port = address.rpartition(":")
    try:
      socket.create_connection((host.strip("[]"), int(port)),
                               timeout=connect_timeout).close()
      reachable[i] = True
    except (OSError, ValueError):
      pass

  # Concurrently, so that many dead addresses take one timeout, not one each.
  # Daemon threads: one stuck in name resolution does not hold the exit.
  threads = [threading.Thread(target=probe, args=(i, address), daemon=True)
             for i, (_, address) in enumerate(addresses)]
  for thread in threads:
    thread.start()
  deadline = time.monotonic() + connect_timeout + _PROBE_GRACE
  for thread in threads:
    thread.join(max(0.0, deadline - time.monotonic()))
  return [f"{name} ({address})"
          for (name, address), ok in zip(addresses, reachable) if not ok]


def _message(description, pid, timeout, missing, tf_config):
  unreachable = ", ".join(missing) or "none (they are up but did not join)"
  here = (f"TF_CONFIG here: {tf_config!r}" if tf_config is not None
          else "TF_CONFIG is not set here.")
  return (
      f"{description or 'ndq_tf'}: the cluster did not form within "
      f"cluster_timeout={timeout:g} s; stopping this worker (pid {pid}, "
      f"SIGKILL). Unreachable workers: {unreachable}. Check that every worker "
      "was started with the same TF_CONFIG 'cluster' and its own "
      f"'task.index'. {here}\n")


def _watch(pid, addresses, timeout, description, probe_delay, log):
  """The watcher's work; returns its exit code."""
  stdin = sys.stdin.fileno()
  if _readable(stdin, 0):
    log("start-up ended before the watch began")
    return _EXIT_DONE
  if os.getppid() != pid:
    sys.stderr.write(
        f"startup_watchdog: `--pid` must be the watcher's parent (the process "
        f"to stop). Received: --pid={pid}, but the parent is "
        f"{os.getppid()}\n")
    return _EXIT_USAGE
  pidfd = _open_pidfd(pid)
  # Checked after opening: the pidfd is then the parent's, not a recycled
  # pid's.
  if os.getppid() != pid:
    log(f"parent {pid} is gone")
    return _EXIT_DONE
  log(f"waiting up to {timeout:g} s for the start-up of pid {pid} to end")
  deadline = time.monotonic() + timeout
  while (remaining := deadline - time.monotonic()) > 0:
    if _readable(stdin, min(remaining, _PARENT_POLL)):
      log("start-up ended")
      return _EXIT_DONE
    if os.getppid() != pid:
      log(f"parent {pid} is gone")
      return _EXIT_DONE
  log(f"start-up did not end within {timeout:g} s; probing "
      f"{len(addresses)} address(es)")
  missing = _probe(addresses)
  if probe_delay:
    log(f"sleeping {probe_delay:g} s (--probe_delay)")
    time.sleep(probe_delay)
  # The last checks: the start-up may have ended while we probed, and the
  # parent may be gone (its pid possibly taken by another process).
  if _readable(stdin, 0):
    log(f"start-up ended while probing; not stopping pid {pid}")
    return _EXIT_DONE
  if os.getppid() != pid:
    log(f"parent {pid} is gone; not stopping it")
    return _EXIT_DONE
  try:
    sys.stderr.write(_message(description, pid, timeout, missing,
                              os.environ.get("TF_CONFIG")))
    sys.stderr.flush()
  except OSError:  # No stderr left: stop the worker all the same.
    pass
  try:
    if pidfd is not None:
      signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    else:
      os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    return _EXIT_DONE
  return _EXIT_KILLED


def _positive_seconds(text):
  try:
    return _check_timeout(float(text), "--timeout")
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e)) from None


def _non_negative_seconds(text):
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not 0 <= value < math.inf:
    raise argparse.ArgumentTypeError(
        f"must be a non-negative number of seconds. Received: {text!r}")
  return value


def _address_list(text):
  try:
    return _check_addresses(json.loads(text))
  except ValueError as e:
    raise argparse.ArgumentTypeError(
        f"must be a JSON list of [task name, 'host:port'] pairs ({e})"
    ) from None


def _parser():
  parser = argparse.ArgumentParser(
      prog="startup_watchdog",
      description=(
          "Watcher of a start-up (see ndq_tf.cluster.startup_watchdog): "
          "exits 0 when its stdin becomes readable (data or end of file) or "
          "its parent is gone; past --timeout seconds, prints which "
          "--addresses are unreachable and kills --pid (SIGKILL), exit 1. "
          "Exit 2: bad arguments, or --pid is not the parent."))
  parser.add_argument("--pid", type=int, required=True,
                      help="process to stop: the watcher's parent")
  parser.add_argument("--timeout", type=_positive_seconds, required=True,
                      help="seconds to wait for stdin to become readable")
  parser.add_argument("--addresses", type=_address_list, default=[],
                      help="JSON list of [task name, 'host:port'] to probe")
  parser.add_argument("--description", default="",
                      help="who waits, named at the start of the message "
                      "(default: ndq_tf)")
  parser.add_argument("--probe_delay", type=_non_negative_seconds,
                      default=0.0,
                      help="for tests only: seconds to sleep after probing, "
                      "before the last checks (default: 0)")
  parser.add_argument("--verbose", action="store_true",
                      help="log each phase to stderr")
  return parser


def main(argv=None):
  """Runs the watcher.

  Args:
    argv: the arguments without the program name (default
      `sys.argv[1:]`), as built by `watcher_command`.

  Returns:
    The exit code: 0 when the start-up ended or the parent is gone, 1 after
    killing the parent, 2 when `--pid` is not the parent.

  Raises:
    SystemExit: with code 2 on malformed arguments (argparse).
  """
  args = _parser().parse_args(argv)
  # Ctrl-C in a terminal reaches the whole process group: the parent decides
  # (and if it dies, its pipe closes and the watcher exits).
  signal.signal(signal.SIGINT, signal.SIG_IGN)

  def log(text):
    if args.verbose:
      sys.stderr.write(f"startup_watchdog (pid {os.getpid()}): {text}\n")
      sys.stderr.flush()

  return _watch(args.pid, args.addresses, args.timeout, args.description,
                args.probe_delay, log)


if __name__ == "__main__":
  sys.exit(main())
