"""Bootstrap intervals and the estimates they are centred on (issue 11, point 2)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from llmgeom.core.stats import bias_corrected, bootstrap_interval
from llmgeom.measures.pca import value_manifold_stats


def test_bias_corrected_known_answers():
    assert bias_corrected(0.5, [0.6, 0.7, 0.8]) == pytest.approx(0.3)  # 2 * 0.5 - 0.7
    assert bias_corrected(0.5, [0.5, 0.5]) == 0.5
    assert bias_corrected(0.1, [0.4, np.nan, 0.4], bounds=(0.0, 1.0)) == 0.0  # -0.2 clipped; NaN ignored
    assert np.isnan(bias_corrected(0.5, [np.nan, np.inf]))
    # the basic interval is centred on it: [2t - q_hi, 2t - q_lo] reflects the replicates around t
    lo, hi = bootstrap_interval(0.5, np.linspace(0.6, 0.8, 101), method="basic", ci=0.95)
    assert (lo + hi) / 2 == pytest.approx(bias_corrected(0.5, np.linspace(0.6, 0.8, 101)))


def test_value_manifold_reports_bias_corrected_shares_below_a_biased_estimate():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((30, 120)) * np.sqrt(0.9 ** np.arange(120))  # n < d: shares biased upward
    st, boot = value_manifold_stats(X, rng.standard_normal(30), n_boot=300, seed=1, standardize=False,
                                    return_boot=True, ci=0.95)
    for k, j in (("pc1", 0), ("pc2", 1), ("pc12", 2)):
        assert st[f"{k}_bc"] == pytest.approx(np.clip(2 * st[k] - boot[:, j].mean(), 0, 1))
        assert st[f"{k}_lo"] <= st[f"{k}_bc"] <= st[f"{k}_hi"]
    assert st["pc12_bc"] < st["pc12"]  # the resamples (37% duplicated prompts) are even more concentrated


@pytest.mark.slow
def test_basic_interval_covers_the_population_share():
    """n = 75 prompts, d = 192 features, population spectrum 0.9^k (PC1+PC2 share 0.190): the basic
    interval covers the population share in >= 90% of 200 draws; the percentile interval almost never
    (it sits on the upward-biased replicates), and the bias-corrected estimate is nearly unbiased."""
    from threadpoolctl import threadpool_limits

    d, n, draws = 192, 75, 200
    lam = 0.9 ** np.arange(d)
    true = (lam[0] + lam[1]) / lam.sum()
    assert true == pytest.approx(0.1900, abs=1e-4)
    rng = np.random.default_rng(1)
    basic = perc = 0
    est, bc = [], []
    with threadpool_limits(1):
        for i in range(draws):
            X = rng.standard_normal((n, d)) * np.sqrt(lam)
            st, boot = value_manifold_stats(X, rng.standard_normal(n), n_boot=200, seed=i, standardize=False,
                                            return_boot=True, ci=0.95)
            basic += st["pc12_lo"] <= true <= st["pc12_hi"]
            lo, hi = bootstrap_interval(st["pc12"], boot[:, 2], method="percentile", ci=0.95)
            perc += lo <= true <= hi
            est.append(st["pc12"])
            bc.append(st["pc12_bc"])
    assert basic / draws >= 0.90
    assert perc / draws <= 0.56
    assert np.mean(est) - true > 0.04  # the sample share is biased upward when n < d
    assert abs(np.mean(bc) - true) < 0.25 * (np.mean(est) - true)


def test_intervention_deltas_carry_basic_intervals_and_bias_corrected_changes():
    from llmgeom.analyses.interventions import intervention_summary

    rng = np.random.default_rng(0)
    n = 40
    hb = rng.uniform(0, 1, n)
    rows = []
    for cond, shift in (("baseline", 0.0), ("edit", 0.2)):
        hm = np.clip(hb + shift + rng.normal(0, 0.1, n), 0, 1)
        for i in range(n):
            rows.append(dict(condition=cond, prompt=f"p{i}", model="m", run="L1", layers="1", axis="entropy",
                             edit=cond, shift_sigmas=0.0, positions="all", h_bayes_bits=hb[i], h_model_bits=hm[i],
                             label_mass=0.5, proj_L1=hm[i] + rng.normal(0, 0.1)))
    per = pd.DataFrame(rows)
    axes = pd.DataFrame({"layer": [1], "sigma": [0.3]})
    s = intervention_summary(per, axes, n_boot=300, seed=0, ci=0.95).set_index("edit")
    e = s.loc["edit"]
    for k in ("mae_bits", "pearson_r", "axis_corr_final"):
        assert e[f"delta_{k}_lo"] <= e[f"delta_{k}_bc"] <= e[f"delta_{k}_hi"]
    assert e.delta_mae_bits == pytest.approx(np.mean(np.abs(per[per.condition == "edit"].h_model_bits.to_numpy()
                                                            - hb)) - s.loc["baseline"].mae_bits)
    b = s.loc["baseline"]
    assert b.delta_mae_bits == 0 and b.delta_mae_bits_lo == 0 and b.delta_mae_bits_bc == 0


def test_weighted_mean_interval_known_answers():
    from llmgeom.core.stats import parse_replicates, weighted_mean_interval

    v = np.array([1.0, 2.0, 3.0, 6.0])
    # three resamples: unit weights (the sample itself), all on unit 3, units 0 and 1 twice each
    w = np.array([[1, 1, 1, 1], [0, 0, 0, 4], [2, 2, 0, 0]])
    out = weighted_mean_interval("x", v, w, ci=0.5)
    reps = parse_replicates(out["x_replicates"])
    np.testing.assert_allclose(reps, [3.0, 6.0, 1.5])
    assert (out["x_lo"], out["x_hi"]) == pytest.approx(bootstrap_interval(3.0, reps, ci=0.5, method="basic"))
    assert out["x_bc"] == pytest.approx(2 * 3.0 - reps.mean())
    # bounds clip the interval and the corrected value; a resample with no unit drawn is a NaN replicate
    out = weighted_mean_interval("x", v, np.vstack([w, np.zeros(4)]), ci=0.5, bounds=(0.0, 4.0))
    assert out["x_replicates"].split()[-1] == "nan" and out["x_hi"] <= 4.0
    assert (out["x_lo"], out["x_hi"]) == pytest.approx(bootstrap_interval(3.0, reps, ci=0.5, bounds=(0.0, 4.0)))
    # equal values: a zero-width interval at the value
    c = weighted_mean_interval("x", np.full(5, 0.07), np.random.default_rng(0).integers(0, 3, (40, 5)), ci=0.95)
    assert c["x_lo"] == pytest.approx(0.07, abs=1e-15) and c["x_hi"] == pytest.approx(0.07, abs=1e-15)
    # no resamples (n_boot = 0) or no values: no interval, no replicates
    for vals, ww in ((v, np.empty((0, 4))), ([], np.empty((0, 0)))):
        e = weighted_mean_interval("x", vals, ww, ci=0.95)
        assert np.isnan(e["x_lo"]) and np.isnan(e["x_hi"]) and np.isnan(e["x_bc"]) and e["x_replicates"] == ""
    with pytest.raises(ValueError, match="weights must be"):
        weighted_mean_interval("x", v, np.ones((3, 5)), ci=0.95)
