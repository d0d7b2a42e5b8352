"""Voronoi margins, the expressibility gap and margin vs perplexity (pure arrays).

Source: LSM, "Latent Semantic Manifolds in Large Language Models" (Voronoi margin of the final
layer, expressibility gap eta(eps) and its linear volume scaling law, the hard core of
boundary-proximal positions, margin as a geometric decomposition of perplexity), and DESIGN.md
sec. 3 ("Voronoi margin"). Inputs are the per-position arrays of the HDF5 contract
(``tokens/margin`` in logits, ``tokens/nll`` and ``tokens/entropy`` in nats); nothing here
touches a model or a file.

Conventions:

* margin m = top-1 minus top-2 logit (float32 logits of the model's own head, including final
  soft-capping where the model has it); m >= 0. m is the distance to the nearest Voronoi
  boundary measured in logit units (the boundary between the top-1 and top-2 token cells).
* eta(eps) = fraction of positions with m < eps (strict), on a log-spaced grid of eps.
* Power-law fit: least squares of log eta = beta log eps + c over the small-eps range (grid
  points with eps <= ``fit_eps_max`` and at least ``min_count`` positions below eps); linear
  coefficient alpha of eta ~ alpha eps: least squares through the origin on the same range,
  alpha = sum(eps eta) / sum(eps^2). The LSM linear scaling law predicts beta = 1.
"""

from __future__ import annotations

import numpy as np

from llmgeom.core.stats import bias_corrected, bootstrap_interval, spearman

#: Margin quantiles reported (LSM: 5, 25, 50, 75, 95%).
QUANTILES = (0.05, 0.25, 0.50, 0.75, 0.95)


def _margins(m) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64).ravel()
    if m.size == 0:
        raise ValueError("no margins given (empty array)")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"margins contain {int(np.count_nonzero(~np.isfinite(m)))} non-finite values")
    if m.min() < 0:
        raise ValueError(f"margins must be >= 0 (top-1 minus top-2 logit), got min {m.min()!r}")
    return m


def log_eps_grid(eps_min: float, eps_max: float, n: int) -> np.ndarray:
    """Log-spaced grid of ``n`` eps values from ``eps_min`` to ``eps_max`` (logits), inclusive.

    Raises:
        ValueError: eps_min <= 0, eps_max <= eps_min or n < 2.
    """
    if not (eps_min > 0 and eps_max > eps_min):
        raise ValueError(f"need 0 < eps_min < eps_max, got {eps_min!r}, {eps_max!r}")
    if int(n) < 2:
        raise ValueError(f"need at least 2 grid points, got {n!r}")
    return np.geomspace(float(eps_min), float(eps_max), int(n))


def eta_curve(margins, eps) -> tuple[np.ndarray, np.ndarray]:
    """Expressibility gap eta(eps) = fraction of positions with margin < eps.

    Args:
        margins: array [n_positions] of margins (logits, >= 0, finite).
        eps: array [n_eps] of thresholds (logits).

    Returns:
        (eta [n_eps] fractions in 0..1, counts [n_eps] int: positions with margin < eps).

    Raises:
        ValueError: empty, negative or non-finite margins.

    Source: LSM (expressibility gap as the measure of the eps-neighbourhood of the Voronoi
    boundaries, estimated by the fraction of token positions within eps of a boundary).
    """
    m = np.sort(_margins(margins))
    eps = np.asarray(eps, dtype=np.float64)
    counts = np.searchsorted(m, eps, side="left")
    return counts / m.size, counts.astype(np.int64)


def fit_power_law(eps, eta) -> dict:
    """Least-squares fit of log eta = beta log eps + c, plus alpha of eta ~ alpha eps.

    Args:
        eps, eta: arrays [k] (k >= 2, all > 0) of thresholds (logits) and fractions.

    Returns:
        dict ``beta`` (slope, dimensionless), ``intercept`` (c, natural log), ``r2`` (of the
        log-log fit), ``alpha`` (per logit; least squares through the origin in linear space).

    Raises:
        ValueError: fewer than 2 points or non-positive values.
    """
    eps = np.asarray(eps, dtype=np.float64)
    eta = np.asarray(eta, dtype=np.float64)
    if eps.size < 2 or eps.shape != eta.shape:
        raise ValueError(f"need >= 2 matching points, got {eps.shape} and {eta.shape}")
    if np.any(eps <= 0) or np.any(eta <= 0):
        raise ValueError("eps and eta must be > 0 for a log-log fit")
    x, y = np.log(eps), np.log(eta)
    beta, c = np.polyfit(x, y, 1)
    resid = y - (beta * x + c)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    alpha = float((eps * eta).sum() / (eps * eps).sum())
    return {"beta": float(beta), "intercept": float(c), "r2": r2, "alpha": alpha}


def expressibility_gap(margins, *, eps_min: float, eps_max: float, n_eps: int, fit_eps_max: float,
                       min_count: int, n_boot: int, ci: float, seed: int = 0) -> tuple[dict, dict]:
    """eta(eps) on a log grid, its power-law fit on the small-eps range, and a bootstrap CI of beta.

    Args:
        margins: array [n_positions] of margins (logits, >= 0).
        eps_min, eps_max, n_eps: the log-spaced grid (logits), see :func:`log_eps_grid` (schema keys
            ``margins.eps_min``, ``margins.eps_max``, ``margins.n_eps``).
        fit_eps_max: largest eps (logits) of the fit range ("small eps"; schema key ``margins.fit_eps_max``).
        min_count: a grid point enters the fit only if at least this many positions have
            margin < eps (eta is too noisy, or 0, below that; schema key ``margins.min_count``).
        n_boot: bootstrap resamples of the token positions (with replacement; 0 = no CI). Each
            resample is refitted on the same eps range (points with eta = 0 dropped). Schema key
            ``margins.n_boot``.
        ci: central interval level of the percentile bootstrap CI (schema key ``margins.ci``).
        seed: seed of ``numpy.random.default_rng``.

    Returns:
        (curve, fit). ``curve``: dict of arrays [n_eps]: ``eps``, ``eta``, ``count``, ``in_fit``
        (bool). ``fit``: ``beta``, ``intercept``, ``r2``, ``alpha`` (see :func:`fit_power_law`),
        ``beta_lo``, ``beta_hi`` (bootstrap CI), ``beta_boot_std``, ``alpha_lo``, ``alpha_hi``,
        ``fit_eps_lo``, ``fit_eps_hi`` (the range used, logits), ``n_fit_points``,
        ``n_positions``, ``n_boot``, ``ci``.

    Raises:
        ValueError: bad margins or grid; fewer than 3 grid points qualify for the fit (the
            message says which of eps_min / fit_eps_max / min_count to change).

    Source: LSM (linear volume scaling law of the expressibility gap, Theorem 10.5: eta ~ alpha
    eps for small eps, i.e. beta = 1 on log-log axes); DESIGN.md sec. 3.
    """
    m = np.sort(_margins(margins))
    eps = log_eps_grid(eps_min, eps_max, n_eps)
    eta, counts = eta_curve(m, eps)
    in_fit = (eps <= fit_eps_max) & (counts >= max(int(min_count), 1))
    if np.count_nonzero(in_fit) < 3:
        raise ValueError(
            f"only {int(np.count_nonzero(in_fit))} eps grid points in [{eps_min:g}, {fit_eps_max:g}] logits have "
            f">= {min_count} of the {m.size} positions below eps; a fit needs 3. Raise fit_eps_max or "
            "eps_min, lower min_count, or use more token positions"
        )
    f = fit_power_law(eps[in_fit], eta[in_fit])
    fit = dict(f, fit_eps_lo=float(eps[in_fit].min()), fit_eps_hi=float(eps[in_fit].max()),
               n_fit_points=int(np.count_nonzero(in_fit)), n_positions=int(m.size), n_boot=int(n_boot),
               ci=float(ci))
    betas, alphas = [], []
    if n_boot and n_boot > 0:
        rng = np.random.default_rng(seed)
        e_fit = eps[in_fit]
        for _ in range(int(n_boot)):
            s = np.sort(m[rng.integers(0, m.size, m.size)])
            eb = np.searchsorted(s, e_fit, side="left") / m.size
            ok = eb > 0
            if np.count_nonzero(ok) >= 2:
                fb = fit_power_law(e_fit[ok], eb[ok])
                betas.append(fb["beta"])
                alphas.append(fb["alpha"])
    lo_q, hi_q = (1 - ci) / 2, 1 - (1 - ci) / 2
    if betas:
        b, a = np.asarray(betas), np.asarray(alphas)
        fit.update(beta_lo=float(np.quantile(b, lo_q)), beta_hi=float(np.quantile(b, hi_q)),
                   beta_boot_std=float(b.std()), alpha_lo=float(np.quantile(a, lo_q)),
                   alpha_hi=float(np.quantile(a, hi_q)))
    else:
        fit.update(beta_lo=np.nan, beta_hi=np.nan, beta_boot_std=np.nan, alpha_lo=np.nan, alpha_hi=np.nan)
    curve = {"eps": eps, "eta": eta, "count": counts, "in_fit": in_fit}
    return curve, fit


def margin_summary(margins, nll=None, entropy=None, *, quantiles=QUANTILES, threshold: float,
                   hard_core_quantile: float) -> dict:
    """Distribution of Voronoi margins, perplexity, and their rank correlations per position.

    Args:
        margins: array [n_positions] (logits, >= 0, finite).
        nll: array [n_positions] of next-token negative log-likelihoods (nats) at the same
            positions, or None.
        entropy: array [n_positions] of next-token entropies (nats) at the same positions, or None.
        quantiles: margin quantiles to report (fractions).
        threshold: report Pr(m < threshold) (logits; LSM uses 0.5; schema key ``margins.threshold``).
        hard_core_quantile: the hard core is the set of positions with margin at or below the
            ``hard_core_quantile`` quantile of m (DESIGN.md: the 5% quantile; schema key
            ``margins.hard_core_quantile``).

    Returns:
        dict: ``n_positions``; ``margin_mean``; ``margin_q05`` .. ``margin_q95`` (logits; keys
        ``margin_q{100*q:02.0f}``); ``p_margin_below`` (Pr(m < threshold)) and ``threshold``;
        ``hard_core_quantile``, ``hard_core_margin`` (its margin level, logits),
        ``hard_core_fraction`` (fraction of positions with m <= that level; equals the quantile
        up to ties), ``hard_core_count``; with nll: ``mean_nll`` (nats/token), ``perplexity``
        (exp of the mean NLL, per token of this model's tokenizer), ``spearman_margin_nll`` and
        its p-value ``spearman_margin_nll_p``, ``hard_core_nll_share`` (fraction of the total NLL
        carried by the hard core); with entropy: ``mean_entropy`` (nats),
        ``spearman_margin_entropy`` and ``spearman_margin_entropy_p``.

    Raises:
        ValueError: bad margins; nll/entropy of another length or non-finite.

    Source: LSM (margin quantiles, Pr(m < 0.5), the hard core, margin vs perplexity);
    DESIGN.md sec. 3 ("Voronoi margin").
    """
    m = _margins(margins)
    out: dict = {"n_positions": int(m.size), "margin_mean": float(m.mean())}
    for q in quantiles:
        out[f"margin_q{100 * q:02.0f}"] = float(np.quantile(m, q))
    out["threshold"] = float(threshold)
    out["p_margin_below"] = float(np.mean(m < threshold))
    level = float(np.quantile(m, hard_core_quantile))
    core = m <= level
    out.update(hard_core_quantile=float(hard_core_quantile), hard_core_margin=level,
               hard_core_fraction=float(core.mean()), hard_core_count=int(core.sum()))
    for name, arr in (("nll", nll), ("entropy", entropy)):
        if arr is None:
            continue
        a = np.asarray(arr, dtype=np.float64).ravel()
        if a.shape != m.shape:
            raise ValueError(f"{name} has {a.size} values, margins {m.size}; they must be per position")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} contains non-finite values")
        out[f"spearman_margin_{name}"], out[f"spearman_margin_{name}_p"] = spearman(m, a)
        if name == "nll":
            out["mean_nll"] = float(a.mean())
            out["perplexity"] = float(np.exp(a.mean()))
            tot = float(a.sum())
            out["hard_core_nll_share"] = float(a[core].sum() / tot) if tot > 0 else float("nan")
        else:
            out["mean_entropy"] = float(a.mean())
    return out


def threshold_key(t: float) -> str:
    """Column stem of threshold ``t`` (logits): ``hard_core_frac_lt_0.05`` etc."""
    return f"hard_core_frac_lt_{float(t):g}"


def fraction_below(margins, thresholds, *, groups=None, n_boot: int, ci: float, seed: int = 0) -> dict:
    """Fraction of positions whose margin lies below fixed thresholds, with bootstrap intervals.

    This is what tests a claim such as "about 5% of positions have a very small margin": the 5% margin
    quantile (``hard_core_margin``) holds 5% of positions by construction and cannot.

    Args:
        margins: array [n_positions] (logits, >= 0, finite).
        thresholds: margin thresholds in logits (each > 0); strict m < t (schema key
            ``margins.hard_core_thresholds``).
        groups: optional array [n_positions] of cluster labels (e.g. the passage of each position,
            ``tokens/prompt``): then whole groups are resampled (positions of one passage are not
            independent). None: positions are resampled independently (the resampled count is then
            Binomial(n, fraction), drawn directly).
        n_boot: bootstrap resamples (0 = no interval: NaN bounds; schema key ``margins.n_boot``).
        ci: central coverage of the interval, in (0, 1) (schema key ``margins.ci``).
        seed: ``numpy.random.default_rng(seed)``.

    Returns:
        dict with, per threshold t and stem s = :func:`threshold_key` (t): ``s`` (fraction in [0, 1]),
        ``s_count``, ``s_lo`` / ``s_hi`` (basic bootstrap interval clipped to [0, 1]), ``s_bc``
        (bias-corrected estimate 2 f - mean of the replicates); plus ``hard_core_boot`` ("passages" or
        "positions") and ``hard_core_n_boot``.

    Raises:
        ValueError: bad margins, a threshold <= 0 or non-finite, groups of another length, n_boot < 0.

    Source: LSM (hard core of boundary-proximal positions); DESIGN.md sec. 3 ("Voronoi margin": the fraction
    of positions below fixed margin thresholds); bootstrap: Davison & Hinkley 1997, sec. 2.2 / 5.2.
    """
    m = _margins(margins)
    th = [float(t) for t in thresholds]
    if any(not np.isfinite(t) or t <= 0 for t in th):
        raise ValueError(f"hard-core thresholds must be finite and > 0 logits, got {list(thresholds)}")
    if int(n_boot) < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    below = np.stack([m < t for t in th], axis=1).astype(np.float64)  # [n, T]
    frac = below.mean(axis=0)
    rng = np.random.default_rng(seed)
    if int(n_boot) == 0:
        reps = np.full((0, len(th)), np.nan)
    elif groups is None:
        reps = rng.binomial(m.size, frac, size=(int(n_boot), len(th))) / m.size
    else:
        g = np.asarray(groups).ravel()
        if g.shape != m.shape:
            raise ValueError(f"groups has {g.size} labels, margins {m.size}; they must be per position")
        _, inv = np.unique(g, return_inverse=True)
        n_g = np.bincount(inv).astype(np.float64)                                   # [G]
        b_g = np.stack([np.bincount(inv, weights=below[:, j], minlength=n_g.size) for j in range(len(th))], 1)
        idx = rng.integers(0, n_g.size, size=(int(n_boot), n_g.size))
        reps = b_g[idx].sum(axis=1) / n_g[idx].sum(axis=1)[:, None]                 # [n_boot, T]
    out: dict = {}
    for j, t in enumerate(th):
        s = threshold_key(t)
        lo, hi = (bootstrap_interval(frac[j], reps[:, j], ci=ci, method="basic", bounds=(0.0, 1.0))
                  if reps.shape[0] else (np.nan, np.nan))
        out.update({s: float(frac[j]), f"{s}_count": int(below[:, j].sum()), f"{s}_lo": lo, f"{s}_hi": hi,
                    f"{s}_bc": bias_corrected(frac[j], reps[:, j], bounds=(0.0, 1.0)) if reps.shape[0] else np.nan})
    out["hard_core_boot"] = "positions" if groups is None else "passages"
    out["hard_core_n_boot"] = int(n_boot)
    return out


def margin_histogram(margins, *, n_bins: int, upper_quantile: float = 0.995) -> dict:
    """Histogram of margins on [0, q] with ``n_bins`` equal bins (schema key ``margins.hist_bins``), q = the
    ``upper_quantile`` quantile (positions above q are counted in ``n_above``).

    Returns:
        dict of arrays [n_bins]: ``bin_lo``, ``bin_hi`` (logits), ``count``, ``density``
        (count / (n_positions * bin width), per logit); plus ``n_above`` (int).

    Raises:
        ValueError: bad margins or n_bins < 1.
    """
    m = _margins(margins)
    if int(n_bins) < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins!r}")
    hi = float(np.quantile(m, upper_quantile))
    if hi <= 0:
        hi = float(m.max()) or 1.0
    edges = np.linspace(0.0, hi, int(n_bins) + 1)
    count, _ = np.histogram(m[m <= hi], bins=edges)
    width = np.diff(edges)
    return {"bin_lo": edges[:-1], "bin_hi": edges[1:], "count": count.astype(np.int64),
            "density": count / (m.size * width), "n_above": int(np.count_nonzero(m > hi))}
