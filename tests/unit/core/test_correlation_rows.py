"""core.stats.spearman_rows: each row's Spearman rho as core.stats.spearman gives it, NaN where it is undefined."""

from __future__ import annotations

import numpy as np
import pytest

from llmgeom.core.stats import spearman, spearman_rows


def test_rows_equal_spearman_with_ties_and_resample_duplicates():
    rng = np.random.default_rng(3)
    x = np.round(rng.standard_normal(40), 1)  # ties
    y = 0.5 * x + rng.standard_normal(40)
    ix = rng.integers(0, 40, size=(60, 40))  # bootstrap resamples: repeated rows are ties of both
    got = spearman_rows(x[ix], y[ix])
    want = np.array([spearman(x[i], y[i])[0] for i in ix])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # the known answers of core.stats.spearman's docstring (four tied values, then a smaller one; two tied pairs)
    assert spearman_rows([[0, 1, 2, 3, 4]], [[3.0, 3.0, 3.0, 3.0, 1.0]])[0] == pytest.approx(-0.7071, abs=1e-4)
    assert spearman_rows([[0, 1, 2, 3, 4]], [[3.0, 2.0, 3.0, 2.0, 1.0]])[0] == pytest.approx(-0.7379, abs=1e-4)


def test_undefined_rows_are_nan_not_a_correlation():
    x = np.array([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0], [1.0, np.nan, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    y = np.array([[1.0, 3.0, 2.0, 4.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    got = spearman_rows(x, y)
    assert got[0] == pytest.approx(spearman(x[0], y[0])[0], abs=1e-12)
    assert np.isnan(got[1:]).all()  # constant x, non-finite x, constant y
    assert np.isnan(spearman_rows(np.ones((2, 2)) * [[1, 2]], np.ones((2, 2)) * [[2, 1]])).all()  # n < 3
    with pytest.raises(ValueError, match="one shape"):
        spearman_rows(np.ones((2, 4)), np.ones((2, 5)))
