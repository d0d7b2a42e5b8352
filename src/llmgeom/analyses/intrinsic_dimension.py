"""intrinsic_dimension.csv, id_last_token.csv, gride_scale.csv and id_profile.csv (LSM): intrinsic
dimension of the residual stream per layer, at corpus token positions and at the last token of each prompt of a
second set, GRIDE's scale curve, and the shape of each profile over depth.

Source: LSM, "Latent Semantic Manifolds in Large Language Models"; DESIGN.md sec. 3 ("Intrinsic dimension
per layer"); Cheng, Vaidya & Antonello (ICML 2026; GRIDE on last-token states). The estimators are in
:mod:`llmgeom.measures.intrinsic_dimension` (scikit-dimension's TwoNN and MLE, and GRIDE, on deduplicated float64
points and one shared neighbour graph); the linear dimensions (participation ratio, PCs for 99% of the variance)
come from :mod:`llmgeom.measures.pca`. This module reads the activation files, subsamples each layer, and returns
one row per layer and estimator (:func:`intrinsic_dimension_table`, :func:`last_token_id_table`), then the peak
layer / value and shape of each estimator's profile, which estimators agree, and the published values beside them
(:func:`id_profile_table`). Every row carries ``model``, ``prompt_set`` and ``quantity``, which names the ID
measured (:data:`llmgeom.core.tables.QUANTITIES`): ``token_id`` (LSM's: corpus token positions), ``token_id_cross_passage`` (the same
points, TwoNN with each point's neighbours taken among other passages) and ``last_token_id`` (Cheng et al.'s: the
last token of each prompt); a table is read by quantity, never by estimator alone (the keys of every table:
:data:`llmgeom.core.tables.TABLE_KEYS`). HDF5 in, tables out; never torch. The other LSM tables are in :mod:`llmgeom.analyses.curvature`, :mod:`llmgeom.analyses.margins`
and :mod:`llmgeom.analyses.fisher`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.core.layers import relative_depth
from llmgeom.core.published import add_published
from llmgeom.core.stats import bootstrap_interval, parse_replicates, replicates_text
from llmgeom.core.store import DS, attrs_dict, open_activations, read_finite
# the values of the ``quantity`` column: the one name of each ID in every table, figure and scaling statistic
from llmgeom.core.tables import LAST_TOKEN_ID, TOKEN_ID, TOKEN_ID_CROSS_PASSAGE
from llmgeom.measures import intrinsic_dimension
from llmgeom.measures.neighbors import TooFewPointsError
from llmgeom.measures.pca import explained_variance, participation_ratio

#: fraction of the variance the ``n_pc99`` column's principal components carry
N_PC_VARIANCE = 0.99
#: id_profile columns with a passage-resampling interval (``<col>_lo``, ``<col>_hi``, ``<col>_replicates``)
PROFILE_INTERVAL_COLUMNS = ("peak_id", "peak_id_over_d_model", "peak_relative_depth", "final_id")
#: what the intervals of intrinsic_dimension.csv and id_profile.csv are (the ``interval`` column)
PASSAGE_INTERVAL = "basic interval over passage half-samples (recentred)"
#: the same for the last-token ID, whose points are one per prompt: half-samples of the prompts
PROMPT_INTERVAL = "basic interval over prompt half-samples (recentred)"

#: measured column -> quantity of llmgeom/data/published.yaml (LSM)
ID_PROFILE_PUBLISHED = {"peak_id": "id_peak", "peak_relative_depth": "id_peak_relative_depth",
                        "peak_id_over_d_model": "id_over_d_model"}

# --------------------------------------------------------------------------------------------
# Intrinsic-dimension profile and curvature
# --------------------------------------------------------------------------------------------


#: the same columns beside the last-token GRIDE profile: Cheng, Vaidya & Antonello (ICML 2026)
ID_PROFILE_PUBLISHED_LAST_TOKEN_GRIDE = {"peak_id": "gride_last_token_peak_id",
                                         "peak_relative_depth": "gride_last_token_peak_relative_depth",
                                         "peak_id_over_d_model": "gride_last_token_peak_id_over_d_model"}


#: columns of an id_profile row before the agreement and published columns (a row without a profile: NaN + note)
_PROFILE_COLUMNS = ["model", "prompt_set", "quantity", "estimator", "n_layers", "d_model", "peak_layer",
                    "peak_relative_depth", "peak_id", "peak_id_over_d_model", "trough_layer", "trough_relative_depth",
                    "trough_id", "embedding_id", "first_id", "final_id", "mean_id", "spearman_depth", "shape",
                    "shape_tol", "embeddings_included", "note", "id_iso", "id_over_d_model_iso"] + [
                    f"{c}{s}" for c in PROFILE_INTERVAL_COLUMNS for s in ("_lo", "_hi", "_replicates")] + [
                    "shape_replicates", "n_resamples", "interval", "ci"]


def _agreement(prof: pd.DataFrame, peak_depth_tol: float) -> pd.DataFrame:
    """Columns agrees_with, n_estimators, estimators_agree, shape_verdict per (model, prompt_set, quantity), over
    the estimators with a profile (a row without one, ``note`` set, gets agrees_with "" and the group's verdict)."""
    prof = prof.copy()
    prof["agrees_with"], prof["n_estimators"], prof["estimators_agree"], prof["shape_verdict"] = "", 0, False, ""
    for _, g_all in prof.groupby(["model", "prompt_set", "quantity"], sort=False):
        g = g_all[g_all["shape"].notna()]
        if g.empty:
            prof.loc[g_all.index, "shape_verdict"] = "none (no estimator has a profile)"
            continue
        for i, r in g.iterrows():
            ok = g[(g["shape"] == r["shape"]) & ((g.peak_relative_depth - r.peak_relative_depth).abs() <= peak_depth_tol)]
            prof.at[i, "agrees_with"] = ";".join(sorted(ok.estimator))
        agree = bool(g["shape"].nunique() == 1 and np.ptp(g.peak_relative_depth.to_numpy()) <= peak_depth_tol)
        prof.loc[g_all.index, "n_estimators"] = len(g)
        prof.loc[g_all.index, "estimators_agree"] = agree
        prof.loc[g_all.index, "shape_verdict"] = g["shape"].iloc[0] if agree else "none (estimators disagree)"
    prof["peak_depth_tol"] = peak_depth_tol
    return prof


def id_profile_table(id_table: pd.DataFrame, *, shape_tol: float, profile_layers: str,
                     peak_depth_tol: float, ci: float) -> pd.DataFrame:
    """Shape of the intrinsic-dimension profile over depth, per model, prompt set, quantity and estimator.

    Args:
        id_table: rows of ``intrinsic_dimension.csv`` and ``id_last_token.csv`` (columns model, prompt_set,
            quantity (:data:`llmgeom.core.tables.QUANTITIES`; absent = "token_id"), estimator, layer, relative_depth, d_model, id_mean,
            optional id_mean_replicates, ...).
        shape_tol: see :func:`llmgeom.measures.intrinsic_dimension.id_profile_shape`.
        profile_layers: "blocks": the outputs of blocks 1..L; "all": also layer 0, the token
            embeddings, whose points are a discrete set (one per vocabulary entry seen, many exact
            duplicates) and whose ID often exceeds every hidden layer's, which would hide the shape
            of the hidden-layer profile.
        peak_depth_tol: two estimators agree when their shapes are equal and their peak relative depths
            differ by at most this much.
        ci: coverage of the intervals (schema key ``intrinsic_dimension.ci``).

    Returns:
        DataFrame, one row per (model, prompt_set, quantity, estimator) (:data:`llmgeom.core.tables.TABLE_KEYS`):
        n_layers (blocks), d_model,
        peak_layer, peak_relative_depth, peak_id, peak_id_over_d_model, trough_layer,
        trough_relative_depth, trough_id, embedding_id (layer 0, reported even when excluded),
        first_id (first layer of the profile), final_id (last block), mean_id (over the profile),
        spearman_depth (ID vs depth; NaN for a constant profile), shape ("rise-then-fall", "fall-then-rise",
        "increasing", "decreasing", "flat"), shape_tol, embeddings_included (True: layer 0 is part of the
        profile), id_iso / id_over_d_model_iso (the estimator on isotropic Gaussian points of the last block's n
        and d, and over d_model: the data-level null; NaN for last-token rows), note ("" or why there is no
        profile: an estimator with fewer than two measured layers, e.g. too few distinct points, gets a row with
        NaN values and the reason); for peak_id, peak_id_over_d_model, peak_relative_depth and final_id
        (:data:`PROFILE_INTERVAL_COLUMNS`) ``<col>_lo`` / ``<col>_hi`` / ``<col>_replicates``: the statistic on
        the profile of each passage half-sample (replicate b of a profile = the ``id_mean_replicates`` b of its
        layers, recentred on id_mean, :func:`intrinsic_dimension_table`; so replicate b of every column comes
        from the same passages) and the basic interval at coverage ``ci``
        (:func:`llmgeom.core.stats.bootstrap_interval`; peak_relative_depth clipped to [0, 1]); shape_replicates
        (the shape label of each replicate profile, space-separated), n_resamples (replicate profiles with a
        value at every layer), interval (what lo / hi are: passage half-samples for token positions, prompt
        half-samples for the last token; "" without replicates: a run with ``passage_resamples: 0``), ci; agrees_with (';'-joined estimators
        of the same model, prompt set and quantity with the same shape and a peak depth within
        ``peak_depth_tol``, this one included), n_estimators (those with a profile), estimators_agree (all of
        them agree), shape_verdict (the common shape when they agree, else "none (estimators disagree)"; "none
        (no estimator has a profile)"), peak_depth_tol; beside peak_id, peak_relative_depth and peak_id_over_d_model the
        published values (``*_published``, ``*_published_on``; ``llmgeom/data/published.yaml``): LSM's for
        token_id rows, Cheng, Vaidya & Antonello's GRIDE peaks for the last_token_id GRIDE rows, "" elsewhere.
        Relative depth = layer / L for residual-stream layer l (output of block l; 0 = embeddings).

    Source: LSM (universal ID profile over relative depth); Cheng, Vaidya & Antonello (ICML 2026);
    DESIGN.md sec. 3.
    """
    if profile_layers not in ("blocks", "all"):
        raise ValueError(f"profile_layers must be 'blocks' or 'all', got {profile_layers!r}")
    if "quantity" not in id_table.columns:
        id_table = id_table.assign(quantity=TOKEN_ID)
    rows = []
    for (model, pset, qty, est), g in id_table.groupby(["model", "prompt_set", "quantity", "estimator"], sort=True):
        g = g.sort_values("layer")
        emb = g[g.layer == 0].id_mean
        n_layers = int(g.layer.max())
        if profile_layers == "blocks" and n_layers >= 2:
            g = g[g.layer > 0]
        d_model = int(g.d_model.iloc[0])
        key = dict(model=model, prompt_set=pset, quantity=qty, estimator=est, n_layers=n_layers, d_model=d_model)
        g = g[np.isfinite(g.id_mean)]  # layers with too few distinct points (their rows say why in `note`)
        if len(g) < 2:  # no profile without two measured layers: a row that says so
            rows.append(dict(key, embedding_id=float(emb.iloc[0]) if len(emb) else np.nan, shape_tol=shape_tol,
                             note=f"no profile: {len(g)} measured layer(s) ({'blocks' if profile_layers == 'blocks' else 'all'}"
                                  " with a finite id_mean), at least 2 needed"))
            continue
        s = intrinsic_dimension.id_profile_shape(g.relative_depth.to_numpy(), g.id_mean.to_numpy(), tol=shape_tol)
        lay = g.layer.to_numpy()
        row = dict(
            **key,
            peak_layer=int(lay[s["peak_index"]]), peak_relative_depth=s["peak_depth"], peak_id=s["peak_id"],
            peak_id_over_d_model=s["peak_id"] / d_model,
            trough_layer=int(lay[s["trough_index"]]), trough_relative_depth=s["trough_depth"],
            trough_id=s["trough_id"], embedding_id=float(emb.iloc[0]) if len(emb) else np.nan,
            first_id=s["first_id"], final_id=s["last_id"], mean_id=float(g.id_mean.mean()),
            spearman_depth=s["spearman_depth"], shape=s["shape"], shape_tol=shape_tol,
            embeddings_included=bool(lay.min() == 0), note="",
            id_iso=float(g.id_iso.max()) if "id_iso" in g else np.nan,
            id_over_d_model_iso=float(g.id_iso.max()) / d_model if "id_iso" in g else np.nan)
        rows.append(dict(row, **_profile_intervals(g, row, d_model=d_model, shape_tol=shape_tol, ci=ci)))
    prof = pd.DataFrame(rows).reindex(columns=_PROFILE_COLUMNS).astype({"peak_layer": "Int64", "trough_layer": "Int64"})
    for c in [f"{c}_replicates" for c in PROFILE_INTERVAL_COLUMNS] + ["shape_replicates", "interval"]:
        prof[c] = prof[c].astype(object).fillna("")
    prof["n_resamples"] = prof["n_resamples"].fillna(0).astype(int)
    prof["ci"] = ci
    prof = _agreement(prof, peak_depth_tol)
    cols = list(add_published(prof.head(0), ID_PROFILE_PUBLISHED).columns)
    last_gride = (prof.quantity == LAST_TOKEN_ID) & (prof.estimator == "gride")
    parts = [add_published(prof[prof.quantity == TOKEN_ID], ID_PROFILE_PUBLISHED),
             add_published(prof[last_gride], ID_PROFILE_PUBLISHED_LAST_TOKEN_GRIDE),
             prof[(prof.quantity != TOKEN_ID) & ~last_gride]]
    out = pd.concat([p for p in parts if len(p)], ignore_index=True).reindex(columns=cols)
    pub = [c for c in cols if c.endswith(("_published", "_published_on"))]
    out[pub] = out[pub].fillna("")
    return out


def _profile_intervals(g: pd.DataFrame, row: dict, *, d_model: int, shape_tol: float, ci: float) -> dict:
    """The interval columns of one profile (:data:`PROFILE_INTERVAL_COLUMNS`) from its layers'
    ``id_mean_replicates`` (replicate b of every layer: the same passage half-sample); {} without replicates."""
    if "id_mean_replicates" not in g:
        return {}
    reps = [parse_replicates(t) for t in g["id_mean_replicates"]]
    n_b = {r.size for r in reps}
    if len(n_b) != 1 or not n_b.pop():
        return {}
    R = np.vstack(reps)  # [layers, resamples]
    depth = g.relative_depth.to_numpy()
    stats = {c: [] for c in PROFILE_INTERVAL_COLUMNS}
    shapes = []
    for b in range(R.shape[1]):
        if not np.isfinite(R[:, b]).all():
            for c in stats:
                stats[c].append(np.nan)
            shapes.append("nan")
            continue
        sb = intrinsic_dimension.id_profile_shape(depth, R[:, b], tol=shape_tol)
        for c, v in (("peak_id", sb["peak_id"]), ("peak_id_over_d_model", sb["peak_id"] / d_model),
                     ("peak_relative_depth", sb["peak_depth"]), ("final_id", sb["last_id"])):
            stats[c].append(v)
        shapes.append(sb["shape"])
    out = {"shape_replicates": " ".join(shapes), "n_resamples": int(sum(s != "nan" for s in shapes)),
           "interval": PASSAGE_INTERVAL}
    for c, v in stats.items():
        bounds = (0.0, 1.0) if c == "peak_relative_depth" else (0.0, np.inf)
        out[f"{c}_lo"], out[f"{c}_hi"] = bootstrap_interval(row[c], v, ci=ci, method="basic", bounds=bounds)
        out[f"{c}_replicates"] = replicates_text(v)
    return out




def _linear_dimensions(pts) -> dict:
    """Participation ratio and number of PCs for 99% of the variance of centred (not z-scored) points."""
    ratios = explained_variance(pts, standardize=False)
    return {"participation_ratio": participation_ratio(ratios),
            "n_pc99": int(min(np.searchsorted(np.cumsum(ratios), N_PC_VARIANCE) + 1, ratios.size))}


def _id_rows(pts, *, estimators, n_subsamples, subsample_size, seed, min_points, mle_k, gride_max_rank,
             gride_plateau_tol, base: dict, scale_rows: list, neighbours=None) -> tuple[list, int]:
    """Rows of one layer (all estimators, one neighbour graph per subset, read off ``neighbours`` when given: the
    layer's list from :func:`llmgeom.measures.intrinsic_dimension.passage_resampled_ids`) and GRIDE's scale curve."""
    res = intrinsic_dimension.id_subsamples(pts, estimator=estimators, n_subsamples=n_subsamples,
                                 subsample_size=subsample_size, seed=seed, min_points=min_points, mle_k=mle_k,
                                 gride_max_rank=gride_max_rank, plateau_tol=gride_plateau_tol, neighbours=neighbours)
    lin = _linear_dimensions(pts)
    rows = []
    for est, r in res.items():
        rows.append(dict(base, estimator=est, n=r["n_points"], n_duplicates_removed=r["n_duplicates_removed"],
                         n_subsamples=r["n_subsamples"], subsample_size=subsample_size,
                         subsample_size_used=r["subsample_size"], id_mean=r["id_mean"], id_std=r["id_std"],
                         id_min=r["id_min"], id_max=r["id_max"], id_over_d_model=r["id_mean"] / base["d_model"],
                         mle_k=mle_k if est.startswith("mle") else None, **lin))
        if est == "gride":
            curves = np.asarray([x["ids"] for x in r["results"]], dtype=np.float64)  # [subsets, scales]
            n1 = r["results"][0]["n1"]
            mean = curves.mean(axis=0)
            i, j, val = intrinsic_dimension.gride_plateau(mean, tol=gride_plateau_tol)
            for s_, (n, v, sd) in enumerate(zip(n1, mean, curves.std(axis=0))):
                scale_rows.append(dict(base, n1=n, n2=2 * n, id_mean=float(v), id_std=float(sd),
                                       in_plateau=i <= s_ <= j, plateau_n1_min=n1[i], plateau_n1_max=n1[j],
                                       plateau_id=val, plateau_tol=gride_plateau_tol, max_rank=gride_max_rank))
    return rows, min(r["subsample_size"] for r in res.values())


def _flag_disagreement(df: pd.DataFrame, disagreement_factor: float) -> pd.DataFrame:
    g = df.groupby(["quantity", "layer"]).id_mean
    ratio = g.transform("max") / g.transform("min")
    df["estimator_ratio"] = ratio.where(df.groupby(["quantity", "layer"]).estimator.transform("nunique") > 1)
    df["estimators_disagree"] = df.estimator_ratio > disagreement_factor
    df["disagreement_factor"] = disagreement_factor
    return df


def intrinsic_dimension_table(h5_path, *, model: str, estimators, n_subsamples: int, subsample_size: int, seed: int,
                              min_points: int, mle_k: int, disagreement_factor: float, gride_max_rank: int,
                              gride_plateau_tol: float, passage_resamples: int, ci: float,
                              return_scale: bool = False):
    """Intrinsic dimension of the residual stream per layer at sampled corpus tokens.

    Points: ``tokens/residual_sample`` [n_sample, L+1, d_model] (position 0 excluded at
    extraction), float64, exact duplicates removed and counted. Layer 0 = embeddings,
    layer l = output of block l. Every estimator sees the same subsamples (same seed) and, within a
    subsample, the same exact neighbour graph (:func:`llmgeom.measures.intrinsic_dimension.id_estimates`).

    Passages: ``tokens/sample_prompt`` (the passage of each sampled position). Beside each estimator's rows
    (quantity "token_id"), TwoNN with each point's two nearest neighbours taken among the points of OTHER passages
    (quantity "token_id_cross_passage", estimator "twonn", on the same subsets): positions of one passage are
    correlated, and this tests whether the token ID is an artefact of same-passage neighbours. Intervals: passage
    half-samples (:func:`llmgeom.measures.intrinsic_dimension.passage_resampled_ids`: half of the passages drawn
    without replacement, ``passage_resamples`` times, the same draws at every layer; not the bootstrap, whose
    repeated passages duplicate points and give zero neighbour distances), each estimator on all points of the kept
    passages, recentred on id_mean (:func:`llmgeom.measures.intrinsic_dimension.recentred_replicates`).

    Returns:
        DataFrame with model, prompt_set, quantity ("token_id", "token_id_cross_passage"), estimator ("twonn"; "mle_mg" = MLE with
        MacKay-Ghahramani's harmonic mean, skdim's default; "mle_lb" = MLE with Levina-Bickel's arithmetic mean;
        "gride" = the plateau of GRIDE's scale curve, Denti et al. 2022), layer, relative_depth
        (layer / L = (block index + 1) / L: the one convention of every table), d_model,
        n (distinct points), n_duplicates_removed, n_subsamples, subsample_size (requested),
        subsample_size_used (= n when fewer distinct points exist; then a warning), id_mean, id_std, id_min,
        id_max, id_over_d_model, mle_k (neighbours of MLE; empty otherwise), participation_ratio and n_pc99
        (linear dimensions of all distinct points of the layer: PR of the PCA spectrum of the centred points,
        PCs for 99% of the variance; :mod:`llmgeom.measures.pca`), estimator_ratio (largest / smallest id_mean
        over the estimators at that layer; NaN with one estimator), estimators_disagree (estimator_ratio >
        disagreement_factor), disagreement_factor, id_iso / id_shuffled (at the last block only, NaN elsewhere: the
        estimator on isotropic Gaussian points / on the points with every coordinate shuffled, same n and d; the
        data-level nulls; NaN on token_id_cross_passage rows), id_mean_lo / id_mean_hi / id_mean_replicates (the
        passage half-sample replicates recentred on id_mean and their basic interval at coverage ``ci``; GRIDE's replicate is the
        plateau of each half-sample's own scale curve; NaN / "" with ``passage_resamples: 0``), n_passages, passages_per_resample, passage_resamples,
        interval, ci. With ``return_scale`` also GRIDE's scale curve
        (:func:`gride_scale_columns`; empty without "gride"): ``(table, scale_table)``.

    Raises:
        StoreError: untrusted file. intrinsic_dimension.TooFewPointsError: too few distinct points in a layer.
        ValueError: fewer than 2 passages.

    ``passage_resamples`` (schema key ``intrinsic_dimension.passage_resamples``): half-samples (0: no intervals).
    ``gride_max_rank`` and ``gride_plateau_tol``: see :func:`llmgeom.measures.intrinsic_dimension.gride_scaling`.
    """
    estimators = list(dict.fromkeys(intrinsic_dimension.canonical_estimator(e) for e in estimators))  # 'mle' = 'mle_mg'
    rows, scale, short = [], [], []
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        X = f[DS.TOKENS_RESIDUAL_SAMPLE]
        n_layers = X.shape[1] - 1
        d_model = X.shape[2]
        passages = np.asarray(f[DS.TOKENS_SAMPLE_PROMPT][()])
        for layer in range(n_layers + 1):
            pts = read_finite(f, DS.TOKENS_RESIDUAL_SAMPLE, layer=layer)
            base = dict(model=model, prompt_set=a.get("prompt_set"), quantity=TOKEN_ID, layer=layer,
                        relative_depth=relative_depth(layer, n_layers, index="residual"), d_model=d_model)
            pr = intrinsic_dimension.passage_resampled_ids(
                pts, passages, estimators=estimators, n_subsamples=n_subsamples, subsample_size=subsample_size,
                seed=seed, n_resamples=passage_resamples, min_points=min_points, mle_k=mle_k,
                gride_max_rank=gride_max_rank, plateau_tol=gride_plateau_tol)
            r, used = _id_rows(pts, estimators=estimators, n_subsamples=n_subsamples, subsample_size=subsample_size,
                               seed=seed, min_points=min_points, mle_k=mle_k, gride_max_rank=gride_max_rank,
                               gride_plateau_tol=gride_plateau_tol, base=base, scale_rows=scale,
                               neighbours=pr["neighbour_list"])
            r += _passage_rows(r, pr, passage_resamples=passage_resamples, ci=ci)
            rows += r
            if used < subsample_size and not short:
                short.append(layer)
                import warnings

                warnings.warn(f"{h5_path}: layer {layer} has only {r[0]['n']} distinct points, fewer than "
                              f"intrinsic_dimension.subsample_size={subsample_size}: every subsample is all of "
                              "them (id_std = 0; column subsample_size_used). Extract more corpus positions "
                              "(prompts.sets.<corpus>.n, extract.sample_per_prompt) for a spread", stacklevel=2)
        # data-level nulls at the last block, same n and d: isotropic Gaussian, each coordinate shuffled
        nulls = _id_nulls(pts, estimators=estimators, n_subsamples=n_subsamples, subsample_size=subsample_size,
                          seed=seed, min_points=min_points, mle_k=mle_k, gride_max_rank=gride_max_rank,
                          gride_plateau_tol=gride_plateau_tol)
    df = _flag_disagreement(pd.DataFrame(rows), disagreement_factor)
    for c in ("id_iso", "id_shuffled"):
        df[c] = np.nan
    last = (df.layer == df.layer.max()) & (df.quantity == TOKEN_ID)
    for est, (iso, shuf) in nulls.items():
        df.loc[last & (df.estimator == est), ["id_iso", "id_shuffled"]] = iso, shuf
    df["id_mean_replicates"] = df["id_mean_replicates"].fillna("")
    df["interval"] = df["interval"].fillna("")
    return (df, pd.DataFrame(scale, columns=gride_scale_columns())) if return_scale else df


def _passage_rows(rows: list, res: dict, *, passage_resamples, ci) -> list:
    """The cross-passage TwoNN row of one layer, and the passage half-sample interval columns written into
    ``rows`` (this layer's token_id rows), from ``res``, the layer's
    :func:`llmgeom.measures.intrinsic_dimension.passage_resampled_ids` (one neighbour list for all). Returns the new
    rows."""
    cp = res[intrinsic_dimension.CROSS_PASSAGE]
    twonn_row = next((r for r in rows if r["estimator"] == "twonn"), rows[0])
    new = [dict(twonn_row, quantity=TOKEN_ID_CROSS_PASSAGE, estimator="twonn", n=cp["n_points"],
                n_subsamples=cp["n_subsamples"], subsample_size_used=cp["subsample_size"], id_mean=cp["id_mean"],
                id_std=cp["id_std"], id_min=cp["id_min"], id_max=cp["id_max"],
                id_over_d_model=cp["id_mean"] / twonn_row["d_model"], mle_k=None)]
    _write_intervals([(r, r["estimator"]) for r in rows] + [(new[0], intrinsic_dimension.CROSS_PASSAGE)], res,
                     passage_resamples=passage_resamples, ci=ci, interval=PASSAGE_INTERVAL)
    return new


def _write_intervals(rows_names, res: dict, *, passage_resamples, ci, interval: str) -> None:
    """Write into each (row, estimator name) the half-sample columns of
    :func:`llmgeom.measures.intrinsic_dimension.passage_resampled_ids`' result ``res``: n_passages,
    passages_per_resample, passage_resamples, ci, and id_mean_lo / id_mean_hi / id_mean_replicates / interval
    (the replicates recentred on the row's id_mean and their basic interval; NaN / "" without replicates)."""
    meta = dict(n_passages=res["n_passages"], passages_per_resample=res["passages_per_resample"],
                passage_resamples=int(passage_resamples), ci=ci)
    for r, name in rows_names:
        r.update(meta)
        raw = res["replicates"].get(name)
        if raw is None or not len(raw):
            r.update(id_mean_lo=np.nan, id_mean_hi=np.nan, id_mean_replicates="", interval="")
            continue
        rep = intrinsic_dimension.recentred_replicates(r["id_mean"], raw)
        lo, hi = bootstrap_interval(r["id_mean"], rep, ci=ci, method="basic", bounds=(0.0, np.inf))
        r.update(id_mean_lo=lo, id_mean_hi=hi, id_mean_replicates=replicates_text(rep), interval=interval)


def _id_nulls(pts, *, seed: int, **kw) -> dict:
    """estimator -> (ID of isotropic Gaussian points, ID of ``pts`` with every coordinate shuffled across points),
    both of the same shape as the distinct points of ``pts`` (what noise of the same n and d reads);
    (NaN, NaN) where an estimator cannot run."""
    from llmgeom.measures.neighbors import deduplicate

    X = deduplicate(np.asarray(pts, np.float64))[0]
    rng = np.random.default_rng([seed, 28])
    iso = rng.standard_normal(X.shape)
    shuf = np.take_along_axis(X, rng.random(X.shape).argsort(axis=0), axis=0)
    out = {}
    try:
        ri = intrinsic_dimension.id_subsamples(iso, estimator=kw["estimators"], n_subsamples=kw["n_subsamples"],
                                    subsample_size=kw["subsample_size"], seed=seed, min_points=kw["min_points"],
                                    mle_k=kw["mle_k"], gride_max_rank=kw["gride_max_rank"],
                                    plateau_tol=kw["gride_plateau_tol"])
        rs = intrinsic_dimension.id_subsamples(shuf, estimator=kw["estimators"], n_subsamples=kw["n_subsamples"],
                                    subsample_size=kw["subsample_size"], seed=seed, min_points=kw["min_points"],
                                    mle_k=kw["mle_k"], gride_max_rank=kw["gride_max_rank"],
                                    plateau_tol=kw["gride_plateau_tol"])
    except intrinsic_dimension.TooFewPointsError:
        return {e: (np.nan, np.nan) for e in kw["estimators"]}
    return {e: (ri[e]["id_mean"], rs[e]["id_mean"]) for e in ri}


def gride_scale_columns() -> list:
    """Columns of ``gride_scale.csv``: model, prompt_set, quantity (token_id / last_token_id), layer, relative_depth, d_model, n1, n2
    (neighbour orders; n2 = 2 n1), id_mean / id_std (GRIDE at that scale over the subsamples), in_plateau,
    plateau_n1_min, plateau_n1_max, plateau_id (plateau of the mean curve:
    :func:`llmgeom.measures.intrinsic_dimension.gride_plateau`), plateau_tol, max_rank."""
    return ["model", "prompt_set", "quantity", "layer", "relative_depth", "d_model", "n1", "n2", "id_mean", "id_std",
            "in_plateau", "plateau_n1_min", "plateau_n1_max", "plateau_id", "plateau_tol", "max_rank"]


def last_token_id_table(h5_path, *, model: str, estimators, min_points: int, mle_k: int, disagreement_factor: float,
                        gride_max_rank: int, gride_plateau_tol: float, seed: int, passage_resamples: int, ci: float):
    """Intrinsic dimension of the last-token residual states over prompts, per layer (Cheng et al.'s points).

    Points: ``last_token/residual`` [n_prompts, L+1, d_model] of a prompt set (the default study: ``mixed``),
    one point per prompt, all of them (one "subsample"), float64, duplicates removed.

    Intervals: half-samples of the prompts (each prompt is its own unit: ``passage_resamples`` draws of half of
    them without replacement, the same draws at every layer; :func:`llmgeom.measures.intrinsic_dimension.passage_resampled_ids`
    with one passage per prompt), every estimator (GRIDE: the plateau of each half-sample's scale curve) on the
    kept prompts' points, recentred on id_mean; interval = :data:`PROMPT_INTERVAL`.

    Returns:
        ``(table, scale_table)``: the columns of :func:`intrinsic_dimension_table` with quantity = "last_token_id"
        (n_subsamples = 1, id_std = 0; no cross-passage rows; n_passages = distinct prompts of the layer), and
        GRIDE's scale curve (:func:`gride_scale_columns`).

    Raises:
        StoreError: untrusted file. KeyError: no ``last_token/residual``. A layer with fewer distinct points than
        ``min_points`` (e.g. layer 0: the final tokens' embeddings) gets NaN IDs and the reason in ``note``.

    Source: Cheng, Vaidya & Antonello (ICML 2026): GRIDE on last-token states.
    """
    estimators = list(dict.fromkeys(intrinsic_dimension.canonical_estimator(e) for e in estimators))
    rows, scale = [], []
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        if DS.LAST_TOKEN_RESIDUAL not in f:
            raise KeyError(f"{h5_path} has no last_token/residual: the last-token ID needs a prompt set with "
                           "last-token states (rerun rule extract)")
        n_prompts, n_layers, d_model = f[DS.LAST_TOKEN_RESIDUAL].shape
        n_layers -= 1
        for layer in range(n_layers + 1):
            pts = read_finite(f, DS.LAST_TOKEN_RESIDUAL, layer=layer)
            base = dict(model=model, prompt_set=a.get("prompt_set"), quantity=LAST_TOKEN_ID, layer=layer,
                        relative_depth=relative_depth(layer, n_layers, index="residual"), d_model=d_model)
            try:
                res = intrinsic_dimension.passage_resampled_ids(
                    pts, np.arange(len(pts)), estimators=estimators, n_subsamples=1, subsample_size=len(pts),
                    seed=seed, n_resamples=passage_resamples, min_points=min_points, mle_k=mle_k,
                    gride_max_rank=gride_max_rank, plateau_tol=gride_plateau_tol, cross_passage=False)
                r = _id_rows(pts, estimators=estimators, n_subsamples=1, subsample_size=n_prompts, seed=seed,
                             min_points=min_points, mle_k=mle_k, gride_max_rank=gride_max_rank,
                             gride_plateau_tol=gride_plateau_tol, base=base, scale_rows=scale,
                             neighbours=res["neighbour_list"])[0]
                _write_intervals([(x, x["estimator"]) for x in r], res, passage_resamples=passage_resamples, ci=ci,
                                 interval=PROMPT_INTERVAL)
                rows += r
            except TooFewPointsError as e:
                # e.g. layer 0 (the embeddings of the final token): as many distinct points as final tokens
                n_distinct = int(len(np.unique(pts, axis=0)))
                rows += [dict(base, estimator=est, n=n_distinct, id_mean=np.nan, id_std=np.nan, id_min=np.nan,
                              id_max=np.nan, id_over_d_model=np.nan, note=f"too few distinct points: {e}")
                         for est in estimators]
    df = pd.DataFrame(rows)
    df["note"] = df["note"].fillna("") if "note" in df.columns else ""
    for c in ("id_mean_replicates", "interval"):
        df[c] = df[c].fillna("") if c in df.columns else ""
    return _flag_disagreement(df, disagreement_factor), pd.DataFrame(scale, columns=gride_scale_columns())
