"""claims.csv: what this run found, claim by claim. The claims are data
(``llmgeom/data/claims.yaml``: sentence, paper and section, table and columns, rule and its parameters); this
module holds the rule engine that decides each claim on the cross-model tables and the scorecard it writes.
Tables in, tables out; never torch.

Verdicts: ``supported``, ``not supported``, ``inconclusive`` (the measurement cannot decide, e.g. an interval
that contains the threshold, a NaN value, estimators that disagree) and ``not testable here`` (the run lacks
what the claim needs: a table, a column, a second attention type, three models; or the claim's ``not_applicable`` column
gives a reason the measure does not apply to the model, e.g. no W_K under latent attention, no attention layers to
edit in a state-space model: a row with that reason and no ``where`` value speaks for the whole model). Every row
carries a reason.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from llmgeom.core.claims_data import ClaimsDataError, claims_file, load_claims  # noqa: F401  (the engine's API)
from llmgeom.analyses.bayes_tables import NULL_SOURCE
from llmgeom.core.published import comparison_entries, entries_by_kind, source_text, value_text

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, NOT_TESTABLE = ("supported", "not supported", "inconclusive",
                                                         "not testable here")
VERDICTS = (SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, NOT_TESTABLE)
MISSING_TABLE = "table not produced by this run"
#: coverage of the per-model intervals an across-size rule reads (rule.interval_ci when a claim's table differs)
INTERVAL_CI = 0.95
#: columns of the scorecard, in order (docs/claims.md describes each)
SCORECARD_COLUMNS = ["claim_id", "claim", "paper", "section", "table", "column", "model", "setting", "measured",
                     "measured_lo", "measured_hi", "measured_text", "published", "published_quantity", "published_on",
                     "published_models", "published_official_code", "same_model", "comparison_flags", "rule", "verdict", "reason",
                     "null_model", "null_measured", "null_measured_text", "null_verdict", "null_reason",
                     "noise_column", "noise_measured", "noise_verdict", "specific", "specific_reason", "stability",
                     "stability_basis", "stability_n", "sensitivity"]
#: headline categories (:func:`headline`), in order: a supported verdict counts as a finding only when specific
#: and stable (stability >= STABLE); rows of a sensitivity axis (``sensitivity``) are shown, not counted
HEADLINE = ("specific finding", "specific, unstable", "supported, not specific", NOT_SUPPORTED, INCONCLUSIVE,
            NOT_TESTABLE)


# ------------------------------------------------------------------------------------------------ rules
# Each rule gets the rows of one verdict (a DataFrame), the claim and the rule's parameters and returns a dict
# with verdict, reason, measured, measured_lo, measured_hi, measured_text (any of the last four may be absent).


def _f(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _num(v) -> str:
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return "NaN" if not np.isfinite(v) else f"{v:.4g}"


def _pick(rows: pd.DataFrame, claim: dict, params: dict):
    """The one row a scalar rule decides on: the only row, or by ``pick`` (last = largest layer, first,
    max / min of the value column); None and a reason when that is ambiguous."""
    pick = params.get("pick")
    if len(rows) == 1 or pick == "first":
        return rows.iloc[0], ""
    col = claim["value"]
    if pick == "last" and "layer" in rows:
        return rows.loc[rows.layer.astype(float).idxmax()], ""
    if pick in ("max", "min"):
        v = pd.to_numeric(rows[col], errors="coerce")
        if params.get("abs"):
            v = v.abs()
        if v.notna().any():
            return rows.loc[v.idxmax() if pick == "max" else v.idxmin()], ""
        return rows.iloc[0], ""
    return None, f"{len(rows)} rows where the rule expects one (set rule.pick: last / first / max / min)"


def _measure(row, claim: dict, params: dict):
    v, lo, hi = (_f(row.get(claim[k])) if claim.get(k) else float("nan") for k in ("value", "lo", "hi"))
    if params.get("abs"):
        if np.isfinite(lo) and np.isfinite(hi):
            lo, hi = (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
        v = abs(v)
    return v, lo, hi


def _nan_result(v, lo, hi) -> dict:
    return dict(verdict=INCONCLUSIVE, reason="measured value is NaN (not measurable on this run's data)",
                measured=v, measured_lo=lo, measured_hi=hi)


def published_range(claim: dict, model, params: dict):
    """(lo, hi, entries, same_model) of the claim's published quantity: the range over
    :func:`llmgeom.core.published.comparison_entries` (the model's own entry, else the other published models),
    widened by ``params["tolerance"]``; None without a published value. ``min`` entries give hi = inf.
    Used by the rules and by the forest plots (:mod:`llmgeom.plots.claims`)."""
    q = claim.get("published")
    if not q:
        return None
    ents, same = comparison_entries(q, model, claim.get("kind"))
    if not ents:
        return None
    tol = float(params.get("tolerance", 0.0))
    los, his = [], []
    for e in ents:
        if "range" in e:
            los.append(e["range"][0]), his.append(e["range"][1])
        elif "min" in e:
            los.append(e["min"]), his.append(math.inf)
        else:
            los.append(e["value"]), his.append(e["value"])
    return min(los) - tol, max(his) + tol, ents, same


def rule_threshold(rows, claim, params, model=None) -> dict:
    """``value op threshold`` (op ">" or "<"); with an interval, supported only when the whole interval is
    on the claimed side, not supported when it is wholly on the other side, else inconclusive. ``threshold``
    may be ``published_lo`` / ``published_hi`` (the published range's end); ``abs``: compare |value|."""
    row, why = _pick(rows, claim, params)
    if row is None:
        return dict(verdict=INCONCLUSIVE, reason=why)
    v, lo, hi = _measure(row, claim, params)
    t = params.get("threshold")
    if isinstance(t, str):
        pr = published_range(claim, model, params)
        if pr is None:
            return dict(verdict=NOT_TESTABLE, reason=f"threshold {t} needs a published value of {claim.get('published')}")
        t = pr[0] if t == "published_lo" else pr[1]
    t, op = float(t), params.get("op", ">")
    if op not in (">", "<"):
        raise ClaimsDataError(f"claim {claim['id']}: rule.op must be '>' or '<', got {op!r}")
    if not np.isfinite(v):
        return _nan_result(v, lo, hi)
    name = f"|{claim['value']}|" if params.get("abs") else claim["value"]
    out = dict(measured=v, measured_lo=lo, measured_hi=hi)
    if np.isfinite(lo) and np.isfinite(hi):
        ok, bad = (lo > t, hi <= t) if op == ">" else (hi < t, lo >= t)
        if ok:
            return dict(out, verdict=SUPPORTED, reason=f"{name} interval [{_num(lo)}, {_num(hi)}] {op} {_num(t)}")
        if bad:
            return dict(out, verdict=NOT_SUPPORTED,
                        reason=f"{name} interval [{_num(lo)}, {_num(hi)}] on the other side of {_num(t)}")
        return dict(out, verdict=INCONCLUSIVE, reason=f"{name} interval [{_num(lo)}, {_num(hi)}] contains {_num(t)}")
    ok = v > t if op == ">" else v < t
    return dict(out, verdict=SUPPORTED if ok else NOT_SUPPORTED,
                reason=f"{name} = {_num(v)} {'' if ok else 'not '}{op} {_num(t)} (no interval)")


def _ci_excludes_zero(rows, claim, params, sign: int) -> dict:
    row, why = _pick(rows, claim, params)
    if row is None:
        return dict(verdict=INCONCLUSIVE, reason=why)
    v, lo, hi = _measure(row, claim, params)
    if not np.isfinite(v):
        return _nan_result(v, lo, hi)
    out = dict(measured=v, measured_lo=lo, measured_hi=hi)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return dict(out, verdict=INCONCLUSIVE, reason=f"{claim['value']} = {_num(v)} has no interval")
    iv = f"interval [{_num(lo)}, {_num(hi)}]"
    want = "> 0" if sign > 0 else "< 0"
    if (lo > 0 and sign > 0) or (hi < 0 and sign < 0):
        return dict(out, verdict=SUPPORTED, reason=f"{iv} excludes 0, {want}")
    if lo > 0 or hi < 0:
        return dict(out, verdict=NOT_SUPPORTED, reason=f"{iv} excludes 0 on the opposite side (claim: {want})")
    return dict(out, verdict=INCONCLUSIVE, reason=f"{iv} contains 0")


def rule_ci_excludes_zero_positive(rows, claim, params, model=None) -> dict:
    """Supported when the interval ``[lo, hi]`` lies above 0; not supported when it lies below 0;
    inconclusive when it contains 0 or is missing."""
    return _ci_excludes_zero(rows, claim, params, +1)


def rule_ci_excludes_zero_negative(rows, claim, params, model=None) -> dict:
    """Supported when the interval ``[lo, hi]`` lies below 0; not supported above 0; inconclusive when it
    contains 0 or is missing."""
    return _ci_excludes_zero(rows, claim, params, -1)


def rule_inside_published_range(rows, claim, params, model=None) -> dict:
    """Value inside the published range of ``claim.published`` (the entry of the same model when the file has
    one, else the range over all published models; ``min`` entries: [min, inf); ``tolerance`` widens it).
    Supported: value inside; not supported: value outside and its interval (if any) does not reach the range;
    inconclusive: value outside but the interval overlaps the range. ``abs``: compare |value|."""
    row, why = _pick(rows, claim, params)
    if row is None:
        return dict(verdict=INCONCLUSIVE, reason=why)
    pr = published_range(claim, model, params)
    if pr is None:
        return dict(verdict=NOT_TESTABLE, reason=f"no published value of {claim.get('published')} in published.yaml")
    plo, phi = pr[0], pr[1]
    v, lo, hi = _measure(row, claim, params)
    if not np.isfinite(v):
        return _nan_result(v, lo, hi)
    out = dict(measured=v, measured_lo=lo, measured_hi=hi)
    rng = f"[{_num(plo)}, {_num(phi)}]"
    if plo <= v <= phi:
        return dict(out, verdict=SUPPORTED, reason=f"{_num(v)} inside the published range {rng}")
    if np.isfinite(lo) and np.isfinite(hi) and lo <= phi and hi >= plo:
        return dict(out, verdict=INCONCLUSIVE,
                    reason=f"{_num(v)} outside {rng} but its interval [{_num(lo)}, {_num(hi)}] overlaps it")
    return dict(out, verdict=NOT_SUPPORTED, reason=f"{_num(v)} outside the published range {rng}")


def rule_sign_of(rows, claim, params, model=None) -> dict:
    """Sign of the value is ``expected`` (positive / negative); with ``p`` (a p-value column) and ``alpha``,
    a p-value >= alpha is inconclusive."""
    row, why = _pick(rows, claim, params)
    if row is None:
        return dict(verdict=INCONCLUSIVE, reason=why)
    v, lo, hi = _measure(row, claim, params)
    exp = params.get("expected", "positive")
    if exp not in ("positive", "negative"):
        raise ClaimsDataError(f"claim {claim['id']}: rule.expected must be positive or negative, got {exp!r}")
    if not np.isfinite(v):
        return _nan_result(v, lo, hi)
    out = dict(measured=v, measured_lo=lo, measured_hi=hi)
    p = _f(row.get(params["p"])) if params.get("p") else float("nan")
    ptxt = f" (p = {p:.2g})" if np.isfinite(p) else ""
    if params.get("p"):
        out["measured_text"] = f"{claim['value']} = {_num(v)}{ptxt}"
        alpha = float(params.get("alpha", 0.05))
        if not np.isfinite(p) or p >= alpha:
            return dict(out, verdict=INCONCLUSIVE, reason=f"{claim['value']} = {_num(v)}{ptxt}: p >= {alpha} or NaN")
    ok = v > 0 if exp == "positive" else v < 0
    return dict(out, verdict=SUPPORTED if ok else NOT_SUPPORTED,
                reason=f"{claim['value']} = {_num(v)}{ptxt} is {'' if ok else 'not '}{exp}")


def rule_compare_columns(rows, claim, params, model=None) -> dict:
    """``value op other`` for every column of ``others`` (op "<" or ">"), all in the same row."""
    row, why = _pick(rows, claim, params)
    if row is None:
        return dict(verdict=INCONCLUSIVE, reason=why)
    v = _f(row.get(claim["value"]))
    op = params.get("op", "<")
    others = {o: _f(row.get(o)) for o in params.get("others", [])}
    if not np.isfinite(v) or not all(np.isfinite(x) for x in others.values()):
        return dict(_nan_result(v, float("nan"), float("nan")),
                    reason=f"NaN among {claim['value']} and {sorted(others)}")
    fails = [o for o, x in others.items() if not (v < x if op == "<" else v > x)]
    txt = ", ".join(f"{o} = {_num(x)}" for o, x in others.items())
    if fails:
        return dict(measured=v, verdict=NOT_SUPPORTED, reason=f"{claim['value']} = {_num(v)} not {op} {', '.join(fails)} ({txt})")
    return dict(measured=v, verdict=SUPPORTED, reason=f"{claim['value']} = {_num(v)} {op} {txt}")


def rule_category_in(rows, claim, params, model=None) -> dict:
    """A text value (e.g. the ID profile's ``shape``) is one of ``values``."""
    row, why = _pick(rows, claim, params)
    if row is None:
        return dict(verdict=INCONCLUSIVE, reason=why)
    v = row.get(claim["value"])
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return dict(verdict=INCONCLUSIVE, reason=f"{claim['value']} is empty")
    ok = str(v) in [str(x) for x in params.get("values", [])]
    return dict(measured_text=str(v), verdict=SUPPORTED if ok else NOT_SUPPORTED,
                reason=f"{claim['value']} = {v} {'is' if ok else 'is not'} one of {params.get('values')}")


def rule_same_verdict_all_estimators(rows, claim, params, model=None) -> dict:
    """The ``inner`` rule decided per value of ``group`` (default ``estimator``): supported / not supported
    when every group agrees on it, inconclusive when they disagree (the reason lists each)."""
    g = params.get("group", "estimator")
    if g not in rows:
        return dict(verdict=NOT_TESTABLE, reason=f"table {claim['table']} has no column {g}")
    inner = dict(params["inner"])
    fn = RULES[inner.pop("kind")]
    res = {k: fn(r, claim, inner, model) for k, r in rows.groupby(g, sort=True)}
    verdicts = {r["verdict"] for r in res.values()}
    parts = [f"{k}: {r.get('measured_text') or _num(_f(r.get('measured')))} {r['verdict']}" for k, r in res.items()]
    text = "; ".join(parts)
    if len(verdicts) == 1:
        v = verdicts.pop()
        return dict(measured_text=text, verdict=v, reason=f"the same under every {g}: {text}")
    return dict(measured_text=text, verdict=INCONCLUSIVE, reason=f"{g}s disagree: {text}")


def _attention_family(label) -> str:
    return str(label).split()[0] if isinstance(label, str) and label else ""


def rule_group_greater(rows, claim, params, model=None) -> dict:
    """Across models: mean value of the models whose ``group`` (first word: MHA / GQA / MQA) is in ``greater``
    above that of the models in ``lesser``; not testable here when either side has no model."""
    fam = rows[params.get("group", "attention_type")].map(_attention_family)
    a = pd.to_numeric(rows.loc[fam.isin(params["greater"]), claim["value"]], errors="coerce").dropna()
    b = pd.to_numeric(rows.loc[fam.isin(params["lesser"]), claim["value"]], errors="coerce").dropna()
    have = sorted(set(fam) - {""})
    if not len(a) or not len(b):
        return dict(verdict=NOT_TESTABLE, reason=f"needs models with two attention types ({'/'.join(params['greater'])} "
                    f"and {'/'.join(params['lesser'])}); this run has: {', '.join(have) or 'none'}")
    d = float(a.mean() - b.mean())
    ok = d > 0
    return dict(measured=d, measured_text=f"{'/'.join(params['greater'])} {a.mean():.3g} vs "
                f"{'/'.join(params['lesser'])} {b.mean():.3g}", verdict=SUPPORTED if ok else NOT_SUPPORTED,
                reason=f"difference of means {d:.3g} {'>' if ok else '<='} 0 ({len(a)} vs {len(b)} models)")


def rule_interval_contains_reference(rows, claim, params, model=None) -> dict:
    """Per row (e.g. layer), the interval ``[lo, hi]`` contains the ``reference`` column; supported when the
    share of rows where it does is >= ``min_share``."""
    ref = params["reference"]
    for c in (claim.get("lo"), claim.get("hi"), ref):
        if c not in rows:
            return dict(verdict=NOT_TESTABLE, reason=f"table {claim['table']} has no column {c}")
    lo, hi, r = (pd.to_numeric(rows[c], errors="coerce") for c in (claim["lo"], claim["hi"], ref))
    ok = lo.notna() & hi.notna() & r.notna()
    if not ok.any():
        return _nan_result(float("nan"), float("nan"), float("nan"))
    share = float(((lo[ok] <= r[ok]) & (r[ok] <= hi[ok])).mean())
    need = float(params.get("min_share", 0.5))
    v = SUPPORTED if share >= need else NOT_SUPPORTED
    return dict(measured=share, measured_text=f"{ref} inside [{claim['lo']}, {claim['hi']}] at {share:.0%} of "
                f"{int(ok.sum())} rows", verdict=v, reason=f"share {share:.2f} {'>=' if share >= need else '<'} {need}")


def min_rank_models(alpha: float) -> int:
    """The fewest models whose exact one-sided rank test can reach p < ``alpha``: the smallest n with 1 / n! <
    alpha (alpha = 0.05: 4, since 1/24 = 0.042 while 1/6 = 0.167)."""
    n, f = 1, 1
    while 1.0 / f >= alpha:
        n += 1
        f *= n
    return n


def _size_series(rows, claim, params):
    """The across-size series of one claim: per model (one row each) log size x, log value y, the standard error
    of log value from the model's interval, and the reason the series cannot be decided ("" when it can).

    Returns:
        dict(x, y, se, v, models, n, why): x = ln(size column ``params["x"]``), y = ln(value), se = (hi - lo) /
        (2 z v) with z the normal quantile of ``params["interval_ci"]`` (default 0.95, the tables' intervals; the
        delta method for ln), all float64 [n]; why names the models without a positive value, a finite size or an
        interval (an across-size statistic is decided against its own noise, never without it).
    """
    from scipy.stats import norm

    xcol = params.get("x", "n_params")
    out = dict(x=np.empty(0), y=np.empty(0), se=np.empty(0), v=np.empty(0), models=[], n=0, xcol=xcol, why="")
    if xcol not in rows or claim["value"] not in rows:
        return dict(out, why=f"no column {xcol if xcol not in rows else claim['value']}")
    num = {c: pd.to_numeric(rows[c], errors="coerce").to_numpy(float) if c in rows else np.full(len(rows), np.nan)
           for c in (xcol, claim["value"], claim.get("lo") or "", claim.get("hi") or "")}
    x, v = num[xcol], num[claim["value"]]
    lo, hi = num[claim.get("lo") or ""], num[claim.get("hi") or ""]
    names = list(rows["model"].astype(str)) if "model" in rows else [str(i) for i in range(len(rows))]
    ok = np.isfinite(x) & np.isfinite(v)
    x, v, lo, hi, names = x[ok], v[ok], lo[ok], hi[ok], [m for m, k in zip(names, ok) if k]
    n = int(x.size)
    out.update(models=names, n=n, v=v)
    need = int(params.get("min_models") or min_rank_models(float(params.get("alpha", 0.05))))
    if n < need:
        return dict(out, why=f"{n} model(s) with a value: an across-size test needs at least {need}")
    if np.any(v <= 0) or np.any(x <= 0):
        bad = [m for m, a, b in zip(names, v, x) if a <= 0 or b <= 0]
        return dict(out, why=f"a log-log slope needs positive sizes and values ({', '.join(bad)})")
    if np.all(x == x[0]):
        return dict(out, why=f"all {n} models have the same {xcol}")
    z = float(norm.ppf(0.5 + float(params.get("interval_ci", INTERVAL_CI)) / 2))
    se = (hi - lo) / (2.0 * z * v)
    miss = [m for m, s in zip(names, se) if not (np.isfinite(s) and s > 0)]
    if miss:
        return dict(out, why=f"no interval for {', '.join(miss)}: an across-size statistic is decided against its "
                             f"per-model noise (scaling.csv lo / hi)")
    return dict(out, x=np.log(x), y=np.log(v), se=se)


def size_slope(x, y, se) -> tuple[float, float, float]:
    """Log-log slope of a statistic against model size, with its standard error propagated from the per-model
    standard errors.

    Args:
        x: [n] ln(model size); y: [n] ln(value); se: [n] standard errors of y (from each model's own interval).

    Returns:
        (slope, sd, dof): the weighted least-squares slope (weights 1 / se^2; numpy.polyfit) and its standard
        deviation: the larger of the propagated one (the per-model errors alone) and the one scaled by the reduced
        chi-square of the fit (the Birge ratio: scatter of the models around the line beyond their own noise), so
        that neither an optimistic interval nor a lucky alignment of four points decides; dof = inf when the
        propagated one is used (known variances: normal quantiles), n - 2 when the scaled one is (the variance is
        then estimated from the residuals: Student's t quantiles, :func:`slope_quantile`). Dimensionless (ln value
        per ln size). (NaN, NaN, NaN) with fewer than 3 points.

    Source: weighted regression with the variance scaled by the reduced chi-square (Birge 1932; Bevington &
    Robinson, Data Reduction and Error Analysis, sec. 6-7).
    """
    x, y, se = (np.asarray(a, np.float64) for a in (x, y, se))
    if x.size < 3:
        return float("nan"), float("nan"), float("nan")
    coef, cov_unscaled = np.polyfit(x, y, 1, w=1.0 / se, cov="unscaled")
    _, cov_scaled = np.polyfit(x, y, 1, w=1.0 / se, cov=True)
    scaled = cov_scaled[0, 0] > cov_unscaled[0, 0]
    return (float(coef[0]), float(np.sqrt(max(cov_unscaled[0, 0], cov_scaled[0, 0]))),
            float(x.size - 2) if scaled else math.inf)


def slope_quantile(p: float, dof: float) -> float:
    """The p quantile of the slope's reference distribution: normal for dof = inf, Student's t with ``dof`` degrees
    of freedom otherwise (:func:`size_slope`)."""
    from scipy.stats import norm, t

    return float(norm.ppf(p) if not np.isfinite(dof) else t.ppf(p, dof))


def _slope_cdf(q: float, dof: float) -> float:
    from scipy.stats import norm, t

    return float(norm.cdf(q) if not np.isfinite(dof) else t.cdf(q, dof))


def _published_points(quantity: str) -> list[tuple[float, float, str]]:
    """(n_params, value, model) of the published per-model entries of ``quantity`` (paper or secondary source,
    a positive value, a model whose size published.yaml's ``models`` gives): what the equivalence bound and the
    trend alternative read."""
    from llmgeom.core.published import load_published, load_published_models, model_key

    facts = load_published_models()
    pts = []
    for e in load_published().get(quantity, []):
        n = facts.get(model_key(e.get("model") or ""), {}).get("n_params")
        if n and "value" in e and e["value"] > 0 and e.get("source_kind") in ("paper", "secondary"):
            pts.append((float(n), float(e["value"]), e["model"]))
    return pts


def equivalence_bound(quantity: str) -> tuple[float, str]:
    """The equivalence bound of a constancy claim: the largest |log-log slope| that the published per-model values
    of ``quantity`` span over the published models' sizes, ln(max / min value) / ln(max / min size): a series that
    the paper calls constant moves at most this much per e-fold of size.

    Args:
        quantity: a quantity of ``llmgeom/data/published.yaml`` with one entry per named model (e.g. LSM Table 4's
            m0.05 per model), the models' sizes in its ``models`` section (total parameter counts: the bound is per
            e-fold of total size, also where a sensitivity row reads another size axis).

    Returns:
        (bound, text): the bound (dimensionless, > 0) and where it comes from; (NaN, why) with fewer than two
        published models with a size and a positive value.

    Source: LSM Tables 2-4 (the per-model values behind "nearly constant" / "roughly constant", sec. 13.4.1).
    """
    pts = _published_points(quantity)
    if len(pts) < 2 or len({p[0] for p in pts}) < 2:
        return float("nan"), f"no per-model published values of {quantity} with sizes"
    ns, vs = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    b = float(np.log(vs.max() / vs.min()) / np.log(ns.max() / ns.min()))
    return b, (f"{quantity}: {len(pts)} published models span {_num(vs.min())}-{_num(vs.max())} over "
               f"{_num(ns.min() / 1e6)}M-{_num(ns.max() / 1e6)}M parameters (total)")


def published_slope(quantity: str) -> tuple[float, str]:
    """The ordinary least-squares log-log slope of a quantity's published per-model values against total size (the
    alternative a trend claim's power is computed against): (slope, text); (NaN, why) without two sized models."""
    pts = _published_points(quantity)
    if len({p[0] for p in pts}) < 2:
        return float("nan"), f"no per-model published values of {quantity} with sizes"
    b = float(np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0])
    return b, f"{quantity} ({len(pts)} published models, total sizes)"


def _slope_text(s: dict, b: float, sd: float, z: float, alpha: float, dof: float) -> str:
    lo, hi = b - z * sd, b + z * sd
    ref = "normal" if not np.isfinite(dof) else f"t with {dof:.0f} df: scatter beyond the models' own intervals"
    return (f"log-log slope vs {s['xcol']} = {_num(b)}, {100 * (1 - 2 * alpha):.0f}% interval [{_num(lo)}, {_num(hi)}] "
            f"({ref}) over n = {s['n']} models")


def _rank_p_text(s: dict, alternative: str) -> str:
    from llmgeom.core.stats import spearman_exact

    rho, p = spearman_exact(s["x"], s["y"], alternative=alternative)
    return f"; exact one-sided rank p = {p:.3g} (rho = {_num(rho)}; smallest possible {1 / math.factorial(s['n']):.3g})"


def rule_size_trend(rows, claim, params, model=None) -> dict:
    """Across models: the value rises (``expected: increasing``) or falls (``decreasing``) with size (``x``, default
    n_params), decided on the log-log slope (:func:`size_slope`, its error propagated from each model's interval):
    supported when the one-sided (1 - ``alpha``) bound of the slope lies on the expected side of 0 (the two-sided
    1 - 2 alpha interval excludes 0 there), not supported when it lies on the other side, else inconclusive; also
    inconclusive with fewer than ``min_models`` models (default :func:`min_rank_models`), non-positive values, equal
    sizes or a model without an interval. The reason gives the slope and interval, the exact one-sided rank p
    (:func:`llmgeom.core.stats.spearman_exact`) and the power at this n: the probability that the rule decides
    "supported" if the true slope were the published models' own (``alternative_from``, a published quantity:
    :func:`published_slope`), Phi(|b_alt| / sd - z)."""

    exp = params.get("expected", "increasing")
    if exp not in ("increasing", "decreasing"):
        raise ClaimsDataError(f"claim {claim['id']}: rule.expected must be increasing or decreasing, got {exp!r}")
    s = _size_series(rows, claim, params)
    if s["why"]:
        return dict(verdict=INCONCLUSIVE, reason=s["why"])
    alpha = float(params.get("alpha", 0.05))
    b, sd, dof = size_slope(s["x"], s["y"], s["se"])
    z = slope_quantile(1 - alpha, dof)
    text = _slope_text(s, b, sd, z, alpha, dof)
    sign = 1 if exp == "increasing" else -1
    out = dict(measured=b, measured_lo=b - z * sd, measured_hi=b + z * sd, measured_text=text)
    alt = params.get("alternative_from")
    if alt:
        ba, atext = published_slope(alt)
        power = (f"; power at n = {s['n']}: {_slope_cdf(sign * ba / sd - z, dof):.2f} against the published slope "
                 f"{_num(ba)} ({atext})" if np.isfinite(ba) else f"; power not computed: {atext}")
    else:
        power = "; power not computed: no published alternative slope"
    tail = _rank_p_text(s, "greater" if sign > 0 else "less") + power
    if sign * (b - sign * z * sd) > 0:
        return dict(out, verdict=SUPPORTED, reason=f"{text} excludes 0: {exp} with size{tail}")
    if sign * (b + sign * z * sd) < 0:
        return dict(out, verdict=NOT_SUPPORTED, reason=f"{text} excludes 0 on the other side{tail}")
    return dict(out, verdict=INCONCLUSIVE, reason=f"{text} contains 0: no trend decided{tail}")


def rule_size_constancy(rows, claim, params, model=None) -> dict:
    """Across models: the value stays constant with size, decided as an equivalence test (two one-sided tests at
    ``alpha``) on the log-log slope (:func:`size_slope`): supported when the 1 - 2 alpha interval of the slope lies
    inside (-B, B), not supported when it lies wholly outside [-B, B] (a trend larger than the bound), else
    inconclusive. B = :func:`equivalence_bound` of ``bound_from`` (the published per-model values' own spread) or
    ``bound`` (a number, said to be ours). With ``grows`` (a size column, e.g. d_model) a constancy that holds must
    also be slower than that column's own log-log slope (the upper end of the interval below it), else
    inconclusive. Inconclusive also as in :func:`rule_size_trend`. The reason gives slope, interval, B and its
    source, the exact two-sided rank p and the power at this n: the probability of "supported" were the true slope
    0, max(0, 2 Phi(B / sd - z) - 1)."""
    from scipy.stats import norm

    s = _size_series(rows, claim, params)
    if s["why"]:
        return dict(verdict=INCONCLUSIVE, reason=s["why"])
    alpha = float(params.get("alpha", 0.05))
    if params.get("bound_from"):
        bound, btext = equivalence_bound(params["bound_from"])
    elif params.get("bound") is not None:
        bound, btext = float(params["bound"]), "our reading (rule.bound)"
    else:
        raise ClaimsDataError(f"claim {claim['id']}: rule size_constancy needs bound_from (a published quantity) "
                              "or bound")
    if not np.isfinite(bound) or bound <= 0:
        return dict(verdict=NOT_TESTABLE, reason=f"no equivalence bound: {btext}")
    b, sd, dof = size_slope(s["x"], s["y"], s["se"])
    z = slope_quantile(1 - alpha, dof)
    lo, hi = b - z * sd, b + z * sd
    text = _slope_text(s, b, sd, z, alpha, dof)
    power = max(0.0, 2 * _slope_cdf(bound / sd - z, dof) - 1)
    tail = (f"; bound B = {_num(bound)} ({btext}); power at n = {s['n']}: {power:.2f} were the slope 0"
            + _rank_p_text(s, "two-sided").replace("one-sided", "two-sided"))
    out = dict(measured=b, measured_lo=lo, measured_hi=hi, measured_text=text)
    if lo > bound or hi < -bound:
        return dict(out, verdict=NOT_SUPPORTED, reason=f"{text} outside [-B, B]: not constant{tail}")
    if not (-bound < lo and hi < bound):
        return dict(out, verdict=INCONCLUSIVE, reason=f"{text} not inside (-B, B): constancy not shown{tail}")
    g = params.get("grows")
    if g:
        gv = pd.to_numeric(rows[g], errors="coerce").to_numpy(float) if g in rows else np.array([])
        xs = pd.to_numeric(rows[s["xcol"]], errors="coerce").to_numpy(float)
        ok = np.isfinite(gv) & (gv > 0) & np.isfinite(xs) & (xs > 0) if gv.size else np.array([], bool)
        gs = (float(np.polyfit(np.log(xs[ok]), np.log(gv[ok]), 1)[0]) if np.ptp(gv[ok]) > 0 else 0.0) if (
            ok.sum() >= 2 and np.ptp(xs[ok]) > 0) else np.nan
        if not np.isfinite(gs) or gs <= hi:
            return dict(out, verdict=INCONCLUSIVE,
                        reason=f"{text} inside (-B, B), but {g} grows with slope {_num(gs)}, not above the upper end{tail}")
        tail = f" while {g} grows with slope {_num(gs)}" + tail
    return dict(out, verdict=SUPPORTED, reason=f"{text} inside (-B, B): constant{tail}")


#: rule kind (claims.yaml ``rule.kind``) -> function(rows, claim, params, model) -> result dict
RULES = {"threshold": rule_threshold, "ci_excludes_zero_positive": rule_ci_excludes_zero_positive,
         "ci_excludes_zero_negative": rule_ci_excludes_zero_negative,
         "inside_published_range": rule_inside_published_range, "sign_of": rule_sign_of,
         "compare_columns": rule_compare_columns, "category_in": rule_category_in,
         "same_verdict_all_estimators": rule_same_verdict_all_estimators, "group_greater": rule_group_greater,
         "interval_contains_reference": rule_interval_contains_reference, "size_trend": rule_size_trend,
         "size_constancy": rule_size_constancy}


# ------------------------------------------------------------------------------------------------ scorecard

def _rule_text(rule: dict) -> str:
    r = dict(rule)
    k = r.pop("kind")
    return k + (" " + ", ".join(f"{a}={b}" for a, b in r.items()) if r else "")


def filter_rows(df: pd.DataFrame, where: dict | None) -> pd.DataFrame:
    """The rows of ``df`` where each column of ``where`` holds its value or one of its values (a list or tuple),
    compared as text (a table read back from CSV); no rows when a column is missing. The one row filter of the
    claims' and the scaling table's ``where``."""
    for col, want in (where or {}).items():
        if col not in df:
            return df.iloc[0:0]
        vals = [str(w) for w in (want if isinstance(want, (list, tuple)) else [want])]
        df = df[df[col].astype(str).isin(vals)]
    return df


def _official_code_text(q: str, model, kind) -> str:
    """The official code's committed values of quantity ``q``, beside the paper's: "value
    (model; source)", "; "-separated; "" when the official code gives none."""
    ents = entries_by_kind(q, model or None, kind).get("official_code", []) or entries_by_kind(q, None, kind).get(
        "official_code", [])
    return "; ".join(f"{value_text(e)} ({e['models']}; {source_text(e)})" for e in ents)


def _published_cells(claim: dict, model) -> dict:
    q = claim.get("published")
    if not q:
        return dict(published="", published_quantity="", published_on="", published_models="",
                    published_official_code="", same_model=False)
    ents, same = comparison_entries(q, model, claim.get("kind"))
    if not ents:
        return dict(published="", published_quantity=q, published_on=f"{q}: not in published.yaml", published_models="",
                    published_official_code=_official_code_text(q, model, claim.get("kind")), same_model=False)
    return dict(published="; ".join(value_text(e) + ("" if same or len(ents) == 1 else f" ({e['model'] or e['models']})")
                                    for e in ents),
                published_quantity=q, published_on="; ".join(sorted({source_text(e) for e in ents})),
                published_models="; ".join(dict.fromkeys(e["models"] for e in ents)), same_model=same,
                published_official_code=_official_code_text(q, model, claim.get("kind")),
                _secondary=any(e["secondary"] for e in ents))


#: the share of resamples a verdict must keep to count as stable (front page, :func:`headline`)
STABLE = 0.9
#: at most this many resamples re-decide a verdict (the first ones of its replicates; the interval used them all)
STABILITY_MAX_RESAMPLES = 200
_NO_STABILITY = dict(stability=float("nan"), stability_basis="", stability_n=0)


def _row_names(g: pd.DataFrame, mask) -> str:
    names = [", ".join(f"{c}={r[c]}" for c in ("model", "estimator", "quantity", "layer") if c in g)
             for (_, r), m in zip(g.iterrows(), mask) if m]
    return "; ".join(names) or "?"


def _replicate_frames(g: pd.DataFrame, claim: dict, across: bool, seed_name: str, interval_ci: float):
    """(frames, basis): copies of a verdict's rows, one per usable resample b, with the decided column moved by
    replicate b's deviation from the replicates' mean (t + t*_b - mean t*: the resampling spread around the estimate,
    without the bootstrap's bias shift, which the tables' basic intervals already correct) and the interval columns
    shifted with it; a resample in which any row's replicate is non-finite (a resample where the statistic is
    undefined) is left out, and the basis says how many; rows without replicates are held at their value (named in
    the basis). ([], why) without replicates."""
    from llmgeom.core.stats import REPLICATES_SUFFIX, derived_seed, parse_replicates

    col, lo, hi = claim["value"], claim.get("lo"), claim.get("hi")
    rcol = col + REPLICATES_SUFFIX
    if col in g and rcol in g and g[col].map(lambda x: isinstance(x, str)).any():
        # a category (e.g. the ID profile's shape): its replicates are labels without spaces, one per resample
        labels = [np.array(str(c).split()) if isinstance(c, str) else np.empty(0, dtype=str) for c in g[rcol]]
        have = [r.size > 0 for r in labels]
        nb = min((r.size for r in labels if r.size), default=0)
        if not nb:
            return [], f"no replicates of {claim['table']}.{col} ({rcol})"
        frames, skipped = [], 0
        for b in range(nb):
            if any(r.size and r[b] == "nan" for r in labels):
                skipped += 1
                continue
            if len(frames) < STABILITY_MAX_RESAMPLES:
                gb = g.copy()
                gb[col] = [r[b] if r.size else x for r, x in zip(labels, g[col])]
                frames.append(gb)
        basis = f"{len(frames)} resamples of {claim['table']}.{rcol}"
        basis += f" ({skipped} without a value left out)" if skipped else ""
        basis += "" if all(have) else f"; held fixed (no replicates): {_row_names(g, [not h for h in have])}"
        return frames, basis
    v = pd.to_numeric(g[col], errors="coerce").to_numpy(float) if col in g else np.full(len(g), np.nan)
    reps = [parse_replicates(c) for c in g[rcol]] if rcol in g else [np.empty(0)] * len(g)
    # a row whose statistic is undefined (NaN estimate, or no finite replicate: e.g. a layer without a straight
    # range) has nothing to resample: held at its value, like a row without replicates
    reps = [r if r.size and np.isfinite(x) and np.isfinite(r).any() else np.empty(0) for r, x in zip(reps, v)]
    have = [r.size > 0 for r in reps]
    basis = f"resamples of {claim['table']}.{rcol}"
    if not any(have):
        if not across:
            return [], f"no replicates of {claim['table']}.{col} ({rcol})"
        if not (lo and hi and lo in g and hi in g):
            return [], f"no replicates or intervals of {claim['table']}.{col}"
    if across and not all(have):
        # models without replicates: normal draws from their own interval (the one an across-size rule reads)
        from scipy.stats import norm

        rng = np.random.default_rng(derived_seed(0, seed_name))
        z = float(norm.ppf(0.5 + float(interval_ci) / 2))
        lo_v = pd.to_numeric(g[lo], errors="coerce").to_numpy(float) if lo and lo in g else np.full(len(g), np.nan)
        hi_v = pd.to_numeric(g[hi], errors="coerce").to_numpy(float) if hi and hi in g else np.full(len(g), np.nan)
        n_draw = min((r.size for r in reps if r.size), default=STABILITY_MAX_RESAMPLES)
        basis = (f"resamples: replicates where the table has them, normal draws from the interval for "
                 f"{_row_names(g, [not h for h in have])}")
        for i, h in enumerate(have):
            if not h:
                reps[i] = v[i] + (hi_v[i] - lo_v[i]) / (2 * z) * rng.standard_normal(n_draw)
        have = [True] * len(reps)
    elif not all(have):
        basis += f"; held fixed (no replicates): {_row_names(g, [not h for h in have])}"
    nb = min((r.size for r in reps if r.size), default=0)
    dev = [r[:nb] - np.nanmean(r[:nb]) if r.size else None for r in reps]
    frames, skipped = [], 0
    for b in range(nb):
        if any(d is not None and not np.isfinite(d[b]) for d in dev):
            skipped += 1
            continue
        if len(frames) >= STABILITY_MAX_RESAMPLES:
            break
        shift = np.array([d[b] if d is not None else 0.0 for d in dev])
        gb = g.copy()
        gb[col] = v + shift
        for c in (lo, hi):
            if c and c in gb:
                gb[c] = pd.to_numeric(gb[c], errors="coerce").to_numpy(float) + shift
        frames.append(gb)
    basis = f"{len(frames)} {basis}" + (f" ({skipped} with an undefined value left out)" if skipped else "")
    return frames, basis


def _stability(fn, g: pd.DataFrame, claim: dict, rule: dict, model, verdict: str, across: bool) -> dict:
    """stability (the share of resamples whose re-decided verdict equals ``verdict``), stability_basis (what was
    resampled, or why nothing was) and stability_n (resamples) of one decided row; NaN for an undecided one.

    Each resample b moves the decided column of every row of the verdict by replicate b's deviation from the mean
    of its replicates (``<value>_replicates``: the resamples of prompts, passages or positions that its interval
    already drew; :func:`_replicate_frames`), shifts the row's interval with it and runs the same rule; resamples in
    which the statistic is undefined are left out. A claim with ``resampling`` (e.g. a statistic of the weights: nothing is
    sampled) is stable by construction (1.0, the reason as basis). Across models: replicate b of every model
    jointly (independent resamples); a model without replicates draws from a normal of its own interval.
    """
    if verdict not in (SUPPORTED, NOT_SUPPORTED):
        return dict(_NO_STABILITY, stability_basis=f"verdict {verdict}: nothing to re-decide")
    if claim.get("resampling"):
        return dict(stability=1.0, stability_basis=str(claim["resampling"]), stability_n=0)
    frames, basis = _replicate_frames(g, claim, across, f"{claim['id']}:{model}",
                                      float(rule.get("interval_ci", INTERVAL_CI)))
    if not frames:
        return dict(_NO_STABILITY, stability_basis=basis)
    same = sum(fn(gb, claim, rule, model)["verdict"] == verdict for gb in frames)
    return dict(stability=same / len(frames), stability_basis=basis, stability_n=len(frames))


def _verdict_rows(claim: dict, table: pd.DataFrame | None, models: list[str], *, stability: bool = True) -> list[dict]:
    base = dict(claim_id=claim["id"], claim=claim["sentence"], paper=claim["paper"], section=claim["section"],
                table=claim["table"], column=claim["value"], rule=_rule_text(claim["rule"]))
    rule = dict(claim["rule"])
    fn = RULES[rule.pop("kind")]
    across = claim.get("scope") == "across_models"

    def none(reason, model):
        return [dict(base, model=model, setting="", verdict=NOT_TESTABLE, reason=reason, sensitivity=False,
                     **_NO_STABILITY, **_published_cells(claim, ""))]

    everyone = "all models" if across else None
    if table is None:
        return [r for m in ([everyone] if across else (models or ["(any)"])) for r in none(MISSING_TABLE, m)]
    need = [claim["value"]] + ([] if rule.get("inner") else [c for c in (claim.get("lo"), claim.get("hi")) if c])
    miss = [c for c in need if c not in table.columns]
    if miss and fn is not rule_interval_contains_reference:
        return none(f"table {claim['table']} has no column(s) {', '.join(miss)}", everyone or "(any)")
    rows = filter_rows(table, claim.get("where"))
    whole = {} if across else _not_applicable_models(table, claim, rows)
    if not len(rows) and not whole:
        return none(f"no rows of {claim['table']} match {claim.get('where')}", everyone or "(any)")
    by = [c for c in (claim.get("by") or []) if c in rows.columns]
    keys = by if across else ["model"] + by
    # an across-size rule is decided on its size axis (x) and, as a sensitivity row, on another (sensitivity_x)
    axes = [(rule, "")] + ([(dict(rule, x=rule["sensitivity_x"]), rule["sensitivity_x"])]
                           if across and rule.get("sensitivity_x") else [])
    out = []
    for key, g in (rows.groupby(keys, sort=False, dropna=False) if keys else [((), rows)]):
        key = key if isinstance(key, tuple) else (key,)
        kv = dict(zip(keys, key))
        model = everyone if across else kv.pop("model")
        if across:
            model = f"all models ({', '.join(dict.fromkeys(map(str, g.model)))})" if "model" in g else everyone
        req = claim.get("requires") or {}
        n_models = g.model.nunique() if "model" in g else len(g)
        pub = _published_cells(claim, "" if across else model)
        na = _not_applicable(g, claim)
        for arule, sens in axes:
            kva = dict(kv, **({"x": arule["x"]} if len(axes) > 1 else {}))
            setting = ", ".join(f"{k}={v}" for k, v in kva.items())
            if na:
                res = dict(verdict=NOT_TESTABLE, reason=na)
            elif req.get("min_models") and n_models < int(req["min_models"]):
                res = dict(verdict=NOT_TESTABLE, reason=f"{req.get('reason', 'needs more models')} (this run: {n_models})")
            else:
                res = fn(g, claim, arule, None if across else model)
            stab = (_stability(fn, g, claim, arule, None if across else model, res["verdict"], across)
                    if stability else dict(stability=float("nan"), stability_basis="", stability_n=0))
            text = res.get("measured_text") or _measured_text(res)
            text += _context_text(g, claim, arule)
            out.append(dict(base, model=model, setting=setting, measured=_f(res.get("measured")),
                            measured_lo=_f(res.get("measured_lo")), measured_hi=_f(res.get("measured_hi")),
                            measured_text=text, verdict=res["verdict"], reason=res["reason"],
                            comparison_flags=_flags(claim, pub, model), sensitivity=bool(sens), **stab, **pub))
    for model, reason in whole.items():  # e.g. a state-space model's interventions: no run, axis or edit to select
        pub = _published_cells(claim, model)
        out.append(dict(base, model=model, setting="", measured=float("nan"), measured_lo=float("nan"),
                        measured_hi=float("nan"), measured_text="", verdict=NOT_TESTABLE, reason=reason,
                        comparison_flags=_flags(claim, pub, model), sensitivity=False, **_NO_STABILITY, **pub))
    return out


def _blank(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == ""


def _not_applicable_models(table: pd.DataFrame, claim: dict, matched: pd.DataFrame) -> dict:
    """{model: reason} of the models that the claim's ``where`` leaves without rows and whose table says, for the
    whole model, that the measure does not apply: a row with a reason in the claim's ``not_applicable`` column and
    none of the ``where`` columns set (the interventions' one row of a model without attention layers: no run,
    axis or edit). Such a model is "not testable here" with that reason (setting ""), not left out."""
    col = claim.get("not_applicable")
    if not col or col not in table.columns or "model" not in table.columns:
        return {}
    where = [c for c in (claim.get("where") or {}) if c in table.columns]
    seen = set(matched.model.astype(str)) if "model" in matched else set()
    out: dict = {}
    for _, r in table[~table[col].map(_blank)].iterrows():  # the rows that give a reason (few)
        m = str(r["model"])
        if m not in seen and m not in out and all(_blank(r[c]) for c in where):
            out[m] = str(r[col]).strip()
    return out


def _not_applicable(g: pd.DataFrame, claim: dict) -> str:
    """The reason the measure does not apply to these rows: the first non-empty text in the claim's
    ``not_applicable`` column (e.g. table2's ``orth_not_applicable``: a model without W_K), else ""."""
    col = claim.get("not_applicable")
    if not col or col not in g.columns:
        return ""
    return next((x.strip() for x in g[col] if isinstance(x, str) and x.strip()), "")


def _context_text(g: pd.DataFrame, claim: dict, rule: dict) -> str:
    """" | c = v, ..." for the claim's ``context`` columns: of the row the rule decided on (per group of a
    group rule, e.g. per estimator)."""
    ctx = [c for c in (claim.get("context") or []) if c in g.columns]
    if not ctx or not len(g):
        return ""
    grp = rule.get("group") if rule.get("inner") else None
    if grp and grp in g:
        return " | " + "; ".join(f"{k}: " + ", ".join(f"{c} = {_ctx(r[c])}" for c in ctx)
                                 for k, r in g.groupby(grp, sort=True).first().iterrows())
    row, _ = _pick(g, claim, rule)
    row = g.iloc[0] if row is None else row
    return " | " + ", ".join(f"{c} = {_ctx(row[c])}" for c in ctx)


def _ctx(v) -> str:
    return _num(v) if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool) else str(v)


def _measured_text(res: dict) -> str:
    v, lo, hi = (_f(res.get(k)) for k in ("measured", "measured_lo", "measured_hi"))
    if not np.isfinite(v):
        return "" if res.get("measured") is None else "NaN"
    return _num(v) + (f" [{_num(lo)}, {_num(hi)}]" if np.isfinite(lo) and np.isfinite(hi) else "")


def _flags(claim: dict, pub: dict, model) -> str:
    """Comparison flags: published on other models than ours, secondary source, and the claim's ``unlike``."""
    flags = []
    if pub.get("published_models") and not pub.get("same_model"):
        flags.append(f"different models: published on {pub['published_models']}; ran {model}")
    if pub.get("_secondary"):
        flags.append("secondary source (not found in the paper itself)")
    flags += list(claim.get("unlike") or [])
    return "; ".join(flags)


def _null_claim(claim: dict) -> dict:
    """The claim as decided on null rows: a ``where`` on ``source`` (llm / wind_tunnel) selects ``NULL_SOURCE``."""
    c = dict(claim)
    if "source" in (c.get("where") or {}):
        c["where"] = dict(c["where"], source=NULL_SOURCE)
    return c


def _noise_result(claim: dict, table: pd.DataFrame | None, row: dict) -> tuple[float, str]:
    """The claim's rule on its data-level null (``null_value``: a column of the same table holding what noise at
    the same n and d gives, e.g. pc12_restricted_iso): (value, verdict); (NaN, "") without one."""
    col = claim.get("null_value")
    if not col or table is None or col not in table.columns:
        return float("nan"), ""
    c = {k: v for k, v in claim.items() if k not in ("lo", "hi")}
    c["value"] = col
    rows = filter_rows(table, claim.get("where"))
    rows = rows[rows.model.astype(str) == str(row["model"])] if "model" in rows else rows
    for k, v in _setting_items(row["setting"]):
        if k in rows:
            rows = rows[rows[k].astype(str) == v]
    if not len(rows):
        return float("nan"), ""
    rule = dict(claim["rule"])
    res = RULES[rule.pop("kind")](rows, c, rule, row["model"])
    return _f(res.get("measured")), res["verdict"]


def _setting_items(setting: str):
    return [tuple(p.split("=", 1)) for p in setting.split(", ") if "=" in p] if setting else []


def _specific(r: dict) -> tuple[bool, str]:
    """Is a decided verdict specific: every null's verdict (the random-init twin's, and the data-level noise's where
    the claim has one) decided (supported / not supported) and different from it? An inconclusive or untestable
    null is no contrast; a null that reads the same verdict is none either, whatever the intervals."""
    if r["verdict"] not in (SUPPORTED, NOT_SUPPORTED):
        return False, f"verdict {r['verdict']}: nothing to compare"
    if r["null_verdict"] in ("", NOT_TESTABLE):
        return False, f"null not testable here: {r['null_reason'] or 'no null'}"
    why = []
    for tag, nv, nval in (("null model", r["null_verdict"], r["null_measured"]),
                          ("noise", r.get("noise_verdict", ""), r.get("noise_measured", float("nan")))):
        if not nv:
            continue
        if nv not in (SUPPORTED, NOT_SUPPORTED):
            return False, f"the {tag}'s verdict is {nv}: an undecided null is no contrast"
        if nv == r["verdict"]:
            return False, f"the {tag} gives the same verdict ({nv})" + (
                f", {_num(nval)}" if np.isfinite(_f(nval)) else "")
        why.append(f"{tag} reads {nv}" + (f" ({_num(nval)})" if np.isfinite(_f(nval)) else ""))
    return True, "; ".join(why)


def _attach_nulls(rows: list[dict], claim: dict, table: pd.DataFrame | None, nulls: dict | None,
                  null_for: dict | None = None) -> None:
    """Fill the null columns of one claim's rows (in place): the claim decided on the null models' rows of the
    same table (random-init twins; ``nulls`` = null model -> trained model; ``null_for`` = trained model -> its
    null where more models share one, e.g. a wind-tunnel checkpoint), the data-level null, ``specific``."""
    null_for = dict({t: n for n, t in (nulls or {}).items()}, **(null_for or {}))
    null_rows, no_rows = {}, ""
    nt = table[table.model.astype(str).isin(list(nulls))] if nulls and table is not None and "model" in table else None
    if nulls and (nt is None or not len(nt)):
        no_rows = (f"table {claim['table']} not produced by this run" if table is None else
                   f"{claim['table']} has no rows of the null models (the twins do not run what it needs)")
    elif nulls:
        across = claim.get("scope") == "across_models"
        for r in _verdict_rows(_null_claim(claim), nt, sorted(set(nulls)), stability=False):
            m = r["model"]
            keys = ([(x["model"], r["setting"]) for x in rows] if across else
                    [(t, r["setting"]) for t, n in null_for.items() if n == m])
            for k in keys:
                null_rows.setdefault(k, r)
    for r in rows:
        n = null_rows.get((r["model"], r["setting"]))
        if not nulls:
            r.update(null_model="", null_measured=float("nan"), null_measured_text="", null_verdict=NOT_TESTABLE,
                     null_reason="no null model in this run (nulls.random_init: false)")
        elif n is None and no_rows:
            twin = [null_for[r["model"]]] if r["model"] in null_for else []
            r.update(null_model=twin[0] if twin else "", null_measured=float("nan"), null_measured_text="",
                     null_verdict=NOT_TESTABLE, null_reason=no_rows)
        elif n is None:
            twin = [null_for[r["model"]]] if r["model"] in null_for else []
            r.update(null_model=twin[0] if twin else "", null_measured=float("nan"), null_measured_text="",
                     null_verdict=NOT_TESTABLE,
                     null_reason=(f"no row of {twin[0]} in {claim['table']} for this setting" if twin else
                                  f"no null model of {r['model']} in this run"))
        else:
            r.update(null_model=n["model"], null_measured=_f(n.get("measured")), null_measured_text=n.get("measured_text", ""),
                     null_verdict=n["verdict"], null_reason=n["reason"])
        val, verdict = _noise_result(claim, table, r)
        r.update(noise_column=claim.get("null_value", "") if verdict else "", noise_measured=val, noise_verdict=verdict)
        r["specific"], r["specific_reason"] = _specific(r)


def row_stability(row) -> float:
    """The ``stability`` of one scorecard row as a float (NaN when empty or not a number: a row read back from CSV
    keeps "" for an undecided one)."""
    return _f(row.get("stability", float("nan")))


def is_stable(df: pd.DataFrame) -> pd.Series:
    """Boolean per scorecard row: stability >= :data:`STABLE` (NaN, i.e. not re-decided, is not stable)."""
    st = pd.to_numeric(df["stability"], errors="coerce") if "stability" in df else pd.Series(np.nan, index=df.index)
    return st >= STABLE


def headline(df: pd.DataFrame) -> dict:
    """Counts of :data:`HEADLINE` over the rows that count (not ``sensitivity`` rows): supported, specific and stable
    ("specific finding"), supported and specific but re-decided the same on fewer than :data:`STABLE` of its
    resamples or not re-decided at all ("specific, unstable"), supported but a null reads the same ("supported, not
    specific"), not supported, inconclusive, not testable here."""
    if "sensitivity" in df:
        df = df[~df.sensitivity.astype(str).isin(["True", "true", "1"])]
    sup = df.verdict == SUPPORTED
    spec = df.specific.astype(str) == "True"
    stable = is_stable(df)
    return {HEADLINE[0]: int((sup & spec & stable).sum()), HEADLINE[1]: int((sup & spec & ~stable).sum()),
            HEADLINE[2]: int((sup & ~spec).sum()),
            **{v: int((df.verdict == v).sum()) for v in (NOT_SUPPORTED, INCONCLUSIVE, NOT_TESTABLE)}}


def claims_table(tables: dict, *, models: list[str] | None = None, path: str | None = None,
                 nulls: dict | None = None, null_for: dict | None = None) -> pd.DataFrame:
    """The scorecard: every claim of the claims file decided on this run's tables, one row per claim and model.

    Args:
        tables: table name -> pandas DataFrame (the cross-model ``results/summary/<name>.csv``), or None for a
            table this run did not produce (its claims are "not testable here: table not produced by this run").
        models: the run's models (rows of a claim whose table is missing).
        path: a claims file instead of the package's ``llmgeom/data/claims.yaml``.
        nulls: null model -> the trained model it is the null of (random-init twins, step-0 checkpoints).
            Their rows are taken out of the tables' rows and decided by the same rule into the null columns.
        null_for: trained model -> its null model, for models that share one (a wind-tunnel model's checkpoints
            and the model itself: its step-0 checkpoint); default: the inverse of ``nulls``.

    Returns:
        DataFrame with :data:`SCORECARD_COLUMNS`: claim_id, claim (sentence), paper, section, table, column,
        model (our model, or "all models (...)" for an across-model claim), setting (the ``by`` values, e.g.
        prompt_set=wiki), measured, measured_lo, measured_hi (the interval where the table has one; units of the
        column), measured_text, published (value text), published_on (paper, where), published_models (what the
        published value was measured on), same_model (True: published for this very model), comparison_flags
        (unlike settings: different models, secondary source, text, estimator ...), rule (kind and parameters),
        verdict (one of :data:`VERDICTS`, never empty) and reason (never empty); null_model, null_measured,
        null_measured_text, null_verdict, null_reason (the claim decided on the model's null, "not testable here"
        with the reason where there is none), noise_column / noise_measured / noise_verdict (the data-level null of
        claims with ``null_value``: isotropic data of the same n and d), specific (bool: every null's verdict is decided and
        differs from this one; an inconclusive null is no contrast) and specific_reason; stability (the share of
        resamples of the decided column's replicates whose re-decided verdict is the same; NaN for an undecided row
        or without replicates), stability_basis (what was resampled, or why not), stability_n; sensitivity (True: a
        row of the across-size rule on its sensitivity size axis, ``rule.sensitivity_x``; shown, not counted).

    Raises:
        ClaimsDataError: a malformed claims file.

    Source: the claims' papers and sections are in the file.
    """
    rows = []
    nulls = dict(nulls or {})
    for c in load_claims(path):
        t = tables.get(c["table"])
        tt = t[~t.model.astype(str).isin(list(nulls))] if t is not None and nulls and "model" in t else t
        got = _verdict_rows(c, tt, [m for m in (models or []) if m not in nulls])
        _attach_nulls(got, c, t, nulls, null_for)
        rows += got
    df = pd.DataFrame(rows)
    for col in SCORECARD_COLUMNS:
        if col not in df:
            df[col] = ""
    for col in ("published", "published_quantity", "published_on", "published_models", "published_official_code",
                "comparison_flags", "setting",
                "measured_text", "null_model", "null_measured_text", "null_reason", "noise_column", "noise_verdict",
                "stability_basis"):
        df[col] = df[col].fillna("")
    return df[SCORECARD_COLUMNS]


def to_markdown(df: pd.DataFrame) -> str:
    """Markdown rendering of :func:`claims_table` for the report: one line per claim and model with the
    verdict first (tested claims first: supported, not supported, inconclusive, then not testable here; file
    order within a verdict), the measurement, the published value with its models, the flags and the reason."""
    head = ["Verdict", "Claim", "Model", "Measured", "Null: verdict (value)", "Specific", "Stability", "Published (on)",
            "Flags", "Reason"]
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    order = df.assign(_v=df.verdict.map({v: i for i, v in enumerate(VERDICTS)})).sort_values("_v", kind="stable")
    for r in order.itertuples():
        one = r.published and "(" not in r.published.replace("(secondary)", "")
        pub = (f"{r.published} ({r.published_models})" if one else r.published) if r.published else "-"
        if r.published:  # name the published quantity: it need not be the decided column (delta_pc12 vs pc12)
            pub = f"{r.published_quantity}: {pub}"
        model = r.model + (f" ({r.setting})" if r.setting else "")
        null = getattr(r, "null_verdict", "") or "-"
        if getattr(r, "null_measured_text", ""):
            null += f" ({r.null_measured_text})"
        if getattr(r, "noise_verdict", ""):
            null += f"; noise: {r.noise_verdict} ({_num(_f(r.noise_measured))})"
        spec = "yes" if str(getattr(r, "specific", "")) == "True" else "no"
        st = _f(getattr(r, "stability", float("nan")))
        stab = "-" if not np.isfinite(st) else f"{st:.2f}" + ("" if st >= STABLE else " (unstable)")
        if str(getattr(r, "sensitivity", "")) == "True":
            model += " [sensitivity]"
        lines.append("| " + " | ".join(esc(x) for x in (r.verdict, f"{r.claim_id}: {r.claim}", model,
                                                        r.measured_text or "-", null, spec, stab, pub,
                                                        r.comparison_flags or "-", r.reason)) + " |")
    n = headline(df) if "specific" in df else {v: int((df.verdict == v).sum()) for v in VERDICTS}
    legend = ("Claims scorecard: each claim of llmgeom/data/claims.yaml decided on this run's tables; "
              + ", ".join(f"{v}: {int(x)}" for v, x in n.items()) + ". A supported verdict is a finding only when it "
              "is specific: the model's null (its seeded random-init twin, through the same prompts and analyses; "
              "noise of the same n and d where the claim has one) gives a decided verdict, and a different one (an "
              "inconclusive null is no contrast). A specific finding is counted only when stable: re-decided the same on at least "
              f"{STABLE:.0%} of the resamples its interval drew ('Stability'); [sensitivity] rows (another size axis) "
              "are shown, not counted. A verdict on a model is a verdict on that "
              "model: 'Published (on)' names the models the paper measured, 'Flags' the settings in which our run "
              "differs. Columns and rules: docs/claims.md.")
    return "\n".join(lines) + "\n\n" + legend + "\n"
