"""The unembedding (output head) of a prepared model, for the Fisher metric and decoding (LSM).

May import: torch, transformers (lazily), llmgeom.models, llmgeom.core.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def load_unembedding(model_dir) -> tuple[np.ndarray, np.ndarray | None, float | None]:
    """Unembedding of a prepared model as numpy arrays, reading only the output head's tensors.

    Which tensors form the head comes from the model itself: its class is built from the config on the
    ``meta`` device (no weights, no memory) and :func:`llmgeom.models.architectures.unembedding` names the
    head's weight and bias (tied weights: the input embedding's name); only those are read from the
    safetensors file(s) (``safetensors.safe_open``) and cast to float32. Checkpoints that are not
    safetensors, or whose keys do not carry those names (transformers renames some at load, e.g. GPT-NeoX's
    ``embed_out`` -> ``lm_head``), are loaded whole through :func:`llmgeom.models.loading.load_prepared`
    (float32, CPU): the same arrays, more time and memory (tests/unit/measures/test_decoding.py).

    Returns:
        (W [V, d_unembed] float32, bias [V] float32 or None, final-logit soft-capping constant or None).

    Raises:
        ModelSourceError / ModelMemoryError: see :func:`load_prepared`.

    Source: LSM (Fisher information metric G(h) = W^T (diag p - p p^T) W; logits z = W h).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from llmgeom.models import architectures as arch
    from llmgeom.models.loading import resolve_weights_path

    wp = Path(resolve_weights_path(Path(model_dir)))
    config = AutoConfig.from_pretrained(wp)
    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception:  # a class that cannot be built without weights: read them all
        skeleton = None
    arrays = _read_head(wp, skeleton) if skeleton is not None else None
    cap = arch.logit_softcap(skeleton) if skeleton is not None else None
    if arrays is None:
        from llmgeom.models.loading import load_prepared

        model, _ = load_prepared(model_dir, dtype="float32", device="cpu")
        arrays = [None if t is None else t.detach().to(torch.float32).numpy().copy() for t in arch.unembedding(model)]
        cap = arch.logit_softcap(model)
        del model
    W, b = arrays
    return W, b, (float(cap) if cap else None)


def _read_head(wp: Path, skeleton):
    """[W, b] of the head as float32 arrays from the safetensors file(s) under ``wp``, or None."""
    import json

    import torch
    from safetensors import safe_open

    from llmgeom.models import architectures as arch

    index = wp / "model.safetensors.index.json"
    if index.is_file():
        where = {k: wp / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    elif (wp / "model.safetensors").is_file():
        with safe_open(wp / "model.safetensors", framework="pt") as f:
            where = {k: wp / "model.safetensors" for k in f.keys()}
    else:
        return None
    names = {id(p): [] for p in skeleton.parameters()}
    for name, p in skeleton.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
    out = []
    for t in arch.unembedding(skeleton):
        if t is None:
            out.append(None)
            continue
        key = next((n for n in names.get(id(t), []) if n in where), None)
        if key is None:
            return None
        with safe_open(where[key], framework="pt") as f:
            a = f.get_tensor(key)
        if tuple(a.shape) != tuple(t.shape):
            return None
        out.append(a.to(torch.float32).numpy().copy())
    return out
