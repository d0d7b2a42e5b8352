"""intrinsic_dimension.csv and id_profile.csv (LSM): intrinsic dimension of the residual stream per layer
and the shape of its profile over depth.

Source: LSM, "Latent Semantic Manifolds in Large Language Models"; DESIGN.md sec. 3 ("Intrinsic dimension
per layer"). The estimators are in :mod:`llmgeom.measures.intrinsic_dimension` (scikit-dimension's TwoNN
and MLE on deduplicated float64 points); this module reads the corpus activation file, subsamples each
layer, and returns one row per layer and estimator (:func:`intrinsic_dimension_table`), then the peak
layer / value and shape of each estimator's profile with LSM's published values beside them
(:func:`id_profile_table`). Every row carries ``model`` and ``prompt_set``. HDF5 in, tables out; never
torch. The other LSM tables are in :mod:`llmgeom.analyses.curvature`, :mod:`llmgeom.analyses.margins`
and :mod:`llmgeom.analyses.fisher`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.core.layers import relative_depth
from llmgeom.core.published import add_published
from llmgeom.core.store import attrs_dict, open_activations, read_finite
from llmgeom.measures import intrinsic_dimension as manifold

#: measured column -> quantity of llmgeom/data/published.yaml (LSM)
ID_PROFILE_PUBLISHED = {"peak_id": "id_peak", "peak_relative_depth": "id_peak_relative_depth",
                        "peak_id_over_d_model": "id_over_d_model"}

# --------------------------------------------------------------------------------------------
# Intrinsic-dimension profile and curvature
# --------------------------------------------------------------------------------------------


def id_profile_table(id_table: pd.DataFrame, *, shape_tol: float = 0.1, layers: str = "blocks") -> pd.DataFrame:
    """Shape of the intrinsic-dimension profile over depth, per model, prompt set and estimator.

    Args:
        id_table: rows of ``intrinsic_dimension.csv`` (columns model, prompt_set, estimator,
            layer, relative_depth, d_model, id_mean, ...).
        shape_tol: see :func:`llmgeom.measures.intrinsic_dimension.id_profile_shape`.
        layers: "blocks" (default): the outputs of blocks 1..L; "all": also layer 0, the token
            embeddings, whose points are a discrete set (one per vocabulary entry seen, many exact
            duplicates) and whose ID often exceeds every hidden layer's, which would hide the shape
            of the hidden-layer profile.

    Returns:
        DataFrame, one row per (model, prompt_set, estimator): n_layers (blocks), d_model,
        peak_layer, peak_relative_depth, peak_id, peak_id_over_d_model, trough_layer,
        trough_relative_depth, trough_id, embedding_id (layer 0, reported even when excluded),
        first_id (first layer of the profile), final_id (last block), mean_id (over the profile),
        spearman_depth (ID vs depth; NaN for a constant profile), shape ("rise-then-fall", "fall-then-rise",
        "increasing", "decreasing", "flat"), shape_tol, embeddings_included (True: layer 0 is part of the
        profile); beside peak_id, peak_relative_depth and peak_id_over_d_model the LSM values
        (``*_published``, ``*_published_on``; ``llmgeom/data/published.yaml``, empty where it has none).
        Relative depth = layer / L for residual-stream layer l (output of block l; 0 = embeddings).

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
    return add_published(pd.DataFrame(rows), ID_PROFILE_PUBLISHED)


def intrinsic_dimension_table(h5_path, *, model: str, estimators=("twonn", "mle_mg", "mle_lb"), n_subsamples: int,
                              subsample_size: int, seed: int, min_points: int = 50,
                              mle_k: int = 20, disagreement_factor: float = 1.5) -> pd.DataFrame:
    """Intrinsic dimension of the residual stream per layer at sampled corpus tokens.

    Points: ``tokens/residual_sample`` [n_sample, L+1, d_model] (position 0 excluded at
    extraction), float64, exact duplicates removed and counted. Layer 0 = embeddings,
    layer l = output of block l. Every estimator sees the same subsamples (same seed).

    Returns:
        DataFrame with model, prompt_set, estimator ("twonn"; "mle_mg" = MLE with MacKay-Ghahramani's harmonic
        mean, skdim's default; "mle_lb" = MLE with Levina-Bickel's arithmetic mean), layer, relative_depth
        (layer / L = (block index + 1) / L: the one convention of every table), d_model,
        n (distinct points), n_duplicates_removed, n_subsamples, subsample_size (requested),
        subsample_size_used (= n when fewer distinct points exist; then a warning), id_mean, id_std, id_min,
        id_max, id_over_d_model, mle_k (neighbours of MLE; empty for TwoNN), estimator_ratio (largest /
        smallest id_mean over the estimators at that layer; NaN with one estimator),
        estimators_disagree (estimator_ratio > disagreement_factor), disagreement_factor.

    Raises:
        StoreError: untrusted file. manifold.TooFewPointsError: too few distinct points in a layer.
    """
    estimators = list(dict.fromkeys(manifold.canonical_estimator(e) for e in estimators))  # 'mle' = 'mle_mg'
    rows, short = [], []
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        X = f["tokens/residual_sample"]
        n_layers = X.shape[1] - 1
        d_model = X.shape[2]
        for layer in range(n_layers + 1):
            pts = read_finite(f, "tokens/residual_sample", layer=layer)
            for est in estimators:
                kw = {"min_points": min_points}
                if est.startswith("mle"):
                    kw["k"] = mle_k
                r = manifold.id_subsamples(pts, estimator=est, n_subsamples=n_subsamples,
                                           subsample_size=subsample_size, seed=seed, **kw)
                if r["subsample_size"] < subsample_size and not short:
                    short.append(layer)
                    import warnings

                    warnings.warn(f"{h5_path}: layer {layer} has only {r['n_points']} distinct points, fewer than "
                                  f"intrinsic_dimension.subsample_size={subsample_size}: every subsample is all of "
                                  "them (id_std = 0; column subsample_size_used). Extract more corpus positions "
                                  "(prompts.sets.<corpus>.n, extract.sample_per_prompt) for a spread", stacklevel=2)
                rows.append(dict(model=model, prompt_set=a.get("prompt_set"), estimator=est, layer=layer,
                                 relative_depth=relative_depth(layer, n_layers, index="residual"), d_model=d_model, n=r["n_points"],
                                 n_duplicates_removed=r["n_duplicates_removed"], n_subsamples=r["n_subsamples"],
                                 subsample_size=subsample_size, subsample_size_used=r["subsample_size"],
                                 id_mean=r["id_mean"], id_std=r["id_std"],
                                 id_min=r["id_min"], id_max=r["id_max"],
                                 id_over_d_model=r["id_mean"] / d_model,
                                 mle_k=mle_k if est.startswith("mle") else None))
    df = pd.DataFrame(rows)
    # LSM (issue 5): flag layers where the estimators disagree by more than a factor
    g = df.groupby("layer").id_mean
    ratio = g.transform("max") / g.transform("min")
    df["estimator_ratio"] = ratio.where(df.groupby("layer").estimator.transform("nunique") > 1)
    df["estimators_disagree"] = df.estimator_ratio > disagreement_factor
    df["disagreement_factor"] = disagreement_factor
    return df
