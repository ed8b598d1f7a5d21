"""Nested groups in the reduce-scatter exchange: their own decode per shard.

Receiver `j` of the reduce-scatter's stage 1 decodes every sender's shard
`j` in sender order, the reference group P1 first
(`fusion_codec.decode_senders`): a nested sender's side information is the
mean of the shards decoded before it, the all-gather's side information
restricted to the shard (a bucket's side information depends only on that
bucket's decodes, so shard by shard gives the same bits). A local nested
sender keeps, for every shard a receiver of its process decodes, its own
values, side information, decode and scales there (`OwnShards`), and its
statistics (`nested_state.sender_statistics`) come from them:

* every shard local (`ndq_tf.MirroredStrategy`): the shards, joined in
  shard order, are the all-gather's buffers, so the statistics and the
  noise state are the all-gather's, bit for bit, in both modes;
* one shard per process (`ndq_tf.MultiWorkerMirroredStrategy`): the
  side information of shard `j` exists only on worker `j`, so a nested
  sender counts its statistics over the shard its worker receives (its
  noise state is NaN for the other buckets, the telemetry counts that
  shard's buckets). The fixed mode does not encode with its noise state,
  so the exchange is the same; the adaptive mode does (every bucket's own
  noise), so it is refused across processes (`check_across_processes`).
"""

import collections

import numpy as np
import tensorflow as tf

from ndq_tf.core import fusion_codec
from ndq_tf.core import nested_state
from ndq_tf.core.exchanges import base

__all__ = [
    "OwnShards",
    "adaptive_refusal",
    "check_across_processes",
]


def adaptive_refusal(options):
  """Why these options cannot run the reduce-scatter across processes, or None.

  Args:
    options: the `CompressionOptions`.
  """
  if options.transport != "reduce_scatter" or not (
      options.nested and options.adaptive):
    return None
  return (
      "exchange='reduce_scatter' cannot run the adaptive nested mode "
      "(adaptive=True, implied by alpha='mmse') across processes: a nested "
      "sender encodes every bucket with the noise of its own decode with "
      "side information, but the side information of shard j exists only "
      "on the worker that receives shard j. Use exchange='all_gather' "
      "(or adaptive=False: the fixed mode counts a sender's statistics over "
      "its own worker's shard)")


def check_across_processes(options):
  """Raises the `adaptive_refusal` of `options` as a ValueError, if any."""
  why = adaptive_refusal(options)
  if why:
    raise ValueError(f"{why}. Received: exchange={options.exchange!r}, "
                     f"adaptive={options.adaptive!r}.")


class OwnShards:
  """The local nested senders' own shards of stage 1, for their statistics.

  Args:
    codecs: one codec per sender, in sender order.
    plan: the `FusionPlan` (one bucketed segment).
    shards: the exchange's shards (`reduce_scatter.shards`).
  """

  def __init__(self, codecs, plan, shards):
    self._codecs = codecs
    self._plan = plan
    self._shards = shards
    self._kept = collections.defaultdict(dict)  # Sender -> shard -> parts.

  def keep(self, me, j, values, wire, side, decoded):
    """Keeps nested sender `me`'s shard `j` (decoded at its receiver)."""
    scales = fusion_codec.wire_scales(self._codecs[me], wire, self._plan,
                                      self._shards[j])
    self._kept[me][j] = (values, side, decoded, scales)

  def complete(self, me):
    """Whether every non-empty shard of `me` is kept (one process)."""
    return all(j in self._kept[me] for j, s in enumerate(self._shards)
               if s.length)

  def statistics(self, me, noise_scale=None, seed=None):
    """`sender_statistics` of `me` over its kept shards, or None (none kept).

    Every shard kept: over the whole buffer, joined in shard order (the
    all-gather's). Otherwise over the one shard kept: its per-bucket
    tensors widened to the buffer's buckets (NaN elsewhere; no elements
    counted there) and `num_buckets` the shard's.

    Raises:
      ValueError: if several shards but not all of them are kept (no
        transport hands a process that).
    """
    kept = self._kept.get(me)
    if not kept:
      return None
    codec, plan = self._codecs[me], self._plan
    if self.complete(me):
      values, side, decoded, scales = (
          base.join([kept[j][k] for j in sorted(kept)]) for k in range(4))
      return nested_state.sender_statistics(
          codec, None, values, side, decoded, plan, noise_scale=noise_scale,
          scales=scales, seed=seed)
    if len(kept) > 1:
      raise ValueError(
          f"A nested sender's statistics over part of its shards need one "
          f"shard. Received: shards {sorted(kept)} of sender {me}.")
    ((j, (values, side, decoded, scales)),) = kept.items()
    shard = self._shards[j]
    statistics = nested_state.sender_statistics(
        codec, None, values, side, decoded, plan, noise_scale=noise_scale,
        scales=scales, seed=seed, chunk=shard)
    return _widen(statistics, plan, shard)


def _widen(statistics, plan, shard):
  """A shard's statistics with per-bucket tensors over the whole buffer."""
  d = plan.bucket_size
  first, count = shard.start // d, shard.length // d
  total = plan.total_size // d

  def widen(values, fill):
    return tf.concat([tf.fill([first], fill), values,
                      tf.fill([total - first - count], fill)], axis=0)

  out = dict(statistics, num_buckets=count)
  out["noise_scale"] = widen(statistics["noise_scale"], np.nan)
  out["bucket_overloads"] = widen(statistics["bucket_overloads"], np.nan)
  out["bucket_elements"] = widen(statistics["bucket_elements"], 0.0)
  return out
