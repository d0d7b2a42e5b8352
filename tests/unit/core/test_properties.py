"""Property tests (hypothesis) for the math: bounds and symmetries that must hold for ANY input.

Issue 6, point 8: entropies within [0, log n], posterior in [0, 1] and symmetric under label swap,
participation ratio within [1, rank], eta(eps) non-decreasing. Pure functions only (fast).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from llmgeom.extract.attention import attention_row_entropy, entropy_nats
from llmgeom.measures import bayes as sula, margins  # plain imports: a renamed module fails loudly, never skips
from llmgeom.measures.pca import explained_variance, participation_ratio

SETTINGS = settings(max_examples=100, deadline=None)
finite = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


# --------------------------------------------------------------------------- entropies


@SETTINGS
@given(arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 64)), elements=finite))
def test_next_token_entropy_within_0_and_log_n(logits):
    """H(softmax(z)) in [0, log n] nats for any finite logits; uniform logits give exactly log n."""
    n = logits.shape[-1]
    h = entropy_nats(torch.from_numpy(logits)).numpy()
    assert np.all(np.isfinite(h))
    assert np.all(h >= -1e-5) and np.all(h <= math.log(n) + 1e-4)
    const = entropy_nats(torch.zeros(1, n)).item()
    assert const == pytest.approx(math.log(n), abs=1e-5)


@SETTINGS
@given(arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 48)), elements=st.floats(0, 1e3, width=32)))
def test_next_token_entropy_shift_invariant(logits):
    """Adding a constant to every logit leaves the distribution, hence the entropy, unchanged."""
    z = torch.from_numpy(logits)
    assert torch.allclose(entropy_nats(z), entropy_nats(z + 17.0), atol=1e-3)


@SETTINGS
@given(arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 40)),
              elements=st.floats(0, 1e6, allow_nan=False, allow_infinity=False)))
def test_attention_row_entropy_within_0_and_log_t(w):
    """Rows of an attention distribution (non-negative, sum 1) over T keys: entropy in [0, log T];
    zero weights (padding, masked keys) contribute 0 (0 log 0 = 0)."""
    assume(np.all(w.sum(-1) > 0))
    p = w / w.sum(-1, keepdims=True)
    h = attention_row_entropy(torch.from_numpy(p)).numpy()
    t_eff = (p > 0).sum(-1)
    assert np.all(h >= -1e-6)
    assert np.all(h <= np.log(t_eff) + 1e-5)  # at most log of the number of attended keys
    assert np.all(h <= math.log(p.shape[-1]) + 1e-5)


# --------------------------------------------------------------------------- SULA posterior

counts = st.integers(0, 60)
alphas = st.floats(0.5, 0.999, allow_nan=False)


@SETTINGS
@given(counts, counts, alphas)
def test_posterior_in_unit_interval_and_symmetric_under_label_swap(n1, n2, alpha):
    p = float(sula.bayes_posterior(n1, n2, alpha=alpha))
    q = float(sula.bayes_posterior(n2, n1, alpha=alpha))
    assert 0.0 <= p <= 1.0
    assert p + q == pytest.approx(1.0, abs=1e-12)  # swapping the labels swaps the posterior
    if n1 == n2:
        assert p == pytest.approx(0.5, abs=1e-12)
    if n1 > n2 and alpha > 0.5:
        assert p > 0.5


@SETTINGS
@given(counts, counts, alphas)
def test_bayes_entropy_in_0_1_bits_and_swap_invariant(n1, n2, alpha):
    h = float(sula.h_bayes_bits(n1, n2, alpha=alpha))
    assert 0.0 <= h <= 1.0
    assert h == float(sula.h_bayes_bits(n2, n1, alpha=alpha))  # bit-identical (issue 11)
    p = float(sula.bayes_posterior(n1, n2, alpha=alpha))
    q = float(sula.bayes_posterior(n2, n1, alpha=alpha))
    assert max(p, q) == 1.0 - min(p, q)  # the larger is 1 - the smaller, bit for bit (issue 11)
    if 1e-12 < p < 1 - 1e-12:
        assert h == pytest.approx(float(sula.binary_entropy_bits(p)), abs=1e-9)


@SETTINGS
@given(st.floats(-80, 0, allow_nan=False), st.floats(-80, 0, allow_nan=False))
def test_model_label_entropy_in_unit_interval_and_swap_symmetric(a, b):
    p, h = sula.model_label_entropy(np.array([a]), np.array([b]))
    q, h2 = sula.model_label_entropy(np.array([b]), np.array([a]))
    assert 0.0 <= p[0] <= 1.0 and 0.0 <= h[0] <= 1.0
    assert p[0] + q[0] == pytest.approx(1.0, abs=1e-12)
    assert h[0] == pytest.approx(h2[0], abs=1e-12)


@SETTINGS
@given(st.floats(0, 1, allow_nan=False))
def test_binary_entropy_bits_bounds_and_symmetry(p):
    h = float(sula.binary_entropy_bits(p))
    assert 0.0 <= h <= 1.0
    assert h == pytest.approx(float(sula.binary_entropy_bits(1 - p)), abs=1e-9)


# --------------------------------------------------------------------------- PCA / participation ratio


@SETTINGS
@given(arrays(np.float64, st.tuples(st.integers(3, 30), st.integers(1, 12)),
              elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)))
def test_participation_ratio_of_a_point_cloud_within_1_and_rank(X):
    """PR of the covariance spectrum of any point cloud lies in [1, rank of the centred cloud]."""
    Xc = X - X.mean(0)
    lam = np.linalg.eigvalsh(Xc.T @ Xc / len(X))
    lam = np.clip(lam, 0, None)
    assume(lam.max() > 1e-9 * max(1.0, np.abs(X).max() ** 2))
    rank = np.linalg.matrix_rank(Xc)
    pr = participation_ratio(lam)
    assert 1.0 - 1e-9 <= pr <= rank + 1e-6


@SETTINGS
@given(arrays(np.float64, st.tuples(st.integers(3, 25), st.integers(2, 10)),
              elements=st.floats(-100, 100, allow_nan=False, allow_infinity=False)))
def test_explained_variance_is_a_sorted_distribution(X):
    assume(np.ptp(X, axis=0).max() > 1e-3)
    for standardize in (True, False):
        try:
            ev = explained_variance(X, standardize=standardize)
        except ValueError:  # every column constant after standardizing: refused, never NaN
            continue
        assert np.all(np.isfinite(ev))
        assert np.all(ev >= -1e-12) and ev.sum() == pytest.approx(1.0, abs=1e-9)
        assert np.all(np.diff(ev) <= 1e-12)


# --------------------------------------------------------------------------- expressibility gap


@SETTINGS
@given(arrays(np.float64, st.integers(1, 200), elements=st.floats(0, 50, allow_nan=False)),
       st.lists(st.floats(1e-4, 100, allow_nan=False), min_size=1, max_size=30))
def test_eta_is_a_non_decreasing_fraction(m, eps):
    eps = np.sort(np.asarray(eps))
    eta, count = margins.eta_curve(m, eps)
    assert np.all((eta >= 0) & (eta <= 1))
    assert np.all(np.diff(eta) >= 0) and np.all(np.diff(count) >= 0)
    assert np.array_equal(count, (m[None, :] < eps[:, None]).sum(1))  # definition: fraction with margin < eps
    top, _ = margins.eta_curve(m, [m.max() + 1.0])
    assert top[0] == 1.0


@SETTINGS
@given(st.floats(1e-4, 1e-1), st.floats(2, 50), st.integers(2, 60))
def test_log_eps_grid_is_increasing_and_spans_the_range(lo, hi, n):
    g = margins.log_eps_grid(lo, hi, n)
    assert len(g) == n and np.all(np.diff(g) > 0)
    assert g[0] == pytest.approx(lo) and g[-1] == pytest.approx(hi)
