"""Every ndq_tf snippet of docs/migrating_from_horovod.md runs (#19).

The snippets are read from the markdown itself: each ```python block right
after a `<!-- ndq_tf snippet -->` comment runs, in order, in one namespace
(the doc reads top to bottom like a notebook), on the 4 logical CPUs of
tests/conftest.py. The block after `<!-- ndq_tf script: train.py -->` is
written to a file and run as the doc says, a real 2-worker job through
`ndq_tf/launch.py`. The Horovod blocks (no comment) are not run.
"""

import os
import re
import subprocess
import sys

import multi_worker_job

DOC = os.path.join(multi_worker_job.ROOT, "docs", "migrating_from_horovod.md")
_BLOCK = re.compile(
    r"<!-- ndq_tf (snippet|script: (\S+)) -->\n```python\n(.*?)```", re.S)


def _blocks():
  with open(DOC) as f:
    text = f.read()
  return [(m.group(2), m.group(3)) for m in _BLOCK.finditer(text)]


def test_the_doc_has_a_snippet_for_every_horovod_name():
  with open(DOC) as f:
    text = f.read()
  for name in ("hvd.DistributedOptimizer", "hvd.Compression.fp16",
               "hvd.DistributedGradientTape", "hvd.broadcast_variables",
               "hvd.callbacks.MetricAverageCallback", "horovodrun -np 2"):
    assert name in text, name
  snippets = [code for script, code in _blocks() if script is None]
  scripts = [script for script, _ in _blocks() if script]
  assert len(snippets) >= 6 and scripts == ["train.py"], (len(snippets),
                                                          scripts)


def test_snippets_run_in_order():
  namespace = {"__name__": "migrating_from_horovod"}
  for i, (script, code) in enumerate(_blocks()):
    if script is None:
      exec(compile(code, f"{DOC}:snippet{i}", "exec"), namespace)  # pylint: disable=exec-used


def test_train_py_runs_as_a_two_worker_job(tmp_path):
  (code,) = [code for script, code in _blocks() if script == "train.py"]
  train = tmp_path / "train.py"
  train.write_text(code)
  cmd = [sys.executable, multi_worker_job.LAUNCH, "--num_workers", "2",
         "--timeout", "300", "--", sys.executable, str(train)]
  out = subprocess.run(cmd, env=multi_worker_job.env(), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=360,
                       check=False)
  log = out.stdout + out.stderr
  assert out.returncode == 0, log[-8000:]
  counts = re.findall(r"\[worker (\d)\] compressed elements (\d+)", log)
  assert sorted(w for w, _ in counts) == ["0", "1"], log[-8000:]
  assert all(int(n) == 64 * 256 + 256 + 256 * 10 for _, n in counts), counts
