"""The exchanges of the compressed all-reduce, listed once.

One module per exchange, each an `base.Exchange` (its name, the codecs it
carries, its bits and decode work per worker, its framing, `run`), listed
once in `EXCHANGES`: `NAMES` is the one list of exchange names the options
(`exchange=`), the cost model (`ndq_tf.core.cost_model`, which also
holds `exchange="auto"`'s choice) and the telemetry use. An exchange's
`run` gets an `ExchangeContext` (`context`: options, step, fingerprint,
seeds, state stores, telemetry), never the engine.

Adding an exchange:

1. A module here with a `base.Exchange` subclass and one instance of it,
   `EXCHANGE`. The subclass sets `name` (the value of `exchange=` that
   picks it, reported by the telemetry), `framing_words` and `automatic`,
   and overrides `refusal` (the codecs it cannot carry, as a sentence),
   `bits` and `work` (its cost model, docs/scaling.md) and
   `run(context, transport, codecs, plan, senders)`, which builds the
   encode, the exchange through `transport` and the decode, draws every
   seed from `context.seed`, and ends with `context.record`.
2. Its instance appended to `EXCHANGES` below. Append only: a name's
   position is its code in the telemetry's checkpointed variables. The
   options then accept the name, the cost model prices it and
   `exchange="auto"` may pick it (if `automatic`).
3. A transport, if none of `ndq_tf.core.transports` moves what it needs:
   one for replicas of one process (device copies or sums) and one for
   workers (TF's collectives). A transport is named for what it moves and
   knows no codecs. The strategies' cross-device ops
   (`ndq_tf.distribute.cross_device_ops`, `ndq_tf.distribute.multi_worker`)
   build it and hand it to `ExchangeEngine.exchange` in its `transports`,
   keyed by the exchange's name.
4. Tests: its declarations in tests/core/exchanges/test_base.py, its cost model
   against the tensors it really sends in tests/core/test_cost_model.py, and
   the strategies' sums under `exchange=<name>`.
"""

from ndq_tf import _deprecation
from ndq_tf.core.exchanges import base
from ndq_tf.core.exchanges import context
from ndq_tf.core.exchanges import feedback
from ndq_tf.core.exchanges import gather
from ndq_tf.core.exchanges import reduce_scatter
from ndq_tf.core.exchanges import sum as sum_exchange

__all__ = [
    "EXCHANGES",
    "ExchangeContext",
    "NAMES",
    "get",
]

#: Every exchange, in the order of their telemetry codes (append new ones).
EXCHANGES = (gather.EXCHANGE, sum_exchange.EXCHANGE,
             reduce_scatter.EXCHANGE)

#: The names of the exchanges: the values of `transport` besides `"auto"`.
NAMES = tuple(e.name for e in EXCHANGES)

_BY_NAME = {e.name: e for e in EXCHANGES}

ExchangeContext = context.ExchangeContext


def get(name):
  """The `base.Exchange` called `name` (one of `NAMES`)."""
  try:
    return _BY_NAME[name]
  except (KeyError, TypeError):
    raise ValueError(
        f"`exchange` must be one of {', '.join(map(repr, NAMES))}. "
        f"Received: exchange={name!r}.") from None


# The cost model lived here (deprecated names, one release).
__getattr__ = _deprecation.moved_attributes(__name__, {
    name: f"ndq_tf.core.cost_model.{name}"
    for name in ("DECODE_NS", "DEFAULT_LINK_GBPS", "DRAW_NS", "LANE_NS",
                 "auto", "bits_summary", "costs", "exchange_bits",
                 "exchange_seconds", "exchange_work", "summary",
                 "time_model")})
