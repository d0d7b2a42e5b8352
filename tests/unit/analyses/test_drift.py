"""drift.csv: a run's headline values against a committed reference (llmgeom.analyses.drift), on synthetic
scaling.csv / claims.csv tables whose statistic names the tests make up themselves."""

from __future__ import annotations

import io
import math

import pandas as pd
import pytest

from llmgeom.analyses import drift as D

STATS = ("stat_ci", "stat_plain")


def _scaling(**values) -> pd.DataFrame:
    """scaling.csv rows: stat_ci (an interval) and stat_plain (none) for model m and its twin m-randinit, and a
    published row (not this run's). ``values``: (statistic, model) overrides as stat__model=value."""
    rows = []
    for stat, lo, hi in (("stat_ci", 0.2, 0.6), ("stat_plain", math.nan, math.nan)):
        for model, src, v in (("m", "measured", 0.5), ("m-randinit", "null_model", 2.0)):
            v = values.get(f"{stat}__{model.replace('-', '_')}", v)
            rows.append(dict(statistic=stat, model=model, source=src, prompt_set="corpus", value=v, lo=lo, hi=hi,
                             interval="95% bootstrap" if stat == "stat_ci" else "", note=""))
        rows.append(dict(statistic=stat, model="Paper-7B", source="published", prompt_set="paper", value=9.0,
                         lo=math.nan, hi=math.nan, interval="", note=""))
    return pd.DataFrame(rows)


def _claims(verdict="supported") -> pd.DataFrame:
    return pd.DataFrame([
        dict(claim_id="c1", setting="", model="m", verdict=verdict, reason="r", null_model="m-randinit",
             null_verdict="not supported", null_reason="nr"),
        dict(claim_id="c2", setting="run=L1", model="all models (m)", verdict="inconclusive", reason="r2",
             null_model="", null_verdict="", null_reason=""),
    ])


def _values(scaling=None, claims=None):
    return D.headline_values(_scaling() if scaling is None else scaling, _claims() if claims is None else claims,
                             statistics=STATS)


def test_headline_values_takes_this_runs_models_and_every_verdict():
    v = _values()
    got = {(r.statistic, r.model): r.value for r in v.itertuples()}
    assert got == {("stat_ci", "m"): 0.5, ("stat_ci", "m-randinit"): 2.0, ("stat_plain", "m"): 0.5,
                   ("stat_plain", "m-randinit"): 2.0, ("verdict:c1", "m"): "supported",
                   ("verdict:c1", "m-randinit"): "not supported",
                   ("verdict:c2[run=L1]", "all models (m)"): "inconclusive"}  # no published row, no empty null
    assert v[v.statistic == "stat_ci"].lo.tolist() == [0.2, 0.2]


def test_headline_values_names_the_prompt_set_only_where_a_model_has_several():
    s = _scaling()
    extra = s[(s.statistic == "stat_ci") & (s.model == "m")].assign(prompt_set="mixed", value=0.7)
    v = D.headline_values(pd.concat([s, extra]), None, statistics=STATS)
    assert set(v[v.model == "m"].statistic) == {"stat_ci[corpus]", "stat_ci[mixed]", "stat_plain"}
    assert set(v[v.model == "m-randinit"].statistic) == {"stat_ci", "stat_plain"}
    assert D.base_statistic("stat_ci[mixed]") == "stat_ci" and D.base_statistic("verdict:c2[run=L1]") == ""


def test_reference_tolerance_from_interval_else_run_to_run():
    ref = D.reference_table(_values(), rtol=1e-3, atol=1e-9, statistics=STATS).set_index(["statistic", "model"])
    assert ref.loc[("stat_ci", "m"), "tolerance"] == pytest.approx(0.2)  # (0.6 - 0.2) / 2
    assert "half-width" in ref.loc[("stat_ci", "m"), "tolerance_source"]
    assert ref.loc[("stat_plain", "m-randinit"), "tolerance"] == pytest.approx(2e-3)  # 1e-3 x |2.0|
    assert "run to run" in ref.loc[("stat_plain", "m"), "tolerance_source"]
    assert ref.loc[("verdict:c1", "m"), "tolerance_source"] == D.VERDICT_TOLERANCE
    zero = D.reference_table(_values(_scaling(stat_plain__m=0.0)), statistics=STATS)
    assert zero[(zero.statistic == "stat_plain") & (zero.model == "m")].tolerance.iloc[0] == D.RUN_TO_RUN_ATOL


def test_reference_refuses_a_statistic_the_run_lacks():
    with pytest.raises(ValueError, match="renamed"):
        D.reference_table(_values(), statistics=(*STATS, "stat_renamed"))


def _drift(scaling=None, claims=None, reference_from=None):
    ref = D.reference_table(_values(reference_from), statistics=STATS)
    d = D.drift_table(_values(scaling, claims), ref, reference_path="ref.csv")
    return d.set_index(["statistic", "model"])


def test_within_and_outside_the_tolerance():
    d = _drift(_scaling(stat_ci__m=0.69, stat_plain__m=0.5004))  # 0.19 < 0.2; 4e-4 < 5e-4
    assert d.within.all() and len(d) == 7
    d = _drift(_scaling(stat_ci__m=0.71, stat_plain__m_randinit=2.0021))  # 0.21 > 0.2; 2.1e-3 > 2e-3
    assert set(d.index[~d.within]) == {("stat_ci", "m"), ("stat_plain", "m-randinit")}
    assert "> tolerance" in d.loc[("stat_ci", "m"), "note"]


def test_a_changed_verdict_is_drift():
    d = _drift(claims=_claims("not supported"))
    assert list(d.index[~d.within]) == [("verdict:c1", "m")]
    assert d.loc[("verdict:c1", "m"), "note"].startswith("verdict changed: supported -> not supported")


def test_missing_and_extra_statistics_are_reported():
    s = _scaling()
    run = pd.concat([s[~((s.statistic == "stat_plain") & (s.model == "m"))],
                     s[s.model == "m"].assign(model="m2")])  # stat_plain of m gone, a new model m2
    d = _drift(run, claims=_claims().iloc[:1])  # claim c2 gone
    bad = d[~d.within]
    assert set(bad.index) == {("stat_plain", "m"), ("verdict:c2[run=L1]", "all models (m)"), ("stat_ci", "m2"),
                              ("stat_plain", "m2")}
    assert bad.loc[("stat_plain", "m"), "note"].startswith("missing from this run")
    assert bad.loc[("stat_ci", "m2"), "note"].startswith("not in ref.csv")
    assert math.isnan(bad.loc[("stat_plain", "m"), "value"]) and math.isnan(bad.loc[("stat_ci", "m2"), "reference"])


def test_nan_value_is_not_within_unless_the_reference_has_none():
    d = _drift(_scaling(stat_ci__m=math.nan))
    assert not d.loc[("stat_ci", "m"), "within"] and "no value in this run" in d.loc[("stat_ci", "m"), "note"]
    d = _drift(_scaling(stat_plain__m=math.nan), reference_from=_scaling(stat_plain__m=math.nan))
    assert d.loc[("stat_plain", "m"), "within"]  # NaN then, NaN now: reproduced
    d = _drift(_scaling(), reference_from=_scaling(stat_plain__m=math.nan))
    assert not d.loc[("stat_plain", "m"), "within"]


def test_no_reference_file_reports_every_value():
    d = D.drift_table(_values(), None, reference_path="absent.csv")
    assert len(d) == 7 and not d.within.any() and d.note.str.startswith("no reference file absent.csv").all()


def test_checked_statistics_are_the_references_and_the_headline_list():
    ref = pd.DataFrame(dict(statistic=["only_in_ref[corpus]", "verdict:c1", D.HEADLINE_STATISTICS[0]]))
    got = D.checked_statistics(ref)
    assert got[0] == "only_in_ref" and got[1:] == list(D.HEADLINE_STATISTICS)


def _summary(tmp_path, scaling, claims):
    d = tmp_path / "summary"
    d.mkdir(exist_ok=True)
    scaling.to_csv(d / "scaling.csv", index=False)
    claims.to_csv(d / "claims.csv", index=False)
    return d


def test_cli_writes_a_reference_with_its_reason_and_checks_a_run(tmp_path, capsys):
    summary = _summary(tmp_path, _scaling(), _claims())
    ref = tmp_path / "ref" / "study.csv"
    args = ["--write-reference", str(summary), str(ref), "--statistics", *STATS]
    with pytest.raises(SystemExit):  # a reference says why it moved
        D.main(args)
    assert not ref.exists()
    assert D.main([*args, "--reason", "a test\nof two lines"]) == 0
    assert D.reference_header(ref)[1] == "reason: a test of two lines"
    back = D.read_reference(ref).set_index(["statistic", "model"])
    assert back.loc[("verdict:c2[run=L1]", "all models (m)"), "value"] == "inconclusive"
    assert back.loc[("stat_ci", "m"), "value"] == 0.5 and back.loc[("stat_ci", "m"), "tolerance"] == pytest.approx(0.2)
    assert math.isnan(back.loc[("stat_plain", "m"), "lo"])
    assert D.main(["--check", str(summary), str(ref)]) == 0
    _summary(tmp_path, _scaling(stat_plain__m=0.6), _claims("inconclusive"))
    out = tmp_path / "drift.csv"
    assert D.main(["--check", str(summary), str(ref), "--out", str(out)]) == 1
    d = pd.read_csv(out, keep_default_na=False)
    assert list(d.columns) == D.DRIFT_COLUMNS
    bad = d[d.within.astype(str) == "False"]
    assert sorted(zip(bad.statistic, bad.model)) == [("stat_plain", "m"), ("verdict:c1", "m")]
    # the headline statistics of the module are not in this synthetic run: reported, not within
    assert D.main(["--check", str(summary), str(tmp_path / "absent.csv")]) == 1
    assert "stat_plain / m" in capsys.readouterr().out


def test_front_page_box_lists_the_drifted_values():
    from llmgeom.plots.claims import drift_html

    d = D.drift_table(_values(_scaling(stat_ci__m=0.9)), D.reference_table(_values(), statistics=STATS))
    d = pd.read_csv(io.StringIO(d.to_csv(index=False)), keep_default_na=False)  # as rule findings reads it
    box = drift_html(d, "config/reference/x.csv")
    assert box.startswith('<div class="drift">') and "1 of 7 headline values outside" in box
    assert box.count("<tr>") == 1 + 1 and "<td>stat_ci</td><td>m</td><td>0.5</td><td>0.9</td>" in box
    ok = drift_html(D.drift_table(_values(), D.reference_table(_values(), statistics=STATS)), "config/reference/x.csv")
    assert ok.startswith('<p class="ok">') and "All 7 headline values within" in ok and "config/reference/x.csv" in ok
    assert drift_html(None) == ""
