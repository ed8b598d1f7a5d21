"""Tests of ndq_tf.ops.rans_ops: lossless, the same bits, near the ideal."""

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf.ops import ecdq_tables
from ndq_tf.ops import rans_ops

_CDF = ecdq_tables.ecdq_cdf_table(2.0, 512, 32, 15)


def _skewed_cdf(alphabet, rows, precision=15, seed=0):
  """Random rows, some very skewed, one symbol of frequency 0 per row."""
  rng = np.random.default_rng(seed)
  total = 1 << precision
  out = []
  for r in range(rows):
    w = rng.exponential(size=alphabet) ** (1 + 3 * (r % 3))
    w[r % alphabet] = 0.0
    f = np.maximum(1, np.floor(w / w.sum() * (total - alphabet))).astype(int)
    f[r % alphabet] = 0
    f[np.argmax(f)] += total - f.sum()
    out.append(np.concatenate([[0], np.cumsum(f)]))
  return np.asarray(out, np.int32)


def _sample(cdf, n, seed):
  """Symbols drawn from their rows' models (none of frequency 0)."""
  rng = np.random.default_rng(seed)
  rows = rng.integers(0, cdf.shape[0], n).astype(np.int32)
  pmf = np.diff(cdf, axis=1).astype(np.float64)
  u = rng.random(n)
  cum = np.cumsum(pmf[rows], axis=1) / pmf[rows].sum(axis=1, keepdims=True)
  symbols = (u[:, None] >= cum).sum(axis=1).astype(np.int32)
  return symbols, rows


def _ideal_bits(cdf, symbols, rows, precision=15):
  f = np.diff(cdf, axis=1)[rows, symbols].astype(np.float64)
  return float(-np.log2(f / 2**precision).sum())


def _roundtrip(cdf, symbols, rows, lanes, precision=15):
  n = len(symbols)
  enc = tf.function(lambda s, r: rans_ops.rans_encode(s, r, cdf, lanes,
                                                      precision),
                    jit_compile=True)
  words, used = enc(tf.constant(symbols), tf.constant(rows))
  dec = tf.function(lambda w, r: rans_ops.rans_decode(w, r, cdf, n, lanes,
                                                      precision),
                    jit_compile=True)
  return words, int(used), dec(words, tf.constant(rows)).numpy()


@pytest.mark.parametrize("n, lanes", [(1, 1), (2, 1), (24, 25), (25, 25),
                                      (26, 25), (4097, 3), (100_000, 25)])
def test_round_trip_on_ecdq_tables(n, lanes):
  symbols, rows = _sample(_CDF, n, seed=n)
  words, used, decoded = _roundtrip(_CDF, symbols, rows, lanes)
  np.testing.assert_array_equal(decoded, symbols)
  assert words.shape[0] == rans_ops.capacity_words(n, lanes)
  assert (words.numpy()[used:] == 0).all()


@pytest.mark.parametrize("alphabet, precision", [(2, 15), (9, 12), (65, 15)])
def test_round_trip_on_skewed_tables_with_zero_frequencies(alphabet,
                                                           precision):
  cdf = _skewed_cdf(alphabet, 7, precision)
  symbols, rows = _sample(cdf, 20_000, seed=alphabet)
  _, _, decoded = _roundtrip(cdf, symbols, rows, 5, precision)
  np.testing.assert_array_equal(decoded, symbols)


def test_code_length_is_the_ideal_plus_headers():
  # 1% of the ideal -Σ log2 p, plus each lane's 32-bit final state and at
  # most one partly used 16-bit word per lane.
  n, lanes = 2**18, 64
  symbols, rows = _sample(_CDF, n, seed=7)
  _, used, _ = _roundtrip(_CDF, symbols, rows, lanes)
  ideal = _ideal_bits(_CDF, symbols, rows)
  assert 32 * used <= 1.01 * ideal + 48 * lanes + 32
  assert 32 * used >= 0.99 * ideal


def test_a_certain_symbol_costs_nothing_but_the_header():
  cdf = ecdq_tables.ecdq_cdf_table(2.0, 512, 32, 15)
  zero_row = ecdq_tables.zero_bucket_row(32)
  a = (cdf.shape[1] - 2) // 2
  n, lanes = 10_000, 3
  symbols = np.full(n, a, np.int32)
  rows = np.full(n, zero_row, np.int32)
  words, used, decoded = _roundtrip(cdf, symbols, rows, lanes)
  np.testing.assert_array_equal(decoded, symbols)
  assert used == lanes


def test_same_bits_eagerly_in_tf_function_and_under_xla():
  symbols, rows = _sample(_CDF, 3000, seed=11)
  s, r = tf.constant(symbols), tf.constant(rows)

  def both(s, r):
    words, used = rans_ops.rans_encode(s, r, _CDF, 7)
    return words, used, rans_ops.rans_decode(words, r, _CDF, 3000, 7)

  eager = both(s, r)
  np.testing.assert_array_equal(eager[2].numpy(), symbols)
  for fn in (tf.function(both), tf.function(both, jit_compile=True)):
    for a, b in zip(eager, fn(s, r)):
      np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_slot_table_skips_symbols_of_frequency_zero():
  cdf = np.array([[0, 0, 3, 3, 8]], np.int32)
  np.testing.assert_array_equal(rans_ops.slot_table(cdf, 3),
                                [[1, 1, 1, 3, 3, 3, 3, 3]])


def test_bad_arguments_name_the_argument_and_the_value():
  s = tf.constant([0, 1], tf.int32)
  with pytest.raises(ValueError, match=r"`num_lanes`.*num_lanes=0"):
    rans_ops.rans_encode(s, s, _CDF, 0)
  with pytest.raises(ValueError, match=r"`precision`.*precision=16"):
    rans_ops.rans_encode(s, s, _CDF, 1, 16)
  with pytest.raises(ValueError, match=r"one static length.*shape \(3,\)"):
    rans_ops.rans_encode(s, tf.constant([0, 1, 2]), _CDF, 1)
  with pytest.raises(ValueError, match=r"frequency 0.*indices \[1\]"):
    rans_ops.rans_encode(tf.constant([1, 1]), tf.constant([0, 32]), _CDF, 1)
  with pytest.raises(ValueError, match=r"rise from 0 to 2\*\*precision"):
    rans_ops.slot_table(np.array([[0, 5, 7]]), 3)
  with pytest.raises(ValueError, match=r"capacity_words.*shape \(5,\)"):
    rans_ops.rans_decode(tf.zeros([5], tf.int32), s, _CDF, 2, 1)
