"""`MultiWorkerMirroredStrategy` whose gradient all-reduce is a compressed all-gather.

Between workers, each step's gradients travel as one `int32` all-gather: every
worker reduces its local replicas' gradients losslessly, encodes the sum once
with the codec (`ndq_tf.distribute.fusion.encode_fused`: all compressed
tensors fused into one payload), prefixes a small header (sender, step), and
all-gathers it. Every worker then decodes all senders in sender order with
`fusion.decode_sum`, a deterministic sum, so every worker ends the step with
bitwise identical variables. Everything else (metric and loss reductions,
broadcasts, integer values, small tensors, `IndexedSlices`) goes through TF's
own lossless `CollectiveAllReduce`.

Cost model (per worker and step, `P` workers, `F` float32 bytes of gradient,
`C` compressed bytes): the all-gather of codes moves about `(P - 1) * C`,
against `2 (P - 1) / P * F` for TF's float32 ring all-reduce. Compression pays
when `C < 2 F / P`; with `C ≈ F / 19` (ternary codes, 1.66 bits/element) that
holds up to about 38 workers. Several devices per worker are summed locally
first (free compared to the network) and encoded once, so the exchange costs
`(P - 1) * C` whatever the devices per worker; one sender per device would
cost `(P·D - 1) * C` and add `D` times the quantization noise.

Seeds: sender `w` at step `t` draws its dither from
`fold_seed(fold_seed([seed, 0], t), w)`. The header carries `w` and `t`, so a
receiver regenerates each sender's dither from the payload alone. Workers
whose steps disagree (e.g. restored from different checkpoints) fail with an
error naming both steps instead of silently decoding with the wrong dither.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019.
"""

import math

from keras.src.saving import keras_saveable
import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import collective_util
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute import cross_device_utils
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import reduce_util
from tensorflow.python.distribute import values as value_lib
from tensorflow.python.distribute import values_util
from tensorflow.python.eager import context
from tensorflow.python.framework import indexed_slices
from tensorflow.python.framework import ops
from tensorflow.python.platform import tf_logging as logging

from ndq_tf.codecs import base as codecs_base
from ndq_tf.distribute import cross_device_ops as cross_device_ops_ndq
from ndq_tf.distribute import fusion

__all__ = [
    "MultiWorkerMirroredStrategy",
    "MultiWorkerCompressedAllReduce",
    "HEADER_WORDS",
]

# Header of every worker's payload: magic, sender id, step, payload words.
HEADER_WORDS = 4
_MAGIC = 0x4E445131  # "NDQ1"
# As `ndq_tf.CompressedAllReduce` (see its docstring for the measurement).
_DEFAULT_MIN_ELEMENTS = cross_device_ops_ndq.DEFAULT_MIN_ELEMENTS


def _check_codec(codec, name="codec"):
  if not isinstance(codec, codecs_base.Codec):
    raise TypeError(
        f"`{name}` must be an ndq_tf codec (an instance of ndq_tf.Codec, e.g. "
        f"ndq_tf.DitheredCodec(num_levels=3)). Received: {name}={codec!r}")


def _check_reference(codec, reference_codec, reference_workers, adaptive):
  """Validates the nested-group arguments.

  The rules of `CompressedAllReduce` (one implementation), with
  `reference_workers` defaulting to half the workers.

  Returns:
    `(reference_workers, adaptive)`, resolved.
  """
  _check_codec(codec, "codec")
  if reference_codec is not None:
    _check_codec(reference_codec, "reference_codec")
  _, reference_workers, adaptive = cross_device_ops_ndq.check_reference(
      codec, reference_codec, reference_workers, adaptive=adaptive,
      group="reference_workers")
  return reference_workers, adaptive


def _reference_count(reference_workers, num_workers):
  """Number of reference workers among `num_workers` (0 without nesting)."""
  return cross_device_ops_ndq.reference_count(
      reference_workers, num_workers, group="reference_workers")


def _is_compressible(value, min_elements):
  """Dense floating point values of at least `min_elements` elements."""
  first = value.values[0] if isinstance(
      value, value_lib.DistributedValues) else value
  if isinstance(first, indexed_slices.IndexedSlices):
    return False
  dtype = getattr(first, "dtype", None)
  if dtype is None or not dtype.is_floating:
    return False
  n = first.shape.num_elements()
  return n is not None and n >= min_elements


class MultiWorkerCompressedAllReduce(cross_device_ops_lib.CollectiveAllReduce):
  """`CollectiveAllReduce` whose between-worker gradient reduction is compressed.

  Used by `MultiWorkerMirroredStrategy`; you do not normally build it yourself.
  Only `batch_reduce` of dense floating point values of at least
  `min_elements` elements, with destinations equal to the values' devices,
  across more than one worker, is compressed. The rest goes through the
  parent class unchanged.

  Args:
    devices: this worker's compute devices.
    group_size: total number of replicas (devices of all workers).
    options: a `tf.distribute.experimental.CommunicationOptions`.
    collective_keys: the strategy's `CollectiveKeys` (shared, so that keys
      stay in step across workers).
    codec: the ndq_tf codec for gradients.
    num_workers: number of workers.
    worker_id: this worker's id in the cluster, `0 <= worker_id < num_workers`.
    min_elements: smallest tensor that is compressed.
    seed: base seed (Python int) of the dither.
    reference_codec: codec of the reference workers when `codec` is nested.
    reference_workers: number of reference workers (ids `0 ..
      reference_workers - 1`), decoded first; 0 without a nested codec.
    adaptive: nested codecs: encode with this worker's own noise of the
      previous exchange (see `MultiWorkerMirroredStrategy`).
    canonicalize_devices: as in `CollectiveAllReduce`.
  """

  def __init__(self, devices, group_size, options, collective_keys, codec,
               num_workers, worker_id, min_elements=_DEFAULT_MIN_ELEMENTS,
               seed=0, reference_codec=None, reference_workers=0,
               adaptive=False, canonicalize_devices=True):
    super().__init__(devices, group_size, options,
                     collective_keys=collective_keys,
                     canonicalize_devices=canonicalize_devices)
    self._codec = codec
    self._reference_codec = reference_codec
    self._reference_workers = reference_workers
    self._num_workers = num_workers
    self._worker_id = worker_id
    self._min_elements = min_elements
    self._seed = seed
    self._adaptive = adaptive
    # This worker's noise state per fused buffer size (`buckets_<n>`):
    # `(noise_scale [n], gain [n])`, local (each worker knows only its own
    # gradient), created on first use. Not checkpointed: after a restart the
    # first exchange falls back to DQSG and the gain starts again at 1.
    self._noise_state = {}
    # One launcher on the first device of every worker: the group of the
    # compressed all-gather. Keys come from the shared CollectiveKeys, in the
    # same order on every worker (construction order), so they match.
    self._exchange_device = self._devices[0]
    group_key = self._collective_keys.get_group_key([self._exchange_device])
    self._exchange = cross_device_utils.CollectiveReplicaLauncher(
        group_key, num_workers, self._collective_keys, self._exchange_device,
        options)
    with ops.init_scope(), ops.device(self._exchange_device):
      self._step = tf.Variable(0, dtype=tf.int32, trainable=False,
                               name="ndq_compression_step")
      self._sent_bits = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name="ndq_sent_bits_per_step")
      self._float32_bits = tf.Variable(0, dtype=tf.int64, trainable=False,
                                       name="ndq_float32_bits_per_step")
      self._wire_bits = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name="ndq_codec_wire_bits_per_step")
      # Nested workers: this worker's own payload in the last exchange
      # (`fusion.nested_sender_statistics`).
      self._nested_telemetry = {
          key: tf.Variable(0, dtype=dtype, trainable=False, name="ndq_" + key)
          for key, dtype in (("overloads", tf.int64),
                             ("nested_elements", tf.int64),
                             ("expected_overloads", tf.float64),
                             ("fallback_buckets", tf.int64),
                             ("buckets", tf.int64))
      }

  @property
  def codec(self):
    """The gradient codec."""
    return self._codec

  @property
  def step(self):
    """`int32` variable: compressed all-reduces done so far (the seed's step)."""
    return self._step

  @property
  def sent_bits(self):
    """`int64` variable: bits this worker put in the last exchange (header too)."""
    return self._sent_bits

  @property
  def wire_bits(self):
    """`int64` variable: the codec's payload bits in the last exchange."""
    return self._wire_bits

  @property
  def float32_bits(self):
    """`int64` variable: what the last exchange's tensors weigh as float32."""
    return self._float32_bits

  @property
  def min_elements(self):
    return self._min_elements

  @property
  def wire_bits_per_element(self):
    """Bits this worker sent per compressed element in the last exchange."""
    elements = int(self._float32_bits.numpy()) / 32
    return int(self._sent_bits.numpy()) / elements if elements else math.nan

  @property
  def compression_ratio(self):
    """float32 bits / bits sent, in the last exchange."""
    sent = int(self._sent_bits.numpy())
    return int(self._float32_bits.numpy()) / sent if sent else math.nan

  @property
  def is_nested_sender(self):
    """Whether this worker sends nested codes (group P2)."""
    return (self._reference_codec is not None
            and self._worker_id >= self._reference_workers)

  @property
  def adaptive(self):
    """Whether nested workers encode with their own last noise scale."""
    return self._adaptive

  def _nested_value(self, key):
    if not self.is_nested_sender:
      return math.nan
    return self._nested_telemetry[key].numpy()

  @property
  def last_overloads(self):
    """Nested workers: elements of this worker's payload decoded wrong.

    Ground truth from this worker's own gradient (see
    `ndq_tf.distribute.fusion.nested_sender_statistics`), last exchange.
    NaN on a reference worker.
    """
    value = self._nested_value("overloads")
    return value if math.isnan(value) else int(value)

  @property
  def last_overload_rate(self):
    """Nested workers: `last_overloads` per element of nested buckets.

    NaN on a reference worker or when every bucket fell back.
    """
    if not self.is_nested_sender:
      return math.nan
    n = int(self._nested_telemetry["nested_elements"].numpy())
    return self.last_overloads / n if n else math.nan

  @property
  def last_overload_probability(self):
    """Nested workers: the Gaussian prediction of `last_overload_rate`."""
    if not self.is_nested_sender:
      return math.nan
    n = int(self._nested_telemetry["nested_elements"].numpy())
    expected = float(self._nested_telemetry["expected_overloads"].numpy())
    return expected / n if n else 0.0

  @property
  def last_fallback_fraction(self):
    """Nested workers: fraction of this worker's buckets sent as DQSG."""
    if not self.is_nested_sender:
      return math.nan
    buckets = int(self._nested_telemetry["buckets"].numpy())
    fallback = int(self._nested_telemetry["fallback_buckets"].numpy())
    return fallback / buckets if buckets else math.nan

  def noise_state(self, num_buckets):
    """`(noise_scale, noise_gain)` variables of a buffer, or None.

    This worker's exact RMS of `z = g - y` per bucket in the last exchange
    (in the adaptive mode its envelope over the exchanges,
    `ndq_tf.distribute.cross_device_ops.next_noise_scale`) and its gains
    (`next_noise_gain`), both `float32` `[num_buckets]`.
    """
    return self._noise_state.get(f"buckets_{int(num_buckets)}")

  def _get_noise_state(self, num_buckets):
    key = f"buckets_{int(num_buckets)}"
    if key not in self._noise_state:
      with ops.init_scope(), ops.device(self._exchange_device), \
          tf.variable_creator_scope(
              cross_device_ops_ndq._plain_variable_creator):  # pylint: disable=protected-access
        self._noise_state[key] = (
            tf.Variable(tf.fill([int(num_buckets)], math.nan),
                        trainable=False, name=f"ndq_noise_scale_{key}"),
            tf.Variable(tf.ones([int(num_buckets)]), trainable=False,
                        name=f"ndq_noise_gain_{key}"))
    return self._noise_state[key]

  def batch_reduce_implementation(self, reduce_op, value_destination_pairs,
                                  options):
    pairs = list(value_destination_pairs)
    if (self._num_workers < 2 or
        cross_device_ops_ndq._in_uncompressed_scope() or  # pylint: disable=protected-access
        reduce_op not in (reduce_util.ReduceOp.SUM, reduce_util.ReduceOp.MEAN)
        or not cross_device_ops_lib._all_devices_match(  # pylint: disable=protected-access
            pairs, self._canonicalize_devices)):
      return super().batch_reduce_implementation(reduce_op, pairs, options)
    compressed = [i for i, (v, _) in enumerate(pairs)
                  if _is_compressible(v, self._min_elements)]
    if not compressed:
      return super().batch_reduce_implementation(reduce_op, pairs, options)
    plain = [i for i in range(len(pairs)) if i not in set(compressed)]
    results = [None] * len(pairs)
    if plain:
      reduced = super().batch_reduce_implementation(
          reduce_op, [pairs[i] for i in plain], options)
      for i, r in zip(plain, reduced):
        results[i] = r
    values_util.mark_as_unsaveable()
    reduced = self._compressed_all_reduce(
        reduce_op, [pairs[i][0] for i in compressed], options)
    for i, r in zip(compressed, reduced):
      results[i] = r
    return results

  def _seed_for(self, step, sender):
    return fusion.derive_seed(
        tf.constant([self._seed, 0], tf.int32), step, sender)

  def _compressed_all_reduce(self, reduce_op, per_replica_values, options):
    """Local lossless sum, one encode, one all-gather, decode of every sender."""
    with self._lock:
      if context.executing_eagerly():
        # Collectives in eager replica threads could deadlock; one function
        # call launches them in order (as the parent's gather does).
        summed = tf.function(
            lambda: self._exchange_and_decode(
                reduce_op, per_replica_values, options),
            autograph=False)()
      else:
        summed = self._exchange_and_decode(reduce_op, per_replica_values,
                                           options)
    results = []
    for s in summed:
      copies = []
      for device in self._devices:
        with ops.device(device):
          copies.append(tf.identity(s))
      results.append(distribute_utils.regroup(
          copies, wrap_class=value_lib.Mirrored))
    return results

  def _sender_codecs(self):
    """Codec of every worker, in decode order (reference workers first)."""
    return ([self._reference_codec] * self._reference_workers +
            [self._codec] * (self._num_workers - self._reference_workers))

  def _exchange_and_decode(self, reduce_op, per_replica_values, options):
    device = self._exchange_device
    with ops.device(device), ops.name_scope("ndq_compressed_all_reduce"):
      local = []
      for pv in per_replica_values:
        parts = pv.values if isinstance(
            pv, value_lib.DistributedValues) else (pv,)
        if len(parts) == 1:
          local.append(tf.identity(parts[0]))
        else:
          # Lossless and order-fixed: the same bits whatever the arrival order.
          local.append(tf.reduce_sum(
              tf.stack([tf.identity(p) for p in parts]), axis=0))
      codecs = self._sender_codecs()
      plan = fusion.FusionPlan.from_tensors(local, self._codec.bucket_size)
      words = [plan.wire_words(c) for c in codecs]
      # Reference and nested wires may differ in length; the all-gather needs
      # one length, so shorter wires are zero-padded to the longest.
      row_words = max(words)
      my_words = words[self._worker_id]
      if min(words) != row_words:
        logging.log_first_n(
            logging.WARN,
            "ndq_tf.MultiWorkerMirroredStrategy: reference payloads have %d "
            "words and nested ones %d; the all-gather pads every payload to "
            "%d. Pick a reference codec of the nested codec's rate (e.g. "
            "DitheredCodec(num_levels=1) with coarse_ratio=3) to avoid it.",
            1, words[0], words[-1], row_words)
      step = self._step.read_value()
      my_codec = codecs[self._worker_id]
      nested = self.is_nested_sender
      noise_scale = None
      if nested:
        sigma_variable, gain_variable = self._get_noise_state(
            plan.total_size // plan.bucket_size)
        if self._adaptive:
          noise_scale = sigma_variable.read_value() * gain_variable.read_value()
      fused = plan.flatten(local)
      wire = fusion.encode_flat(
          my_codec, fused, self._seed_for(step, self._worker_id), plan,
          noise_scale=noise_scale)
      header = tf.stack([
          tf.constant(_MAGIC, tf.int32),
          tf.constant(self._worker_id, tf.int32), step,
          tf.constant(my_words, tf.int32)])
      payload = tf.concat(
          [header, wire, tf.zeros([row_words - my_words], tf.int32)], axis=0)
      with ops.control_dependencies([payload]):
        advance = self._step.assign_add(1)
      telemetry = [
          self._sent_bits.assign(32 * (HEADER_WORDS + row_words)),
          self._wire_bits.assign(32 * my_words),
          self._float32_bits.assign(plan.float32_bits()),
      ]
      gathered = self._exchange._all_gather(payload, options)  # pylint: disable=protected-access
      rows = tf.reshape(gathered, [self._num_workers, HEADER_WORDS + row_words])
      # Decode in sender order whatever order the collective delivered.
      rows = tf.gather(rows, tf.argsort(rows[:, 1], stable=True))
      checks = self._check_headers(rows, words)
      with ops.control_dependencies(checks + telemetry + [advance]):
        wires = [rows[k, HEADER_WORDS:HEADER_WORDS + words[k]]
                 for k in range(self._num_workers)]
        # The seed of each payload comes from its own header, never from the
        # receiver's counter.
        seeds = [self._seed_for(rows[k, 2], rows[k, 1])
                 for k in range(self._num_workers)]
        decoded, side = fusion.decode_senders(codecs, wires, seeds, plan,
                                              return_side_information=True)
        updates = []
        if nested:
          me = self._worker_id
          updates = self._update_noise(
              fusion.nested_sender_statistics(
                  my_codec, wires[me], fused, side[me],
                  decoded[me], plan, noise_scale=noise_scale),
              sigma_variable, gain_variable, plan)
        summed = fusion.sum_decoded(decoded, plan)
        if reduce_op == reduce_util.ReduceOp.MEAN:
          summed = [s / tf.cast(self._group_size, s.dtype) for s in summed]
        with ops.control_dependencies(updates):
          return [tf.identity(s) for s in summed]

  def _update_noise(self, statistics, sigma_variable, gain_variable, plan):
    """Stores this nested worker's noise, gain and telemetry; the ops."""
    t = self._nested_telemetry
    sigma, gain = cross_device_ops_ndq.next_noise_state(
        sigma_variable.read_value(), gain_variable.read_value(), statistics,
        plan, float(self._codec.overload_target), self._adaptive)
    updates = [
        sigma_variable.assign(sigma),
        gain_variable.assign(gain),
        t["buckets"].assign(plan.total_size // plan.bucket_size),
    ]
    for key in ("overloads", "nested_elements", "expected_overloads",
                "fallback_buckets"):
      updates.append(t[key].assign(statistics[key]))
    return updates

  def _check_headers(self, rows, expected_words):
    magic, senders, steps, words = (rows[:, 0], rows[:, 1], rows[:, 2],
                                    rows[:, 3])
    expected = tf.range(self._num_workers, dtype=tf.int32)
    well_formed = tf.reduce_all(tf.stack([
        tf.reduce_all(tf.equal(magic, _MAGIC)),
        tf.reduce_all(tf.equal(senders, expected)),
        tf.reduce_all(tf.equal(words, tf.constant(expected_words, tf.int32))),
    ]))
    header_ok = tf.debugging.Assert(well_formed, [
        "ndq_tf.MultiWorkerMirroredStrategy: malformed compressed payload; "
        "every worker must run the same program with the same codec and "
        "model. (magic, sender, step, words) per worker:",
        rows[:, :HEADER_WORDS]], summarize=4 * self._num_workers)
    low = tf.argmin(steps, output_type=tf.int32)
    high = tf.argmax(steps, output_type=tf.int32)
    steps_ok = tf.debugging.Assert(
        tf.equal(steps[low], steps[high]),
        ["ndq_tf.MultiWorkerMirroredStrategy: workers disagree on the "
         "compression step, so their dither seeds differ and decoding would "
         "be silently wrong: worker", senders[low], "sent step", steps[low],
         "but worker", senders[high], "sent step", steps[high],
         ". Restore every worker from the same checkpoint (the step variable "
         "is `strategy.compression_step`)."])
    return [header_ok, steps_ok]

  def __deepcopy__(self, memo):
    # `tf.distribute` deep-copies strategies in places; a copy must share the
    # step counter, or two copies would reuse the same dither.
    memo[id(self)] = self
    return self


class _CompressedCollectiveExtended(
    collective_all_reduce_strategy.CollectiveAllReduceExtended):
  """`CollectiveAllReduceExtended` with compressed cross-device ops."""

  def __init__(self, container_strategy, cluster_resolver,
               communication_options, compression):
    # Read by `_initialize_*`, which the parent constructor calls.
    self._compression_timeout = compression.pop("cluster_timeout", None)
    self._compression = compression
    super().__init__(container_strategy, cluster_resolver=cluster_resolver,
                     communication_options=communication_options)

  def _initialize_local(self, cluster_resolver, devices=None):
    super()._initialize_local(cluster_resolver, devices=devices)
    self._install_compressed_ops()

  def _initialize_multi_worker(self, cluster_resolver):
    timeout = self._compression_timeout
    if timeout is None:
      super()._initialize_multi_worker(cluster_resolver)
    else:
      # TF waits for every worker inside C++ without a deadline, and the
      # waiting process does not even act on SIGTERM. A watchdog ends it
      # with a clear message instead of a silent hang.
      with _StartupWatchdog(cluster_resolver, timeout):
        super()._initialize_multi_worker(cluster_resolver)
    self._install_compressed_ops()

  def _replica_ctx_all_reduce(self, reduce_op, value, options=None):
    if not context.executing_eagerly() and not self._use_merge_call():
      # XLA with all-GPU devices: TF skips merge_call and batch_reduce, so
      # this all-reduce cannot be compressed. Say so rather than train
      # uncompressed in silence.
      logging.log_first_n(
          logging.WARN,
          "ndq_tf.MultiWorkerMirroredStrategy: all_reduce inside XLA on GPUs "
          "bypasses merge_call and travels uncompressed; compile the step "
          "without XLA (jit_compile=False) to compress gradients.", 1)
    return super()._replica_ctx_all_reduce(reduce_op, value, options)

  def _install_compressed_ops(self):
    stock = self._cross_device_ops
    compression = dict(self._compression)
    compression["reference_workers"] = _reference_count(
        compression["reference_workers"], self._num_workers)
    self._cross_device_ops = MultiWorkerCompressedAllReduce(
        devices=stock._devices,  # pylint: disable=protected-access
        group_size=stock._group_size,  # pylint: disable=protected-access
        options=self._communication_options,
        collective_keys=self._collective_keys,
        num_workers=self._num_workers,
        worker_id=self._id_in_cluster,
        **compression)


# Runs in a separate process: while TF waits for the cluster inside C++ it holds
# the GIL, so no thread of ours could run, and SIGTERM is not acted upon.
_WATCHER = r"""
import json, os, select, signal, socket, sys
pid, timeout, addresses, tf_config = (int(sys.argv[1]), float(sys.argv[2]),
                                      json.loads(sys.argv[3]), sys.argv[4])
ready, _, _ = select.select([sys.stdin], [], [], timeout)
if ready:  # The parent finished start-up (or died): stdin closed.
  sys.exit(0)
missing = []
for name, address in addresses:
  host, _, port = address.rpartition(":")
  try:
    socket.create_connection((host, int(port)), timeout=1.0).close()
  except (OSError, ValueError):
    missing.append(f"{name} ({address})")
sys.stderr.write(
    "ndq_tf.MultiWorkerMirroredStrategy: the cluster did not form within "
    f"cluster_timeout={timeout:g} s; stopping this worker (SIGKILL). "
    "Unreachable workers: "
    f"{', '.join(missing) or 'none (they are up but did not join)'}. Check "
    "that every worker was started with the same TF_CONFIG 'cluster' and its "
    f"own 'task.index'. TF_CONFIG here: {tf_config!r}\n")
sys.stderr.flush()
os.kill(pid, signal.SIGKILL)
"""


class _StartupWatchdog:
  """Kills this process with a clear message if the cluster does not form."""

  def __init__(self, cluster_resolver, timeout):
    spec = cluster_resolver.cluster_spec().as_dict()
    self._addresses = []
    for job, addresses in sorted(spec.items()):
      if isinstance(addresses, dict):
        addresses = [addresses[k] for k in sorted(addresses)]
      for index, address in enumerate(addresses):
        self._addresses.append((f"/job:{job}/task:{index}", address))
    self._timeout = timeout
    self._proc = None

  def __enter__(self):
    import json  # pylint: disable=g-import-not-at-top
    import os  # pylint: disable=g-import-not-at-top
    import subprocess  # pylint: disable=g-import-not-at-top
    import sys  # pylint: disable=g-import-not-at-top
    self._proc = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, str(os.getpid()), str(self._timeout),
         json.dumps(self._addresses), os.environ.get("TF_CONFIG", "")],
        stdin=subprocess.PIPE)
    return self

  def __exit__(self, *exc_info):
    self._proc.stdin.close()
    self._proc.wait()
    return False


def _rank(value):
  if isinstance(value, value_lib.DistributedValues):
    value = value.values[0]
  shape = getattr(value, "shape", None)
  if shape is None:
    return tf.convert_to_tensor(value).shape.rank
  return tf.TensorShape(shape).rank


class MultiWorkerMirroredStrategy(
    collective_all_reduce_strategy.CollectiveAllReduceStrategy,
    tf.__internal__.tracking.Trackable,
    keras_saveable.KerasSaveable):
  """`tf.distribute.MultiWorkerMirroredStrategy` with a compressed gradient all-reduce.

  Each step, every worker sums its replicas' gradients losslessly, encodes the
  sum once with `codec`, and all-gathers one `int32` payload (codes, scales
  and a 4-word header: magic, sender, step, length); every worker decodes all
  payloads in sender order and sums them deterministically, so all workers
  end the step with bitwise identical variables. Metric, loss and iterator
  reductions, broadcasts, integer and small tensors and `IndexedSlices` go
  through TF's lossless `CollectiveAllReduce`.

  To keep one of your own `ReplicaContext.all_reduce` calls lossless, build it
  inside `ndq_tf.distribute.uncompressed()`.

  It also makes Keras 3's `model.fit` work with several workers
  (keras-team/keras#20585): `reduce` accepts nested structures and reduces
  scalars over replicas when asked for `axis=0`.

  Args:
    codec: an ndq_tf codec (e.g. `ndq_tf.DitheredCodec(num_levels=3)`) for
      the gradients.
    cluster_resolver: optional `tf.distribute.cluster_resolver.ClusterResolver`;
      by default `TFConfigClusterResolver` (reads `TF_CONFIG`).
    communication_options: optional
      `tf.distribute.experimental.CommunicationOptions` for all collectives
      (e.g. `timeout_seconds`, so that a lost worker fails rather than hangs).
    min_elements: tensors with fewer elements travel losslessly (default
      256, as `ndq_tf.CompressedAllReduce`: below a bucket, compression saves
      little and the relative error is largest).
    seed: Python int, base seed of the dither.
    reference_codec: for a nested `codec` (`ndq_tf.NestedDitheredCodec`), the
      codec of the reference workers (group P1), decoded first; the other
      workers (P2) send nested codes decoded with the mean of all gradients
      decoded before them as side information (the paper's Algorithm 2).
      One all-gather carries one payload size, so the shorter payloads are
      zero-padded to the longer: a reference codec of the nested codec's
      rate wastes nothing (e.g. `DitheredCodec(num_levels=1)`, ternary, with
      `NestedDitheredCodec(coarse_ratio=3)`: both 1.66 bits per element).
    reference_workers: size of P1: an int >= 1, or a fraction of the workers
      in (0, 1) (default 0.5 with a nested codec, as `reference_replicas` of
      `CompressedAllReduce`). Workers `0 .. |P1| - 1` are the reference
      group.
    adaptive: nested `codec` only, as `CompressedAllReduce`'s (None: True
      iff `codec.alpha == "mmse"`): every nested worker encodes with its
      own noise of the previous exchange, the exact RMS of `z = g - y` per
      bucket (it knows its gradient `g` and decodes its own payload with
      the side information `y` every worker uses; an envelope over the
      exchanges, `cross_device_ops.next_noise_scale`), times a per-bucket
      gain fed back from its own overloads
      (`cross_device_ops.next_noise_gain`).
      Only the steps it picks travel, in the payload's scales: nothing
      else is sent. The noise state is the worker's own and is not
      checkpointed: after a restart the first exchange falls back to DQSG.
      Telemetry of the worker's own payload: `compressed_all_reduce.
      last_overload_rate` (counted), `last_overload_probability` (Gaussian
      prediction), `last_fallback_fraction`.
    cluster_timeout: seconds to wait for every worker to join at start-up
      (`None`: forever, as TF does). TF waits inside C++ holding the GIL,
      where no exception can reach, so past the deadline a watcher process
      prints which workers are unreachable and kills this one (SIGKILL)
      instead of letting it hang.

  Raises:
    TypeError: if `codec` or `reference_codec` is not an ndq_tf codec.
    ValueError: if `min_elements`, `seed`, `cluster_timeout` or the
      reference group is invalid, or `TF_CONFIG` is malformed (the message
      quotes it).

  Example:

  ```python
  # On each worker, with TF_CONFIG set (e.g. by `python -m ndq_tf.launch`):
  strategy = ndq_tf.MultiWorkerMirroredStrategy(
      codec=ndq_tf.DitheredCodec(num_levels=3))
  with strategy.scope():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile("sgd", "sparse_categorical_crossentropy")
  model.fit(dataset, epochs=2)
  ```
  """

  def __init__(self, codec, cluster_resolver=None, communication_options=None,
               min_elements=_DEFAULT_MIN_ELEMENTS, seed=0, reference_codec=None,
               reference_workers=None, cluster_timeout=None, adaptive=None):
    _check_codec(codec)
    reference_workers, adaptive = _check_reference(
        codec, reference_codec, reference_workers, adaptive)
    if cluster_timeout is not None and not (
        isinstance(cluster_timeout, (int, float)) and cluster_timeout > 0):
      raise ValueError(
          "`cluster_timeout` must be a positive number of seconds or None. "
          f"Received: cluster_timeout={cluster_timeout!r}")
    if (not isinstance(min_elements, int) or isinstance(min_elements, bool)
        or min_elements < 1):
      raise ValueError(
          "`min_elements` must be a positive int. "
          f"Received: min_elements={min_elements!r}")
    if (not isinstance(seed, int) or isinstance(seed, bool) or
        not -2**31 <= seed < 2**31):
      raise ValueError(
          "`seed` must be an int in [-2**31, 2**31). "
          f"Received: seed={seed!r}")
    if communication_options is None:
      communication_options = collective_util.Options()
    if cluster_resolver is None:
      cluster_resolver = _tf_config_resolver()
    self._codec = codec
    self._min_elements = min_elements
    self._seed = seed
    self._reference_codec = reference_codec
    self._reference_workers = reference_workers
    self._cluster_timeout = cluster_timeout
    self._adaptive = adaptive
    compression = dict(codec=codec, min_elements=min_elements, seed=seed,
                       reference_codec=reference_codec,
                       reference_workers=reference_workers,
                       adaptive=bool(adaptive),
                       cluster_timeout=cluster_timeout)
    # The parent's constructor hard-codes its extended; build ours instead.
    distribute_lib.Strategy.__init__(self, _CompressedCollectiveExtended(
        self, cluster_resolver=cluster_resolver,
        communication_options=communication_options,
        compression=compression))
    self._maybe_initialize_trackable()
    self._track_trackable(self.compressed_all_reduce.step,
                          name="compression_step")

  @property
  def codec(self):
    """The gradient codec."""
    return self._codec

  @property
  def compressed_all_reduce(self):
    """The `MultiWorkerCompressedAllReduce` in use (telemetry, step)."""
    return self.extended._cross_device_ops  # pylint: disable=protected-access

  @property
  def compression_step(self):
    """`int32` variable, the dither's step (one per compressed all-reduce).

    Saved with the model, with nothing to do: `model.save_weights` and
    `keras.callbacks.BackupAndRestore` (the strategy is a Keras saveable
    reachable from the model) and `tf.train.Checkpoint(model=model)` (Keras
    models track their strategy). Without a Keras model:
    `tf.train.Checkpoint(..., compression_step=strategy.compression_step)`.
    """
    return self.compressed_all_reduce.step

  def reduce(self, reduce_op, value, axis):
    """`tf.distribute.Strategy.reduce`, also for nested values and scalars.

    Keras 3 calls `reduce` on a nested batch and with `axis=0` on per-replica
    scalars (keras-team/keras#20585), which the stock strategy rejects. A
    nested `value` is reduced leaf by leaf; a scalar has no axis to reduce, so
    `axis` is ignored for it (reduction over replicas only).

    Args:
      reduce_op: `tf.distribute.ReduceOp` or `"SUM"` / `"MEAN"`.
      value: a (nested structure of) `tf.distribute.DistributedValues` or
        tensors.
      axis: axis to reduce within each replica, or `None`.

    Returns:
      The reduced value(s), with the structure of `value`.
    """
    if tf.nest.is_nested(value):
      return tf.nest.map_structure(
          lambda v: self.reduce(reduce_op, v, axis), value)
    if axis is not None and _rank(value) == 0:
      axis = None
    return super().reduce(reduce_op, value, axis)

  # -- Keras saving (model.save_weights, BackupAndRestore) -------------------

  def _obj_type(self):
    # Keras walks the attributes of saveables, skipping those of a reference
    # object of this type; any type it knows is fine (as ndq_tf.MirroredStrategy).
    return "Operation"

  def save_own_variables(self, store):
    store["step"] = np.asarray(self.compression_step.numpy())

  def load_own_variables(self, store):
    try:
      value = store["step"]
    except (KeyError, ValueError):
      return  # Saved without a compressed strategy: keep the counter.
    self.compression_step.assign(int(np.asarray(value)))

  def __reduce__(self):
    raise TypeError("ndq_tf.MultiWorkerMirroredStrategy cannot be pickled.")

  def get_config(self):
    """Returns the constructor arguments that describe the compression."""
    return {"codec": self._codec, "min_elements": self._min_elements,
            "seed": self._seed, "reference_codec": self._reference_codec,
            "reference_workers": self._reference_workers,
            "adaptive": self._adaptive,
            "cluster_timeout": self._cluster_timeout}


def _tf_config_resolver():
  """`TFConfigClusterResolver`, with clear errors for a malformed `TF_CONFIG`."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  raw = os.environ.get("TF_CONFIG")
  if raw:
    try:
      config = json.loads(raw)
    except ValueError as e:
      raise ValueError(
          f"`TF_CONFIG` must be JSON. Received: TF_CONFIG={raw!r} ({e})"
      ) from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if cluster:
      if not isinstance(cluster, dict) or not all(
          isinstance(v, list) and v and all(
              isinstance(a, str) and ":" in a for a in v)
          for v in cluster.values()):
        raise ValueError(
            "`TF_CONFIG['cluster']` must map job names to non-empty lists of "
            f"'host:port' strings. Received: TF_CONFIG={raw!r}")
      if (not isinstance(task, dict) or "type" not in task or
          "index" not in task):
        raise ValueError(
            "`TF_CONFIG` with a 'cluster' must have a 'task' with 'type' and "
            f"'index'. Received: TF_CONFIG={raw!r}")
      jobs = cluster.get(task["type"])
      index = task["index"]
      if jobs is None:
        raise ValueError(
            f"`TF_CONFIG['task']['type']` must be a job of the cluster "
            f"({sorted(cluster)}). Received: TF_CONFIG={raw!r}")
      if (not isinstance(index, int) or isinstance(index, bool) or
          not 0 <= index < len(jobs)):
        raise ValueError(
            f"`TF_CONFIG['task']['index']` must be an int in "
            f"[0, {len(jobs)}). Received: TF_CONFIG={raw!r}")
      for address in sum(cluster.values(), []):
        port = address.rsplit(":", 1)[1]
        if not port.isdigit() or not 0 < int(port) < 65536:
          raise ValueError(
              "Every address of `TF_CONFIG['cluster']` must be 'host:port' "
              f"with a port in [1, 65535]. Received: {address!r} in "
              f"TF_CONFIG={raw!r}")
  return tf.distribute.cluster_resolver.TFConfigClusterResolver()

