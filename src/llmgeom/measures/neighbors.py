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


def prepare_neighbors(X, k: int, min_points: int, what: str, *, distinct: bool = False):
    """Dedup, check size, exact k-NN, drop zero-distance points. Returns X, dist, idx, counts.

    ``distinct=True``: the rows are already distinct (the output of :func:`deduplicate` or a subset of it), so the
    deduplication is skipped (the same result, without its sort)."""
    X = as_points(X)
    X, n_exact = (X, 0) if distinct else deduplicate(X)
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
            return X, dist, idx, n_exact, n_zero
        # A point at distance 0 from an earlier row is a duplicate in float64 arithmetic: drop it
        # (keep the first). Ties are broken by index, so the highest-index zero-distance point
        # always has an earlier nearest neighbour and every round removes at least one point.
        drop = zero & (idx[:, 0] < np.arange(X.shape[0]))
        X = X[~drop]
        n_zero += int(np.count_nonzero(drop))
