"""Figures for SULA and the interventions, from tidy tables only (Paper III sec. 4.3, 4.5-4.6, 5.2).

Each function writes the same figure as PNG and PDF, atomically (``llmgeom.plots.base.save_figure``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.plots.base import plt, save_figure

_COND_ORDER = ("main", "remap", "shuffled", "ablation")
_COND_TITLE = {"main": "main", "remap": "lexical remap", "shuffled": "shuffled labels (H_Bayes = 1)",
               "ablation": "evidence ablation (masked carriers)"}


def _conditions(df) -> list[str]:
    present = list(dict.fromkeys(df.condition))
    return [c for c in _COND_ORDER if c in present] + [c for c in present if c not in _COND_ORDER]


def sula_calibration_figure(prompts: pd.DataFrame, sula: pd.DataFrame, paths) -> None:
    """H_model vs H_Bayes (bits), one panel per model (rows) and condition (columns): every prompt as a
    dot coloured by k, the mean per k with +-1 sd bars, and the identity line (a Bayesian model lies on
    it). Panel titles give the overall MAE and Pearson r. Source: Paper III sec. 5.2 (SULA calibration)."""
    models = sorted(prompts.model.unique())
    conds = _conditions(prompts)
    ks = sorted(prompts.k.unique())
    cmap = plt.get_cmap("viridis", max(len(ks), 2))
    fig, axes = plt.subplots(len(models), len(conds), figsize=(3.4 * len(conds), 3.2 * len(models)),
                             squeeze=False, sharex=True, sharey=True)
    for r, m in enumerate(models):
        for c, cond in enumerate(conds):
            ax = axes[r, c]
            g = prompts[(prompts.model == m) & (prompts.condition == cond)]
            ax.plot([0, 1], [0, 1], color="0.5", lw=1, ls="--", label="identity")
            for j, k in enumerate(ks):
                gk = g[g.k == k]
                if gk.empty:
                    continue
                ax.scatter(gk.h_bayes_bits, gk.h_model_bits, s=7, alpha=0.35, color=cmap(j))
                ax.errorbar(gk.h_bayes_bits.mean(), gk.h_model_bits.mean(), yerr=gk.h_model_bits.std(ddof=0),
                            fmt="o", ms=6, color=cmap(j), mec="k", capsize=2, label=f"k={k}")
            row = sula[(sula.model == m) & (sula.condition == cond) & (sula.k.astype(str) == "all")]
            stats = ""
            if not row.empty:
                rr = row.iloc[0]
                rtxt = "n/a" if pd.isna(rr.pearson_r) else f"{rr.pearson_r:.2f}"
                stats = f"\nMAE {rr.mae_bits:.3f} bits, r {rtxt}"
            ax.set_title(f"{m}: {_COND_TITLE.get(cond, cond)}{stats}", fontsize=8)
            ax.set_xlim(-0.03, 1.03)
            ax.set_ylim(-0.03, 1.03)
            if r == len(models) - 1:
                ax.set_xlabel("H_Bayes (bits)")
            if c == 0:
                ax.set_ylabel("H_model (bits)")
    axes[0, -1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, paths)


def sula_pc1_figure(prompts: pd.DataFrame, geometry: pd.DataFrame, paths) -> None:
    """Left: mean PC1 score (standardized last-token values at the last analysed layer; sign: corr with
    H_model >= 0) per k, +-1 SEM, per model and condition. Right: Spearman rho(k, PC1) and rho(PC1,
    H_Bayes) of the main condition across relative depth. Source: Paper III sec. 4.3 (geometry on SULA)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    styles = {"main": "-", "remap": "--", "shuffled": ":", "ablation": "-."}
    colors = {m: f"C{i}" for i, m in enumerate(sorted(prompts.model.unique()))}
    for (m, cond), g in prompts.groupby(["model", "condition"], sort=True):
        g = g.dropna(subset=["pc1_last"])
        if g.empty:
            continue
        st = g.groupby("k").pc1_last.agg(["mean", "sem"]).reset_index()
        ax.errorbar(st.k, st["mean"], yerr=st["sem"], marker="o", ms=4, capsize=2, color=colors[m],
                    ls=styles.get(cond, "-"), label=f"{m} / {cond}")
    ax.set_xlabel("k (in-context examples)")
    ax.set_ylabel("PC1 score at the last layer (standardized values)")
    ax.axhline(0, color="0.7", lw=0.8)
    ax.legend(fontsize=7)
    main = geometry[geometry.condition == "main"] if "main" in set(geometry.condition) else geometry
    for m, g in main.groupby("model", sort=True):
        g = g.sort_values("relative_depth")
        ax2.plot(g.relative_depth, g.rho_k_pc1, marker=".", color=colors.get(m, "k"), label=f"{m}: rho(k, PC1)")
        ax2.plot(g.relative_depth, g.rho_pc1_h_bayes, marker=".", ls="--", color=colors.get(m, "k"),
                 label=f"{m}: rho(PC1, H_Bayes)")
    ax2.axhline(0, color="0.7", lw=0.8)
    ax2.set_ylim(-1.05, 1.05)
    ax2.set_xlabel("relative depth ((layer + 1) / n_layers)")
    ax2.set_ylabel("Spearman rho (main condition)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, paths)


def interventions_figure(summary: pd.DataFrame, paths) -> None:
    """Grouped bars, one row per model: change (edited - unedited) of the axis-entropy correlation at the
    edited layer (left) and of the SULA MAE in bits (right), per run and edit, entropy axis vs matched
    random axis; black lines = paired basic-bootstrap intervals over prompts (centred on the bias-corrected change).
    A model whose row says ``not_applicable`` (no attention layers: no values to edit) gets empty panels that say
    why. Source: Paper III sec. 4.5-4.6 (intervention effects)."""
    na = (summary.not_applicable.fillna("").astype(str) if "not_applicable" in summary
          else pd.Series("", index=summary.index))
    d = summary[(summary.run != "baseline") & (na == "")].copy()
    why = dict(zip(summary.model[na != ""], na[na != ""]))
    models = sorted(set(d.model) | set(why))
    metrics = (("delta_axis_corr_edited", "change in axis-entropy corr (edited layer)"),
               ("delta_mae_bits", "change in SULA MAE (bits)"))
    fig, axes = plt.subplots(len(models), 2, figsize=(14, 3.6 * len(models)), squeeze=False)
    colors = {"entropy": "tab:red", "random": "tab:gray"}
    for r, m in enumerate(models):
        g = d[d.model == m]
        groups = list(dict.fromkeys(zip(g.run, g.edit)))
        x = np.arange(len(groups))
        for c, (col, label) in enumerate(metrics):
            ax = axes[r, c]
            for off, axis in ((-0.2, "entropy"), (0.2, "random")):
                vals, lo, hi = [], [], []
                for run, edit in groups:
                    row = g[(g.run == run) & (g.edit == edit) & (g.axis == axis)]
                    vals.append(row[col].iloc[0] if not row.empty else np.nan)
                    lo.append(row[col + "_lo"].iloc[0] if not row.empty else np.nan)
                    hi.append(row[col + "_hi"].iloc[0] if not row.empty else np.nan)
                ax.bar(x + off, vals, width=0.38, color=colors[axis], label=f"{axis} axis" if c == 0 else None)
                ax.vlines(x + off, lo, hi, color="k", lw=1.2)
            if m not in why:
                ax.axhline(0, color="0.3", lw=0.8)
            ax.set_xticks(x, [f"{run}\n{edit}" for run, edit in groups], rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(label, fontsize=8)
            ax.set_title(m, fontsize=9)
            if m in why:
                ax.text(0.5, 0.5, f"not applicable:\n{why[m]}", ha="center", va="center", fontsize=8, wrap=True,
                        transform=ax.transAxes)
        if m not in why:
            axes[r, 0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, paths)
