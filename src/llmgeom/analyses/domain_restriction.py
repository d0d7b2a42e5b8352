"""Bayesian geometry over the HDF5 store: domain restriction, PC scores, attention focusing, and the
cross-model Table-1 / Table-2 analogues of Paper III.

Source: Paper III ("Geometric Scaling of Bayesian Inference in LLMs"), sec. 4 (value manifolds and
domain restriction, Table 1), sec. 4.2 (key orthogonality and attention focusing, Table 2);
DESIGN.md sec. 3. Everything here reads activation files (``llmgeom.core.store``) or tidy tables; nothing
touches a model. Key orthogonality (weights) is in :mod:`llmgeom.weights.key_orthogonality`.

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
import warnings

import numpy as np
import pandas as pd

from llmgeom.core.layers import relative_depth, select_layers
from llmgeom.core.progress import progress
from llmgeom.core.stats import REPLICATES_SUFFIX, bias_corrected, bootstrap_interval, derived_seed, replicates_text
from llmgeom.core.store import DS, attention_layers, open_activations, read_finite
from llmgeom.measures import pca

# ---------------------------------------------------------------------------------------------
# config helpers (called at DAG construction: must stay cheap and never touch a model or the hub)
# ---------------------------------------------------------------------------------------------



EDGE_MODES = ("per_set", "pooled")


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
# changes against the mixed selection
# ---------------------------------------------------------------------------------------------

def _diff_ci(a: np.ndarray, b: np.ndarray, ci: float, estimate: float) -> tuple[float, float]:
    """Basic-bootstrap CI of a - b from independent bootstrap replicates (rows paired by index);
    ``estimate`` is the observed difference (see pca.bootstrap_interval)."""
    return bootstrap_interval(estimate, a - b, ci=ci, method="basic")


def _topics(meta_ds) -> list[str]:
    out = []
    for m in meta_ds[:]:
        m = m.decode() if isinstance(m, bytes) else m
        try:
            out.append(str(json.loads(m).get("topic", "")))
        except (json.JSONDecodeError, AttributeError):
            out.append("")
    return out


_NULL_NAN = dict(pc1_iso=np.nan, pc12_iso=np.nan, pc1_shuffled=np.nan, pc12_shuffled=np.nan, null_reps=0)
#: the unit-norm shares of a row (:func:`_unit_norm_shares`), NaN off the score layers
UNIT_NORM_COLUMNS = ("pc1_unit_norm", "pc1_unit_norm_lo", "pc1_unit_norm_hi", "pc12_unit_norm", "pc12_unit_norm_lo",
                     "pc12_unit_norm_hi", "pc1_unit_norm_replicates", "pc12_unit_norm_replicates")
#: the bootstrapped columns of a row that also carry their replicates (``<column>_replicates``,
#: :func:`llmgeom.core.stats.replicates_text`) at the ``score_layers`` ("" elsewhere, to keep the per-layer table small)
REPLICATED_COLUMNS = ("pc1", "pc2", "pc12", "delta_pc1", "delta_pc12")


def _unit_norm_shares(X, h, *, n_boot: int, seed: int, standardize: bool, ci: float) -> dict:
    """PC1 and PC1+PC2 shares (with their bootstrap intervals, same seed) after every row of ``X`` is scaled to unit
    norm: :class:`llmgeom.measures.pca.ValueManifoldPCA` with ``unit_norm=True``; the columns of
    :data:`UNIT_NORM_COLUMNS`."""
    st, boot = pca.value_manifold_stats(X, h, n_boot=n_boot, seed=seed, standardize=standardize, ci=ci,
                                        unit_norm=True, return_boot=True)
    out = {f"{k}_unit_norm{t}": st[f"{k}{t}"] for k in ("pc1", "pc12") for t in ("", "_lo", "_hi")}
    out.update(pc1_unit_norm_replicates=replicates_text(boot[:, 0]),
               pc12_unit_norm_replicates=replicates_text(boot[:, 2]))
    return out


def domain_restriction_tables(h5_paths: dict, *, model: str, mixed_set: str, labels: dict | None, n_quantiles: int,
                              per_quantile: int, edges: str, n_boot: int, ci: float, seed: int, layers,
                              data_reps: int, standardize=(True, False), score_layers="last", log=print) -> dict:
    """Domain restriction (Paper III sec. 4, Table 1): value-manifold statistics of entropy-stratified
    selections from the mixed pool and from each single-topic pool, and their change vs mixed.

    Args:
        h5_paths: prompt set -> activation file of ``model``; must contain ``mixed_set``.
        labels: prompt set -> domain label (e.g. "Mathematics"); default: the set name.
        n_quantiles, per_quantile: bins of the model's next-token entropy and prompts drawn per bin.
        edges: "per_set" (each pool's own quantiles; default) or "pooled" (common edges over all pools
            in ``h5_paths``); see the module docstring.
        n_boot, ci, seed: basic (reverse-percentile) bootstrap over prompts; the selection of set s uses
            ``derived_seed(seed, s)`` and its bootstrap ``derived_seed(seed, s + "/boot")``.
        layers: "all", "last" or block indices (value layers 0..L-1; residual stream = output of block l).
        standardize: variants (True = z-scored coordinates, Paper III; False = raw, centred only).
        score_layers: layers at which per-prompt PC1/PC2 scores are kept ("last" by default).
        data_reps: replicates of the data-level nulls at the ``score_layers`` of the standardized variant
            (:func:`llmgeom.measures.pca.null_shares`: isotropic Gaussian = Horn's parallel analysis, and
            each coordinate shuffled across prompts, at the same n and d); 0: none (NaN columns).

    Returns:
        dict of three DataFrames:

        ``stats`` - one row per (prompt_set, representation, layer, standardized): model, prompt_set,
        domain, role ("mixed" / "restricted"), edges, n_quantiles, per_quantile, n_candidates, n (selected),
        entropy_mean, entropy_median (nats, of the selection), representation ("values" = last-token
        value vectors concatenated over key heads; "attn_output" = attention output at the final token, the
        o_proj input; "residual_stream" = output of the block), layer,
        relative_depth ((layer+1)/L), standardized, every key of ``pca.value_manifold_stats`` (pc1,
        pc2, pc12 fractions of variance with *_lo/*_hi basic-bootstrap bounds and *_bc bias-corrected
        estimates 2 t - mean(replicates), participation_ratio (full spectrum), participation_ratio_top10,
        spearman_rho / spearman_p of the PC1 score vs next-token entropy with PC1's sign fixed so that
        rho >= 0, pc1_sign = "spearman(next_token_entropy) >= 0", ...), boot_seed, the data-level nulls
        pc1_iso, pc12_iso, pc1_shuffled, pc12_shuffled, null_reps (``data_reps``; NaN / 0 off the score layers),
        the same PC1 / PC1+PC2 shares after every vector is scaled to unit norm, pc1_unit_norm, pc12_unit_norm and
        their *_lo / *_hi bootstrap bounds (at the ``score_layers``, NaN elsewhere: in pre-LN models PC1 can follow
        the hidden-state norm), and the change vs the mixed selection at the same representation,
        layer and variant: delta_pc1, delta_pc2, delta_pc12 (restricted - mixed; *_lo/*_hi = basic-bootstrap
        CI of the difference of independent bootstrap replicates; delta_pc1_bc / delta_pc12_bc = 2 delta -
        mean(replicate differences), the centre of that interval), delta_participation_ratio,
        delta_participation_ratio_top10,
        delta_spearman_rho (0 for the mixed rows); at the ``score_layers`` the bootstrap replicates behind the
        intervals, ``<column>_replicates`` for pc1, pc2, pc12, delta_pc1, delta_pc12, pc1_unit_norm and
        pc12_unit_norm (:func:`llmgeom.core.stats.replicates_text`, resample order; "" at other layers): e.g.
        ``bootstrap_interval(pc12, parse_replicates(pc12_replicates), ci=ci, bounds=(0, 1)) == (pc12_lo, pc12_hi)``
        (shares clipped to [0, 1]; deltas unclipped), delta replicate b = restricted b - mixed b (independent
        resamples of the two selections).

        ``selection`` - one row per candidate prompt: model, prompt_set, domain, prompt_index (row in the
        activation file), topic, next_token_entropy (nats), entropy_quantile (0 = lowest entropy), quantile_lo,
        quantile_hi (bin edges in nats; -inf / inf at the ends), n_available (candidates in that bin),
        edges, selection_seed, selected (bool).

        ``scores`` - per selected prompt at ``score_layers``: model, prompt_set, domain, representation,
        layer, standardized (True), prompt_index, topic, next_token_entropy, entropy_quantile, pc1, pc2 (scores of
        the standardized data; each component's sign fixed so that its Spearman rho with entropy >= 0),
        pc1_sign, pc2_sign (that convention, "spearman(next_token_entropy) >= 0").

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
    ent, topics, sel, sel_rows = _select(h5_paths, order, model=model, labels=labels, n_quantiles=n_quantiles,
                                         per_quantile=per_quantile, edges=edges, seed=seed, log=log)
    rows, score_rows, mixed_ref = [], [], {}
    for s in order:  # the mixed set first: its rows are the reference of the deltas
        common = dict(model=model, prompt_set=s, domain=labels.get(s, s),
                      role="mixed" if s == mixed_set else "restricted", edges=edges, n_quantiles=int(n_quantiles),
                      per_quantile=int(per_quantile), n_candidates=int(ent[s].size))
        r, sc = _set_statistics(h5_paths[s], common, ent[s], topics[s], sel[s], mixed_ref, model=model, seed=seed,
                                n_boot=n_boot, ci=ci, layers=layers, data_reps=data_reps, standardize=standardize,
                                score_layers=score_layers)
        rows += r
        score_rows += sc
    return {"stats": pd.DataFrame(rows), "selection": pd.DataFrame(sel_rows), "scores": pd.DataFrame(score_rows)}


def _select(h5_paths: dict, order: list, *, model, labels, n_quantiles, per_quantile, edges, seed, log):
    """Pass 1 of :func:`domain_restriction_tables`: entropies and topics of every candidate, the bin edges and the
    seeded entropy-stratified selection of each set. Returns (entropies, topics, selections, selection rows).

    Raises:
        ValueError: a selection with < 3 prompts."""
    ent, topics = {}, {}
    for s in order:
        with open_activations(h5_paths[s], model=model) as f:
            ent[s] = read_finite(f, DS.NEXT_TOKEN_ENTROPY)
            topics[s] = _topics(f[DS.PROMPTS_META])
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
            warnings.warn(msg, stacklevel=3)
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
    return ent, topics, sel, sel_rows


def _set_statistics(path, common: dict, ent, topics, sel, mixed_ref: dict, *, model, seed, n_boot, ci, layers,
                    data_reps, standardize, score_layers) -> tuple[list, list]:
    """Pass 2 of :func:`domain_restriction_tables` for one prompt set: the statistics rows of its selection per
    (representation, layer, variant), with the change vs the mixed selection (``mixed_ref``: filled by the mixed
    set, read by the others), and the PC scores at ``score_layers``. Returns (stats rows, score rows)."""
    s = common["prompt_set"]
    idx = sel["indices"]
    h = ent[idx]
    bseed = derived_seed(seed, s + "/boot")
    with open_activations(path, model=model) as f:
        with_attention = set(attention_layers(f)) if DS.LAST_TOKEN_VALUES in f else set()
        # [n, L, F] / [n, L, H*hd]: NaN at the layers without attention (hybrid models), which are skipped
        vals = read_finite(f, DS.LAST_TOKEN_VALUES, idx) if with_attention else None
        attn = read_finite(f, DS.LAST_TOKEN_ATTN_OUTPUT, idx) if with_attention else None
        resid = read_finite(f, DS.LAST_TOKEN_RESIDUAL, idx)   # [n, L+1, d]
    L = resid.shape[1] - 1
    keep_scores = set(select_layers(score_layers, L))
    sel_layers = select_layers(layers, L)
    bar = progress(total=sum(3 if l in with_attention else 1 for l in sel_layers) * len(standardize),
                   unit="bootstrap", desc=f"domain restriction {model} {s} (n_boot={n_boot})")
    rows, score_rows = [], []
    for layer in sel_layers:
        reps = {"values": vals[:, layer, :], "attn_output": attn[:, layer, :]} if layer in with_attention else {}
        reps["residual_stream"] = resid[:, layer + 1, :]  # every layer (attention-free ones too)
        for rep, X in reps.items():
            for std in standardize:
                st, boot = pca.value_manifold_stats(X, h, n_boot=n_boot, seed=bseed, standardize=bool(std), ci=ci,
                                                    return_boot=True)
                key = (rep, layer, bool(std))
                row = dict(common, entropy_mean=float(h.mean()), entropy_median=float(np.median(h)),
                           representation=rep, layer=layer, relative_depth=relative_depth(layer, L), **st)
                row["standardized"] = bool(std)
                row["boot_seed"] = bseed
                row.update(_NULL_NAN if not (data_reps and std and layer in keep_scores) else
                           pca.null_shares(X, n_reps=data_reps, seed=derived_seed(seed, s + "/null"), standardize=True))
                row.update(_unit_norm_shares(X, h, n_boot=n_boot, seed=bseed, standardize=bool(std), ci=ci)
                           if layer in keep_scores else
                           {c: "" if c.endswith(REPLICATES_SUFFIX) else np.nan for c in UNIT_NORM_COLUMNS})
                if common["role"] == "mixed":
                    mixed_ref[key] = (st, boot)
                row.update(_delta_vs_mixed(st, boot, *mixed_ref[key], ci))
                row.update(_replicates(boot, mixed_ref[key][1]) if layer in keep_scores else
                           dict.fromkeys((c + REPLICATES_SUFFIX for c in REPLICATED_COLUMNS), ""))
                rows.append(row)
                bar.update(1)
            if layer in keep_scores:
                S = pca.pc_scores(X, True, 2, sign=pca.ENTROPY_SIGN, reference=h)
                for i, pi in enumerate(idx):
                    score_rows.append(dict(model=model, prompt_set=s, domain=common["domain"], representation=rep,
                                           layer=layer, standardized=True, prompt_index=int(pi), topic=topics[pi],
                                           next_token_entropy=h[i], entropy_quantile=int(sel["bins"][pi]),
                                           pc1=S[i, 0], pc2=S[i, 1], pc1_sign=pca.ENTROPY_SIGN.label,
                                           pc2_sign=pca.ENTROPY_SIGN.label))
    bar.close()
    return rows, score_rows


def _replicates(boot, mboot) -> dict:
    """The ``<column>_replicates`` cells of :data:`REPLICATED_COLUMNS` from the bootstrap shares of the selection
    (``boot`` [n_boot, 3]: PC1, PC2, PC1+PC2 per resample) and of the mixed one (``mboot``; row b = its
    b-th resample): delta replicate b = boot[b] - mboot[b], the replicates :func:`_delta_vs_mixed`'s intervals are taken
    from (the two selections are resampled independently, so b pairs two independent resamples)."""
    out = {f"{k}{REPLICATES_SUFFIX}": replicates_text(boot[:, j]) for j, k in enumerate(("pc1", "pc2", "pc12"))}
    out["delta_pc1" + REPLICATES_SUFFIX] = replicates_text(boot[:, 0] - mboot[:, 0])
    out["delta_pc12" + REPLICATES_SUFFIX] = replicates_text(boot[:, 2] - mboot[:, 2])
    return out


def _delta_vs_mixed(st: dict, boot, mst: dict, mboot, ci: float) -> dict:
    """The change of a selection's statistics vs the mixed selection's at the same representation, layer and
    variant: delta_pc1/pc2/pc12 (with the basic-bootstrap CI of independent replicate differences and the
    bias-corrected delta, not for pc2), delta_participation_ratio(_top10), delta_spearman_rho."""
    out = {}
    for j, k in enumerate(("pc1", "pc2", "pc12")):
        out[f"delta_{k}"] = st[k] - mst[k]
        if k != "pc2":
            out[f"delta_{k}_lo"], out[f"delta_{k}_hi"] = _diff_ci(boot[:, j], mboot[:, j], ci, out[f"delta_{k}"])
            out[f"delta_{k}_bc"] = bias_corrected(out[f"delta_{k}"], boot[:, j] - mboot[:, j])
    out["delta_participation_ratio"] = st["participation_ratio"] - mst["participation_ratio"]
    out["delta_participation_ratio_top10"] = st["participation_ratio_top10"] - mst["participation_ratio_top10"]
    out["delta_spearman_rho"] = st["spearman_rho"] - mst["spearman_rho"]
    return out


