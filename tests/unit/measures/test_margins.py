"""Known-answer tests of the margins tables' bootstrap over passages and of the expressibility-gap fit range
(issue 48): llmgeom.measures.margins.PassageBootstrap, margin_summary's intervals, fraction_below's replicates,
expressibility_gap's fit range chosen by eta and its passage-bootstrap replicates."""

from __future__ import annotations

import numpy as np
import pytest

from llmgeom.core.stats import parse_replicates
from llmgeom.measures import margins

GAP = dict(eps_min=1e-3, eps_max=10.0, n_eps=41, fit_eps_max=0.5, min_count=10, ci=0.95)


def _passages(n_passages, length):
    return np.repeat(np.arange(n_passages), length)


# --- the resampling -------------------------------------------------------------------------------


def test_passage_bootstrap_weights_are_drawn_passages():
    groups = np.array([7, 7, 3, 3, 3, 9])  # 3 passages of 2, 3, 1 positions (labels need not be 0..G-1)
    boot = margins.PassageBootstrap(groups, 6, n_boot=50, seed=1)
    ws = list(boot)
    assert len(ws) == 50 and boot.unit == "passages" and boot.n_groups == 3
    for w in ws:
        # a position's weight is its passage's draw count: equal within a passage, 3 passages drawn in all
        assert w[0] == w[1] and w[2] == w[3] == w[4]
        assert w[0] + w[2] + w[5] == 3
    # iterating again gives the same resamples (one resampling for every column)
    np.testing.assert_array_equal(np.array(ws), np.array(list(boot)))
    # the weights are those of G passages drawn with replacement by default_rng(seed).integers
    idx = np.random.default_rng(1).integers(0, 3, 3)
    want = np.bincount(idx, minlength=3)[[1, 1, 0, 0, 0, 2]]  # np.unique order: 3 -> 0, 7 -> 1, 9 -> 2
    np.testing.assert_array_equal(ws[0], want)
    iid = margins.PassageBootstrap(None, 6, n_boot=3, seed=1)
    assert iid.unit == "positions" and all(w.sum() == 6 for w in iid)
    assert len(margins.PassageBootstrap(groups, 6, n_boot=0, seed=1)) == 0
    with pytest.raises(ValueError, match="per position"):
        margins.PassageBootstrap(groups, 5, n_boot=2, seed=0)
    with pytest.raises(ValueError, match="n_boot"):
        margins.PassageBootstrap(groups, 6, n_boot=-1, seed=0)


# --- margins.csv intervals ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clustered():
    """400 passages of 50 positions: exponential(1) margins; NLL = passage effect (sd 0.5) + noise (sd 1)."""
    rng = np.random.default_rng(3)
    G, L = 400, 50
    groups = _passages(G, L)
    m = rng.exponential(1.0, G * L)
    nll = 2.0 + np.repeat(rng.normal(0, 0.5, G), L) + rng.normal(0, 1.0, G * L)
    return m, np.abs(nll), groups


def test_margin_summary_replicates_are_the_statistics_of_the_drawn_passages(clustered):
    m, nll, groups = clustered
    s = margins.margin_summary(m, nll, threshold=0.5, hard_core_quantile=0.05, groups=groups, n_boot=30, ci=0.95,
                               seed=5)
    # replicate 0 by hand: concatenate the positions of the G passages drawn (with repeats), then the plain statistic
    G = groups.max() + 1
    drawn = np.random.default_rng(5).integers(0, G, G)
    pos = np.concatenate([np.flatnonzero(groups == g) for g in drawn])
    for q in margins.QUANTILES:
        c = f"margin_q{100 * q:02.0f}"
        reps = parse_replicates(s[f"{c}_replicates"])
        assert reps.size == 30 and reps[0] == pytest.approx(np.quantile(m[pos], q), rel=1e-8)
        assert s[f"{c}_lo"] < s[c] < s[f"{c}_hi"]
    assert parse_replicates(s["p_margin_below_replicates"])[0] == pytest.approx(np.mean(m[pos] < 0.5), rel=1e-8)
    assert parse_replicates(s["mean_nll_replicates"])[0] == pytest.approx(nll[pos].mean(), rel=1e-8)
    # one home: the hard core is the 5% quantile of the same computation; perplexity = exp(mean NLL) per replicate
    assert s["hard_core_margin"] == s["margin_q05"]
    assert s["hard_core_margin_replicates"] == s["margin_q05_replicates"]
    np.testing.assert_allclose(parse_replicates(s["perplexity_replicates"]),
                               np.exp(parse_replicates(s["mean_nll_replicates"])), rtol=1e-8)
    # replicate b of Pr(m < 0.5) is replicate b of the hard-core fraction below 0.5 (the same resample)
    fb = margins.fraction_below(m, (0.5,), groups=groups, n_boot=30, ci=0.95, seed=5)
    np.testing.assert_array_equal(parse_replicates(fb["hard_core_frac_lt_0.5_replicates"]),
                                  parse_replicates(s["p_margin_below_replicates"]))
    assert fb["hard_core_frac_lt_0.5_lo"] == s["p_margin_below_lo"]


def test_margin_summary_interval_widths_known_answers(clustered):
    m, nll, groups = clustered
    s = margins.margin_summary(m, nll, threshold=0.5, hard_core_quantile=0.05, groups=groups, n_boot=400, ci=0.95,
                               seed=0)
    n, G = m.size, groups.max() + 1
    # median of exponential(1) margins (i.i.d. within passages): SE = 1 / (2 f(ln 2) sqrt(n)) = 1 / sqrt(n)
    assert s["margin_q50"] == pytest.approx(np.log(2), abs=0.02)
    assert s["margin_q50_hi"] - s["margin_q50_lo"] == pytest.approx(2 * 1.96 / np.sqrt(n), rel=0.25)
    # mean NLL: positions of a passage share its effect, so the SE is that of the G passage means, not of n positions
    se = np.std([nll[groups == g].mean() for g in range(G)], ddof=1) / np.sqrt(G)
    width = s["mean_nll_hi"] - s["mean_nll_lo"]
    assert width == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert width > 2 * (2 * 1.96 * nll.std() / np.sqrt(n))  # the i.i.d.-positions interval would be too narrow
    assert s["perplexity_lo"] < s["perplexity"] < s["perplexity_hi"]
    assert 0 <= s["p_margin_below_lo"] < s["p_margin_below"] < s["p_margin_below_hi"] <= 1


def test_margin_summary_without_bootstrap_has_no_interval_columns():
    m = np.random.default_rng(4).exponential(1.0, 500)
    s = margins.margin_summary(m, m + 1, threshold=0.5, hard_core_quantile=0.05)
    assert not any(k.endswith(("_lo", "_hi", "_replicates")) for k in s)
    # a hard-core quantile that is not one of the reported ones still comes from the same quantile call
    s2 = margins.margin_summary(m, threshold=0.5, hard_core_quantile=0.1)
    assert s2["hard_core_margin"] == np.quantile(m, 0.1) and s2["margin_q05"] == np.quantile(m, 0.05)
    with pytest.raises(ValueError, match="needs ci"):
        margins.margin_summary(m, threshold=0.5, hard_core_quantile=0.05, n_boot=2)
    assert margins.fraction_below(m, (0.1,), n_boot=0, ci=0.95)["hard_core_frac_lt_0.1_replicates"] == ""


# --- the expressibility gap: fit range chosen by eta ----------------------------------------------


@pytest.mark.parametrize("scale", [1.5, 0.15], ids=["trained-like", "twin-like"])
def test_slope_one_for_a_density_nonzero_at_zero(scale):
    """Uniform margins on [0, scale]: eta = eps / scale below scale (f(0) > 0), slope 1 at either scale, because
    the range ends where eta reaches fit_eta_max, not at a fixed eps."""
    m = np.random.default_rng(6).uniform(0, scale, 100_000)
    curve, fit = margins.expressibility_gap(m, fit_eta_max=0.3, n_boot=0, **GAP)
    assert fit["beta"] == pytest.approx(1.0, abs=0.03) and fit["alpha"] == pytest.approx(1 / scale, rel=0.05)
    eta, eps, inf = curve["eta"], curve["eps"], curve["in_fit"]
    assert eta[inf].max() <= 0.3 and fit["fit_eps_hi"] == eps[inf].max() and fit["fit_eta_max"] == 0.3
    nxt = np.flatnonzero(inf).max() + 1  # the next grid point is over eta 0.3, or over the eps cap
    assert eta[nxt] > 0.3 or eps[nxt] > GAP["fit_eps_max"]
    if scale < 1:  # twin-like: the eps cap alone would fit where eta saturates and bend the slope down
        _, capped = margins.expressibility_gap(m, fit_eta_max=1.0, n_boot=0, **GAP)
        assert capped["fit_eps_hi"] > scale and capped["beta"] < 0.93 < fit["beta"]
    else:  # trained-like: eta stays under 0.3 up to the eps cap, and the range is the cap's
        assert fit["fit_eps_hi"] == eps[eps <= GAP["fit_eps_max"]].max()


@pytest.mark.parametrize("b", [0.5, 2.0])
@pytest.mark.parametrize("scale", [2.0, 0.25], ids=["trained-like", "twin-like"])
def test_slope_of_a_power_law_cdf(b, scale):
    """m = scale U^(1/b): eta(eps) = (eps / scale)^b below scale, log-log slope b."""
    m = scale * np.random.default_rng(7).uniform(0, 1, 200_000) ** (1 / b)
    curve, fit = margins.expressibility_gap(m, fit_eta_max=0.3, n_boot=0, **GAP)
    assert fit["beta"] == pytest.approx(b, rel=0.03) and fit["r2"] > 0.995
    assert curve["eta"][curve["in_fit"]].max() <= 0.3 and fit["n_fit_points"] >= 5


def test_gap_replicates_refit_each_resample_on_its_own_range():
    rng = np.random.default_rng(8)
    G, L = 300, 40
    groups = _passages(G, L)
    # a tenth of the passages have all their margins near 0: the share of such passages drawn moves the eta curve,
    # hence each resample's fit range and slope
    m = rng.uniform(0, 1, G * L) * np.repeat(rng.choice([0.01, 1.0], G, p=[0.1, 0.9]), L)
    curve, fit = margins.expressibility_gap(m, fit_eta_max=0.3, n_boot=40, seed=9, groups=groups, **GAP)
    beta, r2 = parse_replicates(fit["beta_replicates"]), parse_replicates(fit["r2_replicates"])
    assert beta.size == r2.size == 40 and np.isfinite(beta).all() and fit["boot_unit"] == "passages"
    assert fit["beta_lo"] < fit["beta"] < fit["beta_hi"] and fit["r2_lo"] < fit["r2_hi"] <= 1
    assert fit["beta_boot_std"] == pytest.approx(beta.std())
    # replicate 0 by hand: the positions of the drawn passages, eta on them, the range by the same rule, the fit
    drawn = np.random.default_rng(9).integers(0, G, G)
    mb = m[np.concatenate([np.flatnonzero(groups == g) for g in drawn])]
    eta, cnt = margins.eta_curve(mb, curve["eps"])
    ok = margins.fit_range(curve["eps"], eta, cnt, fit_eps_max=0.5, fit_eta_max=0.3, min_count=10)
    want = margins.fit_power_law(curve["eps"][ok], eta[ok])
    assert beta[0] == pytest.approx(want["beta"], rel=1e-7) and r2[0] == pytest.approx(want["r2"], rel=1e-7)
    # passages, not positions: the clustered shares widen the interval
    _, iid = margins.expressibility_gap(m, fit_eta_max=0.3, n_boot=40, seed=9, **GAP)
    assert iid["boot_unit"] == "positions"
    assert fit["beta_hi"] - fit["beta_lo"] > 1.3 * (iid["beta_hi"] - iid["beta_lo"])


def test_gap_fit_range_errors_name_fit_eta_max():
    m = np.random.default_rng(10).uniform(0, 1, 10_000)
    with pytest.raises(ValueError, match="fit_eta_max"):
        margins.expressibility_gap(m, fit_eta_max=0.0012, n_boot=0, **GAP)
