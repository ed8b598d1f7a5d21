"""The cost model of the exchanges: bits and work per worker, and `auto`.

What one exchange of `n` values among `P` workers costs each worker:

* bits: the collective payload one worker sends on its link
  (`exchange_bits`), each exchange's own `bits`
  (`ndq_tf.core.exchanges`), beside the uncompressed float rings
  (`FLOAT_RINGS`, the baselines);
* work: dither draws, decodes and lane codes (`exchange_work`), priced on
  a CPU by constants measured there (`DRAW_NS`, `DECODE_NS`, `LANE_NS`,
  `benchmarks/decode_cost.py`);
* time: the bits over a link of `link_gbps` plus, on CPU devices, the
  work (`exchange_seconds`). On other devices, whose work no machine here
  measures, the bits alone. Devices that share one memory move no bits:
  there the work alone.

`exchange="auto"` picks, per exchange, the one this time model says is
fastest (`auto`). These are the model's numbers, not measurements
(docs/scaling.md tabulates them). The closed-form parts that know no
exchange (`ring_all_reduce_bits`, `ring_all_gather_bits`, `summed_form`)
are `ndq_tf.theory`'s.
"""

import tensorflow as tf

from ndq_tf import theory
from ndq_tf.core import exchanges
from ndq_tf.core.exchanges import base
from ndq_tf.core.exchanges import gather

__all__ = [
    "DECODE_NS",
    "DEFAULT_LINK_GBPS",
    "DRAW_NS",
    "FLOAT_RINGS",
    "LANE_NS",
    "TRANSPORTS",
    "auto",
    "bits_summary",
    "costs",
    "exchange_bits",
    "exchange_seconds",
    "exchange_work",
    "summary",
    "time_model",
]

#: The uncompressed float rings of the model (`exchange_bits`), beside the
#: exchanges (`ndq_tf.core.exchanges.NAMES`).
FLOAT_RINGS = ("float32_ring", "float16_ring")

#: The values of `exchange_bits`' `transport`: the exchanges, then the
#: float rings.
TRANSPORTS = exchanges.NAMES + FLOAT_RINGS


def _codecs(codec, num_elements, num_workers, name):
  base.check_count("num_elements", num_elements, 0)
  base.check_count("num_workers", num_workers, 1)
  codecs = base.sender_codecs(codec, num_workers)
  if any(c is None for c in codecs):
    raise ValueError(
        f"`codec` is required for transport={name!r}. Received: "
        f"codec=None.")
  return codecs


def _float_ring_bits(codec, num_elements, num_workers, transport):
  base.check_count("num_elements", num_elements, 0)
  base.check_count("num_workers", num_workers, 1)
  width = 32 if transport == "float32_ring" else 16
  for c in base.sender_codecs(codec, num_workers):
    if c is not None and theory.summed_form(c) != f"float{width}":
      raise ValueError(
          f"`codec` must be None (or Float{width}Codec) for transport="
          f"{transport!r}, the uncompressed float{width} ring. Received: "
          f"codec={c!r}.")
  return theory.ring_all_reduce_bits(width * num_elements, num_workers)


def exchange_bits(codec, num_elements, num_workers, transport):
  """Bits each worker sends per step to sum `num_elements` values: the model.

  What is counted: the bits of collective payload one worker sends on its
  link in one exchange of a buffer of `n = num_elements` values among
  `P = num_workers` workers (one sender each). All the transports here are
  rings, so a worker receives as many bits as it sends. Not counted:
  latency, the protocol's own framing (gRPC, TCP, NCCL) and lossless
  reductions outside the buffer. These are the model's numbers, not
  measurements (docs/scaling.md). Each exchange's own `bits`
  (`ndq_tf.core.exchanges`) is the model.

  * `"all_gather"` (today's multi-worker transport): every worker sends
    its payload, `codec.wire_bits(n)`, framed by the 5 header words of
    `transports.all_gather.HEADER_WORDS` and padded to the longest payload
    of the exchange, through a ring all-gather:
    `(P - 1)·32·(5 + max_p wire_words_p)` (`theory.ring_all_gather_bits`).
    Every codec, nested ones included. A variable-length codec's
    `wire_bits(n)` is an expectation, and its payloads follow a round of
    headers: `(P - 1)·32·(10 + wire_words)`, an expectation.
  * `"all_reduce"`: the integer sum of codes (`theory.codes_add_up`
    codecs only): the symbols packed in the densest exact lanes for `P`
    senders (`ndq_tf.ops.lane_layout`: `W` words of 32 or 64 bits) through
    a ring all-reduce, plus the MAX all-reduce of the `⌈n/d⌉` float32
    scales that makes them shared (with 8 words of step and fingerprint
    stamps, `transports.collective_sum.STAMP_WORDS`):
    `2(P - 1)/P·(W·word_bits + 32·(⌈n/d⌉ + 8))`. `Float16Codec` and
    `Float32Codec` go through TF's float ring of their dtype:
    `2(P - 1)/P·16n` and `2(P - 1)/P·32n`; `BFloat16Codec`'s bfloat16
    values through the float32 ring, `2(P - 1)/P·32n` (TF's NCCL
    all-reduce takes no bfloat16).
  * `"reduce_scatter"`: `exchanges.reduce_scatter.reduce_scatter_bits`.
  * `"float32_ring"`, `"float16_ring"`: the uncompressed baselines,
    `2(P - 1)/P·32n` and `2(P - 1)/P·16n` (`codec` must be None or the
    matching float codec).

  Example: ternary DQSG (`DitheredCodec(num_levels=1)`, `d = 512`) on
  `2**20` elements costs per element about `1.66·(P - 1)` bits by
  all-gather, `2(P - 1)/P·(5.33 + 0.06)` by all-reduce at `P = 8`
  (5-bit lanes, 6 per `int32`), and `2(P - 1)/P·32` by a float32 ring: the
  all-gather stops paying against the float32 ring from `P = 39`, against
  an fp16 ring from `P = 20`.

  Args:
    codec: a codec, or a list of `P` codecs, one per worker in sender order
      (`CompressionOptions.sender_codecs(P)` of a nested group: rows are
      padded to the longest payload); None for the float rings.
    num_elements: `n >= 0`, the values in the buffer.
    num_workers: `P >= 1`.
    transport: one of `TRANSPORTS`.

  Returns:
    The bits one worker sends per step, a float (0 for `P = 1`).

  Raises:
    ValueError: for an unknown transport, a count out of range, a codec
      that the transport cannot carry (codes that do not add up under
      `"all_reduce"`, different codecs per worker, a codec given to a float
      ring), or a sum too large for 31-bit lanes.
  """
  if transport in FLOAT_RINGS:
    return _float_ring_bits(codec, num_elements, num_workers, transport)
  if transport not in exchanges.NAMES:
    raise ValueError(
        f"`transport` must be one of {', '.join(map(repr, TRANSPORTS))}. "
        f"Received: transport={transport!r}.")
  return exchanges.get(transport).bits(
      _codecs(codec, num_elements, num_workers, transport), num_elements,
      num_workers)


def exchange_work(codec, num_elements, num_workers, name,
                  shared_memory=False):
  """The decode `base.Work` of each worker per exchange `name`.

  With `shared_memory`, of the one process holding every sender.
  """
  exchange = exchanges.get(name)
  codecs = _codecs(codec, num_elements, num_workers, name)
  exchange.bits(codecs, num_elements, num_workers)  # Raises if refused.
  return exchange.work(codecs, num_elements, num_workers, shared_memory)


#: The CPU time model's constants, in nanoseconds per element: one dither
#: draw, one decode (unpack, dequantize, add) without its draw, one code
#: packed into and unpacked from the integer all-reduce's lanes. Measured
#: by `benchmarks/decode_cost.py` on a 2-core AMD EPYC (AVX2) at load
#: about 1: 0.8-1.3, 1.9-3.2 and 1.7-4.9 over three runs (docs/scaling.md).
#: Their ratios, not their scale, decide between the exchanges' work.
DRAW_NS = 1.0
DECODE_NS = 2.0
LANE_NS = 2.5

#: The link rate the time model assumes by default (`link_gbps`, Gbit/s):
#: a data-center Ethernet port. The options take none yet.
DEFAULT_LINK_GBPS = 10.0


def exchange_seconds(codec, num_elements, num_workers, name,
                     link_gbps=DEFAULT_LINK_GBPS, on_cpu=True,
                     shared_memory=False):
  """Seconds one exchange `name` costs each worker by the time model.

  `bits / (link_gbps·10⁹)` (none in one shared memory) plus, `on_cpu`,
  `draws·DRAW_NS + decodes·n·DECODE_NS + lane_codes·LANE_NS` of its
  `base.Work`. Not modelled: collective latency, encode arithmetic beyond
  the draws (about the same for every exchange) and overlap with the
  backward pass.

  Raises:
    ValueError: as `exchange_bits`, for codecs the exchange cannot carry.
  """
  bits = exchange_bits(codec, num_elements, num_workers, name)
  seconds = 0.0 if shared_memory else bits / (link_gbps * 1e9)
  if on_cpu:
    work = exchange_work(codec, num_elements, num_workers, name,
                         shared_memory)
    seconds += 1e-9 * (work.dither_draws * DRAW_NS
                       + work.decodes * num_elements * DECODE_NS
                       + work.lane_codes * LANE_NS)
  return seconds


def costs(codec, num_elements, num_workers, **model):
  """`{name: seconds}` of every `automatic` exchange that carries `codec`.

  `model`: `exchange_seconds`' `link_gbps`, `on_cpu`, `shared_memory`.
  """
  out = {}
  for exchange in exchanges.EXCHANGES:
    if exchange.automatic:
      try:
        out[exchange.name] = exchange_seconds(codec, num_elements,
                                              num_workers, exchange.name,
                                              **model)
      except ValueError:
        continue
  return out


def auto(codec, num_elements, num_workers, **model):
  """The exchange `exchange="auto"` picks: the fastest by the time model.

  Per worker, the bits on a link of `link_gbps` (default 10) plus, on CPU
  devices, the dither draws, decodes and lane codes priced by constants
  measured on a CPU (docs/scaling.md). The all-gather unless another
  `automatic` exchange that carries the codecs costs strictly less
  (`costs`; a tie, a nested group or a single worker keep the all-gather).
  A nested group always gets the all-gather: the integer all-reduce cannot
  sum its codes, and the reduce-scatter refuses its adaptive mode across
  processes, which the model does not know of.

  Args:
    codec: a codec, or one per worker in sender order, as for
      `exchange_bits`.
    num_elements: `n >= 0`.
    num_workers: `P >= 1`.
    **model: `exchange_seconds`' `link_gbps` (float), `on_cpu` (default
      True: price the work) and `shared_memory` (default False: the
      workers are processes).

  Returns:
    `"all_gather"`, `"all_reduce"` or `"reduce_scatter"`.
  """
  best = gather.EXCHANGE.name
  if num_workers < 2 or any(
      getattr(c, "needs_side_information", False)
      for c in base.sender_codecs(codec, num_workers)):
    return best
  priced = costs(codec, num_elements, num_workers, **model)
  least = priced[best]
  for name, seconds in priced.items():
    if seconds < least:
      best, least = name, seconds
  return best


def time_model(devices, shared_memory):
  """`auto`'s `on_cpu` and `shared_memory` for senders on `devices`.

  `on_cpu`: every device is a CPU (a device string without a type counts
  as one), so the CPU's constants price the work. `shared_memory`: the
  transport's, or senders without devices (this process's default one).
  """
  on_cpu = all((tf.DeviceSpec.from_string(d).device_type or "CPU").upper()
               == "CPU" for d in devices)
  shared = bool(shared_memory) or all(not d for d in devices)
  return {"on_cpu": on_cpu, "shared_memory": shared}


def summary(codec, num_elements, num_workers, **model):
  """`"all_gather 1234 bits 0.52 ms, ..."`: what `auto` weighed."""
  parts = []
  for name, seconds in costs(codec, num_elements, num_workers,
                             **model).items():
    bits = exchange_bits(codec, num_elements, num_workers, name)
    parts.append(f"{name} {bits:.0f} bits {1e3 * seconds:.3g} ms")
  return ", ".join(parts)


def bits_summary(codecs, num_elements, num_workers):
  """`"all_gather 1234, all_reduce 567"`: the bits of `auto`'s candidates."""
  parts = []
  for name in (e.name for e in exchanges.EXCHANGES if e.automatic):
    try:
      bits = exchange_bits(codecs, num_elements, num_workers, name)
    except ValueError:
      continue
    parts.append(f"{name} {bits:.0f}")
  return ", ".join(parts)
