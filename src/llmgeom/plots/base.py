"""Base of the figures: matplotlib without a display (Agg) and one atomic save for every figure.

Figures are drawn from tidy tables, never from models or activation files; each function of the
family modules writes the same figure as PNG and PDF.
"""

from __future__ import annotations

import contextlib
import math
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


def panel_grid(n: int, ncol: int, height: float, width: float = 13.0):
    """A figure of ``n`` panels in rows of ``ncol`` (each row ``height`` inches, the figure ``width``); the unused
    panels are switched off. Returns (fig, axes [nrow, ncol], nrow)."""
    nrow = max(1, math.ceil(n / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(width, height * nrow), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, axes, nrow


def shared_legend(fig, axes, *, fontsize: float, nrow: int, top: float) -> None:
    """One legend above a panel grid with every label of its panels once (first handle wins), then a tight
    layout that leaves ``top / nrow`` of the height for it."""
    h, lab = [], []
    for ax in axes.flat:
        for hh, ll in zip(*ax.get_legend_handles_labels()):
            if ll not in lab:
                h.append(hh), lab.append(ll)
    fig.legend(h, lab, loc="upper center", ncol=len(lab), fontsize=fontsize, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - top / nrow))
