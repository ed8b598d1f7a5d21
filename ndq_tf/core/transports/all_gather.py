"""One collective all-gather of framed payloads: the multi-worker transport.

Every worker is one sender. Its payload is framed by a 5-word header
(magic, sender, step, payload words, fingerprint) and zero-padded to the
longest payload of the exchange (one all-gather moves rows of one length);
rows are put back in sender order whatever order the collective delivered
them in, and checked: a malformed header, senders whose steps disagree
(restored from different checkpoints, say), or whose fingerprints
(`ndq_tf.core.fingerprint`: options, fusion plan, exchange kind)
disagree, stop the step with an error naming them rather than decode with
the wrong dither or codec.

Variable-length payloads (`used`) take two rounds: the headers alone,
which carry each payload's used words and are checked as above; then
every worker pads its used words to the longest sender's, `L` (a dynamic
length, not the static worst case), the rows of `L` words are
all-gathered, and each receiver cuts sender `k`'s used words and pads
them with zeros back to the static length (`base.restore`).

Cost per worker and step: it receives `(P - 1)` rows of
`HEADER_WORDS + max(words)` words; for variable-length payloads `(P - 1)`
headers and `(P - 1)` rows of `L` words.
"""

import tensorflow as tf

from ndq_tf import _deprecation
from ndq_tf.core.transports import base

__all__ = [
    "HEADER_WORDS",
    "MAGIC",
    "CollectiveAllGatherTransport",
    "stamp_checks",
]

#: Header of every row: magic, sender, step, payload words, fingerprint.
HEADER_WORDS = 5
MAGIC = 0x4E445131  # "NDQ1"


class CollectiveAllGatherTransport(base.Transport):
  """All-gathers one framed `int32` row per worker.

  Args:
    all_gather: a function `(1-D int32 tensor) -> concatenation of every
      worker's tensor along axis 0` (e.g. a bound
      `CollectiveReplicaLauncher` all-gather with its options).
    num_workers: workers (senders) in the job.
    worker_id: this worker's index, `0 <= worker_id < num_workers`.
    device: this worker's exchange device (where it encodes and decodes).
    who: how the errors name the program (e.g. the strategy's class).
  """

  name = "collective_all_gather"

  def __init__(self, all_gather, num_workers, worker_id, device,
               who="ndq_tf.MultiWorkerMirroredStrategy"):
    self._all_gather = all_gather
    self._num_workers = num_workers
    self._worker_id = base.check_worker_id(worker_id, num_workers)
    self._device = device
    self._who = who

  @property
  def num_senders(self):
    return self._num_workers

  def framing_bits(self, words, local_senders, lengths=None):
    """The header and the padding to the longest payload, per local sender.

    For variable-length payloads (`lengths`, every sender's used words):
    the length round's header and the padding to the longest used length,
    an `int64` tensor.
    """
    if lengths is None:
      return 32 * sum(HEADER_WORDS + max(words) - words[k]
                      for k in local_senders)
    lengths = tf.cast(lengths, tf.int64)
    longest = tf.reduce_max(lengths)
    return 32 * tf.add_n([HEADER_WORDS + longest - lengths[k]
                          for k in local_senders])

  def exchange(self, local_wires, words, step, fingerprint=0, used=None):
    ((sender, _, wire),) = local_wires
    if sender != self._worker_id:
      raise ValueError(
          f"This worker sends as sender {self._worker_id}. Received: "
          f"{sender}.")
    if used is not None:
      return self._exchange_used(sender, wire, used[0], words, step,
                                 fingerprint)
    row_words = max(words)
    with tf.device(self._device):
      header = self._header(sender, step, words[sender], fingerprint)
      row = tf.concat([header, wire, tf.zeros([row_words - words[sender]],
                                              tf.int32)], axis=0)
      gathered = self._all_gather(row)
      rows = tf.reshape(gathered,
                        [self._num_workers, HEADER_WORDS + row_words])
      # Sender order, whatever order the collective delivered.
      rows = tf.gather(rows, tf.argsort(rows[:, 1], stable=True))
      checks = self._check_headers(rows, words)
      # Not gated here: the exchange makes what it decodes wait for the
      # checks (`Reception`).
      wires = [rows[k, HEADER_WORDS:HEADER_WORDS + words[k]]
               for k in range(self._num_workers)]
      return [base.Reception(device=self._device, wires=wires,
                             steps=rows[:, 2], local_sender=sender,
                             checks=checks)]

  def _header(self, sender, step, length, fingerprint):
    """A row's `HEADER_WORDS`: magic, sender, step, length, fingerprint."""
    return tf.stack([
        tf.constant(MAGIC, tf.int32), tf.constant(sender, tf.int32),
        tf.cast(step, tf.int32), tf.cast(length, tf.int32),
        tf.constant(fingerprint, tf.int32)])

  def _exchange_used(self, sender, wire, used, words, step, fingerprint):
    """The two rounds of a variable-length payload (the module's doc)."""
    p = self._num_workers
    with tf.device(self._device):
      used = tf.cast(used, tf.int32)
      header = self._header(sender, step, used, fingerprint)
      headers = tf.reshape(self._all_gather(header), [p, HEADER_WORDS])
      # Sender order, whatever order the collective delivered; the second
      # round's rows come in the same order (same group, same ranks).
      order = tf.argsort(headers[:, 1], stable=True)
      headers = tf.gather(headers, order)
      lengths = headers[:, 3]
      checks = self._check_headers(headers, words, variable=True)
      # The longest used length: every worker's rows have the same shape
      # (the check above runs beside it; a bad length fails the pad).
      longest = tf.reduce_max(lengths)
      row = tf.pad(wire[:used], [[0, longest - used]])
      rows = tf.gather(tf.reshape(self._all_gather(row), [p, longest]),
                       order)
      wires = [base.restore(rows[k, :lengths[k]], words[k])
               for k in range(p)]
      return [base.Reception(device=self._device, wires=wires,
                             steps=headers[:, 2], local_sender=sender,
                             checks=checks, lengths=lengths)]

  def _check_headers(self, rows, words, variable=False):
    magic, senders, steps, lengths, prints = (rows[:, i] for i in range(5))
    words = tf.constant(words, tf.int32)
    well_formed = tf.reduce_all(tf.stack([
        tf.reduce_all(tf.equal(magic, MAGIC)),
        tf.reduce_all(tf.equal(
            senders, tf.range(self._num_workers, dtype=tf.int32))),
        # A variable-length payload uses at most its static words.
        tf.reduce_all(tf.logical_and(tf.greater_equal(lengths, 0),
                                     tf.less_equal(lengths, words))
                      if variable else tf.equal(lengths, words)),
    ]))
    header_ok = tf.debugging.Assert(well_formed, [
        f"{self._who}: malformed compressed payload; every worker must run "
        "the same program with the same codec and model. (magic, sender, "
        "step, words, fingerprint) per worker:", rows[:, :HEADER_WORDS]],
                                    summarize=HEADER_WORDS * self._num_workers)
    return [header_ok] + stamp_checks(self._who, senders, steps, prints)


def stamp_checks(who, senders, steps, prints):
  """Asserts that every sender stamped the same step and fingerprint.

  Args:
    who: how the errors name the program.
    senders, steps, prints: `int32` `[P]`: each row's sender, step and
      fingerprint.

  Returns:
    The two assert ops; each error names a worker of the smallest and one
    of the largest value.
  """
  low = tf.argmin(steps, output_type=tf.int32)
  high = tf.argmax(steps, output_type=tf.int32)
  steps_ok = tf.debugging.Assert(
      tf.equal(steps[low], steps[high]),
      [f"{who}: workers disagree on the compression step, so their "
       "dither seeds differ and decoding would be silently wrong: worker",
       senders[low], "sent step", steps[low], "but worker", senders[high],
       "sent step", steps[high], ". Restore every worker from the same "
       "checkpoint (the step variable is `strategy.compression_step`)."])
  low = tf.argmin(prints, output_type=tf.int32)
  high = tf.argmax(prints, output_type=tf.int32)
  prints_ok = tf.debugging.Assert(
      tf.equal(prints[low], prints[high]),
      [f"{who}: workers disagree on what they exchange (the "
       "fingerprint of their compression options, fusion plan and "
       "exchange kind), so each would decode the others' payloads "
       "wrongly: worker", senders[low], "sent fingerprint", prints[low],
       "but worker", senders[high], "sent", prints[high], ". Every worker "
       "must run the same program, with the same options and model."])
  return [steps_ok, prints_ok]


# Renamed for what it moves (deprecated name, one release).
__getattr__ = _deprecation.moved_attributes(__name__, {
    "AllGatherTransport": f"{__name__}.CollectiveAllGatherTransport"})
