"""HDF5 activation store: the contract between extraction and the analyses.

Layout (DESIGN.md section 2, contract version ``CONTRACT_VERSION``):

Root attributes: model, source, revision, torch_dtype, device, attn_implementation,
n_layers, d_model, d_unembed, n_heads, n_kv_heads, head_dim, vocab_size,
architecture (JSON), prompt_set, prompt_set_sha256, versions (JSON),
created (UTC), contract_version, complete (True only once every dataset is written),
attention_layers (JSON list of the 0-based decoder blocks that have attention; absent in older files: every
layer, :func:`attention_layers`).

Attention-free layers (hybrid and state-space models): the per-layer attention datasets
(:data:`ATTENTION_LAYER_DATASETS`: ``last_token/values``, ``last_token/keys``, ``last_token/attn_output``,
``attention/entropy``) keep the layer axis of every block, and their rows of a layer outside
``attention_layers`` are NaN, every element (the writer requires it; everywhere else it refuses non-finite
values). :func:`read_finite` refuses a read of such a layer (:class:`NoAttentionLayerError`) and, reading all
layers, checks the attention layers for finiteness and the others for NaN. A model without any attention layer
(Mamba, Mamba-2, Falcon-Mamba) has ``attention_layers`` = [] and none of these datasets (``DatasetSpec.when``
``"attention_layers"``); n_heads = n_kv_heads = head_dim = 0 there.

Datasets (float32 unless stated; each has ``units`` and ``axes`` attributes):

- ``prompts/text`` vlen utf-8 [n_prompts]; ``prompts/n_tokens`` int32; ``prompts/meta`` JSON str
- ``last_token/residual`` [n_prompts, n_layers+1, d_model] (0 = embeddings, l = output of block l, pre final norm)
- ``last_token/final_normed`` [n_prompts, d_unembed] (input of the unembedding; d_unembed == d_model
  except OPT with a narrower ``word_embed_proj_dim``)
- ``last_token/values`` [n_prompts, n_layers, n_kv_heads*value_head_dim]
- ``last_token/keys`` [n_prompts, n_layers, n_kv_heads, head_dim] (pre-RoPE)
- ``last_token/attn_output`` [n_prompts, n_layers, n_heads*value_head_dim] (contract 3): the attention output at
  the final token, i.e. the attention-weighted sum of values with heads concatenated, the input of
  o_proj / dense / out_proj / c_proj

value_head_dim == head_dim (the root attribute) except under multi-head latent attention (DeepSeek-V2/V3 MLA;
the ``architecture`` attribute's ``latent_attention`` and ``value_head_dim``): there n_kv_heads = n_heads (the
heads ``kv_b_proj`` decompresses), head_dim = qk_nope_head_dim + qk_rope_head_dim and value_head_dim = v_head_dim;
the values are those the attention function receives, and a key head is [k_nope_h | k_rope] before RoPE: k_nope_h
decompressed per head (``kv_b_proj`` of the normed latent), k_rope the pre-RoPE columns of ``kv_a_proj_with_mqa``
(shared by every head, in the projection's coordinate order). Such keys are not x @ W_K (the latent passes a
norm): key orthogonality does not apply there (``llmgeom.extract.capture``, ``architectures.no_key_projection``).
- ``attention/entropy`` [n_prompts, n_layers, n_heads] nats (prompt sets with attention), final query's
  attention row per head, computed from hooked queries and keys (any attention implementation; with attention
  sinks the entropy of keys plus the sink outcome, docs/design-notes.md "Attention sinks")
- ``next_token/entropy`` [n_prompts] nats; ``next_token/top_ids`` int64 / ``top_logits`` [n_prompts, k]
- SULA sets (extracted with candidate tokens): ``next_token/candidate_logprobs`` [n_prompts, n_candidates]
  log-probabilities in nats over the full vocabulary (float32), ``next_token/candidate_ids`` int64 (same shape)
- corpus sets: ``tokens/residual_sample`` [n_sample, n_layers+1, d_model], ``tokens/final_normed_sample``
  [n_sample, d_unembed] (unembedding input at the same positions, for the Fisher metric), ``tokens/sample_prompt``,
  ``tokens/sample_position``, ``tokens/sample_next_token`` (the token after the sampled one; -1 at a passage's
  last token) int32 [n_sample]; ``tokens/margin`` (top-1 minus top-2 logit),
  ``tokens/nll`` (nats), ``tokens/entropy`` (nats), ``tokens/prompt``, ``tokens/position`` int32 [n_positions].

The names, dtypes, named axes and units above are declared once, in :data:`CONTRACT` (contract 4: the axes
are HDF5 dimension scales at the root, named as in :data:`DIMS`, so xarray/h5netcdf and
:func:`open_labelled` give labelled arrays).

:data:`DS` holds the dataset names as constants derived from :data:`CONTRACT` (code elsewhere names a dataset
only through them), and ``DatasetSpec.point`` declares the capture hook point each per-layer dataset is read from
(``last_token/values`` <- ``attn.hook_v``; ``extract.forward`` registers its hooks and names its buffers by it).

The store knows no workflow: what to rerun when a file cannot be trusted and which prompt file a file is checked
against come from the installed :class:`StoreContext` (:data:`PLAIN` by default; the workflow installs
``llmgeom.pipeline.layout.CONTEXT`` in every job).

Writes go to ``<path>.partial`` and are renamed by ``ActivationWriter.commit`` (:mod:`llmgeom.core.writer`); a
crashed job leaves only the ``.partial`` file, which nothing reads except a resumed extraction with the
same inputs (``ActivationWriter(resume_key=...)``: committed batches are checked against their sha256).

Full disks: :func:`estimate_nbytes` gives a file's size from its :func:`contract_shapes` (the extraction checks it
against the free space before it starts); the writer holds ``<path>.reserve`` (``core.io.SpaceReserve``) while it
writes, flushes a batch's data before recording the batch as committed, and on ENOSPC gives the reserve back so
that HDF5 can close the partial file intact (:meth:`ActivationWriter.close_after_disk_full`).

Integrity (contract version 2): every numeric dataset is chunked with HDF5's per-chunk
Fletcher-32 checksum filter (``fletcher32=True``; integer datasets after lzf compression, floating-point
ones uncompressed: lzf saved 0.001% of an activation file and cost ~3% of the extraction), so a stored value that is not
what was written is detected when its chunk is read: :func:`open_activations` returns a file whose
datasets turn any read error into a :class:`StoreError` naming the file, the dataset and the command to
rerun. Variable-length string datasets (``prompts/text``, ``prompts/meta``) cannot be filtered by HDF5;
their content SHA-256 is recorded at commit (dataset attribute ``sha256``) and checked when the file is
opened. Cost: benchmarks/README.md ("Checksums").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from llmgeom.core.io import sha256_file

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")  # network file systems; set before h5py import

import h5py  # noqa: E402
import numpy as np  # noqa: E402

CONTRACT_VERSION = 5  # 2: Fletcher-32 checksums on every numeric dataset, sha256 of string datasets; 3: last_token/attn_output; 4: named axes (HDF5 dimension scales); 5: tokens/sample_next_token

NUMERIC_1D_CHUNK = 4096   # elements per chunk of a 1-D numeric dataset (16-32 KB)

@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of the contract: ``dtype`` ("float32", "int32", "int64", "str"), ``dims`` (named axes,
    stored as HDF5 dimension scales; sizes in :data:`DIMS`), ``units``, ``axes`` (the human-readable
    ``axes`` attribute), ``when`` (``always``, ``attention_layers`` (models with at least one attention layer),
    ``attention`` (those, extracted with attention entropies), ``candidates``, ``corpus``: which files have it) and
    ``point``: the hook point of the capture API (``llmgeom.extract.capture``, ``blocks.<l>.<point>``) whose
    output the extraction stores here, per layer, or None (computed from the logits or the final norm's
    output). One quantity, one declared mapping: the extraction's hooks and buffers are looked up by this
    (``extract.batch.BatchHooks``), so hook point, buffer and dataset cannot drift apart."""

    dtype: str
    dims: tuple[str, ...]
    units: str
    axes: str
    when: str = "always"
    point: str | None = None


#: Named axes of the activation file (HDF5 dimension scales at the file's root; xarray dimension names).
DIMS = {
    "prompt": "prompt row (order of the prompt file)",
    "layer": "decoder block, 0-based",
    "resid_layer": "residual-stream depth: 0 = embeddings, l = output of block l (pre final norm)",
    "d_model": "residual-stream coordinate", "d_unembed": "unembedding-input coordinate",
    "value_feature": "value coordinate (n_kv_heads*value_head_dim, head-major)", "kv_head": "key/value head",
    "head_dim": "coordinate within a query/key head", "head": "query head",
    "attn_feature": "attention-output coordinate (n_heads*value_head_dim, head-major)",
    "rank": "rank of the next-token logit (0 = top)", "candidate": "candidate token (prompt meta order)",
    "sample": "sampled (prompt, position) of a corpus set", "position": "(prompt, position) pair 1..len-2 of a corpus set",
}

#: The HDF5 contract: every dataset of an activation file (DESIGN.md section 2).
CONTRACT: dict[str, DatasetSpec] = {
    "prompts/text": DatasetSpec("str", ("prompt",), "text", "prompt"),
    "prompts/meta": DatasetSpec("str", ("prompt",), "JSON object", "prompt"),
    "prompts/n_tokens": DatasetSpec("int32", ("prompt",), "tokens", "prompt"),
    "last_token/residual": DatasetSpec("float32", ("prompt", "resid_layer", "d_model"), "activation",
                                       "prompt,layer(0=embeddings),d_model", point="hook_resid_post"),
    "last_token/final_normed": DatasetSpec("float32", ("prompt", "d_unembed"), "activation", "prompt,d_unembed"),
    "last_token/values": DatasetSpec("float32", ("prompt", "layer", "value_feature"), "activation",
                                     "prompt,layer,n_kv_heads*head_dim", "attention_layers", point="attn.hook_v"),
    "last_token/keys": DatasetSpec("float32", ("prompt", "layer", "kv_head", "head_dim"), "activation",
                                   "prompt,layer,kv_head,head_dim", "attention_layers", point="attn.hook_k"),
    "last_token/attn_output": DatasetSpec("float32", ("prompt", "layer", "attn_feature"), "activation",
                                          "prompt,layer,n_heads*head_dim", "attention_layers", point="attn.hook_z"),
    "next_token/entropy": DatasetSpec("float32", ("prompt",), "nats", "prompt"),
    "next_token/top_ids": DatasetSpec("int64", ("prompt", "rank"), "token id", "prompt,rank"),
    "next_token/top_logits": DatasetSpec("float32", ("prompt", "rank"), "logits", "prompt,rank"),
    "next_token/candidate_logprobs": DatasetSpec("float32", ("prompt", "candidate"), "log-probability (nats)",
                                                 "prompt,candidate", "candidates"),
    "next_token/candidate_ids": DatasetSpec("int64", ("prompt", "candidate"), "token id", "prompt,candidate",
                                            "candidates"),
    "attention/entropy": DatasetSpec("float32", ("prompt", "layer", "head"), "nats", "prompt,layer,head", "attention",
                                     point="attn.hook_qk"),
    "tokens/residual_sample": DatasetSpec("float32", ("sample", "resid_layer", "d_model"), "activation",
                                          "sample,layer(0=embeddings),d_model", "corpus", point="hook_resid_post"),
    "tokens/final_normed_sample": DatasetSpec("float32", ("sample", "d_unembed"), "activation", "sample,d_unembed",
                                              "corpus"),
    "tokens/sample_prompt": DatasetSpec("int32", ("sample",), "index", "sample", "corpus"),
    "tokens/sample_position": DatasetSpec("int32", ("sample",), "token position", "sample", "corpus"),
    "tokens/sample_next_token": DatasetSpec("int32", ("sample",), "token id (-1: the passage's last token)", "sample",
                                            "corpus"),
    "tokens/margin": DatasetSpec("float32", ("position",), "logits", "position", "corpus"),
    "tokens/nll": DatasetSpec("float32", ("position",), "nats", "position", "corpus"),
    "tokens/entropy": DatasetSpec("float32", ("position",), "nats", "position", "corpus"),
    "tokens/prompt": DatasetSpec("int32", ("position",), "index", "position", "corpus"),
    "tokens/position": DatasetSpec("int32", ("position",), "token position", "position", "corpus"),
}

#: The contract's dataset names as constants, derived from :data:`CONTRACT` (the name upper-cased, "/" -> "_":
#: ``DS.LAST_TOKEN_VALUES == "last_token/values"``). Code outside this module names a dataset only through these
#: (tests/unit/core/test_store.py fails on a bare name in src/ or workflow/), so a dataset is named in one place.
DS = SimpleNamespace(**{name.replace("/", "_").upper(): name for name in CONTRACT})

#: ``units`` and ``axes`` attribute of each dataset (read from :data:`CONTRACT`).
UNITS = {name: (spec.units, spec.axes) for name, spec in CONTRACT.items()}

#: The per-layer datasets read at an attention layer's hook points (``attn.*``): their rows of a layer without
#: attention are NaN (module docstring; :func:`attention_layers`).
ATTENTION_LAYER_DATASETS = frozenset(name for name, spec in CONTRACT.items()
                                     if spec.point is not None and spec.point.startswith("attn."))


def contract_shapes(sizes: dict, *, attention: bool, candidates: bool, corpus: bool,
                    attention_layers: bool = True) -> dict:
    """``ActivationWriter`` shapes of one extraction: dataset name -> (shape, dtype), from :data:`CONTRACT`.

    Args:
        sizes: size of every named axis the file uses (keys of :data:`DIMS`; ``candidate`` only with
            ``candidates``, ``sample`` / ``position`` only with ``corpus``).
        attention / candidates / corpus: which optional datasets the file has (``DatasetSpec.when``).
        attention_layers: the model has at least one attention layer (False: a state-space model, whose file
            has none of :data:`ATTENTION_LAYER_DATASETS`).

    Raises:
        KeyError: an axis size missing from ``sizes``.
    """
    on = {"always": True, "attention_layers": attention_layers, "attention": attention and attention_layers,
          "candidates": candidates, "corpus": corpus}
    return {name: (tuple(int(sizes[d]) for d in spec.dims), spec.dtype)
            for name, spec in CONTRACT.items() if on[spec.when]}


#: estimate_nbytes: bytes on disk besides the values: per file (superblock, root group, attributes), per dataset
#: (object header, attributes, dimension-scale references), per chunk of a numeric dataset (its Fletcher-32 sum
#: and chunk-index entry: a version-1 B-tree key of 8 bytes per axis + 24), per variable-length string (its global
#: heap object header and the dataset's 16-byte heap id)
_FILE_OVERHEAD, _DATASET_OVERHEAD, _STRING_OVERHEAD = 16384, 2048, 32


def estimate_nbytes(shapes: dict, *, n_rows: dict | None = None, string_bytes: int = 0) -> int:
    """Bytes an activation file (or a part of it) takes on disk, from its :func:`contract_shapes`: every numeric
    dataset's values (shape x dtype size; floating-point datasets are stored uncompressed, so this is what they
    take; the lzf-compressed integers take at most this), its chunks' checksums and index entries, the strings'
    UTF-8 bytes (``string_bytes``, their sum over ``prompts/text`` and ``prompts/meta``) and heap entries, and the
    file's and datasets' headers.

    Args:
        shapes: dataset name -> (shape, dtype), as for :class:`ActivationWriter`.
        n_rows: dataset name -> rows to count (one batch's rows: what the batch writes; the headers are not
            counted then); None: the whole file.
        string_bytes: UTF-8 bytes of the string datasets' values (counted with their rows when ``n_rows`` is None).

    Returns:
        bytes (an estimate within a few percent of the written file for any realistic model; a lower bound on
        the floating-point data alone).
    """
    total = 0 if n_rows is not None else _FILE_OVERHEAD + string_bytes
    for name, (shape, dtype) in shapes.items():
        shape = tuple(int(x) for x in shape)
        rows = shape[0] if n_rows is None else int(n_rows.get(name, 0))
        if n_rows is None:
            total += _DATASET_OVERHEAD
        if dtype == "str":
            total += rows * _STRING_OVERHEAD
            continue
        per_row = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
        chunk_rows = 1 if len(shape) > 1 else max(min(shape[0], NUMERIC_1D_CHUNK), 1)  # as chunk_layout
        n_chunks = -(-rows // chunk_rows)
        if n_rows is None:  # whole chunks: the last chunk of a 1-D dataset is stored full size
            rows = n_chunks * chunk_rows
        total += rows * per_row + n_chunks * (4 + 24 + 8 * (len(shape) + 1))
    if n_rows is None:  # the dimension scales (int64, one per named axis)
        sizes = {d: n for name, (shape, _) in shapes.items() if name in CONTRACT
                 for d, n in zip(CONTRACT[name].dims, shape)}
        total += sum(8 * int(n) + _DATASET_OVERHEAD for n in sizes.values())
    return int(total)


class StoreError(ValueError):
    """An activation file that must not be trusted; the message ends with what to rerun (:func:`rerun_hint`)."""


@dataclass(frozen=True)
class StoreContext:
    """What the store cannot know itself, supplied by the layer that runs it (the store knows no workflow).

    ``rerun_hint(path) -> str``: what to run when the activation file ``path`` cannot be trusted (ends every
    :class:`StoreError`). ``prompt_file(path, prompt_set) -> Path | None``: the current prompt file of the
    activation file ``path`` extracted from ``prompt_set`` (its ``prompt_set`` attribute), which
    :func:`open_activations` checks the file against when no ``prompt_set_sha256`` is given; None: no check.

    :data:`PLAIN` (the default: notebooks, scripts) names the extraction function and checks no prompt file;
    the workflow installs its own with :func:`use_context` (``llmgeom.pipeline.layout.install``: its rules, its
    rerun command and its output layout).
    """

    rerun_hint: Callable[[Path], str]
    prompt_file: Callable[[Path, str | None], Path | None]


def _plain_rerun_hint(path) -> str:
    return (f"extract it again with the same model and prompt set: llmgeom.extract.forward.extract_to_hdf5("
            f"model_dir, prompts_path, {str(path)!r}, model_name=...)")


#: The context outside a workflow: a hint naming the extraction function, no prompt file to check.
PLAIN = StoreContext(rerun_hint=_plain_rerun_hint, prompt_file=lambda path, prompt_set: None)
_context: StoreContext = PLAIN


def use_context(context: StoreContext | None) -> StoreContext:
    """Install ``context`` (None: :data:`PLAIN`) for every later store call in this process; returns the previous
    one (to restore it)."""
    global _context
    if context is not None and not isinstance(context, StoreContext):
        raise TypeError(f"use_context: expected a StoreContext or None, got {type(context).__name__}")
    prev, _context = _context, context or PLAIN
    return prev


def rerun_hint(path) -> str:
    """What to run when the activation file ``path`` cannot be trusted (part of every StoreError), from the
    installed :class:`StoreContext`."""
    return _context.rerun_hint(Path(path))


def chunk_layout(shape: tuple, dtype) -> dict:
    """``create_dataset`` keywords of one dataset of the store (contract version 2).

    Numeric datasets with rows: chunked (one row per chunk for N-D, ``NUMERIC_1D_CHUNK`` elements
    for 1-D) and Fletcher-32 checksummed; integer datasets (indices, token ids, the dimension scales) are
    lzf-compressed first, floating-point ones are not (activations' mantissas do not compress: lzf saved
    2 bytes of 191,891 per prompt on SmolLM2's ``mixed`` file and cost ~3% of the extraction's time).
    Empty datasets and strings: contiguous (HDF5 cannot filter variable-length data; strings get a
    recorded sha256 instead).
    """
    if dtype == "str" or not shape or shape[0] == 0 or 0 in tuple(shape):
        return {}
    chunks = (1,) + tuple(shape[1:]) if len(shape) > 1 else (min(int(shape[0]), NUMERIC_1D_CHUNK),)
    if np.dtype(dtype).kind == "f":
        return {"chunks": chunks, "fletcher32": True}
    return {"chunks": chunks, "compression": "lzf", "fletcher32": True}


def strings_sha256(values) -> str:
    """SHA-256 of a sequence of strings (each UTF-8 encoded, prefixed by its byte length)."""
    h = hashlib.sha256()
    for v in values:
        b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def is_string_dataset(ds) -> bool:
    """Whether an HDF5 dataset holds variable-length strings (unfiltered: its content sha256 is recorded)."""
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


def open_activations(path, *, model: str | None = None, prompt_set_sha256: str | None = None) -> CheckedFile:
    """Open a committed activation file read-only and check that it can be trusted.

    Every numeric read from the returned file is verified by HDF5's Fletcher-32 chunk checksums (a
    failed read raises :class:`StoreError`); string datasets are checked here against their recorded
    sha256.

    Without ``prompt_set_sha256``, the file is checked against its current prompt file when the installed
    :class:`StoreContext` names one (the workflow's does, for a file at the rules' output place: a copied-in or
    stale file is refused; :data:`PLAIN` names none).

    Raises:
        StoreError: missing, truncated, not an HDF5 file, incomplete, other contract
            version, other model or other prompt set, a string dataset whose content differs from
            its recorded sha256; later, a dataset read whose chunk checksum fails. The message names
            the file (and dataset) and ends with :func:`rerun_hint` (in the workflow: the rule and the command
            to rerun).
    """
    path = Path(path)
    fix = rerun_hint(path)
    if not path.is_file():
        raise StoreError(f"{path} does not exist; {fix}")
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
        current = _context.prompt_file(path, a.get("prompt_set"))
        if current is not None and a.get("prompt_set_sha256") != sha256_file(current):
            problems.append(f"it was extracted from another version of the prompt set (sha256 "
                            f"{str(a.get('prompt_set_sha256'))[:12]}.. != {sha256_file(current)[:12]}.. of {current})")
    if not problems:
        problems = _string_problems(f)
    if problems:
        f.close()
        raise StoreError(f"{path}: {'; '.join(problems)}; {fix}")
    return f


def _string_problems(f) -> list[str]:
    """String datasets whose content does not match the sha256 recorded at commit."""
    names: list[str] = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and is_string_dataset(o) else None)
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


class NoAttentionLayerError(ValueError):
    """A read of a per-layer attention dataset (:data:`ATTENTION_LAYER_DATASETS`) at a layer without attention
    (a state-space / linear-attention / MLP-only block of a hybrid model); the message names the file, the
    dataset, the layer and the file's attention layers."""


def attention_layers(f) -> list[int]:
    """The 0-based decoder blocks of an activation file's model that have attention: the root attribute
    ``attention_layers`` (JSON list), or every block ``0..n_layers-1`` for a file without it (written before
    the contract recorded it, when every layer had attention; n_layers from the attribute, else the layer axis of the values).

    Args:
        f: an open activation file (or a dict of its root attributes, :func:`attrs_dict`).
    """
    a = f if isinstance(f, dict) else f.attrs
    raw = a.get("attention_layers")
    if raw is None:
        n = a.get("n_layers")
        if n is None and not isinstance(f, dict):  # a file without the root attributes: its layer axis
            n = next((f[k].shape[1] for k in ("last_token/values", "attention/entropy") if k in f), 0)
        return list(range(int(n)))
    if isinstance(raw, (bytes, str)):
        raw = json.loads(raw)
    return [int(x) for x in raw]


def attention_free_layers(f) -> list[int]:
    """The 0-based decoder blocks without attention (the complement of :func:`attention_layers`)."""
    a = f if isinstance(f, dict) else f.attrs
    if a.get("attention_layers") is None:  # files from before the attribute (and attention-only models' files): none
        return []
    with_attention = set(attention_layers(f))
    return [l for l in range(int(a["n_layers"])) if l not in with_attention]


def read_finite(f: h5py.File, name: str, rows=None, *, layer: int | None = None, dtype=np.float64) -> np.ndarray:
    """Read a numeric dataset of an open activation file and refuse non-finite values.

    The one reading helper of every analysis: a NaN or inf is reported with the file, the
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
        A per-layer attention dataset read over all layers holds NaN at the layers without attention
        (:func:`attention_free_layers`; none in a file of an attention-only model).

    Raises:
        KeyError: no such dataset. NoAttentionLayerError: ``layer`` has no attention (per-layer attention
            datasets of a hybrid model). NonFiniteDataError (a StoreError): a non-finite value; the message names
            the file, the dataset, its layer (given, or the layer of the first bad value when the dataset has
            a layer axis) and the first bad row (the row of the file, not of the selection).
    """
    ds = f[name]
    free = attention_free_layers(f) if name in ATTENTION_LAYER_DATASETS else []
    if free and layer is not None and int(layer) in free:
        raise NoAttentionLayerError(
            f"{f.filename}: dataset {name!r}, layer {int(layer)}: this layer has no attention (a state-space, "
            f"linear-attention or MLP-only block), so it has no {name.split('/')[-1]}; attention layers of the file: "
            f"{attention_layers(f)} (root attribute attention_layers)")
    idx = None if rows is None or isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)
    if layer is None:
        a = ds[()] if rows is None else (ds[rows] if idx is None else ds[idx])
    elif idx is None:
        a = ds[(slice(None) if rows is None else rows), int(layer)]
    else:
        a = ds[idx][:, int(layer)]
    a = np.asarray(a, dtype=dtype)
    if free and layer is None and a.ndim >= 2:  # the attention-free layers' rows are NaN by contract
        if not np.isnan(a[:, free]).all():
            raise NonFiniteDataError(
                f"{f.filename}: dataset {name!r}: the rows of the layers without attention {free} must be NaN (the "
                f"contract), but hold numbers; the file was altered or copied in; {rerun_hint(f.filename)}")
        check = a.copy()
        check[:, free] = 0.0
    else:
        check = a
    if check.size and not np.isfinite(check).all():
        a = check
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


def open_labelled(path, group: str | None = "last_token", **checks):
    """An activation file as labelled xarray arrays (for notebooks): one group as an ``xarray.Dataset``
    whose dimensions are the file's named axes (:data:`DIMS`: prompt, layer, resid_layer, head,
    value_feature, ...), each with an integer coordinate 0..size-1; ``group=None``: the whole file as an
    ``xarray.DataTree``.

    The file is checked first as by :func:`open_activations` (``checks``: ``model``, ``prompt_set_sha256``);
    values are read lazily through h5netcdf, every chunk read verified by its Fletcher-32 checksum.

    Example: ``open_labelled(p)["values"].sel(layer=3)`` is ``f["last_token/values"][:, 3]``.

    Raises:
        StoreError: the file cannot be trusted (see :func:`open_activations`).
        KeyError: no such group (names the groups of the file).
    """
    import xarray as xr

    with open_activations(path, **checks) as f:
        groups = sorted(k for k, v in f.items() if isinstance(v, h5py.Group))
        sizes = {d: int(f[d].shape[0]) for d in DIMS if d in f}
    if group is None:
        return xr.open_datatree(path, engine="h5netcdf")  # the root's axes are coordinates of every group
    if group not in groups:
        raise KeyError(f"{path}: no group {group!r}; groups: {', '.join(groups)}")
    ds = xr.open_dataset(path, engine="h5netcdf", group=group)
    return ds.assign_coords({d: np.arange(sizes[d]) for d in ds.dims if d in sizes})
