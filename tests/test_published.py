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
    # numbers we do not have are absent, not guessed
    assert "paper3_table1_pc12" not in pub and "key_orthogonality_trained" not in pub


def test_rendering_and_columns_beside_the_measured_value():
    assert published_text("eta_slope") == "0.87-1.12" and published_text("eta_r2") == "> 0.985"
    assert published_text("nothing") == "" and published_on("nothing") == ""
    df = pd.DataFrame({"model": ["a"], "beta": [1.01], "r2": [0.99]})
    out = add_published(df, {"beta": "eta_slope", "r2": "eta_r2", "absent": "eta_slope"})
    assert list(out.columns) == ["model", "beta", "beta_published", "beta_published_on", "r2", "r2_published",
                                 "r2_published_on"]
    assert "Latent Semantic Manifolds" in out.beta_published_on.iloc[0]


def test_per_model_entries_and_malformed_files(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("papers: {x: Paper X}\nvalues:\n"
                 "  - {quantity: q, value: 0.1, unit: u, paper: x, where: Table 1, models: M1}\n"
                 "  - {quantity: q, value: 0.2, unit: u, paper: x, where: Table 1, models: M2}\n")
    assert published_text("q", path=str(p)) == "0.1 (M1); 0.2 (M2)"
    assert published_on("q", path=str(p)) == "Paper X, Table 1"
    bad = {
        "exactly one of value": "  - {quantity: q, unit: u, paper: x, where: w, models: m}\n",
        "missing 'where'": "  - {quantity: q, value: 1, unit: u, paper: x, models: m}\n",
        "not listed under 'papers'": "  - {quantity: q, value: 1, unit: u, paper: y, where: w, models: m}\n",
        "unknown field": "  - {quantity: q, value: 1, unit: u, paper: x, where: w, models: m, guess: 2}\n",
        "lo 2.0 > hi 1.0": "  - {quantity: q, range: [2, 1], unit: u, paper: x, where: w, models: m}\n",
        "appears twice": "  - {quantity: q, value: 1, unit: u, paper: x, where: w, models: m}\n" * 2,
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
