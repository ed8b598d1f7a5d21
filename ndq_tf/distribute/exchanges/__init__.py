"""The exchanges of the compressed all-reduce, and their cost model.

One module per exchange, each an `base.Exchange` (its name, the codecs it
carries, its bits and decode work per worker, its framing, `run`), listed
once in `EXCHANGES`: `NAMES` is the one list of exchange names the options
(`transport=`), the cost model (`ndq_tf.theory.exchange_bits`) and the
telemetry use.

Adding an exchange: a module here defining a `base.Exchange` subclass and
an instance, appended to `EXCHANGES` below (see the hand-off note of the
refactor for the steps).
"""

from ndq_tf.distribute.exchanges import base
from ndq_tf.distribute.exchanges import gather
from ndq_tf.distribute.exchanges import reduce_scatter
from ndq_tf.distribute.exchanges import sum as sum_exchange

__all__ = [
    "EXCHANGES",
    "NAMES",
    "auto",
    "bits_summary",
    "exchange_bits",
    "exchange_work",
    "get",
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


def exchange_work(codec, num_elements, num_workers, name):
  """The decode `base.Work` of each worker per exchange `name`."""
  exchange = get(name)
  codecs = _codecs(codec, num_elements, num_workers, name)
  exchange.bits(codecs, num_elements, num_workers)  # Raises if refused.
  return exchange.work(codecs, num_elements, num_workers)


def auto(codec, num_elements, num_workers):
  """The exchange `transport="auto"` picks: the fewest bits by the model.

  The all-gather unless another exchange that can carry the codecs sends
  strictly fewer bits (a tie, a nested group or a single worker keep the
  all-gather). Only the exchanges with `automatic` set are candidates.
  """
  best = gather.EXCHANGE.name
  least = exchange_bits(codec, num_elements, num_workers, best)
  for exchange in EXCHANGES:
    if exchange.name == best or not exchange.automatic:
      continue
    try:
      bits = exchange_bits(codec, num_elements, num_workers, exchange.name)
    except ValueError:
      continue
    if bits < least:
      best, least = exchange.name, bits
  return best


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
