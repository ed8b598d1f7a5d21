"""The one deterministic sum of the senders' decoded buffers.

One XLA-compiled computation adds the buffers in the order given (sender
order) and maps a sum of `-0` to `+0`: every receiver obtains bitwise the
same sum (`ndq_tf.core.fusion`), in one pass over the buffers.

Its bits are those of `tf.reduce_sum(tf.stack(tensors), axis=0)`, which this
module used before, and which adds the rows in order to `+0`, for fewer
than 16 buffers (tests/core/test_fusion_sum.py checks it, zeros, infinities and
NaNs included); from 16 buffers on TF's kernel re-associates, by the CPU's
vector width, and the fold does not. The stack and the reduction took 1.56
ms for two buffers of 10**6 values, the fold 0.60 ms (docs/benchmarks.md).
"""

import tensorflow as tf

__all__ = [
    "sum_decoded",
    "sum_senders",
    "sum_stacked",
]


def _fold(*tensors):
  total = tensors[0]
  for tensor in tensors[1:]:
    total = total + tensor
  # `reduce_sum` starts from +0, so it never returns -0; the fold returns -0
  # only where every term is -0, and otherwise the same bits.
  return tf.where(tf.equal(total, 0), tf.zeros_like(total), total)


# One compiled computation per number, shape and dtype of buffers; XLA keeps
# the additions in this order (it does not re-associate floats).
_FOLD = tf.function(_fold, jit_compile=True, autograph=False)


def sum_stacked(tensors):
  """Deterministic sum of equally shaped tensors, added in the order given."""
  tensors = list(tensors)
  if len(tensors) == 1:
    return tensors[0]
  return _FOLD(*tensors)


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
