"""Known-answer tests for llmgeom.measures.intrinsic_dimension (LSM: intrinsic dimension)."""

import warnings

import numpy as np
import pytest
import skdim

from llmgeom.measures.neighbors import TooFewPointsError, deduplicate
from llmgeom.measures.intrinsic_dimension import (gride, gride_mle, gride_plateau, gride_scaling, id_estimates,
                                               id_subsamples, mle_id, twonn)


def _embed(Y, D, rng):
    """Embed [n, d] coordinates isometrically in D dims with a random orthonormal basis."""
    B, _ = np.linalg.qr(rng.standard_normal((D, Y.shape[1])))
    return Y @ B.T


@pytest.fixture(scope="module")
def linear5():
    rng = np.random.default_rng(0)
    return _embed(rng.standard_normal((2000, 5)), 500, rng)


@pytest.fixture(scope="module")
def linear5_dup(linear5):
    """1800 distinct rows + 200 exact copies (10%), shuffled."""
    rng = np.random.default_rng(1)
    X = np.vstack([linear5[:1800], linear5[rng.choice(1800, 200)]])
    return X[rng.permutation(len(X))], 200


@pytest.fixture(scope="module")
def sphere2():
    rng = np.random.default_rng(2)
    Y = rng.standard_normal((2000, 3))
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)  # uniform on the unit 2-sphere
    return _embed(Y, 500, rng)


# --- deduplicate ----------------------------------------------------------------------------


def test_deduplicate_keeps_first_occurrence_order():
    X = np.array([[3.0, 1], [1, 2], [3, 1], [0, 0], [1, 2], [-0.0, 0]])
    U, k = deduplicate(X)
    assert U.dtype == np.float64 and k == 3
    np.testing.assert_array_equal(U, [[3, 1], [1, 2], [0, 0]])


def test_deduplicate_in_float64_keeps_float32_neighbours_distinct():
    a = np.float32(1.0)
    X = np.array([[a, 0], [np.nextafter(a, np.float32(2)), 0]], dtype=np.float32)
    U, k = deduplicate(X)
    assert k == 0 and U.shape == (2, 2)


# --- TwoNN / MLE known answers --------------------------------------------------------------


def test_twonn_linear_manifold(linear5):
    r = twonn(linear5)
    assert r["id"] == pytest.approx(5.0, abs=0.5)
    assert r["n_points"] == 2000 and r["n_duplicates_removed"] == 0
    # same estimator as skdim on clean data (we only feed it exact NN distances)
    assert r["id"] == pytest.approx(skdim.id.TwoNN().fit(linear5).dimension_, rel=1e-8)


def test_twonn_with_duplicates(linear5_dup):
    X, n_dup = linear5_dup
    r = twonn(X)
    assert r["id"] == pytest.approx(5.0, abs=0.5)
    assert r["n_duplicates_removed"] == n_dup and r["n_points"] == len(X) - n_dup
    assert r["n_zero_distance_removed"] == 0


def test_mle_linear_manifold(linear5, linear5_dup):
    r = mle_id(linear5, k=20)
    assert r["id"] == pytest.approx(5.0, rel=0.10)
    assert r["id"] == pytest.approx(
        skdim.id.MLE().fit(linear5, n_neighbors=20).dimension_, rel=1e-8
    )
    X, n_dup = linear5_dup
    rd = mle_id(X, k=20)
    assert rd["id"] == pytest.approx(5.0, rel=0.10)
    assert rd["n_duplicates_removed"] == n_dup
    # the trap this guards against: raw skdim MLE collapses on duplicate rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert skdim.id.MLE().fit(X, n_neighbors=20).dimension_ < 1.0


def test_twonn_sphere(sphere2):
    assert twonn(sphere2)["id"] == pytest.approx(2.0, rel=0.10)


def test_zero_distance_after_exact_dedup_is_dropped():
    """Rows distinct in float64 whose squared difference underflows to 0 count as duplicates."""
    rng = np.random.default_rng(3)
    X = np.hstack([_embed(rng.standard_normal((300, 5)), 50, rng), np.zeros((300, 1))])
    near = X[:3].copy()
    near[:, -1] = 1e-200  # distinct row, but |x - y|^2 = 1e-400 underflows to 0
    Xz = np.vstack([X, near])
    assert deduplicate(Xz)[1] == 0
    for fn, kw in ((twonn, {}), (mle_id, {"k": 20})):
        r = fn(Xz, **kw)
        assert r["n_zero_distance_removed"] == 3 and r["n_duplicates_removed"] == 3
        assert r["n_points"] == 300
        assert np.isfinite(r["id"]) and r["id"] == pytest.approx(fn(X, **kw)["id"], rel=1e-9)


def test_too_few_points():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((5, 10))[rng.integers(0, 5, 100)]
    with pytest.raises(TooFewPointsError, match=r"only \d+ distinct points.*at least 20"):
        twonn(X)
    with pytest.raises(TooFewPointsError):
        mle_id(X, k=5)
    assert issubclass(TooFewPointsError, ValueError)
    with pytest.raises(TooFewPointsError, match="only 5 distinct"):
        twonn(np.repeat(rng.standard_normal((5, 10)), 20, axis=0))


def test_bad_inputs():
    with pytest.raises(ValueError, match="non-finite"):
        twonn(np.full((30, 3), np.nan))
    with pytest.raises(ValueError, match="2-D"):
        twonn(np.ones(30))
    with pytest.raises(ValueError):
        mle_id(np.random.default_rng(0).standard_normal((50, 3)), k=1)


# --- subsamples -----------------------------------------------------------------------------


def test_id_subsamples_reproducible(linear5_dup):
    X, n_dup = linear5_dup
    kw = dict(estimator="twonn", n_subsamples=4, subsample_size=600)
    a = id_subsamples(X, seed=11, **kw)
    assert a == id_subsamples(X, seed=11, **kw)
    b = id_subsamples(X, seed=12, **kw)
    assert a["ids"] != b["ids"]
    assert a["n_points"] == len(X) - n_dup and a["n_duplicates_removed"] == n_dup
    assert a["n_subsamples"] == 4 and a["subsample_size"] == 600
    assert a["id_min"] <= a["id_mean"] <= a["id_max"] and a["id_std"] > 0
    assert a["id_mean"] == pytest.approx(5.0, abs=0.75)


def test_id_subsamples_all_points_when_small(linear5):
    r = id_subsamples(linear5[:300], estimator="MLE", n_subsamples=3, subsample_size=1000,
                      seed=0, k=10)
    assert r["subsample_size"] == 300 and r["id_std"] == 0.0
    assert r["id_mean"] == pytest.approx(mle_id(linear5[:300], k=10)["id"])
    with pytest.raises(ValueError, match="estimator"):
        id_subsamples(linear5, estimator="pca", n_subsamples=1, subsample_size=10, seed=0)


# --- GRIDE (Denti et al. 2022) ------------------------------------------------------------------


def _torus(n, k, rng):
    """Flat k-torus (product of unit circles) in R^(2k): intrinsically flat, no boundary, uniform."""
    t = rng.uniform(0.0, 2 * np.pi, (n, k))
    return np.hstack([np.cos(t), np.sin(t)])


def _sphere(n, k, rng):
    """Uniform points on the unit k-sphere in R^(k+1) (curved)."""
    Y = rng.standard_normal((n, k + 1))
    return Y / np.linalg.norm(Y, axis=1, keepdims=True)


def _cube(n, k, rng):
    return rng.uniform(0.0, 1.0, (n, k))


def _gauss(n, k, rng):
    """Flat, no boundary, smooth density (locally uniform at small n1)."""
    return rng.standard_normal((n, k))


# k = 10 with 2000 points: a uniform cube's boundary pulls GRIDE ~15% low, the 10-torus's chords (neighbours
# at a distance comparable to the circles' radius) ~17% high (measured): flat k = 10 is tested on the
# Gaussian, curved k = 10 on the sphere.
@pytest.mark.parametrize("shape,k", [("cube", 2), ("cube", 5), ("torus", 2), ("torus", 5), ("gauss", 2),
                                     ("gauss", 5), ("gauss", 10), ("sphere", 2), ("sphere", 5), ("sphere", 10)])
def test_gride_recovers_manifold_dimension_within_15pct(shape, k):
    rng = np.random.default_rng(10 + k)
    X = _embed({"cube": _cube, "torus": _torus, "gauss": _gauss, "sphere": _sphere}[shape](2000, k, rng), 40, rng)
    for n1 in (1, 2):
        assert abs(gride(X, n1=n1)["id"] - k) <= 0.15 * k
    r = gride_scaling(X, max_rank=16, plateau_tol=0.1)
    assert r["n1"] == [1, 2, 4, 8] and len(r["ids"]) == 4
    assert abs(r["ids"][0] - k) <= 0.15 * k and r["ids"][0] == pytest.approx(gride(X, n1=1)["id"], rel=1e-12)


def test_gride_n1_1_is_the_twonn_likelihood_closed_form(sphere2):
    from scipy.spatial.distance import cdist

    X = sphere2[:600]
    D = np.sort(cdist(X, X), axis=1)[:, 1:3]  # independent of the package's neighbour search
    log_mu = np.log(D[:, 1] / D[:, 0])
    # TwoNN's likelihood f(mu) = d mu^-(d+1) has its maximum at N / sum log mu (the (N-1) / sum log mu of
    # DADApy's "ml" TwoNN is that value times the unbiasing factor (N-1)/N)
    want = len(X) / log_mu.sum()
    assert gride(X, n1=1)["id"] == pytest.approx(want, rel=1e-10)
    assert gride(X, n1=1)["id"] * (len(X) - 1) / len(X) == pytest.approx((len(X) - 1) / log_mu.sum(), rel=1e-10)


@pytest.mark.parametrize("n1,d", [(1, 3.0), (4, 7.0), (16, 20.0)])
def test_gride_mle_on_ratios_drawn_from_its_density(n1, d):
    # (r_n1 / r_n2)^d ~ Beta(n1, n2 - n1) for a Poisson process in d dimensions: mu = B^(-1/d)
    rng = np.random.default_rng(n1)
    mu = rng.beta(n1, n1, 40000) ** (-1.0 / d)
    assert gride_mle(mu, n1) == pytest.approx(d, rel=0.02)


def test_gride_plateau_rule():
    assert gride_plateau([5.0, 9.0, 10.0, 10.5, 9.8, 14.0], tol=0.1) == (1, 4, pytest.approx(9.9))
    assert gride_plateau([1.0, 2.0, 4.0], tol=0.1) == (0, 0, 1.0)  # no two scales agree: the smallest scale
    assert gride_plateau([3.0, 3.1, 9.0, 9.1], tol=0.1)[:2] == (0, 1)  # equal lengths: the smaller scales


def test_gride_errors():
    with pytest.raises(ValueError, match=">= 1"):
        gride_mle([0.5, 2.0], 1)
    with pytest.raises(ValueError, match="n1 < n2"):
        gride_mle([1.5, 2.0], 2, 2)
    with pytest.raises(ValueError, match="all distance ratios are 1"):
        gride_mle([1.0, 1.0], 1)
    with pytest.raises(TooFewPointsError, match="GRIDE"):
        gride(np.random.default_rng(0).standard_normal((8, 3)), n1=4)


def test_id_estimates_share_one_neighbour_graph_and_equal_the_single_estimators(linear5_dup):
    X, _ = linear5_dup
    X = X[:800]
    r = id_estimates(X, ["twonn", "mle", "mle_lb", "gride"], mle_k=10, gride_max_rank=32, plateau_tol=0.1)
    assert r["twonn"]["id"] == twonn(X)["id"]
    assert r["mle_mg"]["id"] == mle_id(X, k=10)["id"] and r["mle_lb"]["id"] == mle_id(X, k=10, comb="mean")["id"]
    g = gride_scaling(X, max_rank=32, plateau_tol=0.1)
    assert r["gride"]["ids"] == g["ids"] and r["gride"]["id"] == g["id"] and g["n1"] == [1, 2, 4, 8, 16]
    assert r["gride"]["n_duplicates_removed"] == twonn(X)["n_duplicates_removed"] > 0
    multi = id_subsamples(X, estimator=["twonn", "gride"], n_subsamples=2, subsample_size=400, seed=3, mle_k=20,
                          gride_max_rank=64, plateau_tol=0.1)
    assert multi["twonn"]["ids"] == id_subsamples(X, estimator="twonn", n_subsamples=2, subsample_size=400,
                                                  seed=3)["ids"]
    assert multi["gride"]["id_mean"] == pytest.approx(5.0, rel=0.15)
