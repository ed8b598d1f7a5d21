r"""docs/results.md and its plots from the JSON runs of paper_experiment.py.

benchmarks/paper_experiment.py writes one JSON per (run, seed) to
docs/results_runs/; this script reads every JSON of --runs_dir, groups them
by configuration (data set, epochs, train subset) and run, and writes to
--report_dir:

* results.md: the prose of --template (benchmarks/templates/results.md.in,
  a `string.Template`) around one section of tables per configuration;
* results_accuracy_vs_step.png and results_accuracy_vs_bits.png: the
  configuration with the most runs.

It imports neither TensorFlow nor ndq_tf and trains nothing: it takes
seconds.

Example:

  python benchmarks/paper_report.py
  python benchmarks/paper_report.py --runs_dir=/tmp/paper_smoke \
      --report_dir=/tmp/paper_smoke
"""

import collections
import math
import os
import statistics
import string

from absl import app
from absl import flags
import numpy as np

# benchmarks/common.py and paper_runs.py, next to this script.
import common
import paper_runs
from paper_runs import RUNS

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_PNG = "results_accuracy_vs_step.png"
BITS_PNG = "results_accuracy_vs_bits.png"

_RUNS_DIR = flags.DEFINE_string(
    "runs_dir", os.path.join(_REPO, "docs", "results_runs"),
    "Folder of the per-(run, seed) JSON files of paper_experiment.py "
    "(its --output_dir).")
_REPORT_DIR = flags.DEFINE_string(
    "report_dir", os.path.join(_REPO, "docs"),
    "Where results.md and the results_*.png plots go.")
_TEMPLATE = flags.DEFINE_string(
    "template",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates",
                 "results.md.in"),
    "string.Template of results.md; it gets $cpus, $tensorflow, $keras, "
    "$configurations, $plotted_config, $step_png and $bits_png.")


def _mean_spread(values):
  """'mean ± half range' (or just the value for one seed)."""
  if not values:
    return "—"
  m = statistics.mean(values)
  if len(values) == 1:
    return f"{m:.4f}"
  return f"{m:.4f} ± {(max(values) - min(values)) / 2:.4f}"


def _fmt_seconds(s):
  if s >= 90:
    return f"{s / 60:.1f} min"
  return f"{s:.0f} s"


def _summary(groups):
  """One generated paragraph: accuracy gaps against float32 at equal seeds."""
  base = {r["seed"]: r["final_test_accuracy"]
          for r in groups.get("float32", [])}
  if not base:
    return []
  gaps = []
  for run, rs in groups.items():
    if run == "float32":
      continue
    d = [r["final_test_accuracy"] - base[r["seed"]] for r in rs
         if r["seed"] in base]
    if d:
      gaps.append((statistics.mean(d), len(d), rs[0]["description"]))
  if not gaps:
    return []
  worst = min(gaps)
  best = max(gaps)
  text = (f"**Summary.** Against float32 at the same seed, the final test "
          f"accuracy of the compressed runs differs by {worst[0]:+.4f} "
          f"({worst[2]}) to {best[0]:+.4f} ({best[2]}), averaged over "
          f"{min(g[1] for g in gaps)}–{max(g[1] for g in gaps)} seed(s) per "
          f"run.")
  if len(base) > 1:
    text += (f" For scale, float32 itself varies by "
             f"{max(base.values()) - min(base.values()):.4f} between seeds "
             f"{', '.join(map(str, sorted(base)))}.")
  text += (" With this few seeds, differences below about 0.005 are not "
           "evidence either way.")
  # How far each run's accuracy-vs-step curve strays from float32's at the
  # same seed (same weights and batches) after the first epoch: a steadier
  # view than the last point alone.
  r0 = groups["float32"][0]
  base_curves = {r["seed"]: {p["step"]: p["eval_accuracy"]
                             for p in r["step_curve"]}
                 for r in groups["float32"]}
  rows = []
  for run, rs in groups.items():
    if run == "float32":
      continue
    diffs = []
    for r in rs:
      ref = base_curves.get(r["seed"])
      if not ref:
        continue
      diffs += [p["eval_accuracy"] - ref[p["step"]] for p in r["step_curve"]
                if p["step"] > r["steps_per_epoch"] and p["step"] in ref]
    if diffs:
      rows.append(
          f"| {rs[0]['description']} | {statistics.mean(diffs):+.4f} | "
          f"{statistics.mean(abs(d) for d in diffs):.4f} | "
          f"{min(diffs):+.4f} | {len(diffs)} |")
  if not rows:
    return ["", text]
  return ["", text, "",
          f"Per-step test accuracy (first {r0['eval_examples']:,} test "
          f"images, every {r0['eval_every']} steps after the first epoch) "
          f"minus float32's at the same seed and step:", "",
          "| run | mean | mean abs | worst | points |",
          "|---|---|---|---|---|"] + rows


def _common_seeds(groups):
  """Seeds every run of a configuration has (else those of the most runs)."""
  sets = [{r["seed"] for r in rs} for rs in groups.values()]
  shared = set.intersection(*sets)
  if shared:
    return shared
  return max(sets, key=lambda s: sum(s <= t for t in sets))


def _describe_config(r):
  reduced = []
  if r["train_examples"] < 60000 and r["dataset"] in ("fashion_mnist",
                                                      "mnist"):
    reduced.append(f"{r['train_examples']:,} of the 60,000 training images")
  if r["epochs"] < 5:
    reduced.append(f"{r['epochs']} of the protocol's 5 epochs")
  label = "REDUCED: " + "; ".join(reduced) if reduced else "full protocol"
  return (f"{r['dataset']}, {r['train_examples']:,} training images, "
          f"{r['epochs']} epoch{'s' if r['epochs'] > 1 else ''} "
          f"({r['steps_per_epoch']} steps of "
          f"{r['batch_size']} each), {r['replicas']} replicas, "
          f"{r['padding']} padding, {r['parameters']:,} parameters — {label}")


def _curves(rs):
  """(steps, [accuracy per seed]) of the per-step (else per-epoch) curve."""
  if rs[0]["step_curve"]:
    steps = [p["step"] for p in rs[0]["step_curve"]]
    curves = [[p["eval_accuracy"] for p in r["step_curve"]] for r in rs]
  else:
    steps = [p["step"] for p in rs[0]["epoch_curve"]]
    curves = [[p["test_accuracy"] for p in r["epoch_curve"]] for r in rs]
  n = min(len(c) for c in curves)
  return np.array(steps[:n]), np.array([c[:n] for c in curves])


def _plot(groups, config, path_step, path_bits):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  r0 = next(iter(groups.values()))[0]
  seeds = sorted({r["seed"] for rs in groups.values() for r in rs})
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.8),
                           gridspec_kw={"width_ratios": [3, 2]})
  styles = ["-", "--", "-.", ":"]
  for i, (run, rs) in enumerate(groups.items()):
    steps, curves = _curves(rs)
    mean = curves.mean(axis=0)
    plural = "s" if len(rs) > 1 else ""
    label = f"{rs[0]['description']} ({len(rs)} seed{plural})"
    for ax in axes:
      line, = ax.plot(steps, mean, styles[i % len(styles)], label=label,
                      linewidth=1.4)
      if len(curves) > 1:
        ax.fill_between(steps, curves.min(axis=0), curves.max(axis=0),
                        color=line.get_color(), alpha=0.12)
  last = max(_curves(rs)[0][-1] for rs in groups.values())
  tail = [c for rs in groups.values()
          for s, cs in [_curves(rs)] for c in cs.mean(axis=0)[s >= 0.6 * last]]
  axes[1].set_xlim(0.6 * last, last * 1.01)
  if tail:
    axes[1].set_ylim(min(tail) - 0.005, max(tail) + 0.005)
  axes[1].set_title("zoom: last 40% of the steps", fontsize=9)
  what = ("first %d test images" % r0["eval_examples"] if r0["step_curve"]
          else "test set")
  for ax in axes:
    ax.set_xlabel("training step (total batch %d)" % r0["batch_size"])
    ax.grid(alpha=0.3)
  axes[0].set_ylabel(f"test accuracy ({what})")
  axes[0].set_title(f"Test accuracy vs step — {config}, mean over seeds "
                    f"{','.join(map(str, seeds))} (band: min–max)",
                    fontsize=9)
  axes[0].legend(fontsize=8, loc="lower right")
  fig.tight_layout()
  fig.savefig(path_step, dpi=110)
  plt.close(fig)

  fig, ax = plt.subplots(figsize=(9, 4.8))
  reference = groups.get("float32")
  if reference:
    ax.axhline(statistics.mean(r["final_test_accuracy"] for r in reference),
               color="gray", linestyle=":", linewidth=1,
               label="float32 (mean)")
  for run, rs in groups.items():
    bits = statistics.mean(r["wire_bits_per_element"] for r in rs)
    accs = [r["final_test_accuracy"] for r in rs]
    m = statistics.mean(accs)
    err = [[m - min(accs)], [max(accs) - m]]
    ax.errorbar([bits], [m], yerr=err, fmt="o", capsize=3, markersize=6,
                label=rs[0]["description"])
  ax.set_xscale("log", base=2)
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  ax.set_xlabel("wire bits per gradient element (measured from the payloads)")
  ax.set_ylabel("final test accuracy (10,000 test images)")
  ax.set_title(f"Final accuracy vs bits — {config}, seeds "
               f"{','.join(map(str, seeds))}; bars: min–max over seeds",
               fontsize=9)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  fig.tight_layout()
  fig.savefig(path_bits, dpi=110)
  plt.close(fig)


def _transfer_table(groups):
  """What the measured payloads would cost on a real link, per step."""
  r0 = next(iter(groups.values()))[0]
  n = r0["replicas"]
  f32 = r0["parameters"] * 4
  ring = 2 * (n - 1) / n * f32
  compute = groups.get("float32")
  compute_ms = (statistics.mean(r["median_step_ms"] for r in compute)
                if compute else float("nan"))
  lines = [
      f"Per step, what would cross a real link (from the measured payload "
      f"sizes; {n} replicas, one per machine). `CompressedAllReduce` is an "
      f"all-gather: every replica sends its payload to the {n - 1} others, "
      f"so it sends {n - 1}× its payload; a float32 ring all-reduce "
      f"(TensorFlow's own, NCCL) sends 2·({n}−1)/{n}× the gradient, "
      f"{ring / 1e6:.2f} MB here. Times are bytes / bandwidth (latency and "
      f"overlap ignored). For scale: one step of this model on this CPU "
      f"takes {compute_ms:.0f} ms (float32, median).",
      "",
      "| run | payload per replica | sent per replica (all-gather) | vs "
      "float32 ring all-reduce | at 1 Gbit/s | at 10 Gbit/s |",
      "|---|---|---|---|---|---|",
  ]
  lines.append(f"| float32, ring all-reduce (reference) | {f32 / 1e3:.0f} KB "
               f"| {ring / 1e3:.0f} KB | 1.00× | {ring * 8 / 1e6:.1f} ms | "
               f"{ring * 8 / 1e7:.2f} ms |")
  for run, rs in groups.items():
    payload = statistics.mean(r["wire_bytes_per_step_per_replica"]
                              for r in rs)
    sent = (n - 1) * payload
    lines.append(
        f"| {rs[0]['description']} | {payload / 1e3:.0f} KB | "
        f"{sent / 1e3:.0f} KB | {sent / ring:.3f}× | {sent * 8 / 1e6:.1f} ms "
        f"| {sent * 8 / 1e7:.2f} ms |")
  lines.append("")
  return lines


def _counts_overloads(record):
  """Whether a nested run's record has the senders' counted overload rate.

  The fixed-mode NDQSG records in docs/results_runs/ (run `ndqsg33`) were
  written before the nested senders counted their overloads: they have no
  `mean_overload_rate`, and their `mean_overload_probability` is what the
  receivers estimated from the decoded residuals, not the Gaussian
  prediction it is now. The report labels the two apart; re-running those
  runs (`paper_experiment.py --runs=ndqsg33 --seeds=0,1,2`) makes every
  record count.
  """
  return "mean_overload_rate" in record


def _nested_paragraph(rs):
  """Who sends what in a nested run, and its overload telemetry."""
  r = rs[0]
  k = r["reference_replicas"]
  per_elt = [b / r["parameters"] for b in r["sender_bits_last_step"]]
  overload = [x["mean_overload_probability"] for x in rs
              if x["mean_overload_probability"] is not None]
  counted = [x["mean_overload_rate"] for x in rs
             if _counts_overloads(x) and x["mean_overload_rate"] is not None]
  fallback = [x["mean_fallback_fraction"] for x in rs
              if x["mean_fallback_fraction"] is not None]
  text = (
      f"{r['description']}: replicas 0–{k - 1} (the reference group) send "
      f"`{r['reference_codec']}`, {per_elt[0]:.2f} bits per element; "
      f"replicas {k}–{r['replicas'] - 1} send nested codes, "
      f"{per_elt[-1]:.2f} bits per element, decoded with the mean of the "
      f"gradients decoded before them as side information (payloads "
      f"only, per all {r['parameters']:,} parameters). ")
  if r["run"] in paper_runs.ADAPTIVE_RUNS:
    text += "The automatic mode (`adaptive=True`). "
  if overload and counted:
    text += (f"Gaussian overload probability of the nested elements at "
             f"the measured noise (`overload_probability` of "
             f"`compression_stats()`, mean over the steps): "
             f"{statistics.mean(overload):.2%}; counted by the senders "
             f"(`overload_rate`): {statistics.mean(counted):.2%}")
  elif overload:
    text += (f"Overload probability of the nested elements estimated by "
             f"the receivers from the decoded residuals (the estimator of "
             f"ndq_tf before the senders counted their overloads; it "
             f"misses them, as an overloaded element folds back into the "
             f"coarse cell and looks small), mean over the steps: "
             f"{statistics.mean(overload):.2%}")
  if fallback:
    text += (f"; buckets sent as DQSG instead (`fallback_fraction`): "
             f"{statistics.mean(fallback):.0%}")
  if overload:
    text += "."
  return text


def _group(results):
  """`{config: {run: [records by seed]}}`, largest configuration first."""
  by_config = collections.OrderedDict()
  for r in sorted(results, key=lambda r: (-r["train_examples"] * r["epochs"],
                                          r["config"])):
    by_config.setdefault(r["config"], collections.OrderedDict())
  for config in by_config:
    for run in RUNS:
      rs = [r for r in results if r["config"] == config and r["run"] == run]
      if rs:
        by_config[config][run] = sorted(rs, key=lambda r: r["seed"])
  return by_config


def _config_section(config, groups):
  """The lines of one configuration's section of results.md."""
  r0 = next(iter(groups.values()))[0]
  lines = [f"## {config}", "", _describe_config(r0), ""]
  lines += [
      "| run | codec | seeds | final test accuracy | Δ vs float32, same "
      "seeds | last-epoch train loss | bits/element | rel. bytes | train "
      "time | vs float32 | ms/step median / mean |",
      "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  base_acc = {r["seed"]: r["final_test_accuracy"]
              for r in groups.get("float32", [])}
  base = groups.get("float32")
  base_time = (statistics.mean(r["train_seconds"] for r in base)
               if base else float("nan"))
  for run, rs in groups.items():
    train_time = statistics.mean(r["train_seconds"] for r in rs)
    ratio = (f"{train_time / base_time:.2f}×" if math.isfinite(base_time)
             else "—")
    mean_ms = statistics.mean(1000 * r["train_seconds"] / r["steps"]
                              for r in rs)
    loss = statistics.mean(r["epoch_curve"][-1]["train_loss"] for r in rs)
    deltas = [r["final_test_accuracy"] - base_acc[r["seed"]] for r in rs
              if r["seed"] in base_acc]
    delta = ("—" if run == "float32" or not deltas else
             f"{statistics.mean(deltas):+.4f} ({len(deltas)})")
    codec = f"`{rs[0]['codec']}`"
    if rs[0]["reference_codec"]:
      codec += (f" + reference `{rs[0]['reference_codec']}` on "
                f"{rs[0]['reference_replicas']} replicas")
    lines.append(
        f"| {rs[0]['description']} | {codec} | "
        f"{','.join(str(r['seed']) for r in rs)} | "
        f"{_mean_spread([r['final_test_accuracy'] for r in rs])} | "
        f"{delta} | "
        f"{loss:.4f} | "
        f"{statistics.mean(r['wire_bits_per_element'] for r in rs):.3f} | "
        f"{statistics.mean(r['relative_wire_bytes'] for r in rs):.4f} | "
        f"{_fmt_seconds(train_time)} | {ratio} | "
        f"{statistics.mean(r['median_step_ms'] for r in rs):.0f} / "
        f"{mean_ms:.0f} |")
  for rs in groups.values():
    if rs[0]["reference_codec"]:
      lines += ["", _nested_paragraph(rs)]
  wanted = sorted({r["seed"] for rs in groups.values() for r in rs})
  gaps = []
  for rs in groups.values():
    have = {r["seed"] for r in rs}
    if len(have) < len(wanted):
      gaps.append(f"{rs[0]['description']} (seed "
                  f"{', '.join(str(x) for x in wanted if x not in have)})")
  if gaps:
    lines += ["", f"Not yet run: {'; '.join(gaps)}. `--seeds="
              f"{','.join(map(str, wanted))} --resume` with this "
              f"configuration's flags adds them."]
  missing = [RUNS[r][0] for r in RUNS if r not in groups]
  if missing:
    lines += ["", f"Not run in this configuration: {', '.join(missing)}."]
  lines += ["", "Final test accuracy per seed (same seed: same initial "
            "weights and batch order, so differences between rows of one "
            "column come from the codecs and their random rounding):", "",
            "| run | " + " | ".join(f"seed {x}" for x in wanted) + " |",
            "|---|" + "---|" * len(wanted)]
  for rs in groups.values():
    acc = {r["seed"]: r["final_test_accuracy"] for r in rs}
    lines.append(f"| {rs[0]['description']} | " + " | ".join(
        f"{acc[x]:.4f}" if x in acc else "—" for x in wanted) + " |")
  lines += _summary(groups)
  lines += ["", "Test accuracy after each epoch (mean over each run's "
            "seeds):", "",
            "| run | " + " | ".join(
                f"epoch {p['epoch']}" for p in r0["epoch_curve"]) + " |",
            "|---|" + "---|" * len(r0["epoch_curve"])]
  for rs in groups.values():
    n = min(len(r["epoch_curve"]) for r in rs)
    accs = [statistics.mean(r["epoch_curve"][i]["test_accuracy"]
                            for r in rs) for i in range(n)]
    lines.append(f"| {rs[0]['description']} | " +
                 " | ".join(f"{a:.4f}" for a in accs) + " |")
  totals = [r["wall_seconds_total"] for rs in groups.values() for r in rs]
  lines += ["", f"One run of this configuration took "
            f"{_fmt_seconds(min(totals))}–{_fmt_seconds(max(totals))} "
            f"wall time including the accuracy evaluations.", ""]
  lines += _transfer_table(groups)
  return lines


def write_report(runs_dir, report_dir, template_path):
  """Writes results.md and the plots to `report_dir`.

  Args:
    runs_dir: folder of the JSON runs.
    report_dir: output folder, created if missing.
    template_path: the `string.Template` of results.md.

  Returns:
    The path of results.md, or None when `runs_dir` holds no JSON.

  Raises:
    KeyError: if the template names a placeholder this script does not
      fill.
  """
  results = common.read_json_files(runs_dir)
  if not results:
    print(f"No results in {runs_dir}; no report written.")
    return None
  by_config = _group(results)
  # The plotted configuration: the largest one with the most runs.
  main_config = max(by_config, key=lambda c: (
      len(by_config[c]),
      next(iter(by_config[c].values()))[0]["train_examples"] *
      next(iter(by_config[c].values()))[0]["epochs"]))
  os.makedirs(report_dir, exist_ok=True)
  step_png = os.path.join(report_dir, STEP_PNG)
  bits_png = os.path.join(report_dir, BITS_PNG)
  seeds = _common_seeds(by_config[main_config])
  _plot(collections.OrderedDict(
      (run, [r for r in rs if r["seed"] in seeds])
      for run, rs in by_config[main_config].items()),
        main_config, step_png, bits_png)

  sections = []
  for config, groups in by_config.items():
    sections += _config_section(config, groups)
  with open(template_path) as f:
    template = string.Template(f.read())
  any_r = results[0]
  text = template.substitute(
      cpus=any_r["cpus"], tensorflow=any_r["tensorflow"],
      keras=any_r["keras"],
      configurations="\n".join(sections).strip("\n"),
      plotted_config=main_config, step_png=STEP_PNG, bits_png=BITS_PNG)
  path = os.path.join(report_dir, "results.md")
  with open(path, "w") as f:
    f.write(text.rstrip() + "\n")
  print(f"Wrote {path}, {step_png}, {bits_png} from {len(results)} results.")
  return path


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  write_report(_RUNS_DIR.value, _REPORT_DIR.value, _TEMPLATE.value)
  return 0


if __name__ == "__main__":
  app.run(main)
