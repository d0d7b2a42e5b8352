"""The entropy axis u_ent (unit PC1 of the standardized last-token values, signed so that
corr(v.u, H_model) >= 0) and its seeded random control axis (Paper III sec. 4.5). Numpy only; the PCA is
:class:`llmgeom.measures.pca.ValueManifoldPCA` with :data:`llmgeom.measures.pca.H_MODEL_SIGN`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmgeom.core.stats import pearson
from llmgeom.measures.pca import H_MODEL_SIGN, ValueManifoldPCA

# --------------------------------------------------------------------------- axes


@dataclass
class EntropyAxis:
    """Entropy axis of one layer: unit ``u`` [D] (raw value coordinates), ``sigma`` (std of v.u over the
    fit prompts, raw value units), ``corr`` (Pearson corr(v.u, H_model) >= 0 on the fit prompts),
    ``pc1`` (explained-variance share of PC1 of the standardized values, as ``pc1`` in value_manifold.csv),
    ``n_fit``, ``flipped``; ``sign`` is the convention's label, "pearson(h_model_bits) >= 0"."""

    layer: int
    u: np.ndarray
    sigma: float
    corr: float
    pc1: float
    n_fit: int
    flipped: bool
    sign: str = H_MODEL_SIGN.label


def entropy_axis(values, h_model, layer: int = -1) -> EntropyAxis:
    """Fit the entropy axis of one layer.

    Args:
        values: [n_prompts, D] last-token value vectors of the SULA main prompts at this layer.
        h_model: [n_prompts] model label entropy H_model (bits) of the same prompts (sign reference).

    Returns:
        :class:`EntropyAxis` with unit u = normalized (w / sd) where w is the unit PC1 loading of the
        standardized values and sd the per-coordinate std (constant coordinates get 0); sign such that
        Pearson corr(values @ u, h_model) >= 0 (no flip if undefined); sigma = std(values @ u).

    Raises:
        ValueError: bad shapes, fewer than 3 prompts, non-finite values, no variance.

    Source: Paper III sec. 4.5 (entropy axis and sigma); DESIGN.md sec. 3 (Interventions).
    """

    V = np.asarray(values, np.float64)
    h = np.asarray(h_model, np.float64)
    if V.ndim != 2 or h.shape != (V.shape[0],):
        raise ValueError(f"values must be [n, D] and h_model [n], got {V.shape} and {h.shape}")
    if V.shape[0] < 3:
        raise ValueError(f"the entropy axis needs at least 3 prompts, got {V.shape[0]}")
    if not np.any(np.ptp(V, axis=0) > 0):
        raise ValueError(f"layer {layer}: the last-token values are identical for every prompt (at layer 0 they "
                         "depend only on the final token ':'), so there is no entropy axis; choose a later layer")
    est = ValueManifoldPCA(standardize=True, n_components=1, sign=H_MODEL_SIGN).fit(V, h)
    sd = V[:, est.kept_].std(axis=0)
    u = np.zeros(V.shape[1])
    u[est.kept_] = est.components_[0] / sd  # the signed loading, back in raw value coordinates
    u /= np.linalg.norm(u)
    return EntropyAxis(layer=int(layer), u=u, sigma=float(np.std(V @ u)), corr=pearson(V @ u, h)[0],
                       pc1=est.pc1_, n_fit=int(V.shape[0]), flipped=bool(est.sign_flipped_[0]))


def random_axis(u, seed: int, layer: int) -> np.ndarray:
    """Random unit axis orthogonal to ``u`` [D]: Gaussian draw from ``default_rng([seed, layer])``,
    Gram-Schmidt against the normalized u twice, then normalized (float64).

    Raises:
        ValueError: D < 2 or u of zero length.

    Source: Paper III sec. 4.6 (matched random-axis control).
    """
    u = np.asarray(u, np.float64).ravel()
    nu = np.linalg.norm(u)
    if u.size < 2 or nu == 0:
        raise ValueError("random_axis needs a non-zero axis with at least 2 coordinates")
    u = u / nu
    g = np.random.default_rng([int(seed), int(layer)]).standard_normal(u.size)
    for _ in range(2):
        g = g - (g @ u) * u
    return g / np.linalg.norm(g)
