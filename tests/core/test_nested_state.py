"""Tests of `ndq_tf.core.nested_state`: what a nested sender learns.

Its functions on their own (moved from test_nested_allreduce.py); the noise
states kept by a strategy across steps, saved and restored, are tested in
integration/test_nested_allreduce.py.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf import theory
from ndq_tf.core import nested_state


class TestNoiseState:

  def test_tf_overload_probability_matches_theory(self):
    sigmas = [0.01, 0.05, 0.1, 0.2, 0.4, 1.0]
    for k in (2, 3, 5):
      for alpha in (1.0, 0.8):
        got = nested_state.overload_probability(
            alpha, tf.constant(sigmas, tf.float64),
              tf.fill([len(sigmas)], tf.constant(1 / 3, tf.float64)), k)
        want = [theory.overload_probability(alpha, s, 1 / 3, k)
                for s in sigmas]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-300)

  def test_noise_scale_envelope(self):
    nan = float("nan")
    got = nested_state.next_noise_scale(
        tf.constant([nan, 1.0, 1.0, 1.0, 2.0]),
        tf.constant([0.5, 2.0, 0.5, nan, 1.0]))
    memory = nested_state.NOISE_MEMORY
    np.testing.assert_allclose(
        got.numpy(), [0.5, 2.0, memory, nan, 2 * memory], rtol=1e-6)

  def test_noise_gain_feedback(self):
    """`next_noise_gain`: per bucket, up while overloading, down while not."""
    target = 1e-4
    n = 512.0
    goal = target * n

    def gain(g, overloads):
      return nested_state.next_noise_gain(tf.constant(g, tf.float32),
                                          tf.constant(overloads, tf.float32),
                                          tf.fill([len(g)], n),
                                          target).numpy()

    np.testing.assert_allclose(
        gain([1.0, 1.0, 1.0, 1.0], [goal, 0.0, 2.0, 50.0]),
        [1.0, math.sqrt(1 / (goal + 1)), math.sqrt(3 / (goal + 1)), 4.0],
        rtol=1e-6)  # the last clipped to 4
    assert gain([1.0], [0.0])[0] == pytest.approx(0.9753, abs=1e-4)
    assert gain([1.0], [1e-3])[0] < 1.0  # a tiny expectation: still down
    # Unknown (NaN: no step yet, or a non-finite gradient): unchanged.
    np.testing.assert_array_equal(gain([2.0], [float("nan")]), [2.0])
    # Bounded by NOISE_GAIN_RANGE.
    np.testing.assert_array_equal(gain([16.0, 0.25], [10.0, 0.0]),
                                  [16.0, 0.25])
