"""Parameter counts of a prepared model, from its config alone (the scaling study's x axis).

May import: torch, transformers (lazily), llmgeom.models, llmgeom.core.
"""

from __future__ import annotations

from pathlib import Path


def parameter_counts(model_dir) -> dict:
    """Total and non-embedding parameter counts of a prepared model, without reading its weights.

    The model's class is built from its config on the ``meta`` device (no memory), as
    :func:`llmgeom.weights.unembedding.load_unembedding` does; parameters shared by two modules (tied input
    and output embeddings) count once.

    Args:
        model_dir: a prepared model directory (``resources/models/<model>``, with its manifest).

    Returns:
        dict with n_params (every distinct parameter), n_params_embedding (the token and position
        embeddings: every ``torch.nn.Embedding``, and an output head not tied to the input embedding),
        n_params_non_embedding (n_params - n_params_embedding: the count of Kaplan et al. 2020, sec. 2.1,
        "excluding vocabulary and positional embeddings"), tied_embeddings (bool), d_model, n_layers,
        vocab_size (from the manifest's architecture summary).

    Raises:
        FileNotFoundError: not a prepared directory. Exceptions of ``transformers`` for a config whose class
        cannot be built.

    Source: Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1 (non-embedding N).
    """
    import torch
    from transformers import AutoConfig

    from llmgeom.models import architectures as arch
    from llmgeom.models.loading import meta_model, resolve_weights_path
    from llmgeom.models.sources import read_manifest

    man = read_manifest(model_dir)
    config = AutoConfig.from_pretrained(Path(resolve_weights_path(Path(model_dir))))
    model = meta_model(config)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once
    emb = {id(p): p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    head = arch.unembedding(model)[0]
    tied = head is not None and id(head) in emb
    if head is not None and not tied:
        emb[id(head)] = head.numel()
    a = man.get("architecture") or {}
    n_emb = sum(emb.values())
    return dict(n_params=int(total), n_params_embedding=int(n_emb), n_params_non_embedding=int(total - n_emb),
                tied_embeddings=bool(tied), d_model=int(a.get("d_model") or config.hidden_size),
                n_layers=int(a.get("n_layers") or config.num_hidden_layers), vocab_size=int(a.get("vocab_size") or 0))
