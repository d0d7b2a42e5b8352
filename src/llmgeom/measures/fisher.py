"""Fisher information metric of the next-token distribution with respect to the final state.

Source: LSM, "Latent Semantic Manifolds in Large Language Models" (the latent semantic manifold
carries the metric G(h) = W^T (diag(p) - p p^T) W, the Fisher information of the token
distribution p = softmax(W h + b) with respect to the unembedding input h); DESIGN.md sec. 3.

With final-logit soft-capping (Gemma 2/3: z = c tanh(u / c), u = W h + b) the logits are no
longer linear in h; we use the exact Fisher metric of p(. | h) with respect to h, i.e. W is
replaced by the Jacobian J = dz/dh = diag(s) W with s_v = 1 - tanh^2(u_v / c). Without
soft-capping s = 1 and J = W (the paper's formula). The bias b only enters through p.

Nothing here forms a vocab x vocab matrix. Writing j_v for row v of J and mu = J^T p:

* G = sum_v p_v (j_v - mu)(j_v - mu)^T  (a d x d matrix, d = d_unembed),
* trace G = sum_v p_v ||j_v||^2 - ||mu||^2, computed over the FULL vocabulary in float64
  (the two terms nearly cancel when p is peaked, hence float64),
* the spectrum of G is approximated from the ``max_tokens`` most probable tokens (fewer when
  they already carry 1 - ``tail_mass`` of the probability): G_K = sum_{v in top K} p_v
  (j_v - mu)(j_v - mu)^T, with mu from the full vocabulary. G - G_K is positive semi-definite,
  so trace G_K <= trace G; the ratio is reported (``trace_fraction_topk``) as the quality of the
  spectral approximation. G_K's eigenvalues come from a K x K or d x d Gram matrix in float64.

Effective rank (reported): exp of the Shannon entropy of the normalized eigenvalues
lambda_i / sum lambda (Roy & Vetterli 2007); the participation ratio
(sum lambda)^2 / sum lambda^2 is reported next to it.
"""

from __future__ import annotations

import numpy as np

from llmgeom.measures.decoding import unembed_logits

# Largest unembedding kept as one float64 copy (bytes); larger ones are converted in chunks.
_MAX_W64_BYTES = 2 * 2**30


def fisher_matrix_bruteforce(h, W, b=None, softcap=None) -> np.ndarray:
    """Dense G(h) = J^T (diag(p) - p p^T) J in float64, for tests and small vocabularies only.

    Args:
        h: array [d]; W: array [V, d]; b: array [V] or None; softcap: float or None.

    Returns:
        array [d, d] (float64).
    """
    h = np.asarray(h, np.float64)
    W = np.asarray(W, np.float64)
    u = W @ h + (0.0 if b is None else np.asarray(b, np.float64))
    if softcap:
        t = np.tanh(u / softcap)
        z, s = softcap * t, 1.0 - t * t
    else:
        z, s = u, np.ones_like(u)
    p = np.exp(z - z.max())
    p /= p.sum()
    J = s[:, None] * W
    C = np.diag(p) - np.outer(p, p)
    return J.T @ C @ J


def spectrum_stats(ev) -> dict:
    """Effective rank (exp entropy of normalized eigenvalues), participation ratio and the top
    eigenvalue of a PSD spectrum ``ev`` [k] (negative rounding noise clipped to 0)."""
    ev = np.clip(np.asarray(ev, np.float64), 0.0, None)
    tot = ev.sum()
    if tot <= 0:
        return {"effective_rank": float("nan"), "participation_ratio": float("nan"), "top_eigenvalue": 0.0}
    q = ev[ev > 0] / tot
    return {"effective_rank": float(np.exp(-(q * np.log(q)).sum())),
            "participation_ratio": float(tot ** 2 / (ev ** 2).sum()),
            "top_eigenvalue": float(ev.max())}


def _topk_desc(a: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Values and indices of the k largest entries of each row of ``a`` [B, V], descending."""
    idx = np.argpartition(-a, k - 1, axis=-1)[:, :k] if k < a.shape[-1] else np.tile(np.arange(a.shape[-1]), (len(a), 1))
    vals = np.take_along_axis(a, idx, -1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return np.take_along_axis(vals, order, -1), np.take_along_axis(idx, order, -1)


def fisher_metrics(H, W, b=None, softcap=None, *, max_tokens: int, tail_mass: float, batch: int,
                   vocab_chunk: int = 32768) -> dict:
    """Trace and effective rank of the Fisher metric G(h) at each row of ``H``.

    Args:
        H: array [n, d] of unembedding inputs (``tokens/final_normed_sample``).
        W: array [V, d], the unembedding (output head) weight.
        b: [V] output bias or None.
        softcap: final-logit soft-capping constant c or None (see module docstring).
        max_tokens: K, the most probable tokens used for the spectrum (>= 1; schema key ``fisher.max_tokens``).
        tail_mass: stop adding tokens once the top tokens carry 1 - tail_mass of p (schema key
            ``fisher.tail_mass``).
        batch: positions per batch (schema key ``fisher.batch``; memory ~ batch * V * 40 bytes, plus V * d * 8
            bytes for a float64 copy of W when that is below 2 GiB).
        vocab_chunk: vocabulary rows per float64 chunk when forming mu = J^T p.

    Returns:
        dict of numpy arrays [n]: ``trace`` (full vocabulary, float64; units: nats per squared
        activation unit), ``trace_topk`` (trace of G_K), ``trace_fraction_topk``,
        ``effective_rank``, ``participation_ratio``, ``top_eigenvalue`` (of G_K),
        ``n_tokens`` (K used), ``mass_topk`` (probability carried by those K tokens),
        ``entropy`` (of p, nats), ``margin`` (top-1 minus top-2 logit, float32 logits as in
        the extraction, for a consistency check against ``tokens/margin``).

    Raises:
        ValueError: shapes that do not match, max_tokens < 1, non-finite logits.

    Source: LSM (Fisher information metric on the latent semantic manifold).
    """
    H, W, b = _fisher_inputs(H, W, b, max_tokens)
    n, d = H.shape
    V = W.shape[0]
    K = min(int(max_tokens), V)
    # W in float64 once when it is small enough (the usual case), else converted chunk by chunk
    W64 = W.astype(np.float64) if V * d * 8 <= _MAX_W64_BYTES else None
    wn2 = np.empty(V, dtype=np.float64)  # ||w_v||^2 in float64
    for c0 in range(0, V, vocab_chunk):
        Wc = W64[c0:c0 + vocab_chunk] if W64 is not None else W[c0:c0 + vocab_chunk].astype(np.float64)
        wn2[c0:c0 + vocab_chunk] = np.einsum("vd,vd->v", Wc, Wc)
    keys = ("trace", "trace_topk", "trace_fraction_topk", "effective_rank", "participation_ratio",
            "top_eigenvalue", "n_tokens", "mass_topk", "entropy", "margin")
    out = {k: np.empty(n) for k in keys}
    for s0 in range(0, n, batch):
        h = H[s0:s0 + batch]
        z, sc = unembed_logits(h, W, b, softcap, return_slope=True)  # float32 logits [B, V]; dz/du float64 or None
        if not np.all(np.isfinite(z)):
            raise ValueError(f"non-finite logits in positions {s0}..{s0 + len(h) - 1}")
        top2, _ = _topk_desc(z, 2)
        out["margin"][s0:s0 + len(h)] = top2[:, 0] - top2[:, 1]
        z64 = z.astype(np.float64)
        zmax = z64.max(-1, keepdims=True)
        logp = z64 - zmax - np.log(np.exp(z64 - zmax).sum(-1, keepdims=True))
        p = np.exp(logp)  # [B, V] float64
        out["entropy"][s0:s0 + len(h)] = -(p * logp).sum(-1)
        ps = p if sc is None else p * sc  # p_v s_v
        term1 = (ps * (sc if sc is not None else 1.0) * wn2).sum(-1)  # sum p s^2 ||w||^2
        if W64 is not None:
            mu = ps @ W64
        else:
            mu = np.zeros((len(h), d), dtype=np.float64)
            for c0 in range(0, V, vocab_chunk):
                mu += ps[:, c0:c0 + vocab_chunk] @ W[c0:c0 + vocab_chunk].astype(np.float64)
        trace = term1 - (mu * mu).sum(-1)
        _topk_spectra(out, s0, p, mu, trace, sc, W, W64, K=K, tail_mass=tail_mass)
    out["n_tokens"] = out["n_tokens"].astype(np.int64)
    return out


def _fisher_inputs(H, W, b, max_tokens):
    """``H`` [n, d], ``W`` [V, d] and ``b`` [V] (or None) as float32 arrays, checked (:func:`fisher_metrics`).

    Raises:
        ValueError: shapes that do not match, max_tokens < 1."""
    H = np.asarray(H, np.float32)
    W = np.asarray(W, np.float32)
    if b is not None:
        b = np.asarray(b, np.float32)
    if H.ndim != 2 or W.ndim != 2 or H.shape[1] != W.shape[1]:
        raise ValueError(f"H [n, d] and W [V, d] must share d, got {tuple(H.shape)} and {tuple(W.shape)}")
    if b is not None and b.shape != (W.shape[0],):
        raise ValueError(f"bias must be [V={W.shape[0]}], got {tuple(b.shape)}")
    if int(max_tokens) < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens!r}")
    return H, W, b


def _topk_spectra(out: dict, s0: int, p, mu, trace, sc, W, W64, *, K: int, tail_mass: float) -> None:
    """Per row i of a batch starting at position ``s0``: the spectrum of G restricted to the most probable tokens
    (the fewest of at most ``K`` that carry 1 - ``tail_mass`` of p), written into ``out`` with the full trace
    (:func:`fisher_metrics`). ``p`` [B, V] probabilities, ``mu`` [B, d] = J^T p, ``sc`` the soft-cap slopes or
    None, ``W64`` the float64 W or None (then rows of ``W`` are converted)."""
    d = mu.shape[1]
    pk, ik = _topk_desc(p, K)  # [B, K] descending
    cum = np.cumsum(pk, -1)
    for i in range(len(p)):
        k_i = int(np.searchsorted(cum[i], 1.0 - tail_mass, side="left")) + 1
        k_i = min(max(k_i, 1), K)
        idx = ik[i, :k_i]
        J = W64[idx] if W64 is not None else W[idx].astype(np.float64)
        if sc is not None:
            J = J * sc[i, idx, None]
        B_ = (J - mu[i]) * np.sqrt(pk[i, :k_i, None])  # [k_i, d]
        gram = B_ @ B_.T if k_i <= d else B_.T @ B_
        ev = np.linalg.eigvalsh(gram)
        st = spectrum_stats(ev)
        j = s0 + i
        tr_k = float(np.clip(ev, 0, None).sum())
        out["trace"][j] = float(trace[i])
        out["trace_topk"][j] = tr_k
        out["trace_fraction_topk"][j] = tr_k / float(trace[i]) if trace[i] > 0 else np.nan
        out["effective_rank"][j] = st["effective_rank"]
        out["participation_ratio"][j] = st["participation_ratio"]
        out["top_eigenvalue"][j] = st["top_eigenvalue"]
        out["n_tokens"][j] = k_i
        out["mass_topk"][j] = float(cum[i, k_i - 1])
