"""Margin-adaptive decoding table (LSM): ``decoding.csv``.

Reads the corpus activation file and takes the unembedding as arrays (loaded by
:func:`llmgeom.weights.unembedding.load_unembedding` in the rule's script, as the Fisher rule does).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmgeom.core.stats import REPLICATES_SUFFIX, replicates_text
from llmgeom.core.store import DS, attrs_dict, open_activations, read_finite
from llmgeom.measures import decoding as dec


def decoding_table(h5_path, unembedding, *, model: str, calibration_fraction: float, n_margin_bins: int,
                   ece_bins: int, n_bins: int, n_boot: int, seed: int, ci: float) -> pd.DataFrame:
    """NLL and top-1 ECE of T = 1, a single fitted T and a margin-binned T(m) on held-out corpus passages.

    Logits at the sampled positions: ``tokens/final_normed_sample`` @ W^T + b (soft-capped where the model
    has final-logit soft-capping). Next token: ``tokens/sample_next_token`` [n_sample] (contract 5); sampled
    positions without one (-1: a passage's last token) are dropped.

    Returns:
        DataFrame, one row per scheme ("t1", "single", "adaptive"): model, prompt_set, scheme, nll (nats, held
        out), ece (equal-mass bins), temperature (t1: 1; single: the fitted T; adaptive: ';'-joined T per
        margin bin), margin_edges (';'-joined inner edges, logits), and on every row the comparison
        delta_nll_adaptive_vs_single, delta_ece_adaptive_vs_single with _lo / _hi (paired bootstrap over
        held-out passages, negative = adaptive better) and _replicates (the interval's replicates,
        :func:`llmgeom.core.stats.replicates_text`), accuracy, n_calibration, n_heldout,
        n_passages_heldout, n_boot, n_dropped_no_nll (sampled positions without a next token),
        next_token_source (``tokens/sample_next_token``).

    Raises:
        StoreError: untrusted file. KeyError: not a corpus file. ValueError: d_unembed differs from W's.

    Source: LSM (margin-adaptive decoding).
    """
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        if DS.TOKENS_FINAL_NORMED_SAMPLE not in f:
            raise KeyError(f"{h5_path} has no tokens/final_normed_sample: rerun rule extract on a corpus set")
        H = read_finite(f, DS.TOKENS_FINAL_NORMED_SAMPLE, dtype=np.float32)
        sp = f[DS.TOKENS_SAMPLE_PROMPT][:].astype(np.int64)
        nxt = f[DS.TOKENS_SAMPLE_NEXT_TOKEN][:].astype(np.int64)
    W, b, cap = unembedding
    if W.shape[1] != H.shape[1]:
        raise ValueError(f"{h5_path}: final_normed_sample has d={H.shape[1]} but the unembedding has d={W.shape[1]}")
    keep = nxt >= 0
    st = dec.position_stats(H[keep], W, b, cap, next_ids=nxt[keep], n_bins=n_bins)
    r = dec.compare_schemes(st, sp[keep], calibration_fraction=calibration_fraction, n_margin_bins=n_margin_bins,
                            ece_bins=ece_bins, n_boot=n_boot, ci=ci, seed=seed)
    counts = ("accuracy", "n_calibration", "n_heldout", "n_passages_heldout", "n_boot")
    common = {k: replicates_text(v) if k.endswith(REPLICATES_SUFFIX) else v for k, v in r.items()
              if k.startswith("delta_") or k in counts}
    temps = {"t1": "1", "single": f"{r['t_single']:.4g}", "adaptive": ";".join(f"{t:.4g}" for t in r["t_margin"])}
    rows = [dict(model=model, prompt_set=a.get("prompt_set"), scheme=s, nll=r[f"nll_{s}"], ece=r[f"ece_{s}"],
                 temperature=temps[s], margin_edges=";".join(f"{e:.4g}" for e in r["margin_edges"]), **common,
                 n_dropped_no_nll=int((~keep).sum()),
                 next_token_source=DS.TOKENS_SAMPLE_NEXT_TOKEN) for s in dec.SCHEMES]
    return pd.DataFrame(rows)
