"""Tests of ndq_tf.ops.rans_ops: the rANS coder, the same bits everywhere."""

import math

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf import ops
from ndq_tf.ops import ecdq_tables
from ndq_tf.ops import rans_ops


def _table(rng, num_rows, alphabet, precision, kind="skewed",
           zero_symbols=0):
  """A `[num_rows, alphabet + 1]` cdf: flat, or skewed (a discretized
  Laplace around a random centre, the shape of ECDQ's code distributions),
  with `zero_symbols` random symbols of frequency 0 per row."""
  m = 2**precision
  rows = []
  for _ in range(num_rows):
    if kind == "flat":
      weight = np.ones(alphabet)
    else:
      centre = rng.uniform(0, alphabet - 1)
      weight = np.exp(-np.abs(np.arange(alphabet) - centre)
                      * rng.uniform(0.5, 3.0))
    live = np.ones(alphabet, bool)
    if zero_symbols:
      live[rng.choice(alphabet, zero_symbols, replace=False)] = False
    weight = np.where(live, weight, 0.0)
    freq = np.where(live, np.maximum(
        1, np.floor(weight / weight.sum() * (m - alphabet))), 0).astype(int)
    freq[np.argmax(freq)] += m - freq.sum()
    rows.append(np.concatenate([[0], np.cumsum(freq)]))
  return np.array(rows, np.int32)


def _sample(rng, cdf, n):
  """`n` symbols drawn from the table, each from a random row."""
  rows = rng.integers(0, cdf.shape[0], n).astype(np.int32)
  u = rng.integers(0, cdf[0, -1], n)
  symbols = np.sum(cdf[rows, 1:-1] <= u[:, None], axis=1).astype(np.int32)
  return symbols, rows


def _ideal_bits(cdf, symbols, rows, precision):
  freq = (cdf[rows, symbols + 1] - cdf[rows, symbols]).astype(np.float64)
  return float(np.sum(precision - np.log2(freq)))


def _reference_encode(symbols, rows, cdf, lanes, precision):
  """The documented wire format, with Python integers, element by element."""
  n, m = len(symbols), 2**precision
  steps = -(-n // lanes)
  states, lane_words = [], []
  for lane in range(lanes):
    x, emitted = 2**16, []
    for i in reversed(range(lane, n, lanes)):
      r, s = int(rows[i]), int(symbols[i])
      f, c = int(cdf[r, s + 1] - cdf[r, s]), int(cdf[r, s])
      if x >= f << (32 - precision):
        emitted.append(x & 0xFFFF)
        x >>= 16
      x = (x // f) * m + x % f + c
      assert 2**16 <= x < 2**32
    states.append(x)
    lane_words.append(emitted[::-1])
  counts = [len(w) for w in lane_words]
  if steps >= 2**16:
    header = states + counts
  else:
    counts += [0] * (lanes % 2)
    header = states + [counts[k] | counts[k + 1] << 16
                       for k in range(0, lanes, 2)]
  body = [w for words in lane_words for w in words]
  body += [0] * (len(body) % 2)
  words = header + [body[k] | body[k + 1] << 16
                    for k in range(0, len(body), 2)]
  return np.array(words, np.uint64).astype(np.uint32).view(np.int32)


def _xla(fn):
  return tf.function(fn, jit_compile=True)


def _round_trip_xla(symbols, rows, cdf, lanes, precision):
  n = len(symbols)
  words, used = _xla(lambda s, r: rans_ops.rans_encode(
      s, r, cdf, lanes, precision))(tf.constant(symbols), tf.constant(rows))
  decoded = _xla(lambda w, r: rans_ops.rans_decode(
      w, r, cdf, n, lanes, precision))(words, tf.constant(rows))
  return words.numpy(), int(used), decoded.numpy()


@pytest.mark.parametrize("lanes", [1, 3, 25])
@pytest.mark.parametrize("size", ["1", "2", "L-1", "L", "L+1", "4097",
                                  "100000"])
def test_round_trip_is_exact_for_awkward_lengths(size, lanes):
  n = {"L-1": lanes - 1, "L": lanes, "L+1": lanes + 1}.get(size)
  n = int(size) if n is None else n
  rng = np.random.default_rng(n * 31 + lanes)
  alphabet = int(rng.integers(2, 66))
  cdf = _table(rng, 5, alphabet, 15, "skewed" if n % 2 else "flat")
  symbols, rows = _sample(rng, cdf, n)
  words, used, decoded = _round_trip_xla(symbols, rows, cdf, lanes, 15)
  np.testing.assert_array_equal(decoded, symbols)
  assert words.shape[0] == rans_ops.rans_capacity_words(n, lanes, cdf)
  assert used <= words.shape[0]
  assert not np.any(words[used:])
  if n <= 4097:
    np.testing.assert_array_equal(
        words[:used], _reference_encode(symbols, rows, cdf, lanes, 15))


@pytest.mark.parametrize("alphabet", [2, 3, 9, 17, 64, 65])
@pytest.mark.parametrize("kind", ["flat", "skewed"])
@pytest.mark.parametrize("precision", [15, 11])
def test_round_trip_matches_the_reference_for_every_alphabet(
    alphabet, kind, precision):
  if alphabet > 2**precision // 2:
    pytest.skip("alphabet too large for the precision")
  rng = np.random.default_rng(alphabet * 7 + precision)
  cdf = _table(rng, 7, alphabet, precision, kind)
  symbols, rows = _sample(rng, cdf, 3001)
  words, used, decoded = _round_trip_xla(symbols, rows, cdf, 13, precision)
  np.testing.assert_array_equal(decoded, symbols)
  np.testing.assert_array_equal(
      words[:used], _reference_encode(symbols, rows, cdf, 13, precision))


@pytest.mark.parametrize("n, lanes", [(1, 1), (24, 25), (26, 25),
                                      (4097, 3), (100_000, 25)])
def test_round_trip_on_ecdq_tables(n, lanes):
  # The codec's tables: 32 dither bins, then the zero and the non-finite
  # rows (one symbol of frequency 2**15, the rest 0).
  cdf = ecdq_tables.ecdq_cdf_table(2.0, 512, 32, 15)
  rng = np.random.default_rng(n)
  symbols, rows = _sample(rng, cdf, n)
  words, used, decoded = _round_trip_xla(symbols, rows, cdf, lanes, 15)
  np.testing.assert_array_equal(decoded, symbols)
  assert words.shape[0] == rans_ops.rans_capacity_words(n, lanes, cdf)
  assert not np.any(words[used:])
  if n <= 4097:
    np.testing.assert_array_equal(
        words[:used], _reference_encode(symbols, rows, cdf, lanes, 15))


def test_ecdq_zero_row_costs_nothing_beyond_the_header():
  cdf = ecdq_tables.ecdq_cdf_table(2.0, 512, 32, 15)
  a = (cdf.shape[1] - 2) // 2
  n, lanes = 10_000, 3
  symbols = np.full(n, a, np.int32)
  rows = np.full(n, ecdq_tables.zero_bucket_row(32), np.int32)
  _, used, decoded = _round_trip_xla(symbols, rows, cdf, lanes, 15)
  np.testing.assert_array_equal(decoded, symbols)
  assert used == rans_ops.rans_header_words(n, lanes)


def test_slot_table_by_hand():
  # Symbols 0 and 2 have frequency 0: slots 0-2 are symbol 1's, 3-7 are
  # symbol 3's; each entry is symbol·2**15 + the slot's offset in it.
  cdf = np.array([[0, 0, 3, 3, 8]], np.int32)
  np.testing.assert_array_equal(
      rans_ops.slot_table(cdf, 3).numpy(),
      [[1 << 15 | 0, 1 << 15 | 1, 1 << 15 | 2, 3 << 15 | 0, 3 << 15 | 1,
        3 << 15 | 2, 3 << 15 | 3, 3 << 15 | 4]])


def test_symbols_of_frequency_zero_are_skipped_by_the_table():
  rng = np.random.default_rng(5)
  cdf = _table(rng, 6, 12, 15, "skewed", zero_symbols=4)
  table = rans_ops.slot_table(cdf, 15).numpy()
  slots = np.arange(2**15)
  for r in range(cdf.shape[0]):
    symbol = np.searchsorted(cdf[r], slots, side="right") - 1
    assert np.all(np.diff(cdf[r])[symbol] > 0)
    np.testing.assert_array_equal(table[r] >> 15, symbol)
    np.testing.assert_array_equal(table[r] & (2**15 - 1),
                                  slots - cdf[r, symbol])
  symbols, rows = _sample(rng, cdf, 5000)
  words, used, decoded = _round_trip_xla(symbols, rows, cdf, 4, 15)
  np.testing.assert_array_equal(decoded, symbols)
  np.testing.assert_array_equal(
      words[:used], _reference_encode(symbols, rows, cdf, 4, 15))


def test_same_bits_eager_tf_function_and_xla():
  rng = np.random.default_rng(11)
  cdf = _table(rng, 4, 9, 15)
  n, lanes = 777, 25
  symbols, rows = _sample(rng, cdf, n)
  symbols, rows = tf.constant(symbols), tf.constant(rows)
  table = rans_ops.slot_table(cdf)

  def encode(s, r):
    return rans_ops.rans_encode(s, r, cdf, lanes)

  def decode(w, r):
    return rans_ops.rans_decode(w, r, cdf, n, lanes, table=table)

  results = []
  for wrap in (lambda fn: fn, tf.function, _xla):
    words, used = wrap(encode)(symbols, rows)
    results.append((words.numpy(), int(used),
                    wrap(decode)(words, rows).numpy()))
  for words, used, decoded in results[1:]:
    np.testing.assert_array_equal(words, results[0][0])
    assert used == results[0][1]
    np.testing.assert_array_equal(decoded, results[0][2])
  np.testing.assert_array_equal(results[0][2], symbols.numpy())


def test_code_length_is_within_one_percent_of_the_ideal():
  # ECDQ's setting: 2**20 codes of alphabet 9 over 32 rows, one lane per
  # 4096 elements.
  rng = np.random.default_rng(2)
  cdf = _table(rng, 32, 9, 15)
  n = 2**20
  lanes = -(-n // 4096)
  symbols, rows = _sample(rng, cdf, n)
  _, used, decoded = _round_trip_xla(symbols, rows, cdf, lanes, 15)
  np.testing.assert_array_equal(decoded, symbols)
  ideal = _ideal_bits(cdf, symbols, rows, 15)
  header = 32 * rans_ops.rans_header_words(n, lanes)
  assert header == 48 * lanes
  body_bits = 32 * used - header
  # The body is within 1% of the ideal (plus a half-filled last word); the
  # header adds 32 bits of state and 16 of word count per lane.
  assert body_bits <= 1.01 * ideal + 16
  assert 32 * used <= 1.01 * ideal + (32 + 16) * lanes + 16


def test_a_certain_symbol_costs_nothing_beyond_the_header():
  # Row 1 has a single symbol of frequency 2**p: coding it is the identity.
  cdf = np.array([[0, 2**14, 2**15, 2**15], [0, 0, 0, 2**15]], np.int32)
  n, lanes = 5000, 3
  rows = np.ones(n, np.int32)
  symbols = np.full(n, 2, np.int32)
  words, used, decoded = _round_trip_xla(symbols, rows, cdf, lanes, 15)
  np.testing.assert_array_equal(decoded, symbols)
  assert used == rans_ops.rans_header_words(n, lanes)
  np.testing.assert_array_equal(words[:lanes], 2**16)
  # Mixed in with one-bit symbols, they add nothing either.
  rng = np.random.default_rng(3)
  mixed_rows = rng.integers(0, 2, n).astype(np.int32)
  mixed = np.where(mixed_rows == 1, 2, rng.integers(0, 2, n)).astype(np.int32)
  _, used, decoded = _round_trip_xla(mixed, mixed_rows, cdf, lanes, 15)
  np.testing.assert_array_equal(decoded, mixed)
  body_bits = 32 * (used - rans_ops.rans_header_words(n, lanes))
  assert body_bits <= 1.02 * np.sum(mixed_rows == 0) + 32


def test_empty_input():
  cdf = np.array([[0, 2**14, 2**15]], np.int32)
  words, used = rans_ops.rans_encode(tf.zeros([0], tf.int32),
                                     tf.zeros([0], tf.int32), cdf, 4)
  assert int(used) == rans_ops.rans_header_words(0, 4) == 6
  np.testing.assert_array_equal(words.numpy()[:4], 2**16)
  decoded = rans_ops.rans_decode(words, tf.zeros([0], tf.int32), cdf, 0, 4)
  assert decoded.shape == [0]


def test_capacity_holds_the_rarest_symbols():
  # Every element the rarest symbol (frequency 1 of 2**15): the worst case
  # that the capacity is derived for.
  cdf = np.array([[0, 1, 2**15]], np.int32)
  max_bits = rans_ops.rans_max_bits(cdf, 15)
  assert max_bits == pytest.approx(15 + math.log2(1.5), abs=2**-19)
  n, lanes = 10000, 7
  symbols, rows = np.zeros(n, np.int32), np.zeros(n, np.int32)
  words, used, decoded = _round_trip_xla(symbols, rows, cdf, lanes, 15)
  np.testing.assert_array_equal(decoded, symbols)
  header = rans_ops.rans_header_words(n, lanes)
  capacity = header + -(-math.floor(n * max_bits / 16) // 2)
  assert words.shape[0] == capacity
  assert used <= capacity
  # 15 bits per element plus at most the rounding term.
  assert 32 * (used - header) >= 15 * n - 32 * lanes


def test_capacity_by_hand():
  cdf = np.array([[0, 2**13, 2**15]], np.int32)  # 2 bits at worst
  bits = 2 + math.log2(1.5)
  assert rans_ops.rans_max_bits(cdf, 15) == pytest.approx(bits, abs=2**-19)
  # 1000 elements, 10 lanes: 10 states, 5 count words, floor(1000·B/16)
  # 16-bit words.
  words16 = math.floor(1000 * bits / 16)
  assert rans_ops.rans_capacity_words(1000, 10, cdf) == 15 + -(-words16 // 2)
  assert rans_ops.rans_capacity_words(1000, 10, 16) == 15 + 500
  # 2**16 rows per lane: 32-bit counts.
  assert rans_ops.rans_header_words(2**16, 1) == 2
  assert rans_ops.rans_header_words(2**16 - 1, 1) == 2
  assert rans_ops.rans_header_words(2**16 + 1, 1) == 2
  assert rans_ops.rans_header_words(2**17, 2) == 4
  assert rans_ops.rans_header_words(2**17 - 2, 2) == 3
  single = np.array([[0, 2**15]], np.int32)
  assert rans_ops.rans_max_bits(single, 15) == 0.0
  assert rans_ops.rans_capacity_words(123, 4, single) == 6


def test_wide_counts_round_trip():
  # One lane of 2**16 + 5 elements: word counts take 32 bits.
  rng = np.random.default_rng(9)
  cdf = _table(rng, 2, 3, 15, "flat")
  symbols, rows = _sample(rng, cdf, 2**16 + 5)
  words, used, decoded = _round_trip_xla(symbols, rows, cdf, 1, 15)
  np.testing.assert_array_equal(decoded, symbols)
  # The header is the state and the word count, 32 bits each.
  assert words[1] in (2 * (used - 2), 2 * (used - 2) - 1)


def test_symbolic_table_capacity_is_one_word_per_element():
  cdf = np.array([[0, 2**14, 2**15]], np.int32)
  symbols = tf.constant([0, 1, 1, 0, 1], tf.int32)
  rows = tf.zeros([5], tf.int32)

  @tf.function(jit_compile=True,
               input_signature=[tf.TensorSpec([1, 3], tf.int32)])
  def encode(table):
    return rans_ops.rans_encode(symbols, rows, table, 2)

  words, _ = encode(tf.constant(cdf))
  assert words.shape[0] == rans_ops.rans_capacity_words(5, 2, 16.0)
  decoded = rans_ops.rans_decode(words, rows, cdf, 5, 2)
  np.testing.assert_array_equal(decoded.numpy(), symbols.numpy())


def test_decoding_garbage_raises_nothing():
  rng = np.random.default_rng(4)
  cdf = _table(rng, 3, 9, 15)
  symbols, rows = _sample(rng, cdf, 1000)
  words, used, _ = _round_trip_xla(symbols, rows, cdf, 5, 15)
  garbage = rng.integers(-2**31, 2**31, words.shape[0]).astype(np.int32)
  for wrap in (lambda fn: fn, _xla):
    decoded = wrap(lambda w: rans_ops.rans_decode(w, rows, cdf, 1000, 5))(
        tf.constant(garbage)).numpy()
    assert decoded.shape == (1000,)
    assert decoded.min() >= 0 and decoded.max() < 9
  truncated = np.where(np.arange(words.shape[0]) < used // 2, words, 0)
  decoded = rans_ops.rans_decode(truncated, rows, cdf, 1000, 5).numpy()
  assert decoded.shape == (1000,)


def test_exported_from_ops():
  assert ops.rans_encode is rans_ops.rans_encode
  assert ops.rans_decode is rans_ops.rans_decode
  assert ops.slot_table is rans_ops.slot_table
  assert ops.rans_capacity_words is rans_ops.rans_capacity_words


_CDF = np.array([[0, 2**14, 2**15], [0, 2**15, 2**15]], np.int32)
_SYMBOLS = np.array([0, 1, 0], np.int32)
_ROWS = np.array([0, 0, 1], np.int32)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_lanes=0), "`num_lanes`.*num_lanes=0"),
    (dict(num_lanes=2.0), "`num_lanes`.*num_lanes=2.0"),
    (dict(precision=16), "`precision`.*precision=16"),
    (dict(precision=0), "`precision`.*precision=0"),
    (dict(precision=True), "`precision`.*precision=True"),
    (dict(cdf=_CDF[:, :, None]), "cdf"),
    (dict(cdf=_CDF[:, :1]), "cdf"),
    (dict(cdf=_CDF.astype(np.float32)), "cdf"),
    (dict(cdf=_CDF * 2), "cdf"),
    (dict(cdf=np.array([[0, 2**15, 2**14, 2**15]], np.int32)), "cdf"),
    (dict(cdf=np.array([[1, 2**14, 2**15]], np.int32),
          rows=np.zeros(3, np.int32)), "cdf"),
    (dict(symbols=np.array([0, 2, 0], np.int32)), "symbols"),
    (dict(symbols=np.array([0, -1, 0], np.int32)), "symbols"),
    (dict(symbols=np.array([0, 1, 1], np.int32)),
     "symbol 1 of row 1 \\(frequency 0\\) at element 2"),
    (dict(symbols=np.array([0.0, 1.0, 0.0], np.float32)), "symbols"),
    (dict(symbols=np.zeros([3, 1], np.int32)), "symbols"),
    (dict(rows=np.array([0, 2, 1], np.int32)), "rows"),
    (dict(rows=np.array([0, 0], np.int32)), "rows"),
    (dict(max_bits=17), "max_bits=17"),
])
def test_encode_rejects_bad_input(kwargs, match):
  args = dict(symbols=_SYMBOLS, rows=_ROWS, cdf=_CDF, num_lanes=2)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    rans_ops.rans_encode(**args)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_elements=-1), "num_elements=-1"),
    (dict(num_elements=4), "rows"),
    (dict(num_lanes=0), "num_lanes=0"),
    (dict(words=np.zeros([2], np.int32)), "header"),
    (dict(words=np.zeros([9], np.float32)), "words"),
    (dict(words=np.zeros([3, 3], np.int32)), "words"),
    (dict(rows=np.array([0, 0, 5], np.int32)), "rows"),
    (dict(table=np.zeros([2, 2**14], np.int32)), "table"),
    (dict(precision=16), "precision=16"),
])
def test_decode_rejects_bad_input(kwargs, match):
  args = dict(words=np.zeros([9], np.int32), rows=_ROWS, cdf=_CDF,
              num_elements=3, num_lanes=2)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    rans_ops.rans_decode(**args)


@pytest.mark.parametrize("args, match", [
    ((10, 2, 16.5), "max_bits=16.5"),
    ((10, 2, -1.0), "max_bits"),
    ((-1, 2, 4.0), "num_elements=-1"),
    ((10, 0, 4.0), "num_lanes=0"),
    ((10, 2, "16"), "cdf"),
])
def test_capacity_rejects_bad_input(args, match):
  with pytest.raises(ValueError, match=match):
    rans_ops.rans_capacity_words(*args)


def test_max_bits_needs_known_values():

  @tf.function(input_signature=[tf.TensorSpec([1, 3], tf.int32)])
  def bound(table):
    return rans_ops.rans_max_bits(table)

  with pytest.raises(ValueError, match="known values"):
    bound.get_concrete_function()
