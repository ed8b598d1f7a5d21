"""Starts a local multi-worker job: one process per worker, each with `TF_CONFIG`.

Usage:

```sh
python -m ndq_tf.launch --num_workers 2 --timeout 600 -- \
    python examples/multi_worker.py --epochs 2
```

Every worker gets a `TF_CONFIG` naming all workers on free ports of
`127.0.0.1` (`--host`), and its own `task.index`. Output lines are prefixed with
`[worker i]`. Ctrl-C (SIGINT) and SIGTERM are forwarded to every worker. When a
worker fails, the others are stopped and the launcher exits with the failing
worker's exit code; past `--timeout` seconds, all are stopped and the launcher
exits with 124.

Workers can also listen on addresses of their own and run behind a command
prefix, e.g. one network namespace per worker (as
benchmarks/multi_worker_link.py does):

```sh
python -m ndq_tf.launch --hosts 10.77.0.1,10.77.0.2 --port 23456 \
    --worker_prefix "ip netns exec ndqw{index}" -- python train.py
```

`--hosts` gives one address per worker; `--port P` puts worker i on port
`P + i` (needed when the addresses are not this machine's, e.g. inside
namespaces; without it, free ports are found by binding each address).
`--worker_prefix` is split like a shell command line and goes before the
command, each word formatted with the worker's `{index}`.

All workers are processes of this machine: this is a tool for development,
tests and benchmarks. For several hosts, start the same program once per host
with a `TF_CONFIG` naming every host (or pass any
`tf.distribute.cluster_resolver.ClusterResolver` to the strategy). TF's gRPC
transport is unauthenticated and unencrypted: run it on a trusted network
only.
"""

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = [
    "find_free_ports",
    "make_tf_config",
    "launch",
    "main",
]

# Exit code when the job ran out of time (as coreutils' `timeout`).
TIMEOUT_EXIT_CODE = 124
# Seconds a worker gets between SIGTERM and SIGKILL when the job is stopped.
_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.05


def find_free_ports(num_ports, host="127.0.0.1"):
  """Returns `num_ports` distinct TCP ports that are free on `host` right now.

  All sockets stay bound until every port is chosen, so the ports differ. A
  port can still be taken by another process before a worker binds it; TF then
  fails with an "address in use" error rather than hanging.

  Args:
    num_ports: positive int.
    host: address to bind, e.g. `"127.0.0.1"`.

  Returns:
    A list of `num_ports` ints.

  Raises:
    ValueError: if `num_ports` is not a positive int.

  Example:

  >>> len(find_free_ports(2))
  2
  """
  if not isinstance(num_ports, int) or num_ports < 1:
    raise ValueError(
        f"`num_ports` must be a positive int. Received: num_ports={num_ports!r}")
  return _free_ports([host] * num_ports)


def _free_ports(hosts):
  """One free port per address of `hosts`; distinct for repeated addresses."""
  sockets = []
  try:
    for host in hosts:
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sockets.append(s)
      s.bind((host, 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def make_tf_config(addresses, index, task_type="worker"):
  """Returns the `TF_CONFIG` JSON string of one worker of a cluster.

  Args:
    addresses: list of `"host:port"` strings, one per worker, in task order.
    index: this worker's task index, `0 <= index < len(addresses)`.
    task_type: the job name, `"worker"` by default.

  Returns:
    A JSON string, e.g. `{"cluster": {"worker": [...]}, "task": {"type":
    "worker", "index": 0}}`.

  Raises:
    ValueError: if `index` is out of range or `addresses` is empty.

  Example:

  >>> make_tf_config(["127.0.0.1:1234", "127.0.0.1:1235"], 1)
  '{"cluster": {"worker": ["127.0.0.1:1234", "127.0.0.1:1235"]}, "task": {"type": "worker", "index": 1}}'
  """
  addresses = list(addresses)
  if not addresses:
    raise ValueError("`addresses` must name at least one worker. Received: []")
  if not isinstance(index, int) or not 0 <= index < len(addresses):
    raise ValueError(
        f"`index` must be an int in [0, {len(addresses)}). "
        f"Received: index={index!r}")
  return json.dumps({
      "cluster": {task_type: addresses},
      "task": {"type": task_type, "index": index},
  })


def _exit_code(returncode):
  """Maps a Popen returncode to a shell-style exit code (signal N -> 128+N)."""
  if returncode is None:
    return 1
  if returncode < 0:
    return 128 - returncode
  return returncode


def _format_prefix(worker_prefix, index):
  """The words of `worker_prefix` with `{index}` replaced by `index`."""
  try:
    return [word.format(index=index) for word in worker_prefix]
  except (KeyError, IndexError, ValueError) as e:
    raise ValueError(
        "`worker_prefix` may use no format field but `{index}` (double "
        "any other brace). Received: worker_prefix="
        f"{worker_prefix!r} ({type(e).__name__}: {e})") from e


def _addresses(num_workers, host, hosts, port):
  """The validated `"host:port"` of every worker."""
  if hosts is None:
    hosts = [host] * num_workers
  hosts = list(hosts)
  if len(hosts) != num_workers or not all(
      isinstance(h, str) and h for h in hosts):
    raise ValueError(
        f"`hosts` must give one non-empty address per worker "
        f"(num_workers={num_workers}). Received: hosts={hosts!r}")
  if port is None:
    try:
      ports = _free_ports(hosts)
    except OSError as e:
      raise ValueError(
          "Free ports can only be found on this machine's addresses; pass "
          f"`port` for the others. Received: hosts={hosts!r} ({e})") from e
  else:
    if (isinstance(port, bool) or not isinstance(port, int) or
        not 1 <= port <= 65536 - num_workers):
      raise ValueError(
          f"`port` must be an int in [1, {65536 - num_workers}] (worker i "
          f"listens on port + i). Received: port={port!r}")
    ports = [port + i for i in range(num_workers)]
  return [f"{h}:{p}" for h, p in zip(hosts, ports)]


class _Job:
  """The running worker processes of one launch, and how to stop them."""

  def __init__(self, commands, addresses, env, out):
    self._out = out
    self._out_lock = threading.Lock()
    self.addresses = addresses
    self.procs = []
    self._readers = []
    for i, command in enumerate(commands):
      worker_env = dict(os.environ if env is None else env)
      worker_env["TF_CONFIG"] = make_tf_config(self.addresses, i)
      worker_env["PYTHONUNBUFFERED"] = "1"
      # Each worker leads its own process group, so a stop reaches the
      # processes it starts too, and the terminal's Ctrl-C reaches us only.
      proc = subprocess.Popen(
          command, env=worker_env, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
          start_new_session=True)
      self.procs.append(proc)
      reader = threading.Thread(
          target=self._pump, args=(i, proc.stdout), daemon=True)
      reader.start()
      self._readers.append(reader)

  def _pump(self, index, stream):
    prefix = f"[worker {index}] "
    for raw in iter(stream.readline, b""):
      line = raw.decode("utf-8", errors="replace").rstrip("\n")
      self.say(prefix + line)
    stream.close()

  def say(self, line):
    with self._out_lock:
      self._out.write(line + "\n")
      self._out.flush()

  def signal_all(self, signum):
    for proc in self.procs:
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signum)
        except ProcessLookupError:
          pass

  def stop_all(self, first_signal=signal.SIGTERM, grace=_GRACE_SECONDS):
    """Sends `first_signal` to every running worker, SIGKILL after `grace`."""
    self.signal_all(first_signal)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
      if all(p.poll() is not None for p in self.procs):
        break
      time.sleep(_POLL_SECONDS)
    self.signal_all(signal.SIGKILL)
    for proc in self.procs:
      proc.wait()
    for reader in self._readers:
      reader.join(timeout=2.0)


def launch(command, num_workers, timeout=None, host="127.0.0.1", env=None,
           out=None, grace=_GRACE_SECONDS, hosts=None, port=None,
           worker_prefix=None):
  """Runs `command` as `num_workers` local workers and waits for them.

  Args:
    command: list of strings, the program every worker runs.
    num_workers: positive int.
    timeout: seconds before every worker is stopped, or `None` for no limit.
    host: address every worker listens on, unless `hosts` is given.
    env: base environment of the workers (default: this process's).
    out: text stream for the prefixed output (default: `sys.stdout`).
    grace: seconds between SIGTERM and SIGKILL when stopping workers.
    hosts: list of `num_workers` addresses, worker i listening on `hosts[i]`
      (repeats allowed), or `None` for `host` everywhere.
    port: worker i listens on port `port + i`; `None`: free ports, found by
      binding each worker's address, so the addresses must be this
      machine's.
    worker_prefix: list of strings run before `command` (e.g.
      `["ip", "netns", "exec", "ndqw{index}"]`), each formatted with the
      worker's `index`; `None` for none.

  Returns:
    0 when every worker succeeded; the first failing worker's exit code
    (128 + N when killed by signal N); 124 on timeout; 130 / 143 when the
    launcher got SIGINT / SIGTERM.

  Raises:
    ValueError: on an empty `command`, a non-positive `num_workers` or
      `timeout`, `hosts` not giving one address per worker, a `port` out of
      range, free ports asked for on an address that is not this machine's,
      or a `worker_prefix` with fields other than `{index}`.

  Example:

  >>> launch([sys.executable, "-c", "print('hi')"], num_workers=2)
  0
  >>> launch(["printenv", "WORKER"], num_workers=2,
  ...        worker_prefix=["env", "WORKER={index}"])
  0
  """
  if not command:
    raise ValueError("`command` must name a program to run. Received: []")
  if not isinstance(num_workers, int) or num_workers < 1:
    raise ValueError(
        "`num_workers` must be a positive int. "
        f"Received: num_workers={num_workers!r}")
  if timeout is not None and not timeout > 0:
    raise ValueError(
        f"`timeout` must be positive or None. Received: timeout={timeout!r}")
  command = list(command)
  prefix = list(worker_prefix or [])
  commands = [_format_prefix(prefix, i) + command for i in range(num_workers)]
  addresses = _addresses(num_workers, host, hosts, port)
  out = sys.stdout if out is None else out

  received = []

  def on_signal(signum, frame):
    del frame
    received.append(signum)

  # Handlers can only be installed from the main thread; elsewhere (e.g. a
  # test harness thread) the caller owns signal handling.
  in_main_thread = threading.current_thread() is threading.main_thread()
  previous = {}
  if in_main_thread:
    for signum in (signal.SIGINT, signal.SIGTERM):
      previous[signum] = signal.signal(signum, on_signal)
  job = None
  try:
    job = _Job(commands, addresses, env, out)
    job.say(f"[launch] {num_workers} workers on {', '.join(job.addresses)}: "
            f"{' '.join(prefix + command)}")
    start = time.monotonic()
    while True:
      if received:
        signum = received[0]
        job.say(f"[launch] got {signal.Signals(signum).name}; "
                "forwarding to all workers")
        job.stop_all(signal.SIGINT if signum == signal.SIGINT
                     else signal.SIGTERM, grace)
        return 128 + signum
      codes = [p.poll() for p in job.procs]
      failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if failed:
        index, code = failed[0]
        job.say(f"[launch] worker {index} failed with exit code "
                f"{_exit_code(code)}; stopping the others")
        job.stop_all(signal.SIGTERM, grace)
        return _exit_code(code)
      if all(c == 0 for c in codes):
        job.stop_all(signal.SIGTERM, 0.0)  # Joins the output readers.
        return 0
      if timeout is not None and time.monotonic() - start > timeout:
        job.say(f"[launch] timeout after {timeout:g} s; stopping all workers")
        job.stop_all(signal.SIGTERM, grace)
        return TIMEOUT_EXIT_CODE
      time.sleep(_POLL_SECONDS)
  finally:
    if job is not None and any(p.poll() is None for p in job.procs):
      job.stop_all(signal.SIGKILL, 0.0)
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def _parse_args(argv):
  """Splits `argv` at `--` into launcher options and the worker command."""
  parser = argparse.ArgumentParser(
      prog="python -m ndq_tf.launch",
      description=(
          "Runs a command as N local TensorFlow workers, each with its own "
          "TF_CONFIG (free ports on --host, or the addresses of --hosts). "
          "Output lines are prefixed with the worker index; SIGINT/SIGTERM "
          "are forwarded; when one worker fails all are stopped and the exit "
          "code is non-zero."),
      epilog="Examples: python -m ndq_tf.launch --num_workers 2 -- "
             "python examples/multi_worker.py; python -m ndq_tf.launch "
             "--hosts 10.77.0.1,10.77.0.2 --port 23456 --worker_prefix "
             "'ip netns exec ndqw{index}' -- python train.py")
  parser.add_argument(
      "--num_workers", type=int, default=None,
      help="Number of worker processes to start (default: one per --hosts "
           "address, else 2).")
  parser.add_argument(
      "--timeout", type=float, default=None,
      help="Stop all workers and exit 124 after this many seconds "
           "(default: no limit).")
  addresses = parser.add_mutually_exclusive_group()
  addresses.add_argument(
      "--host", default="127.0.0.1",
      help="Address the workers listen on (default: 127.0.0.1).")
  addresses.add_argument(
      "--hosts", type=_comma_list, default=None,
      help="Comma-separated addresses, one per worker (worker i listens on "
           "the i-th), e.g. 10.77.0.1,10.77.0.2.")
  parser.add_argument(
      "--port", type=int, default=None,
      help="Worker i listens on port PORT + i (default: free ports, found "
           "by binding the addresses, which must then be this machine's).")
  parser.add_argument(
      "--worker_prefix", type=shlex.split, default=None,
      help="Command run before the worker command, split like a shell "
           "line, each word formatted with the worker's {index}, e.g. "
           "'ip netns exec ndqw{index}'.")
  parser.add_argument(
      "--grace", type=float, default=_GRACE_SECONDS,
      help="Seconds between SIGTERM and SIGKILL when stopping workers "
           f"(default: {_GRACE_SECONDS:g}).")
  if "--" in argv:
    split = argv.index("--")
    own, command = argv[:split], argv[split + 1:]
  else:
    own, command = argv, []
  args = parser.parse_args(own)
  if not command:
    parser.error("give the worker command after `--`, e.g. "
                 "`-- python examples/multi_worker.py`")
  if args.num_workers is None:
    args.num_workers = 2 if args.hosts is None else len(args.hosts)
  if args.num_workers < 1:
    parser.error(f"--num_workers must be >= 1. Received: {args.num_workers}")
  if args.hosts is not None and len(args.hosts) != args.num_workers:
    parser.error(f"--hosts must give one address per worker "
                 f"(--num_workers={args.num_workers}). Received: "
                 f"{','.join(args.hosts)}")
  if args.timeout is not None and args.timeout <= 0:
    parser.error(f"--timeout must be > 0. Received: {args.timeout:g}")
  return args, command


def _comma_list(text):
  """`"a,b"` -> `["a", "b"]`; empty items are an error."""
  items = text.split(",")
  if not all(item.strip() for item in items):
    raise argparse.ArgumentTypeError(
        f"expected comma-separated addresses. Received: {text!r}")
  return [item.strip() for item in items]


def main(argv=None):
  """Command-line entry point; returns the exit code."""
  args, command = _parse_args(sys.argv[1:] if argv is None else list(argv))
  try:
    return launch(command, args.num_workers, timeout=args.timeout,
                  host=args.host, grace=args.grace, hosts=args.hosts,
                  port=args.port, worker_prefix=args.worker_prefix)
  except ValueError as e:
    print(f"python -m ndq_tf.launch: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
