"""The unembedding (output head) of a prepared model, for the Fisher metric (LSM).

May import: torch, transformers (lazily), llmgeom.models, llmgeom.core.
"""

from __future__ import annotations

import numpy as np


def load_unembedding(model_dir) -> tuple[np.ndarray, np.ndarray | None, float | None]:
    """Unembedding of a prepared model as numpy arrays.

    Loaded on CPU in float32 through :func:`llmgeom.models.loading.load_prepared` and the
    architectures module (tied weights, OPT's project_out, output bias and soft-capping handled
    there).

    Returns:
        (W [V, d_unembed] float32, bias [V] float32 or None, final-logit soft-capping constant or None).

    Raises:
        ModelSourceError / ModelMemoryError: see :func:`load_prepared`.

    Source: LSM (Fisher information metric G(h) = W^T (diag p - p p^T) W).
    """
    import torch

    from llmgeom.models import architectures as arch
    from llmgeom.models.loading import load_prepared

    model, _ = load_prepared(model_dir, dtype="float32", device="cpu")
    W, b = arch.unembedding(model)
    W = W.detach().to(torch.float32).numpy().copy()
    b = None if b is None else b.detach().to(torch.float32).numpy().copy()
    cap = arch.logit_softcap(model)
    del model
    return W, b, (float(cap) if cap else None)
