"""Training-checkpoint trajectory figure (Paper II: geometry over training), from checkpoint_trajectory.csv.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the workflow calls checkpoint_steps while it builds the DAG
    import pandas as pd


def trajectory_figure(df: pd.DataFrame, paths, max_panels: int = 12) -> None:
    """Small multiples: each metric against the training step (symlog x axis: step 0 is shown), one
    line per series; the metrics that vary most over training first."""
    import numpy as np

    from llmgeom.plots.base import plt, save_figure

    if df.empty:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.text(0.5, 0.5, "no checkpoint models", ha="center", va="center")
        ax.axis("off")
        save_figure(fig, paths)
        return
    key = df["table"] + ": " + df["metric"]
    spread = df.assign(key=key).groupby("key")["value"].agg(lambda v: float(np.nanstd(v) / (abs(np.nanmean(v)) + 1e-12)))
    keys = list(spread.sort_values(ascending=False).index[:max_panels])
    n = len(keys)
    ncol = min(4, n)
    nrow = int(np.ceil(n / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.6 * nrow), squeeze=False)
    for ax, k in zip(axes.flat, keys):
        sub = df[key == k]
        for s, g in sub.groupby("series"):
            ax.plot(g["step"], g["value"], marker="o", ms=3, label=s)
        ax.set_xscale("symlog", linthresh=1000)
        ax.set_title(k, fontsize=8)
        ax.set_xlabel("training step", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, paths)
