"""Bayesian geometry over the HDF5 store: domain restriction, PC scores, attention focusing, and the
cross-model Table-1 / Table-2 analogues of Paper III.

Source: Paper III ("Geometric Scaling of Bayesian Inference in LLMs"), sec. 4 (value manifolds and
domain restriction, Table 1), sec. 4.2 (key orthogonality and attention focusing, Table 2);
DESIGN.md sec. 3. Everything here reads activation files (``llmgeom.store``) or tidy tables; nothing
touches a model. Key orthogonality (weights) is in :mod:`llmgeom.keys`.

Domain restriction (Paper III): per model, the model's own next-token entropy (nats) of every candidate
prompt decides its quantile bin (quintiles by default); ``per_quantile`` prompts are drawn at random
(seeded) from every bin, for the mixed candidate pool and for each single-topic pool, and the
value-manifold statistics are recomputed on each selection.

Quantile edges (decision, see README "Domain restriction"): ``per_set`` (default) cuts each candidate
pool at its own entropy quantiles, which is the paper's entropy-stratified sampling: every selection
spans its pool's whole entropy range with equal weight per quintile and is always feasible.
``pooled`` cuts all pools of the model at common edges (entropy-matched selections); it fails to fill
bins whenever a pool's entropy distribution differs strongly from the others (Python code has almost
no prompts above the pooled median for both embedded models), so bins are filled with as many prompts
as exist and the shortfall is recorded (``n_available`` / ``selected`` in the selection table).
"""

from __future__ import annotations

import json
import math
import warnings
import zlib

import numpy as np
import pandas as pd
from scipy import stats as sstats

from . import geometry
from .store import attrs_dict, open_activations

__all__ = [
    "quantile_edges",
    "quantile_bins",
    "stratified_sample",
    "derived_seed",
    "value_manifold_stats_with_boot",
    "domain_restriction_tables",
    "attention_focusing_tables",
    "focusing_summary",
    "table1",
    "table2",
    "to_markdown",
    "markdown_tables_html",
    "prompt_set_label",
    "resolve_domain_sets",
    "check_bayes_config",
]

EDGE_MODES = ("per_set", "pooled")


# ---------------------------------------------------------------------------------------------
# config helpers (called at DAG construction: must stay cheap and never touch a model or the hub)
# ---------------------------------------------------------------------------------------------

# defined in llmgeom.config_checks (imported while Snakemake builds the DAG; must stay light)
from .config_checks import prompt_set_label, resolve_domain_sets, check_bayes_config  # noqa: E402,F401


# ---------------------------------------------------------------------------------------------
# entropy-stratified selection
# ---------------------------------------------------------------------------------------------

def derived_seed(seed: int, name: str) -> int:
    """A 32-bit seed derived from (seed, name) (stable across runs, platforms and set order)."""
    return int(np.random.SeedSequence([int(seed), zlib.crc32(name.encode())]).generate_state(1)[0])


def quantile_edges(values, n_quantiles: int) -> np.ndarray:
    """Interior quantile edges of ``values``: array [n_quantiles - 1] at probabilities k / n_quantiles
    (numpy's default linear interpolation). Units: those of ``values`` (nats for entropies).

    Raises:
        ValueError: empty or non-finite values, n_quantiles < 1.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError("values must be a non-empty finite array")
    if int(n_quantiles) < 1:
        raise ValueError(f"n_quantiles must be >= 1, got {n_quantiles}")
    q = np.arange(1, int(n_quantiles)) / int(n_quantiles)
    return np.quantile(v, q)


def quantile_bins(values, edges) -> np.ndarray:
    """Bin index 0..len(edges) of each value: bin k holds edges[k-1] <= v < edges[k]
    (a value equal to an edge goes to the upper bin). int64 array of the shape of ``values``."""
    return np.searchsorted(np.asarray(edges, dtype=np.float64), np.asarray(values, dtype=np.float64),
                           side="right").astype(np.int64)


def stratified_sample(entropy, *, n_quantiles: int, per_quantile: int, seed: int, edges=None) -> dict:
    """Draw ``per_quantile`` prompts at random from each entropy-quantile bin.

    Args:
        entropy: [n_candidates] next-token entropies (nats) of the candidate prompts.
        n_quantiles: number of bins (5 = quintiles, Paper III).
        per_quantile: prompts drawn per bin without replacement (Paper III: 15).
        seed: ``numpy.random.default_rng(seed)``; one draw per bin, bins in order.
        edges: interior edges [n_quantiles - 1]; default: the quantiles of ``entropy`` itself.

    Returns:
        dict with ``indices`` (sorted int64 candidate indices of the selection), ``bins`` (bin of every
        candidate, [n_candidates]), ``edges``, ``n_available`` ([n_quantiles] candidates per bin) and
        ``n_selected`` ([n_quantiles]). A bin with fewer than ``per_quantile`` candidates contributes
        all of them (its shortfall is n_available < per_quantile); the caller decides whether to warn.

    Raises:
        ValueError: non-finite entropies, per_quantile < 1, edges of the wrong length.

    Source: Paper III sec. 4 (entropy-stratified selection, 15 x 5 = 75 prompts).
    """
    e = np.asarray(entropy, dtype=np.float64).ravel()
    if int(per_quantile) < 1:
        raise ValueError(f"per_quantile must be >= 1, got {per_quantile}")
    ed = quantile_edges(e, n_quantiles) if edges is None else np.asarray(edges, dtype=np.float64)
    if ed.shape != (int(n_quantiles) - 1,):
        raise ValueError(f"edges must have {int(n_quantiles) - 1} entries, got {ed.shape}")
    if not np.all(np.isfinite(e)):
        raise ValueError("entropy contains non-finite values")
    bins = quantile_bins(e, ed)
    rng = np.random.default_rng(seed)
    chosen, n_av, n_sel = [], [], []
    for k in range(int(n_quantiles)):
        cand = np.flatnonzero(bins == k)
        m = min(int(per_quantile), cand.size)
        pick = rng.choice(cand, size=m, replace=False) if m else np.empty(0, np.int64)
        chosen.append(pick)
        n_av.append(int(cand.size))
        n_sel.append(int(m))
    idx = np.sort(np.concatenate(chosen).astype(np.int64))
    return {"indices": idx, "bins": bins, "edges": ed, "n_available": np.array(n_av), "n_selected": np.array(n_sel)}


# ---------------------------------------------------------------------------------------------
# value-manifold statistics with their bootstrap replicates
# ---------------------------------------------------------------------------------------------

def value_manifold_stats_with_boot(X, next_token_entropy, *, n_boot: int, seed: int, standardize: bool = True,
                                   ci: float = 0.95) -> tuple[dict, np.ndarray]:
    """:func:`llmgeom.geometry.value_manifold_stats` plus its bootstrap replicates.

    Returns (stats, boot): ``stats`` is exactly the dict of ``geometry.value_manifold_stats`` with the
    same arguments (tested); ``boot`` is float64 [n_boot, 3] with the (PC1, PC2, PC1+PC2)
    explained-variance fractions of every resample (NaN rows for resamples without variance), used
    for CIs of differences between prompt sets.

    Raises: as ``geometry.value_manifold_stats``.
    """
    return geometry.value_manifold_stats(X, next_token_entropy, n_boot=n_boot, seed=seed,
                                         standardize=standardize, ci=ci, return_boot=True)


def _diff_ci(a: np.ndarray, b: np.ndarray, ci: float, estimate: float) -> tuple[float, float]:
    """Basic-bootstrap CI of a - b from independent bootstrap replicates (rows paired by index);
    ``estimate`` is the observed difference (see geometry.bootstrap_interval)."""
    return geometry.bootstrap_interval(estimate, a - b, ci=ci, method="basic")


def _layers(spec, n: int) -> list[int]:
    if spec == "all":
        return list(range(n))
    if spec == "last":
        return [n - 1]
    return sorted({(int(i) if int(i) >= 0 else n + int(i)) for i in spec})


def _topics(meta_ds) -> list[str]:
    out = []
    for m in meta_ds[:]:
        m = m.decode() if isinstance(m, bytes) else m
        try:
            out.append(str(json.loads(m).get("topic", "")))
        except (json.JSONDecodeError, AttributeError):
            out.append("")
    return out


def domain_restriction_tables(h5_paths: dict, *, model: str, mixed_set: str, labels: dict | None = None,
                              n_quantiles: int = 5, per_quantile: int = 15, edges: str = "per_set",
                              n_boot: int = 100, ci: float = 0.95, seed: int = 0, layers="all",
                              standardize=(True, False), score_layers="last", log=print) -> dict:
    """Domain restriction (Paper III sec. 4, Table 1): value-manifold statistics of entropy-stratified
    selections from the mixed pool and from each single-topic pool, and their change vs mixed.

    Args:
        h5_paths: prompt set -> activation file of ``model``; must contain ``mixed_set``.
        labels: prompt set -> domain label (e.g. "Mathematics"); default: the set name.
        n_quantiles, per_quantile: bins of the model's next-token entropy and prompts drawn per bin.
        edges: "per_set" (each pool's own quantiles; default) or "pooled" (common edges over all pools
            in ``h5_paths``); see the module docstring.
        n_boot, ci, seed: percentile bootstrap over prompts; the selection of set s uses
            ``derived_seed(seed, s)`` and its bootstrap ``derived_seed(seed, s + "/boot")``.
        layers: "all", "last" or block indices (value layers 0..L-1; residual stream = output of block l).
        standardize: variants (True = z-scored coordinates, Paper III; False = raw, centred only).
        score_layers: layers at which per-prompt PC1/PC2 scores are kept ("last" by default).

    Returns:
        dict of three DataFrames:

        ``stats`` - one row per (prompt_set, representation, layer, standardized): model, prompt_set,
        domain, role ("mixed" / "restricted"), edges, n_quantiles, per_quantile, n_candidates, n (selected),
        entropy_mean, entropy_median (nats, of the selection), representation ("values" = last-token
        value vectors concatenated over key heads; "residual_stream" = output of the block), layer,
        relative_depth ((layer+1)/L), standardized, every key of ``geometry.value_manifold_stats`` (pc1,
        pc2, pc12 fractions of variance with *_lo/*_hi basic-bootstrap bounds, participation_ratio,
        spearman_rho / spearman_p of the PC1 score vs next-token entropy with PC1's sign fixed so that
        rho >= 0, ...), boot_seed, and the change vs the mixed selection at the same representation,
        layer and variant: delta_pc1, delta_pc2, delta_pc12 (restricted - mixed; *_lo/*_hi = basic-bootstrap
        CI of the difference of independent bootstrap replicates), delta_participation_ratio,
        delta_spearman_rho (0 for the mixed rows).

        ``selection`` - one row per candidate prompt: model, prompt_set, domain, prompt_index (row in the
        activation file), topic, next_token_entropy (nats), entropy_quantile (0 = lowest entropy), quantile_lo,
        quantile_hi (bin edges in nats; -inf / inf at the ends), n_available (candidates in that bin),
        edges, selection_seed, selected (bool).

        ``scores`` - per selected prompt at ``score_layers``: model, prompt_set, domain, representation,
        layer, standardized (True), prompt_index, topic, next_token_entropy, entropy_quantile, pc1, pc2 (scores of
        the standardized data; each component's sign fixed so that its Spearman rho with entropy >= 0).

    Raises:
        ValueError: unknown ``edges``; ``mixed_set`` not in ``h5_paths``; a selection with < 3 prompts.
        StoreError: an activation file that must not be trusted.
    """
    if edges not in EDGE_MODES:
        raise ValueError(f"edges must be one of {EDGE_MODES}, got {edges!r}")
    if mixed_set not in h5_paths:
        raise ValueError(f"mixed_set {mixed_set!r} is not among the prompt sets {list(h5_paths)}")
    labels = dict(labels or {})
    order = [mixed_set] + [s for s in h5_paths if s != mixed_set]

    # pass 1: entropies and topics of every candidate; bin edges; seeded selections
    ent, topics = {}, {}
    for s in order:
        with open_activations(h5_paths[s], model=model) as f:
            ent[s] = f["next_token/entropy"][:].astype(np.float64)
            topics[s] = _topics(f["prompts/meta"])
    common = quantile_edges(np.concatenate([ent[s] for s in order]), n_quantiles) if edges == "pooled" else None
    sel, sel_rows = {}, []
    for s in order:
        sseed = derived_seed(seed, s)
        r = stratified_sample(ent[s], n_quantiles=n_quantiles, per_quantile=per_quantile, seed=sseed, edges=common)
        sel[s] = r
        short = [k for k in range(n_quantiles) if r["n_available"][k] < per_quantile]
        if short:
            msg = (f"{model} / {s}: quantile bin(s) {short} hold only {r['n_available'][short].tolist()} candidates "
                   f"(< per_quantile={per_quantile}, edges={edges}); took all of them: n = {r['indices'].size}")
            log(f"[domain_restriction] WARNING {msg}")
            warnings.warn(msg, stacklevel=2)
        if r["indices"].size < 3:
            raise ValueError(f"{model} / {s}: only {r['indices'].size} prompts selected; need >= 3 "
                             f"(candidates: {ent[s].size}; n_quantiles={n_quantiles}, per_quantile={per_quantile})")
        ext = np.concatenate([[-np.inf], r["edges"], [np.inf]])
        chosen = np.zeros(ent[s].size, bool)
        chosen[r["indices"]] = True
        for i in range(ent[s].size):
            b = int(r["bins"][i])
            sel_rows.append(dict(model=model, prompt_set=s, domain=labels.get(s, s), prompt_index=i, topic=topics[s][i],
                                 next_token_entropy=ent[s][i], entropy_quantile=b, quantile_lo=ext[b], quantile_hi=ext[b + 1],
                                 n_available=int(r["n_available"][b]), edges=edges, selection_seed=sseed,
                                 selected=bool(chosen[i])))

    # pass 2: statistics on the selections
    rows, score_rows, mixed_ref = [], [], {}
    for s in order:
        idx = sel[s]["indices"]
        h = ent[s][idx]
        bseed = derived_seed(seed, s + "/boot")
        with open_activations(h5_paths[s], model=model) as f:
            vals = np.asarray(f["last_token/values"][idx], dtype=np.float64)      # [n, L, F]
            resid = np.asarray(f["last_token/residual"][idx], dtype=np.float64)   # [n, L+1, d]
        L = vals.shape[1]
        keep_scores = set(_layers(score_layers, L))
        for layer in _layers(layers, L):
            reps = {"values": vals[:, layer, :], "residual_stream": resid[:, layer + 1, :]}
            for rep, X in reps.items():
                for std in standardize:
                    st, boot = value_manifold_stats_with_boot(X, h, n_boot=n_boot, seed=bseed, standardize=bool(std),
                                                              ci=ci)
                    key = (rep, layer, bool(std))
                    row = dict(model=model, prompt_set=s, domain=labels.get(s, s),
                               role="mixed" if s == mixed_set else "restricted", edges=edges,
                               n_quantiles=int(n_quantiles), per_quantile=int(per_quantile),
                               n_candidates=int(ent[s].size), entropy_mean=float(h.mean()),
                               entropy_median=float(np.median(h)), representation=rep, layer=layer,
                               relative_depth=(layer + 1) / L, **st)
                    row["standardized"] = bool(std)
                    row["boot_seed"] = bseed
                    if s == mixed_set:
                        mixed_ref[key] = (st, boot)
                    mst, mboot = mixed_ref[key]
                    for j, k in enumerate(("pc1", "pc2", "pc12")):
                        row[f"delta_{k}"] = st[k] - mst[k]
                        if k != "pc2":
                            row[f"delta_{k}_lo"], row[f"delta_{k}_hi"] = _diff_ci(boot[:, j], mboot[:, j], ci, row[f"delta_{k}"])
                    row["delta_participation_ratio"] = st["participation_ratio"] - mst["participation_ratio"]
                    row["delta_spearman_rho"] = st["spearman_rho"] - mst["spearman_rho"]
                    rows.append(row)
                if layer in keep_scores:
                    S = geometry.pc_scores(X, True, 2, sign_reference=h)
                    for i, pi in enumerate(idx):
                        score_rows.append(dict(model=model, prompt_set=s, domain=labels.get(s, s), representation=rep,
                                               layer=layer, standardized=True, prompt_index=int(pi),
                                               topic=topics[s][pi], next_token_entropy=h[i],
                                               entropy_quantile=int(sel[s]["bins"][pi]), pc1=S[i, 0], pc2=S[i, 1]))
    return {"stats": pd.DataFrame(rows), "selection": pd.DataFrame(sel_rows), "scores": pd.DataFrame(score_rows)}


# ---------------------------------------------------------------------------------------------
# attention focusing
# ---------------------------------------------------------------------------------------------

def _spearman(a, b) -> tuple[float, float]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan"), float("nan")
    r = sstats.spearmanr(a, b)
    return float(r.statistic), float(r.pvalue)


def focusing_summary(layer_entropy, *, sliding=None) -> dict:
    """Focusing statistics of a per-layer mean attention entropy profile.

    Args:
        layer_entropy: [n_layers] mean final-query attention entropy per layer (nats), layer 0 first.
        sliding: optional bool [n_layers], True for sliding-window layers.

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
    rho, p = _spearman(np.arange(H.size), H)
    out = dict(entropy_first=float(H[0]), entropy_last=float(H[-1]), focusing_pct=float(100 * (H[0] - H[-1]) / H[0]),
               spearman_rho=rho, spearman_p=p)
    g = np.flatnonzero(~np.asarray(sliding, bool)) if sliding is not None else np.arange(H.size)
    out["n_global_layers"] = int(g.size)
    out["focusing_pct_global"] = (float(100 * (H[g[0]] - H[g[-1]]) / H[g[0]]) if g.size >= 2 and H[g[0]] > 0
                                  else float("nan"))
    return out


def attention_focusing_tables(h5_path, *, model: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Attention focusing from ``attention/entropy`` [n_prompts, n_layers, n_heads] (nats) of one file.

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
        sliding_window, n_sliding_layers, and :func:`focusing_summary` of the per-layer means.

    Raises:
        StoreError: untrusted file; KeyError: the file has no attention entropies (corpus set).
    """
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        if "attention/entropy" not in f:
            raise KeyError(f"{h5_path} has no attention/entropy (prompt set of kind corpus?); "
                           "use a mixed/domain/code set for attention focusing")
        E = f["attention/entropy"][:].astype(np.float64)  # [n, L, H]
        ntok = f["prompts/n_tokens"][:].astype(np.float64)
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
    for layer in range(L):
        common = dict(model=model, prompt_set=pset, layer=layer, relative_depth=(layer + 1) / L,
                      sliding=bool(sliding[layer]), window=window if sliding[layer] else None,
                      attention_type=att, n_prompts=n)
        for h in range(nh):
            rows.append(dict(common, level="head", head=h, entropy_mean=head_mean[layer, h],
                             entropy_std=E[:, layer, h].std(ddof=1) if n > 1 else float("nan"),
                             entropy_bits_mean=head_mean[layer, h] / math.log(2),
                             normalized_entropy_mean=float(np.nanmean(norm[:, layer, h]))))
        rows.append(dict(common, level="layer", head=-1, entropy_mean=head_mean[layer].mean(),
                         entropy_std=head_mean[layer].std(ddof=1) if nh > 1 else 0.0,
                         entropy_bits_mean=head_mean[layer].mean() / math.log(2),
                         normalized_entropy_mean=float(np.nanmean(norm[:, layer, :]))))
    cols = ["model", "prompt_set", "level", "layer", "relative_depth", "head", "sliding", "window", "attention_type",
            "n_prompts", "entropy_mean", "entropy_std", "entropy_bits_mean", "normalized_entropy_mean"]
    detail = pd.DataFrame(rows, columns=cols)
    summ = dict(model=model, prompt_set=pset, attention_type=att, n_layers=L, n_heads=nh,
                n_kv_heads=int(a.get("n_kv_heads", nh)), sliding_window=window, n_sliding_layers=int(sliding.sum()),
                **focusing_summary(head_mean.mean(axis=1), sliding=sliding))
    return detail, pd.DataFrame([summ])


# ---------------------------------------------------------------------------------------------
# cross-model summaries (Table 1 / Table 2 analogues)
# ---------------------------------------------------------------------------------------------

def _final_values(dr: pd.DataFrame, representation="values", standardized=True) -> pd.DataFrame:
    d = dr[(dr.representation == representation) & (dr.standardized.astype(str) == str(bool(standardized)))]
    return d[d.layer == d.groupby("model").layer.transform("max")]


def table1(dr: pd.DataFrame, *, representation: str = "values", standardized: bool = True) -> pd.DataFrame:
    """Table-1 analogue (Paper III): PC1 and PC1+PC2 with 95% CIs at the final layer, per model and set.

    Args:
        dr: concatenated ``domain_restriction`` stats tables (all models).

    Returns:
        one row per (model, prompt_set), mixed first: model, prompt_set, domain, role, n, layer,
        representation, standardized, pc1, pc1_lo, pc1_hi, pc12, pc12_lo, pc12_hi, participation_ratio,
        spearman_rho, spearman_p, delta_pc12, delta_pc12_lo, delta_pc12_hi (fractions of variance).
    """
    d = _final_values(dr, representation, standardized).copy()
    d["_o"] = (d.role != "mixed").astype(int)
    d = d.sort_values(["model", "_o", "prompt_set"])
    cols = ["model", "prompt_set", "domain", "role", "n", "layer", "representation", "standardized", "pc1", "pc1_lo",
            "pc1_hi", "pc12", "pc12_lo", "pc12_hi", "participation_ratio", "spearman_rho", "spearman_p",
            "delta_pc12", "delta_pc12_lo", "delta_pc12_hi"]
    return d[cols].reset_index(drop=True)


def _attention_label(att: str, n_sliding: int, n_layers: int, window) -> str:
    if n_sliding and window:
        part = "all layers" if n_sliding == n_layers else f"{n_sliding}/{n_layers} layers"
        return f"{att} + sliding window ({int(window)} tokens, {part})"
    return att


def table2(dr: pd.DataFrame, ko: pd.DataFrame, af: pd.DataFrame, *, restricted_set: str,
           representation: str = "values", standardized: bool = True) -> pd.DataFrame:
    """Table-2 analogue (Paper III): per model, value manifold mixed vs restricted, key orthogonality
    range vs baselines, attention focusing and attention type.

    Args:
        dr: concatenated domain_restriction stats; ko: concatenated key_orthogonality tables;
        af: concatenated attention_focusing_summary tables; restricted_set: prompt set of the
            "restricted" column (e.g. domain_mathematics).

    Returns:
        one row per model: model, attention_type (MHA / GQA / MQA, "+ sliding window (...)" when some
        layers use one), n_layers, restricted_set, restricted_domain, pc12_mixed (+ _lo/_hi), pc12_restricted
        (+ _lo/_hi), delta_pc12 (+ _lo/_hi) at the final layer; orth_min, orth_max, orth_mean (per-layer mean
        over key heads: range over layers), gaussian_min/max, random_init_min/max (same statistic, same
        shapes), orth_over_random_init (orth_mean / mean random-init baseline); focusing_pct,
        focusing_pct_global, focusing_rho, focusing_p. Orthogonality values dimensionless in [0, 1].
    """
    fin = _final_values(dr, representation, standardized)
    kl = ko.groupby(["model", "layer"], as_index=False)[["orthogonality", "baseline_gaussian",
                                                          "baseline_random_init"]].mean()
    rows = []
    for m in sorted(set(fin.model) | set(kl.model) | set(af.model)):
        r = dict(model=m)
        a = af[af.model == m]
        if len(a):
            a = a.iloc[0]
            r.update(attention_type=_attention_label(a.attention_type, int(a.n_sliding_layers), int(a.n_layers),
                                                     a.sliding_window if pd.notna(a.sliding_window) else None),
                     n_layers=int(a.n_layers))
        f = fin[fin.model == m]
        mx = f[f.role == "mixed"]
        rs = f[f.prompt_set == restricted_set]
        r["restricted_set"] = restricted_set
        r["restricted_domain"] = rs.domain.iloc[0] if len(rs) else None
        for tag, g in (("mixed", mx), ("restricted", rs)):
            for k in ("pc12", "pc12_lo", "pc12_hi"):
                r[f"{k.replace('pc12', 'pc12_' + tag)}"] = float(g[k].iloc[0]) if len(g) else float("nan")
        for k in ("delta_pc12", "delta_pc12_lo", "delta_pc12_hi"):
            r[k] = float(rs[k].iloc[0]) if len(rs) else float("nan")
        k = kl[kl.model == m]
        if len(k):
            r.update(orth_min=k.orthogonality.min(), orth_max=k.orthogonality.max(), orth_mean=k.orthogonality.mean(),
                     gaussian_min=k.baseline_gaussian.min(), gaussian_max=k.baseline_gaussian.max(),
                     random_init_min=k.baseline_random_init.min(), random_init_max=k.baseline_random_init.max(),
                     orth_over_random_init=k.orthogonality.mean() / k.baseline_random_init.mean())
        if len(a):
            r.update(focusing_pct=float(a.focusing_pct), focusing_pct_global=float(a.focusing_pct_global),
                     focusing_rho=float(a.spearman_rho), focusing_p=float(a.spearman_p))
        rows.append(r)
    return pd.DataFrame(rows)


def _pct(v, lo=None, hi=None) -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    s = f"{100 * v:.1f}"
    if lo is not None and hi is not None and np.isfinite(lo) and np.isfinite(hi):
        s += f" [{100 * lo:.1f}, {100 * hi:.1f}]"
    return s


def to_markdown(df: pd.DataFrame, kind: str) -> str:
    """Markdown rendering of :func:`table1` (``kind="table1"``) or :func:`table2` (``kind="table2"``),
    with percentages and 95% CIs in brackets (a GitHub-flavoured pipe table plus a legend line)."""
    if kind == "table1":
        head = ["Model", "Prompt set", "n", "PC1 % [95% CI]", "PC1+PC2 % [95% CI]", "PR", "rho(PC1, H)",
                "Δ PC1+PC2 vs mixed (pp)"]
        body = [[r.model, r.domain if r.role == "restricted" else "mixed", str(int(r.n)),
                 _pct(r.pc1, r.pc1_lo, r.pc1_hi), _pct(r.pc12, r.pc12_lo, r.pc12_hi), f"{r.participation_ratio:.2f}",
                 f"{r.spearman_rho:.2f} (p={r.spearman_p:.2g})",
                 "-" if r.role == "mixed" else _pct(r.delta_pc12, r.delta_pc12_lo, r.delta_pc12_hi)]
                for r in df.itertuples()]
        legend = ("Table 1 analogue (Paper III): standardized last-token value vectors at the final layer, "
                  "entropy-stratified selections; PC1 sign fixed so that rho >= 0; Δ = restricted - mixed in "
                  "percentage points (CI from independent bootstraps).")
    elif kind == "table2":
        head = ["Model", "Attention", "PC1+PC2 mixed %", "PC1+PC2 restricted %", "Key orthogonality (range over layers)",
                "Gaussian baseline", "Random-init baseline", "Focusing %", "rho(H, depth)"]
        body = []
        for r in df.itertuples():
            g = lambda k: getattr(r, k, float("nan"))  # noqa: E731
            body.append([r.model, str(g("attention_type")), _pct(g("pc12_mixed"), g("pc12_mixed_lo"), g("pc12_mixed_hi")),
                         f"{_pct(g('pc12_restricted'), g('pc12_restricted_lo'), g('pc12_restricted_hi'))} "
                         f"({g('restricted_domain')})",
                         f"{g('orth_min'):.3f}–{g('orth_max'):.3f}", f"{g('gaussian_min'):.3f}–{g('gaussian_max'):.3f}",
                         f"{g('random_init_min'):.3f}–{g('random_init_max'):.3f}",
                         f"{g('focusing_pct'):.1f}", f"{g('focusing_rho'):.2f}"])
        legend = ("Table 2 analogue (Paper III): PC1+PC2 of standardized final-layer value vectors (mixed vs "
                  "restricted selection); key orthogonality = mean |cos| between W_K columns, per-layer mean over "
                  "key heads, range over layers, vs a Gaussian matrix and the random-init architecture of the same "
                  "shape; focusing = % reduction of the mean final-query attention entropy from the first to the last "
                  "layer; rho = Spearman of entropy vs layer index.")
    else:
        raise ValueError(f"kind must be table1 or table2, got {kind!r}")
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in body]
    return "\n".join(lines) + "\n\n" + legend + "\n"


def markdown_tables_html(sections: dict) -> str:
    """A standalone HTML page with the pipe tables of :func:`to_markdown` outputs
    (``{"Table 1 analogue": md1, ...}``), each followed by its legend (for the Snakemake report)."""
    import html

    style = ("<style>body{font-family:sans-serif;font-size:13px} table{border-collapse:collapse} "
             "td,th{border:1px solid #bbb;padding:3px 6px}</style>")
    parts = []
    for title, md in sections.items():
        lines = [ln for ln in md.splitlines() if ln.startswith("|")]
        legend = " ".join(ln for ln in md.splitlines() if ln and not ln.startswith("|"))
        rows = [[html.escape(c.strip().replace("\\|", "|")) for c in ln.strip().strip("|").split(" | ")]
                for ln in lines]
        head = "".join(f"<th>{c}</th>" for c in rows[0]) if rows else ""
        body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows[2:])
        parts.append(f"<h3>{html.escape(title)}</h3><table><tr>{head}</tr>{body}</table><p>{html.escape(legend)}</p>")
    return f"<html><head><meta charset='utf-8'>{style}</head><body>{''.join(parts)}</body></html>\n"
