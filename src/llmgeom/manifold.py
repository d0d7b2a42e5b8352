"""Intrinsic dimension of representation point clouds (pure arrays).

Source: LSM, "Latent Semantic Manifolds in Large Language Models" (intrinsic dimension per layer of
the residual stream at sampled corpus tokens), and DESIGN.md sec. 3 ("Intrinsic dimension per
layer") and sec. 4 (TwoNN returns inf/NaN on duplicate points; deduplicate in float64).

The estimators themselves are scikit-dimension's (``skdim.id.TwoNN``, ``skdim.id.MLE``); this
module only prepares their inputs:

* cast to float64 and remove exact duplicate rows (kept: first occurrence, original order);
* compute the k nearest-neighbour distances *exactly* (candidates from scikit-learn's brute-force
  search, whose ``|x|^2 + |y|^2 - 2 x.y`` expansion loses precision for close points in high
  dimension, then distances recomputed from the coordinate differences and re-sorted);
* drop points whose nearest-neighbour distance is still 0 in float64 (distinct rows whose squared
  difference underflows), keeping the first of each coincident group, and count them;
* hand the exact distances to skdim (``TwoNN(dist=True)`` with (r1, r2); ``MLE.fit`` with
  ``precomputed_knn_arrays``), so both estimators see the same neighbour graph.

Nothing here touches a model or an HDF5 file.
"""

from __future__ import annotations

import numpy as np
import skdim
from sklearn.neighbors import NearestNeighbors

__all__ = [
    "TooFewPointsError",
    "deduplicate",
    "twonn",
    "mle_id",
    "id_subsamples",
    "local_pca_residuals",
    "id_profile_shape",
]

# Extra neighbour candidates fetched from the approximate (dot-product) search before the exact
# re-ranking, so that rounding in the candidate search cannot push a true neighbour out.
_EXTRA_CANDIDATES = 8
# Memory budget (bytes) for one chunk of coordinate differences in the exact re-ranking. Small
# chunks stay in cache: 8 MiB is ~20x faster than 256 MiB for 1000 points x 600 dims.
_CHUNK_BYTES = 8 * 2**20
# Largest point cloud for which the curvature proxy uses one global Gram matrix (n^2 float64).
_GRAM_MAX_POINTS = 4096


class TooFewPointsError(ValueError):
    """Fewer distinct points remain (after deduplication) than an estimator needs."""


def _as_points(X) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D [n_points, n_features], got shape {X.shape}")
    if X.shape[1] < 1:
        raise ValueError("X has no features (columns)")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains non-finite values (NaN or inf)")
    return X


def deduplicate(X) -> tuple[np.ndarray, int]:
    """Remove exact duplicate rows after casting to float64.

    Parameters
    ----------
    X : array [n_points, n_features] (any real dtype; compared in float64, so rows that are
        distinct in float32 stay distinct).

    Returns
    -------
    X_unique : float64 array [n_unique, n_features], the first occurrence of each distinct row,
        in the original row order.
    n_removed : int, n_points - n_unique.

    Raises
    ------
    ValueError : X not 2-D.

    Source: DESIGN.md sec. 4 (TwoNN on duplicates; dedup in float64); LSM intrinsic dimension.
    Note: -0.0 and 0.0 compare equal (same point); NaN rows are not merged.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D [n_points, n_features], got shape {X.shape}")
    if X.shape[0] == 0:
        return X.copy(), 0
    X = X + 0.0  # normalizes -0.0 to +0.0 so that np.unique treats them as equal
    _, first = np.unique(X, axis=0, return_index=True)
    first = np.sort(first)
    return X[first], int(X.shape[0] - first.size)


def _exact_knn(X: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact Euclidean k-NN (self excluded): distances and indices [n, k], ascending."""
    n, d = X.shape
    m = min(n - 1, k + _EXTRA_CANDIDATES)
    Xc = X - X.mean(axis=0)  # centring shrinks the cancellation error of the dot-product trick
    _, cand = NearestNeighbors(n_neighbors=m, algorithm="brute").fit(Xc).kneighbors()
    dist = np.empty((n, m))
    chunk = max(1, _CHUNK_BYTES // (8 * m * d))
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        diff = X[cand[s:e]] - X[s:e, None, :]  # uncentred: exact differences of the inputs
        dist[s:e] = np.sqrt(np.einsum("cmd,cmd->cm", diff, diff))
    order = np.lexsort((cand, dist), axis=1)  # by distance, ties by index (deterministic)
    dist = np.take_along_axis(dist, order, axis=1)[:, :k]
    cand = np.take_along_axis(cand, order, axis=1)[:, :k]
    return dist, cand


def _prepare(X, k: int, min_points: int, what: str):
    """Dedup, check size, exact k-NN, drop zero-distance points. Returns X, dist, idx, counts."""
    X = _as_points(X)
    X, n_exact = deduplicate(X)
    n_zero = 0
    while True:
        if X.shape[0] < min_points:
            raise TooFewPointsError(
                f"{what}: only {X.shape[0]} distinct points remain after removing "
                f"{n_exact} exact duplicate rows and {n_zero} zero-distance points; "
                f"at least {min_points} are needed"
            )
        dist, idx = _exact_knn(X, k)
        zero = dist[:, 0] == 0.0
        if not zero.any():
            return X, dist, idx, n_exact, n_zero
        # A point at distance 0 from an earlier row is a duplicate in float64 arithmetic: drop it
        # (keep the first). Ties are broken by index, so the highest-index zero-distance point
        # always has an earlier nearest neighbour and every round removes at least one point.
        drop = zero & (idx[:, 0] < np.arange(X.shape[0]))
        X = X[~drop]
        n_zero += int(np.count_nonzero(drop))


def _result(est: float, X, n_exact: int, n_zero: int, what: str) -> dict:
    est = float(est)
    if not np.isfinite(est):
        raise ValueError(f"{what} estimate is not finite ({est!r}) on {X.shape[0]} points")
    return {
        "id": est,
        "n_points": int(X.shape[0]),
        "n_duplicates_removed": int(n_exact + n_zero),
        "n_zero_distance_removed": int(n_zero),
    }


def twonn(X, *, min_points: int = 20, discard_fraction: float = 0.1, method: str = "linear") -> dict:
    """TwoNN intrinsic dimension (Facco et al. 2017) via ``skdim.id.TwoNN``.

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; finite), e.g. residual-stream vectors at
        sampled corpus tokens for one layer.
    min_points : minimum number of distinct points required (after deduplication).
    discard_fraction, method : passed to ``skdim.id.TwoNN`` (defaults = skdim's: discard the 10%
        largest ratios mu = r2/r1, linear fit through the origin).

    Returns
    -------
    dict: ``id`` (float, dimensionless), ``n_points`` (distinct points used),
    ``n_duplicates_removed`` (exact duplicate rows + zero-distance points removed),
    ``n_zero_distance_removed`` (the second kind alone; normally 0).

    Raises
    ------
    TooFewPointsError : fewer than ``min_points`` distinct points (message gives both numbers).
    ValueError : X not 2-D or non-finite, or the estimate is not finite.

    Source: LSM (intrinsic dimension per layer); DESIGN.md sec. 3-4. The exact (r1, r2)
    nearest-neighbour distances are computed here and passed to ``TwoNN(dist=True)``; on clean
    data this equals ``skdim.id.TwoNN().fit(X).dimension_`` up to rounding.
    """
    min_points = max(int(min_points), 3)
    X, dist, _, n_exact, n_zero = _prepare(X, 2, min_points, "TwoNN")
    est = skdim.id.TwoNN(discard_fraction=discard_fraction, dist=True, method=method)
    d = est.fit(dist).dimension_
    return _result(d, X, n_exact, n_zero, "TwoNN")


def mle_id(X, *, k: int = 20, min_points=None, comb: str = "mle") -> dict:
    """Levina-Bickel maximum-likelihood intrinsic dimension via ``skdim.id.MLE``.

    Each point's estimate uses its ``k`` nearest neighbours,
    m_k(x) = (k - 1) / sum_{j<k} log(T_k(x) / T_j(x)); the pointwise values are combined by
    ``comb``: 'mle' (skdim's default: 1 / mean(1 / m), the MacKay-Ghahramani correction),
    'mean' (Levina & Bickel's original average) or 'median'.

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; finite).
    k : neighbours per point (skdim's ``n_neighbors``; skdim's ``K`` is only used by its
        non-neighbourhood variant and is not used here). Must be >= 2.
    min_points : minimum number of distinct points; default max(20, k + 1).
    comb : how pointwise estimates are combined ('mle', 'mean', 'median').

    Returns
    -------
    dict: ``id``, ``n_points``, ``n_duplicates_removed``, ``n_zero_distance_removed`` as in
    :func:`twonn`.

    Raises
    ------
    TooFewPointsError : fewer distinct points than ``min_points`` (or than k + 1).
    ValueError : bad X, k < 2, or a non-finite estimate.

    Source: LSM (intrinsic dimension per layer; MLE of Levina & Bickel 2004); DESIGN.md sec. 3.
    """
    k = int(k)
    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    if min_points is None:
        min_points = max(20, k + 1)
    min_points = max(int(min_points), k + 1)
    X, dist, idx, n_exact, n_zero = _prepare(X, k, min_points, "MLE")
    est = skdim.id.MLE()
    d = est.fit(X, precomputed_knn_arrays=(dist, idx), n_neighbors=k, comb=comb).dimension_
    return _result(d, X, n_exact, n_zero, "MLE")


_ESTIMATORS = {"twonn": twonn, "mle": mle_id}


def id_subsamples(
    X,
    *,
    estimator: str,
    n_subsamples: int,
    subsample_size: int,
    seed: int,
    **kw,
) -> dict:
    """Repeat an intrinsic-dimension estimator on random subsets of the distinct points.

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; exact duplicates removed first).
    estimator : 'twonn' or 'mle' (case-insensitive).
    n_subsamples : number of random subsets (>= 1).
    subsample_size : points per subset, drawn without replacement from the distinct points; if
        fewer distinct points exist, every subset is all of them (then id_std = 0).
    seed : seed for ``numpy.random.default_rng``; the same seed gives the same subsets.
    **kw : passed to the estimator (e.g. ``k``, ``min_points``, ``discard_fraction``).

    Returns
    -------
    dict: ``id_mean``, ``id_std`` (ddof=0), ``id_min``, ``id_max`` over subsets (dimensionless),
    ``ids`` (list of per-subset estimates), ``n_subsamples``, ``subsample_size`` (points per
    subset actually used), ``n_points`` (distinct points in X), ``n_duplicates_removed`` (exact
    duplicate rows in X), ``estimator``.

    Raises
    ------
    ValueError : unknown estimator, n_subsamples < 1, subsample_size < 1, bad X.
    TooFewPointsError : a subset has fewer distinct points than the estimator needs.

    Source: LSM (mean and spread of the ID over several random subsamples); DESIGN.md sec. 3.
    """
    name = str(estimator).lower()
    if name not in _ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(_ESTIMATORS)}, got {estimator!r}")
    if int(n_subsamples) < 1:
        raise ValueError(f"n_subsamples must be >= 1, got {n_subsamples}")
    if int(subsample_size) < 1:
        raise ValueError(f"subsample_size must be >= 1, got {subsample_size}")
    fn = _ESTIMATORS[name]
    X, n_exact = deduplicate(_as_points(X))
    n = X.shape[0]
    size = min(int(subsample_size), n)
    rng = np.random.default_rng(seed)
    ids = []
    for _ in range(int(n_subsamples)):
        sel = np.sort(rng.choice(n, size=size, replace=False)) if size < n else np.arange(n)
        ids.append(fn(X[sel], **kw)["id"])
    a = np.asarray(ids, dtype=np.float64)
    return {
        "id_mean": float(a.mean()),
        "id_std": float(a.std()),
        "id_min": float(a.min()),
        "id_max": float(a.max()),
        "ids": [float(v) for v in a],
        "n_subsamples": int(n_subsamples),
        "subsample_size": int(size),
        "n_points": int(n),
        "n_duplicates_removed": int(n_exact),
        "estimator": name,
    }


# --------------------------------------------------------------------------------------------
# Curvature proxy and ID profile shape (LSM sec. 13.3; issue 5)
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
    X, _, idx, n_exact, n_zero = _prepare(X, k, min_points, "curvature proxy")
    n = X.shape[0]
    if n_anchors is None or int(n_anchors) >= n:
        anchors = np.arange(n)
    else:
        anchors = np.sort(np.random.default_rng(seed).choice(n, size=int(n_anchors), replace=False))
    vals = np.empty(anchors.size)
    # Local Gram matrices [c, k+1, k+1] have the same non-zero spectrum as the local covariance.
    # Up to _GRAM_MAX_POINTS points they are read off one global BLAS Gram matrix of the centred
    # data and double-centred (fast); beyond that the neighbourhoods are gathered explicitly.
    Xc = X - X.mean(axis=0)
    G = Xc @ Xc.T if n <= _GRAM_MAX_POINTS else None
    chunk = int(chunk or max(1, _CHUNK_BYTES // (8 * (k + 1) * max(X.shape[1], k + 1))))
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
        "k": k,
        "m": m,
        "n_points": int(n),
        "n_anchors": int(anchors.size),
        "n_duplicates_removed": int(n_exact + n_zero),
    }


def id_profile_shape(depth, ids, *, tol: float = 0.1) -> dict:
    """Summarize an intrinsic-dimension profile over depth: peak, trough and a shape label.

    Parameters
    ----------
    depth : array [n_layers] of layer positions (e.g. relative depth 0..1), any order.
    ids : array [n_layers] of intrinsic-dimension estimates (dimensionless) at those depths.
    tol : a bump counts when the interior extreme differs from BOTH end points by more than
        ``tol`` times the profile's range (max - min); a profile whose range is below
        ``tol`` * its maximum is "flat".

    Returns
    -------
    dict: ``peak_index`` (position in the depth-sorted profile), ``peak_depth``, ``peak_id``,
    ``trough_index``, ``trough_depth``, ``trough_id``, ``first_id``, ``last_id``,
    ``spearman_depth`` (rank correlation of ID with depth), ``shape`` in
    {"rise-then-fall" (interior peak: the "hunchback"), "fall-then-rise" (interior trough: the
    "hourglass"), "increasing", "decreasing", "flat"}. When both an interior peak and an
    interior trough qualify, the larger excursion wins.

    Raises
    ------
    ValueError : fewer than 2 layers, mismatched lengths, or non-finite values.

    Source: LSM (hourglass / hunchback ID profiles across depth); DESIGN.md sec. 3.
    """
    from scipy.stats import spearmanr

    depth = np.asarray(depth, dtype=np.float64)
    ids = np.asarray(ids, dtype=np.float64)
    if depth.shape != ids.shape or depth.ndim != 1 or depth.size < 2:
        raise ValueError(f"depth and ids must be 1-D of equal length >= 2, got {depth.shape}, {ids.shape}")
    if not (np.all(np.isfinite(depth)) and np.all(np.isfinite(ids))):
        raise ValueError("depth and ids must be finite")
    o = np.argsort(depth, kind="stable")
    depth, ids = depth[o], ids[o]
    ip, it = int(np.argmax(ids)), int(np.argmin(ids))
    rng = float(ids.max() - ids.min())
    first, last = float(ids[0]), float(ids[-1])
    rho = float(spearmanr(depth, ids).statistic) if rng > 0 else 0.0
    thr = tol * rng
    bump_up = (0 < ip < ids.size - 1) and ids[ip] - first > thr and ids[ip] - last > thr
    bump_dn = (0 < it < ids.size - 1) and first - ids[it] > thr and last - ids[it] > thr
    if rng <= tol * max(abs(float(ids.max())), 1e-300):
        shape = "flat"
    elif bump_up and bump_dn:
        up = min(ids[ip] - first, ids[ip] - last)
        dn = min(first - ids[it], last - ids[it])
        shape = "rise-then-fall" if up >= dn else "fall-then-rise"
    elif bump_up:
        shape = "rise-then-fall"
    elif bump_dn:
        shape = "fall-then-rise"
    else:
        shape = "increasing" if last >= first else "decreasing"
    return {
        "peak_index": ip, "peak_depth": float(depth[ip]), "peak_id": float(ids[ip]),
        "trough_index": it, "trough_depth": float(depth[it]), "trough_id": float(ids[it]),
        "first_id": first, "last_id": last, "spearman_depth": rho, "shape": shape,
    }
