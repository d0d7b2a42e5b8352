"""Known-answer tests for the latent-semantic-manifold measurements (LSM, issue 5):
intrinsic dimension (TwoNN, MLE), curvature proxy, ID profile shape, Voronoi margins and the
expressibility gap, the Fisher information metric, the LSM tables and the WikiText corpus option."""

from __future__ import annotations

import json
import random

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from llmgeom.measures import fisher, margins
from llmgeom.analyses import intrinsic_dimension as lsm
from llmgeom.measures.neighbors import TooFewPointsError
from llmgeom.measures.intrinsic_dimension import id_profile_shape, id_subsamples, mle_id, mle_lb, mle_mg, twonn
from llmgeom.measures.curvature import local_pca_residuals
from llmgeom.prompts.builders import build_prompt_set
from llmgeom.prompts.io import PromptDataError
from llmgeom.prompts.sources import text_file_passages
from ref_tokenizer import word_tokenizer

TOK = word_tokenizer()  # the reference tokenizer of the corpus passages: one token a word or punctuation run
from llmgeom.core.writer import ActivationWriter
from llmgeom.core.stats import bias_corrected, bootstrap_interval, derived_seed, parse_replicates
from llmgeom.core.tables import duplicate_keys
from llmgeom.analyses.intrinsic_dimension import intrinsic_dimension_table
from llmgeom.analyses.curvature import curvature_table
from llmgeom.analyses.margins import margin_tables, margin_vs_perplexity_table
from llmgeom.core.stats import parse_replicates
from llmgeom.pipeline.checks import check_curvature, check_fisher, check_margins
from llmgeom.pipeline.schema import ConfigError


def _embed(Y, D, rng):
    B, _ = np.linalg.qr(rng.standard_normal((D, Y.shape[1])))
    return Y @ B.T


def _sphere(n, rng, radius=1.0):
    Y = rng.standard_normal((n, 3))
    return radius * Y / np.linalg.norm(Y, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def clouds():
    rng = np.random.default_rng(10)
    return {"linear5": (_embed(rng.standard_normal((1500, 5)), 500, rng), 5.0),
            "sphere2": (_embed(_sphere(1500, rng), 500, rng), 2.0)}


def _with_duplicates(X, frac, rng):
    """Replace a fraction of the rows by exact copies of other rows (so frac of rows are duplicates)."""
    n = len(X)
    n_dup = int(round(frac * n))
    keep = X[: n - n_dup]
    Xd = np.vstack([keep, keep[rng.choice(len(keep), n_dup)]])
    return Xd[rng.permutation(n)], n_dup


# --- intrinsic dimension: known answers, duplicates, too few points ----------------------------


@pytest.mark.parametrize("name", ["linear5", "sphere2"])
@pytest.mark.parametrize("est", ["twonn", "mle_mg", "mle_lb"])
def test_id_known_dimension_within_10pct(clouds, name, est):
    X, d = clouds[name]
    fn, kw = {"twonn": (twonn, {}), "mle_mg": (mle_mg, {"k": 20}), "mle_lb": (mle_lb, {"k": 20})}[est]
    assert fn(X, **kw)["id"] == pytest.approx(d, rel=0.10)


def test_mle_aggregates_on_a_uniform_cube():
    """Uniform 5-cube, n = 2000: the harmonic (MacKay-Ghahramani) and arithmetic (Levina-Bickel) means of
    the pointwise MLE both recover d = 5 within 10%, and harmonic <= arithmetic (AM-HM)."""
    X = np.random.default_rng(0).uniform(size=(2000, 5))
    mg, lb = mle_mg(X, k=10)["id"], mle_lb(X, k=10)["id"]
    assert mg == pytest.approx(5, rel=0.10) and lb == pytest.approx(5, rel=0.10)
    assert mg < lb
    assert mg == mle_id(X, k=10, comb="mle")["id"] and lb == mle_id(X, k=10, comb="mean")["id"]
    with pytest.raises(ValueError, match="comb must be one of"):
        mle_id(X, k=10, comb="harmonic")
    r = id_subsamples(X, estimator="mle", n_subsamples=1, subsample_size=2000, seed=0, k=10)
    assert r["estimator"] == "mle_mg" and r["id_mean"] == mg  # 'mle' is the old name of mle_mg
    with pytest.raises(ValueError, match="mle_lb"):
        id_subsamples(X, estimator="levina", n_subsamples=1, subsample_size=10, seed=0)


@pytest.mark.parametrize("est", ["twonn", "mle_mg", "mle_lb"])
def test_id_finite_with_20pct_duplicates(clouds, est):
    rng = np.random.default_rng(11)
    X, d = clouds["linear5"]
    Xd, n_dup = _with_duplicates(X, 0.20, rng)
    kw = {} if est == "twonn" else {"k": 20}
    r = id_subsamples(Xd, estimator=est, n_subsamples=2, subsample_size=1000, seed=0, **kw)
    assert np.isfinite(r["id_mean"]) and r["id_mean"] == pytest.approx(d, rel=0.15)
    assert r["n_duplicates_removed"] == n_dup
    one = {"twonn": twonn, "mle_mg": mle_mg, "mle_lb": mle_lb}[est](Xd, **kw)
    assert one["n_duplicates_removed"] == n_dup and np.isfinite(one["id"])


@pytest.mark.parametrize("fn,kw", [(twonn, {}), (mle_id, {"k": 20})])
def test_id_clear_error_when_too_few_distinct_points(fn, kw):
    X = np.repeat(np.random.default_rng(12).standard_normal((8, 20)), 30, axis=0)
    with pytest.raises(TooFewPointsError, match=r"only 8 distinct points remain after removing 232"):
        fn(X, **kw)


# --- curvature proxy ---------------------------------------------------------------------------


def test_curvature_flat_is_zero_sphere_is_not():
    rng = np.random.default_rng(13)
    flat = _embed(rng.standard_normal((600, 5)) * 0.05, 200, rng)
    r_flat = local_pca_residuals(flat, k=30, m=5)
    assert r_flat["curvature_mean"] < 1e-10 and r_flat["k"] == 30 and r_flat["m"] == 5
    small = _embed(_sphere(600, rng, radius=0.05), 200, rng)
    r_s = local_pca_residuals(small, k=30, m=2)
    assert r_s["curvature_mean"] > 0.005 and r_s["curvature_median"] > 1e6 * max(r_flat["curvature_mean"], 1e-18)
    # neighbourhoods that cover more of the sphere bend more
    assert local_pca_residuals(small, k=60, m=2)["curvature_mean"] > r_s["curvature_mean"]
    # a flat plane with the same m reads 0 while the sphere does not
    plane = _embed(rng.standard_normal((600, 2)), 200, rng)
    assert local_pca_residuals(plane, k=30, m=2)["curvature_mean"] < 1e-10


def test_curvature_gram_path_equals_explicit_path(monkeypatch):
    from llmgeom.measures import curvature

    rng = np.random.default_rng(14)
    X = rng.standard_normal((300, 40))
    a = local_pca_residuals(X, k=20, m=3)["values"]
    monkeypatch.setattr(curvature, "GRAM_MAX_POINTS", 0)
    b = local_pca_residuals(X, k=20, m=3)["values"]
    np.testing.assert_allclose(a, b, atol=1e-12)


def test_curvature_anchor_rows_map_anchors_to_input_rows():
    rng = np.random.default_rng(16)
    X = rng.standard_normal((60, 8))
    Xd = np.vstack([X, X[:10]])[rng.permutation(70)]  # 10 rows twice, shuffled
    r = local_pca_residuals(Xd, k=10, m=2)
    rows = r["anchor_rows"]
    assert rows.size == r["n_anchors"] == 60 and np.all(np.diff(rows) > 0)
    # each anchor is the first of its duplicate rows of the input
    first = {tuple(x): i for i, x in reversed(list(enumerate(Xd)))}
    assert sorted(first.values()) == rows.tolist()
    # the values follow the rows: the same cloud without duplicates gives the same value at the same point
    ref = local_pca_residuals(Xd[rows], k=10, m=2)
    np.testing.assert_allclose(r["values"], ref["values"], atol=1e-12)
    sub = local_pca_residuals(Xd, k=10, m=2, n_anchors=15, seed=3)
    assert sub["anchor_rows"].size == 15 and set(sub["anchor_rows"]) <= set(rows)


def test_curvature_errors():
    X = np.random.default_rng(15).standard_normal((100, 10))
    with pytest.raises(ValueError, match="smaller than k"):
        local_pca_residuals(X, k=5, m=5)
    with pytest.raises(TooFewPointsError):
        local_pca_residuals(np.repeat(X[:4], 10, axis=0), k=5, m=2)


# --- ID profile shape --------------------------------------------------------------------------


@pytest.mark.parametrize("ids,shape", [
    ([10, 20, 30, 25, 12], "rise-then-fall"),
    ([30, 12, 10, 14, 28], "fall-then-rise"),
    ([5, 8, 12, 20, 30], "increasing"),
    ([30, 20, 12, 8, 5], "decreasing"),
    ([20, 20.5, 20.2, 19.9, 20.1], "flat"),
])
def test_id_profile_shape(ids, shape):
    depth = np.linspace(0, 1, len(ids))
    s = id_profile_shape(depth[::-1], np.asarray(ids, float)[::-1], tol=0.1)  # order does not matter
    assert s["shape"] == shape
    assert s["peak_id"] == max(ids) and s["peak_depth"] == depth[int(np.argmax(ids))]


# --- Voronoi margins and the expressibility gap ------------------------------------------------


def test_eta_uniform_margins_beta_alpha_one():
    m = np.random.default_rng(16).uniform(0, 1, 100_000)
    curve, fit = margins.expressibility_gap(m, eps_min=1e-3, eps_max=10, n_eps=41, fit_eps_max=0.5, fit_eta_max=0.5,
                                            min_count=10, n_boot=50, seed=0, ci=0.95)
    assert fit["beta"] == pytest.approx(1.0, rel=0.05)
    assert fit["alpha"] == pytest.approx(1.0, rel=0.05)
    assert fit["r2"] > 0.99 and fit["beta_lo"] <= fit["beta"] <= fit["beta_hi"]
    assert fit["fit_eps_hi"] <= 0.5 and fit["n_fit_points"] >= 10
    # eta is the fraction strictly below eps and saturates at 1 above the largest margin
    np.testing.assert_allclose(curve["eta"][curve["eps"] <= 0.9], curve["eps"][curve["eps"] <= 0.9], atol=0.01)
    assert curve["eta"][-1] == 1.0


def test_eta_counts_strictly_below():
    eta, cnt = margins.eta_curve([0.0, 0.1, 0.2, 0.2, 1.0], [0.1, 0.2, 0.21, 5])
    np.testing.assert_array_equal(cnt, [1, 2, 4, 5])
    np.testing.assert_allclose(eta, [0.2, 0.4, 0.8, 1.0])


def test_expressibility_gap_needs_three_points():
    with pytest.raises(ValueError, match="a fit needs 3"):
        margins.expressibility_gap(np.full(50, 3.0), n_boot=0, eps_min=1e-3, eps_max=10.0, n_eps=41, fit_eps_max=0.5, fit_eta_max=0.3,
                                   min_count=10, ci=0.95)
    with pytest.raises(ValueError, match=">= 0"):
        margins.eta_curve([-1.0, 1.0], [0.5])


def test_margin_summary_quantiles_hard_core_and_correlations():
    rng = np.random.default_rng(17)
    m = rng.exponential(1.0, 20_000)
    nll = np.exp(-m) * 3 + rng.normal(0, 0.01, m.size)  # small margin -> high loss
    s = margins.margin_summary(m, nll, nll * 0.5, threshold=0.5, hard_core_quantile=0.05)
    assert s["margin_q50"] == pytest.approx(np.log(2), rel=0.03)
    assert s["margin_q05"] == pytest.approx(-np.log(0.95), rel=0.1)
    assert s["p_margin_below"] == pytest.approx(1 - np.exp(-0.5), abs=0.01)
    assert s["hard_core_margin"] == s["margin_q05"] and s["hard_core_fraction"] == pytest.approx(0.05, abs=1e-3)
    assert s["spearman_margin_nll"] < -0.9 and s["spearman_margin_entropy"] < -0.9
    assert s["perplexity"] == pytest.approx(np.exp(nll.mean()))
    assert 0.05 < s["hard_core_nll_share"] < 1


# --- Fisher information metric -----------------------------------------------------------------


def _unembedding_case(seed, V, d, n, scale):
    """Random float32 unembedding W [V, d], bias [V] and states H [n, d] (scale: spread of H)."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((V, d)).astype(np.float32)
    b = rng.standard_normal(V).astype(np.float32)
    return W, b, (rng.standard_normal((n, d)) * scale).astype(np.float32)


@pytest.mark.parametrize("softcap", [None, 4.0])
def test_fisher_trace_and_spectrum_equal_bruteforce(softcap):
    V = 64
    W, b, H = _unembedding_case(18, V, 12, 7, 1.5)
    r = fisher.fisher_metrics(H, W, b, softcap, max_tokens=V, tail_mass=0.0, batch=3)
    for i in range(len(H)):
        G = fisher.fisher_matrix_bruteforce(H[i], W, b, softcap)
        ev = np.linalg.eigvalsh(G)
        assert r["trace"][i] == pytest.approx(np.trace(G), rel=1e-5)
        assert r["trace_topk"][i] == pytest.approx(np.trace(G), rel=1e-5)
        st = fisher.spectrum_stats(ev)
        assert r["effective_rank"][i] == pytest.approx(st["effective_rank"], rel=1e-4)
        assert r["participation_ratio"][i] == pytest.approx(st["participation_ratio"], rel=1e-4)
        assert r["top_eigenvalue"][i] == pytest.approx(ev.max(), rel=1e-5)


@pytest.mark.parametrize("softcap", [None, 4.0])
def test_fisher_uses_the_decoding_logits(softcap):
    """One home for logits from the unembedding (issue 20 clean-up): fisher_metrics's margin and entropy are
    those of measures.decoding.unembed_logits (float32 BLAS rounding apart), and its trace is the brute-force Jacobian formula's
    written out here with the slope that unembed_logits returns (the pre-change formula of fisher.py)."""
    from scipy.special import log_softmax

    from llmgeom.measures import decoding as dec

    V = 80
    W, b, H = _unembedding_case(19, V, 10, 9, 2.0)
    r = fisher.fisher_metrics(H, W, b, softcap, max_tokens=V, tail_mass=0.0, batch=4)
    z, slope = dec.unembed_logits(H, W, b, softcap, return_slope=True)
    top2 = -np.partition(-z, 1, axis=1)[:, :2]
    np.testing.assert_allclose(r["margin"], top2[:, 0] - top2[:, 1], rtol=1e-5, atol=1e-5)
    logp = log_softmax(z.astype(np.float64), axis=1)
    np.testing.assert_allclose(r["entropy"], -(np.exp(logp) * logp).sum(1), rtol=1e-5)
    assert (slope is None) == (softcap is None)
    s = np.ones_like(logp) if slope is None else slope
    u = H.astype(np.float64) @ W.T.astype(np.float64) + b
    if softcap:
        np.testing.assert_allclose(s, 1 - np.tanh(u / softcap) ** 2, atol=1e-6)
    J = s[:, :, None] * W.astype(np.float64)[None]  # [n, V, d]
    p = np.exp(logp)
    mu = np.einsum("nv,nvd->nd", p, J)
    want = np.einsum("nv,nvd->n", p, J * J) - (mu * mu).sum(1)
    np.testing.assert_allclose(r["trace"], want, rtol=1e-4)


def test_fisher_bruteforce_equals_expected_score_outer_product():
    """G(h) = E_p[grad log p grad log p^T] with the gradient from autograd (independent of the formula)."""
    rng = np.random.default_rng(19)
    V, d, cap = 20, 5, 3.0
    W = torch.tensor(rng.standard_normal((V, d)))
    h0 = torch.tensor(rng.standard_normal(d))
    h = h0.clone().requires_grad_(True)
    logp = torch.log_softmax(cap * torch.tanh((W @ h) / cap), -1)
    p = logp.exp().detach()
    G = torch.zeros(d, d, dtype=torch.float64)
    for v in range(V):
        (g,) = torch.autograd.grad(logp[v], h, retain_graph=True)
        G += p[v] * torch.outer(g, g)
    np.testing.assert_allclose(fisher.fisher_matrix_bruteforce(h0.numpy(), W.numpy(), None, cap), G.numpy(),
                               rtol=1e-9, atol=1e-12)


def test_fisher_truncated_spectrum_bounds_and_peaked_trace():
    rng = np.random.default_rng(20)
    V, d = 400, 16
    W = rng.standard_normal((V, d)).astype(np.float32)
    H = (rng.standard_normal((4, d)) * 3).astype(np.float32)
    full = fisher.fisher_metrics(H, W, max_tokens=V, tail_mass=0.0, batch=32)
    part = fisher.fisher_metrics(H, W, max_tokens=10, tail_mass=0.0, batch=32)
    np.testing.assert_allclose(part["trace"], full["trace"], rtol=1e-9)  # the trace always uses all tokens
    assert np.all(part["trace_topk"] <= full["trace"] * (1 + 1e-9)) and np.all(part["n_tokens"] == 10)
    assert np.all((part["mass_topk"] > 0) & (part["mass_topk"] <= 1 + 1e-12))
    # nearly one-hot distribution: tiny trace, still non-negative and accurate (float64)
    Hp = (W[0] * 20).reshape(1, d)
    r = fisher.fisher_metrics(Hp, W, max_tokens=V, tail_mass=0.0, batch=32)
    G = fisher.fisher_matrix_bruteforce(Hp[0], W)
    assert r["trace"][0] >= 0 and r["trace"][0] == pytest.approx(np.trace(G), rel=1e-3, abs=1e-12)


def test_fisher_shape_errors():
    with pytest.raises(ValueError, match="share d"):
        fisher.fisher_metrics(np.zeros((2, 3)), np.zeros((5, 4)), max_tokens=1024, tail_mass=1e-6, batch=32)


# --- tables from a synthetic activation file ---------------------------------------------------


@pytest.fixture(scope="module")
def corpus_h5(tmp_path_factory):
    """A corpus activation file: 3 layers (+ embeddings) of 5-d data in 24 dims, uniform margins."""
    rng = np.random.default_rng(21)
    n_s, L, d, n_p = 300, 3, 24, 3000
    base = _embed(rng.standard_normal((n_s, 5)), d, rng)
    R = np.stack([base * (1 + layer) for layer in range(L + 1)], axis=1).astype(np.float32)
    path = tmp_path_factory.mktemp("lsm") / "corpus.h5"
    shapes = {"tokens/residual_sample": ((n_s, L + 1, d), "float32"),
              "tokens/final_normed_sample": ((n_s, d), "float32"),
              "tokens/sample_prompt": ((n_s,), "int32"), "tokens/sample_position": ((n_s,), "int32"),
              "tokens/margin": ((n_p,), "float32"), "tokens/nll": ((n_p,), "float32"),
              "tokens/entropy": ((n_p,), "float32"), "tokens/prompt": ((n_p,), "int32"),
              "tokens/position": ((n_p,), "int32")}
    w = ActivationWriter(path, {"model": "toy", "prompt_set": "corpus", "d_model": d, "vocab_size": 50}, shapes)
    w.write("tokens/residual_sample", slice(None), R)
    w.write("tokens/final_normed_sample", slice(None), R[:, -1])
    w.write("tokens/sample_prompt", slice(None), np.arange(n_s) // 10)
    w.write("tokens/sample_position", slice(None), np.arange(n_s) % 10 + 1)
    m = rng.uniform(0, 1, n_p).astype(np.float32)
    w.write("tokens/margin", slice(None), m)
    w.write("tokens/nll", slice(None), (2 - m + rng.normal(0, 0.1, n_p)).astype(np.float32))
    w.write("tokens/entropy", slice(None), (2 - m).astype(np.float32))
    w.write("tokens/prompt", slice(None), np.arange(n_p) // 100)
    w.write("tokens/position", slice(None), np.arange(n_p) % 100 + 1)
    w.commit()
    return path


def test_id_table_disagreement_profile_and_curvature_tables(corpus_h5):
    idt = intrinsic_dimension_table(corpus_h5, model="toy", estimators=["twonn", "mle"], n_subsamples=2,
                                    subsample_size=200, seed=0, min_points=20, mle_k=10, disagreement_factor=1.5,
                                    gride_max_rank=64, gride_plateau_tol=0.1, passage_resamples=20, ci=0.9)
    assert duplicate_keys(idt, "intrinsic_dimension").empty
    cross = idt[idt.quantity == "token_id_cross_passage"]
    # the passages (10 consecutive samples) of i.i.d. points do not cluster: the cross-passage TwoNN reads the same
    assert len(cross) == 4 and (cross.estimator == "twonn").all() and cross.id_mean.between(4, 6.5).all()
    assert cross.id_iso.isna().all() and (cross.n_passages == 30).all() and (cross.passages_per_resample == 15).all()
    idt_all, idt = idt, idt[idt.quantity == "token_id"]
    # passage half-sample intervals: 20 replicates recentred on id_mean, a basic interval around it
    assert (idt_all.id_mean_lo < idt_all.id_mean).all() and (idt_all.id_mean < idt_all.id_mean_hi).all()
    reps = np.vstack([parse_replicates(t) for t in idt_all.id_mean_replicates])
    assert reps.shape == (12, 20) and np.allclose(reps.mean(axis=1), idt_all.id_mean)
    assert (idt_all.interval == lsm.PASSAGE_INTERVAL).all() and (idt_all.ci == 0.9).all()
    assert len(idt) == 8 and set(idt.estimator) == {"twonn", "mle_mg"}  # 'mle' is stored under its real name
    assert idt.id_mean.between(4, 6.5).all()
    assert (idt.estimator_ratio >= 1).all() and not idt.estimators_disagree.any()
    assert (idt[idt.estimator == "mle_mg"].mle_k == 10).all() and idt[idt.estimator == "twonn"].mle_k.isna().all()
    # residual-stream layer l (0 = embeddings) sits at l / L: the output of block l - 1, (l - 1 + 1) / L
    np.testing.assert_array_equal(idt.relative_depth, idt.layer / 3)
    strict = intrinsic_dimension_table(corpus_h5, model="toy", estimators=["twonn", "mle"], n_subsamples=2,
                                       subsample_size=200, seed=0, min_points=20, mle_k=10,
                                       disagreement_factor=1.0000001, gride_max_rank=64, gride_plateau_tol=0.1,
                                       passage_resamples=0, ci=0.9)
    assert strict.estimators_disagree.any() and (strict.id_mean_replicates == "").all()
    assert strict.id_mean_lo.isna().all() and (strict.interval == "").all()
    np.testing.assert_array_equal(strict.id_mean, idt_all.id_mean)  # the resamples do not move the estimates
    prof = lsm.id_profile_table(idt_all, shape_tol=0.1, profile_layers="blocks", peak_depth_tol=0.1, ci=0.9)
    assert duplicate_keys(prof, "id_profile").empty
    assert len(prof) == 3 and set(prof.columns) >= {"peak_layer", "peak_id", "shape", "peak_relative_depth"}
    assert sorted(zip(prof.quantity, prof.estimator)) == [("token_id", "mle_mg"), ("token_id", "twonn"),
                                                          ("token_id_cross_passage", "twonn")]
    for c in lsm.PROFILE_INTERVAL_COLUMNS:
        assert (prof[f"{c}_lo"] <= prof[c]).all() and (prof[c] <= prof[f"{c}_hi"]).all(), c
        assert prof[f"{c}_replicates"].map(lambda t: parse_replicates(t).size).eq(20).all()
    assert prof.peak_relative_depth_lo.ge(0).all() and prof.peak_relative_depth_hi.le(1).all()
    assert (prof.n_resamples == 20).all() and prof.shape_replicates.str.split().str.len().eq(20).all()
    # replicate b of each column comes from the same replicate profile: peak_id_over_d_model_b = peak_id_b / d
    tw = prof[(prof.quantity == "token_id") & (prof.estimator == "twonn")].iloc[0]
    np.testing.assert_allclose(parse_replicates(tw.peak_id_over_d_model_replicates),
                               parse_replicates(tw.peak_id_replicates) / 24, rtol=1e-8)
    # the last block's replicates are the final_id replicates (the profile's last layer)
    last_layer = idt_all[(idt_all.quantity == "token_id") & (idt_all.estimator == "twonn") & (idt_all.layer == 3)]
    np.testing.assert_allclose(parse_replicates(tw.final_id_replicates),
                               parse_replicates(last_layer.id_mean_replicates.iloc[0]), rtol=1e-8)
    prof0 = lsm.id_profile_table(strict, shape_tol=0.1, profile_layers="blocks", peak_depth_tol=0.1, ci=0.9)
    assert prof0.peak_id_lo.isna().all() and (prof0.peak_id_replicates == "").all() and (prof0.n_resamples == 0).all()
    prof = prof[prof.quantity == "token_id"]
    # LSM's values are over six models, none of them ours: not attached by quantity alone (issue 19); they are
    # compared in claims.csv
    assert (prof.peak_id_over_d_model_published == "").all() and (prof.peak_id_published == "").all()
    assert (prof.source == "measured").all()
    cols = list(prof.columns)
    assert cols.index("peak_id_published") == cols.index("peak_id") + 1
    cv = curvature_table(corpus_h5, idt, model="toy", k=20, n_points=250, min_points=20, id_estimator="twonn", seed=0,
                         n_boot=20, ci=0.9)
    assert len(cv) == 4 and cv.m.isin([5, 6]).all() and (cv.k == 20).all()  # m = round(TwoNN ID)
    assert (cv.curvature_mean < 1e-6).all()  # a linear 5-d cloud is flat at m >= 5
    assert (cv.n == 250).all()
    # curvature_mean's interval: a bootstrap over the passages (tokens/sample_prompt), the same resamples at
    # every layer; the replicates reproduce the interval and the corrected value
    assert (cv.boot_unit == "passages").all() and (cv.n_boot == 20).all()
    for _, r in cv.iterrows():
        reps = parse_replicates(r.curvature_mean_replicates)
        assert reps.size == 20 and np.isfinite(reps).all()
        lo, hi = bootstrap_interval(r.curvature_mean, reps, ci=0.9, method="basic", bounds=(0.0, 1.0))
        assert (r.curvature_mean_lo, r.curvature_mean_hi) == pytest.approx((lo, hi))
        assert r.curvature_mean_bc == pytest.approx(bias_corrected(r.curvature_mean, reps, bounds=(0.0, 1.0)))
        assert 0 <= r.curvature_mean_lo <= r.curvature_mean_hi <= 1
    # known answer at layer 2: replicate b = mean of the anchors' values, each weighted by the times its passage
    # (sample index // 10 in this file) is drawn in resample b
    sel = np.sort(np.random.default_rng(0).choice(300, size=250, replace=False))
    with h5py.File(corpus_h5, "r") as f:
        pts = f["tokens/residual_sample"][sel, 2, :].astype(np.float64)
    r2 = local_pca_residuals(pts, k=20, m=int(cv.m.iloc[2]), min_points=20)
    w = np.array(list(margins.PassageBootstrap(sel // 10, sel.size, n_boot=20, seed=derived_seed(0, "passages"))))
    wa = w[:, r2["anchor_rows"]]
    np.testing.assert_allclose(parse_replicates(cv.curvature_mean_replicates.iloc[2]),
                               wa @ r2["values"] / wa.sum(axis=1), rtol=1e-6, atol=1e-12)
    # seeded: the same arguments give the same replicates; n_boot = 0: no interval
    kw = dict(model="toy", k=20, n_points=250, min_points=20, id_estimator="twonn", seed=0, ci=0.9)
    again = curvature_table(corpus_h5, idt, n_boot=20, **kw)
    assert list(again.curvature_mean_replicates) == list(cv.curvature_mean_replicates)
    none = curvature_table(corpus_h5, idt, n_boot=0, **kw)
    assert none.curvature_mean_lo.isna().all() and (none.curvature_mean_replicates == "").all()
    np.testing.assert_array_equal(none.curvature_mean, cv.curvature_mean)


def test_id_profile_row_for_an_estimator_without_two_measured_layers():
    """An estimator measured at fewer than two blocks gets a row (NaN, reason in ``note``) instead of none; the
    verdict is taken over the estimators with a profile."""
    ids = {"twonn": [9.0, 3.0, 6.0, 8.0, 4.0], "mle_mg": [9.0, np.nan, 5.0, np.nan, np.nan]}
    idt = pd.DataFrame([dict(model="toy", prompt_set="s", estimator=e, layer=layer, relative_depth=layer / 4,
                             d_model=16, id_mean=v) for e, vs in ids.items() for layer, v in enumerate(vs)])
    prof = lsm.id_profile_table(idt, shape_tol=0.1, profile_layers="blocks", peak_depth_tol=0.1,
                                ci=0.95).set_index("estimator")
    assert list(prof.index) == ["mle_mg", "twonn"] and (prof.quantity == "token_id").all()
    assert prof.peak_id_lo.isna().all() and (prof.interval == "").all()  # no replicates: no interval
    m, t = prof.loc["mle_mg"], prof.loc["twonn"]
    assert np.isnan(m.peak_id) and pd.isna(m.peak_layer) and pd.isna(m["shape"]) and m.embedding_id == 9.0
    assert m.note == "no profile: 1 measured layer(s) (blocks with a finite id_mean), at least 2 needed"
    assert (t.peak_layer, t.peak_id, t["shape"], t.note) == (3, 8.0, "rise-then-fall", "")
    assert t.peak_relative_depth == 0.75 and t.peak_id_over_d_model == 0.5 and t.n_layers == 4
    assert (prof.n_estimators == 1).all() and prof.estimators_agree.all()
    assert (prof.shape_verdict == "rise-then-fall").all() and list(prof.agrees_with) == ["", "twonn"]


@pytest.fixture(scope="module")
def mixed_h5(tmp_path_factory):
    """A last-token activation file: 120 prompts, 4 layers (+ embeddings) of 3-d data in 16 dims whose
    spread rises then falls over depth (the ID does not change: a linear 3-d cloud at every layer)."""
    rng = np.random.default_rng(22)
    n, L, d = 120, 4, 16
    base = _embed(rng.standard_normal((n, 3)), d, rng)
    R = np.stack([base * s for s in (1, 2, 3, 2, 1)], axis=1).astype(np.float32)
    path = tmp_path_factory.mktemp("lsm") / "mixed.h5"
    w = ActivationWriter(path, {"model": "toy", "prompt_set": "mixed", "d_model": d, "vocab_size": 50},
                         {"last_token/residual": ((n, L + 1, d), "float32")})
    w.write("last_token/residual", slice(None), R)
    w.commit()
    return path


def test_gride_linear_dimensions_last_token_and_agreement(corpus_h5, mixed_h5):
    kw = dict(model="toy", estimators=["twonn", "mle_mg", "gride"], min_points=20, mle_k=10, gride_max_rank=32,
              disagreement_factor=1.5, gride_plateau_tol=0.1)
    res = dict(passage_resamples=5, ci=0.95)
    idt, scale = intrinsic_dimension_table(corpus_h5, n_subsamples=2, subsample_size=200, seed=0, return_scale=True,
                                           **kw, **res)
    assert len(idt) == 16 and set(idt.quantity) == {"token_id", "token_id_cross_passage"}
    gr = idt[(idt.estimator == "gride") & (idt.layer > 0)]  # GRIDE resampled too: the plateau per half-sample
    assert gr.id_mean_lo.notna().all() and (gr.id_mean_lo <= gr.id_mean).all() and (gr.id_mean <= gr.id_mean_hi).all()
    assert (gr.id_mean_replicates.str.split().str.len() == 5).all()
    assert (scale.quantity == "token_id").all() and duplicate_keys(scale, "gride_scale").empty
    idt16, idt = idt, idt[idt.quantity == "token_id"]
    g = idt[idt.estimator == "gride"]
    assert g.id_mean.between(4.25, 5.75).all()  # the cloud is 5-d
    # linear dimensions of the same points: a 5-d Gaussian cloud needs 5 PCs, its PR lies in (1, 5]
    assert (idt.n_pc99 == 5).all() and idt.participation_ratio.between(3.0, 5.0).all()
    assert list(scale.columns) == lsm.gride_scale_columns()
    assert len(scale) == 4 * 5 and set(scale.n1) == {1, 2, 4, 8, 16} and (scale.n2 == 2 * scale.n1).all()
    assert scale.groupby("layer").in_plateau.any().all()
    # the per-layer ID is the same whether or not GRIDE shares the neighbour graph
    solo = intrinsic_dimension_table(corpus_h5, n_subsamples=2, subsample_size=200, seed=0,
                                     **{**kw, "estimators": ["twonn"]}, **res)
    for q in ("token_id", "token_id_cross_passage"):  # the cross-passage TwoNN does not depend on the others either
        np.testing.assert_array_equal(solo[solo.quantity == q].id_mean,
                                      idt16[(idt16.quantity == q) & (idt16.estimator == "twonn")].id_mean)
    last, last_scale = lsm.last_token_id_table(mixed_h5, seed=0, **kw, **res)
    assert len(last) == 15 and (last.quantity == "last_token_id").all() and (last.n == 120).all()
    assert (last.n_subsamples == 1).all() and (last.id_std == 0).all() and (last.note == "").all()
    # prompt half-samples: one unit per prompt (60 of 120 per replicate), every estimator, recentred on id_mean
    assert (last.n_passages == 120).all() and (last.passages_per_resample == 60).all()
    assert (last.interval == lsm.PROMPT_INTERVAL).all() and last.id_mean_lo.notna().all()
    for r in last.itertuples():
        rep = parse_replicates(r.id_mean_replicates)
        assert rep.size == 5 and np.isfinite(rep).all() and np.mean(rep) == pytest.approx(r.id_mean, rel=1e-9)
    none, _ = lsm.last_token_id_table(mixed_h5, seed=0, **kw, passage_resamples=0, ci=0.95)
    assert none.id_mean_lo.isna().all() and (none.id_mean_replicates == "").all()
    np.testing.assert_array_equal(none.id_mean, last.id_mean)  # the intervals do not move the estimate
    # a layer with fewer distinct points than min_points (in real files: layer 0, the final tokens' embeddings)
    # is reported, not fatal: NaN IDs, the distinct count and the reason
    few, _ = lsm.last_token_id_table(mixed_h5, seed=0, **{**kw, "min_points": 121}, **res)
    assert len(few) == 15 and few.id_mean.isna().all() and (few.n == 120).all()
    assert few.note.str.contains("too few distinct points").all()
    # no profile from NaN layers, but a row per estimator that says so (NaN values, the reason in `note`)
    pf = lsm.id_profile_table(pd.concat([idt, few]), shape_tol=0.1, profile_layers="blocks", peak_depth_tol=0.1,
                              ci=0.95)
    nop, tok = pf[pf.quantity == "last_token_id"], pf[pf.quantity == "token_id"]
    assert sorted(nop.estimator) == ["gride", "mle_mg", "twonn"] and (nop.n_layers == 4).all()
    assert nop.peak_id.isna().all() and nop["shape"].isna().all() and (nop.agrees_with == "").all()
    assert nop.note.str.contains("0 measured layer").all() and (tok.note == "").all() and tok.peak_id.notna().all()
    assert (nop.shape_verdict == "none (no estimator has a profile)").all() and (nop.n_estimators == 0).all()
    assert last[last.estimator == "gride"].id_mean.between(2.5, 3.5).all() and (last.n_pc99 == 3).all()
    prof = lsm.id_profile_table(pd.concat([idt, last]), peak_depth_tol=0.1, shape_tol=0.1, profile_layers="blocks",
                                ci=0.95)
    assert len(prof) == 6 and set(prof.quantity) == {"token_id", "last_token_id"}
    assert duplicate_keys(prof, "id_profile").empty
    assert (prof.n_estimators == 3).all() and prof.agrees_with.str.contains(";").any()
    for _, grp in prof.groupby("quantity"):
        agree = grp["shape"].nunique() == 1 and np.ptp(grp.peak_relative_depth) <= 0.1
        assert (grp.estimators_agree == agree).all()
        assert (grp.shape_verdict == (grp["shape"].iloc[0] if agree else "none (estimators disagree)")).all()
    # published peaks: LSM's beside token positions, Cheng et al.'s GRIDE peaks beside the last-token GRIDE row
    # (only beside a model the paper measured: "toy" gets none; the same rows named opt-125m get Cheng's)
    assert (prof.peak_id_published == "").all()
    named = lsm.id_profile_table(pd.concat([idt, last]).assign(model="opt-125m"), peak_depth_tol=0.1, shape_tol=0.1,
                                 profile_layers="blocks", ci=0.95)
    lg = named[(named.quantity == "last_token_id") & (named.estimator == "gride")]
    assert lg.peak_id_published.str.contains("23.4").all() and lg.peak_id_published_on.str.contains("Cheng").all()
    assert (named[(named.quantity == "last_token_id") & (named.estimator != "gride")].peak_id_published == "").all()
    strict = lsm.id_profile_table(pd.concat([idt, last]), peak_depth_tol=0.0, shape_tol=0.1, profile_layers="blocks",
                                  ci=0.95)
    assert (strict.agrees_with.str.split(";").str.len() <= prof.agrees_with.str.split(";").str.len()).all()


def test_margin_tables_on_uniform_margins(corpus_h5):
    t = margin_tables(corpus_h5, model="toy", n_boot=20, min_count=10, threshold=0.5, hard_core_quantile=0.05, hard_core_thresholds=(0.05, 0.1), eps_min=1e-3, eps_max=10.0, n_eps=41, fit_eps_max=0.5, fit_eta_max=0.3, ci=0.95, seed=0, hist_bins=60)
    assert set(t) == {"margins", "eta_curve", "expressibility_gap", "margin_histogram"}
    fit = t["expressibility_gap"].iloc[0]
    assert fit.beta == pytest.approx(1, rel=0.1) and fit.alpha == pytest.approx(1, rel=0.1)
    mg = t["margins"].iloc[0]
    assert mg.n_positions == 3000 and mg.spearman_margin_nll < -0.8 and mg.spearman_margin_entropy == pytest.approx(-1)
    assert len(t["eta_curve"]) == 41 and t["margin_histogram"]["count"].sum() + t["margin_histogram"].n_above.iloc[0] == 3000
    mvp = margin_vs_perplexity_table(pd.concat([t["margins"], t["margins"].assign(model="toy2", margin_q50=0.2,
                                                                                       perplexity=9.0),
                                                    t["margins"].assign(model="toy3", margin_q50=0.1,
                                                                        perplexity=20.0)]))
    assert len(mvp) == 3 and mvp.spearman_rho_across_models.iloc[0] == pytest.approx(-1.0)
    # exact permutation p (two-sided): 2 of the 3! pairings are as extreme as a perfect order, p = 1/3 (the t
    # approximation gives 0)
    assert mvp.spearman_p_across_models.iloc[0] == pytest.approx(1 / 3)
    assert {"median_margin_lo", "median_margin_hi", "median_margin_replicates", "log_perplexity_replicates",
            "perplexity_lo", "hard_core_margin_replicates"} <= set(mvp.columns)
    assert mvp.median_margin_replicates.iloc[0] == mg.margin_q50_replicates
    four = margin_vs_perplexity_table(pd.concat([t["margins"].assign(model=f"m{i}", margin_q50=0.1 * i,
                                                                     perplexity=30.0 - i) for i in range(4)]))
    assert four.spearman_rho_across_models.iloc[0] == pytest.approx(-1.0)
    assert four.spearman_p_across_models.iloc[0] == pytest.approx(1 / 12)
    # the directional claim's one-sided p (rho < 0): 1/24 for four models in perfect inverse order, 1/6 for three
    assert four.spearman_p_negative_across_models.iloc[0] == pytest.approx(1 / 24)
    assert mvp.spearman_p_negative_across_models.iloc[0] == pytest.approx(1 / 6)
    # issue 48: every margin statistic the across-size claims read has a passage-bootstrap interval and replicates
    for c in ("margin_q05", "margin_q25", "margin_q50", "margin_q75", "margin_q95", "hard_core_margin",
              "p_margin_below", "mean_nll", "perplexity", "hard_core_frac_lt_0.05", "hard_core_frac_lt_0.1"):
        assert mg[f"{c}_lo"] <= mg[c] <= mg[f"{c}_hi"], c
        assert parse_replicates(mg[f"{c}_replicates"]).size == 20, c
    assert mg.hard_core_margin_replicates == mg.margin_q05_replicates
    # one resampling of passages for the three tables: with the threshold at a hard-core threshold, replicate b of
    # Pr(m < t) is replicate b of hard_core_frac_lt_t
    t2 = margin_tables(corpus_h5, model="toy", n_boot=20, min_count=10, threshold=0.1, hard_core_quantile=0.05,
                       hard_core_thresholds=(0.1,), eps_min=1e-3, eps_max=10.0, n_eps=41, fit_eps_max=0.5,
                       fit_eta_max=0.3, ci=0.95, seed=0, hist_bins=60)["margins"].iloc[0]
    assert t2.p_margin_below_replicates == t2["hard_core_frac_lt_0.1_replicates"]
    assert t2["hard_core_frac_lt_0.1_replicates"] == mg["hard_core_frac_lt_0.1_replicates"]
    gap = t["expressibility_gap"].iloc[0]
    assert gap.boot_unit == "passages" and parse_replicates(gap.beta_replicates).size == 20
    assert gap.r2_lo < gap.r2_hi <= 1 and gap.fit_eta_max == 0.3 and gap.fit_eps_hi <= 0.3 + 1e-12
    ec = t["eta_curve"]
    assert ec[ec.in_fit].eta.max() <= 0.3
    # issue 11: fraction of positions below fixed thresholds (uniform margins on [0, 1]: ~ the threshold)
    for t_ in (0.05, 0.1):
        s_ = f"hard_core_frac_lt_{t_:g}"
        assert mg[s_] == pytest.approx(t_, abs=0.015)
        assert mg[f"{s_}_lo"] < mg[s_] < mg[f"{s_}_hi"] and mg[f"{s_}_lo"] <= mg[f"{s_}_bc"] <= mg[f"{s_}_hi"]
        assert s_ in mvp.columns
    assert mg.hard_core_boot == "passages" and mg.hard_core_n_boot == 20
    # LSM's (and its replication's) values name no single model: not attached to our rows (issue 19)
    assert mg.hard_core_margin_published == "" and (mvp.hard_core_margin_published == "").all()
    assert "margin_q50_published" in t["margins"] and "median_margin_published" in mvp
    fit = t["expressibility_gap"].iloc[0]
    assert fit.beta_published == "" and fit.r2_published == "" and fit.source == "measured"


def test_fraction_below_known_answers_and_intervals():
    m = np.r_[np.zeros(5), np.full(45, 0.07), np.ones(50)]  # 5% below 0.05, 50% below 0.1
    out = margins.fraction_below(m, (0.05, 0.1), n_boot=400, seed=0, ci=0.95)
    assert out["hard_core_frac_lt_0.05"] == 0.05 and out["hard_core_frac_lt_0.05_count"] == 5
    assert out["hard_core_frac_lt_0.1"] == 0.5
    lo, hi = out["hard_core_frac_lt_0.1_lo"], out["hard_core_frac_lt_0.1_hi"]
    assert 0.38 < lo < 0.45 and 0.55 < hi < 0.62  # binomial: 0.5 +- 1.96 * 0.05
    # clustered positions: resampling whole passages widens the interval when passages differ
    groups = np.repeat(np.arange(10), 10)
    m2 = np.where(groups < 5, 0.0, 1.0)  # half the passages entirely in the hard core
    iid = margins.fraction_below(m2, (0.05,), n_boot=400, seed=0, ci=0.95)
    clu = margins.fraction_below(m2, (0.05,), groups=groups, n_boot=400, seed=0, ci=0.95)
    w = lambda o: o["hard_core_frac_lt_0.05_hi"] - o["hard_core_frac_lt_0.05_lo"]  # noqa: E731
    assert w(clu) > 2 * w(iid) and clu["hard_core_boot"] == "passages"
    none = margins.fraction_below(m, (0.05,), n_boot=0, ci=0.95)
    assert np.isnan(none["hard_core_frac_lt_0.05_lo"]) and none["hard_core_frac_lt_0.05"] == 0.05
    with pytest.raises(ValueError, match="thresholds"):
        margins.fraction_below(m, (0.0,), n_boot=200, ci=0.95)
    with pytest.raises(ValueError, match="per position"):
        margins.fraction_below(m, (0.05,), groups=np.arange(3), n_boot=200, ci=0.95)


def test_check_lsm_config():
    from llmgeom.pipeline.schema import apply_defaults, read_schema

    def check_lsm_config(c):  # the LSM sections' checks, on the config with its defaults filled in
        c = apply_defaults(json.loads(json.dumps(c)), read_schema())
        for check in (check_curvature, check_margins, check_fisher):
            check(c)

    cfg = {"prompts": {"sets": {"corpus": {"kind": "corpus"}, "mixed": {"kind": "mixed"}}},
           "margins": {"prompt_set": "corpus", "eps_min": 1e-3, "eps_max": 10, "fit_eps_max": 0.5},
           "fisher": {"prompt_set": "corpus"}, "curvature": {"id_estimator": "twonn"},
           "intrinsic_dimension": {"estimators": ["twonn"]}}
    check_lsm_config(cfg)
    with pytest.raises(ConfigError, match="fisher.prompt_set"):
        check_lsm_config({**cfg, "fisher": {"prompt_set": "mixed"}})
    with pytest.raises(ConfigError, match="curvature.id_estimator"):
        check_lsm_config({**cfg, "curvature": {"id_estimator": "mle"}})
    # 'mle' is the old name of 'mle_mg': either spelling matches the other
    check_lsm_config({**cfg, "curvature": {"id_estimator": "mle"},
                      "intrinsic_dimension": {"estimators": ["twonn", "mle_mg", "mle_lb"]}})


# --- corpus from a local text file (WikiText-103) ----------------------------------------------

WIKITEXT = """ 
 = Alpha Article = 
 
 The alpha article has a state @-@ of @-@ the @-@ art section with 1 @,@ 000 words and 3 @.@ 5 points . More text follows here in the first paragraph of it .
 
 = = History = = 
 
 A second paragraph that keeps going with plain words so that several passages can be cut from it .
 
 = Beta Article = 
 
 Beta starts here and also has enough words for one passage at least , maybe two if lucky .
"""


def test_text_file_passages_wikitext(tmp_path):
    p = tmp_path / "wiki.valid.tokens"
    p.write_text(WIKITEXT, encoding="utf-8")
    recs = text_file_passages(p, n=4, tokenizer=TOK, token_budget=8, rng=random.Random(0))
    # the most whole words within 8 tokens (one a word or punctuation run); the next word would not fit
    assert len(recs) == 4 and all(TOK.count(r["text"]) == r["meta"]["n_tokens"] <= 8 for r in recs)
    assert all(r["meta"]["n_words"] == len(r["text"].split()) >= 3 for r in recs)
    alltext = " ".join(r["text"] for r in text_file_passages(p, n=7, tokenizer=TOK, token_budget=8,
                                                             rng=random.Random(0)))
    assert "History" not in alltext and "=" not in alltext
    first = text_file_passages(p, n=7, tokenizer=TOK, token_budget=8, rng=random.Random(0))
    assert "state-of-the-art" in " ".join(r["text"] for r in first) or "1,000" in " ".join(r["text"] for r in first)
    assert {r["meta"]["title"] for r in first} == {"Alpha Article", "Beta Article"}
    recs2 = build_prompt_set("corpus", tokenizer=TOK, n=3, seed=1, token_budget=12, path=str(p))
    assert recs2 == build_prompt_set("corpus", tokenizer=TOK, n=3, seed=1, token_budget=12, path=str(p))
    assert recs2[0]["meta"]["source"] == "file" and len(recs2[0]["meta"]["file_sha256"]) == 64


def test_text_file_passages_errors(tmp_path):
    with pytest.raises(PromptDataError, match="does not exist.*WikiText-103"):
        build_prompt_set("corpus", tokenizer=TOK, n=3, seed=0, token_budget=64, path=str(tmp_path / "missing.tokens"))
    p = tmp_path / "small.txt"
    p.write_text("only a few words here", encoding="utf-8")
    with pytest.raises(PromptDataError, match="gives only 0 passages"):
        build_prompt_set("corpus", tokenizer=TOK, n=3, seed=0, token_budget=64, path=str(p))
    with pytest.raises(PromptDataError, match="only valid for kind corpus"):
        build_prompt_set("mixed", tokenizer=TOK, n=3, seed=0, token_budget=64, path=str(p))
