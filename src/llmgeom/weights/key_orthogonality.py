"""Key orthogonality of W_K per layer and key head, with Gaussian and random-init baselines.

Source: Paper III ("Geometric Scaling of Bayesian Inference in LLMs") sec. 4.2 and DESIGN.md sec. 3
("Key orthogonality"). For layer l and key head h, W_K^(l,h) has d_model rows and head_dim columns
(sliced by :func:`llmgeom.models.architectures.w_k_heads` so that ``input_norm(h) @ W + b`` reproduces the
model's own pre-RoPE keys for that head; fused GPT-NeoX / GPT-2 Conv1D layouts and GQA/MQA sharing are
handled there). Its columns are L2-normalized and

    Orthog = mean over i != j of |cos(k_i, k_j)|        (dimensionless, in [0, 1])

i.e. the mean absolute off-diagonal entry of the column Gram matrix of the normalized columns.
0 = orthogonal columns, 1 = all columns parallel. Two baselines of the same shape:

* ``baseline_gaussian``: a matrix with i.i.d. N(0, 1) entries (seeded per layer and head); its
  expectation is close to sqrt(2 / (pi * d_model)) (:func:`gaussian_expectation`).
* ``baseline_random_init``: the same architecture at random initialization, built from the model's
  config. The model is instantiated on the ``meta`` device (no memory), and in each layer only the
  module that holds W_K (``k_proj`` or the fused QKV projection) is materialized on the CPU in float32
  and initialized with the model's own ``_init_weights`` under ``torch.manual_seed`` derived from
  (seed, layer). This is the distribution a full ``from_config`` gives for those weights (the RNG
  stream differs), costs O(size of W_K) instead of the whole model, and works unchanged for a 7B
  model.

A model whose keys have no W_K (multi-head latent attention: the key latent passes a norm before it is
decompressed per head; :func:`llmgeom.models.families.no_key_projection`) gets rows that say so: the same
columns, NaN statistics and the reason in ``not_applicable`` (empty for every measured row), so that the tables
built on them (``analyses.bayes_tables.table2``) and the claims decide "not testable here" with that reason.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from llmgeom.core.layers import relative_depth
from llmgeom.measures.orthogonality import (
    gaussian_baseline,
    gaussian_expectation,
    orthogonality,
)
from llmgeom.models import architectures as arch
from llmgeom.models import families
from llmgeom.models.random_init import random_init_skeleton  # noqa: F401  (one home: models.random_init)


def key_orthogonality_rows(model) -> list[dict]:
    """Orthogonality of every attention layer's key heads of a loaded model.

    Returns a list of dicts (layer, kv_head, orthogonality, d_model, head_dim), one per key head of each layer
    with attention (``architectures.attention_layers``: every layer, n_layers * n_kv_heads rows, except in hybrid
    models; none in a state-space model). Weights are read through ``architectures.w_k_heads`` (the shared,
    tested slicing) and upcast to float64 (exact for bf16/fp16/fp32 weights).
    """
    rows = []
    for layer in arch.attention_layers(model):
        for h, (W, _b) in enumerate(arch.w_k_heads(model, layer)):
            rows.append(dict(layer=layer, kv_head=h, orthogonality=orthogonality(W),
                             d_model=int(W.shape[0]), head_dim=int(W.shape[1])))
    return rows


def _random_init_layer_heads(skeleton, layer: int, seed: int):
    """Materialize and initialize the W_K-holding module of ``layer`` of a meta skeleton.

    Raises RuntimeError if the model's ``_init_weights`` leaves any of its parameters unset.
    """
    import torch

    mod = arch.kv_module(skeleton, layer)
    mod.to_empty(device="cpu")
    with torch.no_grad():
        for p in mod.parameters(recurse=False):
            p.fill_(float("nan"))
    torch.manual_seed(int(seed) * 1_000_003 + int(layer))
    skeleton._init_weights(mod)
    for name, p in mod.named_parameters(recurse=False):
        if not torch.isfinite(p).all():
            raise RuntimeError(
                f"{type(skeleton).__name__}._init_weights did not initialize {type(mod).__name__}.{name} "
                f"(layer {layer}); the random-init baseline needs an init rule for this module type")
    return arch.w_k_heads(skeleton, layer)


#: The columns of :func:`key_orthogonality_table`, in order.
KEY_ORTHOGONALITY_COLUMNS = ["model", "layer", "relative_depth", "kv_head", "n_query_heads_sharing", "attention_type",
                             "sliding", "orthogonality", "baseline_gaussian", "baseline_random_init",
                             "gaussian_expected", "d_model", "head_dim", "seed", "not_applicable"]


def key_orthogonality_table(model, *, model_name: str, seed: int, random_init: bool) -> pd.DataFrame:
    """Key orthogonality per layer and key head with both baselines (Paper III sec. 4.2).

    Args:
        model: a loaded ``*ForCausalLM`` (any dtype; on CPU).
        model_name: the config name, written in the ``model`` column.
        seed: seeds the Gaussian matrices (``[seed, layer, head]``) and the random-init weights
            (``seed * 1000003 + layer``).
        random_init: compute ``baseline_random_init`` (NaN if False).

    Returns:
        DataFrame, one row per (layer, kv_head) of the layers with attention (hybrid models: only those, so the
        ``layer`` column says which; a state-space model: no rows): model, layer, relative_depth ((layer+1)/L), kv_head,
        n_query_heads_sharing (n_heads / n_kv_heads: 1 = MHA, > 1 = GQA/MQA), attention_type,
        sliding (layer uses a sliding window), orthogonality, baseline_gaussian, baseline_random_init,
        gaussian_expected (sqrt(2/(pi d)) limit), d_model, head_dim, seed. All orthogonality values
        are dimensionless, in [0, 1].

        ``not_applicable``: "" on measured rows; for a model without W_K (multi-head latent attention,
        ``architectures.no_key_projection``) one row per (layer, kv_head) with NaN statistics and the reason here.

    Raises:
        UnsupportedArchitectureError: a family llmgeom.models.families does not describe.
        RuntimeError: the random-init rule leaves W_K unset (see ``_random_init_layer_heads``).
    """
    s = families.summarize(model.config)
    share = s.n_heads // s.n_kv_heads if s.n_kv_heads else 0  # 0: a state-space model (no rows)
    why = families.no_key_projection(model.config)
    if why:
        nan = float("nan")
        rows = [dict(model=model_name, layer=layer, relative_depth=relative_depth(layer, s.n_layers), kv_head=h,
                     n_query_heads_sharing=share, attention_type=s.attention_type, sliding=layer in s.sliding_layers,
                     orthogonality=nan, baseline_gaussian=nan, baseline_random_init=nan,
                     gaussian_expected=gaussian_expectation(s.d_model), d_model=s.d_model, head_dim=s.head_dim,
                     seed=int(seed), not_applicable=f"key orthogonality not applicable: {why}")
                for layer in (s.attention_layers or range(s.n_layers)) for h in range(s.n_kv_heads)]
        return pd.DataFrame(rows, columns=KEY_ORTHOGONALITY_COLUMNS)
    skeleton = random_init_skeleton(model.config) if random_init else None
    rows = key_orthogonality_rows(model)
    by_layer: dict[int, list] = {}
    for r in rows:
        layer, h = r["layer"], r["kv_head"]
        if skeleton is not None and layer not in by_layer:
            by_layer[layer] = [orthogonality(W) for W, _ in _random_init_layer_heads(skeleton, layer, seed)]
            arch.kv_module(skeleton, layer).to("meta")  # free it again
        r.update(
            model=model_name,
            relative_depth=relative_depth(layer, s.n_layers),
            n_query_heads_sharing=share,
            attention_type=s.attention_type,
            sliding=layer in s.sliding_layers,
            baseline_gaussian=gaussian_baseline(r["d_model"], r["head_dim"], seed=seed, layer=layer, head=h),
            baseline_random_init=by_layer[layer][h] if skeleton is not None else float("nan"),
            gaussian_expected=gaussian_expectation(r["d_model"]),
            seed=int(seed),
            not_applicable="",
        )
    return pd.DataFrame(rows, columns=KEY_ORTHOGONALITY_COLUMNS)


def key_orthogonality_from_dir(model_dir: str | Path, *, model_name: str, seed: int, dtype: str,
                               random_init: bool, device: str, device_map: str | None,
                               mem_mb: int | None = None, reuse_model: bool = False) -> pd.DataFrame:
    """Load a prepared model (``models.load_prepared``) and run :func:`key_orthogonality_table`.

    The model server's task "key_orthogonality" (``pipeline.model_server.TASKS``; rule key_orthogonality is a GPU
    rule): with ``reuse_model`` the weights are those the server holds for the model's extractions (loaded as they
    load it: sdpa attention, ``dtype``, ``device``, ``device_map``), so no job loads the model a second time.
    ``dtype`` as in the model's config entry ("auto" = float32 on CPU); W_K is read from the weights as they are
    (``architectures.w_k_heads``, on whatever device) and the statistic is computed in float64 either way.
    ``device`` (schema key ``extract.device``) and ``device_map`` (the model entry's) are the extraction's, required
    so that the server's loaded model is found; ``mem_mb``: the job's declared memory, checked before a load.
    """
    from llmgeom.models.loading import load_prepared

    model, _ = load_prepared(model_dir, dtype=dtype, attn="sdpa", device=device, device_map=device_map,
                             mem_mb=mem_mb, reuse=reuse_model)
    return key_orthogonality_table(model, model_name=model_name, seed=seed, random_init=random_init)


def write_key_orthogonality(table: pd.DataFrame, table_path) -> None:
    """Write :func:`key_orthogonality_from_dir`'s table to the rule's output (CSV, atomically: ``core.io.write_table``)
    in the process that computed it: the model server's writer of the "key_orthogonality" task
    (``pipeline.model_server.TASK_WRITERS``)."""
    from llmgeom.core.io import write_table

    write_table(table, table_path)
