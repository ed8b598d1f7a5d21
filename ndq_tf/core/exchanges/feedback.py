"""Error feedback for the reduce-scatter's stage 2 (a receiver's residual).

With `reduce_scatter_error_feedback=True`, receiver `j` adds to its reduced
shard, before re-quantizing it, what its last re-quantization left out,
and keeps what this one leaves out:

    s_t = S_t + e_(t-1),   x̂_t = decode(encode(s_t)),   e_t = s_t − x̂_t,

`S_t` the sum of the senders' stage-1 decodes. Over `T` exchanges of one
plan the decoded sums add up to `Σ_t S_t − e_T`: stage 2's errors no longer
accumulate (a random walk of `√T` steps without feedback) but stay within
one re-quantization's, `|e_T| ≤ Δ2/2` per element for DQSG. Each step's
sum is no longer unbiased on its own (it carries `e_(t-1) − e_t`). The
same server-side residual as DeepSpeed's compressed all-reduce (its
"server error"); stage 1's senders keep no residual.

Every receiver decodes every re-quantized shard from the same payloads, so
the workers stay bitwise identical; each worker's residual covers the
shard it reduces (all shards under `MirroredStrategy`). `FeedbackStore`
keeps one `float32` variable of the plan's whole buffer per plan signature,
saved with the strategy (`.weights.h5` keys `feedback_<signature>`,
`tf.train.Checkpoint` through the engine).
"""

import numpy as np
import tensorflow as tf

from ndq_tf.core import tf_internals

__all__ = ["FeedbackStore"]


class FeedbackStore(tf.Module):
  """Stage 2's residual per fusion plan, in host variables.

  Args:
    device: where the variables live.
    name: the module's name.
  """

  def __init__(self, device="/device:CPU:0", name="feedback"):
    super().__init__(name=name)
    self._device = device
    self.residuals = {}

  def variable_for(self, signature, num_elements):
    """The `[num_elements]` residual of a plan, zeros when first made.

    Raises:
      ValueError: if it exists with another length.
    """
    if signature not in self.residuals:
      with tf.init_scope(), tf.device(self._device):
        self.residuals[signature] = tf_internals.plain_variable(
            tf.zeros([num_elements], tf.float32), trainable=False,
            name=f"feedback_{signature}")
    variable = self.residuals[signature]
    if variable.shape.as_list() != [int(num_elements)]:
      raise ValueError(
          f"The error feedback of plan {signature} was made for "
          f"{variable.shape.as_list()} elements. Received: {num_elements}.")
    return variable

  def save(self, store, prefix="feedback"):
    """Writes every plan's residual into a dict-like `store`."""
    for signature in sorted(self.residuals):
      store[f"{prefix}_{signature}"] = np.asarray(
          self.residuals[signature].numpy())

  def load(self, store, prefix="feedback"):
    """Restores what `save` wrote (keys it does not know are ignored)."""
    try:
      keys = list(store.keys())
    except AttributeError:  # pragma: no cover
      return
    head = f"{prefix}_"
    for key in keys:
      if key.startswith(head):
        value = np.asarray(store[key])
        self.variable_for(key[len(head):], value.shape[0]).assign(value)


def add_residual(variable, shard, total, device):
  """`total + e` for the shard (`variable[shard]`, read on `device`)."""
  with tf.device(device):
    return total + variable[shard.start:shard.start + shard.length]


def store_residuals(variable, parts, residuals, device):
  """Assigns the new residuals: `{shard index: e_t}`, zeros elsewhere."""
  pieces = []
  for j, shard in enumerate(parts):
    if not shard.length:
      continue
    pieces.append(residuals[j] if j in residuals
                  else tf.zeros([shard.length], tf.float32))
  with tf.device(device):
    return variable.assign(tf.concat(pieces, axis=0) if len(pieces) > 1
                           else pieces[0])
