"""What the exchanges of ECDQ payloads must give, from the codec's own API.

Each sender's `encode` and `decode` at the exchange's seeds
(`fusion_codec.derive_seed`, segment 0: a bucketed buffer is one codec
segment), chunk by chunk or shard by shard with the dither its elements
have in the whole buffer (`dither_offset`), summed in sender order in
float32 as `fusion_sum` does: the exchanges must give these bits. Also the
words each payload uses, from which the tests compute the telemetry.
Used by integration/test_variable_length.py (replicas of one process) and
integration/test_all_reduce_multi_worker.py (worker processes).
"""

import numpy as np
import tensorflow as tf

from ndq_tf.core import engine as engine_lib
from ndq_tf.core import fusion_codec
from ndq_tf.core import fusion_plan
from ndq_tf.core.exchanges import reduce_scatter

__all__ = [
    "direct_all_gather",
    "direct_reduce_scatter",
]


def _plus(total, value):
  """`total + value` in float32, `-0` made `+0` (as `fusion_sum`)."""
  total = (total + value).astype(np.float32)
  return np.where(total == 0, np.float32(0), total)


def _setup(codec, grads, seed):
  grads = [np.asarray(g, np.float32) for g in grads]
  n = grads[0].size
  plan = fusion_plan.FusionPlan([[n]], [tf.float32], codec.bucket_size)
  fused = [np.pad(g, [0, plan.total_size - n]) for g in grads]
  base = tf.constant([seed, engine_lib.SEED_TAG], tf.int32)
  return n, plan, fused, base


def _code(codec, values, seed, offset):
  """`(decoded, words used)` of one payload."""
  payload = codec.encode(tf.constant(values), seed, dither_offset=offset)
  decoded = codec.decode(payload, seed, dither_offset=offset).numpy()
  return decoded, int(codec.payload_words(payload))


def direct_all_gather(codec, grads, seed, step, chunk_elements=None):
  """The all-gather's sum of `grads` (one 1-D array per sender).

  Returns:
    `(sum, used)`: the `float32` sum of every sender's decode, and the
    words each sender's payloads use (over its chunks).
  """
  n, plan, fused, base = _setup(codec, grads, seed)
  total = np.zeros([plan.total_size], np.float32)
  used = []
  for k, g in enumerate(fused):
    sender_seed = fusion_codec.derive_seed(base, step, k, segment=0)
    parts, words = [], 0
    for chunk in plan.chunks(chunk_elements):
      a, b = chunk.start, chunk.start + chunk.length
      decoded, w = _code(codec, g[a:b], sender_seed, a)
      parts.append(decoded)
      words += w
    total = _plus(total, np.concatenate(parts)) if k else np.concatenate(
        parts)
    used.append(words)
  return _plus(total, 0)[:n], used


def direct_reduce_scatter(codec, grads, seed, step):
  """The reduce-scatter's sum with ECDQ in both stages.

  Returns:
    `(sum, used, used2)`: the sum of the re-coded reduced shards;
    `used[k][j]`, the words sender `k`'s shard `j` uses; `used2[j]`, the
    words of reduced shard `j`'s payload.
  """
  n, plan, fused, base = _setup(codec, grads, seed)
  p = len(fused)
  stage2_seed = fusion_codec.derive_seed(base, step,
                                         reduce_scatter.STAGE2_SENDER,
                                         segment=0)
  used = [[0] * p for _ in range(p)]
  used2, total = [0] * p, []
  for j, shard in enumerate(reduce_scatter.shards(plan, p)):
    if not shard.length:
      continue
    a, b = shard.start, shard.start + shard.length
    reduced = None
    for k, g in enumerate(fused):
      decoded, used[k][j] = _code(
          codec, g[a:b], fusion_codec.derive_seed(base, step, k, segment=0),
          a)
      reduced = decoded if reduced is None else _plus(reduced, decoded)
    decoded, used2[j] = _code(codec, _plus(reduced, 0), stage2_seed, a)
    total.append(decoded)
  return np.concatenate(total)[:n], used, used2
