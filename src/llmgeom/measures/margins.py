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
  points with eta(eps) <= ``fit_eta_max``, eps <= ``fit_eps_max`` and at least ``min_count`` positions below
  eps: "small" is defined by eta, so that a trained model and its random-init twin, whose margins differ
  several-fold in scale, are fitted over the same share of their positions; :func:`fit_range`); linear
  coefficient alpha of eta ~ alpha eps: least squares through the origin on the same range,
  alpha = sum(eps eta) / sum(eps^2). The LSM linear scaling law predicts beta = 1.
* Intervals: bootstrap over passages (:class:`PassageBootstrap`), one resampling for every column of
  margins.csv and expressibility_gap.csv; each column also writes its replicates (``<col>_replicates``).
"""

from __future__ import annotations

import numpy as np

from llmgeom.core.stats import REPLICATES_SUFFIX, bias_corrected, bootstrap_interval, replicates_text, spearman

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


class PassageBootstrap:
    """Bootstrap resamples of passages, as integer weights per position: the one resampling of the margins tables.

    Positions of one passage are not independent (a passage's margins and NLLs move together), so every interval of
    margins.csv and expressibility_gap.csv resamples whole passages: G passages drawn with replacement from the G
    observed ones; a position's weight in resample b is how many times its passage was drawn (0, 1, 2, ...), and
    every statistic of resample b is the statistic of the positions repeated by their weights. Iterating twice
    gives the same resamples (the generator is re-seeded), so replicate b of every column that a caller computes
    from one ``PassageBootstrap`` (or from two built with the same arguments) comes from the same resample.

    Args:
        groups: array [n_positions] of passage labels (``tokens/prompt``), or None: every position is its own
            passage (positions resampled independently).
        n_positions: number of positions (the length of the margin array).
        n_boot: resamples (0 = none; schema key ``margins.n_boot``).
        seed: seed of ``numpy.random.default_rng``.

    Attributes:
        unit: "passages" or "positions"; n_groups: G; n_boot.

    Raises:
        ValueError: groups of another length than n_positions, n_boot < 0.

    Source: cluster (block) bootstrap, Davison & Hinkley 1997, sec. 3.8.
    """

    def __init__(self, groups, n_positions: int, *, n_boot: int, seed: int):
        if int(n_boot) < 0:
            raise ValueError(f"n_boot must be >= 0, got {n_boot}")
        self.n_positions, self.n_boot, self.seed = int(n_positions), int(n_boot), int(seed)
        if groups is None:
            self._inv, self.n_groups, self.unit = None, self.n_positions, "positions"
        else:
            g = np.asarray(groups).ravel()
            if g.size != self.n_positions:
                raise ValueError(f"groups has {g.size} labels, margins {self.n_positions}; they must be per position")
            _, self._inv = np.unique(g, return_inverse=True)
            self.n_groups, self.unit = int(self._inv.max()) + 1 if g.size else 0, "passages"

    def __len__(self) -> int:
        return self.n_boot

    def __iter__(self):
        """Yields n_boot int64 arrays [n_positions]: the weight of each position in resample b (resample order)."""
        rng = np.random.default_rng(self.seed)
        for _ in range(self.n_boot):
            c = np.bincount(rng.integers(0, self.n_groups, self.n_groups), minlength=self.n_groups)
            yield c if self._inv is None else c[self._inv]


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


def fit_range(eps, eta, counts, *, fit_eps_max: float, fit_eta_max: float, min_count: int) -> np.ndarray:
    """The grid points of the small-eps fit: the one rule of the point estimate and of every bootstrap resample.

    A point enters when eps <= ``fit_eps_max`` (an upper cap, logits), eta(eps) <= ``fit_eta_max`` (the range is
    defined by the fraction of positions it covers, so that models whose margins differ in scale, a trained model
    (median margin about half a logit) and its random-init twin (a tenth of that), are fitted over the same part
    of their margin distribution: "small eps" is where eta is small) and at least ``min_count`` positions lie
    below eps (eta is 0 or too noisy below that). eta rises with eps, so the range is one run of grid points.

    Args:
        eps: array [n_eps] (logits, increasing); eta: array [n_eps] (fractions); counts: array [n_eps] (positions
            below eps, in a resample the weighted count).
        fit_eps_max, fit_eta_max, min_count: schema keys ``margins.fit_eps_max``, ``margins.fit_eta_max``,
            ``margins.min_count``.

    Returns:
        bool array [n_eps].
    """
    eps, eta, counts = (np.asarray(a, dtype=np.float64) for a in (eps, eta, counts))
    return (eps <= fit_eps_max) & (eta <= fit_eta_max) & (counts >= max(int(min_count), 1))


def expressibility_gap(margins, *, eps_min: float, eps_max: float, n_eps: int, fit_eps_max: float,
                       fit_eta_max: float, min_count: int, n_boot: int, ci: float, seed: int = 0,
                       groups=None) -> tuple[dict, dict]:
    """eta(eps) on a log grid, its power-law fit on the small-eps range, and bootstrap intervals over passages.

    Args:
        margins: array [n_positions] of margins (logits, >= 0).
        eps_min, eps_max, n_eps: the log-spaced grid (logits), see :func:`log_eps_grid` (schema keys
            ``margins.eps_min``, ``margins.eps_max``, ``margins.n_eps``).
        fit_eps_max: largest eps (logits) of the fit range, a cap (schema key ``margins.fit_eps_max``).
        fit_eta_max: largest eta of the fit range (schema key ``margins.fit_eta_max``): LSM fits "small eps";
            here small means eta(eps) <= fit_eta_max, see :func:`fit_range`.
        min_count: a grid point enters the fit only if at least this many positions have
            margin < eps (eta is too noisy, or 0, below that; schema key ``margins.min_count``).
        n_boot: bootstrap resamples of the passages (:class:`PassageBootstrap`; 0 = no intervals; schema key
            ``margins.n_boot``). In each resample eta is recomputed and the fit range re-chosen by the same rule
            (:func:`fit_range`); a resample with fewer than 3 points in range gives NaN replicates.
        ci: central coverage of the percentile intervals (schema key ``margins.ci``).
        seed: seed of the resampling (:class:`PassageBootstrap`).
        groups: array [n_positions] of passage labels (``tokens/prompt``) or None (positions resampled as if
            independent).

    Returns:
        (curve, fit). ``curve``: dict of arrays [n_eps]: ``eps``, ``eta``, ``count``, ``in_fit``
        (bool). ``fit``: ``beta``, ``intercept``, ``r2``, ``alpha`` (see :func:`fit_power_law`);
        ``beta_lo``, ``beta_hi`` (percentile bootstrap interval), ``beta_replicates``
        (:func:`llmgeom.core.stats.replicates_text`), ``beta_boot_std``, ``r2_lo``, ``r2_hi``, ``r2_replicates``,
        ``alpha_lo``, ``alpha_hi``; ``fit_eps_lo``, ``fit_eps_hi`` (the range used, logits), ``fit_eta_max``,
        ``fit_eps_max``, ``n_fit_points``, ``n_positions``, ``n_boot``, ``boot_unit`` ("passages" or
        "positions"), ``ci``.

    Raises:
        ValueError: bad margins or grid; fewer than 3 grid points qualify for the fit (the
            message says which of eps_min / fit_eps_max / fit_eta_max / min_count to change).

    Source: LSM (linear volume scaling law of the expressibility gap, Theorem 10.5: eta ~ alpha
    eps for small eps, i.e. beta = 1 on log-log axes); DESIGN.md sec. 3.
    """
    m = _margins(margins)
    order = np.argsort(m, kind="stable")
    ms = m[order]
    eps = log_eps_grid(eps_min, eps_max, n_eps)
    eta, counts = eta_curve(ms, eps)
    rule = dict(fit_eps_max=fit_eps_max, fit_eta_max=fit_eta_max, min_count=min_count)
    in_fit = fit_range(eps, eta, counts, **rule)
    if np.count_nonzero(in_fit) < 3:
        raise ValueError(
            f"only {int(np.count_nonzero(in_fit))} eps grid points in [{eps_min:g}, {fit_eps_max:g}] logits have "
            f">= {min_count} of the {m.size} positions below eps and eta <= {fit_eta_max:g}; a fit needs 3. Raise "
            "fit_eps_max, fit_eta_max or eps_min, lower min_count, or use more token positions"
        )
    f = fit_power_law(eps[in_fit], eta[in_fit])
    fit = dict(f, fit_eps_lo=float(eps[in_fit].min()), fit_eps_hi=float(eps[in_fit].max()),
               fit_eta_max=float(fit_eta_max), fit_eps_max=float(fit_eps_max),
               n_fit_points=int(np.count_nonzero(in_fit)), n_positions=int(m.size), n_boot=int(n_boot))
    boot = PassageBootstrap(groups, m.size, n_boot=n_boot, seed=seed)
    pos = np.searchsorted(ms, eps, side="left")  # positions (in sorted order) below each eps
    reps = np.full((len(boot), 3), np.nan)       # beta, r2, alpha per resample
    for b, w in enumerate(boot):
        cw = np.concatenate([[0], np.cumsum(w[order])])
        cb = cw[pos]
        eb = cb / cw[-1]
        ok = fit_range(eps, eb, cb, **rule)
        if np.count_nonzero(ok) >= 3:
            fb = fit_power_law(eps[ok], eb[ok])
            reps[b] = fb["beta"], fb["r2"], fb["alpha"]
    for j, col in enumerate(("beta", "r2", "alpha")):
        lo, hi = (bootstrap_interval(fit[col], reps[:, j], ci=ci, method="percentile") if len(boot)
                  else (np.nan, np.nan))
        fit.update({f"{col}_lo": lo, f"{col}_hi": hi})
        if col != "alpha":
            fit[f"{col}{REPLICATES_SUFFIX}"] = replicates_text(reps[:, j])
    fin = reps[np.isfinite(reps[:, 0]), 0]
    fit.update(beta_boot_std=float(fin.std()) if fin.size else np.nan, boot_unit=boot.unit, ci=float(ci))
    curve = {"eps": eps, "eta": eta, "count": counts, "in_fit": in_fit}
    return curve, fit


#: margins.csv columns with a passage-bootstrap interval and replicates (besides hard_core_frac_lt_<t>)
BOOT_COLUMNS = tuple(f"margin_q{100 * q:02.0f}" for q in QUANTILES) + (
    "hard_core_margin", "p_margin_below", "mean_nll", "perplexity")


def _location_stats(m, nll, weights, *, quantiles, threshold: float, hard_core_quantile: float) -> dict:
    """Margin quantiles, the hard-core level, Pr(m < threshold), mean NLL and perplexity of the positions
    repeated by ``weights`` (None: every position once): the one formula of the point estimates and of every
    bootstrap replicate. The hard-core level is the quantile at ``hard_core_quantile`` from the same call as
    margin_q05 etc. (the same number when hard_core_quantile is one of ``quantiles``)."""
    qs = list(quantiles) + [float(hard_core_quantile)]
    mm = m if weights is None else np.repeat(m, weights)
    qv = np.quantile(mm, qs)
    out = {f"margin_q{100 * q:02.0f}": float(v) for q, v in zip(quantiles, qv)}
    out["hard_core_margin"] = float(qv[-1])
    out["p_margin_below"] = float(fractions_below(m, [threshold], weights)[0])
    if nll is not None:
        out["mean_nll"] = float(np.average(nll, weights=weights))
        out["perplexity"] = float(np.exp(out["mean_nll"]))
    return out


#: clip of each interval in BOOT_COLUMNS (margins and NLL >= 0, Pr in [0, 1], perplexity >= 1)
_BOUNDS = {"p_margin_below": (0.0, 1.0), "perplexity": (1.0, np.inf)}


def margin_summary(margins, nll=None, entropy=None, *, quantiles=QUANTILES, threshold: float,
                   hard_core_quantile: float, groups=None, n_boot: int = 0, ci: float | None = None,
                   seed: int = 0) -> dict:
    """Distribution of Voronoi margins, perplexity, their rank correlations per position, and bootstrap intervals.

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
        groups, n_boot, seed: the resampling (:class:`PassageBootstrap`: passages drawn with replacement;
            ``margins.n_boot``, ``margins.seed``); n_boot = 0: no intervals (the ``_lo`` / ``_hi`` /
            ``_replicates`` keys are absent).
        ci: central coverage of the basic bootstrap intervals, in (0, 1) (schema key ``margins.ci``; required
            when n_boot > 0).

    Returns:
        dict: ``n_positions``; ``margin_mean``; ``margin_q05`` .. ``margin_q95`` (logits; keys
        ``margin_q{100*q:02.0f}``); ``p_margin_below`` (Pr(m < threshold)) and ``threshold``;
        ``hard_core_quantile``, ``hard_core_margin`` (its margin level, logits: the same quantile computation as
        margin_q05, equal to it at hard_core_quantile = 0.05),
        ``hard_core_fraction`` (fraction of positions with m <= that level; equals the quantile
        up to ties), ``hard_core_count``; with nll: ``mean_nll`` (nats/token), ``perplexity``
        (exp of the mean NLL, per token of this model's tokenizer), ``spearman_margin_nll`` and
        its p-value ``spearman_margin_nll_p``, ``hard_core_nll_share`` (fraction of the total NLL
        carried by the hard core); with entropy: ``mean_entropy`` (nats),
        ``spearman_margin_entropy`` and ``spearman_margin_entropy_p``. With n_boot > 0, for each of
        :data:`BOOT_COLUMNS` c present: ``c_lo``, ``c_hi`` (basic bootstrap interval, clipped: Pr to [0, 1],
        perplexity to >= 1, the others to >= 0) and ``c_replicates`` (:func:`llmgeom.core.stats.replicates_text`;
        replicate b of every column from resample b; the resampling unit and count are those of
        :func:`fraction_below` with the same arguments: ``hard_core_boot``, ``hard_core_n_boot``).

    Raises:
        ValueError: bad margins; nll/entropy/groups of another length or non-finite; n_boot < 0; n_boot > 0
            without ci.

    Source: LSM (margin quantiles, Pr(m < 0.5), the hard core, margin vs perplexity);
    DESIGN.md sec. 3 ("Voronoi margin"); bootstrap: Davison & Hinkley 1997, sec. 3.8 / 5.2.
    """
    m = _margins(margins)
    arrs = {}
    for name, arr in (("nll", nll), ("entropy", entropy)):
        if arr is None:
            continue
        a = np.asarray(arr, dtype=np.float64).ravel()
        if a.shape != m.shape:
            raise ValueError(f"{name} has {a.size} values, margins {m.size}; they must be per position")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} contains non-finite values")
        arrs[name] = a
    kw = dict(quantiles=quantiles, threshold=threshold, hard_core_quantile=hard_core_quantile)
    loc = _location_stats(m, arrs.get("nll"), None, **kw)
    out: dict = {"n_positions": int(m.size), "margin_mean": float(m.mean())}
    out.update({k: v for k, v in loc.items() if k.startswith("margin_q")})
    out["threshold"] = float(threshold)
    out["p_margin_below"] = loc["p_margin_below"]
    level = loc["hard_core_margin"]
    core = m <= level
    out.update(hard_core_quantile=float(hard_core_quantile), hard_core_margin=level,
               hard_core_fraction=float(core.mean()), hard_core_count=int(core.sum()))
    for name, a in arrs.items():
        out[f"spearman_margin_{name}"], out[f"spearman_margin_{name}_p"] = spearman(m, a)
        if name == "nll":
            out["mean_nll"], out["perplexity"] = loc["mean_nll"], loc["perplexity"]
            tot = float(a.sum())
            out["hard_core_nll_share"] = float(a[core].sum() / tot) if tot > 0 else float("nan")
        else:
            out["mean_entropy"] = float(a.mean())
    boot = PassageBootstrap(groups, m.size, n_boot=n_boot, seed=seed)
    if len(boot):
        if ci is None:
            raise ValueError("margin_summary: n_boot > 0 needs ci (the interval coverage, margins.ci)")
        reps = [_location_stats(m, arrs.get("nll"), w, **kw) for w in boot]
        for c in BOOT_COLUMNS:
            if c not in loc:
                continue
            r = np.array([x[c] for x in reps])
            lo, hi = bootstrap_interval(loc[c], r, ci=ci, method="basic", bounds=_BOUNDS.get(c, (0.0, np.inf)))
            out.update({f"{c}_lo": lo, f"{c}_hi": hi, f"{c}{REPLICATES_SUFFIX}": replicates_text(r)})
    return out



def fractions_below(margins, thresholds, weights=None) -> np.ndarray:
    """Fraction of positions with margin strictly below each threshold: Pr(m < 0.5) of margins.csv and the
    hard-core fractions, in the point estimate (``weights`` None) and in a bootstrap resample (``weights``
    [n_positions]: times each position is drawn, :class:`PassageBootstrap`).

    Args:
        margins: array [n_positions] (logits); thresholds: sequence of T thresholds (logits).
        weights: None or array [n_positions] of non-negative weights.

    Returns:
        float64 array [T] of fractions in [0, 1]: sum of the weights of positions below t / sum of all weights.
    """
    m = np.asarray(margins, dtype=np.float64).ravel()
    th = np.asarray(thresholds, dtype=np.float64).ravel()
    if weights is None:
        return np.array([np.count_nonzero(m < t) for t in th], dtype=np.float64) / m.size
    w = np.asarray(weights)
    return np.array([w[m < t].sum() for t in th], dtype=np.float64) / w.sum()


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
            independent). None: positions are resampled independently. The resampling is
            :class:`PassageBootstrap` (the one of every margins.csv interval: the same ``groups``, ``n_boot``
            and ``seed`` give the same resamples as :func:`margin_summary` and :func:`expressibility_gap`).
        n_boot: bootstrap resamples (0 = no interval: NaN bounds; schema key ``margins.n_boot``).
        ci: central coverage of the interval, in (0, 1) (schema key ``margins.ci``).
        seed: seed of the resampling.

    Returns:
        dict with, per threshold t and stem s = :func:`threshold_key` (t): ``s`` (fraction in [0, 1]),
        ``s_count``, ``s_lo`` / ``s_hi`` (basic bootstrap interval clipped to [0, 1]), ``s_bc``
        (bias-corrected estimate 2 f - mean of the replicates), ``s_replicates``
        (:func:`llmgeom.core.stats.replicates_text`; "" with n_boot = 0); plus ``hard_core_boot`` ("passages" or
        "positions") and ``hard_core_n_boot``.

    Raises:
        ValueError: bad margins, a threshold <= 0 or non-finite, groups of another length, n_boot < 0.

    Source: LSM (hard core of boundary-proximal positions); DESIGN.md sec. 3 ("Voronoi margin": the fraction
    of positions below fixed margin thresholds); bootstrap: Davison & Hinkley 1997, sec. 2.2 / 3.8 / 5.2.
    """
    m = _margins(margins)
    th = [float(t) for t in thresholds]
    if any(not np.isfinite(t) or t <= 0 for t in th):
        raise ValueError(f"hard-core thresholds must be finite and > 0 logits, got {list(thresholds)}")
    boot = PassageBootstrap(groups, m.size, n_boot=n_boot, seed=seed)
    frac = fractions_below(m, th)
    reps = np.array([fractions_below(m, th, w) for w in boot]).reshape(len(boot), len(th))  # [n_boot, T]
    out: dict = {}
    for j, t in enumerate(th):
        s = threshold_key(t)
        lo, hi = (bootstrap_interval(frac[j], reps[:, j], ci=ci, method="basic", bounds=(0.0, 1.0))
                  if len(boot) else (np.nan, np.nan))
        out.update({s: float(frac[j]), f"{s}_count": int(np.count_nonzero(m < t)), f"{s}_lo": lo, f"{s}_hi": hi,
                    f"{s}_bc": bias_corrected(frac[j], reps[:, j], bounds=(0.0, 1.0)) if len(boot) else np.nan,
                    f"{s}{REPLICATES_SUFFIX}": replicates_text(reps[:, j])})
    out["hard_core_boot"] = boot.unit
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
