"""Exact Bayesian posterior of the SULA task (Paper III sec. 4.3 / 5.2) and binary entropies in bits.

p(y = L1 | data) = 1 / (1 + r^-(n_L1 - n_L2)), r = alpha / (1 - alpha); H_Bayes = its binary entropy (bits).

May import: numpy. Nothing of llmgeom but llmgeom.core.
"""

from __future__ import annotations

import numpy as np

from llmgeom.core.units import nats_to_bits

# --------------------------------------------------------------------------- exact posterior


def check_alpha(alpha: float) -> float:
    """Return ``alpha`` as a float if 0.5 <= alpha < 1 (example labels agree with y at least as often as not), else raise ValueError."""
    alpha = float(alpha)
    if not 0.5 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0.5, 1), got {alpha!r}")
    return alpha


def binary_entropy_from_logit(z) -> np.ndarray:
    """Binary entropy in bits of p = sigmoid(z), computed stably from the logit z = log(p / (1-p)).

    Args:
        z: array-like of logits (any shape; +-inf allowed and give 0 bits).

    Returns:
        float64 array of the same shape, in [0, 1] bits (1 bit at z = 0).

    Source: Paper III sec. 4.3 (binary entropy of the posterior / of the renormalized label distribution).
    """
    z = np.asarray(z, dtype=np.float64)
    shape = z.shape
    z = np.atleast_1d(z)
    p = sigmoid(z)
    # -log p = softplus(-z), -log(1-p) = softplus(z); 0 * inf -> 0 handled by where
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.where(p > 0, p * np.logaddexp(0.0, -z), 0.0)
        b = np.where(p < 1, (1.0 - p) * np.logaddexp(0.0, z), 0.0)
    return np.clip(nats_to_bits(a + b), 0.0, 1.0).reshape(shape)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function 1 / (1 + exp(-z)), elementwise, float64."""
    z = np.asarray(z, dtype=np.float64)
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def binary_entropy_bits(p) -> np.ndarray:
    """Binary entropy H(p) = -p log2 p - (1-p) log2 (1-p) in bits, with 0 log 0 = 0.

    Args:
        p: array-like of probabilities in [0, 1].

    Raises:
        ValueError: a value outside [0, 1] or non-finite.
    """
    p = np.asarray(p, dtype=np.float64)
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("probabilities must be finite and in [0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(np.where(p > 0, p * np.log2(p), 0.0) + np.where(p < 1, (1 - p) * np.log2(1 - p), 0.0))
    return np.clip(h, 0.0, 1.0)


def _abs_logit(n_l1, n_l2, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(|z|, sign) with z = (n_L1 - n_L2) log(alpha/(1-alpha)): |z| is computed from |n_L1 - n_L2| alone,
    so symmetric evidence (n1, n2) / (n2, n1) gives bit-identical |z| (DESIGN.md sec. 4, floating-point ties)."""
    alpha = check_alpha(alpha)
    n1, n2 = np.asarray(n_l1, dtype=np.float64), np.asarray(n_l2, dtype=np.float64)
    if np.any(n1 < 0) or np.any(n2 < 0):
        raise ValueError("counts must be non-negative")
    diff = n1 - n2
    return np.abs(diff) * np.log(alpha / (1.0 - alpha)), np.sign(diff)


def bayes_posterior(n_l1, n_l2, alpha: float = 0.9) -> np.ndarray:
    """Exact posterior p(y = L1 | examples) = 1 / (1 + (alpha/(1-alpha))^-(n_L1 - n_L2)).

    Args:
        n_l1, n_l2: counts of examples labelled L1 / L2 (array-like, broadcastable).
        alpha: probability that an example's label equals the latent label, in [0.5, 1).
            alpha = 0.5 means labels carry no evidence (p = 0.5 for any counts).

    Returns:
        float64 array p(L1) in [0, 1]; k = 0 or equal counts give 0.5; all k examples agreeing on L1
        give 1 / (1 + 9^-k) at alpha = 0.9. Computed from |n_L1 - n_L2| only: q = sigmoid(-|z|) is the
        smaller of the two posteriors, and p(L1) = q or 1 - q by the sign of n_L1 - n_L2, so for a > b
        ``bayes_posterior(a, b) == 1 - bayes_posterior(b, a)`` holds bit for bit (both from the same q).

    Raises:
        ValueError: alpha outside [0.5, 1) or negative counts.

    Source: Paper III sec. 4.3; DESIGN.md sec. 3 (SULA) and sec. 4 (floating-point ties).
    """
    az, sgn = _abs_logit(n_l1, n_l2, alpha)
    q = sigmoid(-np.atleast_1d(az)).reshape(np.shape(az))
    return np.where(sgn > 0, 1.0 - q, np.where(sgn < 0, q, 0.5))


def h_bayes_bits(n_l1, n_l2, alpha: float = 0.9) -> np.ndarray:
    """Binary entropy (bits) of the exact posterior :func:`bayes_posterior`; 1 bit at k = 0 or equal counts.

    Computed from |n_L1 - n_L2| only (the entropy of sigmoid(|z|)), so symmetric evidence gives
    bit-identical values: ``h_bayes_bits(1, 0) == h_bayes_bits(0, 1)`` exactly, and a set of prompts that
    is constant in exact arithmetic (e.g. every k = 1 prompt) is constant in float64 too.

    Raises:
        ValueError: alpha outside [0.5, 1) or negative counts.

    Source: Paper III sec. 4.3 ("H_Bayes"); DESIGN.md sec. 4 (floating-point ties).
    """
    az, _ = _abs_logit(n_l1, n_l2, alpha)
    return binary_entropy_from_logit(np.atleast_1d(az)).reshape(np.shape(az))


def posterior_predictive(p_l1, alpha: float = 0.9) -> np.ndarray:
    """Probability that the NEXT example's label is L1: alpha p + (1 - alpha)(1 - p), p = p(y = L1 | data).

    Its binary entropy is >= H(alpha) (0.469 bits at alpha = 0.9) however many examples are seen; the
    headline comparison (DESIGN.md, Paper III) uses the posterior entropy H_Bayes instead, and this one is
    reported alongside (``h_pred_bits``).
    """
    alpha = check_alpha(alpha)
    p = np.asarray(p_l1, np.float64)
    return alpha * p + (1.0 - alpha) * (1.0 - p)


def model_label_entropy(logp_l1, logp_l2) -> tuple[np.ndarray, np.ndarray]:
    """Renormalize the model's next-token probabilities over the two labels.

    Args:
        logp_l1, logp_l2: log-probabilities (nats, over the full vocabulary) of the two label tokens
            at the final position, arrays [n].

    Returns:
        (p_model(L1) [n] = sigmoid(logp1 - logp2), H_model [n] in bits).

    Raises:
        ValueError: non-finite log-probabilities.

    Source: Paper III sec. 4.3 ("H_model").
    """
    a, b = np.asarray(logp_l1, np.float64), np.asarray(logp_l2, np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("label log-probabilities must be finite")
    z = np.atleast_1d(a - b)
    return sigmoid(z).reshape(np.shape(a - b)), binary_entropy_from_logit(z).reshape(np.shape(a - b))
