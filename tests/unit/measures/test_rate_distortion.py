"""Known answers for the rate-distortion exponent k_RD (LSM Theorem 10.8; issue 20): points on flat and curved
k-dimensional manifolds in R^40 recover k within 15%."""

from __future__ import annotations

import numpy as np
import pytest

from llmgeom.measures.neighbors import TooFewPointsError
from llmgeom.measures.rate_distortion import fit_range, n_grid, rate_distortion_exponent

# the curve parameters of distortion_curve: the schema defaults rate_distortion.n_min ... rate_distortion.init
RD_CURVE = dict(n_min=8, max_fraction=0.25, n_points=6, train_fraction=0.5, max_iter=30, init="random")


def _embed(Y, D, rng):
    B, _ = np.linalg.qr(rng.standard_normal((D, Y.shape[1])))
    return Y @ B.T


def _cube(n, k, rng):  # flat
    return rng.uniform(0.0, 1.0, (n, k))


def _arcs(n, k, rng):  # extrinsically curved (each coordinate bent onto a 1-radian arc of the unit circle)
    t = rng.uniform(0.0, 1.0, (n, k))
    return np.hstack([np.cos(t), np.sin(t)])


def _cap(n, k, rng, angle=0.8):  # intrinsically curved: a geodesic cap of the unit k-sphere in R^(k+1)
    out, got = [], 0
    while got < n:
        Y = rng.standard_normal((8 * n, k + 1))
        Y /= np.linalg.norm(Y, axis=1, keepdims=True)
        Y = Y[Y[:, 0] > np.cos(angle)]
        out.append(Y)
        got += len(Y)
    return np.vstack(out)[:n]


@pytest.mark.parametrize("k", [2, 5, 10])
@pytest.mark.parametrize("shape", ["cube", "arcs", "cap"])
def test_k_rd_recovers_manifold_dimension_within_15pct(shape, k):
    rng = np.random.default_rng(k)
    X = _embed({"cube": _cube, "arcs": _arcs, "cap": _cap}[shape](2000, k, rng), 40, rng)
    r = rate_distortion_exponent(X, n_boot=50, ci=0.95, min_fit_points=4, r2_min=0.98, seed=0, **RD_CURVE)
    assert abs(r["k_rd"] - k) <= 0.15 * k, r
    assert r["k_rd_lo"] < r["k_rd_hi"] and r["r2"] > 0.9
    assert r["n_grid"][0] == 8 and r["n_grid"][-1] == 250  # 1000 training points x max_fraction 0.25


def test_fit_range_picks_the_straight_part():
    n = np.array([8, 16, 32, 64, 128, 256, 512], float)
    D = n ** (-2 / 4.0)
    D[-2:] *= [0.5, 0.1]  # a sample-limited tail that falls off the line
    f = fit_range(n, D, min_fit_points=4, r2_min=0.999)
    assert (f["fit_n_min"], f["fit_n_max"]) == (8, 128) and f["straight"]
    assert f["k_rd"] == pytest.approx(4.0)


def test_too_few_points_and_bad_input():
    with pytest.raises(TooFewPointsError, match="octaves"):
        n_grid(40, n_min=8, max_fraction=0.25, n_points=6)
    with pytest.raises(ValueError, match="train_fraction"):
        rate_distortion_exponent(np.zeros((10, 2)), n_boot=200, ci=0.95, min_fit_points=4, r2_min=0.98,
                                 **dict(RD_CURVE, train_fraction=1.0))


def test_table_takes_the_token_position_ids_beside_k_rd(tmp_path):
    """gride (and every ID column) comes from the token-position rows of intrinsic_dimension.csv, the same points as
    k_RD, never from last-token rows; NaN for the final normed states."""
    import pandas as pd

    from llmgeom.analyses.rate_distortion import rate_distortion_table
    from llmgeom.core.writer import ActivationWriter

    rng = np.random.default_rng(3)
    n, L, d = 400, 2, 12
    R = np.stack([_embed(_cube(n, 3, rng), d, rng) for _ in range(L + 1)], axis=1).astype(np.float32)
    path = tmp_path / "corpus.h5"
    w = ActivationWriter(path, {"model": "toy", "prompt_set": "corpus", "d_model": d, "vocab_size": 50},
                         {"tokens/residual_sample": ((n, L + 1, d), "float32"),
                          "tokens/final_normed_sample": ((n, d), "float32")})
    w.write("tokens/residual_sample", slice(None), R)
    w.write("tokens/final_normed_sample", slice(None), R[:, -1])
    w.commit()
    ids = pd.DataFrame([dict(model="toy", quantity=pts, estimator=e, layer=l, id_mean=v + l)
                        for pts, v in (("token_id", 3.0), ("last_token_id", 90.0), ("token_id_cross_passage", 50.0))
                        for e in ("twonn", "gride") for l in range(L + 1)])
    df = rate_distortion_table(path, ids, model="toy", n_boot=20, seed=0, ci=0.95, agree_tol=0.15, min_fit_points=4,
                               r2_min=0.98, **RD_CURVE)
    res = df[df.states == "residual"]
    np.testing.assert_array_equal(res.gride, 3.0 + res.layer)
    np.testing.assert_array_equal(res.twonn, 3.0 + res.layer)
    assert df[df.states == "final_normed"].gride.isna().all() and df.mle_mg.isna().all()
    from replicate_checks import assert_replicates_reproduce  # issue 48 point 4: k_rd's replicates

    assert assert_replicates_reproduce(df, "k_rd", ci=0.95, n_boot=20) == len(df)
