"""Published values live in a data file with their source (issue 11, point 4; DESIGN.md sec. 3)."""

from __future__ import annotations

import pandas as pd
import pytest

from llmgeom.core.published import (SOURCE_KINDS, PublishedDataError, add_published, comparison_entries,
                                    entries_by_kind, load_published, published_on, published_table, published_text,
                                    source_text, value_text)


def test_package_data_file_entries_have_sources_and_the_issue_values():
    pub = load_published()
    for q, entries in pub.items():
        for e in entries:
            assert e["paper"] and e["where"] and e["models"] and e["unit"], q
    assert pub["eta_slope"][0]["range"] == [0.87, 1.12] and pub["eta_r2"][0]["min"] == 0.985
    assert pub["hard_core_margin"][0]["range"] == [0.04, 0.06]
    assert pub["id_over_d_model"][0]["range"] == [0.01, 0.03] and pub["id_peak"][0]["range"] == [19, 22]
    assert pub["key_orthogonality_random_init"][0]["range"] == [0.35, 0.45]
    assert "reading" in pub["id_peak"][0] and "reading" in pub["hard_core_margin"][0]
    # numbers we do not have are absent, not guessed (Paper III's Table 1 has no participation ratio)
    assert "paper3_table1_participation_ratio_top10" not in pub


def test_paper3_table_values_load_with_their_source_and_reach_table1_table2():
    from llmgeom.analyses.bayes_tables import table1, table2

    pub = load_published()
    by = {(q, e["models"]): e for q in pub for e in pub[q]}
    v1 = "arXiv:2512.23752v1"
    # Table 1 (percent in the paper -> fractions), per model and prompt set
    for (q, m), v in {("paper3_table1_pc1", "Pythia-410M (mixed-domain prompts)"): 0.796,
                      ("paper3_table1_pc12", "Llama-3.2-1B (mathematics prompts)"): 0.736,
                      ("paper3_table1_pc12", "Phi-2 (mixed-domain prompts)"): 0.606}.items():
        e = by[(q, m)]
        assert e["value"] == pytest.approx(v) and e["where"] == f"Table 1, {v1}" and "Paper III" in e["paper"]
    # Table 2
    assert by[("paper3_table2_pc12_mixed", "Pythia-410M")]["value"] == pytest.approx(0.997)
    assert by[("paper3_table2_pc12_mixed", "Mistral-7B")]["range"] == [0.15, 0.20]
    assert by[("paper3_table2_pc12_restricted", "Llama-3.2-1B, mathematics prompts")]["value"] == pytest.approx(0.736)
    assert by[("key_orthogonality_trained", "Phi-2")]["range"] == [0.034, 0.051]
    assert by[("paper3_table2_focusing_pct", "Pythia-410M")]["value"] == 82
    assert all(e["where"].startswith("Table 2") and e["where"].endswith(v1) for q in
               ("paper3_table2_pc12_mixed", "paper3_table2_pc12_restricted", "key_orthogonality_trained",
                "paper3_table2_focusing_pct") for e in pub[q] if e["source_kind"] == "paper")
    assert sorted(e["value"] for e in pub["paper3_sula_entropy_mae"]) == [0.31, 0.36, 0.44]
    # a synthetic pythia-410m row carries the published Paper III values beside the measured ones
    dr = pd.DataFrame({"model": "pythia-410m", "prompt_set": ["mixed", "domain_mathematics"],
                       "domain": [None, "Mathematics"], "role": ["mixed", "restricted"], "n": 75, "layer": 23,
                       "relative_depth": 1.0, "representation": "values", "standardized": True,
                       "pc1": [0.8, 0.6], "pc12": [0.99, 0.99], "spearman_rho": [0.3, 0.1]})
    t1 = table1(dr)
    ours, pub1 = t1[t1.source == "measured"], t1[(t1.source == "published") & (t1.source_kind == "paper")]
    # beside our row: only the value published for the same model and prompt-set kind
    assert list(ours.pc1_published) == ["0.796", "0.58"] and list(ours.pc12_published) == ["0.997", "0.999"]
    assert list(ours.spearman_rho_published) == ["-0.32", "-0.14"]  # sec. 5.1, matched by kind too
    assert "Table 1, arXiv:2512.23752v1" in ours.pc1_published_on.iloc[0]
    # issue 28: the official code's committed value beside the paper's, and as a published row of its own
    assert list(ours.pc12_official_code)[0] == "0.277" and list(ours.pc12_published)[0] == "0.997"
    oc = t1[(t1.source == "published") & (t1.source_kind == "official_code")]
    assert list(oc.model) == ["Pythia-410M"] and oc.pc12.iloc[0] == pytest.approx(0.277)
    # the published models as rows of their own, in the same columns and units (fractions)
    p = pub1.set_index(["model", "role"])
    assert len(pub1) == 6 and p.loc[("Phi-2", "mixed"), "pc1"] == pytest.approx(0.464)
    assert p.loc[("Llama-3.2-1B", "restricted"), "pc12"] == pytest.approx(0.736)
    assert p.loc[("Llama-3.2-1B", "restricted"), "spearman_rho"] == pytest.approx(-0.51)
    ko = pd.DataFrame({"model": "pythia-410m", "layer": [0, 1], "orthogonality": 0.1, "baseline_gaussian": 0.03,
                       "baseline_random_init": 0.03, "gaussian_expected": 0.025})
    af = pd.DataFrame({"model": ["pythia-410m"], "attention_type": "MHA", "n_sliding_layers": 0, "n_layers": 24,
                       "sliding_window": [None], "focusing_pct": 50.0, "focusing_pct_global": 50.0,
                       "spearman_rho": -0.5, "spearman_p": 0.01})
    t2 = table2(dr, ko, af, restricted_set="domain_mathematics")
    r = t2.iloc[0]
    assert r.model == "pythia-410m" and r.source == "llm" and r.pc12_mixed == pytest.approx(0.99)
    assert r.pc12_mixed_published == "0.997" and r.pc12_restricted_published == "0.999"
    assert r.orth_mean_published == "0.11-0.13" and r.focusing_pct_published == "82"
    assert r.random_init_mean_published == ""  # the baseline is not Pythia-410M's own value
    assert "Table 2" in r.orth_mean_published_on and v1 in r.orth_mean_published_on
    p2 = t2[t2.source == "published"].set_index("model")
    assert {"Pythia-410M", "Phi-2", "Llama-3.2-1B", "Mistral-7B", "Pythia-12B"} <= set(p2.index)
    assert p2.loc["Pythia-12B", "pc12_restricted"] == pytest.approx(0.90)
    wt = p2.loc["wind-tunnel transformers (Paper III Table 2)"]
    assert wt.orth_mean_published == "0.09-0.12"  # PC1 (0.84-0.9): only with wind-tunnel rows (pc1_wind_tunnel)
    assert wt.focusing_pct_published == "85-90"
    base = p2.loc["Paper III baselines (models with public step-0 checkpoints, e.g. Pythia)"]
    assert base.random_init_mean_published == "0.35-0.45" and base.gaussian_expected_published == "0.02-0.04"
    assert "sec. 4.2 / 4.5" in base.random_init_mean_published_on


def test_corrections_of_issue_19_with_their_sources():
    pub = load_published()
    ri = pub["key_orthogonality_random_init"][0]
    assert ri["where"].startswith("sec. 4.2 / 4.5") and "Table 2" not in ri["where"].split(";")[0]
    assert pub["key_orthogonality_gaussian"][0]["range"] == [0.02, 0.04]
    rho = {(e["model"], e["kind"]): e["value"] for e in pub["paper3_rho_pc1_entropy"] if e["source_kind"] == "paper"}
    assert rho == {("Pythia-410M", "mixed"): -0.32, ("Pythia-410M", "restricted"): -0.14, ("Phi-2", "mixed"): 0.34,
                   ("Phi-2", "restricted"): 0.16, ("Llama-3.2-1B", "mixed"): 0.59,
                   ("Llama-3.2-1B", "restricted"): -0.51}
    assert sorted(e["value"] for e in pub["wind_tunnel_hmm_mae"]) == [7.5e-5, 0.012, 0.029]
    assert "bayesian-wind-tunnel" in pub["wind_tunnel_bijection_mae"][0]["paper"]
    for q in ("id_peak", "hard_core_margin", "lsm_margin_q50", "lsm_margin_q25", "lsm_margin_q75",
              "lsm_margin_q95", "lsm_p_margin_below"):
        e = pub[q][0]
        assert e["secondary"] and e["source_kind"] == "secondary" and "mellowmarshall/mrp-paper" in e["source"], q
        assert "Brett 2026" in e["source"] and "2604.06767" in e["source"] and "replication" not in e["source"], q
        assert value_text(e).endswith("(secondary)"), q
    assert pub["lsm_margin_q50"][0]["range"] == [0.487, 0.641]
    assert "Aggarwal" in pub["eta_slope"][0]["paper"] or "Aggarwal" in pub["paper3_table1_pc1"][0]["paper"]
    assert not pub["eta_slope"][0]["secondary"] and pub["eta_slope"][0]["source_kind"] == "paper"


def test_every_published_entry_reaches_a_table():
    """Each quantity of the data file is mapped to a table column or decided by a claim of claims.yaml (shown in
    claims.csv); published.csv lists every entry once."""
    from llmgeom.analyses import bayes_tables, intrinsic_dimension, margins
    from llmgeom.analyses.claims import load_claims
    from llmgeom.core.published import published_table

    mapped = set()
    for mod, names in ((bayes_tables, ("TABLE1_PUBLISHED", "TABLE2_PUBLISHED")),
                       (intrinsic_dimension, ("ID_PROFILE_PUBLISHED",)),
                       (margins, ("MARGINS_PUBLISHED", "GAP_PUBLISHED"))):
        for n in names:
            mapped |= set(getattr(mod, n).values())
    from llmgeom.analyses.scaling import STATISTICS

    mapped |= {s.published for s in STATISTICS if s.published}  # scaling.csv: the papers' models as rows
    claimed = {c["published"] for c in load_claims() if c.get("published")}
    pub = load_published()
    # issue 28 point 3: quantities added at the data layer whose table column is still to come (the lead maps
    # them: Table 1 / SULA geometry / id_profile). Listed by name so that nothing else may go unshown.
    pending = {"paper3_sula_pc1", "paper3_sula_pc12", "paper3_sula_rho_pc1_entropy", "lsm_twonn_layer",
               "lsm_curvature_proxy"}
    assert pending <= set(pub)
    assert set(pub) - mapped - claimed - pending == set()
    t = published_table()
    assert len(t) == sum(len(v) for v in pub.values()) and t.text.str.len().gt(0).all()


def test_rendering_and_columns_beside_the_measured_value():
    assert published_text("eta_slope") == "0.87-1.12" and published_text("eta_r2") == "> 0.985"
    assert published_text("nothing") == "" and published_on("nothing") == ""
    df = pd.DataFrame({"model": ["a"], "beta": [1.01], "r2": [0.99]})
    out = add_published(df, {"beta": "eta_slope", "r2": "eta_r2", "absent": "eta_slope"})
    assert list(out.columns) == ["model", "beta", "beta_published", "beta_published_on", "r2", "r2_published",
                                 "r2_published_on", "source"]
    # LSM's values name no single model: never attached to our row by quantity alone
    assert out.beta_published.iloc[0] == "" and out.source.iloc[0] == "measured"
    rows = add_published(df, {"beta": "eta_slope", "r2": "eta_r2"}, rows=True)
    p = rows[rows.source == "published"].iloc[0]
    assert len(rows) == 2 and p.beta_published == "0.87-1.12" and p.r2_published == "> 0.985"
    assert "Latent Semantic Manifolds" in p.beta_published_on and "124M-1.5B" in p.model


def test_per_model_entries_and_malformed_files(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("papers: {x: Paper X}\nvalues:\n"
                 "  - {quantity: q, value: 0.1, unit: u, paper: x, where: 'Table 1, arXiv:1v1', models: M1, "
                 "source_kind: paper}\n"
                 "  - {quantity: q, value: 0.2, unit: u, paper: x, where: 'Table 1, arXiv:1v1', models: M2, "
                 "source_kind: paper}\n")
    assert published_text("q", path=str(p)) == "0.1 (M1); 0.2 (M2)"
    assert published_on("q", path=str(p)) == "Paper X, Table 1, arXiv:1v1"
    m = tmp_path / "m.yaml"
    m.write_text("papers: {x: Paper X}\nvalues:\n"
                 "  - {quantity: q, value: 0.1, unit: u, paper: x, where: T1 arXiv, models: M-1 mixed, model: M-1, "
                 "kind: mixed, source_kind: paper}\n"
                 "  - {quantity: q, value: 0.3, unit: u, paper: x, where: T1 arXiv, models: M-1 math, model: M-1, "
                 "kind: restricted, source_kind: paper}\n")
    df = pd.DataFrame({"model": ["m-1", "m-1", "other"], "role": ["mixed", "restricted", "mixed"], "x": 1.0})
    out = add_published(df, {"x": "q"}, path=str(m), kind_col="role", rows=True)
    assert list(out.x_published) == ["0.1", "0.3", "", "0.1", "0.3"]  # by model and kind
    assert list(out.source) == ["measured"] * 3 + ["published"] * 2 and list(out.role[3:]) == ["mixed", "restricted"]
    assert list(out.x[3:]) == [0.1, 0.3]
    ok = "quantity: q, unit: u, paper: x, where: w arXiv:1v1, models: m, source_kind: paper"
    bad = {
        "exactly one of value": f"  - {{{ok}}}\n",
        "missing 'where'": "  - {quantity: q, value: 1, unit: u, paper: x, models: m, source_kind: paper}\n",
        "not listed under 'papers'": f"  - {{{ok.replace('paper: x', 'paper: y')}, value: 1}}\n",
        "unknown field": f"  - {{{ok}, value: 1, guess: 2}}\n",
        "lo 2.0 > hi 1.0": f"  - {{{ok}, range: [2, 1]}}\n",
        "appears twice": f"  - {{{ok}, value: 1}}\n" * 2,
        "kind 'math'": f"  - {{{ok}, value: 1, kind: math}}\n",
        "source_kind secondary needs a 'source'": f"  - {{{ok.replace('source_kind: paper', 'source_kind: secondary')}"
                                                  ", value: 1}\n",
        "now source_kind: secondary": f"  - {{{ok}, value: 1, secondary: true, source: s}}\n",
        r"values\[0\] \(q, models 'm'\): missing 'source_kind'; allowed kinds: \['paper', 'official_code', "
        r"'secondary', 'replication', 'other_study'\]": "  - {quantity: q, value: 1, unit: u, paper: x, where: w, "
                                                       "models: m}\n",
        r"unknown source_kind 'preprint'; allowed kinds: \['paper'":
            f"  - {{{ok.replace('kind: paper', 'kind: preprint')}, value: 1}}\n",
        "needs the arXiv version": "  - {quantity: q, value: 1, unit: u, paper: x, where: Table 1, models: m, "
                                   "source_kind: paper}\n",
    }
    for i, (msg, body) in enumerate(bad.items()):
        f = tmp_path / f"b{i}.yaml"
        f.write_text("papers: {x: Paper X}\nvalues:\n" + body)
        with pytest.raises(PublishedDataError, match=msg):
            load_published(str(f))


def test_rules_showing_published_values_rerun_when_the_data_file_changes():
    from pathlib import Path

    from llmgeom.pipeline import code_tracking

    repo = Path(__file__).resolve().parents[3]
    for script in ("bayes_tables", "margins", "intrinsic_dimension", "margin_vs_perplexity"):
        files = code_tracking.package_files(script=repo / "workflow" / "scripts" / f"{script}.py", cwd=repo)
        assert "src/llmgeom/data/published.yaml" in files, script
    assert not any("published" in f for f in code_tracking.package_files(script=repo / "workflow/scripts/value_manifold.py",
                                                                      cwd=repo))


# ---- issue 28 point 3: published values in tiers (source_kind)
OFFICIAL = "github.com/vishalmisra/bayesian-wind-tunnel"


def test_every_entry_has_a_source_kind_and_the_derived_secondary_flag():
    from llmgeom.core.published import load_papers

    pub = load_published()
    for q, es in pub.items():
        for e in es:
            assert e["source_kind"] in SOURCE_KINDS, q
            assert e["secondary"] == (e["source_kind"] not in ("paper", "official_code")), q
            assert e["source_kind"] == "paper" or e["source"], q  # every non-paper entry names its source
            if e["source_kind"] == "paper":
                assert "arxiv" in e["where"].lower(), q
    t = published_table()
    assert "source_kind" in t.columns and set(t.source_kind) <= set(SOURCE_KINDS)
    assert {"paper", "official_code", "secondary", "replication", "other_study"} <= set(t.source_kind)
    assert "2604.06767" in load_papers()["brett2026"]


def test_pythia410m_paper_and_official_code_values_side_by_side():
    by = entries_by_kind("paper3_table1_pc12", "pythia-410m", "mixed")
    assert list(by) == ["paper", "official_code"]
    assert [e["value"] for e in by["paper"]] == [0.997] and [e["value"] for e in by["official_code"]] == [0.277]
    oc = by["official_code"][0]
    assert oc["model"] == "Pythia-410M" and oc["kind"] == "mixed" and "15 prompts" in oc["models"]
    assert "figures/pythia_410m_test/geometry_results.json" in oc["source"] and "2026-01-02" in oc["source"]
    assert source_text(oc).endswith(f"official code: {oc['source']}") and OFFICIAL in source_text(oc)
    assert value_text(oc) == "0.277" and not oc["secondary"]
    known = {("paper3_table1_pc1", "mixed"): (0.796, 0.146), ("paper3_rho_pc1_entropy", "mixed"): (-0.32, -0.59)}
    for (q, k), (paper, code) in known.items():
        b = entries_by_kind(q, "Pythia-410M", k)
        assert [e["value"] for e in b["paper"]] == [paper] and [e["value"] for e in b["official_code"]] == [code], q
    ko = entries_by_kind("key_orthogonality_trained", "pythia-410m")
    assert ko["paper"][0]["range"] == [0.11, 0.13] and ko["official_code"][0]["value"] == pytest.approx(0.0297)
    assert "embedding" in ko["official_code"][0]["note"] and "24 layers" in ko["official_code"][0]["note"]
    sula = {q: entries_by_kind(q, "pythia-410m")["official_code"][0] for q in
            ("paper3_sula_pc1", "paper3_sula_pc12", "paper3_sula_rho_pc1_entropy")}
    assert [sula[q]["value"] for q in sula] == [0.264, 0.377, -0.77]
    assert all("figures/sula_pythia_test/sula_summary.json" in e["source"] and "150 prompts" in e["models"]
               for e in sula.values())
    # the verdict keeps deciding on the paper's number; the official code decides only where the paper has none
    es, same = comparison_entries("paper3_table1_pc12", "pythia-410m", "mixed")
    assert [e["value"] for e in es] == [0.997] and same
    es, same = comparison_entries("key_orthogonality_trained", "pythia-410m")
    assert [e["range"] for e in es] == [[0.11, 0.13]] and same
    es, same = comparison_entries("paper3_sula_pc1", "pythia-410m")
    assert [e["source_kind"] for e in es] == ["official_code"] and same
    assert entries_by_kind("paper3_table1_pc12", "phi-2", "mixed").keys() == {"paper"}
    assert entries_by_kind("nothing", "pythia-410m") == {}


def test_tables_show_the_official_code_in_columns_of_their_own_only_when_asked():
    df = pd.DataFrame({"model": ["pythia-410m"], "role": ["mixed"], "pc12": [0.3]})
    plain = add_published(df, {"pc12": "paper3_table1_pc12"}, kind_col="role", rows=True)
    assert plain.pc12_published.iloc[0] == "0.997" and "pc12_official_code" not in plain
    assert "source_kind" not in plain and 0.277 not in set(plain.pc12)  # default: as before issue 28
    t = add_published(df, {"pc12": "paper3_table1_pc12"}, kind_col="role", rows=True, also=("official_code",))
    cols = list(t.columns)
    assert cols[cols.index("pc12"):cols.index("pc12") + 5] == ["pc12", "pc12_published", "pc12_published_on",
                                                               "pc12_official_code", "pc12_official_code_on"]
    r = t.iloc[0]
    assert r.pc12_published == "0.997" and r.pc12_official_code == "0.277" and OFFICIAL in r.pc12_official_code_on
    pub = t[t.source == "published"].set_index(["model", "role", "source_kind"])
    assert pub.loc[("Pythia-410M", "mixed", "paper"), "pc12"] == pytest.approx(0.997)
    assert pub.loc[("Pythia-410M", "mixed", "official_code"), "pc12"] == pytest.approx(0.277)
    assert t.source_kind.iloc[0] == ""
    with pytest.raises(ValueError, match="unknown source kind"):
        add_published(df, {"pc12": "paper3_table1_pc12"}, also=("code",))


def test_brett2026_own_row_is_another_study_never_lsms_range():
    own = entries_by_kind("eta_slope")["other_study"]
    assert [(e["model"], e["value"]) for e in own] == [("Qwen3.5-4B-Base", 0.912)]
    assert own[0]["paper_key"] == "brett2026"
    assert value_text(own[0]) == "0.912 (other study)" and own[0]["secondary"]
    row = {q: entries_by_kind(q, "qwen3.5-4b-base")["other_study"][0]["value"]
           for q in ("eta_slope", "eta_r2", "lsm_margin_q50", "hard_core_margin")}
    assert row == {"eta_slope": 0.912, "eta_r2": 0.9997, "lsm_margin_q50": 1.030, "hard_core_margin": 0.065}
    # the range a claim decides on stays LSM's (quoted by Brett 2026 where secondary), on any model, Qwen included
    for m in ("qwen3.5-4b-base", "smollm2-135m"):
        for q, rng in (("eta_slope", [0.87, 1.12]), ("lsm_margin_q50", [0.487, 0.641]),
                       ("hard_core_margin", [0.04, 0.06])):
            es, same = comparison_entries(q, m)
            assert [e.get("range") for e in es] == [rng] and not same, (q, m)
            assert all(e["source_kind"] in ("paper", "secondary") for e in es)
        es, _ = comparison_entries("eta_r2", m)
        assert [e.get("min") for e in es] == [0.985]
    assert published_text("eta_slope") == "0.87-1.12"


def test_gpt2_replication_of_lsm_is_shown_not_decided_on():
    tw = entries_by_kind("lsm_twonn_layer", "gpt2")
    assert list(tw) == ["replication"]
    assert {e["layer"]: e["value"] for e in tw["replication"]} == {1: 3.43, 6: 6.72, 12: 7.48}
    assert all("ChaminiMaduwanthi/Fisher-Rao" in e["source"] and "1,800 vectors" in e["models"]
               for e in tw["replication"])
    cur = load_published()["lsm_curvature_proxy"][0]
    assert cur["source_kind"] == "replication" and "0.9999" in cur["reading"] and "3-sphere" in cur["reading"]
    assert comparison_entries("lsm_twonn_layer", "gpt2") == ([], False)
    assert published_text("lsm_curvature_proxy") == ""


def _pre_issue28(q, model, kind):
    """comparison_entries as it was before source kinds, on the entries that existed then."""
    from llmgeom.core.published import model_key

    old = [e for e in load_published().get(q, []) if e["source_kind"] in ("paper", "secondary")
           or (e["source_kind"] == "official_code" and "figures/" not in e["source"])]
    own = [e for e in old if e["model"] and model_key(e["model"]) == model_key(model)
           and not (kind and e["kind"] and kind != e["kind"])]
    if own:
        return own, True
    es = [e for e in old if not kind or e["kind"] in ("", kind)]
    return ([e for e in es if e["model"]] or es), False


def test_comparison_entries_unchanged_for_existing_claims():
    from llmgeom.analyses.claims import load_claims

    models = ("pythia-410m", "smollm2-135m", "phi-2", "llama-3.2-1b", "mistral-7b", "gpt2", "qwen3.5-4b-base",
              "opt-125m")
    n = 0
    for c in load_claims():
        if not c.get("published"):
            continue
        for m in models:
            for k in {c.get("kind"), None, "mixed", "restricted"}:
                assert comparison_entries(c["published"], m, k) == _pre_issue28(c["published"], m, k), (c["id"], m)
                n += 1
    assert n > 100
