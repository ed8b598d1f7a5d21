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
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NUM_LOGICAL_CPUS = 4


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
