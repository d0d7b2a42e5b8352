"""Exact nearest neighbours on deduplicated float64 points, shared by TwoNN / MLE and the local-PCA
curvature proxy (LSM; DESIGN.md sec. 4: duplicates make TwoNN return inf/NaN).

May import: numpy, scikit-learn. Nothing of llmgeom but llmgeom.core.
"""

from __future__ import annotations

import numpy as np
from sklearn.neighbors import NearestNeighbors

# Extra neighbour candidates fetched from the approximate (dot-product) search before the exact
# re-ranking, so that rounding in the candidate search cannot push a true neighbour out.
EXTRA_CANDIDATES = 8
# Memory budget (bytes) for one chunk of coordinate differences in the exact re-ranking. Small
# chunks stay in cache: 8 MiB is ~20x faster than 256 MiB for 1000 points x 600 dims.
CHUNK_BYTES = 8 * 2**20
# Largest point cloud for which the curvature proxy uses one global Gram matrix (n^2 float64).
GRAM_MAX_POINTS = 4096


class TooFewPointsError(ValueError):
    """Fewer distinct points remain (after deduplication) than an estimator needs."""


def as_points(X) -> np.ndarray:
    """Cast to a finite float64 array [n_points, n_features]; raise ValueError on other shapes or non-finite values."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D [n_points, n_features], got shape {X.shape}")
    if X.shape[1] < 1:
        raise ValueError("X has no features (columns)")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains non-finite values (NaN or inf)")
    return X


def deduplicate(X, *, return_index: bool = False) -> tuple[np.ndarray, int]:
    """Remove exact duplicate rows after casting to float64.

    Parameters
    ----------
    X : array [n_points, n_features] (any real dtype; compared in float64, so rows that are
        distinct in float32 stay distinct).
    return_index : also return the kept rows' indices into X (int64 [n_unique], ascending), e.g. to carry a
        label per point (its passage) through the deduplication.

    Returns
    -------
    X_unique : float64 array [n_unique, n_features], the first occurrence of each distinct row,
        in the original row order.
    n_removed : int, n_points - n_unique.
    (index : int64 [n_unique], only with ``return_index``.)

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
        return (X.copy(), 0, np.empty(0, np.int64)) if return_index else (X.copy(), 0)
    X = X + 0.0  # normalizes -0.0 to +0.0 so that np.unique treats them as equal
    _, first = np.unique(X, axis=0, return_index=True)
    first = np.sort(first)
    out = X[first], int(X.shape[0] - first.size)
    return (*out, first.astype(np.int64)) if return_index else out


def exact_knn(X: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact Euclidean k-NN (self excluded): distances and indices [n, k], ascending."""
    n, d = X.shape
    m = min(n - 1, k + EXTRA_CANDIDATES)
    Xc = X - X.mean(axis=0)  # centring shrinks the cancellation error of the dot-product trick
    _, cand = NearestNeighbors(n_neighbors=m, algorithm="brute").fit(Xc).kneighbors()
    dist = np.empty((n, m))
    chunk = max(1, CHUNK_BYTES // (8 * m * d))
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        diff = X[cand[s:e]] - X[s:e, None, :]  # uncentred: exact differences of the inputs
        dist[s:e] = np.sqrt(np.einsum("cmd,cmd->cm", diff, diff))
    order = np.lexsort((cand, dist), axis=1)  # by distance, ties by index (deterministic)
    dist = np.take_along_axis(dist, order, axis=1)[:, :k]
    cand = np.take_along_axis(cand, order, axis=1)[:, :k]
    return dist, cand


class FallbackRows:
    """What :func:`knn_among` keeps between calls on the same points X (the selections of one layer): the centred
    points, their squared norms and, per row asked for, its approximate squared distances to every point (the
    dot-product trick of :func:`exact_knn`'s candidate search), float64 [n]."""

    def __init__(self, X: np.ndarray):
        self.Xc = X - X.mean(axis=0)
        self.sq = np.einsum("nd,nd->n", self.Xc, self.Xc)
        self.rows: dict[int, np.ndarray] = {}

    def approximate(self, rows: np.ndarray) -> np.ndarray:
        """Approximate squared distances [len(rows), n] (for ranking candidates only; never returned as distances)."""
        new = np.array([i for i in dict.fromkeys(rows.tolist()) if i not in self.rows], dtype=np.int64)
        if new.size:
            A = self.sq[new, None] + self.sq[None, :] - 2.0 * (self.Xc[new] @ self.Xc.T)
            self.rows.update(zip(new.tolist(), A))
        return np.stack([self.rows[i] for i in rows.tolist()])


def prepare_neighbors(X, k: int, min_points: int, what: str, *, distinct: bool = False, return_kept: bool = False):
    """Dedup, check size, exact k-NN, drop zero-distance points. Returns X, dist, idx, counts.

    ``distinct=True``: the rows are already distinct (the output of :func:`deduplicate` or a subset of it), so the
    deduplication is skipped (the same result, without its sort). ``return_kept=True``: a sixth value, the kept
    rows' indices into the input X (int64, ascending)."""
    X = as_points(X)
    X, n_exact, kept = (X, 0, np.arange(X.shape[0])) if distinct else deduplicate(X, return_index=True)
    n_zero = 0
    while True:
        if X.shape[0] < min_points:
            raise TooFewPointsError(
                f"{what}: only {X.shape[0]} distinct points remain after removing "
                f"{n_exact} exact duplicate rows and {n_zero} zero-distance points; "
                f"at least {min_points} are needed"
            )
        dist, idx = exact_knn(X, k)
        zero = dist[:, 0] == 0.0
        if not zero.any():
            return (X, dist, idx, n_exact, n_zero, kept) if return_kept else (X, dist, idx, n_exact, n_zero)
        # A point at distance 0 from an earlier row is a duplicate in float64 arithmetic: drop it
        # (keep the first). Ties are broken by index, so the highest-index zero-distance point
        # always has an earlier nearest neighbour and every round removes at least one point.
        drop = zero & (idx[:, 0] < np.arange(X.shape[0]))
        X, kept = X[~drop], kept[~drop]
        n_zero += int(np.count_nonzero(drop))


def knn_among(X, dist, idx, k: int, *, rows, candidates, groups=None, exclude_own_group: bool = False,
              fallback: "FallbackRows | None" = None):
    """The first ``k`` neighbours of each query point among the allowed ones, read off one precomputed neighbour list.

    The neighbour search (the costly part) is done once on all points (:func:`exact_knn` or
    :func:`prepare_neighbors`, k = K); this picks, for each query row i, the nearest neighbours j with
    ``candidates[j]`` (and, with ``exclude_own_group``, ``groups[j] != groups[i]``), in the list's order (ascending
    distance, ties by index). A row whose K-list holds fewer than ``k`` allowed neighbours gets them as
    :func:`exact_knn` finds neighbours: candidates among all allowed points by the dot-product trick, ``k`` +
    :data:`EXTRA_CANDIDATES` of them, re-ranked by exact distances (the same ordering), so the result does not
    depend on K.

    Args:
        X: float64 [n, d], the distinct points the list was computed on.
        dist, idx: [n, K] ascending exact distances / indices of each point's K nearest others (self excluded).
        k: neighbours wanted per query row (>= 1).
        rows: int [m], the query points (indices into X).
        candidates: bool [n], the points that may be neighbours (e.g. the points of the passages a resample keeps).
        groups: int [n], group label of each point (e.g. its passage); required with ``exclude_own_group``.
        exclude_own_group: only neighbours of another group than the query point's.
        fallback: a :class:`FallbackRows` of X that the caller keeps for many calls on the same X (e.g. the
            resamples of one layer): a fallback row's candidate ranking is computed once and kept there; the same
            numbers as without it.

    Returns:
        (dist_sel, idx_sel): float64 / int64 [m, k], ascending (Euclidean distances in the units of X).

    Raises:
        ValueError: some query row has fewer than ``k`` allowed points at all; bad shapes.

    Source: LSM (TwoNN at corpus token positions); used for the cross-passage TwoNN and passage resampling of
    :mod:`llmgeom.measures.intrinsic_dimension`.
    """
    rows = np.asarray(rows, dtype=np.int64)
    cand = np.asarray(candidates, dtype=bool)
    if cand.shape != (X.shape[0],) or dist.shape != idx.shape or dist.shape[0] != X.shape[0]:
        raise ValueError(f"shapes: X {X.shape}, dist {dist.shape}, idx {idx.shape}, candidates {cand.shape}")
    if exclude_own_group and groups is None:
        raise ValueError("exclude_own_group needs groups")
    g = None if groups is None else np.asarray(groups)
    nb = idx[rows]
    M = cand[nb]
    if exclude_own_group:
        M &= g[nb] != g[rows, None]
    pos = np.argsort(~M, axis=1, kind="stable")[:, :k]  # allowed entries first, list order kept
    d_sel = np.take_along_axis(dist[rows], pos, axis=1)
    i_sel = np.take_along_axis(nb, pos, axis=1)
    short = np.flatnonzero(M.sum(axis=1) < k)  # too few allowed in the K-list: a search among all allowed
    if short.size:
        q = rows[short]
        ok = np.repeat(cand[None, :], q.size, axis=0)
        ok[np.arange(q.size), q] = False
        if exclude_own_group:
            ok &= g[None, :] != g[q, None]
        n_ok = ok.sum(axis=1)
        if (n_ok < k).any():
            r = int(np.flatnonzero(n_ok < k)[0])
            raise ValueError(f"point {q[r]} has only {n_ok[r]} allowed neighbours, {k} needed")
        # candidates by the dot-product trick (as exact_knn), k + EXTRA_CANDIDATES of them, then exact distances
        cache = fallback if fallback is not None else FallbackRows(X)
        A = np.where(ok, cache.approximate(q), np.inf)
        c = min(X.shape[0], k + EXTRA_CANDIDATES)
        cj = np.argpartition(A, c - 1, axis=1)[:, :c] if c < X.shape[0] else np.broadcast_to(np.arange(c), A.shape)
        diff = X[cj] - X[q][:, None, :]  # uncentred: exact differences of the inputs
        dj = np.sqrt(np.einsum("rcd,rcd->rc", diff, diff))
        dj[~np.take_along_axis(ok, cj, axis=1)] = np.inf  # fewer allowed points than candidates: never chosen
        o = np.lexsort((cj, dj), axis=1)[:, :k]  # by distance, ties by index (the list's order)
        d_sel[short] = np.take_along_axis(dj, o, axis=1)
        i_sel[short] = np.take_along_axis(cj, o, axis=1)
    return d_sel, i_sel
