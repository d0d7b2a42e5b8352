"""Known-answer tests for llmgeom.measures.pca (Paper III sec. 4, value manifolds)."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from llmgeom.measures.pca import (ENTROPY_SIGN, H_MODEL_SIGN, SignConvention, ValueManifoldPCA, explained_variance,
                                  participation_ratio, pc_scores, standardize_columns, value_manifold_stats)


def _latent_cloud(n=200, d=30, noise=0.5, seed=0):
    rng = np.random.default_rng(seed)
    lat = rng.standard_normal(n)
    X = np.outer(lat, rng.standard_normal(d)) + noise * rng.standard_normal((n, d))
    return X, lat


# --- explained variance ---------------------------------------------------------------------


@pytest.mark.parametrize("standardize", [True, False])
def test_rank_one_cloud_pc1_is_one(standardize):
    rng = np.random.default_rng(1)
    t = rng.standard_normal(100)
    v = rng.standard_normal(20)
    v[3] = 0.0  # a constant column: dropped when standardizing, never divided by zero
    X = np.outer(t, v) + 5.0  # offset: the column means must be removed
    ev = explained_variance(X, standardize=standardize)
    assert abs(ev[0] - 1.0) < 1e-9
    assert abs(ev.sum() - 1.0) < 1e-12
    assert np.all(np.diff(ev) <= 1e-15)
    assert participation_ratio(ev) == pytest.approx(1.0, abs=1e-9)


def test_isotropic_gaussian():
    rng = np.random.default_rng(2)
    d = 10
    X = rng.standard_normal((5000, d))
    for standardize in (True, False):
        ev = explained_variance(X, standardize=standardize)
        assert ev.shape == (d,)
        assert 1.0 / d <= ev[0] < 1.3 / d
        assert participation_ratio(ev) == pytest.approx(d, rel=0.15)


def test_standardize_makes_scale_irrelevant():
    X, _ = _latent_cloud()
    scales = np.geomspace(1e-3, 1e3, X.shape[1])
    np.testing.assert_allclose(explained_variance(X * scales), explained_variance(X), atol=1e-10)
    # without standardizing, the largest-scale column dominates
    assert explained_variance(X * scales, standardize=False)[0] > 0.5


def test_rounding_noise_column_is_dropped():
    X, _ = _latent_cloud(n=50, d=5)
    X = np.hstack([X, np.full((50, 1), 0.1)])  # 0.1 is inexact: its mean is not exactly 0.1
    Z, kept = standardize_columns(X)
    assert kept.tolist() == [True] * 5 + [False]
    assert np.all(np.isfinite(Z))
    np.testing.assert_allclose(Z.std(axis=0), 1.0)


@pytest.mark.parametrize("shape", [(120, 30), (20, 50)])  # n > d and n < d
@pytest.mark.parametrize("standardize", [True, False])
def test_explained_variance_is_the_spectrum_of_the_value_manifold_pca(shape, standardize):
    """The spectrum-only path (singular values without vectors) gives scikit-learn's PCA shares, as the
    estimator reports them, to rounding; a constant column changes neither."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal(shape) @ rng.standard_normal((shape[1], shape[1])) + 4.0
    X[:, 2] = -1.25
    want = ValueManifoldPCA(standardize=standardize, n_components=1).fit(X).explained_variance_ratio_
    got = explained_variance(X, standardize=standardize)
    assert got.shape == want.shape == (min(shape[0], shape[1] - standardize),)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


def test_explained_variance_errors():
    with pytest.raises(ValueError, match="non-finite"):
        explained_variance(np.array([[0.0, 1.0], [np.nan, 2.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="variance"):
        explained_variance(np.ones((5, 3)))
    with pytest.raises(ValueError, match="2-D"):
        explained_variance(np.ones(5))


# --- participation ratio --------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5, 37])
def test_pr_equal_eigenvalues(k):
    assert participation_ratio(np.full(k, 3.7)) == pytest.approx(k, rel=1e-12)
    assert participation_ratio(np.r_[np.full(k, 0.2), np.zeros(4)]) == pytest.approx(k, rel=1e-12)


def test_pr_top10_is_the_published_definition():
    """Paper III's published code: PR of the 10 largest PCA eigenvalues (issue 11, point 3a)."""
    from llmgeom.measures.pca import participation_ratio_top

    lam = np.ones(40)
    assert participation_ratio(lam) == pytest.approx(40) and participation_ratio_top(lam) == pytest.approx(10)
    lam = np.r_[np.full(5, 2.0), np.full(100, 0.1)]  # any order
    assert participation_ratio_top(lam[::-1]) == pytest.approx((10 + 0.5) ** 2 / (5 * 4 + 5 * 0.01))
    assert participation_ratio_top([3.0, 1.0], top=10) == participation_ratio([3.0, 1.0])
    with pytest.raises(ValueError, match="top"):
        participation_ratio_top(lam, top=0)
    rng = np.random.default_rng(0)
    st = value_manifold_stats(rng.standard_normal((50, 80)), rng.standard_normal(50), n_boot=5, seed=0, ci=0.95)
    assert 1 <= st["participation_ratio_top10"] <= 10 < st["participation_ratio"]


def test_relative_depth_one_convention():
    from llmgeom.core.layers import relative_depth

    L = 30
    assert relative_depth(L - 1, L) == 1.0 == relative_depth(L, L, index="residual")
    assert relative_depth(0, L, index="residual") == 0.0
    for b in range(L):  # block b's output: the same depth in both indexings
        assert relative_depth(b, L) == relative_depth(b + 1, L, index="residual") == (b + 1) / L
    for bad in ((L, L, "block"), (-1, L, "block"), (L + 1, L, "residual"), (0, L, "layer")):
        with pytest.raises(ValueError):
            relative_depth(bad[0], bad[1], index=bad[2])


def test_pr_one_nonzero():
    assert participation_ratio([0.0, 5.0, 0.0]) == 1.0


def test_pr_errors():
    for bad in ([], [0.0, 0.0], [1.0, -1.0], [1.0, np.inf]):
        with pytest.raises(ValueError):
            participation_ratio(bad)


@settings(max_examples=200, deadline=None)
@given(
    arrays(
        np.float64,
        st.integers(1, 40),
        elements=st.one_of(st.just(0.0), st.floats(1e-300, 1e300)),
    ).filter(lambda a: a.max() > 0)
)
def test_pr_within_one_and_rank(lam):
    pr = participation_ratio(lam)
    assert 1.0 <= pr <= np.count_nonzero(lam)
    assert participation_ratio(lam * 1e-7) == pytest.approx(pr, rel=1e-9)  # scale invariant


# --- scores and sign convention -------------------------------------------------------------


def test_pc_scores_shape_and_sign_reference():
    X, lat = _latent_cloud()
    S = pc_scores(X, n_components=3)
    assert S.shape == (200, 3)
    S1 = pc_scores(-X, n_components=1, sign=ENTROPY_SIGN, reference=lat)[:, 0]
    S2 = pc_scores(X, n_components=1, sign=ENTROPY_SIGN, reference=lat)[:, 0]
    np.testing.assert_allclose(S1, S2, atol=1e-9)
    assert np.corrcoef(S2, lat)[0, 1] > 0.9
    with pytest.raises(ValueError):
        pc_scores(X, n_components=31)


def _planted(d=20, seed=0):
    """Rows t_i u + s_i w with t, s centred and orthogonal, u, w orthonormal: the covariance has exactly
    two non-zero eigenvalues |t|^2/n and |s|^2/n, so PC1 = 168/176, PC2 = 8/176 (unstandardized)."""
    t = np.array([-7.0, -5, -3, -1, 1, 3, 5, 7])
    s = np.array([1.0, -1, -1, 1, 1, -1, -1, 1])
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, 2)))
    return np.outer(t, q[:, 0]) + np.outer(s, q[:, 1]) + 3.0, t


@pytest.mark.parametrize("sign", [ENTROPY_SIGN, H_MODEL_SIGN])
def test_planted_rank1_direction_known_shares_and_rho(sign):
    X, t = _planted()
    for Xs, ref in ((X, 2 * t + 5), (-X, 2 * t + 5), (X, -t)):  # entropy-like references affine in t
        e = ValueManifoldPCA(standardize=False, n_components=2, sign=sign, n_boot=30, seed=0, ci=0.95).fit(Xs, ref)
        assert e.pc1_ == pytest.approx(168 / 176, abs=1e-12) and e.pc2_ == pytest.approx(8 / 176, abs=1e-12)
        assert e.participation_ratio_ == pytest.approx(176 ** 2 / (168 ** 2 + 8 ** 2), rel=1e-10)
        # PC1 is +-t itself: after the sign fix its Spearman and Pearson correlation with the reference is 1
        assert e.sign_corr_[0] == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(np.abs(e.scores_[:, 0]), np.abs(t), atol=1e-12)
        assert np.sign(e.scores_[:, 0] @ (ref - ref.mean())) == 1.0
    a = ValueManifoldPCA(standardize=False, sign=ENTROPY_SIGN).fit(X, t)
    b = ValueManifoldPCA(standardize=False, sign=ENTROPY_SIGN).fit(X, -t)
    assert a.sign_flipped_[0] != b.sign_flipped_[0]  # the entropy's direction, not the data's, decides
    np.testing.assert_allclose(a.scores_[:, 0], -b.scores_[:, 0], atol=1e-12)
    assert a.summary()["pc1_sign"] == "spearman(next_token_entropy) >= 0"
    assert SignConvention("h_exact_bits").label == "spearman(h_exact_bits) >= 0"
    with pytest.raises(ValueError, match="method"):
        SignConvention("x", "kendall")


def test_sign_convention_is_invariant_to_negating_x():
    X, lat = _latent_cloud()
    entropy = np.exp(lat)
    a = value_manifold_stats(X, entropy, n_boot=20, seed=0, ci=0.95)
    b = value_manifold_stats(-X, entropy, n_boot=20, seed=0, ci=0.95)
    assert a["spearman_rho"] == pytest.approx(0.986, abs=0.01)  # latent + noise 0.5 in 30 coordinates
    assert b["spearman_rho"] == pytest.approx(a["spearman_rho"], abs=1e-12)
    assert b["spearman_p"] == pytest.approx(a["spearman_p"], rel=1e-9)
    assert a["pc1_sign_flipped"] != b["pc1_sign_flipped"]
    for key in ("pc1", "pc2", "pc12", "participation_ratio"):
        assert b[key] == pytest.approx(a[key], abs=1e-12)


@pytest.mark.parametrize("shape", [(60, 100), (60, 20)])  # Gram [m, m] and covariance [d, d] branches
@pytest.mark.parametrize("standardize", [True, False])
def test_fast_bootstrap_equals_sklearn_on_the_same_resample(shape, standardize):
    """The batched Gram path of the bootstrap gives the shares of scikit-learn's PCA on X[idx[b]]."""
    rng = np.random.default_rng(4)
    n, d = shape
    X = rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) + 2.0
    X[:, 0] = 1.5  # constant: dropped
    X[:, 1] = np.where(np.arange(n) < 2, 1.0, 0.0)  # tied: constant in resamples that miss rows 0 and 1
    st, boot = value_manifold_stats(X, rng.random(n), n_boot=40, seed=9, ci=0.95, standardize=standardize,
                                    return_boot=True)
    idx = np.random.default_rng(9).integers(0, n, size=(40, n))  # the estimator's documented draw
    for b in range(40):
        ref = explained_variance(X[idx[b]], standardize)
        np.testing.assert_allclose(boot[b], [ref[0], ref[1], ref[0] + ref[1]], rtol=0, atol=1e-10)


@pytest.mark.parametrize("d", [2, 8])  # covariance and (centre-only: one-kernel) Gram branches
@pytest.mark.parametrize("standardize", [True, False])
def test_bootstrap_resample_of_one_distinct_row_is_nan(d, standardize):
    """n = 3 rows (two of them identical): a resample that draws one distinct row has no variance (NaN
    shares, not a rounding-noise spectrum); every other resample has the shares of scikit-learn's PCA."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, d))
    X[2] = X[1]
    st, boot = value_manifold_stats(X, np.array([0.1, 0.5, 0.9]), n_boot=60, seed=3, standardize=standardize,
                                    return_boot=True, ci=0.95)
    idx = np.random.default_rng(3).integers(0, 3, size=(60, 3))
    single = np.array([len(set(map(tuple, X[r]))) == 1 for r in idx])
    assert single.any() and (~single).any()
    assert np.isnan(boot[single]).all() and np.isfinite(boot[~single]).all()
    for b in np.flatnonzero(~single):
        ref = explained_variance(X[idx[b]], standardize)
        np.testing.assert_allclose(boot[b], [ref[0], ref[1] if ref.size > 1 else 0.0,
                                             ref[0] + (ref[1] if ref.size > 1 else 0.0)], rtol=0, atol=1e-10)


def test_constant_entropy_gives_nan_rho_no_flip():
    X, _ = _latent_cloud(n=30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN is documented; no ConstantInputWarning leaks out
        r = value_manifold_stats(X, np.ones(30), n_boot=5, seed=0, ci=0.95)
    assert np.isnan(r["spearman_rho"]) and r["pc1_sign_flipped"] is False


# --- bootstrap ------------------------------------------------------------------------------


def test_bootstrap_ci_contains_estimate_and_is_reproducible():
    X, lat = _latent_cloud()
    a = value_manifold_stats(X, lat, n_boot=200, seed=7, ci=0.95)
    assert set(a) >= {
        "n", "n_features", "pc1", "pc2", "pc12", "pc1_lo", "pc1_hi", "pc12_lo", "pc12_hi",
        "pc2_lo", "pc2_hi", "participation_ratio", "spearman_rho", "spearman_p",
        "pc1_sign_flipped",
    }
    assert a["n"] == 200 and a["n_features"] == 30 and a["n_boot_valid"] == 200
    assert a["pc1_lo"] <= a["pc1"] <= a["pc1_hi"]
    assert a["pc12_lo"] <= a["pc12"] <= a["pc12_hi"]
    assert 0 < a["pc1_lo"] < a["pc1_hi"] < 1 and a["pc2_lo"] <= a["pc2_hi"]
    assert a["pc12"] == pytest.approx(a["pc1"] + a["pc2"])
    assert 1.0 <= a["participation_ratio"] <= 30
    assert a == value_manifold_stats(X, lat, n_boot=200, seed=7, ci=0.95)
    c = value_manifold_stats(X, lat, n_boot=200, seed=8, ci=0.95)
    assert (c["pc1_lo"], c["pc1_hi"]) != (a["pc1_lo"], a["pc1_hi"])
    assert c["pc1"] == a["pc1"]  # the point estimate does not depend on the seed


def test_bootstrap_tiny_n_skips_degenerate_resamples():
    r = value_manifold_stats(np.eye(3), [1.0, 2.0, 3.0], n_boot=50, seed=0, ci=0.95)
    assert 0 < r["n_boot_valid"] < 50
    assert np.isfinite(r["pc1_lo"]) and np.isfinite(r["pc1_hi"])


def test_value_manifold_errors():
    X, lat = _latent_cloud(n=20)
    with pytest.raises(ValueError, match="at least 3"):
        value_manifold_stats(X[:2], lat[:2], n_boot=10, seed=0, ci=0.95)
    bad = X.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        value_manifold_stats(bad, lat, n_boot=10, seed=0, ci=0.95)
    with pytest.raises(ValueError, match="shape"):
        value_manifold_stats(X, lat[:-1], n_boot=10, seed=0, ci=0.95)
    with pytest.raises(ValueError, match="n_boot"):
        value_manifold_stats(X, lat, n_boot=0, seed=0, ci=0.95)
    with pytest.raises(ValueError, match="non-finite"):
        value_manifold_stats(X, np.r_[lat[:-1], np.nan], n_boot=10, seed=0, ci=0.95)


def test_duplicate_prompts_get_bit_identical_scores_and_tied_ranks():
    """Identical rows (e.g. layer-0 values of prompts ending in the same token) score bit-identically, so
    Spearman ranks them as exact ties: rho equals rho computed on the distinct rows' scores repeated."""
    from llmgeom.core.stats import spearman
    from llmgeom.measures.pca import ENTROPY_SIGN, ValueManifoldPCA

    rng = np.random.default_rng(3)
    base = rng.standard_normal((8, 40)) * rng.uniform(0.1, 3.0, 40)
    rows = rng.integers(0, 8, 150)
    X, H = base[rows], rng.random(8)[rows] + 0.01 * rng.standard_normal(150)
    est = ValueManifoldPCA(standardize=True, n_components=1, sign=ENTROPY_SIGN).fit(X, H)
    s = est.scores_[:, 0]
    assert len(np.unique(s)) == len(np.unique(rows))
    for r in np.unique(rows):
        assert len(set(s[rows == r].tolist())) == 1
    first = {r: s[np.flatnonzero(rows == r)[0]] for r in np.unique(rows)}
    want = spearman(np.array([first[r] for r in rows]), H)[0]
    assert est.sign_corr_[0] == pytest.approx(want, abs=0) and abs(want) > 0
