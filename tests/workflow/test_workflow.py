"""Workflow tests: the whole DAG on the tiny study .test/config/config.yaml (two tiny random models, a handful
of prompts; ``snakemake --directory .test --cores 2`` runs the same).

Runs Snakemake in a temporary working directory with the repository's Snakefile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.stats
import yaml

from conftest import tiny_config

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = [pytest.mark.slow, pytest.mark.minutes(3)]


def run_smk(workdir: Path, *args, check=True):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "-d", str(workdir),
                       "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
    if check and r.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}")
    return r


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("wf")
    cfg = tiny_config()
    (wd / "config.yaml").write_text(yaml.safe_dump(cfg))
    run_smk(wd)
    return wd, cfg


def test_every_target_exists_and_is_sane(tiny_run):
    wd, cfg = tiny_run
    for m in cfg["models"]:
        assert (wd / f"resources/models/{m}/manifest.json").is_file()
        for s in cfg["prompts"]["sets"]:
            h5 = wd / f"results/{m}/activations/{s}.h5"
            with h5py.File(h5, "r") as f:
                assert bool(f.attrs["complete"])
                assert f.attrs["model"] == m
                assert np.isfinite(f["last_token/residual"][:]).all()
        vm = pd.read_csv(wd / f"results/{m}/tables/value_manifold.csv")
        assert set(vm.prompt_set) == {"mixed", "domain_mathematics"}
        assert set(vm.representation) == {"values", "attn_output", "residual_stream"}
        assert {"model", "layer", "prompt_set", "n"} <= set(vm.columns)
        assert (vm.n == 12).all()
        assert ((vm.pc1 > 0) & (vm.pc1 <= vm.pc12) & (vm.pc12 <= 1 + 1e-9)).all()
        assert ((vm.pc1_lo <= vm.pc1_hi)).all()
        # known answer for one row, from the stored arrays with numpy/scipy only: PC1 share of the z-scored
        # last-layer values and |Spearman rho(PC1 score, next-token entropy)| (PC1 signed so that rho >= 0)
        row = vm[(vm.prompt_set == "mixed") & (vm.representation == "values") & vm.standardized
                 & (vm.layer == vm[vm.representation == "values"].layer.max())].iloc[0]
        with h5py.File(wd / f"results/{m}/activations/mixed.h5", "r") as f:
            X = f["last_token/values"][:, int(row.layer)].astype(np.float64)
            ent = f["next_token/entropy"][:].astype(np.float64)
        X = X[:, np.ptp(X, axis=0) > 0]
        Z = (X - X.mean(0)) / X.std(0)
        U, S, _ = np.linalg.svd(Z, full_matrices=False)
        assert row.pc1 == pytest.approx(S[0] ** 2 / (S ** 2).sum(), abs=1e-9)
        assert row.spearman_rho == pytest.approx(abs(scipy.stats.spearmanr(U[:, 0], ent).statistic), abs=1e-9)
        idt = pd.read_csv(wd / f"results/{m}/tables/intrinsic_dimension.csv")
        assert set(idt.estimator) == {"twonn", "mle_mg"}  # the config says "mle", the old name of mle_mg
        assert idt.layer.nunique() == 3  # embeddings + 2 blocks
        assert np.isfinite(idt.id_mean).all() and (idt.id_mean > 0).all()
        assert (idt.n <= 8 * 20).all()
    summ = pd.read_csv(wd / "results/summary/value_manifold.csv")
    assert set(summ.model) == set(cfg["models"])
    for fig in ("value_manifold", "intrinsic_dimension"):
        for ext in ("png", "pdf"):
            assert (wd / f"results/figures/{fig}.{ext}").stat().st_size > 1000
    assert not list(wd.rglob("*.partial"))


def test_bayes_geometry_outputs(tiny_run):
    """Paper III tables, cross-model summaries and figures (domain_restriction, key_orthogonality, attention_focusing and summary .smk) with schema defaults:
    restricted sets = every domain/code set; 15 per quintile exceeds the 12 candidates, so all are taken."""
    wd, cfg = tiny_run
    for m in cfg["models"]:
        dr = pd.read_csv(wd / f"results/{m}/tables/domain_restriction.csv")
        assert set(dr.prompt_set) == {"mixed", "domain_mathematics"}
        assert set(dr.role) == {"mixed", "restricted"} and (dr.n == 12).all()
        assert dr.layer.nunique() == 2 and set(dr.standardized) == {True, False}
        assert (dr[dr.role == "mixed"].delta_pc12 == 0).all()
        sel = pd.read_csv(wd / f"results/{m}/tables/domain_selection.csv")
        assert len(sel) == 24 and sel.selected.all()
        ko = pd.read_csv(wd / f"results/{m}/tables/key_orthogonality.csv")
        assert len(ko) == 2 * (2 if m == "tiny-llama" else 4)  # layers x key heads (llama GQA: 2 key heads)
        assert ko[["orthogonality", "baseline_gaussian", "baseline_random_init"]].apply(lambda c: c.between(0, 1)).all().all()
        af = pd.read_csv(wd / f"results/{m}/tables/attention_focusing.csv")
        assert set(af.level) == {"head", "layer"} and (af[af.level == "layer"].shape[0] == 2)
    t1 = pd.read_csv(wd / "results/summary/table1.csv")
    t2 = pd.read_csv(wd / "results/summary/table2.csv")
    ours = t1[(t1.source == "measured") & (t1.null_of.fillna("") == "")]
    assert len(ours) == 4 and set(t2[t2.source == "llm"].model) == set(cfg["models"])
    # issue 28: each model's random-init twin as a model of its own, marked as the null of its model
    assert {(m, n) for m, n in zip(t2[t2.source == "null_model"].model, t2[t2.source == "null_model"].null_of)} == \
        {(f"{m}-randinit", m) for m in cfg["models"]} | {(f"{m}-step0", m) for m in cfg["wind_tunnel"]["models"]}
    assert np.isfinite(t2[t2.source == "llm"].pc12_restricted_iso).all()
    assert list(t2[t2.source == "wind_tunnel"].model) == list(cfg["wind_tunnel"]["models"])  # Table 2 rows
    assert "| Model |" in (wd / "results/summary/table2.md").read_text()
    for fig in ("pc_scatter", "explained_variance_layers", "key_orthogonality", "attention_focusing", "bayes_summary"):
        assert (wd / f"results/figures/{fig}.png").stat().st_size > 1000


def test_lsm_outputs(tiny_run):
    """LSM tables, cross-model summaries and figures (intrinsic_dimension, curvature, margins, fisher and summary .smk; issue 5)."""
    wd, cfg = tiny_run
    for m in cfg["models"]:
        t = wd / f"results/{m}/tables"
        idt = pd.read_csv(t / "intrinsic_dimension.csv")
        assert {"estimator_ratio", "estimators_disagree", "disagreement_factor"} <= set(idt.columns)
        assert set(idt.quantity) == {"token_id", "token_id_cross_passage"}
        assert (idt[idt.quantity == "token_id_cross_passage"].estimator == "twonn").all()
        assert idt.id_mean_replicates.notna().any() and (idt.id_mean_lo <= idt.id_mean_hi).all()
        prof = pd.read_csv(t / "id_profile.csv")
        assert set(prof.estimator) == {"twonn", "mle_mg"}
        assert set(prof.quantity) == {"token_id", "token_id_cross_passage", "last_token_id"}
        tok = prof.quantity != "last_token_id"  # last token: 12 prompts < min_points, NaN rows with the reason
        assert prof[tok].peak_layer.between(1, 2).all() and prof[~tok].note.str.startswith("no profile").all()
        assert (prof[tok].peak_id_lo <= prof[tok].peak_id_hi).all() and (prof[tok].n_resamples > 0).all()
        cv = pd.read_csv(t / "curvature.csv")
        blocks = cv[cv.layer > 0]  # layer 0: the tiny vocabulary's few distinct embeddings may be too few (NaN + note)
        assert len(cv) == 3 and blocks.curvature_mean.between(0, 1).all() and (blocks.k > blocks.m).all()
        assert cv.curvature_mean.notna().all() or cv[cv.curvature_mean.isna()].note.str.contains("too few").all()
        mg = pd.read_csv(t / "margins.csv").iloc[0]
        with h5py.File(wd / f"results/{m}/activations/corpus.h5", "r") as f:
            assert mg.n_positions == f["tokens/margin"].shape[0]
        assert 0 <= mg.margin_q05 <= mg.margin_q50 <= mg.margin_q95 and mg.perplexity > 1
        gap = pd.read_csv(t / "expressibility_gap.csv").iloc[0]
        assert np.isfinite(gap.beta) and gap.n_fit_points >= 3 and gap.beta_lo <= gap.beta_hi
        fs = pd.read_csv(t / "fisher_summary.csv").iloc[0]
        assert fs.trace_median > 0 and fs.effective_rank_median >= 1 and fs.margin_check_max_abs_diff < 1e-3
    mvp = pd.read_csv(wd / "results/summary/margin_vs_perplexity.csv")
    assert set(mvp.model) == set(cfg["models"]) and mvp.spearman_rho_across_models.isna().all()
    for fig in ("curvature", "margin_histogram", "expressibility_gap", "margin_vs_perplexity", "intrinsic_dimension"):
        for ext in ("png", "pdf"):
            assert (wd / f"results/figures/{fig}.{ext}").stat().st_size > 1000


def test_no_two_rows_of_a_table_share_a_key(tiny_run):
    """Every table with a declared key (llmgeom.core.tables.TABLE_KEYS), per model and across models: no two rows
    share it (issue 48: id_profile held two twonn rows per model told apart by a column no reader filtered on)."""
    from llmgeom.core.tables import TABLE_KEYS, duplicate_keys

    wd, cfg = tiny_run
    paths = [p for t in TABLE_KEYS for p in [wd / f"results/summary/{t}.csv",
                                            *(wd / f"results/{m}/tables/{t}.csv" for m in cfg["models"])]]
    read = {p: pd.read_csv(p) for p in paths if p.is_file()}
    for need in ("id_profile", "intrinsic_dimension", "margins", "scaling", "claims"):
        assert wd / f"results/summary/{need}.csv" in read, need
    for p, df in read.items():
        dup = duplicate_keys(df, p.stem)
        assert dup.empty, f"{p.relative_to(wd)}: rows share a key:\n{dup.head(10)}"


def test_sula_and_intervention_outputs(tiny_run):
    """SULA tables, controls, geometry, interventions, summaries and figures (workflow/rules/sula.smk,
    interventions.smk; issue 4)."""
    wd, cfg = tiny_run
    for m in cfg["models"]:
        for cond, n in (("main", 16), ("remap", 12), ("shuffled", 12), ("ablation", 12)):
            with h5py.File(wd / f"results/{m}/activations/sula_{cond}.h5", "r") as f:
                assert f["next_token/candidate_logprobs"].shape == (n, 2) and bool(f.attrs["complete"])
        s = pd.read_csv(wd / f"results/{m}/tables/sula.csv")
        assert set(s.condition) == {"main", "remap", "shuffled", "ablation"}
        assert set(s.k.astype(str)) == {"0", "1", "2", "4", "all"}
        assert s.mae_bits.between(0, 1).all()
        assert set(s[s.condition == "remap"].labels) == {"p/q"} and set(s[s.condition == "main"].labels) == {"x/y"}
        per = pd.read_csv(wd / f"results/{m}/tables/sula_prompts.csv")
        assert (per[per.condition == "shuffled"].h_bayes_bits == 1).all()
        assert (per[per.k == 0].h_bayes_bits == 1).all()
        geo = pd.read_csv(wd / f"results/{m}/tables/sula_geometry.csv")
        assert set(geo.layer) == {0, 1}
        assert len(pd.read_csv(wd / f"results/{m}/tables/sula_calibration.csv")) >= 4
        iv = pd.read_csv(wd / f"results/{m}/interventions/sula_interventions.csv")
        # layers [middle, last] = [1, 1] for 2 layers: one single-layer run and the multi-layer run (layer 1)
        assert len(iv) == 1 + 2 * 2 * 4 and set(iv.axis) == {"none", "entropy", "random"}
        assert (iv.n == 12).all()
        cut = iv[(iv.axis == "entropy") & (iv.edit == "axis_cut")]
        assert (cut.axis_corr_edited == 0).all() and cut.degenerate_edited.all()
        ax = pd.read_csv(wd / f"results/{m}/interventions/entropy_axes.csv")
        assert (ax.random_dot_u.dropna() < 1e-10).all()
    for t in ("sula", "sula_calibration", "sula_geometry", "sula_prompts", "sula_interventions"):  # + the twins
        assert set(pd.read_csv(wd / f"results/summary/{t}.csv").model) == {*cfg["models"],
                                                                           *(f"{m}-randinit" for m in cfg["models"])}
    for fig in ("sula_calibration", "sula_pc1", "sula_interventions"):
        for ext in ("png", "pdf"):
            assert (wd / f"results/figures/{fig}.{ext}").stat().st_size > 1000
    assert "sula" in (wd / "resources/prompts/sula/tiny-gpt2/main.jsonl").read_text()
    for m in cfg["models"]:  # a twin runs its trained model's SULA prompt file (same tokenizer), not a copy of its own
        assert not (wd / f"resources/prompts/sula/{m}-randinit").exists()
        with h5py.File(wd / f"results/{m}/activations/sula_main.h5", "r") as f, \
                h5py.File(wd / f"results/{m}-randinit/activations/sula_main.h5", "r") as g:
            assert f.attrs["prompt_set_sha256"] == g.attrs["prompt_set_sha256"]
            assert (f["next_token/candidate_ids"][:] == g["next_token/candidate_ids"][:]).all()


def test_wind_tunnel_outputs(tiny_run):
    """Issue 14: the workflow trains the tiny wind-tunnel model, saves a checkpoint entry, extracts both on the
    task's prompt set and runs the calibration / geometry tables, key orthogonality and attention focusing."""
    wd, cfg = tiny_run
    entries = ["wt-tiny", "wt-tiny-step50"]
    for m, step in zip(entries, (100, 50)):
        man = json.loads((wd / f"resources/models/{m}/manifest.json").read_text())
        assert man["source"] == "wind_tunnel" and man["step"] == step
        t = wd / f"results/{m}/tables"
        s = pd.read_csv(t / "wind_tunnel.csv")
        assert {"model", "task", "step", "t", "n", "mae_bits", "pearson_r", "spearman_rho", "mean_h_model_bits",
                "mean_h_exact_bits", "mean_kl_bits", "mean_answer_mass"} <= set(s.columns)
        assert list(s.t.astype(str)) == ["0", "1", "2", "all"] and (s.step == step).all()
        assert np.isfinite(s.mae_bits).all() and s.mae_bits.between(0, 2).all()
        np.testing.assert_allclose(s.mean_h_exact_bits.iloc[:3], np.log2([4, 3, 2]))
        assert int(s.n.iloc[-1]) == 6 * 3  # 6 sequences x 3 answer positions
        g = pd.read_csv(t / "wind_tunnel_geometry.csv")
        assert {"values", "residual_stream"} <= set(g.representation)
        assert len(g[g.representation == "values"]) == 2 and len(g[g.representation == "residual_stream"]) == 3
        assert pd.read_csv(t / "wind_tunnel_calibration.csv").n.sum() == 18
        assert len(pd.read_csv(t / "key_orthogonality.csv")) == 2 * 4  # 2 layers x 4 key heads
        assert pd.read_csv(t / "attention_focusing_summary.csv").n_layers.iloc[0] == 2
    assert (wd / "resources/models/wt-tiny/training_log.csv").is_file()
    assert set(pd.read_csv(wd / "results/summary/wind_tunnel.csv").model) == set(entries) | {"wt-tiny-step0"}
    assert "wt-tiny" in set(pd.read_csv(wd / "results/summary/key_orthogonality.csv").model)
    for m in entries:  # no LLM extraction for wind-tunnel models
        assert sorted(p.name for p in (wd / f"results/{m}/activations").iterdir()) == ["wind_tunnel.h5"]
    for ext in ("png", "pdf"):
        assert (wd / f"results/figures/wind_tunnel.{ext}").stat().st_size > 1000


def test_second_dry_run_schedules_nothing(tiny_run):
    wd, _ = tiny_run
    r = run_smk(wd, "-n")
    assert "Nothing to be done" in r.stdout + r.stderr


def test_lint_is_clean(tiny_run):
    wd, _ = tiny_run
    r = run_smk(wd, "--lint", check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Lints for" not in out, out


def test_report_is_written(tiny_run):
    wd, _ = tiny_run
    run_smk(wd, "--report", str(wd / "report.html"))
    html = (wd / "report.html").read_text(errors="replace")
    assert "intrinsic_dimension" in html and "value_manifold" in html
    assert "sula_calibration" in html and "sula_interventions" in html
    for msg in ("Undefined substitution", "Inline literal start-string", "System Message"):  # issue 11
        assert msg not in html, msg


def test_analysis_param_change_reruns_only_that_analysis(tiny_run):
    wd, cfg = tiny_run
    cfg2 = dict(cfg, value_manifold=dict(cfg["value_manifold"], n_boot=7))
    (wd / "config2.yaml").write_text(yaml.safe_dump(cfg2))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "-d", str(wd), "--configfile",
                                    str(wd / "config2.yaml"), "-n", "--cores", "1"],
                       capture_output=True, text=True, env=env, cwd=wd)
    out = r.stdout
    assert r.returncode == 0, r.stderr
    assert "value_manifold" in out
    assert "extract" not in out.split("Job stats:")[1].split("Reasons")[0]
    assert "intrinsic_dimension  " not in out.split("Job stats:")[1].split("Reasons")[0]


def test_claims_scorecard(tiny_run):
    """Issue 19: the report's first table, a verdict and a reason for every claim and model, never blank."""
    from llmgeom.analyses.claims import VERDICTS, load_claims

    wd, cfg = tiny_run
    card = pd.read_csv(wd / "results/summary/claims.csv", keep_default_na=False)
    assert set(card.claim_id) == {c["id"] for c in load_claims()}
    assert card.verdict.isin(VERDICTS).all() and (card.reason.str.len() > 0).all()
    absent = [t for t in set(card.table) if not (wd / f"results/summary/{t}.csv").exists()]
    assert (card[card.table.isin(absent)].reason == "table not produced by this run").all()
    assert (card[~card.table.isin(absent)].reason != "table not produced by this run").all()
    assert "| Verdict | Claim |" in (wd / "results/summary/claims.md").read_text()
    assert len(pd.read_csv(wd / "results/summary/published.csv")) > 50


def test_replicates_reach_the_summary_tables(tiny_run):
    """Issue 48 point 4: the cross-model tables the claims read carry <col>_replicates beside each bootstrap interval
    (aggregate and bayes_tables pass them through), the replicates reproduce the interval, and the Markdown
    renderings do not print them."""
    import llmgeom
    from replicate_checks import assert_replicates_reproduce

    wd, cfg = tiny_run

    def ci(section):
        return {**llmgeom.defaults(section), **(cfg.get(section) or {})}.get("ci", 0.95)

    def table(name):
        return pd.read_csv(wd / f"results/summary/{name}.csv")

    shares, r = (0.0, 1.0), (-1.0, 1.0)
    t2 = table("table2")
    t2 = t2[t2.source.isin(["llm", "null_model"]) & t2.pc12_mixed.notna()]
    cases = [(t2, c, ci("domain_restriction"), shares) for c in ("pc12_mixed", "pc12_restricted")]
    cases += [(t2, "delta_pc12", ci("domain_restriction"), None), (t2, "focusing_pct", ci("attention_focusing"), None)]
    s = table("sula")
    s = s[(s.condition == "main") & (s.k.astype(str) == "all")]
    cases += [(s, "mae_bits", ci("sula"), (0.0, np.inf)), (s, "pearson_r", ci("sula"), r)]
    iv = table("sula_interventions")
    cases += [(iv, "delta_mae_bits", ci("interventions"), None), (iv, "pc1_corr_final", ci("interventions"), r)]
    cases += [(table("decoding"), "delta_nll_adaptive_vs_single", 0.95, None),
              (table("rate_distortion"), "k_rd", 0.95, None)]
    for df, col, c, bounds in cases:
        assert assert_replicates_reproduce(df, col, ci=c, bounds=bounds) > 0, col
    assert t2.focusing_rho_replicates.notna().all()
    md = (wd / "results/summary/table2.md").read_text() + (wd / "results/summary/table1.md").read_text()
    assert t2.pc12_mixed_replicates.iloc[0].split()[0] not in md


def test_null_models_and_front_page(tiny_run):
    """Issue 28: every model's random-init twin runs the prompt sets and analyses the claims read (and nothing
    else); every scorecard row carries its null's value and verdict and a specific flag; the front page shows the
    headline counts and the verdict matrix."""
    from llmgeom.analyses.claims import HEADLINE, headline

    wd, cfg = tiny_run
    for m in cfg["models"]:
        twin = f"{m}-randinit"
        man = json.loads((wd / f"resources/models/{twin}/manifest.json").read_text())
        assert man["source"] == "random_init" and man["null_of"] == m and man["seed"] == 0
        acts = sorted(p.name for p in (wd / f"results/{twin}/activations").iterdir())
        assert acts == ["corpus.h5", "domain_mathematics.h5", "mixed.h5", "sula_main.h5"]  # no SULA controls
        assert not (wd / f"results/{twin}/tables/value_manifold.csv").exists()  # no claim reads it
        assert (wd / f"results/{twin}/interventions/sula_interventions.csv").is_file()
    card = pd.read_csv(wd / "results/summary/claims.csv", keep_default_na=False)
    assert not card.model.str.endswith("-randinit").any()  # nulls are columns, not rows
    assert (card.null_verdict != "").all() and (card.null_reason != "").all()
    assert card.specific.astype(str).isin(["True", "False"]).all()
    llm = card[card.model.isin(list(cfg["models"])) & (card.table == "expressibility_gap")]
    assert set(llm.null_model) == {f"{m}-randinit" for m in cfg["models"]}
    assert llm.null_verdict.isin(["supported", "not supported", "inconclusive"]).all()  # decided like any row
    page = (wd / "results/index.html").read_text()
    for k, v in headline(card).items():
        assert f"{k}: <b>{v}</b>" in page
    assert set(headline(card)) == set(HEADLINE) and '<table class="vm">' in page  # the matrix as real text
    for m in cfg["models"]:  # every model's column beside its twin's
        assert f"<th class=\"m\">{m.replace('-', '-<wbr>')}</th><th class=\"n\">{m.replace('-', '-<wbr>')}-<wbr>randinit" in page
    assert (wd / "results/figures/claims_matrix.png").stat().st_size > 1000


def test_scaling_table_and_figures(tiny_run):
    """Issue 42: scaling.csv has one row per statistic and model (the two tiny models, their twins) plus the papers'
    models; sizes from the configs; the across-size claims are decided on it (inconclusive on two models)."""
    from llmgeom.analyses.scaling import STATISTICS

    wd, cfg = tiny_run
    df = pd.read_csv(wd / "results/summary/scaling.csv", keep_default_na=False, na_values=[""])
    ours = df[df.source != "published"]
    models = sorted(cfg["models"]) + [f"{m}-randinit" for m in sorted(cfg["models"])]
    names = [s.name for s in STATISTICS]
    assert sorted(zip(ours.statistic, ours.model)) == sorted((s, m) for s in names for m in models)
    sizes = ours.groupby("model").n_params.unique()
    assert sizes["tiny-llama"].tolist() == [24736] and sizes["tiny-gpt2"].tolist() == [61312]
    assert (ours.groupby("model").d_model.first() == 32).all()
    twin = ours[(ours.source == "measured") & ours.twin_value.notna()]
    assert len(twin) and (twin.twin_model == twin.model + "-randinit").all()
    assert (df[df.source == "published"].n_params > 1e8).all()
    pc = ours[ours.statistic == "pc12_mixed_unit_norm"]
    assert pc.value.between(0, 1).all() and pc.lo.notna().all()  # unit-norm shares with their interval
    for s in names:
        assert (wd / f"results/figures/scaling/{s}.png").stat().st_size > 1000
    card = pd.read_csv(wd / "results/summary/claims.csv", keep_default_na=False)
    rank = card[(card.table == "scaling") & card.rule.str.startswith(("size_trend", "size_constancy"))]
    assert len(rank) >= 8 and (rank.verdict == "inconclusive").all()
    assert rank.reason.str.contains("needs at least 4").all() and (rank.null_verdict == "inconclusive").all()
    # each decided on the total parameter count and, as a sensitivity row, on the non-embedding count
    assert sorted(set(rank.setting.str.extract(r"x=(\w+)")[0])) == ["n_params", "n_params_non_embedding"]
    assert (rank.sensitivity.astype(str) == (rank.setting.str.contains("non_embedding")).astype(str)).all()
    # a stability in [0, 1] for every decided row
    dec = card[card.verdict.isin(["supported", "not supported"])]
    st = pd.to_numeric(dec.stability, errors="coerce")
    assert st.between(0, 1).all(), dec[~st.between(0, 1)][["claim_id", "model", "stability_basis"]]


def test_headline_values_within_the_tiny_studys_reference(tiny_run):
    """The tiny study's headline values (llmgeom.analyses.drift: scaling.csv's headline statistics per model and
    twin, every verdict) stay within .test/reference/tiny-study.csv: a change that moves one fails here until the
    reference is rewritten with its reason (docs/testing.md, "Headline reference"); the front page says so."""
    from llmgeom.analyses.drift import HEADLINE_STATISTICS, REFERENCE_COLUMNS, read_reference

    wd, cfg = tiny_run
    ref_path = cfg["reference"]["path"]
    assert ref_path.endswith(".test/reference/tiny-study.csv")
    ref = read_reference(ref_path)
    assert list(ref.columns) == REFERENCE_COLUMNS
    d = pd.read_csv(wd / "results/summary/drift.csv", keep_default_na=False)
    assert {s.split("[")[0] for s in d.statistic if not s.startswith("verdict:")} == set(HEADLINE_STATISTICS)
    assert d.statistic.str.startswith("verdict:").sum() > len(cfg["models"])
    bad = d[d.within.astype(str) != "True"]
    listing = "\n".join(f"  {r.statistic} / {r.model}: reference {r.reference}, value {r.value} "
                        f"(tolerance {r.tolerance}): {r.note}" for r in bad.itertuples())
    assert not len(bad), (
        f"{len(bad)} headline values of the tiny study left .test/reference/tiny-study.csv:\n{listing}\n"
        "If the change is meant to move them, rewrite the reference in the same commit, with the reason:\n"
        "  snakemake --directory .test --cores 2 && PYTHONPATH=src python -m llmgeom.analyses.drift "
        "--write-reference .test/results/summary .test/reference/tiny-study.csv --reason '<why>'")
    page = (wd / "results/index.html").read_text()
    assert f"All {len(d)} headline values within their tolerance of the reference" in page
