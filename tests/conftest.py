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

Tiers: the test files whose Bazel target in tests/BUILD is tagged "heavy"
get the pytest marker `heavy` (registered in pytest.ini), read from BUILD so
that the two never disagree; `make test-quick` runs `-m "not heavy"`, as
`bazel test --config=quick` leaves the tagged targets out.

`tf.test.TestCase` has a method `test_session` (a deprecated context
manager), which pytest would collect as a test of every TestCase subclass;
methods that test classes inherit from TensorFlow are deselected.
"""

import os
import pathlib
import re

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NUM_LOGICAL_CPUS = 4

_BUILD = pathlib.Path(__file__).with_name("BUILD")


def heavy_test_files(build_text):
  """The `srcs` of the `pytest_test` targets of a BUILD file tagged "heavy"."""
  files = set()
  for target in re.findall(r"^pytest_test\((.*?)^\)", build_text,
                           flags=re.M | re.S):
    tags = re.search(r"\btags\s*=\s*\[([^\]]*)\]", target)
    if tags and re.search(r"[\"']heavy[\"']", tags.group(1)):
      srcs = re.search(r"\bsrcs\s*=\s*\[([^\]]*)\]", target)
      files.update(re.findall(r"[\"']([^\"']+\.py)[\"']", srcs.group(1)))
  return files


def _heavy_files():
  # Under Bazel the BUILD file is not among a test's runfiles; its tags
  # select the tiers there.
  if not _BUILD.exists():
    return set()
  return heavy_test_files(_BUILD.read_text())


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
  heavy = _heavy_files()
  for item in items:
    if item.path.name in heavy:
      item.add_marker(pytest.mark.heavy)


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
