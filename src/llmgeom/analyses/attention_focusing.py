"""attention_focusing.csv and attention_focusing_summary.csv (Paper III): final-query attention entropy
per head and layer, percent reduction first -> last layer, Spearman rho vs depth. HDF5 in; never torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# ---------------------------------------------------------------------------------------------
# config helpers (called at DAG construction: must stay cheap and never touch a model or the hub)
# ---------------------------------------------------------------------------------------------
from llmgeom.core.layers import relative_depth
from llmgeom.core.not_applicable import NO_ATTENTION_LAYERS
from llmgeom.core.stats import bootstrap_interval, replicates_text, spearman
from llmgeom.core.store import DS, attention_layers, attrs_dict, open_activations, read_finite
from llmgeom.core.units import nats_to_bits


def focusing_summary(layer_entropy, *, sliding=None, layers=None) -> dict:
    """Focusing statistics of a per-layer mean attention entropy profile.

    Args:
        layer_entropy: [n_layers] mean final-query attention entropy per layer (nats), layer 0 first.
        sliding: optional bool [n_layers], True for sliding-window layers.
        layers: optional [n_layers] block indices of the entries (hybrid models: the attention layers, the
            depth the Spearman rho is taken against); default 0..n_layers-1.

    Returns:
        dict: entropy_first, entropy_last (nats), focusing_pct = 100 * (first - last) / first (percent
        reduction; positive = attention sharpens with depth), spearman_rho / spearman_p of entropy vs
        layer index (negative rho = monotone sharpening), and the same percent reduction between the
        first and last global (non-sliding) layers, focusing_pct_global (NaN with < 2 global layers).

    Raises:
        ValueError: fewer than 2 layers, non-finite values or a zero first-layer entropy.

    Source: Paper III sec. 4.2 (attention focusing).
    """
    H = np.asarray(layer_entropy, dtype=np.float64).ravel()
    if H.size < 2 or not np.all(np.isfinite(H)):
        raise ValueError(f"need >= 2 finite per-layer entropies, got {H}")
    if H[0] <= 0:
        raise ValueError("first-layer entropy is 0: percent reduction undefined")
    rho, p = spearman(np.arange(H.size) if layers is None else np.asarray(layers, dtype=np.float64), H)
    out = dict(entropy_first=float(H[0]), entropy_last=float(H[-1]), focusing_pct=float(100 * (H[0] - H[-1]) / H[0]),
               spearman_rho=rho, spearman_p=p)
    g = np.flatnonzero(~np.asarray(sliding, bool)) if sliding is not None else np.arange(H.size)
    out["n_global_layers"] = int(g.size)
    out["focusing_pct_global"] = (float(100 * (H[g[0]] - H[g[-1]]) / H[g[0]]) if g.size >= 2 and H[g[0]] > 0
                                  else float("nan"))
    return out


_DETAIL_COLUMNS = ["model", "prompt_set", "level", "layer", "relative_depth", "head", "sliding", "window",
                   "attention_type", "n_prompts", "entropy_mean", "entropy_std", "entropy_bits_mean",
                   "normalized_entropy_mean"]
_FOCUSING = ("entropy_first", "entropy_last", "focusing_pct", "spearman_rho", "spearman_p", "n_global_layers",
             "focusing_pct_global")


def _not_applicable(a: dict, model: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tables of a model without attention layers: no detail rows; one summary row whose measures are NaN,
    ``attention_layers`` empty and ``not_applicable`` the reason."""
    summ = dict(model=model, prompt_set=a.get("prompt_set"), attention_type="none", n_layers=int(a["n_layers"]),
                n_heads=0, n_kv_heads=0, sliding_window=None, n_sliding_layers=0,
                **dict.fromkeys(_FOCUSING, float("nan")), attention_layers="",
                not_applicable=NO_ATTENTION_LAYERS)
    summ["n_global_layers"] = 0
    return pd.DataFrame([], columns=_DETAIL_COLUMNS), pd.DataFrame([summ])


def attention_focusing_tables(h5_path, *, model: str, n_boot: int, ci: float,
                              seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Attention focusing from ``attention/entropy`` [n_prompts, n_layers, n_heads] (nats) of one file.

    Args:
        h5_path: activation file of a prompt set with attention entropies; model: its model (checked).
        n_boot: bootstrap resamples of the prompts (schema key ``attention_focusing.n_boot``; 0: no interval);
            ci: their interval's coverage; seed: ``numpy.random.default_rng(seed)`` draws them.

    Entropies are averaged over prompts per head, then over heads per layer (the mean of the heads'
    entropies, never the entropy of an averaged attention distribution).

    Returns:
        (detail, summary).

        ``detail``: rows with ``level`` = "head" (one per layer and query head) and ``level`` = "layer"
        (one per layer; ``head`` = -1): model, prompt_set, level, layer, relative_depth ((layer+1)/L),
        head, sliding (layer attends within a sliding window), window (tokens, or empty), attention_type
        (MHA/GQA/MQA), n_prompts, entropy_mean (nats), entropy_std (head rows: over prompts; layer rows:
        over the heads' means), entropy_bits_mean, normalized_entropy_mean (entropy / log(n_keys) where
        n_keys = prompt length, capped at the window for sliding layers; 1 = uniform attention).

        ``summary``: one row: model, prompt_set, attention_type, n_layers, n_heads, n_kv_heads,
        sliding_window, n_sliding_layers, and :func:`focusing_summary` of the per-layer means; its uncertainty
        over prompts: the prompts are resampled with replacement ``n_boot`` times and the whole profile (mean over
        the resampled prompts per head, then over heads per layer) summarised again, giving focusing_pct_lo /
        focusing_pct_hi (basic bootstrap interval, percent) and the replicates focusing_pct_replicates and
        spearman_rho_replicates (:func:`llmgeom.core.stats.replicates_text`; replicate b of both from the same
        resample), n_boot, ci, boot_seed (NaN / "" where the profile is undefined, e.g. one attention layer).

        Hybrid models (layers without attention, the file's ``attention_layers``): ``detail`` has rows for the
        attention layers only, and ``summary`` adds ``attention_layers`` (the layers, comma-separated) and takes
        the profile over them, first to last attention layer (Spearman rho against their block index; NaN
        focusing with a single attention layer). A model without attention layers (state-space): no detail
        rows and one summary row with NaN measures, ``attention_layers`` empty and ``not_applicable`` saying why.
        Files of attention-only models: unchanged.

    Raises:
        StoreError: untrusted file; KeyError: the file has no attention entropies (corpus set).
    """
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        with_attention = attention_layers(f)
        if not with_attention:  # a state-space model: the tables say so, in one summary row
            return _not_applicable(a, model)
        if DS.ATTENTION_ENTROPY not in f:
            raise KeyError(f"{h5_path} has no attention/entropy (prompt set of kind corpus?); "
                           "use a mixed/domain/code set for attention focusing")
        E = read_finite(f, DS.ATTENTION_ENTROPY)  # [n, L, H]; NaN at the layers without attention
        ntok = f[DS.PROMPTS_N_TOKENS][:].astype(np.float64)
    ar = a.get("architecture") or {}
    n, L, nh = E.shape
    sliding = np.zeros(L, bool)
    sliding[[i for i in ar.get("sliding_layers", []) if i < L]] = True
    window = ar.get("sliding_window")
    att = ar.get("attention_type", "")
    pset = a.get("prompt_set")
    nkeys = np.empty((n, L))
    for layer in range(L):
        nkeys[:, layer] = np.minimum(ntok, window) if (sliding[layer] and window) else ntok
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.where(nkeys[:, :, None] > 1, E / np.log(np.maximum(nkeys, 2))[:, :, None], np.nan)
    rows = []
    head_mean = E.mean(axis=0)  # [L, H]
    for layer in with_attention:  # hybrid models: the layers with attention only
        common = dict(model=model, prompt_set=pset, layer=layer, relative_depth=relative_depth(layer, L),
                      sliding=bool(sliding[layer]), window=window if sliding[layer] else None,
                      attention_type=att, n_prompts=n)
        for h in range(nh):
            rows.append(dict(common, level="head", head=h, entropy_mean=head_mean[layer, h],
                             entropy_std=E[:, layer, h].std(ddof=1) if n > 1 else float("nan"),
                             entropy_bits_mean=nats_to_bits(head_mean[layer, h]),
                             normalized_entropy_mean=float(np.nanmean(norm[:, layer, h]))))
        rows.append(dict(common, level="layer", head=-1, entropy_mean=head_mean[layer].mean(),
                         entropy_std=head_mean[layer].std(ddof=1) if nh > 1 else 0.0,
                         entropy_bits_mean=nats_to_bits(head_mean[layer].mean()),
                         normalized_entropy_mean=float(np.nanmean(norm[:, layer, :]))))
    detail = pd.DataFrame(rows, columns=_DETAIL_COLUMNS)
    summ = dict(model=model, prompt_set=pset, attention_type=att, n_layers=L, n_heads=nh,
                n_kv_heads=int(a.get("n_kv_heads", nh)), sliding_window=window, n_sliding_layers=int(sliding.sum()))
    every = len(with_attention) == L  # every layer attends: the profile of all layers (the study's models)
    if not every:  # a hybrid: the profile over its attention layers, named
        summ["attention_layers"] = ",".join(map(str, with_attention))

    def profile(hm):  # focusing_summary of a [L, H] per-head mean (the full sample's or a resample's)
        if every:
            return focusing_summary(hm.mean(axis=1), sliding=sliding)
        return focusing_summary(hm[with_attention].mean(axis=1), sliding=sliding[with_attention], layers=with_attention)

    if every or len(with_attention) >= 2:
        summ.update(profile(head_mean))
    else:  # one attention layer: no first-to-last reduction
        only = float(head_mean[with_attention[0]].mean())
        summ.update(entropy_first=only, entropy_last=only, focusing_pct=float("nan"), spearman_rho=float("nan"),
                    spearman_p=float("nan"), n_global_layers=int((~sliding[with_attention]).sum()),
                    focusing_pct_global=float("nan"))
    summ.update(focusing_pct_lo=float("nan"), focusing_pct_hi=float("nan"), focusing_pct_replicates="",
                spearman_rho_replicates="", n_boot=int(n_boot), ci=float(ci), boot_seed=int(seed))
    if every or len(with_attention) >= 2:
        summ.update(_focusing_bootstrap(E, profile, summ["focusing_pct"], n_boot=n_boot, ci=ci, seed=seed))
    return detail, pd.DataFrame([summ])


def _focusing_bootstrap(E, profile, focusing_pct: float, *, n_boot: int, ci: float, seed: int) -> dict:
    """Bootstrap over prompts of the focusing summary: ``E`` [n, L, H] entropies (nats), ``profile`` the summary of a
    per-head mean [L, H]; resample b = the prompts ``default_rng(seed).integers(0, n, (n_boot, n))[b]``. A resample
    whose profile is undefined (first-layer mean entropy 0) gives NaN replicates. Returns the focusing_pct_lo / _hi
    (basic interval) and the two replicates cells."""
    if int(n_boot) < 1:
        return {}
    idx = np.random.default_rng(seed).integers(0, E.shape[0], size=(int(n_boot), E.shape[0]))
    pct, rho = np.full(int(n_boot), np.nan), np.full(int(n_boot), np.nan)
    for b, ix in enumerate(idx):
        try:
            r = profile(E[ix].mean(axis=0))
        except ValueError:  # e.g. a first-layer mean entropy of 0 in this resample
            continue
        pct[b], rho[b] = r["focusing_pct"], r["spearman_rho"]
    lo, hi = bootstrap_interval(focusing_pct, pct, ci=ci) if np.isfinite(focusing_pct) else (np.nan, np.nan)
    return dict(focusing_pct_lo=lo, focusing_pct_hi=hi, focusing_pct_replicates=replicates_text(pct),
                spearman_rho_replicates=replicates_text(rho))
