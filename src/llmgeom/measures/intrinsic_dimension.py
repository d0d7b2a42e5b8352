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

GRIDE (Denti et al. 2022) is implemented here (:func:`gride_mle`, :func:`gride`, :func:`gride_scaling`) on
the same exact neighbour distances, because its reference implementation (DADApy 0.3.4) cannot be installed
beside numpy 2.

Nothing here touches a model or an HDF5 file.
"""

from __future__ import annotations

import numpy as np
import skdim
from scipy.optimize import brentq

from llmgeom.core.stats import spearman
from llmgeom.measures.neighbors import EXTRA_CANDIDATES, FallbackRows, TooFewPointsError, as_points, deduplicate, knn_among, prepare_neighbors


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
    return _id_result(twonn_from_distances(dist, discard_fraction, method), X, n_exact, n_zero, "TwoNN")


def twonn_from_distances(dist, discard_fraction: float = 0.1, method: str = "linear") -> float:
    """TwoNN (Facco et al. 2017) from given neighbour distances: ``skdim.id.TwoNN(dist=True)`` on the columns
    (r1, r2) = ``dist[:, :2]`` (float64 [n, >= 2], each point's first and second neighbour distance, ascending; > 0).
    The one TwoNN of the package: :func:`twonn` and :func:`id_estimates` pass the nearest neighbours of all points;
    :func:`passage_resampled_ids` passes neighbours restricted to other passages or to a resample's passages, so
    that every variant is skdim's formula (ratios mu = r2 / r1, the 10% largest discarded, a line through the
    origin) on other neighbours. Returns the ID (dimensionless)."""
    est = skdim.id.TwoNN(discard_fraction=discard_fraction, dist=True, method=method)
    return est.fit(np.ascontiguousarray(dist[:, :2])).dimension_


def mle_id(X, *, k: int, min_points=None, comb: str = "mle") -> dict:
    """Maximum-likelihood intrinsic dimension (Levina & Bickel 2004 pointwise estimates) via ``skdim.id.MLE``.

    Each point's estimate uses its ``k`` nearest neighbours,
    m_k(x) = (k - 1) / sum_{j<k} log(T_k(x) / T_j(x)) (skdim's pointwise estimator); the pointwise
    values are combined by ``comb`` (skdim's names):

    * ``'mle'`` (skdim's default): the harmonic mean 1 / mean(1 / m_k(x)), MacKay & Ghahramani's
      correction (2005, "Comments on 'Maximum likelihood estimation of intrinsic dimension'"):
      estimator ``mle_mg`` of this package;
    * ``'mean'``: the arithmetic mean of m_k(x), Levina & Bickel's (2004) own aggregate: ``mle_lb``;
    * ``'median'``: the median.

    On curved, noisy or high-dimensional data the two aggregates differ a lot (e.g. 11.49 vs 18.49
    at SmolLM2 layer 15); on a uniform cube both recover its dimension (tested).

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; finite).
    k : neighbours per point (skdim's ``n_neighbors``; skdim's ``K`` is only used by its
        non-neighbourhood variant and is not used here). Must be >= 2. The workflow's is schema key
        ``intrinsic_dimension.mle_k`` (through :func:`id_estimates`).
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
    return _id_result(_mle_knn(X, dist, idx, k, comb), X, n_exact, n_zero, "MLE")


def _mle_knn(X, dist, idx, k: int, comb: str) -> float:
    knn = (np.ascontiguousarray(dist[:, :k]), np.ascontiguousarray(idx[:, :k]))
    return skdim.id.MLE().fit(X, precomputed_knn_arrays=knn, n_neighbors=k, comb=comb).dimension_


MLE_COMBS = ("mle", "mean", "median")


def mle_mg(X, *, k: int, min_points=None) -> dict:
    """MLE intrinsic dimension aggregated by the harmonic mean of the pointwise Levina-Bickel estimates
    (MacKay & Ghahramani 2005; skdim's default ``comb="mle"``). Arguments and result as :func:`mle_id`."""
    return mle_id(X, k=k, min_points=min_points, comb="mle")


def mle_lb(X, *, k: int, min_points=None) -> dict:
    """MLE intrinsic dimension aggregated by the arithmetic mean of the pointwise estimates (Levina &
    Bickel 2004, their eq. 9; skdim ``comb="mean"``). Arguments and result as :func:`mle_id`."""
    return mle_id(X, k=k, min_points=min_points, comb="mean")


#: search interval of the GRIDE likelihood root (dimensionless ID); DADApy's defaults d0, d1 are 0.001, 1000
GRIDE_D_BOUNDS = (1e-3, 1e4)


def _gride_score(d: float, a: np.ndarray, n1: int, n2: int) -> float:
    """d/dd of the GRIDE log-likelihood at d for log-ratios a = log mu >= 0 (strictly decreasing in d)."""
    s = a.size / d - (n2 - 1) * a.sum()
    if n2 - n1 - 1:
        pos = a > 0
        # mu^d log mu / (mu^d - 1) = a / (1 - exp(-a d)); its limit at a = 0 (tied distances) is 1 / d
        s += (n2 - n1 - 1) * (np.sum(a[pos] / -np.expm1(-a[pos] * d)) + np.count_nonzero(~pos) / d)
    return float(s)


def gride_mle(mu, n1: int, n2: int | None = None) -> float:
    """Maximum-likelihood intrinsic dimension from generalized neighbour-distance ratios (GRIDE).

    Under a locally uniform density on a d-dimensional manifold, mu = r_{n2} / r_{n1} (distances to a
    point's n2-th and n1-th nearest neighbours, n2 > n1) has the density (Denti et al. 2022, eq. 5)

        f(mu | d) = d (mu^d - 1)^(n2 - n1 - 1) / (B(n2 - n1, n1) mu^((n2 - 1) d + 1)),  mu > 1,

    and, treating the points' ratios as independent, the log-likelihood
    N log d + (n2 - n1 - 1) sum log(mu^d - 1) - (n2 - 1) d sum log mu (+ terms free of d) is strictly concave
    in d. Its maximum is the root of the score, found with ``scipy.optimize.brentq`` in ``GRIDE_D_BOUNDS``.
    With n1 = 1, n2 = 2 it is the closed form N / sum log mu (TwoNN's likelihood).

    Parameters
    ----------
    mu : array [n_points] of ratios >= 1 (float64; 1 = tied distances).
    n1 : neighbour order of the denominator (>= 1).
    n2 : neighbour order of the numerator (> n1); default 2 n1 (GRIDE's choice, as DADApy).

    Returns
    -------
    d : float, the maximum-likelihood intrinsic dimension (dimensionless).

    Raises
    ------
    ValueError : empty or non-finite mu, a ratio < 1, n2 <= n1, all ratios 1 (no scale), or a root outside
        ``GRIDE_D_BOUNDS``.

    Source: Denti, Doimo, Laio & Mira (2022), "The generalized ratios intrinsic dimension estimator",
    Sci. Rep. 12:20005, sec. "Methods" (eq. 5 and its likelihood).
    """
    n1 = int(n1)
    n2 = 2 * n1 if n2 is None else int(n2)
    if n1 < 1 or n2 <= n1:
        raise ValueError(f"GRIDE needs 1 <= n1 < n2, got n1={n1}, n2={n2}")
    mu = np.asarray(mu, dtype=np.float64).ravel()
    if mu.size == 0 or not np.all(np.isfinite(mu)):
        raise ValueError("mu must be a non-empty finite array of distance ratios")
    if mu.min() < 1.0:
        raise ValueError(f"distance ratios mu = r_n2 / r_n1 must be >= 1, got min {mu.min()!r}")
    a = np.log(mu)
    if not np.any(a > 0):
        raise ValueError("all distance ratios are 1 (every n1-th and n2-th neighbour tie): GRIDE undefined")
    lo, hi = GRIDE_D_BOUNDS
    if _gride_score(lo, a, n1, n2) <= 0 or _gride_score(hi, a, n1, n2) >= 0:
        raise ValueError(f"GRIDE likelihood maximum lies outside d in {GRIDE_D_BOUNDS} "
                         f"(n1={n1}, n2={n2}, {mu.size} ratios)")
    return float(brentq(_gride_score, lo, hi, args=(a, n1, n2), xtol=1e-13, rtol=4 * np.finfo(float).eps,
                        maxiter=500))


def gride(X, *, n1: int = 1, n2: int | None = None, min_points: int = 20) -> dict:
    """GRIDE intrinsic dimension at one scale (neighbour orders n1 and n2 = 2 n1 by default).

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; finite); exact duplicates and zero-distance points
        removed as for :func:`twonn`.
    n1, n2 : neighbour orders of :func:`gride_mle`.
    min_points : minimum number of distinct points (raised to n2 + 1).

    Returns
    -------
    dict: ``id`` (float), ``n1``, ``n2``, ``n_points``, ``n_duplicates_removed``, ``n_zero_distance_removed``.

    Raises
    ------
    TooFewPointsError : fewer distinct points than needed. ValueError : bad X or see :func:`gride_mle`.

    Source: Denti et al. (2022), Sci. Rep. 12:20005. Implemented here because DADApy 0.3.4 (the
    reference implementation) needs numpy < 2 and does not build against numpy 2.
    """
    n1 = int(n1)
    n2 = 2 * n1 if n2 is None else int(n2)
    X, dist, _, n_exact, n_zero = prepare_neighbors(X, n2, max(int(min_points), n2 + 1, 3), "GRIDE")
    d = gride_mle(dist[:, n2 - 1] / dist[:, n1 - 1], n1, n2)
    return dict(_id_result(d, X, n_exact, n_zero, "GRIDE"), n1=n1, n2=n2)


def gride_plateau(ids, *, tol: float) -> tuple[int, int, float]:
    """The plateau of a GRIDE scale curve: the longest run of consecutive scales whose IDs all lie within
    ``tol`` (relative) of the run's median; ties go to the run at the smallest scales.

    Parameters
    ----------
    ids : array [n_scales] of IDs ordered by scale (n1 = 1, 2, 4, ...). tol : relative half-width (> 0;
        the workflow's is schema key ``intrinsic_dimension.gride_plateau_tol``).

    Returns
    -------
    (first, last, value): indices of the run's first and last scale (inclusive) and its median ID.

    Raises
    ------
    ValueError : empty or non-finite ids, tol <= 0.

    Source: the rule of this package (Denti et al. 2022 read the plateau off the scale curve by eye).
    """
    ids = np.asarray(ids, dtype=np.float64).ravel()
    if ids.size == 0 or not np.all(np.isfinite(ids)):
        raise ValueError("ids must be a non-empty finite array")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    best = (0, 0, float(ids[0]))
    for i in range(ids.size):
        for j in range(ids.size - 1, i + best[1] - best[0] - 1, -1):  # longest first; only longer than best
            med = float(np.median(ids[i:j + 1]))
            if j - i > best[1] - best[0] and np.all(np.abs(ids[i:j + 1] - med) <= tol * abs(med)):
                best = (i, j, med)
                break
    return best


def gride_scaling(X, *, max_rank: int, plateau_tol: float, min_points: int = 20) -> dict:
    """GRIDE scale curve: ID at n1 = 1, 2, 4, ... (n2 = 2 n1 <= ``max_rank``) and its plateau.

    As DADApy's ``return_id_scaling_gride(range_max=max_rank)``: the neighbour order doubles from scale to
    scale, so the curve shows the ID from the shortest distances (noise) to the longest (curvature); the
    plateau (:func:`gride_plateau`) is the value reported as ``id``.

    Parameters
    ----------
    X : array [n_points, n_features] (float64, duplicates removed as in :func:`twonn`).
    max_rank : largest neighbour order n2 used (>= 2); capped at the distinct points - 1 (the workflow's is
        schema key ``intrinsic_dimension.gride_max_rank``).
    plateau_tol : see :func:`gride_plateau` (schema key ``intrinsic_dimension.gride_plateau_tol``).
    min_points : minimum number of distinct points.

    Returns
    -------
    dict: ``id`` (plateau median), ``n1`` (list of scales), ``ids`` (list, ID per scale), ``plateau_n1_min``,
    ``plateau_n1_max`` (n1 of the plateau's first and last scale), ``n_points``, ``n_duplicates_removed``,
    ``n_zero_distance_removed``.

    Raises
    ------
    TooFewPointsError : fewer than ``min_points`` (or 3) distinct points. ValueError : bad X, max_rank < 2.

    Source: Denti et al. (2022), Sci. Rep. 12:20005 (scale analysis, Fig. 3); DADApy
    ``IdEstimation.return_id_scaling_gride``. Implemented here: DADApy 0.3.4 does not build against numpy 2.
    """
    max_rank = int(max_rank)
    if max_rank < 2:
        raise ValueError(f"max_rank must be >= 2, got {max_rank}")
    X0, n_exact = deduplicate(as_points(X))
    X, dist, _, n_ex2, n_zero = prepare_neighbors(X0, max(min(max_rank, X0.shape[0] - 1), 2),
                                                  max(int(min_points), 3), "GRIDE")
    g = _gride_knn(dist, max_rank, plateau_tol)
    return dict(_id_result(g.pop("id"), X, n_exact + n_ex2, n_zero, "GRIDE"), **g)


def _gride_knn(dist, max_rank: int, plateau_tol: float) -> dict:
    k = min(int(max_rank), dist.shape[1])
    scales = [2 ** j for j in range(int(np.floor(np.log2(k))))]  # n1 = 1, 2, 4, ... with 2 n1 <= k
    ids = [gride_mle(dist[:, 2 * n - 1] / dist[:, n - 1], n, 2 * n) for n in scales]
    i, j, val = gride_plateau(ids, tol=plateau_tol)
    return dict(id=val, n1=scales, ids=[float(v) for v in ids], plateau_n1_min=scales[i], plateau_n1_max=scales[j])


def _neighbour_order(names, mle_k: int, gride_max_rank: int, n_points: int) -> tuple[int, int]:
    """(need, k) of :func:`id_estimates` on ``n_points`` distinct points: the largest order the MLEs / TwoNN need,
    and the neighbours searched (GRIDE: up to ``gride_max_rank``, at most n_points - 1)."""
    need = max([2] + [int(mle_k) for n in names if n.startswith("mle")])
    return need, (max(need, min(int(gride_max_rank), n_points - 1)) if "gride" in names else need)


def id_estimates(X, estimators, *, min_points: int = 20, mle_k: int, gride_max_rank: int, plateau_tol: float,
                 distinct: bool = False, neighbours: tuple | None = None) -> dict:
    """Several intrinsic-dimension estimators on ONE exact neighbour graph of the same points.

    Equal to calling :func:`twonn`, :func:`mle_mg` / :func:`mle_lb` (``k = mle_k``) and
    :func:`gride_scaling` one by one (tested), but the neighbours (the costly part) are searched once, with
    k = the largest order any estimator needs.

    Parameters
    ----------
    X : array [n_points, n_features] (float64, duplicates removed as in :func:`twonn`).
    estimators : names (see :func:`canonical_estimator`).
    min_points : minimum number of distinct points (raised to mle_k + 1 when an MLE is asked for).
    mle_k : neighbours of the MLEs (schema key ``intrinsic_dimension.mle_k``). gride_max_rank, plateau_tol :
        see :func:`gride_scaling` (schema keys ``intrinsic_dimension.gride_max_rank`` and ``.gride_plateau_tol``).
        All three are required, also when the estimators do not use them.
    distinct : the rows of X are already distinct (e.g. a subset of deduplicated points): skip deduplication.
    neighbours : (dist, idx) [n, k], the exact neighbour lists of the distinct rows of X (k as this function
        searches them; none at distance 0), e.g. read off a larger set's list (:func:`id_subsamples` with
        ``neighbours``): no search here; the same result as searching.

    Returns
    -------
    dict {canonical name: result dict of that estimator} (``id``, ``n_points``, ``n_duplicates_removed``,
    ``n_zero_distance_removed``; GRIDE adds its scale curve).

    Raises
    ------
    TooFewPointsError, ValueError : as the single estimators.

    Source: as the single estimators (LSM; Facco et al. 2017; Levina & Bickel 2004; Denti et al. 2022).
    """
    names = list(dict.fromkeys(canonical_estimator(e) for e in estimators))
    mle_k = int(mle_k)
    if any(n.startswith("mle") for n in names) and mle_k < 2:
        raise ValueError(f"mle_k must be >= 2, got {mle_k}")
    X0, n_exact = (as_points(X), 0) if distinct else deduplicate(as_points(X))
    need, k = _neighbour_order(names, mle_k, gride_max_rank, X0.shape[0])
    min_points = max(int(min_points), 3, need + 1)
    if neighbours is None:
        X, dist, idx, n_ex2, n_zero = prepare_neighbors(X0, k, min_points, "ID", distinct=True)
    else:
        if X0.shape[0] < min_points:
            raise TooFewPointsError(f"ID: only {X0.shape[0]} distinct points; at least {min_points} are needed")
        (dist, idx), X, n_ex2, n_zero = neighbours, X0, 0, 0
        if dist.shape != (X.shape[0], k):
            raise ValueError(f"neighbours: lists of shape {dist.shape}, {(X.shape[0], k)} expected")
    out = {}
    for n in names:
        extra = {}
        if n == "twonn":
            d = twonn_from_distances(dist)
        elif n == "gride":
            extra = _gride_knn(dist, gride_max_rank, plateau_tol)
            d = extra.pop("id")
        else:
            d = _mle_knn(X, dist, idx, mle_k, "mle" if n == "mle_mg" else "mean")
        out[n] = dict(_id_result(d, X, n_exact + n_ex2, n_zero, n), **extra)
    return out


_ESTIMATORS = {"twonn": twonn, "mle_mg": mle_mg, "mle_lb": mle_lb, "gride": gride_scaling}
#: former name of mle_mg (skdim's default aggregate), still accepted; tables say "mle_mg"
ESTIMATOR_ALIASES = {"mle": "mle_mg"}


def canonical_estimator(name: str) -> str:
    """Canonical estimator name ('twonn', 'mle_mg', 'mle_lb', 'gride'; 'mle' -> 'mle_mg'), case-insensitive.

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
    neighbours: "LayerNeighbours | None" = None,
    **kw,
) -> dict:
    """Repeat an intrinsic-dimension estimator on random subsets of the distinct points.

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; exact duplicates removed first).
    estimator : 'twonn', 'mle_mg' (MacKay-Ghahramani aggregate; alias 'mle'), 'mle_lb' (Levina-Bickel
        aggregate) or 'gride' (plateau of :func:`gride_scaling`), case-insensitive; or a sequence of names:
        then every subset is measured by :func:`id_estimates` (one neighbour graph for all) and the result
        is {canonical name: dict below}.
    n_subsamples : number of random subsets (>= 1).
    subsample_size : points per subset, drawn without replacement from the distinct points; if
        fewer distinct points exist, every subset is all of them (then id_std = 0).
    seed : seed for ``numpy.random.default_rng``; the same seed gives the same subsets.
    neighbours : the exact neighbour list of all distinct points of X (:class:`LayerNeighbours`, e.g. the one
        :func:`passage_resampled_ids` returns for the same points): with a sequence of estimators, each subset's
        lists are read off it (:func:`llmgeom.measures.neighbors.knn_among`) instead of searched; the same result.
    **kw : passed to the estimator (e.g. ``k`` for the MLEs and ``max_rank``, ``plateau_tol`` for GRIDE, which
        they require; ``min_points``, ``discard_fraction``), or to :func:`id_estimates` (``mle_k``,
        ``gride_max_rank``, ``plateau_tol``, required; ``min_points``) for a sequence.

    Returns
    -------
    dict: ``id_mean``, ``id_std`` (ddof=0), ``id_min``, ``id_max`` over subsets (dimensionless),
    ``ids`` (list of per-subset estimates), ``n_subsamples``, ``subsample_size`` (points per
    subset actually used), ``n_points`` (distinct points in X), ``n_duplicates_removed`` (exact
    duplicate rows in X), ``estimator`` (canonical name), ``results`` (the estimator's full result per
    subset, e.g. GRIDE's scale curve).

    Raises
    ------
    ValueError : unknown estimator, n_subsamples < 1, subsample_size < 1, bad X.
    TooFewPointsError : a subset has fewer distinct points than the estimator needs.

    Source: LSM (mean and spread of the ID over several random subsamples); DESIGN.md sec. 3.
    """
    multi = not isinstance(estimator, str)
    names = [canonical_estimator(e) for e in ([estimator] if not multi else estimator)]
    if int(n_subsamples) < 1:
        raise ValueError(f"n_subsamples must be >= 1, got {n_subsamples}")
    if int(subsample_size) < 1:
        raise ValueError(f"subsample_size must be >= 1, got {subsample_size}")
    # subsets of the distinct points are distinct: the multi-estimator path does not deduplicate them again
    fn = ((lambda Z: id_estimates(Z, names, distinct=True, **kw)) if multi
          else (lambda Z: {names[0]: _ESTIMATORS[names[0]](Z, **kw)}))
    X, n_exact = deduplicate(as_points(X))
    n = X.shape[0]
    size = min(int(subsample_size), n)
    sels = subsample_indices(n, n_subsamples=n_subsamples, size=size, seed=seed)
    if multi and neighbours is not None and neighbours.complete(X):
        per_subset = [id_estimates(X[sel], names, distinct=True, **kw,
                                   neighbours=neighbours.among(sel, _neighbour_order(
                                       names, kw["mle_k"], kw["gride_max_rank"], sel.size)[1]))
                      for sel in sels]
    else:
        per_subset = [fn(X[sel]) for sel in sels]
    out = {name: _subsample_summary([r[name] for r in per_subset], n_subsamples, size, n, n_exact, name)
           for name in names}
    return out if multi else out[names[0]]


def subsample_indices(n: int, *, n_subsamples: int, size: int, seed: int) -> list:
    """The point subsets of :func:`id_subsamples`: ``n_subsamples`` sorted int arrays of ``min(size, n)`` indices
    into the n distinct points, drawn without replacement (``numpy.random.default_rng(seed)``); all points when
    size >= n. One home, so that another statistic measured on "the same subsets" (the cross-passage TwoNN of
    :func:`passage_resampled_ids`) is."""
    rng = np.random.default_rng(seed)
    size = min(int(size), int(n))
    return [np.sort(rng.choice(n, size=size, replace=False)) if size < n else np.arange(n)
            for _ in range(int(n_subsamples))]


def _subsample_summary(results, n_subsamples, size, n, n_exact, name) -> dict:
    a = np.asarray([r["id"] for r in results], dtype=np.float64)
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
        "results": results,
    }


def id_profile_shape(depth, ids, *, tol: float) -> dict:
    """Summarize an intrinsic-dimension profile over depth: peak, trough and a shape label.

    Parameters
    ----------
    depth : array [n_layers] of layer positions (e.g. relative depth 0..1), any order.
    ids : array [n_layers] of intrinsic-dimension estimates (dimensionless) at those depths.
    tol : a bump counts when the interior extreme differs from BOTH end points by more than
        ``tol`` times the profile's range (max - min); a profile whose range is below
        ``tol`` * its maximum is "flat" (the workflow's is schema key ``intrinsic_dimension.shape_tol``).

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


class LayerNeighbours:
    """The exact neighbour list of all distinct points of one layer, which :func:`passage_resampled_ids` searches
    once and returns, for :func:`id_subsamples` to read its subsets' lists off.

    Attributes: ``X0`` the distinct points [n0, d] (``neighbors.deduplicate`` order); ``Xk``, ``dist``, ``idx`` as
    ``prepare_neighbors(X0, K, ...)`` gives them (Xk = X0 unless zero-distance points were dropped); ``fallback`` the
    :class:`llmgeom.measures.neighbors.FallbackRows` of Xk."""

    def __init__(self, X0, Xk, dist, idx):
        self.X0, self.Xk, self.dist, self.idx = X0, Xk, dist, idx
        self.fallback = FallbackRows(Xk)

    def complete(self, X0) -> bool:
        """The list covers exactly these distinct points (no zero-distance point removed from them)."""
        return self.Xk.shape[0] == self.X0.shape[0] == X0.shape[0] and np.array_equal(self.X0, X0)

    def among(self, sel, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(dist, idx) [len(sel), k] of the points ``sel`` (sorted indices into X0) among themselves, idx
        renumbered into the subset: what ``exact_knn(X0[sel], k)`` gives."""
        sel = np.asarray(sel, dtype=np.int64)
        cand = np.zeros(self.Xk.shape[0], bool)
        cand[sel] = True
        d, i = knn_among(self.Xk, self.dist, self.idx, k, rows=sel, candidates=cand, fallback=self.fallback)
        local = np.full(self.Xk.shape[0], -1, dtype=np.int64)
        local[sel] = np.arange(sel.size)
        return d, local[i]


#: estimators whose passage-resampled replicates :func:`passage_resampled_ids` computes (all of them; GRIDE's
#: replicate is the plateau of the resample's own scale curve, which needs gride_max_rank neighbours per point)
RESAMPLED_ESTIMATORS = ("twonn", "mle_mg", "mle_lb", "gride")
#: name of the cross-passage TwoNN in the result of :func:`passage_resampled_ids`
CROSS_PASSAGE = "twonn_cross_passage"


def passage_resampled_ids(X, passages, *, estimators, n_subsamples: int, subsample_size: int, seed: int,
                          n_resamples: int, min_points: int, mle_k: int, gride_max_rank: int,
                          plateau_tol: float, cross_passage: bool = True) -> dict:
    """Cross-passage TwoNN and passage-level resampling replicates of the ID, from ONE neighbour list per layer.

    Points of one passage (corpus prompt) are correlated: consecutive positions share context, so a point's nearest
    neighbours are often positions of its own passage. Two statistics read that off the same exact neighbour list
    of all distinct points (k = K, :func:`llmgeom.measures.neighbors.exact_knn`; the subsets and resamples then
    only select from it, :func:`llmgeom.measures.neighbors.knn_among`):

    * **cross-passage TwoNN** (``twonn_cross_passage``): skdim's TwoNN formula (:func:`twonn_from_distances`) on
      each point's first and second nearest neighbours among the points of OTHER passages, on the same subsets as
      :func:`id_subsamples` (:func:`subsample_indices`, same ``seed``): mean / std / min / max over them. Equal to
      the TwoNN when passages do not cluster; larger when same-passage neighbours sit closer than the manifold's
      own spacing (a string of nearby positions reads as a low-dimensional filament), smaller when they sit farther.
    * **passage resamples**: ``n_resamples`` half-samples of the passages: m = floor(G / 2) of the G passages
      drawn without replacement (``default_rng([seed, 4802])``; the same draws at every layer of a file with the
      same passages, so replicate b of every layer comes from the same passages), each estimator of
      :data:`RESAMPLED_ESTIMATORS` (and the cross-passage TwoNN) on ALL points of the kept passages (GRIDE: the
      plateau of the resample's own scale curve, :func:`gride_scaling`). Why not the
      bootstrap: resampling passages with replacement duplicates points, and a duplicate is a zero nearest-
      neighbour distance (TwoNN's mu = r2 / r1 is then infinite; DESIGN.md sec. 4). Subsampling without
      replacement never duplicates; with m = G / 2 it is the delete-d jackknife with d = G / 2 (Shao & Wu 1989),
      which, unlike the delete-one jackknife, is consistent for non-smooth statistics (a profile's maximum and its
      argmax), and whose variance factor (G - d) / d is 1 there: the spread of the replicates around their mean
      estimates the sampling spread of the full-sample statistic without rescaling. The replicates are on about
      half the points, so their level differs from the full-sample ID (an ID estimate moves with the scale of
      the neighbourhoods): use their deviations from their mean (the caller recentres them on its estimate,
      :func:`recentred_replicates`).

    Parameters
    ----------
    X : array [n_points, n_features] (float64; exact duplicates removed here, as in :func:`id_subsamples`).
    passages : int array [n_points], the passage (prompt) of each point (``tokens/sample_prompt``).
    estimators : names (:func:`canonical_estimator`); those of :data:`RESAMPLED_ESTIMATORS` get replicates.
    n_subsamples, subsample_size, seed : as :func:`id_subsamples` (the subsets of the cross-passage TwoNN).
    n_resamples : passage half-samples (0: none; schema key ``intrinsic_dimension.passage_resamples``).
    min_points : fewest distinct points of an estimate (a resample with fewer gives NaN replicates).
    mle_k : neighbours of the MLEs.
    gride_max_rank, plateau_tol : GRIDE's scale curve and plateau on each resample (as :func:`gride_scaling`,
        whose largest neighbour order is also at most the resample's points - 1); a resample whose GRIDE
        likelihood has no maximum gives NaN.
    cross_passage : False: no cross-passage TwoNN, neither on the subsets nor per resample (the result has no
        ``twonn_cross_passage`` entry); for points that are each their own passage (the last-token ID: one point
        per prompt), where it would be the TwoNN itself.

    Returns
    -------
    dict: ``twonn_cross_passage`` (``id_mean``, ``id_std`` (ddof=0), ``id_min``, ``id_max``, ``ids`` over the
    subsets, ``n_points``, ``subsample_size``, ``n_subsamples``), ``replicates`` ({estimator or
    "twonn_cross_passage": float64 [n_resamples]}, raw half-sample IDs, NaN where a resample cannot be measured),
    ``n_passages`` (G), ``passages_per_resample`` (m), ``neighbours`` (K of the shared list), ``neighbour_list``
    (that list, a :class:`LayerNeighbours`, for :func:`id_subsamples` on the same points).

    Raises
    ------
    TooFewPointsError : fewer distinct points than ``min_points``. ValueError : fewer than 2 passages, bad shapes.

    Source: LSM (TwoNN at corpus token positions, sec. on the ID profile); Facco et al. 2017 (TwoNN); Shao & Wu
    (1989, Ann. Statist. 17: delete-d jackknife); Politis, Romano & Wolf (1999, Subsampling).
    """
    X0, n_exact, first = deduplicate(as_points(X), return_index=True)
    g_all = np.asarray(passages)
    if g_all.shape != (as_points(X).shape[0],):
        raise ValueError(f"passages must have one entry per point ({as_points(X).shape[0]}), got {g_all.shape}")
    g0 = g_all[first]
    labels, g_codes = np.unique(g0, return_inverse=True)
    G = labels.size
    if G < 2 and cross_passage:  # (without it, one distinct point is too few points: TooFewPointsError below)
        raise ValueError(f"the cross-passage TwoNN needs points of at least 2 passages, got {G}")
    names = [canonical_estimator(e) for e in estimators]
    res_names = [e for e in RESAMPLED_ESTIMATORS if e in names]
    need = max([2] + [int(mle_k) for e in res_names if e.startswith("mle")])
    k_gride = int(gride_max_rank) if "gride" in res_names else 0  # as gride_scaling: fewer when fewer points
    biggest = int(np.bincount(g_codes).max())
    K = min(X0.shape[0] - 1, 2 * max(need, k_gride) + (biggest if cross_passage else 0) + EXTRA_CANDIDATES)
    Xk, dist, idx, _, _, kept = prepare_neighbors(X0, K, max(int(min_points), 3), "ID", distinct=True,
                                                  return_kept=True)
    shared = LayerNeighbours(X0, Xk, dist, idx)
    g = g_codes[kept]
    n = Xk.shape[0]
    # the subsets of id_subsamples are drawn on the n0 deduplicated points; zero-distance points removed here
    # (normally none) are left out of them
    pos = np.full(X0.shape[0], -1)
    pos[kept] = np.arange(n)
    full = shared.fallback  # the candidate ranking of rows whose K-list runs short, kept for every selection
    cross = []
    for sel in (subsample_indices(X0.shape[0], n_subsamples=n_subsamples, size=subsample_size, seed=seed)
                if cross_passage else []):
        rows = pos[sel][pos[sel] >= 0]
        cand = np.zeros(n, bool)
        cand[rows] = True
        d2, _ = knn_among(Xk, dist, idx, 2, rows=rows, candidates=cand, groups=g, exclude_own_group=True,
                          fallback=full)
        cross.append(twonn_from_distances(d2))
    a = np.asarray(cross)
    m = G // 2
    rng = np.random.default_rng([int(seed), 4802])
    reps = {e: np.full(int(n_resamples), np.nan) for e in res_names + ([CROSS_PASSAGE] if cross_passage else [])}
    for b in range(int(n_resamples)):
        keep_g = np.zeros(G, bool)
        keep_g[rng.choice(G, size=m, replace=False)] = True
        cand = keep_g[g]
        rows = np.flatnonzero(cand)
        if rows.size < max(int(min_points), need + 1):
            continue
        d, i = knn_among(Xk, dist, idx, max(need, min(k_gride, rows.size - 1)), rows=rows, candidates=cand,
                         fallback=full)
        if "twonn" in res_names:
            reps["twonn"][b] = twonn_from_distances(d)
        if any(e.startswith("mle") for e in res_names):
            # skdim's MLE on the resample's points (neighbour indices renumbered into them), fitted once: its
            # pointwise estimates combined as skdim combines them (comb "mle": harmonic mean; "mean": mean)
            sub = np.full(n, -1)
            sub[rows] = np.arange(rows.size)
            k = int(mle_k)
            knn = (np.ascontiguousarray(d[:, :k]), np.ascontiguousarray(sub[i[:, :k]]))
            fit = skdim.id.MLE().fit(Xk[rows], precomputed_knn_arrays=knn, n_neighbors=k, comb="mle")
            for e, v in (("mle_mg", fit.dimension_), ("mle_lb", np.mean(fit.dimension_pw_))):
                if e in reps:
                    reps[e][b] = v
        if "gride" in res_names:
            try:  # the plateau of this resample's scale curve (a curve without a likelihood maximum: NaN)
                reps["gride"][b] = _gride_knn(d, int(gride_max_rank), plateau_tol)["id"]
            except ValueError:
                pass
        if not cross_passage:
            continue
        try:  # a kept passage whose other kept passages hold fewer than 2 points: no replicate (NaN)
            d2, _ = knn_among(Xk, dist, idx, 2, rows=rows, candidates=cand, groups=g, exclude_own_group=True,
                              fallback=full)
            reps[CROSS_PASSAGE][b] = twonn_from_distances(d2)
        except ValueError:
            pass
    out = {"replicates": reps, "n_passages": int(G), "passages_per_resample": int(m), "neighbours": int(K),
           "neighbour_list": shared}
    if not cross_passage:
        return out
    return {**out, CROSS_PASSAGE: {"id_mean": float(a.mean()), "id_std": float(a.std()), "id_min": float(a.min()),
                            "id_max": float(a.max()), "ids": [float(v) for v in a], "n_points": int(n),
                            "subsample_size": int(min(int(subsample_size), X0.shape[0])),
                            "n_subsamples": int(n_subsamples), "n_duplicates_removed": int(n_exact)}}


def recentred_replicates(estimate, replicates, *, scale: float = 1.0) -> np.ndarray:
    """Subsampling replicates moved onto an estimate: ``estimate + scale * (replicates - mean(replicates))``.

    Half-sample replicates (:func:`passage_resampled_ids`) carry the spread of the full-sample statistic but the
    level of an ID on half the points; recentring keeps the spread and puts them around ``estimate`` (the
    variance factor ``scale`` = sqrt((G - d) / d) of the delete-d jackknife is 1 for d = G / 2).

    Args: estimate: float (or float64 [L] per layer); replicates: float64 [B] (or [B, L]), NaN ignored in the
    mean; scale: >= 0. Returns: float64 of the shape of ``replicates`` (NaN stays NaN; all NaN or empty: as given).
    """
    r = np.asarray(replicates, dtype=np.float64)
    if r.size == 0 or not np.isfinite(r).any():
        return r.copy()
    with np.errstate(invalid="ignore"):
        return np.asarray(estimate, dtype=np.float64) + float(scale) * (r - np.nanmean(r, axis=0))
