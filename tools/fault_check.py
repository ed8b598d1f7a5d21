"""Fault check: does the test suite catch the faults that would hurt a user?

A passing suite proves little by itself: a test that asserts too loosely, or
that compares the code with itself (a reference built from the same
function), passes whatever the code does. This tool plants deliberate,
realistic faults, one at a time, in a copy of the source tree (a dropped
sender in the sum, a decode that keeps the dither, lanes one bit too narrow,
the step counter left out of checkpoints...) and runs the tests that should
notice. A fault is CAUGHT when they fail, MISSED when they pass; a missed
fault is a hole in the suite (or a fault that does no harm: then it does not
belong in `FAULTS`).

Each fault in `FAULTS` names the function or method it breaks by its
qualified name (`"DitheredCodec._dequantize"`), looked up with `ast`, and an
exact snippet inside it with its replacement, so that the list survives code
moving within a file; `--dry_run` says when it no longer applies. Its
`tests` are pytest arguments: test files (relative to the tree), optionally
`path::test` node ids or a `-k` expression (one `-k` per fault: pytest
applies it to every file of the run). They are the quick test files that
assert the behaviour where one exists (tests/BUILD tags the slow ones
"heavy").

For every fault: the tree is copied to a temporary directory (what `git
ls-files --cached --others --exclude-standard` lists in a git checkout, so
new test files count before they are committed; otherwise the whole tree
without .git, .venv*, bazel-* and __pycache__), the fault is applied to the
copy, and

  python -m pytest -x -q -p no:cacheprovider -p no:randomly -p no:xdist \
      <tests>

runs in the copy with PYTHONPATH set to it (so the copy's ndq_tf is
imported, not an editable install's) and TF_CPP_MIN_LOG_LEVEL=2. Exit 1
(tests failed) is CAUGHT, exit 0 MISSED; any other exit (2 interrupted or a
collection error, 4 a usage error, 5 no tests collected) or a timeout is an
ERROR. A fault whose test files the tree does not have is reported as "no
such tests". The exit status is 0 only if every fault was caught.

Usage:

  python tools/fault_check.py                     # every fault
  python tools/fault_check.py --only lanes_one_bit_narrow sum_drops_last_sender
  python tools/fault_check.py --list              # the faults and their tests
  python tools/fault_check.py --dry_run           # do they still apply?
  python tools/fault_check.py --tree ../old_checkout --python .venv/bin/python
  python tools/fault_check.py --baseline          # also run the tests unfaulted

`--dry_run` applies every fault to a copy and compiles the faulted module,
without running a test (nor importing TensorFlow); it exits non-zero if a
fault does not apply (its symbol is gone, or its snippet is not there
exactly once), and notes test files that are missing and `-k` words found
in none of them (tests renamed or moved: the real run would report "no such
tests", or an ERROR for a `-k` that selects nothing). `--baseline` first
runs each fault's tests on the unfaulted copy: a fault whose tests fail
without it is an ERROR, not CAUGHT (a flaky or broken test, or golden
hashes recorded on another CPU, would otherwise "catch" the fault).
`--log_dir DIR` keeps every pytest output, `--keep` the copies.

Faults run one after the other: the suite's own tests split one CPU into 4
logical devices and start worker processes, so running faults in parallel
would only slow them down. A run of all of them takes tens of minutes;
`--timeout` bounds each.
"""

import argparse
import ast
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import List, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Fault(NamedTuple):
  """One deliberate fault and the tests that must catch it.

  Attributes:
    name: short id, for `--only` and the report.
    what: what a user would suffer, in one sentence.
    file: the module, relative to the tree.
    symbol: the qualified name of the function or method it breaks
      (`"Class.method"`, `"function"`).
    old: an exact snippet of the symbol's source lines, there exactly once.
    new: what replaces it.
    tests: pytest arguments: test files relative to the tree, node ids
      (`path::test`), or `-k` and its expression as two items.
  """
  name: str
  what: str
  file: str
  symbol: str
  old: str
  new: str
  tests: List[str]


FAULTS = [
    # -- ops ------------------------------------------------------------------
    Fault(
        name="lanes_one_bit_narrow",
        what="Integer lanes are one bit too narrow when the largest sum is a "
             "power of two (ternary codes of 2, 4 or 8 workers): the integer "
             "all-reduce carries into the next lane and silently corrupts "
             "the summed gradient.",
        file="ndq_tf/ops/lane_ops.py",
        symbol="lane_layout",
        old="bits = max_sum.bit_length()",
        new="bits = (max_sum - 1).bit_length()",
        tests=["tests/ops/test_lane_ops.py"]),
    Fault(
        name="unpack_without_half_offset",
        what="Unpacking divides the word without its half offset, so words "
             "at a digit boundary (exact multiples of L**j) unpack one code "
             "off: some received codes decode to the wrong level.",
        file="ndq_tf/ops/packing_ops.py",
        symbol="unpack_planar_codes",
        old="value = value + 0.5",
        new="# value = value + 0.5  (fault: the half offset removed)",
        tests=["tests/ops/test_packing_ops.py"]),
    Fault(
        name="sum_decode_one_dither",
        what="The all-reduce's decode of the summed codes subtracts the first "
             "sender's dither only: the sum keeps every other sender's dither "
             "as a bias, and the error no longer shrinks as promised.",
        file="ndq_tf/ops/sum_decode_ops.py",
        symbol="dithered_sum_dequantize",
        old="dither_sum(seeds, n)",
        new="dither_sum(seeds[:1], n)",
        tests=["tests/ops/test_sum_decode_ops.py"]),
    # -- codecs ---------------------------------------------------------------
    Fault(
        name="dqsg_decode_keeps_dither",
        what="DitheredCodec decodes Δq without subtracting the dither (the "
             "half-dithered reconstruction): errors up to a whole step, "
             "correlated with the signal, instead of DQSG's uniform half "
             "step.",
        file="ndq_tf/codecs/dithered.py",
        symbol="DitheredCodec._dequantize",
        old="quantization_ops.dithered_dequantize(q, u, 1.0)",
        new="quantization_ops.half_dithered_dequantize(q, 1.0, q.dtype)",
        tests=["tests/codecs/test_base.py"]),
    Fault(
        name="nan_bucket_decodes_finite",
        what="A bucket holding a NaN or an Inf gets the scale 0 instead of "
             "NaN and decodes to finite zeros: an overflow is hidden from "
             "loss scaling, and training goes on with a silently zeroed "
             "gradient.",
        file="ndq_tf/codecs/base.py",
        symbol="bucket_scales",
        old="return tf.where(finite, kappa, nan)",
        new="return kappa",
        tests=["tests/codecs/test_base.py"]),
    Fault(
        name="rotation_signs_not_regenerated",
        what="A rotated codec's receiver inverts the Hadamard transform "
             "without regenerating the sender's random signs: every rotated "
             "bucket decodes to garbage.",
        file="ndq_tf/codecs/bucketed.py",
        symbol="BucketedCodec._unrotate",
        old=("self._signs(seed, yb.shape[0],\n"
             "                                                 yb.dtype)"),
        new="tf.ones_like(yb)",
        # test_bucketed is not tagged heavy but is long; these two decode
        # through the codec and compare with the input.
        tests=["tests/codecs/test_bucketed.py",
               "-k", "spreads_an_outlier or rotated_dqsg_is_unbiased"]),
    Fault(
        name="qsgd_decode_ignores_levels",
        what="QSGD decodes κ·q instead of κ·q/s: with s > 1 levels every "
             "gradient arrives s times too large (TernGrad, s = 1, is "
             "unaffected).",
        file="ndq_tf/codecs/baselines.py",
        symbol="_StochasticRoundingCodec._dequantize",
        old="return q * (scales / self._levels)[:, None]",
        new="return q * scales[:, None]",
        tests=["tests/codecs/test_base.py"]),
    # -- the exchange core ----------------------------------------------------
    Fault(
        name="sum_drops_last_sender",
        what="The deterministic sum of the decoded buffers stops one sender "
             "short: every replica trains on a sum without the last "
             "worker's gradient.",
        file="ndq_tf/core/fusion_sum.py",
        symbol="_fold",
        old="for tensor in tensors[1:]:",
        new="for tensor in tensors[1:-1]:",
        tests=["tests/core/test_fusion_sum.py", "tests/core/test_fusion_codec.py"]),
    Fault(
        name="seed_fold_step_plus_sender",
        what="The payload seed folds `step + sender` instead of the step then "
             "the sender: sender s at step t reuses sender 0's dither of "
             "step t + s, so dithers repeat across steps and senders.",
        file="ndq_tf/core/fusion_codec.py",
        symbol="derive_seed",
        old="ndq_ops.fold_seed(ndq_ops.fold_seed(base_seed, step), sender)",
        new="ndq_ops.fold_seed(base_seed, step + sender)",
        tests=["tests/core/test_engine.py", "tests/core/test_fusion_codec.py"]),
    Fault(
        name="nested_side_info_off_by_one",
        what="A nested sender's side information divides the sum of the "
             "buffers decoded before it by one sender too many: a shrunk "
             "estimate, more overloads, silently wrong nested gradients.",
        file="ndq_tf/core/fusion_codec.py",
        symbol="decode_senders",
        old="fusion_sum.sum_stacked(decoded) / len(decoded)",
        new="fusion_sum.sum_stacked(decoded) / (sender + 1)",
        # The nested exchange's other tests rebuild their ground truth with
        # decode_senders itself; test_fusion's side-information test (added
        # for this fault, issue #31) computes the mean independently.
        tests=["tests/core/test_fusion_codec.py"]),
    Fault(
        name="agreement_check_skipped",
        what="The workers' options check compares worker 0's config with "
             "itself, so workers built with different seeds or codecs decode "
             "each other's payloads as garbage without an error.",
        file="ndq_tf/core/fingerprint.py",
        symbol="check_agreement",
        old="_decode_words(rows[i], int(heads[i, 1]))",
        new="_decode_words(rows[0], int(heads[0, 1]))",
        # test_agreement is heavy for its two-process jobs; this in-process
        # test drives check_agreement with a fake all-gather and expects the
        # mismatch error.
        tests=["tests/integration/test_agreement.py",
               "-k", "waits_for_its_peers"]),
    Fault(
        name="tf_keras_gradients_unrecognised",
        what="Gradient aggregation is recognised by Keras 3's name scope "
             "only, not by trainable-variable destinations: tf_keras (and "
             "TF's low-level loop) gradients travel uncompressed.",
        file="ndq_tf/distribute/gradient_detection.py",
        symbol="ReductionLabels.is_gradient",
        old="gradient = noted or destinations_are_trainable_variables(pairs)",
        new="gradient = noted",
        # Only test_gradient_routes (heavy) trains through tf_keras; one
        # transport is enough.
        tests=["tests/integration/test_gradient_routes.py",
               "-k", "tf_keras_fit_compresses_with_the_same_bits and "
                     "all_gather"]),
    Fault(
        name="step_not_checkpointed",
        what="The strategy tracks its telemetry instead of its exchange "
             "engine, so tf.train.Checkpoint(model=...) loses the dither's "
             "step counter: a resumed job redraws the dithers of steps "
             "already taken.",
        file="ndq_tf/distribute/strategy_state.py",
        symbol="StrategyState._track_engine",
        old='self._track_trackable(engine, name="compression")',
        new='self._track_trackable(engine.telemetry, name="compression")',
        tests=["tests/integration/test_mirrored.py",
               "-k", "step_counter_is_saved"]),
    Fault(
        name="shards_reuse_dither",
        what="Every reduce-scatter shard draws the dither of the buffer's "
             "first elements (offset 0) in both stages: the same dither is "
             "reused across shards, their errors are correlated, and stage "
             "1's codes are no longer the all-gather's.",
        file="ndq_tf/core/exchanges/reduce_scatter.py",
        symbol="shards",
        old="((0, start, length, start),)",
        new="((0, start, length, 0),)",
        # The variance test cannot see a reused dither (same variance); the
        # nested group's noise state must equal the all-gather's bit for bit.
        tests=["tests/core/exchanges/test_reduce_scatter.py",
               "-k", "nested_group_keeps"]),
    Fault(
        name="telemetry_lossless_bits",
        what="The telemetry counts every lossless element as 32 bits, "
             "whatever its dtype: float16 and float64 tensors get wrong "
             "sent_bits and compression ratios.",
        file="ndq_tf/core/telemetry.py",
        symbol="lossless_size",
        old="lossless_bits += n * v.dtype.size * 8",
        new="lossless_bits += n * 32",
        tests=["tests/core/test_telemetry.py"]),
    Fault(
        name="auto_checks_first_codec_only",
        what="transport='auto' looks only at the first sender's codec, the "
             "reference codec of a nested group, and may pick the "
             "reduce-scatter, which refuses the adaptive nested mode across "
             "processes at the first step.",
        file="ndq_tf/core/cost_model.py",
        symbol="auto",
        old="for c in base.sender_codecs(codec, num_workers))",
        new="for c in base.sender_codecs(codec, num_workers)[:1])",
        tests=["tests/distribute/test_options.py"]),
    # -- keras and cluster ----------------------------------------------------
    Fault(
        name="loss_scale_local_flag",
        what="ndq_tf's LossScaleOptimizer poisons only the replica whose own "
             "gradients overflowed instead of every replica: Keras checks "
             "replica 0 alone, applies the step, and a NaN reaches the "
             "weights.",
        file="ndq_tf/keras/loss_scale_optimizer.py",
        symbol="LossScaleOptimizer.apply",
        old="grads = [_poison(g, any_bad) for g in grads]",
        new="grads = [_poison(g, bad > 0) for g in grads]",
        # Only test_mirrored_training (heavy) trains with a NaN on one
        # replica; the one test needed.
        tests=["tests/integration/test_mirrored_training.py",
               "-k", "skips_a_step_with_a_nan"]),
    Fault(
        name="launcher_ports_off_by_one",
        what="With --port P the launcher puts worker i on P + i + 1: the "
             "workers listen on ports other than those opened for them, and "
             "the job never connects.",
        file="ndq_tf/cluster/launch.py",
        symbol="_addresses",
        old="ports = [port + i for i in range(num_workers)]",
        new="ports = [port + i for i in range(1, num_workers + 1)]",
        # The rest of test_launch waits for children that sleep.
        tests=["tests/cluster/test_launch.py", "-k", "port_puts_worker_i"]),
]

# The statuses of a fault.
CAUGHT = "CAUGHT"
MISSED = "MISSED"
ERROR = "ERROR"
NO_TESTS = "NO TESTS"
APPLIES = "APPLIES"

#: Names a copy of the tree leaves out.
_SKIPPED_NAMES = re.compile(r"^(\.git|\.venv.*|bazel-.*|__pycache__)$")
#: pytest options whose value is the next argument.
_OPTIONS_WITH_VALUES = ("-k", "-m")
#: Seconds a timed-out pytest gets between SIGTERM and SIGKILL.
_GRACE_SECONDS = 10
#: Lines of pytest's output shown for a fault that was not caught.
_TAIL_LINES = 15


class FaultError(Exception):
  """A fault that does not apply to a tree."""


class Result(NamedTuple):
  """What became of one fault."""
  fault: Fault
  status: str
  seconds: float
  detail: str = ""
  output: str = ""


# -- Applying a fault ----------------------------------------------------------


def _definitions(body):
  """The classes and functions defined by a list of statements.

  Looks inside `if`, `try` and `with` blocks too (not inside functions or
  classes: those are the next part of a qualified name).
  """
  for node in body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
      yield node
    elif isinstance(node, (ast.If, ast.Try, ast.With)):
      for block in ("body", "orelse", "finalbody"):
        yield from _definitions(getattr(node, block, []))
      for handler in getattr(node, "handlers", []):
        yield from _definitions(handler.body)


def symbol_lines(source, symbol, filename="<source>"):
  """The 1-based first and last line of `symbol` in `source`.

  Args:
    source: a module's text.
    symbol: a qualified name, `"function"` or `"Class.method"`.
    filename: for the error messages.

  Returns:
    `(first, last)`, decorators included.

  Raises:
    FaultError: if the source does not parse, or the symbol is missing or
      defined more than once.
  """
  try:
    tree = ast.parse(source, filename)
  except SyntaxError as e:
    raise FaultError(f"{filename} does not parse: {e}") from None
  body, node = tree.body, None
  for part in symbol.split("."):
    found = [n for n in _definitions(body) if n.name == part]
    if not found:
      raise FaultError(f"no {part!r} in {filename} (looking for {symbol!r})")
    if len(found) > 1:
      raise FaultError(f"{part!r} is defined {len(found)} times in "
                       f"{filename} (looking for {symbol!r})")
    node = found[0]
    body = node.body
  first = min([node.lineno] + [d.lineno for d in node.decorator_list])
  return first, node.end_lineno


def apply_fault(source, fault):
  """`source` with `fault` applied, compiled to check that it still parses.

  Raises:
    FaultError: if the fault does not apply, or the result does not compile
      or is the same text.
  """
  first, last = symbol_lines(source, fault.symbol, fault.file)
  lines = source.splitlines(keepends=True)
  before = "".join(lines[:first - 1])
  inside = "".join(lines[first - 1:last])
  after = "".join(lines[last:])
  count = inside.count(fault.old)
  if count != 1:
    raise FaultError(
        f"the snippet {fault.old!r} occurs {count} times in {fault.symbol} "
        f"(lines {first}-{last} of {fault.file}), not once")
  faulted = before + inside.replace(fault.old, fault.new, 1) + after
  if faulted == source:
    raise FaultError("the fault changes nothing")
  try:
    compile(faulted, fault.file, "exec", dont_inherit=True)
  except SyntaxError as e:
    raise FaultError(
        f"the faulted {fault.file} does not compile: {e}") from None
  return faulted


# -- The tree and its copy -----------------------------------------------------


def _skipped(relative_path):
  return any(_SKIPPED_NAMES.match(part)
             for part in relative_path.split("/"))


def _listed_files(tree):
  """The files git lists in `tree` (tracked and new), or None if not git."""
  if not os.path.exists(os.path.join(tree, ".git")):
    return None
  try:
    out = subprocess.run(
        ["git", "-C", tree, "ls-files", "-z", "--cached", "--others",
         "--exclude-standard"], capture_output=True, check=True)
  except (OSError, subprocess.CalledProcessError):
    return None
  names = sorted({n for n in out.stdout.decode().split("\0") if n})
  # --cached lists files deleted from the working tree too.
  return [n for n in names if not _skipped(n)
          and os.path.lexists(os.path.join(tree, n))]


def copy_tree(tree, destination):
  """Copies `tree` to the new directory `destination` (see the module doc)."""
  files = _listed_files(tree)
  if files is None:
    shutil.copytree(
        tree, destination, symlinks=True,
        ignore=lambda _, names: [n for n in names if _SKIPPED_NAMES.match(n)])
    return
  os.makedirs(destination)
  for name in files:
    source = os.path.join(tree, name)
    target = os.path.join(destination, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(source):
      os.symlink(os.readlink(source), target)
    elif os.path.isdir(source):  # A submodule: not needed by the tests.
      continue
    else:
      shutil.copy2(source, target)


def named_test_files(tests):
  """The test files a fault's pytest arguments name (node ids cut to files)."""
  files, skip = [], False
  for arg in tests:
    if skip:
      skip = False
    elif arg in _OPTIONS_WITH_VALUES:
      skip = True
    elif not arg.startswith("-"):
      files.append(arg.split("::", 1)[0])
  return files


def unmatched_keywords(tests, tree):
  """The words of the `-k` expression found in none of the named test files.

  A static hint for `--dry_run`, which collects no test: `-k` matches
  substrings of test, class and parameter names, so a word that is not even
  in the files' text selects nothing (a test renamed or moved). `and`,
  `or` and `not` are operators.
  """
  words = []
  for option, value in zip(tests, tests[1:]):
    if option == "-k":
      words += [w for w in re.findall(r"[A-Za-z0-9_]+", value)
                if w not in ("and", "or", "not")]
  texts = []
  for name in named_test_files(tests):
    try:
      with open(os.path.join(tree, name), encoding="utf-8") as f:
        texts.append(f.read())
    except OSError:
      pass
  return [w for w in words if not any(w in t for t in texts)]


def heavy_test_files(tree):
  """The test files tagged "heavy" in the tree's tests/BUILD (best effort)."""
  path = os.path.join(tree, "tests", "BUILD")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return set()
  heavy = set()
  for target in re.findall(r"^pytest_test\((.*?)^\)", text,
                           flags=re.M | re.S):
    tags = re.search(r"\btags\s*=\s*\[([^\]]*)\]", target)
    srcs = re.search(r"\bsrcs\s*=\s*\[([^\]]*)\]", target)
    if tags and srcs and re.search(r"[\"']heavy[\"']", tags.group(1)):
      heavy.update("tests/" + s for s in
                   re.findall(r"[\"']([^\"']+\.py)[\"']", srcs.group(1)))
  return heavy


# -- Running pytest ------------------------------------------------------------


def _environment(copy):
  env = dict(os.environ)
  env["PYTHONPATH"] = copy
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  env["PYTHONDONTWRITEBYTECODE"] = "1"
  env.pop("TF_CONFIG", None)
  return env


def _run(command, cwd, env, timeout):
  """`(exit code or None on timeout, output)`; a timeout ends the group.

  The output goes to a file, not a pipe: a worker process that a test
  started in a session of its own may outlive pytest and would hold a pipe
  open.
  """
  with tempfile.TemporaryFile("w+", encoding="utf-8",
                              errors="replace") as log:
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
      code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      _stop(proc)
      code = None
    except BaseException:  # KeyboardInterrupt: leave no pytest behind.
      _stop(proc)
      raise
    log.seek(0)
    return code, log.read()


def _stop(proc):
  """SIGTERM, then SIGKILL, to the process group of `proc` (ours: it leads
  a session this tool started), and waits for `proc`."""
  for signum in (signal.SIGTERM, signal.SIGKILL):
    try:
      os.killpg(proc.pid, signum)
    except ProcessLookupError:
      break
    try:
      proc.wait(timeout=_GRACE_SECONDS)
      break
    except subprocess.TimeoutExpired:
      continue
  proc.wait()


def check_import_path(python, copy, env):
  """None if `python` imports ndq_tf from `copy`; else why not.

  `importlib.util.find_spec` locates the package without running it (no
  TensorFlow is imported).
  """
  code = ("import importlib.util; s = importlib.util.find_spec('ndq_tf'); "
          "print(s.origin if s else '')")
  try:
    out = subprocess.run([python, "-c", code], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=120)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"cannot run {python}: {e}"
  origin = out.stdout.strip()
  expected = os.path.join(os.path.realpath(copy), "ndq_tf", "")
  if not os.path.realpath(origin).startswith(expected):
    return (f"{python} imports ndq_tf from {origin or '(nowhere)'}, not from "
            f"the copy {copy} {out.stderr.strip()}")
  return None


def pytest_command(python, tests):
  return [python, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider",
          "-p", "no:randomly", "-p", "no:xdist"] + list(tests)


def first_failure(output):
  """The id of the first failed or erroring test in pytest's output."""
  match = re.search(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.M)
  return match.group(1) if match else ""


def _tail(output, count=_TAIL_LINES):
  lines = [l for l in output.rstrip().splitlines() if l.strip()]
  return "\n".join("    | " + l for l in lines[-count:])


# -- One fault -----------------------------------------------------------------


def _check(fault, tree, args, baselines):
  """Copies `tree`, applies `fault` and (unless a dry run) runs its tests."""
  start = time.monotonic()

  def result(status, detail="", output=""):
    return Result(fault, status, time.monotonic() - start, detail, output)

  missing = [f for f in named_test_files(fault.tests)
             if not os.path.isfile(os.path.join(tree, f))]
  module = os.path.join(tree, fault.file)
  if not os.path.isfile(module):
    return result(ERROR, f"does not apply: no {fault.file} in {tree}")
  workdir = tempfile.mkdtemp(prefix=f"fault_check_{fault.name}_")
  try:
    copy = os.path.join(workdir, os.path.basename(tree.rstrip(os.sep)))
    copy_tree(tree, copy)
    target = os.path.join(copy, fault.file)
    with open(target, encoding="utf-8") as f:
      original = f.read()
    try:
      faulted = apply_fault(original, fault)
    except FaultError as e:
      return result(ERROR, f"does not apply: {e}")
    env = _environment(copy)
    wrong_path = check_import_path(args.python, copy, env)
    if wrong_path:
      return result(ERROR, wrong_path)
    if args.dry_run:
      notes = []
      if missing:
        notes.append(f"no such tests: {', '.join(missing)}")
      unmatched = unmatched_keywords(fault.tests, tree)
      if unmatched:
        notes.append(f"-k words in no named test file: "
                     f"{', '.join(unmatched)}")
      return result(APPLIES, "; ".join(notes))
    if missing:
      return result(NO_TESTS, f"no such tests: {', '.join(missing)}")
    command = pytest_command(args.python, fault.tests)
    if args.baseline:
      key = tuple(fault.tests)
      if key not in baselines:
        baselines[key] = _run(command, copy, env, args.timeout)
      code, output = baselines[key]
      if code != 0:
        why = ("timed out" if code is None else
               f"exit {code} {first_failure(output)}".rstrip())
        return result(ERROR, f"baseline: the tests fail unfaulted ({why})",
                      output)
    with open(target, "w", encoding="utf-8") as f:
      f.write(faulted)
    with open(target, encoding="utf-8") as f:
      if f.read() == original:
        return result(ERROR, "the faulted module is the original")
    code, output = _run(command, copy, env, args.timeout)
    if code is None:
      return result(ERROR, f"timeout after {args.timeout:.0f} s "
                    f"{first_failure(output)}".rstrip(), output)
    if code == 1:
      return result(CAUGHT, first_failure(output), output)
    if code == 0:
      return result(MISSED, "the tests passed", output)
    meaning = {2: "interrupted or collection error", 3: "internal error",
               4: "usage error", 5: "no tests collected"}.get(code, "")
    return result(ERROR, f"pytest exit {code} ({meaning}) "
                  f"{first_failure(output)}".rstrip(), output)
  finally:
    if args.keep:
      print(f"  (kept {workdir})", flush=True)
    else:
      shutil.rmtree(workdir, ignore_errors=True)


# -- Reports -------------------------------------------------------------------


def _where(fault):
  return f"{fault.file}:{fault.symbol}"


def list_faults(faults, tree):
  heavy = heavy_test_files(tree)
  width = max(len(f.name) for f in faults)
  for fault in faults:
    marks = [f for f in named_test_files(fault.tests) if f in heavy]
    print(f"{fault.name:<{width}}  {_where(fault)}")
    print(f"{'':<{width}}    tests: {shlex.join(fault.tests)}"
          + (f"  [heavy: {', '.join(marks)}]" if marks else ""))
    for line in textwrap.wrap(fault.what, 76):
      print(f"{'':<{width}}    {line}")


def _line(r, width):
  return (f"{r.fault.name:<{width}}  {r.status:<8} {r.seconds:7.1f} s  "
          f"{r.detail}").rstrip()


def summary(results):
  width = max(len("fault"), *(len(r.fault.name) for r in results))
  where = max(len("where"), *(len(_where(r.fault)) for r in results))
  rule = "-" * (width + where + 34)
  print("\n" + rule)
  print(f"{'fault':<{width}}  {'result':<8} {'seconds':>9}  "
        f"{'where':<{where}}  detail")
  print(rule)
  for r in results:
    print(f"{r.fault.name:<{width}}  {r.status:<8} {r.seconds:9.1f}  "
          f"{_where(r.fault):<{where}}  {r.detail}".rstrip())
  print(rule)
  counts = {}
  for r in results:
    counts[r.status] = counts.get(r.status, 0) + 1
  print(f"{len(results)} faults: " + ", ".join(
      f"{n} {status.lower()}" for status, n in sorted(counts.items())))


# -- main ----------------------------------------------------------------------


def _parse_args(argv):
  parser = argparse.ArgumentParser(
      description="Plants deliberate faults in a copy of the tree and checks "
                  "that the tests catch each one (see the module doc).")
  parser.add_argument("--only", nargs="+", metavar="NAME",
                      help="run these faults only (names from --list)")
  parser.add_argument("--list", action="store_true",
                      help="print the faults and their tests, and exit")
  parser.add_argument("--tree", default=ROOT,
                      help="the source tree to fault (default: this "
                           "repository, %(default)s)")
  parser.add_argument("--dry_run", action="store_true",
                      help="apply and compile every fault, run no test")
  parser.add_argument("--python", default=sys.executable,
                      help="the interpreter that runs pytest (default: "
                           "%(default)s)")
  parser.add_argument("--timeout", type=float, default=900.0,
                      help="seconds per fault's pytest run (default: "
                           "%(default)s)")
  parser.add_argument("--baseline", action="store_true",
                      help="first run each fault's tests unfaulted; a fault "
                           "whose tests fail unfaulted is an ERROR")
  parser.add_argument("--keep", action="store_true",
                      help="keep the temporary copies (for debugging)")
  parser.add_argument("--log_dir",
                      help="write every fault's pytest output to "
                           "LOG_DIR/<name>.log")
  args = parser.parse_args(argv)
  names = [f.name for f in FAULTS]
  if len(set(names)) != len(names):
    parser.error("FAULTS has duplicate names")
  unknown = sorted(set(args.only or ()) - set(names))
  if unknown:
    parser.error(f"unknown fault(s) {', '.join(unknown)}; known: "
                 f"{', '.join(names)}")
  if args.timeout <= 0:
    parser.error("--timeout must be positive")
  args.tree = os.path.realpath(args.tree)
  if not os.path.isdir(args.tree):
    parser.error(f"--tree {args.tree} is not a directory")
  return args


def main(argv=None):
  args = _parse_args(argv)
  faults = [f for f in FAULTS if not args.only or f.name in args.only]
  if args.list:
    list_faults(faults, args.tree)
    return 0
  if args.log_dir:
    os.makedirs(args.log_dir, exist_ok=True)
  width = max(len(f.name) for f in faults)
  print(f"{'dry run: ' if args.dry_run else ''}{len(faults)} faults in "
        f"{args.tree}, pytest by {args.python}", flush=True)
  results, baselines = [], {}
  for fault in faults:
    r = _check(fault, args.tree, args, baselines)
    results.append(r)
    print(_line(r, width), flush=True)
    if r.status in (MISSED, ERROR) and r.output:
      print(_tail(r.output), flush=True)
    if args.log_dir and r.output:
      with open(os.path.join(args.log_dir, f"{fault.name}.log"), "w",
                encoding="utf-8") as f:
        f.write(r.output)
  summary(results)
  wanted = APPLIES if args.dry_run else CAUGHT
  return 0 if all(r.status == wanted for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
