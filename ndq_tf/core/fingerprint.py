"""What every sender must agree on: the wire fingerprint and the options check.

A receiver decodes every sender's payload with its *own* options: codec and
its config, reference codec and group, adaptive mode, seed, `min_elements`,
`chunk_elements`, and with its own fusion plan and exchange kind. A sender
that differs in any of them would be decoded as garbage without a word, or
caught only by TF's generic "Shape mismatch in the collective instance"
when sizes differ. Two guards stop that, each with an error on every
worker:

* `check_agreement`, once when a multi-worker strategy is built: two small
  all-gathers of fixed shape (the length of each worker's options config,
  then the configs padded to the longest), compared in Python, so that the
  error names the setting at fault and every worker's value. Fixed shapes:
  a mismatch in sizes cannot crash in TF's shape check before the
  comparison. A worker that finds a mismatch waits for one more all-gather
  before it raises: none can finish it before every worker has read the
  configs, so no worker exits (closing its sockets) while a peer still
  reads its row, which would end that peer with "Socket closed" instead of
  the error.
* `fingerprint`, on every exchange: one 32-bit hash of the options' full
  config (`CompressionOptions.get_config()`, so that codec options added
  later are covered without a change here), an entropy coder's step ratio
  and table digest (`coding_tables`), the fusion plan's signature and the
  exchange kind. The all-gather carries it in every row's header,
  the integer all-reduce on the MAX of the scales beside the step
  (`transports`); senders whose fingerprints differ stop the step, naming
  them. It catches what the options check cannot (another model, hence
  another plan, of the same size) and covers exchanges built without the
  strategy (`MultiWorkerCompressedAllReduce` on its own).

Both also carry `decoded_bits` (`decode_digest`): a digest of what this
process's TensorFlow decodes from fixed payloads with the options' codecs.
Two TensorFlow versions can decode the same payload to other bits (XLA in
TF 2.22 compiled a division as a multiplication by the reciprocal, which
moved NDQSG's decode by an ulp), and the workers' replicas would then drift
apart silently; workers whose TensorFlows decode alike (2.19 and 2.21, say)
still work together. It costs one small decode per codec and process,
compiled once (`decode_digest`).

Cost: docs/scaling.md ("What every exchange carries").
"""

import hashlib
import json

import keras
import numpy as np
import tensorflow as tf

from ndq_tf.codecs import base as codec_base
from ndq_tf.ops import packing_ops

__all__ = [
    "CONFIG_MAGIC",
    "SETTLE_SECONDS",
    "agreed_config",
    "check_agreement",
    "coding_tables",
    "config_words",
    "decode_digest",
    "describe_differences",
    "fingerprint",
]

#: First word of the options check's length row ("NDQC").
CONFIG_MAGIC = 0x4E445143


def _canonical(config):
  return json.dumps(config, sort_keys=True, separators=(",", ":"))


# -- What this TensorFlow decodes ---------------------------------------------

#: `{canonical codec config: its decode_digest}`, per process.
_DIGESTS = {}


def _codec_digest(codec):
  """Digest of `codec`'s decodes of fixed payloads (2 buckets), on the CPU.

  The payloads are made without float arithmetic (NumPy's generator, integer
  packing), so they are the same on every version; only the decode's bits
  can differ. Decoded like the exchanges decode: `decode` (side information
  for a nested codec) and, for codes that add up, `decode_symbol_sum` of two
  senders.
  """
  alphabet = getattr(codec, "alphabet_size", None)
  if not alphabet:
    # Float codecs: a bitcast and a cast, no arithmetic to differ.
    return type(codec).__name__
  rng = np.random.default_rng(20190402)
  n = 2 * codec.bucket_size
  if getattr(codec, "variable_length", False):
    # An entropy-coded payload has no fixed form to make without its
    # coder: the codec encodes small integers, whose rotation and scale
    # are exact, and the digest covers that encode too (workers whose
    # TensorFlows encode otherwise are stopped as well).
    x = tf.constant(rng.integers(-64, 65, n).astype(np.float32))
    seed = tf.constant([5, 7], tf.int32)
    digest = hashlib.blake2b(digest_size=4)
    payload = codec.encode(x, seed)
    digest.update(payload.words.numpy().tobytes())
    digest.update(codec.decode(payload, seed).numpy().tobytes())
    return digest.hexdigest()
  scales = tf.constant(
      (rng.uniform(0.5, 1.0, 2) * 2.0 ** rng.integers(-20, 6, 2)).astype(
          np.float32))
  seed = tf.constant([5, 7], tf.int32)
  symbols = tf.constant(rng.integers(0, alphabet, n), tf.int32)
  payload = codec_base.Payload(
      words=packing_ops.pack_codes(symbols, alphabet), scales=scales,
      shape=tf.TensorShape([n]), dtype=tf.float32)
  side = {}
  if codec.needs_side_information:
    side["side_information"] = tf.constant(
        rng.standard_normal(n).astype(np.float32) * scales.numpy()[0])
  digest = hashlib.blake2b(digest_size=4)
  digest.update(codec.decode(payload, seed, **side).numpy().tobytes())
  if codec.summed_form() == "codes":
    rotation = {"rotation_seed": seed} if codec.rotation else {}
    total = codec.decode_symbol_sum(
        tf.constant(rng.integers(0, 2 * alphabet - 1, n), tf.int32), scales,
        tf.constant([[5, 7], [9, 11]], tf.int32), **rotation)
    digest.update(total.numpy().tobytes())
  return digest.hexdigest()


def decode_digest(options):
  """What this TensorFlow decodes with `options`' codecs, as hex digits.

  One digest per codec (`codec`, and `reference_codec` for a nested
  codec), computed once per process and codec config (one small decode,
  compiled with XLA like every decode), on the CPU, outside any graph being
  traced. Workers whose digests differ would decode the same payloads to
  other bits.

  Args:
    options: the `CompressionOptions`.

  Returns:
    A string, e.g. `"3f0c9a12"` or `"3f0c9a12,77e1d0b4"`.
  """
  codecs = [options.codec]
  if options.low_rank is not None:  # `ndq_tf.PowerSGD`: its two codecs.
    codecs = [options.low_rank.fallback_codec, options.low_rank.factor_codec]
  if options.nested:
    codecs.append(options.reference_codec)
  parts = []
  for codec in codecs:
    key = _canonical(keras.saving.serialize_keras_object(codec))
    if key not in _DIGESTS:
      with tf.init_scope(), tf.device("/cpu:0"):
        _DIGESTS[key] = _codec_digest(codec)
    parts.append(_DIGESTS[key])
  return ",".join(parts)


def agreed_config(options):
  """What the options check compares: the options, and the decode's bits.

  `tensorflow` is not compared (versions that decode alike work together);
  the error names it when `decoded_bits` differ.
  """
  return dict(options.get_config(), decoded_bits=decode_digest(options),
              tensorflow=tf.__version__)


def fingerprint(options, plan_signature, kind, decoded_bits=True):
  """The 32-bit fingerprint of an exchange, as a signed `int32` Python int.

  Args:
    options: the `CompressionOptions`.
    plan_signature: the fusion plan's `signature`.
    kind: the exchange kind, `"all_gather"` or `"all_reduce"`.
    decoded_bits: whether it covers `decode_digest(options)`: needed when
      senders run in other processes (perhaps another TensorFlow); one
      process need not pay for the digest's decodes.
  """
  config = {"options": options.get_config(), "plan": plan_signature,
            "kind": kind}
  tables = coding_tables(options)
  if tables:  # Only then: the other fingerprints stay as they were.
    config["tables"] = tables
  if decoded_bits:
    config["decoded_bits"] = decode_digest(options)
  text = _canonical(config)
  value = int.from_bytes(
      hashlib.blake2b(text.encode(), digest_size=4).digest(), "little")
  return value - (1 << 32) if value >= 1 << 31 else value


def coding_tables(options):
  """What the options' entropy coders code with, beyond their configs.

  An entropy-coded codec (`table_digest`) codes with an integer table
  derived from its step ratio, which `bits=` maps through a float formula
  (`theory.ecdq_step_ratio`): the fingerprint covers the ratio (its exact
  float) and the table's SHA-256, so that workers whose tables differ stop
  rather than decode each other's streams as garbage. `[]` without one.
  """
  codecs = [options.codec]
  if options.low_rank is not None:
    codecs = [options.low_rank.fallback_codec, options.low_rank.factor_codec]
  if options.nested:
    codecs.append(options.reference_codec)
  return [[float(c.step_ratio).hex(), c.table_digest()] for c in codecs
          if callable(getattr(c, "table_digest", None))]


def config_words(options):
  """`agreed_config(options)` as `int32` words (UTF-8 JSON, zero-padded)."""
  data = _canonical(agreed_config(options)).encode()
  data += b"\0" * (-len(data) % 4)
  return np.frombuffer(data, dtype="<i4").astype(np.int32)


def _decode_words(words, length):
  data = np.asarray(words, dtype="<i4").tobytes()[:length]
  return json.loads(data.decode())


def _flatten(config, prefix=""):
  """`{dotted name: value}` of a config; codecs by class and their config."""
  out = {}
  for key, value in config.items():
    if isinstance(value, dict) and "class_name" in value:
      # A Keras-serialized object: `codec` names its class,
      # `codec.num_levels` an entry of its config.
      out[prefix + key] = value["class_name"]
      out.update(_flatten(value.get("config") or {}, prefix + key + "."))
    elif isinstance(value, dict):
      out.update(_flatten(value, prefix + key + "."))
    else:
      out[prefix + key] = value
  return out


def describe_differences(configs, names=None):
  """The settings on which `configs` (one per worker) differ, as a sentence.

  Args:
    configs: every worker's `CompressionOptions.get_config()`, in worker
      order.
    names: `{config key: the argument's name}` (e.g. `reference_group` ->
      `reference_workers`).

  Returns:
    None if every config is the same; else e.g. "`seed` is 7 on worker 0
    but 1 on worker 1".
  """
  names = names or {}
  flat = [_flatten(c) for c in configs]
  keys = sorted(set().union(*flat))
  parts = []
  for key in keys:
    values = [f.get(key, "(not set)") for f in flat]
    if any(v != values[0] for v in values):
      top, _, rest = key.partition(".")
      name = names.get(top, top) + ("." + rest if rest else "")
      where = ", ".join(f"{v!r} on worker {i}" for i, v in enumerate(values))
      parts.append(f"`{name}` is {where}")
  return "; ".join(parts) or None


#: Seconds a worker that found a mismatch waits for its peers (`_settle`)
#: before it raises anyway.
SETTLE_SECONDS = 30


def _settle(all_gather):
  """Returns once every worker has finished the all-gathers before this one.

  A worker's row of this all-gather is sent only after its earlier
  all-gathers returned, so a worker that finishes this one (and then raises
  and exits) leaves no peer reading its earlier rows. A peer that exits
  first can make this one fail here, and a peer of an older version never
  joins it (`SETTLE_SECONDS` bound the wait); the caller raises its own
  error then.
  """
  try:
    all_gather(np.zeros([1], np.int32), timeout=SETTLE_SECONDS)
  except Exception:  # pylint: disable=broad-except
    pass  # The peer that ended it had its configs: it raises the same error.


def check_agreement(all_gather, options, num_workers, who, names=None):
  """Compares every worker's options; raises on every worker if they differ.

  Two all-gathers of fixed shape: `[CONFIG_MAGIC, length]` of each worker,
  then every config zero-padded to the longest. On a mismatch, a third
  (`_settle`) before the error.

  Args:
    all_gather: a function `(1-D int32 numpy array, timeout=None) -> the
      concatenation of every worker's array` (an eager collective; with
      `timeout`, it fails after that many seconds).
    options: this worker's `CompressionOptions`.
    num_workers: workers in the job.
    who: how the error names the program (the strategy's class).
    names: as for `describe_differences`.

  Raises:
    ValueError: if the workers' options differ, naming every setting at
      fault and every worker's value.
  """
  words = config_words(options)
  length = len(_canonical(agreed_config(options)).encode())
  heads = np.reshape(all_gather(np.array([CONFIG_MAGIC, length], np.int32)),
                     [num_workers, 2])
  if not np.all(heads[:, 0] == CONFIG_MAGIC):
    _settle(all_gather)
    raise ValueError(
        f"{who}: a worker sent no options config (first words "
        f"{heads[:, 0].tolist()}); every worker must run the same version of "
        "ndq_tf.")
  width = -(-int(heads[:, 1].max()) // 4)
  padded = np.zeros([width], np.int32)
  padded[:len(words)] = words
  rows = np.reshape(all_gather(padded), [num_workers, width])
  configs = [_decode_words(rows[i], int(heads[i, 1]))
             for i in range(num_workers)]
  versions = [c.pop("tensorflow", "(unknown)") for c in configs]
  decoded = [c.pop("decoded_bits", None) for c in configs]
  differences = describe_differences(configs, names)
  if differences:
    _settle(all_gather)
    raise ValueError(
        f"{who}: the workers were built with different compression options, "
        f"so each would decode the others' payloads with the wrong codec, "
        f"seed or layout: {differences}. Build the strategy with the same "
        f"arguments on every worker (compare `strategy.get_config()`).")
  if any(d != decoded[0] for d in decoded):
    _settle(all_gather)
    where = ", ".join(f"{d!r} with TensorFlow {v} on worker {i}"
                      for i, (d, v) in enumerate(zip(decoded, versions)))
    raise ValueError(
        f"{who}: the workers' TensorFlow decode the same payloads to other "
        f"bits, so their replicas would drift apart: `decoded_bits` is "
        f"{where}. Install the same TensorFlow on every worker.")
