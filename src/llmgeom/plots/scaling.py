"""Scaling figures: one figure per statistic of ``results/summary/scaling.csv`` against the parameter
count (log axis), with three series: this run's models (with their intervals), their random-init twins and the
papers' models; and an overview of every statistic in one grid (the README's figure).

Drawn from scaling.csv alone (:func:`llmgeom.analyses.scaling.scaling_table`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.ticker import LogLocator, NullFormatter

from llmgeom.plots.base import panel_grid, plt, save_figure, shared_legend

#: (source in scaling.csv, legend label, marker style), drawn in this order (this run on top)
SERIES = (("published", "papers' models", dict(marker="s", color="#3182bd", ls="none", ms=4.5)),
          ("null_model", "random-init twin", dict(marker="o", mfc="white", mec="#d73027", color="#d73027", ls="none",
                                                  ms=5)),
          ("measured", "this run", dict(marker="o", color="black", ls="none", ms=5)))
#: the twins are drawn at 1.15 x their model's size, so that a twin of the same value does not hide its model
TWIN_DODGE = 1.15


def _panel(ax, g: pd.DataFrame, *, fontsize: float = 8, labels: bool = True) -> None:
    """One statistic's panel: the three series against n_params (log x), intervals as error bars, this run's
    reference (noise / baseline) as grey crosses, each of this run's points labelled with its model; the twins
    dodged to the right (:data:`TWIN_DODGE`)."""
    for src, lab, st in SERIES:
        s = g[(g.source == src) & np.isfinite(g.n_params) & np.isfinite(g.value)]
        if not len(s):
            continue
        x, v = s.n_params.to_numpy(float) * (TWIN_DODGE if src == "null_model" else 1.0), s.value.to_numpy(float)
        lo, hi = s.lo.to_numpy(float), s.hi.to_numpy(float)
        ok = np.isfinite(lo) & np.isfinite(hi)
        if ok.any():
            ax.errorbar(x[ok], v[ok], yerr=[np.clip(v[ok] - lo[ok], 0, None), np.clip(hi[ok] - v[ok], 0, None)],
                        fmt="none", ecolor=st["color"], lw=0.8, alpha=0.8)
        ax.plot(x, v, label=lab, **st)
        if src == "measured" and labels:
            for xi, vi, m in zip(x, v, s.model):
                ax.annotate(str(m), (xi, vi), xytext=(3, 3), textcoords="offset points", fontsize=fontsize - 2)
    ref = g[(g.source == "measured") & np.isfinite(pd.to_numeric(g.reference, errors="coerce"))]
    if len(ref):
        ax.plot(ref.n_params, pd.to_numeric(ref.reference), "x", color="#737373", ms=5,
                label="reference: " + (str(ref.reference_kind.iloc[0]) or "baseline"))
    x = g.n_params[np.isfinite(g.n_params) & (g.n_params > 0) & np.isfinite(g.value)]
    if not len(x):
        ax.text(0.5, 0.5, "no value in this run", ha="center", va="center", fontsize=fontsize, transform=ax.transAxes)
    else:  # whole decades, so that every panel reads the same way
        ax.set_xscale("log")
        lo, hi = math.floor(math.log10(x.min())), math.ceil(math.log10(x.max() * TWIN_DODGE))
        ax.set_xlim(10.0 ** lo / 1.5, 10.0 ** max(hi, lo + 1) * 1.5)
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=12))
        ax.xaxis.set_minor_formatter(NullFormatter())
    y = pd.to_numeric(g.value, errors="coerce").dropna()
    if len(y) and (y > 0).all() and y.max() / y.min() > 100:  # e.g. perplexity: twins near 1e5, models near 10
        ax.set_yscale("log")
    ax.set_title(str(g.label.iloc[0]), fontsize=fontsize)
    ax.set_xlabel("parameters", fontsize=fontsize - 1)
    ax.set_ylabel(str(g.unit.iloc[0]), fontsize=fontsize - 1)
    ax.tick_params(labelsize=fontsize - 1)


def scaling_figures(df: pd.DataFrame, paths: dict) -> None:
    """One figure per statistic (:func:`_panel`), each with its legend.

    Args:
        df: scaling.csv. paths: statistic -> list of output files (PNG, PDF); a statistic without a path is
            not drawn, a path whose statistic has no row gets an empty panel that says so.
    """
    for stat, out in paths.items():
        g = df[df.statistic == stat]
        fig, ax = plt.subplots(figsize=(3.0, 2.3))
        if len(g):
            _panel(ax, g)
            ax.legend(fontsize=6, frameon=False, loc="best")
        else:
            ax.text(0.5, 0.5, f"{stat}: no rows in scaling.csv", ha="center", va="center", fontsize=8)
            ax.axis("off")
        save_figure(fig, out)


def scaling_overview(df: pd.DataFrame, paths) -> None:
    """Every statistic of scaling.csv as one panel of a grid (4 columns), one legend for all: the README's scaling
    figure.

    Args:
        df: scaling.csv. paths: output files (PNG, PDF).
    """
    stats = list(dict.fromkeys(df.statistic))
    fig, axes, nrow = panel_grid(len(stats), 4, 2.5)
    for ax, s in zip(axes.flat, stats):
        _panel(ax, df[df.statistic == s], fontsize=8, labels=False)
    shared_legend(fig, axes, fontsize=8, nrow=nrow, top=0.3)
    save_figure(fig, paths)
