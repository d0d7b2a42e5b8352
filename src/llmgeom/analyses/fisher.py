"""Fisher information metric table (LSM): ``fisher.csv`` and ``fisher_summary.csv``.

Reads the corpus activation file and takes the unembedding as arrays (loaded by
:func:`llmgeom.weights.unembedding.load_unembedding` in the rule's script): never a model, never torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.core.store import DS, attrs_dict, open_activations, read_finite
from llmgeom.measures import fisher as fisher_mod


def fisher_tables(h5_path, unembedding, *, model: str, n_positions: int, max_tokens: int, tail_mass: float, seed: int,
                  batch: int) -> dict[str, pd.DataFrame]:
    """Fisher information metric G(h) at a seeded subset of sampled corpus positions.

    h = ``tokens/final_normed_sample`` (the unembedding input at the sampled positions); W, bias and
    soft-capping in ``unembedding`` = (W [V, d_unembed], bias [V] or None, softcap or None), numpy
    arrays from :func:`llmgeom.weights.unembedding.load_unembedding`; the metric from
    :mod:`llmgeom.measures.fisher`.
    The recomputed top-1 minus top-2 logit is compared with ``tokens/margin`` at the positions
    where both exist (the last position of a passage has no stored margin);
    ``margin_check_max_abs_diff`` in the summary should be ~1e-5 logits or less.

    Returns:
        dict of DataFrames. ``fisher``: one row per position: model, prompt_set, sample (row of
        ``tokens/final_normed_sample``), prompt, position, trace, trace_topk,
        trace_fraction_topk, effective_rank, participation_ratio, top_eigenvalue, n_tokens,
        mass_topk, entropy (nats), margin (logits). ``fisher_summary``: one row: n_positions,
        d_unembed, vocab_size, softcap, max_tokens, tail_mass, mean/median/q05/q95 of trace and
        of effective_rank, median participation ratio, median trace_fraction_topk, median
        mass_topk, spearman rho of trace with margin and with entropy, margin_check_max_abs_diff,
        margin_check_n.

    Raises:
        StoreError: untrusted file. KeyError: not a corpus file. ValueError: d_unembed of the file
        differs from the model's unembedding.

    Source: LSM (Fisher information metric, G(h) = W^T (diag p - p p^T) W).
    """
    from llmgeom.core.stats import spearman

    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        if DS.TOKENS_FINAL_NORMED_SAMPLE not in f:
            raise KeyError(f"{h5_path} has no tokens/final_normed_sample: rerun rule extract on a corpus set")
        n_total = f[DS.TOKENS_FINAL_NORMED_SAMPLE].shape[0]
        rng = np.random.default_rng(seed)
        sel = np.sort(rng.choice(n_total, size=min(n_positions, n_total), replace=False))
        H = read_finite(f, DS.TOKENS_FINAL_NORMED_SAMPLE, sel, dtype=np.float32)
        sp = f[DS.TOKENS_SAMPLE_PROMPT][sel].astype(np.int64)
        spos = f[DS.TOKENS_SAMPLE_POSITION][sel].astype(np.int64)
        tok_key = f[DS.TOKENS_PROMPT][:].astype(np.int64) * 1_000_000 + f[DS.TOKENS_POSITION][:]
        tok_margin = read_finite(f, DS.TOKENS_MARGIN, dtype=np.float32)
    W, b, cap = unembedding
    if W.shape[1] != H.shape[1]:
        raise ValueError(f"{h5_path}: final_normed_sample has d={H.shape[1]} but the unembedding "
                         f"has d={W.shape[1]}")
    r = fisher_mod.fisher_metrics(H, W, b, cap, max_tokens=max_tokens, tail_mass=tail_mass, batch=batch)
    base = dict(model=model, prompt_set=a.get("prompt_set"))
    per = pd.DataFrame(dict(base, sample=sel, prompt=sp, position=spos, **r))
    order = np.argsort(tok_key)
    key = sp * 1_000_000 + spos
    loc = np.searchsorted(tok_key[order], key)
    loc = np.clip(loc, 0, len(order) - 1)
    hit = tok_key[order][loc] == key
    diff = np.abs(per.margin.to_numpy()[hit] - tok_margin[order][loc][hit])
    tr, er = per.trace.to_numpy(), per.effective_rank.to_numpy()
    summ = dict(base, n_positions=len(per), d_unembed=int(W.shape[1]), vocab_size=int(W.shape[0]),
                softcap=cap if cap else np.nan, has_bias=b is not None, max_tokens=max_tokens,
                tail_mass=tail_mass,
                trace_mean=float(tr.mean()), trace_median=float(np.median(tr)),
                trace_q05=float(np.quantile(tr, 0.05)), trace_q95=float(np.quantile(tr, 0.95)),
                effective_rank_mean=float(np.nanmean(er)), effective_rank_median=float(np.nanmedian(er)),
                effective_rank_q05=float(np.nanquantile(er, 0.05)),
                effective_rank_q95=float(np.nanquantile(er, 0.95)),
                participation_ratio_median=float(np.nanmedian(per.participation_ratio)),
                trace_fraction_topk_median=float(np.nanmedian(per.trace_fraction_topk)),
                mass_topk_median=float(per.mass_topk.median()),
                spearman_trace_margin=spearman(tr, per.margin)[0],
                spearman_trace_entropy=spearman(tr, per.entropy)[0],
                margin_check_max_abs_diff=float(diff.max()) if diff.size else np.nan,
                margin_check_n=int(diff.size))
    return {"fisher": per, "fisher_summary": pd.DataFrame([summ])}
