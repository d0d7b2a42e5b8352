"""Tiny random models of every installed causal-LM ``model_type`` and the checks that decide its verdict.

Shared by ``tests/unit/models/test_model_types.py`` (which writes ``docs/models.md``) and usable by hand::

    HF_HUB_OFFLINE=1 .venv/bin/python -c "import sys; sys.path.insert(0, 'tests/support'); import model_types as t; print(t.verify('olmo2'))"

The per-type settings that make a tiny config valid live here (``TYPE_SETTINGS``); everything else is the
same for every type (``TINY``): hidden size 64, 3 layers, 4 query heads, 2 key heads, head_dim 16, vocab 128.

Checks (each against the model's own computation, float32, two right-padded prompts of 7 and 3 tokens):
residual stream per block vs ``output_hidden_states`` (the Mamba family's start at block 0's output: there the
embeddings vs the input embeddings); the last block's residual through the final norm vs
the stored final normed state; values vs the KV cache; stored (pre-RoPE) keys at position 0 vs the cache's
keys there (RoPE is the identity at position 0 up to the rotary scaling, e.g. YaRN's mscale; skipped where a QK-norm sits between, the keys being
pre-norm by contract); W_K (``architectures.w_k_heads``) vs the basis-vector reference (the attention
module's input replaced by the rows of [I; 0] at position 0, keys read back at the attention interface);
final-token top logits vs the model's logits; attention entropy and attention output vs eager attention
probabilities; one prompt alone == the same prompt in the batch. Hybrid and state-space models (issue 29): the
residual stream, final normed state, logits and padding invariance on every layer; values, keys, W_K, attention
entropy and output on ``architectures.attention_layers`` (which must equal the config's), NaN at the other layers
(absent without any attention layer); the hybrids' tiny configs keep an attention layer between two attention-free
ones.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=96, max_position_embeddings=128,
            n_embd=64, n_layer=3, n_head=4, n_positions=128, n_ctx=128, ffn_dim=96, n_inner=96,
            num_layers=3, num_heads=4, d_model=64,
            moe_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4,
            num_experts_per_tok=2, shared_expert_intermediate_size=32, n_shared_experts=1,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)

_MAMBA2_TINY = {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_chunk_size": 8}
_LINEAR_TINY = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                "linear_value_head_dim": 16}
#: DeepSeek Sparse Attention (``indexed_attention`` layers): an indexer of 2 heads keeps index_topk = 3 keys per
#: query, fewer than the 7 tokens of the longer prompt, so that its selection (merged into the attention mask) hides
#: causal keys (with T <= index_topk every key is kept)
_DSA_TINY = {"index_topk": 3, "index_n_heads": 2, "index_head_dim": 16}
#: Qwen4-Exp's QSA indexer: 1 of the complete blocks of 2 keys per query (indexer_budget / indexer_compress_ratio),
#: beside the trailing incomplete block (the type is refused by its config for its hyper-connections, so these only
#: make its tiny config valid)
_QSA_TINY = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 2,
             "indexer_compress_ratio": 2}

#: Per model type: attribute -> value set on the text config after ``TINY`` (the tiny config's validity).
TYPE_SETTINGS: dict[str, dict] = {
    "codegen": {"rotary_dim": 8}, "gptj": {"rotary_dim": 8},
    "opt": {"word_embed_proj_dim": 64},  # project_out (word_embed_proj_dim < hidden): tests/unit/models/test_architectures.py
    # logit scales away from 1, so that a missed scaling shows
    "granite": {"logits_scaling": 4.0}, "granitemoe": {"logits_scaling": 4.0},
    "granitemoeshared": {"logits_scaling": 4.0}, "granite_swa": {"logits_scaling": 4.0},
    "granitemoe_swa": {"logits_scaling": 4.0},
    "axk1": {"n_group": 1, "topk_group": 1},  # expert groups of the 4 tiny experts (default 8 groups)
    "laguna": {"num_attention_heads_per_layer": [4, 4, 4]},  # its per-layer head counts, for the tiny 4 heads
    # hybrids (issue 29): three layers with attention at layer 1 only, the others state-space / linear attention;
    # state-space sizes made tiny too (SSM heads x head dim = expand x hidden = 128; the reference scans of
    # transformers without the mamba_ssm kernels take minutes at the default state sizes)
    # its default layer_types is None (no full_attn_idxs fallback as in lfm2): the hybrid's kinds given here
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv"], "num_dense_layers": 1},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1], **_MAMBA2_TINY},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention", "linear_attention"], **_MAMBA2_TINY},
    "falcon_h1": {"mamba_d_ssm": 128, **_MAMBA2_TINY},
    "nemotron_h": {"ssm_state_size": 16, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 1, "chunk_size": 8},
    "zamba2": {"n_mamba_heads": 8, "mamba_headdim": 16, "mamba_d_state": 16, "chunk_size": 8},
    "mamba2": {"num_heads": 8, "state_size": 16, "n_groups": 1, "chunk_size": 8, "time_step_rank": 4},
    "rwkv": {"attention_hidden_size": 64, "context_length": 128},
    "recurrent_gemma": {"lru_width": 64},  # its recurrent blocks' width (default 2560)
    **{t: _LINEAR_TINY for t in ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
                                 "olmo_hybrid", "lara_mini")},
    # masks beyond causality, padding and a window (the entropy reads the mask the attention function receives)
    **{t: _DSA_TINY for t in ("deepseek_v32", "glm_moe_dsa", "hy_v4")},
    "axk2": {"n_group": 1, "topk_group": 1, **_DSA_TINY},  # expert groups as axk1's
    **{t: {**_LINEAR_TINY, **_QSA_TINY} for t in ("qwen4_exp", "qwen4_exp_text")},
    # Doge's dynamic mask keeps the keep_window_size = 4 top-biased keys of each query (fewer than 7 tokens)
    "doge": {"keep_window_size": 4},
}

#: Multi-head latent attention (configs with ``kv_lora_rank``), after ``TINY``: a small latent, value heads of
#: another size than key heads (a mixed-up head size must show), one key/value head per query head (what the
#: decompression gives), ``head_dim`` = the RoPE part (what the rotary embedding of these configs is sized by).
MLA_TINY = dict(kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                qk_head_dim=24, head_dim=8, num_key_value_heads=4)

ATOL = 2e-4
SEQS = [[1, 5, 6, 7, 8, 9, 10], [1, 20, 21]]


@dataclass(frozen=True)
class Row:
    """One line of docs/models.md: ``verdict`` "captured" / "refused" / "not built" (no tiny model could be
    built or run: then the code must refuse it too), ``runs`` what runs, ``why`` the reason (refused, not built)."""

    model_type: str
    verdict: str
    runs: str
    why: str


def causal_lm_types() -> list[str]:
    """Every model_type of the installed transformers' causal-LM auto mapping, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str):
    """The default config of ``model_type`` made tiny (``TINY``, then ``TYPE_SETTINGS``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from llmgeom.models import families

    cfg = CONFIG_MAPPING[model_type]()
    tc = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    mla = MLA_TINY if getattr(tc, "kv_lora_rank", None) else {}
    for target in {id(cfg): cfg, id(tc): tc}.values():
        for k, v in {**TINY, **mla, **TYPE_SETTINGS.get(model_type, {})}.items():
            if k in TINY and not hasattr(target, k):
                continue
            try:
                setattr(target, k, v)
            except (AttributeError, TypeError, ValueError):
                pass
    if getattr(tc, "layer_types", None) is not None and len(tc.layer_types) != tc.num_hidden_layers:
        lt = list(tc.layer_types)
        n = tc.num_hidden_layers
        free = [k for k in lt if k in families._ATTENTION_FREE_LAYER_TYPES]
        attn = [k for k in lt if k not in families._ATTENTION_FREE_LAYER_TYPES]
        # a hybrid keeps both kinds in its tiny model: attention-free, attention, attention-free (layer 1 attends)
        tc.layer_types = [free[0], attn[0], free[0]][:n] + lt[:max(n - 3, 0)] if free and attn else (lt * n)[:n]
    return cfg


def build(model_type: str, attn: str = "sdpa", context: int | None = None):
    """The tiny random model of ``model_type`` (seed 0; 1-d weights shifted so that a wrong slice shows) with the
    attention implementation ``attn``; ``context``: its number of positions (max_position_embeddings / n_positions /
    n_ctx where the config has them), else the tiny default."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(model_type)
    if context is not None:
        tc = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        for k in ("max_position_embeddings", "n_positions", "n_ctx"):
            if hasattr(tc, k):
                setattr(tc, k, context)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-trivial biases and norm gains (a wrong slice must show)
        for p in m.parameters():
            if p.dim() == 1 and p.is_floating_point():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return m.eval()


def _close(a, b, what: str, atol: float = ATOL) -> str | None:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return f"{what}: shape {a.shape} != {b.shape}"
    scale = max(1.0, float(np.abs(b).max()) if b.size else 1.0)
    err = float(np.abs(a - b).max()) if a.size else 0.0
    if not math.isfinite(err) or err > atol * scale:
        return f"{what}: max |diff| {err:.3g} (scale {scale:.3g})"
    return None


def _has_qk_norm(att) -> bool:
    return any(n in dict(att.named_children()) for n in ("k_norm", "key_norm", "k_layernorm", "key_layernorm", "k_ln", "qk_norm"))


def check_model(model, eager) -> list[str]:
    """The capture of ``model`` (sdpa or its own implementation) against its own outputs and ``eager``'s
    attention probabilities (same weights). Returns the failed checks (empty: captured exactly)."""
    import numpy as np
    import torch

    from llmgeom.extract import batch as forward_batch
    from llmgeom.models import architectures as arch
    from llmgeom.models import families

    s = families.summarize(model.config)
    L, hd, nkv, H = s.n_layers, s.head_dim, s.n_kv_heads, s.n_heads
    fails: list[str] = []
    with_attention = list(arch.attention_layers(model))
    free = [l for l in range(L) if l not in with_attention]
    if with_attention != list(s.attention_layers):
        fails.append(f"attention layers of the structure {with_attention} != the config's {list(s.attention_layers)}")
    res = forward_batch.extract_batch(model, SEQS, attention=True, top_k=5)
    per_layer_attention = ("last_token/values", "last_token/keys", "last_token/attn_output", "attention/entropy")
    for k in per_layer_attention:  # the contract at attention-free layers: NaN; a model without attention: absent
        if not with_attention:
            if k in res:
                fails.append(f"{k} stored for a model without attention layers")
        elif free and not np.isnan(res[k][:, free]).all():
            fails.append(f"{k}: layers without attention {free} are not NaN")
    B = len(SEQS)
    last = [len(q) - 1 for q in SEQS]
    T = max(len(q) for q in SEQS)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, q in enumerate(SEQS):
        ids[i, :len(q)] = torch.tensor(q)
        mask[i, :len(q)] = 1
    pos = torch.arange(T).expand(B, T)
    # attention sinks (a learned per-head logit outside q.k, the module's ``sinks``): the eager model's own
    # attention output (its o_proj input) at those layers, the reference of the sink's share (below)
    eager_atts = arch.attention_modules(eager)
    sink_layers = [l for l in with_attention if getattr(eager_atts[l], "sinks", None) is not None]
    # differential attention (Family.z_from_o_proj): the attention output is o_proj's input, (A1 - lambda A2) V
    # group-normed per head pair, not p @ V: its reference is the eager model's own o_proj input
    z_layers = with_attention if families.family_for(model.config).z_from_o_proj else sink_layers
    eager_z: dict[int, torch.Tensor] = {}
    handles = [arch.o_proj_module(eager, l).register_forward_pre_hook(
        lambda mod, args, l=l: eager_z.__setitem__(l, args[0].detach().clone())) for l in z_layers]
    try:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True, use_cache=True)
            eo = eager(input_ids=ids, attention_mask=mask, position_ids=pos, output_attentions=True, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    hs = out.hidden_states
    if len(hs) != L + 1:
        fails.append(f"output_hidden_states has {len(hs)} entries, not n_layers+1 = {L + 1}")
        return fails
    R = res["last_token/residual"]
    at = (lambda t: np.stack([t[b, last[b]].numpy() for b in range(B)]))
    # hidden_states = (embeddings, block 0, ..., block L-2, final norm(block L-1)); the Mamba family's (Mamba,
    # Mamba-2, Falcon-Mamba) = (block 0, ..., block L-1, final norm(block L-1)): no embeddings entry
    with torch.no_grad():
        emb = model.get_input_embeddings()(ids)
    shift = 0 if _close(R[:, 0], at(hs[0]), "") is None else 1
    if shift:
        fails.append(_close(R[:, 0], at(emb), "residual 0 vs the input embeddings"))
    for layer in range(shift, L):
        f = _close(R[:, layer], at(hs[layer - shift]), f"residual {layer} vs hidden_states[{layer - shift}]")
        if f:
            fails.append(f)
            break
    if shift:
        fails.append(_close(R[:, L], at(hs[L - 1]), f"residual {L} vs hidden_states[{L - 1}]"))
    fn = arch.final_norm(model)
    head = arch.head_transform(model) or (lambda x: x)  # the unembedding's input (ModernBERT-decoder's prediction head)
    fam = families.family_for(model.config)
    if fn is None and fam is not families.GENERIC and fam.final_norm is None:  # a family without one (GPT-1, post-LN)
        fn = (lambda x: x)
    if fn is None:
        fails.append("no final norm found")
    else:
        with torch.no_grad():
            y = head(fn(torch.as_tensor(R[:, L]).unsqueeze(1)))[:, 0]
        fails.append(_close(res["last_token/final_normed"], y.numpy(), "final norm(block L output) vs final_normed"))
    with torch.no_grad():
        want = head(torch.stack([hs[L][b, last[b]] for b in range(B)]).unsqueeze(1))[:, 0]
    fails.append(_close(res["last_token/final_normed"], want.numpy(), "final_normed vs hidden_states[-1]"))
    lg = torch.stack([out.logits[b, last[b]] for b in range(B)]).float()
    top = lg.topk(5, dim=-1)
    fails.append(_close(res["next_token/top_logits"], top.values.numpy(), "top logits vs the model's"))
    # (RWKV returns its state, not a cache; GPT-1 keeps none: the block inputs then, _cache_kv)
    cache = (getattr(out, "past_key_values", None) or hs) if with_attention else None
    for layer in with_attention:
        cv = _cache_kv(model, cache, layer)[1]
        cv = np.stack([cv[b, :, last[b]].reshape(-1).numpy() for b in range(B)])
        f = _close(res["last_token/values"][:, layer], cv, f"values {layer} vs KV cache")
        if f:
            fails.append(f)
            break
        # keys at position 0 vs the cache; a model without a KV cache (GPT-1) has no independent key reference
        # (its projection split by our layout is what the capture stores): skipped there, its values are checked
        # through attention output = eager p @ values above and below
        if not _has_qk_norm(arch.attention_modules(model)[layer]) and not isinstance(cache, tuple):
            one = forward_batch.extract_batch(model, [[1]], attention=False, top_k=1)
            with torch.no_grad():
                o1 = model(input_ids=torch.tensor([[1]]), use_cache=True, output_hidden_states=True)
                c1 = getattr(o1, "past_key_values", None) or o1.hidden_states
                k0 = _pre_rope_at_0(model, _cache_kv(model, c1, layer)[0][0, :, 0])
            f = _close(one["last_token/keys"][0, layer], k0.numpy(), f"keys {layer} at position 0 vs KV cache")
            if f:
                fails.append(f)
                break
    # attention entropy and output vs eager probabilities (eager returns one map per attention layer, or per layer)
    atts = getattr(eo, "attentions", None) or ()
    for layer in with_attention:
        p = atts[layer] if len(atts) == L else (atts[with_attention.index(layer)] if len(atts) == len(with_attention)
                                                 else None)
        if p is None:
            fails.append(f"eager gave no attention probabilities for layer {layer}")
            break
        ent = np.zeros((B, H))
        V = _cache_kv(model, cache, layer)[1]
        z = np.zeros((B, H * V.shape[-1]))
        f = None
        for b in range(B):
            pb = p[b, :, last[b], :last[b] + 1].double()
            vb = V[b, :, :last[b] + 1].double().repeat_interleave(H // V.shape[1], dim=0)  # [H, t, hd]
            zb = torch.einsum("ht,htd->hd", pb, vb)
            if layer in sink_layers:
                # the model's distribution is over the keys plus the sink outcome: eager returns it over the keys
                # (summing to 1 - p_sink; gpt_oss, flint, mimo_v2_flash) or renormalized over the keys with the
                # output scaled by their mass (granite_swa's LSE scaling); the mass per head is the eager
                # output's share of p @ v (least squares; 1 for the former), the output itself the reference
                ob = eager_z[layer][b, last[b]].double().reshape(H, -1)
                mass = (ob * zb).sum(-1) / (zb * zb).sum(-1)
                f = f or _close(ob.numpy(), (mass[:, None] * zb).numpy(), f"eager attention output {layer}: not "
                                "its attention probabilities @ values times one share per head")
                pb, zb = pb * mass[:, None], ob
                p_sink = (1 - pb.sum(-1)).clamp_min(0)
                ent[b] = -(p_sink * torch.log(p_sink.clamp_min(1e-300))).numpy()
            ent[b] += (-(pb * torch.log(pb.clamp_min(1e-300))).sum(-1)).numpy()
            if layer in z_layers and layer not in sink_layers:  # differential attention: eager's o_proj input
                zb = eager_z[layer][b, last[b]].double()
            z[b] = zb.reshape(-1).numpy()
        f = f or _close(res["attention/entropy"][:, layer], ent, f"attention entropy {layer} vs eager", atol=1e-4)
        f = f or _close(res["last_token/attn_output"][:, layer], z, f"attention output {layer} vs eager p @ values")
        if f:
            fails.append(f)
            break
    # W_K vs the basis-vector reference at position 0
    if with_attention:
        fails.append(_wk_check(model, s))
    # padding / batch invariance (the residual stream and logits on every layer; the attention datasets on the
    # attention layers)
    for b, q in enumerate(SEQS):
        alone = forward_batch.extract_batch(model, [q], attention=True, top_k=5)
        for k in ("last_token/residual", *per_layer_attention, "next_token/top_logits", "last_token/final_normed"):
            if k not in res:
                continue
            a, w = alone[k][0], res[k][b]
            if k in per_layer_attention:
                a, w = a[with_attention], w[with_attention]
            f = _close(a, w, f"{k}: prompt {b} alone vs in the batch", atol=1e-5)
            if f:
                fails.append(f)
                break
    return [f for f in fails if f]


def key_value_extractors(model) -> list:
    """Per layer: (key_module, key_fn, value_module, value_fn), or None for a layer without attention
    (``architectures.attention_layers``): ``key_fn(output) -> keys [..., n_kv_heads*head_dim]`` and ``value_fn``
    likewise, applied to the forward output of the corresponding module (pre-RoPE keys, before any k_norm: the
    reference the tests read the model's own projections with; ``architectures.qkv_part`` splits a fused one).

    Raises:
        KeyProjectionNotApplicable: multi-head latent attention (keys and values exist per head only inside the
            attention module: the capture reads them at the attention interface)."""
    from llmgeom.models import architectures as arch
    from llmgeom.models import families

    if families.summarize(model.config).latent_attention:
        raise families.KeyProjectionNotApplicable("multi-head latent attention: keys and values are read at the "
                                                  "attention interface, not from one projection's output")
    with_attention = set(arch.attention_layers(model))
    return [(arch.kv_module(model, i), lambda o: arch.qkv_part(model, o, "k"),
             arch.v_module(model, i), lambda o: arch.qkv_part(model, o, "v")) if i in with_attention else None
            for i in range(len(arch.decoder_layers(model)))]


def _cache_kv(model, cache, layer: int):
    """(keys, values) [B, n_kv_heads, T, head_dim / value_head_dim] as the attention function receives them, from the
    model's KV cache: its own tensors, or under multi-head latent attention (whose cache holds the normed latent and
    the rotated k_rope) the heads its attention module decompresses from them with its own ``expand_kv``. A model
    without a KV cache (GPT-1): ``cache`` is its ``hidden_states`` and the keys and values are its key/value
    projection of block ``layer``'s input (through the input norm where the block has one), split as the family's
    layout says (the values are checked independently, through the attention output = eager p @ values)."""
    from llmgeom.models import architectures as arch
    from llmgeom.models import families

    import torch

    if isinstance(cache, tuple):  # hidden_states: no KV cache
        s = families.summarize(model.config)
        with torch.no_grad():
            x = cache[layer]
            norm = arch.input_norm(model, layer)
            x = norm(x) if norm is not None else x
            km, kfn, vm, vfn = key_value_extractors(model)[layer]
            k, v = kfn(km(x)), vfn(vm(x))
        return tuple(t.reshape(*t.shape[:2], s.n_kv_heads, -1).transpose(1, 2) for t in (k, v))
    c = cache.layers[layer]
    if families.latent_dims(model.config) is None:
        return c.keys, c.values
    with torch.no_grad():
        return arch.attention_modules(model)[layer].expand_kv(c.keys, c.values)


def _rope_scale_at_0(model) -> float:
    """The factor RoPE multiplies a key by at position 0 (there sin = 0 and cos = the rotary embedding's
    ``attention_scaling``: 1 for plain RoPE, YaRN's mscale 0.1 ln(factor) + 1 otherwise, e.g. gpt_oss), read from
    the model's own rotary embedding module(s); 1.0 where the model has none.

    Raises:
        AssertionError: rotary embeddings with different scalings (which layer uses which is not known here)."""
    scales = {float(m.attention_scaling) for m in model.modules()
              if hasattr(m, "attention_scaling") and hasattr(m, "inv_freq")}
    assert len(scales) <= 1, f"rotary embeddings with different attention_scaling {sorted(scales)}"
    return scales.pop() if scales else 1.0


def _pre_rope_at_0(model, k0):
    """Keys at position 0 [n_kv, head_dim] as the contract stores them (pre-RoPE): RoPE is the identity there up to
    the rotary embedding's scaling (:func:`_rope_scale_at_0`, undone here), except that DeepSeek's
    ``rope_interleave`` writes the rotary part as [even | odd] coordinates (its
    ``apply_rotary_pos_emb_interleave``; :func:`_rope_interleaved`); that permutation is undone here too."""
    from llmgeom.models import families

    scale = _rope_scale_at_0(model)
    if scale != 1.0:
        k0 = k0 / scale
    lat = families.latent_dims(model.config)
    if lat is None or not _rope_interleaved(model):
        return k0
    r = k0[..., lat.qk_nope_head_dim:].clone()
    half = r.shape[-1] // 2
    out = k0.clone()
    out[..., lat.qk_nope_head_dim::2], out[..., lat.qk_nope_head_dim + 1::2] = r[..., :half], r[..., half:]
    return out


def _rope_interleaved(model) -> bool:
    """Whether the attention writes RoPE's rotary part as [even | odd] coordinates: DeepSeek-V3's config switch
    ``rope_interleave`` where the config has one, else whether its attention's forward calls
    ``apply_rotary_pos_emb_interleave`` (unconditionally: deepseek_v32, glm_moe_dsa, axk2)."""
    import inspect

    from llmgeom.models import architectures as arch
    from llmgeom.models import families

    cfg = families.text_config(model.config)
    if hasattr(cfg, "rope_interleave"):
        return bool(cfg.rope_interleave)
    att = next(a for a in arch.attention_modules(model) if a is not None)
    return "apply_rotary_pos_emb_interleave(" in inspect.getsource(type(att).forward)


def _wk_check(model, s) -> str | None:
    import torch

    from llmgeom.models import architectures as arch
    from llmgeom.models import families
    from llmgeom.extract import hooks

    why = families.no_key_projection(model.config)
    if why:  # no W_K: w_k_heads must say so (key orthogonality writes 'not applicable' rows with the reason)
        try:
            arch.w_k_heads(model, 0)
        except families.KeyProjectionNotApplicable as e:
            return None if str(e) == why else f"w_k_heads raised {e!r}, not the reason {why!r}"
        return "w_k_heads returned heads for a model without a key projection"

    d = s.d_model
    basis = torch.cat([torch.eye(d), torch.zeros(1, d)]).unsqueeze(1)  # [d+1, 1, d] at position 0
    atts = arch.attention_modules(model)
    got: dict[int, torch.Tensor] = {}

    def is_stream(x):  # the attention input(s): [B, T, d_model] (CTRL passes it three times, as v, k, q)
        return isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[-1] == d and x.is_floating_point()

    def pre(mod, args, kwargs):
        return (tuple(basis if is_stream(a) else a for a in args),
                {k: basis if is_stream(v) else v for k, v in kwargs.items()})

    hs = [a.register_forward_pre_hook(pre, with_kwargs=True) for a in atts if a is not None]
    try:
        with torch.no_grad(), hooks.capture_attention(model, lambda i, q, k, o, sc, cap: got.setdefault(i, k)):
            arch.base_model(model)(input_ids=torch.ones(d + 1, 1, dtype=torch.long), use_cache=False)
    finally:
        for h in hs:
            h.remove()
    for layer in arch.attention_layers(model):
        heads = arch.w_k_heads(model, layer)
        if len(heads) != s.n_kv_heads:
            return f"w_k_heads({layer}): {len(heads)} heads, not n_kv_heads = {s.n_kv_heads}"
        if _has_qk_norm(atts[layer]):  # the interface sees k_norm(x W_K): the reference is the key projection
            with torch.no_grad():
                k = arch.qkv_part(model, arch.kv_module(model, layer)(basis[:, 0]), "k")
                k = k.reshape(d + 1, s.n_kv_heads, s.head_dim).transpose(0, 1)
        else:
            k = got.get(layer)
            if k is None:
                return f"layer {layer}: no attention-interface call"
            k = k[:, :, 0]  # [d+1, n_kv, hd]
            scale = _rope_scale_at_0(model)  # RoPE at position 0: the identity up to the rotary scaling
            if scale != 1.0:
                k = k / scale
            k = k.transpose(0, 1)
        for h, (W, b) in enumerate(heads):
            ref_b = k[h, d]
            ref_W = k[h, :d] - ref_b
            f = _close(W.detach().numpy(), ref_W.numpy(), f"W_K layer {layer} head {h} vs basis-vector reference")
            f = f or _close((0 if b is None else b.detach()) + 0 * ref_b, ref_b.numpy(), f"key bias layer {layer} head {h}")
            if f:
                return f
    return None


@functools.lru_cache(maxsize=None)
def verify(model_type: str) -> Row:
    """Build, check and classify one model type (cached: the table and the per-type tests share it)."""
    import torch

    from llmgeom.models import families

    torch.set_num_threads(1)
    if model_type in families.REFUSED:  # refused by name: not built (some cannot be, here)
        return Row(model_type, "refused", "nothing", families.REFUSED[model_type])
    try:
        cfg = tiny_config(model_type)
    except Exception as e:  # noqa: BLE001 - recorded in the table
        return Row(model_type, "not built", "nothing", f"default config fails: {type(e).__name__}: {_short(e)}")
    why = families.refusal(cfg)
    if why:
        return Row(model_type, "refused", "nothing", why)
    try:
        impl = families.attention_implementation(cfg, "sdpa")  # what the workflow loads it with (Falcon: eager)
        try:
            model = build(model_type, impl)
        except ValueError as e:
            if "does not support" not in str(e):
                raise
            model = build(model_type, "eager")
        eager = build(model_type, "eager")
        eager.load_state_dict(model.state_dict())
        with torch.no_grad():
            model(input_ids=torch.tensor([SEQS[0]]), use_cache=False)
    except Exception as e:  # noqa: BLE001 - recorded in the table
        return Row(model_type, "not built", "nothing", f"tiny model does not build or run: {type(e).__name__}: {_short(e)}")
    try:
        fails = check_model(model, eager)
    except Exception as e:  # noqa: BLE001 - recorded in the table
        fails = [f"capture failed: {type(e).__name__}: {_short(e)}"]
    if fails:
        return Row(model_type, "wrong", "nothing", "; ".join(fails))
    fam = families.family_for(model.config)
    how = f"family entry `{fam.name}`" if fam is not families.GENERIC else "generic path"
    runs = what_runs(model)
    no_wk = families.no_key_projection(model.config)
    if no_wk:
        runs = "every measure but key orthogonality" if runs == "every measure" else f"{runs} (no key orthogonality)"
        return Row(model_type, "captured", runs, f"{how}; key orthogonality not applicable: {no_wk}")
    return Row(model_type, "captured", runs, how)


def what_runs(model) -> str:
    """The "what runs" cell of docs/models.md: every measure, or for a hybrid / state-space model the
    residual-stream and logit measures on every layer and the attention measures on its attention layers."""
    from llmgeom.models import architectures as arch
    from llmgeom.models import families

    with_attention = arch.attention_layers(model)
    if len(with_attention) == families.summarize(model.config).n_layers:
        return "every measure"
    if not with_attention:
        return "residual-stream and logit measures (no attention layers)"
    which = f"layer{'s' if len(with_attention) > 1 else ''} {', '.join(map(str, with_attention))}"
    return f"residual-stream and logit measures; attention measures on {which}"


def _short(e: BaseException, n: int = 140) -> str:
    return " ".join(str(e).split())[:n]
