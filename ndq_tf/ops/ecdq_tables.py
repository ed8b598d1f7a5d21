"""Integer coding models of entropy-coded dithered quantization (ECDQ).

A rotated bucket `x` of `d` values, divided by its RMS `σ̂`, is nearly
`N(0, 1)`; ECDQ sends `q = round(x/(r·σ̂) + u)` (`r = Δ/σ̂` the step ratio,
`u ∈ [-1/2, 1/2)` the subtractive dither, no clipping). Given `u`, the
model of `q` is the Gaussian's mass on one step:
`P(q | u) = Φ(r(q - u + 1/2)) - Φ(r(q - u - 1/2))`. It depends on `r` and
`u` only, so both ends can hold it as a fixed integer table, indexed by a
bin of `u` and the symbol, and an entropy coder (`ndq_tf.ops.rans_ops`)
codes `q` with it. Nothing of it travels; its SHA-256 (`table_digest`) goes
into the options fingerprint.

**The table.** `ecdq_cdf_table(r, d, bins, precision)` is an `int32` array
`cdf[bins + 2, 2A + 2]`: row `j` is a cumulative frequency table over the
symbols `q + A` (`q ∈ [-A, A]`, `A = max_abs_symbol(r, d)`), non-decreasing
from 0 to `2^precision`; the frequency of symbol `s` is
`cdf[j, s + 1] - cdf[j, s]`.

* Rows `0 .. bins - 1` (`dither_bin`): row `j` models the elements whose
  dither falls in `[-1/2 + j/bins, -1/2 + (j + 1)/bins)`, with `P(q | u)`
  averaged over that bin (in closed form, `_bin_probabilities`). Every
  symbol has a frequency of at least 1, so any `q ∈ [-A, A]` can be coded.
* Row `zero_bucket_row(bins) = bins`: a bucket of zeros. All `2^precision`
  on `q = 0`, every other symbol 0: its codes cost nothing.
* Row `nonfinite_bucket_row(bins) = bins + 1`: a bucket holding a NaN or an
  Inf, which the codec sends as zeros (the NaN travels in the scale). The
  same as the zero row.

**The alphabet.** With `σ̂` the bucket's RMS rounded up,
`|x|/σ̂ <= √d`, so `|x/Δ + u| <= √d/r + 1/2` and
`|q| <= A = ⌈√d/r⌉ + 1` for every bucket, Gaussian or not.

**Bitwise the same everywhere.** A float model evaluated at run time can
differ in its last bit between two machines (their `libm`s) and
desynchronize the coder; the table cannot. It is built from Python floats
with `+ - * /` only (correctly rounded IEEE 754 operations, the same on
every machine), in a fixed order: `exp` by range reduction and a fixed
Taylor polynomial, `Φ` by a fixed number of terms of its series or
continued fraction, no `math.exp`/`math.erf`, no NumPy arithmetic, no
`sum()` (whose float algorithm changed in Python 3.12). `⌈√d/r⌉` is exact
(rational arithmetic). The probabilities are accurate to about `1e-12`;
their rounding to integers (`_integer_frequencies`) is what is pinned.

**The cost.** Against the continuous model's `H(Q|U)`
(`ndq_tf.theory.ecdq_conditional_rate`), the table's expected code length
(`table_code_length`) is 0.14% longer at `r = 4` with 32 bins and 15-bit
precision, 0.08% at `r = 1`: 0.065% and 0.003% from binning the dither,
the rest from the integer rounding (docs/algorithms.md tabulates it).

References:
  J. Ziv. On universal quantization. IEEE Trans. Inf. Theory 31(3), 1985.
  R. Zamir, M. Feder. On universal quantization by randomized
  uniform/lattice quantizers. IEEE Trans. Inf. Theory 38(2), 1992.
  J. Duda. Asymmetric numeral systems. arXiv:0902.0271, 2009.
  docs/algorithms.md#entropy-coded-dithered-quantization-ecdq.
"""

import fractions
import functools
import hashlib
import math

import numpy as np
import tensorflow as tf

from ndq_tf.ops import checks

__all__ = [
    "MIN_STEP_RATIO",
    "MAX_STEP_RATIO",
    "MAX_BINS",
    "MIN_PRECISION",
    "MAX_PRECISION",
    "max_abs_symbol",
    "num_rows",
    "dither_bin",
    "zero_bucket_row",
    "nonfinite_bucket_row",
    "ecdq_cdf_table",
    "ecdq_cdf_constant",
    "table_digest",
    "table_code_length",
]

#: Step ratios `Δ/σ` a table can be built for: about 7.7 to 0.16 bits per
#: element of `H(Q|U)` (vNMSE 1.6e-5 .. 21).
MIN_STEP_RATIO = 2.0**-6
MAX_STEP_RATIO = 16.0
#: `bins` is a power of two up to this (the dither's grid is `2⁻²⁴`).
MAX_BINS = 256
#: Total frequency `2^precision`: at most 16 bits, so a rANS coder with a
#: 32-bit state and 16-bit output words can use it.
MIN_PRECISION = 8
MAX_PRECISION = 16
#: The rotation's bucket sizes: powers of two from 4.
_MIN_BUCKET, _MAX_BUCKET = 4, 2**24

_DIGEST_VERSION = b"ndq_tf.ecdq_cdf_table/1"

# exp: fdlibm's split of ln 2 (`k·_LN2_HI` is exact for |k| < 2^11), and
# Taylor terms to t^15/15! for |t| <= ln(2)/2 (below 2^-60 relative).
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_EXP_TERMS = 15
_INV_SQRT_2PI = 0.3989422804014327
# Φ: its series up to |s| <= 8 (100 terms leave < 1e-21 of the sum at 8),
# the continued fraction of the tail beyond (30 levels).
_SERIES_LIMIT = 8.0
_SERIES_TERMS = 100
_FRACTION_DEPTH = 30


def _exp(x):
  """`e^x` for `x <= 0`: `2^k·e^t`, `t = x - k·ln 2`, `|t| <= ln(2)/2`."""
  if x < -700.0:
    return 0.0  # e^-700 = 1e-304; below, ldexp would round subnormals.
  k = math.floor(x * _INV_LN2 + 0.5)
  t = (x - k * _LN2_HI) - k * _LN2_LO
  p = 1.0
  for n in range(_EXP_TERMS, 0, -1):
    p = 1.0 + p * t / n
  return math.ldexp(p, k)  # Exact: a power of two times a normal number.


def _normal(s):
  """`(Φ(s), φ(s))` of the standard normal, from `+ - * /` only."""
  pdf = _INV_SQRT_2PI * _exp(-0.5 * s * s)
  a = -s if s < 0.0 else s
  if a <= _SERIES_LIMIT:
    # Φ(s) = 1/2 + φ(s)·Σ s^(2n+1)/(1·3···(2n+1)): positive terms.
    s2 = s * s
    term = s
    total = s
    for n in range(1, _SERIES_TERMS):
      term = term * s2 / (2 * n + 1)
      total = total + term
    return 0.5 + pdf * total, pdf
  # Q(a) = φ(a)/(a + 1/(a + 2/(a + 3/(a + ...)))).
  f = a
  for k in range(_FRACTION_DEPTH, 0, -1):
    f = a + k / f
  tail = pdf / f
  return (1.0 - tail if s > 0.0 else tail), pdf


def _antiderivative(s):
  """`G(s) = s·Φ(s) + φ(s)`, `G' = Φ`."""
  cdf, pdf = _normal(s)
  return s * cdf + pdf


def _check_bins(bins):
  return checks.check_int("bins", bins, 1, MAX_BINS, power_of_two=True)


def _check(step_ratio, bucket_size, bins=1, precision=MAX_PRECISION):
  """Validates the arguments; returns them as `float, int, int, int`."""
  if (isinstance(step_ratio, bool)
      or not isinstance(step_ratio, (int, float, np.floating, np.integer))
      or not MIN_STEP_RATIO <= step_ratio <= MAX_STEP_RATIO):
    raise ValueError(
        f"`step_ratio` (Δ/σ) must be a number in [{MIN_STEP_RATIO}, "
        f"{MAX_STEP_RATIO}]. Received: step_ratio={step_ratio!r}.")
  d = checks.check_int("bucket_size", bucket_size, _MIN_BUCKET, _MAX_BUCKET,
                       power_of_two=True)
  bins = _check_bins(bins)
  precision = checks.check_int("precision", precision, MIN_PRECISION,
                               MAX_PRECISION)
  r = float(step_ratio)
  alphabet = 2 * _max_abs_symbol(r, d) + 1
  if 2 * alphabet > 2**precision:
    raise ValueError(
        f"The alphabet of {alphabet} symbols (step_ratio={step_ratio!r}, "
        f"bucket_size={bucket_size!r}) needs `precision` >= "
        f"{(2 * alphabet - 1).bit_length()}. Received: "
        f"precision={precision!r}.")
  return r, d, bins, precision


def _max_abs_symbol(r, d):
  # ⌈√d/r⌉ = the least m >= 0 with m² >= d/r², exactly: m² is an integer,
  # so m² >= d/r² exactly when m² >= ⌈d/r²⌉.
  bound = math.ceil(fractions.Fraction(d) / fractions.Fraction(r)**2)
  root = math.isqrt(bound - 1) + 1  # bound >= 1, since d >= 4.
  return root + 1


def max_abs_symbol(step_ratio, bucket_size):
  """`A = ⌈√d/r⌉ + 1`: every code of a bucket of `d` is in `[-A, A]`.

  With `σ̂` the bucket's RMS rounded up, `|x|/σ̂ <= √d` and
  `|x/Δ + u| <= √d/r + 1/2`.

  Args:
    step_ratio: `r = Δ/σ̂`, in `[MIN_STEP_RATIO, MAX_STEP_RATIO]`.
    bucket_size: `d`, a power of two `>= 4`.

  Returns:
    `A`, an int.
  """
  r, d, _, _ = _check(step_ratio, bucket_size, 1, MAX_PRECISION)
  return _max_abs_symbol(r, d)


def num_rows(bins):
  """`bins + 2`: the dither's bins, the zero row and the non-finite row."""
  return _check_bins(bins) + 2


def dither_bin(u, bins):
  """The row of a dither `u ∈ [-1/2, 1/2)`: `⌊(u + 1/2)·bins⌋`.

  Exact in `float32` for the dither generator's `u` (a multiple of `2⁻²⁴`
  minus 1/2) and a power-of-two `bins`: a shift of `u`'s 24-bit integer,
  which is how a codec should compute it.
  """
  bins = _check_bins(bins)
  if not -0.5 <= u < 0.5:
    raise ValueError(f"`u` must be in [-0.5, 0.5). Received: u={u!r}.")
  return math.floor((u + 0.5) * bins)


def zero_bucket_row(bins):
  """`bins`: the row of a bucket of zeros (everything on `q = 0`)."""
  return _check_bins(bins)


def nonfinite_bucket_row(bins):
  """`bins + 1`: the row of a bucket with a NaN or an Inf (on `q = 0`)."""
  return _check_bins(bins) + 1


def _bin_probabilities(r, a, bins, j):
  """`P(q | u ∈ bin j)` for `q = -A .. A`, normalized: a list of floats.

  With `G' = Φ`, `∫ Φ(r(c - u)) du = -G(r(c - u))/r`, so with
  `D(c) = G(r(c - u_lo)) - G(r(c - u_hi))` over the bin `[u_lo, u_hi)`,
  `P(q | bin) = bins/r·(D(q + 1/2) - D(q - 1/2))`.
  """
  lo = -0.5 + j / bins
  hi = -0.5 + (j + 1) / bins
  edges = []
  for k in range(2 * a + 2):
    c = k - a - 0.5
    edges.append(_antiderivative(r * (c - lo))
                 - _antiderivative(r * (c - hi)))
  scale = bins / r
  p = []
  total = 0.0
  for k in range(2 * a + 1):
    v = scale * (edges[k + 1] - edges[k])
    v = v if v > 0.0 else 0.0
    p.append(v)
    total = total + v
  return [v / total for v in p]


def _integer_frequencies(p, total):
  """Frequencies `>= 1` summing to `total`, close to `total·p`.

  Symbols whose share would be below 1 get exactly 1 (repeated until none
  is left); the rest share what remains in proportion to `p`, rounded down,
  and the units still missing go to the largest remainders (ties to the
  lower symbol).
  """
  n = len(p)
  pinned = [False] * n
  while True:
    budget = total - pinned.count(True)
    mass = 0.0
    for i in range(n):
      if not pinned[i]:
        mass = mass + p[i]
    newly = [i for i in range(n)
             if not pinned[i] and p[i] * budget < mass]
    if not newly:
      break
    for i in newly:
      pinned[i] = True
  freq = [1] * n
  remainders = []
  for i in range(n):
    if not pinned[i]:
      ideal = p[i] * budget / mass
      whole = math.floor(ideal)
      freq[i] = int(whole)
      remainders.append((-(ideal - whole), i))
  missing = total - sum(freq)
  remainders.sort()
  for _, i in remainders[:missing]:
    freq[i] += 1
  return freq


def _cdf(freq):
  row = [0]
  for f in freq:
    row.append(row[-1] + f)
  return row


@functools.lru_cache(maxsize=32)
def _table(r, d, bins, precision):
  a = _max_abs_symbol(r, d)
  total = 2**precision
  rows = [None] * bins
  # P(q | u) = P(-q | -u), and bin bins-1-j is bin j mirrored: compute the
  # first half and mirror it, so the table is exactly symmetric.
  for j in range((bins + 1) // 2):
    freq = _integer_frequencies(_bin_probabilities(r, a, bins, j), total)
    rows[j] = freq
    if bins - 1 - j != j:
      rows[bins - 1 - j] = freq[::-1]
  special = [0] * (2 * a + 1)
  special[a] = total
  rows += [special, special]
  table = np.array([_cdf(f) for f in rows], dtype=np.int32)
  table.flags.writeable = False
  return table


def ecdq_cdf_table(step_ratio, bucket_size=512, bins=32, precision=15):
  """The integer CDF table of ECDQ's Gaussian model, bitwise reproducible.

  Args:
    step_ratio: `r = Δ/σ̂`, in `[MIN_STEP_RATIO, MAX_STEP_RATIO]`.
    bucket_size: `d`, a power of two `>= 4`; sets the alphabet
      (`max_abs_symbol`).
    bins: the dither's bins, a power of two in `[1, MAX_BINS]`. One bin is
      the model that ignores the dither (`H(Q)`).
    precision: the rows end at `2^precision`, in
      `[MIN_PRECISION, MAX_PRECISION]`; it must leave at least 2 units per
      symbol (`ValueError` otherwise).

  Returns:
    A read-only `np.int32` array `[bins + 2, 2A + 2]` (module docstring:
    rows `dither_bin`, `zero_bucket_row`, `nonfinite_bucket_row`; symbol
    `q + A`). Cached: the same array for the same arguments.

  Raises:
    ValueError: naming the argument out of range and its value.
  """
  return _table(*_check(step_ratio, bucket_size, bins, precision))


def ecdq_cdf_constant(step_ratio, bucket_size=512, bins=32, precision=15):
  """`ecdq_cdf_table(...)` as an `int32` `tf.constant`."""
  return tf.constant(
      ecdq_cdf_table(step_ratio, bucket_size, bins, precision), tf.int32)


def table_digest(step_ratio, bucket_size=512, bins=32, precision=15):
  """SHA-256 (hex) of the table's parameters and its little-endian bytes.

  The parameters are hashed exactly (the step ratio's `float.hex`), then
  the shape and the `int32` values, so two tables with the same digest
  code identically.
  """
  r, d, bins, precision = _check(step_ratio, bucket_size, bins, precision)
  table = _table(r, d, bins, precision)
  h = hashlib.sha256(_DIGEST_VERSION)
  h.update(f" step_ratio={r.hex()} bucket_size={d} bins={bins} "
           f"precision={precision} shape={table.shape}".encode())
  h.update(table.astype("<i4").tobytes())
  return h.hexdigest()


def table_code_length(step_ratio, bucket_size=512, bins=32, precision=15):
  """Bits per element of coding `N(0, 1)` with the table (its expected cost).

  `(1/bins)·Σ_j Σ_q P(q | bin j)·log2(2^precision/f_j(q))`: the cross
  entropy of the Gaussian model's `q` (dither uniform) against the table's
  integer frequencies, before any coder overhead. Compare with
  `ndq_tf.theory.ecdq_conditional_rate(step_ratio)`, its continuous ideal.
  (Uses `math.log2`: a measurement, not part of the table.)
  """
  r, d, bins, precision = _check(step_ratio, bucket_size, bins, precision)
  table = _table(r, d, bins, precision)
  a = _max_abs_symbol(r, d)
  bits = 0.0
  for j in range(bins):
    p = _bin_probabilities(r, a, bins, j)
    for s, pq in enumerate(p):
      f = int(table[j, s + 1]) - int(table[j, s])
      bits += pq * (precision - math.log2(f))
  return bits / bins
