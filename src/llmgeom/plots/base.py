"""Base of the figures: matplotlib without a display (Agg) and one atomic save for every figure.

Figures are drawn from tidy tables, never from models or activation files; each function of the
family modules writes the same figure as PNG and PDF.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from llmgeom.core.io import atomic_path  # noqa: E402


def save_figure(fig, paths) -> None:
    """Write ``fig`` to every path in ``paths`` (format from the suffix: PNG, PDF), each atomically via ``<path>.partial``, then close the figure."""
    for p in paths:
        p = Path(p)
        with atomic_path(p) as tmp:
            fig.savefig(tmp, dpi=130, bbox_inches="tight", format=p.suffix.lstrip(".") or "png")
    plt.close(fig)
