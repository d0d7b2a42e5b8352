"""Wind-tunnel tables (Papers I-III): calibration of the model's entropy against the exact Bayesian
posterior entropy, and the value-manifold geometry per layer and representation, from the activation
file of a wind-tunnel model on its prompt set (``results/{model}/activations/wind_tunnel.h5``).

Everything the tables need comes from the HDF5 file: the exact entropy (``h_exact_bits``), the exact
posterior and the candidate token ids are in each prompt's meta (written by
:func:`llmgeom.prompts.wind_tunnel.prompt_records`); the model's log-probabilities of the candidate
tokens in ``next_token/candidate_logprobs`` (nats, over the full vocabulary). Never torch.

Tables:

* ``wind_tunnel.csv`` (:func:`calibration_summary`): per answer position t and overall (t = "all"):
  n, mae_bits (with a basic-bootstrap interval over held-out sequences: mae_bits_lo / _hi / _bc /
  _replicates, boot_unit, n_boot), pearson_r / p, spearman_rho / p, mean_h_model_bits, mean_h_exact_bits,
  mean_kl_bits, mean_answer_mass.
* ``wind_tunnel_calibration.csv`` (:func:`entropy_bins`): prompts binned by exact entropy.
* ``wind_tunnel_geometry.csv`` (:func:`geometry_table`): per representation (``values``,
  ``attn_output`` when the file has it, ``residual_stream``) and layer: PC1 share, PC1+PC2 share,
  participation ratio, Spearman rho(PC1, exact entropy), pc1_sign.

Source: Paper I ("The Bayesian Geometry of Transformer Attention": entropy calibration in bits, value
manifolds ordered by posterior entropy), Paper III sec. 4 (the same statistics on LLMs).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from llmgeom.core.layers import relative_depth, select_layers
from llmgeom.core.stats import derived_seed, pearson, spearman, weighted_mean_interval
from llmgeom.core.store import DS
from llmgeom.core.units import nats_to_bits
from llmgeom.measures.pca import SignConvention, ValueManifoldPCA
from llmgeom.prompts.io import CANDIDATES_KEY

#: Meta key of the candidate (answer-symbol) token ids (= llmgeom.prompts.wind_tunnel.CANDIDATES_KEY).

#: representation name -> (HDF5 dataset, layer index convention of llmgeom.core.layers.relative_depth).
#: ``attn_output`` (the attention-weighted sum of values at the final token, the input of o_proj) is
#: read only when the file has it (HDF5 contract with ``last_token/attn_output``).
REPRESENTATIONS = {
    "values": (DS.LAST_TOKEN_VALUES, "block"),
    "attn_output": (DS.LAST_TOKEN_ATTN_OUTPUT, "block"),
    "residual_stream": (DS.LAST_TOKEN_RESIDUAL, "residual"),
}

SUMMARY_COLUMNS = ["model", "task", "kind", "step", "t", "n", "mae_bits", "mae_bits_lo", "mae_bits_hi", "mae_bits_bc",
                   "mae_bits_replicates", "boot_unit", "n_boot", "pearson_r", "pearson_p", "spearman_rho",
                   "spearman_p", "mean_h_model_bits", "mean_h_exact_bits", "mean_kl_bits", "mean_answer_mass"]
GEOMETRY_COLUMNS = ["model", "task", "step", "representation", "layer", "relative_depth", "n", "n_features",
                    "pc1", "pc12", "participation_ratio", "participation_ratio_top10", "rho_pc1_h_exact",
                    "p_pc1_h_exact", "abs_rho_pc1_h_exact", "pc1_sign", "pc1_lo", "pc1_hi", "pc1_replicates",
                    "pc12_lo", "pc12_hi", "pc12_replicates"]

#: Sign convention of wind_tunnel_geometry.csv: Spearman rho(PC1 score, exact posterior entropy) >= 0.
H_EXACT_SIGN = SignConvention("h_exact_bits", "spearman")


def candidate_entropy(candidate_logprobs, posterior=None) -> dict:
    """The model's next-token distribution renormalized over the candidate (answer-symbol) tokens.

    Args:
        candidate_logprobs: [n, C] log-probabilities (nats) of the C candidate tokens under the model's
            full-vocabulary next-token distribution (``next_token/candidate_logprobs``).
        posterior: optional [n, C] exact posterior over the same candidates (probabilities, rows sum to 1).

    Returns:
        dict of [n] float64 arrays: ``h_model_bits`` (entropy of the renormalized distribution, bits),
        ``answer_mass`` (sum of the candidates' probabilities before renormalizing, in [0, 1]) and, with
        ``posterior``, ``kl_bits`` = KL(exact || model) in bits (terms with exact probability 0 are 0;
        +inf where the model gives 0 to a possible answer).

    Raises:
        ValueError: not 2-D, C < 2, non-finite log-probabilities or a posterior of another shape.

    Source: Paper I (entropy calibration over the answer symbols); the same renormalization as SULA's
    two labels (Paper III sec. 5.2).
    """
    from scipy.special import log_softmax, logsumexp

    lp = np.asarray(candidate_logprobs, np.float64)
    if lp.ndim != 2 or lp.shape[1] < 2:
        raise ValueError(f"candidate_logprobs must be [n, C >= 2], got shape {lp.shape}")
    if not np.all(np.isfinite(lp)):
        raise ValueError("candidate_logprobs contains non-finite values")
    lq = log_softmax(lp, axis=1)
    q = np.exp(lq)
    out = {"h_model_bits": nats_to_bits(-np.sum(q * lq, axis=1)), "answer_mass": np.exp(logsumexp(lp, axis=1))}
    if posterior is not None:
        p = np.asarray(posterior, np.float64)
        if p.shape != lp.shape:
            raise ValueError(f"posterior shape {p.shape} != candidate_logprobs shape {lp.shape}")
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - lq), 0.0)
        out["kl_bits"] = nats_to_bits(terms.sum(axis=1))
    return out


def read_wind_tunnel_h5(path, *, model: str | None = None) -> pd.DataFrame:
    """Per-prompt calibration quantities of one wind-tunnel activation file.

    Returns:
        DataFrame, one row per prompt in file order: id (``<task>-s<sequence>-t<t>``, as the prompt set), task, kind, t, sequence, h_exact_bits (exact
        posterior entropy, bits), h_model_bits (model entropy renormalized over the candidates, bits),
        answer_mass, kl_bits (KL(exact || model), bits), h_vocab_bits (full next-token entropy, bits).

    Raises:
        StoreError: untrusted file; KeyError: no ``next_token/candidate_logprobs`` (not extracted with
        ``candidates_key``: rerun rule extract_wind_tunnel) or a prompt without ``h_exact_bits`` /
        ``posterior`` in its meta; ValueError: the file's candidate ids differ from the meta's.
    """
    from llmgeom.core.store import open_activations, read_finite

    with open_activations(path, model=model) as f:
        if DS.NEXT_TOKEN_CANDIDATE_LOGPROBS not in f:
            raise KeyError(f"{path} has no next_token/candidate_logprobs; it was not extracted with "
                           f"candidates_key={CANDIDATES_KEY!r} (rerun rule extract_wind_tunnel)")
        meta = [json.loads(m) for m in f[DS.PROMPTS_META].asstr()[:]]
        lp = read_finite(f, DS.NEXT_TOKEN_CANDIDATE_LOGPROBS)
        cid = f[DS.NEXT_TOKEN_CANDIDATE_IDS][:]
        hv = nats_to_bits(read_finite(f, DS.NEXT_TOKEN_ENTROPY))
    # the prompt id of llmgeom.prompts.wind_tunnel.prompt_records (the file keeps the meta, not the id)
    ids = [f"{m.get('task')}-s{int(m.get('sequence', -1)):04d}-t{int(m.get('t', -1)):02d}" for m in meta]
    for i, m in enumerate(meta):
        missing = [k for k in ("h_exact_bits", "posterior", CANDIDATES_KEY, "t") if k not in m]
        if missing:
            raise KeyError(f"{path}: prompt {ids[i]!r} has no {', '.join(missing)} in its meta; "
                           "not a wind-tunnel prompt set (rule build_wind_tunnel_prompts)")
        if list(m[CANDIDATES_KEY]) != [int(c) for c in cid[i]]:
            raise ValueError(f"{path}: prompt {ids[i]!r}: candidate ids in the file {list(cid[i])} differ from "
                             f"meta[{CANDIDATES_KEY!r}] {m[CANDIDATES_KEY]}")
    post = np.array([m["posterior"] for m in meta], np.float64)
    c = candidate_entropy(lp, post)
    return pd.DataFrame({
        "id": ids, "task": [m.get("task") for m in meta], "kind": [m.get("kind") for m in meta],
        "t": [int(m["t"]) for m in meta], "sequence": [int(m.get("sequence", -1)) for m in meta],
        "h_exact_bits": [float(m["h_exact_bits"]) for m in meta], "h_model_bits": c["h_model_bits"],
        "answer_mass": c["answer_mass"], "kl_bits": c["kl_bits"], "h_vocab_bits": hv,
    })


def calibration_stats(h_model, h_exact) -> dict:
    """MAE |H_model - H_exact| (bits), Pearson r and Spearman rho between them, and their means.

    Args:
        h_model, h_exact: [n] entropies in bits.

    Returns:
        dict: n, mae_bits (NaN when n = 0), pearson_r, pearson_p, spearman_rho, spearman_p (NaN when
        n < 3 or either input is constant, e.g. at a single position t of the bijection task, where
        H_exact = log2(V - t) for every prompt), mean_h_model_bits, mean_h_exact_bits.

    Source: Paper I (entropy calibration: MAE in bits); Paper III sec. 5.2 (MAE and r for SULA).
    """
    hm, he = np.asarray(h_model, np.float64), np.asarray(h_exact, np.float64)
    if hm.shape != he.shape or hm.ndim != 1:
        raise ValueError(f"h_model and h_exact must be 1-d of equal length, got {hm.shape} and {he.shape}")
    nan = float("nan")
    r, rp = pearson(hm, he)
    rho, sp = spearman(hm, he)
    return {"n": int(hm.size), "mae_bits": float(np.mean(np.abs(hm - he))) if hm.size else nan,
            "pearson_r": r, "pearson_p": rp, "spearman_rho": rho, "spearman_p": sp,
            "mean_h_model_bits": float(hm.mean()) if hm.size else nan,
            "mean_h_exact_bits": float(he.mean()) if he.size else nan}


def calibration_summary(per_prompt: pd.DataFrame, *, model: str, n_boot: int, ci: float, seed: int,
                        step=None) -> pd.DataFrame:
    """``wind_tunnel.csv``: :func:`calibration_stats` per answer position t (one row each, t ascending)
    and over all prompts (t = "all", last row), plus mean_kl_bits and mean_answer_mass, and a bootstrap
    interval of mae_bits.

    The interval resamples held-out sequences (the ``sequence`` column; the prompts of one sequence, cut at
    its answer positions, share their context and are not independent): G sequences drawn with replacement
    (:class:`llmgeom.measures.margins.PassageBootstrap`, seed ``derived_seed(seed, "sequences")``); replicate b
    of a row is the mean |H_model - H_exact| of that row's prompts of the drawn sequences, each repeated as
    often as its sequence was drawn (:func:`llmgeom.core.stats.weighted_mean_interval`). Replicate b of every
    row (each t and "all") comes from the same resample. Without sequence labels (all -1) the prompts are
    resampled independently (``boot_unit`` "prompts").

    Args:
        per_prompt: :func:`read_wind_tunnel_h5` output (columns t, sequence, h_model_bits, h_exact_bits,
            kl_bits, answer_mass, task, kind). n_boot: bootstrap resamples (0: no interval; schema key
            ``wind_tunnel.n_boot``). ci: interval coverage (``wind_tunnel.ci``). seed: bootstrap seed
            (``wind_tunnel.seed``). step: training step of the model (empty for none).

    Returns:
        DataFrame with :data:`SUMMARY_COLUMNS`: mae_bits_lo / mae_bits_hi (basic interval, bits, clipped at
        0), mae_bits_bc (bias-corrected MAE), mae_bits_replicates (:func:`llmgeom.core.stats.replicates_text`),
        boot_unit ("sequences" or "prompts"), n_boot.

    Raises:
        ValueError: empty per_prompt; n_boot < 0.

    Source: Paper I (MAE in bits per position and overall); cluster bootstrap: Davison & Hinkley 1997,
    sec. 3.8 / 5.2.
    """
    from llmgeom.measures.margins import PassageBootstrap

    if not len(per_prompt):
        raise ValueError("per_prompt is empty: no prompts to calibrate")
    task, kind = per_prompt.task.iloc[0], per_prompt.kind.iloc[0]
    seq = per_prompt["sequence"].to_numpy() if "sequence" in per_prompt else np.full(len(per_prompt), -1)
    by_sequence = bool(np.all(seq >= 0))
    boot = PassageBootstrap(seq if by_sequence else None, len(per_prompt), n_boot=n_boot,
                            seed=derived_seed(seed, "sequences"))
    w = np.array(list(boot), np.float64).reshape(len(boot), len(per_prompt))  # [n_boot, n_prompts]
    err = np.abs(per_prompt.h_model_bits.to_numpy(np.float64) - per_prompt.h_exact_bits.to_numpy(np.float64))
    t_all = per_prompt.t.to_numpy()
    groups = [(int(t), t_all == t) for t in np.unique(t_all)] + [("all", np.ones(len(per_prompt), bool))]
    rows = []
    for t, sel in groups:
        g = per_prompt[sel]
        stats = calibration_stats(g.h_model_bits.to_numpy(), g.h_exact_bits.to_numpy())
        rows.append(dict(model=model, task=task, kind=kind, step=step, t=t, **stats,
                         **weighted_mean_interval("mae_bits", err[sel], w[:, sel], ci=ci, bounds=(0.0, np.inf)),
                         boot_unit="sequences" if by_sequence else "prompts",
                         n_boot=int(n_boot), mean_kl_bits=float(g.kl_bits.mean()),
                         mean_answer_mass=float(g.answer_mass.mean())))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def entropy_bins(h_model, h_exact, *, h_max: float, n_bins: int) -> pd.DataFrame:
    """Calibration bins: prompts binned by exact entropy, equal-width bins on [0, h_max] bits (last bin
    closed; values above h_max go to the last bin), as :func:`llmgeom.analyses.sula.calibration_table`
    does on [0, 1] bit. Empty bins are omitted.

    Args:
        h_model, h_exact: [n] entropies (bits). h_max: upper edge (bits), e.g. log2(number of candidates).
        n_bins: number of bins (>= 1).

    Returns:
        DataFrame: bin, bin_lo, bin_hi (bits), n, mean_h_exact_bits, mean_h_model_bits, sd_h_model_bits
        (ddof 1; NaN for a single prompt), mean_abs_error_bits.

    Raises:
        ValueError: n_bins < 1, h_max not > 0, or inputs of different length.

    Source: Paper III sec. 5.2 (calibration of H_model against the exact posterior entropy).
    """
    hm, he = np.asarray(h_model, np.float64).ravel(), np.asarray(h_exact, np.float64).ravel()
    if int(n_bins) < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if not (np.isfinite(h_max) and h_max > 0):
        raise ValueError(f"h_max must be a finite number > 0 (bits), got {h_max}")
    if hm.shape != he.shape:
        raise ValueError(f"h_model and h_exact differ in length: {hm.size} vs {he.size}")
    edges = np.linspace(0.0, float(h_max), int(n_bins) + 1)
    b = np.clip(np.searchsorted(edges, he, side="right") - 1, 0, int(n_bins) - 1)
    rows = []
    for j in range(int(n_bins)):
        sel = b == j
        if not sel.any():
            continue
        rows.append(dict(bin=j, bin_lo=edges[j], bin_hi=edges[j + 1], n=int(sel.sum()),
                         mean_h_exact_bits=float(he[sel].mean()), mean_h_model_bits=float(hm[sel].mean()),
                         sd_h_model_bits=float(hm[sel].std(ddof=1)) if sel.sum() > 1 else float("nan"),
                         mean_abs_error_bits=float(np.abs(hm[sel] - he[sel]).mean())))
    return pd.DataFrame(rows, columns=["bin", "bin_lo", "bin_hi", "n", "mean_h_exact_bits", "mean_h_model_bits",
                                       "sd_h_model_bits", "mean_abs_error_bits"])


def manifold_stats(X, h_exact, *, standardize: bool = True, n_boot: int = 0, seed: int | None = None,
                   ci: float | None = None) -> dict:
    """Value-manifold statistics of one representation at one layer.

    Args:
        X: [n, d] final-token representation of n prompts (any units; columns z-scored across prompts
            when ``standardize``, zero-variance columns dropped). h_exact: [n] exact entropies (bits).

    Returns:
        dict: n, n_features (d), pc1, pc12 (explained-variance fractions), participation_ratio (full
        spectrum), participation_ratio_top10, rho_pc1_h_exact / p_pc1_h_exact (Spearman of the PC1 score
        with the exact entropy; PC1's sign is fixed so that rho >= 0), abs_rho_pc1_h_exact, pc1_sign
        (:data:`H_EXACT_SIGN`, "spearman(h_exact_bits) >= 0"); with ``n_boot`` > 0 (and its ``seed``, ``ci``)
        pc1_lo / pc1_hi / pc1_replicates and the same of pc12: the basic bootstrap over prompts of
        :class:`ValueManifoldPCA` (NaN / "" without). All NaN
        (n and n_features kept) when X does not vary across prompts; rho NaN when h_exact is constant.

    Source: Paper I (value manifolds ordered by posterior entropy); Paper III sec. 4 (PC1 share,
    participation ratio, rho(PC1, entropy)); the estimator is :class:`llmgeom.measures.pca.ValueManifoldPCA`
    (its bootstrap over prompts where ``n_boot`` > 0).
    """
    from llmgeom.core.stats import replicates_text

    X = np.asarray(X, np.float64)
    he = np.asarray(h_exact, np.float64)
    if X.ndim != 2 or X.shape[0] != he.size:
        raise ValueError(f"X must be [n, d] with n = len(h_exact) = {he.size}, got shape {X.shape}")
    nan = float("nan")
    out = dict(n=int(X.shape[0]), n_features=int(X.shape[1]), pc1=nan, pc12=nan, participation_ratio=nan,
               participation_ratio_top10=nan, rho_pc1_h_exact=nan, p_pc1_h_exact=nan, abs_rho_pc1_h_exact=nan,
               pc1_sign=H_EXACT_SIGN.label, pc1_lo=nan, pc1_hi=nan, pc1_replicates="", pc12_lo=nan, pc12_hi=nan,
               pc12_replicates="")
    if X.shape[0] < 3 or not np.any(np.ptp(X, axis=0) > 0):
        return out
    est = ValueManifoldPCA(standardize=standardize, n_components=1, sign=H_EXACT_SIGN, n_boot=int(n_boot), seed=seed,
                           ci=ci).fit(X, he)
    if int(n_boot) > 0:
        for j, c in ((0, "pc1"), (2, "pc12")):
            out.update({f"{c}_lo": est.interval_[c][0], f"{c}_hi": est.interval_[c][1],
                        f"{c}_replicates": replicates_text(est.boot_[:, j])})
    rho, p = float(est.sign_corr_[0]), float(est.sign_p_[0])
    out.update(pc1=est.pc1_, pc12=est.pc12_, participation_ratio=est.participation_ratio_,
               participation_ratio_top10=est.participation_ratio_top_, rho_pc1_h_exact=rho, p_pc1_h_exact=p,
               abs_rho_pc1_h_exact=abs(rho))
    return out


def geometry_table(h5_path, per_prompt: pd.DataFrame, *, model: str, layers, step=None,
                   standardize: bool = True, n_boot: int, ci: float, seed: int) -> pd.DataFrame:
    """``wind_tunnel_geometry.csv``: :func:`manifold_stats` per representation (:data:`REPRESENTATIONS`:
    values, attn_output when the file has ``last_token/attn_output``, residual_stream) and layer.

    Args:
        h5_path: the wind-tunnel activation file; per_prompt: :func:`read_wind_tunnel_h5` of it.
        layers: ``select_layers`` spec (block layers; the residual stream adds its embedding layer 0
            and indexes hidden states 0..L). step: training step (empty for none).
        n_boot, ci, seed: the bootstrap over prompts of pc1 / pc12 (:func:`manifold_stats`), at the final layer of
        the values only (what Table 2's wind-tunnel row reads); 0 = none.

    Returns:
        DataFrame with :data:`GEOMETRY_COLUMNS`; relative_depth = (layer + 1) / L for blocks, layer / L
        for the residual stream.

    Source: Paper I / Paper III sec. 4 (values, attention output and residual stream side
    by side).
    """
    from llmgeom.core.store import open_activations, read_finite

    he = per_prompt.h_exact_bits.to_numpy(np.float64)
    task = per_prompt.task.iloc[0] if len(per_prompt) else None
    rows = []
    with open_activations(h5_path, model=model) as f:
        L = f[DS.LAST_TOKEN_VALUES].shape[1]
        blocks = select_layers(layers, L)
        for rep, (ds, index) in REPRESENTATIONS.items():
            if ds not in f:
                continue
            idx = sorted(set([0] + [b + 1 for b in blocks])) if index == "residual" else blocks
            for layer in idx:
                X = read_finite(f, ds, layer=layer)
                X = X.reshape(X.shape[0], -1)
                boot = dict(n_boot=n_boot, seed=derived_seed(seed, "geometry"), ci=ci) if (
                    n_boot and rep == "values" and layer == max(idx)) else {}
                rows.append(dict(model=model, task=task, step=step, representation=rep, layer=layer,
                                 relative_depth=relative_depth(layer, L, index=index),
                                 **manifold_stats(X, he, standardize=standardize, **boot)))
    return pd.DataFrame(rows, columns=GEOMETRY_COLUMNS)


def wind_tunnel_tables(h5_path, *, model: str, calibration_bins: int, layers, n_boot: int, ci: float, seed: int,
                       step=None) -> dict:
    """All wind-tunnel tables of one model: {"summary", "calibration", "geometry", "prompts"}.

    ``summary`` is :func:`calibration_summary` with the bootstrap of mae_bits (``n_boot`` resamples of the
    held-out sequences, coverage ``ci``, ``seed``: schema keys ``wind_tunnel.n_boot`` / ``ci`` / ``seed``);
    ``geometry`` bootstraps pc1 / pc12 over prompts at the values' final layer with the same keys.

    ``calibration`` bins span [0, log2 C] bits (C = number of candidate tokens, the largest possible
    entropy) and carry model, task and step columns; ``prompts`` is :func:`read_wind_tunnel_h5` with a
    model column.

    Source: Papers I and III.
    """
    per = read_wind_tunnel_h5(h5_path, model=model)
    from llmgeom.core.store import open_activations

    with open_activations(h5_path, model=model) as f:
        n_cand = int(f[DS.NEXT_TOKEN_CANDIDATE_IDS].shape[1])
    cal = entropy_bins(per.h_model_bits, per.h_exact_bits, h_max=float(np.log2(n_cand)), n_bins=calibration_bins)
    cal.insert(0, "step", step)
    cal.insert(0, "task", per.task.iloc[0])
    cal.insert(0, "model", model)
    prompts = per.copy()
    prompts.insert(0, "model", model)
    return {"summary": calibration_summary(per, model=model, n_boot=n_boot, ci=ci, seed=seed, step=step),
            "calibration": cal,
            "geometry": geometry_table(h5_path, per, model=model, layers=layers, step=step, n_boot=n_boot, ci=ci,
                                       seed=seed), "prompts": prompts}


def best_geometry(geometry: pd.DataFrame) -> pd.DataFrame:
    """Per model and representation, the layer with the largest |rho(PC1, exact entropy)|: model,
    representation, layer, relative_depth, pc1, abs_rho_pc1_h_exact (rows with NaN rho skipped): the
    representation that carries the entropy ordering.
    """
    g = geometry.dropna(subset=["abs_rho_pc1_h_exact"])
    if not len(g):
        return pd.DataFrame(columns=["model", "representation", "layer", "relative_depth", "pc1",
                                     "abs_rho_pc1_h_exact"])
    i = g.groupby(["model", "representation"], sort=False).abs_rho_pc1_h_exact.idxmax()
    return g.loc[i, ["model", "representation", "layer", "relative_depth", "pc1",
                     "abs_rho_pc1_h_exact"]].reset_index(drop=True)
