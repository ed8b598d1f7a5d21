"""A NumPy reference of PowerSGD with error feedback (issue #34's steps 1-7).

Written from the algorithm as PyTorch's `powerSGD_hook.py` runs it, in
float64, with nothing of ndq_tf's but the initial `Q` (passed in): the
tests compare `ndq_tf.core.low_rank` with it, with float32 codecs (exact
sums), for W = 1, 2 and 4 senders.
"""

import math

import numpy as np


def orthogonalize(x):
  """Modified Gram-Schmidt on the columns of `x`; zero columns stay zero."""
  x = np.array(x, dtype=np.float64)
  for i in range(x.shape[1]):
    norm = np.linalg.norm(x[:, i])
    if norm > 0:
      x[:, i] /= norm
    for j in range(i + 1, x.shape[1]):
      x[:, j] -= np.dot(x[:, i], x[:, j]) * x[:, i]
  return x


class PowerSGDReference:
  """PowerSGD of W senders' gradients, one `step` per exchange.

  Args:
    rank: the rank `k`.
    start_step: exchanges that sum every tensor exactly first.
    min_compression_rate: as `ndq_tf.PowerSGD`'s.
    initial_q: `{tensor index: [cols, k] array}`, the first `Q` of each
      matrix sent low rank.
  """

  def __init__(self, rank, start_step, min_compression_rate, initial_q):
    self.rank = rank
    self.start_step = start_step
    self.min_rate = min_compression_rate
    self.q = {i: np.asarray(q, np.float64) for i, q in initial_q.items()}
    self.residuals = {}
    self.step_count = 0

  def is_low_rank(self, shape):
    if len(shape) < 2:
      return False
    rows, cols = math.prod(shape[:-1]), shape[-1]
    k = min(self.rank, rows, cols)
    return k > 0 and rows * cols / ((rows + cols) * k) >= self.min_rate

  def step(self, grads):
    """`grads[sender][tensor]` arrays; returns the summed tensors."""
    num = len(grads)
    out = []
    warm = self.step_count < self.start_step
    self.step_count += 1
    for t, first in enumerate(grads[0]):
      shape = first.shape
      if warm or not self.is_low_rank(shape):
        out.append(sum(np.asarray(g[t], np.float64) for g in grads))
        continue
      rows, cols = math.prod(shape[:-1]), shape[-1]
      ms = []
      for s in range(num):
        e = self.residuals.get((s, t), np.zeros((rows, cols)))
        ms.append(np.asarray(grads[s][t], np.float64).reshape(rows, cols) + e)
      q = orthogonalize(self.q[t])
      p = orthogonalize(sum(m @ q for m in ms))
      q_mean = sum(m.T @ p for m in ms) / num
      approx = p @ q_mean.T
      for s in range(num):
        self.residuals[(s, t)] = ms[s] - approx
      self.q[t] = q_mean
      out.append((num * approx).reshape(shape))
    return out
