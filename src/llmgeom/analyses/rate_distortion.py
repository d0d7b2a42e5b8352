"""Rate-distortion exponent per layer (LSM Theorem 10.8), beside the intrinsic-dimension estimates: table
``rate_distortion.csv``.

Reads the corpus activation file (``tokens/residual_sample`` per layer, ``tokens/final_normed_sample``) and
``intrinsic_dimension.csv``; the measurement is :mod:`llmgeom.measures.rate_distortion`. No model, no torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.core.layers import relative_depth
from llmgeom.core.stats import replicates_text
from llmgeom.core.store import DS, attrs_dict, open_activations, read_finite
from llmgeom.core.tables import TOKEN_ID
from llmgeom.measures.rate_distortion import rate_distortion_exponent

#: ID estimators reported beside k_RD (columns of the same name; NaN where intrinsic_dimension.csv has none)
ID_COLUMNS = ("twonn", "mle_mg", "mle_lb", "gride")


def rate_distortion_table(h5_path, id_table: pd.DataFrame | None = None, *, model: str, seed: int, n_boot: int,
                          agree_tol: float, min_fit_points: int, r2_min: float, n_min: int, max_fraction: float,
                          n_points: int, train_fraction: float, max_iter: int, init: str, ci: float) -> pd.DataFrame:
    """k_RD per residual-stream layer and for the final normed states, beside TwoNN / MLE of the same layer.

    Args:
        h5_path: corpus activation file (``tokens/residual_sample`` [n_sample, L+1, d_model],
            ``tokens/final_normed_sample`` [n_sample, d_unembed]).
        id_table: rows of ``intrinsic_dimension.csv`` (model, estimator, layer, id_mean) or None.
        model: model name (checked against the file).
        seed, n_boot, ci, min_fit_points, r2_min, n_min, max_fraction, n_points, train_fraction, max_iter, init:
            see :func:`llmgeom.measures.rate_distortion.rate_distortion_exponent` (the config section
            ``rate_distortion``; notebooks: ``llmgeom.defaults("rate_distortion")``).
        agree_tol: ``agrees_twonn`` is True when TwoNN lies inside [k_rd_lo, k_rd_hi] or within
            ``agree_tol`` * TwoNN of k_rd.

    Returns:
        DataFrame, one row per (model, states, layer): model, prompt_set, states ("residual": layer l = output
        of block l, 0 = embeddings; "final_normed": the unembedding input, layer = L), layer, relative_depth,
        d_model, k_rd, k_rd_lo, k_rd_hi, k_rd_replicates (the replicates of the interval,
        :func:`llmgeom.core.stats.replicates_text`; each layer's own resamples of its held-out points), slope, intercept, r2, fit_n_min, fit_n_max, fit_points, straight,
        n_train, n_test, n_duplicates_removed, n_boot, n_grid / distortion_grid (';'-joined N and D(N)),
        twonn, mle_mg, mle_lb, gride (id_mean of that estimator at the same residual layer; NaN for
        final_normed and for estimators not run), agrees_twonn, agree_tol.

    Raises:
        StoreError: untrusted file. KeyError: not a corpus file. TooFewPointsError: too few distinct points.

    Source: LSM Theorem 10.8 (D(N) >= c_k (vol M / N)^(2/k)).
    """
    rows = []
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        for name in (DS.TOKENS_RESIDUAL_SAMPLE, DS.TOKENS_FINAL_NORMED_SAMPLE):
            if name not in f:
                raise KeyError(f"{h5_path} has no {name}: rate_distortion needs a corpus set (rerun rule extract)")
        n_layers = f[DS.TOKENS_RESIDUAL_SAMPLE].shape[1] - 1
        d_model = f[DS.TOKENS_RESIDUAL_SAMPLE].shape[2]
        jobs = [("residual", l, lambda l=l: read_finite(f, DS.TOKENS_RESIDUAL_SAMPLE, layer=l, dtype=np.float32))
                for l in range(n_layers + 1)]
        jobs.append(("final_normed", n_layers, lambda: read_finite(f, DS.TOKENS_FINAL_NORMED_SAMPLE, dtype=np.float32)))
        for states, layer, read in jobs:
            r = rate_distortion_exponent(read(), n_boot=n_boot, ci=ci, min_fit_points=min_fit_points,
                                         r2_min=r2_min, seed=seed, n_min=n_min, max_fraction=max_fraction,
                                         n_points=n_points, train_fraction=train_fraction, max_iter=max_iter,
                                         init=init)
            grid, dist = r.pop("n_grid"), r.pop("distortion_grid")
            r["k_rd_replicates"] = replicates_text(r["k_rd_replicates"])
            for k in ("fit_lo", "fit_hi"):
                r.pop(k)
            rows.append(dict(model=model, prompt_set=a.get("prompt_set"), states=states, layer=layer,
                             relative_depth=relative_depth(layer, n_layers, index="residual"), d_model=d_model, **r,
                             n_grid=";".join(map(str, grid)), distortion_grid=";".join(f"{v:.6g}" for v in dist)))
    df = pd.DataFrame(rows)
    for est in ID_COLUMNS:
        df[est] = np.nan
    if id_table is not None and len(id_table):
        sel = id_table.model == model
        if "quantity" in id_table.columns:  # the token ID (the same points as k_RD), not the last-token one
            sel &= id_table.quantity == TOKEN_ID
        ids = id_table[sel].pivot_table(index="layer", columns="estimator", values="id_mean")
        res = df.states == "residual"
        for est in ID_COLUMNS:
            if est in ids.columns:
                df.loc[res, est] = df.loc[res, "layer"].map(ids[est]).to_numpy()
    inside = (df.twonn >= df.k_rd_lo) & (df.twonn <= df.k_rd_hi)
    df["agrees_twonn"] = (inside | ((df.k_rd - df.twonn).abs() <= agree_tol * df.twonn)) & df.twonn.notna()
    df["agree_tol"] = agree_tol
    return df
