"""Atomic file output and small file helpers: the one way the package writes an output.

Every output is written to ``<name>.partial`` in the same directory and renamed over the final
name only when complete (:func:`atomic_path`), so a killed job never leaves a file that looks
finished; leftover ``.partial`` files are never read. Outputs get the mode that the user's umask
gives to any new file (never ``tempfile``'s 0600), so a lab group can read each other's results.

May import: the standard library and (lazily) pandas. Nothing of llmgeom.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path


PARTIAL_SUFFIX = ".partial"


def partial_path(path) -> Path:
    """The temporary name of ``path`` while it is written: ``<path>.partial`` (same directory)."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path, *, fsync: bool = False):
    """Context manager: yield ``<path>.partial`` to write to; on success rename it over ``path``.

    The parent directory is created. On any exception (including KeyboardInterrupt) the partial
    file is removed and the exception propagates; ``path`` is left as it was. With ``fsync`` the
    data is flushed to disk before the rename.

    Example::

        with atomic_path("results/m/tables/x.csv") as tmp:
            df.to_csv(tmp, index=False)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(path)
    tmp.unlink(missing_ok=True)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_dir(out_dir) -> Path:
    """Create and return an empty temporary directory ``.<name>.<random>.partial`` beside ``out_dir``
    (mode from the umask); fill it, then call :func:`commit_dir`."""
    import tempfile

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=PARTIAL_SUFFIX, dir=out_dir.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def commit_dir(tmp, out_dir) -> None:
    """Replace ``out_dir`` (if any) by the completed temporary directory ``tmp``."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)


def sha256_file(path) -> str:
    """SHA-256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_text(text: str, path) -> None:
    """Write UTF-8 text atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_table(df, path) -> None:
    """Write a tidy table as CSV atomically (``%.10g`` floats, no index)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.10g")


def concat_tables(paths):
    """Concatenate per-model tables (cross-model aggregation) into one DataFrame; empty input -> empty frame."""
    import pandas as pd

    frames = [pd.read_csv(p) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
