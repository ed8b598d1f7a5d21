"""One telemetry vocabulary for every strategy and transport.

`Telemetry` keeps, in host variables, what the last compressed exchange of
this process did; `result()` reads it as a dict of Python numbers with the
keys below, the same for `ndq_tf.MirroredStrategy` and
`ndq_tf.MultiWorkerMirroredStrategy`. `ndq_tf.CompressionStats` puts
`sent_bits_per_element`, `compression_ratio` and, with a nested codec,
`overload_rate` and `fallback_fraction` in the Keras logs.

"This process" is one `MirroredStrategy` (which encodes for all its
replicas: every replica is a sender) or one worker of a multi-worker job
(which sums its devices and encodes once: one sender).

Keys (all of the last compressed exchange):

* `exchange_count`: compressed exchanges so far (the value of the dither's
  step counter; not a quantizer's step).
* `transport`: how the last exchange travelled, `"all_gather"`,
  `"all_reduce"` (what `exchange="auto"` picked) or `"reduce_scatter"`
  (both of its stages); before the first exchange, the option as given.
* `senders`: senders in the exchange, all processes together.
* `local_senders`: senders this process encoded.
* `sent_bits`: bits this process's senders put on the wire: their packed
  payloads with the transport's framing (headers, padding to a common
  length), plus the tensors of the same call sent losslessly, at their
  width, once per local sender.
  For `"all_reduce"`, the payload is what a sender puts into the sum: its
  lanes of codes and its scales (plus the step stamps as framing).
* `payload_bits`: the codec payloads alone, all local senders (measured,
  like `sent_bits`); of a variable-length codec (`EntropyCodedDitheredCodec`),
  the words its payloads use, and `sent_bits` adds the length rounds and
  the padding to the longest payload.
* `model_link_bits`: what the local senders' links carry for this exchange
  by the cost model, not measured (`ndq_tf.core.cost_model.exchange_bits`: `(P - 1)` framed rows
  for `"all_gather"`, `2(P - 1)/P` payloads for `"all_reduce"`, `(P - 1)`
  framed shard rows per stage for `"reduce_scatter"`; the lossless tensors as a float ring, `2(P - 1)/P` of their bits).
* `compressed_elements`, `lossless_elements`: gradient elements per sender
  in the call that were compressed, and that travelled losslessly beside
  them (small tensors, `IndexedSlices`, integers; sparse values counted by
  their runtime size).
* `sent_bits_per_element`: `sent_bits` per local sender and element of the
  call (compressed and lossless): 32 for float32 everywhere.
* `compression_ratio`: float32 bits of the same elements / `sent_bits`.
* `link_compression_ratio`: what a float32 ring all-reduce of the same
  elements carries (`2(P - 1)/P·32` bits each) / `model_link_bits`: the
  traffic saved against TF's own all-reduce, whatever the transport.

Deprecated keys, kept for one release (`DEPRECATED_KEYS`; reading one warns
and names its replacement): `step` (`exchange_count`), `link_bits`
(`model_link_bits`), `wire_bits_per_element` (`sent_bits_per_element`).

Counted since the strategy was built (not only the last exchange):

* `uncompressed_gradient_reductions`: gradient aggregations in which
  nothing was compressed (every gradient below `min_elements`, say).
* `lossless_fallbacks`: floating tensors of at least `min_elements`
  elements, in reductions that were to be compressed, that travelled
  losslessly for a structural reason (destinations on other devices, no
  static shape, shapes that differ between replicas); each reason is
  also logged once.
* `unrecognised_gradient_steps`: `strategy.run` calls that updated
  trainable variables from an all-reduce nothing recognised as gradient
  aggregation (so it travelled losslessly), e.g. a
  `ReplicaContext.all_reduce` of gradients by hand outside
  `ndq_tf.distribute.compressed()`; logged once
  (`ndq_tf.distribute.gradient_detection`). Under a `tf.function`, the
  check is made when it is traced and the count when it runs.

With a nested codec, about this process's nested senders (none on a
reference worker: zeros):

* `overloads`: real elements of nested buckets that decoded wrong, counted
  by their senders from their own gradients (ground truth).
* `nested_elements`: real elements sent in nested (not fallback) buckets.
* `overload_rate`: `overloads / nested_elements`; 0 when no element was
  sent nested (then `fallback_fraction` says why).
* `overload_probability`: what a Gaussian noise of the measured per-bucket
  RMS would overload per nested element; 0 when none was sent nested.
* `fallback_fraction`: buckets of the nested senders sent as DQSG; 0
  without nested senders here.

With a low-rank codec (`ndq_tf.PowerSGD`), whose exchange runs up to three
rounds (the fallback codec's tensors, then the factors `P` and `Q`), the
counters above add the rounds up (`transport` is the factors' exchange, or
the fallback's during the warm-up), and:

* `rank`: the largest rank of the matrices sent low rank (0 in the
  warm-up);
* `low_rank_fraction`: the fraction of the compressed elements sent as
  factors.
"""

import tensorflow as tf

from ndq_tf import _deprecation
from ndq_tf.core import exchanges
from ndq_tf.core import tf_internals

__all__ = [
    "DEPRECATED_KEYS",
    "KEYS",
    "NESTED_KEYS",
    "TRANSPORT_NAMES",
    "Stats",
    "Telemetry",
    "lossless_size",
]

KEYS = ("exchange_count", "transport", "senders", "local_senders",
        "sent_bits", "payload_bits", "model_link_bits", "compressed_elements",
        "lossless_elements", "sent_bits_per_element", "compression_ratio",
        "link_compression_ratio", "uncompressed_gradient_reductions",
        "lossless_fallbacks", "unrecognised_gradient_steps")

#: Old keys of `Telemetry.result` and their replacements (one release).
DEPRECATED_KEYS = {
    "step": "exchange_count",
    "link_bits": "model_link_bits",
    "wire_bits_per_element": "sent_bits_per_element",
}

#: The exchanges the key `"transport"` reports, by their code in the
#: telemetry (the exchanges' names, not their transports').
TRANSPORT_NAMES = exchanges.NAMES
NESTED_KEYS = ("overloads", "nested_elements", "overload_rate",
               "overload_probability", "fallback_fraction")
LOW_RANK_KEYS = ("rank", "low_rank_fraction")

_COUNTERS = ("senders", "local_senders", "sent_bits", "payload_bits",
             "link_bits", "compressed_elements", "lossless_elements")
_CUMULATIVE = ("uncompressed_gradient_reductions", "lossless_fallbacks",
               "unrecognised_gradient_steps")
_NESTED_COUNTERS = ("overloads", "nested_elements", "fallback_buckets",
                    "nested_buckets")
_LOW_RANK_COUNTERS = ("rank", "low_rank_elements")


class Telemetry(tf.Module):
  """Host variables describing the last compressed exchange of this process.

  Args:
    transport: the transport option (reported until the first exchange).
    nested: whether to keep the nested counters.
    device: where the variables live.
    low_rank: whether to keep the low-rank counters.
  """

  def __init__(self, transport, nested, device="/device:CPU:0",
               low_rank=False):
    super().__init__(name="telemetry")
    self._transport = transport
    self._nested = nested
    self._low_rank = low_rank
    self._device = device
    with tf.init_scope(), tf.device(device):
      self._counters = {
          key: tf.Variable(0, dtype=tf.int64, trainable=False, name=key)
          for key in (_COUNTERS + _CUMULATIVE
                      + (_NESTED_COUNTERS if nested else ())
                      + (_LOW_RANK_COUNTERS if low_rank else ()))}
      self._transport_code = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                         name="transport")
      if nested:
        self._expected = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                     name="expected_overloads")

  @property
  def transport(self):
    """The transport of the last exchange (the option before the first)."""
    code = int(self._transport_code.numpy())
    return TRANSPORT_NAMES[code] if code >= 0 else self._transport

  def record(self, transport, **values):
    """Assigns the counters of one exchange; returns the assign ops.

    Args:
      transport: one of `TRANSPORT_NAMES`.
      **values: integer scalars (Python or tensors) for `senders`,
        `local_senders`, `sent_bits`, `payload_bits`, `link_bits`,
        `compressed_elements`, `lossless_elements`.
    """
    if transport not in TRANSPORT_NAMES:
      raise ValueError(
          f"`transport` must be one of {TRANSPORT_NAMES}. Received: "
          f"transport={transport!r}.")
    unknown = set(values) - set(_COUNTERS)
    if unknown:
      raise ValueError(f"Unknown telemetry keys: {sorted(unknown)}.")
    return [self._transport_code.assign(TRANSPORT_NAMES.index(transport))] + [
        self._counters[k].assign(tf.cast(v, tf.int64))
        for k, v in values.items()]

  def count(self, **increments):
    """Adds to the cumulative counters (`uncompressed_gradient_reductions`,
    `lossless_fallbacks`, `unrecognised_gradient_steps`) when the reduction
    runs; returns the ops."""
    unknown = set(increments) - set(_CUMULATIVE)
    if unknown:
      raise ValueError(f"Unknown telemetry counters: {sorted(unknown)}.")
    with tf.device(self._device):
      return [self._counters[k].assign_add(tf.cast(v, tf.int64))
              for k, v in increments.items()]

  def counted(self, key):
    """The current value of a cumulative counter (an int)."""
    return int(self._counters[key].numpy())

  def record_nested(self, statistics):
    """Assigns the nested counters from the local nested senders' statistics.

    Args:
      statistics: list of `nested_state.sender_statistics` dicts, one per
        nested sender of this process (may be empty), each with
        `num_buckets`.
    """
    if not self._nested:
      return []

    def total(key, dtype):
      parts = [tf.cast(s[key], dtype) for s in statistics]
      return tf.add_n(parts) if parts else tf.zeros([], dtype)

    c = self._counters
    buckets = sum(int(s["num_buckets"]) for s in statistics)
    return [
        c["overloads"].assign(total("overloads", tf.int64)),
        c["nested_elements"].assign(total("nested_elements", tf.int64)),
        c["fallback_buckets"].assign(total("fallback_buckets", tf.int64)),
        c["nested_buckets"].assign(buckets),
        self._expected.assign(total("expected_overloads", tf.float64)),
    ]

  def record_low_rank(self, rank, low_rank_elements):
    """Assigns the low-rank counters (`LOW_RANK_KEYS`); returns the ops."""
    return [self._counters["rank"].assign(tf.cast(rank, tf.int64)),
            self._counters["low_rank_elements"].assign(
                tf.cast(low_rank_elements, tf.int64))]

  def result(self, step):
    """The telemetry of the last exchange, as a dict (see the module doc).

    Args:
      step: the exchange's step counter (an int), reported as `step`.
    """
    value = {k: int(v.numpy()) for k, v in self._counters.items()}
    out = Stats(exchange_count=int(step), transport=self.transport)
    for key in _COUNTERS + _CUMULATIVE:
      out["model_link_bits" if key == "link_bits" else key] = value[key]
    elements = value["compressed_elements"] + value["lossless_elements"]
    per_sender = elements * value["local_senders"]
    sent = value["sent_bits"]
    out["sent_bits_per_element"] = (sent / per_sender if per_sender
                                    else float("nan"))
    out["compression_ratio"] = 32 * per_sender / sent if sent else float(
        "nan")
    senders, link = value["senders"], value["link_bits"]
    ring = 2.0 * (senders - 1) / senders if senders else 0.0
    out["link_compression_ratio"] = (ring * 32 * per_sender / link if link
                                     else float("nan"))
    if self._nested:
      nested = value["nested_elements"]
      out["overloads"] = value["overloads"]
      out["nested_elements"] = nested
      out["overload_rate"] = value["overloads"] / nested if nested else 0.0
      out["overload_probability"] = (
          float(self._expected.numpy()) / nested if nested else 0.0)
      buckets = value["nested_buckets"]
      out["fallback_fraction"] = (value["fallback_buckets"] / buckets
                                  if buckets else 0.0)
    if self._low_rank:
      out["rank"] = value["rank"]
      compressed = value["compressed_elements"]
      out["low_rank_fraction"] = (value["low_rank_elements"] / compressed
                                  if compressed else 0.0)
    for old, new in DEPRECATED_KEYS.items():
      dict.__setitem__(out, old, out[new])
    return out


class Stats(dict):
  """The dict of `Telemetry.result`; its deprecated keys warn when read."""

  def __getitem__(self, key):
    if key in DEPRECATED_KEYS:
      _deprecation.warn(f"The telemetry key {key!r}",
                        repr(DEPRECATED_KEYS[key]))
    return super().__getitem__(key)

  def get(self, key, default=None):
    return self[key] if key in self else default


def lossless_size(lossless_values):
  """`int64` elements and bits of the values that travel losslessly.

  `IndexedSlices` count their values and indices at their runtime size;
  a `DistributedValues` counts its first component.
  """
  lossless_elements = tf.zeros([], tf.int64)
  lossless_bits = tf.zeros([], tf.int64)
  for value in lossless_values:
    v = value.values[0] if isinstance(
        value, tf_internals.DistributedValues) else value
    if isinstance(v, tf.IndexedSlices):
      n = tf.size(v.values, out_type=tf.int64)
      lossless_elements += n
      lossless_bits += (n * v.values.dtype.size * 8
                        + tf.size(v.indices, out_type=tf.int64)
                        * v.indices.dtype.size * 8)
      continue
    v = tf.convert_to_tensor(v)
    n = tf.size(v, out_type=tf.int64)
    lossless_elements += n
    lossless_bits += n * v.dtype.size * 8
  return lossless_elements, lossless_bits
