"""margins.csv, eta_curve.csv, expressibility_gap.csv, margin_histogram.csv and margin_vs_perplexity.csv:
Voronoi margins and the expressibility gap eta(eps) (LSM). HDF5 in, tables out; never torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.core.published import add_published
from llmgeom.core.stats import REPLICATES_SUFFIX, derived_seed
from llmgeom.core.store import DS, attrs_dict, open_activations, read_finite
from llmgeom.measures import margins

#: measured column -> quantity of llmgeom/data/published.yaml
MARGINS_PUBLISHED = {"hard_core_margin": "hard_core_margin", "margin_q25": "lsm_margin_q25", "margin_q50": "lsm_margin_q50",
                     "margin_q75": "lsm_margin_q75", "margin_q95": "lsm_margin_q95",
                     "p_margin_below": "lsm_p_margin_below"}
#: the same quantities under margin_vs_perplexity's column names
MVP_PUBLISHED = dict(MARGINS_PUBLISHED, median_margin="lsm_margin_q50")
GAP_PUBLISHED = {"beta": "eta_slope", "r2": "eta_r2"}

# --------------------------------------------------------------------------------------------
# Margins, expressibility gap, perplexity
# --------------------------------------------------------------------------------------------


def margin_tables(h5_path, *, model: str, threshold: float, hard_core_quantile: float, hard_core_thresholds,
                  eps_min: float, eps_max: float, n_eps: int, fit_eps_max: float, fit_eta_max: float,
                  min_count: int, n_boot: int,
                  ci: float, seed: int, hist_bins: int) -> dict[str, pd.DataFrame]:
    """Voronoi margins, the expressibility gap and perplexity of one model on a corpus set.

    Reads ``tokens/margin`` (logits, float32, top-1 minus top-2 of the final layer, computed at
    extraction: no second forward pass), ``tokens/nll`` and ``tokens/entropy`` (nats) at every
    scored position (positions 1..len-2 of each passage: BOS excluded, the last token has no
    target).

    Returns:
        dict of DataFrames:
        ``margins``: one row: model, prompt_set, vocab_size, d_model, n_positions, margin_mean,
        margin_q05/q25/q50/q75/q95, threshold, p_margin_below, hard_core_quantile,
        hard_core_margin (the margin quantile at hard_core_quantile, from the same computation as margin_q05:
        equal to it at the default 0.05), hard_core_fraction, hard_core_count,
        hard_core_nll_share, mean_nll, perplexity, spearman_margin_nll(_p), mean_entropy,
        spearman_margin_entropy(_p) (see :func:`llmgeom.measures.margins.margin_summary`); for each of
        margin_q05/q25/q50/q75/q95, hard_core_margin, p_margin_below, mean_nll and perplexity a basic bootstrap
        interval ``_lo`` / ``_hi`` and ``_replicates``; and per threshold t of
        ``hard_core_thresholds`` (logits, config ``margins.hard_core_thresholds``) the fraction of positions with
        margin < t: hard_core_frac_lt_{t} with _count, _lo / _hi, _replicates and _bc (bias-corrected);
        hard_core_boot (the resampling unit of every interval of the row: "passages", or "positions" for a file
        without ``tokens/prompt``), hard_core_n_boot
        (see :func:`llmgeom.measures.margins.fraction_below`); beside hard_core_margin and margin_q25 / q50 / q75 /
        q95 / p_margin_below the value published for the same model (``*_published`` / ``*_published_on``; ""
        where none: LSM's values are over six models and appear as rows of margin_vs_perplexity and claims.csv);
        ``eta_curve``: per eps: model, prompt_set, eps, eta, count, in_fit;
        ``expressibility_gap``: one row: beta, intercept, r2 (each with ``*_published`` / ``*_published_on`` of
        the same model, "" where none), alpha, beta_lo, beta_hi, beta_replicates, beta_boot_std, r2_lo, r2_hi,
        r2_replicates, alpha_lo, alpha_hi (percentile intervals), fit_eps_lo, fit_eps_hi (the fit range chosen by
        eta(eps) <= fit_eta_max, capped at fit_eps_max), fit_eta_max, fit_eps_max, n_fit_points, n_positions,
        n_boot, boot_unit, ci, min_count (see :func:`llmgeom.measures.margins.expressibility_gap`).
        Every interval of the three tables comes from one bootstrap over passages (``tokens/prompt``;
        ``n_boot`` resamples, seeded by ``seed``): replicate b of every ``_replicates`` column is the same
        resample of passages;
        ``margin_histogram``: per bin: bin_lo, bin_hi, count, density, n_above, plus the
        hard-core level for the figure.

    Raises:
        StoreError: untrusted file. KeyError: not a corpus activation file. ValueError: see
        :mod:`llmgeom.measures.margins`.

    Source: LSM (Voronoi margins, expressibility gap, hard core, perplexity); DESIGN.md sec. 3.
    """
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        if DS.TOKENS_MARGIN not in f:
            raise KeyError(f"{h5_path} has no tokens/margin: it is not a corpus activation file")
        m = read_finite(f, DS.TOKENS_MARGIN)
        nll = read_finite(f, DS.TOKENS_NLL)
        ent = read_finite(f, DS.TOKENS_ENTROPY)
        passage = f[DS.TOKENS_PROMPT][:] if DS.TOKENS_PROMPT in f else None
    base = dict(model=model, prompt_set=a.get("prompt_set"))
    # float32 rounding can leave a tie at -0.0 or a tiny negative; the margin is >= 0 by definition
    m = np.clip(m.astype(np.float64), 0.0, None)
    # one resampling of passages for every interval of the three tables: replicate b of every column is resample b
    boot = dict(groups=passage, n_boot=n_boot, seed=derived_seed(seed, "passages"))
    summ = margins.margin_summary(m, nll, ent, threshold=threshold, hard_core_quantile=hard_core_quantile, ci=ci,
                                  **boot)
    summ.update(margins.fraction_below(m, hard_core_thresholds, ci=ci, **boot))
    curve, fit = margins.expressibility_gap(m, eps_min=eps_min, eps_max=eps_max, n_eps=n_eps,
                                            fit_eps_max=fit_eps_max, fit_eta_max=fit_eta_max, min_count=min_count,
                                            ci=ci, **boot)
    hist = margins.margin_histogram(m, n_bins=hist_bins)
    return {
        "margins": add_published(pd.DataFrame([dict(base, vocab_size=a.get("vocab_size"), d_model=a.get("d_model"),
                                                    **summ)]), MARGINS_PUBLISHED),
        "eta_curve": pd.DataFrame(dict(base, **curve)),
        "expressibility_gap": add_published(pd.DataFrame([dict(base, **fit, min_count=int(min_count))]),
                                            GAP_PUBLISHED),
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
        p_margin_below, hard_core_margin, each with its ``_lo`` / ``_hi`` / ``_replicates`` from margins.csv (the
        passage bootstrap; margin_q50's as median_margin_*, mean_nll's as log_perplexity_*), beside the margin columns ``*_published`` / ``*_published_on`` (the value
        published for the same model, "" where none; ``llmgeom/data/published.yaml``), the hard-core fractions below fixed thresholds with their intervals
        (hard_core_frac_lt_*), spearman_margin_nll, n_positions, and across models of the
        same prompt set: n_models, spearman_rho_across_models and spearman_p_across_models
        (rank correlation of median margin with perplexity; the p-value is the exact two-sided permutation p of
        :func:`llmgeom.core.stats.spearman_exact`, not the t approximation, which is far off for a handful of
        models: three models in perfect order give p = 1/3, four give 1/12; NaN with fewer than 3 models),
        spearman_p_negative_across_models (the exact one-sided p for rho < 0, what the directional claim reads:
        1/6 and 1/24 in perfect inverse order), ``source``
        ("measured"). LSM's published margin values (over several models, some secondary) are not attached to
        our rows: they appear once, with their models, in ``claims.csv`` and ``published.csv`` (rule claims).
        Perplexities of models with different tokenizers count different tokens: compare them
        with care.

    Source: LSM (margin distribution as a geometric decomposition of perplexity).
    """
    from llmgeom.core.stats import spearman_exact

    cols = ["model", "prompt_set", "vocab_size", "margin_q50", "margin_q25", "margin_q75", "perplexity", "mean_nll",
            "p_margin_below", "hard_core_margin"]
    cols = [x for c in cols for x in (c, f"{c}_lo", f"{c}_hi", f"{c}{REPLICATES_SUFFIX}")
            if x == c or c not in ("model", "prompt_set", "vocab_size")]
    cols += [c for c in margins_table.columns if c.startswith("hard_core_frac_lt_")]
    cols += ["spearman_margin_nll", "n_positions"]
    rename = {f"{a}{s}": f"{b}{s}" for a, b in (("margin_q50", "median_margin"), ("mean_nll", "log_perplexity"))
              for s in ("", "_lo", "_hi", REPLICATES_SUFFIX)}
    d = margins_table[[c for c in cols if c in margins_table.columns]].rename(columns=rename).copy()
    d["n_models"] = d.groupby("prompt_set").model.transform("nunique")
    d["spearman_rho_across_models"] = np.nan
    d["spearman_p_across_models"] = np.nan
    d["spearman_p_negative_across_models"] = np.nan
    for ps, g in d.groupby("prompt_set"):
        if len(g) >= 3:
            r, p = spearman_exact(g.median_margin, g.perplexity, alternative="two-sided")
            d.loc[g.index, "spearman_rho_across_models"] = r
            d.loc[g.index, "spearman_p_across_models"] = p
            # the claim is directional (LSM: higher margin, lower perplexity): its exact one-sided p, rho < 0
            d.loc[g.index, "spearman_p_negative_across_models"] = spearman_exact(
                g.median_margin, g.perplexity, alternative="less")[1]
    d = d.drop(columns=[c for c in d.columns if c.endswith(("_published", "_published_on"))] + ["source"],
               errors="ignore")
    return add_published(d.sort_values(["prompt_set", "model"]).reset_index(drop=True), MVP_PUBLISHED)
