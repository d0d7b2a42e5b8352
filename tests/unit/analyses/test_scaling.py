"""The scaling study (issue 42): the exact rank test and the across-size rules on known answers (n too small,
ties, constant input), the unit-norm value-manifold shares, parameter counts from a config, and scaling.csv read
from the cross-model tables (never recomputed) beside the twins and the papers' models."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from scipy.stats import norm

from llmgeom.analyses.claims import (ClaimsDataError, claims_table, equivalence_bound, headline, min_rank_models,
                                     size_slope, slope_quantile)
from llmgeom.analyses.scaling import COLUMNS, STATISTICS, TABLES, scaling_table
from llmgeom.core.published import PublishedDataError, load_published, load_published_models, model_key
from llmgeom.core.stats import replicates_text, spearman, spearman_exact
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

def _across(tmp_path, rule: dict, values, sizes=(1e8, 2e8, 5e8, 1.5e9), *, rel=0.02, card=False, nulls=None,
            **cols):
    """The claim decided on a scaling table of ``values`` at ``sizes``, each with the interval value * (1 -+ rel)."""
    claim = dict(id="c", sentence="s", paper="lsm", section="sec. 1", table="scaling", value="value", lo="lo", hi="hi",
                 scope="across_models", where={"source": "measured"}, rule=rule)
    p = tmp_path / f"claims_{len(list(tmp_path.iterdir()))}.yaml"
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    n = len(values)
    v = np.asarray(values, float)
    t = pd.DataFrame(dict(model=[f"m{i}" for i in range(n)], source="measured", n_params=list(sizes)[:n],
                          value=v, lo=v * (1 - rel), hi=v * (1 + rel), **{k: list(c) for k, c in cols.items()}))
    if nulls is not None:  # the twins' series: the same sizes
        w = np.asarray(nulls, float)
        t = pd.concat([t, pd.DataFrame(dict(model=[f"m{i}-r" for i in range(n)], source="null_model",
                                            n_params=list(sizes)[:n], value=w, lo=w * (1 - rel), hi=w * (1 + rel),
                                            **{k: list(c) for k, c in cols.items()}))], ignore_index=True)
    out = claims_table({"scaling": t}, models=[f"m{i}" for i in range(n)], path=str(p),
                       nulls={f"m{i}-r": f"m{i}" for i in range(n)} if nulls is not None else None)
    assert out.reason.astype(bool).all()
    return out if card else out.iloc[0]


Z95, Z90 = 1.959963984540054, 1.6448536269514722
RISE = {"kind": "size_trend", "expected": "increasing", "x": "n_params", "alpha": 0.05}
CONST = {"kind": "size_constancy", "bound": 0.1, "x": "n_params", "alpha": 0.05}
SIZES = np.array([1e8, 2e8, 5e8, 1.5e9])


def _propagated_sd(rel, sizes=SIZES):
    """The slope's sd from equal per-model errors alone: se / sqrt(sum (x - mean x)^2), se = rel / z95 (ln scale)."""
    x = np.log(sizes)
    return (rel / Z95) / np.sqrt(((x - x.mean()) ** 2).sum())


def test_size_slope_known_answers():
    x = np.log(SIZES)
    b, sd, dof = size_slope(x, 0.3 * x + 1.0, np.full(4, 0.01))  # an exact power law: slope 0.3, no scatter
    assert b == pytest.approx(0.3) and sd == pytest.approx(0.01 / np.sqrt(((x - x.mean()) ** 2).sum())) and dof == math.inf
    # scatter beyond the per-model errors inflates sd by sqrt(reduced chi-square) (Birge ratio)
    y = 0.3 * x + np.array([0.1, -0.1, -0.1, 0.1])
    b, sd, dof = size_slope(x, y, np.full(4, 0.01))
    fit = np.polyfit(x, y, 1)
    chi2 = (((y - np.polyval(fit, x)) / 0.01) ** 2).sum()
    assert b == pytest.approx(fit[0]) and sd == pytest.approx(0.01 / np.sqrt(((x - x.mean()) ** 2).sum())
                                                              * np.sqrt(chi2 / 2))
    assert dof == 2  # the variance estimated from the residuals: Student's t with n - 2 df
    assert slope_quantile(0.95, 2) == pytest.approx(2.919986) and slope_quantile(0.95, math.inf) == pytest.approx(Z90)
    assert all(math.isnan(v) for v in size_slope(x[:2], x[:2], [0.1, 0.1]))


def test_size_trend_known_answers_rising_falling_noisy_and_flat(tmp_path):
    rising = 0.5 * (SIZES / 1e8) ** 0.1  # slope 0.1, tight intervals: supported
    r = _across(tmp_path, RISE, rising)
    assert r.verdict == "supported" and r.measured == pytest.approx(0.1)
    assert r.measured_lo == pytest.approx(0.1 - Z90 * _propagated_sd(0.02))
    assert "exact one-sided rank p = 0.0417" in r.reason and "power not computed" in r.reason
    r = _across(tmp_path, RISE, rising[::-1])  # the same series falling: decided the other way
    assert r.verdict == "not supported" and r.measured < 0
    assert _across(tmp_path, dict(RISE, expected="decreasing"), rising[::-1]).verdict == "supported"
    # the same rise inside wide intervals (+-50%): noise could give it, inconclusive
    r = _across(tmp_path, RISE, rising, rel=0.5)
    assert r.verdict == "inconclusive" and r.measured_lo < 0 < r.measured_hi
    # a noisy series whose scatter exceeds its intervals: the Birge ratio widens the slope's interval
    noisy = rising * np.array([1.3, 0.75, 1.3, 0.8])
    r = _across(tmp_path, RISE, noisy)
    assert r.verdict == "inconclusive" and (r.measured_hi - r.measured_lo) > 20 * 2 * Z90 * _propagated_sd(0.02)
    r = _across(tmp_path, RISE, [0.5] * 4)  # flat: slope 0
    assert r.verdict == "inconclusive" and r.measured == pytest.approx(0.0, abs=1e-12)
    # power against the published models' own slope (LSM Table 3's medians)
    r = _across(tmp_path, dict(RISE, alternative_from="lsm_table3_median_margin"), rising)
    assert "power at n = 4:" in r.reason and "against the published slope" in r.reason


def test_size_rules_refuse_what_they_cannot_decide(tmp_path):
    for rule in (RISE, CONST):
        r = _across(tmp_path, rule, [0.49, 0.55, 0.64])  # 3 models
        assert r.verdict == "inconclusive" and "needs at least 4" in r.reason and "3 model(s)" in r.reason
        r = _across(tmp_path, rule, [0.49, np.nan, 0.55, 0.64])  # a NaN value leaves 3 models
        assert r.verdict == "inconclusive" and "3 model(s)" in r.reason
        r = _across(tmp_path, rule, [0.4, 0.5, 0.6, 0.7], sizes=(1e8,) * 4)
        assert r.verdict == "inconclusive" and "same n_params" in r.reason
        r = _across(tmp_path, rule, [0.0, 0.5, 0.6, 0.7])
        assert r.verdict == "inconclusive" and "positive" in r.reason
        r = _across(tmp_path, rule, [0.4, 0.5, 0.6, 0.7], rel=0.0)  # no interval: not decided against noise
        assert r.verdict == "inconclusive" and "no interval for m0, m1, m2, m3" in r.reason
    r = _across(tmp_path, dict(RISE, min_models=5), [0.49, 0.51, 0.55, 0.64])
    assert r.verdict == "inconclusive" and "needs at least 5" in r.reason


def test_size_constancy_is_an_equivalence_test(tmp_path):
    r = _across(tmp_path, CONST, [0.05] * 4)  # flat, tight: the slope's 90% interval inside (-0.1, 0.1)
    assert r.verdict == "supported" and r.measured == pytest.approx(0.0, abs=1e-12)
    assert r.measured_hi == pytest.approx(Z90 * _propagated_sd(0.02))
    power = 2 * norm.cdf(0.1 / _propagated_sd(0.02) - Z90) - 1
    assert f"power at n = 4: {power:.2f} were the slope 0" in r.reason and "rank p" in r.reason
    r = _across(tmp_path, CONST, [0.05] * 4, rel=0.5)  # flat but noisy: constancy not shown (absence of evidence)
    assert r.verdict == "inconclusive" and "constancy not shown" in r.reason
    r = _across(tmp_path, CONST, 0.05 * (SIZES / 1e8) ** 0.3)  # a clear trend beyond the bound: denied
    assert r.verdict == "not supported" and r.measured_lo > 0.1
    # the hard core of the scaling study (0.0717 -> 0.0842, monotone, 135M-1.5B): a slope of ~0.065, inside
    # LSM's own spread (Table 4: 0.041-0.055 over 124M-1.5B, B = ln(0.055/0.041) / ln(1.5e9/124e6)) when each
    # model's interval is +-2%, and at the same time a decided rise
    hc, hs = [0.0717, 0.0725, 0.0760, 0.0842], (1.35e8, 2.68e8, 4.94e8, 1.54e9)
    r = _across(tmp_path, dict(CONST, bound=None, bound_from="lsm_table4_margin_q05"), hc, sizes=hs)
    b = np.log(0.055 / 0.041) / np.log(1.5e9 / 124e6)
    assert f"B = {b:.4g}" in r.reason and r.verdict == "supported" and 0.05 < r.measured < 0.08
    assert _across(tmp_path, RISE, hc, sizes=hs).verdict == "supported"
    grows = dict(CONST, grows="d_model")
    r = _across(tmp_path, grows, [11.0, 11.2, 10.9, 11.1], d_model=[576, 640, 896, 1536])
    assert r.verdict == "supported" and "d_model grows with slope" in r.reason
    r = _across(tmp_path, grows, [11.0, 11.2, 10.9, 11.1], d_model=[32, 32, 32, 32])  # d_model does not grow
    assert r.verdict == "inconclusive" and "d_model grows with slope 0" in r.reason
    with pytest.raises(ClaimsDataError, match="bound_from"):
        _across(tmp_path, dict(CONST, bound=None), [0.05] * 4)


def test_equivalence_bound_is_the_published_models_own_spread():
    b, text = equivalence_bound("lsm_table4_margin_q05")
    assert b == pytest.approx(np.log(0.055 / 0.041) / np.log(1.5e9 / 124e6)) and "6 published models" in text
    b, _ = equivalence_bound("lsm_table2_twonn_peak")
    assert b == pytest.approx(np.log(22.1 / 19.2) / np.log(1.5e9 / 124e6))
    assert math.isnan(equivalence_bound("no_such_quantity")[0])


def test_an_across_size_claim_stands_beside_its_twins_series_and_an_undecided_null_is_no_contrast(tmp_path):
    rising = 0.5 * (SIZES / 1e8) ** 0.1
    card = _across(tmp_path, RISE, rising, nulls=[0.5, 0.5, 0.5, 0.5], card=True)  # twins flat: inconclusive
    r = card[card.setting == ""].iloc[0] if (card.setting == "").any() else card.iloc[0]
    assert r.verdict == "supported" and r.null_verdict == "inconclusive" and str(r.specific) == "False"
    assert "undecided null is no contrast" in r.specific_reason
    card = _across(tmp_path, RISE, rising, nulls=rising[::-1], card=True)  # twins fall: decided and different
    assert card.iloc[0].null_verdict == "not supported" and str(card.iloc[0].specific) == "True"
    card = _across(tmp_path, RISE, rising, nulls=rising * 2, card=True)  # twins rise too: not specific
    assert card.iloc[0].null_verdict == "supported" and str(card.iloc[0].specific) == "False"


def test_the_size_axis_is_stated_with_a_sensitivity_row(tmp_path):
    ne = [2e7, 1.8e8, 3e8, 1.3e9]  # non-embedding counts: the smallest two swap places with the total
    card = _across(tmp_path, dict(RISE, sensitivity_x="n_params_non_embedding"), 0.5 * (SIZES / 1e8) ** 0.1,
                   card=True, n_params_non_embedding=ne)
    assert list(card.setting) == ["x=n_params", "x=n_params_non_embedding"]
    assert list(card.sensitivity) == [False, True] and "vs n_params_non_embedding" in card.reason.iloc[1]
    assert headline(card)["specific finding"] + sum(headline(card).values()) == 1  # the sensitivity row not counted


def test_stability_re_decides_over_the_replicates(tmp_path):
    """Per model: a threshold claim (value > 0.7) whose replicates lie above 0.7 in 9 of 10 resamples has stability
    0.9 when supported; across models, replicate b of every model's value re-decides the slope rule."""
    claim = dict(id="c", sentence="s", paper="lsm", section="sec. 1", table="t", value="v", lo="v_lo", hi="v_hi",
                 rule={"kind": "threshold", "op": ">", "threshold": 0.7})
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    reps = [0.8] * 9 + [0.6]
    t = pd.DataFrame(dict(model=["a", "b"], v=[0.8, 0.8], v_lo=[0.75, 0.75], v_hi=[0.85, 0.85],
                          v_replicates=[replicates_text(reps), ""]))
    card = claims_table({"t": t}, models=["a", "b"], path=str(p)).set_index("model")
    # resample 10: 0.6 with the interval shifted with it ([0.55, 0.65]): not supported
    assert card.loc["a", "verdict"] == "supported" and card.loc["a", "stability"] == pytest.approx(0.9)
    assert card.loc["a", "stability_n"] == 10 and "10 resamples of t.v_replicates" in card.loc["a", "stability_basis"]
    assert math.isnan(card.loc["b", "stability"]) and "no replicates" in card.loc["b", "stability_basis"]
    # across models: every resample of the rising series still rises -> 1.0
    rising = 0.5 * (SIZES / 1e8) ** 0.1
    claim = dict(id="c", sentence="s", paper="lsm", section="sec. 1", table="scaling", value="value", lo="lo", hi="hi",
                 scope="across_models", rule=RISE)
    p = tmp_path / "c2.yaml"  # the claims file is cached by path
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    rng = np.random.default_rng(0)
    t = pd.DataFrame(dict(model=list("abcd"), n_params=SIZES, value=rising, lo=rising * 0.98, hi=rising * 1.02,
                          value_replicates=[replicates_text(v * (1 + 0.01 * rng.standard_normal(50))) for v in rising]))
    r = claims_table({"scaling": t}, models=list("abcd"), path=str(p)).iloc[0]
    assert r.verdict == "supported" and r.stability == pytest.approx(1.0) and r.stability_n == 50
    # a weights-only claim is stable by construction; an undecided row has no stability
    claim = dict(claim, scope="per_model", table="t", value="v", lo="v_lo", hi="v_hi",
                 rule={"kind": "threshold", "op": ">", "threshold": 0.8}, resampling="none: weights")
    p = tmp_path / "c3.yaml"
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    t = pd.DataFrame(dict(model=["a", "b"], v=[0.9, 0.8], v_lo=[0.85, 0.75], v_hi=[0.95, 0.85]))
    card = claims_table({"t": t}, models=["a", "b"], path=str(p)).set_index("model")
    assert card.loc["a", "stability"] == 1.0 and card.loc["a", "stability_basis"] == "none: weights"
    assert card.loc["b", "verdict"] == "inconclusive" and math.isnan(card.loc["b", "stability"])


def test_headline_counts_only_stable_specific_findings():
    card = pd.DataFrame(dict(verdict=["supported"] * 4, specific=["True", "True", "True", "False"],
                             stability=[0.95, 0.5, np.nan, 1.0], sensitivity=[False] * 4))
    h = headline(card)
    assert (h["specific finding"], h["specific, unstable"], h["supported, not specific"]) == (1, 2, 1)


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


def test_stability_of_a_category_re_decides_over_its_label_replicates(tmp_path):
    claim = dict(id="c", sentence="s", paper="lsm", section="sec. 1", table="t", value="shape",
                 rule={"kind": "category_in", "values": ["rise-then-fall"]})
    p = tmp_path / "cat.yaml"
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    t = pd.DataFrame(dict(model=["a"], shape=["rise-then-fall"],
                          shape_replicates=[" ".join(["rise-then-fall"] * 3 + ["increasing"])]))
    r = claims_table({"t": t}, models=["a"], path=str(p)).iloc[0]
    assert r.verdict == "supported" and r.stability == pytest.approx(0.75) and r.stability_n == 4


def test_stability_leaves_out_undefined_resamples_and_removes_the_bootstrap_bias(tmp_path):
    """A resample whose statistic is undefined (NaN) is left out, not counted as a flip; and the resampling spread is
    read around the estimate: replicates all shifted by a bias (+0.3 here) re-decide like unshifted ones."""
    claim = dict(id="c", sentence="s", paper="lsm", section="sec. 1", table="t", value="v", lo="v_lo", hi="v_hi",
                 rule={"kind": "threshold", "op": ">", "threshold": 0.7})
    p = tmp_path / "nan.yaml"
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    t = pd.DataFrame(dict(model=["a", "b"], v=[0.8, 0.8], v_lo=[0.75, 0.75], v_hi=[0.85, 0.85],
                          v_replicates=["0.8 nan nan 0.82", replicates_text(np.array([0.8] * 9 + [0.6]) + 0.3)]))
    card = claims_table({"t": t}, models=["a", "b"], path=str(p)).set_index("model")
    assert card.loc["a", "stability"] == 1.0 and card.loc["a", "stability_n"] == 2
    assert "2 with an undefined value left out" in card.loc["a", "stability_basis"]
    assert card.loc["b", "stability"] == pytest.approx(0.9)  # as without the +0.3 bias


def test_size_trend_power_has_the_sign_of_the_alternative(tmp_path):
    """The published slope of median margin rises (LSM Table 3): against a falling claim its power is ~0."""
    rising = 0.5 * (SIZES / 1e8) ** 0.1
    up = _across(tmp_path, dict(RISE, alternative_from="lsm_table3_median_margin"), rising)
    down = _across(tmp_path, dict(RISE, expected="decreasing", alternative_from="lsm_table3_median_margin"),
                   rising[::-1])
    p_up = float(up.reason.split("power at n = 4: ")[1].split()[0])
    p_down = float(down.reason.split("power at n = 4: ")[1].split()[0])
    assert p_up > 0.5 and p_down < 0.05


def test_stability_holds_a_row_without_a_defined_statistic_fixed(tmp_path):
    """A per-layer rule (interval_contains_reference) where one layer's statistic is undefined (NaN, all replicates
    NaN): that row is held fixed and named, the others re-decide; the resamples are not all thrown away."""
    claim = dict(id="c", sentence="s", paper="lsm", section="sec. 1", table="t", value="k", lo="k_lo", hi="k_hi",
                 rule={"kind": "interval_contains_reference", "reference": "ref", "min_share": 0.5})
    p = tmp_path / "rd.yaml"
    p.write_text(yaml.safe_dump({"claims": [claim]}))
    t = pd.DataFrame(dict(model="a", layer=[1, 2, 3], k=[5.0, 5.0, np.nan], k_lo=[4.0, 4.0, np.nan],
                          k_hi=[6.0, 6.0, np.nan], ref=[5.0, 5.0, 5.0],
                          k_replicates=[replicates_text([5.0, 5.1, 4.9]), replicates_text([5.0, 5.1, 4.9]),
                                        "nan nan nan"]))
    r = claims_table({"t": t}, models=["a"], path=str(p)).iloc[0]
    assert r.verdict == "supported" and r.stability == 1.0 and r.stability_n == 3
    assert "held fixed" in r.stability_basis and "layer=3" in r.stability_basis
