"""Known-answer tests for llmgeom.measures.intrinsic_dimension (LSM: intrinsic dimension)."""

import warnings

import numpy as np
import pytest
import skdim

from llmgeom.measures.neighbors import TooFewPointsError, deduplicate
from llmgeom.measures.intrinsic_dimension import id_subsamples, mle_id, twonn


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
    r = mle_id(linear5)
    assert r["id"] == pytest.approx(5.0, rel=0.10)
    assert r["id"] == pytest.approx(
        skdim.id.MLE().fit(linear5, n_neighbors=20).dimension_, rel=1e-8
    )
    X, n_dup = linear5_dup
    rd = mle_id(X)
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
    for fn in (twonn, mle_id):
        r = fn(Xz)
        assert r["n_zero_distance_removed"] == 3 and r["n_duplicates_removed"] == 3
        assert r["n_points"] == 300
        assert np.isfinite(r["id"]) and r["id"] == pytest.approx(fn(X)["id"], rel=1e-9)


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
