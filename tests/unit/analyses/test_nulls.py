"""Null models (issue 28): the random-init twin, the data-level nulls at the same n and d, the axis-cut claim
decided where it can fail, each claim kind's rule on a null input, and the scorecard's null columns / `specific`."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from llmgeom.analyses.claims import HEADLINE, claims_table, headline
from llmgeom.measures.pca import ValueManifoldPCA, null_shares


# ------------------------------------------------------------------------------------------ twins

def _prepared_tiny(tmp_path, family="llama"):
    from llmgeom.models.sources import prepare_model
    from llmgeom.models.tiny import save_tiny_model_dir

    src = save_tiny_model_dir(family, tmp_path / f"src-{family}", seed=3)
    out = tmp_path / f"prepared-{family}"
    prepare_model("m", {"source": "hf_local", "path": str(src)}, out)
    return src, out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_random_init_twin_is_the_architectures_own_init_under_its_seed(tmp_path, family):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from llmgeom.models.loading import load_prepared
    from llmgeom.models.random_init import prepare_random_init

    src, base = _prepared_tiny(tmp_path, family)
    man = prepare_random_init("m-randinit", base, 5, tmp_path / "twin")
    assert man["source"] == "random_init" and man["null_of"] == "m" and man["seed"] == 5
    assert json.loads((tmp_path / "twin" / "manifest.json").read_text())["null_of"] == "m"
    twin, tok = load_prepared(tmp_path / "twin", dtype="float32", device="cpu")
    trained, tok0 = load_prepared(base, dtype="float32", device="cpu")
    assert twin.config.to_dict()["num_hidden_layers" if family == "llama" else "n_layer"] == \
        trained.config.to_dict()["num_hidden_layers" if family == "llama" else "n_layer"]
    assert tok("a b c")["input_ids"] == tok0("a b c")["input_ids"]  # the same tokenizer
    # the weights: exactly from_config under torch.manual_seed(5), not the trained model's
    torch.manual_seed(5)
    ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
    sd, rd, td = twin.state_dict(), ref.state_dict(), trained.state_dict()
    assert all(torch.equal(sd[k], rd[k]) for k in rd)
    assert any(not torch.equal(sd[k], td[k]) for k in td if td[k].numel() > 1)
    # another seed, another twin
    prepare_random_init("m-randinit", base, 6, tmp_path / "twin6")
    t6, _ = load_prepared(tmp_path / "twin6", dtype="float32", device="cpu")
    assert any(not torch.equal(t6.state_dict()[k], sd[k]) for k in sd if sd[k].numel() > 1)


def test_a_config_without_a_causal_lm_initializer_is_refused_with_the_reason():
    from transformers import T5Config

    from llmgeom.models.random_init import NullModelError, check_random_init
    from llmgeom.models.tiny import tiny_config

    check_random_init(tiny_config("llama"))  # has one
    with pytest.raises(NullModelError, match="model_type 't5' cannot be built from its config"):
        check_random_init(T5Config(d_model=8, d_ff=16, num_layers=1, num_heads=2, vocab_size=32))


def test_null_entries_of_a_config():
    from llmgeom.pipeline.derived import null_entries, null_of_models
    from llmgeom.pipeline.schema import ConfigError

    cfg = {"models": {"a": {}, "b": {}}, "wind_tunnel": {"models": {"wt": {"training": {"steps": 10}, "task": "t",
                                                                          "checkpoints": [5]}}},
           "nulls": {"random_init": True, "seed": 0}}  # the derived values read a config with its defaults filled
    n = null_entries(cfg)
    assert n == {"a-randinit": {"null_of": "a", "kind": "random_init", "seed": 0},
                 "b-randinit": {"null_of": "b", "kind": "random_init", "seed": 0},
                 "wt-step0": {"null_of": "wt", "kind": "step0", "seed": None}}
    assert null_of_models(cfg) == {"a": "a-randinit", "b": "b-randinit", "wt": "wt-step0", "wt-step5": "wt-step0"}
    assert null_entries(dict(cfg, nulls={"random_init": False, "seed": 0})) == {}
    with pytest.raises(ConfigError, match="random-init twin of models.a"):
        null_entries(dict(cfg, models={"a": {}, "a-randinit": {}}))


def test_wind_tunnel_step0_checkpoint_is_the_initialization_and_training_is_unchanged(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from llmgeom.wind_tunnel.train import train_wind_tunnel

    task = {"kind": "bijection", "V": 4, "n_pairs": 3}
    kw = dict(steps=6, batch_size=8, lr=3e-3, warmup_steps=2, weight_decay=0.01, clip_norm=1.0, threads=1, n_val=16,
              schedule="cosine", min_lr_ratio=0.1,
              arch={"family": "llama", "n_layers": 1, "d_model": 16, "n_heads": 2})
    a = train_wind_tunnel(task, tmp_path / "a" / "w", seed=0, checkpoints=[0, 3], log=lambda s: None, **kw)
    b = train_wind_tunnel(task, tmp_path / "b" / "w", seed=0, checkpoints=[], log=lambda s: None, **kw)
    z = AutoModelForCausalLM.from_pretrained(a["checkpoints"][0])
    fa, fb = (AutoModelForCausalLM.from_pretrained(r["model_dir"]) for r in (a, b))
    # saving the step-0 null draws no random number: the trained weights are bit-identical without it
    assert all(torch.equal(x, y) for x, y in zip(fa.state_dict().values(), fb.state_dict().values()))
    # the step-0 null is exactly the initialization the training started from
    from transformers import AutoConfig

    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a["checkpoints"][0]), dtype=torch.float32)
    assert all(torch.equal(z.state_dict()[k], v) for k, v in ref.state_dict().items())
    assert json.loads((a["checkpoints"][0] / "manifest.json").read_text())["step"] == 0
    with pytest.raises(ValueError, match="0..steps"):
        train_wind_tunnel(task, tmp_path / "c" / "w", seed=0, checkpoints=[-1], log=lambda s: None, **kw)


# ------------------------------------------------------------------------------------------ data-level nulls

def test_isotropic_reference_is_horns_parallel_analysis_at_the_same_n_and_d():
    rng = np.random.default_rng(0)
    # the issue's numbers: ~17% at n = 15, d = 1024; ~6.6% at n = 75, d = 192
    assert null_shares(rng.standard_normal((15, 1024)), n_reps=20, seed=1)["pc12_iso"] == pytest.approx(0.17, abs=0.01)
    assert null_shares(rng.standard_normal((75, 192)), n_reps=20, seed=1)["pc12_iso"] == pytest.approx(0.066, abs=0.004)
    # a rank-1 signal plus noise: far above both references; the shuffle destroys the shared direction
    z = rng.standard_normal((60, 1))
    X = z @ rng.standard_normal((1, 100)) + 0.3 * rng.standard_normal((60, 100))
    ns = null_shares(X, n_reps=10, seed=0)
    share = ValueManifoldPCA(standardize=True).fit(X).pc1_
    assert share > 0.6 and ns["pc1_iso"] < 0.1 and ns["pc1_shuffled"] < 0.1
    # the isotropic reference depends only on n and d (and the seed), not on the data
    assert null_shares(X, n_reps=5, seed=3)["pc12_iso"] == null_shares(rng.standard_normal((60, 100)), n_reps=5,
                                                                        seed=3)["pc12_iso"]


def test_null_shares_refuses_what_has_no_shares():
    with pytest.raises(ValueError, match="n_reps"):
        null_shares(np.ones((5, 3)), n_reps=0, seed=0)
    with pytest.raises(ValueError, match="no varying column"):
        null_shares(np.ones((5, 3)), n_reps=2, seed=0)  # constant input: NaN-free refusal, not a number


def test_intrinsic_dimension_nulls_at_the_same_n_and_d():
    from llmgeom.analyses.intrinsic_dimension import _id_nulls
    from llmgeom.measures.intrinsic_dimension import id_subsamples

    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 3)) @ rng.standard_normal((3, 40))  # a 3-dimensional linear manifold in R^40
    kw = dict(estimators=["twonn", "mle_mg"], n_subsamples=1, subsample_size=400, min_points=50, mle_k=20,
              gride_max_rank=64, gride_plateau_tol=0.1)
    got = id_subsamples(X, estimator=kw["estimators"], n_subsamples=1, subsample_size=400, seed=0, min_points=50,
                        mle_k=20, gride_max_rank=64, plateau_tol=0.1)
    nulls = _id_nulls(X, seed=0, **kw)
    for e in kw["estimators"]:
        assert got[e]["id_mean"] == pytest.approx(3, abs=0.6)
        iso, shuf = nulls[e]
        assert iso > 10 and shuf > 10  # noise of the same n and d reads a much larger dimension


def test_curvature_proxy_on_known_geometries():
    from llmgeom.analyses.curvature import known_geometry_references

    r = known_geometry_references(400, 60, 3, 30, seed=0)
    assert r["curvature_flat"] < 1e-10                          # a flat subspace: exactly 0
    assert 1e-4 < r["curvature_sphere"] < 0.2                   # a sphere of the same dimension: > 0, small
    assert r["curvature_iso"] > 0.5                             # no manifold: most variance outside m = 3
    with pytest.raises(ValueError, match="1 <= m < d"):
        known_geometry_references(100, 5, 5, 10)


# ------------------------------------------------------------------------------------------ axis cut

def test_recomputed_pc1_after_an_axis_cut_can_fail():
    """The axis-cut claim is decided on the PC1 recomputed on the edited values: 0 when the cut axis carried all
    of the entropy geometry, high when another direction carries it too (the projection on the cut axis itself is
    constant in both cases: no information)."""
    from llmgeom.interventions.axes import entropy_axis
    from llmgeom.interventions.runner import recomputed_pc1
    from llmgeom.core.stats import pearson

    rng = np.random.default_rng(0)
    n, D = 200, 20
    h = rng.uniform(0, 1, n)
    one = 0.05 * rng.standard_normal((n, D))
    one[:, 0] += 10 * h                            # entropy on one direction only
    two = one.copy()
    two[:, 1] += 6 * h                             # ... and on a second one
    for V, expect_destroyed in ((one, True), (two, False)):
        u = entropy_axis(V, h).u
        cut = V - np.outer(V @ u, u)
        assert np.std(cut @ u) < 1e-9                # the edited projection: constant by construction
        r = abs(pearson(recomputed_pc1(cut, h, 0), h)[0])
        assert (r < 0.1) == expect_destroyed, r
    assert np.isnan(recomputed_pc1(np.ones((5, 3)), h[:5], 0)).all()


# ------------------------------------------------------------------------------------------ rules on nulls

def _claims_file(tmp_path, claims):
    p = tmp_path / "claims.yaml"
    base = dict(sentence="s", paper="paper3", section="sec. 1")
    p.write_text(yaml.safe_dump({"claims": [dict(base, **c) for c in claims]}))
    return str(p)


NULL_CASES = [
    # rule kind, claim fields, the null's table row, the verdict the null must give
    ("threshold", {"value": "x", "rule": {"kind": "threshold", "op": ">", "threshold": 0.7}},
     {"x": "iso"}, "not supported"),
    ("ci_excludes_zero_positive", {"value": "x", "lo": "lo", "hi": "hi", "rule": {"kind": "ci_excludes_zero_positive"}},
     {"x": 0.001, "lo": -0.02, "hi": 0.03}, "inconclusive"),
    ("ci_excludes_zero_negative", {"value": "x", "lo": "lo", "hi": "hi", "rule": {"kind": "ci_excludes_zero_negative"}},
     {"x": 0.001, "lo": -0.02, "hi": 0.03}, "inconclusive"),
    ("sign_of", {"value": "x", "rule": {"kind": "sign_of", "expected": "negative", "p": "p", "alpha": 0.05}},
     {"x": -0.05, "p": 0.7}, "inconclusive"),
    ("compare_columns", {"value": "x", "rule": {"kind": "compare_columns", "op": "<", "others": ["y"]}},
     {"x": 0.033, "y": 0.033}, "not supported"),
    ("category_in", {"value": "x", "rule": {"kind": "category_in", "values": ["rise-then-fall"]}},
     {"x": "flat"}, "not supported"),
    ("interval_contains_reference", {"value": "x", "lo": "lo", "hi": "hi",
                                     "rule": {"kind": "interval_contains_reference", "reference": "r"}},
     {"x": 3.0, "lo": 2.0, "hi": 4.0, "r": 40.0}, "not supported"),
    ("inside_published_range", {"value": "x", "published": "eta_r2", "rule": {"kind": "inside_published_range"}},
     {"x": 0.5}, "not supported"),
]


@pytest.mark.parametrize("kind, claim, null_row, verdict", NULL_CASES, ids=[c[0] for c in NULL_CASES])
def test_each_rule_kind_on_a_null_input_gives_the_verdict_it_must(tmp_path, kind, claim, null_row, verdict):
    if null_row.get("x") == "iso":  # the PC1+PC2 share that isotropic noise of the run's n and d gives
        null_row = dict(null_row, x=null_shares(np.random.default_rng(0).standard_normal((75, 192)), n_reps=5,
                                                seed=0)["pc12_iso"])
    path = _claims_file(tmp_path, [dict(claim, id="c", table="t")])
    t = pd.DataFrame([dict(null_row, model="m-null")])
    card = claims_table({"t": t}, models=["m-null"], path=path)
    assert card.verdict.iloc[0] == verdict


def test_group_rule_on_a_null_with_one_attention_type_is_not_testable(tmp_path):
    path = _claims_file(tmp_path, [dict(id="g", table="t", value="x", scope="across_models",
                                        rule={"kind": "group_greater", "group": "a", "greater": ["MHA"],
                                              "lesser": ["GQA"]})])
    t = pd.DataFrame({"model": ["n1", "n2"], "a": ["GQA", "GQA"], "x": [1.0, 2.0]})
    assert claims_table({"t": t}, models=["n1", "n2"], path=path).verdict.iloc[0] == "not testable here"


def test_same_verdict_rule_on_disagreeing_estimators_is_inconclusive(tmp_path):
    path = _claims_file(tmp_path, [dict(id="s", table="t", value="x", rule={
        "kind": "same_verdict_all_estimators", "group": "e", "inner": {"kind": "category_in", "values": ["a"]}})])
    t = pd.DataFrame({"model": ["m", "m"], "e": ["twonn", "mle"], "x": ["a", "b"]})
    assert claims_table({"t": t}, models=["m"], path=path).verdict.iloc[0] == "inconclusive"


# ------------------------------------------------------------------------------------------ scorecard

THR = {"id": "c", "table": "t", "value": "x", "lo": "lo", "hi": "hi", "null_value": "x_iso",
       "rule": {"kind": "threshold", "op": ">", "threshold": 0.5}}


def _scored(tmp_path, null_x, null_lo=None, iso=0.1, nulls=True, claim=THR):
    path = _claims_file(tmp_path, [claim])
    t = pd.DataFrame({"model": ["m", "m-randinit"], "x": [0.8, null_x], "lo": [0.7, null_lo or null_x - 0.05],
                      "hi": [0.9, null_x + 0.05], "x_iso": [iso, iso]})
    return claims_table({"t": t}, models=["m"], path=path, nulls={"m-randinit": "m"} if nulls else None).iloc[0]


def test_a_verdict_the_null_shares_is_not_specific(tmp_path):
    r = _scored(tmp_path, null_x=0.85)
    assert r.model == "m" and r.verdict == "supported" and r.null_model == "m-randinit"
    assert r.null_verdict == "supported" and r.null_measured == pytest.approx(0.85)
    assert r.specific is False or r.specific == False  # noqa: E712
    assert "same verdict" in r.specific_reason


def test_a_verdict_that_differs_from_every_null_is_specific(tmp_path):
    r = _scored(tmp_path, null_x=0.2)
    assert r.null_verdict == "not supported" and r.noise_verdict == "not supported"
    assert r.noise_column == "x_iso" and r.noise_measured == pytest.approx(0.1)
    assert bool(r.specific) and "null model reads not supported" in r.specific_reason
    # the data-level null alone can take specificity away: noise above the threshold too
    r2 = _scored(tmp_path, null_x=0.2, iso=0.9)
    assert r2.noise_verdict == "supported" and not bool(r2.specific)


def test_same_verdict_is_not_specific_even_when_the_interval_excludes_the_nulls_value(tmp_path):
    """Issue 48: "specific" needs the null's verdict decided and different; a null that reads the same verdict is
    no contrast however far its value lies from the interval."""
    claim = dict(THR, null_value=None)
    r = _scored(tmp_path, null_x=0.6, null_lo=0.55, claim={k: v for k, v in claim.items() if v is not None})
    assert r.null_verdict == "supported" and not bool(r.specific) and "same verdict" in r.specific_reason


def test_an_undecided_null_is_no_contrast(tmp_path):
    claim = dict(THR, null_value=None)
    r = _scored(tmp_path, null_x=0.5, null_lo=0.3, claim={k: v for k, v in claim.items() if v is not None})
    assert r.null_verdict == "inconclusive" and not bool(r.specific) and "no contrast" in r.specific_reason


def test_without_nulls_every_row_says_so(tmp_path):
    r = _scored(tmp_path, null_x=0.2, nulls=False)
    assert r.null_verdict == "not testable here" and "nulls.random_init" in r.null_reason and not bool(r.specific)


def test_headline_counts_a_supported_claim_as_a_finding_only_when_specific(tmp_path):
    card = pd.DataFrame({"verdict": ["supported", "supported", "supported", "not supported", "inconclusive",
                                     "not testable here"],
                         "specific": [True, True, False, False, False, False],
                         "stability": [0.95, 0.5, 1.0, 1.0, np.nan, np.nan]})
    assert headline(card) == dict(zip(HEADLINE, [1, 1, 1, 1, 1, 1]))


def test_front_page_shows_the_counts_and_the_matrix(tmp_path):
    from llmgeom.plots.claims import findings_page, forest_plots, verdict_matrix

    card = pd.DataFrame([_scored(tmp_path, null_x=0.2), _scored(tmp_path, null_x=0.85)])
    card["claim_id"] = ["c1", "c2"]
    card["stability"] = [1.0, 0.5]  # c1 stable: a finding; c2 (not specific) unstable: "~" in its stripe
    card.to_csv(tmp_path / "claims.csv", index=False)  # read back as rule findings reads it: text stays text
    card = pd.read_csv(tmp_path / "claims.csv", keep_default_na=False)
    verdict_matrix(card, [tmp_path / "m.png"])
    forest_plots(card, [tmp_path / "f.png"])
    findings_page(card, tmp_path / "m.png", tmp_path / "f.png", tmp_path / "index.html")
    page = (tmp_path / "index.html").read_text()
    assert "specific finding: <b>1</b>" in page and "supported, not specific: <b>1</b>" in page
    assert page.index('<table class="vm">') < page.index("forest plots")  # the matrix comes first, as text
    assert page.count('<span class="s"') == 2 * 2  # one stripe per claim for the model and for its twin
    assert (tmp_path / "m.png").stat().st_size > 1000
