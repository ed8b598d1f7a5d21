"""One collective all-reduce per tensor: the multi-worker summing transport.

Every worker is one sender. Its tensor is all-reduced with TF's own
`CollectiveReduceV2` (a ring on CPUs, NCCL on GPUs): `Add` for integer
lanes of codes (exact in any order) and float16/float32 values (bfloat16
ones as float32: NCCL takes no bfloat16), `Max` for the per-bucket scales. A NaN scale is sent as +Inf (NCCL's max need not
propagate NaN; +Inf decodes to NaN all the same).

No headers travel: an all-reduce cannot tell senders apart. The step each
worker encodes at, and the exchange's fingerprint
(`ndq_tf.core.fingerprint`: options, fusion plan, exchange kind), are
stamped instead on the scales' `Max` as `STAMP_WORDS` floats (the step's
low 24 and high bits, the fingerprint's two 16-bit halves, and their
negatives: the max of `-s` is minus the smallest `s`); workers whose steps
or fingerprints disagree stop with an error giving the largest and the
smallest rather than decode with the wrong dither or codec.

Cost per worker and step: a ring all-reduce sends `2(P - 1)/P` times the
tensor (`ndq_tf.core.cost_model.exchange_bits`).
"""

import tensorflow as tf

from ndq_tf.core.transports import base

__all__ = [
    "STAMP_WORDS",
    "CollectiveSumTransport",
]

#: Float32 words stamped on the `Max` of the scales: low and high parts of
#: the step, the fingerprint's two 16-bit halves, and their negatives.
STAMP_WORDS = 8
_STAMP = STAMP_WORDS // 2
_LOW_BITS = 24  # float32 holds integers below 2**24 exactly
_MERGE_OPS = ("Add", "Max")


class CollectiveSumTransport(base.SummingTransport):
  """All-reduces one tensor per worker with TF's collectives.

  Args:
    all_reduce: a function `(tensor, merge_op) -> the all-reduced tensor`
      (e.g. `tf_internals.all_reduce` bound to a `CollectiveReplicaLauncher`
      and its options).
    num_workers: workers (senders) in the job.
    worker_id: this worker's index, `0 <= worker_id < num_workers`.
    device: this worker's exchange device.
    who: how the errors name the program (e.g. the strategy's class).
  """

  name = "collective_sum"

  def __init__(self, all_reduce, num_workers, worker_id, device,
               who="ndq_tf.MultiWorkerMirroredStrategy"):
    self._all_reduce = all_reduce
    self._num_workers = num_workers
    self._worker_id = base.check_worker_id(worker_id, num_workers)
    self._device = device
    self._who = who

  @property
  def num_senders(self):
    return self._num_workers

  def framing_bits(self, step_checked):
    return 32 * STAMP_WORDS if step_checked else 0

  def all_reduce(self, local_values, merge_op, step=None, fingerprint=0):
    if merge_op not in _MERGE_OPS:
      raise ValueError(
          f"`merge_op` must be one of {_MERGE_OPS}. Received: "
          f"merge_op={merge_op!r}.")
    ((sender, _, value),) = local_values
    if sender != self._worker_id:
      raise ValueError(
          f"This worker sends as sender {self._worker_id}. Received: "
          f"{sender}.")
    checks = []
    with tf.device(self._device):
      if merge_op == "Max":
        if value.dtype != tf.float32:
          raise ValueError(
              f"`Max` reduces float32 scales. Received: a tensor of dtype "
              f"{value.dtype.name}.")
        value = tf.where(tf.math.is_nan(value),
                         tf.constant(float("inf"), tf.float32), value)
      elif step is not None:
        raise ValueError("Only the `Max` of the scales carries the step.")
      if step is None:
        return [base.Reduction(self._device, self._all_reduce(value, merge_op),
                               sender, [])]
      n = value.shape[0]
      unsigned = fingerprint & 0xFFFFFFFF  # Two halves, exact in float32.
      stamp = tf.concat([_stamp(step), tf.constant(
          [unsigned & 0xFFFF, unsigned >> 16], tf.float32)], 0)
      reduced = self._all_reduce(tf.concat([value, stamp, -stamp], 0), "Max")
      largest = reduced[n:n + _STAMP]
      smallest = -reduced[n + _STAMP:]
      checks.append(tf.debugging.Assert(
          tf.reduce_all(tf.equal(largest[2:], smallest[2:])),
          [f"{self._who}: workers disagree on what they exchange (the "
           "fingerprint of their compression options, fusion plan and "
           "exchange kind), so the codes they sum would be decoded wrongly: "
           "the fingerprints reduce to", _unstamp(largest[2:], 16),
           "(the largest of each 16-bit half) and", _unstamp(smallest[2:], 16),
           "(the smallest). Every worker must run the same program, with the "
           "same options and model."]))
      checks.append(tf.debugging.Assert(
          tf.reduce_all(tf.equal(largest[:2], smallest[:2])),
          [f"{self._who}: workers disagree on the compression step, so "
           "their dither seeds differ and decoding would be silently wrong: "
           "the largest step is", _unstamp(largest[:2]), "and the smallest",
           _unstamp(smallest[:2]), ". Restore every worker from the same "
           "checkpoint (the step variable is `strategy.compression_step`)."]))
      with tf.control_dependencies(checks):
        value = tf.identity(reduced[:n])
      return [base.Reduction(self._device, value, sender, checks)]


def _stamp(step):
  """The step as two float32 integers (exact): low 24 bits, the rest."""
  step = tf.cast(step, tf.int32)
  low = tf.bitwise.bitwise_and(step, (1 << _LOW_BITS) - 1)
  high = tf.bitwise.right_shift(step, _LOW_BITS)
  return tf.cast(tf.stack([low, high]), tf.float32)


def _unstamp(stamp, low_bits=_LOW_BITS):
  parts = tf.cast(stamp, tf.int64)
  return parts[0] + tf.bitwise.left_shift(parts[1], low_bits)
