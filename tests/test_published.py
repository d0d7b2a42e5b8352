"""Published values live in a data file with their source (issue 11, point 4; DESIGN.md sec. 3)."""

from __future__ import annotations

import pandas as pd
import pytest

from llmgeom.core.published import PublishedDataError, add_published, load_published, published_on, published_text


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
                "paper3_table2_focusing_pct") for e in pub[q])
    assert sorted(e["value"] for e in pub["paper3_sula_entropy_mae"]) == [0.31, 0.36, 0.44]
    # a synthetic pythia-410m row carries the published Paper III values beside the measured ones
    dr = pd.DataFrame({"model": "pythia-410m", "prompt_set": ["mixed", "domain_mathematics"],
                       "domain": [None, "Mathematics"], "role": ["mixed", "restricted"], "n": 75, "layer": 23,
                       "relative_depth": 1.0, "representation": "values", "standardized": True,
                       "pc1": [0.8, 0.6], "pc12": [0.99, 0.99], "spearman_rho": [0.3, 0.1]})
    t1 = table1(dr)
    ours, pub1 = t1[t1.source == "measured"], t1[t1.source == "published"]
    # beside our row: only the value published for the same model and prompt-set kind
    assert list(ours.pc1_published) == ["0.796", "0.58"] and list(ours.pc12_published) == ["0.997", "0.999"]
    assert list(ours.spearman_rho_published) == ["-0.32", "-0.14"]  # sec. 5.1, matched by kind too
    assert "Table 1, arXiv:2512.23752v1" in ours.pc1_published_on.iloc[0]
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
    rho = {(e["model"], e["kind"]): e["value"] for e in pub["paper3_rho_pc1_entropy"]}
    assert rho == {("Pythia-410M", "mixed"): -0.32, ("Pythia-410M", "restricted"): -0.14, ("Phi-2", "mixed"): 0.34,
                   ("Phi-2", "restricted"): 0.16, ("Llama-3.2-1B", "mixed"): 0.59,
                   ("Llama-3.2-1B", "restricted"): -0.51}
    assert sorted(e["value"] for e in pub["wind_tunnel_hmm_mae"]) == [7.5e-5, 0.012, 0.029]
    assert "bayesian-wind-tunnel" in pub["wind_tunnel_bijection_mae"][0]["paper"]
    for q in ("id_peak", "hard_core_margin", "lsm_margin_q50", "lsm_margin_q25", "lsm_margin_q75",
              "lsm_margin_q95", "lsm_p_margin_below"):
        e = pub[q][0]
        assert e["secondary"] and "mellowmarshall/mrp-paper" in e["source"], q
        assert published_text(q).endswith("(secondary)"), q
    assert pub["lsm_margin_q50"][0]["range"] == [0.487, 0.641]
    assert "Aggarwal" in pub["eta_slope"][0]["paper"] or "Aggarwal" in pub["paper3_table1_pc1"][0]["paper"]
    assert not pub["eta_slope"][0]["secondary"]


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
    claimed = {c["published"] for c in load_claims() if c.get("published")}
    pub = load_published()
    assert set(pub) - mapped - claimed == set()
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
                 "  - {quantity: q, value: 0.1, unit: u, paper: x, where: Table 1, models: M1}\n"
                 "  - {quantity: q, value: 0.2, unit: u, paper: x, where: Table 1, models: M2}\n")
    assert published_text("q", path=str(p)) == "0.1 (M1); 0.2 (M2)"
    assert published_on("q", path=str(p)) == "Paper X, Table 1"
    m = tmp_path / "m.yaml"
    m.write_text("papers: {x: Paper X}\nvalues:\n"
                 "  - {quantity: q, value: 0.1, unit: u, paper: x, where: T1, models: M-1 mixed, model: M-1, kind: mixed}\n"
                 "  - {quantity: q, value: 0.3, unit: u, paper: x, where: T1, models: M-1 math, model: M-1, "
                 "kind: restricted}\n")
    df = pd.DataFrame({"model": ["m-1", "m-1", "other"], "role": ["mixed", "restricted", "mixed"], "x": 1.0})
    out = add_published(df, {"x": "q"}, path=str(m), kind_col="role", rows=True)
    assert list(out.x_published) == ["0.1", "0.3", "", "0.1", "0.3"]  # by model and kind
    assert list(out.source) == ["measured"] * 3 + ["published"] * 2 and list(out.role[3:]) == ["mixed", "restricted"]
    assert list(out.x[3:]) == [0.1, 0.3]
    bad = {
        "exactly one of value": "  - {quantity: q, unit: u, paper: x, where: w, models: m}\n",
        "missing 'where'": "  - {quantity: q, value: 1, unit: u, paper: x, models: m}\n",
        "not listed under 'papers'": "  - {quantity: q, value: 1, unit: u, paper: y, where: w, models: m}\n",
        "unknown field": "  - {quantity: q, value: 1, unit: u, paper: x, where: w, models: m, guess: 2}\n",
        "lo 2.0 > hi 1.0": "  - {quantity: q, range: [2, 1], unit: u, paper: x, where: w, models: m}\n",
        "appears twice": "  - {quantity: q, value: 1, unit: u, paper: x, where: w, models: m}\n" * 2,
        "kind 'math'": "  - {quantity: q, value: 1, unit: u, paper: x, where: w, models: m, kind: math}\n",
        "needs a 'source'": "  - {quantity: q, value: 1, unit: u, paper: x, where: w, models: m, secondary: true}\n",
    }
    for i, (msg, body) in enumerate(bad.items()):
        f = tmp_path / f"b{i}.yaml"
        f.write_text("papers: {x: Paper X}\nvalues:\n" + body)
        with pytest.raises(PublishedDataError, match=msg):
            load_published(str(f))


def test_rules_showing_published_values_rerun_when_the_data_file_changes():
    from pathlib import Path

    from llmgeom.workflow import cluster

    repo = Path(__file__).resolve().parents[1]
    for script in ("bayes_tables", "margins", "intrinsic_dimension", "margin_vs_perplexity"):
        files = cluster.package_files(script=repo / "workflow" / "scripts" / f"{script}.py", cwd=repo)
        assert "src/llmgeom/data/published.yaml" in files, script
    assert not any("published" in f for f in cluster.package_files(script=repo / "workflow/scripts/value_manifold.py",
                                                                      cwd=repo))
