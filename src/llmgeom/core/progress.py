"""Progress you can watch: done / total, rate and ETA from ``tqdm``.

In a terminal the bar redraws in place (every ``LLMGEOM_PROGRESS_TTY_S``, default 0.5 s); in a
job log (stderr not a TTY, as under SLURM or Snakemake's per-job logs) it writes one plain line
every ``LLMGEOM_PROGRESS_LOG_S`` seconds (default 20) and a final line, so the log reads top to
bottom without carriage returns. ``LLMGEOM_PROGRESS=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm


class _LineWriter:
    """A file for tqdm that turns its in-place redraws into whole lines (log files)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s: str) -> None:
        s = s.replace("\r", "").replace("\x1b[A", "").strip()
        if s:
            self.stream.write(s + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be a number of seconds") from None
    if v < 0:
        raise ValueError(f"environment variable {name}={raw!r} must be >= 0 seconds")
    return v


def progress(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it", stream=None) -> tqdm:
    """A ``tqdm`` progress bar on stderr (or ``stream``) that reads well in a terminal and in a log file.

    Args:
        iterable: optional iterable to wrap; otherwise call ``.update(n)`` on the result.
        total: number of units (prompts, batches, resamples, steps); shown as done/total with an ETA.
        desc: what is running, e.g. "extract smollm2 mixed".
        unit: the unit counted (shown in the rate, e.g. "prompt/s").

    Returns:
        The ``tqdm`` object (use as a context manager, or ``close()`` it).

    Raises:
        ValueError: ``LLMGEOM_PROGRESS_LOG_S`` / ``LLMGEOM_PROGRESS_TTY_S`` not a number >= 0.
    """
    stream = stream if stream is not None else sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    off = os.environ.get("LLMGEOM_PROGRESS", "1") in ("0", "false", "no", "off")
    interval = _seconds("LLMGEOM_PROGRESS_TTY_S", 0.5) if tty else _seconds("LLMGEOM_PROGRESS_LOG_S", 20.0)
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream if tty else _LineWriter(stream),
                mininterval=interval, maxinterval=max(interval, 10.0), miniters=1, dynamic_ncols=tty,
                ncols=None if tty else 100, ascii=not tty, disable=off, leave=True, smoothing=0.1)
