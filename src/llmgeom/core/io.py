"""Atomic file output and small file helpers: the one way the package writes an output.

Every output is written to ``<name>.partial`` in the same directory and renamed over the final
name only when complete (:func:`atomic_path`), so a killed job never leaves a file that looks
finished; leftover ``.partial`` files are never read. The data are flushed to disk (fsync) before the
rename, and the directory after it (:func:`replace_durably`), so a file system that reports a full disk only
when the data reach it (delayed allocation, NFS) fails the write instead of leaving a short file under the final
name, and a crash after the rename keeps it. Outputs get the mode that the user's
umask gives to any new file (never ``tempfile``'s 0600), so a lab group can read each other's results.

A full disk (ENOSPC, or a disk quota: EDQUOT) while an output is written raises :class:`DiskFullError`, which
names the file, the free space on its file system and what to do (:func:`disk_full_guard`); nothing is left
under the final name.

May import: the standard library and (lazily) pandas. Nothing of llmgeom.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
from pathlib import Path


PARTIAL_SUFFIX = ".partial"

#: errno values that mean "the file system has no room for this write"
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: how libraries that do not raise OSError report them: HDF5 (``errno = 28``, in a RuntimeError or an OSError
#: without errno), safetensors' Rust writer (``StorageFull``), and the C library's own text
_NO_SPACE_TEXT = tuple(f"errno = {n}," for n in _NO_SPACE) + tuple(os.strerror(n) for n in _NO_SPACE) + (
    "StorageFull", "QuotaExceeded")


class DiskFullError(OSError):
    """The file system ran out of room (ENOSPC, or a quota: EDQUOT) while an output was written.

    ``errno`` is ``errno.ENOSPC``; ``path`` the output; ``free`` the bytes free on its file system when the
    error was raised; ``need`` the bytes the write needed, where known (None otherwise). The message names all
    three and what to do."""

    def __init__(self, message: str, *, path, free: int | None, need: int | None = None):
        super().__init__(message)
        self.errno, self.strerror, self.filename = errno.ENOSPC, message, str(path)
        self.path, self.free, self.need = Path(path), free, need

    def __str__(self) -> str:
        return self.strerror


def is_disk_full(exc: BaseException | None) -> bool:
    """True when ``exc`` (or an exception in its ``__cause__`` / ``__context__`` chain) says the file system had
    no room: an OSError with errno ENOSPC / EDQUOT, or a library's error that carries that errno in its text
    (HDF5's ``errno = 28``, safetensors' ``StorageFull``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno in _NO_SPACE):
            return True
        if any(t in str(exc) for t in _NO_SPACE_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _existing(path) -> Path:
    """``path`` or its nearest existing parent (an output's directory may not exist yet)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path) -> int:
    """Bytes free to this user on the file system of ``path`` (its nearest existing parent directory)."""
    return int(shutil.disk_usage(_existing(path)).free)


def mount_point(path) -> Path:
    """The mount point of the file system that holds ``path`` (its nearest existing parent)."""
    p = _existing(path).resolve()
    while not os.path.ismount(p):
        p = p.parent
    return p


def human_bytes(n: int | float) -> str:
    """``n`` bytes as a short decimal size with its exact count: ``"3.2 MB (3,200,000 bytes)"``."""
    x, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(x) < 1000 or unit == "PB":
            break
        x /= 1000
    short = f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
    return f"{short} ({int(n):,} bytes)"


def disk_full_error(path, *, need: int | None = None, what: str = "", fix: str = "",
                    free: int | None = None) -> DiskFullError:
    """The :class:`DiskFullError` of a write of ``path`` that found no room: names the file, the free space on its
    file system (``free``, default: now) and its mount point, ``need`` (bytes needed, where known), ``what`` (what
    became of the partial output) and ``fix`` (default: free space there, or point the output elsewhere, and
    rerun)."""
    free = free_bytes(path) if free is None else int(free)
    needs = f"; it needs {human_bytes(need)}" if need is not None else ""
    what = f" {what.strip()}" if what else ""
    fix = fix or ("free space there (or put the output on a larger file system) and rerun the same command; "
                  "Snakemake reruns the failed job")
    msg = (f"no space left on the device for {path}: {human_bytes(free)} free on {mount_point(path)}{needs}."
           f"{what} Fix: {fix}")
    return DiskFullError(msg, path=path, free=free, need=need)


@contextlib.contextmanager
def disk_full_guard(path, *, need: int | None = None, what: str = "", fix: str = ""):
    """Context manager: a full disk inside it (:func:`is_disk_full`: ENOSPC / EDQUOT from any library) is raised
    as :func:`disk_full_error` for ``path`` (chained to the original); every other exception passes unchanged.

    Example (the dequantized model's save, ``models.sources.prepare_model``)::

        with disk_full_guard(out_dir, need=model_bytes):
            model.save_pretrained(tmp)
    """
    try:
        yield
    except DiskFullError:
        raise
    except BaseException as e:
        if not is_disk_full(e):
            raise
        raise disk_full_error(path, need=need, what=what, fix=fix) from e


def partial_path(path) -> Path:
    """The temporary name of ``path`` while it is written: ``<path>.partial`` (same directory)."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def reserve_path(path) -> Path:
    """Where the space held back beside ``path`` while it is written in place lies (:class:`SpaceReserve`):
    ``<path>.reserve`` (same directory)."""
    path = Path(path)
    return path.with_name(path.name + ".reserve")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class SpaceReserve:
    """Disk space held back beside an output that is written in place over a long time (an activation file's
    ``.partial``): ``<path>`` is created with ``nbytes`` allocated (``posix_fallocate``: real blocks, not a sparse
    file) and given back (:meth:`release`) when the output is closed, or at once when the file system fills, so
    that a writer whose cached data and metadata are not yet on disk (HDF5) can still flush them and close its
    file intact.

    Raises (at creation):
        DiskFullError: not even ``nbytes`` are free (nothing is left behind).
    """

    def __init__(self, path, nbytes: int):
        self.path, self.nbytes = Path(path), max(int(nbytes), 0)
        if not self.nbytes:  # nothing to hold back: no file
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with disk_full_guard(self.path, need=self.nbytes, what="Nothing was written."):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o666)
                try:
                    os.posix_fallocate(fd, 0, self.nbytes)
                finally:
                    os.close(fd)
            except BaseException:
                self.path.unlink(missing_ok=True)
                raise

    def held(self) -> int:
        """Bytes held now (0 once released)."""
        return self.path.stat().st_size if self.path.exists() else 0

    def release(self) -> None:
        """Give the space back (idempotent)."""
        self.path.unlink(missing_ok=True)


def fsync_path(path, *, directory: bool = False) -> None:
    """Flush what the kernel holds of ``path`` (a file's data, or with ``directory`` a directory's entries) to the
    disk (``fsync``). A file system that allocates blocks only when data reach the disk (delayed allocation, NFS,
    quotas enforced by a server) reports a full disk here (OSError ENOSPC / EDQUOT), not at ``write``. File
    systems that cannot fsync a directory (EINVAL, ENOTSUP) are left as they are."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if not directory or e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def replace_durably(tmp, path) -> None:
    """Rename the complete file ``tmp`` over ``path`` (same directory) durably: ``tmp``'s data are flushed
    (:func:`fsync_path`) before ``os.replace``, so that a full disk reported only when the data reach the disk
    fails here and never leaves a short file under ``path``, and the directory after it, so that the rename
    survives a crash. The one commit step of :func:`atomic_path` and of the activation writer
    (``core.writer.ActivationWriter.commit``).

    Raises:
        OSError: from the fsync of ``tmp`` (e.g. ENOSPC; ``path`` is then left as it was) or from the rename.
    """
    path = Path(path)
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)


@contextlib.contextmanager
def atomic_path(path, *, fsync: bool = True):
    """Context manager: yield ``<path>.partial`` to write to; on success rename it over ``path``.

    The parent directory is created. On any exception (including KeyboardInterrupt) the partial
    file is removed and the exception propagates; ``path`` is left as it was. With ``fsync`` (default) the
    data are flushed to disk before the rename and the directory after it (:func:`replace_durably`).

    Raises:
        DiskFullError: the file system filled while ``<path>.partial`` was written or flushed (from any writer:
            pandas, matplotlib, json); the message names ``path``, the free space, the bytes written when it
            filled, and the fix. The partial file is removed first, and ``path`` is left as it was.

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
            replace_durably(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException as e:
        full = None if isinstance(e, DiskFullError) or not is_disk_full(e) else disk_full_error(  # free space now
            path, what=f"It had written {human_bytes(tmp.stat().st_size if tmp.exists() else 0)} to {tmp.name} when "
                       f"the device filled; that partial file was removed and {path.name} left as it was.")
        tmp.unlink(missing_ok=True)
        if full is None:
            raise
        raise full from e


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


def sha256_files(paths) -> str:
    """SHA-256 hex digest of the concatenated bytes of ``paths`` (in order), streamed 1 MiB at a time."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def sha256_file(path) -> str:
    """SHA-256 hex digest of a file's bytes (:func:`sha256_files` of one)."""
    return sha256_files([path])


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
