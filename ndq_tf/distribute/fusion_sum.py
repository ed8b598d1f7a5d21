"""The one deterministic sum of the senders' decoded buffers.

`tf.reduce_sum` over a stacked axis: one kernel with one order, so every
receiver obtains bitwise the same sum (`ndq_tf.distribute.fusion`).
"""

import tensorflow as tf

__all__ = [
    "sum_decoded",
    "sum_senders",
    "sum_stacked",
]


def sum_stacked(tensors):
  """Deterministic sum: one `reduce_sum` over a stacked axis."""
  if len(tensors) == 1:
    return tensors[0]
  return tf.reduce_sum(tf.stack(tensors, axis=0), axis=0)


def sum_decoded(decoded, plan, mean=False, divisor=None):
  """The second half of `decode_sum`: deterministic sum, then `plan.split`.

  Args:
    decoded: the list `decode_senders` returned.
    plan: the `FusionPlan` the senders encoded with.
    mean: divide the sum (in `float32`, before the cast back to the
      tensors' dtypes) by `divisor`.
    divisor: what `mean` divides by; default the number of senders. A
      multi-worker exchange whose senders each summed several replicas
      passes the number of replicas.

  Returns:
    A list of tensors with the plan's shapes and dtypes.
  """
  return plan.split(sum_senders(decoded, mean=mean, divisor=divisor))


def sum_senders(decoded, mean=False, divisor=None):
  """The deterministic sum of decoded buffers (one per sender, in order).

  Args:
    decoded: the list `decode_senders` returned (whole buffers or one
      chunk's).
    mean: divide the sum (in `float32`) by `divisor`.
    divisor: what `mean` divides by; default the number of senders.

  Returns:
    One 1-D `float32` tensor.
  """
  if not decoded:
    raise ValueError("`wires` must hold at least one sender. Received: [].")
  total = sum_stacked(decoded)
  if mean:
    total = total / float(divisor or len(decoded))
  return total
