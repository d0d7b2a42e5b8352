"""Base of the figures: matplotlib without a display (Agg) and one atomic save for every figure.

Figures are drawn from tidy tables, never from models or activation files; each function of the
family modules writes the same figure as PNG and PDF.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from llmgeom.core.io import atomic_path  # noqa: E402


def save_figure(fig, paths) -> None:
    """Write ``fig`` to every path in ``paths`` (format from the suffix: PNG, PDF) via ``<path>.partial`` files,
    renamed only once every format is written (a failure leaves none of them changed), then close the figure.

    Raises:
        DiskFullError: the file system filled (``core.io.atomic_path``: names the file and the free space); no
            partial file is left.
    """
    try:
        with contextlib.ExitStack() as stack:
            for p in map(Path, paths):
                tmp = stack.enter_context(atomic_path(p))
                fig.savefig(tmp, dpi=130, bbox_inches="tight", format=p.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
