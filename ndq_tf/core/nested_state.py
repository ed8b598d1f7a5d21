"""The nested senders' own measurements, and the adaptive mode's state.

A nested sender knows its own gradient `g`; decoding its own payload with the
side information `y` every receiver uses, it knows the exact noise
`z = g - y` of every bucket and every element that overloaded. This module
holds what is computed from that:

* `sender_statistics`: one XLA-compiled pass over the sender's buffers
  giving per-bucket RMS of `z`, counted overloads and the Gaussian
  prediction (`overload_probability`, `ndq_tf.theory.overload_probability`
  in TensorFlow).
* The adaptive mode's state, in the style of optax: a `NoiseState`
  (`scale`, `gain`, per local sender and bucket) made by `init` and advanced
  by `update`, pure functions of tensors.
* `NestedStateStore`, the `tf.Module` that keeps one `NoiseState` per fusion
  plan in variables (keyed by the plan's `signature`: shapes and dtypes,
  not the bucket count), so that both strategies checkpoint it.

The rules (envelope, gain feedback) are in docs/algorithms.md; the
measurements behind their constants in docs/distribute.md ("The adaptive
nested mode's constants").
"""

import collections
import math

import numpy as np
import tensorflow as tf

from ndq_tf import theory
from ndq_tf.core import fusion_codec
from ndq_tf.core import tf_internals
from ndq_tf.ops import rotation_ops

__all__ = [
    "NOISE_GAIN_RANGE",
    "NOISE_GAIN_STEPS",
    "NOISE_MEMORY",
    "NestedStateStore",
    "NoiseState",
    "init",
    "next_noise_gain",
    "next_noise_scale",
    "overload_probability",
    "sender_statistics",
    "update",
]

#: Bounds of a sender's noise gains, and the most one may fall and rise per
#: call (factors; see `next_noise_gain`).
NOISE_GAIN_RANGE = (0.25, 16.0)
NOISE_GAIN_STEPS = (0.8, 4.0)
#: How much of a bucket's last noise envelope the next call keeps (see
#: `next_noise_scale`).
NOISE_MEMORY = 0.95

#: The statistics of one nested sender in one call (`sender_statistics`).
STATISTICS_KEYS = ("noise_scale", "overloads", "nested_elements",
                   "expected_overloads", "fallback_buckets",
                   "bucket_overloads")


class NoiseState(collections.namedtuple("NoiseState", ["scale", "gain"])):
  """The adaptive mode's state of some senders: `float32` `[senders, buckets]`.

  `scale`: per bucket, the exact RMS of the sender's `z` in its last call
  (the adaptive mode keeps an envelope over calls); NaN before the first
  call and for senders that are not nested. `gain`: the per-bucket factor
  fed back from the sender's counted overloads, 1 at first.
  """


def init(num_senders, num_buckets):
  """The initial `NoiseState`: NaN scales (unknown), unit gains."""
  return NoiseState(tf.fill([int(num_senders), int(num_buckets)], math.nan),
                    tf.ones([int(num_senders), int(num_buckets)]))


def next_noise_scale(previous, measured):
  """The adaptive mode's noise envelope: `max(measured, NOISE_MEMORY·previous)`.

  Per bucket; `measured` where `previous` is NaN; NaN where `measured` is.
  A bucket's noise jumps between steps and a bucket qualifies for nested
  coding right after a quiet step, so a step sized from the last RMS alone
  is too small exactly where it is used; the envelope forgets a loud step
  over about `1/(1 - NOISE_MEMORY)` calls.
  """
  envelope = tf.maximum(measured, NOISE_MEMORY * previous)
  envelope = tf.where(tf.math.is_nan(previous), measured, envelope)
  return tf.where(tf.math.is_nan(measured), measured, envelope)


def next_noise_gain(gain, bucket_overloads, bucket_elements, target):
  """The adaptive mode's feedback: a sender's per-bucket gains, next call.

  A sender encodes bucket `b` with `noise_scale = gain_b·σ_b`; the codec
  sizes the step so that a *Gaussian* `z` of that scale would overload with
  probability `target`. Real gradient noise has heavier tails and changes
  between steps, so the gain corrects the step bucket by bucket from the
  sender's own ground truth: `E_b` (`bucket_overloads`, what the step it
  used would overload on average given the exact `z`, for nested and
  DQSG-fallback buckets alike) against the goal `G_b = target·n_b`:
  `gain_b·sqrt((E_b + 1)/(G_b + 1))`, the factor clipped to
  `NOISE_GAIN_STEPS` and the gain to `NOISE_GAIN_RANGE`; unchanged where
  `E_b` is NaN. A safe bucket lowers its gain a little, one that overloaded
  raises it more, so each settles where overloads are rare; the `+ 1`
  keeps a bucket whose goal is far below one element from being driven down
  by every call without an overload.

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


def update(state, statistics, plan, target, adaptive):
  """One sender's `NoiseState` row after a call.

  The fixed mode keeps the measured RMS and leaves the gain alone; the
  adaptive mode keeps the envelope (`next_noise_scale`) and feeds the gain
  back (`next_noise_gain`).

  Args:
    state: `NoiseState` of `[num_buckets]` tensors (one sender's row).
    statistics: the sender's `sender_statistics` of this call.
    plan: the `FusionPlan`.
    target: the codec's `overload_target`.
    adaptive: whether the sender is in the adaptive mode.

  Returns:
    The new `NoiseState` row.
  """
  measured = statistics["noise_scale"]
  if not adaptive:
    return NoiseState(measured, state.gain)
  counts = statistics.get("bucket_elements")
  if counts is None:
    counts = tf.constant(plan.bucket_counts().astype("float32"))
  return NoiseState(
      next_noise_scale(state.scale, measured),
      next_noise_gain(state.gain, statistics["bucket_overloads"], counts,
                      target))


class NestedStateStore(tf.Module):
  """Keeps a `NoiseState` per fusion plan in variables, for checkpoints.

  One pair of `float32` `[senders, buckets]` variables per plan signature
  (`FusionPlan.signature`), created on first use on `device` as plain host
  variables (also inside a strategy's scope); tracked, so
  `tf.train.Checkpoint` saves them (keys `scales/<signature>` and
  `gains/<signature>`), and the strategies put them in `.weights.h5` files.

  Args:
    device: where the variables live.
    name: the module's name.
  """

  def __init__(self, device="/device:CPU:0", name="nested_state"):
    super().__init__(name=name)
    self._device = device
    self.scales = {}
    self.gains = {}

  def variables_for(self, signature, num_senders, num_buckets):
    """`(scale, gain)` variables of a plan, created if need be.

    Raises:
      ValueError: if they exist with another shape (another number of
        senders).
    """
    if signature not in self.scales:
      with tf.init_scope(), tf.device(self._device):
        initial = init(num_senders, num_buckets)
        self.scales[signature] = tf_internals.plain_variable(
            initial.scale, trainable=False, name=f"noise_scale_{signature}")
        self.gains[signature] = tf_internals.plain_variable(
            initial.gain, trainable=False, name=f"noise_gain_{signature}")
    scale, gain = self.scales[signature], self.gains[signature]
    expected = [int(num_senders), int(num_buckets)]
    if scale.shape.as_list() != expected:
      raise ValueError(
          f"The noise state of plan {signature} was made for shape "
          f"{scale.shape.as_list()} (senders, buckets). Received: {expected}.")
    return scale, gain

  def read(self, signature):
    """The `NoiseState` of a plan (variables' values), or None."""
    if signature not in self.scales:
      return None
    return NoiseState(self.scales[signature].read_value(),
                      self.gains[signature].read_value())

  def items(self):
    """`(signature, (scale variable, gain variable))` for every plan."""
    return [(k, (self.scales[k], self.gains[k])) for k in sorted(self.scales)]

  def save(self, store, prefix="noise"):
    """Writes every plan's state into a dict-like `store` (`.weights.h5`)."""
    for signature, (scale, gain) in self.items():
      store[f"{prefix}_scale_{signature}"] = np.asarray(scale.numpy())
      store[f"{prefix}_gain_{signature}"] = np.asarray(gain.numpy())

  def load(self, store, prefix="noise"):
    """Restores what `save` wrote (keys it does not know are ignored)."""
    try:
      keys = list(store.keys())
    except AttributeError:  # pragma: no cover
      return
    head = f"{prefix}_scale_"
    for key in keys:
      if not key.startswith(head):
        continue
      signature = key[len(head):]
      scale = np.asarray(store[key])
      gain = np.asarray(store[f"{prefix}_gain_{signature}"])
      scale_variable, gain_variable = self.variables_for(
          signature, *scale.shape)
      scale_variable.assign(scale)
      gain_variable.assign(gain)


def sender_statistics(codec, wire, values, side_information, decoded,
                      plan, noise_scale=None, scales=None, seed=None,
                      chunk=None):
  """What a nested sender learns by decoding its own wire, with ground truth.

  Overload is silent at the receivers, but the sender knows its own gradient
  `g`: once it has decoded its own wire with the side information `y` every
  receiver uses (it decodes every sender anyway), it knows the exact noise
  `z = g - y` and every element that came out wrong. In the absolute units
  of the gradient, with `δ1 = |scale|/num_levels` and `δ2 = k·δ1` a bucket's
  fine and coarse steps, decoding gives `ĝ - y = α²z + α·e - α·δ2·j` with
  `|e| <= δ1/2` and the integer `j` zero exactly when the element did not
  overload, so `j = round((α²z - (ĝ - y))/(α·δ2))` (exact: the rounding
  has a margin of `1/2 - 1/(2k)` cells). Only real elements (not the
  padding) count; DQSG-fallback buckets (negative scale) cannot overload.

  A rotated codec (`codec.rotation`) codes and overloads in the rotated
  domain, so everything is counted there: `values`, `side_information` and
  `decoded` are rotated with the sender's signs (those of `seed`, as its
  encoder drew them) and all `d` coefficients of a bucket count, the
  padding's too (a rotated bucket is sent whole). `noise_scale` stays in
  the orthonormal units the codec takes (`rotate`'s output divided by
  `rotation_ops.domain_gain`); its squared sum over a bucket is the
  unrotated one's (the rotation is orthogonal).

  Args:
    codec: the sender's nested codec (`needs_side_information`).
    wire: its 1-D `int32` wire.
    values: the sender's own fused buffer (`plan.flatten(tensors)`).
    side_information: the fused side information it was decoded with.
    decoded: its decoded fused buffer (`decode_senders`).
    plan: the `FusionPlan` (with buckets).
    noise_scale: adaptive mode: the `float32` `[num_buckets]` noise scales
      the sender encoded this call with (`encode_fused`), for
      `bucket_overloads`; None otherwise.
    scales: the wire's per-bucket scales (`fusion_codec.wire_scales`),
      instead of `wire` (None then): an exchange in chunks has one wire per
      chunk.
    seed: the sender's shape-`[2]` seed of this call (the one given to
      `fusion_codec.encode_flat`); needed, and only used, with a rotation.
    chunk: a `fusion_plan.Chunk` of whole buckets of the one segment (a
      reduce-scatter shard): `values`, `side_information`, `decoded` (and
      `wire`, `scales`) hold only its elements, and everything is counted
      over its buckets alone (a rotated codec's signs are those of its
      place in the buffer). None: the whole buffer.

  Returns:
    A dict of tensors:
    * `noise_scale`: `float32` `[num_buckets]`, the RMS of `z` over each
      bucket's real elements (what the adaptive mode encodes the next call
      with; NaN for a bucket holding a NaN or Inf);
    * `overloads`: `int64`, real elements of nested buckets decoded wrong;
    * `nested_elements`: `int64`, real elements of nested buckets;
    * `expected_overloads`: `float64`, the Gaussian prediction of
      `overloads` from this call's `noise_scale` and steps (the sum over
      nested buckets of `count·overload_probability(α, σ_b, δ1_b, k)`);
    * `fallback_buckets`: `int64`, buckets sent as DQSG;
    * `bucket_overloads`: `float32` `[num_buckets]`, with `noise_scale`:
      for every bucket, nested or not, the overloads its real elements
      would have had on average over the dither at the adaptive step
      `δ1_b = r·noise_scale_b` (`r = theory.auto_nested_step_ratio`), given
      the exact `z`: `Σ_i clip((α|z_i| - (k - 1)·δ1_b/2)/δ1_b, 0, 1)`
      (the probability that `|α·z_i + e| >= k·δ1_b/2` for
      `e ~ U[-δ1_b/2, δ1_b/2]`); NaN where that step is not positive and
      finite. All NaN without `noise_scale`;
    * `bucket_elements`: `float32` `[num_buckets]`, the elements counted
      per bucket (`plan.bucket_counts()`; `d` everywhere when rotated), the
      adaptive gains' goal.
    With `chunk`, the per-bucket tensors have the chunk's buckets
    (`noise_scale`, given per bucket of the whole buffer, is sliced).

  Raises:
    ValueError: if `codec` is not nested or the plan has no buckets, or
      `seed` is missing for a rotated codec.
  """
  if not getattr(codec, "needs_side_information", False):
    raise ValueError(
        f"`sender_statistics` needs a nested codec (with side "
        f"information). Received: codec={codec!r}.")
  rotated = getattr(codec, "rotation", None) is not None
  if rotated and seed is None:
    raise ValueError(
        f"`sender_statistics` of a rotated codec needs the sender's `seed` "
        f"(its rotation's signs). Received: seed=None for codec={codec!r}.")
  if scales is None:
    scales = fusion_codec.wire_scales(codec, wire, plan, chunk)
  alpha = float(codec.adaptive_alpha)
  kernel = _statistics_kernel(
      alpha, codec.coarse_ratio, codec.num_levels, plan.bucket_size,
      theory.auto_nested_step_ratio(codec.coarse_ratio,
                                    codec.overload_target, alpha),
      rotated)
  d = plan.bucket_size
  start, length = (0, plan.total_size) if chunk is None else chunk[:2]
  first, num_buckets = start // d, length // d
  real = plan.padding_mask()
  if chunk is not None:
    real = real[start:start + length]
    if noise_scale is not None:
      noise_scale = noise_scale[first:first + num_buckets]
  if rotated:
    counts = np.full([num_buckets], d, np.float32)
    # One segment: the seed `fusion_codec.encode_flat` folds, at the
    # chunk's offset as the codec draws its signs there.
    extra = fusion_codec.segment_seed(seed, 0)
    if start:
      extra = tf.concat([tf.cast(extra, tf.int64),
                         tf.constant([start], tf.int64)], 0)
    extra = (extra,)
  else:
    counts = plan.bucket_counts()[first:first + num_buckets].astype(
        np.float32)
    extra = ()
  if noise_scale is None:
    noise_scale = tf.fill([num_buckets], float("nan"))
  counts = tf.constant(counts)
  (sigma, overloads, nested_elements, expected, fallback,
   bucket_overloads) = kernel(
       tf.cast(values, tf.float32), side_information, decoded, scales,
       real, counts, tf.cast(noise_scale, tf.float32), *extra)
  return {"noise_scale": sigma, "overloads": overloads,
          "nested_elements": nested_elements,
          "expected_overloads": expected, "fallback_buckets": fallback,
          "bucket_overloads": bucket_overloads, "bucket_elements": counts}


_STATISTICS_KERNELS = {}


def _statistics_kernel(alpha, k, num_levels, d, ratio, rotated=False):
  """The XLA-compiled body of `sender_statistics` (one fused pass)."""
  key = (alpha, k, num_levels, d, ratio, rotated)
  kernel = _STATISTICS_KERNELS.get(key)
  if kernel is not None:
    return kernel
  # `rotate` is `gain` times the orthonormal rotation: the codec's steps
  # are in its units, the noise scales it takes in the orthonormal ones.
  gain = rotation_ops.domain_gain(d) if rotated else 1.0

  def statistics(values, side_information, decoded, scales, real, counts,
                 used, seed=None):
    shape = [-1, d]
    fine = tf.abs(scales) / num_levels
    y = tf.reshape(side_information, shape)
    values = tf.reshape(values, shape)
    decoded = tf.reshape(decoded, shape)
    real = tf.reshape(real, shape)
    if rotated:
      signs = rotation_ops.rotation_signs(seed, y.shape[0], d, y.dtype)
      y, values, decoded = (rotation_ops.rotate(v, signs)
                            for v in (y, values, decoded))
      real = tf.ones_like(real)
    z = values - y
    residual = decoded - y
    noise_scale = tf.sqrt(tf.reduce_sum(real * tf.square(z), axis=1) / counts)
    j = tf.round(tf.math.divide_no_nan(alpha * alpha * z - residual,
                                       (alpha * k) * fine[:, None]))
    nested = scales > 0
    in_nested = nested[:, None] & (real > 0)
    wrong = in_nested & tf.not_equal(j, 0.0)
    probability = overload_probability(alpha, noise_scale, fine, k)
    if rotated:
      noise_scale = noise_scale / gain
      used = used * gain
    probability = tf.where(nested & tf.math.is_finite(probability),
                           probability, tf.zeros_like(probability))
    # The adaptive step of every bucket, and its overloads on average over
    # the dither given the exact z.
    step = ratio * used
    usable = tf.math.is_finite(step) & (step > 0)
    safe = tf.where(usable, step, tf.ones_like(step))[:, None]
    per_element = tf.clip_by_value(
        (alpha * tf.abs(z) - (k - 1) * safe / 2.0) / safe, 0.0, 1.0)
    would = tf.reduce_sum(real * per_element, axis=1)
    would = tf.where(usable, would, tf.fill(tf.shape(would), float("nan")))
    return (noise_scale,
            tf.reduce_sum(tf.cast(wrong, tf.int64)),
            tf.reduce_sum(tf.cast(in_nested, tf.int64)),
            tf.reduce_sum(probability * tf.cast(counts, tf.float64)),
            tf.reduce_sum(tf.cast(scales < 0, tf.int64)),
            would)

  kernel = tf.function(statistics, jit_compile=True, autograph=False)
  _STATISTICS_KERNELS[key] = kernel
  return kernel


def overload_probability(alpha, sigma, fine_step, coarse_ratio):
  """`ndq_tf.theory.overload_probability` in TensorFlow, element-wise.

  `P(|α·z + e| >= Δ2/2)` for `z ~ N(0, σ²)`, `e ~ U[-Δ1/2, Δ1/2]`,
  `Δ2 = k·Δ1`, in closed form:
  `P = (2σ'/Δ1)·[F((h + Δ1/2)/σ') - F((h - Δ1/2)/σ')]`, `F(t) = t·Q(t) -
  φ(t)`, `h = k·Δ1/2`, `σ' = α·σ`. Computed in `float64`. Where `σ' = 0`:
  0 (1 if `k <= 1`); NaN stays NaN.

  Args:
    alpha: Python float or tensor, the shrinkage `α`.
    sigma: tensor, `σ` (any units).
    fine_step: tensor broadcastable with `sigma`, `Δ1` (same units).
    coarse_ratio: Python int `k`.

  Returns:
    A `float64` tensor of the broadcast shape, in `[0, 1]`.
  """
  def as_float64(value):
    # A Python float straight to float64 (tf.cast would round it through a
    # float32 constant first).
    if tf.is_tensor(value):
      return tf.cast(value, tf.float64)
    return tf.convert_to_tensor(value, tf.float64)

  sigma = as_float64(sigma)
  fine = as_float64(fine_step)
  alpha = as_float64(alpha)
  spread = alpha * sigma
  positive = spread > 0
  safe = tf.where(positive, spread, tf.ones_like(spread))
  half = coarse_ratio * fine / 2.0

  def antiderivative(t):
    q = 0.5 * tf.math.erfc(t / tf.sqrt(tf.constant(2.0, tf.float64)))
    phi = tf.exp(-0.5 * t * t) / tf.sqrt(tf.constant(2.0 * 3.141592653589793,
                                                     tf.float64))
    return t * q - phi

  upper = (half + fine / 2.0) / safe
  lower = (half - fine / 2.0) / safe
  p = 2.0 * safe / fine * (antiderivative(upper) - antiderivative(lower))
  p = tf.clip_by_value(p, 0.0, 1.0)
  degenerate = tf.constant(1.0 if coarse_ratio <= 1 else 0.0, tf.float64)
  p = tf.where(positive, p, degenerate * tf.ones_like(p))
  return tf.where(tf.math.is_nan(spread) | tf.math.is_nan(fine),
                  tf.constant(float("nan"), tf.float64) * tf.ones_like(p), p)
