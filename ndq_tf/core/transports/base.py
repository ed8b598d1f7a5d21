"""What a transport does for an exchange (`ndq_tf.core.exchanges`).

A transport moves packed payloads, or sums tensors, between the senders and
the receivers of an exchange; it knows no codecs and never looks inside a
payload. Each is named for what it moves and how (`name`):

* `"device_copy"`, `"device_sum"`, `"device_all_to_all"`: replicas of one
  process (`ndq_tf.MirroredStrategy`), by device copies and one sum;
* `"collective_all_gather"`, `"collective_sum"`,
  `"collective_all_to_all"`: one sender per worker
  (`ndq_tf.MultiWorkerMirroredStrategy`), by TF's collectives.

An exchange (an algorithm: `"all_gather"`, `"all_reduce"`,
`"reduce_scatter"`) picks its transport by its own name; the telemetry
reports the exchange's name, never the transport's.
"""

import abc
import collections

import tensorflow as tf

__all__ = [
    "check_worker_id",
    "restore",
    "shares_memory",
    "Reception",
    "Reduction",
    "SummingTransport",
    "Transport",
]

#: What one receiver of this process got: its `device`, every sender's
#: payload in sender order (`wires`), the step each sender stamped on its
#: payload (`steps`, a list or an `int32` tensor; None when every sender
#: shares this process's counter), the index of the sender on the same
#: device (`local_sender`, None if none) and ops that must run before
#: anything decoded from the payloads is used (`checks`; the exchange adds
#: the dependency, so a chunk can decode before an earlier chunk's checks,
#: which TF runs in program order, have run). For variable-length payloads
#: (`Transport.exchange`'s `used`), `lengths` is the words every sender's
#: payload uses, in sender order (an `int32` `[P]` tensor; `[P, P]`, sender
#: and shard, from a reduce-scatter's `scatter`; None otherwise).
Reception = collections.namedtuple(
    "Reception", ["device", "wires", "steps", "local_sender", "checks",
                  "lengths"], defaults=(None,))


#: What one receiver of this process got from an all-reduce: its `device`,
#: the reduced tensor (`value`), the index of the sender on the same device
#: (`local_sender`, None if none) and ops that must run before the value is
#: used (`checks`).
Reduction = collections.namedtuple(
    "Reduction", ["device", "value", "local_sender", "checks"])


class Transport(abc.ABC):
  """Moves every sender's `int32` payload to every receiver.

  Subclasses know how many senders the exchange has and where the
  receivers of this process are; they never look inside a payload.
  """

  #: What it moves and how (`"device_copy"`, ...), for logs and errors; the
  #: telemetry reports the exchange's name instead.
  name = None

  #: Whether every receiver of this process reads the same memory (replicas
  #: on the host's CPU devices): the engine then decodes each payload once
  #: and gives every receiver the same sum (`shares_memory`).
  shared_memory = False

  @property
  @abc.abstractmethod
  def num_senders(self):
    """Senders of the exchange, all processes together."""

  @abc.abstractmethod
  def exchange(self, local_wires, words, step, fingerprint=0, used=None):
    """Moves the local senders' payloads; returns a list of `Reception`.

    Args:
      local_wires: `(sender index, device, 1-D int32 payload)` of every
        sender this process encodes.
      words: the payload length (`int32` words) of every sender, in sender
        order: the receivers cut the payloads by it (for variable-length
        payloads, the longest a payload can be).
      step: the `int32` step of this exchange (a transport that frames its
        payloads stamps it on them).
      fingerprint: the exchange's `int32` fingerprint
        (`ndq_tf.core.fingerprint`); a transport whose senders live
        in other processes stamps it on the payloads and checks that every
        sender sent the same, in the `checks` of its result.
      used: None for fixed-length payloads. For variable-length ones, the
        words each of `local_wires`' payloads uses (`int32` scalars, in the
        same order): a payload's words after them are zeros, which the
        transport need not move; every receiver gets the payloads back at
        their `words` (`restore`), and the `lengths` of every sender in
        its `Reception`.
    """

  def framing_bits(self, words, local_senders, lengths=None):
    """Bits this process sends beyond its senders' payloads (headers, padding).

    Args:
      words: payload words of every sender.
      local_senders: indices of the senders this process encodes.
      lengths: for variable-length payloads, the words every sender's
        payload used (a `Reception`'s `lengths`); the payloads are then
        counted by these, and the bits may be a tensor.
    """
    del words, local_senders, lengths
    return 0


class SummingTransport(abc.ABC):
  """All-reduces one tensor per sender: every receiver gets their sum or max.

  The transport of codecs whose payloads add up (`ndq_tf.theory.summed_form`):
  integer lanes of codes, summed exactly, after a MAX of the per-bucket
  scales; or float16/float32 values through a float ring (bfloat16 values
  travel as float32: TF's NCCL all-reduce takes no bfloat16). It knows
  nothing of codecs either.
  """

  #: What it sums and how (`"device_sum"`, `"collective_sum"`).
  name = None

  #: As for `Transport.shared_memory`: the engine decodes the sum once.
  shared_memory = False

  @property
  @abc.abstractmethod
  def num_senders(self):
    """Senders of the exchange, all processes together."""

  @abc.abstractmethod
  def all_reduce(self, local_values, merge_op, step=None, fingerprint=0):
    """Sums (or maxes) the local senders' tensors with everyone else's.

    Args:
      local_values: `(sender index, device, tensor)` of every sender this
        process holds; the tensors have one shape and dtype on every
        sender: integers (`int32`, `int64`) or `float16`/`float32` for
        `"Add"`, `float32` for `"Max"`.
      merge_op: `"Add"` or `"Max"`.
      step: the `int32` step of this exchange, or None. A transport whose
        senders live in other processes then checks that every sender is at
        the same step (their seeds, so their dithers, depend on it), with
        an error naming the steps, in the `checks` of its result.
      fingerprint: with `step`, the exchange's fingerprint, checked alike.

    Returns:
      A list of `Reduction`, one per receiver of this process.
    """

  def framing_bits(self, step_checked):
    """Bits each local sender sends beyond its tensors (step and fingerprint stamps).

    Args:
      step_checked: whether the reduction carried the step.
    """
    del step_checked
    return 0


def restore(prefix, words):
  """A variable-length payload's used `prefix`, zero-padded to `words`.

  The wire the sender encoded, with its static length (the decode needs
  it), from the words that travelled.
  """
  padded = tf.pad(prefix, [[0, words - tf.shape(prefix)[0]]])
  return tf.reshape(padded, [words])


def shares_memory(devices):
  """Whether `devices` are all CPU devices of one task (one host memory).

  Replicas on such devices exchange nothing that moves: a "copy" between
  them hands over the same buffer. Any other device (a GPU), or devices of
  several tasks, do not share memory.
  """
  specs = [tf.DeviceSpec.from_string(d) for d in devices]
  return bool(specs) and all(
      (s.device_type or "").upper() == "CPU"
      and (s.job, s.replica, s.task) == (specs[0].job, specs[0].replica,
                                         specs[0].task)
      for s in specs)


def check_worker_id(worker_id, num_workers):
  """`worker_id`, if in `[0, num_workers)`; else a ValueError naming it."""
  if not 0 <= worker_id < num_workers:
    raise ValueError(
        f"`worker_id` must be in [0, {num_workers}). Received: "
        f"worker_id={worker_id!r}.")
  return worker_id
