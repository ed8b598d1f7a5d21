"""All-to-all of framed shards, then an all-gather: the reduce-scatter transport.

The transport of `exchange="reduce_scatter"`
(`ndq_tf.core.exchanges.reduce_scatter`). Stage 1 (`scatter`): every sender
has cut its payload into one wire per shard, and receiver `j` gets shard
`j` of every sender, in sender order. Stage 2 (`gather`, a `Transport`):
every receiver's one payload (its encoded reduced shard) goes to every
receiver. Like the other transports it never looks inside a payload.

Two implementations:

* `CollectiveAllToAllTransport` (multi-worker): one `CollectiveAllToAllV2`
  (`tf_internals.all_to_all`) of a `[P, SCATTER_HEADER_WORDS + W]` `int32`
  array, row `j` for worker `j`: a header (magic, sender, shard, step,
  fingerprint) and the shard's wire, zero-padded to the longest shard
  wire `W` of the exchange. The received rows are put in sender order and
  checked as `CollectiveAllGatherTransport` checks its rows: a malformed
  header, a shard meant for another worker, steps or fingerprints that
  disagree stop the step with an error naming them. Stage 2 is a
  `CollectiveAllGatherTransport`.
* `DeviceAllToAllTransport` (`ndq_tf.MirroredStrategy`): device copies in
  one process, stage 2 a `DeviceCopyTransport`.

Variable-length shard wires (`scatter`'s `used`) take two all-to-alls: a
length round, in which every row carries the header and the words each of
the sender's shard wires uses (so every worker learns every sender's
lengths, checked as above); then rows of the longest used length `L`
over every sender and shard (a dynamic length, not the static worst
case), without a header; receiver `j` cuts sender `i`'s used words of
shard `j` and pads them with zeros back to their static length
(`base.restore`).

Cost per worker and step of stage 1: it sends `P - 1` rows of
`SCATTER_HEADER_WORDS + W` words (its own row stays); for variable-length
wires `P - 1` rows of `SCATTER_HEADER_WORDS + P` words, then `P - 1` of
`L`.
"""

import tensorflow as tf

from ndq_tf import _deprecation
from ndq_tf.core.transports import all_gather
from ndq_tf.core.transports import base
from ndq_tf.core.transports import device_copy

__all__ = [
    "SCATTER_HEADER_WORDS",
    "SCATTER_MAGIC",
    "CollectiveAllToAllTransport",
    "DeviceAllToAllTransport",
]

#: Header of every stage-1 row: magic, sender, shard, step, fingerprint.
SCATTER_HEADER_WORDS = 5
SCATTER_MAGIC = 0x4E445253  # "NDRS"


def _check_rows(local_rows, words, num_senders):
  for sender, _, wires in local_rows:
    if len(wires) != num_senders or len(words[sender]) != num_senders:
      raise ValueError(
          f"Every sender sends one wire per shard ({num_senders}). Received: "
          f"{len(wires)} wires and {len(words[sender])} lengths from sender "
          f"{sender}.")


class CollectiveAllToAllTransport:
  """Shards by one collective all-to-all; reduced shards by an all-gather.

  Args:
    all_to_all: a function `(int32 [P, k]) -> int32 [P, k]`, row `i` of the
      result from the worker of rank `i` (`tf_internals.all_to_all` bound to
      a `CollectiveReplicaLauncher` and its options).
    gather: the `CollectiveAllGatherTransport` of stage 2, over the same
      workers.
    num_workers: workers (senders and receivers) in the job.
    worker_id: this worker's index, `0 <= worker_id < num_workers`; it
      receives shard `worker_id`.
    device: this worker's exchange device.
    who: how the errors name the program (e.g. the strategy's class).
  """

  name = "collective_all_to_all"
  shared_memory = False

  def __init__(self, all_to_all, gather, num_workers, worker_id, device,
               who="ndq_tf.MultiWorkerMirroredStrategy"):
    self._all_to_all = all_to_all
    self.gather = gather
    self._num_workers = num_workers
    self._worker_id = base.check_worker_id(worker_id, num_workers)
    self._device = device
    self._who = who

  @property
  def num_senders(self):
    return self._num_workers

  def framing_bits(self, words, local_senders, lengths=None):
    """Stage 1's bits beyond the payloads: headers and padding, own row too.

    Args:
      words: `words[i][j]`, words of sender `i`'s wire of shard `j`.
      local_senders: the senders this process encodes.
      lengths: for variable-length wires, a `Reception`'s `lengths`
        (`[P, P]`, the words each sender's shard wires use): the length
        round and the padding to the longest, an `int64` tensor.
    """
    p = self._num_workers
    if lengths is not None:
      lengths = tf.cast(lengths, tf.int64)
      row = tf.reduce_max(lengths) + SCATTER_HEADER_WORDS + p
      return 32 * tf.add_n([p * row - tf.reduce_sum(lengths[k])
                            for k in local_senders])
    row = SCATTER_HEADER_WORDS + max(max(w) for w in words)
    return 32 * sum(p * row - sum(words[k]) for k in local_senders)

  def scatter(self, local_rows, words, step, fingerprint=0, used=None):
    """Hands shard `j` of every sender to receiver `j`.

    Args:
      local_rows: `(sender index, device, [wire of shard j for every j])`
        of every sender this process encodes.
      words: `words[i][j]`, the length of sender `i`'s wire of shard `j`,
        for every sender (for variable-length wires, the longest).
      step: the `int32` step of this exchange, stamped on every row.
      fingerprint: the exchange's `int32` fingerprint, stamped and checked.
      used: None for fixed-length wires; for variable-length ones, the
        words each local sender's shard wires use (a list of `P` `int32`
        scalars per entry of `local_rows`), as `Transport.exchange`'s
        `used`.

    Returns:
      A list of `base.Reception`, one per receiver of this process; its
      `local_sender` is the receiver's index, so the shard it holds. For
      variable-length wires its `lengths` is every sender's used words of
      every shard, `int32` `[P, P]` (sender, shard).
    """
    ((sender, _, wires),) = local_rows
    if sender != self._worker_id:
      raise ValueError(
          f"This worker sends as sender {self._worker_id}. Received: "
          f"{sender}.")
    _check_rows(local_rows, words, self._num_workers)
    if used is not None:
      return self._scatter_used(sender, wires, used[0], words, step,
                                fingerprint)
    p = self._num_workers
    width = max(max(w) for w in words)
    with tf.device(self._device):
      rows = []
      for j, wire in enumerate(wires):
        rows.append(tf.concat(
            [self._header(sender, j, step, fingerprint), wire,
             tf.zeros([width - words[sender][j]], tf.int32)], axis=0))
      received = self._all_to_all(tf.stack(rows, axis=0))
      received = tf.reshape(received, [p, SCATTER_HEADER_WORDS + width])
      # Sender order, whatever rank order the collective used.
      received = tf.gather(received,
                           tf.argsort(received[:, 1], stable=True))
      checks = self._check_headers(received)
      with tf.control_dependencies(checks):
        shard_wires = [
            received[i, SCATTER_HEADER_WORDS:
                     SCATTER_HEADER_WORDS + words[i][self._worker_id]]
            for i in range(p)]
      return [base.Reception(device=self._device, wires=shard_wires,
                             steps=received[:, 3],
                             local_sender=self._worker_id, checks=checks)]

  def _header(self, sender, shard, step, fingerprint):
    """A row's `SCATTER_HEADER_WORDS`: magic, sender, shard, step, print."""
    return tf.stack([
        tf.constant(SCATTER_MAGIC, tf.int32), tf.constant(sender, tf.int32),
        tf.constant(shard, tf.int32), tf.cast(step, tf.int32),
        tf.constant(fingerprint, tf.int32)])

  def _scatter_used(self, sender, wires, used, words, step, fingerprint):
    """The two rounds of variable-length shard wires (the module's doc)."""
    p, me = self._num_workers, self._worker_id
    with tf.device(self._device):
      used = tf.stack([tf.cast(u, tf.int32) for u in used])
      # Every row carries all of this sender's lengths: every worker learns
      # every sender's, so the longest of all.
      heads = tf.stack([tf.concat([self._header(sender, j, step,
                                                fingerprint), used], 0)
                        for j in range(p)])
      heads = tf.reshape(self._all_to_all(heads),
                         [p, SCATTER_HEADER_WORDS + p])
      # Sender order; the second round's rows come in the same order.
      order = tf.argsort(heads[:, 1], stable=True)
      heads = tf.gather(heads, order)
      lengths = heads[:, SCATTER_HEADER_WORDS:]
      mine = [w[me] for w in words]
      checks = self._check_headers(
          heads, tf.reduce_all(tf.logical_and(
              tf.greater_equal(lengths, 0),
              tf.less_equal(lengths, tf.constant(words, tf.int32)))))
      longest = tf.reduce_max(lengths)
      rows = tf.stack([tf.pad(w[:used[j]], [[0, longest - used[j]]])
                       for j, w in enumerate(wires)])
      received = tf.gather(
          tf.reshape(self._all_to_all(rows), [p, longest]), order)
      shard_wires = [base.restore(received[i, :lengths[i, me]], mine[i])
                     for i in range(p)]
      return [base.Reception(device=self._device, wires=shard_wires,
                             steps=heads[:, 3], local_sender=me,
                             checks=checks, lengths=lengths)]

  def _check_headers(self, rows, lengths_ok=True):
    magic, senders, shards, steps, prints = (rows[:, i] for i in range(5))
    p = self._num_workers
    well_formed = tf.reduce_all(tf.stack([
        tf.reduce_all(tf.equal(magic, SCATTER_MAGIC)),
        tf.reduce_all(tf.equal(senders, tf.range(p, dtype=tf.int32))),
        tf.reduce_all(tf.equal(shards, self._worker_id)),
        # Variable-length wires: each uses at most its static words.
        tf.convert_to_tensor(lengths_ok),
    ]))
    header_ok = tf.debugging.Assert(well_formed, [
        f"{self._who}: malformed reduce-scatter shard at worker "
        f"{self._worker_id}; every worker must run the same program with "
        "the same codec and model. (magic, sender, shard, step, "
        "fingerprint) per sender:", rows[:, :SCATTER_HEADER_WORDS]],
                                    summarize=SCATTER_HEADER_WORDS * p)
    return [header_ok] + all_gather.stamp_checks(self._who, senders, steps,
                                                 prints)


class DeviceAllToAllTransport:
  """The reduce-scatter transport of replicas in one process: device copies.

  Receiver `j` (replica `j`'s device) gets a copy of every replica's wire
  of shard `j`; stage 2 is a `DeviceCopyTransport`. On the host's CPU
  devices nothing moves (`shared_memory`): the engine then decodes the
  reduced shards once for every replica.

  Args:
    devices: the replicas' devices, in sender order.
  """

  name = "device_all_to_all"

  def __init__(self, devices):
    self._devices = tuple(devices)
    self.shared_memory = base.shares_memory(self._devices)
    self.gather = device_copy.DeviceCopyTransport(self._devices)

  @property
  def num_senders(self):
    return len(self._devices)

  def framing_bits(self, words, local_senders, lengths=None):
    del words, local_senders, lengths  # Nothing framed inside one process.
    return 0

  def scatter(self, local_rows, words, step, fingerprint=0, used=None):
    """As `CollectiveAllToAllTransport.scatter`, every sender local.

    Of a variable-length wire only its used words cross devices (not in
    one shared memory), zero-padded back on the receiver.
    """
    del step, fingerprint  # One process, one counter, one options object.
    order = sorted(range(len(local_rows)), key=lambda i: local_rows[i][0])
    rows = [local_rows[i][2] for i in order]
    if len(rows) != len(self._devices):
      raise ValueError(
          f"Every replica sends its shards. Received: {len(rows)} senders "
          f"for {len(self._devices)} replicas.")
    _check_rows(local_rows, words, len(self._devices))
    lengths = None
    if used is not None:
      used = [used[i] for i in order]
      with tf.device(self._devices[0]):
        lengths = tf.stack([tf.stack([tf.cast(u, tf.int32) for u in mine])
                            for mine in used])
      if not self.shared_memory:  # Only the used words cross devices.
        moved = []
        for i, mine in zip(order, used):
          with tf.device(local_rows[i][1]):
            moved.append([w[:u] for w, u in zip(local_rows[i][2], mine)])
        rows = moved
    receptions = []
    for j, device in enumerate(self._devices):
      with tf.device(device):
        if lengths is None or self.shared_memory:
          got = [tf.identity(w[j]) for w in rows]
        else:
          got = [base.restore(tf.identity(w[j]), words[i][j])
                 for i, w in enumerate(rows)]
        receptions.append(base.Reception(
            device=device, wires=got, steps=None, local_sender=j, checks=[],
            lengths=lengths))
    return receptions


# Renamed for what it moves (deprecated name, one release).
__getattr__ = _deprecation.moved_attributes(__name__, {
    "AllToAllTransport": f"{__name__}.CollectiveAllToAllTransport"})
