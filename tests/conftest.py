"""pytest set-up shared by every test file (the Bazel py_tests run pytest too).

TensorFlow reads TF_CPP_MIN_LOG_LEVEL when it loads, so it is set here, before
any test module imports TF.

The CPU is split into NUM_LOGICAL_CPUS logical devices once per test process,
before any test module is imported. TF accepts a split only before its runtime
initializes, and pytest (and every pytest-xdist worker, whatever the --dist
mode) imports all test modules into one process during collection, so splits
made per test file would silently overwrite or contradict each other. A test
that needs N <= NUM_LOGICAL_CPUS devices takes the first N of
tf.config.list_logical_devices("CPU") and must not split again.

Tiers (issue #31): every test file's target in tests/BUILD carries exactly one
of the tags "quick" and "heavy", and "oldest" when what it tests depends on
the TensorFlow or Keras version (TF internals, saving and restoring, the
gradient routes, the golden bits, the Keras callbacks). Each tag becomes the
pytest marker of the same name (registered in pytest.ini), read from BUILD so
that the two never disagree: `make test-quick` runs `-m quick`, `make
test-oldest` runs `-m oldest` on the oldest supported versions, as `bazel test
--config=quick` keeps the targets tagged "quick". A collected test file with
no tier in BUILD stops the run (tools/check_build.py checks the same in CI).

`tf.test.TestCase` has a method `test_session` (a deprecated context
manager), which pytest would collect as a test of every TestCase subclass;
methods that test classes inherit from TensorFlow are deselected.
"""

import json
import os
import pathlib
import re
import resource
import time

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NUM_LOGICAL_CPUS = 4

_BUILD = pathlib.Path(__file__).with_name("BUILD")


#: The tiers: each test file's BUILD target has one of the first two.
TIERS = ("quick", "heavy", "oldest")


def tiers_of_test_files(build_text):
  """{test file: its tier tags} for the `pytest_test` targets of a BUILD file."""
  tiers = {}
  for target in re.findall(r"^pytest_test\((.*?)^\)", build_text,
                           flags=re.M | re.S):
    tags = re.search(r"\btags\s*=\s*\[([^\]]*)\]", target)
    names = set(re.findall(r"[\"']([^\"']+)[\"']", tags.group(1))
                if tags else ())
    srcs = re.search(r"\bsrcs\s*=\s*\[([^\]]*)\]", target)
    for src in re.findall(r"[\"']([^\"']+\.py)[\"']", srcs.group(1)):
      tiers[src] = names & set(TIERS)
  return tiers


def _file_tiers():
  # Under Bazel the BUILD file is not among a test's runfiles; its tags
  # select the tiers there.
  if not _BUILD.exists():
    return None
  return tiers_of_test_files(_BUILD.read_text())


def _build_path(item):
  """The test file of `item` as tests/BUILD names it: relative to tests/."""
  try:
    return item.path.relative_to(_BUILD.parent).as_posix()
  except ValueError:  # A file outside tests/: its name (BUILD lacks it).
    return item.path.name


def _inherited_from_tensorflow(item):
  function = getattr(item, "obj", None)
  return getattr(function, "__module__", "").startswith("tensorflow.")


def pytest_collection_modifyitems(config, items):
  # Not a test: tf.test.TestCase.test_session, inherited by every TestCase
  # (reported as deselected, so that the counts add up).
  inherited = [item for item in items if _inherited_from_tensorflow(item)]
  if inherited:
    items[:] = [item for item in items if not _inherited_from_tensorflow(item)]
    config.hook.pytest_deselected(items=inherited)
  tiers = _file_tiers()
  if tiers is None:
    return
  untiered = sorted({_build_path(item) for item in items
                     if len(tiers.get(_build_path(item), set()) &
                            {"quick", "heavy"}) != 1})
  if untiered:
    raise pytest.UsageError(
        "tests/BUILD must tag the pytest_test target of each test file with "
        "exactly one of \"quick\" and \"heavy\" (issue #31); these have "
        "not: %s" % ", ".join(untiered))
  for item in items:
    for tier in sorted(tiers[_build_path(item)]):
      item.add_marker(getattr(pytest.mark, tier))


def _is_xdist_controller(config):
  """True in the pytest-xdist process that only hands tests out to workers."""
  option = config.option
  return (not hasattr(config, "workerinput") and
          getattr(option, "dist", "no") != "no" and
          bool(getattr(option, "tx", None)) and
          not option.collectonly)


def _split_cpu():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


def pytest_configure(config):
  # Importing TF in the xdist controller would cost seconds and memory for
  # nothing: it runs no tests.
  if _is_xdist_controller(config):
    return
  # TF writes start-up messages straight to fd 2 before TF_CPP_MIN_LOG_LEVEL
  # takes effect; let pytest capture them like any other output (`-s` shows
  # them).
  capman = config.pluginmanager.getplugin("capturemanager")
  if capman is not None:
    capman.resume_global_capture()
  try:
    _split_cpu()
  finally:
    if capman is not None:
      capman.suspend_global_capture()


# The suite's time budget (issue #31): the whole run's wall time, and every
# test whose setup, call and teardown (fixtures included) add up to more than
# SLOW_TEST_SECONDS. Under pytest-xdist the controller receives every
# worker's reports, so one summary covers both processes. A module-scoped
# fixture's cost lands on the test that first asks for it.
SLOW_TEST_SECONDS = 30.0
#: No test may take longer (the suite issue's rule); the summary flags those.
TEST_BUDGET_SECONDS = 60.0

_durations = {}
# CPU seconds of each test: its own process's and its finished child
# processes' (a launcher's count includes its workers', which it waits for).
# A test whose wall time far exceeds both waited: for the other xdist
# worker's processes, a timeout, or a tf.data iterator's destruction, which
# waits for its autotuning thread's next wake-up (up to minutes for a
# distributed iterator; seen on TF 2.18 and 2.21).
_cpu = {}
_START = time.monotonic()  # When pytest loaded this file, before TF loads.
_CPU_PROPERTY = "cpu_seconds"
_RSS_PROPERTY = "max_rss_mb"
_max_rss = {}  # The test process's peak resident memory after each test.


def _cpu_seconds():
  own = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return (own.ru_utime + own.ru_stime,
          children.ru_utime + children.ru_stime)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  if call.when == "teardown":
    start = getattr(item, "_ndq_cpu_start", None)
    if start is not None:
      now = _cpu_seconds()
      outcome.get_result().user_properties.append(
          (_CPU_PROPERTY, [b - a for a, b in zip(start, now)]))
      outcome.get_result().user_properties.append(
          (_RSS_PROPERTY,
           resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  item._ndq_cpu_start = _cpu_seconds()  # pylint: disable=protected-access


def pytest_runtest_logreport(report):
  _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + (
      report.duration)
  for name, value in report.user_properties:
    if name == _RSS_PROPERTY:
      _max_rss[report.nodeid] = value
    if name == _CPU_PROPERTY:
      _cpu[report.nodeid] = tuple(value)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  del exitstatus  # Unused.
  if hasattr(config, "workerinput"):
    return  # An xdist worker: the controller reports.
  if not _durations:
    return
  write = terminalreporter.write_line
  terminalreporter.section("time budget")
  slow = sorted(((d, n) for n, d in _durations.items()
                 if d > SLOW_TEST_SECONDS), reverse=True)
  for seconds, nodeid in slow:
    flag = "  OVER %.0f s" % TEST_BUDGET_SECONDS if (
        seconds > TEST_BUDGET_SECONDS) else ""
    own, children = _cpu.get(nodeid, (0.0, 0.0))
    write("%7.1f s  %s (CPU: %.1f s own, %.1f s child processes)%s"
          % (seconds, nodeid, own, children, flag))
  write("%d tests: %.1f s of test time, %.1f s of wall time; %d over %.0f s"
        % (len(_durations), sum(_durations.values()),
           time.monotonic() - _START, len(slow), SLOW_TEST_SECONDS))
  if _cpu:
    write("CPU: %.1f s in the test processes, %.1f s in their child "
          "processes" % tuple(sum(c[i] for c in _cpu.values())
                              for i in range(2)))
  report = os.environ.get("NDQ_TIME_REPORT")
  if report:
    # Every test's wall seconds, CPU seconds (own, child processes) and its
    # process's peak memory after it (MB), for finding where the suite's
    # time and memory go: NDQ_TIME_REPORT=<file.json>.
    with open(report, "w") as f:
      json.dump({n: {"seconds": d, "cpu": _cpu.get(n, (0.0, 0.0)),
                     "max_rss_mb": _max_rss.get(n)}
                 for n, d in _durations.items()}, f, indent=0)
    write("time report: %s" % report)
