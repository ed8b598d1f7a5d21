"""docs/accuracy_vs_bits.md and its plot, from the run files alone.

benchmarks/accuracy_vs_bits.py writes one JSON per (workload, row, seed);
`write_report` reads every JSON of a folder, keeps for each workload the
newest configuration (recipe and code version) of its most recent run, and
writes a table per workload and one PNG with a panel per workload (the
metric against bits per element, each row's seed spread as error bars,
float32's spread as a horizontal band). It imports neither TensorFlow nor
ndq_tf and trains nothing.

Spreads are half the range over seeds (with 3 seeds, the honest summary;
a standard deviation of 3 values says little more). The paired difference
subtracts float32's metric at the same seed (same initial weights, batch
order) before averaging, which removes the seed's own variation.
"""

import collections
import json
import os
import statistics

# benchmarks/*.py, next to this script; neither imports TensorFlow.
import accuracy_workloads
import common

__all__ = ["MARKDOWN", "PNG", "select", "summarize", "write_report"]

MARKDOWN = "accuracy_vs_bits.md"
PNG = "accuracy_vs_bits.png"

_TITLES = {"vision": "Fashion-MNIST CNN", "chars": "character transformer"}


def _higher_is_better(workload):
  return accuracy_workloads.METRICS.get(workload, ("", True))[1]


def _version(run):
  c = run["config"]
  return json.dumps([c["recipe"], c["code"], c["replicas"]], sort_keys=True)


def select(runs):
  """{workload: runs of its newest version}, older versions dropped.

  A version is (recipe, code, replicas); the newest is that of the
  workload's most recently finished run.
  """
  out = {}
  by_workload = collections.defaultdict(list)
  for r in runs:
    by_workload[r["config"]["workload"]].append(r)
  for workload, rs in by_workload.items():
    newest = _version(max(rs, key=lambda r: r["finished_utc"]))
    out[workload] = [r for r in rs if _version(r) == newest]
  return out


def _mean_spread(values):
  mean = statistics.mean(values)
  return mean, (max(values) - min(values)) / 2


def summarize(runs):
  """One dict per row (in the order of the script's ROWS) of a workload."""
  rows = collections.OrderedDict()
  for r in sorted(runs, key=lambda r: r.get("row_order", 1 << 30)):
    rows.setdefault(r["config"]["row"]["name"], []).append(r)
  base = {r["config"]["seed"]: r["metric"] for r in rows.get("float32", [])}
  out = []
  for name, rs in rows.items():
    rs = sorted(rs, key=lambda r: r["config"]["seed"])
    metric, spread = _mean_spread([r["metric"] for r in rs])
    paired = [r["metric"] - base[r["config"]["seed"]] for r in rs
              if r["config"]["seed"] in base]
    relative = [(r["metric"] - base[r["config"]["seed"]])
                / base[r["config"]["seed"]] for r in rs
                if r["config"]["seed"] in base]
    out.append({
        "name": name,
        "label": rs[0]["label"],
        "codec": rs[0]["config"]["row"]["codec"],
        "options": rs[0]["config"]["row"]["options"],
        "seeds": [r["config"]["seed"] for r in rs],
        "metric": metric,
        "spread": spread,
        "paired": _mean_spread(paired) if paired and name != "float32"
                  else None,
        "relative": _mean_spread(relative) if relative and name != "float32"
                    else None,
        "bits": statistics.mean(r["bits_per_element"] for r in rs),
        "transport": rs[0]["transport"],
        "priced_as": rs[0]["priced_as"],
        "model_ms": {k: statistics.mean(r["model_exchange_ms"][k] for r in rs)
                     for k in rs[0]["model_exchange_ms"]},
        "step_ms": statistics.mean(r["median_step_ms"] for r in rs),
    })
  return out


def _table(workload, runs, summary):
  r0 = runs[0]
  metric_name = r0["metric_name"]
  higher = _higher_is_better(workload)
  digits = 4
  links = list(summary[0]["model_ms"])
  header = ["row", "codec", "exchange", "seeds", f"{metric_name}",
            "Δ vs float32, paired"]
  if not higher:
    header.append("Δ %")
  header += ["bits/element"] + [
      f"model exchange ms @ {float(k) * 1000:g} Mbit/s" for k in links] + [
          "measured ms/step"]
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  for s in summary:
    paired = ("—" if s["paired"] is None else
              f"{s['paired'][0]:+.{digits}f} ± {s['paired'][1]:.{digits}f}")
    exchange = s["transport"] + (
        f" (priced as {s['priced_as']})" if s["priced_as"] != s["transport"]
        else "")
    codec = f"`{s['codec']}`"
    if s["options"].get("reference_codec"):
      codec += (f" + reference `{s['options']['reference_codec']}` on "
                f"{s['options'].get('reference_replicas')} replicas")
    cells = [s["label"], codec, exchange,
             ",".join(map(str, s["seeds"])),
             f"{s['metric']:.{digits}f} ± {s['spread']:.{digits}f}", paired]
    if not higher:
      cells.append("—" if s["relative"] is None else
                   f"{100 * s['relative'][0]:+.2f} ± "
                   f"{100 * s['relative'][1]:.2f}")
    cells += [f"{s['bits']:.3f}"] + [
        f"{s['model_ms'][k]:.1f}" for k in links] + [f"{s['step_ms']:.0f}"]
    lines.append("| " + " | ".join(cells) + " |")
  c = r0["config"]
  recipe = ", ".join(f"{k}={v}" for k, v in c["recipe"].items())
  return [f"## {workload}: {_TITLES.get(workload, workload)}", "",
          f"Recipe: {recipe}; {c['replicas']} replicas; "
          f"{r0['parameters']:,} parameters ({r0['compressed_elements']:,} "
          f"compressed, {r0['lossless_elements']:,} sent losslessly), "
          f"{r0['steps']:,} steps; code {c['code']}. Higher is "
          f"{'better' if higher else 'worse'}.", ""] + lines + [""]


def _plot(selected, summaries, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  workloads = list(selected)
  fig, axes = plt.subplots(1, len(workloads),
                           figsize=(6.5 * len(workloads), 4.8), squeeze=False)
  for ax, workload in zip(axes[0], workloads):
    summary = summaries[workload]
    markers = "osD^v<>ph*"
    for i, s in enumerate(summary):
      if s["name"] == "float32":
        # A band, so that every row can be read against float32's own
        # seed-to-seed variation.
        ax.axhspan(s["metric"] - s["spread"], s["metric"] + s["spread"],
                   color="0.85", label="float32 seed spread")
        ax.axhline(s["metric"], color="0.5", linewidth=0.8)
      ax.errorbar(s["bits"], s["metric"], yerr=s["spread"],
                  fmt=markers[i % len(markers)], capsize=3, label=s["label"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bits per gradient element (sent, per replica)")
    better = "higher" if _higher_is_better(workload) else "lower"
    ax.set_ylabel(f"{selected[workload][0]['metric_name']} "
                  f"({better} is better)")
    ax.set_title(_TITLES.get(workload, workload))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_report(runs_dir, report_dir):
  """Writes MARKDOWN and PNG into `report_dir`; returns their paths.

  Raises:
    FileNotFoundError: if `runs_dir` holds no run file.
  """
  runs = common.read_json_files(runs_dir)
  if not runs:
    raise FileNotFoundError(f"No run files (*.json) in runs_dir={runs_dir!r}; "
                            "train some first.")
  selected = select(runs)
  order = [w for w in ("vision", "chars") if w in selected] + sorted(
      w for w in selected if w not in ("vision", "chars"))
  selected = {w: selected[w] for w in order}
  summaries = {w: summarize(rs) for w, rs in selected.items()}
  lines = [
      "# Accuracy against bits per element",
      "",
      "<!-- Generated by `python benchmarks/accuracy_vs_bits.py --report` "
      "from its run files; edit benchmarks/accuracy_report.py, not this "
      "file. -->",
      "",
      "Workloads where gradient compression costs accuracy "
      "(benchmarks/accuracy_workloads.py: Adam 1e-3 at a constant step, a "
      "modest batch; recipes fixed on float32 before any codec ran). "
      "Every run: 4 replicas of `ndq_tf.MirroredStrategy` on one CPU split "
      "into 4 logical devices.",
      "",
      "Columns: the metric as mean ± half the range over seeds; **Δ vs "
      "float32, paired**: the metric minus float32's at the same seed, mean "
      "± half range; **bits/element**: every step's `sent_bits` of "
      "`compression_stats()` per element and replica (compressed and "
      "lossless elements); **exchange**: what ran; **model exchange ms**: "
      "one step's exchange among 4 worker processes by the cost model "
      "(`ndq_tf.distribute.exchanges.exchange_seconds`: bits over the link "
      "plus the CPU's decode work; the lossless tensors as a float32 ring), "
      "float32 and fp16 priced as TF's float ring; **measured ms/step**: "
      "median step on this machine's 4 logical devices, where nothing "
      "crosses a link (2 shared cores: compare roughly).",
      "",
  ]
  for workload, runs_of in selected.items():
    lines += _table(workload, runs_of, summaries[workload])
  lines += [f"![{PNG}]({PNG})", ""]
  os.makedirs(report_dir, exist_ok=True)
  md = os.path.join(report_dir, MARKDOWN)
  png = os.path.join(report_dir, PNG)
  _plot(selected, summaries, png)
  with open(md, "w") as f:
    f.write("\n".join(lines))
  return [md, png]
