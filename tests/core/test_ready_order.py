"""Chunks in ready order (issue #20): chunk 0 waits for the last layers only.

The engine fuses a call's gradients in the order the backward pass
produces them, the last variable's first (`ndq_tf.core.ready_order`),
so that the first chunk's encode and exchange can run while the first
layers' gradients are still being computed. Checked on the graph of one
real training step (Keras 3's `apply_gradients` under
`ndq_tf.MirroredStrategy` on logical CPUs): every op of chunk 0's encode
depends (through data or control edges) on the last layer's gradient and
on none of the first layer's; the last chunk's encode does depend on the
first layer's. And the replicas end the step bitwise identical. No timing:
the overlap itself is measured by benchmarks/step_breakdown.py.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import ndq_tf
from ndq_tf.core import ready_order

NUM_REPLICAS = 2
#: Input 16, then 64, 64, 8: kernels of 1024, 4096 and 512 elements, so
#: chunks of 512 (one DQSG bucket) keep the first and last layers apart.
WIDTHS = (16, 64, 64, 8)


def test_ready_order_is_the_reverse_of_the_call():
  assert ready_order.ready_order(4) == (3, 2, 1, 0)
  assert ready_order.ready_order(0) == ()


def test_ready_order_round_trips():
  order = ready_order.ready_order(5)
  values = list("abcde")
  fused = ready_order.in_ready_order(values, order)
  assert fused == list("edcba")
  assert ready_order.in_call_order(fused, order) == values


@pytest.mark.parametrize("count", [-1, 1.5, True, None])
def test_bad_count_is_named(count):
  with pytest.raises(ValueError, match="`count` must be"):
    ready_order.ready_order(count)


def test_order_that_is_not_a_permutation_is_named():
  with pytest.raises(ValueError, match="`order` must be a permutation"):
    ready_order.in_ready_order([1, 2], (0, 0))


def _ancestors(ops):
  """Every op `ops` depend on, through data and control edges."""
  seen, stack = set(), list(ops)
  while stack:
    op = stack.pop()
    for parent in [t.op for t in op.inputs] + list(op.control_inputs):
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


def _train_step():
  """One step's concrete graph, its gradient ops, and the strategy."""
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  strategy = ndq_tf.MirroredStrategy(
      devices=devices[:NUM_REPLICAS], codec="dqsg:num_levels=1",
      exchange="all_gather", chunk_elements=512, seed=3)
  with strategy.scope():
    model = tf.keras.Sequential(
        [tf.keras.Input((WIDTHS[0],))]
        + [tf.keras.layers.Dense(w) for w in WIDTHS[1:]])
    optimizer = tf.keras.optimizers.SGD(0.1)
  rng = np.random.default_rng(0)
  x = tf.constant(rng.standard_normal((4, WIDTHS[0])), tf.float32)
  y = tf.constant(rng.standard_normal((4, WIDTHS[-1])), tf.float32)
  gradient_ops = []  # Per replica: (first kernel's, last kernel's) op.

  @tf.function
  def step():
    def replica_step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
      grads = tape.gradient(loss, model.trainable_variables)
      gradient_ops.append((grads[0].op, grads[-2].op))
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
    strategy.run(replica_step)

  graph = step.get_concrete_function().graph
  return step, graph, gradient_ops, strategy, model


def test_chunk_zero_needs_only_the_last_layers_gradients():
  _, graph, gradient_ops, _, _ = _train_step()
  encodes = {}
  for op in graph.get_operations():
    # `ndq_encode_1`: the scope of the second replica's encode.
    match = re.search(r"/ndq_chunk(\d+)(?:_\d+)?/ndq_encode(?:_\d+)?/",
                      op.name)
    if match:
      encodes.setdefault(int(match.group(1)), []).append(op)
  assert len(encodes) >= 3, sorted(encodes)
  first_chunk = _ancestors(encodes[0])
  last_chunk = _ancestors(encodes[max(encodes)])
  for first_kernel, last_kernel in gradient_ops:
    assert first_kernel not in first_chunk
    assert last_kernel in first_chunk
    assert first_kernel in last_chunk


def test_replicas_stay_identical_in_ready_order():
  step, _, _, strategy, model = _train_step()
  for _ in range(2):
    step()
  assert int(strategy.compression_stats()["exchange_count"]) == 2
  for variable in model.trainable_variables:
    copies = [v.numpy() for v in variable.value.values]
    for other in copies[1:]:
      np.testing.assert_array_equal(other.view(np.uint32),
                                    copies[0].view(np.uint32))
