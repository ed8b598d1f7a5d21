"""The CPU constants of `exchange="auto"`'s time model, measured.

`ndq_tf.core.cost_model.auto` prices an exchange on CPU devices as
`bits / link rate + draws·DRAW_NS + decodes·n·DECODE_NS + lanes·LANE_NS`
(`cost_model.exchange_seconds`). This measures the three constants on this machine,
each as the median of `--repeats` runs of one compiled `tf.function` over
`--num_elements` values (ternary DQSG, the default codec's family):

* `draw`: one element of the counter-based dither (`ndq_tf.ops.
  uniform_dither`), XLA-compiled;
* `decode`: one element of `DitheredCodec.decode` minus its dither draw
  (unpack, dequantize) plus one add into a running sum;
* `lane`: one code packed into and unpacked from the integer all-reduce's
  lanes (`ndq_tf.ops.pack_lanes` + `unpack_lanes`, 8 summands).

Usage:
  python benchmarks/decode_cost.py [--num_elements=4194304] [--repeats=9]

Prints the three constants in nanoseconds per element and the values in
`ndq_tf/core/cost_model.py` beside them.
"""

import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import ndq_tf
from ndq_tf import ops as ndq_ops
from ndq_tf.core import cost_model

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_elements", 4 * 2**20, "Elements per measurement.")
flags.DEFINE_integer("repeats", 9, "Timed repetitions; the median is used.")


def _median_seconds(fn, repeats):
  fn()  # Trace and warm up.
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def measure(n, repeats):
  """`{"draw": ns, "decode": ns, "lane": ns}` per element on this CPU.

  The draw is the slope of the integer all-reduce's sum of dithers
  (`ndq_tf.ops.dither_sum`, XLA-compiled as in the codecs' decodes) in
  its number of senders, 2 against 8 (one sender's has a fixed cost of its
  own); the decode, `DitheredCodec.decode` plus an
  add, less one draw; the lanes, as the exchange runs them (not compiled).
  """
  codec = ndq_tf.DitheredCodec(num_levels=1)
  x = tf.constant(np.random.default_rng(0).normal(size=n).astype(np.float32))
  seed = tf.constant([7, 11])
  payload = codec.encode(x, seed)
  total = tf.zeros([n])
  symbols = tf.constant(
      np.random.default_rng(1).integers(0, 3, size=n).astype(np.int32))

  def dither_sum(p):
    seeds = tf.constant([[7, 11 + i] for i in range(p)], tf.int32)
    return tf.function(lambda: ndq_ops.dither_sum(seeds, n),
                       jit_compile=True)

  @tf.function
  def decode():
    return total + codec.decode(payload, seed)

  layout = ndq_ops.lane_layout(codec.alphabet_size, 8, n)

  @tf.function
  def lanes():
    return ndq_ops.unpack_lanes(ndq_ops.pack_lanes(symbols, layout), layout)

  t2 = _median_seconds(dither_sum(2), repeats)
  t8 = _median_seconds(dither_sum(8), repeats)
  draw = (t8 - t2) / 6
  return {"draw": 1e9 * draw / n,
          "decode": 1e9 * (_median_seconds(decode, repeats) - draw) / n,
          "lane": 1e9 * _median_seconds(lanes, repeats) / n}


def main(argv):
  del argv
  got = measure(FLAGS.num_elements, FLAGS.repeats)
  used = {"draw": cost_model.DRAW_NS, "decode": cost_model.DECODE_NS,
          "lane": cost_model.LANE_NS}
  print(f"{'constant':<8} {'measured ns':>12} {'in the model':>13}")
  for key in ("draw", "decode", "lane"):
    print(f"{key:<8} {got[key]:>12.2f} {used[key]:>13.2f}")


if __name__ == "__main__":
  app.run(main)
