"""Training-checkpoint sweeps: the same model at several training steps, each a separate model entry
(``revision: step1000`` ...), joined by step to trace geometry over training (issue 7;
``config/pythia_checkpoints.yaml``).

The trajectory reads only the cross-model summary tables (one row per model, e.g. Paper III's Table 2,
the LSM margin-vs-perplexity table, the ID profile), so adding a checkpoint later reruns that
checkpoint's jobs, the summaries and this table - never the other checkpoints' jobs.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the workflow calls checkpoint_steps while it builds the DAG
    import pandas as pd

_STEP = re.compile(r"step(\d+)")


def checkpoint_steps(models: dict) -> dict[str, int]:
    """model name -> training step, for the entries whose ``revision`` is ``step<N>`` (Pythia's
    branch names)."""
    out = {}
    for name, spec in sorted(models.items()):
        m = _STEP.fullmatch(str(spec.get("revision") or ""))
        if m:
            out[name] = int(m.group(1))
    return out


def checkpoint_series(models: dict, steps: dict) -> dict[str, str]:
    """model name -> the run it is a checkpoint of (``repo_id``, else ``path``, else the name)."""
    return {m: str(models[m].get("repo_id") or models[m].get("path") or m) for m in steps}


def trajectory_table(tables: dict[str, pd.DataFrame], steps: dict[str, int], series: dict[str, str]) -> pd.DataFrame:
    """Long table of every numeric column of the one-row-per-model summary ``tables`` for the checkpoint
    models: columns series, model, step, table, metric, value; sorted by series, metric and step.
    Tables with several rows per model contribute their per-model mean (``n_rows`` says how many)."""
    import numpy as np
    import pandas as pd

    rows = []
    for tname, df in sorted(tables.items()):
        if "model" not in df.columns:
            continue
        df = df[df["model"].isin(list(steps))]
        num = [c for c in df.columns if c != "model" and pd.api.types.is_numeric_dtype(df[c])
               and not pd.api.types.is_bool_dtype(df[c])]
        for model, g in df.groupby("model", sort=True):
            for c in num:
                vals = g[c].to_numpy(dtype=float)
                if not np.isfinite(vals).any():
                    continue
                rows.append({"series": series[model], "model": model, "step": steps[model], "table": tname,
                             "metric": c, "value": float(np.nanmean(vals)), "n_rows": int(len(g))})
    cols = ["series", "model", "step", "table", "metric", "value", "n_rows"]
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["series", "table", "metric", "step"], kind="stable").reset_index(drop=True)


def trajectory_figure(df: pd.DataFrame, paths, max_panels: int = 12) -> None:
    """Small multiples: each metric against the training step (symlog x axis: step 0 is shown), one
    line per series; the metrics that vary most over training first."""
    import numpy as np

    from .plotting import _save, plt

    if df.empty:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.text(0.5, 0.5, "no checkpoint models", ha="center", va="center")
        ax.axis("off")
        _save(fig, paths)
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
    _save(fig, paths)
