"""docs/accuracy_vs_bits.md and its plot, from the run files alone.

benchmarks/accuracy_vs_bits.py writes one JSON per (workload, row, seed);
`write_report` reads every JSON of a folder, keeps for each workload the
newest configuration (recipe and replicas) of its most recent run and, for
each row, the code version of that row's most recent run (so that rows
added later, such as the low-rank ones, join the runs made before them;
the table names each row's code when they differ), and writes a table per
workload and one PNG with a panel per workload (the metric against bits
per element, each row's seed spread as error bars, float32's spread as a
horizontal band), then the issue's checks (every row
has 3 seeds, float32 meets the recipe's floor, unrotated ternary sits at
least 1 point or 3% from float32) and rotation's verdict (`rotation_verdict`:
what rotated ternary buys beyond the seeds' spread, its measured cost per
step, and the link rate below which it beats the cheapest unrotated row as
accurate). It imports neither TensorFlow nor ndq_tf and trains nothing.

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

__all__ = ["MARKDOWN", "PNG", "QUALITY_FLOORS", "SEPARATION", "SEEDS",
           "select", "summarize", "rotation_verdict", "ecdq_match", "findings",
           "write_report"]

MARKDOWN = "accuracy_vs_bits.md"
PNG = "accuracy_vs_bits.png"

#: The recipes' quality floors for float32 at every seed (issue #32: at
#: least 90% on Fashion-MNIST; the character model states none).
QUALITY_FLOORS = {"vision": 0.90}
#: How far unrotated ternary DQSG must sit from float32 (mean of the
#: paired differences) for the workload to tell codecs apart: 1 point of
#: accuracy, or 3% of the bits per character.
SEPARATION = {"vision": ("paired", 0.01), "chars": ("relative", 0.03)}
#: Seeds every row must have.
SEEDS = 3
#: The rows that decide rotation's default: unrotated and rotated ternary.
_PLAIN, _ROTATED = "dqsg1", "dqsg1r"

_TITLES = {"vision": "Fashion-MNIST CNN", "chars": "character transformer"}


def _higher_is_better(workload):
  return accuracy_workloads.METRICS.get(workload, ("", True))[1]


def _version(run):
  c = run["config"]
  return json.dumps([c["recipe"], c["replicas"]], sort_keys=True)


def _newest(runs, key):
  """The runs whose `key` is that of the most recently finished one."""
  newest = key(max(runs, key=lambda r: r["finished_utc"]))
  return [r for r in runs if key(r) == newest]


def select(runs):
  """{workload: runs of its newest version}, older versions dropped.

  A workload's version is (recipe, replicas), the newest that of its most
  recently finished run; within it, each row keeps the runs of its own
  most recent code version.
  """
  out = {}
  by_workload = collections.defaultdict(list)
  for r in runs:
    by_workload[r["config"]["workload"]].append(r)
  for workload, rs in by_workload.items():
    by_row = collections.defaultdict(list)
    for r in _newest(rs, _version):
      by_row[r["config"]["row"]["name"]].append(r)
    out[workload] = [r for row_runs in by_row.values()
                     for r in _newest(row_runs, lambda r: r["config"]["code"])]
  return out


def _mean_of(runs, key):
  """The mean of `key` over `runs` (numbers or dicts), None if one lacks it."""
  values = [r.get(key) for r in runs]
  if any(v is None for v in values):
    return None
  if isinstance(values[0], dict):
    return {k: statistics.mean(v[k] for v in values) for k in values[0]}
  return statistics.mean(values)


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
        "code": rs[0]["config"]["code"],
        # Low-rank rows: their PowerSGD keywords, and the steps after the
        # warm-up (None for the others).
        "low_rank": rs[0]["config"]["row"].get("low_rank"),
        "steady_bits": _mean_of(rs, "steady_bits_per_element"),
        "steady_model_ms": _mean_of(rs, "steady_model_exchange_ms"),
    })
  return out


def _interval(mean_spread):
  mean, spread = mean_spread
  return mean - spread, mean + spread


def _line(a1, b1, a2, b2):
  """Link rate (Gbit/s) where a1 + b1/L = a2 + b2/L, or None if none."""
  if a1 == a2 or (b2 - b1) / (a1 - a2) <= 0:
    return None
  return (b2 - b1) / (a1 - a2)


def _fit(model_ms):
  """(a, b) of the cost model's `a + b/L` ms from its two link rates."""
  (l1, t1), (l2, t2) = sorted((float(k), v) for k, v in model_ms.items())[:2]
  b = (t1 - t2) / (1 / l1 - 1 / l2)
  return t1 - b / l1, b


def rotation_verdict(workload, summary):
  """What rotated ternary buys on one workload, and what it costs.

  Returns None when either ternary row is missing, else a dict:
  `better`: rotated's paired difference from float32 is better than
  unrotated's and the two rows' intervals (mean ± half range over seeds)
  do not overlap; `step_ms`: rotation's measured cost per step on this
  machine (rotated minus unrotated median step, averaged over seeds);
  `against`: the row with the fewest bits, unrotated, whose paired
  difference is at least as good as rotated ternary's, and `pays_below`:
  the link rate (Gbit/s) below which rotated ternary's step (cost model
  plus `step_ms`) beats that row's.
  """
  by = {s["name"]: s for s in summary}
  if _PLAIN not in by or _ROTATED not in by:
    return None
  plain, rotated = by[_PLAIN], by[_ROTATED]
  if plain["paired"] is None or rotated["paired"] is None:
    return None
  sign = 1 if _higher_is_better(workload) else -1
  lo_p, hi_p = _interval(plain["paired"])
  lo_r, hi_r = _interval(rotated["paired"])
  gain = sign * (rotated["paired"][0] - plain["paired"][0])
  disjoint = lo_r > hi_p if sign > 0 else hi_r < lo_p
  cost = rotated["step_ms"] - plain["step_ms"]
  candidates = [s for s in summary
                if "hadamard" not in s["codec"]
                and (s["paired"] is None  # float32 itself
                     or sign * s["paired"][0] >= sign * rotated["paired"][0])]
  against = min(candidates, key=lambda s: s["bits"]) if candidates else None
  pays_below = None
  if against is not None:
    a1, b1 = _fit(rotated["model_ms"])
    a2, b2 = _fit(against["model_ms"])
    pays_below = _line(a1 + cost, b1, a2, b2)
  return {"better": gain > 0 and disjoint, "gain": gain,
          "disjoint": disjoint, "step_ms": cost, "against": against,
          "pays_below": pays_below}


def _is_ecdq(summary_row):
  return summary_row["codec"].split(":")[0] == "ecdq"


def ecdq_match(workload, summary, metric_name):
  """Issue #35's check: the lowest ECDQ rate as accurate as unrotated ternary.

  A row matches when the mean of its paired differences from float32 is no
  worse than unrotated ternary DQSG's (`dqsg1`); the line gives both, with
  their seed spreads, and the goal (at most 1 bit per element).
  """
  title = _TITLES.get(workload, workload)
  by = {s["name"]: s for s in summary}
  plain = by.get(_PLAIN)
  if plain is None or plain["paired"] is None:
    return f"- **{title}, ECDQ:** no unrotated ternary runs to compare with."
  sign = 1 if _higher_is_better(workload) else -1
  scale, unit = ((100, " points") if sign > 0 else
                 (1, " " + metric_name))
  def cell(s):
    mean, spread = s["paired"]
    return (f"{scale * mean:+.3g} ± {scale * spread:.2g}{unit} at "
            f"{s['bits']:.2f} bits")
  rows = sorted((s for s in summary if _is_ecdq(s) and s["paired"]),
                key=lambda s: s["bits"])
  match = next((s for s in rows
                if sign * s["paired"][0] >= sign * plain["paired"][0]), None)
  text = (f"- **{title}, the lowest ECDQ rate as accurate as unrotated "
          f"ternary** ({cell(plain)}; mean paired difference no worse): ")
  if match is None:
    text += ("none of " + ", ".join(cell(s) for s in rows)
             + ". The goal (at most 1 bit) is MISSED.")
  else:
    text += (f"{match['label']}, {cell(match)}. The goal is at most 1 bit: "
             f"{'met' if match['bits'] <= 1.0 else 'MISSED'}.")
  return text


def findings(selected, summaries, rows):
  """The issue's checks and rotation's verdict, as markdown lines.

  `rows`: the row names every workload should have.
  """
  lines = ["## Checks", ""]
  for workload, summary in summaries.items():
    by = {s["name"]: s for s in summary}
    title = _TITLES.get(workload, workload)
    short = [s["name"] for s in summary if len(s["seeds"]) < SEEDS] + [
        f"{name} (none)" for name in rows if name not in by]
    lines.append(f"- **{title}, seeds:** " + (
        f"every row has {SEEDS}." if not short else
        f"rows with fewer than {SEEDS}: {', '.join(short)}."))
    floor = QUALITY_FLOORS.get(workload)
    base = [r for r in selected[workload]
            if r["config"]["row"]["name"] == "float32"]
    if floor is not None and base:
      values = ", ".join(f"{r['metric']:.4f}" for r in
                         sorted(base, key=lambda r: r["config"]["seed"]))
      ok = all(r["metric"] >= floor for r in base)
      lines.append(f"- **{title}, float32 against the floor "
                   f"{floor:g}:** {values} by seed: "
                   f"{'met' if ok else 'MISSED'}.")
    kind, need = SEPARATION.get(workload, (None, None))
    if kind and _PLAIN in by and by[_PLAIN][kind] is not None:
      value = by[_PLAIN][kind][0]
      unit = (f"{100 * value:+.2f} points" if kind == "paired" and
              _higher_is_better(workload) else f"{100 * value:+.2f}%")
      goal = (f"{100 * need:g} point" if kind == "paired"
              else f"{100 * need:g}%")
      lines.append(f"- **{title}, unrotated ternary against float32** "
                   f"(mean of paired differences): {unit}; the goal is at "
                   f"least {goal}: {'met' if abs(value) >= need else 'MISSED'}.")
  lines += [ecdq_match(w, s, selected[w][0]["metric_name"])
            for w, s in summaries.items() if any(_is_ecdq(x) for x in s)]
  lines += ["", "## Rotation's default", ""]
  verdicts = {w: rotation_verdict(w, s) for w, s in summaries.items()}
  for workload, v in verdicts.items():
    title = _TITLES.get(workload, workload)
    if v is None:
      lines.append(f"- **{title}:** no rotated and unrotated ternary runs.")
      continue
    # Accuracy reads in points; a lower-is-better metric in its own unit.
    higher = _higher_is_better(workload)
    scale = 100 if higher else 1
    unit = (" points" if higher
            else " " + selected[workload][0]["metric_name"])
    text = (f"- **{title}:** rotation moves ternary's paired difference "
            f"by {scale * v['gain']:+.4g}{unit} toward float32 "
            f"({'beyond' if v['disjoint'] else 'within'} the seeds' "
            f"spread). Its cost here: {v['step_ms']:+.1f} ms per measured "
            "step (4 replicas on 2 shared cores).")
    if v["against"] is not None:
      a = v["against"]
      where = ("at every link rate" if v["pays_below"] is None and
               v["step_ms"] <= 0 else
               "at no link rate" if v["pays_below"] is None else
               f"below {1000 * v['pays_below']:.0f} Mbit/s")
      text += (f" The unrotated row with the fewest bits that is at least "
               f"as accurate is {a['label']} ({a['bits']:.2f} bits); "
               f"rotated ternary's step (cost model plus that cost) beats "
               f"it {where}.")
    else:
      text += " No unrotated row is as accurate."
    lines.append(text)
  decided = [v for v in verdicts.values() if v is not None]
  default = (len(decided) == len(verdicts) and decided
             and all(v["better"] for v in decided))
  lines += ["", ("**Verdict: rotation becomes the default** for the "
                 "dithered codecs: rotated ternary's paired difference is "
                 "smaller on every workload, beyond the seeds' spread."
                 if default else
                 "**Verdict: rotation stays off by default**: rotated "
                 "ternary's paired difference is not smaller than "
                 "unrotated's beyond the seeds' spread on every workload."),
            ""]
  return lines


def _codec_cell(s):
  if s["low_rank"]:
    return "`ndq_tf.PowerSGD(" + ", ".join(
        f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
        for k, v in s["low_rank"].items()) + ")`"
  codec = f"`{s['codec']}`"
  if s["options"].get("reference_codec"):
    codec += (f" + reference `{s['options']['reference_codec']}` on "
              f"{s['options'].get('reference_replicas')} replicas")
  return codec


def _with_steady(value, steady, digits):
  """`value`, then the low rank's value after the warm-up in parentheses."""
  return f"{value:.{digits}f}" + (
      "" if steady is None else f" ({steady:.{digits}f})")


def _codes(summary):
  """The code version, or each version and its rows when they differ."""
  rows = collections.OrderedDict()
  for s in summary:
    rows.setdefault(s["code"], []).append(s["name"])
  if len(rows) == 1:
    return f"code {next(iter(rows))}"
  return "code " + "; ".join(f"{code} ({', '.join(names)})"
                             for code, names in rows.items())


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
    cells = [s["label"], _codec_cell(s), exchange,
             ",".join(map(str, s["seeds"])),
             f"{s['metric']:.{digits}f} ± {s['spread']:.{digits}f}", paired]
    if not higher:
      cells.append("—" if s["relative"] is None else
                   f"{100 * s['relative'][0]:+.2f} ± "
                   f"{100 * s['relative'][1]:.2f}")
    steady_ms = s["steady_model_ms"] or {}
    cells += [_with_steady(s["bits"], s["steady_bits"], 3)] + [
        _with_steady(s["model_ms"][k], steady_ms.get(k), 1)
        for k in links] + [f"{s['step_ms']:.0f}"]
    lines.append("| " + " | ".join(cells) + " |")
  c = r0["config"]
  recipe = ", ".join(f"{k}={v}" for k, v in c["recipe"].items())
  return [f"## {workload}: {_TITLES.get(workload, workload)}", "",
          f"Recipe: {recipe}; {c['replicas']} replicas; "
          f"{r0['parameters']:,} parameters ({r0['compressed_elements']:,} "
          f"compressed, {r0['lossless_elements']:,} sent losslessly), "
          f"{r0['steps']:,} steps; {_codes(summary)}. Higher is "
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
    markers = "osD^v<>ph*XPd8"
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


def _low_rank_note(selected, summaries):
  """The low-rank rows' paragraph, when any ran (else no line)."""
  starts, fallbacks = {}, set()
  for workload, summary in summaries.items():
    for s in summary:
      if s["low_rank"]:
        steps = selected[workload][0]["steps"]
        starts.setdefault(workload, (set(), steps))[0].add(
            s["low_rank"]["start_step"])
        fallbacks.add(f"`{s['low_rank']['fallback_codec']}`")
  if not starts:
    return []
  warm = ", ".join(
      f"{' or '.join(f'{start:,}' for start in sorted(ss))} of {steps:,} "
      f"on {workload}" for workload, (ss, steps) in starts.items())
  return [
      "**Low-rank rows** (`ndq_tf.PowerSGD`, issue #34): their first "
      "steps (the warm-up of the row's label; `start_step`: "
      f"{warm}) send every tensor with the fallback "
      f"codec ({', '.join(sorted(fallbacks))}) before the low rank starts "
      "(the warm-up). "
      "Their **bits/element** and **model exchange ms** are the mean over "
      "every step of the run, warm-up included, as for the other rows; in "
      "parentheses, the steady state: the mean over the steps after the "
      "warm-up. The cost model prices a low-rank step as its three "
      "exchanges (the fallback codec's tensors, then the factors `P` and "
      "`Q`), all-reduced like PyTorch's hook; the plot places them at the "
      "mean.",
      "",
  ]


def write_report(runs_dir, report_dir, rows=None):
  """Writes MARKDOWN and PNG into `report_dir`; returns their paths.

  `rows`: the row names every workload should have (default: every row
  that any workload has); the checks list those with no run or fewer than
  `SEEDS` seeds.

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
      "(`ndq_tf.core.cost_model.exchange_seconds`: bits over the link "
      "plus the CPU's decode work; the lossless tensors as a float32 ring), "
      "float32 and fp16 priced as TF's float ring; **measured ms/step**: "
      "median step on this machine's 4 logical devices, where nothing "
      "crosses a link (2 shared cores: compare roughly).",
      "",
  ]
  lines += _low_rank_note(selected, summaries)
  for workload, runs_of in selected.items():
    lines += _table(workload, runs_of, summaries[workload])
  if rows is None:
    rows = sorted({s["name"] for summary in summaries.values()
                   for s in summary})
  lines += findings(selected, summaries, rows)
  lines += [f"![{PNG}]({PNG})", ""]
  os.makedirs(report_dir, exist_ok=True)
  md = os.path.join(report_dir, MARKDOWN)
  png = os.path.join(report_dir, PNG)
  _plot(selected, summaries, png)
  with open(md, "w") as f:
    f.write("\n".join(lines))
  return [md, png]
