"""What an exchange gets from the engine for one call: `ExchangeContext`.

An exchange (`base.Exchange.run`) builds its ops from its transport, the
codecs, the fusion plan and the local senders, plus a few things the engine
owns: the options, the step and the fingerprint of this call, the seeds,
the state stores (the nested senders' noise, the reduce-scatter's error
feedback) and the telemetry. `ExchangeContext` carries exactly those, built
by `ndq_tf.core.engine.ExchangeEngine.exchange` for every call; an exchange
never sees the engine.
"""

import dataclasses
from typing import Any, Optional, Tuple

import tensorflow as tf

from ndq_tf.core import fusion_codec
from ndq_tf.core import nested_state as nested_state_lib

__all__ = ["ExchangeContext"]


@dataclasses.dataclass(frozen=True)
class ExchangeContext:
  """The options, step, seeds, state stores and recorder of one exchange.

  Attributes:
    options: the `ndq_tf.distribute.CompressionOptions`.
    step: the step counter's value at this call (an `int32` tensor).
    fingerprint: the exchange's fingerprint (`fingerprint.fingerprint`),
      stamped on the payloads by the transports that check it.
    base_seed: `(options.seed, engine.SEED_TAG)`, the base of every seed.
    device: where the state and the telemetry live.
    telemetry: the engine's `telemetry.Telemetry`, which `record` assigns.
    nested_state: the `nested_state.NestedStateStore` of the nested
      senders' noise, or None without a nested group.
    feedback: the reduce-scatter's `feedback.FeedbackStore`, or None
      without `reduce_scatter_error_feedback`.
    mean: whether to divide the sum by `divisor`.
    divisor: what a mean divides by; None: the number of senders.
    lossless_elements: elements of the call's values that travel losslessly
      (`telemetry.lossless_size`), for the telemetry.
    lossless_bits: their bits.
  """

  options: Any
  step: Any
  fingerprint: int
  base_seed: Tuple[int, int]
  device: str
  telemetry: Any
  nested_state: Optional[Any] = None
  feedback: Optional[Any] = None
  mean: bool = False
  divisor: Optional[float] = None
  lossless_elements: Any = 0
  lossless_bits: Any = 0

  def seed(self, sender, step=None, segment=None):
    """The `[2]` `int32` seed of `sender`'s payload.

    Args:
      sender: the sender's index (or a reserved negative index, such as
        `sum.ROTATION_SENDER`).
      step: the step the sender encoded at (a receiver passes the one the
        transport reports); None: this call's `step`.
      segment: None: the payload's seed; an index: that codec segment's
        (`fusion_codec.segment_seed`, as `encode_flat` folds it).
    """
    return fusion_codec.derive_seed(
        tf.constant(self.base_seed, tf.int32),
        self.step if step is None else step, sender, segment)

  def finish(self, total, num_senders):
    """`total`, divided by the divisor (or `num_senders`) for a mean."""
    if self.mean:
      total = total / float(self.divisor or num_senders)
    return total

  def update_nested_state(self, variables, senders, statistics, plan):
    """Stores the local nested senders' noise state and their telemetry.

    Args:
      variables: the plan's `(scale, gain)` variables
        (`NestedStateStore.variables_for`), one row per local sender.
      senders: the local `LocalSender`s, in sender order.
      statistics: `{sender index: nested_state.sender_statistics}` of the
        local nested senders (reference senders have none).
      plan: the `FusionPlan`.
    """
    scale_variable, gain_variable = variables
    num_buckets = plan.total_size // plan.bucket_size
    target = float(self.options.codec.overload_target)
    with tf.device(self.device):
      scales = scale_variable.read_value()
      gains = gain_variable.read_value()
      rows = []
      for row, sender in enumerate(senders):
        if sender.index in statistics:
          rows.append(nested_state_lib.update(
              nested_state_lib.NoiseState(scales[row], gains[row]),
              statistics[sender.index], plan, target, self.options.adaptive))
        else:  # A reference sender: no noise of its own.
          rows.append(nested_state_lib.NoiseState(
              tf.fill([num_buckets], float("nan")), gains[row]))
      scale_variable.assign(tf.stack([r.scale for r in rows]))
      gain_variable.assign(tf.stack([r.gain for r in rows]))
      self.telemetry.record_nested(
          [{"num_buckets": num_buckets, **statistics[p]}  # Or a shard's.
           for p in sorted(statistics)])

  def record(self, exchange, num_senders, plan, local_senders, payload_bits,
             framing_bits, link_bits):
    """Assigns the telemetry of this exchange.

    Args:
      exchange: the exchange's name (`Exchange.name`), which the telemetry
        reports as `"transport"`.
      num_senders: senders of the exchange, all processes together.
      plan: the `FusionPlan` of the compressed values.
      local_senders: how many senders this process encodes.
      payload_bits: bits of the local senders' payloads.
      framing_bits: bits the transport adds to them (headers, padding).
      link_bits: the cost model's bits on the local senders' links for the
        compressed buffer; the lossless values add a float ring's.
    """
    ring = 2.0 * (num_senders - 1) / num_senders
    with tf.device(self.device):
      self.telemetry.record(
          transport=exchange,
          senders=num_senders,
          local_senders=local_senders,
          payload_bits=payload_bits,
          sent_bits=(payload_bits + framing_bits
                     + self.lossless_bits * local_senders),
          link_bits=(tf.constant(round(link_bits), tf.int64) + tf.cast(
              tf.round(tf.cast(self.lossless_bits, tf.float64) * ring
                       * local_senders), tf.int64)),
          compressed_elements=plan.num_elements,
          lossless_elements=self.lossless_elements)
