"""Rate-distortion exponent of a point cloud: held-out k-means distortion D(N) ~ N^(-2/k) (pure arrays).

Source: LSM, "Latent Semantic Manifolds in Large Language Models", Theorem 10.8 (any N-point vocabulary on a
k-dimensional manifold M has distortion D >= c_k (vol(M)/N)^(2/k)); high-resolution quantization theory
(Zador 1982; Graf & Luschgy 2000, Thm. 6.2) gives the same exponent for optimal codebooks. So on a
k-dimensional manifold log D(N) = a - (2/k) log N, and k_RD = -2 / slope is a dimension estimate.

Procedure (:func:`distortion_curve`, :func:`rate_distortion_exponent`):

* split the points at random into a training half and a held-out half (``train_fraction``);
* for each N on a log grid from ``n_min`` to ``max_fraction`` * n_train (bounded by the points available),
  learn a codebook of N centres on the training split with scikit-learn's ``KMeans`` (one initialisation:
  N random distinct training points, or k-means++ with one local trial; ``max_iter`` Lloyd steps; float32);
* D(N) = mean over held-out points of the squared Euclidean distance to the nearest centre (units: squared
  activation units);
* fit range rule: among the windows of at least ``min_fit_points`` consecutive grid points, the longest whose
  least-squares line in (log N, log D) has R^2 >= ``r2_min`` (ties: the higher R^2); when none reaches
  ``r2_min``, the shortest windows' best R^2 (``straight`` = False);
* interval: a basic bootstrap over held-out points (resampled with replacement, the same resample for every N,
  the codebooks fixed), the slope refitted on the chosen range each time.

Nothing here touches a model or an HDF5 file.
"""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans, kmeans_plusplus

from llmgeom.core.stats import bootstrap_interval
from llmgeom.measures.neighbors import TooFewPointsError, as_points, deduplicate


def n_grid(n_train: int, *, n_min: int, max_fraction: float, n_points: int) -> np.ndarray:
    """Log-spaced codebook sizes from ``n_min`` to ``max_fraction * n_train`` (distinct integers).

    ``n_min``, ``max_fraction``, ``n_points``: schema keys ``rate_distortion.n_min``, ``.max_fraction``,
    ``.n_points``.

    Returns:
        int64 array [<= n_points], increasing.

    Raises:
        TooFewPointsError: ``max_fraction * n_train`` < 2 ``n_min`` (fewer than two octaves of N).
    """
    n_max = int(np.floor(max_fraction * n_train))
    if n_max < 2 * int(n_min):
        raise TooFewPointsError(f"{n_train} training points allow codebooks up to N = {n_max}, fewer than two "
                                f"octaves above n_min = {n_min}: use more points (extract.sample_per_prompt) or "
                                "a smaller rate_distortion.n_min")
    return np.unique(np.round(np.geomspace(int(n_min), n_max, int(n_points))).astype(np.int64))


def _sq_dist_to_nearest(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Squared distance [n] of each row of X [n, d] to its nearest row of C [N, d] (float64 accumulation)."""
    x2 = np.einsum("nd,nd->n", X, X, dtype=np.float64)
    c2 = np.einsum("nd,nd->n", C, C, dtype=np.float64)
    d2 = x2[:, None] + c2[None, :] - 2.0 * (X @ C.T).astype(np.float64)
    j = np.argmin(d2, axis=1)
    diff = X.astype(np.float64) - C[j].astype(np.float64)  # exact value at the chosen centre
    return np.einsum("nd,nd->n", diff, diff)


def distortion_curve(X, *, n_min: int, max_fraction: float, n_points: int, train_fraction: float, max_iter: int,
                     init: str, seed: int = 0) -> dict:
    """Held-out mean squared k-means distortion D(N) on a log grid of codebook sizes N.

    Parameters
    ----------
    X : array [n_points, n_features] (finite; exact duplicate rows removed first, in float64).
    n_min, max_fraction, n_points : the grid, see :func:`n_grid` (N <= max_fraction * n_train).
    train_fraction : share of the distinct points used to learn the codebooks (rest: held out).
    max_iter : Lloyd iterations of ``sklearn.cluster.KMeans`` (one initialisation).
    init : "random" (N distinct training points; the schema's default: the k-means++ seeding costs ~10x more on
        600 x 576 points and changes the fitted exponent little, see docs/lsm-predictions.md) or "k-means++" (one
        local trial).
    All six are required: schema keys ``rate_distortion.n_min`` ... ``rate_distortion.init``.
    seed : seed of the split and of the initialisations.

    Returns
    -------
    dict: ``n`` (int64 [G] codebook sizes), ``distortion`` (float64 [G], mean squared distance of held-out points
    to the nearest centre, squared activation units), ``sq_dist`` (float64 [G, n_test], per held-out point, for
    the bootstrap), ``n_train``, ``n_test``, ``n_duplicates_removed``.

    Raises
    ------
    ValueError : bad X or train_fraction outside (0, 1). TooFewPointsError : too few points for two octaves of N.

    Source: LSM Theorem 10.8; Graf & Luschgy 2000 (quantization of probability distributions).
    """
    if init not in ("random", "k-means++"):
        raise ValueError(f"init must be 'random' or 'k-means++', got {init!r}")
    if not 0.0 < float(train_fraction) < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
    X, n_dup = deduplicate(as_points(X))
    rng = np.random.default_rng(seed)
    perm = rng.permutation(X.shape[0])
    n_train = int(round(train_fraction * X.shape[0]))
    grid = n_grid(n_train, n_min=n_min, max_fraction=max_fraction, n_points=n_points)
    tr = np.ascontiguousarray(X[perm[:n_train]], dtype=np.float32)
    te = np.ascontiguousarray(X[perm[n_train:]], dtype=np.float32)
    sq = np.empty((grid.size, te.shape[0]))
    for i, N in enumerate(grid):
        rs = int(rng.integers(2**31))
        if init == "k-means++":
            c0, _ = kmeans_plusplus(tr, int(N), n_local_trials=1, random_state=rs)
        else:  # N distinct training points at random (sklearn's "random" init), ~10x cheaper than k-means++
            c0 = tr[np.sort(np.random.default_rng(rs).choice(tr.shape[0], int(N), replace=False))]
        km = KMeans(int(N), init=c0, n_init=1, max_iter=int(max_iter), random_state=rs).fit(tr)
        sq[i] = _sq_dist_to_nearest(te, km.cluster_centers_.astype(np.float32))
    return {"n": grid, "distortion": sq.mean(axis=1), "sq_dist": sq, "n_train": n_train,
            "n_test": int(te.shape[0]), "n_duplicates_removed": n_dup}


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    slope, icpt = np.polyfit(x, y, 1)
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - slope * x - icpt) ** 2).sum()) / ss if ss > 0 else float("nan")
    return float(slope), float(icpt), r2


def fit_range(n, distortion, *, min_fit_points: int, r2_min: float) -> dict:
    """Choose the straight range of log D(N) vs log N and fit log D = a - (2/k) log N on it.

    Rule: among windows of >= ``min_fit_points`` consecutive grid points, the longest with R^2 >= ``r2_min``
    (ties: higher R^2); if none qualifies, the window of ``min_fit_points`` points with the highest R^2 and
    ``straight`` = False. Schema keys ``rate_distortion.min_fit_points`` and ``rate_distortion.r2_min``.

    Returns:
        dict ``k_rd`` (-2 / slope; NaN when the slope is >= 0), ``slope``, ``intercept`` (a, natural log),
        ``r2``, ``fit_lo`` / ``fit_hi`` (first and last grid index of the window), ``fit_n_min``, ``fit_n_max``,
        ``fit_points``, ``straight``.

    Raises:
        ValueError: fewer grid points than ``min_fit_points`` (>= 2) or non-positive distortions.
    """
    n = np.asarray(n, np.float64)
    D = np.asarray(distortion, np.float64)
    m = max(int(min_fit_points), 2)
    if n.size < m or n.shape != D.shape:
        raise ValueError(f"need >= {m} matching grid points, got n {n.shape} and distortion {D.shape}")
    if np.any(D <= 0) or np.any(n <= 0):
        raise ValueError("n and distortion must be > 0 for a log-log fit")
    x, y = np.log(n), np.log(D)
    best = None
    for lo in range(n.size):
        for hi in range(lo + m - 1, n.size):
            s, a, r2 = _line(x[lo:hi + 1], y[lo:hi + 1])
            ok = r2 >= r2_min
            key = (ok, (hi - lo) if ok else -(hi - lo), r2)
            if best is None or key > best[0]:
                best = (key, lo, hi, s, a, r2)
    (ok, _, _), lo, hi, s, a, r2 = best
    return {"k_rd": -2.0 / s if s < 0 else float("nan"), "slope": s, "intercept": a, "r2": r2,
            "fit_lo": lo, "fit_hi": hi, "fit_n_min": int(n[lo]), "fit_n_max": int(n[hi]),
            "fit_points": hi - lo + 1, "straight": bool(ok)}


def rate_distortion_exponent(X, *, n_boot: int, ci: float, min_fit_points: int, r2_min: float, seed: int = 0,
                             **curve_kw) -> dict:
    """Rate-distortion dimension k_RD of a point cloud with a bootstrap interval.

    Parameters
    ----------
    X : array [n_points, n_features], e.g. residual-stream states of one layer at sampled corpus tokens.
    n_boot : bootstrap resamples of the held-out points (0: no interval, NaN bounds; schema key
        ``rate_distortion.n_boot``).
    ci : central coverage of the interval (the rate_distortion section has no ci key: the caller passes 0.95).
    min_fit_points, r2_min : the fit-range rule of :func:`fit_range`.
    seed : seed of the split, the k-means initialisations and the bootstrap.
    **curve_kw : passed to :func:`distortion_curve` (n_min, max_fraction, n_points, train_fraction, max_iter,
        init: all required there).

    Returns
    -------
    dict: the keys of :func:`fit_range`, ``k_rd_lo`` / ``k_rd_hi`` (basic bootstrap interval of k_RD over held-out
    points with the codebooks fixed), ``k_rd_replicates`` (float64 [n_boot], the replicates it is taken from; NaN for
    a resample without a falling fit), ``n_boot``, ``n_train``, ``n_test``, ``n_duplicates_removed``, ``n_grid``
    (list of N), ``distortion_grid`` (list of D(N)).

    Raises
    ------
    ValueError, TooFewPointsError : as :func:`distortion_curve` / :func:`fit_range`.

    Source: LSM Theorem 10.8 (D >= c_k (vol M / N)^(2/k)); bootstrap: Davison & Hinkley 1997, sec. 5.2.
    """
    c = distortion_curve(X, seed=seed, **curve_kw)
    f = fit_range(c["n"], c["distortion"], min_fit_points=min_fit_points, r2_min=r2_min)
    lo, hi = f["fit_lo"], f["fit_hi"]
    x = np.log(c["n"][lo:hi + 1].astype(np.float64))
    sq = c["sq_dist"][lo:hi + 1]
    reps = np.full(int(n_boot), np.nan)
    rng = np.random.default_rng([int(seed), 1])
    xc = x - x.mean()
    for b in range(int(n_boot)):
        idx = rng.integers(0, sq.shape[1], sq.shape[1])
        y = np.log(sq[:, idx].mean(axis=1))
        s = float((xc * (y - y.mean())).sum() / (xc * xc).sum())
        reps[b] = -2.0 / s if s < 0 else np.nan
    k_lo, k_hi = (bootstrap_interval(f["k_rd"], reps, ci=ci) if int(n_boot) > 0 else (np.nan, np.nan))
    return dict(f, k_rd_lo=k_lo, k_rd_hi=k_hi, k_rd_replicates=reps, n_boot=int(n_boot), n_train=c["n_train"], n_test=c["n_test"],
                n_duplicates_removed=c["n_duplicates_removed"], n_grid=[int(v) for v in c["n"]],
                distortion_grid=[float(v) for v in c["distortion"]])
