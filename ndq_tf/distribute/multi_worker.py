"""`MultiWorkerMirroredStrategy` whose gradient all-reduce is compressed.

Between workers, each step's gradients travel as one `int32` payload per
worker: every worker sums its local replicas' gradients losslessly, encodes
the sum once (the exchange engine, `ndq_tf.core.engine`, the same as
`ndq_tf.MirroredStrategy`'s), and the all-gather transport
(`CollectiveAllGatherTransport`) moves the payloads; every worker decodes
all senders in sender order and sums them deterministically, so every
worker ends the step with bitwise identical variables. Everything else
(metric and loss reductions, broadcasts, integers, small tensors,
`IndexedSlices` unless asked) goes through TF's own lossless
`CollectiveAllReduce`.

Cost model (per worker and step, `P` workers, `F` float32 bytes of gradient,
`C` compressed bytes): the all-gather moves about `(P - 1)·C` against
`2(P - 1)/P·F` for TF's float32 ring; compression pays while `C < 2F/P`
(about 38 workers for ternary codes). Several devices per worker are summed
locally first and encoded once: `(P - 1)·C` whatever the devices per
worker, instead of `(P·D - 1)·C` and `D` times the quantization noise.

References:
  A. Abdi, F. Fekri. Nested Dithered Quantization for Communication
  Reduction in Distributed Training. arXiv:1904.01197, 2019.
"""

from __future__ import annotations

import itertools
from typing import Any

import tensorflow as tf

from ndq_tf.cluster import startup_watchdog
from ndq_tf.cluster import tf_config
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import fingerprint
from ndq_tf.core import tf_internals
from ndq_tf.core import transports
from ndq_tf import _deprecation
from ndq_tf.core.exchanges import nested_shards
from ndq_tf.distribute import arguments as arguments_lib
from ndq_tf.distribute import cross_device_ops
from ndq_tf.distribute import gradient_detection
from ndq_tf.distribute import options as options_lib
from ndq_tf.distribute import strategy_state

__all__ = [
    "EXCHANGES_IN_FLIGHT",
    "MultiWorkerCompressedAllReduce",
    "MultiWorkerMirroredStrategy",
    "ordering_chains",
]

CodecLike = cross_device_ops.CodecLike
_BASES = tf_internals.MULTI_WORKER_BASES
_WHO = "ndq_tf.MultiWorkerMirroredStrategy"
# Collective group keys each strategy of a process may use. TF starts every
# MultiWorkerMirroredStrategy at the same group key, so two of them in one
# process would reuse each other's collective instances (a mismatch error,
# or a hang). Every worker builds its strategies in the same order, so the
# n-th strategy of each worker gets the same keys.
_GROUP_KEYS_PER_STRATEGY = 1000
_STRATEGIES = itertools.count()
#: Chains of collectives the compressed exchange keeps on a CPU exchange
#: device (`ordering_chains`): the collectives of one exchange take them in
#: turn, so the all-gather of chunk `k + 1` (chain `(k + 1) % 3`) need not
#: wait for chunk `k`'s (chain `k % 3`), and is on the link while chunk `k`
#: is decoded (issue #20). Three, not two: on the 8-layer model of
#: docs/benchmarks.md the median share of link time during the backward
#: pass was 59% in 5 launches against 40% with two in 7.
EXCHANGES_IN_FLIGHT = 3


def ordering_chains(device):
  """How many ordering-token chains the exchange on `device` uses.

  One collective launcher orders its collectives by one token, so each
  waits for the one before it, which on one inter-op thread is launched
  only after the previous chunk's decode. On a CPU, `EXCHANGES_IN_FLIGHT`
  chains: TF's CPU collectives match instances by key, in any order. On
  any other device one: NCCL needs every worker to launch its collectives
  in one order.

  Args:
    device: the exchange device (a device string).
  """
  kind = tf.DeviceSpec.from_string(device).device_type or ""
  return EXCHANGES_IN_FLIGHT if kind.upper() == "CPU" else 1


def _local_sum(parts):
  """This worker's replicas summed losslessly, in a fixed order."""
  if len(parts) == 1:
    return tf.identity(parts[0])
  return tf.reduce_sum(tf.stack([tf.identity(p) for p in parts]), axis=0)


class MultiWorkerCompressedAllReduce(cross_device_ops.DeprecatedTelemetry,
                                     _BASES.CollectiveAllReduce):
  """`CollectiveAllReduce` whose between-worker gradient reduction is compressed.

  Built by `MultiWorkerMirroredStrategy`; you do not normally build it
  yourself. What `ExchangeEngine.split` selects is compressed; the rest goes
  through the parent class unchanged.

  Args:
    devices: this worker's compute devices.
    group_size: total number of replicas (devices of all workers).
    options: a `tf.distribute.experimental.CommunicationOptions`.
    collective_keys: the strategy's `CollectiveKeys` (shared, so that keys
      stay in step across workers).
    compression: the `CompressionOptions`.
    num_workers: number of workers.
    worker_id: this worker's index, `0 <= worker_id < num_workers`.
    labels: the extended's `gradient_detection.ReductionLabels`.
    engine: the `ExchangeEngine` to use (the strategy keeps one across
      re-initializations); a new one when None.
    canonicalize_devices: as in `CollectiveAllReduce`.
  """

  def __init__(self, devices, group_size, options, collective_keys,
               compression, num_workers, worker_id, labels, engine=None,
               canonicalize_devices=True):
    super().__init__(devices, group_size, options,
                     collective_keys=collective_keys,
                     canonicalize_devices=canonicalize_devices)
    self._num_workers = num_workers
    self._worker_id = worker_id
    self._labels = labels
    # One launcher on the first device of every worker: the group of the
    # compressed exchange. Keys come from the shared CollectiveKeys, in the
    # same order on every worker (construction order), so they match.
    self._exchange_device = self._devices[0]
    group_key = self._collective_keys.get_group_key([self._exchange_device])
    self._launcher = tf_internals.multi_worker().CollectiveReplicaLauncher(
        group_key, num_workers, self._collective_keys, self._exchange_device,
        options)
    # The launcher's token and the extra ones, made now, outside any trace.
    self._chains = ordering_chains(self._exchange_device)
    tf_internals.extra_ordering_tokens(self._launcher, self._chains - 1)
    self._engine = engine or engine_lib.ExchangeEngine(
        compression, device=self._exchange_device)
    # Keras' steps_per_execution runs the step in a loop (tf_internals).
    tf_internals.loop_safe_collectives(self, self._launcher)

  @property
  def engine(self):
    """The `ExchangeEngine` (step counter, telemetry, nested state)."""
    return self._engine

  def stats(self):
    """The telemetry of the last compressed exchange (`telemetry` keys)."""
    return self._engine.stats()

  @property
  def worker_id(self):
    return self._worker_id

  @property
  def ordering_chains(self):
    """Chains of collectives the exchange keeps in flight (`ordering_chains`)."""
    return self._chains

  @property
  def num_workers(self):
    return self._num_workers

  def check_agreement(self):
    """Raises on every worker if the workers' compression options differ.

    Eager collectives of fixed shape (`fingerprint.check_agreement`); the
    error names each setting at fault and every worker's value.
    """
    def gather(row, timeout=None):
      options = self._options
      if timeout is not None:
        timeout = min(t for t in (timeout, options.timeout_seconds) if t)
        options = options.merge(
            tf.distribute.experimental.CommunicationOptions(
                timeout_seconds=timeout))
      with tf.device(self._exchange_device):
        return tf_internals.all_gather(self._launcher, tf.constant(row),
                                       options).numpy()
    fingerprint.check_agreement(gather, self._engine.options,
                                self._num_workers, _WHO)

  def batch_reduce_implementation(self, reduce_op, value_destination_pairs,
                                  options):
    pairs = list(value_destination_pairs)
    compressed, lossless, _ = self._engine.split(
        reduce_op, pairs, self._num_workers,
        gradient=self._labels.is_gradient(
            reduce_op, pairs, self._num_workers,
            self._engine.options.min_elements))
    if not compressed:
      return super().batch_reduce_implementation(reduce_op, pairs, options)
    results = [None] * len(pairs)
    if lossless:
      reduced = super().batch_reduce_implementation(
          reduce_op, [pairs[i] for i in lossless], options)
      for i, r in zip(lossless, reduced):
        results[i] = r
    tf_internals.multi_worker().mark_as_unsaveable()
    lossless_values = [pairs[i][0] for i in lossless]
    with self._lock:
      if tf.executing_eagerly():
        # Collectives in eager replica threads could deadlock; one function
        # call launches them in order (as the parent's gather does).
        summed = tf.function(
            lambda: self._exchange(reduce_op, compressed, options,
                                   lossless_values), autograph=False)()
      else:
        summed = self._exchange(reduce_op, compressed, options,
                                lossless_values)
    for (i, _), s in zip(compressed, summed):
      copies = []
      for device in self._devices:
        with tf.device(device):
          copies.append(tf.identity(s))
      results[i] = tf_internals.regroup_mirrored(copies)
    return results

  def _exchange(self, reduce_op, compressed, options, lossless_values):
    """Local lossless sum, one encode per worker, the exchange, the decode.

    The exchange's collectives take the ordering chains in turn, in
    program order (`ordering_chains`): under the all-gather chunk `k`'s
    collective is on chain `k % 3` of three on a CPU. The same ops, instance
    keys and bits whatever the chains.
    """
    device = self._exchange_device
    # None: the launcher's own token, first; then the extra ones.
    turns = itertools.cycle([None] + tf_internals.extra_ordering_tokens(
        self._launcher, self._chains - 1))
    launcher = self._launcher
    with tf.device(device), tf.name_scope("ndq_compressed_all_reduce"):
      local = [_local_sum(dense) for _, dense in compressed]
      gather = transports.CollectiveAllGatherTransport(
          lambda row: tf_internals.all_gather(
              launcher, row, options, ordering_token=next(turns)),
          self._num_workers, self._worker_id, device, who=_WHO)
      reduce = transports.CollectiveSumTransport(
          lambda value, merge_op: tf_internals.all_reduce(
              launcher, value, options, merge_op,
              ordering_token=next(turns)),
          self._num_workers, self._worker_id, device, who=_WHO)
      scatter = transports.CollectiveAllToAllTransport(
          lambda rows: tf_internals.all_to_all(
              launcher, rows, options, ordering_token=next(turns)),
          gather, self._num_workers, self._worker_id, device, who=_WHO)
      (summed,) = self._engine.exchange(
          {"all_gather": gather, "all_reduce": reduce,
           "reduce_scatter": scatter},
          [engine_lib.LocalSender(self._worker_id, device, local)],
          reduce_op, divisor=self._group_size, lossless_values=lossless_values)
      return summed

  def __deepcopy__(self, memo):
    # `tf.distribute` deep-copies strategies in places; a copy must share the
    # step counter, or two copies would reuse the same dither.
    memo[id(self)] = self
    return self


class _CompressedCollectiveExtended(gradient_detection.LabellingExtendedMixin,
                                   _BASES.CollectiveAllReduceExtended):
  """`CollectiveAllReduceExtended` with compressed cross-device ops."""

  _ndq_who = _WHO

  def __init__(self, container_strategy, cluster_resolver,
               communication_options, compression, cluster_timeout):
    # Read by `_initialize_*`, which the parent constructor calls.
    self._compression = compression
    self._cluster_timeout = cluster_timeout
    self._engine = None
    super().__init__(container_strategy, cluster_resolver=cluster_resolver,
                     communication_options=communication_options)

  def _initialize_local(self, cluster_resolver, devices=None):
    super()._initialize_local(cluster_resolver, devices=devices)
    self._install_compressed_ops()

  def _initialize_multi_worker(self, cluster_resolver):
    if tf_internals.collective_server_serves(cluster_resolver):
      # Another strategy of this process started the server: restarting
      # it would break the collectives a peer has already begun with its
      # own new strategy (tf_internals.collective_server_serves).
      self._std_server_started = True
    if self._cluster_timeout is None:
      super()._initialize_multi_worker(cluster_resolver)
    else:
      # TF waits for every worker inside C++ without a deadline, and the
      # waiting process does not even act on SIGTERM. A watchdog ends it
      # with a clear message instead of a silent hang.
      addresses = startup_watchdog.cluster_addresses(
          cluster_resolver.cluster_spec().as_dict())
      with startup_watchdog.StartupWatchdog(addresses, self._cluster_timeout,
                                            description=_WHO):
        super()._initialize_multi_worker(cluster_resolver)
    self._install_compressed_ops()
    if self._num_workers > 1:
      # Before any exchange, whose sizes could differ (see fingerprint).
      self._cross_device_ops.check_agreement()

  def _replica_ctx_all_reduce(self, reduce_op, value, options=None):
    if not tf.executing_eagerly() and not self._use_merge_call():
      # XLA with all-GPU devices: TF skips merge_call and the cross-device
      # ops, and would all-reduce uncompressed floats without a word.
      raise strategy_state.xla_bypass_error(_WHO, self.worker_devices)
    return super()._replica_ctx_all_reduce(reduce_op, value, options)

  def _install_compressed_ops(self):
    stock = self._cross_device_ops
    # Raises a clear error now rather than at the first exchange.
    self._compression.reference_count(self._num_workers)
    self._cross_device_ops = MultiWorkerCompressedAllReduce(
        devices=stock._devices,  # pylint: disable=protected-access
        group_size=stock._group_size,  # pylint: disable=protected-access
        options=self._communication_options,
        collective_keys=self._collective_keys,
        compression=self._compression,
        num_workers=self._num_workers,
        worker_id=self._id_in_cluster,
        labels=self.reduction_labels,
        engine=self._engine)
    self._engine = self._cross_device_ops.engine
    tf_internals.loop_safe_collectives(
        getattr(self, "_host_cross_device_ops", None))


def _rank(value):
  if isinstance(value, tf_internals.DistributedValues):
    value = value.values[0]
  shape = getattr(value, "shape", None)
  if shape is None:
    return tf.convert_to_tensor(value).shape.rank
  return tf.TensorShape(shape).rank


class MultiWorkerMirroredStrategy(_BASES.CollectiveAllReduceStrategy,
                                  strategy_state.StrategyState):
  """`tf.distribute.MultiWorkerMirroredStrategy` with a compressed gradient all-reduce.

  Each step, every worker sums its replicas' gradients losslessly, encodes
  the sum once with `codec`, and all-gathers one `int32` payload (codes,
  scales and a 5-word header: magic, sender, step, length, fingerprint of
  the options, fusion plan and exchange kind); every worker
  decodes all payloads in sender order and sums them deterministically, so
  all workers end the step with bitwise identical variables. The rules of
  what is compressed, the seeds, the codecs' forms and the telemetry are
  those of `ndq_tf.MirroredStrategy` (one exchange engine). Receivers take
  each sender's step from its header; workers whose steps or fingerprints
  disagree stop with an error naming both, and workers built with other
  options stop when the strategy is built, naming the setting
  (`ndq_tf.core.fingerprint`).

  It also makes Keras 3's `model.fit` work with several workers
  (keras-team/keras#20585): `reduce` accepts nested structures and reduces
  scalars over replicas when asked for `axis=0`.

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

  The compression settings are the fields of
  `ndq_tf.distribute.CompressionOptions`, one by one or all at once as
  `options`. Here the senders are the workers; the reference group P1 is
  workers `0 .. |P1| - 1`. One all-gather moves rows of one length, so
  shorter payloads are padded: a `reference_codec` of the nested codec's
  rate wastes nothing (e.g. `DitheredCodec(num_levels=1)` with
  `NestedDitheredCodec(coarse_ratio=3)`). Nested groups go through
  `exchange="reduce_scatter"` in the fixed mode only: each nested worker
  counts its statistics over the shard it receives
  (`exchanges.nested_shards`); `adaptive=True` is refused there.

  Raises:
    ImportError: if this TensorFlow lacks an internal the strategy needs.
    TypeError: if `codec` or `reference_codec` is not a codec.
    ValueError: for a bad argument value, or a malformed `TF_CONFIG`;
      for `exchange="reduce_scatter"` with an adaptive nested group.
  """

  def __init__(self, *args, **kwargs) -> None:
    # The signature and the Args section: `_ARGUMENTS`, below the class.
    values, given = _ARGUMENTS.bind(self, args, kwargs)
    cluster_resolver = values["cluster_resolver"]
    communication_options = values["communication_options"]
    cluster_timeout = values["cluster_timeout"]
    tf_internals.multi_worker()  # Raises if this TF lacks its internals.
    compression = options_lib.from_arguments(_WHO, values, given,
                                             values["options"])
    # Before any cluster: one sender per worker, each receiving one shard.
    nested_shards.check_across_processes(compression)
    if cluster_timeout is not None and (
        isinstance(cluster_timeout, bool) or
        not isinstance(cluster_timeout, (int, float)) or cluster_timeout <= 0):
      raise ValueError(
          f"`cluster_timeout` must be a positive number of seconds or None. "
          f"Received: cluster_timeout={cluster_timeout!r}.")
    if communication_options is None:
      communication_options = tf.distribute.experimental.CommunicationOptions()
    if cluster_resolver is None:
      cluster_resolver = tf_config.tf_config_resolver()
    self._compression = compression
    self._cluster_timeout = cluster_timeout
    # Read by the extended's constructor (see _GROUP_KEYS_PER_STRATEGY).
    self._collective_key_base = _GROUP_KEYS_PER_STRATEGY * next(_STRATEGIES)
    # The parent's constructor hard-codes its extended; build ours instead.
    tf_internals.Strategy.__init__(self, _CompressedCollectiveExtended(
        self, cluster_resolver=cluster_resolver,
        communication_options=communication_options,
        compression=compression, cluster_timeout=cluster_timeout))
    self._track_engine(self.compression_engine)
    gradient_detection.warn_if_single_sender(
        _WHO, self.extended._num_workers, unit="worker")  # pylint: disable=protected-access

  @property
  def options(self):
    """The `CompressionOptions`."""
    return self._compression

  @property
  def codec(self):
    return self._compression.codec

  @property
  def exchange(self):
    """The `exchange` option (`"auto"`, `"all_gather"`, `"all_reduce"`,
    `"reduce_scatter"`)."""
    return self._compression.exchange

  @property
  def transport(self):
    """Deprecated: `exchange`."""
    _deprecation.warn(f"`{_WHO}.transport`", "`exchange`")
    return self._compression.exchange

  @property
  def chunk_elements(self):
    """About how many elements per chunk of the exchange (None: one chunk)."""
    return self._compression.chunk_elements

  @property
  def compressed_all_reduce(self):
    """The `MultiWorkerCompressedAllReduce` in use."""
    return tf_internals.cross_device_ops_of(self)

  @property
  def compression_engine(self):
    """The exchange engine: step counter, telemetry, nested noise state."""
    return self.compressed_all_reduce.engine

  def reduce(self, reduce_op, value, axis) -> Any:
    """`tf.distribute.Strategy.reduce`, also for nested values and scalars.

    Keras 3 calls `reduce` on a nested batch and with `axis=0` on per-replica
    scalars (keras-team/keras#20585), which the stock strategy rejects. A
    nested `value` is reduced leaf by leaf; a scalar has no axis to reduce,
    so `axis` is ignored for it (reduction over replicas only).
    """
    if tf.nest.is_nested(value):
      return tf.nest.map_structure(
          lambda v: self.reduce(reduce_op, v, axis), value)
    if axis is not None and _rank(value) == 0:
      axis = None
    return super().reduce(reduce_op, value, axis)

  def get_config(self) -> dict[str, Any]:
    """The constructor arguments that describe the compression.

    Under the keys of release 0.1.0: `exchange` as `"transport"`,
    `reference_group` as `"reference_workers"`.
    """
    config = options_lib.config_under_keys(
        self._compression.get_config(), reference_group="reference_workers")
    config["cluster_timeout"] = self._cluster_timeout
    return config


_ARGUMENTS = options_lib.arguments(
    _WHO, options_lib.CODEC_OR_OPTIONS,
    arguments_lib.Argument(
        "cluster_resolver",
        "tf.distribute.cluster_resolver.ClusterResolver | None", None,
        "optional `tf.distribute.cluster_resolver.ClusterResolver`; by "
        "default `TFConfigClusterResolver` (reads `TF_CONFIG`, validated "
        "first: a malformed entry fails at once, naming it)."),
    arguments_lib.Argument(
        "communication_options",
        "tf.distribute.experimental.CommunicationOptions | None", None,
        "optional `tf.distribute.experimental.CommunicationOptions` for all "
        "collectives (e.g. `timeout_seconds`, so that a lost worker fails "
        "rather than hangs)."),
    "min_elements", "seed", "reference_codec", "reference_group",
    arguments_lib.Argument(
        "cluster_timeout", "float | None", None,
        "seconds to wait for every worker to join at start-up (`None`: "
        "forever, as TF does). Past it, a watcher process says which "
        "workers are unreachable and stops this one (`startup_watchdog`)."),
    "adaptive", "compress_indexed_slices", "exchange", "chunk_elements",
    "reduce_scatter_levels", "reduce_scatter_error_feedback",
    options_lib.OPTIONS, keyword_only="options",
    renamed=("transport", "reference_workers"))
_ARGUMENTS.apply(MultiWorkerMirroredStrategy)
