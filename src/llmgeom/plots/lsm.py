"""Figures of the latent-semantic-manifold analyses (LSM), drawn from tidy tables only.

Each function writes the same figure to every path given (PNG and PDF), atomically, via
``llmgeom.plots.base.save_figure``. Source: LSM ("Latent Semantic Manifolds in Large Language Models"):
intrinsic-dimension profile, curvature proxy, Voronoi margins, expressibility gap, margin vs
perplexity. Columns are those of the tables built by :mod:`llmgeom.analyses`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.plots.base import plt, save_figure


def _colors(models):
    cmap = plt.get_cmap("tab10" if len(models) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(sorted(models))}


#: panel titles of the ID profile figure: (quantity, estimator) -> title (llmgeom.core.tables.QUANTITIES)
ID_PANEL_TITLES = {("token_id", "twonn"): "TwoNN, token positions",
                   ("token_id_cross_passage", "twonn"): "TwoNN, token positions, neighbours from other passages",
                   ("token_id", "mle_mg"): "MLE, MacKay-Ghahramani (harmonic mean), token positions",
                   ("token_id", "mle_lb"): "MLE, Levina-Bickel (mean), token positions",
                   ("token_id", "gride"): "GRIDE plateau, token positions"}


def id_profile_figure(df: pd.DataFrame, paths, profile: pd.DataFrame | None = None) -> None:
    """ID vs relative depth, one panel per quantity and estimator (TwoNN at token positions, the cross-passage TwoNN,
    MLE, GRIDE; ``quantity`` names the ID, a table without it is token_id), one line per model; band = the
    passage-resampling interval (``id_mean_lo`` / ``id_mean_hi``) where the table has one, else mean +/- std over
    subsamples (min..max when that is wider); a star marks each profile's peak; the right axis of each panel is not
    shared: ID / d_model is in the table. Layers flagged ``estimators_disagree`` are ringed."""
    if "quantity" not in df:
        df = df.assign(quantity="token_id")
    panels = sorted(df[["quantity", "estimator"]].drop_duplicates().itertuples(index=False, name=None),
                    key=lambda p: (p[1] != "twonn", p[1], p[0]))
    col = _colors(df.model.unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.2), squeeze=False, sharey=True)
    for ax, (qty, est) in zip(axes[0], panels):
        for m, g in df[(df.quantity == qty) & (df.estimator == est)].groupby("model", sort=True):
            g = g.sort_values("relative_depth")
            ax.plot(g.relative_depth, g.id_mean, marker=".", color=col[m], label=m)
            if "id_mean_lo" in g and g.id_mean_lo.notna().all():
                lo, hi = g.id_mean_lo, g.id_mean_hi
            else:
                lo = np.minimum(g.id_mean - g.id_std, g.id_min)
                hi = np.maximum(g.id_mean + g.id_std, g.id_max)
            ax.fill_between(g.relative_depth, lo, hi, color=col[m], alpha=0.2, lw=0)
            if "estimators_disagree" in g:
                bad = g[g.estimators_disagree.astype(str) == "True"]
                ax.scatter(bad.relative_depth, bad.id_mean, s=60, facecolors="none", edgecolors=col[m], lw=1)
            ip = g.id_mean.idxmax()
            ax.scatter([g.relative_depth[ip]], [g.id_mean[ip]], marker="*", s=140, color=col[m], zorder=3)
        ax.set_title(ID_PANEL_TITLES.get((qty, est), f"{est}, {qty}"), fontsize=9)
        ax.set_xlabel("relative depth (0 = embeddings, 1 = last block)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("intrinsic dimension")
    axes[0][-1].legend(fontsize=8)
    save_figure(fig, paths)


def curvature_figure(df: pd.DataFrame, paths) -> None:
    """Curvature proxy (fraction of local variance outside the top-m local PCA directions) vs
    relative depth, median over anchors with the inter-quartile band; one line per model."""
    col = _colors(df.model.unique())
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m, g in df.groupby("model", sort=True):
        g = g.sort_values("relative_depth")
        k = sorted(set(g.k))
        ax.plot(g.relative_depth, g.curvature_median, marker=".", color=col[m],
                label=f"{m} (k={k[0] if len(k) == 1 else f'{min(k)}-{max(k)}'}, m=round ID)")
        ax.fill_between(g.relative_depth, g.curvature_q25, g.curvature_q75, color=col[m], alpha=0.2, lw=0)
    ax.set_xlabel("relative depth (0 = embeddings, 1 = last block)")
    ax.set_ylabel("local variance outside top-m PCA directions")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, paths)


def margin_histogram_figure(df: pd.DataFrame, paths, margins: pd.DataFrame | None = None) -> None:
    """Density of Voronoi margins (top-1 minus top-2 logit) per model as step histograms; the
    hard core (margin at or below its quantile level) is shaded and its level marked by a dashed
    line. ``margins`` (rows of margins.csv) adds the median and Pr(m < 0.5) to the legend."""
    col = _colors(df.model.unique())
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for m, g in df.groupby("model", sort=True):
        g = g.sort_values("bin_lo")
        edges = np.append(g.bin_lo.to_numpy(), g.bin_hi.iloc[-1])
        label = m
        if margins is not None and (margins.model == m).any():
            r = margins[margins.model == m].iloc[0]
            label = (f"{m}: median {r.margin_q50:.2f}, Pr(m<{r.threshold:g}) = {r.p_margin_below:.2f}, "
                     f"hard core m <= {r.hard_core_margin:.3g}")
        ax.stairs(g.density.to_numpy(), edges, color=col[m], label=label, lw=1.4)
        level = float(g.hard_core_margin.iloc[0])
        core = g.bin_lo < level
        if core.any():
            e = np.append(g.bin_lo[core].to_numpy(), min(level, g.bin_hi[core].iloc[-1]))
            ax.stairs(g.density[core].to_numpy(), e, color=col[m], fill=True, alpha=0.3)
        ax.axvline(level, color=col[m], ls="--", lw=1)
    ax.set_xlabel("Voronoi margin m = top-1 minus top-2 logit")
    ax.set_ylabel("density (per logit)")
    ax.set_title("margin distribution; shaded / dashed: hard core (lowest 5% of margins)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, paths)


def expressibility_gap_figure(curve: pd.DataFrame, fit: pd.DataFrame, paths) -> None:
    """eta(eps) on log-log axes per model (points; filled = inside the fit range) with the fitted
    power law eta = exp(c) eps^beta over the fit range, and the reference slope 1 (LSM's linear
    scaling law) through the first model's fit at the range's upper end."""
    col = _colors(curve.model.unique())
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for m, g in curve.groupby("model", sort=True):
        g = g[g.eta > 0]
        inf = g.in_fit.astype(str) == "True"
        ax.scatter(g.eps[~inf], g.eta[~inf], s=12, facecolors="none", edgecolors=col[m])
        ax.scatter(g.eps[inf], g.eta[inf], s=14, color=col[m])
        if (fit.model == m).any():
            r = fit[fit.model == m].iloc[0]
            e = np.geomspace(r.fit_eps_lo, r.fit_eps_hi, 20)
            ax.plot(e, np.exp(r.intercept) * e ** r.beta, color=col[m],
                    label=f"{m}: beta={r.beta:.2f} [{r.beta_lo:.2f}, {r.beta_hi:.2f}], R2={r.r2:.3f}, "
                          f"alpha={r.alpha:.2f}")
    if len(fit):
        r = fit.sort_values("model").iloc[0]
        e = np.geomspace(r.fit_eps_lo, r.fit_eps_hi, 20)
        y0 = np.exp(r.intercept) * r.fit_eps_hi ** r.beta
        ax.plot(e, y0 * e / r.fit_eps_hi, color="0.4", ls=":", label="slope 1 (linear law)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("eps (logits)")
    ax.set_ylabel("eta(eps) = fraction of positions with margin < eps")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    save_figure(fig, paths)


def margin_vs_perplexity_figure(df: pd.DataFrame, paths) -> None:
    """Median Voronoi margin (logits; bar = inter-quartile range) vs perplexity (per token, log
    axis) across models, one point per model and prompt set, labelled; the across-model Spearman
    rho is in the title when there are at least 3 models."""
    col = _colors(df.model.unique())
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    for i, (_, r) in enumerate(df.sort_values("perplexity").iterrows()):
        if "margin_q25" in r and "margin_q75" in r:
            ax.vlines(r.perplexity, r.margin_q25, r.margin_q75, color=col[r.model], lw=1.2)
        ax.scatter(r.perplexity, r.median_margin, color=col[r.model], s=40)
        ax.annotate(f"{r.model}" + (f" ({r.prompt_set})" if df.prompt_set.nunique() > 1 else ""),
                    (r.perplexity, r.median_margin), fontsize=7, xytext=(4, 6 if i % 2 == 0 else -12),
                    textcoords="offset points")
    ax.set_xscale("log")
    lo, hi = float(df.perplexity.min()), float(df.perplexity.max())
    ax.set_xlim(lo / 1.5, hi * 1.5)
    ax.set_ylim(bottom=0)
    from matplotlib.ticker import LogLocator, ScalarFormatter

    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("perplexity (exp mean NLL per token; tokenizers differ)")
    ax.set_ylabel("median margin (logits)")
    rho = df.spearman_rho_across_models.dropna()
    ax.set_title(f"Spearman rho across models = {rho.iloc[0]:.2f}" if len(rho) else
                 "median margin vs perplexity (rho needs >= 3 models)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    save_figure(fig, paths)


def intrinsic_dimension_figure(df: pd.DataFrame, paths) -> None:
    """Intrinsic dimension of the residual stream vs relative depth: one panel per estimator
    (TwoNN, MLE), one line per model, band = spread over subsamples, star = peak. Source: LSM
    (ID profile); drawn by :func:`llmgeom.plots.lsm.id_profile_figure`."""
    from llmgeom.plots.lsm import id_profile_figure

    id_profile_figure(df, paths)
