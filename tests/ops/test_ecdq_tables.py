"""Tests of `ndq_tf.ops.ecdq_tables`: ECDQ's integer coding model (#35).

The tables against an independent evaluation of the Gaussian model (with
`math.erfc` and Gauss–Legendre quadrature), their cost against
`ndq_tf.theory`, their pinned bits, and their validation.
"""

import math
import time

import numpy as np
import pytest
import tensorflow as tf

from ndq_tf import ops
from ndq_tf import theory
from ndq_tf.ops import ecdq_tables

# (step_ratio, bucket_size, bins, precision): the SHA-256 of each table,
# computed once when the module was written. A change here changes every
# ECDQ code: it must come with a new `_DIGEST_VERSION`.
GOLDEN = {
    (2.0, 512, 32, 15):
        "da73cf6271813d2d5b3ea8eeb9ec464605f6d5123f830d6cf3767539cf7d13b4",
    (0.5, 512, 32, 15):
        "bb40f35b4630b05566df21b667515553a0b016a69a57f1972597f1649c1cb78b",
    (4.0, 256, 16, 16):
        "1e1ee628d6a2919ec935c153de53abf18b2b827559593c1c438c137749a9b4e6",
    (1.0, 64, 1, 12):
        "8a5db42ba156e1786699cb92ecb3335f4925ff1735e93ff64093d04da6e5a625",
    (2.5, 512, 32, 15):
        "08d22f93efa1deb21bf5fab4ca30fc8ab5fcdc7d1923115a9de14ed276a4ba26",
}

CASES = [(4.0, 512, 32, 15), (2.5, 512, 32, 15), (1.0, 512, 32, 15),
         (0.5, 512, 32, 15), (2.0, 256, 16, 16), (1.0, 64, 1, 12),
         (16.0, 4, 2, 8), (2.0**-6, 512, 8, 16)]


def _frequencies(table):
  return np.diff(table.astype(np.int64), axis=1)


def _model(r, a, bins, j, nodes=16):
  """`P(q | u ∈ bin j)`, q = -A..A, by `math.erfc` and quadrature in u."""
  x, w = np.polynomial.legendre.leggauss(nodes)
  lo, hi = -0.5 + j / bins, -0.5 + (j + 1) / bins
  us = lo + (hi - lo) * (x + 1) / 2
  cdf = np.vectorize(lambda s: 0.5 * math.erfc(-s / math.sqrt(2)))
  q = np.arange(-a, a + 1)[:, None]
  p = cdf(r * (q - us + 0.5)) - cdf(r * (q - us - 0.5))
  return p @ w / 2


@pytest.mark.parametrize("args", CASES)
def test_rows_are_cdfs_of_the_full_alphabet(args):
  r, d, bins, precision = args
  table = ecdq_tables.ecdq_cdf_table(*args)
  a = ecdq_tables.max_abs_symbol(r, d)
  assert table.dtype == np.int32
  assert table.shape == (bins + 2, 2 * a + 2)
  assert ecdq_tables.num_rows(bins) == bins + 2
  np.testing.assert_array_equal(table[:, 0], 0)
  np.testing.assert_array_equal(table[:, -1], 2**precision)
  freq = _frequencies(table)
  assert (freq >= 0).all()
  # Every symbol of every dither row can be coded.
  assert (freq[:bins] >= 1).all()


@pytest.mark.parametrize("args", CASES)
def test_special_rows_put_everything_on_zero_and_cost_nothing(args):
  r, d, bins, precision = args
  table = ecdq_tables.ecdq_cdf_table(*args)
  a = ecdq_tables.max_abs_symbol(r, d)
  assert ecdq_tables.zero_bucket_row(bins) == bins
  assert ecdq_tables.nonfinite_bucket_row(bins) == bins + 1
  for row in (ecdq_tables.zero_bucket_row(bins),
              ecdq_tables.nonfinite_bucket_row(bins)):
    freq = _frequencies(table)[row]
    expected = np.zeros_like(freq)
    expected[a] = 2**precision
    np.testing.assert_array_equal(freq, expected)
    assert math.log2(2**precision / freq[a]) == 0.0


@pytest.mark.parametrize("args", [c for c in CASES if c[2] >= 2])
def test_rows_mirror_each_other(args):
  # P(q | u) = P(-q | -u), and bin bins-1-j is bin j mirrored.
  bins = args[2]
  freq = _frequencies(ecdq_tables.ecdq_cdf_table(*args))
  for j in range(bins):
    np.testing.assert_array_equal(freq[j], freq[bins - 1 - j][::-1])


@pytest.mark.parametrize("args", CASES)
def test_rows_are_the_gaussian_model_rounded(args):
  # |f - T·p| <= 1 + n·p: a unit from rounding, at most n pinned units.
  r, d, bins, precision = args
  a = ecdq_tables.max_abs_symbol(r, d)
  freq = _frequencies(ecdq_tables.ecdq_cdf_table(*args))
  total, n = 2**precision, 2 * a + 1
  for j in range(bins):
    p = _model(r, a, bins, j)
    p /= p.sum()
    assert np.all(np.abs(freq[j] - total * p) <= 1 + n * p + 1e-6)


@pytest.mark.parametrize("r", [1.0, 2.0, 2.5, 4.0])
def test_code_length_is_within_half_a_percent_of_the_theory(r):
  length = ecdq_tables.table_code_length(r, 512, 32, 15)
  ideal = theory.ecdq_conditional_rate(r)
  # A cross entropy: at least the entropy. Measured: +0.08% to +0.14%.
  assert ideal <= length <= 1.005 * ideal
  # One bin is the model that ignores the dither: H(Q).
  unconditioned = ecdq_tables.table_code_length(r, 512, 1, 15)
  ideal = theory.ecdq_unconditional_rate(r)
  assert ideal <= unconditioned <= 1.005 * ideal


@pytest.mark.parametrize("args,digest", sorted(GOLDEN.items()))
def test_golden_digests(args, digest):
  assert ecdq_tables.table_digest(*args) == digest


def test_digest_covers_every_parameter():
  base = (2.0, 512, 32, 15)
  digests = {ecdq_tables.table_digest(*base)}
  for other in [(math.nextafter(2.0, 3.0), 512, 32, 15), (2.0, 256, 32, 15),
                (2.0, 512, 16, 15), (2.0, 512, 32, 16)]:
    digests.add(ecdq_tables.table_digest(*other))
  assert len(digests) == 5
  assert ecdq_tables.table_digest(*base) == ecdq_tables.table_digest(
      np.float32(2.0), np.int64(512), 32, 15)


def test_tables_are_cached_and_read_only():
  table = ecdq_tables.ecdq_cdf_table(2.0)
  assert table is ecdq_tables.ecdq_cdf_table(2.0, 512, 32, 15)
  assert ops.ecdq_cdf_table is ecdq_tables.ecdq_cdf_table
  with pytest.raises(ValueError):
    table[0, 0] = 1


def test_constant_is_the_table():
  constant = ecdq_tables.ecdq_cdf_constant(2.5, 512, 32, 15)
  assert constant.dtype == tf.int32
  np.testing.assert_array_equal(constant.numpy(),
                                ecdq_tables.ecdq_cdf_table(2.5, 512, 32, 15))


def test_building_a_large_table_is_fast():
  ecdq_tables._table.cache_clear()
  start = time.perf_counter()
  ecdq_tables.ecdq_cdf_table(0.5, 512, 32, 15)
  assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("r,d,a", [(2.0, 512, 13), (1.0, 256, 17),
                                   (0.5, 512, 47), (4.0, 4, 2),
                                   (16.0, 4, 2), (2.0**-6, 512, 1450)])
def test_max_abs_symbol_hand_values(r, d, a):
  # ⌈√d/r⌉ + 1: √512/2 = 11.3, √256/1 = 16 exactly, √512/0.5 = 45.3.
  assert ecdq_tables.max_abs_symbol(r, d) == a


@pytest.mark.parametrize("r", [0.5, 1.0, 2.0, 4.0, 16.0])
@pytest.mark.parametrize("d", [4, 64, 512])
def test_every_code_is_in_the_alphabet(r, d):
  # The worst buckets: one spike, or two, σ̂ the RMS rounded up to float32,
  # and the extreme dithers.
  a = ecdq_tables.max_abs_symbol(r, d)
  rng = np.random.default_rng(d)
  buckets = [np.eye(1, d)[0], np.eye(1, d)[0] - np.eye(1, d, 1)[0],
             rng.standard_t(1, d), rng.standard_normal(d)]
  for x in buckets:
    x = x.astype(np.float32)
    sigma = np.float32(np.sqrt(np.mean(x.astype(np.float64)**2)))
    sigma = np.nextafter(sigma, np.float32(np.inf))
    for u in (-0.5, 0.5 - 2**-24):
      q = np.round(x / (np.float32(r) * sigma) + np.float32(u))
      assert np.max(np.abs(q)) <= a


def test_dither_bins():
  for bins in (1, 2, 32, 256):
    assert ecdq_tables.dither_bin(-0.5, bins) == 0
    assert ecdq_tables.dither_bin(0.5 - 2**-24, bins) == bins - 1
    for j in range(bins):
      assert ecdq_tables.dither_bin(-0.5 + j / bins, bins) == j
  for u in (0.5, -0.6, float("nan")):
    with pytest.raises(ValueError, match=f"`u`.*u={u!r}"):
      ecdq_tables.dither_bin(u, 32)


def test_deterministic_normal_matches_the_library():
  # Only + - * / inside; agrees with math's to an absolute 2e-15.
  for s in np.linspace(-12, 12, 4801):
    cdf, pdf = ecdq_tables._normal(float(s))
    assert abs(cdf - 0.5 * math.erfc(-s / math.sqrt(2))) < 2e-15
    assert abs(pdf - math.exp(-s * s / 2) / math.sqrt(2 * math.pi)) <= (
        1e-15 * pdf)
  for x in (-1e-9, -0.3, -1.0, -30.0, -699.0):
    assert abs(ecdq_tables._exp(x) / math.exp(x) - 1) < 1e-15
  assert ecdq_tables._exp(-800.0) == 0.0


@pytest.mark.parametrize("value", [0.0, -1.0, 2.0**-7, 17.0, 1e9,
                                   float("nan"), float("inf"), True, "2",
                                   None])
def test_rejects_bad_step_ratios(value):
  for f in (ecdq_tables.ecdq_cdf_table, ecdq_tables.table_digest,
            ecdq_tables.table_code_length):
    with pytest.raises(ValueError, match=f"`step_ratio`.*step_ratio={value!r}"):
      f(value)
  with pytest.raises(ValueError, match=f"`step_ratio`.*step_ratio={value!r}"):
    ecdq_tables.max_abs_symbol(value, 512)


@pytest.mark.parametrize("value", [0, 3, 48, 512, 1.0, 32.0, True, None])
def test_rejects_bad_bins(value):
  with pytest.raises(ValueError, match=f"`bins`.*bins={value!r}"):
    ecdq_tables.ecdq_cdf_table(2.0, 512, value)
  with pytest.raises(ValueError, match=f"`bins`.*bins={value!r}"):
    ecdq_tables.num_rows(value)


@pytest.mark.parametrize("value", [7, 17, 0, 15.0, True, None])
def test_rejects_bad_precisions(value):
  with pytest.raises(ValueError, match=f"`precision`.*precision={value!r}"):
    ecdq_tables.ecdq_cdf_table(2.0, 512, 32, value)


@pytest.mark.parametrize("value", [0, 2, 3, 100, 2**25, 512.0, True, None])
def test_rejects_bad_bucket_sizes(value):
  with pytest.raises(ValueError, match=f"`bucket_size`.*bucket_size={value!r}"):
    ecdq_tables.ecdq_cdf_table(2.0, value)
  with pytest.raises(ValueError, match=f"`bucket_size`.*bucket_size={value!r}"):
    ecdq_tables.max_abs_symbol(2.0, value)


def test_rejects_an_alphabet_the_precision_cannot_hold():
  # A = ⌈√512·64⌉ + 1 = 1450: 2901 symbols need 2·2901 <= 2^precision.
  ecdq_tables.ecdq_cdf_table(2.0**-6, 512, 2, 13)
  with pytest.raises(ValueError, match="2901 symbols.*precision=12"):
    ecdq_tables.ecdq_cdf_table(2.0**-6, 512, 2, 12)
