"""Statistics used by every table: one Pearson, one Spearman, bootstrap intervals, derived seeds.

Correlations (DESIGN.md sec. 3, "Correlations"): constant input in exact arithmetic gives NaN
("undefined: constant input"), never a number; ties are ranked by average rank on the exact
values. Quantities that are equal in theory must therefore be computed bit-identically upstream
(e.g. the SULA posterior entropy depends on |n_L1 - n_L2| only).

May import: numpy, scipy. Nothing of llmgeom.
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
from scipy import stats as _stats

MIN_POINTS = 3


def _pair(x, y) -> tuple[np.ndarray, np.ndarray] | None:
    x = np.asarray(x, np.float64).ravel()
    y = np.asarray(y, np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"correlation needs two arrays of equal length, got {x.size} and {y.size}")
    if x.size < MIN_POINTS or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        return None
    if np.all(x == x[0]) or np.all(y == y[0]):  # constant input: undefined, not a correlation
        return None
    return x, y


def _correlation(test, x, y) -> tuple[float, float]:
    """(statistic, p) of a scipy correlation test on the checked pair; (NaN, NaN) where undefined."""
    xy = _pair(x, y)
    if xy is None:
        return float("nan"), float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _stats.ConstantInputWarning)
        res = test(*xy)
    return float(res.statistic), float(res.pvalue)


def pearson(x, y) -> tuple[float, float]:
    """Pearson r and its two-sided p-value.

    Args:
        x, y: 1-d arrays of equal length n (any real units; cast to float64).

    Returns:
        (r, p). (NaN, NaN) when n < 3, when either input holds a non-finite value, or when either
        input is constant (all values exactly equal): the correlation is undefined there.

    Raises:
        ValueError: arrays of different length.
    """
    return _correlation(_stats.pearsonr, x, y)


def spearman(x, y) -> tuple[float, float]:
    """Spearman rho (ties ranked by their average rank) and its two-sided p-value.

    Args:
        x, y: 1-d arrays of equal length n (cast to float64; ties are exact equalities).

    Returns:
        (rho, p). (NaN, NaN) when n < 3, on non-finite input, or when either input is constant.
        Known answers: spearman([0, 1, 2, 3, 4], [a, a, a, a, c]) with a > c is -0.7071;
        [a, b, a, b, c] with a > b > c gives -0.7379.

    Raises:
        ValueError: arrays of different length.
    """
    return _correlation(_stats.spearmanr, x, y)


def spearman_rows(x, y) -> np.ndarray:
    """Spearman rho of each row pair: ``out[b]`` = :func:`spearman` ``(x[b], y[b])[0]`` (to rounding), for many
    resamples at once (bootstrap replicates), without a scipy call per row.

    Args:
        x, y: [B, n] arrays (cast to float64; ties ranked by their average rank, ``scipy.stats.rankdata``).

    Returns:
        float64 [B]: the Pearson correlation of the rows' average ranks; NaN where :func:`spearman` is (n < 3,
        a non-finite value in either row, either row constant).

    Raises:
        ValueError: x and y of different shapes or not 2-D.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim != 2:
        raise ValueError(f"spearman_rows needs two [B, n] arrays of one shape, got {x.shape} and {y.shape}")
    out = np.full(x.shape[0], np.nan)
    if x.shape[1] < MIN_POINTS:
        return out
    ok = (np.isfinite(x).all(axis=1) & np.isfinite(y).all(axis=1)
          & (x != x[:, :1]).any(axis=1) & (y != y[:, :1]).any(axis=1))
    if ok.any():
        rx = _stats.rankdata(x[ok], axis=1)
        ry = _stats.rankdata(y[ok], axis=1)
        rx -= rx.mean(axis=1, keepdims=True)
        ry -= ry.mean(axis=1, keepdims=True)
        r = np.einsum("bn,bn->b", rx, ry) / np.sqrt(np.einsum("bn,bn->b", rx, rx) * np.einsum("bn,bn->b", ry, ry))
        out[ok] = np.clip(r, -1.0, 1.0)
    return out


def spearman_exact(x, y, *, alternative: str = "two-sided", max_exact: int = 8) -> tuple[float, float]:
    """Spearman rho with a permutation p-value that is exact for small n (the across-model rank tests: a
    handful of models, where the t approximation of :func:`spearman` is far off).

    Args:
        x, y: 1-d arrays of equal length n (cast to float64; ties ranked by their average rank).
        alternative: "greater" (rho > 0), "less" (rho < 0) or "two-sided".
        max_exact: up to this n every one of the n! pairings is enumerated (8! = 40320); above it,
            9,999 random pairings (seed 0, so the p-value is reproducible).

    Returns:
        (rho, p): p = share of pairings whose rho is at least as extreme as the observed one (ties
        counted). The smallest one-sided p of n points without ties is 1 / n! (n = 4: 0.0417; n = 3:
        0.167). (NaN, NaN) where :func:`spearman` is undefined (n < 3, non-finite or constant input).
        Known answers: x = y = [1, 2, 3, 4]: (1.0, 1/24) with "greater"; y = [1, 1, 2, 2]: (0.894, 1/6).

    Raises:
        ValueError: arrays of different length, an unknown ``alternative``.
    """
    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative must be 'greater', 'less' or 'two-sided', got {alternative!r}")
    xy = _pair(x, y)
    if xy is None:
        return float("nan"), float("nan")
    rx, ry = _stats.rankdata(xy[0]), _stats.rankdata(xy[1])

    def rho(a, axis=-1):
        return np.array([np.corrcoef(rx, r)[0, 1] for r in np.atleast_2d(a)]).reshape(np.shape(a)[:-1])

    exact = rx.size <= max_exact
    res = _stats.permutation_test((ry,), rho, permutation_type="pairings", alternative=alternative,
                                  n_resamples=np.inf if exact else 9999, vectorized=True,
                                  rng=None if exact else np.random.default_rng(0))
    return float(res.statistic), float(res.pvalue)


def derived_seed(seed: int, name: str) -> int:
    """A 32-bit seed derived from (seed, name) (stable across runs, platforms and set order)."""
    return int(np.random.SeedSequence([int(seed), zlib.crc32(name.encode())]).generate_state(1)[0])


def bootstrap_interval(estimate: float, replicates, *, ci: float, method: str = "basic",
                       bounds: tuple[float, float] | None = None) -> tuple[float, float]:
    """Bootstrap confidence interval from replicates of a statistic.

    ``method="basic"`` is what every table uses; report it with :func:`bias_corrected`, the point it
    is centred on (it need not contain the raw estimate t when t is biased).
    ``method="percentile"``: the (1-ci)/2 and (1+ci)/2 quantiles of the replicates.
    ``method="basic"`` (reverse percentile): [2 t - q_hi, 2 t - q_lo], which corrects a shift of
    the replicates against the estimate t (Davison & Hinkley 1997, sec. 5.2). Optional ``bounds``
    clip the interval (e.g. (0, 1) for explained-variance fractions). Non-finite replicates are
    ignored; none left gives (nan, nan). ``ci``, the central coverage in (0, 1), is required: each caller
    passes its own (e.g. schema key ``margins.ci``).

    Raises:
        ValueError: unknown method or ci outside (0, 1).
    """
    if method not in ("basic", "percentile"):
        raise ValueError(f"ci_method must be 'basic' or 'percentile', got {method!r}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci!r}")
    r = np.asarray(replicates, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return float("nan"), float("nan")
    q_lo, q_hi = np.percentile(r, [50.0 * (1.0 - ci), 50.0 * (1.0 + ci)])
    lo, hi = (q_lo, q_hi) if method == "percentile" else (2 * estimate - q_hi, 2 * estimate - q_lo)
    if bounds is not None:
        lo, hi = np.clip(lo, *bounds), np.clip(hi, *bounds)
    return float(lo), float(hi)


def bias_corrected(estimate: float, replicates, *, bounds: tuple[float, float] | None = None) -> float:
    """Bootstrap bias-corrected estimate 2 t - mean(t*_b), the point on which the basic interval is centred.

    Args:
        estimate: the statistic t on the full sample.
        replicates: its bootstrap replicates t*_b (array-like [n_boot]; non-finite ones ignored).
        bounds: optional (lo, hi) clip, e.g. (0, 1) for explained-variance fractions.

    Returns:
        float; NaN when no finite replicate is left. The bootstrap estimates the bias of t as
        mean(t*) - t and subtracts it (Efron & Tibshirani 1993, sec. 10.3; Davison & Hinkley 1997,
        sec. 2.2). With n prompts < d features the sample PC shares are biased upward, and the
        resamples (which duplicate ~37% of the prompts) more so, so the corrected value lies below t.
    """
    r = np.asarray(replicates, dtype=np.float64).ravel()
    r = r[np.isfinite(r)]
    if r.size == 0 or not np.isfinite(estimate):
        return float("nan")
    bc = 2.0 * float(estimate) - float(r.mean())
    if bounds is not None:
        bc = float(np.clip(bc, *bounds))
    return bc


#: suffix of the column that holds a statistic's bootstrap (or resampling) replicates in a table:
#: ``<column>_replicates`` beside ``<column>``, ``<column>_lo`` and ``<column>_hi`` (docs/outputs.md "Replicates")
REPLICATES_SUFFIX = "_replicates"


def replicates_text(replicates) -> str:
    """The replicates of one statistic as one table cell: the values in resample order, space-separated, 9
    significant digits ("nan" for a non-finite one). Resample b of two columns of the same row is the same resample
    (the same drawn prompts, passages or positions), so a verdict that reads two columns can be re-decided per b.

    Args:
        replicates: array-like [n_boot] of the statistic on each resample, in its own units.

    Returns:
        str; "" for no replicates (n_boot = 0). Round trip: :func:`parse_replicates`.
    """
    r = np.asarray(replicates, dtype=np.float64).ravel()
    return " ".join(f"{v:.9g}" if np.isfinite(v) else "nan" for v in r)


def parse_replicates(text) -> np.ndarray:
    """The replicates of a ``<column>_replicates`` cell (:func:`replicates_text`) as float64 [n_boot].

    Args:
        text: the cell: a space-separated string; "", None or NaN (a table read back from CSV) mean none.

    Returns:
        np.ndarray float64 [n_boot] (empty for none; "nan" entries stay NaN: the caller decides on them).

    Raises:
        ValueError: a cell that is not a list of numbers (names the bad token).
    """
    if text is None or (isinstance(text, float) and not np.isfinite(text)):
        return np.empty(0)
    s = str(text).strip()
    if not s:
        return np.empty(0)
    try:
        return np.array([float(t) for t in s.split()], dtype=np.float64)
    except ValueError as e:
        raise ValueError(f"a replicates cell must hold space-separated numbers: {e}") from None


def weighted_mean_interval(column: str, values, weights, *, ci: float,
                           bounds: tuple[float, float] | None = None) -> dict:
    """Bootstrap interval of the mean of per-unit values from resample weights: the columns ``<column>_lo``,
    ``<column>_hi`` (basic interval, :func:`bootstrap_interval`), ``<column>_bc`` (:func:`bias_corrected`) and
    ``<column>_replicates`` (:func:`replicates_text`) of a table that reports ``<column>`` = mean(values).

    Replicate b is the weighted mean sum_i w_bi v_i / sum_i w_bi, with w_bi the times unit i is drawn in resample
    b (e.g. the rows of :class:`llmgeom.measures.margins.PassageBootstrap`, which draws whole passages or sequences:
    a cluster bootstrap, Davison & Hinkley 1997, sec. 3.8; basic interval sec. 5.2). A resample that draws none of
    the units gives a NaN replicate (ignored by the interval).

    Args:
        column: the table column of the mean (the prefix of the four keys).
        values: float array [n] (in the column's units; finite).
        weights: array [n_boot, n] of non-negative resample weights (n_boot = 0: no interval).
        ci: central coverage in (0, 1). bounds: optional clip of the interval and of the corrected value
            (e.g. (0, 1) for fractions).

    Returns:
        dict of the four keys; with n_boot = 0 or no values: NaN lo / hi / bc and "" replicates. Known answer: equal
        values c give lo = hi = bc = c and every replicate c (to rounding: a weighted mean of equal values).

    Raises:
        ValueError: weights not [n_boot, n]; ci outside (0, 1) (with n_boot > 0).
    """
    v = np.asarray(values, np.float64).ravel()
    w = np.asarray(weights, np.float64)
    if w.ndim != 2 or w.shape[1] != v.size:
        raise ValueError(f"weights must be [n_boot, {v.size}], got shape {w.shape}")
    nan = float("nan")
    if w.shape[0] == 0 or v.size == 0:
        return {f"{column}_lo": nan, f"{column}_hi": nan, f"{column}_bc": nan, f"{column}{REPLICATES_SUFFIX}": ""}
    tot = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = np.where(tot > 0, (w @ v) / np.where(tot > 0, tot, 1.0), nan)
    est = float(v.mean())
    lo, hi = bootstrap_interval(est, reps, ci=ci, method="basic", bounds=bounds)
    return {f"{column}_lo": lo, f"{column}_hi": hi, f"{column}_bc": bias_corrected(est, reps, bounds=bounds),
            f"{column}{REPLICATES_SUFFIX}": replicates_text(reps)}
