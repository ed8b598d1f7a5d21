"""The order in which a step's gradients become ready, and the fused order.

The backward pass produces the gradients of the last layers first and the
first layer's last. The exchange engine fuses a call's tensors in *ready
order* (`ready_order`), so that the fused buffer's first chunk holds the
last layers' gradients: chunk 0's encode and exchange depend on those
alone, and TF's executor runs them while the earlier layers' backward ops
still run (issue #20; PyTorch DDP fills its buckets the same way, in
reverse order of the parameters).

Keras' optimizers, `tf.distribute`'s `batch_reduce_to` of gradient and
variable pairs and the users' own `apply_gradients(zip(grads, vars))` all
give the gradients in the order of the model's variables, first layer
first: the ready order is then the reverse of the call's order. It is
fixed by the call alone (its length), so every sender and every worker of
an exchange, tracing the same program, agree on it without a word, and the
dither each element draws is the same on all of them.

The order moves where every tensor sits in the fused buffer, so which part
of the dither stream it draws (the codes of a step change, not their law);
`chunk_elements=None` keeps one exchange after the backward pass, in the
same order, so the bits do not depend on the chunking.
"""

__all__ = [
    "ready_order",
    "in_ready_order",
    "in_call_order",
]


def ready_order(count):
  """Indices of a call's `count` tensors in the order they become ready.

  Args:
    count: how many tensors the call reduces, in the order of the model's
      variables (first layer first).

  Returns:
    A tuple of indices into the call's tensors: the last one first.

  Raises:
    ValueError: if `count` is not a non-negative integer.
  """
  if isinstance(count, bool) or not isinstance(count, int) or count < 0:
    raise ValueError("`count` must be a non-negative integer. Received: "
                     f"count={count!r}.")
  return tuple(range(count - 1, -1, -1))


def _check_order(values, order):
  """`values` as a list, if `order` is a permutation of its indices."""
  values = list(values)
  if sorted(order) != list(range(len(values))):
    raise ValueError(
        f"`order` must be a permutation of the {len(values)} values. "
        f"Received: order={tuple(order)!r}.")
  return values


def in_ready_order(values, order):
  """`values` (one per tensor of the call) rearranged into `order`."""
  values = _check_order(values, order)
  return [values[i] for i in order]


def in_call_order(values, order):
  """Inverse of `in_ready_order`: back to the call's order."""
  values = _check_order(values, order)
  out = [None] * len(values)
  for position, index in enumerate(order):
    out[index] = values[position]
  return out
