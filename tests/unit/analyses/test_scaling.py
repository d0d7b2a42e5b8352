"""The scaling study (issue 42): the exact rank test and the across-size rules on known answers (n too small,
ties, constant input), the unit-norm value-manifold shares, parameter counts from a config, and scaling.csv read
from the cross-model tables (never recomputed) beside the twins and the papers' models."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from llmgeom.analyses.claims import claims_table, min_rank_models
from llmgeom.analyses.scaling import COLUMNS, STATISTICS, TABLES, scaling_table
from llmgeom.core.published import PublishedDataError, load_published, load_published_models, model_key
from llmgeom.core.stats import spearman, spearman_exact
from llmgeom.measures.pca import ValueManifoldPCA, unit_rows

from conftest import TEST_DIR


# ------------------------------------------------------------------------------------------ exact rank test

def test_spearman_exact_known_answers():
    assert spearman_exact([1, 2, 3, 4], [1, 2, 3, 4], alternative="greater") == pytest.approx((1.0, 1 / 24))
    assert spearman_exact([1, 2, 3, 4], [4, 3, 2, 1], alternative="less") == pytest.approx((-1.0, 1 / 24))
    assert spearman_exact([1, 2, 3, 4], [4, 3, 2, 1], alternative="greater")[1] == pytest.approx(1.0)
    assert spearman_exact([1, 2, 3, 4], [1, 2, 3, 4])[1] == pytest.approx(2 / 24)  # two-sided
    # ties: ranks [1.5, 1.5, 3.5, 3.5]; rho = 4 / (2 sqrt 5); 4 of the 24 pairings are as extreme
    assert spearman_exact([1, 2, 3, 4], [1, 1, 2, 2], alternative="greater") == pytest.approx((2 / math.sqrt(5), 1 / 6))
    # the statistic is SciPy's Spearman rho, ties included
    x, y = [3, 1, 4, 1.5, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1]
    assert spearman_exact(x, y)[0] == pytest.approx(spearman(x, y)[0])
    # above max_exact: 9,999 seeded random pairings, reproducible
    a = spearman_exact(range(10), [1, 3, 2, 5, 4, 7, 6, 9, 8, 10], alternative="greater")
    assert a == spearman_exact(range(10), [1, 3, 2, 5, 4, 7, 6, 9, 8, 10], alternative="greater") and a[1] < 0.001


@pytest.mark.parametrize("x, y", [([1, 2, 3, 4], [2, 2, 2, 2]), ([5, 5, 5, 5], [1, 2, 3, 4]), ([1, 2], [1, 2]),
                                  ([1, 2, 3, np.nan], [1, 2, 3, 4])])
def test_spearman_exact_undefined_is_nan(x, y):
    assert all(math.isnan(v) for v in spearman_exact(x, y, alternative="greater"))


def test_spearman_exact_rejects_an_unknown_alternative():
    with pytest.raises(ValueError, match="alternative"):
        spearman_exact([1, 2, 3], [1, 2, 3], alternative="up")


def test_min_rank_models_is_the_smallest_n_with_one_over_n_factorial_below_alpha():
    assert min_rank_models(0.05) == 4  # 1/6 = 0.167 >= 0.05 > 1/24 = 0.042
    assert min_rank_models(0.01) == 5  # 1/120 = 0.0083
    assert min_rank_models(0.5) == 3


# ------------------------------------------------------------------------------------------ across-size rules

def _across(tmp_path, rule: dict, values, sizes=(1e8, 2e8, 5e8, 1.5e9), **cols) -> pd.Series:
    claim = dict(id="c", sentence="s", paper="lsm", section="sec. 1", table="scaling", value="value",
                 scope="across_models", where={"source": "measured"}, rule=rule)
    p = tmp_path / f"claims_{len(list(tmp_path.iterdir()))}.yaml"
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    n = len(values)
    t = pd.DataFrame(dict(model=[f"m{i}" for i in range(n)], source="measured", n_params=list(sizes)[:n],
                          value=list(values), **{k: list(v) for k, v in cols.items()}))
    card = claims_table({"scaling": t}, models=list(t.model), path=str(p))
    assert len(card) == 1 and card.reason.iloc[0]
    return card.iloc[0]


RISE = {"kind": "rank_trend", "expected": "increasing", "x": "n_params", "alpha": 0.05}


def test_rank_trend_known_answers(tmp_path):
    r = _across(tmp_path, RISE, [0.49, 0.51, 0.55, 0.64])
    assert r.verdict == "supported" and r.measured == pytest.approx(1.0)
    assert "n = 4" in r.reason and "0.0417" in r.reason and "weak" in r.reason
    r = _across(tmp_path, RISE, [0.64, 0.55, 0.51, 0.49])  # significant the other way
    assert r.verdict == "not supported" and r.measured == pytest.approx(-1.0)
    r = _across(tmp_path, dict(RISE, expected="decreasing"), [0.64, 0.55, 0.51, 0.49])
    assert r.verdict == "supported"
    r = _across(tmp_path, RISE, [0.49, 0.55, 0.51, 0.64])  # rho = 0.8: rho >= 0.8 in 4 of 24 pairings
    assert r.verdict == "inconclusive" and r.measured == pytest.approx(0.8) and "p = 0.167" in r.reason
    r = _across(tmp_path, RISE, [0.5, 0.5, 0.6, 0.6])  # ties: rho = 0.894, p = 4/24
    assert r.verdict == "inconclusive" and r.measured == pytest.approx(2 / math.sqrt(5))


def test_rank_trend_too_few_models_constant_input_and_nan(tmp_path):
    r = _across(tmp_path, RISE, [0.49, 0.55, 0.64])  # 3 models: no ordering reaches p < 0.05
    assert r.verdict == "inconclusive" and "needs at least 4" in r.reason and "3 model(s)" in r.reason
    r = _across(tmp_path, RISE, [0.49, 0.55])
    assert r.verdict == "inconclusive" and "2 model(s)" in r.reason
    r = _across(tmp_path, RISE, [0.5, 0.5, 0.5, 0.5])  # constant values
    assert r.verdict == "inconclusive" and "undefined" in r.reason and math.isnan(r.measured)
    r = _across(tmp_path, RISE, [0.4, 0.5, 0.6, 0.7], sizes=(1e8,) * 4)  # constant sizes
    assert r.verdict == "inconclusive" and "undefined" in r.reason
    r = _across(tmp_path, RISE, [0.49, np.nan, 0.55, 0.64])  # a NaN value leaves 3 models
    assert r.verdict == "inconclusive" and "3 model(s)" in r.reason
    r = _across(tmp_path, dict(RISE, min_models=5), [0.49, 0.51, 0.55, 0.64])
    assert r.verdict == "inconclusive" and "needs at least 5" in r.reason


CONST = {"kind": "constant_across_models", "max_ratio": 1.5, "x": "n_params", "alpha": 0.05}


def test_constant_across_models_known_answers(tmp_path):
    r = _across(tmp_path, CONST, [0.041, 0.050, 0.048, 0.055])  # LSM's m0.05: max / min = 1.34
    assert r.verdict == "supported" and r.measured == pytest.approx(0.055 / 0.041) and "weak" in r.reason
    r = _across(tmp_path, CONST, [0.02, 0.04, 0.05, 0.08])
    assert r.verdict == "not supported" and r.measured == pytest.approx(4.0)
    r = _across(tmp_path, CONST, [0.05] * 4)  # constant input: exactly constant
    assert r.verdict == "supported" and r.measured == pytest.approx(1.0)
    r = _across(tmp_path, CONST, [0.0, 0.04, 0.05, 0.05])
    assert r.verdict == "inconclusive" and "<= 0" in r.reason
    r = _across(tmp_path, CONST, [0.04, 0.05])
    assert r.verdict == "inconclusive" and "needs at least 4" in r.reason
    r = _across(tmp_path, CONST, [0.04, 0.05, 0.05, 0.045], sizes=(1e8,) * 4)
    assert r.verdict == "inconclusive" and "same n_params" in r.reason
    grows = dict(CONST, grows="d_model")
    r = _across(tmp_path, grows, [19.2, 21.7, 20.2, 22.1], d_model=[576, 640, 896, 1536])
    assert r.verdict == "supported" and "d_model grows 2.667x" in r.reason
    r = _across(tmp_path, grows, [19.2, 21.7, 20.2, 22.1], d_model=[32, 32, 32, 32])  # d_model does not grow
    assert r.verdict == "inconclusive" and "grows only 1x" in r.reason


def test_an_across_size_claim_stands_beside_its_twins_series(tmp_path):
    claim = dict(id="c", sentence="s", paper="lsm", section="sec. 1", table="scaling", value="value",
                 scope="across_models", where={"source": "measured"}, rule=RISE)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    sizes = [1e8, 2e8, 5e8, 1.5e9]
    t = pd.DataFrame(dict(model=["a", "b", "c", "d", "a-r", "b-r", "c-r", "d-r"], n_params=sizes * 2,
                          source=["measured"] * 4 + ["null_model"] * 4, value=[1, 2, 3, 4, 2, 2, 2, 2]))
    nulls = {f"{m}-r": m for m in "abcd"}
    r = claims_table({"scaling": t}, models=list("abcd"), path=str(p), nulls=nulls).iloc[0]
    assert r.verdict == "supported" and r.null_verdict == "inconclusive" and str(r.specific) == "True"


# ------------------------------------------------------------------------------------------ unit-norm shares

def test_unit_norm_removes_a_pc1_that_only_follows_the_norm():
    """Rows = one fixed direction plus small isotropic noise, scaled by norms spread over two orders of magnitude:
    centred PCA puts nearly all variance on PC1 (the norm); after scaling every row to unit norm it is gone."""
    rng = np.random.default_rng(0)
    u = rng.standard_normal(64)
    X = (u + 0.05 * rng.standard_normal((40, 64))) * np.geomspace(1, 100, 40)[:, None]
    raw = ValueManifoldPCA(standardize=False).fit(X)
    unit = ValueManifoldPCA(standardize=False, unit_norm=True).fit(X)
    assert raw.pc1_ > 0.99 and unit.pc1_ < 0.2
    # invariance: scaling any row leaves the unit-norm fit unchanged, bootstrap intervals included
    Y = X * rng.uniform(0.1, 10, (40, 1))
    a = ValueManifoldPCA(unit_norm=True, n_boot=20, seed=1, ci=0.95).fit(X)
    b = ValueManifoldPCA(unit_norm=True, n_boot=20, seed=1, ci=0.95).fit(Y)
    assert a.pc12_ == pytest.approx(b.pc12_) and a.interval_["pc12"] == pytest.approx(b.interval_["pc12"])
    assert np.allclose(np.linalg.norm(unit_rows(X), axis=1), 1.0)


def test_unit_norm_rejects_a_zero_row():
    X = np.ones((5, 3))
    X[2] = 0
    with pytest.raises(ValueError, match=r"row\(s\) \[2\].*norm 0"):
        ValueManifoldPCA(unit_norm=True).fit(X)


# ------------------------------------------------------------------------------------------ sizes and data

@pytest.mark.parametrize("model, total, embedding, tied", [
    ("tiny-llama", 24736, 2 * 96 * 32, False),  # token embedding and an untied head, 96 x 32 each
    ("tiny-gpt2", 61312, 96 * 32 + 1024 * 32, True),  # tied token embedding (counted once) and 1024 positions
])
def test_parameter_counts_from_config(tmp_path, model, total, embedding, tied):
    import torch
    from transformers import AutoModelForCausalLM

    from llmgeom.models.sources import prepare_model
    from llmgeom.weights.model_size import parameter_counts

    src = TEST_DIR / "models" / model
    prepare_model(model, {"source": "hf_local", "path": str(src), "dtype": "float32"}, tmp_path / model)
    c = parameter_counts(tmp_path / model)
    assert (c["n_params"], c["n_params_embedding"], c["tied_embeddings"]) == (total, embedding, tied)
    assert c["n_params_non_embedding"] == total - embedding and (c["d_model"], c["n_layers"]) == (32, 2)
    # the count of the loaded model's distinct tensors (transformers' own num_parameters)
    assert AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).num_parameters() == total


def test_published_models_and_lsm_tables_are_entered():
    facts = load_published_models()
    pub = load_published()
    for q, n in (("lsm_table2_twonn_peak", 6), ("lsm_table3_slope", 6), ("lsm_table4_margin_q05", 6)):
        es = pub[q]
        assert len(es) == n and all(e["source_kind"] == "paper" and e["model"] for e in es)
        assert all(model_key(e["model"]) in facts for e in es), q
    gpt2 = next(e for e in pub["lsm_table2_utilisation"] if e["model"] == "GPT-2")
    assert gpt2["value"] == pytest.approx(0.025) and facts["gpt2"]["n_params"] == pytest.approx(124e6)
    for m in ("Pythia-410M", "Pythia-12B", "Phi-2", "Llama-3.2-1B", "Mistral-7B"):
        assert facts[model_key(m)]["n_params"] > 1e8


def test_published_models_section_is_checked(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"papers": {}, "values": [], "models": {"X": {"n_params": 1e9}}}))
    with pytest.raises(PublishedDataError, match="models.X: needs n_params and source"):
        load_published_models(str(p))


# ------------------------------------------------------------------------------------------ scaling.csv

def _tables(v_small: float, v_large: float) -> dict:
    """Minimal cross-model tables for two models "s" (small) and "l" (large) and the twin of each."""
    models = ["s", "l", "s-r", "l-r"]
    src = ["llm", "llm", "null_model", "null_model"]
    t2 = pd.DataFrame(dict(model=models + ["Pythia-12B"], source=src + ["published"],
                           pc12_mixed=[v_small, v_large, 0.1, 0.2, 0.19], pc12_mixed_lo=[v_small - 0.01] + [np.nan] * 4,
                           pc12_mixed_hi=[v_small + 0.01] + [np.nan] * 4, orth_mean=0.05, gaussian_expected=0.03))
    idp = pd.DataFrame(dict(model=[m for m in models for _ in range(4)], prompt_set="corpus",
                            quantity=["token_id", "token_id", "last_token_id", "token_id_cross_passage"] * 4,
                            estimator=["twonn", "mle_lb", "twonn", "twonn"] * 4, peak_id=[20.0, 25.0, 99.0, 31.0] * 4,
                            peak_id_lo=[18.0, 22.0, np.nan, 27.0] * 4, peak_id_hi=[23.0, 27.0, np.nan, 35.0] * 4))
    return {"table2": t2, "id_profile": idp}


def test_scaling_table_reads_the_tables_and_sets_twins_and_papers_beside():
    sizes = pd.DataFrame(dict(model=["s", "l"], n_params=[2e9, 1e8], n_params_non_embedding=[1.5e9, 5e7],
                              d_model=[1536, 576], n_layers=[28, 30]))
    df = scaling_table(_tables(0.3, 0.9), sizes, models=["s", "l"], nulls={"s-r": "s", "l-r": "l"})
    assert list(df.columns) == COLUMNS
    pc = df[df.statistic == "pc12_mixed"].set_index("model")
    # trained models sorted by size, then their twins, then the papers' models
    assert list(pc.index[:4]) == ["l", "s", "l-r", "s-r"] and (pc.loc[["l-r", "s-r"], "source"] == "null_model").all()
    assert pc.loc["s", "value"] == 0.3 and (pc.loc["s", "lo"], pc.loc["s", "hi"]) == (0.29, 0.31)
    assert pc.loc["s", "twin_value"] == 0.1 and pc.loc["s", "twin_model"] == "s-r"
    assert pc.loc["s-r", "n_params"] == 2e9 and pc.loc["s-r", "null_of"] == "s"  # a twin has its model's size
    assert pc.loc["Pythia-12B", "source"] == "published" and pc.loc["Pythia-12B", "value"] == pytest.approx(0.19)
    assert pc.loc["Pythia-12B", "n_params"] == 12e9
    mistral = pc.loc["Mistral-7B"]  # a published range: centre, ends as the interval
    assert (mistral.value, mistral.lo, mistral.hi) == pytest.approx((0.175, 0.15, 0.2))
    mle = df[(df.statistic == "mle_token_peak_id") & (df.model == "s")].iloc[0]
    assert mle.value == 25.0 and mle.note == "estimator = mle_lb" and mle.prompt_set == "corpus"
    # one name per quantity: the token-position profile, never the last-token or cross-passage one
    tw = df[(df.statistic == "twonn_token_peak_id") & (df.source == "measured")]
    assert (tw.value == 20.0).all() and (tw.lo == 18.0).all() and (tw.hi == 23.0).all()
    assert tw.interval.str.contains("passage half-samples").all()
    cp = df[(df.statistic == "twonn_cross_passage_peak_id") & (df.source == "measured")]
    assert (cp.value == 31.0).all() and (cp.lo == 27.0).all()
    lt = df[(df.statistic == "twonn_last_token_peak_id") & (df.source == "measured")]
    assert (lt.value == 99.0).all() and lt.lo.isna().all()
    ko = df[(df.statistic == "key_orthogonality") & (df.model == "s")].iloc[0]
    assert ko.reference == 0.03 and "Gaussian W_K" in ko.reference_kind
    # a table the run did not produce: NaN rows that say why, never a missing model
    mg = df[(df.statistic == "margin_median") & (df.source != "published")]
    assert len(mg) == 4 and mg.value.isna().all() and (mg.note == "table margins not produced by this run").all()
    assert {s.name for s in STATISTICS} == set(df.statistic)


def test_scaling_statistics_cover_the_issue():
    names = {s.name for s in STATISTICS}
    for need in ("pc12_mixed", "pc12_restricted", "pc12_mixed_unit_norm", "pc12_restricted_unit_norm",
                 "key_orthogonality", "attention_focusing_pct", "twonn_token_peak_id", "mle_token_peak_id",
                 "twonn_token_peak_relative_depth", "mle_token_peak_relative_depth", "twonn_token_final_id",
                 "mle_token_final_id", "twonn_token_peak_id_over_d_model", "twonn_cross_passage_peak_id",
                 "twonn_last_token_peak_id", "margin_median", "margin_q05", "margin_q25", "margin_q75", "margin_q95",
                 "p_margin_below", "abs_rho_margin_entropy", "eta_slope", "eta_r2",
                 "perplexity", "sula_entropy_mae"):
        assert need in names, need
    assert set(TABLES) == {"table2", "id_profile", "margins", "expressibility_gap", "sula"}
    pub = load_published()
    assert all(s.published in pub for s in STATISTICS if s.published)


@pytest.mark.parametrize("values, log", [((12.0, 9.0, 1.5e5, 2.0e5), True), ((0.15, 0.12, 0.08, 0.06), False),
                                         ((12.0, -3.0, 1.5e5, 2.0e5), False)])
def test_a_panel_spanning_more_than_two_decades_reads_on_a_log_axis(values, log):
    """Perplexity: the twins near 1e5 beside trained models near 10 would flatten the models on a linear axis; a
    positive series spanning more than a factor of 100 gets a log y axis, anything else stays linear."""
    from llmgeom.plots.base import plt
    from llmgeom.plots.scaling import _panel

    g = pd.DataFrame(dict(statistic="perplexity", label="corpus perplexity", unit="perplexity",
                          source=["measured", "measured", "null_model", "null_model"],
                          model=["a", "b", "a-randinit", "b-randinit"], n_params=[1e8, 1e9, 1e8, 1e9],
                          value=values, lo=np.nan, hi=np.nan, reference=np.nan, reference_kind=""))
    fig, ax = plt.subplots()
    _panel(ax, g)
    assert ax.get_yscale() == ("log" if log else "linear")
    plt.close(fig)
