"""The value-manifold estimator: PCA shares, participation ratio, signed PC scores, bootstrap (pure arrays).

Source: Paper III, "Geometric Scaling of Bayesian Inference in LLMs", sec. 4 (value manifolds),
and DESIGN.md sec. 3 ("Value manifold"). Per prompt, one row of ``X`` ([n_prompts, n_features]: e.g.
the last-token value vectors concatenated over heads, or the residual stream); each coordinate is
standardized across prompts, PCA is taken, and we report PC1, PC2 and PC1+PC2 explained-variance
shares with basic (reverse-percentile) bootstrap CIs over prompts and the bias-corrected estimate
2 t - mean(replicates) they are centred on, the participation ratio PR = (sum lambda)^2 / sum lambda^2
(over the full spectrum and over the top 10 eigenvalues), and the PC scores with a stated sign.

One estimator, :class:`ValueManifoldPCA` (scikit-learn style: hyperparameters in the constructor,
``fit(X, reference)`` checks its input once, results as attributes ending in ``_``), is used by every
table: value manifold, domain restriction, SULA geometry, wind-tunnel geometry and the intervention
entropy axis. :func:`value_manifold_stats` is its one-call summary dict (the columns of the tables).

Sign convention (DESIGN.md sec. 4, "PCA sign is arbitrary"): a :class:`SignConvention` names the
reference quantity and the correlation (``llmgeom.core.stats.spearman`` or ``pearson``); each kept
component's sign is chosen so that corr(score, reference) >= 0, and its ``label`` (e.g.
``"spearman(next_token_entropy) >= 0"``) is written into every table as ``pc1_sign``.

Nothing here touches a model or an HDF5 file. All computation is in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.decomposition import PCA
from scipy.linalg import lapack

from llmgeom.core.stats import bias_corrected, bootstrap_interval, pearson, spearman

# A column whose standard deviation is below this multiple of (float64 eps * its largest absolute
# value) is treated as constant: its "variance" is rounding noise from the mean, and z-scoring it
# would blow that noise up to unit variance.
_CONST_TOL = 16.0

#: Eigenvalues used by the published Paper III code for its participation ratio (the top 10 PCA eigenvalues).
PR_TOP = 10


def _as_2d_float64(X, name: str = "X") -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D [n_points, n_features], got shape {X.shape}")
    if X.shape[0] < 2:
        raise ValueError(f"{name} needs at least 2 points (rows), got {X.shape[0]}")
    if X.shape[1] < 1:
        raise ValueError(f"{name} needs at least 1 feature (column), got {X.shape[1]}")
    if not np.all(np.isfinite(X)):
        bad = int(np.size(X) - np.count_nonzero(np.isfinite(X)))
        raise ValueError(f"{name} contains {bad} non-finite values (NaN or inf)")
    return X


def standardize_columns(X, standardize: bool = True, *, weights=None, parent=None) -> tuple[np.ndarray, np.ndarray]:
    """Centre (and optionally z-score) each column of ``X`` across points.

    Parameters
    ----------
    X : array [n_points, n_features], any real dtype (cast to float64), finite; or, with ``weights``,
        a batch [n_batch, m, n_features] of point sets (e.g. the distinct rows of bootstrap resamples).
    standardize : if True divide each centred column by its standard deviation (ddof=0);
        columns with zero variance are dropped (never divided by zero). A column counts as
        constant when max == min, or when its std is at rounding-noise level
        (std <= 16 * eps * max|column|). If False, only centre; constant columns are kept
        (set exactly to 0, so they contribute nothing to the variance).
    weights : optional [n_batch, m] positive multiplicities of the rows (a bootstrap resample is its
        distinct rows with their counts): mean and variance are the weighted ones (ddof=0). The same
        rule drops constant columns, but in place: a dropped column is set to 0 (the batch keeps its
        shape), and the rows are *not* multiplied by sqrt(weight) (the caller does that where needed).
    parent : optional (distinct [n_features] bool, absmax [n_features]) of the sample the weighted rows
        were drawn from (a column's values all distinct; its max |value|): the same outcome with less work.

    Returns
    -------
    Z : float64 array [n_points, n_kept] (centred / standardized data); with ``weights``
        [n_batch, m, n_features].
    kept : bool array [n_features] (with ``weights``: [n_batch, n_features]), True for the columns kept.

    Raises
    ------
    ValueError : X not 2-D, fewer than 2 rows, non-finite values, or no column with variance
        (without ``weights``; a batch member without variance has no kept column instead).

    Source: Paper III sec. 4 ("standardize each coordinate across prompts").
    """
    if weights is not None:
        return _standardize_weighted(np.asarray(X, dtype=np.float64), np.asarray(weights, np.float64), standardize,
                                     parent)
    X = _as_2d_float64(X)
    varies = np.ptp(X, axis=0) > 0
    if not np.any(varies):
        raise ValueError("X has zero total variance (all rows identical)")
    Z = X - X.mean(axis=0)
    if not standardize:
        Z[:, ~varies] = 0.0  # exactly constant columns: no rounding noise from the mean
        return Z, np.ones(X.shape[1], dtype=bool)
    std = Z.std(axis=0)
    kept = varies & (std > _CONST_TOL * np.finfo(np.float64).eps * np.max(np.abs(X), axis=0))
    if not np.any(kept):
        raise ValueError("X has no column with non-zero variance (all rows identical)")
    return Z[:, kept] / std[kept], kept


def _standardize_weighted(X: np.ndarray, w: np.ndarray, standardize: bool,
                          parent: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The weighted, batched branch of :func:`standardize_columns` (same rule, dropped columns zeroed).

    ``parent`` = (distinct [d], absmax [d]) of the sample the rows were drawn from (all values of a column
    distinct; max |value|) lets the rule skip work without changing its outcome: a column with distinct
    values varies in any batch member of >= 2 rows, and max|column| of a subset is <= the parent's, so
    only columns whose std is below the parent's rounding-noise threshold are re-examined exactly.
    """
    if X.ndim != 3 or w.shape != X.shape[:2]:
        raise ValueError(f"weights must be [n_batch, m] for X [n_batch, m, d], got {w.shape} and {X.shape}")
    eps_tol = _CONST_TOL * np.finfo(np.float64).eps
    if parent is None:
        distinct, absmax = np.zeros(X.shape[2], bool), None
    else:
        distinct, absmax = parent
    varies = np.full((X.shape[0], X.shape[2]), X.shape[1] >= 2)
    tied = np.flatnonzero(~distinct)
    if tied.size:
        varies[:, tied] = X[:, :, tied].max(axis=1) > X[:, :, tied].min(axis=1)
    tot = w.sum(axis=1)[:, None]
    mean = np.matmul(w[:, None, :], X)[:, 0] / tot
    Z = X - mean[:, None, :]
    if not standardize:
        return (Z if varies.all() else Z * varies[:, None, :]), varies
    std = np.sqrt(np.matmul(w[:, None, :], Z * Z)[:, 0] / tot)
    if absmax is None:
        kept = varies & (std > eps_tol * np.abs(X).max(axis=1))
    else:
        kept = varies & (std > eps_tol * absmax)
        b, c = np.nonzero(varies & ~kept)  # below the parent's threshold: the subset's own max decides
        if b.size:
            kept[b, c] = std[b, c] > eps_tol * np.abs(X[b, :, c]).max(axis=1)
    return Z * np.where(kept, 1.0 / np.where(kept, std, 1.0), 0.0)[:, None, :], kept


def _fit_pca(Z: np.ndarray) -> PCA:
    """scikit-learn PCA (full SVD, float64) of the already centred/standardized ``Z`` [n, d], all components."""
    # Data are already centred; PCA re-centres (a no-op up to rounding). 'full' = exact LAPACK SVD.
    return PCA(svd_solver="full").fit(Z)


def _pca_scores(pca: PCA, Z: np.ndarray, k: int) -> np.ndarray:
    """Scores of ``Z`` on the first ``k`` components: scikit-learn's ``PCA._transform`` arithmetic
    (Z C^T - mean C^T), so that they equal ``PCA(n_components=k).fit(Z).transform(Z)`` bit for bit (a k-component
    fit stores C as a Fortran-ordered [k, d] array; the memory layout decides the BLAS kernel, hence the last bits)."""
    C = np.asfortranarray(pca.components_[:k])
    S = Z @ C.T
    S -= np.reshape(pca.mean_, (1, -1)) @ C.T
    return np.asarray(S, dtype=np.float64)
def participation_ratio(eigvals) -> float:
    """Participation ratio PR = (sum l)^2 / sum l^2 of a spectrum.

    Parameters
    ----------
    eigvals : 1-D array-like of non-negative eigenvalues (covariance eigenvalues or explained-
        variance ratios; PR is scale-invariant, so either gives the same value). Tiny negative
        values from rounding (>= -1e-12 * max) are treated as 0.

    Returns
    -------
    PR : float in [1, rank], where rank = number of non-zero eigenvalues (clipped into that range
        to absorb rounding). Dimensionless "effective number of dimensions".

    Raises
    ------
    ValueError : empty input, non-finite values, clearly negative values, or all zeros.

    Source: Paper III sec. 4 (participation ratio of the value manifold).
    """
    lam = np.asarray(eigvals, dtype=np.float64).ravel()
    if lam.size == 0:
        raise ValueError("eigvals is empty")
    if not np.all(np.isfinite(lam)):
        raise ValueError("eigvals contains non-finite values")
    top = lam.max()
    if top <= 0:
        raise ValueError("eigvals are all zero (or negative): participation ratio undefined")
    if lam.min() < -1e-12 * top:
        raise ValueError(f"eigvals must be non-negative, got min {lam.min()!r}")
    lam = np.clip(lam, 0.0, None) / top  # rescale: no overflow in the squares
    rank = int(np.count_nonzero(lam))
    pr = lam.sum() ** 2 / np.sum(lam * lam)
    return float(np.clip(pr, 1.0, rank))


def participation_ratio_top(eigvals, top: int = PR_TOP) -> float:
    """Participation ratio of the ``top`` largest eigenvalues only (default 10: the published Paper III
    code's definition; the full-spectrum value is :func:`participation_ratio`).

    Parameters
    ----------
    eigvals : 1-D array-like of non-negative eigenvalues (any order; sorted here).
    top : number of largest eigenvalues kept (>= 1); all of them if fewer exist.

    Returns
    -------
    PR in [1, min(top, rank)] (dimensionless): the PR of a truncated spectrum, so it never exceeds
    ``top``; compare it only with values computed the same way.

    Raises
    ------
    ValueError : as :func:`participation_ratio`, or top < 1.

    Source: Paper III sec. 4 (participation ratio) as computed by its published code (top 10 PCA
    eigenvalues), e.g. 5.94 (top 10) vs 16.29 (full) on the official SULA prompts.
    """
    if int(top) < 1:
        raise ValueError(f"top must be >= 1, got {top!r}")
    lam = np.sort(np.asarray(eigvals, dtype=np.float64).ravel())[::-1]
    return participation_ratio(lam[: int(top)])


@dataclass(frozen=True)
class SignConvention:
    """Sign convention of PC scores: each component's sign makes ``method``(score, reference) >= 0.

    Attributes
    ----------
    reference : name of the reference quantity as the tables call it (e.g. ``"next_token_entropy"``,
        ``"h_model_bits"``, ``"h_exact_bits"``).
    method : ``"spearman"`` (default) or ``"pearson"``, computed by :mod:`llmgeom.core.stats`
        (NaN for a constant reference: then no flip).

    Raises ValueError on an unknown method. Source: DESIGN.md sec. 4 ("PCA sign is arbitrary").
    """

    reference: str
    method: str = "spearman"

    def __post_init__(self):
        if self.method not in ("spearman", "pearson"):
            raise ValueError(f"SignConvention.method must be 'spearman' or 'pearson', got {self.method!r}")

    @property
    def label(self) -> str:
        """The convention as written in the tables' ``pc1_sign`` column, e.g. ``"spearman(next_token_entropy) >= 0"``."""
        return f"{self.method}({self.reference}) >= 0"

    def corr(self, score, reference) -> tuple[float, float]:
        """(statistic, two-sided p) of :func:`llmgeom.core.stats.spearman` / ``pearson`` of score vs reference."""
        return (spearman if self.method == "spearman" else pearson)(score, reference)


#: The convention of value_manifold.csv, domain_restriction.csv and pc_scores.csv (Paper III sec. 4).
ENTROPY_SIGN = SignConvention("next_token_entropy", "spearman")
#: The convention of sula_geometry.csv and the intervention entropy axis: Pearson corr(PC1, H_model) >= 0
#: (Paper III sec. 4.5; H_model = the model's label entropy in bits).
H_MODEL_SIGN = SignConvention("h_model_bits", "pearson")


def _resample_groups(idx: np.ndarray):
    """Yield (resample numbers, distinct row indices [b, m], counts [b, m]) of the bootstrap index sets
    ``idx`` [n_boot, n], grouped by their number m of distinct rows (so each group is one dense batch)."""
    n_boot, n = idx.shape
    counts = np.zeros((n_boot, n), dtype=np.int64)
    np.add.at(counts, (np.arange(n_boot)[:, None], idx), 1)
    present = counts > 0
    m = present.sum(axis=1)
    for mm in np.unique(m):
        bs = np.flatnonzero(m == mm)
        p = present[bs]
        yield bs, np.nonzero(p)[1].reshape(bs.size, mm), counts[bs][p].reshape(bs.size, mm)


def _centred_gram(K0: np.ndarray, X_tied: np.ndarray, any_distinct: bool, u: np.ndarray,
                  w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted Gram matrices W^(1/2) Zc Zc^T W^(1/2) [b, m, m] of centred (not standardized) resamples.

    ``K0`` [n, n] = X0 X0^T of the sample centred once (X0 = X - mean); a resample's distinct rows ``u``
    [b, m] with counts ``w`` [b, m] are re-centred on their weighted mean (p = w / sum w) by the exact
    identity Zc Zc^T = K - K p 1^T - 1 p^T K + (p^T K p) 1 1^T with K = K0[u, u] (X0's own mean cancels), so
    the O(m^2 d) product of each resample becomes O(m^2) (the shares agree with the direct product to
    rounding). The second return, [b, 1] bool, is True where some column varies within the resample (the
    rule of :func:`standardize_columns`: a column with all values distinct (``any_distinct``) varies in any
    resample of >= 2 rows; of the others, ``X_tied`` [n, k], each is checked); without one the spectrum is
    zero and the shares NaN.
    """
    K = K0[u[:, :, None], u[:, None, :]]
    p = w / w.sum(axis=1, keepdims=True)
    Kp = np.matmul(K, p[:, :, None])  # [b, m, 1]
    G = K - Kp - np.swapaxes(Kp, 1, 2) + np.matmul(p[:, None, :], Kp)
    sw = np.sqrt(w)
    G *= sw[:, :, None] * sw[:, None, :]
    varies = np.full(u.shape[0], u.shape[1] >= 2 and any_distinct)
    if X_tied.shape[1] and u.shape[1] >= 2 and not any_distinct:
        Xt = X_tied[u]
        varies = (Xt.max(axis=1) > Xt.min(axis=1)).any(axis=1)
    return G, varies[:, None]


def _top2_eigvals(G: np.ndarray) -> np.ndarray:
    """The two largest eigenvalues, descending and clipped at 0, of each symmetric [m, m] matrix of ``G``
    [b, m, m] (LAPACK ``dsyevr`` for an index range: only those two are computed); float64 [b, 2], the second 0
    when m = 1."""
    b, m, _ = G.shape
    out = np.zeros((b, 2))
    if m == 0:
        return out
    k = min(2, m)
    syevr = lapack.get_lapack_funcs("syevr", (G,))
    for i in range(b):
        w, _, _, _, info = syevr(G[i], compute_v=0, range="I", il=m - k + 1, iu=m, lower=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"LAPACK dsyevr failed (info={info}) on a bootstrap Gram matrix")
        out[i, :k] = w[:k][::-1]
    return np.clip(out, 0.0, None)


def _bootstrap_shares(X: np.ndarray, idx: np.ndarray, standardize: bool, chunk: int = 64) -> np.ndarray:
    """PC1, PC2, PC1+PC2 explained-variance shares of every bootstrap resample ``X[idx[b]]``.

    Each resample is its distinct rows U with their counts w (``standardize_columns(X[U], weights=w)``:
    the same rule as the reference path); its Gram matrix W^(1/2) Z Z^T W^(1/2) [m, m] (m ~ 0.63 n
    distinct rows; Z^T W Z [d, d] when d < m) has the non-zero eigenvalues of the resample's covariance
    (up to the factor n): its two largest eigenvalues (:func:`_top2_eigvals`) over the trace.
    Centre-only with d >= n: the Gram matrices come from one kernel of the sample (:func:`_centred_gram`).
    Resamples without variance give NaN rows. Returns float64 [n_boot, 3].
    """
    n_boot, n = idx.shape
    d = X.shape[1]
    out = np.full((n_boot, 3), np.nan)
    parent = ((np.diff(np.sort(X, axis=0), axis=0) != 0).all(axis=0), np.abs(X).max(axis=0))
    centred_gram = not standardize and d >= n
    if centred_gram:  # centre-only, wide X: each resample's Gram is a re-centred block of one [n, n] kernel
        X0 = X - X.mean(axis=0)
        K0, X_tied, any_distinct = X0 @ X0.T, X[:, ~parent[0]], bool(parent[0].any())
    for bs, U, cnt in _resample_groups(idx):
        for a in range(0, bs.size, chunk):
            u, w = U[a:a + chunk], cnt[a:a + chunk].astype(np.float64)
            if centred_gram:
                G, kept = _centred_gram(K0, X_tied, any_distinct, u, w)
            else:
                Z, kept = standardize_columns(X[u], standardize, weights=w, parent=parent)
                if d >= u.shape[1]:
                    sw = np.sqrt(w)
                    G = (Z @ np.swapaxes(Z, 1, 2)) * sw[:, :, None] * sw[:, None, :]
                else:
                    G = np.swapaxes(Z, 1, 2) @ (Z * w[:, :, None])
            ev = _top2_eigvals(G)
            tot = np.trace(G, axis1=1, axis2=2)  # = the sum of the eigenvalues
            ok = kept.any(axis=1) & (tot > 0)
            r1 = np.where(ok, ev[:, 0] / np.where(ok, tot, 1.0), np.nan)
            r2 = np.where(ok, ev[:, 1] / np.where(ok, tot, 1.0), np.nan)
            out[bs[a:a + chunk]] = np.stack([r1, r2, r1 + r2], axis=1)
    return out


class ValueManifoldPCA:
    """The value-manifold estimator (one for every table): PCA of standardized rows with signed scores,
    explained-variance shares, participation ratios and bootstrap intervals over rows.

    Parameters
    ----------
    standardize : z-score each column across rows (Paper III; zero-variance columns dropped, see
        :func:`standardize_columns`) if True, else only centre.
    n_components : number of signed scores / components kept (>= 1; at most min(n, n_kept)).
    sign : :class:`SignConvention`, or None for scikit-learn's deterministic but meaningless
        ``svd_flip`` sign (then ``fit`` takes no reference).
    n_boot : bootstrap resamples of the rows (0 = none). Rows are drawn with replacement,
        ``numpy.random.default_rng(seed).integers(0, n, (n_boot, n))``, and the whole statistic
        (standardization included) is recomputed on each resample.
    seed : bootstrap seed (required when n_boot > 0); the same seed reproduces the intervals exactly.
    ci : central coverage of the bootstrap interval, in (0, 1); required when n_boot > 0 (the workflow's is
        schema key ``value_manifold.ci``), unused (None) without a bootstrap.
    ci_method : ``"basic"`` (reverse percentile, [2t - q_hi, 2t - q_lo] clipped to [0, 1]; default) or
        ``"percentile"`` (:func:`llmgeom.core.stats.bootstrap_interval`). Resampling duplicates ~37% of
        the rows, which inflates the top shares when n < d: the percentile interval then lies above the
        estimate; the basic one corrects that shift (Davison & Hinkley 1997, sec. 5.2).
    pr_top : eigenvalues in ``participation_ratio_top_`` (10: the published Paper III code).
    unit_norm : scale every row to unit Euclidean norm before anything else (then standardize / centre as
        above; the bootstrap resamples the scaled rows). In pre-LN transformers the hidden-state norm grows
        with depth and varies across prompts, and PC1 can follow that norm alone: a share that survives the
        scaling is about direction, not size (:func:`unit_rows`).

    Attributes (after :meth:`fit`)
    ------------------------------
    n_, n_features_, n_features_used_ : rows, input columns, columns kept after dropping constants.
    kept_ : bool [n_features], the kept columns.
    explained_variance_ratio_ : float64 [min(n, n_kept)], descending, clipped >= 0, sum 1.
    pc1_, pc2_, pc12_ : shares in [0, 1] (pc2_ = 0 with one component; pc12_ = min(pc1_ + pc2_, 1)).
    participation_ratio_, participation_ratio_top_ : PR of the full spectrum / of the ``pr_top`` largest.
    components_ : [n_components, n_kept] unit loadings of the standardized kept columns, signed.
    scores_ : [n, n_components] PC scores (units of the standardized data), signed; equal bit for bit to
        scikit-learn's ``PCA(n_components).fit(Z).transform(Z)`` up to the sign.
    sign_flipped_ : bool [n_components], components negated to apply ``sign``.
    sign_corr_, sign_p_ : [n_components] the convention's correlation of each signed score with the
        reference and its two-sided p (>= 0 or NaN; NaN everywhere without ``sign``).
    boot_ : [n_boot, 3] (PC1, PC2, PC1+PC2) shares of every resample (NaN rows: resample without
        variance); n_boot_valid_ : resamples with variance.
    interval_ : {"pc1", "pc2", "pc12"} -> (lo, hi) bootstrap interval (NaN without usable resamples).
    bias_corrected_ : {"pc1", "pc2", "pc12"} -> 2 t - mean(replicates) clipped to [0, 1]
        (:func:`llmgeom.core.stats.bias_corrected`), the point the basic interval is centred on.

    Raises
    ------
    ValueError : (constructor) bad hyperparameters; (fit) X not 2-D, fewer than 3 rows, non-finite
        values, no variance, a reference of the wrong length or non-finite, n_components too large.

    Source: Paper III sec. 4 (value manifolds; PC1 / PC1+PC2 shares, PR, rho(PC1, entropy));
    DESIGN.md sec. 3-4.
    """

    def __init__(self, *, standardize: bool = True, n_components: int = 2, sign: SignConvention | None = None,
                 n_boot: int = 0, seed: int | None = None, ci: float | None = None, ci_method: str = "basic",
                 pr_top: int = PR_TOP, unit_norm: bool = False):
        if int(n_boot) != n_boot or n_boot < 0:
            raise ValueError(f"n_boot must be an integer >= 0, got {n_boot!r}")
        if n_boot and seed is None:
            raise ValueError("a bootstrap (n_boot > 0) needs a seed")
        if n_boot and ci is None:
            raise ValueError("a bootstrap (n_boot > 0) needs ci (its interval's coverage)")
        if ci_method not in ("basic", "percentile"):
            raise ValueError(f"ci_method must be 'basic' or 'percentile', got {ci_method!r}")
        if ci is not None and not 0.0 < ci < 1.0:
            raise ValueError(f"ci must be in (0, 1), got {ci!r}")
        if int(n_components) < 1:
            raise ValueError(f"n_components must be >= 1, got {n_components!r}")
        if sign is not None and not isinstance(sign, SignConvention):
            raise ValueError(f"sign must be a SignConvention or None, got {sign!r}")
        self.standardize, self.n_components, self.sign = bool(standardize), int(n_components), sign
        self.n_boot, self.seed, self.ci, self.ci_method, self.pr_top = int(n_boot), seed, ci, ci_method, pr_top
        self.unit_norm = bool(unit_norm)

    def fit(self, X, reference=None) -> "ValueManifoldPCA":
        """Fit on rows ``X`` [n, d] (cast to float64) with the sign reference [n] (required iff ``sign``).

        Returns self. Raises ValueError as described in the class docstring.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D [n_prompts, n_features], got shape {X.shape}")
        n = X.shape[0]
        if n < 3:
            raise ValueError(f"the value-manifold estimator needs at least 3 points (prompts), got {n}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X contains non-finite values (NaN or inf)")
        if self.sign is not None:
            ref = np.asarray(reference, dtype=np.float64)
            if ref.ndim != 1 or ref.shape[0] != n:
                raise ValueError(f"the sign reference {self.sign.reference!r} must have shape ({n},) to match "
                                 f"X {X.shape}, got {ref.shape}")
            if not np.all(np.isfinite(ref)):
                raise ValueError(f"the sign reference {self.sign.reference!r} contains non-finite values")
        elif reference is not None:
            raise ValueError("a reference was given but sign=None: pass sign=SignConvention(...)")
        if self.unit_norm:
            X = unit_rows(X)

        Z, kept = standardize_columns(X, self.standardize)
        pca = _fit_pca(Z)
        evr = np.clip(np.asarray(pca.explained_variance_ratio_, dtype=np.float64), 0.0, None)
        evr = evr / evr.sum()
        k = self.n_components
        if k > evr.size:
            raise ValueError(f"n_components must be in [1, {evr.size}], got {k}")
        S = _pca_scores(pca, Z, k)
        # Identical prompts (rows) must get bit-identical scores, so that their ranks tie exactly (DESIGN sec. 4,
        # floating-point ties): BLAS may round the same row differently at another position of the matrix, so
        # every duplicate takes the score of its first occurrence (e.g. layer-0 values depend on the final token only).
        _, first, inv = np.unique(X, axis=0, return_index=True, return_inverse=True)
        S = S[first][np.reshape(inv, -1)]
        C = np.array(pca.components_[:k], dtype=np.float64)
        flipped = np.zeros(k, dtype=bool)
        corr, p = np.full(k, np.nan), np.full(k, np.nan)
        if self.sign is not None:
            for j in range(k):
                r, pj = self.sign.corr(S[:, j], ref)
                flipped[j] = bool(np.isfinite(r) and r < 0)
                if flipped[j]:  # negating the score negates the correlation; the two-sided p is unchanged
                    S[:, j], C[j], r = -S[:, j], -C[j], -r
                corr[j], p[j] = r, pj

        self.n_, self.n_features_ = int(n), int(X.shape[1])
        self.kept_, self.n_features_used_ = kept, int(np.count_nonzero(kept))
        self.explained_variance_ratio_ = evr
        self.pc1_ = float(evr[0])
        self.pc2_ = float(evr[1]) if evr.size > 1 else 0.0
        self.pc12_ = float(min(self.pc1_ + self.pc2_, 1.0))
        self.participation_ratio_ = participation_ratio(evr)
        self.participation_ratio_top_ = participation_ratio_top(evr, self.pr_top)
        self.components_, self.scores_, self.sign_flipped_ = C, S, flipped
        self.sign_corr_, self.sign_p_ = corr, p

        est = {"pc1": self.pc1_, "pc2": self.pc2_, "pc12": self.pc1_ + self.pc2_}
        if self.n_boot:
            idx = np.random.default_rng(self.seed).integers(0, n, size=(self.n_boot, n))
            boot = _bootstrap_shares(X, idx, self.standardize)
        else:
            boot = np.empty((0, 3))
        valid = np.all(np.isfinite(boot), axis=1)
        self.boot_, self.n_boot_valid_ = boot, int(np.count_nonzero(valid))
        self.interval_ = {key: (bootstrap_interval(t, boot[valid, j], ci=self.ci, method=self.ci_method,
                                                   bounds=(0.0, 1.0)) if valid.any() else (np.nan, np.nan))
                          for j, (key, t) in enumerate(est.items())}
        self.bias_corrected_ = {key: bias_corrected(t, boot[valid, j], bounds=(0.0, 1.0))
                                for j, (key, t) in enumerate(est.items())}
        return self

    def summary(self) -> dict:
        """The table columns of a fitted estimator (keys documented in :func:`value_manifold_stats`)."""
        iv, bc = self.interval_, self.bias_corrected_
        return {
            "n": self.n_, "n_features": self.n_features_, "n_features_used": self.n_features_used_,
            "pc1": self.pc1_, "pc2": self.pc2_, "pc12": self.pc12_,
            "pc1_lo": float(iv["pc1"][0]), "pc1_hi": float(iv["pc1"][1]),
            "pc2_lo": float(iv["pc2"][0]), "pc2_hi": float(iv["pc2"][1]),
            "pc12_lo": float(iv["pc12"][0]), "pc12_hi": float(iv["pc12"][1]),
            "pc1_bc": bc["pc1"], "pc2_bc": bc["pc2"], "pc12_bc": bc["pc12"],
            "n_boot": self.n_boot, "n_boot_valid": self.n_boot_valid_,
            "ci": float(self.ci) if self.ci is not None else float("nan"),
            "ci_method": self.ci_method, "seed": self.seed, "standardized": self.standardize,
            "participation_ratio": self.participation_ratio_,
            "participation_ratio_top10": self.participation_ratio_top_,
            "spearman_rho": float(self.sign_corr_[0]), "spearman_p": float(self.sign_p_[0]),
            "pc1_sign_flipped": bool(self.sign_flipped_[0]),
            "pc1_sign": self.sign.label if self.sign is not None else "svd_flip (arbitrary)",
        }


def unit_rows(X) -> np.ndarray:
    """``X`` [n, d] with every row divided by its Euclidean norm (float64): the rows' directions only.

    Raises:
        ValueError: X not 2-D, or a row of norm 0 (it has no direction; the message gives its index).

    Source: the pre-LN norm confound of residual-stream PCA (PC1 can follow the hidden-state norm).
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D [n_points, n_features], got shape {X.shape}")
    norm = np.linalg.norm(X, axis=1)
    zero = np.flatnonzero(~(norm > 0))
    if zero.size:
        raise ValueError(f"unit_norm: row(s) {zero[:5].tolist()} of X have norm 0 (or NaN) and no direction")
    return X / norm[:, None]


def explained_variance(X, standardize: bool = True) -> np.ndarray:
    """Explained-variance shares of PCA on ``X`` (:attr:`ValueManifoldPCA.explained_variance_ratio_`).

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; must be finite, >= 3 rows).
    standardize : z-score each column across points (zero-variance columns dropped) if True, else only centre.

    Returns
    -------
    ratios : float64 array [min(n_points, n_kept_features)], descending, non-negative, sum 1.

    Raises
    ------
    ValueError : bad shape, fewer than 3 rows, non-finite values, or no variance at all.

    The spectrum only: the eigenvalues (``scipy.linalg.eigvalsh``) of the scatter matrix of the centred
    (standardized) points, Z^T Z [d, d] or, with fewer points than features, the Gram matrix Z Z^T [n, n] (the same
    non-zero eigenvalues): the squared singular values of scikit-learn's ``PCA(svd_solver="full")``, without its
    SVD (a fifth of its time at 1200 x 576); equal to :attr:`ValueManifoldPCA.explained_variance_ratio_` to
    rounding, 1e-14 (tested).

    Source: Paper III sec. 4 (PC1 and PC1+PC2 explained variance of the value manifold).
    """
    from scipy.linalg import eigvalsh

    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D [n_prompts, n_features], got shape {X.shape}")
    if X.shape[0] < 3:
        raise ValueError(f"the value-manifold estimator needs at least 3 points (prompts), got {X.shape[0]}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains non-finite values (NaN or inf)")
    Z, _ = standardize_columns(X, standardize)
    Z = Z - Z.mean(axis=0)  # PCA re-centres (a no-op up to rounding), as _fit_pca
    var = np.clip(eigvalsh(Z.T @ Z if Z.shape[1] <= Z.shape[0] else Z @ Z.T)[::-1], 0.0, None)
    if not var.sum() > 0:
        raise ValueError("X has no variance (all rows identical)")
    return var / var.sum()


def pc_scores(X, standardize: bool = True, n_components: int = 2, *, sign: SignConvention | None = None,
              reference=None) -> np.ndarray:
    """Signed principal-component scores of the points in ``X`` (:attr:`ValueManifoldPCA.scores_`).

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; finite; >= 3 rows).
    standardize : z-score columns (dropping zero-variance ones) if True, else only centre.
    n_components : number of components; at most min(n_points, n_kept_features).
    sign, reference : :class:`SignConvention` and its reference [n_points]; without them the sign is
        scikit-learn's ``svd_flip`` choice, arbitrary with respect to meaning (DESIGN.md sec. 4).

    Returns
    -------
    scores : float64 array [n_points, n_components], in the units of the (standardized) data.

    Raises
    ------
    ValueError : as :meth:`ValueManifoldPCA.fit`.

    Source: Paper III sec. 4.
    """
    return ValueManifoldPCA(standardize=standardize, n_components=n_components, sign=sign).fit(X, reference).scores_


def value_manifold_stats(X, next_token_entropy, *, n_boot: int, seed: int, ci: float, standardize: bool = True,
                         ci_method: str = "basic", sign: SignConvention = ENTROPY_SIGN,
                         return_boot: bool = False, unit_norm: bool = False) -> dict:
    """Value-manifold summary of :class:`ValueManifoldPCA`: PC shares with bootstrap CIs, PR, signed rho.

    Parameters
    ----------
    X : array [n_prompts, n_features]: one row per prompt (cast to float64).
    next_token_entropy : array [n_prompts], the sign reference (next-token entropy in nats by default;
        any monotone transform gives the same Spearman rho).
    n_boot : bootstrap resamples (>= 1). seed : their ``numpy.random.default_rng`` seed.
    ci : central coverage of the bootstrap intervals, in (0, 1) (schema key ``value_manifold.ci``).
    standardize, ci_method : as :class:`ValueManifoldPCA`.
    sign : the sign convention (default :data:`ENTROPY_SIGN`, Spearman with next-token entropy).
    return_boot : also return the replicates, float64 [n_boot, 3]: ``(stats, boot)``.
    unit_norm : scale each row to unit norm first (:class:`ValueManifoldPCA`).

    Returns
    -------
    dict with keys
        n, n_features (input columns), n_features_used (columns kept after dropping constants),
        pc1, pc2, pc12 : explained-variance fractions in [0, 1] (pc2 = 0 if only one component),
        pc1_lo, pc1_hi, pc2_lo, pc2_hi, pc12_lo, pc12_hi : bootstrap CI bounds (``ci_method``),
        pc1_bc, pc2_bc, pc12_bc : bias-corrected estimates 2 t - mean(replicates) clipped to [0, 1],
        n_boot, n_boot_valid, ci, ci_method, seed, standardized,
        participation_ratio : PR of the full spectrum, in [1, rank],
        participation_ratio_top10 : PR of the 10 largest eigenvalues (the published code's definition),
        spearman_rho, spearman_p : the convention's correlation (PC1 score, reference) after the sign
            fix (>= 0) and its two-sided p; NaN when the reference (or the score) is constant,
        pc1_sign_flipped : True if PC1 was negated to apply the convention,
        pc1_sign : the convention, e.g. "spearman(next_token_entropy) >= 0".

    Raises
    ------
    ValueError : as :meth:`ValueManifoldPCA.fit`, or n_boot < 1.

    Source: Paper III sec. 4 (value manifolds); DESIGN.md sec. 3.
    """
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    est = ValueManifoldPCA(standardize=standardize, n_components=1, sign=sign, n_boot=n_boot, seed=seed, ci=ci,
                           ci_method=ci_method, unit_norm=unit_norm).fit(X, next_token_entropy)
    stats = est.summary()
    return (stats, est.boot_) if return_boot else stats


def null_shares(X, *, n_reps: int, seed: int, standardize: bool = True) -> dict:
    """PC1 and PC1+PC2 shares that noise gives at the same n and d: the data-level nulls of the value manifold.

    Two references, each the mean over ``n_reps`` replicates of :class:`ValueManifoldPCA` shares (same
    ``standardize``):

    * isotropic: i.i.d. N(0, 1) data of X's shape after constant columns are dropped ([n, d_used]); this is
      Horn's (1965) parallel-analysis reference. For standardized isotropic data PC1+PC2 is about
      2 / (n - 1) + O(sqrt(1/d)) when n < d (e.g. ~0.17 at n = 15, d = 1024), so a share is structure only as
      far as it rises above it;
    * shuffled: every column of X permuted independently across rows (the marginals kept, the joint
      structure between coordinates destroyed).

    Parameters
    ----------
    X : array [n_prompts, n_features] (float64 after casting).
    n_reps : replicates (>= 1). seed : ``numpy.random.default_rng`` seed of both references.
    standardize : as :class:`ValueManifoldPCA`.

    Returns
    -------
    dict with pc1_iso, pc12_iso, pc1_shuffled, pc12_shuffled (fractions of variance, [0, 1]) and null_reps.

    Raises
    ------
    ValueError : n_reps < 1, or as :meth:`ValueManifoldPCA.fit` (fewer than 2 rows, no variance).

    Source: data-level nulls (parallel analysis), Horn (1965), "A rationale and test for the number of
    factors in factor analysis"; DESIGN.md sec. 5 (Statistics).
    """
    if int(n_reps) != n_reps or n_reps < 1:
        raise ValueError(f"n_reps must be an integer >= 1, got {n_reps!r}")
    X = np.asarray(X, np.float64)
    if X.ndim != 2 or X.shape[0] < 2:
        raise ValueError(f"X must be [n >= 2, d], got shape {X.shape}")
    Xk = X[:, np.ptp(X, axis=0) > 0]
    if not Xk.shape[1]:
        raise ValueError("X has no varying column: no shares to compare with noise")
    n, R = Xk.shape[0], int(n_reps)
    rng = np.random.default_rng(seed)
    one = np.arange(n)[None]  # each replicate as one "resample" holding every row once: the bootstrap path's shares
    iso = np.concatenate([_bootstrap_shares(rng.standard_normal(Xk.shape), one, standardize) for _ in range(R)])
    shuf = np.concatenate([_bootstrap_shares(np.take_along_axis(Xk, rng.random(Xk.shape).argsort(axis=0), axis=0),
                                             one, standardize) for _ in range(R)])
    return dict(pc1_iso=float(np.nanmean(iso[:, 0])), pc12_iso=float(np.nanmean(iso[:, 2])),
                pc1_shuffled=float(np.nanmean(shuf[:, 0])), pc12_shuffled=float(np.nanmean(shuf[:, 2])),
                null_reps=R)
