"""PowerSGD on the exchange core: low-rank factors, summed, with error feedback.

With `codec=ndq_tf.PowerSGD(...)`, `ExchangeEngine.exchange` hands the call
to `exchange` here, which runs up to three rounds, each an ordinary
exchange (`ExchangeEngine.run_round`: all-gather, integer or float
all-reduce, reduce-scatter, as `exchange=` says) of its own tensors:

1. the vectors and the matrices whose compression rate is below
   `min_compression_rate`, with the fallback codec (during the first
   `start_step` exchanges: every tensor, and nothing else runs);
2. `P_i = M_i Q` of every low-rank matrix, `M_i` the sender's gradient plus
   its residual and `Q` the last step's (orthogonalized), with the factor
   codec, summed; every receiver orthogonalizes the sum `P`;
3. `Q_i = M_iᵀ P`, summed, `Q̄ = (Σ_i Q_i) / W`.

Receivers return `W·P Q̄ᵀ` (divided by the divisor for a mean); sender `i`
keeps `M_i − P Q̄ᵀ` as its residual, and `Q̄` warm-starts the next step. The
factors' quantization error is in `P Q̄ᵀ`, so the residual absorbs it too.
Every receiver orthogonalizes and forms `P Q̄ᵀ` from the same sums with
ops whose order of additions is fixed (`ndq_tf.ops.low_rank_ops`), so the
replicas and workers stay bitwise identical.

A step whose result is not finite (loss scaling's overflow) keeps the
residuals and `Q` as they were. Residuals are kept in the units of the
gradients the strategy reduces (Keras unscales them first).

State (`LowRankStore`, per call signature): `Q` of every matrix in one
host variable, one residual variable per matrix and local sender on the
sender's device, and
the number of senders the residuals were made for: residuals made for
another number (a restore into another cluster) are reset to zeros, with
a warning. Saved with the strategy (`tf.train.Checkpoint` through the
engine, `.weights.h5` keys `lowrank_*`).
"""

import collections
import math

import numpy as np
import tensorflow as tf
from absl import logging

from ndq_tf.core import fusion_plan
from ndq_tf.core import tf_internals
from ndq_tf.ops import low_rank_ops
from ndq_tf.ops import random_ops

__all__ = ["LowRankStore", "Layout", "exchange"]

#: Rounds' tags (`ExchangeEngine.run_round`): fallback, `P`, `Q`.
FALLBACK_ROUND, P_ROUND, Q_ROUND = 0, 1, 2

#: One matrix sent low rank: its tensor's index, view, rank, and offset in
#: the flat buffer of every matrix's `Q` (`cols·k` values each).
Matrix = collections.namedtuple("Matrix",
                                ["index", "rows", "cols", "rank", "q_at"])


class Layout:
  """Which tensors of a call go low rank, and where their state lives.

  Args:
    shapes: the tensors' static shapes, in the call's (ready) order.
    config: the `ndq_tf.PowerSGD`.
  """

  def __init__(self, shapes, config):
    self.matrices, self.fallback = [], []
    elements = q_at = 0
    for index, shape in enumerate(shapes):
      view = low_rank_ops.matrix_shape(shape)
      rate = (low_rank_ops.compression_rate(*view, config.rank) if view
              else 0.0)
      if view and rate > 0 and rate >= config.min_compression_rate:
        k = low_rank_ops.effective_rank(*view, config.rank)
        self.matrices.append(Matrix(index, view[0], view[1], k, q_at))
        elements += view[0] * view[1]
        q_at += view[1] * k
      else:
        self.fallback.append(index)
    self.num_elements = sum(math.prod(s) for s in shapes)
    self.low_rank_elements = elements
    self.rank = max((m.rank for m in self.matrices), default=0)


class LowRankStore(tf.Module):
  """The residuals, factors `Q` and sender counts of every call signature.

  Args:
    device: where `Q` and the sender counts live (the residuals live on
      their senders' devices).
    name: the module's name.
  """

  def __init__(self, device="/device:CPU:0", name="low_rank"):
    super().__init__(name=name)
    self._device = device
    self.factors = {}
    self.senders = {}
    self.residuals = {}

  def _variable(self, table, key, value, device):
    if key not in table:
      with tf.init_scope(), tf.device(device):
        table[key] = tf_internals.plain_variable(
            value() if callable(value) else value, trainable=False,
            name=f"lowrank_{key}")
    return table[key]

  def factors_for(self, signature, initial):
    """`Q` of a signature (flat), `initial()` when first made."""
    return self._variable(self.factors, signature, initial, self._device)

  def senders_for(self, signature):
    """How many senders the residuals were made for (0: none yet)."""
    return self._variable(self.senders, signature,
                          lambda: tf.zeros([], tf.int32), self._device)

  def residual_for(self, signature, sender, device, matrix):
    """Sender `sender`'s `[rows, cols]` residual of a `Matrix`, on `device`."""
    return self._variable(
        self.residuals, f"{signature}_{sender}_{matrix.index}",
        lambda: tf.zeros([matrix.rows, matrix.cols], tf.float32), device)

  def save(self, store):
    """Writes every variable into a dict-like `store` (keys `lowrank_*`)."""
    for kind, table in (("q", self.factors), ("senders", self.senders),
                        ("residual", self.residuals)):
      for key in sorted(table):
        store[f"lowrank_{kind}_{key}"] = np.asarray(table[key].numpy())

  def load(self, store):
    """Restores what `save` wrote; a shape that differs warns and stays."""
    try:
      keys = list(store.keys())
    except AttributeError:  # pragma: no cover
      return
    tables = {"q": self.factors, "senders": self.senders,
              "residual": self.residuals}
    for key in keys:
      if not key.startswith("lowrank_"):
        continue
      kind, _, name = key[len("lowrank_"):].partition("_")
      value = np.asarray(store[key])
      table = tables.get(kind)
      if table is None:
        continue
      if name in table:
        if table[name].shape.as_list() != list(value.shape):
          logging.warning(
              "ndq_tf: the saved low-rank state %s has shape %s, this "
              "model's %s: not restored (residuals start from zeros).",
              key, list(value.shape), table[name].shape.as_list())
          continue
        table[name].assign(value)
      else:  # Made later, at the first exchange of this signature.
        self._variable(table, name, value, self._device)


class _Capture:
  """A telemetry stand-in that keeps each round's counters to add them up."""

  def __init__(self):
    self.records = []

  def record(self, transport, **values):
    self.records.append((transport, values))
    return []


def _factors(flat, matrices):
  """Each matrix's `[cols, k]` `Q` from the flat buffer of all of them."""
  return [tf.reshape(flat[m.q_at:m.q_at + m.cols * m.rank], [m.cols, m.rank])
          for m in matrices]


def _orthogonalize_all(factors, epsilon):
  """`low_rank_ops.orthogonalize` of each `[n, k]` factor, batched.

  Factors whose `n` rounds up to the same power of two are padded with
  zero rows (and columns up to the largest `k`) and orthogonalized
  together; the padding stays zeros and changes no other bit.
  """
  groups = collections.defaultdict(list)
  for i, f in enumerate(factors):
    groups[1 << max(0, (f.shape[0] - 1)).bit_length()].append(i)
  out = [None] * len(factors)
  for width, members in sorted(groups.items()):
    k = max(factors[i].shape[1] for i in members)
    batch = tf.stack([
        tf.pad(factors[i], [[0, width - factors[i].shape[0]],
                            [0, k - factors[i].shape[1]]])
        for i in members])
    done = low_rank_ops.orthogonalize_compiled(batch, epsilon)
    for j, i in enumerate(members):
      out[i] = done[j, :factors[i].shape[0], :factors[i].shape[1]]
  return out


def _flat(tensors):
  parts = [tf.reshape(t, [-1]) for t in tensors]
  return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]


def _all_finite(tensors):
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t))
                        for t in tensors])


def exchange(engine, transports, senders, step, mean, divisor,
             lossless_values):
  """The low-rank exchange of one call (see the module doc).

  Args:
    engine: the `ExchangeEngine` (its options, state, telemetry and
      `run_round`).
    transports, senders, divisor, lossless_values: as for
      `ExchangeEngine.exchange`, the senders' tensors in ready order.
    step: the step counter's value.
    mean: whether the result is the mean.

  Returns:
    One list of tensors per receiver, in the senders' tensor order.
  """
  options = engine.options
  config = options.low_rank
  fallback_options, factor_options = options.round_options
  num_senders = transports["all_gather"].num_senders
  tensors = senders[0].tensors
  layout = Layout([t.shape.as_list() for t in tensors], config)
  signature = fusion_plan.FusionPlan.from_tensors(tensors).signature
  store = engine.low_rank

  def base():  # Made where it is used (the variables' init scope too).
    return tf.constant([options.seed, 0x50534744], tf.int32)  # "PSGD"

  def initial_q(seed):
    return _flat([low_rank_ops.initial_factor(
        random_ops.fold_seed(seed, m.index), m.cols, m.rank)
                  for m in layout.matrices])

  if layout.matrices:
    q_variable = store.factors_for(signature, lambda: initial_q(base()))
    count = store.senders_for(signature)
    residuals = [[store.residual_for(signature, s.index, s.device, m)
                  for m in layout.matrices] for s in senders]
    with tf.init_scope():
      made_for = int(count.numpy()) if tf.executing_eagerly() else None
    if made_for not in (None, 0, num_senders):
      logging.warning(
          "ndq_tf: the low-rank residuals were made for %d senders, this "
          "job has %d: they restart from zeros.", made_for, num_senders)

  def run(tensors_of, opts, round_tag, capture, **kwargs):
    round_senders = [s._replace(tensors=tensors_of(j, s))
                     for j, s in enumerate(senders)]
    return engine.run_round(opts, transports, round_senders, step,
                            round_tag=round_tag, telemetry=capture, **kwargs)

  def record(capture, low_rank_elements, rank):
    kind = capture.records[-1][0]
    total = collections.Counter()
    for _, values in capture.records:
      for key in ("sent_bits", "payload_bits", "link_bits"):
        total[key] += tf.cast(values[key], tf.int64)
    first = capture.records[0][1]
    with tf.device(engine.device):
      engine.telemetry.record(
          kind, senders=first["senders"],
          local_senders=first["local_senders"],
          sent_bits=total["sent_bits"], payload_bits=total["payload_bits"],
          link_bits=total["link_bits"],
          compressed_elements=layout.num_elements,
          lossless_elements=first["lossless_elements"])
      engine.telemetry.record_low_rank(rank, low_rank_elements)

  def warm_up():
    capture = _Capture()
    results = run(lambda j, s: list(s.tensors), fallback_options,
                  FALLBACK_ROUND, capture, mean=mean, divisor=divisor,
                  lossless_values=lossless_values)
    record(capture, 0, 0)
    return results

  def low_rank():
    capture = _Capture()
    out = [[None] * len(tensors) for _ in senders]
    first_round = {}
    if layout.fallback:
      results = run(lambda j, s: [s.tensors[i] for i in layout.fallback],
                    fallback_options, FALLBACK_ROUND, capture, mean=mean,
                    divisor=divisor, lossless_values=lossless_values)
      for r, summed in enumerate(results):
        for i, t in zip(layout.fallback, summed):
          out[r][i] = t
    else:
      results = None
      first_round = {"lossless_values": lossless_values}
    with tf.device(engine.device):
      q_old = q_variable.read_value()
      q_flat = q_old if config.warm_start else initial_q(
          random_ops.fold_seed(base(), step))
      valid = tf.equal(count.read_value(), num_senders)
      qs = _orthogonalize_all(_factors(q_flat, layout.matrices),
                              config.orthogonalization_epsilon)
    ms, ps = [], []
    for j, s in enumerate(senders):
      with tf.device(s.device):
        # Residuals made for another number of senders restart from zeros.
        views = [tf.cond(valid, v.read_value,
                         lambda x=x: tf.zeros([x.rows, x.cols], tf.float32))
                 for v, x in zip(residuals[j], layout.matrices)]
        m = [tf.reshape(tf.cast(s.tensors[x.index], tf.float32),
                        [x.rows, x.cols]) + e
             for x, e in zip(layout.matrices, views)]
        ms.append(m)
        ps.append([tf.linalg.matmul(a, tf.identity(q)) for a, q in zip(m, qs)])
    p_sums = run(lambda j, s: ps[j], factor_options, P_ROUND, capture,
                 **first_round)
    if len(p_sums) != len(senders):
      raise NotImplementedError(
          f"The low-rank exchange needs one receiver per local sender. "
          f"Received: {len(p_sums)} receivers, {len(senders)} senders.")
    p_orth = []
    for j, s in enumerate(senders):
      with tf.device(s.device):
        p_orth.append(_orthogonalize_all(p_sums[j],
                                         config.orthogonalization_epsilon))
    q_parts = []
    for j, s in enumerate(senders):
      with tf.device(s.device):
        q_parts.append([tf.linalg.matmul(a, p, transpose_a=True)
                        for a, p in zip(ms[j], p_orth[j])])
    q_sums = run(lambda j, s: q_parts[j], factor_options, Q_ROUND, capture)
    residual_parts = []
    scale = float(num_senders)
    if mean:
      scale /= float(divisor or num_senders)
    for r in range(len(q_sums)):
      with tf.device(senders[r].device):
        q_mean = [q / float(num_senders) for q in q_sums[r]]
        parts = []
        for x, a, p, q in zip(layout.matrices, ms[r], p_orth[r], q_mean):
          # `scale·P Q̄ᵀ` and the residual `M − P Q̄ᵀ`, one fused pass.
          summed, residual = low_rank_ops.reconstruct(a, p, q, scale)
          out[r][x.index] = tf.cast(tf.reshape(
              summed, tensors[x.index].shape), tensors[x.index].dtype)
          parts.append(residual)
        residual_parts.append(parts)
    with tf.device(engine.device):
      finite = _all_finite(list(p_sums[0]) + list(q_sums[0]) + (
          list(results[0]) if results else []))
    updates = []
    for j, s in enumerate(senders):
      with tf.device(s.device):
        def store_new(j=j):
          return [v.assign(e, read_value=True)
                  for v, e in zip(residuals[j], residual_parts[j])]

        def keep_old(j=j):  # A non-finite step keeps the old residuals.
          return [v.read_value() for v in residuals[j]]

        updates.append(tf.cond(finite, store_new, keep_old))
    with tf.device(engine.device):
      updates.append(q_variable.assign(
          tf.where(finite, _flat(q_mean), q_old)))
      updates.append(count.assign(
          tf.where(finite, num_senders, count.read_value())))
    record(capture, layout.low_rank_elements, layout.rank)
    with tf.control_dependencies(updates):
      return [[tf.identity(t) for t in row] for row in out]

  if not layout.matrices:
    return warm_up()
  if config.start_step == 0:
    return low_rank()
  return tf.cond(step >= config.start_step, low_rank, warm_up)
