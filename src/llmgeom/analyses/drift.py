"""drift.csv: this run's headline values set against a committed reference of the same study, each with a
tolerance, so that a change that moves a headline value is seen (front page) and, for the tiny study, fails the
suite. Tables in, tables out; never torch, and no statistic is recomputed here: the numbers are read from
``results/summary/scaling.csv`` (:mod:`llmgeom.analyses.scaling`, which reads each from the table that owns it),
the verdicts from ``results/summary/claims.csv`` (:mod:`llmgeom.analyses.claims`).

Which statistics are headline values is data: :data:`HEADLINE_STATISTICS` (names of scaling.csv's
``statistic``) when a reference is written, and every statistic the reference file names when a run is checked
against it. A reference is written from a run by the command line (docs/testing.md, "Headline reference")::

    python -m llmgeom.analyses.drift --write-reference results/summary config/reference/default-study.csv \\
        --reason "why the headline values moved"

May import: numpy, pandas (inside the functions), llmgeom.core.
"""

from __future__ import annotations

import io
import math
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

#: the statistics of scaling.csv (``statistic``) that a new reference records, per model and twin: PC1+PC2 of the
#: mixed and restricted prompts, key orthogonality, attention focusing, the token-position ID peaks (TwoNN, MLE) and
#: their depths, the last-token and cross-passage TwoNN peaks, the median
#: margin and m0.05, the eta slope, perplexity and the SULA MAE. Edit here when scaling.csv renames one (a name
#: that scaling.csv lacks is refused when a reference is written).
HEADLINE_STATISTICS = ("pc12_mixed", "pc12_restricted", "key_orthogonality", "attention_focusing_pct",
                       "twonn_token_peak_id", "mle_token_peak_id", "twonn_token_peak_relative_depth",
                       "mle_token_peak_relative_depth", "twonn_last_token_peak_id", "twonn_cross_passage_peak_id",
                       "margin_median", "margin_q05", "eta_slope", "perplexity", "sula_entropy_mae")
#: the ``statistic`` of a verdict: ``verdict:<claim_id>`` or ``verdict:<claim_id>[<setting>]``
VERDICT_PREFIX = "verdict:"
#: run-to-run tolerance of a statistic without an interval: the pipeline is seeded and deterministic, so only
#: numerical noise (BLAS thread order, another CPU's kernels) moves it: rtol of |reference|, at least atol
RUN_TO_RUN_RTOL, RUN_TO_RUN_ATOL = 1e-3, 1e-9
#: columns of the reference file (config/reference/*.csv), in order
REFERENCE_COLUMNS = ["statistic", "model", "value", "lo", "hi", "tolerance", "tolerance_source"]
#: columns of drift.csv, in order (docs/outputs.md describes each)
DRIFT_COLUMNS = ["statistic", "model", "reference", "value", "tolerance", "tolerance_source", "within", "note"]
#: ``tolerance_source`` of a verdict
VERDICT_TOLERANCE = "verdict text: must be equal"
#: how to regenerate a reference (drift.csv notes, the suite's message)
REGENERATE = ("python -m llmgeom.analyses.drift --write-reference results/summary <reference.csv> "
              "--reason '<why the values moved>'")


def is_verdict(statistic: str) -> bool:
    """True for a verdict's ``statistic`` (:data:`VERDICT_PREFIX`)."""
    return str(statistic).startswith(VERDICT_PREFIX)


def base_statistic(statistic: str) -> str:
    """scaling.csv's name of a headline ``statistic``: without its ``[prompt set]`` ("" for a verdict)."""
    return "" if is_verdict(statistic) else str(statistic).split("[", 1)[0]


def _unique(rows: list[dict]) -> list[dict]:
    """Make (statistic, model) unique: a key seen before gets `` #2``, `` #3`` ... in table order."""
    seen: dict = {}
    for r in rows:
        k = (r["statistic"], r["model"])
        seen[k] = seen.get(k, 0) + 1
        if seen[k] > 1:
            r["statistic"] = f"{r['statistic']} #{seen[k]}"
    return rows


def headline_values(scaling: pd.DataFrame | None, claims: pd.DataFrame | None, *,
                    statistics=HEADLINE_STATISTICS) -> pd.DataFrame:
    """This run's headline values: the numbers of ``statistics`` from scaling.csv and every verdict of claims.csv.

    Args:
        scaling: results/summary/scaling.csv (:data:`llmgeom.analyses.scaling.COLUMNS`) or None (not produced):
            its rows of this run's trained models and twins (``source`` measured / null_model; the papers' models
            are no value of this run). A statistic with more than one row for a model (several prompt sets) gets
            ``<statistic>[<prompt_set>]``.
        claims: results/summary/claims.csv read with ``keep_default_na=False`` (text stays text) or None: one row
            per claim, setting and model (``verdict:<claim_id>[<setting>]``, the verdict) and one for its null
            (``model`` = the null model, the null's verdict) where the row names one.
        statistics: the names of scaling.csv's ``statistic`` to take (default :data:`HEADLINE_STATISTICS`).

    Returns:
        DataFrame: statistic, model, value (float for a number, the verdict's text for a verdict), lo, hi (the
        statistic's interval, NaN where it has none), interval (what lo / hi are), note; (statistic, model) unique
        (a repeated key gets `` #2``). A requested statistic that scaling.csv lacks has no row: the caller reports
        it (:func:`reference_table` refuses it, :func:`drift_table` reports the reference's row as missing).
    """
    import pandas as pd

    rows = []
    if scaling is not None and len(scaling):
        own = scaling[scaling.source.astype(str).isin(["measured", "null_model"])]
        for stat in statistics:
            g = own[own.statistic.astype(str) == stat]
            many = g.groupby(g.model.astype(str)).size()
            for r in g.itertuples():
                ps = "" if pd.isna(r.prompt_set) else str(r.prompt_set)
                name = f"{stat}[{ps}]" if many.get(str(r.model), 0) > 1 else stat
                rows.append(dict(statistic=name, model=str(r.model), value=_float(r.value), lo=_float(r.lo),
                                 hi=_float(r.hi), interval="" if pd.isna(r.interval) else str(r.interval),
                                 note="" if pd.isna(r.note) else str(r.note)))
    if claims is not None and len(claims):
        for r in claims.itertuples():
            setting = str(r.setting) if isinstance(r.setting, str) and r.setting else ""
            name = f"{VERDICT_PREFIX}{r.claim_id}" + (f"[{setting}]" if setting else "")
            base = dict(statistic=name, lo=math.nan, hi=math.nan, interval="")
            rows.append(dict(base, model=str(r.model), value=str(r.verdict), note=str(r.reason)))
            if isinstance(r.null_model, str) and r.null_model:
                rows.append(dict(base, model=r.null_model, value=str(r.null_verdict), note=str(r.null_reason)))
    return pd.DataFrame(_unique(rows), columns=["statistic", "model", "value", "lo", "hi", "interval", "note"])


def _float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def reference_table(values: pd.DataFrame, *, rtol: float = RUN_TO_RUN_RTOL, atol: float = RUN_TO_RUN_ATOL,
                    statistics=HEADLINE_STATISTICS) -> pd.DataFrame:
    """A reference from one run's :func:`headline_values`: each value with its tolerance.

    The tolerance of a number is the half-width (hi - lo) / 2 of its interval where it has one (finite, > 0),
    else the run-to-run tolerance max(rtol * |value|, atol) of a seeded, deterministic pipeline (numerical noise
    only); a verdict has none (it must be equal). ``tolerance_source`` says which.

    Args:
        values: :func:`headline_values` of the reference run. rtol, atol: the run-to-run tolerance.
        statistics: the statistics the values were taken for: each must have a row (a renamed or missing
            statistic is refused rather than left out of the reference without a word).

    Returns:
        DataFrame with :data:`REFERENCE_COLUMNS` (value: float or the verdict's text).

    Raises:
        ValueError: a statistic of ``statistics`` without a row in ``values``.
    """
    import pandas as pd

    have = {base_statistic(s) for s in values.statistic}
    lacking = [s for s in statistics if s not in have]
    if lacking:
        raise ValueError(f"no rows of {lacking} in this run's scaling.csv: renamed? edit "
                         "llmgeom.analyses.drift.HEADLINE_STATISTICS or pass --statistics")
    rows = []
    for r in values.itertuples():
        if is_verdict(r.statistic):
            rows.append(dict(statistic=r.statistic, model=r.model, value=r.value, lo=math.nan, hi=math.nan,
                             tolerance=math.nan, tolerance_source=VERDICT_TOLERANCE))
            continue
        v, lo, hi = float(r.value), float(r.lo), float(r.hi)
        half = (hi - lo) / 2 if math.isfinite(lo) and math.isfinite(hi) else math.nan
        if math.isfinite(half) and half > 0:
            tol, src = half, f"half-width of the reference's interval ({r.interval or 'lo, hi'})"
        elif math.isfinite(v):
            tol = max(rtol * abs(v), atol)
            src = f"run to run: max({rtol:g} x |reference|, {atol:g}) (seeded, deterministic: numerical noise only)"
        else:
            tol, src = math.nan, f"no value in the reference run ({r.note or 'NaN'}): this run must have none either"
        rows.append(dict(statistic=r.statistic, model=r.model, value=v, lo=lo, hi=hi, tolerance=tol,
                         tolerance_source=src))
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS)


def _compare(ref: dict, run: dict) -> tuple[bool, str]:
    """(within, note) of one statistic and model present in both."""
    if is_verdict(ref["statistic"]):
        same = str(ref["value"]) == str(run["value"])
        return same, "" if same else f"verdict changed: {ref['value']} -> {run['value']} ({run['note']})"
    r, v, tol = _float(ref["value"]), _float(run["value"]), _float(ref["tolerance"])
    if math.isnan(r) and math.isnan(v):
        return True, "no value in the reference or this run"
    if math.isnan(v):
        return False, f"no value in this run ({run['note'] or 'NaN'})"
    if math.isnan(r):
        return False, "the reference has no value, this run has one"
    d = abs(v - r)
    ok = d <= tol
    return ok, "" if ok else f"|value - reference| = {d:.4g} > tolerance {tol:.4g}"


def drift_table(values: pd.DataFrame, reference: pd.DataFrame | None, *, reference_path: str = "") -> pd.DataFrame:
    """drift.csv: every headline value of this run against the reference.

    Args:
        values: :func:`headline_values` of this run (for the statistics the reference names and
            :data:`HEADLINE_STATISTICS`).
        reference: the reference (:func:`read_reference`, :data:`REFERENCE_COLUMNS`) or None (no reference
            file: every row is reported, none within). reference_path: named in the notes.

    Returns:
        DataFrame with :data:`DRIFT_COLUMNS`, the reference's rows in its order, then this run's rows that it lacks.
        within: a number within ``tolerance`` of the reference (both NaN: within; one NaN: not), a verdict equal to
        the reference's; a reference row that this run lacks and a run row that the reference lacks are not within
        (note says which). reference / value: the numbers or verdict texts (NaN / "" where absent).
    """
    import pandas as pd

    where = reference_path or "the reference"
    run = {(r["statistic"], r["model"]): r for r in values.to_dict("records")}
    rows = []
    if reference is None:
        for r in run.values():
            rows.append(dict(statistic=r["statistic"], model=r["model"], reference=math.nan, value=r["value"],
                             tolerance=math.nan, tolerance_source="", within=False,
                             note=f"no reference file {where}: write it with {REGENERATE}"))
        return pd.DataFrame(rows, columns=DRIFT_COLUMNS)
    refs = reference.to_dict("records")
    for ref in refs:
        key = (ref["statistic"], ref["model"])
        base = dict(statistic=key[0], model=key[1], reference=ref["value"], tolerance=ref["tolerance"],
                    tolerance_source=ref["tolerance_source"])
        if key in run:
            within, note = _compare(ref, run[key])
            rows.append(dict(base, value=run[key]["value"], within=within, note=note))
        else:
            rows.append(dict(base, value=math.nan if not is_verdict(key[0]) else "", within=False,
                             note="missing from this run (renamed, or its model / claim left out?)"))
    known = {(r["statistic"], r["model"]) for r in refs}
    for key, r in run.items():
        if key not in known:
            rows.append(dict(statistic=key[0], model=key[1], reference=math.nan if not is_verdict(key[0]) else "",
                             value=r["value"], tolerance=math.nan, tolerance_source="", within=False,
                             note=f"not in {where}: a new statistic, model or claim? regenerate it: {REGENERATE}"))
    return pd.DataFrame(rows, columns=DRIFT_COLUMNS)


def checked_statistics(reference: pd.DataFrame | None) -> list[str]:
    """The scaling.csv statistics a run is checked on: those the reference names, then
    :data:`HEADLINE_STATISTICS` (a headline statistic the reference lacks is reported as not in it)."""
    named = [] if reference is None else [base_statistic(s) for s in reference.statistic]
    return [s for s in dict.fromkeys([*named, *HEADLINE_STATISTICS]) if s]


def read_reference(path) -> pd.DataFrame:
    """A reference file (:func:`write_reference`): its leading ``#`` lines (reason, provenance) skipped; value
    as text for a verdict and a float for a number.

    Returns:
        DataFrame with :data:`REFERENCE_COLUMNS`.

    Raises:
        ValueError: a column of :data:`REFERENCE_COLUMNS` missing.
    """
    import pandas as pd

    lines = Path(path).read_text(encoding="utf-8").splitlines(keepends=True)
    body = "".join(lines[len(reference_header(path)):])
    df = pd.read_csv(io.StringIO(body), keep_default_na=False, dtype=str)
    missing = [c for c in REFERENCE_COLUMNS if c not in df]
    if missing:
        raise ValueError(f"{path}: no column {missing} (a reference has {REFERENCE_COLUMNS})")
    for c in ("lo", "hi", "tolerance"):
        df[c] = pd.to_numeric(df[c].replace("", "nan"), errors="coerce")
    df["value"] = [v if is_verdict(s) else _float(v or "nan") for s, v in zip(df.statistic, df.value)]
    return df[REFERENCE_COLUMNS]


def reference_header(path) -> list[str]:
    """The leading ``#`` lines of a reference file (without ``# ``): its reason and provenance."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        out.append(line[1:].strip())
    return out


def write_reference(reference: pd.DataFrame, path, *, reason: str, source: str = "") -> None:
    """Write a reference file atomically: ``#`` header lines (reason, when and from what, how to regenerate),
    then the CSV of :data:`REFERENCE_COLUMNS` (``%.10g`` floats).

    Raises:
        ValueError: an empty reason (a reference that moves says why).
    """
    from llmgeom.core.io import write_text

    if not reason.strip():
        raise ValueError("a reference needs a reason (--reason): why the headline values moved")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [f"# headline reference of a study (llmgeom.analyses.drift): {len(reference)} values",
            f"# reason: {' '.join(reason.split())}", f"# written: {when} from {source or 'a run'}",
            f"# regenerate: {REGENERATE}"]
    buf = io.StringIO()
    reference.to_csv(buf, index=False, float_format="%.10g")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text("\n".join(head) + "\n" + buf.getvalue(), path)


def read_summary(summary_dir, *, statistics=HEADLINE_STATISTICS) -> pd.DataFrame:
    """:func:`headline_values` of a run's results/summary folder (scaling.csv and claims.csv; a missing one gives
    no rows)."""
    import pandas as pd

    d = Path(summary_dir)
    scaling = (pd.read_csv(d / "scaling.csv", keep_default_na=False, na_values=[""])
               if (d / "scaling.csv").is_file() else None)
    claims = pd.read_csv(d / "claims.csv", keep_default_na=False) if (d / "claims.csv").is_file() else None
    return headline_values(scaling, claims, statistics=statistics)


def main(argv=None) -> int:
    """Command line: ``--write-reference SUMMARY_DIR REFERENCE --reason TEXT`` writes a reference from a run;
    ``--check SUMMARY_DIR REFERENCE [--out drift.csv]`` prints the drifted rows (exit 1 when any)."""
    import argparse

    from llmgeom.core.io import write_table

    p = argparse.ArgumentParser(prog="python -m llmgeom.analyses.drift", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write-reference", nargs=2, metavar=("SUMMARY_DIR", "REFERENCE"))
    g.add_argument("--check", nargs=2, metavar=("SUMMARY_DIR", "REFERENCE"))
    p.add_argument("--reason", help="why the reference is (re)written (required with --write-reference)")
    p.add_argument("--statistics", nargs="+", default=list(HEADLINE_STATISTICS),
                   help="scaling.csv statistics to record (default: HEADLINE_STATISTICS)")
    p.add_argument("--rtol", type=float, default=RUN_TO_RUN_RTOL, help="run-to-run relative tolerance")
    p.add_argument("--atol", type=float, default=RUN_TO_RUN_ATOL, help="run-to-run absolute tolerance")
    p.add_argument("--out", help="--check: write drift.csv here")
    a = p.parse_args(argv)
    if a.write_reference:
        if not (a.reason or "").strip():
            p.error("--write-reference needs --reason: why the headline values moved")
        summary, path = a.write_reference
        ref = reference_table(read_summary(summary, statistics=a.statistics), rtol=a.rtol, atol=a.atol,
                              statistics=a.statistics)
        write_reference(ref, path, reason=a.reason, source=str(summary))
        nan = ref[~ref.statistic.map(is_verdict) & ref.value.map(lambda v: math.isnan(_float(v)))]
        print(f"{path}: {len(ref)} values ({ref.statistic.map(is_verdict).sum()} verdicts)")
        if len(nan):
            print(f"  without a value (this run must have none either): "
                  f"{', '.join(nan.statistic + ' / ' + nan.model)}")
        return 0
    summary, path = a.check
    ref = read_reference(path) if Path(path).is_file() else None
    drift = drift_table(read_summary(summary, statistics=checked_statistics(ref)), ref, reference_path=str(path))
    if a.out:
        write_table(drift, a.out)
    bad = drift[~drift.within.astype(bool)]
    print(f"{len(drift) - len(bad)} of {len(drift)} headline values within {path}")
    for r in bad.itertuples():
        print(f"  {r.statistic} / {r.model}: reference {r.reference}, value {r.value}: {r.note}")
    return 1 if len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
