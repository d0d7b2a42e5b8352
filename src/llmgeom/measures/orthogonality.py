"""Key orthogonality of W_K columns and its Gaussian baseline (Paper III sec. 4.2): pure array maths.

May import: numpy. Nothing of llmgeom but llmgeom.core.
"""

from __future__ import annotations

import math

import numpy as np


def orthogonality(W) -> float:
    """Mean absolute off-diagonal cosine between the columns of ``W``.

    Parameters
    ----------
    W : array [d_model, head_dim] (numpy or torch, any float dtype; computed in float64).
        Columns are the key directions of one head.

    Returns
    -------
    float in [0, 1]: mean over ordered pairs i != j of |cos(w_i, w_j)| (dimensionless).
    Orthonormal (or merely orthogonal) columns give 0; parallel columns give 1.

    Raises
    ------
    ValueError : W not 2-D, fewer than 2 columns, non-finite entries, or a zero column
        (its direction is undefined).

    Source: Paper III sec. 4.2.
    """
    if hasattr(W, "detach"):
        W = W.detach().to("cpu").double().numpy()
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2:
        raise ValueError(f"W must be 2-D [d_model, head_dim], got shape {W.shape}")
    k = W.shape[1]
    if k < 2:
        raise ValueError(f"W needs at least 2 columns for an off-diagonal cosine, got {k}")
    if not np.all(np.isfinite(W)):
        raise ValueError("W contains non-finite values")
    norms = np.linalg.norm(W, axis=0)
    if np.any(norms == 0):
        raise ValueError(f"W has {int(np.sum(norms == 0))} zero column(s): cosine undefined")
    Wn = W / norms
    C = np.abs(Wn.T @ Wn)
    off = (C.sum() - np.trace(C)) / (k * (k - 1))
    return float(np.clip(off, 0.0, 1.0))


def gaussian_expectation(d_model: int) -> float:
    """Large-head_dim expectation of :func:`orthogonality` for an i.i.d. Gaussian [d_model, k] matrix.

    The cosine of two independent isotropic vectors in R^d has mean absolute value
    Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)) ~ sqrt(2 / (pi d)). Dimensionless.
    """
    d = int(d_model)
    return float(math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi))


def gaussian_baseline(d_model: int, head_dim: int, *, seed: int, layer: int = 0, head: int = 0) -> float:
    """:func:`orthogonality` of an i.i.d. N(0, 1) matrix [d_model, head_dim].

    Seeded with ``numpy.random.default_rng([seed, layer, head])``: reproducible and independent of
    the order in which heads are visited. Source: Paper III sec. 4.2 (Gaussian baseline).
    """
    rng = np.random.default_rng([int(seed), int(layer), int(head)])
    return orthogonality(rng.standard_normal((int(d_model), int(head_dim))))
