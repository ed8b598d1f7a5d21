"""A multi-worker job that a test file starts once, in the background.

`MultiWorkerJob(script, args, out_dir, marker)` runs `script` on every worker
of a local job started by `ndq_tf/launch.py` (run by path, as a script, so
the test needs no installed package), bounded by the launcher's `--timeout`
and, behind it, the subprocess timeout. The job's output goes to a file
(`<out_dir>/job.log`), not a pipe: nobody reads while the test file does
other work, and a full pipe would stall the workers. Each worker prints one
line `<marker> {"worker": i, "results": ...}`; `results()` waits for the
job and returns every worker's `results` in worker order, or fails the
calling test with the exit code and the tail of the log.

Start jobs from a module-scoped fixture and `stop()` them at its end: the
launcher forwards SIGTERM to its workers.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

__all__ = [
    "LAUNCH",
    "ROOT",
    "MultiWorkerJob",
    "env",
    "load_script",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "ndq_tf", "launch.py")
_MARGIN = 30  # Seconds the subprocess timeout adds to the launcher's.


def load_script(path, name):
  """A worker script loaded as a module (for its constants and functions)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def env():
  """The workers' environment: this repository first, no inherited TF_CONFIG."""
  out = dict(os.environ)
  out["PYTHONPATH"] = ROOT + os.pathsep + out.get("PYTHONPATH", "")
  out["TF_CPP_MIN_LOG_LEVEL"] = "2"
  out.pop("TF_CONFIG", None)
  return out


class MultiWorkerJob:
  """One local multi-worker job, started at construction.

  Args:
    script: path of the Python script every worker runs.
    args: list of its command-line arguments.
    out_dir: an existing directory for the job's log.
    marker: the word that starts every worker's result line.
    num_workers: number of worker processes.
    timeout: seconds before the launcher stops every worker (exit 124).
    name: the job's name in failure messages.
  """

  def __init__(self, script, args, out_dir, marker, num_workers=2,
               timeout=300, name=None):
    self._marker = marker
    self._num_workers = num_workers
    self._timeout = timeout
    self._name = name or os.path.basename(script)
    cmd = [sys.executable, LAUNCH, "--num_workers", str(num_workers),
           "--timeout", str(timeout), "--grace", "2", "--", sys.executable,
           script] + list(args)
    self._log_path = os.path.join(str(out_dir), "job.log")
    with open(self._log_path, "w") as log:
      self._proc = subprocess.Popen(cmd, env=env(), cwd=ROOT, text=True,
                                    stdout=log, stderr=subprocess.STDOUT)
    self._results = None
    self._error = None

  @property
  def log_path(self):
    return self._log_path

  def results(self):
    """Every worker's results, in worker order (waits for the job)."""
    if self._results is None and self._error is None:
      note = ""
      try:
        self._proc.wait(timeout=self._timeout + _MARGIN)
      except subprocess.TimeoutExpired:
        self.stop()
        note = f"(killed after {self._timeout + _MARGIN} s)\n"
      with open(self._log_path) as log:
        output = log.read()
      prefix = f"] {self._marker} {{"
      reports = [json.loads(line.split(f"{self._marker} ", 1)[1])
                 for line in output.splitlines() if prefix in line]
      workers = sorted(r["worker"] for r in reports)
      if (self._proc.returncode != 0 or
          workers != list(range(self._num_workers))):
        self._error = (f"{note}exit code {self._proc.returncode}, workers "
                       f"{workers}:\n{output[-20000:]}")
      else:
        self._results = [r["results"] for r in
                         sorted(reports, key=lambda r: r["worker"])]
    if self._error is not None:
      pytest.fail(f"The multi-worker job {self._name} failed: {self._error}")
    return self._results

  def stop(self):
    """Stops the job if it still runs (the launcher stops its workers)."""
    if self._proc.poll() is None:
      self._proc.terminate()
      try:
        self._proc.wait(timeout=_MARGIN)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait(timeout=_MARGIN)
