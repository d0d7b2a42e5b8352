"""Wind-tunnel figure from tidy tables only (Papers I-III): entropy calibration against the exact
posterior and the PC1 geometry per representation over depth.

The figure is written as PNG and PDF, atomically (``plots.base.save_figure``).
"""

from __future__ import annotations

import pandas as pd

from llmgeom.plots.base import plt, save_figure

#: representation -> (label, colour); attn_output appears only when the tables have it.
_REPR = {"values": ("values", "C0"), "attn_output": ("attention output", "C3"),
         "residual_stream": ("residual stream", "C2")}


def wind_tunnel_figure(prompts: pd.DataFrame, summary: pd.DataFrame, geometry: pd.DataFrame, paths, *,
                       models=None) -> None:
    """One row per wind-tunnel model, three panels.

    (a) H_model vs H_exact (bits): every prompt as a dot, the mean per answer position t with +-1 sd bars,
    the identity line (a calibrated model lies on it); the title gives the overall MAE and Pearson r
    (``summary`` row t = "all"). (b) |Spearman rho(PC1, H_exact)| and (c) PC1 share vs relative depth, one
    line per representation (values, attention output when present, residual stream).

    Args:
        prompts / summary / geometry: the concatenated ``wind_tunnel_prompts``, ``wind_tunnel`` and
            ``wind_tunnel_geometry`` tables (:mod:`llmgeom.analyses.wind_tunnel`).
        paths: output files (PNG, PDF). models: rows to draw (default: every model of ``summary``).

    Raises:
        ValueError: no model to draw.

    Source: Paper I (entropy calibration; value manifolds ordered by entropy); Paper III sec. 4.
    """
    models = list(models) if models is not None else list(dict.fromkeys(summary.model))
    models = [m for m in models if m in set(prompts.model)]
    if not models:
        raise ValueError("no wind-tunnel model with prompts to draw")
    fig, axes = plt.subplots(len(models), 3, figsize=(11, 3.3 * len(models)), squeeze=False)
    for r, m in enumerate(models):
        g = prompts[prompts.model == m]
        ax = axes[r, 0]
        hi = max(float(g.h_exact_bits.max()), float(g.h_model_bits.max())) * 1.05 + 0.05
        ax.plot([0, hi], [0, hi], color="0.5", lw=1, ls="--", label="identity")
        ax.scatter(g.h_exact_bits, g.h_model_bits, s=5, alpha=0.25, color="0.3")
        by_t = g.groupby("t")
        ax.errorbar(by_t.h_exact_bits.mean(), by_t.h_model_bits.mean(), yerr=by_t.h_model_bits.std(ddof=0),
                    fmt="o", ms=5, color="C1", mec="k", capsize=2, label="mean per t")
        row = summary[(summary.model == m) & (summary.t.astype(str) == "all")]
        stats = ""
        if len(row):
            rr = row.iloc[0]
            rtxt = "n/a" if pd.isna(rr.pearson_r) else f"{rr.pearson_r:.3f}"
            stats = f"\nMAE {rr.mae_bits:.4f} bits, r {rtxt}"
        ax.set_title(f"{m}{stats}", fontsize=8)
        ax.set_xlabel("H_exact (bits)")
        ax.set_ylabel("H_model (bits, over answer symbols)")
        ax.legend(fontsize=7, loc="upper left")
        geo = geometry[geometry.model == m]
        for c, (col, ylabel) in enumerate((("abs_rho_pc1_h_exact", "|rho(PC1, H_exact)|"), ("pc1", "PC1 share")), 1):
            ax = axes[r, c]
            for rep, (label, colour) in _REPR.items():
                d = geo[geo.representation == rep].sort_values("relative_depth")
                if len(d):
                    ax.plot(d.relative_depth, d[col], "o-", color=colour, label=label, ms=4)
            ax.set_ylim(0, 1.02)
            ax.set_xlabel("relative depth")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{m}: {ylabel} per representation", fontsize=8)
            if c == 1:
                ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, paths)
