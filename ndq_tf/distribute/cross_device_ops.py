"""`CompressedAllReduce`: a `tf.distribute.CrossDeviceOps` that quantizes gradients.

Plug it into `tf.distribute.MirroredStrategy` (or use `ndq_tf.MirroredStrategy`,
which does it for you). The gradient all-reduce (`batch_reduce` of dense
floating tensors, SUM or MEAN, to the values' own devices) is compressed with
a codec; everything else travels losslessly through a fallback
`CrossDeviceOps`.
"""

import contextlib
import threading
import weakref

import keras
import tensorflow as tf
# `tf.distribute.CrossDeviceOps` returns per-device results as `Mirrored`
# values, which only the internal modules can build (TF's own subclasses use
# the same helpers).
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import values as value_lib

from ndq_tf import codecs as ndq_codecs
from ndq_tf.distribute import fusion

__all__ = [
    "CompressedAllReduce",
    "uncompressed",
]

#: Default `min_elements`; the measurement behind it is in the docstring of
#: `CompressedAllReduce`.
DEFAULT_MIN_ELEMENTS = 256

_BASE_SEED_TAG = 0x4E445154  # "NDQT": second word of the base seed.

_UNCOMPRESSED_LOCK = threading.Lock()
_UNCOMPRESSED_DEPTH = weakref.WeakKeyDictionary()


def _current_graph():
  # In eager mode this is the global default graph, shared by every thread;
  # in a tf.function it is the FuncGraph that MirroredStrategy's replica
  # threads and its merge_call (main thread) all build into.
  return tf.compat.v1.get_default_graph()


@contextlib.contextmanager
def uncompressed():
  """Opts the all-reduces built inside this scope out of compression.

  Works for `tf.distribute.get_replica_context().all_reduce(...)` in user
  code (enter the scope inside the replica function, on every replica) and
  for cross-replica calls (`strategy.extended.batch_reduce_to`). It acts when
  the reduction is *built* (traced), so inside a `tf.function` it applies to
  every later execution of that trace.

  MirroredStrategy runs the replica functions in threads and the
  reduction in the main thread (`merge_call`); the scope is therefore kept
  per graph (the `tf.function` being traced, or the eager default graph),
  not per thread.

  Example:

  >>> def step_fn(x):
  ...   ctx = tf.distribute.get_replica_context()
  ...   with ndq_tf.distribute.uncompressed():
  ...     exact = ctx.all_reduce("sum", x)   # lossless
  ...   approx = ctx.all_reduce("sum", x)    # compressed
  ...   return exact, approx

  Yields:
    None.
  """
  graph = _current_graph()
  with _UNCOMPRESSED_LOCK:
    _UNCOMPRESSED_DEPTH[graph] = _UNCOMPRESSED_DEPTH.get(graph, 0) + 1
  try:
    yield
  finally:
    with _UNCOMPRESSED_LOCK:
      depth = _UNCOMPRESSED_DEPTH.get(graph, 1) - 1
      if depth:
        _UNCOMPRESSED_DEPTH[graph] = depth
      else:
        _UNCOMPRESSED_DEPTH.pop(graph, None)


def _in_uncompressed_scope():
  with _UNCOMPRESSED_LOCK:
    return _UNCOMPRESSED_DEPTH.get(_current_graph(), 0) > 0


def _base_seed(seed):
  if isinstance(seed, bool) or not isinstance(seed, int) or not (
      -2**31 <= seed < 2**31):
    raise ValueError(
        f"`seed` must be an integer in [-2**31, 2**31). Received: "
        f"seed={seed!r}.")
  return seed


@keras.saving.register_keras_serializable(package="ndq_tf")
class CompressedAllReduce(tf.distribute.CrossDeviceOps, tf.Module):
  """Cross-device all-reduce that sends quantized gradients between replicas.

  A `tf.distribute.CrossDeviceOps` for `tf.distribute.MirroredStrategy`. For
  each compressed `batch_reduce` call, every replica (sender) fuses all its
  compressible tensors into one buffer (`fusion.FusionPlan`: each tensor
  starts on a bucket boundary) and encodes it on its own device; only the
  packed `int32` wire (codes and scales) is copied to the other devices;
  every destination decodes every sender's wire in replica order and sums
  them with one `reduce_sum`, so every replica gets bitwise the same
  result and mirrored variables stay identical.

  What is compressed: `batch_reduce` (this is what Keras optimizers and
  `ReplicaContext.all_reduce` use) with `SUM` or `MEAN`, of dense floating
  point tensors with a static shape and at least `min_elements` elements,
  whose destinations are the values' own devices, outside an
  `ndq_tf.distribute.uncompressed()` scope. Everything else goes through
  `fallback` unchanged: `reduce`, broadcasts (the optimizer's int64 step),
  integer tensors, small tensors, `IndexedSlices` (unless
  `compress_indexed_slices`), gathers. One call may mix both kinds.

  Seeds: the dither of sender `s` at aggregation `t` comes from
  `fold_seed(fold_seed([seed, tag], t), s)`, where `t` is the int32 variable
  `step`, owned by this object and advanced by one per compressed call.
  `step` is saved by `tf.train.Checkpoint(..., cross_device_ops=this)` and,
  through `ndq_tf.MirroredStrategy`, with the Keras model
  (`tf.train.Checkpoint(model=...)`, `model.save_weights`,
  `keras.callbacks.BackupAndRestore`): a restore continues the sequence.
  With a plain `tf.distribute.MirroredStrategy(cross_device_ops=this)`, the
  model cannot reach this object: add it to your `tf.train.Checkpoint`
  yourself (BackupAndRestore cannot save it; use `ndq_tf.MirroredStrategy`).

  Telemetry (of the last compressed call, readable eagerly):
  `last_wire_bits` (what every sender put on the wire: compressed payloads,
  plus lossless tensors at their width), `last_float32_bits` (what float32
  would have cost), `last_compressed_bits` (the codec payloads alone,
  measured from the wires' sizes), `wire_bits_per_element`,
  `compression_ratio`; see also `ndq_tf.CompressionStats`.

  Mixed precision and clipping: a bucket holding a NaN or an Inf is sent
  with a NaN scale, so a non-finite gradient on any replica makes the
  reduced gradient non-finite on every replica. Keras 3.15's
  `LossScaleOptimizer` however decides to skip a step from replica 0's
  *local* gradients, before the all-reduce (a NaN on replica 1 alone is
  applied, with TF's own all-reduce too): use
  `ndq_tf.keras.LossScaleOptimizer`, which all-reduces the overflow flag
  first. Keras' `clipnorm`/`clipvalue` likewise act on each replica's local
  gradients, before compression.

  Opting out: all-reduces built inside `with ndq_tf.distribute.uncompressed():`
  are lossless.

  Why `min_elements=256` by default (measured, examples/fit_mirrored.py,
  digits MLP 64-256-10, 4 logical CPU replicas, 12 epochs, Adam):

    min_elements   DQSG M=1: acc / bits per element   M=3: acc / bits
    1              0.9711 / 1.729                     0.9733 / 3.090
    256            0.9711 / 1.701                     0.9733 / 3.027
    100000 (none)  0.9733 / 32                        0.9733 / 32

  Every tensor starts on a bucket boundary, so a tensor of `n < bucket_size`
  elements still costs a whole bucket (`codec.wire_bits(bucket_size)`: 864
  bits for ternary codes, 1536 for 7 levels with `bucket_size=512`): below
  27-48 elements compression *adds* bits (the 10-element output bias above),
  and between that and a few hundred it saves a few hundred bits per step,
  noise next to the kernels, on the tensors (biases, norm scales) whose
  per-element error matters most. 256 keeps those exact at no measurable
  cost in bits or time (the fused payload makes the per-tensor overhead
  nil). Lower it when every bit counts.

  Example:

  >>> codec = ndq_tf.DitheredCodec(num_levels=3)
  >>> strategy = tf.distribute.MirroredStrategy(
  ...     cross_device_ops=ndq_tf.CompressedAllReduce(codec))

  Args:
    codec: an `ndq_tf` codec (`DitheredCodec`, `QSGDCodec`, ...), or a spec
      string / config dict for `ndq_tf.codecs.get` (`"dqsg:num_levels=3"`).
      Codecs that need side information (nested) need a reference group of
      senders, which this class alone does not provide.
    min_elements: tensors with fewer elements travel losslessly.
    seed: base seed of the dither, an integer in `[-2**31, 2**31)`.
    compress_indexed_slices: densify `IndexedSlices` (embedding gradients)
      of a static dense shape and compress them like dense tensors. Off by
      default: a sparse update is usually smaller than a dense compressed
      one.
    fallback: the `tf.distribute.CrossDeviceOps` for everything not
      compressed; default `tf.distribute.ReductionToOneDevice()`:
      deterministic (one sum, then copies) and measured faster than
      MirroredStrategy's own choice for CPUs, a collective ring
      (benchmarks/mirrored_step.py, MLP of 1.3M parameters, 4 logical CPUs,
      interleaved runs: 21 against 31 ms per step). On GPUs, pass e.g.
      `tf.distribute.NcclAllReduce()`.
    name: name of the module (variables are created under it).

  Raises:
    TypeError: if `codec` is not a codec or `fallback` not a CrossDeviceOps.
    ValueError: for a bad `min_elements` or `seed`, a codec that needs side
      information, or when created inside a `tf.distribute.Strategy` scope
      (its variables must be plain host variables, not mirrored ones).
  """

  def __init__(self,
               codec,
               min_elements=DEFAULT_MIN_ELEMENTS,
               seed=0,
               compress_indexed_slices=False,
               fallback=None,
               name="compressed_all_reduce"):
    tf.distribute.CrossDeviceOps.__init__(self)
    tf.Module.__init__(self, name=name)
    if isinstance(codec, (str, dict)):
      codec = ndq_codecs.get(codec)
    for attr in ("encode", "decode", "to_wire", "from_wire", "wire_bits"):
      if not callable(getattr(codec, attr, None)):
        raise TypeError(
            f"`codec` must be an ndq_tf codec (with encode, decode, to_wire, "
            f"from_wire and wire_bits). Received: codec={codec!r} of type "
            f"{type(codec).__name__}.")
    if getattr(codec, "needs_side_information", False):
      raise ValueError(
          f"`codec` must not need side information: a nested codec needs a "
          f"reference group of senders decoded first. Received: "
          f"codec={codec!r}.")
    if (isinstance(min_elements, bool) or not isinstance(min_elements, int)
        or min_elements < 1):
      raise ValueError(
          f"`min_elements` must be an integer >= 1. Received: "
          f"min_elements={min_elements!r}.")
    if not isinstance(compress_indexed_slices, bool):
      raise ValueError(
          f"`compress_indexed_slices` must be a bool. Received: "
          f"compress_indexed_slices={compress_indexed_slices!r}.")
    self._default_fallback = fallback is None
    if fallback is None:
      fallback = tf.distribute.ReductionToOneDevice()
    if not isinstance(fallback, tf.distribute.CrossDeviceOps):
      raise TypeError(
          f"`fallback` must be a tf.distribute.CrossDeviceOps. Received: "
          f"fallback={fallback!r}.")
    if isinstance(fallback, CompressedAllReduce):
      raise ValueError(
          "`fallback` must be lossless; it cannot be a CompressedAllReduce.")
    if tf.distribute.has_strategy():
      raise ValueError(
          f"CompressedAllReduce must be created outside any "
          f"`tf.distribute.Strategy` scope: its step counter is one host "
          f"variable, and inside a scope it would become a mirrored "
          f"variable. Received: created inside the scope of "
          f"{tf.distribute.get_strategy()!r}.")
    self._codec = codec
    self._min_elements = min_elements
    self._seed = _base_seed(seed)
    self._compress_indexed_slices = compress_indexed_slices
    self._fallback = fallback
    with tf.init_scope(), tf.device("/device:CPU:0"):
      self._step = tf.Variable(0, dtype=tf.int32, trainable=False,
                               name="step")
      self._telemetry = {
          key: tf.Variable(0, dtype=tf.int64, trainable=False, name=key)
          for key in ("wire_bits", "float32_bits", "compressed_bits",
                      "elements", "compressed_elements", "senders")
      }

  # -- Configuration ----------------------------------------------------------

  @property
  def codec(self):
    return self._codec

  @property
  def min_elements(self):
    return self._min_elements

  @property
  def seed(self):
    return self._seed

  @property
  def compress_indexed_slices(self):
    return self._compress_indexed_slices

  @property
  def fallback(self):
    return self._fallback

  def get_config(self):
    """Returns the constructor arguments.

    Raises:
      NotImplementedError: if a custom `fallback` was given (a
        `CrossDeviceOps` has no config to serialize).
    """
    if not self._default_fallback:
      raise NotImplementedError(
          f"get_config cannot serialize a custom `fallback`. Received: "
          f"fallback={self._fallback!r}; pass it again to the constructor "
          f"instead of using from_config.")
    return {
        "codec": keras.saving.serialize_keras_object(self._codec),
        "min_elements": self._min_elements,
        "seed": self._seed,
        "compress_indexed_slices": self._compress_indexed_slices,
        "name": self.name,
    }

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    config["codec"] = keras.saving.deserialize_keras_object(config["codec"])
    return cls(**config)

  def __repr__(self):
    return (f"CompressedAllReduce(codec={self._codec!r}, min_elements="
            f"{self._min_elements}, seed={self._seed})")

  def __deepcopy__(self, memo):
    # `tf.distribute` deep-copies strategies in places; the copy must share
    # the step counter, or two copies would reuse the same dither.
    memo[id(self)] = self
    return self

  # -- State and telemetry ----------------------------------------------------

  @property
  def step(self):
    """The int32 variable counting compressed calls (the dither's step)."""
    return self._step

  def _read(self, key):
    return int(self._telemetry[key].numpy())

  @property
  def last_wire_bits(self):
    """Bits all senders put on the wire in the last compressed call."""
    return self._read("wire_bits")

  @property
  def last_float32_bits(self):
    """Bits the same call would have cost in float32."""
    return self._read("float32_bits")

  @property
  def last_compressed_bits(self):
    """Bits of the codec payloads alone (all senders) in the last call."""
    return self._read("compressed_bits")

  @property
  def last_num_elements(self):
    """Elements per sender reduced by the last call (all tensors)."""
    return self._read("elements")

  @property
  def last_compressed_elements(self):
    """Elements per sender that were compressed in the last call."""
    return self._read("compressed_elements")

  @property
  def last_num_senders(self):
    return self._read("senders")

  @property
  def wire_bits_per_element(self):
    """Wire bits per reduced element per sender in the last call."""
    denominator = self.last_num_elements * self.last_num_senders
    return self.last_wire_bits / denominator if denominator else float("nan")

  @property
  def compression_ratio(self):
    """float32 bits / wire bits of the last call."""
    wire = self.last_wire_bits
    return self.last_float32_bits / wire if wire else float("nan")

  def stats(self):
    """All telemetry of the last compressed call as a dict of Python numbers."""
    return {
        "step": int(self._step.numpy()),
        "wire_bits": self.last_wire_bits,
        "float32_bits": self.last_float32_bits,
        "compressed_bits": self.last_compressed_bits,
        "elements": self.last_num_elements,
        "compressed_elements": self.last_compressed_elements,
        "senders": self.last_num_senders,
        "wire_bits_per_element": self.wire_bits_per_element,
        "compression_ratio": self.compression_ratio,
    }

  # -- CrossDeviceOps hooks ---------------------------------------------------

  def reduce_implementation(self, reduce_op, per_replica_value, destinations,
                            options):
    return self._fallback.reduce(reduce_op, per_replica_value, destinations,
                                 options)

  def _gather_implementation(self, per_replica_value, destinations, axis,
                             options):
    return self._fallback._gather(  # pylint: disable=protected-access
        per_replica_value, destinations, axis, options)

  def _all_reduce(self, reduce_op, value, replica_id, options):
    # Only reached when MirroredStrategy skips merge_call (XLA with all-GPU
    # devices), and there it uses its own collective ops instead of us.
    raise NotImplementedError(
        "CompressedAllReduce works through merge_call; MirroredStrategy "
        "bypasses cross-device ops under XLA with all-GPU devices. Do not "
        "jit-compile the replica function (see ndq_tf.MirroredStrategy).")

  def batch_reduce_implementation(self, reduce_op, value_destination_pairs,
                                  options):
    pairs = list(value_destination_pairs)
    if isinstance(reduce_op, str):
      reduce_op = tf.distribute.ReduceOp(reduce_op.upper())
    compressed, lossless = [], []
    skip_all = (_in_uncompressed_scope()
                or reduce_op not in (tf.distribute.ReduceOp.SUM,
                                     tf.distribute.ReduceOp.MEAN))
    for index, (value, destinations) in enumerate(pairs):
      dense = None if skip_all else self._compressible(value, destinations)
      if dense is None:
        lossless.append(index)
      else:
        compressed.append((index, dense, value))
    results = [None] * len(pairs)
    if lossless:
      reduced = self._fallback.batch_reduce(
          reduce_op, [pairs[i] for i in lossless], options)
      for i, r in zip(lossless, reduced):
        results[i] = r
    if compressed:
      reduced = self._compressed_batch_reduce(reduce_op, compressed, pairs,
                                              lossless)
      for (i, _, _), r in zip(compressed, reduced):
        results[i] = r
    return results

  # -- Internals --------------------------------------------------------------

  def _compressible(self, value, destinations):
    """Per-replica dense tensors of `value` if it is compressed, else None."""
    if not isinstance(value, value_lib.PerReplica) or len(value.values) < 2:
      return None
    devices = cross_device_ops_lib.get_devices_from(value)
    if tuple(devices) != tuple(
        cross_device_ops_lib.get_devices_from(destinations)):
      return None
    tensors = []
    for v in value.values:
      if isinstance(v, tf.IndexedSlices):
        if not self._compress_indexed_slices:
          return None
        shape = tf.TensorShape(tf.get_static_value(v.dense_shape))
        if shape.rank is None or not shape.is_fully_defined():
          return None
        with tf.device(v.values.device):
          v = tf.scatter_nd(tf.expand_dims(v.indices, -1), v.values, shape)
      elif not isinstance(v, tf.Tensor):
        return None
      if not v.dtype.is_floating or not v.shape.is_fully_defined():
        return None
      tensors.append(v)
    shape = tensors[0].shape
    if any(t.shape != shape or t.dtype != tensors[0].dtype for t in tensors):
      return None
    if shape.num_elements() < self._min_elements:
      return None
    return tensors

  def _sender_codecs(self, num_senders):
    """The codec of every sender, in decode order (one codec for all here)."""
    return [self._codec] * num_senders

  def _compressed_batch_reduce(self, reduce_op, compressed, pairs, lossless):
    devices = cross_device_ops_lib.get_devices_from(compressed[0][2])
    for _, _, value in compressed[1:]:
      if tuple(cross_device_ops_lib.get_devices_from(value)) != tuple(devices):
        raise ValueError(
            f"All compressed values of one batch_reduce must live on the same "
            f"devices. Received: {devices} and "
            f"{cross_device_ops_lib.get_devices_from(value)}.")
    num_senders = len(devices)
    codecs = self._sender_codecs(num_senders)
    per_sender = [[dense[s] for _, dense, _ in compressed]
                  for s in range(num_senders)]
    plan = fusion.FusionPlan.from_tensors(per_sender[0],
                                          codecs[0].bucket_size)

    with tf.device(self._step.device):
      step = self._step.read_value()
      base_seed = tf.constant([self._seed, _BASE_SEED_TAG], tf.int32)
      seeds = [fusion.derive_seed(base_seed, step, s)
               for s in range(num_senders)]

    # Senders are indexed by replica (the order of `devices`), and decoded
    # in that order by every destination (fusion.decode_senders).
    wires = []
    for s, device in enumerate(devices):
      with tf.device(device):
        wires.append(fusion.encode_fused(codecs[s], per_sender[s], seeds[s],
                                         plan))

    mean = reduce_op == tf.distribute.ReduceOp.MEAN
    per_destination = []
    for device in devices:
      with tf.device(device):
        # The only cross-device copies of the compressed path: int32 wires
        # (and the [2] seeds).
        received = [tf.identity(w) for w in wires]
        per_destination.append(
            fusion.decode_sum(codecs, received, seeds, plan, mean=mean))

    self._record(plan, wires, pairs, lossless, num_senders)
    with tf.device(self._step.device):
      self._step.assign_add(1)

    return [
        distribute_utils.regroup(
            [per_destination[d][k] for d in range(num_senders)],
            wrap_class=value_lib.Mirrored)
        for k in range(len(compressed))
    ]

  def _record(self, plan, wires, pairs, lossless, num_senders):
    """Assigns the telemetry variables for this call."""
    lossless_bits = 0
    lossless_elements = 0
    dynamic_bits = []
    for i in lossless:
      value = pairs[i][0]
      v = value.values[0] if isinstance(value, value_lib.DistributedValues) \
          else value
      if isinstance(v, tf.IndexedSlices):
        n = tf.size(v.values, out_type=tf.int64)
        width = v.values.dtype.size * 8
        dynamic_bits.append((n, width, tf.size(v.indices, out_type=tf.int64),
                             v.indices.dtype.size * 8))
        continue
      v = tf.convert_to_tensor(v)
      n = v.shape.num_elements()
      if n is None:
        continue
      lossless_elements += n
      lossless_bits += n * v.dtype.size * 8
    with tf.device(self._step.device):
      compressed_bits = tf.add_n(
          [tf.size(w, out_type=tf.int64) for w in wires]) * 32
      wire_bits = compressed_bits + lossless_bits * num_senders
      elements = tf.constant(plan.num_elements + lossless_elements, tf.int64)
      for n, width, ni, iwidth in dynamic_bits:
        wire_bits += (n * width + ni * iwidth) * num_senders
        elements += n
      float32_bits = elements * 32 * num_senders
      t = self._telemetry
      t["compressed_bits"].assign(compressed_bits)
      t["wire_bits"].assign(wire_bits)
      t["float32_bits"].assign(float32_bits)
      t["elements"].assign(elements)
      t["compressed_elements"].assign(plan.num_elements)
      t["senders"].assign(num_senders)
