"""Cross-passage TwoNN and passage half-sample replicates (llmgeom.measures.intrinsic_dimension.passage_resampled_ids,
llmgeom.measures.neighbors.knn_among): known answers."""

from __future__ import annotations

import numpy as np
import pytest
import skdim

from llmgeom.measures.intrinsic_dimension import (CROSS_PASSAGE, gride_scaling, id_subsamples, passage_resampled_ids,
                                                  recentred_replicates, twonn_from_distances)
from llmgeom.measures.neighbors import deduplicate, exact_knn, knn_among

G, P = 40, 30  # passages x positions, as the default corpus set


def _embed(Z, D, rng):
    return Z @ np.linalg.qr(rng.standard_normal((D, Z.shape[1])))[0].T


def _kw(**kw):
    return dict(dict(estimators=["twonn", "mle_mg", "mle_lb", "gride"], n_subsamples=3, subsample_size=1000, seed=0,
                     n_resamples=30, min_points=50, mle_k=20, gride_max_rank=32, plateau_tol=0.1), **kw)


def test_knn_among_equals_a_direct_search_of_the_allowed_points():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 6))
    g = np.repeat(np.arange(20), 10)
    dist, idx = exact_knn(X, 12)  # a short list: many rows need the exact fallback
    cand = np.isin(g, rng.choice(20, 10, replace=False))
    rows = np.flatnonzero(cand)
    d, i = knn_among(X, dist, idx, 3, rows=rows, candidates=cand, groups=g, exclude_own_group=True)
    D = np.linalg.norm(X[:, None] - X[None], axis=-1)
    for r, q in enumerate(rows):
        ok = np.flatnonzero(cand & (g != g[q]))
        want = ok[np.argsort(D[q, ok], kind="stable")[:3]]
        np.testing.assert_array_equal(i[r], want)
        np.testing.assert_allclose(d[r], D[q, want], rtol=1e-12)
    # no restriction: the list itself
    d0, i0 = knn_among(X, dist, idx, 2, rows=np.arange(200), candidates=np.ones(200, bool))
    np.testing.assert_array_equal(i0, idx[:, :2])
    with pytest.raises(ValueError, match="allowed neighbours"):
        knn_among(X, dist, idx, 11, rows=[0], candidates=g == 0)
    with pytest.raises(ValueError, match="needs groups"):
        knn_among(X, dist, idx, 2, rows=[0], candidates=cand, exclude_own_group=True)


def test_twonn_from_distances_is_skdims_twonn():
    X = np.random.default_rng(2).standard_normal((500, 4))
    dist, _ = exact_knn(X, 2)
    assert twonn_from_distances(dist) == pytest.approx(skdim.id.TwoNN().fit(X).dimension_, rel=1e-9)


def test_passages_that_do_not_cluster_give_d_with_and_without_the_exclusion():
    """i.i.d. points on a 5-d plane in 50 dims, assigned to 40 passages of 30: both TwoNNs ~5, the half-sample
    replicates ~5 with a spread, and the TwoNN on the same subsets equals id_subsamples'."""
    rng = np.random.default_rng(0)
    X = _embed(rng.standard_normal((G * P, 5)), 50, rng)
    g = np.repeat(np.arange(G), P)
    r = passage_resampled_ids(X, g, **_kw())
    cp = r[CROSS_PASSAGE]
    assert cp["id_mean"] == pytest.approx(5, rel=0.1) and len(cp["ids"]) == 3 and cp["subsample_size"] == 1000
    tw = id_subsamples(X, estimator="twonn", n_subsamples=3, subsample_size=1000, seed=0)["id_mean"]
    assert cp["id_mean"] == pytest.approx(tw, rel=0.05)
    assert (r["n_passages"], r["passages_per_resample"]) == (40, 20)
    for e in ("twonn", "mle_mg", "mle_lb", "gride", CROSS_PASSAGE):
        v = r["replicates"][e]
        assert v.shape == (30,) and np.isfinite(v).all() and np.mean(v) == pytest.approx(5, rel=0.12), e
        assert np.std(v) > 0, e
    # a half-sample replicate is the estimator on all points of the kept passages: draw 0 by hand
    keep = np.zeros(G, bool)
    keep[np.random.default_rng([0, 4802]).choice(G, size=20, replace=False)] = True
    Xb = X[keep[g]]
    assert r["replicates"]["twonn"][0] == pytest.approx(skdim.id.TwoNN().fit(Xb).dimension_, rel=1e-9)
    assert r["replicates"]["mle_lb"][0] == pytest.approx(
        skdim.id.MLE().fit(Xb, n_neighbors=20, comb="mean").dimension_, rel=1e-9)
    assert r["replicates"]["mle_mg"][0] == pytest.approx(
        skdim.id.MLE().fit(Xb, n_neighbors=20, comb="mle").dimension_, rel=1e-9)
    assert r["replicates"]["gride"][0] == pytest.approx(
        gride_scaling(Xb, max_rank=32, plateau_tol=0.1)["id"], rel=1e-9)
    # seeded: the same draws again; no resamples: no replicates
    again = passage_resampled_ids(X, g, **_kw())
    np.testing.assert_array_equal(again["replicates"]["twonn"], r["replicates"]["twonn"])
    assert passage_resampled_ids(X, g, **_kw(n_resamples=0))["replicates"]["twonn"].size == 0


def test_same_passage_filaments_deflate_the_twonn_and_the_exclusion_sees_it():
    """Each passage a short random walk (a 1-d filament) in a 5-d space: the plain TwoNN reads the filaments'
    ~1-3 dimensions; with same-passage neighbours excluded the two nearest points of another filament sit at
    almost the same distance (mu ~ 1), so the cross-passage TwoNN is far larger. The variant moves."""
    rng = np.random.default_rng(3)
    W = np.cumsum(rng.standard_normal((G, P, 5)) * 0.05, axis=1) + 3 * rng.standard_normal((G, 1, 5))
    X = _embed(W.reshape(-1, 5), 50, rng)
    g = np.repeat(np.arange(G), P)
    r = passage_resampled_ids(X, g, **_kw(n_resamples=3))
    plain = id_subsamples(X, estimator="twonn", n_subsamples=3, subsample_size=1000, seed=0)["id_mean"]
    assert plain < 4 and r[CROSS_PASSAGE]["id_mean"] > 3 * plain


def test_passage_labels_follow_the_deduplication_and_errors():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((300, 3))
    g = np.repeat(np.arange(10), 30)
    Xd = np.vstack([X, X[:5]])  # 5 exact duplicates (of passage 0), labelled as another passage
    gd = np.concatenate([g, np.full(5, 99)])
    a = passage_resampled_ids(Xd, gd, **_kw(subsample_size=300, n_resamples=4, min_points=20))
    b = passage_resampled_ids(X, g, **_kw(subsample_size=300, n_resamples=4, min_points=20))
    assert a["n_passages"] == 10 and a[CROSS_PASSAGE]["n_duplicates_removed"] == 5
    assert a[CROSS_PASSAGE]["id_mean"] == b[CROSS_PASSAGE]["id_mean"]
    assert deduplicate(Xd, return_index=True)[2].tolist() == list(range(300))
    with pytest.raises(ValueError, match="at least 2 passages"):
        passage_resampled_ids(X, np.zeros(300, int), **_kw(subsample_size=300, min_points=20))
    with pytest.raises(ValueError, match="one entry per point"):
        passage_resampled_ids(X, g[:10], **_kw(subsample_size=300, min_points=20))


def test_one_point_per_passage_is_a_half_sample_of_the_points_and_gride_uses_what_it_has():
    """The last-token ID: every point its own passage (a prompt). A replicate is the estimator on half of the
    points; with fewer kept points than gride_max_rank, GRIDE's curve stops at the largest order the half-sample
    allows, as gride_scaling does on the same points."""
    rng = np.random.default_rng(5)
    X = _embed(rng.standard_normal((150, 4)), 40, rng)
    r = passage_resampled_ids(X, np.arange(150), **_kw(subsample_size=150, n_resamples=6, gride_max_rank=128,
                                                       min_points=20))
    assert (r["n_passages"], r["passages_per_resample"]) == (150, 75)
    keep = np.zeros(150, bool)
    keep[np.random.default_rng([0, 4802]).choice(150, size=75, replace=False)] = True
    assert r["replicates"]["gride"][0] == pytest.approx(
        gride_scaling(X[keep], max_rank=128, plateau_tol=0.1)["id"], rel=1e-9)
    assert r["replicates"]["twonn"][0] == pytest.approx(skdim.id.TwoNN().fit(X[keep]).dimension_, rel=1e-9)
    assert np.isfinite(r["replicates"]["gride"]).all() and np.mean(r["replicates"]["gride"]) == pytest.approx(4, rel=0.2)


def test_recentred_replicates():
    np.testing.assert_allclose(recentred_replicates(10.0, [1.0, 2.0, 3.0]), [9.0, 10.0, 11.0])
    np.testing.assert_allclose(recentred_replicates(10.0, [1.0, np.nan, 3.0], scale=2.0), [8.0, np.nan, 12.0])
    assert recentred_replicates(1.0, []).size == 0 and np.isnan(recentred_replicates(1.0, [np.nan])).all()


def test_subsets_read_off_the_layer_list_equal_their_own_search():
    """id_subsamples with the layer's neighbour list (passage_resampled_ids' neighbour_list) gives, subset by
    subset, exactly what each subset's own neighbour search gives, GRIDE's scale curve included; a list of other
    points is not used."""
    rng = np.random.default_rng(5)
    X = _embed(rng.standard_normal((G * P, 4)), 30, rng)
    g = np.repeat(np.arange(G), P)
    kw = dict(n_subsamples=3, subsample_size=700, seed=2, min_points=50, mle_k=20, gride_max_rank=32, plateau_tol=0.1)
    est = ["twonn", "mle_mg", "mle_lb", "gride"]
    shared = passage_resampled_ids(X, g, **_kw(n_resamples=2))["neighbour_list"]
    a = id_subsamples(X, estimator=est, neighbours=shared, **kw)
    b = id_subsamples(X, estimator=est, **kw)
    for e in est:
        assert a[e]["ids"] == b[e]["ids"], e
    assert a["gride"]["results"][0]["ids"] == b["gride"]["results"][0]["ids"]
    other = passage_resampled_ids(X[:900], g[:900], **_kw(n_resamples=2))["neighbour_list"]
    assert not other.complete(deduplicate(X)[0])
    assert id_subsamples(X, estimator=est, neighbours=other, **kw)["twonn"]["ids"] == b["twonn"]["ids"]
