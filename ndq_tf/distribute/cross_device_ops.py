"""`CompressedAllReduce`: a `tf.distribute.CrossDeviceOps` that quantizes gradients.

Plug it into `tf.distribute.MirroredStrategy` (or use `ndq_tf.MirroredStrategy`,
which does it for you). The gradient all-reduce is compressed by the
exchange engine (`ndq_tf.core.engine`) over device copies
(`transports.DeviceCopyTransport`); everything else travels losslessly
through a fallback `CrossDeviceOps`.
"""

from __future__ import annotations

import math
from typing import Any

from absl import logging
import keras
import tensorflow as tf

from ndq_tf import _deprecation
from ndq_tf.core import engine as engine_lib
from ndq_tf.core import tf_internals
from ndq_tf.core import transports
from ndq_tf.distribute import arguments as arguments_lib
from ndq_tf.distribute import gradient_detection
from ndq_tf.distribute import options as options_lib

__all__ = [
    "CompressedAllReduce",
    "DeprecatedTelemetry",
]


#: What `codec` may be: a codec, a spec string or a config dict.
CodecLike = options_lib.CodecLike

#: The `fallback` argument (of `CompressedAllReduce` and
#: `ndq_tf.MirroredStrategy`).
FALLBACK = arguments_lib.Argument(
    "fallback", "tf.distribute.CrossDeviceOps | None", None,
    "the `tf.distribute.CrossDeviceOps` for everything not compressed; "
    "default `tf.distribute.ReductionToOneDevice()` (deterministic: one "
    "sum, then copies; faster than a collective ring on CPUs, "
    "docs/benchmarks.md). On GPUs, pass e.g. "
    "`tf.distribute.NcclAllReduce()`.")

# The config keys of release 0.1.0 that are not the fields' names.
_STORED_AS = {"reference_group": "reference_replicas"}


class DeprecatedTelemetry:
  """Telemetry names of release 0.1.0, kept for one release (deprecated).

  Mixed into both strategies' cross-device ops, which provide `stats()`.
  """

  @property
  def last_wire_bits(self):
    """Deprecated: `stats()["sent_bits"]`."""
    _deprecation.warn("`last_wire_bits`", '`stats()["sent_bits"]`')
    return self.stats()["sent_bits"]

  @property
  def last_overload_rate(self):
    """Deprecated: `stats()["overload_rate"]` (NaN without a nested codec)."""
    _deprecation.warn("`last_overload_rate`", '`stats()["overload_rate"]`')
    return self.stats().get("overload_rate", math.nan)

  @property
  def wire_bits_per_element(self):
    """Deprecated: `stats()["sent_bits_per_element"]`."""
    _deprecation.warn("`wire_bits_per_element`",
                      '`stats()["sent_bits_per_element"]`')
    return self.stats()["sent_bits_per_element"]


@keras.saving.register_keras_serializable(package="ndq_tf")
class CompressedAllReduce(DeprecatedTelemetry, tf.distribute.CrossDeviceOps,
                          tf.Module):
  """Cross-device all-reduce that sends quantized gradients between replicas.

  The `tf.distribute.CrossDeviceOps` of `ndq_tf.MirroredStrategy` (pass it as
  `ndq_tf.MirroredStrategy(cross_device_ops=...)`). In each compressed
  `batch_reduce` call, every replica (sender) fuses its
  compressible tensors into one buffer and encodes it on its own device;
  only the packed `int32` payloads are copied to the other devices; every
  replica decodes every payload in replica order and sums them with one
  compiled fold in that order, so every replica gets bitwise the same
  result and mirrored variables stay identical. The rules of what is
  compressed, the seeds, the decode order and the nested groups are the
  exchange engine's (`ndq_tf.core.engine`), shared with
  `ndq_tf.MultiWorkerMirroredStrategy`; the equations are in
  docs/algorithms.md.

  What is compressed: gradient aggregation, i.e. the all-reduce of the
  gradients a Keras 3 optimizer is applying (`model.fit`, `apply_gradients`
  in custom loops, `LossScaleOptimizer`, gradient accumulation) and every
  `batch_reduce` whose destinations are trainable variables (tf_keras'
  optimizers, TF's low-level `batch_reduce_to(SUM, grads_and_vars)`; see
  `ndq_tf.distribute.gradient_detection`), and all-reduces built inside
  `ndq_tf.distribute.compressed()`; of those, SUM or MEAN of dense floating
  tensors of at least `min_elements` elements. Everything else goes
  through `fallback` unchanged: other all-reduces (synchronized
  BatchNormalization, metrics, losses, your own `ReplicaContext.all_reduce`),
  `reduce`, broadcasts (the optimizer's int64 step), integer tensors, small
  tensors, `IndexedSlices` (unless `compress_indexed_slices`), gathers. One
  call may mix both kinds. Inside a plain `tf.distribute.MirroredStrategy`,
  which cannot see Keras 3's optimizers, only reductions to trainable
  variables and `compressed()` scopes are compressed.

  State: the engine's step counter (the dither's step, advanced by one per
  compressed call), its telemetry and the nested senders' noise state are
  variables of this module, saved by `tf.train.Checkpoint(...,
  cross_device_ops=this)` and, through `ndq_tf.MirroredStrategy`, with the
  Keras model (`model.save_weights`, `keras.callbacks.BackupAndRestore`): a
  restore continues the dither sequence.

  Telemetry: `stats()` (the keys of `ndq_tf.core.telemetry`, the same
  for every strategy); `ndq_tf.CompressionStats` puts them in the Keras logs.

  Nested codecs (NDQSG, the paper's Algorithm 2): with
  `codec=ndq_tf.NestedDitheredCodec(...)`, pass `reference_codec` and
  `reference_group`. Replicas `0 .. |P1| - 1` (P1) send
  `reference_codec`, the others nested codes decoded in replica order with
  side information = the mean of everything decoded before them. In the
  automatic mode (`adaptive=True`) each nested replica encodes with its own
  measured noise; see docs/algorithms.md.

  Mixed precision and clipping: a bucket holding a NaN or an Inf decodes to
  NaN on every replica. Keras' `LossScaleOptimizer` decides from replica 0's
  *local* gradients: use `ndq_tf.keras.LossScaleOptimizer`. `clipnorm` and
  `clipvalue` act on each replica's local gradients, before compression.

  Example:

  >>> codec = ndq_tf.DitheredCodec(num_levels=3)
  >>> strategy = ndq_tf.MirroredStrategy(
  ...     cross_device_ops=ndq_tf.CompressedAllReduce(codec, seed=7))

  Raises:
    TypeError: if `codec` or `reference_codec` is not a codec (a class,
      `None`, an object without the codec methods) or `fallback` not a
      `CrossDeviceOps`.
    ValueError: for a bad argument value (see `CompressionOptions`), or when
      created inside a `tf.distribute.Strategy` scope (its variables must be
      plain host variables).
  """

  def __init__(self, *args, **kwargs) -> None:
    # The signature and the Args section: `_ARGUMENTS`, below the class.
    values, given = _ARGUMENTS.bind(self, args, kwargs)
    fallback = values["fallback"]
    tf.distribute.CrossDeviceOps.__init__(self)
    tf.Module.__init__(self, name=values["name"])
    self._options = options_lib.from_arguments(
        "ndq_tf.CompressedAllReduce", values, given, values["options"])
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
    self._fallback = fallback
    self._engine = engine_lib.ExchangeEngine(self._options)
    self._labels = None
    self._warned_unlabelled = False

  def attach_labels(self, labels):
    """Called by `ndq_tf.MirroredStrategy`: how to recognise gradients.

    Args:
      labels: the strategy's `gradient_detection.ReductionLabels`.
    """
    self._labels = labels

  # -- Configuration ----------------------------------------------------------

  @property
  def options(self):
    """The `CompressionOptions`."""
    return self._options

  @property
  def engine(self):
    """The `ExchangeEngine` (step counter, telemetry, nested state)."""
    return self._engine

  @property
  def codec(self):
    return self._options.codec

  @property
  def reference_codec(self):
    """The codec of the reference replicas P1 (None without a nested codec)."""
    return self._options.reference_codec

  @property
  def reference_group(self):
    """Size of P1: an int count or a fraction (None without a nested codec)."""
    return self._options.reference_group

  @property
  def reference_replicas(self):
    """Deprecated: `reference_group`."""
    _deprecation.warn("`CompressedAllReduce.reference_replicas`",
                      "`reference_group`")
    return self._options.reference_group

  @property
  def adaptive(self):
    return self._options.adaptive

  @property
  def exchange(self):
    """The `exchange` option (`"auto"`, `"all_gather"`, `"all_reduce"`,
    `"reduce_scatter"`)."""
    return self._options.exchange

  @property
  def transport(self):
    """Deprecated: `exchange`."""
    _deprecation.warn("`CompressedAllReduce.transport`", "`exchange`")
    return self._options.exchange

  @property
  def chunk_elements(self):
    """About how many elements per chunk of the exchange (None: one chunk)."""
    return self._options.chunk_elements

  @property
  def needs_reference(self):
    """Whether `codec` is nested (senders split into P1 and P2)."""
    return self._options.nested

  def reference_count(self, num_replicas):
    """Size of P1 for `num_replicas` replicas (0 without a nested codec)."""
    return self._options.reference_count(num_replicas)

  @property
  def min_elements(self):
    return self._options.min_elements

  @property
  def seed(self):
    return self._options.seed

  @property
  def compress_indexed_slices(self):
    return self._options.compress_indexed_slices

  @property
  def fallback(self):
    return self._fallback

  @property
  def step(self):
    """The `int32` variable counting compressed calls (the dither's step)."""
    return self._engine.step

  def stats(self) -> dict[str, Any]:
    """The telemetry of the last compressed call (`telemetry` keys)."""
    return self._engine.stats()

  def get_config(self):
    """Returns the constructor arguments.

    Under the keys of release 0.1.0, which its `from_config` reads:
    `exchange` as `"transport"`, `reference_group` as
    `"reference_replicas"`; `from_config` takes either name.

    Raises:
      NotImplementedError: if a custom `fallback` was given (a
        `CrossDeviceOps` has no config to serialize).
    """
    if not self._default_fallback:
      raise NotImplementedError(
          f"get_config cannot serialize a custom `fallback`. Received: "
          f"fallback={self._fallback!r}; pass it again to the constructor "
          f"instead of using from_config.")
    config = options_lib.config_under_keys(self._options.get_config(),
                                           **_STORED_AS)
    config["name"] = self.name
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**options_lib.stored_config(config, **_STORED_AS))

  def __repr__(self):
    return f"CompressedAllReduce({self._options!r})"

  def __deepcopy__(self, memo):
    # `tf.distribute` deep-copies strategies in places; the copy must share
    # the step counter, or two copies would reuse the same dither.
    memo[id(self)] = self
    return self

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
    num_replicas = max((len(v.values) for v, _ in pairs if isinstance(
        v, tf_internals.DistributedValues)), default=1)
    compressed, lossless, devices = self._engine.split(
        reduce_op, pairs, num_replicas,
        gradient=self._is_gradient(reduce_op, pairs, num_replicas))
    results = [None] * len(pairs)
    if lossless:
      reduced = self._fallback.batch_reduce(
          reduce_op, [pairs[i] for i in lossless], options)
      for i, r in zip(lossless, reduced):
        results[i] = r
    if compressed:
      senders = [engine_lib.LocalSender(s, device,
                                        [dense[s] for _, dense in compressed])
                 for s, device in enumerate(devices)]
      per_destination = self._engine.exchange(
          {"all_gather": transports.DeviceCopyTransport(devices),
           "all_reduce": transports.DeviceSumTransport(devices),
           "reduce_scatter": transports.DeviceAllToAllTransport(devices)},
          senders,
          reduce_op,
          lossless_values=[pairs[i][0] for i in lossless])
      for k, (i, _) in enumerate(compressed):
        results[i] = tf_internals.regroup_mirrored(
            [summed[k] for summed in per_destination])
    return results

  def _is_gradient(self, reduce_op, pairs, num_replicas):
    if self._labels is not None:
      return self._labels.is_gradient(reduce_op, pairs, num_replicas,
                                      self._options.min_elements)
    if gradient_detection.destinations_are_trainable_variables(pairs):
      return True  # batch_reduce_to(grads_and_vars): tf_keras, TF's loop.
    if not self._warned_unlabelled:
      self._warned_unlabelled = True
      logging.warning(
          "ndq_tf: CompressedAllReduce inside a plain "
          "tf.distribute.MirroredStrategy cannot recognise Keras 3's "
          "gradient aggregation, so it compresses only gradients reduced to "
          "their variables (batch_reduce_to: tf_keras, TF's low-level "
          "loop) and all-reduces built inside "
          "ndq_tf.distribute.compressed(). Use "
          "ndq_tf.MirroredStrategy(cross_device_ops=...) to compress "
          "Keras 3's gradients.")
    return False


_ARGUMENTS = options_lib.arguments(
    "ndq_tf.CompressedAllReduce", options_lib.CODEC_OR_OPTIONS,
    "min_elements", "seed", "compress_indexed_slices", FALLBACK,
    arguments_lib.Argument("name", "str", "compressed_all_reduce",
                           "name of the module."),
    "reference_codec", "reference_group", "adaptive", "exchange",
    "chunk_elements", "reduce_scatter_levels",
    "reduce_scatter_error_feedback", options_lib.OPTIONS,
    keyword_only="options", renamed=("transport", "reference_replicas"))
_ARGUMENTS.apply(CompressedAllReduce)
