"""Latent semantic manifolds (LSM): tidy tables from the HDF5 store (and, for the Fisher metric,
the prepared model's unembedding).

Source: LSM, "Latent Semantic Manifolds in Large Language Models"; DESIGN.md sec. 3. The
measurements themselves live in :mod:`llmgeom.manifold` (intrinsic dimension, curvature proxy,
profile shape), :mod:`llmgeom.margins` (Voronoi margins, expressibility gap, perplexity) and
:mod:`llmgeom.fisher` (Fisher information metric); this module reads inputs, loops over layers and
returns one row per measurement. Every row carries ``model`` and ``prompt_set``.

Tables (``results/{model}/tables/``):

* ``id_profile.csv``      (:func:`id_profile_table`) peak layer / value and shape of the ID profile
* ``curvature.csv``       (:func:`curvature_table`) local-PCA curvature proxy per layer, with k and m
* ``margins.csv``         (:func:`margin_tables`) margin quantiles, Pr(m < 0.5), hard core,
  perplexity, Spearman rho of margin with NLL and entropy
* ``eta_curve.csv``       eta(eps) on the eps grid (the curve behind the fit)
* ``expressibility_gap.csv`` beta, R^2, fit range, alpha, bootstrap CI of beta
* ``margin_histogram.csv`` histogram of margins (for the figure)
* ``fisher.csv`` / ``fisher_summary.csv`` (:func:`fisher_tables`) per position / per model
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import fisher as fisher_mod
from . import manifold, margins
from .store import attrs_dict, open_activations

__all__ = [
    "LSMConfigError",
    "check_lsm_config",
    "id_profile_table",
    "curvature_table",
    "margin_tables",
    "load_unembedding",
    "fisher_tables",
    "margin_vs_perplexity_table",
]


# defined in llmgeom.config_checks (imported while Snakemake builds the DAG; must stay light)
from .config_checks import LSMConfigError, check_lsm_config  # noqa: E402,F401


# --------------------------------------------------------------------------------------------
# Intrinsic-dimension profile and curvature
# --------------------------------------------------------------------------------------------


def id_profile_table(id_table: pd.DataFrame, *, shape_tol: float = 0.1, layers: str = "blocks") -> pd.DataFrame:
    """Shape of the intrinsic-dimension profile over depth, per model, prompt set and estimator.

    Args:
        id_table: rows of ``intrinsic_dimension.csv`` (columns model, prompt_set, estimator,
            layer, relative_depth, d_model, id_mean, ...).
        shape_tol: see :func:`llmgeom.manifold.id_profile_shape`.
        layers: "blocks" (default): the outputs of blocks 1..L; "all": also layer 0, the token
            embeddings, whose points are a discrete set (one per vocabulary entry seen, many exact
            duplicates) and whose ID often exceeds every hidden layer's, which would hide the shape
            of the hidden-layer profile.

    Returns:
        DataFrame, one row per (model, prompt_set, estimator): n_layers (blocks), d_model,
        peak_layer, peak_relative_depth, peak_id, peak_id_over_d_model, trough_layer,
        trough_relative_depth, trough_id, embedding_id (layer 0, reported even when excluded),
        first_id (first layer of the profile), final_id (last block), mean_id (over the profile),
        spearman_depth (ID vs depth), shape ("rise-then-fall", "fall-then-rise", "increasing",
        "decreasing", "flat"), shape_tol, embeddings_included (True: layer 0 is part of the profile).

    Source: LSM (universal ID profile over relative depth); DESIGN.md sec. 3.
    """
    if layers not in ("blocks", "all"):
        raise ValueError(f"layers must be 'blocks' or 'all', got {layers!r}")
    rows = []
    for (model, pset, est), g in id_table.groupby(["model", "prompt_set", "estimator"], sort=True):
        g = g.sort_values("layer")
        emb = g[g.layer == 0].id_mean
        n_layers = int(g.layer.max())
        if layers == "blocks" and n_layers >= 2:
            g = g[g.layer > 0]
        s = manifold.id_profile_shape(g.relative_depth.to_numpy(), g.id_mean.to_numpy(), tol=shape_tol)
        lay = g.layer.to_numpy()
        d_model = int(g.d_model.iloc[0])
        rows.append(dict(
            model=model, prompt_set=pset, estimator=est, n_layers=n_layers, d_model=d_model,
            peak_layer=int(lay[s["peak_index"]]), peak_relative_depth=s["peak_depth"], peak_id=s["peak_id"],
            peak_id_over_d_model=s["peak_id"] / d_model,
            trough_layer=int(lay[s["trough_index"]]), trough_relative_depth=s["trough_depth"],
            trough_id=s["trough_id"], embedding_id=float(emb.iloc[0]) if len(emb) else np.nan,
            first_id=s["first_id"], final_id=s["last_id"], mean_id=float(g.id_mean.mean()),
            spearman_depth=s["spearman_depth"], shape=s["shape"], shape_tol=shape_tol,
            embeddings_included=bool(lay.min() == 0)))
    return pd.DataFrame(rows)


def curvature_table(h5_path, id_table: pd.DataFrame, *, model: str, k: int, id_estimator: str = "twonn",
                    n_points: int = 1000, seed: int = 0, min_points: int = 50) -> pd.DataFrame:
    """Curvature proxy (local PCA residual variance) of the residual stream per layer.

    Points: ``tokens/residual_sample[:, layer]`` (float64, duplicates removed), a seeded subset
    of ``n_points`` (the same subset for every layer). m = the ID estimate of ``id_estimator``
    for that layer (``id_mean`` in ``intrinsic_dimension.csv``), rounded, at least 1. If m >= k
    the neighbourhood cannot show curvature, so k is raised to 2 m for that layer; k is lowered to
    the number of distinct points - 1 when fewer exist (both recorded in ``k``, ``k_adjusted`` and
    ``note``). A layer with fewer than ``min_points`` distinct points (or k <= m after lowering)
    gets NaN values and a note instead of an error (typically the embedding layer, a discrete set).

    Returns:
        DataFrame: model, prompt_set, layer, relative_depth (layer / L), d_model, id_estimator,
        id_used (the unrounded ID), m, k, k_adjusted, n (distinct points), n_duplicates_removed,
        n_anchors, curvature_mean, curvature_median, curvature_std, curvature_q25, curvature_q75
        (fractions of local variance outside the top-m local PCA directions, 0..1), note.

    Raises:
        StoreError: untrusted file. ValueError: no ID row for a layer. TooFewPointsError.

    Source: LSM sec. 13.3 (curvature proxy); DESIGN.md sec. 3.
    """
    ids = id_table[(id_table.model == model) & (id_table.estimator == id_estimator)].set_index("layer")
    if ids.empty:
        raise ValueError(f"intrinsic_dimension table has no {id_estimator!r} rows for model {model!r}; "
                         "add the estimator to intrinsic_dimension.estimators")
    rows = []
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        X = f["tokens/residual_sample"]
        n_total, n_layers = X.shape[0], X.shape[1] - 1
        d_model = X.shape[2]
        rng = np.random.default_rng(seed)
        sel = np.sort(rng.choice(n_total, size=n_points, replace=False)) if n_points < n_total else np.arange(n_total)
        data = X[sel] if sel.size < n_total else X[:]
        for layer in range(n_layers + 1):
            if layer not in ids.index:
                raise ValueError(f"no {id_estimator} intrinsic dimension for layer {layer} of {model}")
            id_used = float(ids.loc[layer, "id_mean"])
            m = max(1, int(round(id_used)))
            pts = data[:, layer, :]
            n_distinct = manifold.deduplicate(pts)[0].shape[0]
            k_used, note = k, ""
            if m >= k_used:
                k_used, note = 2 * m, f"k raised to 2m (m={m} >= k={k})"
            if k_used > n_distinct - 1:
                k_used, note = n_distinct - 1, f"k lowered to n_distinct - 1 ({n_distinct} distinct points)"
            row = dict(model=model, prompt_set=a.get("prompt_set"), layer=layer, relative_depth=layer / n_layers,
                       d_model=d_model, id_estimator=id_estimator, id_used=id_used, m=m, k=k_used,
                       k_adjusted=k_used != k, n=n_distinct, n_duplicates_removed=pts.shape[0] - n_distinct)
            cols = ("curvature_mean", "curvature_median", "curvature_std", "curvature_q25", "curvature_q75")
            if n_distinct < min_points or k_used <= m:
                # e.g. the embedding layer of a tiny vocabulary: a handful of distinct token vectors
                note = f"too few distinct points ({n_distinct}; min_points={min_points}, m={m})"
                rows.append(dict(row, n_anchors=0, **{c: np.nan for c in cols}, note=note))
                continue
            r = manifold.local_pca_residuals(pts, k=k_used, m=m, min_points=min_points)
            rows.append(dict(row, n=r["n_points"], n_duplicates_removed=r["n_duplicates_removed"],
                             n_anchors=r["n_anchors"], **{c: r[c] for c in cols}, note=note))
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Margins, expressibility gap, perplexity
# --------------------------------------------------------------------------------------------


def margin_tables(h5_path, *, model: str, threshold: float = 0.5, hard_core_quantile: float = 0.05,
                  eps_min: float = 1e-3, eps_max: float = 10.0, n_eps: int = 41, fit_eps_max: float = 0.5,
                  min_count: int = 10, n_boot: int = 200, ci: float = 0.95, seed: int = 0,
                  hist_bins: int = 60) -> dict[str, pd.DataFrame]:
    """Voronoi margins, the expressibility gap and perplexity of one model on a corpus set.

    Reads ``tokens/margin`` (logits, float32, top-1 minus top-2 of the final layer, computed at
    extraction: no second forward pass), ``tokens/nll`` and ``tokens/entropy`` (nats) at every
    scored position (positions 1..len-2 of each passage: BOS excluded, the last token has no
    target).

    Returns:
        dict of DataFrames:
        ``margins``: one row: model, prompt_set, vocab_size, d_model, n_positions, margin_mean,
        margin_q05/q25/q50/q75/q95, threshold, p_margin_below, hard_core_quantile,
        hard_core_margin, hard_core_fraction, hard_core_count, hard_core_nll_share, mean_nll,
        perplexity, spearman_margin_nll(_p), mean_entropy, spearman_margin_entropy(_p)
        (see :func:`llmgeom.margins.margin_summary`);
        ``eta_curve``: per eps: model, prompt_set, eps, eta, count, in_fit;
        ``expressibility_gap``: one row: beta, intercept, r2, alpha, beta_lo, beta_hi,
        beta_boot_std, alpha_lo, alpha_hi, fit_eps_lo, fit_eps_hi, n_fit_points, n_positions,
        n_boot, ci, min_count (see :func:`llmgeom.margins.expressibility_gap`);
        ``margin_histogram``: per bin: bin_lo, bin_hi, count, density, n_above, plus the
        hard-core level for the figure.

    Raises:
        StoreError: untrusted file. KeyError: not a corpus activation file. ValueError: see
        :mod:`llmgeom.margins`.

    Source: LSM (Voronoi margins, expressibility gap, hard core, perplexity); DESIGN.md sec. 3.
    """
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        if "tokens/margin" not in f:
            raise KeyError(f"{h5_path} has no tokens/margin: it is not a corpus activation file")
        m = f["tokens/margin"][:]
        nll = f["tokens/nll"][:]
        ent = f["tokens/entropy"][:]
    base = dict(model=model, prompt_set=a.get("prompt_set"))
    # float32 rounding can leave a tie at -0.0 or a tiny negative; the margin is >= 0 by definition
    m = np.clip(m.astype(np.float64), 0.0, None)
    summ = margins.margin_summary(m, nll, ent, threshold=threshold, hard_core_quantile=hard_core_quantile)
    curve, fit = margins.expressibility_gap(m, eps_min=eps_min, eps_max=eps_max, n_eps=n_eps,
                                            fit_eps_max=fit_eps_max, min_count=min_count, n_boot=n_boot,
                                            ci=ci, seed=seed)
    hist = margins.margin_histogram(m, n_bins=hist_bins)
    return {
        "margins": pd.DataFrame([dict(base, vocab_size=a.get("vocab_size"), d_model=a.get("d_model"), **summ)]),
        "eta_curve": pd.DataFrame(dict(base, **curve)),
        "expressibility_gap": pd.DataFrame([dict(base, **fit, min_count=int(min_count))]),
        "margin_histogram": pd.DataFrame(dict(base, **hist, hard_core_margin=summ["hard_core_margin"])),
    }


def margin_vs_perplexity_table(margins_table: pd.DataFrame) -> pd.DataFrame:
    """Cross-model relation of median margin and perplexity.

    Args:
        margins_table: concatenated ``margins.csv`` rows (one per model and prompt set).

    Returns:
        DataFrame, one row per model and prompt set: model, prompt_set, vocab_size,
        median_margin (logits), margin_q25, margin_q75, perplexity (per token), log_perplexity
        (= mean NLL, nats),
        p_margin_below, hard_core_margin, spearman_margin_nll, n_positions, and across models of the
        same prompt set: n_models, spearman_rho_across_models and spearman_p_across_models
        (rank correlation of median margin with perplexity; NaN with fewer than 3 models).
        Perplexities of models with different tokenizers count different tokens: compare them
        with care.

    Source: LSM (margin distribution as a geometric decomposition of perplexity).
    """
    from scipy.stats import spearmanr

    cols = ["model", "prompt_set", "vocab_size", "margin_q50", "margin_q25", "margin_q75", "perplexity", "mean_nll",
            "p_margin_below", "hard_core_margin", "spearman_margin_nll", "n_positions"]
    d = margins_table[[c for c in cols if c in margins_table.columns]].rename(
        columns={"margin_q50": "median_margin", "mean_nll": "log_perplexity"}).copy()
    d["n_models"] = d.groupby("prompt_set").model.transform("nunique")
    d["spearman_rho_across_models"] = np.nan
    d["spearman_p_across_models"] = np.nan
    for ps, g in d.groupby("prompt_set"):
        if len(g) >= 3:
            r = spearmanr(g.median_margin, g.perplexity)
            d.loc[g.index, "spearman_rho_across_models"] = float(r.statistic)
            d.loc[g.index, "spearman_p_across_models"] = float(r.pvalue)
    return d.sort_values(["prompt_set", "model"]).reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# Fisher information metric
# --------------------------------------------------------------------------------------------


def load_unembedding(model_dir):
    """(W [V, d_unembed] float32 tensor, bias [V] or None, softcap or None) of a prepared model,
    loaded on CPU in float32 through :func:`llmgeom.models.load_prepared` and the architectures
    module (tied weights, output bias and soft-capping handled there)."""
    import torch

    from . import architectures as arch
    from .models import load_prepared

    model, _ = load_prepared(model_dir, dtype="float32", device="cpu")
    W, b = arch.unembedding(model)
    W = W.detach().to(torch.float32).clone()
    b = None if b is None else b.detach().to(torch.float32).clone()
    cap = arch.logit_softcap(model)
    del model
    return W, b, (float(cap) if cap else None)


def fisher_tables(h5_path, model_dir, *, model: str, n_positions: int = 128, max_tokens: int = 1024,
                  tail_mass: float = 1e-6, seed: int = 0, batch: int = 32) -> dict[str, pd.DataFrame]:
    """Fisher information metric G(h) at a seeded subset of sampled corpus positions.

    h = ``tokens/final_normed_sample`` (the unembedding input at the sampled positions); W, bias and
    soft-capping from the prepared model (see :func:`load_unembedding` and :mod:`llmgeom.fisher`).
    The recomputed top-1 minus top-2 logit is compared with ``tokens/margin`` at the positions
    where both exist (the last position of a passage has no stored margin);
    ``margin_check_max_abs_diff`` in the summary should be ~1e-5 logits or less.

    Returns:
        dict of DataFrames. ``fisher``: one row per position: model, prompt_set, sample (row of
        ``tokens/final_normed_sample``), prompt, position, trace, trace_topk,
        trace_fraction_topk, effective_rank, participation_ratio, top_eigenvalue, n_tokens,
        mass_topk, entropy (nats), margin (logits). ``fisher_summary``: one row: n_positions,
        d_unembed, vocab_size, softcap, max_tokens, tail_mass, mean/median/q05/q95 of trace and
        of effective_rank, median participation ratio, median trace_fraction_topk, median
        mass_topk, spearman rho of trace with margin and with entropy, margin_check_max_abs_diff,
        margin_check_n.

    Raises:
        StoreError: untrusted file. KeyError: not a corpus file. ValueError: d_unembed of the file
        differs from the model's unembedding.

    Source: LSM (Fisher information metric, G(h) = W^T (diag p - p p^T) W).
    """
    from scipy.stats import spearmanr

    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        if "tokens/final_normed_sample" not in f:
            raise KeyError(f"{h5_path} has no tokens/final_normed_sample: rerun rule extract on a corpus set")
        n_total = f["tokens/final_normed_sample"].shape[0]
        rng = np.random.default_rng(seed)
        sel = np.sort(rng.choice(n_total, size=min(n_positions, n_total), replace=False))
        H = f["tokens/final_normed_sample"][sel]
        sp = f["tokens/sample_prompt"][sel].astype(np.int64)
        spos = f["tokens/sample_position"][sel].astype(np.int64)
        tok_key = f["tokens/prompt"][:].astype(np.int64) * 1_000_000 + f["tokens/position"][:]
        tok_margin = f["tokens/margin"][:]
    W, b, cap = load_unembedding(model_dir)
    if W.shape[1] != H.shape[1]:
        raise ValueError(f"{h5_path}: final_normed_sample has d={H.shape[1]} but the unembedding of "
                         f"{model_dir} has d={W.shape[1]}")
    r = fisher_mod.fisher_metrics(H, W, b, cap, max_tokens=max_tokens, tail_mass=tail_mass, batch=batch)
    base = dict(model=model, prompt_set=a.get("prompt_set"))
    per = pd.DataFrame(dict(base, sample=sel, prompt=sp, position=spos, **r))
    order = np.argsort(tok_key)
    key = sp * 1_000_000 + spos
    loc = np.searchsorted(tok_key[order], key)
    loc = np.clip(loc, 0, len(order) - 1)
    hit = tok_key[order][loc] == key
    diff = np.abs(per.margin.to_numpy()[hit] - tok_margin[order][loc][hit])
    tr, er = per.trace.to_numpy(), per.effective_rank.to_numpy()
    summ = dict(base, n_positions=len(per), d_unembed=int(W.shape[1]), vocab_size=int(W.shape[0]),
                softcap=cap if cap else np.nan, has_bias=b is not None, max_tokens=max_tokens,
                tail_mass=tail_mass,
                trace_mean=float(tr.mean()), trace_median=float(np.median(tr)),
                trace_q05=float(np.quantile(tr, 0.05)), trace_q95=float(np.quantile(tr, 0.95)),
                effective_rank_mean=float(np.nanmean(er)), effective_rank_median=float(np.nanmedian(er)),
                effective_rank_q05=float(np.nanquantile(er, 0.05)),
                effective_rank_q95=float(np.nanquantile(er, 0.95)),
                participation_ratio_median=float(np.nanmedian(per.participation_ratio)),
                trace_fraction_topk_median=float(np.nanmedian(per.trace_fraction_topk)),
                mass_topk_median=float(per.mass_topk.median()),
                spearman_trace_margin=float(spearmanr(tr, per.margin).statistic) if len(per) > 2 else np.nan,
                spearman_trace_entropy=float(spearmanr(tr, per.entropy).statistic) if len(per) > 2 else np.nan,
                margin_check_max_abs_diff=float(diff.max()) if diff.size else np.nan,
                margin_check_n=int(diff.size))
    return {"fisher": per, "fisher_summary": pd.DataFrame([summ])}
