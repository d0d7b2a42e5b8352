"""Value-manifold geometry of last-token representations (pure arrays).

Source: Paper III, "Geometric Scaling of Bayesian Inference in LLMs", sec. 4 (value manifolds),
and DESIGN.md sec. 3 ("Value manifold"). Per prompt, the final layer's value vectors at the last
token are concatenated over heads into one row of ``X`` ([n_prompts, n_features]); each coordinate
is standardized across prompts, PCA is taken, and we report PC1 and PC1+PC2 explained-variance
fractions with basic (reverse-percentile) bootstrap CIs over prompts and the bias-corrected estimate
2 t - mean(replicates) they are centred on, the participation ratio PR = (sum lambda)^2 / sum lambda^2
(over the full spectrum and over the top 10 eigenvalues), and Spearman rho between the PC1 score and next-token entropy.
The same functions apply unchanged to residual-stream rows.

Nothing here touches a model or an HDF5 file. All computation is in float64.

Sign convention (DESIGN.md sec. 4, "PCA sign is arbitrary"): :func:`value_manifold_stats` fixes
PC1's sign so that Spearman rho(PC1 score, next-token entropy) >= 0. :func:`pc_scores` alone
returns scikit-learn's deterministic (but data-dependent) sign unless ``sign_reference`` is given.
"""

from __future__ import annotations

import numpy as np
from sklearn.decomposition import PCA

from llmgeom.core.stats import bias_corrected, bootstrap_interval, spearman

# A column whose standard deviation is below this multiple of (float64 eps * its largest absolute
# value) is treated as constant: its "variance" is rounding noise from the mean, and z-scoring it
# would blow that noise up to unit variance.
_CONST_TOL = 16.0


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


def standardize_columns(X, standardize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Centre (and optionally z-score) each column of ``X`` across points.

    Parameters
    ----------
    X : array [n_points, n_features], any real dtype (cast to float64), finite.
    standardize : if True divide each centred column by its standard deviation (ddof=0);
        columns with zero variance are dropped (never divided by zero). A column counts as
        constant when max == min, or when its std is at rounding-noise level
        (std <= 16 * eps * max|column|). If False, only centre; constant columns are kept
        (set exactly to 0, so they contribute nothing to the variance).

    Returns
    -------
    Z : float64 array [n_points, n_kept] (centred / standardized data).
    kept : bool array [n_features], True for the columns kept in ``Z``.

    Raises
    ------
    ValueError : X not 2-D, fewer than 2 rows, non-finite values, or no column with variance.

    Source: Paper III sec. 4 ("standardize each coordinate across prompts").
    """
    X = _as_2d_float64(X)
    varies = np.ptp(X, axis=0) > 0
    if not np.any(varies):
        raise ValueError("X has zero total variance (all rows identical)")
    Z = X - X.mean(axis=0)
    if not standardize:
        Z[:, ~varies] = 0.0  # exactly constant columns: no rounding noise from the mean
        return Z, np.ones(X.shape[1], dtype=bool)
    std = Z.std(axis=0)
    scale = np.max(np.abs(X), axis=0)
    kept = varies & (std > _CONST_TOL * np.finfo(np.float64).eps * scale)
    if not np.any(kept):
        raise ValueError("X has no column with non-zero variance (all rows identical)")
    return Z[:, kept] / std[kept], kept


def fit_pca(Z: np.ndarray, n_components=None) -> PCA:
    """scikit-learn PCA (full SVD, float64) fitted on the already centred/standardized matrix ``Z`` [n, d]; ``n_components`` as in sklearn."""
    # Data are already centred; PCA re-centres (a no-op up to rounding). 'full' = exact LAPACK SVD.
    return PCA(n_components=n_components, svd_solver="full").fit(Z)


def explained_variance(X, standardize: bool = True) -> np.ndarray:
    """Explained-variance ratios of PCA on ``X``.

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; must be finite, >= 2 rows).
    standardize : z-score each column across points (zero-variance columns dropped, see
        :func:`standardize_columns`) if True, else only centre.

    Returns
    -------
    ratios : float64 array [min(n_points, n_kept_features)], descending, non-negative, sum 1
        (dimensionless fractions of total variance).

    Raises
    ------
    ValueError : bad shape, non-finite values, or no variance at all.

    Source: Paper III sec. 4 (PC1 and PC1+PC2 explained variance of the value manifold).
    """
    Z, _ = standardize_columns(X, standardize)
    ratios = np.asarray(fit_pca(Z).explained_variance_ratio_, dtype=np.float64)
    ratios = np.clip(ratios, 0.0, None)
    return ratios / ratios.sum()


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


#: Eigenvalues used by the published Paper III code for its participation ratio (the top 10 PCA eigenvalues).
PR_TOP = 10


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
    eigenvalues); issue 11: 5.94 (top 10) vs 16.29 (full) on the official SULA prompts.
    """
    if int(top) < 1:
        raise ValueError(f"top must be >= 1, got {top!r}")
    lam = np.sort(np.asarray(eigvals, dtype=np.float64).ravel())[::-1]
    return participation_ratio(lam[: int(top)])


def pc_scores(X, standardize: bool = True, n_components: int = 2, *, sign_reference=None) -> np.ndarray:
    """Principal-component scores of the points in ``X``.

    Parameters
    ----------
    X : array [n_points, n_features] (cast to float64; finite; >= 2 rows).
    standardize : z-score columns (dropping zero-variance ones) if True, else only centre.
    n_components : number of components; at most min(n_points, n_kept_features).
    sign_reference : optional 1-D array [n_points]. If given, each component's sign is chosen so
        that Spearman rho(score, sign_reference) >= 0 (unchanged when rho is NaN). Otherwise the
        sign is scikit-learn's deterministic ``svd_flip`` choice, which is arbitrary with respect
        to meaning: fix a convention before comparing runs (DESIGN.md sec. 4).

    Returns
    -------
    scores : float64 array [n_points, n_components], in the units of the (standardized) data.

    Raises
    ------
    ValueError : bad shape, non-finite values, no variance, n_components out of range, or a
        ``sign_reference`` of the wrong length.

    Source: Paper III sec. 4.
    """
    Z, _ = standardize_columns(X, standardize)
    max_c = min(Z.shape)
    if not 1 <= int(n_components) <= max_c:
        raise ValueError(f"n_components must be in [1, {max_c}], got {n_components}")
    S = np.asarray(fit_pca(Z, int(n_components)).transform(Z), dtype=np.float64)
    if sign_reference is not None:
        ref = np.asarray(sign_reference, dtype=np.float64).ravel()
        if ref.shape[0] != S.shape[0]:
            raise ValueError(f"sign_reference has {ref.shape[0]} entries, X has {S.shape[0]} rows")
        for j in range(S.shape[1]):
            rho = spearman(S[:, j], ref)[0]
            if np.isfinite(rho) and rho < 0:
                S[:, j] = -S[:, j]
    return S


def _bootstrap_top2(X: np.ndarray, idx: np.ndarray, standardize: bool, chunk: int = 16) -> np.ndarray:
    """PC1, PC2, PC1+PC2 explained-variance ratios of each bootstrap resample ``X[idx[b]]``.

    Same centring/standardization rule as :func:`standardize_columns`, applied to each resample;
    eigenvalues from the batched Gram matrices Z Z^T [n, n] (numpy ``eigvalsh``), which share their
    non-zero eigenvalues with the covariance. Resamples without variance give NaN rows.
    Returns float64 [n_boot, 3].
    """
    n_boot, n = idx.shape
    out = np.full((n_boot, 3), np.nan)
    eps = np.finfo(np.float64).eps
    for a in range(0, n_boot, chunk):
        Xb = X[idx[a:a + chunk]]  # [b, n, d]
        varies = np.ptp(Xb, axis=1) > 0  # [b, d]
        Z = Xb - Xb.mean(axis=1, keepdims=True)
        if standardize:
            std = Z.std(axis=1)
            kept = varies & (std > _CONST_TOL * eps * np.max(np.abs(Xb), axis=1))
            Z = np.where(kept[:, None, :], Z / np.where(kept, std, 1.0)[:, None, :], 0.0)
        else:
            kept = varies
            Z = np.where(varies[:, None, :], Z, 0.0)
        G = Z @ np.swapaxes(Z, 1, 2) if Z.shape[2] >= n else None
        ev = (np.linalg.eigvalsh(G) if G is not None
              else np.linalg.eigvalsh(np.swapaxes(Z, 1, 2) @ Z))[:, ::-1]
        ev = np.clip(ev, 0.0, None)
        tot = ev.sum(axis=1)
        ok = kept.any(axis=1) & (tot > 0)
        r1 = np.where(ok, ev[:, 0] / np.where(ok, tot, 1.0), np.nan)
        r2 = np.where(ok, (ev[:, 1] if ev.shape[1] > 1 else 0.0) / np.where(ok, tot, 1.0), np.nan)
        out[a:a + chunk] = np.stack([r1, r2, r1 + r2], axis=1)
    return out


def value_manifold_stats(
    X,
    next_token_entropy,
    *,
    n_boot: int,
    seed: int,
    standardize: bool = True,
    ci: float = 0.95,
    ci_method: str = "basic",
    return_boot: bool = False,
) -> dict:
    """Value-manifold summary: PC1/PC2 explained variance with bootstrap CIs, PR, entropy rho.

    Parameters
    ----------
    X : array [n_prompts, n_features]: one row per prompt (e.g. final-layer value vectors at the
        last token concatenated over heads, or the residual stream). Cast to float64.
    next_token_entropy : array [n_prompts], next-token entropy in nats (any monotone transform
        gives the same Spearman rho).
    n_boot : number of bootstrap resamples (>= 1). Rows are resampled with replacement and the
        whole statistic (standardization included) is recomputed on each resample.
    seed : seed for ``numpy.random.default_rng``; the same seed reproduces the CIs exactly.
    standardize : z-score each coordinate across prompts (Paper III) if True, else only centre.
    ci : central coverage of the bootstrap interval, in (0, 1).
    return_boot : also return the bootstrap replicates, float64 [n_boot, 3] (PC1, PC2, PC1+PC2 of
        every resample; NaN rows for resamples without variance): ``(stats, boot)``.
    ci_method : "basic" (default; reverse percentile, [2t - q_hi, 2t - q_lo] clipped to [0, 1]) or
        "percentile". Resampling prompts with replacement duplicates ~37% of them, which inflates the
        top components' share when n_prompts < n_features: the percentile interval then lies above
        the estimate. The basic interval corrects that shift (Davison & Hinkley 1997, sec. 5.2).

    Returns
    -------
    dict with keys
        n, n_features (input columns), n_features_used (columns kept after dropping constants),
        pc1, pc2, pc12 : explained-variance fractions in [0, 1] (pc2 = 0 if only one component),
        pc1_lo, pc1_hi, pc2_lo, pc2_hi, pc12_lo, pc12_hi : bootstrap CI bounds (``ci_method``),
        pc1_bc, pc2_bc, pc12_bc : bias-corrected estimates 2 t - mean(replicates) clipped to [0, 1]
            (:func:`llmgeom.core.stats.bias_corrected`): the point the basic interval is centred on;
            with n_prompts < n_features the raw share is biased upward and may lie above its interval,
        n_boot, n_boot_valid : resamples requested / usable (a resample whose rows are all
            identical has no variance and is skipped; CIs are NaN if none is usable),
        ci, seed, standardized,
        participation_ratio : PR of the full explained-variance spectrum, in [1, rank],
        participation_ratio_top10 : PR of the 10 largest eigenvalues (the published code's definition),
        spearman_rho, spearman_p : :func:`llmgeom.core.stats.spearman` (PC1 score, entropy), two-sided p;
            NaN when the entropy (or the PC1 score) is constant,
        pc1_sign_flipped : True if the PC1 score from PCA was negated to apply the convention.

    Sign convention: PC1's sign is fixed so that Spearman rho(PC1 score, next-token entropy) >= 0
    (DESIGN.md sec. 3); negating X therefore does not change rho. If rho is NaN, no flip.

    Raises
    ------
    ValueError : X not 2-D, n < 3 prompts, non-finite values in X or the entropy, entropy length
        != n, n_boot < 1, ci outside (0, 1), or X without any variance.

    Source: Paper III sec. 4 (value manifolds); DESIGN.md sec. 3.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D [n_prompts, n_features], got shape {X.shape}")
    n, n_features = X.shape
    if n < 3:
        raise ValueError(f"value_manifold_stats needs at least 3 points (prompts), got {n}")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains non-finite values (NaN or inf)")
    h = np.asarray(next_token_entropy, dtype=np.float64)
    if h.ndim != 1 or h.shape[0] != n:
        raise ValueError(
            f"next_token_entropy must have shape ({n},) to match X {X.shape}, got {h.shape}"
        )
    if not np.all(np.isfinite(h)):
        raise ValueError("next_token_entropy contains non-finite values")
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1, got {n_boot!r}")
    n_boot = int(n_boot)
    if ci_method not in ("basic", "percentile"):
        raise ValueError(f"ci_method must be 'basic' or 'percentile', got {ci_method!r}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci!r}")

    Z, kept = standardize_columns(X, standardize)
    pca = fit_pca(Z)
    evr = np.clip(np.asarray(pca.explained_variance_ratio_, dtype=np.float64), 0.0, None)
    evr = evr / evr.sum()
    pc1 = float(evr[0])
    pc2 = float(evr[1]) if evr.size > 1 else 0.0

    score = np.asarray(pca.transform(Z)[:, 0], dtype=np.float64)
    rho, p = spearman(score, h)
    flipped = bool(np.isfinite(rho) and rho < 0)
    if flipped:
        rho = -rho  # negating the score negates rho; the two-sided p is unchanged

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    boot = _bootstrap_top2(X, idx, standardize)
    valid = np.all(np.isfinite(boot), axis=1)
    est = (pc1, pc2, pc1 + pc2)
    if valid.any():
        (l1, h1), (l2, h2), (l12, h12) = (
            bootstrap_interval(t, boot[valid, j], ci=ci, method=ci_method, bounds=(0.0, 1.0))
            for j, t in enumerate(est))
    else:
        l1 = l2 = l12 = h1 = h2 = h12 = np.nan
    bc1, bc2, bc12 = (bias_corrected(t, boot[valid, j], bounds=(0.0, 1.0)) for j, t in enumerate(est))

    stats = {
        "n": int(n),
        "n_features": int(n_features),
        "n_features_used": int(np.count_nonzero(kept)),
        "pc1": pc1,
        "pc2": pc2,
        "pc12": float(min(pc1 + pc2, 1.0)),
        "pc1_lo": float(l1),
        "pc1_hi": float(h1),
        "pc2_lo": float(l2),
        "pc2_hi": float(h2),
        "pc12_lo": float(l12),
        "pc12_hi": float(h12),
        "pc1_bc": bc1,
        "pc2_bc": bc2,
        "pc12_bc": bc12,
        "n_boot": n_boot,
        "n_boot_valid": int(np.count_nonzero(valid)),
        "ci": float(ci),
        "ci_method": ci_method,
        "seed": seed,
        "standardized": bool(standardize),
        "participation_ratio": participation_ratio(evr),
        "participation_ratio_top10": participation_ratio_top(evr, PR_TOP),
        "spearman_rho": rho,
        "spearman_p": p,
        "pc1_sign_flipped": flipped,
    }
    return (stats, boot) if return_boot else stats
