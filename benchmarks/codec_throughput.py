"""Encode + decode throughput of every codec, against one fused elementwise pass.

Both are measured in the same run on the same buffer: the reference is
`x * a + b` compiled with XLA (one read and one write of the buffer, the
least any codec could do), the codecs run `decode(encode(x))` as their users
call them. Reported as ratios, which transfer between machines far better
than seconds.

With `--rotation` (the default) every codec that takes `rotation=` is
measured again with `rotation="hadamard"`, in the same run, alternating
the two, and the table gives the extra cost of the rotation in elementwise
passes: `(t_rotated - t_plain) / t_pass` (issue #17's goal: at most 1.5).

Usage:
  python benchmarks/codec_throughput.py [--num_elements=16777216] [--repeats=7]
"""

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

import common  # benchmarks/common.py, next to this script
import ndq_tf

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_elements", 16 * 2**20, "Elements in the buffer.")
flags.DEFINE_integer("repeats", 7, "Timed repetitions; the median is shown.")
flags.DEFINE_string("codecs", "", "Semicolon-separated codec specs (see "
                    "ndq_tf.codecs.get); empty: every codec.")
flags.DEFINE_bool("rotation", True, "Also measure rotation='hadamard' for "
                  "the codecs that take it.")

_DEFAULT = [
    "float32", "float16", "dqsg:num_levels=1", "dqsg:num_levels=3",
    "half_dithered", "ndqsg:num_levels=3,coarse_ratio=3", "qsgd:num_levels=1",
    "terngrad",
]


def main(argv):
  del argv
  n = FLAGS.num_elements
  x = tf.constant(np.random.default_rng(0).normal(size=n).astype(np.float32))
  side = x + 0.01
  seed = tf.constant([7, 11])

  fused = tf.function(lambda v: v * 1.5 + 0.25, jit_compile=True)
  base, base_cpu = common.median_seconds(lambda: fused(x).numpy(),
                                         FLAGS.repeats)
  print(f"fused elementwise pass over {n} float32: {base * 1e3:.1f} ms wall, "
        f"{base_cpu * 1e3:.1f} ms CPU")
  print("Ratios are encode + decode over that pass, measured in this run; "
        "CPU time is steadier than wall time on a shared machine.\n")
  print("| codec | bits/elem | encode+decode ms (wall) | ratio (wall) | "
        "ratio (CPU) |" + (" rotated: bits/elem | ratio (wall) | ratio (CPU) "
                           "| extra passes (wall / CPU) |"
                           if FLAGS.rotation else ""))
  print("|---|---:|---:|---:|---:|" + ("---:|---:|---:|---:|"
                                     if FLAGS.rotation else ""))
  specs = FLAGS.codecs.split(";") if FLAGS.codecs else _DEFAULT
  for spec in specs:
    codec = ndq_tf.codecs.get(spec)
    kwargs = ({"side_information": side}
              if codec.needs_side_information else {})

    def run(codec=codec, kwargs=kwargs):
      codec.decode(codec.encode(x, seed), seed, **kwargs).numpy()

    rotated = None
    if FLAGS.rotation and "rotation" in codec.get_config():
      rotated = type(codec)(**dict(codec.get_config(), rotation="hadamard"))

      def run_rotated(codec=rotated, kwargs=kwargs):
        codec.decode(codec.encode(x, seed), seed, **kwargs).numpy()

      # Alternate plain and rotated so that both see the same load.
      times = [(common.median_seconds(run, 1),
                common.median_seconds(run_rotated, 1))
               for _ in range(FLAGS.repeats)]
      seconds, cpu = (float(np.median([t[0][i] for t in times]))
                      for i in (0, 1))
      r_seconds, r_cpu = (float(np.median([t[1][i] for t in times]))
                          for i in (0, 1))
    else:
      seconds, cpu = common.median_seconds(run, FLAGS.repeats)
    bits = codec.wire_bits(n) / n
    row = (f"| `{codec!r}` | {bits:.3f} | {seconds * 1e3:.1f} | "
           f"{seconds / base:.2f} | {cpu / base_cpu:.2f} |")
    if rotated is not None:
      row += (f" {rotated.wire_bits(n) / n:.3f} | {r_seconds / base:.2f} | "
              f"{r_cpu / base_cpu:.2f} | {(r_seconds - seconds) / base:.2f} "
              f"/ {(r_cpu - cpu) / base_cpu:.2f} |")
    elif FLAGS.rotation:
      row += " | | | |"
    print(row, flush=True)


if __name__ == "__main__":
  app.run(main)
