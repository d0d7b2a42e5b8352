"""Known-answer tests of the Bayesian-geometry analyses (Paper III): key orthogonality and its baselines,
entropy-stratified domain restriction, attention focusing, the cross-model tables, and the paper3 dry run.

Known answers: a rank-1 point cloud has PC1 = 100%; orthonormal W_K columns have orthogonality 0 (parallel
ones 1); uniform attention over n keys has entropy log n (also through a real forward pass with W_Q = 0).
W_K slicing against the model's own keys for every family: tests/unit/models/test_architectures.py
(test_w_k_heads_reproduce_model_keys); here the same slices are written to and read back by the table.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import llmgeom
from llmgeom.models import architectures as arch
from llmgeom.models import families
from llmgeom.analyses import domain_restriction as bg
from llmgeom.weights import key_orthogonality as keys
from llmgeom.models import tiny as testing
from llmgeom.extract.attention import attention_row_entropy
from llmgeom.extract.batch import extract_batch
from llmgeom.core.writer import ActivationWriter
from llmgeom.pipeline.schema import ConfigError
from llmgeom.analyses.attention_focusing import attention_focusing_tables, focusing_summary
from llmgeom.analyses.bayes_tables import markdown_tables_html, table1, table2, to_markdown
from llmgeom.measures.orthogonality import gaussian_baseline, gaussian_expectation, orthogonality
from llmgeom.measures.pca import value_manifold_stats
from llmgeom.pipeline.checks import check_attention_focusing, check_domain_restriction

REPO = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------ key orthogonality: pure statistic

def test_orthogonality_known_answers():
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((64, 16)))
    assert orthogonality(Q) == pytest.approx(0.0, abs=1e-12)  # orthonormal columns
    assert orthogonality(Q * rng.uniform(0.1, 10, 16)) == pytest.approx(0.0, abs=1e-12)  # scale-free
    assert orthogonality(np.eye(10)[:, :4]) == 0.0
    u = rng.standard_normal(32)
    assert orthogonality(np.outer(u, [1.0, -2.0, 3.0])) == pytest.approx(1.0)  # parallel (|cos| = 1)
    # two unit columns at 60 degrees: |cos| = 0.5
    W = np.array([[1.0, 0.5], [0.0, math.sqrt(3) / 2], [0.0, 0.0]])
    assert orthogonality(W) == pytest.approx(0.5)
    # three columns: e1, e2, (e1+e2)/sqrt2 -> pairs 0, 1/sqrt2, 1/sqrt2 -> mean sqrt2/3
    W = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    assert orthogonality(W) == pytest.approx(math.sqrt(2) / 3)
    assert orthogonality(torch.tensor(W, dtype=torch.bfloat16)) == pytest.approx(math.sqrt(2) / 3, rel=1e-2)


@pytest.mark.parametrize("bad", [np.zeros((4, 1)), np.ones(5), np.array([[1.0, 0.0], [0.0, 0.0]]),
                                 np.array([[np.nan, 1.0], [1.0, 0.0]])])
def test_orthogonality_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        orthogonality(bad)


def test_gaussian_baseline_matches_expectation_and_is_seeded():
    d, k = 256, 64
    vals = [gaussian_baseline(d, k, seed=0, layer=i) for i in range(20)]
    assert np.mean(vals) == pytest.approx(gaussian_expectation(d), rel=0.03)
    assert gaussian_expectation(d) == pytest.approx(math.sqrt(2 / (math.pi * d)), rel=0.01)
    assert gaussian_baseline(d, k, seed=0, layer=3, head=1) == gaussian_baseline(d, k, seed=0, layer=3, head=1)
    assert gaussian_baseline(d, k, seed=0, layer=3, head=1) != gaussian_baseline(d, k, seed=1, layer=3, head=1)


# ------------------------------------------------------------------ key orthogonality: models, every family

def _share(family):
    s = families.summarize(testing.tiny_config(family))
    return s.n_heads // s.n_kv_heads


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_key_orthogonality_table_known_answers_every_family(family):
    """Write orthonormal columns into every key head through architectures.w_k_heads (the slicing
    that reproduces the model's own keys) and one head with parallel columns: the table reads 0
    everywhere except 1 at exactly that (layer, kv_head)."""
    m = testing.tiny_model(family)
    s = families.summarize(m.config)
    rng = np.random.default_rng(0)
    target = (s.n_layers - 1, s.n_kv_heads - 1)
    with torch.no_grad():
        for layer in range(s.n_layers):
            for h, (W, _b) in enumerate(arch.w_k_heads(m, layer)):
                if (layer, h) == target:
                    new = np.outer(rng.standard_normal(W.shape[0]), rng.uniform(0.5, 2, W.shape[1]))
                else:
                    new, _ = np.linalg.qr(rng.standard_normal(tuple(W.shape)))
                W.copy_(torch.tensor(new, dtype=W.dtype))  # W is a view into the model's parameter
    df = keys.key_orthogonality_table(m, model_name=family, seed=0, random_init=True)
    assert len(df) == s.n_layers * s.n_kv_heads
    assert list(df.columns[:4]) == ["model", "layer", "relative_depth", "kv_head"]
    assert (df.n_query_heads_sharing == _share(family)).all()
    assert (df.d_model == s.d_model).all() and (df.head_dim == s.head_dim).all()
    is_t = (df.layer == target[0]) & (df.kv_head == target[1])
    assert df.orthogonality[is_t].item() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(df.orthogonality[~is_t], 0.0, atol=1e-6)
    assert set(df.sliding) == ({True, False} if family == "gemma3" else {family == "mistral"})
    # baselines: finite, in (0, 1), reproducible
    assert df.baseline_gaussian.between(0, 1).all() and df.baseline_random_init.between(0, 1).all()
    df2 = keys.key_orthogonality_table(m, model_name=family, seed=0, random_init=True)
    pd.testing.assert_frame_equal(df, df2)


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_random_init_baseline_uses_the_architectures_init(family):
    """k-only random init on the meta skeleton: finite weights with the config's init std, close to
    what a full from_config gives, and Gaussian-like orthogonality."""
    cfg = testing.tiny_config(family)
    sk = keys.random_init_skeleton(cfg)
    W, b = keys._random_init_layer_heads(sk, 0, seed=0)[0]
    std = getattr(cfg, "initializer_range", None) or getattr(cfg, "init_std", None)
    full = arch.w_k_heads(testing.tiny_model(family, seed=0), 0)[0][0]
    assert torch.isfinite(W).all()
    W, full = W.detach(), full.detach()
    assert float(W.std()) == pytest.approx(std, rel=0.2)
    assert float(W.std()) == pytest.approx(float(full.std()), rel=0.2)
    assert b is None or float(b.detach().abs().max()) == 0.0
    assert str(next(iter(arch.kv_module(sk, 1).parameters())).device) == "meta"  # other layers stay on meta
    W2 = keys._random_init_layer_heads(keys.random_init_skeleton(cfg), 0, seed=0)[0][0]
    torch.testing.assert_close(W, W2)  # seeded


def test_random_init_refuses_unset_weights(monkeypatch):
    sk = keys.random_init_skeleton(testing.tiny_config("llama"))
    monkeypatch.setattr(type(sk), "_init_weights", lambda self, module: None)
    with pytest.raises(RuntimeError, match="did not initialize"):
        keys._random_init_layer_heads(sk, 0, seed=0)


# ------------------------------------------------------------------ attention entropy: log n

def test_uniform_attention_entropy_is_log_n():
    for n in (1, 2, 7, 64):
        assert float(attention_row_entropy(torch.full((n,), 1.0 / n))) == pytest.approx(math.log(n), abs=1e-6)
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])  # 0 log 0 = 0
    assert float(attention_row_entropy(p)) == pytest.approx(math.log(2), abs=1e-7)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt_neox"])
def test_zero_queries_give_uniform_attention_log_n_keys(family):
    """W_Q = 0 makes every score equal: the stored final-query entropy is log(number of visible keys);
    the sliding-window layer of tiny Gemma 3 (window 4) sees 4 keys."""
    m = testing.tiny_model(family)
    s = families.summarize(m.config)
    with torch.no_grad():
        for blk in arch.decoder_layers(m):
            if family == "gpt_neox":
                qkv = blk.attention.query_key_value
                for h in range(s.n_heads):
                    sl = slice(3 * h * s.head_dim, (3 * h + 1) * s.head_dim)
                    qkv.weight[sl].zero_()
                    qkv.bias[sl].zero_()
            else:
                blk.self_attn.q_proj.weight.zero_()
    r = extract_batch(m, [[1, 5, 6, 7, 8, 9, 10, 11], [1, 20, 21]], attention=True, top_k=10)
    E = r["attention/entropy"]  # [B, L, H]
    for b, n in enumerate((8, 3)):
        for layer in range(s.n_layers):
            k = min(n, s.sliding_window) if layer in s.sliding_layers else n
            np.testing.assert_allclose(E[b, layer], math.log(k), atol=1e-5)


# ------------------------------------------------------------------ fake activation files

def _write_h5(path, *, model="m", prompt_set="mixed", entropy, values, residual=None, attn=None, n_tokens=None,
              topics=None, arch_attrs=None, attn_output=None):
    n, L, F = values.shape
    residual = residual if residual is not None else np.random.default_rng(1).standard_normal((n, L + 1, 6))
    attn_output = attn_output if attn_output is not None else np.random.default_rng(2).standard_normal((n, L, 4))
    attn = attn if attn is not None else np.ones((n, L, 2))
    n_tokens = n_tokens if n_tokens is not None else np.full(n, 10)
    topics = topics or ["t"] * n
    a = dict(model=model, prompt_set=prompt_set, n_layers=L, n_heads=attn.shape[2], n_kv_heads=1,
             architecture=arch_attrs or {"attention_type": "MQA", "sliding_layers": [], "sliding_window": None})
    shapes = {"prompts/text": ((n,), "str"), "prompts/meta": ((n,), "str"), "prompts/n_tokens": ((n,), "int32"),
              "last_token/values": ((n, L, F), "float32"), "last_token/residual": (residual.shape, "float32"),
              "last_token/attn_output": (attn_output.shape, "float32"),
              "next_token/entropy": ((n,), "float32"), "attention/entropy": (attn.shape, "float32")}
    w = ActivationWriter(path, a, shapes)
    w.write("prompts/text", slice(None), [f"p{i}" for i in range(n)])
    w.write("prompts/meta", slice(None), [json.dumps({"topic": t}) for t in topics])
    w.write("prompts/n_tokens", slice(None), np.asarray(n_tokens, np.int32))
    w.write("last_token/values", slice(None), values.astype(np.float32))
    w.write("last_token/residual", slice(None), residual.astype(np.float32))
    w.write("last_token/attn_output", slice(None), attn_output.astype(np.float32))
    w.write("next_token/entropy", slice(None), np.asarray(entropy, np.float32))
    w.write("attention/entropy", slice(None), attn.astype(np.float32))
    return w.commit()


# ------------------------------------------------------------------ entropy-stratified selection

def test_quantile_edges_and_bins():
    e = np.arange(100.0)
    ed = bg.quantile_edges(e, 5)
    np.testing.assert_allclose(ed, [19.8, 39.6, 59.4, 79.2])
    b = bg.quantile_bins(e, ed)
    assert np.bincount(b).tolist() == [20, 20, 20, 20, 20]
    assert bg.quantile_bins([19.8], ed).item() == 1  # a value on an edge goes up


def test_stratified_sample_equal_per_quintile_and_seeded():
    e = np.random.default_rng(0).permutation(np.arange(150.0))
    r = bg.stratified_sample(e, n_quantiles=5, per_quantile=15, seed=7)
    assert r["indices"].size == 75 and np.all(np.diff(r["indices"]) > 0)
    assert np.bincount((e[r["indices"]] // 30).astype(int)).tolist() == [15] * 5
    assert r["n_available"].tolist() == [30] * 5 and r["n_selected"].tolist() == [15] * 5
    np.testing.assert_array_equal(r["indices"], bg.stratified_sample(e, n_quantiles=5, per_quantile=15, seed=7)["indices"])
    assert not np.array_equal(r["indices"], bg.stratified_sample(e, n_quantiles=5, per_quantile=15, seed=8)["indices"])
    # common (pooled) edges that leave a bin short: all of that bin is taken, shortfall visible
    r2 = bg.stratified_sample(np.arange(10.0), n_quantiles=2, per_quantile=4, seed=0, edges=[8.5])
    assert r2["n_available"].tolist() == [9, 1] and r2["n_selected"].tolist() == [4, 1]
    assert 9 in r2["indices"]


def test_value_manifold_bootstrap_replicates_known_answers():
    """The replicates behind the delta CIs: a rank-1 cloud (plus a constant column) has PC1 = 100% in every
    resample; two standardized coordinates with correlation r have PC1 = (1 + |r|) / 2 and PC1+PC2 = 1."""
    rng = np.random.default_rng(0)
    h = rng.random(30)
    X = np.c_[np.outer(h, rng.standard_normal(11)) + 5.0, np.full(30, 2.0)]
    for std in (True, False):
        st, boot = value_manifold_stats(X, h, n_boot=40, seed=5, standardize=std, return_boot=True, ci=0.95)
        assert boot.shape == (40, 3) and np.isfinite(boot).all()
        np.testing.assert_allclose(boot, np.tile([1.0, 0.0, 1.0], (40, 1)), atol=1e-9)
        assert st["pc1"] == pytest.approx(1.0, abs=1e-12) and st["spearman_rho"] == pytest.approx(1.0)
    a = rng.standard_normal(200)
    X2 = np.c_[a, 0.6 * a + 0.8 * rng.standard_normal(200)]
    r = np.corrcoef(X2.T)[0, 1]
    st, boot = value_manifold_stats(X2, a, n_boot=40, seed=5, standardize=True, return_boot=True, ci=0.95)
    assert st["pc1"] == pytest.approx((1 + abs(r)) / 2, abs=1e-12)
    np.testing.assert_allclose(boot[:, 2], 1.0, atol=1e-12)
    assert (boot[:, 0] >= 0.5).all() and boot[:, 0].std() > 0  # replicates of real resamples, not copies


def test_domain_restriction_rank1_known_answers(tmp_path):
    """Restricted set: values = entropy * u (rank 1) -> PC1 = 100%, rho(PC1, H) = 1, delta > 0 vs a
    full-rank mixed set; selection 3 per quintile, seeded and recorded."""
    rng = np.random.default_rng(0)
    n, L, F = 40, 2, 8
    h_mix, h_dom = rng.uniform(0, 5, n), rng.uniform(0, 5, n)
    u = rng.standard_normal(F)
    vals_dom = np.repeat((h_dom[:, None] * u)[:, None, :], L, axis=1) + 3.0
    att_dom = rng.standard_normal((n, L, 6))  # attention output: rank 1 in entropy at layer 0 only
    att_dom[:, 0, :] = -h_dom[:, None] * rng.standard_normal(6)
    paths = {"mixed": _write_h5(tmp_path / "mixed.h5", entropy=h_mix, values=rng.standard_normal((n, L, F)),
                                topics=["a", "b"] * (n // 2), attn_output=rng.standard_normal((n, L, 6))),
             "domain_x": _write_h5(tmp_path / "domain_x.h5", prompt_set="domain_x", entropy=h_dom, values=vals_dom,
                                   topics=["x"] * n, attn_output=att_dom)}
    out = bg.domain_restriction_tables(paths, model="m", mixed_set="mixed", labels={"domain_x": "X"}, n_quantiles=5,
                                       per_quantile=3, n_boot=20, seed=0, edges="per_set", ci=0.95, layers="all", data_reps=0)
    st, sel, sc = out["stats"], out["selection"], out["scores"]
    assert len(st) == 2 * L * 3 * 2  # sets x layers x representations (values, attn_output, residual) x variants
    a = st[(st.prompt_set == "domain_x") & (st.representation == "attn_output")].set_index(["layer", "standardized"])
    np.testing.assert_allclose(a.loc[0].pc1, 1.0, atol=1e-9)
    np.testing.assert_allclose(a.loc[0].spearman_rho, 1.0)
    assert (a.loc[1].pc1 < 0.8).all()
    d = st[(st.prompt_set == "domain_x") & (st.representation == "values")]
    np.testing.assert_allclose(d.pc1, 1.0, atol=1e-9)
    np.testing.assert_allclose(d.pc1_lo, 1.0, atol=1e-9)
    np.testing.assert_allclose(d.spearman_rho, 1.0)
    assert (d.delta_pc1 > 0.3).all() and (d.delta_pc12_lo > 0).all()
    assert (d.n == 15).all() and (d.domain == "X").all() and (d.role == "restricted").all()
    mx = st[st.prompt_set == "mixed"]
    assert (mx.delta_pc12 == 0).all() and (mx.role == "mixed").all()
    # issue 11: bias-corrected estimates beside every bootstrapped share and difference; PR of the top 10
    assert (mx.delta_pc12_bc == 0).all()
    for k in ("pc1", "pc2", "pc12"):
        assert ((st[f"{k}_lo"] - 1e-12 <= st[f"{k}_bc"]) & (st[f"{k}_bc"] <= st[f"{k}_hi"] + 1e-12)).all()
    assert ((d.delta_pc12_lo - 1e-12 <= d.delta_pc12_bc) & (d.delta_pc12_bc <= d.delta_pc12_hi + 1e-12)).all()
    np.testing.assert_allclose(d.participation_ratio_top10, 1.0, atol=1e-9)  # rank 1
    assert ((st.participation_ratio_top10 >= 1) & (st.participation_ratio_top10 <= 10)).all()
    assert ((st.relative_depth - (st.layer + 1) / L).abs() < 1e-15).all()
    # selection: every candidate recorded, 3 per quintile selected, reproducible
    assert len(sel) == 2 * n
    assert sel[sel.selected].groupby(["prompt_set", "entropy_quantile"]).size().tolist() == [3] * 10
    again = bg.domain_restriction_tables(paths, model="m", mixed_set="mixed", n_quantiles=5, per_quantile=3,
                                         n_boot=20, seed=0, labels=None, edges="per_set", ci=0.95, layers="all", data_reps=0)["selection"]
    assert sel.selected.tolist() == again.selected.tolist()
    # per-prompt scores at the last layer: PC1 of the rank-1 set is an increasing function of entropy
    s = sc[(sc.prompt_set == "domain_x") & (sc.representation == "values")]
    assert len(s) == 15 and (s.layer == L - 1).all()
    assert np.all(np.diff(s.sort_values("next_token_entropy").pc1) > 0)


def test_domain_restriction_pooled_edges_record_shortfall(tmp_path):
    rng = np.random.default_rng(1)
    n, L, F = 30, 1, 5
    paths = {"mixed": _write_h5(tmp_path / "a.h5", entropy=rng.uniform(2, 4, n), values=rng.standard_normal((n, L, F))),
             "code": _write_h5(tmp_path / "b.h5", prompt_set="code", entropy=rng.uniform(0, 1, n),
                               values=rng.standard_normal((n, L, F)))}
    with pytest.warns(UserWarning, match="took all"):
        out = bg.domain_restriction_tables(paths, model="m", mixed_set="mixed", edges="pooled", n_quantiles=2,
                                           per_quantile=20, n_boot=5, seed=0, log=lambda *a: None, labels=None, ci=0.95, layers="all", data_reps=0)
    sel = out["selection"]
    assert (sel.edges == "pooled").all()
    # the pooled median splits the two pools apart: each pool fills only one bin
    assert sel.groupby("prompt_set").entropy_quantile.nunique().tolist() == [1, 1]
    assert (out["stats"].n == 20).all()
    with pytest.raises(ValueError, match="edges"):
        bg.domain_restriction_tables(paths, model="m", mixed_set="mixed", edges="nope", labels=None, n_quantiles=5, per_quantile=15, n_boot=100, ci=0.95, seed=0, layers="all", data_reps=0)


# ------------------------------------------------------------------ attention focusing

def test_focusing_summary_known_answers():
    r = focusing_summary([4.0, 3.0, 2.0, 1.0])
    assert r["focusing_pct"] == pytest.approx(75.0)
    assert r["spearman_rho"] == pytest.approx(-1.0)
    r = focusing_summary([2.0, 1.0, 3.0, 1.0], sliding=[True, False, True, False])
    assert r["focusing_pct"] == pytest.approx(50.0)
    assert r["n_global_layers"] == 2 and r["focusing_pct_global"] == pytest.approx(0.0)
    with pytest.raises(ValueError):
        focusing_summary([0.0, 1.0])


def test_attention_focusing_tables_means_over_heads(tmp_path):
    """Layer 0: uniform attention over each prompt's n keys (entropy log n, normalized 1); later layers
    sharpen. Layer rows = mean of the heads' entropies; sliding layers labelled, window caps n_keys."""
    n, L, H = 6, 3, 2
    ntok = np.array([4, 8, 16, 4, 8, 16])
    E = np.zeros((n, L, H))
    E[:, 0, :] = np.log(ntok)[:, None]
    E[:, 1, 0], E[:, 1, 1] = 1.0, 0.5
    E[:, 2, :] = np.log(np.minimum(ntok, 8))[:, None]  # sliding layer (window 8), uniform over its window
    p = _write_h5(tmp_path / "mixed.h5", entropy=np.ones(n), values=np.ones((n, L, 2)), attn=E, n_tokens=ntok,
                  arch_attrs={"attention_type": "GQA", "sliding_layers": [2], "sliding_window": 8})
    detail, summ = attention_focusing_tables(p, model="m", **llmgeom.defaults("attention_focusing"))
    heads, layers = detail[detail.level == "head"], detail[detail.level == "layer"]
    assert len(heads) == L * H and len(layers) == L and (layers["head"] == -1).all()
    assert layers.entropy_mean.tolist() == pytest.approx([np.log(ntok).mean(), 0.75, np.log(np.minimum(ntok, 8)).mean()])
    assert layers.normalized_entropy_mean.iloc[0] == pytest.approx(1.0)
    assert layers.normalized_entropy_mean.iloc[2] == pytest.approx(1.0)  # window-capped key count
    assert layers.sliding.tolist() == [False, False, True] and layers.window.iloc[2] == 8
    row = summ.iloc[0]
    h0, h2 = np.log(ntok).mean(), np.log(np.minimum(ntok, 8)).mean()
    assert row.focusing_pct == pytest.approx(100 * (h0 - h2) / h0)
    assert row.focusing_pct_global == pytest.approx(100 * (h0 - 0.75) / h0)
    assert row.attention_type == "GQA" and row.n_sliding_layers == 1


# ------------------------------------------------------------------ cross-model tables

def _fake_tables():
    dr = []
    for m in ("a", "b"):
        for s, role, dom, pc1 in (("mixed", "mixed", "mixed (all topics)", 0.2), ("domain_mathematics", "restricted",
                                                                                   "Mathematics", 0.5)):
            for layer in (0, 1):
                dr.append(dict(model=m, prompt_set=s, domain=dom, role=role, n=75, layer=layer, representation="values",
                               relative_depth=(layer + 1) / 2, standardized=True, pc1=pc1 + layer / 10,
                               pc1_bc=pc1 + 0.05, pc1_lo=pc1, pc1_hi=pc1 + 0.2, pc12=pc1 + 0.1, pc12_bc=pc1 + 0.15,
                               pc12_lo=pc1, pc12_hi=pc1 + 0.3, participation_ratio=3.0, participation_ratio_top10=2.5,
                               spearman_rho=0.4, spearman_p=0.01, delta_pc12=0.0 if role == "mixed" else 0.3,
                               delta_pc12_bc=0.0 if role == "mixed" else 0.25, delta_pc12_lo=0.1, delta_pc12_hi=0.5))
    ko = pd.DataFrame([dict(model=m, layer=layer, kv_head=h, orthogonality=0.1 * (layer + 1), baseline_gaussian=0.03,
                            baseline_random_init=0.04) for m in ("a", "b") for layer in (0, 1) for h in (0, 1)])
    af = pd.DataFrame([dict(model="a", attention_type="GQA", n_layers=2, n_sliding_layers=0, sliding_window=None,
                            focusing_pct=40.0, focusing_pct_global=40.0, spearman_rho=-1.0, spearman_p=0.0),
                       dict(model="b", attention_type="MQA", n_layers=2, n_sliding_layers=1, sliding_window=512,
                            focusing_pct=10.0, focusing_pct_global=float("nan"), spearman_rho=-1.0, spearman_p=0.0)])
    return pd.DataFrame(dr), ko, af


def test_table1_table2_and_markdown():
    dr, ko, af = _fake_tables()
    t1_all = table1(dr)
    t1 = t1_all[t1_all.source == "measured"]
    assert len(t1) == 4 and (t1.layer == 1).all() and t1.role.tolist() == ["mixed", "restricted"] * 2
    assert t1.pc1.tolist() == pytest.approx([0.3, 0.6, 0.3, 0.6])
    t2_all = table2(dr, ko, af, restricted_set="domain_mathematics")
    t2 = t2_all[t2_all.source == "llm"]
    assert t2.model.tolist() == ["a", "b"]
    r = t2.set_index("model").loc["b"]
    assert r.attention_type == "MQA + sliding window (512 tokens, 1/2 layers)"
    assert (r.orth_min, r.orth_max) == pytest.approx((0.1, 0.2))
    assert r.pc12_mixed == pytest.approx(0.3) and r.pc12_restricted == pytest.approx(0.6)
    assert r.restricted_domain == "Mathematics" and r.orth_over_random_init == pytest.approx(0.15 / 0.04)
    md1, md2 = to_markdown(t1_all, "table1"), to_markdown(t2_all, "table2")
    assert md1.count("| this run |") == 4 and "30.0 (25.0) [20.0, 40.0]" in md1 and "Mathematics" in md1
    assert "estimate (bias-corrected)" in md1
    assert "0.100–0.200" in md2 and "40.0" in md2
    # issue 19: published values are not attached to models the paper did not measure; the papers' models are
    # rows of their own (6 in Table 1: 3 models x mixed / restricted), in the same columns and units
    assert (t1.pc12_published == "").all() and (t2.random_init_mean_published == "").all()
    p1 = t1_all[(t1_all.source == "published") & (t1_all.source_kind == "paper")]
    assert len(p1) == 6 and set(p1.role) == {"mixed", "restricted"}
    assert "| Pythia-410M | published (paper) | mixed | - | 79.6 | 99.7 |" in md1 and "| -0.32 |" in md1
    # issue 28: the official code's committed output as a row of its own beside the paper's
    assert "| Pythia-410M | published (official code) | mixed | - | 14.6 | 27.7 |" in md1 and "| -0.59 |" in md1
    assert "| Mistral-7B | published (paper) | - | 15-20 | 80 | 0.05-0.06 |" in md2
    # issue 48: the random-init note types no number: the published baseline from published.yaml, ours from the table
    from llmgeom.analyses.bayes_tables import random_init_note
    from llmgeom.core.published import published_text
    assert published_text("key_orthogonality_random_init") in md2 and "sqrt(2 / (pi d_model))" in md2
    assert "a 0.150 vs 0.040; b 0.150 vs 0.040." in md2 and "No random-init architecture of this run reaches" in md2
    assert "trained vs random init" not in random_init_note(None) and random_init_note(t2_all) in md2
    assert "Table 2, arXiv:2512.23752v1" in md2 and all(len(ln) < 400 for ln in md1.splitlines() if ln.startswith("|"))
    with pytest.raises(ValueError):
        to_markdown(t1, "table3")
    page = markdown_tables_html({"Table 1 analogue": md1, "Table 2 analogue": md2})
    n_pub2 = int((t2_all.source == "published").sum())
    assert page.count("<table>") == 2 and page.count("<tr>") == 1 + 4 + 7 + 1 + 2 + n_pub2
    assert "<th>PC1 % (bc) [95% CI]</th>" in page and "MQA + sliding window" in page


def test_config_checks():
    cfg = {"prompts": {"sets": {"mixed": {"kind": "mixed"}, "domain_mathematics": {"kind": "domain", "topics": ["M"]},
                                "code": {"kind": "code"}, "corpus": {"kind": "corpus"}}},
           "domain_restriction": {"mixed_set": "mixed", "restricted_sets": None, "summary_set": None},
           "attention_focusing": {"prompt_set": "mixed"}}

    def check_bayes_config(c):
        check_domain_restriction(c)
        check_attention_focusing(c)

    check_bayes_config(cfg)
    from llmgeom.pipeline.derived import resolve_domain_sets

    r = resolve_domain_sets(cfg)
    assert r["restricted"] == ["domain_mathematics", "code"] and r["summary"] == "domain_mathematics"
    assert r["labels"] == {"mixed": "mixed (all topics)", "domain_mathematics": "M", "code": "code"}
    for key, val, msg in (("domain_restriction", {"restricted_sets": ["nope"]}, "not in prompts.sets"),
                          ("domain_restriction", {"restricted_sets": ["corpus"]}, "corpus set"),
                          ("domain_restriction", {"summary_set": "mixed"}, "summary_set"),
                          ("attention_focusing", {"prompt_set": "corpus"}, "corpus set")):
        bad = json.loads(json.dumps(cfg))
        bad[key].update(val)
        with pytest.raises(ConfigError, match=msg):
            check_bayes_config(bad)


# ------------------------------------------------------------------ paper3 config: offline dry run

def test_paper3_dry_run_offline(tmp_path):
    """config/paper3.yaml builds its DAG offline with an empty Hugging Face cache (nothing touches the hub
    at DAG construction; prepare_model checks sources at job time) and schedules every stage per model."""
    from conftest import offline_dry_run_counts, study_config

    counts = offline_dry_run_counts(REPO / "config/paper3.yaml", tmp_path)
    import yaml

    cfg = study_config(REPO / "config/paper3.yaml")
    n_models, n_sets = len(cfg["models"]), len(cfg["prompts"]["sets"])
    assert n_models == 4
    # every model and its random-init twin (issue 28); a twin extracts mixed, the summary set and the corpus only
    assert counts["prepare_model"] == 2 * n_models
    assert counts["build_prompts"] == n_sets
    assert counts["extract"] == n_models * n_sets + n_models * 3
    assert counts["value_manifold"] == n_models  # no claim reads it: not run on the twins
    for rule in ("domain_restriction", "key_orthogonality", "attention_focusing"):
        assert counts[rule] == 2 * n_models, rule
    assert counts["bayes_tables"] == 1 and counts["figure_bayes"] == 1
    # one aggregate job per family of cross-model tables: the Bayesian-geometry tables in one (issue 21)
    assert counts["aggregate_bayes"] == 1 and "aggregate" not in counts
    # each entry carries what it needs
    for name, spec in cfg["models"].items():
        assert spec["source"] == "hf_hub" and spec["revision"] and spec["dtype"] == "bfloat16", name
    assert cfg["models"]["mistral-7b"]["device_map"] == "auto"
    assert {s["repo_id"] for s in cfg["models"].values()} == {
        "EleutherAI/pythia-410m", "microsoft/phi-2", "meta-llama/Llama-3.2-1B", "mistralai/Mistral-7B-v0.1"}
    assert not (tmp_path / "empty_hf_home").exists() or not any((tmp_path / "empty_hf_home").rglob("*.safetensors"))


def test_value_manifold_table_reads_attn_output(tmp_path):
    """value_manifold_table: one row per representation (values, attn_output, residual_stream), each read from its
    own dataset and layer (attention output rank 1 in entropy at layer 1 only)."""
    from llmgeom.analyses.value_manifold import value_manifold_table

    rng = np.random.default_rng(4)
    n, L = 30, 2
    h = rng.uniform(0, 4, n)
    att = rng.standard_normal((n, L, 5))
    att[:, 1, :] = h[:, None] * rng.standard_normal(5) + 1.0
    p = _write_h5(tmp_path / "mixed.h5", entropy=h, values=rng.standard_normal((n, L, 3)), attn_output=att)
    vm = value_manifold_table({"mixed": p}, model="m", n_boot=10, seed=0, ci=0.95, layers="all")
    assert sorted(vm.representation.unique()) == ["attn_output", "residual_stream", "values"]
    a = vm[vm.representation == "attn_output"].set_index(["layer", "standardized"])
    np.testing.assert_allclose(a.loc[1].pc1, 1.0, atol=1e-9)
    np.testing.assert_allclose(a.loc[1].spearman_rho, 1.0)
    assert (a.loc[0].pc1 < 0.8).all()
    assert (vm[vm.representation == "values"].pc1 < 0.95).all()


# ------------------------------------------------------------------ replicates (issue 48 point 4)

def test_replicates_reproduce_the_intervals_of_domain_restriction_and_table2(tmp_path):
    """Every bootstrapped share and difference carries the replicates its interval is taken from (at the score
    layers), and Tables 1 / 2 pass them through: bootstrap_interval(estimate, replicates) == (lo, hi); the delta's
    replicate b is restricted b - mixed b; the bias-corrected value is 2 t - mean(replicates)."""
    from replicate_checks import assert_replicates_reproduce

    from llmgeom.core.stats import bias_corrected, parse_replicates

    rng = np.random.default_rng(3)
    n, L, F = 40, 3, 8
    h_mix, h_dom = rng.uniform(0, 5, n), rng.uniform(0, 5, n)
    vals_dom = (np.repeat((h_dom[:, None] * rng.standard_normal(F))[:, None, :], L, axis=1)
                + rng.standard_normal((n, L, F)))
    E = rng.uniform(0.5, 3, (n, L, 2)) * np.linspace(1, 0.3, L)[None, :, None]
    paths = {"mixed": _write_h5(tmp_path / "mixed.h5", entropy=h_mix, values=rng.standard_normal((n, L, F)), attn=E),
             "domain_x": _write_h5(tmp_path / "domain_x.h5", prompt_set="domain_x", entropy=h_dom, values=vals_dom)}
    st = bg.domain_restriction_tables(paths, model="m", mixed_set="mixed", labels={"domain_x": "X"}, n_quantiles=5,
                                      per_quantile=4, n_boot=30, seed=0, edges="per_set", ci=0.9, layers="all",
                                      data_reps=2)["stats"]
    last = st[st.layer == L - 1]
    for col in ("pc1", "pc2", "pc12", "pc1_unit_norm", "pc12_unit_norm"):
        assert assert_replicates_reproduce(last, col, ci=0.9, bounds=(0.0, 1.0), n_boot=30) == len(last)
    for col in ("delta_pc1", "delta_pc12"):
        assert assert_replicates_reproduce(last, col, ci=0.9, n_boot=30) == len(last)
    assert (st[st.layer < L - 1].pc12_replicates == "").all()  # only at the score layers
    r = last.set_index(["prompt_set", "representation", "standardized"])
    dom, mix = r.loc[("domain_x", "values", True)], r.loc[("mixed", "values", True)]
    np.testing.assert_allclose(parse_replicates(dom.delta_pc12_replicates),
                               parse_replicates(dom.pc12_replicates) - parse_replicates(mix.pc12_replicates), atol=1e-8)
    assert dom.pc12_bc == pytest.approx(bias_corrected(dom.pc12, parse_replicates(dom.pc12_replicates), bounds=(0, 1)))
    assert np.ptp(parse_replicates(dom.pc12_replicates)) > 0  # real resamples, not copies
    # attention focusing: the bootstrap over prompts (new in issue 48); seeded
    _, af = attention_focusing_tables(paths["mixed"], model="m", n_boot=40, ci=0.9, seed=1)
    assert assert_replicates_reproduce(af, "focusing_pct", ci=0.9, n_boot=40) == 1
    a = af.iloc[0]
    assert a.focusing_pct_lo < a.focusing_pct_hi and parse_replicates(a.spearman_rho_replicates).size == 40
    again = attention_focusing_tables(paths["mixed"], model="m", n_boot=40, ci=0.9, seed=1)[1].iloc[0]
    assert again.focusing_pct_replicates == a.focusing_pct_replicates
    # the cross-model tables, through a CSV round trip (results/summary/*.csv)
    ko = pd.DataFrame([dict(model="m", layer=l, kv_head=0, orthogonality=0.1, baseline_gaussian=0.03,
                            baseline_random_init=0.04) for l in range(L)])
    csv = tmp_path / "dr.csv"
    st.to_csv(csv, index=False)
    dr = pd.read_csv(csv)
    t2 = table2(dr, ko, af, restricted_set="domain_x")
    t2 = t2[t2.source == "llm"]
    for col in ("pc12_mixed", "pc12_restricted", "pc12_mixed_unit_norm", "pc12_restricted_unit_norm"):
        assert assert_replicates_reproduce(t2, col, ci=0.9, bounds=(0.0, 1.0), n_boot=30) == 1
    assert assert_replicates_reproduce(t2, "delta_pc12", ci=0.9, n_boot=30) == 1
    assert assert_replicates_reproduce(t2, "focusing_pct", ci=0.9, n_boot=40) == 1
    assert t2.focusing_rho_replicates.iloc[0] == a.spearman_rho_replicates
    t1 = table1(dr)
    t1 = t1[t1.source == "measured"]
    assert assert_replicates_reproduce(t1, "pc12", ci=0.9, bounds=(0.0, 1.0), n_boot=30) == 2
    # the renderings do not print the replicate strings
    md = to_markdown(table2(dr, ko, af, restricted_set="domain_x"), "table2") + to_markdown(table1(dr), "table1")
    cell = t2.pc12_mixed_replicates.iloc[0].split()[0]
    assert cell not in md
    assert all(len(ln) < 400 for ln in md.splitlines() if ln.startswith("|"))
