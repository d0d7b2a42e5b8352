"""SULA tables (Paper III sec. 4.3 / 5.2): sula.csv (MAE in bits, Pearson r per condition and k),
sula_calibration.csv, sula_geometry.csv (rho of PC1 with H_Bayes and k) and sula_prompts.csv,
from the SULA activation files. Never torch.
"""

from __future__ import annotations

import json

import numpy as np

from llmgeom.core.layers import relative_depth, select_layers
from llmgeom.core.stats import bootstrap_interval, derived_seed, pearson, replicates_text, spearman, spearman_rows
from llmgeom.core.store import DS
from llmgeom.core.units import nats_to_bits
from llmgeom.measures.bayes import model_label_entropy
from llmgeom.measures.pca import H_MODEL_SIGN, ValueManifoldPCA


def read_sula_h5(path, *, model: str | None = None):
    """Per-prompt SULA quantities from one activation file written with candidate log-probs.

    Returns:
        (pandas DataFrame with one row per prompt: id-free columns condition, k, i, n_L1, n_L2, labels,
        alpha, p_bayes, h_bayes_bits, h_counts_bits, h_pred_bits, logp_l1, logp_l2 (nats), p_model, h_model_bits,
        label_mass (p(L1) + p(L2) over the full vocabulary), h_vocab_bits (full next-token entropy, bits);
        values h5 dataset is not loaded).

    Raises:
        StoreError: untrusted file; KeyError: the file has no ``next_token/candidate_logprobs`` (it was
        not extracted as a SULA set: rerun rule extract_sula).
    """
    import pandas as pd

    from llmgeom.core.store import attention_layers, open_activations, read_finite

    with open_activations(path, model=model) as f:
        if DS.NEXT_TOKEN_CANDIDATE_LOGPROBS not in f:
            raise KeyError(f"{path} has no next_token/candidate_logprobs; it is not a SULA extraction "
                           "(rerun rule extract_sula)")
        meta = [json.loads(m) for m in f[DS.PROMPTS_META].asstr()[:]]
        lp = read_finite(f, DS.NEXT_TOKEN_CANDIDATE_LOGPROBS)
        hv = nats_to_bits(read_finite(f, DS.NEXT_TOKEN_ENTROPY))
    p_model, h_model = model_label_entropy(lp[:, 0], lp[:, 1])
    df = pd.DataFrame({
        "condition": [m["condition"] for m in meta], "k": [int(m["k"]) for m in meta],
        "i": [int(m["i"]) for m in meta], "n_L1": [m["n_L1"] for m in meta], "n_L2": [m["n_L2"] for m in meta],
        "labels": ["/".join(m["labels"]) for m in meta], "alpha": [m["alpha"] for m in meta],
        "p_bayes": [m["p_bayes"] for m in meta], "h_bayes_bits": [m["h_bayes_bits"] for m in meta],
        "h_counts_bits": [m["h_counts_bits"] for m in meta],
        "h_pred_bits": [m.get("h_pred_bits", np.nan) for m in meta],
        "logp_l1": lp[:, 0], "logp_l2": lp[:, 1], "p_model": p_model, "h_model_bits": h_model,
        "label_mass": np.exp(lp[:, 0]) + np.exp(lp[:, 1]), "h_vocab_bits": hv,
    })
    return df


def sula_stats(h_model, h_bayes, p_model=None, p_bayes=None) -> dict:
    """MAE |H_model - H_Bayes| (bits) and Pearson r between them (NaN when either is constant, e.g.
    at k = 0 or in the shuffled control, where H_Bayes = 1 bit for every prompt).

    Source: Paper III sec. 5.2 (SULA calibration: MAE and r).
    """
    hm, hb = np.asarray(h_model, np.float64), np.asarray(h_bayes, np.float64)
    r, p = pearson(hm, hb)
    out = {"n": int(hm.size), "mae_bits": float(np.mean(np.abs(hm - hb))) if hm.size else float("nan"),
           "pearson_r": r, "pearson_p": p, "mean_h_model_bits": float(np.mean(hm)) if hm.size else float("nan"),
           "mean_h_bayes_bits": float(np.mean(hb)) if hb.size else float("nan")}
    if p_model is not None and p_bayes is not None:
        out["mae_p"] = float(np.mean(np.abs(np.asarray(p_model) - np.asarray(p_bayes))))
    return out


def sula_table(per_prompt, *, model: str, n_boot: int, ci: float, seed: int):
    """Per condition, per k and overall (k = "all"): n, mae_bits, pearson_r, pearson_p, mean_h_model_bits,
    mean_h_bayes_bits, mae_p (|p_model(L1) - p_bayes(L1)|), mean_h_pred_bits / mae_pred_bits (against the
    posterior predictive entropy), mean_label_mass, mean_h_vocab_bits, labels, alpha; and the bootstrap over the
    row's prompts (:func:`sula_bootstrap`): mae_bits_lo / _hi / _replicates, pearson_r_lo / _hi / _replicates,
    n_boot, ci, boot_seed.

    Args:
        per_prompt: DataFrame from :func:`read_sula_h5` (all conditions concatenated).
        n_boot, ci, seed: see :func:`sula_bootstrap` (schema keys ``sula.n_boot``, ``sula.ci``, ``sula.seed``).

    Source: Paper III sec. 5.2.
    """
    import pandas as pd

    rows = []
    for cond, g in per_prompt.groupby("condition", sort=False):
        groups = [(str(k), gk) for k, gk in g.groupby("k")] + [("all", g)]
        for k, gk in groups:
            st = sula_stats(gk.h_model_bits, gk.h_bayes_bits, gk.p_model, gk.p_bayes)
            bseed = derived_seed(seed, f"sula/boot/{cond}/{k}")
            rows.append(dict(model=model, condition=cond, labels=gk.labels.iloc[0], k=k, **st,
                             mean_h_pred_bits=float(gk.h_pred_bits.mean()),
                             mae_pred_bits=float(np.mean(np.abs(gk.h_model_bits - gk.h_pred_bits))),
                             mean_label_mass=float(gk.label_mass.mean()),
                             mean_h_vocab_bits=float(gk.h_vocab_bits.mean()), alpha=float(gk.alpha.iloc[0]),
                             **sula_bootstrap(gk.h_model_bits, gk.h_bayes_bits, st, n_boot=n_boot, ci=ci, seed=bseed),
                             n_boot=int(n_boot), ci=float(ci), boot_seed=bseed))
    return pd.DataFrame(rows)


#: the sula.csv statistics with a bootstrap interval over prompts, and the bounds their interval is clipped to
SULA_BOOTSTRAPPED = {"mae_bits": (0.0, np.inf), "pearson_r": (-1.0, 1.0)}


def sula_bootstrap(h_model, h_bayes, stats: dict, *, n_boot: int, ci: float, seed: int) -> dict:
    """Basic bootstrap over prompts of the MAE (bits) and Pearson r of :func:`sula_stats`.

    Args:
        h_model, h_bayes: [n] entropies (bits) of one row's prompts; stats: :func:`sula_stats` of them (the estimates).
        n_boot: resamples (0: NaN bounds, no replicates); resample b = the prompts
            ``numpy.random.default_rng(seed).integers(0, n, (n_boot, n))[b]``, the same for both statistics.
        ci: central coverage of the interval, in (0, 1).

    Returns:
        dict: ``<s>_lo``, ``<s>_hi`` (basic interval clipped to :data:`SULA_BOOTSTRAPPED` bounds: MAE >= 0,
        r in [-1, 1]; NaN when the estimate is NaN, e.g. r at k = 0) and ``<s>_replicates``
        (:func:`llmgeom.core.stats.replicates_text`; a resample with constant entropies gives a NaN r) for s in
        mae_bits, pearson_r.

    Source: Paper III sec. 5.2 (the statistics); basic bootstrap: Davison & Hinkley 1997, sec. 5.2.
    """
    hm, hb = np.asarray(h_model, np.float64), np.asarray(h_bayes, np.float64)
    reps = {s: np.full(int(n_boot), np.nan) for s in SULA_BOOTSTRAPPED}
    if int(n_boot) > 0 and hm.size:
        for b, ix in enumerate(np.random.default_rng(seed).integers(0, hm.size, size=(int(n_boot), hm.size))):
            sb = sula_stats(hm[ix], hb[ix])
            for s in reps:
                reps[s][b] = sb[s]
    out = {}
    for s, bounds in SULA_BOOTSTRAPPED.items():
        t = stats[s]
        lo, hi = (bootstrap_interval(t, reps[s], ci=ci, bounds=bounds) if np.isfinite(t) and int(n_boot) > 0
                  else (np.nan, np.nan))
        out.update({f"{s}_lo": lo, f"{s}_hi": hi, f"{s}_replicates": replicates_text(reps[s])})
    return out


def calibration_table(per_prompt, *, model: str, n_bins: int):
    """Calibration: prompts binned by H_Bayes (equal-width bins on [0, 1] bit, last bin closed), per
    condition: bin, bin_lo, bin_hi, n, mean_h_bayes_bits, mean_h_model_bits, sd_h_model_bits,
    mean_abs_error_bits. Empty bins are omitted. A calibrated model has mean_h_model ~ mean_h_bayes.

    Source: Paper III sec. 5.2 (calibration of H_model against H_Bayes).
    """
    import pandas as pd

    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    rows = []
    for cond, g in per_prompt.groupby("condition", sort=False):
        hb = g.h_bayes_bits.to_numpy(np.float64)
        hm = g.h_model_bits.to_numpy(np.float64)
        b = np.clip(np.searchsorted(edges, hb, side="right") - 1, 0, n_bins - 1)
        for j in range(n_bins):
            sel = b == j
            if not sel.any():
                continue
            rows.append(dict(model=model, condition=cond, bin=j, bin_lo=edges[j], bin_hi=edges[j + 1],
                             n=int(sel.sum()), mean_h_bayes_bits=float(hb[sel].mean()),
                             mean_h_model_bits=float(hm[sel].mean()),
                             sd_h_model_bits=float(hm[sel].std(ddof=1)) if sel.sum() > 1 else float("nan"),
                             mean_abs_error_bits=float(np.abs(hm[sel] - hb[sel]).mean())))
    return pd.DataFrame(rows)


def _rho_replicates(s, hb, k, *, n_boot: int, ci: float, seed: int) -> dict:
    """Basic bootstrap over prompts of rho(PC1, H_Bayes) and rho(k, PC1) with the PC1 scores ``s`` [n] held at the
    full-sample fit (the interval is conditional on that axis: PC1 is not refitted per resample). Resample b =
    ``numpy.random.default_rng(seed).integers(0, n, (n_boot, n))[b]``, the same for both. Returns
    ``<c>_lo`` / ``_hi`` (clipped to [-1, 1]; NaN without resamples or for a NaN estimate) and ``<c>_replicates``
    for c in rho_pc1_h_bayes, rho_k_pc1."""
    cols = {"rho_pc1_h_bayes": (s, hb), "rho_k_pc1": (k, s)}
    reps = {c: np.full(int(n_boot), np.nan) for c in cols}
    if int(n_boot) > 0 and len(s):
        ix = np.random.default_rng(seed).integers(0, len(s), size=(int(n_boot), len(s)))
        for c, (x, y) in cols.items():
            reps[c] = spearman_rows(np.asarray(x)[ix], np.asarray(y)[ix])
    out = {}
    for c, (x, y) in cols.items():
        t = spearman(x, y)[0]
        lo, hi = (bootstrap_interval(t, reps[c], ci=ci, bounds=(-1.0, 1.0)) if np.isfinite(t) and int(n_boot) > 0
                  else (np.nan, np.nan))
        out.update({f"{c}_lo": lo, f"{c}_hi": hi, f"{c}_replicates": replicates_text(reps[c])})
    return out


def geometry_table(h5_paths: dict, per_prompt, *, model: str, layers, n_boot: int, ci: float, seed: int):
    """SULA geometry per condition and layer: PC1 of the standardized last-token values
    (``last_token/values`` [n, L, n_kv*head_dim]) by :class:`llmgeom.measures.pca.ValueManifoldPCA`; its sign
    is fixed so that Pearson corr(PC1, H_model) >= 0 (:data:`llmgeom.measures.pca.H_MODEL_SIGN`).

    Returns:
        (table, scores) where table has model, condition, layer, relative_depth ((layer+1)/L), n, pc1
        (explained-variance share, as in value_manifold.csv; not bootstrapped), participation_ratio (full spectrum of the standardized
        values) and participation_ratio_top10 (10 largest eigenvalues, the published code's definition),
        rho_pc1_h_bayes / p (Spearman, PC1 vs H_Bayes; NaN if H_Bayes is
        constant, e.g. shuffled), rho_k_pc1 / p (Spearman, k vs PC1), rho_pc1_h_model / p,
        pc1_sign_flipped, pc1_sign ("pearson(h_model_bits) >= 0"), rho_pc1_h_bayes_lo / _hi / _replicates and
        rho_k_pc1_lo / _hi / _replicates (``n_boot`` resamples of the prompts, the PC1 scores held at the
        full-sample fit: :func:`_rho_replicates`; seed derived from ``seed``, condition and layer)
        (all NaN at a layer where the values do not vary across prompts, e.g. layer 0: the
        final token is always ":"); and scores = {condition: PC1 score [n] at the last layer analysed}. Only
        layers with attention are analysed (the file's ``attention_layers``: hybrid models list fewer layers; a
        state-space model has no rows and NaN scores).

    Source: Paper III sec. 4.3 (geometry on SULA).
    """
    import pandas as pd

    from llmgeom.core.store import attention_layers, open_activations, read_finite

    rows, last_scores = [], {}
    for cond, path in h5_paths.items():
        g = per_prompt[per_prompt.condition == cond]
        hb, hm, k = (g[c].to_numpy(np.float64) for c in ("h_bayes_bits", "h_model_bits", "k"))
        with open_activations(path, model=model) as f:
            L = f[DS.LAST_TOKEN_RESIDUAL].shape[1] - 1
            with_attention = set(attention_layers(f)) if DS.LAST_TOKEN_VALUES in f else set()
            last_scores[cond] = np.full(len(g), np.nan)  # no attention layer analysed (a state-space model)
            for layer in [l for l in select_layers(layers, L) if l in with_attention]:
                X = read_finite(f, DS.LAST_TOKEN_VALUES, layer=layer)
                if not np.any(np.ptp(X, axis=0) > 0):
                    # e.g. layer 0: the value at the final token ":" depends on that token only
                    rows.append(dict(model=model, condition=cond, layer=layer, relative_depth=relative_depth(layer, L),
                                     n=len(X), pc1=np.nan, participation_ratio=np.nan,
                                     participation_ratio_top10=np.nan, rho_pc1_h_bayes=np.nan, p_pc1_h_bayes=np.nan,
                                     rho_k_pc1=np.nan, p_k_pc1=np.nan, rho_pc1_h_model=np.nan, p_pc1_h_model=np.nan,
                                     pc1_sign_flipped=False, pc1_sign=H_MODEL_SIGN.label))
                    last_scores[cond] = np.full(len(X), np.nan)
                    continue
                est = ValueManifoldPCA(standardize=True, n_components=1, sign=H_MODEL_SIGN).fit(X, hm)
                s = est.scores_[:, 0]
                r1, p1 = spearman(s, hb)
                r2, p2 = spearman(k, s)
                r3, p3 = spearman(s, hm)
                boot = _rho_replicates(s, hb, k, n_boot=n_boot, ci=ci,
                                       seed=derived_seed(seed, f"geometry:{cond}:{layer}"))
                rows.append(dict(model=model, condition=cond, layer=layer, relative_depth=relative_depth(layer, L), **boot,
                                 n=len(s), pc1=est.pc1_, participation_ratio=est.participation_ratio_,
                                 participation_ratio_top10=est.participation_ratio_top_, rho_pc1_h_bayes=r1,
                                 p_pc1_h_bayes=p1, rho_k_pc1=r2, p_k_pc1=p2, rho_pc1_h_model=r3, p_pc1_h_model=p3,
                                 pc1_sign_flipped=bool(est.sign_flipped_[0]), pc1_sign=H_MODEL_SIGN.label))
                last_scores[cond] = s
    return pd.DataFrame(rows), last_scores


def sula_tables(h5_paths: dict, *, model: str, calibration_bins: int, layers, n_boot: int, ci: float,
                seed: int) -> dict:
    """All SULA tables for one model: {"sula", "calibration", "geometry", "prompts"} DataFrames.

    Args:
        h5_paths: condition -> ``results/{model}/activations/sula_{condition}.h5``.
        n_boot, ci, seed: the bootstrap over prompts of sula.csv (:func:`sula_table`) and of the geometry rhos
            (:func:`geometry_table`; ``seed`` is the prompt
            generation's, each row's bootstrap seed is derived from it and the row).

    ``prompts`` holds one row per prompt (condition, k, i, counts, p_bayes, h_bayes_bits, p_model,
    h_model_bits, label_mass, h_vocab_bits, logp_l1/l2 in nats) plus ``pc1_last`` (PC1 score of the values at
    the last analysed layer, sign convention of :func:`geometry_table`).

    Source: Paper III sec. 4.3 / 5.2.
    """
    import pandas as pd

    per = pd.concat([read_sula_h5(p, model=model) for p in h5_paths.values()], ignore_index=True)
    geo, scores = geometry_table(h5_paths, per, model=model, layers=layers, n_boot=n_boot, ci=ci, seed=seed)
    per["pc1_last"] = np.nan
    for cond, s in scores.items():
        per.loc[per.condition == cond, "pc1_last"] = s
    per.insert(0, "model", model)
    return {"sula": sula_table(per, model=model, n_boot=n_boot, ci=ci, seed=seed),
            "calibration": calibration_table(per, model=model, n_bins=calibration_bins),
            "geometry": geo, "prompts": per}
