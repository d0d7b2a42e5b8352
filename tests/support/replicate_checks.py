"""Test helper: a table's ``<column>_replicates`` cells reproduce its ``<column>_lo`` / ``<column>_hi`` interval
(the contract of :func:`llmgeom.core.stats.replicates_text`: the claims engine re-decides verdicts on them)."""

from __future__ import annotations

import numpy as np

from llmgeom.core.stats import bootstrap_interval, parse_replicates


def assert_replicates_reproduce(table, column: str, *, ci: float, bounds=None, lo: str | None = None,
                                hi: str | None = None, n_boot: int | None = None) -> int:
    """Assert, for every row of ``table`` with a non-empty ``<column>_replicates`` cell, that
    ``bootstrap_interval(row[column], parse_replicates(cell), ci=ci, bounds=bounds)`` equals the row's interval
    (``lo`` / ``hi`` columns, default ``<column>_lo`` / ``<column>_hi``) up to the 9 significant digits the cell
    keeps, and that the cell holds ``n_boot`` replicates when given. Returns the number of rows checked."""
    lo, hi = lo or f"{column}_lo", hi or f"{column}_hi"
    checked = 0
    for _, row in table.iterrows():
        reps = parse_replicates(row[f"{column}_replicates"])
        if not reps.size:
            continue
        if n_boot is not None:
            assert reps.size == n_boot, (column, reps.size)
        want = (float(row[lo]), float(row[hi]))
        got = bootstrap_interval(float(row[column]), reps, ci=ci, bounds=bounds)
        scale = 1e-8 * max(1.0, np.nanmax(np.abs(reps)) if np.isfinite(reps).any() else 1.0)
        np.testing.assert_allclose(got, want, rtol=0, atol=scale, err_msg=f"{column}: {dict(row)}")
        checked += 1
    return checked
