"""Local-PCA curvature proxy (LSM sec. 13.3): the fraction of local variance outside the top-m local
PCA directions of each point's k-neighbourhood.

May import: numpy. Nothing of llmgeom but llmgeom.core and llmgeom.measures.
"""

from __future__ import annotations

import numpy as np

from llmgeom.measures.neighbors import CHUNK_BYTES, GRAM_MAX_POINTS, prepare_neighbors

# --------------------------------------------------------------------------------------------
# Curvature proxy and ID profile shape (LSM sec. 13.3)
# --------------------------------------------------------------------------------------------


def local_pca_residuals(X, *, k: int, m: int, n_anchors: int | None = None, seed: int = 0,
                        min_points: int | None = None, chunk: int | None = None) -> dict:
    """Curvature proxy: fraction of local variance outside the top-``m`` local PCA directions.

    For each anchor point x the neighbourhood is x and its ``k`` nearest neighbours (k + 1 points,
    exact Euclidean distances in float64 after removing duplicate rows, see :func:`twonn`),
    centred at their mean. With local covariance eigenvalues lambda_1 >= lambda_2 >= ...,
    the proxy is r(x) = sum_{i > m} lambda_i / sum_i lambda_i (dimensionless, 0..1). On a flat
    m-dimensional manifold r = 0; on a curved one the neighbourhood bends out of its tangent
    plane and r > 0 (for a neighbourhood of radius rho on a sphere of radius R, r grows like
    (rho / R)^2). Noise off the manifold also raises r: it is a proxy, not a curvature.

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; finite).
    k : neighbours per anchor (>= 2); must exceed ``m``.
    m : local dimension kept (>= 1), normally the rounded intrinsic-dimension estimate.
    n_anchors : anchors drawn (seeded, without replacement) from the distinct points; None = all.
    seed : seed of ``numpy.random.default_rng`` for the anchor draw.
    min_points : minimum number of distinct points (default k + 1).
    chunk : anchors per batched eigen-decomposition (memory ~ chunk * (k+1) * n_features * 8 B);
        default: as many as fit in 8 MiB (cache-friendly).

    Returns
    -------
    dict: ``curvature_mean``, ``curvature_median``, ``curvature_std`` (ddof=0),
    ``curvature_q25``, ``curvature_q75`` over anchors; ``values`` (per-anchor array [n_anchors]);
    ``anchor_rows`` (int64 [n_anchors], each anchor's row in the input X: the first of its duplicates, so a
    caller can carry a label per anchor, e.g. its passage, through the deduplication);
    ``k``, ``m``, ``n_points`` (distinct points), ``n_anchors``, ``n_duplicates_removed``.

    Raises
    ------
    ValueError : k < 2, m < 1, m >= k, or bad X.
    TooFewPointsError : fewer than ``min_points`` distinct points.

    Source: LSM sec. 13.3 (curvature proxy by local PCA); DESIGN.md sec. 3 ("Curvature proxy").
    """
    k, m = int(k), int(m)
    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if m >= k:
        raise ValueError(f"m={m} must be smaller than k={k}: k + 1 centred points span at most k "
                         "directions, so the proxy would be 0 by construction; raise k")
    min_points = max(int(min_points or 0), k + 1)
    X, _, idx, n_exact, n_zero, kept = prepare_neighbors(X, k, min_points, "curvature proxy", return_kept=True)
    n = X.shape[0]
    if n_anchors is None or int(n_anchors) >= n:
        anchors = np.arange(n)
    else:
        anchors = np.sort(np.random.default_rng(seed).choice(n, size=int(n_anchors), replace=False))
    vals = np.empty(anchors.size)
    # Local Gram matrices [c, k+1, k+1] have the same non-zero spectrum as the local covariance.
    # Up to GRAM_MAX_POINTS points they are read off one global BLAS Gram matrix of the centred
    # data and double-centred (fast); beyond that the neighbourhoods are gathered explicitly.
    Xc = X - X.mean(axis=0)
    G = Xc @ Xc.T if n <= GRAM_MAX_POINTS else None
    chunk = int(chunk or max(1, CHUNK_BYTES // (8 * (k + 1) * max(X.shape[1], k + 1))))
    for s in range(0, anchors.size, chunk):
        a = anchors[s:s + chunk]
        nb = np.concatenate([a[:, None], idx[a]], axis=1)  # [c, k+1]
        if G is not None:
            gram = G[nb[:, :, None], nb[:, None, :]]
            gram = gram - gram.mean(axis=1, keepdims=True)
            gram = gram - gram.mean(axis=2, keepdims=True)
        else:
            P = Xc[nb]  # [c, k+1, d]
            P = P - P.mean(axis=1, keepdims=True)
            gram = np.einsum("cid,cjd->cij", P, P)
        ev = np.clip(np.linalg.eigvalsh(gram)[:, ::-1], 0.0, None)  # descending
        tot = ev.sum(axis=1)
        out = ev[:, m:].sum(axis=1)
        vals[s:s + chunk] = np.divide(out, tot, out=np.zeros_like(out), where=tot > 0)
    return {
        "curvature_mean": float(vals.mean()),
        "curvature_median": float(np.median(vals)),
        "curvature_std": float(vals.std()),
        "curvature_q25": float(np.quantile(vals, 0.25)),
        "curvature_q75": float(np.quantile(vals, 0.75)),
        "values": vals,
        "anchor_rows": kept[anchors],
        "k": k,
        "m": m,
        "n_points": int(n),
        "n_anchors": int(anchors.size),
        "n_duplicates_removed": int(n_exact + n_zero),
    }
