"""Analyses that read the HDF5 store and return tidy tables (one row per measurement).

Each function takes paths and parameters, never a model; each row carries
model, prompt_set, representation, layer, n. Rows are the unit that the
report, the cross-model summaries and the tests compare.

Sources: Paper III ("Geometric Scaling of Bayesian Inference in LLMs") sec. 4
for value manifolds; LSM ("Latent Semantic Manifolds in Large Language
Models") for intrinsic dimension.
"""

from __future__ import annotations

import pandas as pd

from llmgeom.core.layers import relative_depth, select_layers
from llmgeom.core.progress import progress
from llmgeom.core.store import DS, attention_layers, open_activations, read_finite
from llmgeom.measures import pca


def value_manifold_table(h5_paths: dict, *, model: str, n_boot: int, seed: int, ci: float, layers,
                         standardize=(True, False)) -> pd.DataFrame:
    """Value-manifold statistics per prompt set, representation, layer and variant.

    Args:
        h5_paths: prompt set name -> activation file of ``model``.
        layers: "all", "last" or a list of layer indices (of the value layers 0..L-1;
            the residual stream uses the same block index, output of block l = index l+1).
        standardize: variants to compute; True = per-coordinate z-score (Paper III), False = raw (centred).

    Returns:
        DataFrame with columns model, prompt_set, representation ("values" = last-token value vectors
        concatenated over key heads [n_prompts, n_kv_heads*head_dim]; "attn_output" = the attention output
        at the final token, the o_proj input [n_prompts, n_heads*head_dim] (where small
        transformers carry the entropy ordering); "residual_stream" = output of the
        block [n_prompts, d_model]; hybrid and state-space models: values and attn_output rows only at the layers
        with attention, the file's ``attention_layers``, residual_stream rows at every layer),
        layer (0-based block index), relative_depth ((layer+1)/L),
        standardized, n, pc1, pc2, pc12 and their basic-bootstrap CI bounds *_lo / *_hi and
        bias-corrected estimates *_bc = 2 t - mean(replicates) (fractions of variance, 0..1),
        participation_ratio (full spectrum), participation_ratio_top10 (10 largest eigenvalues), spearman_rho, spearman_p (PC1 score vs next-token entropy in nats; PC1 sign
        fixed so rho >= 0), pc1_sign_flipped, pc1_sign (the convention, "spearman(next_token_entropy) >= 0";
        estimator: :class:`llmgeom.measures.pca.ValueManifoldPCA`).

    Raises:
        StoreError: an activation file that must not be trusted.
    """
    rows = []
    for pset, path in h5_paths.items():
        with open_activations(path, model=model) as f:
            ent = read_finite(f, DS.NEXT_TOKEN_ENTROPY)
            L = f[DS.LAST_TOKEN_RESIDUAL].shape[1] - 1
            sel = select_layers(layers, L)
            with_attention = set(attention_layers(f)) if DS.LAST_TOKEN_VALUES in f else set()
            with progress(total=sum(3 if l in with_attention else 1 for l in sel) * len(standardize), unit="bootstrap",
                          desc=f"value manifold {model} {pset} (n_boot={n_boot})") as bar:
                for layer in sel:
                    reps = {"values": lambda: read_finite(f, DS.LAST_TOKEN_VALUES, layer=layer),
                            "attn_output": lambda: read_finite(f, DS.LAST_TOKEN_ATTN_OUTPUT, layer=layer),
                            "residual_stream": lambda: read_finite(f, DS.LAST_TOKEN_RESIDUAL, layer=layer + 1)}
                    if layer not in with_attention:  # a state-space / MLP-only block: the residual stream only
                        reps = {"residual_stream": reps["residual_stream"]}
                    for rep, read in reps.items():
                        X = read()
                        for std in standardize:
                            st = pca.value_manifold_stats(X, ent, n_boot=n_boot,
                                                               seed=seed, standardize=bool(std), ci=ci)
                            st["standardized"] = bool(std)
                            rows.append(dict(model=model, prompt_set=pset, representation=rep, layer=layer,
                                             relative_depth=relative_depth(layer, L), **st))
                            bar.update(1)
    return pd.DataFrame(rows)
