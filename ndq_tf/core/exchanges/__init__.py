"""The exchanges of the compressed all-reduce, and their cost model.

`transport="auto"` picks, per exchange, the one the time model says is
fastest (`auto`, `exchange_seconds`): the bits each worker sends over a
link of `link_gbps` plus, on CPU devices, its work, priced by constants
measured on a CPU (`benchmarks/decode_cost.py`): dither draws, decodes and
lane codes (`base.Work`). On other devices, whose work no machine here
measures, the bits alone. Devices that share one memory move no bits:
there the work alone.

One module per exchange, each an `base.Exchange` (its name, the codecs it
carries, its bits and decode work per worker, its framing, `run`), listed
once in `EXCHANGES`: `NAMES` is the one list of exchange names the options
(`transport=`), the cost model (`ndq_tf.theory.exchange_bits`) and the
telemetry use.

Adding an exchange: a module here defining a `base.Exchange` subclass and
an instance, appended to `EXCHANGES` below (see the hand-off note of the
refactor for the steps).
"""

import tensorflow as tf

from ndq_tf.distribute.exchanges import base
from ndq_tf.distribute.exchanges import feedback
from ndq_tf.distribute.exchanges import gather
from ndq_tf.distribute.exchanges import reduce_scatter
from ndq_tf.distribute.exchanges import sum as sum_exchange

__all__ = [
    "DECODE_NS",
    "DEFAULT_LINK_GBPS",
    "DRAW_NS",
    "EXCHANGES",
    "LANE_NS",
    "NAMES",
    "auto",
    "bits_summary",
    "costs",
    "exchange_bits",
    "exchange_seconds",
    "exchange_work",
    "get",
    "summary",
    "time_model",
]

#: Every exchange, in the order of their telemetry codes (append new ones).
EXCHANGES = (gather.EXCHANGE, sum_exchange.EXCHANGE,
             reduce_scatter.EXCHANGE)

#: The names of the exchanges: the values of `transport` besides `"auto"`.
NAMES = tuple(e.name for e in EXCHANGES)

_BY_NAME = {e.name: e for e in EXCHANGES}


def get(name):
  """The `base.Exchange` called `name` (one of `NAMES`)."""
  try:
    return _BY_NAME[name]
  except (KeyError, TypeError):
    raise ValueError(
        f"`transport` must be one of {', '.join(map(repr, NAMES))}. "
        f"Received: transport={name!r}.") from None


def _codecs(codec, num_elements, num_workers, name):
  base.check_count("num_elements", num_elements, 0)
  base.check_count("num_workers", num_workers, 1)
  codecs = base.sender_codecs(codec, num_workers)
  if any(c is None for c in codecs):
    raise ValueError(
        f"`codec` is required for transport={name!r}. Received: "
        f"codec=None.")
  return codecs


def exchange_bits(codec, num_elements, num_workers, name):
  """Bits each worker sends per exchange `name` of `num_elements` values.

  Args:
    codec: a codec, or one per worker in sender order.
    num_elements: `n >= 0`.
    num_workers: `P >= 1`.
    name: one of `NAMES`.

  Raises:
    ValueError: for an unknown name, a count out of range or codecs the
      exchange cannot carry.
  """
  exchange = get(name)
  return exchange.bits(_codecs(codec, num_elements, num_workers, name),
                       num_elements, num_workers)


def exchange_work(codec, num_elements, num_workers, name,
                  shared_memory=False):
  """The decode `base.Work` of each worker per exchange `name`.

  With `shared_memory`, of the one process holding every sender.
  """
  exchange = get(name)
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
  for exchange in EXCHANGES:
    if exchange.automatic:
      try:
        out[exchange.name] = exchange_seconds(codec, num_elements,
                                              num_workers, exchange.name,
                                              **model)
      except ValueError:
        continue
  return out


def auto(codec, num_elements, num_workers, **model):
  """The exchange `transport="auto"` picks: the fastest by the time model.

  The all-gather unless another `automatic` exchange that carries the
  codecs costs strictly less (`costs`; a tie, a nested group or a single
  worker keep the all-gather). A nested group always gets the all-gather:
  the integer all-reduce cannot sum its codes, and the reduce-scatter
  refuses its adaptive mode across processes, which the model does not
  know of.

  Args:
    codec: a codec, or one per worker in sender order.
    num_elements: `n >= 0`.
    num_workers: `P >= 1`.
    **model: `exchange_seconds`' `link_gbps`, `on_cpu` and
      `shared_memory`.
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
  for name in (e.name for e in EXCHANGES if e.automatic):
    try:
      bits = exchange_bits(codecs, num_elements, num_workers, name)
    except ValueError:
      continue
    parts.append(f"{name} {bits:.0f}")
  return ", ".join(parts)
