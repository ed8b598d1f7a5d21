"""Bits per worker per step against the number of workers: the cost model.

Tabulates `ndq_tf.core.cost_model.exchange_bits` (what each worker sends per step, per
gradient element) for every codec and transport, next to TF's float32 and
float16 rings, for a range of worker counts; which exchange `"auto"` would
pick (`cost_model.auto`, for worker processes on CPUs and by bits
alone); and the integer lanes the all-reduce packs
the codes in (`ndq_tf.ops.lane_layout`). Nothing is run or measured: these
are the model's numbers.

Usage:
  python benchmarks/scaling_table.py [--num_elements=4194304]
      [--bucket_size=512] [--workers=2,4,...,1024] [--output=docs/scaling.md]

With `--output`, the tables replace what lies between the markers
`<!-- BEGIN scaling_table -->` and `<!-- END scaling_table -->` in that file;
without it they are printed.
"""

import re

from absl import app
from absl import flags

import ndq_tf
from ndq_tf import ops
from ndq_tf.core import cost_model
from ndq_tf.core.exchanges import reduce_scatter

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_elements", 2**22,
                     "Elements in the exchanged (fused) buffer.")
flags.DEFINE_integer("bucket_size", 512, "Values per scale, every codec.")
flags.DEFINE_list("workers",
                  ["2", "4", "8", "16", "32", "64", "128", "256", "512",
                   "1024"],
                  "Worker counts P (one column each).")
flags.DEFINE_string("output", "",
                    "Markdown file whose marked section is replaced by the "
                    "tables; empty: print them.")

_BEGIN = "<!-- BEGIN scaling_table -->"
_END = "<!-- END scaling_table -->"


def _codecs(bucket_size):
  """(label, codec or per-worker codecs function) of every codec shown."""
  d = bucket_size
  nested = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3,
                                      bucket_size=d)
  options = ndq_tf.distribute.CompressionOptions(
      codec=nested,
      reference_codec=ndq_tf.DitheredCodec(num_levels=3, bucket_size=d))
  return [
      ("DQSG M=1", ndq_tf.DitheredCodec(num_levels=1, bucket_size=d)),
      ("DQSG M=3", ndq_tf.DitheredCodec(num_levels=3, bucket_size=d)),
      ("TernGrad", ndq_tf.TernGradCodec(bucket_size=d)),
      ("QSGD s=1", ndq_tf.QSGDCodec(num_levels=1, bucket_size=d)),
      ("NDQSG (3,3), P1 = half DQSG M=3", options.sender_codecs),
  ]


def _resolve(codec, p):
  return codec(p) if callable(codec) else codec


def _rows(n, bucket_size, workers):
  """(label, [bits per element for each P]) of every configuration."""
  rows = [
      ("float32 ring", [cost_model.exchange_bits(None, n, p, "float32_ring") / n
                        for p in workers]),
      ("fp16 ring", [cost_model.exchange_bits(None, n, p, "float16_ring") / n
                     for p in workers]),
  ]
  for label, codec in _codecs(bucket_size):
    for transport in ("all_gather", "all_reduce", "reduce_scatter"):
      values = []
      for p in workers:
        try:
          values.append(
              cost_model.exchange_bits(_resolve(codec, p), n, p, transport) / n)
        except ValueError:
          values = None
          break
      if values is not None:
        rows.append((f"{label}, {transport}", values))
    if label == "DQSG M=1":
      # The reduce-scatter with ternary re-quantization of the sums.
      ternary = reduce_scatter.stage2_codec(
          ndq_tf.distribute.CompressionOptions(
              codec, exchange="reduce_scatter", reduce_scatter_levels=1))
      rows.append((f"{label}, reduce_scatter_levels=1", [
          reduce_scatter.bits_per_element(codec, n, p, stage2=ternary)
          for p in workers]))
  return rows


_SHORT = {"all_gather": "AG", "all_reduce": "AR", "reduce_scatter": "RS"}


def _auto_rows(n, bucket_size, workers):
  rows = []
  for label, codec in _codecs(bucket_size):
    cells = []
    for p in workers:
      c = _resolve(codec, p)
      choice = cost_model.auto(c, n, p)
      # By bits alone (devices whose work the model does not price) the
      # choice is the same at every P tabulated.
      assert choice == cost_model.auto(c, n, p, on_cpu=False), (c, p)
      bits = cost_model.exchange_bits(c, n, p, choice) / n
      cells.append(f"{_SHORT[choice]} {bits:.2f}")
    rows.append((label, cells))
  return rows


def _lane_rows(n, workers):
  rows = []
  for m in (1, 3):
    cells = []
    for p in workers:
      layout = ops.lane_layout(2 * m + 1, p, n)
      dtype = layout.dtype.name
      cells.append(f"{layout.lane_bits}b×{layout.lanes_per_word} {dtype} "
                   f"({layout.wire_bits / n:.2f})")
    rows.append((f"M={m} ({2 * m + 1} symbols)", cells))
  return rows


def _table(header, rows):
  lines = ["| " + " | ".join(header) + " |",
           "|---|" + "---:|" * (len(header) - 1)]
  for label, cells in rows:
    lines.append("| " + " | ".join([label] + list(cells)) + " |")
  return "\n".join(lines)


def render(n, bucket_size, workers):
  """The markdown tables (the generated section of docs/scaling.md)."""
  header = ["bits per element, P ="] + [str(p) for p in workers]
  bits = [(label, [f"{v:.2f}" for v in values])
          for label, values in _rows(n, bucket_size, workers)]
  parts = [
      f"Generated by `python benchmarks/scaling_table.py --output "
      f"docs/scaling.md` "
      f"(n = {n} elements, bucket_size = {bucket_size}).",
      "",
      "**Bits each worker sends per step, per element** "
      "(`cost_model.exchange_bits(...) / n`):",
      "",
      _table(header, bits),
      "",
      "**What `\"auto\"` picks for worker processes on CPUs** "
      "(`cost_model.auto`'s time model: bits over a 10 Gbit/s link "
      "plus the CPU work; AG all-gather, AR all-reduce, RS reduce-scatter; "
      "a tie keeps the all-gather), and its bits per element:",
      "",
      _table(["codec, P ="] + [str(p) for p in workers],
             _auto_rows(n, bucket_size, workers)),

      "",
      "**Lanes of the all-reduce** (`ops.lane_layout(2M + 1, P, n)`: bits "
      "per lane × lanes per word, word type, and bits per code):",
      "",
      _table(["DQSG, P ="] + [str(p) for p in workers],
             _lane_rows(n, workers)),
  ]
  return "\n".join(parts)


def main(argv):
  del argv
  workers = [int(p) for p in FLAGS.workers]
  text = render(FLAGS.num_elements, FLAGS.bucket_size, workers)
  if not FLAGS.output:
    print(text)
    return
  with open(FLAGS.output, encoding="utf-8") as f:
    doc = f.read()
  pattern = re.compile(re.escape(_BEGIN) + ".*?" + re.escape(_END), re.S)
  if not pattern.search(doc):
    raise ValueError(
        f"`--output` must name a file with the markers {_BEGIN} and {_END}. "
        f"Received: --output={FLAGS.output!r}.")
  doc = pattern.sub(lambda _: f"{_BEGIN}\n{text}\n{_END}", doc)
  with open(FLAGS.output, "w", encoding="utf-8") as f:
    f.write(doc)
  print(f"Wrote {FLAGS.output}.")


if __name__ == "__main__":
  app.run(main)
