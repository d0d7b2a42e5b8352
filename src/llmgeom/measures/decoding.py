"""Margin-adaptive decoding: next-token NLL and top-1 calibration under a fixed and a margin-dependent
temperature (pure arrays).

Source: LSM, "Latent Semantic Manifolds in Large Language Models" (practical claim: a higher temperature at
low-margin positions and a lower one at high-margin positions beats a single temperature).

Per position i with logits z_i [V] (``tokens/final_normed_sample`` @ W_U^T + b, Gemma's final soft-capping
applied) and next token y_i:

* log p_T(y_i) = z_i[y_i] / T - A_i(1 / T), with the log-partition A_i(beta) = logsumexp_v(beta z_iv);
* the next token y_i is ``tokens/sample_next_token``; the top-1 prediction is correct when
  z_i[y_i] >= max(z_i) - tol (the argmax does not depend on T);
* A_i(beta) for any beta comes from a per-position histogram of the logits (``n_bins`` equal-width bins between
  the row's minimum and maximum, each bin represented by its count and its mean logit), so no full-vocabulary
  logits are kept; the error in A is O((beta * bin width)^2), below 1e-3 nats in the tests;
* ECE of top-1: equal-mass bins (``ece_bins`` bins of the evaluated positions sorted by confidence),
  sum_b (n_b / n) |accuracy_b - mean confidence_b|;
* schemes: ``t1`` (T = 1, the model's own), ``single`` (one T minimising the calibration split's NLL,
  ``scipy.optimize.minimize_scalar`` bounded on [t_min, t_max]), ``adaptive`` (T(m): the calibration split's
  margins m = z_(1) - z_(2) cut into ``n_margin_bins`` equal-mass bins, one T fitted per bin the same way;
  held-out positions use the T of their margin's bin).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

SCHEMES = ("t1", "single", "adaptive")


def unembed_logits(H, W, b=None, softcap=None, *, return_slope: bool = False):
    """Logits z = c tanh((H W^T + b) / c) (or H W^T + b without soft-capping), float32 [n, V].

    The one place the package turns unembedding inputs into logits (decoding and the Fisher metric,
    :func:`llmgeom.measures.fisher.fisher_metrics`), in float32 as at extraction.

    Args:
        H: [n, d] unembedding inputs; W: [V, d]; b: [V] or None; softcap: c or None (Gemma 2/3
            ``final_logit_softcapping``, as :func:`llmgeom.weights.unembedding.load_unembedding` returns it).
        return_slope: also return dz/du = 1 - tanh^2(u / c), float64 [n, V] (None without soft-capping):
            the Jacobian factor of the Fisher metric.

    Returns:
        z (float32 [n, V], logits), or ``(z, slope)`` with ``return_slope``.
    """
    u = np.asarray(H, np.float32) @ np.asarray(W, np.float32).T
    if b is not None:
        u += np.asarray(b, np.float32)
    slope = None
    if softcap:
        t = np.tanh(u / np.float32(softcap))
        u = t * np.float32(softcap)
        if return_slope:
            slope = 1.0 - t.astype(np.float64) ** 2
    return (u, slope) if return_slope else u


def position_stats(H, W, b=None, softcap=None, *, next_ids, n_bins: int, tol: float = 1e-3,
                   batch: int = 64) -> dict:
    """Per-position sufficient statistics for NLL / confidence under any temperature.

    The logits are computed ``batch`` positions at a time (float32, :func:`unembed_logits`) and reduced at once
    to the next token's logit, the top two logits and a logit histogram; no [n, V] array is kept.

    Args:
        H, W, b, softcap: see :func:`unembed_logits`.
        next_ids: int [n] next-token ids (``tokens/sample_next_token``), each in [0, V).
        n_bins: logit histogram bins per position (at most V; schema key ``decoding.n_bins``); tol: logits, for
            the top-1 correctness test.
        batch: positions per logit block (memory: batch x V float32; not a result).

    Returns:
        dict of arrays: ``z_next`` [n], ``z_max`` [n], ``margin`` [n] (top-1 minus top-2 logit), ``correct``
        bool [n], ``hist_count`` / ``hist_center`` [n, n_bins] (count and mean logit of each equal-width bin
        between the row's minimum and maximum logit), ``hist_log_count`` [n, n_bins] (log of the counts, -inf
        for empty bins; used by :func:`log_partition`).

    Raises:
        ValueError: next_ids not one id in [0, V) per position, non-finite logits.
    """
    H = np.asarray(H, np.float32)
    W = np.asarray(W, np.float32)
    n, V = H.shape[0], W.shape[0]
    next_ids = np.asarray(next_ids)
    if next_ids.shape != (n,) or not np.issubdtype(next_ids.dtype, np.integer):
        raise ValueError(f"next_ids must hold one integer token id per position: shape ({n},), got "
                         f"{next_ids.shape} {next_ids.dtype}")
    if n and (next_ids.min() < 0 or next_ids.max() >= V):
        raise ValueError(f"next_ids must lie in [0, {V}) (drop positions without a next token, id -1)")
    next_ids = next_ids.astype(np.intp)
    n_bins = min(int(n_bins), V)  # never more bins than tokens
    out = {k: np.empty(n) for k in ("z_next", "z_max", "margin")}
    cnt = np.zeros((n, n_bins))
    cen = np.zeros((n, n_bins))
    t = np.empty(V, np.float32)  # one row's scaled logits and bin indices, reused: the row stays in cache
    idx = np.empty(V, np.intp)
    for s0 in range(0, n, batch):
        z = unembed_logits(H[s0:s0 + batch], W, b, softcap)  # the matmul in blocks, the reductions row by row
        for r, zr in enumerate(z):
            i = s0 + r
            top = zr.argmax()
            z1, lo = zr[top], zr.min()
            if not (np.isfinite(z1) and np.isfinite(lo)):  # max / min propagate NaN and inf
                raise ValueError(f"non-finite logits at position {i}")
            zr[top] = -np.inf  # the second largest logit, then restore
            z2 = zr.max()
            zr[top] = z1
            out["z_max"][i], out["margin"][i], out["z_next"][i] = z1, z1 - z2, zr[next_ids[i]]
            w = np.maximum(z1 - lo, 1e-12) / n_bins  # float32 bin width
            np.subtract(zr, lo, out=t)
            np.divide(t, w, out=t)
            np.copyto(idx, t, casting="unsafe")  # truncation: the bin of each logit
            np.minimum(idx, n_bins - 1, out=idx)
            c = np.bincount(idx, minlength=n_bins)
            cnt[i] = c
            cen[i] = np.where(c > 0, np.bincount(idx, weights=zr, minlength=n_bins) / np.maximum(c, 1), 0.0)
    out["correct"] = out["z_next"] >= out["z_max"] - tol
    out["hist_count"], out["hist_center"] = cnt, cen
    with np.errstate(divide="ignore"):
        out["hist_log_count"] = np.log(cnt)
    return out


def log_partition(stats: dict, beta, rows=None) -> np.ndarray:
    """A_i(beta) = log sum_v exp(beta z_iv) from the histogram of :func:`position_stats` (nats) [n_rows].

    ``beta`` = 1 / T: a scalar or an array [n_rows]; ``rows``: index array or None (all positions).
    """
    lc = stats["hist_log_count"] if rows is None else stats["hist_log_count"][rows]
    z = stats["hist_center"] if rows is None else stats["hist_center"][rows]
    beta = np.broadcast_to(np.asarray(beta, np.float64), (lc.shape[0],))[:, None]
    return logsumexp(beta * z + lc, axis=1)


def nll_at(stats: dict, T, rows) -> np.ndarray:
    """Per-position NLL (nats) [n_rows] under temperature(s) ``T`` (scalar or [n_rows]) at ``rows``."""
    beta = 1.0 / np.asarray(T, np.float64)
    return log_partition(stats, beta, rows) - stats["z_next"][rows] * beta


def confidence_at(stats: dict, T, rows) -> np.ndarray:
    """Top-1 probability p_T(argmax) [n_rows] under temperature(s) ``T`` at ``rows``."""
    beta = 1.0 / np.asarray(T, np.float64)
    return np.exp(stats["z_max"][rows] * beta - log_partition(stats, beta, rows))


def ece(confidence, correct, *, n_bins: int) -> float:
    """Top-1 expected calibration error with ``n_bins`` equal-mass bins: sum_b (n_b / n) |acc_b - conf_b| (in
    [0, 1]); the workflow's bins are schema key ``decoding.ece_bins`` (through :func:`compare_schemes`)."""
    conf = np.asarray(confidence, np.float64)
    ok = np.asarray(correct, np.float64)
    o = np.argsort(conf, kind="stable")
    e = 0.0
    for part in np.array_split(o, min(int(n_bins), conf.size)):
        e += part.size * abs(ok[part].mean() - conf[part].mean())
    return float(e / conf.size)


def fit_temperature(stats: dict, rows, *, t_min: float = 0.05, t_max: float = 20.0) -> float:
    """The T in [t_min, t_max] minimising the mean NLL over ``rows`` (scipy ``minimize_scalar``, bounded, in log T)."""
    r = minimize_scalar(lambda lt: float(nll_at(stats, np.exp(lt), rows).mean()),
                        bounds=(np.log(t_min), np.log(t_max)), method="bounded", options={"xatol": 1e-4})
    return float(np.exp(r.x))


def fit_margin_temperatures(stats: dict, rows, *, n_margin_bins: int, edges=None, **kw) -> dict:
    """T(m): one temperature per margin bin, fitted on ``rows``.

    Args:
        n_margin_bins: margin bins (schema key ``decoding.n_margin_bins``); used only for ``edges=None``.
        edges: inner bin edges in logits (increasing, [n_margin_bins - 1]); None: equal-mass bins of the
            margins at ``rows``.

    Returns:
        dict ``edges`` [n_bins - 1] and ``temperatures`` [n_bins].
    """
    m = stats["margin"][rows]
    if edges is None:
        edges = np.quantile(m, np.linspace(0, 1, int(n_margin_bins) + 1)[1:-1])
    edges = np.asarray(edges, np.float64)
    which = np.searchsorted(edges, m, side="right")
    temps = np.array([fit_temperature(stats, np.asarray(rows)[which == j], **kw) if np.any(which == j) else 1.0
                      for j in range(edges.size + 1)])
    return {"edges": edges, "temperatures": temps}


def margin_temperature(fit: dict, margin) -> np.ndarray:
    """Temperature [n] of each margin under a fit of :func:`fit_margin_temperatures`."""
    return fit["temperatures"][np.searchsorted(fit["edges"], np.asarray(margin, np.float64), side="right")]


def compare_schemes(stats: dict, passages, *, calibration_fraction: float, n_margin_bins: int, ece_bins: int,
                    n_boot: int, ci: float, seed: int = 0, edges=None) -> dict:
    """NLL and ECE of the three temperature schemes on held-out passages, with paired bootstrap intervals.

    Args:
        stats: :func:`position_stats`. passages: [n] passage (prompt) id of each position; passages are split
            at random into a calibration part (``calibration_fraction``) and a held-out part.
        calibration_fraction, n_margin_bins, ece_bins, n_boot: schema keys ``decoding.calibration_fraction``,
            ``decoding.n_margin_bins``, ``decoding.ece_bins`` (:func:`ece`), ``decoding.n_boot`` (resamples of
            the paired bootstrap); ci: its central coverage (the decoding section has no ci key: the caller
            passes 0.95). edges: see :func:`fit_margin_temperatures`.

    Returns:
        dict: ``nll_<scheme>``, ``ece_<scheme>`` (held-out means; nats, [0, 1]), ``t_single``, ``t_margin``
        (list), ``margin_edges`` (list, logits), ``delta_nll_adaptive_vs_single`` and
        ``delta_ece_adaptive_vs_single`` with ``_lo`` / ``_hi`` (basic paired bootstrap over held-out passages;
        negative = adaptive better) and ``_replicates`` (float64 [n_boot], the replicates the interval is taken from;
        replicate b of both deltas from the same passage resample), ``n_calibration`` / ``n_heldout`` (positions), ``n_passages_heldout``,
        ``accuracy`` (top-1, held out).

    Source: LSM (margin-adaptive decoding); bootstrap: Davison & Hinkley 1997, sec. 5.2.
    """
    from llmgeom.core.stats import bootstrap_interval

    g = np.asarray(passages)
    up = np.unique(g)
    rng = np.random.default_rng(seed)
    cal_p = rng.choice(up, size=max(1, int(round(calibration_fraction * up.size))), replace=False)
    cal = np.flatnonzero(np.isin(g, cal_p))
    held = np.flatnonzero(~np.isin(g, cal_p))
    if held.size == 0:
        raise ValueError("no held-out passage: lower decoding.calibration_fraction or use more passages")
    t_single = fit_temperature(stats, cal)
    mfit = fit_margin_temperatures(stats, cal, n_margin_bins=n_margin_bins, edges=edges)
    temps = {"t1": np.ones(held.size), "single": np.full(held.size, t_single),
             "adaptive": margin_temperature(mfit, stats["margin"][held])}
    nll = {s: nll_at(stats, temps[s], held) for s in SCHEMES}
    conf = {s: confidence_at(stats, temps[s], held) for s in SCHEMES}
    ok = stats["correct"][held]
    out = {f"nll_{s}": float(nll[s].mean()) for s in SCHEMES}
    out.update({f"ece_{s}": ece(conf[s], ok, n_bins=ece_bins) for s in SCHEMES})
    d_nll = nll["adaptive"] - nll["single"]
    hp = g[held]
    hu, inv = np.unique(hp, return_inverse=True)
    groups = [np.flatnonzero(inv == j) for j in range(hu.size)]
    reps_n, reps_e = np.full(int(n_boot), np.nan), np.full(int(n_boot), np.nan)
    for b in range(int(n_boot)):
        idx = np.concatenate([groups[j] for j in rng.integers(0, hu.size, hu.size)])
        reps_n[b] = d_nll[idx].mean()
        reps_e[b] = (ece(conf["adaptive"][idx], ok[idx], n_bins=ece_bins)
                     - ece(conf["single"][idx], ok[idx], n_bins=ece_bins))
    dn, de = float(d_nll.mean()), out["ece_adaptive"] - out["ece_single"]
    (nlo, nhi), (elo, ehi) = bootstrap_interval(dn, reps_n, ci=ci), bootstrap_interval(de, reps_e, ci=ci)
    out.update(t_single=t_single, t_margin=[float(t) for t in mfit["temperatures"]],
               margin_edges=[float(e) for e in mfit["edges"]],
               delta_nll_adaptive_vs_single=dn, delta_nll_adaptive_vs_single_lo=nlo,
               delta_nll_adaptive_vs_single_hi=nhi, delta_ece_adaptive_vs_single=de,
               delta_ece_adaptive_vs_single_lo=elo, delta_ece_adaptive_vs_single_hi=ehi,
               delta_nll_adaptive_vs_single_replicates=reps_n, delta_ece_adaptive_vs_single_replicates=reps_e,
               n_calibration=int(cal.size), n_heldout=int(held.size), n_passages_heldout=int(hu.size),
               accuracy=float(ok.mean()), n_boot=int(n_boot))
    return out
