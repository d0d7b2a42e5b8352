"""The writer of HDF5 activation files (the contract: :mod:`llmgeom.core.store`): :class:`ActivationWriter`
writes ``<path>.partial`` batch by batch, records each committed batch with the sha256 of what it wrote (a resumed
extraction checks them), holds a space reserve beside it, and renames the file when every dataset is written.

May import: numpy, h5py, llmgeom.core.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from llmgeom.core.io import SpaceReserve, partial_path, replace_durably, reserve_path
from llmgeom.core.versions import package_versions


import h5py
import numpy as np

from llmgeom.core.store import (ATTENTION_LAYER_DATASETS, CONTRACT, CONTRACT_VERSION, DIMS, UNITS,
                                  attention_free_layers, chunk_layout, is_string_dataset, strings_sha256)


def batch_digest(items: dict) -> str:
    """SHA-256 of what one batch wrote: ``items`` maps dataset name -> (rows [m] int, values [m, ...]); names in
    sorted order, rows sorted, each value array as its stored dtype's bytes (C order)."""
    h = hashlib.sha256()
    for name in sorted(items):
        rows, v = items[name]
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows, kind="stable")
        h.update(name.encode() + b"\0" + rows[order].tobytes())
        h.update(np.ascontiguousarray(np.asarray(v)[order]).tobytes())
    return h.hexdigest()


def _row_index(rows) -> np.ndarray:
    if isinstance(rows, slice):
        return np.arange(rows.start or 0, rows.stop, dtype=np.int64)
    return np.asarray(rows, dtype=np.int64)


def _write_rows(ds, rows: np.ndarray, v: np.ndarray) -> None:
    """``ds[r] = v[i]`` for each row index ``r = rows[i]``, through h5py's low-level API: one file-space
    hyperslab re-selected per row and one memory space for all rows (the high-level ``ds[r] = x`` builds both
    per row: 2.5x the time of the same writes; a union of hyperslabs in one write is slower still)."""
    v = np.ascontiguousarray(v, dtype=ds.dtype)
    if not len(rows):
        return
    rest = tuple(ds.shape[1:])
    fspace = ds.id.get_space()
    mspace = h5py.h5s.create_simple((1,) + rest)
    count, zeros = (1,) + rest, (0,) * len(rest)
    for i, r in enumerate(rows):
        fspace.select_hyperslab((int(r),) + zeros, count)
        ds.id.write(mspace, fspace, v[i:i + 1])


def _read_rows(ds, idx: np.ndarray) -> np.ndarray:
    if not len(idx):
        return ds[:0]
    if np.all(np.diff(idx) == 1):
        return ds[int(idx[0]):int(idx[-1]) + 1]
    return ds[idx]


class ActivationWriter:
    """Create ``<path>.partial``, fill datasets by row slices, then ``commit()``.

    ``shapes`` maps dataset name -> (shape tuple, numpy dtype) (for an extraction: :func:`contract_shapes`).
    Rows are written with ``write(name, rows, values)``; non-finite float values raise ValueError
    (callers name model, layer and prompt before that point), except the NaN rows of the layers without
    attention in the per-layer attention datasets (``attrs["attention_layers"]``; module docstring), which must
    be NaN. Datasets of :data:`CONTRACT` get their named
    axes as HDF5 dimension scales (datasets at the file's root named as the axis, values 0..size-1), so
    ``xarray.open_dataset(path, engine="h5netcdf", group=...)`` gives labelled arrays.

    Resumable writing: with ``resume_key`` (a digest of everything that determines the
    file's content: prompt-set sha256, model, settings, the code that writes it) and ``n_batches``, the partial file records, per
    batch, whether it is complete (``resume/done``) and the :func:`batch_digest` of what it wrote
    (``resume/sha256``), flushed by :meth:`commit_batch`. A later writer with the same key and shapes
    reopens the partial and :meth:`verify_batches` re-reads every committed batch against its digest;
    a partial with another key, other shapes, or a failed digest or chunk checksum is discarded with a log
    line. ``resume/*`` and the key are removed at :meth:`commit`, so a resumed file has the same datasets,
    byte for byte, as an uninterrupted one.
    """

    def __init__(self, path, attrs: dict, shapes: dict, *, resume_key: str | None = None,
                 n_batches: int = 0, reserve_bytes: int = 0, log=print):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = partial_path(self.path)
        #: space held back while the file is written (``<path>.reserve``), given back at close, or at a full disk
        #: so that the partial file can still be flushed and closed intact (:meth:`close_after_disk_full`)
        self.reserve = SpaceReserve(reserve_path(self.path), reserve_bytes)
        self.shapes = {k: (tuple(int(x) for x in shp), dt) for k, (shp, dt) in shapes.items()}
        self.resume_key = resume_key
        self.n_batches = int(n_batches)
        self.log = log
        self._pending: dict = {}
        self._datasets: dict = {}  # name -> h5py.Dataset of self.f (a lookup by path costs ~0.1 ms; ~10 per batch),
        # dropped (_forget_datasets) wherever self.f is closed, so a recreated partial starts a new set
        #: the layers without attention (attrs ``attention_layers``): their rows of the per-layer attention datasets
        #: are NaN by contract; empty for attention-only models (the plain finiteness check, nothing more)
        self.attention_free = attention_free_layers(attrs) if "n_layers" in attrs else []
        self.f = None
        self.resumed = False
        try:
            if self.tmp.exists() and resume_key is not None:
                self.f = self._reopen()
            if self.f is None:
                self.tmp.unlink(missing_ok=True)
                self.f = self._create(attrs)
        except BaseException:
            self.reserve.release()
            raise

    def _create(self, attrs):
        f = h5py.File(self.tmp, "w")
        try:
            return self._fill_new(f, attrs)
        except BaseException:  # e.g. a full disk: nothing of this file is worth keeping
            self.reserve.release()  # room for HDF5 to close the file cleanly
            try:
                f.close()
            finally:
                self.tmp.unlink(missing_ok=True)
            raise

    def _fill_new(self, f, attrs):
        for k, v in attrs.items():
            f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v)
        f.attrs["contract_version"] = CONTRACT_VERSION
        f.attrs["created"] = datetime.now(timezone.utc).isoformat()
        f.attrs["versions"] = json.dumps(package_versions())
        f.attrs["complete"] = False
        sizes: dict = {}
        for name, (shape, dtype) in self.shapes.items():
            spec = CONTRACT.get(name)
            if spec is not None and len(spec.dims) == len(shape):
                for dim, n in zip(spec.dims, shape):
                    if sizes.setdefault(dim, n) != n:
                        raise ValueError(f"dataset {name!r}: axis {dim!r} has size {n}, another dataset of the "
                                         f"file has {sizes[dim]}; fix the shapes passed to ActivationWriter")
        for dim, n in sizes.items():  # dimension scales first: the named axes of the file
            sc = f.create_dataset(dim, data=np.arange(n, dtype=np.int64), **chunk_layout((n,), "int64"))
            sc.make_scale(dim)
            sc.attrs["description"] = DIMS.get(dim, "")
        for name, (shape, dtype) in self.shapes.items():
            layout = chunk_layout(tuple(shape), dtype)
            ds = f.create_dataset(name, shape=shape, dtype=h5py.string_dtype("utf-8") if dtype == "str"
                                  else dtype, **layout)
            units, axes = UNITS.get(name, ("", ""))
            ds.attrs["units"] = units
            ds.attrs["axes"] = axes
            spec = CONTRACT.get(name)
            if spec is not None and len(spec.dims) == len(shape):
                for i, dim in enumerate(spec.dims):
                    ds.dims[i].attach_scale(f[dim])
        if self.resume_key is not None:
            f.attrs["resume_key"] = self.resume_key
            f.create_dataset("resume/done", shape=(self.n_batches,), dtype="int8", fillvalue=0)
            f.create_dataset("resume/sha256", shape=(self.n_batches,), dtype="S64")
            f.flush()
        return f

    def _reopen(self):
        why = None
        try:
            f = h5py.File(self.tmp, "r+")
        except OSError as e:
            self.log(f"[store] discarding {self.tmp}: not a readable HDF5 file ({e})")
            return None
        try:
            if f.attrs.get("resume_key") != self.resume_key:
                why = "it was written with other inputs (prompts, model, settings or package code)"
            elif f.attrs.get("contract_version") != CONTRACT_VERSION:
                why = f"contract version {f.attrs.get('contract_version')} != {CONTRACT_VERSION}"
            elif "resume/done" not in f or f["resume/done"].shape != (self.n_batches,):
                why = "it has no record of its committed batches"
            else:
                for name, (shape, _) in self.shapes.items():
                    if name not in f or tuple(f[name].shape) != shape:
                        why = f"dataset {name!r} is missing or has another shape"
                        break
        except (OSError, KeyError) as e:
            why = f"its structure cannot be read ({e})"
        if why:
            f.close()
            self.log(f"[store] discarding {self.tmp}: {why}; extracting from the start")
            return None
        self.resumed = True
        return f

    def done_batches(self) -> np.ndarray:
        """Indices of the batches recorded as complete (empty for a new file or without ``resume_key``)."""
        if self.resume_key is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.f["resume/done"][:] == 1)

    def verify_batches(self, rows_of) -> np.ndarray:
        """Re-read every committed batch and compare it with its recorded digest.

        Args:
            rows_of: ``rows_of(j) -> {dataset name: row indices}`` of batch ``j`` (as written).

        Returns:
            the indices of the verified batches. When one fails (digest mismatch, or a chunk whose
            Fletcher-32 checksum fails), the partial file is discarded with a log line and recreated empty,
            and the result is empty.
        """
        done = self.done_batches()
        try:
            for j in done:
                items = {}
                for name, rows in rows_of(int(j)).items():
                    idx = np.sort(_row_index(rows))
                    items[name] = (idx, _read_rows(self.f[name], idx))
                if batch_digest(items) != self.f["resume/sha256"][j].decode():
                    raise ValueError(f"batch {int(j)} does not match its recorded sha256")
        except (OSError, ValueError) as e:
            self.log(f"[store] discarding {self.tmp}: a committed batch cannot be trusted ({e}); "
                     "extracting from the start")
            attrs = {k: v for k, v in self.f.attrs.items()
                     if k not in ("contract_version", "created", "versions", "complete", "resume_key")}
            self._forget_datasets()
            self.f.close()
            self.tmp.unlink()
            self.resumed = False
            self.f = self._create(attrs)
            return np.zeros(0, dtype=np.int64)
        if len(done):
            self.log(f"[store] resuming {self.tmp}: {len(done)} of {self.n_batches} batches already committed "
                     "(verified against their sha256)")
        return done

    def begin_batch(self) -> None:
        """Start a batch: what is written from here to :meth:`commit_batch` goes into its digest."""
        self._pending.clear()

    def _forget_datasets(self) -> None:
        """Drop the kept handles (before the file closes or a group is deleted: HDF5 frees a deleted dataset's
        space only once no handle holds it, so a held ``resume/*`` handle at :meth:`commit` would leave its bytes
        in the file)."""
        self._datasets = {}

    def _dataset(self, name: str) -> h5py.Dataset:
        """``self.f[name]``, the handle kept until the file closes."""
        ds = self._datasets.get(name)
        if ds is None:
            ds = self._datasets[name] = self.f[name]
        return ds

    def write(self, name: str, rows, values) -> None:
        """Write ``values`` at row indices ``rows`` (sorted int array or slice) of dataset ``name``."""
        v = np.asarray(values) if not isinstance(values, list) else values
        if self.attention_free and name in ATTENTION_LAYER_DATASETS:
            self._check_attention_rows(name, v)
        elif isinstance(v, np.ndarray) and v.dtype.kind == "f" and not np.isfinite(v).all():
            raise ValueError(f"refusing to store non-finite values in {name}")
        ds = self._dataset(name)
        if self.resume_key is not None and isinstance(v, np.ndarray):
            idx = _row_index(rows)
            prev = self._pending.get(name)
            arr = v.astype(ds.dtype, copy=False)
            self._pending[name] = (idx, arr) if prev is None else (np.concatenate([prev[0], idx]),
                                                                   np.concatenate([prev[1], arr]))
        if isinstance(rows, slice):
            ds[rows] = v
            return
        rows = np.asarray(rows)
        order = np.argsort(rows)
        rows = rows[order]
        v = [v[i] for i in order] if isinstance(v, list) else v[order]
        if len(rows) and np.all(np.diff(rows) == 1):
            ds[rows[0]:rows[-1] + 1] = v
        elif isinstance(v, list):
            for r, x in zip(rows, v):
                ds[int(r)] = x
        else:
            _write_rows(ds, rows, v)

    def _check_attention_rows(self, name: str, v: np.ndarray) -> None:
        """A per-layer attention dataset's rows [rows, n_layers, ...] of a hybrid model: finite at the attention
        layers, NaN at every element of the others (ValueError otherwise)."""
        free = self.attention_free
        if not np.isnan(v[:, free]).all():
            raise ValueError(f"refusing to store numbers in {name} at layers without attention {free} (the contract "
                             "keeps NaN there)")
        keep = np.ones(v.shape[1], bool)
        keep[free] = False
        if not np.isfinite(v[:, keep]).all():
            raise ValueError(f"refusing to store non-finite values in {name} at attention layers")

    def commit_batch(self, j: int) -> None:
        """Record batch ``j`` as complete with the digest of what was written since the last commit, and
        flush the file (a stop after this point keeps the batch). The batch's data are flushed first and the
        record after them: a flush that fails (a full disk) can lose data HDF5 still held, but never those of a
        batch already recorded as complete."""
        if self.resume_key is None:
            self._pending.clear()
            return
        self.f.flush()
        self._dataset("resume/sha256")[j] = batch_digest(self._pending).encode()
        self._dataset("resume/done")[j] = 1
        self._pending.clear()
        self.f.flush()

    def close_partial(self) -> Path:
        """Flush and close, keeping ``<path>.partial`` for a later resume (a stop by signal)."""
        self._pending.clear()
        self._forget_datasets()
        try:
            self.f.flush()
            self.f.close()
        finally:
            self.reserve.release()
        return self.tmp

    def close_after_disk_full(self) -> str | None:
        """After a full disk (ENOSPC from HDF5 in :meth:`write`, :meth:`commit_batch` or :meth:`commit`): give the
        reserved space back, so that HDF5 can write what it still holds (the batch in flight, its metadata), and
        close the partial file, keeping it for a resume. Returns None when it closed cleanly (a rerun verifies the
        committed batches against their sha256 and resumes), else why not (the rerun's checks then decide: a
        partial that fails them is discarded with a log line and the extraction starts over)."""
        self.reserve.release()
        self._pending.clear()
        self._forget_datasets()
        if self.f is None or not self.f.id.valid:
            return None
        try:
            self.f.close()
        except Exception as e:  # noqa: BLE001 - the reason is reported; the rerun's checks decide
            return f"HDF5 could not close it cleanly ({str(e).splitlines()[0][:200]})"
        return None

    def commit(self) -> Path:
        """Record the sha256 of every string dataset, mark complete, close, and rename to the final path durably
        (:func:`llmgeom.core.io.replace_durably`: the file's data flushed to the disk before the rename, its
        directory after it; a full disk reported only then leaves the partial file, never a short final one).

        Order, for a full disk on the way: the digests (which grow the file) are flushed while the reserve is
        still held, so a full disk there leaves the resume record intact and the reserve for
        :meth:`close_after_disk_full` (a rerun verifies every batch and only commits); the reserve is given back
        before the resume record is removed, so that what HDF5 writes from there to the close has its room (a
        close that failed after the removal would leave a partial that is extracted again).

        Raises:
            OSError: from the rename's fsync (ENOSPC where the file system allocates late) or the rename itself,
                or from HDF5 (a full disk even after the reserve was given back: ``close_after_disk_full``).
        """
        self._forget_datasets()
        names = []
        self.f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and is_string_dataset(o) else None)
        for n in names:
            self.f[n].attrs["sha256"] = strings_sha256(self.f[n].asstr()[()] if self.f[n].size else [])
        self.f.flush()
        self.reserve.release()
        if "resume" in self.f:
            del self.f["resume"]
        if "resume_key" in self.f.attrs:
            del self.f.attrs["resume_key"]
        self.f.attrs["complete"] = True
        self.f.close()
        replace_durably(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Close and delete the partial file."""
        try:
            self._forget_datasets()
            self.reserve.release()
            self.f.close()
        finally:
            self.tmp.unlink(missing_ok=True)
