"""Exact Bayesian posteriors of the tasks with a known answer, and entropies in bits.

* SULA (Paper III sec. 4.3 / 5.2): p(y = L1 | data) = 1 / (1 + r^-(n_L1 - n_L2)), r = alpha / (1 - alpha);
  H_Bayes = its binary entropy (bits).
* Wind-tunnel tasks (Paper I, "The Bayesian Geometry of Transformer Attention"): bijection elimination
  (uniform on the unused outputs, entropy log2(V - t) bits) and HMM filtering (the scaled forward
  algorithm), each with a brute-force reference for the tests. The tasks themselves (spec checks,
  sampling, prompt layout) are :mod:`llmgeom.prompts.wind_tunnel`.

May import: numpy. Nothing of llmgeom but llmgeom.core.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

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


def bayes_posterior(n_l1, n_l2, *, alpha: float) -> np.ndarray:
    """Exact posterior p(y = L1 | examples) = 1 / (1 + (alpha/(1-alpha))^-(n_L1 - n_L2)).

    Args:
        n_l1, n_l2: counts of examples labelled L1 / L2 (array-like, broadcastable).
        alpha: probability that an example's label equals the latent label, in [0.5, 1) (the workflow's
            is schema key ``sula.alpha``). alpha = 0.5 means labels carry no evidence (p = 0.5 for any counts).

    Returns:
        float64 array p(L1) in [0, 1]; k = 0 or equal counts give 0.5; all k examples agreeing on L1
        give 1 / (1 + 9^-k) at alpha = 0.9. Computed from |n_L1 - n_L2| only: q = sigmoid(-|z|) is the
        smaller of the two posteriors, and p(L1) = q or 1 - q by the sign of n_L1 - n_L2, so for a > b
        ``bayes_posterior(a, b, alpha=c) == 1 - bayes_posterior(b, a, alpha=c)`` holds bit for bit (both from the same q).

    Raises:
        ValueError: alpha outside [0.5, 1) or negative counts.

    Source: Paper III sec. 4.3; DESIGN.md sec. 3 (SULA) and sec. 4 (floating-point ties).
    """
    az, sgn = _abs_logit(n_l1, n_l2, alpha)
    q = sigmoid(-np.atleast_1d(az)).reshape(np.shape(az))
    return np.where(sgn > 0, 1.0 - q, np.where(sgn < 0, q, 0.5))


def h_bayes_bits(n_l1, n_l2, *, alpha: float) -> np.ndarray:
    """Binary entropy (bits) of the exact posterior :func:`bayes_posterior`; 1 bit at k = 0 or equal counts.

    ``alpha`` as in :func:`bayes_posterior` (required; schema key ``sula.alpha``).

    Computed from |n_L1 - n_L2| only (the entropy of sigmoid(|z|)), so symmetric evidence gives
    bit-identical values: ``h_bayes_bits(1, 0, alpha=a) == h_bayes_bits(0, 1, alpha=a)`` exactly, and a set of prompts that
    is constant in exact arithmetic (e.g. every k = 1 prompt) is constant in float64 too.

    Raises:
        ValueError: alpha outside [0.5, 1) or negative counts.

    Source: Paper III sec. 4.3 ("H_Bayes"); DESIGN.md sec. 4 (floating-point ties).
    """
    az, _ = _abs_logit(n_l1, n_l2, alpha)
    return binary_entropy_from_logit(np.atleast_1d(az)).reshape(np.shape(az))


def posterior_predictive(p_l1, *, alpha: float) -> np.ndarray:
    """Probability that the NEXT example's label is L1: alpha p + (1 - alpha)(1 - p), p = p(y = L1 | data).

    Its binary entropy is >= H(alpha) (0.469 bits at alpha = 0.9) however many examples are seen; the
    headline comparison (DESIGN.md, Paper III) uses the posterior entropy H_Bayes instead, and this one is
    reported alongside (``h_pred_bits``). ``alpha`` as in :func:`bayes_posterior` (required; schema key
    ``sula.alpha``).
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


# --------------------------------------------------------------------------- wind-tunnel tasks (Paper I)


def entropy_bits(p, axis: int = -1) -> np.ndarray:
    """Shannon entropy in **bits** of probability vectors along ``axis`` (0 log 0 = 0), float64.

    Args:
        p: array [..., A] (any shape; ``axis`` holds the distribution).

    Returns:
        array [...] of entropies in bits (a 0-d array for one vector).
    """
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(axis=axis)



def _pairs(shown_pairs) -> list[tuple[int, int]]:
    return [(int(x), int(y)) for x, y in shown_pairs]


def bijection_posterior(V: int, shown_pairs: Sequence[tuple[int, int]], query_x: int) -> np.ndarray:
    """Exact posterior over pi(query_x) given the shown pairs, for a uniform prior on bijections (Paper I).

    If ``query_x`` was already shown, the answer is known (one-hot). Otherwise pi(query_x) is uniform on
    the outputs not yet used: with t distinct pairs shown, 1 / (V - t) on each of the V - t unused outputs.

    Args:
        V: number of symbols.
        shown_pairs: sequence of (x, y) pairs already shown (consistent with a bijection).
        query_x: the input whose output is asked for.

    Returns:
        float64 [V]: probability of each output y0..y{V-1}.

    Raises:
        ValueError: symbols outside 0..V-1 or pairs inconsistent with any bijection.
    """
    pairs = _pairs(shown_pairs)
    fwd: dict[int, int] = {}
    used = set()
    for x, y in pairs:
        if not (0 <= x < V and 0 <= y < V):
            raise ValueError(f"pair ({x}, {y}) outside symbols 0..{V - 1}")
        if fwd.get(x, y) != y or (x not in fwd and y in used):
            raise ValueError(f"shown pairs {pairs} are not consistent with any bijection")
        fwd[x] = y
        used.add(y)
    if not 0 <= int(query_x) < V:
        raise ValueError(f"query_x = {query_x} outside 0..{V - 1}")
    p = np.zeros(V, dtype=np.float64)
    if int(query_x) in fwd:
        p[fwd[int(query_x)]] = 1.0
        return p
    free = [y for y in range(V) if y not in used]
    p[free] = 1.0 / len(free)
    return p


def bijection_entropy_bits(V: int, t) -> np.ndarray | float:
    """Exact posterior entropy log2(V - t) in **bits** before the t-th output is shown (t = 0, 1, ...).

    Computed as ``log2(V - t)`` directly (never from a vector), so equal t give bit-identical values.

    Args:
        V: number of symbols; t: int or int array [...] with 0 <= t < V.

    Returns:
        float (for scalar t) or float64 array [...].

    Raises:
        ValueError: any t outside 0..V-1.
    """
    ta = np.asarray(t)
    if np.any(ta < 0) or np.any(ta >= V):
        raise ValueError(f"t must lie in 0..{V - 1} (t pairs already shown), got {t!r}")
    h = np.log2((V - ta).astype(np.float64))
    return float(h) if h.ndim == 0 else h


def bijection_posterior_bruteforce(V: int, shown_pairs: Sequence[tuple[int, int]], query_x: int) -> np.ndarray:
    """Reference posterior by enumerating all V! bijections consistent with the shown pairs (tests only).

    Returns:
        float64 [V]: count of consistent bijections with pi(query_x) = y, normalized.

    Raises:
        ValueError: V > 6 (too many permutations) or no consistent bijection.
    """
    if V > 6:
        raise ValueError(f"brute force enumerates V! bijections; V = {V} > 6 is refused")
    pairs = _pairs(shown_pairs)
    counts = np.zeros(V, dtype=np.float64)
    for perm in itertools.permutations(range(V)):
        if all(perm[x] == y for x, y in pairs):
            counts[perm[int(query_x)]] += 1
    if counts.sum() == 0:
        raise ValueError(f"no bijection on {V} symbols is consistent with {pairs}")
    return counts / counts.sum()



def hmm_forward(obs, initial, transition, emission) -> dict[str, np.ndarray]:
    """Exact filtering by the scaled forward algorithm, float64 (Paper I, HMM filtering).

    Convention: s_1 ~ initial, o_t ~ emission[s_t], s_{t+1} ~ transition[s_t].

    Args:
        obs: int array [..., L] of observation symbols (any batch shape).
        initial [K], transition [K, K], emission [K, M]: HMM parameters (rows sum to 1).

    Returns:
        ``{"filter": [..., L, K]`` with filter[..., t-1, :] = p(s_t | o_1..t),
        ``"predictive": [..., L + 1, M]`` with predictive[..., t, :] = p(o_{t+1} | o_1..t)
        (t = 0 is the prior predictive initial @ emission),
        ``"predictive_bits": [..., L + 1]`` its entropy in bits,
        ``"filter_bits": [..., L]`` entropy of the filtering posterior in bits,
        ``"loglik_nats": [...]`` log p(o_1..L) in nats}.

    Raises:
        ValueError: an observation outside 0..M-1 or one with probability 0 under the model.
    """
    init, T, E = (np.asarray(a, np.float64) for a in (initial, transition, emission))
    obs = np.asarray(obs)
    M = E.shape[1]
    if obs.size and (obs.min() < 0 or obs.max() >= M):
        raise ValueError(f"observations must lie in 0..{M - 1}")
    batch, L = obs.shape[:-1], obs.shape[-1]
    prior = np.broadcast_to(init, batch + init.shape).copy()
    filt = np.empty(batch + (L, T.shape[0]))
    pred = np.empty(batch + (L + 1, M))
    loglik = np.zeros(batch)
    for t in range(L):
        pred[..., t, :] = prior @ E
        a = prior * np.moveaxis(E[:, obs[..., t]], 0, -1)
        c = a.sum(-1)
        if np.any(c <= 0):
            raise ValueError(f"observation sequence has probability 0 under the HMM (at position {t + 1})")
        loglik += np.log(c)
        filt[..., t, :] = a / c[..., None]
        prior = filt[..., t, :] @ T
    pred[..., L, :] = prior @ E
    return {"filter": filt, "predictive": pred, "predictive_bits": entropy_bits(pred),
            "filter_bits": entropy_bits(filt), "loglik_nats": loglik}


def hmm_bruteforce(obs, initial, transition, emission) -> dict[str, np.ndarray]:
    """Reference filtering by summing over all K^t hidden paths (tests only; K^(L+1) <= 1e6).

    Args:
        obs: int array [L] (one sequence).

    Returns:
        ``{"filter": [L, K], "predictive": [L + 1, M]}`` as in :func:`hmm_forward`, float64.

    Raises:
        ValueError: K^(L+1) > 1e6 paths.
    """
    init, T, E = (np.asarray(a, np.float64) for a in (initial, transition, emission))
    obs = [int(o) for o in np.asarray(obs).ravel()]
    K, M, L = T.shape[0], E.shape[1], len(obs)
    if K ** (L + 1) > 1_000_000:
        raise ValueError(f"brute force over K^(L+1) = {K}^{L + 1} paths is refused")
    filt = np.zeros((L, K))
    pred = np.zeros((L + 1, M))
    for t in range(L + 1):  # t observations shown; paths over s_1..s_{t+1}
        num = np.zeros(M)
        for path in itertools.product(range(K), repeat=t + 1):
            w = init[path[0]]
            for i in range(1, t + 1):
                w *= T[path[i - 1], path[i]]
            for i in range(t):
                w *= E[path[i], obs[i]]
            num += w * E[path[t]]
            if t >= 1:
                filt[t - 1, path[t - 1]] += w  # summing over s_{t+1} marginalizes it out
        pred[t] = num / num.sum()
    filt /= filt.sum(1, keepdims=True)
    return {"filter": filt, "predictive": pred}
