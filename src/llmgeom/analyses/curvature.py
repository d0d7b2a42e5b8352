"""curvature.csv: the LSM local-PCA curvature proxy per residual-stream layer (LSM sec. 13.3), m = the
layer's rounded ID from intrinsic_dimension.csv. HDF5 in, table out; never torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.core.layers import relative_depth
from llmgeom.core.stats import derived_seed, weighted_mean_interval
from llmgeom.core.store import DS, attrs_dict, open_activations, read_finite
from llmgeom.measures.curvature import local_pca_residuals
from llmgeom.measures.neighbors import deduplicate


def known_geometry_references(n: int, d: int, m: int, k: int, *, seed: int = 0) -> dict:
    """The curvature proxy on clouds of known geometry at the same n, d, m and k (the nulls of
    ``smooth_low_curvature``).

    * ``curvature_flat``: n points uniform in an m-dimensional unit cube, rotated into R^d (a flat subspace):
      the known answer is 0 (to rounding);
    * ``curvature_sphere``: n points uniform on the unit sphere S^m in R^(m+1), rotated into R^d (curvature 1,
      radius 1): the known answer is > 0, growing like (rho / R)^2 with the neighbourhood radius rho; a proxy that
      reads it near 0 cannot tell this sphere from flat at this n and k;
    * ``curvature_iso``: n i.i.d. N(0, I_d) points (no manifold at all).

    Args:
        n: points; d: ambient dimension; m: the local dimension kept (the measured ID, rounded); k: neighbours.

    Returns:
        dict of the three mean proxies (fractions of local variance outside the top-m local PCA directions, 0..1).

    Raises:
        ValueError: m >= d, or k >= n (as :func:`llmgeom.measures.curvature.local_pca_residuals`).

    Source: LSM sec. 13.3 (curvature proxy).
    """
    if not 1 <= m < d:
        raise ValueError(f"known-geometry clouds need 1 <= m < d, got m={m}, d={d}")
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((d, m + 1)))[0]  # orthonormal [d, m+1]
    flat = rng.uniform(size=(n, m)) @ Q[:, :m].T
    g = rng.standard_normal((n, m + 1))
    sphere = (g / np.linalg.norm(g, axis=1, keepdims=True)) @ Q.T
    iso = rng.standard_normal((n, d))
    return {f"curvature_{name}": local_pca_residuals(X, k=k, m=m)["curvature_mean"]
            for name, X in (("flat", flat), ("sphere", sphere), ("iso", iso))}


def curvature_table(h5_path, id_table: pd.DataFrame, *, model: str, k: int, id_estimator: str, n_points: int,
                    seed: int, min_points: int, n_boot: int, ci: float) -> pd.DataFrame:
    """Curvature proxy (local PCA residual variance) of the residual stream per layer.

    Points: ``tokens/residual_sample[:, layer]`` (float64, duplicates removed), a seeded subset
    of ``n_points`` (the same subset for every layer). m = the ID estimate of ``id_estimator``
    for that layer (``id_mean`` in ``intrinsic_dimension.csv``), rounded, at least 1. If m >= k
    the neighbourhood cannot show curvature, so k is raised to 2 m for that layer; k is lowered to
    the number of distinct points - 1 when fewer exist (both recorded in ``k``, ``k_adjusted`` and
    ``note``). A layer with fewer than ``min_points`` distinct points (or k <= m after lowering)
    gets NaN values and a note instead of an error (typically the embedding layer, a discrete set).

    Interval of curvature_mean: a bootstrap over passages (``tokens/sample_prompt``, the passage of each sampled
    position; positions of one passage are not independent): the passages of the subset drawn with replacement
    ``n_boot`` times (:class:`llmgeom.measures.margins.PassageBootstrap`, seed ``derived_seed(seed, "passages")``),
    the same resamples at every layer, so replicate b of every layer comes from the same drawn passages. Each
    anchor keeps its passage through the deduplication (an anchor is the first of its duplicate rows,
    ``anchor_rows`` of :func:`llmgeom.measures.curvature.local_pca_residuals`); replicate b is the mean of the
    per-anchor residual fractions, each anchor repeated as often as its passage was drawn
    (:func:`llmgeom.core.stats.weighted_mean_interval`). The neighbourhoods are not recomputed on a resample:
    the interval covers the choice of passages among the anchors, not the neighbour search. A file without
    ``tokens/sample_prompt`` resamples the anchors as if independent (``boot_unit`` "anchors").

    Args:
        h5_path: corpus activation file; id_table: intrinsic_dimension.csv. k, id_estimator, n_points, seed,
            min_points, n_boot (0: no interval), ci: schema keys ``curvature.*``.

    Returns:
        DataFrame: model, prompt_set, layer, relative_depth (layer / L), d_model, id_estimator,
        id_used (the unrounded ID), m, k, k_adjusted, n (distinct points), n_duplicates_removed,
        n_anchors, curvature_mean, curvature_median, curvature_std, curvature_q25, curvature_q75
        (fractions of local variance outside the top-m local PCA directions, 0..1), curvature_mean_lo /
        curvature_mean_hi (basic bootstrap interval, clipped to [0, 1]), curvature_mean_bc (bias-corrected),
        curvature_mean_replicates (:func:`llmgeom.core.stats.replicates_text`; "" with n_boot = 0 or a too-few
        layer), boot_unit ("passages" or "anchors"), n_boot, note, and at the layer of the
        largest curvature_mean (NaN elsewhere) the known-geometry references curvature_flat (known answer 0),
        curvature_sphere (> 0) and curvature_iso of :func:`known_geometry_references` at that layer's n, d, m, k.

    Raises:
        StoreError: untrusted file. ValueError: no ID row for a layer. TooFewPointsError.

    Source: LSM sec. 13.3 (curvature proxy); DESIGN.md sec. 3.
    """
    from llmgeom.core.tables import TOKEN_ID
    from llmgeom.measures.intrinsic_dimension import canonical_estimator
    from llmgeom.measures.margins import PassageBootstrap

    id_estimator = canonical_estimator(id_estimator)
    sel = (id_table.model == model) & (id_table.estimator == id_estimator)
    if "quantity" in id_table.columns:  # the token ID of these points (not the cross-passage or last-token one)
        sel &= id_table.quantity == TOKEN_ID
    ids = id_table[sel].set_index("layer")
    if ids.empty:
        raise ValueError(f"intrinsic_dimension table has no {id_estimator!r} rows for model {model!r}; "
                         "add the estimator to intrinsic_dimension.estimators")
    rows = []
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        X = f[DS.TOKENS_RESIDUAL_SAMPLE]
        n_total, n_layers = X.shape[0], X.shape[1] - 1
        d_model = X.shape[2]
        rng = np.random.default_rng(seed)
        sel = np.sort(rng.choice(n_total, size=n_points, replace=False)) if n_points < n_total else np.arange(n_total)
        data = read_finite(f, DS.TOKENS_RESIDUAL_SAMPLE, sel if sel.size < n_total else None)
        passages = f[DS.TOKENS_SAMPLE_PROMPT][()][sel] if DS.TOKENS_SAMPLE_PROMPT in f else None
        boot = PassageBootstrap(passages, sel.size, n_boot=n_boot, seed=derived_seed(seed, "passages"))
        weights = np.array(list(boot), np.float64).reshape(len(boot), sel.size)  # [n_boot, n_points]
        unit = "passages" if passages is not None else "anchors"
        for layer in range(n_layers + 1):
            if layer not in ids.index:
                raise ValueError(f"no {id_estimator} intrinsic dimension for layer {layer} of {model}")
            id_used = float(ids.loc[layer, "id_mean"])
            m = max(1, int(round(id_used)))
            pts = data[:, layer, :]
            n_distinct = deduplicate(pts)[0].shape[0]
            k_used, note = k, ""
            if m >= k_used:
                k_used, note = 2 * m, f"k raised to 2m (m={m} >= k={k})"
            if k_used > n_distinct - 1:
                k_used, note = n_distinct - 1, f"k lowered to n_distinct - 1 ({n_distinct} distinct points)"
            row = dict(model=model, prompt_set=a.get("prompt_set"), layer=layer, relative_depth=relative_depth(layer, n_layers, index="residual"),
                       d_model=d_model, id_estimator=id_estimator, id_used=id_used, m=m, k=k_used,
                       k_adjusted=k_used != k, n=n_distinct, n_duplicates_removed=pts.shape[0] - n_distinct,
                       boot_unit=unit, n_boot=int(n_boot))
            cols = ("curvature_mean", "curvature_median", "curvature_std", "curvature_q25", "curvature_q75")
            if n_distinct < min_points or k_used <= m:
                # e.g. the embedding layer of a tiny vocabulary: a handful of distinct token vectors
                note = f"too few distinct points ({n_distinct}; min_points={min_points}, m={m})"
                rows.append(dict(row, n_anchors=0, **{c: np.nan for c in cols},
                                 **weighted_mean_interval("curvature_mean", [], np.empty((0, 0)), ci=ci), note=note))
                continue
            r = local_pca_residuals(pts, k=k_used, m=m, min_points=min_points)
            iv = weighted_mean_interval("curvature_mean", r["values"], weights[:, r["anchor_rows"]], ci=ci,
                                        bounds=(0.0, 1.0))
            rows.append(dict(row, n=r["n_points"], n_duplicates_removed=r["n_duplicates_removed"],
                             n_anchors=r["n_anchors"], **{c: r[c] for c in cols}, **iv, note=note))
    df = pd.DataFrame(rows)
    for c in _REFERENCES:
        df[c] = np.nan
    v = pd.to_numeric(df.curvature_mean, errors="coerce")
    if v.notna().any():  # the references at the layer the claim decides on (the largest proxy)
        i = v.idxmax()
        r = df.loc[i]
        if int(r.m) < d_model:
            ref = known_geometry_references(int(r.n), d_model, int(r.m), int(r.k), seed=seed)
            for c, x in ref.items():
                df.loc[i, c] = x
    return df


_REFERENCES = ("curvature_flat", "curvature_sphere", "curvature_iso")
