"""Throughput of the rANS coder (`ndq_tf.ops.rans_encode` / `rans_decode`).

Codes `--num_elements` symbols of an alphabet of `--alphabet` drawn from
`--rows` skewed tables (discretized Laplace distributions, the shape of
ECDQ's codes; each element from a random row), XLA-compiled, with one lane
per `--elements_per_lane` elements, and prints the median over
`--repeats` runs of encode and decode, in million elements per second
(wall) and CPU milliseconds (all threads of the process), together with
the code length against the ideal `-Σ log2 p`. The decoder is given the
slot table built once beforehand, as a codec would cache it.

Each thread setting (`--threads`, 0 meaning TensorFlow's default) runs in
a process of its own, since TensorFlow fixes its thread pools when it
starts.

Usage:
  python benchmarks/rans_throughput.py [--num_elements=1048576]
      [--elements_per_lane=4096,1024] [--threads=1,0]
"""

import json
import subprocess
import sys

from absl import app
from absl import flags
import numpy as np

import common  # benchmarks/common.py, next to this script

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_elements", 2**20, "Symbols coded per run.")
flags.DEFINE_integer("alphabet", 9, "Alphabet size.")
flags.DEFINE_integer("rows", 32, "Table rows (distributions).")
flags.DEFINE_integer("precision", 15, "Table precision: rows sum to 2**p.")
flags.DEFINE_list("elements_per_lane", ["4096", "1024"],
                  "Elements per lane: num_lanes = ceil(n / this).")
flags.DEFINE_list("threads", ["1", "0"],
                  "Intra-op thread counts to measure (0: TF's default).")
flags.DEFINE_integer("repeats", 7, "Timed repetitions; the median is shown.")
flags.DEFINE_integer("child_threads", -1, "Internal: measure in this "
                     "process with that many threads and print JSON.")


def _table(rng, rows, alphabet, precision):
  m = 2**precision
  cdf = []
  for _ in range(rows):
    centre = rng.uniform(0, alphabet - 1)
    weight = np.exp(-np.abs(np.arange(alphabet) - centre)
                    * rng.uniform(0.5, 2.0))
    freq = np.maximum(1, np.floor(weight / weight.sum() * (m - alphabet)))
    freq = freq.astype(np.int64)
    freq[np.argmax(freq)] += m - freq.sum()
    cdf.append(np.concatenate([[0], np.cumsum(freq)]))
  return np.array(cdf, np.int32)


def _measure(threads):
  """One JSON line per lane setting, measured in this process."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if threads:
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
  from ndq_tf.ops import rans_ops  # pylint: disable=g-import-not-at-top

  n, p = FLAGS.num_elements, FLAGS.precision
  rng = np.random.default_rng(0)
  cdf = _table(rng, FLAGS.rows, FLAGS.alphabet, p)
  rows = rng.integers(0, FLAGS.rows, n).astype(np.int32)
  u = rng.integers(0, 2**p, n)
  symbols = np.sum(cdf[rows, 1:-1] <= u[:, None], axis=1).astype(np.int32)
  freq = cdf[rows, symbols + 1] - cdf[rows, symbols]
  ideal = float(np.sum(p - np.log2(freq)))
  symbols_t, rows_t = tf.constant(symbols), tf.constant(rows)
  table = rans_ops.slot_table(cdf, p)
  for per_lane in FLAGS.elements_per_lane:
    lanes = -(-n // int(per_lane))
    encode = tf.function(
        lambda s, r, lanes=lanes: rans_ops.rans_encode(s, r, cdf, lanes, p),
        jit_compile=True)
    decode = tf.function(
        lambda w, r, lanes=lanes: rans_ops.rans_decode(
            w, r, cdf, n, lanes, p, table=table),
        jit_compile=True)
    words, used = encode(symbols_t, rows_t)
    if not np.array_equal(decode(words, rows_t).numpy(), symbols):
      raise RuntimeError("the round trip failed")
    enc = common.median_seconds(
        lambda: encode(symbols_t, rows_t)[0].numpy(), FLAGS.repeats)
    dec = common.median_seconds(lambda: decode(words, rows_t).numpy(),
                                FLAGS.repeats)
    print(json.dumps({
        "threads": threads, "lanes": lanes, "per_lane": int(per_lane),
        "encode": enc, "decode": dec, "bits": 32 * int(used),
        "ideal": ideal,
        "header": 32 * rans_ops.rans_header_words(n, lanes)}), flush=True)


def main(argv):
  del argv
  if FLAGS.child_threads >= 0:
    _measure(FLAGS.child_threads)
    return
  n = FLAGS.num_elements
  print(f"{n} symbols, alphabet {FLAGS.alphabet}, {FLAGS.rows} rows, "
        f"precision {FLAGS.precision}, XLA; median of {FLAGS.repeats}.\n")
  print("| threads | lanes (elements/lane) | encode Melem/s | encode ms CPU "
        "| decode Melem/s | decode ms CPU | bits/elem | ideal | header |")
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
  for threads in FLAGS.threads:
    cmd = [sys.executable, __file__, f"--child_threads={int(threads)}"] + [
        f"--{name}={FLAGS[name].serialize().split('=', 1)[1]}"
        for name in ("num_elements", "alphabet", "rows", "precision",
                     "elements_per_lane", "repeats")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
      if not line.startswith("{"):
        continue
      r = json.loads(line)
      print(f"| {r['threads'] or 'default'} | {r['lanes']} ({r['per_lane']}) "
            f"| {n / r['encode'][0] / 1e6:.1f} | {r['encode'][1] * 1e3:.1f} "
            f"| {n / r['decode'][0] / 1e6:.1f} | {r['decode'][1] * 1e3:.1f} "
            f"| {r['bits'] / n:.4f} | {r['ideal'] / n:.4f} "
            f"| {r['header'] / n:.4f} |")


if __name__ == "__main__":
  app.run(main)
