"""Value-manifold figure: PC1 / PC1+PC2 shares per layer (Paper III sec. 4), from value_manifold.csv.
"""

from __future__ import annotations

import pandas as pd

from llmgeom.plots.base import plt, save_figure


def value_manifold_figure(df: pd.DataFrame, paths, *, representation: str = "values",
                          standardized: bool = True) -> None:
    """Left: PC1 and PC1+PC2 explained variance (95% bootstrap CI) at the final layer,
    per model and prompt set. Right: PC1+PC2 vs relative depth. Source: Paper III sec. 4, Table 1."""
    d = df[(df.representation == representation) & (df.standardized == standardized)]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    final = d[d.layer == d.groupby("model").layer.transform("max")]
    labels, x = [], 0
    for (m, ps), g in final.groupby(["model", "prompt_set"], sort=True):
        r = g.iloc[0]
        for off, key, color in ((-0.18, "pc1", "tab:blue"), (0.18, "pc12", "tab:orange")):
            ax.bar(x + off, 100 * r[key], width=0.34, color=color,
                   label={"pc1": "PC1", "pc12": "PC1+PC2"}[key] if x == 0 else None)
            # basic-bootstrap CI, centred on the bias-corrected estimate (tick): it need not contain the bar
            ax.vlines(x + off, 100 * r[key + "_lo"], 100 * r[key + "_hi"], color="k", lw=1.2)
            if key + "_bc" in r:
                ax.scatter([x + off], [100 * r[key + "_bc"]], marker="_", s=60, color="k", zorder=3)
        labels.append(f"{m}\n{ps}")
        x += 1
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("explained variance at final layer (%)")
    ax.set_title(f"{representation}{' (standardized)' if standardized else ' (raw)'}")
    ax.legend()
    for (m, ps), g in d.groupby(["model", "prompt_set"], sort=True):
        g = g.sort_values("relative_depth")
        ax2.plot(g.relative_depth, 100 * g.pc12, marker=".", label=f"{m} / {ps}")
        ax2.fill_between(g.relative_depth, 100 * g.pc12_lo, 100 * g.pc12_hi, alpha=0.15)
    ax2.set_xlabel("relative depth ((layer + 1) / n_layers)")
    ax2.set_ylabel("PC1+PC2 explained variance (%)")
    ax2.legend(fontsize=7)
    save_figure(fig, paths)
