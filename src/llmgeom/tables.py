"""Analyses that read the HDF5 store and return tidy tables (one row per measurement).

Each function takes paths and parameters, never a model; each row carries
model, prompt_set, representation, layer, n. Rows are the unit that the
report, the cross-model summaries and the tests compare.

Sources: Paper III ("Geometric Scaling of Bayesian Inference in LLMs") sec. 4
for value manifolds; LSM ("Latent Semantic Manifolds in Large Language
Models") for intrinsic dimension.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from . import geometry, manifold
from .store import attrs_dict, open_activations


def write_table(df: pd.DataFrame, path) -> None:
    """Write a CSV atomically (temporary file in the same directory, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        df.to_csv(tmp, index=False, float_format="%.10g")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _layers(spec, n: int) -> list[int]:
    """"all" -> every index, "last" -> [n-1], list of ints (negative from the end)."""
    if spec == "all":
        return list(range(n))
    if spec == "last":
        return [n - 1]
    return sorted({(i if i >= 0 else n + i) for i in spec})


def value_manifold_table(h5_paths: dict, *, model: str, n_boot: int, seed: int, ci: float = 0.95,
                         layers="all", standardize=(True, False)) -> pd.DataFrame:
    """Value-manifold statistics per prompt set, representation, layer and variant.

    Args:
        h5_paths: prompt set name -> activation file of ``model``.
        layers: "all", "last" or a list of layer indices (of the value layers 0..L-1;
            the residual stream uses the same block index, output of block l = index l+1).
        standardize: variants to compute; True = per-coordinate z-score (Paper III), False = raw (centred).

    Returns:
        DataFrame with columns model, prompt_set, representation ("values" = last-token value vectors
        concatenated over key heads [n_prompts, n_kv_heads*head_dim]; "residual_stream" = output of the
        block [n_prompts, d_model]), layer (0-based block index), relative_depth ((layer+1)/L),
        standardized, n, pc1, pc2, pc12 and their CI bounds (fractions of variance, 0..1),
        participation_ratio, spearman_rho, spearman_p (PC1 score vs next-token entropy in nats; PC1 sign
        fixed so rho >= 0), pc1_sign_flipped.

    Raises:
        StoreError: an activation file that must not be trusted.
    """
    rows = []
    for pset, path in h5_paths.items():
        with open_activations(path, model=model) as f:
            ent = f["next_token/entropy"][:].astype(np.float64)
            vals = f["last_token/values"]
            resid = f["last_token/residual"]
            L = vals.shape[1]
            for layer in _layers(layers, L):
                reps = {"values": vals[:, layer, :], "residual_stream": resid[:, layer + 1, :]}
                for rep, X in reps.items():
                    for std in standardize:
                        st = geometry.value_manifold_stats(np.asarray(X, np.float64), ent, n_boot=n_boot,
                                                           seed=seed, standardize=bool(std), ci=ci)
                        st["standardized"] = bool(std)
                        rows.append(dict(model=model, prompt_set=pset, representation=rep, layer=layer,
                                         relative_depth=(layer + 1) / L, **st))
    return pd.DataFrame(rows)


def intrinsic_dimension_table(h5_path, *, model: str, estimators=("twonn",), n_subsamples: int,
                              subsample_size: int, seed: int, min_points: int = 20,
                              mle_k: int = 20, disagreement_factor: float = 1.5) -> pd.DataFrame:
    """Intrinsic dimension of the residual stream per layer at sampled corpus tokens.

    Points: ``tokens/residual_sample`` [n_sample, L+1, d_model] (position 0 excluded at
    extraction), float64, exact duplicates removed and counted. Layer 0 = embeddings,
    layer l = output of block l. Every estimator sees the same subsamples (same seed).

    Returns:
        DataFrame with model, prompt_set, estimator, layer, relative_depth (layer / L), d_model,
        n (distinct points), n_duplicates_removed, n_subsamples, subsample_size (requested),
        subsample_size_used (= n when fewer distinct points exist; then a warning), id_mean, id_std, id_min,
        id_max, id_over_d_model, mle_k (neighbours of MLE; empty for TwoNN), estimator_ratio (largest /
        smallest id_mean over the estimators at that layer; NaN with one estimator),
        estimators_disagree (estimator_ratio > disagreement_factor), disagreement_factor.

    Raises:
        StoreError: untrusted file. manifold.TooFewPointsError: too few distinct points in a layer.
    """
    rows, short = [], []
    with open_activations(h5_path, model=model) as f:
        a = attrs_dict(f)
        X = f["tokens/residual_sample"]
        n_layers = X.shape[1] - 1
        d_model = X.shape[2]
        for layer in range(n_layers + 1):
            pts = np.asarray(X[:, layer, :], dtype=np.float64)
            for est in estimators:
                kw = {"min_points": min_points}
                if est == "mle":
                    kw["k"] = mle_k
                r = manifold.id_subsamples(pts, estimator=est, n_subsamples=n_subsamples,
                                           subsample_size=subsample_size, seed=seed, **kw)
                if r["subsample_size"] < subsample_size and not short:
                    short.append(layer)
                    import warnings

                    warnings.warn(f"{h5_path}: layer {layer} has only {r['n_points']} distinct points, fewer than "
                                  f"intrinsic_dimension.subsample_size={subsample_size}: every subsample is all of "
                                  "them (id_std = 0; column subsample_size_used). Extract more corpus positions "
                                  "(prompts.sets.<corpus>.n, extract.sample_per_prompt) for a spread", stacklevel=2)
                rows.append(dict(model=model, prompt_set=a.get("prompt_set"), estimator=est, layer=layer,
                                 relative_depth=layer / n_layers, d_model=d_model, n=r["n_points"],
                                 n_duplicates_removed=r["n_duplicates_removed"], n_subsamples=r["n_subsamples"],
                                 subsample_size=subsample_size, subsample_size_used=r["subsample_size"],
                                 id_mean=r["id_mean"], id_std=r["id_std"],
                                 id_min=r["id_min"], id_max=r["id_max"],
                                 id_over_d_model=r["id_mean"] / d_model,
                                 mle_k=mle_k if est == "mle" else None))
    df = pd.DataFrame(rows)
    # LSM (issue 5): flag layers where the estimators disagree by more than a factor
    g = df.groupby("layer").id_mean
    ratio = g.transform("max") / g.transform("min")
    df["estimator_ratio"] = ratio.where(df.groupby("layer").estimator.transform("nunique") > 1)
    df["estimators_disagree"] = df.estimator_ratio > disagreement_factor
    df["disagreement_factor"] = disagreement_factor
    return df


def concat_tables(paths) -> pd.DataFrame:
    """Concatenate per-model tables (cross-model aggregation); empty input -> empty frame."""
    frames = [pd.read_csv(p) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
