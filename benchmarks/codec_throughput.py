"""Encode + decode throughput of every codec, against one fused elementwise pass.

Both are measured in the same run on the same buffer: the reference is
`x * a + b` compiled with XLA (one read and one write of the buffer, the
least any codec could do), the codecs run `decode(encode(x))` as their users
call them. Reported as ratios, which transfer between machines far better
than seconds.

Usage:
  python benchmarks/codec_throughput.py [--num_elements=16777216] [--repeats=7]
"""

import time

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import ndq_tf

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_elements", 16 * 2**20, "Elements in the buffer.")
flags.DEFINE_integer("repeats", 7, "Timed repetitions; the median is shown.")
flags.DEFINE_string("codecs", "", "Comma-separated codec specs (see "
                    "ndq_tf.codecs.get); empty: every codec.")

_DEFAULT = [
    "float32", "float16", "dqsg:num_levels=1", "dqsg:num_levels=3",
    "half_dithered", "ndqsg:num_levels=3,coarse_ratio=3", "qsgd:num_levels=1",
    "terngrad",
]


def _median_seconds(fn, repeats):
  fn()  # Compile and warm up.
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def main(argv):
  del argv
  n = FLAGS.num_elements
  x = tf.constant(np.random.default_rng(0).normal(size=n).astype(np.float32))
  side = x + 0.01
  seed = tf.constant([7, 11])

  fused = tf.function(lambda v: v * 1.5 + 0.25, jit_compile=True)
  base = _median_seconds(lambda: fused(x).numpy(), FLAGS.repeats)
  print(f"fused elementwise pass over {n} float32: {base * 1e3:.1f} ms")
  print(f"{'codec':45s} {'bits/elem':>9s} {'encode+decode ms':>17s} "
        f"{'ratio':>6s}")
  specs = FLAGS.codecs.split(",") if FLAGS.codecs else _DEFAULT
  for spec in specs:
    codec = ndq_tf.codecs.get(spec)
    kwargs = ({"side_information": side}
              if codec.needs_side_information else {})

    def run(codec=codec, kwargs=kwargs):
      codec.decode(codec.encode(x, seed), seed, **kwargs).numpy()

    seconds = _median_seconds(run, FLAGS.repeats)
    bits = codec.wire_bits(n) / n
    print(f"{repr(codec):45s} {bits:9.3f} {seconds * 1e3:17.1f} "
          f"{seconds / base:6.2f}")


if __name__ == "__main__":
  app.run(main)
