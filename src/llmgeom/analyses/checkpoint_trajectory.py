"""checkpoint_trajectory.csv: value-manifold and ID statistics across training checkpoints of one
model series (Paper II: geometry over training). Tables in, table out; never torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the workflow calls checkpoint_steps while it builds the DAG
    import pandas as pd


def trajectory_table(tables: dict[str, pd.DataFrame], steps: dict[str, int], series: dict[str, str]) -> pd.DataFrame:
    """Long table of every numeric column of the one-row-per-model summary ``tables`` for the checkpoint
    models: columns series, model, step, table, metric, value; sorted by series, metric and step.
    A table whose key (:data:`llmgeom.core.tables.TABLE_KEYS`) has columns beside ``model`` that take several
    values (id_profile: ``quantity`` and ``estimator``) gives one metric per value: ``peak_id [quantity=token_id,
    estimator=twonn]``, never a mean of different statistics; other tables with several rows per model contribute
    their per-model mean (``n_rows`` says how many)."""
    import numpy as np
    import pandas as pd

    from llmgeom.core.tables import TABLE_KEYS, key_columns

    rows = []
    for tname, df in sorted(tables.items()):
        if "model" not in df.columns:
            continue
        df = df[df["model"].isin(list(steps))]
        extra = [c for c in (key_columns(tname, df.columns) if tname in TABLE_KEYS else [])
                 if c not in ("model", "source") and c in df.columns and df[c].nunique(dropna=False) > 1]
        num = [c for c in df.columns if c != "model" and c not in extra and pd.api.types.is_numeric_dtype(df[c])
               and not pd.api.types.is_bool_dtype(df[c])
               and not c.endswith("_replicates")]  # a single replicate reads back from CSV as a number
        for keys, g in df.groupby(["model"] + extra, sort=True, dropna=False):
            model = keys[0]
            tag = " [" + ", ".join(f"{k}={v}" for k, v in zip(extra, keys[1:])) + "]" if extra else ""
            for c in num:
                vals = g[c].to_numpy(dtype=float)
                if not np.isfinite(vals).any():
                    continue
                rows.append({"series": series[model], "model": model, "step": steps[model], "table": tname,
                             "metric": c + tag, "value": float(np.nanmean(vals)), "n_rows": int(len(g))})
    cols = ["series", "model", "step", "table", "metric", "value", "n_rows"]
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["series", "table", "metric", "step"], kind="stable").reset_index(drop=True)
