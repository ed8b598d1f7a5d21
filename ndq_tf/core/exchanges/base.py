"""What every exchange declares, and the pieces the exchanges share.

An *exchange* is one algorithm of the compressed all-reduce: how the
senders' encoded gradients travel and are summed (`gather`: every payload
to every receiver; `sum`: integer codes summed by an all-reduce). Each one
is an `Exchange`: its name (the value of the option `transport`), which
codecs it carries, its cost in bits and in decode work per worker (the
cost model of docs/scaling.md), its framing words, and `run`, which builds
the exchange's ops from a small context (`context.ExchangeContext`: the
options, step, fingerprint, seeds, state stores and telemetry of the call),
never the engine. A transport (`ndq_tf.core.transports`) only moves bytes,
and is named for what it moves.
"""

import collections
import contextlib

import tensorflow as tf

__all__ = [
    "Exchange",
    "Work",
    "chunk_scope",
    "check_count",
    "join",
    "sender_codecs",
    "split_results",
]

#: The work of one worker in one exchange of `n` values (of the whole
#: process when its devices share one memory): elements of dither it draws
#: (to encode and to decode: a subtractive dither is drawn again by every
#: receiver), decodes of `n` elements it runs, and codes it packs into and
#: unpacks from the integer all-reduce's lanes.
Work = collections.namedtuple("Work", ["dither_draws", "decodes",
                                       "lane_codes"], defaults=(0,))


class Exchange:
  """One algorithm of the compressed all-reduce (subclasses set `name`).

  Subclasses override `refusal`, `bits`, `work` and `run`;
  `framing_words` is the words the exchange adds to a payload, as its
  transport sends them.
  """

  #: The value of the option `transport` that picks this exchange (and
  #: the key of its transport in `ExchangeEngine.exchange`'s `transports`).
  name = None
  #: Words the exchange's transport adds to every sender's payload.
  framing_words = 0
  #: Whether `exchange="auto"` may pick it (`cost_model.auto`).
  automatic = True

  def refusal(self, codec, nested):
    """Why this exchange cannot carry `codec` (a sentence), or None.

    Args:
      codec: the options' codec.
      nested: whether the options have a nested group.
    """
    del codec, nested
    return None

  def bits(self, codecs, num_elements, num_workers):
    """Bits each worker sends per exchange of `num_elements` values (model).

    Args:
      codecs: one codec per worker, in sender order.
      num_elements: `n >= 0`.
      num_workers: `P >= 1`.

    Raises:
      ValueError: if the exchange cannot carry the codecs.
    """
    raise NotImplementedError

  def work(self, codecs, num_elements, num_workers, shared_memory=False):
    """The `Work` of each worker per exchange of `num_elements` values.

    With `shared_memory`, the work of the one process whose devices hold
    all `num_workers` senders (`transports.base.shares_memory`).
    """
    raise NotImplementedError

  def run(self, context, transport, codecs, plan, senders):
    """Builds the exchange; returns one list of summed tensors per receiver.

    Args:
      context: the call's `context.ExchangeContext` (options, step,
        fingerprint, `seed`, the state stores, `record`, the mean).
      transport: the transport of this exchange (`ExchangeEngine.exchange`'s
        `transports[self.name]`).
      codecs: one codec per sender, in sender order.
      plan: the `FusionPlan` of the senders' tensors.
      senders: the local `LocalSender`s, in sender order.
    """
    raise NotImplementedError

  def __repr__(self):
    return f"<exchange {self.name!r}>"


def check_count(name, value, low):
  """Raises unless `value` is an integer `>= low` (named `name`)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise ValueError(
        f"`{name}` must be an integer >= {low}. Received: {name}={value!r}.")


def sender_codecs(codec, num_workers):
  """One codec per worker from one codec or a list of them."""
  if isinstance(codec, (list, tuple)):
    if len(codec) != num_workers:
      raise ValueError(
          f"`codec` must be one codec or one per worker ({num_workers}). "
          f"Received: {len(codec)} codecs.")
    return list(codec)
  return [codec] * num_workers


def chunk_scope(index, count):
  """The name scope `ndq_chunk<index>` of a chunk, if there are several."""
  if count > 1:
    return tf.name_scope(f"ndq_chunk{index}")
  return contextlib.nullcontext()


def join(parts):
  """One 1-D tensor from a chunk's parts (the part itself if only one)."""
  return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]


def split_results(plan, chunks, totals, devices, checks=None):
  """Every receiver's list of summed tensors from its chunks' sums.

  `totals` maps a receiver to its sum per chunk; receivers without sums of
  their own (on a transport with `shared_memory`) get the first one's
  tensors, handed over on their devices. `checks` maps a receiver to ops
  that must run before its tensors are used (its transport's checks).
  """
  results = []
  for r in sorted(devices):
    with tf.device(devices[r]), tf.name_scope("ndq_sum"):
      if r in totals:
        tensors = plan.split_chunks(chunks, totals[r])
        if checks and checks.get(r):
          with tf.control_dependencies(checks[r]):
            tensors = [tf.identity(t) for t in tensors]
        results.append(tensors)
      else:
        results.append([tf.identity(t) for t in results[0]])
  return results
