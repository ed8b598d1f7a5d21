"""The plot of benchmarks/nested_tradeoff.py: NMSE against wire bits.

`plot` draws every codec's rows (`nested_tradeoff.py`'s baselines and
nested rows, by noise ratio and side information) on log axes and writes a
PNG; `settings` is that script's parsed flags (the configs, levels and
sizes the legend and the title name).
"""

import math

import numpy as np


_CONFIG_MARKERS = "osDph*<>"


def plot(path, baselines, nested, sides, ratios, settings):
  """Writes the PNG at `path`: one panel per side-information model."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, len(sides), figsize=(7 * len(sides), 6.5),
                           sharey=True, squeeze=False)
  colors = plt.cm.viridis(np.linspace(0.0, 0.85, len(ratios)))
  configs = list(settings.nested_configs)
  markers = {c: _CONFIG_MARKERS[i % len(_CONFIG_MARKERS)]
             for i, c in enumerate(configs)}
  base = baselines[ratios[0]]
  xmax = 1.1 * max(r["bits"] for r in base if r["family"] != "float16")
  for ax, side in zip(axes[0], sides):
    pts = sorted((r["bits"], r["nmse"]) for r in base if r["family"] == "qsgd")
    ax.plot(*zip(*pts), "-", marker="s", color="0.6", lw=1.8, ms=5)
    # DQSG's NMSE depends on the noise (g_p changes): one dashed line each.
    for color, ratio in zip(colors, ratios):
      pts = sorted((r["bits"], r["nmse"]) for r in baselines[ratio]
                   if r["family"] == "dqsg")
      ax.plot(*zip(*pts), "--", marker=".", color=color, lw=1.2, ms=6)
    for r in base:
      if r["family"] == "terngrad":
        ax.plot(r["bits"], r["nmse"], "X", color="tab:red", ms=10)
      elif r["family"] == "float16":
        ax.annotate(f"Float16: {r['bits']:.0f} bits, NMSE {r['nmse']:.1e}"
                    " (off scale) →", xy=(0.99, 0.03),
                    xycoords="axes fraction", ha="right", fontsize=8,
                    color="tab:brown")
    for i, (color, ratio) in enumerate(zip(colors, ratios)):
      rows = nested[(side, ratio)]
      fixed = [r for r in rows if r["family"] == "ndqsg"]
      # The series: the best fixed config at each bit budget, joined.
      best = {}
      for r in fixed:
        best[r["bits"]] = min(r["nmse"], best.get(r["bits"], math.inf))
      xs = sorted(best)
      # Thinner for each noise level, so that coinciding series stay visible.
      ax.plot(xs, [best[x] for x in xs], "-", color=color,
              lw=max(4.5 - 1.2 * i, 1.0))
      for r in fixed:
        ax.plot(r["bits"], r["nmse"], markers[r["params"].replace(
            "M=", "").replace(",k=", ":")], color=color, ms=7, mec="k",
                mew=0.4)
      # Adaptive: offset ±0.06 bits so that they do not hide the fixed ones.
      for marker, fam, dx in (("^", "adaptive_1", -0.06),
                              ("v", "adaptive_mmse", 0.06)):
        for r in rows:
          if r["family"] == fam:
            ax.plot(r["bits"] + dx, r["nmse"], marker, color=color, ms=10,
                    mec="k", mew=0.8)
    ax.set_yscale("log")
    ax.set_xlim(1.3, xmax)
    ax.set_xlabel("wire bits per element (codes + scales)")
    detail = (" (y = g)" if side == "clean" else
              f" (mean of {settings.num_references} DQSG M=3 decodes)")
    ax.set_title(f"side information: {side}{detail}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
  axes[0][0].set_ylabel("NMSE  ‖ĝ − g_p‖² / ‖g_p‖²")

  handles = [
      Line2D([], [], color="0.3", ls="--", marker=".", label="DQSG M=" +
             ",".join(settings.dqsg_levels) + " (colour: σ/κ)"),
      Line2D([], [], color="0.6", marker="s", label="QSGD s=" + ",".join(
          settings.qsgd_levels)),
      Line2D([], [], color="tab:red", marker="X", ls="", ms=9,
             label="TernGrad"),
  ]
  handles += [Line2D([], [], color=c, lw=3, label=f"σ/κ = {r:g}")
              for c, r in zip(colors, ratios)]
  handles += [Line2D([], [], color="w", marker=markers[c], mfc="0.7",
                     mec="k", ms=8, label=f"NDQSG M={c.replace(':', ',k=')}")
              for c in configs]
  handles += [Line2D([], [], color="w", marker="^", mfc="0.7", mec="k", ms=9,
                     label="adaptive α=1 (−0.06 bit)"),
              Line2D([], [], color="w", marker="v", mfc="0.7", mec="k", ms=9,
                     label="adaptive α=mmse (+0.06 bit)")]
  fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8,
             frameon=False)
  fig.suptitle(
      f"NMSE against wire bits: {settings.num_elements} elements, buckets of "
      f"{settings.bucket_size}. Colour: noise σ/κ; solid lines join the best "
      "fixed NDQSG per bit budget, dashed lines are DQSG on the same g_p.\n"
      "The reference senders' own bits are not counted. QSGD, TernGrad, "
      f"Float16 at σ/κ = {ratios[0]:g}.", fontsize=9)
  fig.tight_layout(rect=(0, 0.13, 1, 0.94))
  fig.savefig(path, dpi=110)
  plt.close(fig)
