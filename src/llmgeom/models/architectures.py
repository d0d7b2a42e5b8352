"""Where a loaded decoder-only model keeps its parts, and the W_K / fused-QKV maths.

The accessors (decoder blocks, input and final norms, key/value projections, output projection, unembedding) of
a ``Family`` entry follow its paths (``models.families``); a generic model's are found from its structure
(:func:`parts`: the decoder-layer list of the base model, the separate ``k_proj``/``v_proj`` Linear modules of each
attention module, checked against n_kv_heads*head_dim). Fused QKV layouts are split by one function
(:func:`qkv_part`; GPT-NeoX interleaves per head, GPT-2 uses a transposed Conv1D, CodeGen groups them), and
W_K of each key head is sliced from the projection's weight (:func:`w_k_heads`). Hybrid and state-space models
(Jamba, Nemotron-H, Qwen3-Next, Mamba, RWKV, ...): the blocks with attention are :func:`attention_layers`; the other
blocks carry the residual stream only, and their attention accessors raise. Extraction, interventions and the weight
analyses use these accessors and never look at a model's attributes themselves; the runtime hooks that read a
forward pass live in ``extract.hooks``.

Source: DESIGN.md section 1 and Paper III ("Geometric Scaling of Bayesian Inference in LLMs") sec. 4.2 for W_K
slicing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmgeom.models.families import (CODEGEN_MP_NUM, GENERIC, KeyProjectionNotApplicable,
                                     UnsupportedArchitectureError, config_attention_layers, family_for, layer_kinds,
                                     no_key_projection, summarize, text_config)

if TYPE_CHECKING:  # torch is imported where it is used: importing this module stays cheap
    import torch


def _get(obj, path: str | None):
    if path is None:
        return None
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


_K_NAMES = ("k_proj", "key", "k", "wk", "Wk", "key_proj", "k_lin")
_V_NAMES = ("v_proj", "value", "v", "wv", "Wv", "value_proj", "v_lin")
_O_NAMES = ("o_proj", "dense", "out_proj", "c_proj", "wo", "o", "out_lin")
_FINAL_NORM_NAMES = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f", "ln_final", "final_norm")


def _is_norm(m) -> bool:
    return "norm" in type(m).__name__.lower()


def _linear_of(m):
    """``m`` if it is a Linear; the Linear inside a thin wrapper (no parameters of its own, that Linear its only
    child: e.g. Moshi's ``MoshiLinear``, whose forward returns ``self.linear(x)``; the tiny-model test checks that
    its output is the keys), else None."""
    import torch

    if isinstance(m, torch.nn.Linear):
        return m
    kids = list(m.children()) if isinstance(m, torch.nn.Module) else []
    if len(kids) == 1 and isinstance(kids[0], torch.nn.Linear) and not list(m.parameters(recurse=False)):
        return kids[0]
    return None


@dataclass
class Parts:
    """The parts of one loaded generic model (:func:`parts`): ``layers`` the decoder blocks; per block the
    ``attention`` module (the one whose class is an attention module and that holds ``k_proj``), the key /
    value projections ``k_proj``/``v_proj`` ([d_model] -> [n_kv_heads*head_dim] Linear; under multi-head latent
    attention ``kv_a_proj_with_mqa`` and ``kv_b_proj``, :class:`LatentDims`), ``o_proj`` and the
    ``input_norm`` (the block's first norm module, or None); ``final_norm`` of the base model or None.
    ``attention_layers``: the indices of the blocks that have attention; in the other blocks (state-space,
    linear-attention, convolution or MLP-only layers) ``attention`` / ``k_proj`` / ``v_proj`` / ``o_proj`` are
    None."""

    layers: list
    attention: list
    k_proj: list
    v_proj: list
    o_proj: list
    input_norm: list
    final_norm: object
    attention_layers: tuple = ()


_PARTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> Parts (dies with the model)


def _find_layers(base, n_layers: int):
    import torch

    for name, m in base.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers and n_layers > 0:
            return name, list(m)
    raise UnsupportedArchitectureError(
        f"{type(base).__name__}: no ModuleList of {n_layers} decoder layers (num_hidden_layers) in the base model; "
        "the generic path needs one (add a Family entry naming `layers`)")


def parts(model) -> Parts:
    """Find the parts of a generic model from its structure (cached per model object).

    Raises:
        UnsupportedArchitectureError: no decoder-layer list, or a block without separate key/value
            projections of n_kv_heads*head_dim outputs (a fused layout without a ``Family`` entry).
    """
    import torch

    hit = _PARTS.get(model)
    if hit is not None:
        return hit
    s = summarize(model.config)
    base = base_model(model)
    lname, layers = _find_layers(base, s.n_layers)
    kv_out = s.n_kv_heads * s.head_dim
    lat = s.latent_attention  # MLA: "k" = kv_a_proj_with_mqa ([c_kv | k_rope]), "v" = kv_b_proj ([k_nope_h | v_h])
    k_names, v_names = (("kv_a_proj_with_mqa",), ("kv_b_proj",)) if lat else (_K_NAMES, _V_NAMES)
    want = set(config_attention_layers(model.config))  # the config's layer kinds ("hybrid": by structure below)
    kinds = layer_kinds(text_config(model.config))
    mt = getattr(text_config(model.config), "model_type", "?")
    att, ks, vs, os_, norms, with_attention = [], [], [], [], [], []
    for i, blk in enumerate(layers):
        found = None
        if i in want:
            for name, m in blk.named_modules():
                if "attention" not in type(m).__name__.lower():
                    continue
                kids = dict(m.named_children())
                k = next((_linear_of(kids[n]) for n in k_names if _linear_of(kids.get(n)) is not None), None)
                v = next((_linear_of(kids[n]) for n in v_names if _linear_of(kids.get(n)) is not None), None)
                if k is not None and v is not None:
                    found = (m, k, v, next((kids[n] for n in _O_NAMES if isinstance(kids.get(n), torch.nn.Module)),
                                           None))
                    break
            kind = f" ({kinds[i]!r} in config.layer_types)" if kinds else ""
            if lat and found is None:
                raise UnsupportedArchitectureError(
                    f"model_type {mt!r}, layer {i}{kind}: multi-head latent attention (kv_lora_rank) without the "
                    "kv_a_proj_with_mqa / kv_b_proj Linear modules of transformers' DeepSeek-V2/V3 attention")
            if not lat and (found is None or found[1].out_features != kv_out or found[2].out_features != kv_out):
                raise UnsupportedArchitectureError(
                    f"model_type {mt!r}, layer {i}{kind}: no separate key/value projections (k_proj/v_proj Linear "
                    f"with n_kv_heads*head_dim = {kv_out} outputs) in an attention module; a fused or factored layout "
                    "needs a Family entry in llmgeom.models.families")
            with_attention.append(i)
        att.append(found and found[0]); ks.append(found and found[1]); vs.append(found and found[2])
        os_.append(found and found[3])
        norms.append(next((m for _n, m in blk.named_children() if _is_norm(m)), None))
    kids = dict(base.named_children())
    fn = next((kids[n] for n in _FINAL_NORM_NAMES if n in kids and _is_norm(kids[n])), None)
    if fn is None:  # else the first norm registered after the layer list (embedding norms come before it)
        order = list(kids)
        top = lname.split(".")[0]
        after = order[order.index(top) + 1:] if top in order else []
        fn = next((kids[n] for n in after if _is_norm(kids[n])), None)
    res = Parts(layers, att, ks, vs, os_, norms, fn, tuple(with_attention))
    _PARTS[model] = res
    return res



def base_model(model):
    """The decoder stack under a ``*ForCausalLM``: ``model.base_model``, or its ``language_model`` where the
    base model wraps a text decoder beside other encoders (multimodal wrappers registered as causal LMs,
    e.g. ``gemma3``): that one takes ``input_ids`` and returns the final norm's output."""
    base = model.base_model
    if base is model:  # base_model_prefix names no attribute (Llama-4's text model: "language_model", the stack
        base = getattr(model, "model", model)  # is .model): transformers' own attribute for it
    lm = getattr(base, "language_model", None)
    if lm is None or not hasattr(lm, "forward"):
        return base
    if lm is not model and hasattr(lm, "get_output_embeddings") and lm.get_output_embeddings() is not None:
        return base_model(lm)  # the text model is itself a *ForCausalLM (Llama-4, Mllama): its own stack
    return lm


def decoder_layers(model) -> list[torch.nn.Module]:
    """The decoder blocks, in depth order (length n_layers)."""
    fam = family_for(model.config)
    if fam is GENERIC:
        return parts(model).layers
    return list(_get(base_model(model), fam.layers))


def attention_layers(model) -> tuple[int, ...]:
    """0-based indices of the decoder blocks of ``model`` that have attention (the layers whose keys, values,
    attention output and attention entropy exist): every block for a ``Family`` entry; for the generic path the
    blocks whose attention module :func:`parts` found, which are those of :func:`config_attention_layers` (hybrid
    models: Jamba, Bamba, Nemotron-H, Qwen3-Next, ...; () for a pure state-space model: Mamba, Mamba-2,
    Falcon-Mamba). The other blocks carry only the residual stream."""
    fam = family_for(model.config)
    if fam is GENERIC:
        return parts(model).attention_layers
    return tuple(range(len(decoder_layers(model))))


def input_norm(model, layer: int) -> torch.nn.Module:
    """The norm applied to the residual stream before attention in block ``layer``."""
    fam = family_for(model.config)
    if fam is GENERIC:
        return parts(model).input_norm[layer]
    return _get(decoder_layers(model)[layer], fam.input_norm)


def final_norm(model) -> torch.nn.Module | None:
    """The final norm before the unembedding, or None (e.g. OPT-350m post-LN)."""
    fam = family_for(model.config)
    if fam is GENERIC:
        return parts(model).final_norm
    return _get(base_model(model), fam.final_norm) if fam.final_norm else None


#: model_type -> the ``*ForCausalLM`` attribute applied between the base model's output (after its final norm) and
#: the unembedding, where there is one: ModernBERT-decoder's prediction head ``lm_head`` (norm(act(dense(h)));
#: ``logits = decoder(lm_head(h))`` in ``ModernBertDecoderForCausalLM.forward``).
_HEAD_TRANSFORMS = {"modernbert-decoder": "lm_head"}


def head_transform(model) -> torch.nn.Module | None:
    """The module between the final norm's output [.., d_model] and the unembedding's input [.., d_unembed], or None
    (every family but ModernBERT-decoder, :data:`_HEAD_TRANSFORMS`): the stored final normed state is its output,
    what the unembedding sees (``extract.capture.run``)."""
    path = _HEAD_TRANSFORMS.get(getattr(text_config(model.config), "model_type", None))
    return None if path is None else _get(model, path)


def unembedding(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W_U [vocab, d_unembed], bias [vocab] or None) of the output head."""
    head = model.get_output_embeddings()
    return head.weight, getattr(head, "bias", None)


def logit_multiplier(model) -> float | None:
    """The constant that multiplies the LM head's logits before the soft-cap, or None (1): Cohere's
    ``logit_scale`` (logits * logit_scale), Granite's ``logits_scaling`` (logits / logits_scaling).
    Source: the models' ``forward`` in transformers (cohere, cohere2, granite, granitemoe)."""
    cfg = text_config(model.config)
    if family_for(model.config) is not GENERIC:
        return None
    m = 1.0
    if isinstance(getattr(cfg, "logit_scale", None), (int, float)):
        m *= float(cfg.logit_scale)
    if isinstance(getattr(cfg, "logits_scaling", None), (int, float)) and cfg.logits_scaling:
        m /= float(cfg.logits_scaling)
    return None if m == 1.0 else m


def logit_softcap(model) -> float | None:
    """Final-logit soft-capping constant c (logits -> c * tanh(logits / c)), or None: Gemma 2/3's
    ``final_logit_softcapping``, RecurrentGemma's ``logits_soft_cap``."""
    cfg = text_config(model.config)
    return getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logits_soft_cap", None)


def _generic_attention(model, layer: int, what: str):
    """``parts(model)``'s ``what`` list entry of block ``layer``; ValueError for a block without attention."""
    p = parts(model)
    if layer not in p.attention_layers:
        raise ValueError(f"layer {layer} of this {text_config(model.config).model_type!r} model has no attention "
                         f"(attention layers: {list(p.attention_layers)}), so it has no {what}")
    return getattr(p, what)[layer]


def projection_module(model, layer: int, part: str) -> torch.nn.Module:
    """The module whose forward output holds the queries (``part`` "q"), keys ("k") or values ("v") of block
    ``layer``: the separate projection, or the one fused projection (its part: :func:`qkv_part`).

    Raises:
        ValueError: a layer without attention (:func:`attention_layers`), or "q" of a generic model (its parts
            are found by their keys and values only)."""
    fam = family_for(model.config)
    if fam is GENERIC:
        if part == "q":
            raise ValueError("projection_module: the generic path finds no query projection (queries are read at "
                             "the attention interface)")
        return _generic_attention(model, layer, "k_proj" if part == "k" else "v_proj")
    path = fam.fused_proj or {"q": fam.q_proj, "k": fam.k_proj, "v": fam.v_proj}[part]
    return _get(decoder_layers(model)[layer], path)


def kv_module(model, layer: int) -> torch.nn.Module:
    """The module whose forward output holds the keys of block ``layer`` (``projection_module(.., "k")``; in a
    fused layout also the values)."""
    return projection_module(model, layer, "k")


def v_module(model, layer: int) -> torch.nn.Module:
    """The module whose output holds the value vectors of block ``layer`` (``projection_module(.., "v")``)."""
    return projection_module(model, layer, "v")


def qkv_columns(model, part: str) -> torch.Tensor | None:
    """The output columns of the fused projection that hold the queries (``part`` "q"), keys ("k") or values ("v"),
    [n*head_dim] long, head-major (``out[..., cols]`` is [..., n*head_dim], heads concatenated); None for separate
    projections (the whole output is the part). The one description of the fused layouts (:class:`Family`
    ``qkv``): GPT-2's Conv1D and ``qkv_blocks`` are [q | k | v] blocks (k and v of n_kv_heads*head_dim),
    GPT-NeoX interleaves [q_h | k_h | v_h] per head, CodeGen's ``CODEGEN_MP_NUM`` groups are each [q_g | v_g | k_g].

    Raises:
        ValueError: an unknown layout or part."""
    import torch

    fam = family_for(model.config)
    if fam.qkv == "separate":
        return None
    i = "qkv".index(part)
    s = summarize(model.config)
    d = s.n_heads * s.head_dim
    if fam.qkv == "gpt2_conv1d":
        return torch.arange(i * d, (i + 1) * d)
    if fam.qkv == "qkv_blocks":
        dk = s.n_kv_heads * s.head_dim
        return torch.arange(0, d) if i == 0 else torch.arange(d + (i - 1) * dk, d + i * dk)
    if fam.qkv == "neox_fused":
        h = torch.arange(s.n_heads).unsqueeze(1) * 3 * s.head_dim + i * s.head_dim
        return (h + torch.arange(s.head_dim).unsqueeze(0)).reshape(-1)
    if fam.qkv == "codegen_mp":  # group g holds [q | v | k], d/groups columns each (CodeGenAttention.forward)
        w = d // CODEGEN_MP_NUM
        slot = {0: 0, 1: 2, 2: 1}[i]
        g = torch.arange(CODEGEN_MP_NUM).unsqueeze(1) * 3 * w + slot * w
        return (g + torch.arange(w).unsqueeze(0)).reshape(-1)
    raise ValueError(f"family {fam.name}: unknown qkv layout {fam.qkv!r}")


def qkv_part(model, out: torch.Tensor, part: str) -> torch.Tensor:
    """The queries, keys or values (``part`` "q" / "k" / "v") [..., n*head_dim] in the output ``out`` of
    :func:`projection_module`: ``out`` itself for separate projections, its :func:`qkv_columns` for a fused one.
    What the capture and the tests' references split a fused projection with."""
    cols = qkv_columns(model, part)
    return out if cols is None else out[..., cols.to(out.device)]


def w_k_heads(model, layer: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """W_K of each key head of block ``layer``: list (length n_kv_heads) of
    (W [d_model, head_dim], bias [head_dim] or None), sliced so that
    ``input_norm(h) @ W + b`` equals the model's own keys for that head
    (pre-RoPE). Under GQA/MQA there is one entry per key head, shared by
    n_heads / n_kv_heads query heads.

    Source: Paper III sec. 4.2 (key orthogonality).

    Raises:
        KeyProjectionNotApplicable: keys without a per-head projection (multi-head latent attention), with the
            reason (:func:`no_key_projection`).
        ValueError: a layer without attention (:func:`attention_layers`).
    """
    why = no_key_projection(model.config)
    if why:
        raise KeyProjectionNotApplicable(why)
    s = summarize(model.config)
    hd = s.head_dim
    lin = kv_module(model, layer)
    W = lin.weight if family_for(model.config).qkv == "gpt2_conv1d" else lin.weight.T  # [d_model, out]: Conv1D
    # stores [in, out]
    b = lin.bias
    cols = qkv_columns(model, "k")  # every fused layout keeps a key head's head_dim columns together: views, not copies
    heads = []
    for h in range(s.n_kv_heads):
        lo = h * hd if cols is None else int(cols[h * hd])
        if cols is not None and int(cols[(h + 1) * hd - 1]) != lo + hd - 1:
            raise ValueError(f"family {family_for(model.config).name}: key head {h}'s columns are not contiguous")
        heads.append((W[:, lo:lo + hd], None if b is None else b[lo:lo + hd]))
    return heads


# --------------------------------------------------------------------------- attention, without eager weights


def attention_modules(model) -> list[torch.nn.Module]:
    """The attention module of each decoder block (length n_layers): the module that calls the
    attention function with post-RoPE queries and keys; None for a block without attention
    (:func:`attention_layers`)."""
    fam = family_for(model.config)
    if fam is GENERIC:
        return parts(model).attention
    return [_get(blk, fam.attention) for blk in decoder_layers(model)]


def o_proj_module(model, layer: int) -> torch.nn.Module:
    """The output projection of block ``layer``'s attention (o_proj / dense / out_proj / c_proj);
    its input [B, T, n_heads*head_dim] is the attention output (Paper III sec. 4)."""
    fam = family_for(model.config)
    if fam is GENERIC:
        return _generic_attention(model, layer, "o_proj")
    return _get(decoder_layers(model)[layer], fam.o_proj)


def final_token_modules(model) -> list[torch.nn.Module]:
    """Modules of the last decoder block whose input may be cut to each prompt's final token when only the
    final tokens' output of the block is needed: the attention output projection (its input [B, T,
    n_heads*head_dim]) and the MLP (its input [B, T, d_model]; not in families whose block flattens the
    stream before the MLP, OPT). Their outputs then hold one position per prompt, [B, 1, d_model], which the
    block's residual additions broadcast over T: the block output is the model's at the final tokens only.
    The keys and values of every position are still computed (the final query attends to them).

    Generic models (no ``Family`` entry) and ``Family.module_attention`` ones: none (their blocks may gate, branch or route the flattened stream;
    the final-token values are then those of the full pass, exactly).

    Why: the study keeps the last block's output at the final tokens only (the ``logits_to_keep`` idea of
    transformers, one block earlier)."""
    fam = family_for(model.config)
    if fam is GENERIC or fam.module_attention:  # block layouts vary (gates, parallel branches, MoE routing over
        return []  # flattened tokens, residual adds inside the attention module): no cut
    blk = decoder_layers(model)[-1]
    return [_get(blk, path) for path in (fam.o_proj, fam.mlp) if path]
