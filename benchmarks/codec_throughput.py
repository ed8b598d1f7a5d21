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

A second table (`--sections=ecdq`) compares entropy-coded dithered
quantization (`EntropyCodedDitheredCodec`, `--ecdq_bits`, bucket 512) with
rotated ternary DQSG (bucket 512) on `--ecdq_elements` Gaussian values:
encode and decode apart, their sum over DQSG's (issue #35's goal: at most
2.5), the bits per element a payload really uses and the vNMSE
`‖x̂ - x‖² / ‖x‖²`. The codecs are timed in turn, one call each per round.

Usage:
  python benchmarks/codec_throughput.py [--num_elements=16777216] [--repeats=7]
      [--sections=codecs,ecdq] [--ecdq_elements=1048576]
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
flags.DEFINE_list("sections", ["codecs", "ecdq"], "Tables to print: "
                  "'codecs' (every codec against one fused pass), 'ecdq' "
                  "(ECDQ against rotated ternary DQSG).")
flags.DEFINE_integer("ecdq_elements", 2**20, "Gaussian values of the ECDQ "
                     "table.")
flags.DEFINE_list("ecdq_bits", ["0.7", "1.0", "2.0"], "The ECDQ codecs' "
                  "`bits` targets.")

_DEFAULT = [
    "float32", "float16", "dqsg:num_levels=1", "dqsg:num_levels=3",
    "half_dithered", "ndqsg:num_levels=3,coarse_ratio=3", "qsgd:num_levels=1",
    "terngrad",
]


def main(argv):
  del argv
  unknown = set(FLAGS.sections) - {"codecs", "ecdq"}
  if unknown:
    raise app.UsageError(f"--sections takes 'codecs' and 'ecdq'. Received: "
                         f"{sorted(unknown)}.")
  if "codecs" in FLAGS.sections:
    _codec_table()
  if "ecdq" in FLAGS.sections:
    _ecdq_table()


def _codec_table():
  """Every codec's encode + decode over one fused elementwise pass."""
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


def _ecdq_table():
  """ECDQ against rotated ternary DQSG: times, bits and vNMSE."""
  n = FLAGS.ecdq_elements
  x = tf.constant(np.random.default_rng(0).normal(size=n).astype(np.float32))
  seed = tf.constant([7, 11])
  codecs = [ndq_tf.DitheredCodec(num_levels=1, bucket_size=512,
                                 rotation="hadamard")]
  codecs += [ndq_tf.EntropyCodedDitheredCodec(bits=float(b), bucket_size=512)
             for b in FLAGS.ecdq_bits]
  x64 = x.numpy().astype(np.float64)
  payloads, bits, vnmse = [], [], []
  for codec in codecs:
    payload = codec.encode(x, seed)
    error = codec.decode(payload, seed).numpy().astype(np.float64) - x64
    payloads.append(payload)
    bits.append((int(codec.payload_bits(payload)) if codec.variable_length
                 else codec.wire_bits(n)) / n)
    vnmse.append(float(np.sum(error**2) / np.sum(x64**2)))

  def timers(codec, payload):
    return (lambda: codec.encode(x, seed).words.numpy(),
            lambda: codec.decode(payload, seed).numpy())

  # One call of each per round, the codecs in turn, so that they all see
  # the same load; the first round warms up.
  calls = [timers(c, p) for c, p in zip(codecs, payloads)]
  times = [[[], []] for _ in codecs]
  for round_ in range(FLAGS.repeats + 1):
    for timed, fns in zip(times, calls):
      for k, fn in enumerate(fns):
        t = common.median_seconds(fn, 1, warm_up=False)
        if round_:
          timed[k].append(t)
  # [codec][encode, decode][wall, cpu]
  med = [[[float(np.median([t[i] for t in timed[k]])) for i in (0, 1)]
          for k in (0, 1)] for timed in times]
  ref = [med[0][0][i] + med[0][1][i] for i in (0, 1)]
  print(f"\nECDQ against rotated ternary DQSG: {n} Gaussian float32, "
        f"bucket 512, median of {FLAGS.repeats} rounds.\n")
  print("| codec | bits/elem | vNMSE | encode ms (wall / CPU) | "
        "decode ms (wall / CPU) | (enc+dec)/DQSG (wall / CPU) |")
  print("|---|---:|---:|---:|---:|---:|")
  for codec, b, v, (enc, dec) in zip(codecs, bits, vnmse, med):
    ratio = [(enc[i] + dec[i]) / ref[i] for i in (0, 1)]
    print(f"| `{codec!r}` | {b:.3f} | {v:.4f} | {enc[0] * 1e3:.1f} / "
          f"{enc[1] * 1e3:.1f} | {dec[0] * 1e3:.1f} / {dec[1] * 1e3:.1f} | "
          f"{ratio[0]:.2f} / {ratio[1]:.2f} |", flush=True)


if __name__ == "__main__":
  app.run(main)
