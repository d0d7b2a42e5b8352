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

from llmgeom.core.stats import spearman
from llmgeom.measures.neighbors import as_points, deduplicate, prepare_neighbors


def _id_result(est: float, X, n_exact: int, n_zero: int, what: str) -> dict:
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
    X, dist, _, n_exact, n_zero = prepare_neighbors(X, 2, min_points, "TwoNN")
    est = skdim.id.TwoNN(discard_fraction=discard_fraction, dist=True, method=method)
    d = est.fit(dist).dimension_
    return _id_result(d, X, n_exact, n_zero, "TwoNN")


def mle_id(X, *, k: int = 20, min_points=None, comb: str = "mle") -> dict:
    """Maximum-likelihood intrinsic dimension (Levina & Bickel 2004 pointwise estimates) via ``skdim.id.MLE``.

    Each point's estimate uses its ``k`` nearest neighbours,
    m_k(x) = (k - 1) / sum_{j<k} log(T_k(x) / T_j(x)) (skdim's pointwise estimator); the pointwise
    values are combined by ``comb`` (skdim's names):

    * ``'mle'`` (skdim's default): the harmonic mean 1 / mean(1 / m_k(x)), MacKay & Ghahramani's
      correction (2005, "Comments on 'Maximum likelihood estimation of intrinsic dimension'"):
      estimator ``mle_mg`` of this package;
    * ``'mean'``: the arithmetic mean of m_k(x), Levina & Bickel's (2004) own aggregate: ``mle_lb``;
    * ``'median'``: the median.

    On curved, noisy or high-dimensional data the two aggregates differ a lot (issue 11: 11.49 vs 18.49
    at SmolLM2 layer 15); on a uniform cube both recover its dimension (tested).

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
    if comb not in MLE_COMBS:
        raise ValueError(f"comb must be one of {MLE_COMBS}, got {comb!r}")
    X, dist, idx, n_exact, n_zero = prepare_neighbors(X, k, min_points, "MLE")
    est = skdim.id.MLE()
    d = est.fit(X, precomputed_knn_arrays=(dist, idx), n_neighbors=k, comb=comb).dimension_
    return _id_result(d, X, n_exact, n_zero, "MLE")


MLE_COMBS = ("mle", "mean", "median")


def mle_mg(X, *, k: int = 20, min_points=None) -> dict:
    """MLE intrinsic dimension aggregated by the harmonic mean of the pointwise Levina-Bickel estimates
    (MacKay & Ghahramani 2005; skdim's default ``comb="mle"``). Arguments and result as :func:`mle_id`."""
    return mle_id(X, k=k, min_points=min_points, comb="mle")


def mle_lb(X, *, k: int = 20, min_points=None) -> dict:
    """MLE intrinsic dimension aggregated by the arithmetic mean of the pointwise estimates (Levina &
    Bickel 2004, their eq. 9; skdim ``comb="mean"``). Arguments and result as :func:`mle_id`."""
    return mle_id(X, k=k, min_points=min_points, comb="mean")


_ESTIMATORS = {"twonn": twonn, "mle_mg": mle_mg, "mle_lb": mle_lb}
#: former name of mle_mg (skdim's default aggregate), still accepted; tables say "mle_mg"
ESTIMATOR_ALIASES = {"mle": "mle_mg"}


def canonical_estimator(name: str) -> str:
    """Canonical estimator name ('twonn', 'mle_mg', 'mle_lb'; 'mle' -> 'mle_mg'), case-insensitive.

    Raises:
        ValueError: unknown name (lists the valid ones).
    """
    n = ESTIMATOR_ALIASES.get(str(name).lower(), str(name).lower())
    if n not in _ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(_ESTIMATORS)} (or the alias 'mle' = 'mle_mg'), "
                         f"got {name!r}")
    return n


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
    estimator : 'twonn', 'mle_mg' (MacKay-Ghahramani aggregate; alias 'mle') or 'mle_lb' (Levina-Bickel
        aggregate), case-insensitive.
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
    duplicate rows in X), ``estimator`` (canonical name).

    Raises
    ------
    ValueError : unknown estimator, n_subsamples < 1, subsample_size < 1, bad X.
    TooFewPointsError : a subset has fewer distinct points than the estimator needs.

    Source: LSM (mean and spread of the ID over several random subsamples); DESIGN.md sec. 3.
    """
    name = canonical_estimator(estimator)
    if int(n_subsamples) < 1:
        raise ValueError(f"n_subsamples must be >= 1, got {n_subsamples}")
    if int(subsample_size) < 1:
        raise ValueError(f"subsample_size must be >= 1, got {subsample_size}")
    fn = _ESTIMATORS[name]
    X, n_exact = deduplicate(as_points(X))
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
    ``spearman_depth`` (rank correlation of ID with depth; NaN for a constant profile), ``shape`` in
    {"rise-then-fall" (interior peak: the "hunchback"), "fall-then-rise" (interior trough: the
    "hourglass"), "increasing", "decreasing", "flat"}. When both an interior peak and an
    interior trough qualify, the larger excursion wins.

    Raises
    ------
    ValueError : fewer than 2 layers, mismatched lengths, or non-finite values.

    Source: LSM (hourglass / hunchback ID profiles across depth); DESIGN.md sec. 3.
    """
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
    rho = spearman(depth, ids)[0]  # NaN for a constant profile
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
