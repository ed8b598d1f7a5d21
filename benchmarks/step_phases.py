"""The phases of a traced training step, and their overlaps.

benchmarks/step_breakdown.py traces steps with TensorFlow's profiler;
this module classifies every op of one step by phase (`classify`: forward,
backward, the compressed all-reduce's encode, exchange, decode and sum,
the optimizer's update, other), and measures from the resulting `Op`s what
step_breakdown.py prints and draws: ms per phase per device
(`phase_table`), the exchange's overlap with other chunks' encode and
decode (`exchange_overlap`), the link time and its overlap with the
backward pass (`backward_overlap`) and each chunk's spans (`chunk_rows`).
"""

import collections
import re


#: Phases in drawing order, with their colours.
PHASES = collections.OrderedDict([
    ("forward", "#4c72b0"),
    ("backward", "#55a868"),
    ("encode", "#dd8452"),
    ("exchange", "#c44e52"),
    ("decode", "#8172b3"),
    ("sum", "#937860"),
    ("optimizer update", "#da8bc3"),
    ("other", "#bbbbbb"),
])

# A scope of the engine, with the `_<n>` TF appends to a repeated scope name.
_NDQ_SCOPE = re.compile(r"(?:^|/)ndq_(encode|exchange|decode|sum)(?:_\d+)?/")
_NDQ_CHUNK = re.compile(r"(?:^|/)ndq_chunk(\d+)(?:_\d+)?/")
_COLLECTIVES = {"CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
                "CollectiveGather", "CollectiveGatherV2",
                "CollectiveAllToAllV2", "CollectiveAllToAllV3",
                "CollectiveBcastSend", "CollectiveBcastRecv",
                "CollectiveBcastSendV2", "CollectiveBcastRecvV2",
                "NcclAllReduce", "NcclReduce", "NcclBroadcast"}
_TRANSFERS = {"_Send", "_Recv", "_HostSend", "_HostRecv"}
_BACKWARD = re.compile(r"(?:^|/)(?:gradient_tape|gradients)(?:_\d+)?/")

#: One op execution: its node name and type, device, thread, phase, chunk
#: (None outside `ndq_chunk<k>`), start and end in ms from the step's start.
Op = collections.namedtuple(
    "Op", ["name", "type", "device", "thread", "phase", "chunk", "start",
           "end"])


def _scope_pattern(scope):
  """Matches name scope `scope` (or `scope_<n>`) anywhere in a node name."""
  return re.compile(rf"(?:^|/){re.escape(scope)}(?:_\d+)?/")


def classify(name, op_type, function, optimizer_scope, forward_scopes):
  """The phase and chunk of one op.

  Args:
    name: its node name, e.g. `sgd/ndq_chunk1/ndq_encode/concat`.
    op_type: its type, e.g. `ConcatV2`.
    function: the function it calls (XLA clusters, `PartitionedCall`), or "".
    optimizer_scope: the optimizer's name scope, e.g. `sgd`.
    forward_scopes: the name scopes of the forward pass: the model's and the
      loss's names (Keras scopes its ops under them).

  Returns:
    `(phase, chunk)`: a key of `PHASES` and the `k` of the innermost
    `ndq_chunk<k>` scope around it, or None.
  """
  chunk = None
  chunks = _NDQ_CHUNK.findall(name)
  if chunks:
    chunk = int(chunks[-1])
  scopes = _NDQ_SCOPE.findall(name)
  if scopes:
    return scopes[-1], chunk
  if op_type in _COLLECTIVES:
    return "exchange", chunk
  # The codec's stages are XLA-compiled functions: named even without scopes.
  if re.search(r"_(unpack|dequantize)_stage", function):
    return "decode", chunk
  if re.search(r"_(pack|quantize)_stage", function):
    return "encode", chunk
  if _BACKWARD.search(name):
    return "backward", chunk
  if _scope_pattern(optimizer_scope).search(name):
    return "optimizer update", chunk
  if any(_scope_pattern(scope).search(name) for scope in forward_scopes):
    return "forward", chunk
  return "other", chunk


def build_ops(events, window, optimizer_scope, forward_scopes):
  """`Op`s of `op_events`, times in ms from the window's start."""
  start = window[0]
  ops = []
  for name, op_type, device, function, thread, t0, t1 in events:
    phase, chunk = classify(name, op_type, function, optimizer_scope,
                            forward_scopes)
    if op_type in _TRANSFERS and phase not in ("encode", "exchange",
                                               "decode", "sum"):
      phase = "other"
    elif op_type in _TRANSFERS:
      # A transfer is named after the tensor it moves (an encoder's output,
      # a payload copy): moving bytes between devices is the exchange.
      phase = "exchange"
    ops.append(Op(name, op_type, device, thread, phase, chunk,
                  (t0 - start) / 1e9, (t1 - start) / 1e9))
  return ops


def union(intervals):
  """Sorted disjoint intervals covering `intervals`."""
  merged = []
  for a, b in sorted(intervals):
    if merged and a <= merged[-1][1]:
      merged[-1][1] = max(merged[-1][1], b)
    else:
      merged.append([a, b])
  return merged


def length(intervals):
  return sum(b - a for a, b in intervals)


def _intersection(xs, ys):
  """Length of the intersection of two disjoint sorted interval lists."""
  total, i, j = 0.0, 0, 0
  while i < len(xs) and j < len(ys):
    a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
    if b > a:
      total += b - a
    if xs[i][1] < ys[j][1]:
      i += 1
    else:
      j += 1
  return total


def exchange_overlap(ops):
  """Fraction of the exchange's time hidden behind other chunks' codec work.

  For each chunk `k`, the time (union over all devices and threads) when
  chunk `k`'s exchange runs while some other chunk is being encoded or
  decoded, summed over the chunks, divided by the exchange's total time.
  0 when the exchange is not split in chunks (or took no measurable time).
  """
  chunks = sorted({op.chunk for op in ops if op.chunk is not None})
  if len(chunks) < 2:
    return 0.0
  overlapped = total = 0.0
  for k in chunks:
    exchange = union([(o.start, o.end) for o in ops
                       if o.chunk == k and o.phase == "exchange"])
    codec = union([(o.start, o.end) for o in ops
                    if o.chunk not in (None, k)
                    and o.phase in ("encode", "decode")])
    total += length(exchange)
    overlapped += _intersection(exchange, codec)
  return overlapped / total if total else 0.0


def _is_gradient_exchange(op):
  """Whether `op` moves the compressed gradients (the engine's exchange)."""
  return op.phase == "exchange" and "ndq_exchange" in op.name


def link_ops(ops):
  """The ops that move the gradients: collectives and transfers.

  Those under the engine's `ndq_exchange` when there are any (the loss's
  `strategy.reduce` is left out), else every collective (TF's own
  strategies); not the small ops that build a payload's header.
  """
  moving = [o for o in ops if o.phase == "exchange"
            and o.type in _COLLECTIVES | _TRANSFERS]
  ours = [o for o in moving if _is_gradient_exchange(o)]
  return ours or moving


def backward_overlap(ops):
  """Link time, and the part of it that overlaps the backward pass.

  The link time is the union (over devices and threads) of the gradient
  exchange's ops (`link_ops`), from each collective's launch to its
  completion, so it includes waiting for the other workers; the backward
  pass is the union of the backward ops.

  Returns:
    `(link_ms, overlapped_ms)`.
  """
  link = union([(o.start, o.end) for o in link_ops(ops)])
  backward = union([(o.start, o.end) for o in ops if o.phase == "backward"])
  return length(link), _intersection(link, backward)


def chunk_rows(ops):
  """`[(label, {phase: union of intervals})]`: backward, then each chunk.

  The rows of the timeline's lower panel: the backward pass, then one row
  per chunk (one row `exchange` when it is not split) with the union of
  its encode, exchange, decode and sum ops.
  """
  rows = [("backward", {"backward": union(
      [(o.start, o.end) for o in ops if o.phase == "backward"])})]
  chunks = sorted({o.chunk for o in ops if o.chunk is not None})
  keys = chunks or [None]
  link = set(map(id, link_ops(ops)))
  for k in keys:
    phases = collections.OrderedDict()
    for phase in ("encode", "exchange", "decode", "sum"):
      phases[phase] = union([
          (o.start, o.end) for o in ops
          if o.phase == phase and (k is None or o.chunk == k)
          and (phase != "exchange" or id(o) in link)])
    rows.append(("exchange" if k is None else f"chunk {k}", phases))
  return rows


def device_key(device):
  match = re.match(r"([A-Za-z_]+):(\d+)$", device)
  return (0, match.group(1), int(match.group(2))) if match else (1, device, 0)


def phase_table(ops):
  """`{device: {phase: ms}}` (sums of op durations), devices sorted."""
  table = collections.OrderedDict()
  for device in sorted({o.device for o in ops}, key=device_key):
    table[device] = collections.OrderedDict((p, 0.0) for p in PHASES)
  for op in ops:
    table[op.device][op.phase] += op.end - op.start
  return table


def format_table(table, step_ms):
  """The table of `phase_table` as text, with a total column and row."""
  phases = [p for p in PHASES if any(row[p] for row in table.values())]
  head = f"{'device':8s}" + "".join(f"{p:>17s}" for p in phases) + (
      f"{'busy':>9s}")
  lines = [head]
  totals = collections.Counter()
  for device, row in table.items():
    busy = sum(row.values())
    totals.update(row)
    lines.append(f"{device:8s}" + "".join(f"{row[p]:17.2f}" for p in phases)
                 + f"{busy:9.2f}")
  lines.append(f"{'all':8s}" + "".join(f"{totals[p]:17.2f}" for p in phases)
               + f"{sum(totals.values()):9.2f}")
  lines.append(f"(ms of op time in a step of {step_ms:.2f} ms wall; 'busy' "
               "can exceed it: ops of one device run on several threads)")
  return "\n".join(lines)
