"""The deterministic sum of decoded buffers (`fusion_sum.sum_stacked`).

It replaced `tf.reduce_sum(tf.stack(...), axis=0)` (2.4-2.6 times slower
alone): below 16 buffers it must give that reduction's bits exactly, signed
zeros, infinities and NaNs included, so that the recorded hashes of
tests/test_golden.py hold; at any count it adds in the order given.
"""

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf.core import fusion_sum


def _buffers(count, n, seed):
  """`count` float32 buffers spanning 60 decades, many zeros of each sign."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n))
    x = x.astype(np.float32)
    if n:
      x[rng.integers(0, n, max(1, n // 3))] = -0.0
      x[rng.integers(0, n, max(1, n // 6))] = 0.0
      for special in (np.inf, -np.inf, np.nan):
        x[rng.integers(0, n, 2)] = special
    out.append(x)
  return out


def _same_bits(a, b):
  """Bitwise equal, except that any NaN equals any NaN."""
  nan = np.isnan(a)
  return (np.array_equal(nan, np.isnan(b))
          and np.array_equal(a.view(np.int32)[~nan], b.view(np.int32)[~nan]))


@pytest.mark.parametrize("count", [2, 3, 4, 7, 8, 15])
@pytest.mark.parametrize("n", [0, 1, 513, 100003])
def test_bits_of_reduce_sum_over_a_stacked_axis(count, n):
  buffers = [tf.constant(x) for x in _buffers(count, n, seed=count * 7 + n)]
  expected = tf.reduce_sum(tf.stack(buffers), axis=0).numpy()
  got = fusion_sum.sum_stacked(buffers).numpy()
  assert _same_bits(got, expected)


def test_all_negative_zeros_sum_to_positive_zero():
  # reduce_sum adds to +0 first; a plain a + b would keep -0.
  got = fusion_sum.sum_stacked([tf.constant([-0.0, -0.0, 1.0])] * 2).numpy()
  assert got.view(np.int32).tolist() == np.array(
      [0.0, 0.0, 2.0], np.float32).view(np.int32).tolist()


def test_adds_in_the_order_given_at_any_count():
  buffers = _buffers(20, 4096, seed=3)
  expected = buffers[0].copy()
  with np.errstate(invalid="ignore"):  # inf + -inf is NaN, as in TF.
    for x in buffers[1:]:
      expected = expected + x
  expected[expected == 0] = 0.0  # -0 to +0
  got = fusion_sum.sum_stacked([tf.constant(x) for x in buffers]).numpy()
  assert _same_bits(got, expected)


def test_one_buffer_is_returned_as_is():
  x = tf.constant([-0.0, 1.0])
  assert fusion_sum.sum_stacked([x]) is x


def test_inside_a_function():
  buffers = [tf.constant(x) for x in _buffers(3, 1000, seed=5)]
  expected = tf.reduce_sum(tf.stack(buffers), axis=0).numpy()
  got = tf.function(fusion_sum.sum_stacked)(buffers).numpy()
  assert _same_bits(got, expected)
