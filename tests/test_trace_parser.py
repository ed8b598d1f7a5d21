"""Tests of benchmarks/trace_parser.py on a real, small profiler trace.

One tiny `tf.function` (a matmul), its placement from the run metadata of
its first call, then two steps traced with the step marker: the parser
finds both steps and the matmul inside each, on its device.
"""

import importlib.util
import os

import pytest
import tensorflow as tf
from tensorflow.python.eager import context

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "benchmarks", "trace_parser.py")


def _parser():
  spec = importlib.util.spec_from_file_location("ndq_trace_parser", _PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
  parser = _parser()
  x = tf.random.stateless_normal([64, 64], seed=[1, 2])

  @tf.function
  def step():
    return tf.reduce_sum(tf.matmul(x, x, name="trace_matmul"))

  ctx = context.context()
  ctx.enable_run_metadata()
  step()
  placement = parser.op_placement(ctx.export_run_metadata())
  ctx.disable_run_metadata()
  logdir = str(tmp_path_factory.mktemp("trace"))
  tf.profiler.experimental.start(logdir)
  try:
    for i in range(2):
      with tf.profiler.experimental.Trace(parser.STEP_MARKER, step_num=i,
                                          _r=1):
        step().numpy()
  finally:
    tf.profiler.experimental.stop()
  return parser, placement, parser.read_xspace(logdir)


def test_placement_names_the_ops_and_their_devices(trace):
  _, placement, _ = trace
  device, op_type, _ = placement["trace_matmul"]
  assert op_type.endswith("MatMul")  # _MklMatMul with oneDNN.
  assert device.startswith("CPU:")


def test_every_marked_step_is_one_window_in_order(trace):
  parser, _, space = trace
  windows = parser.step_windows(space)
  assert len(windows) == 2
  assert all(a < b for a, b in windows)
  assert windows[0][1] <= windows[1][0]


def test_the_ops_of_a_step_are_inside_its_window(trace):
  parser, placement, space = trace
  window = parser.step_windows(space)[1]
  events = parser.op_events(space, window, placement)
  matmuls = [e for e in events if e[1].endswith("MatMul")]
  assert matmuls, events
  for name, _, device, _, _, start, end in matmuls:
    assert name == "trace_matmul" and device.startswith("CPU:")
    assert window[0] <= start <= end <= window[1]


def test_a_folder_without_a_trace_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="No .xplane.pb"):
    _parser().read_xspace(str(tmp_path))
