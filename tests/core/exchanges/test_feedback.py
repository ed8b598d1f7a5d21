"""Error feedback in the reduce-scatter's stage 2 (`exchanges.feedback`).

Real TensorFlow on 4 logical CPU devices (tests/conftest.py): eager
exchanges of one engine, as in test_reduce_scatter.py. The multi-worker
case is integration/test_all_reduce_multi_worker.py's `feedback2`.
"""

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf.core import engine as engine_lib
from ndq_tf.distribute.options import CompressionOptions

# tests/core/exchanges/ as a namespace package (pytest.ini puts tests/ on
# sys.path).
from core.exchanges import test_reduce_scatter as rs

#: Stage 1 with so many levels that its error is negligible (|error| at
#: most max|g|/(2·LEVELS) per sender and element): what is left is stage 2's.
FINE_LEVELS = 2**14
STEPS = 12
N = 4 * 512


def _options(feedback):
  return CompressionOptions(f"dqsg:num_levels={FINE_LEVELS}", seed=3,
                            exchange="reduce_scatter",
                            reduce_scatter_levels=1,
                            reduce_scatter_error_feedback=feedback)


def _gradients():
  rng = np.random.default_rng(11)
  return [[tf.constant(rng.normal(size=N).astype(np.float32))]
          for _ in range(rs.NUM_REPLICAS)]


def _run(feedback):
  """`(Σ_t decoded sum_t, T·Σ g, the engine, the last results)`."""
  devices = rs._devices()  # pylint: disable=protected-access
  engine = engine_lib.ExchangeEngine(_options(feedback))
  values = _gradients()
  total = np.zeros(N, np.float64)
  for _ in range(STEPS):
    results = rs._exchange(engine, values, devices)  # pylint: disable=protected-access
    total += results[0][0].numpy()
  exact = STEPS * np.sum([v[0].numpy() for v in values], axis=0,
                         dtype=np.float64)
  return total, exact, engine, results


def test_options_refuse_feedback_without_the_reduce_scatter():
  with pytest.raises(ValueError, match="only for exchange='reduce_scatter'.*"
                     "exchange='auto'"):
    CompressionOptions("dqsg", reduce_scatter_error_feedback=True)
  with pytest.raises(ValueError, match="must be a bool.*feedback=1"):
    CompressionOptions("dqsg", exchange="reduce_scatter",
                       reduce_scatter_error_feedback=1)
  options = _options(True)
  assert CompressionOptions.from_config(options.get_config()) == options
  assert "reduce_scatter_error_feedback" not in _options(False).get_config()


def test_stage2_errors_do_not_accumulate_with_feedback():
  total, exact, engine, results = _run(feedback=True)
  (residual,) = engine.feedback.residuals.values()
  e = residual.numpy()
  # Σ_t x̂_t = Σ_t S_t − e_T: what is left is the last residual (and stage
  # 1's negligible errors, at most Δ1/2 per sender, element and step).
  max_sum = np.max(np.abs(exact)) / STEPS
  stage1 = STEPS * rs.NUM_REPLICAS * max_sum / FINE_LEVELS
  np.testing.assert_allclose(total + e, exact, rtol=0, atol=stage1)
  # And that residual is one ternary re-quantization's: |e| <= Δ2/2 with
  # Δ2 = max|S + e_(T-1)| <= max|S| + max|e|, so max|e| <= max|S|.
  assert 0 < np.max(np.abs(e)) <= max_sum * (1 + 1e-3) + stage1
  # Without feedback the T errors add up like a random walk: √T times one.
  plain, exact2, _, _ = _run(feedback=False)
  np.testing.assert_array_equal(exact, exact2)
  assert np.linalg.norm(plain - exact) > 2 * np.linalg.norm(total - exact)
  # Every replica holds the same bits.
  for r in results[1:]:
    np.testing.assert_array_equal(r[0].numpy(), results[0][0].numpy())


def test_residual_is_saved_and_restored():
  _, _, engine, _ = _run(feedback=True)
  store = {}
  engine.feedback.save(store)
  (key, value), = store.items()
  assert key.startswith("feedback_") and value.shape == (N,)
  assert np.any(value != 0)
  fresh = engine_lib.ExchangeEngine(_options(True))
  fresh.feedback.load(store)
  np.testing.assert_array_equal(
      fresh.feedback.variable_for(key[len("feedback_"):], N).numpy(), value)
