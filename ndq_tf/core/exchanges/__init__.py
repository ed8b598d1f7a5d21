"""The exchanges of the compressed all-reduce, listed once.

One module per exchange, each an `base.Exchange` (its name, the codecs it
carries, its bits and decode work per worker, its framing, `run`), listed
once in `EXCHANGES`: `NAMES` is the one list of exchange names the options
(`transport=`), the cost model (`ndq_tf.core.cost_model`, which also
holds `transport="auto"`'s choice) and the telemetry use.

Adding an exchange: a module here defining a `base.Exchange` subclass and
an instance, appended to `EXCHANGES` below; its transport, if it needs a
new one, in `ndq_tf.core.transports`, built by the strategies' cross-device
ops (`ndq_tf.distribute`) beside the others.
"""

from ndq_tf import _deprecation
from ndq_tf.core.exchanges import base
from ndq_tf.core.exchanges import feedback
from ndq_tf.core.exchanges import gather
from ndq_tf.core.exchanges import reduce_scatter
from ndq_tf.core.exchanges import sum as sum_exchange

__all__ = [
    "EXCHANGES",
    "NAMES",
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


# The cost model lived here (deprecated names, one release).
__getattr__ = _deprecation.moved_attributes(__name__, {
    name: f"ndq_tf.core.cost_model.{name}"
    for name in ("DECODE_NS", "DEFAULT_LINK_GBPS", "DRAW_NS", "LANE_NS",
                 "auto", "bits_summary", "costs", "exchange_bits",
                 "exchange_seconds", "exchange_work", "summary",
                 "time_model")})
