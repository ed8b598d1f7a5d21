"""Reads a TensorFlow profiler trace: step windows, and the ops inside them.

The parser of benchmarks/step_breakdown.py. A trace (`.xplane.pb`, from
`tf.profiler.experimental.start`/`stop`) holds ops by name and thread, not
by device: `op_placement` maps node names to devices from the run metadata
of a step function's first call; `step_windows` finds the steps marked by a
`tf.profiler.experimental.Trace(STEP_MARKER)`; `op_events` lists the TF ops
executed inside one of them. Tested by tests/test_trace_parser.py.
"""

import glob
import os
import re

__all__ = [
    "STEP_MARKER",
    "op_events",
    "op_placement",
    "read_xspace",
    "step_windows",
]

#: The name of the profiler event that marks one traced step.
STEP_MARKER = "step_breakdown_step"
# The executor's event of one kernel: `node name:op type`; an asynchronous
# kernel's, with its name and type in the event's stats.
_ASYNC_START = "ExecutorState::ProcessAsync::Start"
_OP_EVENT = re.compile(r"^([^:\s][^:]*):([A-Za-z_][A-Za-z0-9_]*)$")


# -- The graph: which device runs which op --------------------------------------


def op_placement(run_metadata):
  """Maps node names of the partitioned graphs to `(device, type, function)`.

  Args:
    run_metadata: a `RunMetadata` proto exported after the step function's
      first call (its `function_graphs` hold the graphs as partitioned).

  Returns:
    A dict from node name to `(short device name, op type, name of the
    function it calls or "")`.
  """
  placement = {}
  graphs = list(run_metadata.partition_graphs)
  for function_graph in run_metadata.function_graphs:
    graphs.extend(function_graph.partition_graphs)
  for graph in graphs:
    for node in graph.node:
      function = node.attr["f"].func.name if "f" in node.attr else ""
      placement[node.name] = (_short_device(node.device), node.op, function)
  return placement


def _short_device(device):
  """`CPU:1` from `/job:localhost/replica:0/task:0/device:CPU:1`."""
  match = re.search(r"device:([^/]+)$", device or "")
  return match.group(1) if match else (device or "?")


# -- The trace ------------------------------------------------------------------


def read_xspace(logdir):
  """The `XSpace` of the newest `.xplane.pb` under `logdir`."""
  # The only way into the profiler's output from Python in TF 2.21: the
  # public API writes it, TSL's generated protobuf module reads it.
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  files = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                           recursive=True), key=os.path.getmtime)
  if not files:
    raise FileNotFoundError(f"No .xplane.pb under {logdir!r}.")
  space = xplane_pb2.XSpace()
  with open(files[-1], "rb") as f:
    space.ParseFromString(f.read())
  return space


def _host_plane(space):
  for plane in space.planes:
    if plane.name == "/host:CPU":
      return plane
  raise ValueError("The trace has no /host:CPU plane; planes: "
                   f"{[p.name for p in space.planes]}")


def step_windows(space):
  """`[(start_ps, end_ps)]` of the steps marked by `traced_steps`, in order."""
  plane = _host_plane(space)
  windows = []
  for line in plane.lines:
    base = line.timestamp_ns * 1000
    for event in line.events:
      if plane.event_metadata[event.metadata_id].name == STEP_MARKER:
        start = base + event.offset_ps
        windows.append((start, start + event.duration_ps))
  return sorted(windows)


def _stats(plane, event):
  """The stats of `event` as a dict of name to value."""
  stats = {}
  for stat in event.stats:
    key = plane.stat_metadata[stat.metadata_id].name
    which = stat.WhichOneof("value")
    if which == "ref_value":
      stats[key] = plane.stat_metadata[stat.ref_value].name
    elif which is not None:
      stats[key] = getattr(stat, which)
  return stats


def _lookup(name, placement):
  """`placement` of `name`, also under a call's prefix (`Call/inner/op`)."""
  parts = name.split("/")
  for i in range(len(parts)):
    found = placement.get("/".join(parts[i:]))
    if found is not None:
      return "/".join(parts[i:]), found
  return name, None


def op_events(space, window, placement):
  """The TF ops executed inside `window`, outermost per thread.

  Args:
    space: the `XSpace` of the trace.
    window: `(start_ps, end_ps)` of one step.
    placement: the map of `op_placement`.

  Returns:
    A list of `(name, type, device, function, thread, start_ps, end_ps)`.
    TF's executor records each kernel as an event `name:type`, and an
    asynchronous kernel (a `PartitionedCall`, e.g. of the codec's
    XLA-compiled stages) as `ExecutorState::ProcessAsync::Start` with its
    name and type as stats; an op running a function nests the function's
    events inside its own, so only the outermost op event of each nest is
    kept. Ops not in the partitioned graphs (the input pipeline's
    own functions) are attributed to the device `host`.
  """
  plane = _host_plane(space)
  start, end = window
  events = []
  for line in plane.lines:
    base = line.timestamp_ns * 1000
    kept_end = -1
    for event in sorted(line.events, key=lambda e: (e.offset_ps,
                                                    -e.duration_ps)):
      t0 = base + event.offset_ps
      t1 = t0 + event.duration_ps
      if t1 <= start or t0 >= end or t0 < kept_end:
        continue
      label = plane.event_metadata[event.metadata_id].name
      if label == _ASYNC_START:
        # An asynchronous kernel (a function call, an XLA cluster: it runs
        # the compiled computation inside this event) names itself in stats.
        stats = _stats(plane, event)
        name, op_type = stats.get("name"), stats.get("kernel_type")
        if not name or not op_type:
          continue
      else:
        match = _OP_EVENT.match(label)
        if not match:  # The executor's own events, XLA's, tf.data's.
          continue
        name, op_type = match.groups()
      name, found = _lookup(name, placement)
      device, op_type, function = found or ("host", op_type, "")
      events.append((name, op_type, device, function, line.name,
                     max(t0, start), min(t1, end)))
      kept_end = t1
  return events
