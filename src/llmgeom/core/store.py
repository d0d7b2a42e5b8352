"""HDF5 activation store: the contract between extraction and the analyses.

Layout (DESIGN.md section 2, contract version ``CONTRACT_VERSION``):

Root attributes: model, source, revision, torch_dtype, device, attn_implementation,
n_layers, d_model, d_unembed, n_heads, n_kv_heads, head_dim, vocab_size,
architecture (JSON), prompt_set, prompt_set_sha256, versions (JSON),
created (UTC), contract_version, complete (True only once every dataset is written).

Datasets (float32 unless stated; each has ``units`` and ``axes`` attributes):

- ``prompts/text`` vlen utf-8 [n_prompts]; ``prompts/n_tokens`` int32; ``prompts/meta`` JSON str
- ``last_token/residual`` [n_prompts, n_layers+1, d_model] (0 = embeddings, l = output of block l, pre final norm)
- ``last_token/final_normed`` [n_prompts, d_unembed] (input of the unembedding; d_unembed == d_model
  except OPT with a narrower ``word_embed_proj_dim``)
- ``last_token/values`` [n_prompts, n_layers, n_kv_heads*head_dim]
- ``last_token/keys`` [n_prompts, n_layers, n_kv_heads, head_dim] (pre-RoPE)
- ``last_token/attn_output`` [n_prompts, n_layers, n_heads*head_dim] (contract 3): the attention output at
  the final token, i.e. the attention-weighted sum of values with heads concatenated, the input of
  o_proj / dense / out_proj / c_proj (issue 14 item 5)
- ``attention/entropy`` [n_prompts, n_layers, n_heads] nats (prompt sets with attention), final query's
  attention row per head, computed from hooked queries and keys (any attention implementation)
- ``next_token/entropy`` [n_prompts] nats; ``next_token/top_ids`` int64 / ``top_logits`` [n_prompts, k]
- SULA sets (extracted with candidate tokens): ``next_token/candidate_logprobs`` [n_prompts, n_candidates]
  log-probabilities in nats over the full vocabulary (float32), ``next_token/candidate_ids`` int64 (same shape)
- corpus sets: ``tokens/residual_sample`` [n_sample, n_layers+1, d_model], ``tokens/final_normed_sample``
  [n_sample, d_unembed] (unembedding input at the same positions, for the Fisher metric), ``tokens/sample_prompt``,
  ``tokens/sample_position`` int32 [n_sample]; ``tokens/margin`` (top-1 minus top-2 logit),
  ``tokens/nll`` (nats), ``tokens/entropy`` (nats), ``tokens/prompt``, ``tokens/position`` int32 [n_positions].

Writes go to ``<path>.partial`` and are renamed by ``ActivationWriter.commit``; a
crashed job leaves only the ``.partial`` file, which nothing reads.

Integrity (contract version 2, issue 12): every numeric dataset is chunked with HDF5's per-chunk
Fletcher-32 checksum filter (``fletcher32=True``, after lzf compression), so a stored value that is not
what was written is detected when its chunk is read: :func:`open_activations` returns a file whose
datasets turn any read error into a :class:`StoreError` naming the file, the dataset and the command to
rerun. Variable-length string datasets (``prompts/text``, ``prompts/meta``) cannot be filtered by HDF5;
their content SHA-256 is recorded at commit (dataset attribute ``sha256``) and checked when the file is
opened. Cost: benchmarks/README.md ("Checksums").
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from llmgeom.core.io import partial_path
from llmgeom.core.versions import package_versions

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")  # network file systems; set before h5py import

import h5py  # noqa: E402
import numpy as np  # noqa: E402

CONTRACT_VERSION = 3  # 2: Fletcher-32 checksums on every numeric dataset, sha256 of string datasets; 3: last_token/attn_output

NUMERIC_1D_CHUNK = 4096   # elements per chunk of a 1-D numeric dataset (16-32 KB)

UNITS = {
    "last_token/residual": ("activation", "prompt,layer(0=embeddings),d_model"),
    "last_token/final_normed": ("activation", "prompt,d_unembed"),
    "last_token/values": ("activation", "prompt,layer,n_kv_heads*head_dim"),
    "last_token/keys": ("activation", "prompt,layer,kv_head,head_dim"),
    "last_token/attn_output": ("activation", "prompt,layer,n_heads*head_dim"),
    "attention/entropy": ("nats", "prompt,layer,head"),
    "next_token/entropy": ("nats", "prompt"),
    "next_token/top_ids": ("token id", "prompt,rank"),
    "next_token/top_logits": ("logits", "prompt,rank"),
    "next_token/candidate_logprobs": ("log-probability (nats)", "prompt,candidate"),
    "next_token/candidate_ids": ("token id", "prompt,candidate"),
    "tokens/residual_sample": ("activation", "sample,layer(0=embeddings),d_model"),
    "tokens/final_normed_sample": ("activation", "sample,d_unembed"),
    "tokens/sample_prompt": ("index", "sample"),
    "tokens/sample_position": ("token position", "sample"),
    "tokens/margin": ("logits", "position"),
    "tokens/nll": ("nats", "position"),
    "tokens/entropy": ("nats", "position"),
    "tokens/prompt": ("index", "position"),
    "tokens/position": ("token position", "position"),
    "prompts/n_tokens": ("tokens", "prompt"),
    "prompts/text": ("text", "prompt"),
    "prompts/meta": ("JSON object", "prompt"),
}


class StoreError(ValueError):
    """An activation file that must not be trusted; the message names the rule to rerun."""


def rerun_hint(path) -> str:
    """What to run when the activation file ``path`` cannot be trusted (part of every StoreError)."""
    return (f"rerun rule extract (extract_sula for SULA sets) for it: snakemake --forcerun {path} "
            "(reruns it and every analysis that reads it)")


def chunk_layout(shape: tuple, dtype) -> dict:
    """``create_dataset`` keywords of one dataset of the store (contract version 2).

    Numeric datasets with rows: chunked (one row per chunk for N-D, ``NUMERIC_1D_CHUNK`` elements
    for 1-D), lzf-compressed and Fletcher-32 checksummed. Empty datasets and strings: contiguous (HDF5
    cannot filter variable-length data; strings get a recorded sha256 instead).
    """
    if dtype == "str" or not shape or shape[0] == 0 or 0 in tuple(shape):
        return {}
    chunks = (1,) + tuple(shape[1:]) if len(shape) > 1 else (min(int(shape[0]), NUMERIC_1D_CHUNK),)
    return {"chunks": chunks, "compression": "lzf", "fletcher32": True}


def strings_sha256(values) -> str:
    """SHA-256 of a sequence of strings (each UTF-8 encoded, prefixed by its byte length)."""
    import hashlib

    h = hashlib.sha256()
    for v in values:
        b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _is_string(ds) -> bool:
    return h5py.check_string_dtype(ds.dtype) is not None


class CheckedDataset(h5py.Dataset):
    """A dataset of a trusted activation file: any failed read (Fletcher-32 checksum mismatch, a
    corrupt compressed chunk, a damaged chunk index) raises :class:`StoreError` naming the file, the
    dataset and the rerun command instead of h5py's ``OSError``."""

    def _fail(self, e):
        return StoreError(f"{self.file.filename}: dataset {self.name.lstrip('/')!r} cannot be read: its stored "
                          f"bytes are not what was written (corrupted on disk or in transfer: {e}); "
                          f"{rerun_hint(self.file.filename)}")

    def __getitem__(self, args, new_dtype=None):
        try:
            return super().__getitem__(args, new_dtype=new_dtype)
        except OSError as e:
            raise self._fail(e) from None

    def read_direct(self, dest, source_sel=None, dest_sel=None):
        try:
            return super().read_direct(dest, source_sel=source_sel, dest_sel=dest_sel)
        except OSError as e:
            raise self._fail(e) from None


class CheckedGroup(h5py.Group):
    """Group whose datasets are :class:`CheckedDataset`."""

    def __getitem__(self, name):
        return _checked(self, name, h5py.Group.__getitem__)


class CheckedFile(h5py.File):
    """Read-only activation file returned by :func:`open_activations` (datasets are checked on read)."""

    def __getitem__(self, name):
        return _checked(self, name, h5py.File.__getitem__)


def _checked(group, name, get):
    try:
        obj = get(group, name)
    except OSError as e:  # a damaged object header or chunk index (a missing name stays a KeyError)
        where = f"{group.name.rstrip('/')}/{name}".lstrip("/")
        raise StoreError(f"{group.file.filename}: dataset {where!r} cannot be opened: the file's structure is "
                         f"damaged ({e}); {rerun_hint(group.file.filename)}") from None
    if isinstance(obj, h5py.Dataset):
        return CheckedDataset(obj.id)
    if isinstance(obj, h5py.Group):
        return CheckedGroup(obj.id)
    return obj


class ActivationWriter:
    """Create ``<path>.partial``, fill datasets by row slices, then ``commit()``.

    ``shapes`` maps dataset name -> (shape tuple, numpy dtype). Rows are written
    with ``write(name, rows, values)``; non-finite float values raise ValueError
    (callers name model, layer and prompt before that point).
    """

    def __init__(self, path, attrs: dict, shapes: dict, compression="lzf"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = partial_path(self.path)
        if self.tmp.exists():
            self.tmp.unlink()
        self.f = h5py.File(self.tmp, "w")
        for k, v in attrs.items():
            self.f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else ("" if v is None else v)
        self.f.attrs["contract_version"] = CONTRACT_VERSION
        self.f.attrs["created"] = datetime.now(timezone.utc).isoformat()
        self.f.attrs["versions"] = json.dumps(package_versions())
        self.f.attrs["complete"] = False
        for name, (shape, dtype) in shapes.items():
            layout = chunk_layout(tuple(shape), dtype)
            if layout and compression != "lzf":
                layout["compression"] = compression
            ds = self.f.create_dataset(name, shape=shape, dtype=h5py.string_dtype("utf-8") if dtype == "str"
                                       else dtype, **layout)
            units, axes = UNITS.get(name, ("", ""))
            ds.attrs["units"] = units
            ds.attrs["axes"] = axes

    def write(self, name: str, rows, values) -> None:
        """Write ``values`` at row indices ``rows`` (sorted int array or slice) of dataset ``name``."""
        v = np.asarray(values) if not isinstance(values, list) else values
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and not np.isfinite(v).all():
            raise ValueError(f"refusing to store non-finite values in {name}")
        ds = self.f[name]
        if isinstance(rows, slice):
            ds[rows] = v
            return
        rows = np.asarray(rows)
        order = np.argsort(rows)
        rows = rows[order]
        v = [v[i] for i in order] if isinstance(v, list) else v[order]
        if len(rows) and np.all(np.diff(rows) == 1):
            ds[rows[0]:rows[-1] + 1] = v
        else:
            for r, x in zip(rows, v):
                ds[int(r)] = x

    def commit(self) -> Path:
        """Record the sha256 of every string dataset, mark complete, close, and atomically rename
        to the final path."""
        names = []
        self.f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and _is_string(o) else None)
        for n in names:
            self.f[n].attrs["sha256"] = strings_sha256(self.f[n].asstr()[()] if self.f[n].size else [])
        self.f.attrs["complete"] = True
        self.f.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Close and delete the partial file."""
        try:
            self.f.close()
        finally:
            self.tmp.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _workflow_prompt_file(h5_path: Path, prompt_set) -> Path | None:
    """The prompt file a workflow activation file was extracted from, when it exists; else None:
    ``<root>/resources/prompts/<set>.jsonl`` for ``<root>/results/<model>/activations/<set>.h5``, and
    ``<root>/resources/prompts/sula/<model>/<cond>.jsonl`` for ``.../activations/sula_<cond>.h5``."""
    p = Path(h5_path)
    if not prompt_set or p.parent.name != "activations" or len(p.parents) < 4 or p.parents[2].name != "results":
        return None
    prompts = p.parents[3] / "resources" / "prompts"
    if p.stem == prompt_set:
        cand = prompts / f"{prompt_set}.jsonl"
    elif p.stem == f"sula_{prompt_set}":
        cand = prompts / "sula" / p.parents[1].name / f"{prompt_set}.jsonl"
    else:
        return None
    return cand if cand.is_file() else None


def open_activations(path, *, model: str | None = None, prompt_set_sha256: str | None = None) -> CheckedFile:
    """Open a committed activation file read-only and check that it can be trusted.

    Every numeric read from the returned file is verified by HDF5's Fletcher-32 chunk checksums (a
    failed read raises :class:`StoreError`); string datasets are checked here against their recorded
    sha256.

    Without ``prompt_set_sha256``, a file at the workflow's place
    (``<root>/results/<model>/activations/<set>.h5``) is checked against the current prompt file
    ``<root>/resources/prompts/<set>.jsonl`` when that exists (a copied-in or stale file is refused).

    Raises:
        StoreError: missing, truncated, not an HDF5 file, incomplete, other contract
            version, other model or other prompt set, a string dataset whose content differs from
            its recorded sha256; later, a dataset read whose chunk checksum fails. The message names
            the file (and dataset) and says to rerun rule ``extract``.
    """
    path = Path(path)
    fix = rerun_hint(path)
    if not path.is_file():
        raise StoreError(f"{path} does not exist; run rule extract")
    try:
        f = CheckedFile(path, "r")
    except OSError as e:
        raise StoreError(f"{path} is not a readable HDF5 file ({e}); {fix}") from None
    a = f.attrs
    problems = []
    if a.get("contract_version") != CONTRACT_VERSION:
        problems.append(f"contract version {a.get('contract_version')} != {CONTRACT_VERSION}")
    if not bool(a.get("complete", False)):
        problems.append("file is incomplete")
    if model is not None and a.get("model") != model:
        problems.append(f"file is for model {a.get('model')!r}, expected {model!r}")
    if prompt_set_sha256 is not None and a.get("prompt_set_sha256") != prompt_set_sha256:
        problems.append("prompt set sha256 differs from the current prompt file")
    elif prompt_set_sha256 is None:
        current = _workflow_prompt_file(path, a.get("prompt_set"))
        if current is not None and a.get("prompt_set_sha256") != _sha256(current):
            problems.append(f"it was extracted from another version of the prompt set (sha256 "
                            f"{str(a.get('prompt_set_sha256'))[:12]}.. != {_sha256(current)[:12]}.. of {current})")
    if not problems:
        problems = _string_problems(f)
    if problems:
        f.close()
        raise StoreError(f"{path}: {'; '.join(problems)}; {fix}")
    return f


def _string_problems(f) -> list[str]:
    """String datasets whose content does not match the sha256 recorded at commit."""
    names: list[str] = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and _is_string(o) else None)
    out = []
    for n in names:
        ds = h5py.Dataset(f[n].id)
        try:
            got = strings_sha256(ds.asstr()[()] if ds.size else [])
        except (OSError, UnicodeDecodeError, ValueError) as e:
            out.append(f"dataset {n!r} cannot be read: its stored bytes are not what was written ({e})")
            continue
        if ds.attrs.get("sha256") != got:
            out.append(f"dataset {n!r} does not match its recorded sha256 (corrupted on disk or in transfer)")
    return out


class NonFiniteDataError(StoreError):
    """A stored array holds NaN or inf (the writer refuses them, so the file was altered or copied in)."""


def read_finite(f: h5py.File, name: str, rows=None, *, layer: int | None = None, dtype=np.float64) -> np.ndarray:
    """Read a numeric dataset of an open activation file and refuse non-finite values.

    The one reading helper of every analysis (issue 11): a NaN or inf is reported with the file, the
    dataset, the layer and the first bad row, instead of numpy's "X contains non-finite values" later.

    Args:
        f: an open file (:func:`open_activations`).
        name: dataset path, e.g. ``"last_token/values"`` (axes as in ``UNITS``).
        rows: None (all rows), a slice, or a sorted 1-d int array of rows (prompts / samples / positions).
        layer: index on axis 1 (the layer axis of ``last_token/*``, ``attention/entropy``,
            ``tokens/residual_sample``) or None (all of them).
        dtype: dtype of the returned array (float64 by default).

    Returns:
        numpy array: shape of the dataset with ``rows`` applied and, when ``layer`` is given, axis 1 removed.

    Raises:
        KeyError: no such dataset. NonFiniteDataError (a StoreError): a non-finite value; the message names
            the file, the dataset, its layer (given, or the layer of the first bad value when the dataset has
            a layer axis) and the first bad row (the row of the file, not of the selection).
    """
    ds = f[name]
    idx = None if rows is None or isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)
    if layer is None:
        a = ds[()] if rows is None else (ds[rows] if idx is None else ds[idx])
    elif idx is None:
        a = ds[(slice(None) if rows is None else rows), int(layer)]
    else:
        a = ds[idx][:, int(layer)]
    a = np.asarray(a, dtype=dtype)
    if a.size and not np.isfinite(a).all():
        first = np.argwhere(~np.isfinite(a))[0]
        r = int(first[0]) if a.ndim else 0
        if idx is not None:
            r = int(idx[r])
        elif isinstance(rows, slice):
            r = range(ds.shape[0])[rows][r]
        axes = str(ds.attrs.get("axes", ""))
        if layer is not None:
            lay = f"layer {int(layer)}"
        elif a.ndim >= 2 and axes.split(",")[1:2] and axes.split(",")[1].startswith("layer"):
            lay = f"layer {int(first[1])}"
        else:
            lay = "no layer axis"
        axis0 = axes.split(",")[0] or "row"
        raise NonFiniteDataError(
            f"{f.filename}: dataset {name!r}, {lay}, {axis0} row {r}: non-finite value {a[tuple(first)]!r} "
            f"(first of {int(np.count_nonzero(~np.isfinite(a)))} in what was read); the extraction never writes one, "
            f"so the file was altered or copied in; {rerun_hint(f.filename)}")
    return a


def attrs_dict(f: h5py.File) -> dict:
    """Root attributes with JSON fields decoded."""
    out = {}
    for k, v in f.attrs.items():
        if isinstance(v, str) and v[:1] in "{[":
            try:
                v = json.loads(v)
            except json.JSONDecodeError:
                pass
        out[k] = v.item() if hasattr(v, "item") else v
    return out
