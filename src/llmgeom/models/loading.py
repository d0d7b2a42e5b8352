"""Loading a prepared model (resources/models/{model}) for a forward pass: device, dtype, a memory check
before any weight is read, and the float16-overflow guard for Gemma 2/3.

May import: torch, transformers (lazily), llmgeom.models, llmgeom.core.
"""

from __future__ import annotations

from pathlib import Path

from llmgeom.models import families
from llmgeom.models.sources import read_manifest


def resolve_device(*, device: str) -> str:
    """"auto" -> "cuda" when available, else "cpu"; any other device is returned as it is (the workflow's is
    schema key ``extract.device``)."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str):
    """Config dtype -> torch dtype. "auto": bfloat16 on CUDA, float32 on CPU."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def _fp16_guard(weights_path: Path, device: str, model_dir):
    """float16 for a family known to overflow it (Gemma 2/3): upcast with a warning to bfloat16
    (CUDA with bf16 support) or float32, and return the dtype to use."""
    import warnings

    import torch
    from transformers import AutoConfig

    if not families.fp16_overflows(AutoConfig.from_pretrained(weights_path)):
        return torch.float16
    dev = str(device)
    up = torch.bfloat16 if (dev.startswith("cuda") and torch.cuda.is_available()
                            and torch.cuda.is_bf16_supported()) else torch.float32
    warnings.warn(
        f"{model_dir}: dtype float16 requested, but this architecture overflows float16 (Gemma 2/3 activations "
        f"exceed 65504 and become inf); loading it in {str(up).replace('torch.', '')} instead. Set dtype: bfloat16 "
        "(or float32) for this model in the config to silence this warning",
        stacklevel=3,
    )
    return up


class ModelMemoryError(MemoryError):
    """A model that cannot fit the memory its job declares (or the GPUs it gets); raised before any
    weight is read, with the numbers and the fix."""


MEMORY_OVERHEAD_MB = 1024  # Python, torch, tokenizer, one batch of activations and logits


def resolve_weights_path(model_dir: Path) -> Path:
    """The directory holding the weights of a prepared model: ``weights_path`` of its manifest (relative to the model directory for GGUF-prepared ones, absolute for hub/local sources)."""
    man = read_manifest(model_dir)
    wp = Path(man.get("weights_path") or ".")
    return wp if wp.is_absolute() else model_dir / wp


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a prepared model directory (from :func:`resolve_weights_path`), without the model.

    Used where only the tokenizer is needed (SULA label choice, :func:`llmgeom.prompts.sula.build_sula_sets`).

    Raises:
        FileNotFoundError: not a prepared directory (no manifest).
    """
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_weights_path(Path(model_dir)))


def meta_model(config):
    """The causal LM that ``config`` describes, built on the meta device: its parameters' shapes and sharing
    (tied weights are one tensor) without reading or allocating anything."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def count_parameters(config) -> int:
    """Exact number of parameters of the causal LM that ``config`` describes (tied weights counted
    once), from :func:`meta_model`: nothing is read or allocated."""
    return int(sum(p.numel() for p in meta_model(config).parameters()))


def check_memory(model_dir: str | Path, *, dtype: str, device: str, device_map=None,
                 mem_mb: int | None = None, name: str | None = None) -> dict:
    """Check, before loading, that the weights fit where they will live.

    ``dtype`` and ``device`` as in :func:`load_prepared` (required: schema keys ``models.<name>.dtype`` and
    ``extract.device``).

    CPU: weights + ``MEMORY_OVERHEAD_MB`` against the job's declared ``mem_mb`` (skipped when None).
    CUDA: 1.1 x weights + ``MEMORY_OVERHEAD_MB`` against the total memory of the GPU in use, or of
    every visible GPU with a ``device_map`` (e.g. "auto"). The parameter count comes from the model's
    config.json (``count_parameters``, meta device), so nothing is loaded.

    Returns:
        dict(n_params, bytes_per_param, weights_mb, needed_mb, available_mb, where).

    Raises:
        ModelMemoryError: naming both numbers and the fix (raise ``models.<name>.mem_mb``, use
            bfloat16, or device_map: auto with more GPUs).
    """
    import torch
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    name = name or model_dir.name
    dev = resolve_device(device=device)
    td = resolve_dtype(dtype, dev)
    cfg = AutoConfig.from_pretrained(resolve_weights_path(model_dir))
    n = count_parameters(cfg)
    bpp = torch.empty((), dtype=td).element_size()
    weights_mb = n * bpp / 2**20
    dt = str(td).replace("torch.", "")
    if dev.startswith("cuda"):
        if device_map:
            idx = list(range(torch.cuda.device_count()))
        else:
            d = torch.device(dev)
            idx = [d.index if d.index is not None else torch.cuda.current_device()]
        available = sum(torch.cuda.get_device_properties(i).total_memory for i in idx) / 2**20
        needed = 1.1 * weights_mb + MEMORY_OVERHEAD_MB
        where = f"{len(idx)} GPU{'s' if len(idx) > 1 else ''} ({', '.join(torch.cuda.get_device_name(i) for i in idx)})"
        fix = ("use dtype bfloat16, or device_map: auto with gpus: N on a node with more GPU memory"
               if not device_map else "request more or larger GPUs (models.{0}.gpus, gpu_model) or use bfloat16")
    else:
        available = float(mem_mb) if mem_mb is not None else float("inf")
        needed = weights_mb + MEMORY_OVERHEAD_MB
        where = f"mem_mb={mem_mb} declared by the job"
        fix = (f"raise models.{{0}}.mem_mb to at least {int(needed) + 1} (or run on a GPU node in bfloat16)")
    info = dict(n_params=n, bytes_per_param=bpp, weights_mb=round(weights_mb, 1), needed_mb=round(needed, 1),
                available_mb=round(available, 1), where=where)
    if needed > available:
        raise ModelMemoryError(
            f"model {name!r} does not fit: {n:,} parameters x {bpp} bytes ({dt}) = {weights_mb:,.0f} MiB of weights, "
            f"about {needed:,.0f} MiB needed with overhead, but only {available:,.0f} MiB available ({where}); "
            + fix.format(name))
    return info


#: Weight loads in this process: {model directory: count} (benchmarks/gpu_economy.py, the model server).
LOADS: dict[str, int] = {}
_CACHE: dict = {}


def clear_model_cache() -> None:
    """Drop the model kept by ``load_prepared(..., reuse=True)`` (frees its memory)."""
    _CACHE.clear()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


def _attn_implementation(weights_path, attn: str) -> str:
    """``attn``, or "eager" where ``families.attention_implementation`` says so (a model without attention
    layers; a family whose modules compute the attention themselves, ``Family.module_attention``)."""
    from transformers import AutoConfig

    from llmgeom.models import families

    try:
        cfg = AutoConfig.from_pretrained(weights_path)
        return families.attention_implementation(cfg, attn)
    except (OSError, ValueError, families.UnsupportedArchitectureError):  # the load itself names what is wrong
        return attn


def load_prepared(model_dir: str | Path, *, dtype: str, attn: str = "sdpa", device: str,
                  device_map: str | None = None, mem_mb: int | None = None, reuse: bool = False):
    """Load (model, tokenizer) from a prepared directory, in eval mode.

    With ``reuse=True`` the last model loaded with ``reuse=True`` is kept in this process and returned
    again for the same (directory and weights mtime, dtype, attention, device, device_map): one weight
    load for all the GPU jobs of a model that run in one process (``llmgeom.pipeline.model_server``). A different key replaces it (one model in memory at a time). Callers must not modify
    the returned model (extraction and interventions only add hooks that they remove).

    Args:
        dtype: "float32" | "bfloat16" | "float16" | "auto" (bf16 on CUDA, fp32 on CPU); required (the workflow's
            is schema key ``models.<name>.dtype``).
        device: "cpu", "cuda", "cuda:<i>" or "auto" (:func:`resolve_device`); required (schema key
            ``extract.device``).
        attn: attention implementation (extraction needs no eager weights: attention entropies come from
            hooked queries and keys, ``extract.hooks.capture_attention``); a model without attention layers
            (state-space) is loaded with "eager" whatever ``attn`` says (transformers refuses sdpa there).
        device_map: e.g. "auto" to spread a large model over the GPUs of a node. Without it, a model
            for a CUDA device is loaded straight onto that device (host memory holds no copy).
        mem_mb: the job's declared memory; with it (and always on CUDA) ``check_memory`` runs first.

    float16 on a family that overflows it (``families.FP16_OVERFLOW_MODEL_TYPES``, Gemma 2/3)
    is upcast to bfloat16 (CUDA) or float32 with a warning; the dtype used is ``model.dtype``
    (recorded as ``torch_dtype`` in every HDF5 file).

    Raises:
        FileNotFoundError: not a prepared directory.
        ModelMemoryError: the weights cannot fit (see ``check_memory``); nothing has been loaded.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    wp = resolve_weights_path(model_dir)
    key = None
    if reuse:
        try:
            stamp = max(p.stat().st_mtime_ns for p in Path(wp).iterdir())
        except (OSError, ValueError):
            stamp = None
        key = (str(Path(wp).resolve()), stamp, dtype, attn, device, device_map)
        if key in _CACHE:
            return _CACHE[key]
        clear_model_cache()
    dev = resolve_device(device=device)
    td = resolve_dtype(dtype, dev)
    if td == torch.float16:
        td = _fp16_guard(wp, dev, model_dir)
    if mem_mb is not None or dev.startswith("cuda"):
        check_memory(model_dir, dtype=str(td).replace("torch.", ""), device=dev, device_map=device_map,
                     mem_mb=mem_mb)
    kw = dict(dtype=td, attn_implementation=_attn_implementation(wp, attn))
    if device_map:
        kw["device_map"] = device_map
    elif dev.startswith("cuda"):
        kw["device_map"] = dev  # straight onto the GPU, no host copy of the weights
    model = AutoModelForCausalLM.from_pretrained(wp, **kw)
    if not device_map:
        model.to(dev)
    model.eval()
    tok = AutoTokenizer.from_pretrained(wp)
    LOADS[str(model_dir)] = LOADS.get(str(model_dir), 0) + 1
    if key is not None:
        _CACHE[key] = (model, tok)
    return model, tok
