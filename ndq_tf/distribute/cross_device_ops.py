"""`CompressedAllReduce`: a `tf.distribute.CrossDeviceOps` that quantizes gradients.

Plug it into `tf.distribute.MirroredStrategy` (or use `ndq_tf.MirroredStrategy`,
which does it for you). The gradient all-reduce (`batch_reduce` of dense
floating tensors, SUM or MEAN, to the values' own devices) is compressed with
a codec; everything else travels losslessly through a fallback
`CrossDeviceOps`.
"""

import contextlib
import math
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
from tensorflow.python.ops import resource_variable_ops

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

#: Default size of the reference group P1 for a nested codec: half the
#: replicas (`reference_replicas=0.5`).
DEFAULT_REFERENCE_REPLICAS = 0.5

#: Adaptive nested mode: bounds of a sender's noise gains, and the most
#: one may fall and rise per call (factors; see `next_noise_gain`).
NOISE_GAIN_RANGE = (0.25, 16.0)
NOISE_GAIN_STEPS = (0.8, 4.0)
#: Adaptive nested mode: how much of a bucket's last noise envelope the
#: next call keeps (see `next_noise_scale`).
NOISE_MEMORY = 0.95

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


def _check_codec_like(codec, name):
  if isinstance(codec, (str, dict)):
    codec = ndq_codecs.get(codec)
  for attr in ("encode", "decode", "to_wire", "from_wire", "wire_bits"):
    if not callable(getattr(codec, attr, None)):
      raise TypeError(
          f"`{name}` must be an ndq_tf codec (with encode, decode, to_wire, "
          f"from_wire and wire_bits). Received: {name}={codec!r} of type "
          f"{type(codec).__name__}.")
  return codec


def check_reference(codec, reference_codec, reference_replicas, adaptive,
                    group="reference_replicas"):
  """Validates the nested-group arguments (the paper's Algorithm 2).

  Shared by `CompressedAllReduce` (`reference_replicas`) and
  `ndq_tf.MultiWorkerMirroredStrategy` (`reference_workers`, passed as
  `group` so that errors name the argument the user wrote).

  Returns:
    `(reference_codec, reference_replicas, adaptive)`, resolved.
  """
  nested = bool(getattr(codec, "needs_side_information", False))
  if not nested:
    if (reference_codec is not None or reference_replicas is not None
        or adaptive):
      raise ValueError(
          f"`reference_codec`, `{group}` and `adaptive` are only "
          f"for a nested `codec` (one that needs side information). "
          f"Received: codec={codec!r}, reference_codec={reference_codec!r}, "
          f"{group}={reference_replicas!r}, "
          f"adaptive={adaptive!r}.")
    return None, None, False
  if reference_codec is None:
    raise ValueError(
        f"A nested `codec` ({codec!r}) needs side information: pass "
        f"`reference_codec` (e.g. ndq_tf.DitheredCodec(num_levels=3)), the "
        f"codec of the reference replicas decoded first, and optionally "
        f"`{group}` (a count or a fraction of the senders; "
        f"default {DEFAULT_REFERENCE_REPLICAS}). Received: "
        f"reference_codec=None.")
  reference_codec = _check_codec_like(reference_codec, "reference_codec")
  if getattr(reference_codec, "needs_side_information", False):
    raise ValueError(
        f"`reference_codec` must not need side information (the reference "
        f"senders are decoded first). Received: "
        f"reference_codec={reference_codec!r}.")
  if reference_codec.bucket_size != codec.bucket_size:
    raise ValueError(
        f"`reference_codec` must have the bucket size of `codec` (one fusion "
        f"plan serves both). Received: reference_codec.bucket_size="
        f"{reference_codec.bucket_size} and codec.bucket_size="
        f"{codec.bucket_size}.")
  if reference_replicas is None:
    reference_replicas = DEFAULT_REFERENCE_REPLICAS
  if isinstance(reference_replicas, bool) or not (
      (isinstance(reference_replicas, int) and reference_replicas >= 1) or
      (isinstance(reference_replicas, float) and 0 < reference_replicas < 1)):
    raise ValueError(
        f"`{group}` must be an int >= 1 or a float in (0, 1). "
        f"Received: {group}={reference_replicas!r}.")
  mmse = getattr(codec, "alpha", None) == "mmse"
  if adaptive is None:
    adaptive = mmse
  if not isinstance(adaptive, bool):
    raise ValueError(
        f"`adaptive` must be a bool or None. Received: adaptive={adaptive!r}.")
  if mmse and not adaptive:
    raise ValueError(
        f"`alpha='mmse'` is only defined in the adaptive mode: pass "
        f"adaptive=True (or leave it None). Received: codec={codec!r}, "
        f"adaptive=False.")
  if adaptive:
    if not getattr(codec, "accepts_noise_scale", False):
      raise ValueError(
          f"`adaptive=True` needs a codec whose encode takes `noise_scale` "
          f"(ndq_tf.NestedDitheredCodec). Received: codec={codec!r}.")
    if codec.coarse_ratio % 2 == 0:
      raise ValueError(
          f"`adaptive=True` needs an odd `coarse_ratio` (the codec's DQSG "
          f"fallback is symmetric). Received: codec={codec!r}.")
  return reference_codec, reference_replicas, adaptive


def reference_count(reference_replicas, num_replicas,
                    group="reference_replicas"):
  """Size of the reference group P1 among `num_replicas` replicas.

  A count is used as is; a fraction `f` gives `max(1, round(f·P))`, at most
  `P - 1` (as `ndq_tf.MultiWorkerMirroredStrategy` counts workers).

  Args:
    reference_replicas: an int >= 1 or a float in (0, 1), or None (0).
    num_replicas: `P`, the number of replicas (senders).

  Returns:
    An int in `[1, P - 1]`; 0 when `reference_replicas` is None or
    `P < 2` (as `ndq_tf.MultiWorkerMirroredStrategy`).

  Raises:
    ValueError: if an int count leaves no nested replica (`count >= P`).
  """
  if reference_replicas is None or num_replicas < 2:
    return 0  # One replica: nothing is all-reduced, nothing compressed.
  if isinstance(reference_replicas, float):
    return min(num_replicas - 1,
               max(1, int(round(reference_replicas * num_replicas))))
  if reference_replicas >= num_replicas:
    raise ValueError(
        f"`{group}` must leave at least one nested sender among the "
        f"{num_replicas} senders (1 <= count < {num_replicas}). "
        f"Received: {group}={reference_replicas!r}.")
  return reference_replicas


def next_noise_scale(previous, measured):
  """The adaptive mode's noise state: an envelope of the measured RMS.

  `max(measured, NOISE_MEMORY·previous)` per bucket (`measured` where
  `previous` is NaN; NaN where `measured` is). A bucket's noise jumps
  between steps (0.5-2× on the digits MLP), and a bucket qualifies for
  nested coding exactly after a quiet step, so a step sized from the last
  RMS alone is too small exactly where it is used (on Fashion-MNIST the
  Gaussian overload prediction at the true RMS matched the counted 0.7%).
  The envelope forgets a loud step over about `1/(1 - NOISE_MEMORY)` calls.
  Measured on 100 steps of the Fashion-MNIST CNN of
  benchmarks/paper_experiment.py: counted overloads 0.68% without it,
  0.27% with `NOISE_MEMORY = 0.9`, 0.21% with 0.95, with the same share of
  buckets nested (17-18%).
  """
  decayed = NOISE_MEMORY * previous
  envelope = tf.maximum(measured, decayed)
  envelope = tf.where(tf.math.is_nan(previous), measured, envelope)
  return tf.where(tf.math.is_nan(measured), measured, envelope)


def next_noise_gain(gain, bucket_overloads, bucket_elements, target):
  """The adaptive mode's feedback: a sender's per-bucket gains, next call.

  A sender encodes bucket `b` with `noise_scale = gain_b·σ_b`, `σ_b` the
  exact RMS of its last call's `z = g - y` there. The codec sizes the step
  so that a *Gaussian* `z` of that scale would overload with probability
  `target`; real gradient noise has heavier tails, differs between buckets
  and changes from step to step (measured on the digits MLP: 5e-3 of `|z|`
  beyond 3.9·RMS instead of 1e-4, and the RMS of one step 0.5-2× the last
  one's). The gain corrects for that bucket by bucket, from the sender's
  own ground truth: `bucket_overloads` (`E_b`, what the step it used would
  overload on average given the exact `z`, nested or DQSG-fallback bucket
  alike; `fusion.nested_sender_statistics`) against the goal
  `G_b = target·n_b`: `gain_b·sqrt((E_b + 1)/(G_b + 1))`, the factor
  clipped to `NOISE_GAIN_STEPS` and the gain to `NOISE_GAIN_RANGE`;
  unchanged where `E_b` is unknown (NaN). A bucket whose step was safe
  (`E_b = 0`) lowers its gain a little (by 2.5% for 512 elements at a 1e-4
  target), one that overloaded raises it more, up to 4× at once when many
  elements did (a Gaussian's overload rate falls from 10% to 1e-4 over a
  2.2× larger step), so each settles where overloads are rare events. The
  `+ 1` keeps a bucket whose goal is far below one element from being
  driven down by every call without an overload (measured on the digits
  MLP: `+ 1/2` overloaded 0.33% of the nested elements, `+ 1` 0.18-0.2%).

  Args:
    gain: `float32` `[num_buckets]` (or broadcastable), the current gains.
    bucket_overloads: `float32` `[num_buckets]`, `E_b`.
    bucket_elements: `float32` `[num_buckets]`, real elements `n_b`.
    target: the codec's `overload_target`.

  Returns:
    `float32`, the new gains.
  """
  goal = target * tf.cast(bucket_elements, tf.float32)
  ratio = (tf.cast(bucket_overloads, tf.float32) + 1.0) / (goal + 1.0)
  factor = tf.clip_by_value(tf.sqrt(ratio), *NOISE_GAIN_STEPS)
  factor = tf.where(tf.math.is_finite(factor), factor, tf.ones_like(factor))
  return tf.clip_by_value(gain * factor, *NOISE_GAIN_RANGE)


def next_noise_state(noise_scale, gain, statistics, plan, target, adaptive):
  """One nested sender's noise scales and gains after a call.

  Shared by `CompressedAllReduce` and the multi-worker strategy. The fixed
  mode keeps the measured RMS and leaves the gains alone; the adaptive
  mode keeps the envelope (`next_noise_scale`) and feeds the gains back
  (`next_noise_gain`).

  Args:
    noise_scale: `float32` `[num_buckets]`, the sender's previous scales.
    gain: `float32` `[num_buckets]`, its previous gains.
    statistics: its `fusion.nested_sender_statistics` of this call.
    plan: the `FusionPlan`.
    target: the codec's `overload_target`.
    adaptive: whether the sender is in the adaptive mode.

  Returns:
    `(noise_scale, gain)`, the new values.
  """
  measured = statistics["noise_scale"]
  if not adaptive:
    return measured, gain
  counts = tf.constant(plan.bucket_counts().astype("float32"))
  return (next_noise_scale(noise_scale, measured),
          next_noise_gain(gain, statistics["bucket_overloads"], counts,
                          target))


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
  measured from the wires' sizes), `last_sender_bits` (the payload of each
  sender), `wire_bits_per_element`, `compression_ratio`; with a nested
  codec also `last_overload_probability` and `last_fallback_fraction`; see
  also `stats()` and `ndq_tf.CompressionStats`.

  Nested codecs (NDQSG, the paper's Algorithm 2): with
  `codec=ndq_tf.NestedDitheredCodec(...)`, pass `reference_codec` (a codec
  without side information and with the same `bucket_size`, e.g.
  `ndq_tf.DitheredCodec(num_levels=3)`) and `reference_replicas`. Replicas
  `0 .. |P1| - 1` (P1) send `reference_codec`, the others (P2) nested codes
  (`log2 coarse_ratio` bits per element); every destination decodes P1
  first, then each P2 sender in replica order with side information = the
  mean of all buffers decoded before it (`fusion.decode_senders`), so every
  replica still gets bitwise the same result. `reference_replicas` is a
  count (`1 <= count < P`, checked once the number of replicas `P` is known)
  or a fraction `f` in `(0, 1)`: `max(1, round(f·P))`, at most `P - 1`;
  default 0.5. The arguments follow `ndq_tf.MultiWorkerMirroredStrategy`'s
  `reference_codec` / `reference_workers`.

  Nested codecs in fixed mode (`adaptive=False`, the default unless
  `alpha="mmse"`) send `Δ1 = κ/num_levels`, `Δ2 = coarse_ratio·Δ1`: an
  element overloads (decodes off by a multiple of `α·κ·Δ2`, silently) when
  `|α(g_p - y_p) + e| >= Δ2/2`.

  Overload is silent at the receivers, but not at its sender: the nested
  sender `p` knows its own gradient `g_p`, and decodes its own payload with
  the side information `y_p` every replica uses (every destination decodes
  every sender). So on its own device it measures, every call, the exact
  noise `z = g_p - y_p` per bucket and counts the elements that really
  overloaded (`fusion.nested_sender_statistics`); only `[num_buckets]`
  floats and a few scalars leave the device. Telemetry of the last call,
  summed over the nested senders: `last_overloads` and `last_overload_rate`
  (counted, ground truth), `last_overload_probability` (what a Gaussian `z`
  of the measured RMS would give: the gap between the two is the tails of
  real gradient noise), `last_fallback_fraction`.

  Automatic mode (`adaptive=True`, implied by the codec's `alpha="mmse"`):
  every nested sender encodes bucket `b` with `noise_scale = gain_pb·σ_pb`,
  `σ_pb` an envelope of its own exact RMS of `z` there in the *previous*
  calls on the same fused buffer (`next_noise_scale`;
  `noise_scale(num_buckets)`, row `p`; NaN at first). The
  codec picks per bucket the fine step whose Gaussian overload probability
  is its `overload_target`, or falls back to DQSG with `coarse_ratio`
  symbols where that would not beat it (every bucket on the first call:
  `last_fallback_fraction` is 1.0). Real gradient noise is heavier-tailed
  than a Gaussian, differs between buckets and changes between steps, so
  the step alone would overload far more often than the target (measured
  on the digits MLP of the tests: 1.8% instead of 1e-4). The gains
  (`noise_gain(num_buckets)`, 1.0 at first) correct it bucket by bucket
  from the sender's ground truth (`next_noise_gain`): what the step it
  used would overload on average given the exact `z`, for DQSG-fallback
  buckets too, so that they can come back. A larger gain also moves the
  bucket towards the DQSG fallback, whose error is unbiased and bounded:
  where nested coding cannot be made safe, the automatic mode becomes
  DQSG, at the same wire size. Nothing extra is sent: only the steps each
  sender picked, in the scales of its payload. The noise scales and gains
  are saved with the step counter.

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
      A nested codec (`NestedDitheredCodec`) needs `reference_codec`.
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
    reference_codec: nested `codec` only (required then): the codec of the
      reference replicas P1, decoded first; a codec (or spec string / config
      dict) without side information, of `codec`'s `bucket_size`.
    reference_replicas: nested `codec` only: size of P1, an int count
      `>= 1` or a fraction in `(0, 1)`; default 0.5.
    adaptive: nested `codec` only: every P2 sender encodes with its own
      noise of the previous call times its gain (see "Automatic mode").
      None: True iff `codec.alpha` is `"mmse"` (which needs it).

  Raises:
    TypeError: if `codec` or `reference_codec` is not a codec or `fallback`
      not a CrossDeviceOps.
    ValueError: for a bad `min_elements` or `seed`, a nested codec without
      `reference_codec`, a `reference_codec` that needs side information or
      has another bucket size, a bad `reference_replicas` or `adaptive`,
      reference arguments with a codec that is not nested, or when created
      inside a `tf.distribute.Strategy` scope (its variables must be plain
      host variables, not mirrored ones).
  """

  def __init__(self,
               codec,
               min_elements=DEFAULT_MIN_ELEMENTS,
               seed=0,
               compress_indexed_slices=False,
               fallback=None,
               name="compressed_all_reduce",
               reference_codec=None,
               reference_replicas=None,
               adaptive=None):
    tf.distribute.CrossDeviceOps.__init__(self)
    tf.Module.__init__(self, name=name)
    codec = _check_codec_like(codec, "codec")
    reference_codec, reference_replicas, adaptive = check_reference(
        codec, reference_codec, reference_replicas, adaptive)
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
    self._reference_codec = reference_codec
    self._reference_replicas = reference_replicas
    self._adaptive = adaptive
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
      # Payload bits of every sender (in replica order) in the last call.
      self._sender_bits = tf.Variable(
          tf.zeros([0], tf.int64), trainable=False, shape=tf.TensorShape(
              [None]), name="sender_bits")
      if self.needs_reference:
        self._nested_telemetry = {
            key: tf.Variable(0.0, dtype=tf.float32, trainable=False,
                             name=key)
            for key in ("overload_probability", "fallback_fraction")
        }
        # Ground truth, counted by every nested sender on its own device.
        self._nested_telemetry.update({
            key: tf.Variable(0, dtype=tf.int64, trainable=False, name=key)
            for key in ("overloads", "nested_elements")
        })
    # Per-sender, per-bucket noise scales and gains of the nested
    # senders, one variable each per fused buffer size (`buckets_<n>`),
    # created on first use (`nested_state`).
    self._noise_scales = {}
    self._noise_gains = {}

  # -- Configuration ----------------------------------------------------------

  @property
  def codec(self):
    return self._codec

  @property
  def reference_codec(self):
    """The codec of the reference replicas P1 (None without a nested codec)."""
    return self._reference_codec

  @property
  def reference_replicas(self):
    """Size of P1: an int count or a fraction (None without a nested codec)."""
    return self._reference_replicas

  @property
  def adaptive(self):
    """Whether the nested senders encode with their own last noise scale."""
    return self._adaptive

  @property
  def needs_reference(self):
    """Whether `codec` is nested (senders split into P1 and P2)."""
    return self._reference_codec is not None

  def reference_count(self, num_replicas):
    """Size of P1 for `num_replicas` replicas (0 without a nested codec).

    Raises:
      ValueError: if `reference_replicas` leaves no nested replica.
    """
    return reference_count(self._reference_replicas, num_replicas)

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
    config = {
        "codec": keras.saving.serialize_keras_object(self._codec),
        "min_elements": self._min_elements,
        "seed": self._seed,
        "compress_indexed_slices": self._compress_indexed_slices,
        "name": self.name,
    }
    if self.needs_reference:
      config["reference_codec"] = keras.saving.serialize_keras_object(
          self._reference_codec)
      config["reference_replicas"] = self._reference_replicas
      config["adaptive"] = self._adaptive
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    config["codec"] = keras.saving.deserialize_keras_object(config["codec"])
    if isinstance(config.get("reference_codec"), dict):
      config["reference_codec"] = keras.saving.deserialize_keras_object(
          config["reference_codec"])
    return cls(**config)

  def __repr__(self):
    nested = ""
    if self.needs_reference:
      nested = (f", reference_codec={self._reference_codec!r}, "
                f"reference_replicas={self._reference_replicas!r}, "
                f"adaptive={self._adaptive}")
    return (f"CompressedAllReduce(codec={self._codec!r}, min_elements="
            f"{self._min_elements}, seed={self._seed}{nested})")

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

  @property
  def last_sender_bits(self):
    """Payload bits of every sender, in replica order, in the last call.

    With a nested codec the reference replicas (first) and the nested ones
    differ. Compressed payloads only (lossless small tensors excluded).
    """
    return [int(b) for b in self._sender_bits.numpy()]

  @property
  def last_overload_probability(self):
    """Nested codecs: Gaussian overload probability per element, last call.

    What a Gaussian `z = g_p - y_p` would give: the mean over the nested
    senders' real elements in nested buckets of
    `fusion.overload_probability(α, σ_pb, Δ1_pb, k)`, with the fine step
    `Δ1_pb` each bucket was sent with and `σ_pb` the exact RMS of `z` in
    that bucket in the same call (measured by the sender). Compare it with
    the counted `last_overload_rate`: real gradient noise has heavier tails.
    NaN without a nested codec; 0 if every bucket fell back.
    """
    if not self.needs_reference:
      return float("nan")
    return float(self._nested_telemetry["overload_probability"].numpy())

  @property
  def last_fallback_fraction(self):
    """Nested codecs: fraction of the nested senders' buckets sent as DQSG.

    Only the adaptive mode falls back (1.0 on its first call); NaN without
    a nested codec.
    """
    if not self.needs_reference:
      return float("nan")
    return float(self._nested_telemetry["fallback_fraction"].numpy())

  @property
  def last_overloads(self):
    """Nested codecs: elements that really overloaded in the last call.

    Ground truth, not an estimate: every nested sender, which knows its own
    gradient, decodes its own wire with the side information every replica
    uses and counts the elements that came out off by a multiple of the
    coarse step (`fusion.nested_sender_statistics`); summed over the nested
    senders, real elements of nested buckets only. 0 without a nested codec.
    """
    if not self.needs_reference:
      return 0
    return int(self._nested_telemetry["overloads"].numpy())

  @property
  def last_overload_rate(self):
    """Nested codecs: measured overloads per nested element, last call.

    `last_overloads` divided by the real elements the nested senders sent
    in nested (not DQSG-fallback) buckets; compare it with the estimate
    `last_overload_probability`. NaN without a nested codec or when every
    bucket fell back.
    """
    if not self.needs_reference:
      return float("nan")
    total = int(self._nested_telemetry["nested_elements"].numpy())
    return self.last_overloads / total if total else float("nan")

  def noise_scale(self, num_buckets):
    """The `float32` `[senders, num_buckets]` variable of noise scales.

    Nested codecs: after every compressed call whose fused buffer has
    `num_buckets` buckets, row `p` holds, for every nested sender `p`, the
    exact RMS of `z = g_p - y_p` per bucket in that call (its own gradient
    minus the side information it was decoded with; NaN rows for the
    reference senders); in the adaptive mode, its envelope over the calls
    (`next_noise_scale`). The adaptive mode encodes sender `p`'s next call
    with `noise_gain(num_buckets)[p]` times row `p`. NaN until the first
    call. Created on first use, on the host CPU, outside any distribution
    strategy, and tracked (checkpoint key `_noise_scales/buckets_<n>`).

    Args:
      num_buckets: buckets of the fused buffer (`plan.total_size //
        bucket_size`).

    Returns:
      The variable, or None if no call with that buffer ran yet.
    """
    return self._noise_scales.get(f"buckets_{int(num_buckets)}")

  def noise_gain(self, num_buckets):
    """The `float32` `[senders, num_buckets]` noise gains (`next_noise_gain`).

    1.0 until the first call (and in the fixed mode); tracked
    (`_noise_gains/buckets_<n>`). None if no call with that buffer ran yet.
    """
    return self._noise_gains.get(f"buckets_{int(num_buckets)}")

  def noise_scales(self):
    """All noise-scale variables, as a dict `{num_buckets: variable}`."""
    return {int(k.split("_")[1]): v for k, v in self._noise_scales.items()}

  def noise_gains(self):
    """All noise-gain variables, as a dict `{num_buckets: variable}`."""
    return {int(k.split("_")[1]): v for k, v in self._noise_gains.items()}

  def nested_state(self, num_buckets, num_senders):
    """`(noise_scale, noise_gain)` of a buffer, created if need be.

    Args:
      num_buckets: buckets of the fused buffer.
      num_senders: replicas (all senders, reference ones included).

    Raises:
      ValueError: if the variables exist for another number of senders.
    """
    key = f"buckets_{int(num_buckets)}"
    if key not in self._noise_scales:
      with tf.init_scope(), tf.device(self._step.device), \
          tf.variable_creator_scope(_plain_variable_creator):
        self._noise_scales[key] = tf.Variable(
            tf.fill([int(num_senders), int(num_buckets)], math.nan),
            trainable=False, name=f"noise_scale_{key}")
        self._noise_gains[key] = tf.Variable(
            tf.ones([int(num_senders), int(num_buckets)]), trainable=False,
            name=f"noise_gain_{key}")
    sigma, gain = self._noise_scales[key], self._noise_gains[key]
    if sigma.shape[0] != num_senders:
      raise ValueError(
          f"The noise state of the buffer of {num_buckets} buckets was made "
          f"for {sigma.shape[0]} senders. Received: {num_senders} senders.")
    return sigma, gain

  def stats(self):
    """All telemetry of the last compressed call as a dict of Python numbers."""
    stats = {
        "step": int(self._step.numpy()),
        "wire_bits": self.last_wire_bits,
        "float32_bits": self.last_float32_bits,
        "compressed_bits": self.last_compressed_bits,
        "elements": self.last_num_elements,
        "compressed_elements": self.last_compressed_elements,
        "senders": self.last_num_senders,
        "wire_bits_per_element": self.wire_bits_per_element,
        "compression_ratio": self.compression_ratio,
        "sender_bits": self.last_sender_bits,
    }
    if self.needs_reference:
      stats["overload_probability"] = self.last_overload_probability
      stats["fallback_fraction"] = self.last_fallback_fraction
      stats["overloads"] = self.last_overloads
      stats["overload_rate"] = self.last_overload_rate
    return stats

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
    """The codec of every sender, in decode order.

    With a nested codec: `reference_codec` for replicas `0 .. |P1| - 1`,
    then `codec` for the others (decoded in that order).
    """
    count = self.reference_count(num_senders)
    return ([self._reference_codec] * count
            + [self._codec] * (num_senders - count))

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

    nested = [s for s, c in enumerate(codecs)
              if getattr(c, "needs_side_information", False)]
    noise_scale = None
    if nested:
      num_buckets = plan.total_size // plan.bucket_size
      sigma_variable, gain_variable = self.nested_state(num_buckets,
                                                        num_senders)
      if self._adaptive:
        with tf.device(sigma_variable.device):
          # Each nested sender's own last noise, times its gain: known to
          # the sender alone; only the steps it picks travel (in the wire).
          noise_scale = (sigma_variable.read_value()
                         * gain_variable.read_value())

    # Senders are indexed by replica (the order of `devices`), and decoded
    # in that order by every destination (fusion.decode_senders).
    wires, fused = [], []
    for s, device in enumerate(devices):
      with tf.device(device):
        fused.append(plan.flatten(per_sender[s]))
        wires.append(fusion.encode_flat(
            codecs[s], fused[s], seeds[s], plan,
            noise_scale=(noise_scale[s] if noise_scale is not None
                         and s in nested else None)))

    mean = reduce_op == tf.distribute.ReduceOp.MEAN
    per_destination = []
    statistics = {}
    for d, device in enumerate(devices):
      with tf.device(device):
        # The only cross-device copies of the compressed path: int32 wires
        # (and the [2] seeds).
        received = [tf.identity(w) for w in wires]
        if d in nested:
          decoded, side = fusion.decode_senders(
              codecs, received, seeds, plan, return_side_information=True)
          # The nested sender on this device knows its true gradient: its
          # exact noise and real overloads (only [num_buckets] floats and
          # a few scalars leave the device).
          statistics[d] = fusion.nested_sender_statistics(
              codecs[d], received[d], fused[d], side[d],
              decoded[d], plan,
              noise_scale=None if noise_scale is None else noise_scale[d])
        else:
          decoded = fusion.decode_senders(codecs, received, seeds, plan)
        per_destination.append(fusion.sum_decoded(decoded, plan, mean=mean))

    if nested:
      self._update_nested_state(statistics, sigma_variable, gain_variable,
                                num_senders, plan)

    self._record(plan, wires, pairs, lossless, num_senders)
    with tf.device(self._step.device):
      self._step.assign_add(1)

    return [
        distribute_utils.regroup(
            [per_destination[d][k] for d in range(num_senders)],
            wrap_class=value_lib.Mirrored)
        for k in range(len(compressed))
    ]

  def _update_nested_state(self, statistics, sigma_variable, gain_variable,
                           num_senders, plan):
    """Stores the nested senders' noise, gains and telemetry of one call."""
    nested = sorted(statistics)
    num_buckets = plan.total_size // plan.bucket_size
    target = float(self._codec.overload_target)
    with tf.device(sigma_variable.device):
      sigmas = sigma_variable.read_value()
      gains = gain_variable.read_value()
      # Reference senders' rows: NaN scales, gains unchanged.
      rows = [next_noise_state(sigmas[p], gains[p], statistics[p], plan,
                               target, self._adaptive)
              if p in statistics else
              (tf.fill([num_buckets], math.nan), gains[p])
              for p in range(num_senders)]
      sigma_variable.assign(tf.stack([sigma for sigma, _ in rows]))
      gain_variable.assign(tf.stack([gain for _, gain in rows]))
      total = {key: tf.add_n([statistics[p][key] for p in nested])
               for key in ("overloads", "nested_elements",
                           "expected_overloads", "fallback_buckets")}
      t = self._nested_telemetry
      t["overloads"].assign(total["overloads"])
      t["nested_elements"].assign(total["nested_elements"])
      t["overload_probability"].assign(tf.cast(tf.math.divide_no_nan(
          total["expected_overloads"],
          tf.cast(total["nested_elements"], tf.float64)), tf.float32))
      t["fallback_fraction"].assign(
          tf.cast(total["fallback_buckets"], tf.float32)
          / float(num_buckets * len(nested)))

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
      sender_bits = tf.stack(
          [tf.size(w, out_type=tf.int64) for w in wires]) * 32
      self._sender_bits.assign(sender_bits)
      compressed_bits = tf.reduce_sum(sender_bits)
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


def _plain_variable_creator(next_creator, **kwargs):
  """Creates a plain host variable even inside a strategy's scope.

  `batch_reduce` runs inside the strategy's scope (merge_call), where
  `tf.Variable` would make a mirrored variable; the noise scales, like the
  step counter, are one host variable.
  """
  del next_creator
  return resource_variable_ops.ResourceVariable(**kwargs)
