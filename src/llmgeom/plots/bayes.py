"""Figures of the Bayesian-geometry analyses (Paper III), drawn from tidy tables only.

Each function writes the same figure to every path given (PNG and PDF), atomically, via
``llmgeom.plots.base.save_figure``. Source: Paper III ("Geometric Scaling of Bayesian Inference in LLMs")
sec. 4 (value manifolds, domain restriction), sec. 4.2 (key orthogonality, attention focusing).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.plots.base import plt, save_figure


def _std_mask(df, standardized=True):
    return df.standardized.astype(str) == str(bool(standardized))


def _set_order(df) -> list[str]:
    """Prompt sets with the mixed one first (``role`` column when present)."""
    sets = list(dict.fromkeys(df.prompt_set))
    if "role" in df:
        mixed = list(dict.fromkeys(df[df.role == "mixed"].prompt_set))
        return mixed + [s for s in sets if s not in mixed]
    return sorted(sets, key=lambda s: (s != "mixed", s))


def pc_scatter_figure(scores: pd.DataFrame, paths, *, representation: str = "values") -> None:
    """PC1 vs PC2 scores of the selected prompts at the final layer, coloured by next-token entropy
    (nats); one row per model, one column per prompt set (mixed first, then the restricted sets).
    Input: concatenated ``pc_scores`` tables."""
    d = scores[(scores.representation == representation) & _std_mask(scores)]
    d = d[d.layer == d.groupby("model").layer.transform("max")]
    models = sorted(d.model.unique())
    sets = list(dict.fromkeys(sorted(d.prompt_set.unique(), key=lambda s: (s != "mixed", s))))
    fig, axes = plt.subplots(len(models), len(sets), figsize=(3.3 * len(sets) + 0.8, 3.0 * len(models)),
                             squeeze=False, layout="constrained")
    vmax = float(d.next_token_entropy.max()) if len(d) else 1.0
    sc = None
    for i, m in enumerate(models):
        for j, s in enumerate(sets):
            ax = axes[i, j]
            g = d[(d.model == m) & (d.prompt_set == s)]
            if len(g):
                sc = ax.scatter(g.pc1, g.pc2, c=g.next_token_entropy, cmap="viridis", vmin=0, vmax=vmax, s=14)
                ax.set_title(f"{m}\n{g.domain.iloc[0]} (n={len(g)}, layer {int(g.layer.iloc[0])})", fontsize=8)
            else:
                ax.set_axis_off()
            ax.set_xlabel("PC1 score" if i == len(models) - 1 else "")
            ax.set_ylabel("PC2 score" if j == 0 else "")
            ax.tick_params(labelsize=7)
    if sc is not None:
        cb = fig.colorbar(sc, ax=axes, shrink=0.8)
        cb.set_label("next-token entropy (nats)")
    fig.suptitle(f"final-layer {representation} (standardized); PC signs: rho with entropy >= 0", fontsize=9)
    save_figure(fig, paths)


def explained_variance_layers_figure(dr: pd.DataFrame, paths, *, standardized: bool = True) -> None:
    """PC1 (dashed) and PC1+PC2 (solid, 95% bootstrap band) explained variance vs relative depth for
    each prompt-set selection; columns = models, rows = representation (values, attention output, residual stream).
    Input: concatenated ``domain_restriction`` tables."""
    d = dr[_std_mask(dr, standardized)]
    models = sorted(d.model.unique())
    reps = [r for r in ("values", "attn_output", "residual_stream") if r in set(d.representation)]
    fig, axes = plt.subplots(len(reps), len(models), figsize=(4.6 * len(models), 3.4 * len(reps)), squeeze=False,
                             sharey=True, layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, m in enumerate(models):
        dm = d[d.model == m]
        for i, rep in enumerate(reps):
            ax = axes[i, j]
            for c, s in enumerate(_set_order(dm)):
                g = dm[(dm.prompt_set == s) & (dm.representation == rep)].sort_values("relative_depth")
                if not len(g):
                    continue
                col = colors[c % len(colors)]
                ax.plot(g.relative_depth, 100 * g.pc12, color=col, marker=".", label=f"{g.domain.iloc[0]} PC1+PC2")
                ax.fill_between(g.relative_depth, 100 * g.pc12_lo, 100 * g.pc12_hi, color=col, alpha=0.15)
                ax.plot(g.relative_depth, 100 * g.pc1, color=col, ls="--", lw=1)
                if "pc12_iso" in g and np.isfinite(g.pc12_iso).any():  # the null: noise of the same n and d
                    ax.scatter(g.relative_depth, 100 * g.pc12_iso, color=col, marker="x", s=25, zorder=4,
                               label=f"{g.domain.iloc[0]} isotropic reference")
            ax.set_title(f"{m}: {rep}", fontsize=9)
            if i == len(reps) - 1:
                ax.set_xlabel("relative depth (layer+1)/L")
            if j == 0:
                ax.set_ylabel("explained variance (%)")
            ax.legend(fontsize=6)
    fig.suptitle("explained variance vs depth (solid: PC1+PC2 with 95% CI; dashed: PC1; x: PC1+PC2 of isotropic "
                 "noise of the same n and d at the final layer); "
                 f"{'standardized' if standardized else 'raw'}", fontsize=9)
    save_figure(fig, paths)


def key_orthogonality_figure(ko: pd.DataFrame, paths) -> None:
    """Key orthogonality (mean |cos| between W_K columns) vs relative depth: per-layer mean over key
    heads (solid, individual heads as dots), random-init architecture (dashed) and Gaussian matrix
    (dotted) of the same shapes. Input: concatenated ``key_orthogonality`` tables. Models whose rows say key
    orthogonality does not apply (``not_applicable``: no W_K, multi-head latent attention) are named in the legend
    as such, with no curve."""
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for c, (m, g) in enumerate(ko.groupby("model", sort=True)):
        col = colors[c % len(colors)]
        if "not_applicable" in g and g.orthogonality.isna().all() and g.not_applicable.map(
                lambda x: isinstance(x, str) and bool(x.strip())).any():
            ax.plot([], [], color=col, lw=0, label=f"{m}: not applicable (no W_K)")
            continue
        ax.scatter(g.relative_depth, g.orthogonality, color=col, s=6, alpha=0.35)
        lm = g.groupby("relative_depth")[["orthogonality", "baseline_gaussian", "baseline_random_init"]].mean()
        ax.plot(lm.index, lm.orthogonality, color=col, marker=".", label=f"{m} trained")
        ax.plot(lm.index, lm.baseline_random_init, color=col, ls="--", lw=1, label=f"{m} random init")
        ax.plot(lm.index, lm.baseline_gaussian, color=col, ls=":", lw=1, label=f"{m} Gaussian")
    ax.set_xlabel("relative depth (layer+1)/L")
    ax.set_ylabel("mean |cos| between W_K columns")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, paths)


def attention_focusing_figure(af: pd.DataFrame, paths) -> None:
    """Mean final-query attention entropy per layer (mean over heads, nats) vs relative depth for all
    models on one axis (left) and the same normalized by log(number of keys) (right); filled markers =
    global layers, open markers = sliding-window layers. Input: concatenated ``attention_focusing``."""
    d = af[af.level == "layer"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for c, (m, g) in enumerate(d.groupby("model", sort=True)):
        g = g.sort_values("relative_depth")
        col = colors[c % len(colors)]
        sl = g.sliding.astype(str) == "True"
        for a, key in ((ax, "entropy_mean"), (ax2, "normalized_entropy_mean")):
            a.plot(g.relative_depth, g[key], color=col, lw=1.2, label=m)
            a.scatter(g.relative_depth[~sl], g[key][~sl], color=col, s=22, zorder=3)
            if sl.any():
                a.scatter(g.relative_depth[sl], g[key][sl], facecolors="none", edgecolors=col, s=22, zorder=3)
    ax.set_ylabel("attention entropy at the final query (nats)")
    ax2.set_ylabel("entropy / log(n keys)  (1 = uniform)")
    for a in (ax, ax2):
        a.set_xlabel("relative depth (layer+1)/L")
        a.set_ylim(bottom=0)
    ax.legend(fontsize=8, title="open marker: sliding-window layer", title_fontsize=7)
    save_figure(fig, paths)


def bayes_summary_figure(t2: pd.DataFrame, paths) -> None:
    """Cross-model summary (Table-2 analogue): PC1+PC2 mixed vs restricted with 95% CIs, key
    orthogonality range over layers vs random-init and Gaussian ranges, focusing percent."""
    t2 = t2[t2.get("source", pd.Series("", index=t2.index)) != "published"]  # the papers' rows: in the table only
    t2 = t2.sort_values("model").reset_index(drop=True)
    x = np.arange(len(t2))
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4.4), layout="constrained")
    for off, tag in ((-0.18, "mixed"), (0.18, "restricted")):
        v = 100 * t2[f"pc12_{tag}"].to_numpy(float)
        a1.bar(x + off, v, width=0.34, label="mixed" if tag == "mixed" else f"restricted ({t2.restricted_domain.iloc[0]})")
        # basic-bootstrap CI, centred on the bias-corrected estimate (tick): it need not contain the bar
        a1.vlines(x + off, 100 * t2[f"pc12_{tag}_lo"], 100 * t2[f"pc12_{tag}_hi"], color="k", lw=1.5)
        if f"pc12_{tag}_bc" in t2:
            a1.scatter(x + off, 100 * t2[f"pc12_{tag}_bc"].to_numpy(float), marker="_", s=80, color="k", zorder=3)
        if f"pc12_{tag}_iso" in t2:  # the null: what isotropic noise of the same n and d gives (parallel analysis)
            a1.scatter(x + off, 100 * t2[f"pc12_{tag}_iso"].to_numpy(float), marker="x", s=30, color="C3", zorder=4,
                       label="isotropic reference (same n, d)" if tag == "mixed" else None)
    a1.set_ylabel("PC1+PC2 explained variance (%), 95% CI")
    a1.legend(fontsize=7)
    for off, lo, hi, lab in ((-0.22, "orth_min", "orth_max", "trained"),
                             (0.0, "random_init_min", "random_init_max", "random init"),
                             (0.22, "gaussian_min", "gaussian_max", "Gaussian")):
        if lo in t2:
            col = f"C{['trained', 'random init', 'Gaussian'].index(lab)}"
            a2.vlines(x + off, t2[lo], t2[hi], lw=6, alpha=0.6, color=col)
            a2.scatter(x + off, (t2[lo] + t2[hi]) / 2, color=col, marker="s", s=18, label=f"{lab} (bar: min-max over layers)")
    if "orth_mean" in t2:
        a2.scatter(x - 0.22, t2.orth_mean, color="k", s=14, zorder=3, label="trained, mean over layers")
    a2.set_ylabel("key orthogonality (mean |cos|)")
    a2.set_ylim(bottom=0)
    a2.legend(fontsize=7)
    if "focusing_pct" in t2:
        a3.bar(x, t2.focusing_pct, width=0.5)
    a3.axhline(0, color="k", lw=0.5)
    a3.set_ylabel("attention entropy reduction, first -> last layer (%)")
    labels = [f"{m}\n{str(t).replace(' + ', chr(10) + '+ ')}"
              for m, t in zip(t2.model, t2.get("attention_type", [""] * len(t2)))]
    for a in (a1, a2, a3):
        a.set_xticks(x, labels, fontsize=7)
    save_figure(fig, paths)
