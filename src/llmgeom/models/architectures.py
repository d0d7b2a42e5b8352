"""All family-specific knowledge about decoder-only transformers lives here.

Where the decoder blocks, the input norms, the key/value projections and the
unembedding are; how fused QKV layouts are split (GPT-NeoX interleaves per head,
GPT-2 uses a transposed Conv1D); grouped-/multi-query head sharing; which layers
use a sliding window. Extraction, interventions and the weight analyses use
these accessors and never look at a model's attributes themselves.

Any other decoder-only causal LM is read through transformers' own seams (the *generic* path, issue 29):
the decoder-layer list of the base model (the ``ModuleList`` with ``num_hidden_layers`` entries), the
final norm's output (``last_hidden_state``), ``get_output_embeddings()``, the attention interface
(``ALL_ATTENTION_FUNCTIONS``: post-RoPE queries and keys, values, attention output of every layer that
calls it) and the separate key/value projections of the attention module (``k_proj``/``v_proj`` Linear,
found by name and checked against n_kv_heads*head_dim). A ``Family`` entry holds only what those seams
cannot tell (a fused or Conv1D layout, a pre-scaled query, a soft-cap, attention computed inside the module
instead of through the interface: ``Family.module_attention``), with its reason; ``REFUSED``
names the model types that cannot be read and why (:func:`refusal`). Multi-head latent attention
(DeepSeek-V2/V3 MLA, ``kv_lora_rank``; :class:`LatentDims`) is read on the generic path too: its values and keys
exist per head only inside the attention module, so ``extract.capture`` reads them at the attention interface
(value heads of ``v_head_dim``, key heads [k_nope | k_rope] of qk_nope + qk_rope, n_kv_heads = n_heads), and its
keys have no W_K (:func:`no_key_projection`: key orthogonality does not apply). Hybrid and state-space models
(Jamba, Nemotron-H, Qwen3-Next, Mamba, RWKV, ...): the blocks with attention are :func:`attention_layers` (from
``config.layer_types``, checked against the blocks' attention modules); the other blocks carry the residual
stream only, and their attention accessors raise. Masks that carry more than causality, padding and a window
(DeepSeek Sparse Attention's indexer selection, Doge's dynamic mask) are read as the attention function receives
them (``CALL_EXTRAS`` ``mask``; a modeling file's own attention registry is wrapped too, :func:`capture_attention`).
``tests/test_model_types.py``
builds a tiny random model of every installed causal-LM type, checks the capture against the model's
own outputs and writes the coverage table ``docs/models.md``.

Source: DESIGN.md section 1 ("one architectures module") and Paper III
("Geometric Scaling of Bayesian Inference in LLMs") sec. 4.2 for W_K slicing.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # torch is imported where it is used: the workflow reads configs here without it (fast DAG)
    import torch


class UnsupportedArchitectureError(ValueError):
    """A model family that the architectures module does not describe."""


class KeyProjectionNotApplicable(UnsupportedArchitectureError):
    """A model whose keys have no linear projection W_K of the residual stream (multi-head latent attention):
    key orthogonality does not apply; the message is the reason (:func:`no_key_projection`)."""


@dataclass(frozen=True)
class LatentDims:
    """Sizes of multi-head latent attention (DeepSeek-V2/V3 MLA; transformers' ``*Attention`` with
    ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj`` and ``expand_kv``): ``kv_lora_rank`` r (the
    compressed key/value latent), ``qk_nope_head_dim`` and ``qk_rope_head_dim`` (a key head is
    [k_nope_h | k_rope], the RoPE part shared by every head), ``v_head_dim`` (a value head).

    ``kv_a_proj_with_mqa(x)`` is [c_kv (r) | k_rope (qk_rope_head_dim), before RoPE]; ``kv_b_proj(norm(c_kv))`` is,
    per head h, [k_nope_h | v_h]. Source: DeepSeek-V2 report (arXiv:2405.04434) sec. 2.1; transformers
    ``models/deepseek_v3/modeling_deepseek_v3.py`` ``DeepseekV3Attention``."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


def latent_dims(config) -> LatentDims | None:
    """The :class:`LatentDims` of a multi-head latent attention config (``kv_lora_rank`` set), else None."""
    cfg = _text_config(config)
    r = getattr(cfg, "kv_lora_rank", None)
    if not r:
        return None
    return LatentDims(int(r), int(cfg.qk_nope_head_dim), int(cfg.qk_rope_head_dim), int(cfg.v_head_dim))


def no_key_projection(config) -> str | None:
    """Why the keys of this model have no per-head projection W_K [d_model, head_dim] of the attention input (key
    orthogonality then does not apply), or None when they have one."""
    if latent_dims(config) is not None:
        return ("multi-head latent attention: each key head is [k_nope_h | k_rope], with k_nope_h = "
                "kv_b_proj(RMSNorm(x W_a)) decompressed through a norm (not linear in x) and k_rope shared by all "
                "heads, so there is no single W_K per head")
    return None


@dataclass(frozen=True)
class Family:
    """How to find the parts of one decoder-only family.

    Paths are dotted attribute paths: ``layers`` and ``final_norm`` from the base
    model (``model.base_model``), ``input_norm``/``attention``/``k_proj``/``v_proj``
    from one decoder layer. ``qkv`` is one of ``"separate"`` (q/k/v Linear),
    ``"neox_fused"`` (one Linear, per-head interleaved [q_h, k_h, v_h]),
    ``"gpt2_conv1d"`` (one Conv1D, [q | k | v] blocks, weight stored [in, out]), ``"qkv_blocks"`` (one
    Linear, [q (n_heads*head_dim) | k (n_kv_heads*head_dim) | v (n_kv_heads*head_dim)] blocks) or
    ``"codegen_mp"`` (one Linear in ``CODEGEN_MP_NUM`` model-parallel groups, each [q_g | v_g | k_g] of
    d_model / groups columns; q, k, v are the groups' parts concatenated, then split into heads).
    ``reason``: why the entry exists (what the generic seams cannot tell).
    ``q_proj``: the query projection (separate layouts; fused ones split ``fused_proj``).
    ``module_attention``: the attention module computes softmax(q.k) itself instead of calling transformers'
    attention interface (BLOOM, MPT, XGLM, GPT-Neo, GPT-1, Falcon, GPT-NeoX-Japanese): :func:`capture_attention`
    then reads its queries and keys from the projections (as projected: no RoPE in these families but Falcon's and
    GPT-NeoX-Japanese's, applied inside the module after them), the attention output from ``o_proj``'s input and
    the attention probabilities from the module's own output (its second element, [B, n_heads, T, T]: the
    probabilities it multiplies the values by, with its ALiBi or position bias, window and mask), asking for them
    with ``output_attentions=True`` where the module only returns them then. ``input_norm`` None: a post-LN block
    (GPT-1) whose attention reads the residual stream itself. These families are loaded with the eager
    implementation (:func:`attention_implementation`): their modules compute the softmax themselves whatever the
    implementation, BLOOM refuses sdpa, and Falcon's sdpa branch returns no probabilities (asking for them there
    adds sdpa's bool mask to its eager scores).
    ``z_from_o_proj``: the attention output (``hook_z``) is read at ``o_proj``'s input, not from the attention
    function's output: differential attention (DiffLlama) calls the function twice per layer, with the same queries
    and keys and the two halves of the values, and feeds o_proj the group-normed difference of the two outputs
    ((A1 - lambda A2) V per head pair, Ye et al. 2024, "Differential Transformer", sec. 2.1).
    ``attention`` is the attention module of a layer (the one that calls the attention function,
    ``transformers``' ``AttentionInterface``); ``o_proj`` the output projection whose input is the
    attention output (the attention-weighted sum of values, heads concatenated). ``mlp`` the
    feed-forward module of a layer, where the layer adds its output to the [B, T, d_model] residual
    stream (so an output for fewer positions broadcasts there; :func:`final_token_modules`), else None.
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    final_norm: str | None
    input_norm: str | None
    qkv: str
    k_proj: str = "self_attn.k_proj"
    v_proj: str = "self_attn.v_proj"
    fused_proj: str | None = None
    attention: str = "self_attn"
    o_proj: str = "self_attn.o_proj"
    mlp: str | None = "mlp"
    reason: str = ""
    q_proj: str = "self_attn.q_proj"
    module_attention: bool = False
    z_from_o_proj: bool = False


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama", "mistral", "qwen2", "qwen3"), "layers", "norm", "input_layernorm", "separate",
           reason="the studies' own families: explicit paths keep the last block's final-token cut (issue 21)"),
    Family("gemma3", ("gemma3_text", "gemma2", "gemma"), "layers", "norm", "input_layernorm", "separate",
           reason="query_pre_attn_scalar scaling, Gemma 2 attention soft-cap, QK-norm (keys before k_norm)"),
    Family("phi", ("phi",), "layers", "final_layernorm", "input_layernorm", "separate", o_proj="self_attn.dense",
           reason="parallel attention/MLP block: explicit paths keep the final-token cut"),
    Family("opt", ("opt",), "decoder.layers", "decoder.final_layer_norm", "self_attn_layer_norm", "separate",
           o_proj="self_attn.out_proj", mlp=None,  # fc1/fc2 on the flattened [B*T, d] stream
           reason="queries pre-scaled by head_dim**-0.5 before the attention function (scaling 1.0)"),
    Family("gpt_neox", ("gpt_neox",), "layers", "final_layer_norm", "input_layernorm", "neox_fused",
           fused_proj="attention.query_key_value", attention="attention", o_proj="attention.dense",
           reason="fused QKV projection, interleaved per head"),
    Family("gpt2", ("gpt2",), "h", "ln_f", "ln_1", "gpt2_conv1d", fused_proj="attn.c_attn", attention="attn",
           o_proj="attn.c_proj", reason="fused Conv1D QKV ([in, out] weights, [q | k | v] blocks); "
           "scale_attn_by_inverse_layer_idx"),
    Family("phi3", ("phi3",), "layers", "norm", "input_layernorm", "qkv_blocks", fused_proj="self_attn.qkv_proj",
           reason="fused qkv_proj Linear: [q (n_heads*hd) | k (n_kv*hd) | v (n_kv*hd)] blocks"),
    Family("persimmon", ("persimmon",), "layers", "final_layernorm", "input_layernorm", "neox_fused",
           fused_proj="self_attn.query_key_value", o_proj="self_attn.dense",
           reason="fused query_key_value Linear, interleaved per head as in GPT-NeoX (also Fuyu's text model); "
           "QK-norm (keys before k_layernorm)"),
    Family("gpt_bigcode", ("gpt_bigcode",), "h", "ln_f", "ln_1", "qkv_blocks", fused_proj="attn.c_attn",
           attention="attn", o_proj="attn.c_proj",
           reason="fused c_attn Linear: [q | k | v] blocks, multi-query (one key head: config.multi_query)"),
    Family("codegen", ("codegen",), "h", "ln_f", "ln_1", "codegen_mp", fused_proj="attn.qkv_proj", attention="attn",
           o_proj="attn.out_proj",
           reason="fused qkv_proj Linear in the 4 model-parallel groups CodeGen was trained with, each [q | v | k] "
           "(CodeGenAttention.mp_num); parallel attention/MLP block"),
    Family("diffllama", ("diffllama",), "layers", "norm", "input_layernorm", "separate", z_from_o_proj=True,
           reason="differential attention: two attention-function calls per layer (same q and k, each half of the "
           "values); the attention output is o_proj's input, the group-normed (A1 - lambda A2) V of each head pair"),
    # attention computed inside the module (no attention interface): Family.module_attention
    Family("bloom", ("bloom",), "h", "ln_f", "input_layernorm", "neox_fused",
           fused_proj="self_attention.query_key_value", attention="self_attention", o_proj="self_attention.dense",
           module_attention=True, reason="its attention computes softmax(q.k + ALiBi) itself (BloomAttention); fused "
           "query_key_value Linear, [q_h | k_h | v_h] per head as in GPT-NeoX"),
    Family("mpt", ("mpt",), "blocks", "norm_f", "norm_1", "qkv_blocks", fused_proj="attn.Wqkv", attention="attn",
           o_proj="attn.out_proj", mlp="ffn", module_attention=True,
           reason="its attention computes softmax(q.k + ALiBi) itself (MptAttention); fused Wqkv Linear, [q | k | v]"),
    Family("xglm", ("xglm",), "layers", "layer_norm", "self_attn_layer_norm", "separate", o_proj="self_attn.out_proj",
           mlp=None, module_attention=True,
           reason="its attention computes softmax(q.k) itself (XGLMAttention, queries pre-scaled)"),
    Family("gpt_neo", ("gpt_neo",), "h", "ln_f", "ln_1", "separate", q_proj="attn.attention.q_proj",
           k_proj="attn.attention.k_proj", v_proj="attn.attention.v_proj", attention="attn.attention",
           o_proj="attn.attention.out_proj", module_attention=True,
           reason="its attention computes softmax(q.k) itself (GPTNeoSelfAttention: unscaled q.k, local layers)"),
    Family("openai-gpt", ("openai-gpt",), "h", None, None, "gpt2_conv1d", fused_proj="attn.c_attn", attention="attn",
           o_proj="attn.c_proj", module_attention=True,
           reason="its attention computes softmax(q.k) itself (openai-gpt's Attention); fused Conv1D c_attn as GPT-2; "
           "post-LN blocks and no final norm"),
    Family("falcon", ("falcon",), "h", "ln_f", "input_layernorm", "qkv_blocks", fused_proj="self_attention.query_key_value",
           attention="self_attention", o_proj="self_attention.dense", module_attention=True,
           reason="its attention computes softmax(q.k) itself or calls torch's sdpa directly (FalconAttention; "
           "loaded eager); multi-query fused query_key_value Linear: [q (n_heads*hd) | k (hd) | v (hd)]"),
    Family("gpt_neox_japanese", ("gpt_neox_japanese",), "layers", "final_layer_norm", "input_layernorm", "neox_fused",
           fused_proj="attention.query_key_value", attention="attention", o_proj="attention.dense",
           module_attention=True,
           reason="its attention computes softmax(q.k) itself (GPTNeoXJapaneseAttention._attn); fused query_key_value "
           "interleaved per head as in GPT-NeoX; a causal decoder although its config carries BERT's is_decoder"),
    Family("git", ("git",), "encoder.layer", None, None, "separate", q_proj="attention.self.query",
           k_proj="attention.self.key", v_proj="attention.self.value", attention="attention.self",
           o_proj="attention.output.dense", mlp=None, module_attention=True,
           reason="its text decoder's attention computes softmax(q.k) itself (GitSelfAttention); BERT-style post-LN "
           "layers without a final norm; read on text alone (no image tokens)"),
)

#: CodeGen's model-parallel groups of its fused qkv_proj (``CodeGenAttention.mp_num``, fixed in transformers).
CODEGEN_MP_NUM = 4

#: The generic path: every part found on the model itself (:func:`parts`); ``qkv`` "separate" (k_proj/v_proj
#: Linear modules found by name). Returned by :func:`family_for` for any readable model type without an entry.
GENERIC = Family("generic", (), layers="", final_norm=None, input_norm="", qkv="separate", k_proj="", v_proj="",
                 attention="", o_proj="", mlp=None,
                 reason="no entry needed: parts found from transformers' seams (decoder-layer list, attention "
                 "interface, k_proj/v_proj, get_output_embeddings)")

_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}

#: model_types whose activations exceed the float16 range (65504) in real checkpoints: Gemma 2/3
#: residual streams grow to ~1e5 (their embeddings are scaled by sqrt(d_model) and trained in bf16).
FP16_OVERFLOW_MODEL_TYPES = frozenset({"gemma3_text", "gemma3", "gemma2"})


def fp16_overflows(config) -> bool:
    """True for families known to overflow in float16 (load them in bfloat16 or float32 instead)."""
    return getattr(_text_config(config), "model_type", None) in FP16_OVERFLOW_MODEL_TYPES or \
        getattr(config, "model_type", None) in FP16_OVERFLOW_MODEL_TYPES


def supported_model_types() -> list[str]:
    """Sorted list of the ``config.model_type`` values with a ``Family`` entry (the generic path reads any
    other type that :func:`refusal` does not refuse)."""
    return sorted(_BY_TYPE)


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def family_for(config) -> Family:
    """Return the ``Family`` for a transformers config: its entry, else :data:`GENERIC`.

    Raises:
        UnsupportedArchitectureError: a model type that cannot be read (:func:`refusal`), naming the
            model_type and why.
    """
    cfg = _text_config(config)
    mt = getattr(cfg, "model_type", None)
    why = refusal(config)
    if why:
        raise UnsupportedArchitectureError(
            f"model_type {mt!r} is not supported by llmgeom.models.architectures: {why}. Every causal-LM type and its "
            f"verdict: docs/models.md; Family entries (supported: {', '.join(supported_model_types())}), and the "
            "generic path's types there. To read it, add a Family entry in src/llmgeom/models/architectures.py "
            "(and its tiny-model settings in tests/model_types.py)")
    return _BY_TYPE.get(mt, GENERIC)


def attention_implementation(config, requested: str) -> str:
    """The attention implementation to load a model of ``config`` with: ``requested`` (the workflow's sdpa, or flash
    attention on a GPU), or "eager" for a model without attention layers (Mamba, Mamba-2, Falcon-Mamba:
    :func:`config_attention_layers` is empty; transformers refuses sdpa there and no attention function runs) and
    for a family whose modules compute the attention themselves (``Family.module_attention``: the implementation
    does not change their softmax; BLOOM refuses sdpa; Falcon returns its probabilities on its eager branch only)."""
    if not config_attention_layers(config):
        return "eager"
    fam = _BY_TYPE.get(getattr(_text_config(config), "model_type", None))
    return "eager" if fam is not None and fam.module_attention else requested


def _family_refusal(cfg) -> str | None:
    """Why a config of a ``Family`` entry's type cannot be read after all (a variant whose layout the entry does not
    describe), or None. ``cfg``: the text config, a transformers config or a namespace of config.json."""
    mt = getattr(cfg, "model_type", None)
    if mt == "mpt":
        ac = getattr(cfg, "attn_config", None)
        clip = ac.get("clip_qkv") if isinstance(ac, dict) else getattr(ac, "clip_qkv", None)
        if clip:
            return (f"MPT with attn_config.clip_qkv = {clip}: its fused Wqkv output is clamped before the split into "
                    "queries, keys and values, so the keys are not linear in the attention input (no W_K) and the "
                    "projection's output is not the values")
    if mt == "falcon":
        if getattr(cfg, "new_decoder_architecture", False):
            return ("Falcon's new decoder architecture (Falcon-40B/180B): its fused query_key_value is grouped per key "
                    "head ([q_1 .. q_r | k | v] per group) and its cache holds the keys broadcast to every query head; "
                    "not read yet")
        if not getattr(cfg, "multi_query", True):
            return ("Falcon without multi-query attention (e.g. falcon-rw): its fused query_key_value is interleaved "
                    "per head; not read yet")
    if mt == "bloom" and (getattr(cfg, "pretraining_tp", 1) or 1) > 1 and getattr(cfg, "slow_but_exact", False):
        return ("BLOOM with slow_but_exact and pretraining_tp > 1: its output projection runs as per-slice F.linear "
                "calls, bypassing the dense module whose input is the attention output")
    return None


#: Model types that cannot be read, with the reason (what the tiny-model test of every installed type,
#: tests/test_model_types.py, found; the rules of :func:`refusal` cover whole classes of types).
REFUSED: dict[str, str] = {
    'blt': 'not verified: its tiny model needs more than 6 GiB (byte-level patcher with fixed large sizes)',
    'cohere_compass_text': "not verified: no tiny model of this type builds here (KeyError: 'full_attention')",
    'cpmant': "it prepends prompt_length learned prompt tokens to every input inside CpmAntModel (a segment-aware relative position bias over them) and drops them only from its outputs, so the blocks' positions are not the prompt's tokens that the capture indexes; not read",
    'dbrx': "not verified: no tiny model of this type builds here (AttributeError: 'DbrxAttentionConfig' object has no attribute 'rope_theta')",
    'dory': "a looped (recurrent-depth) decoder: its recurrent layers run n_recurrent_loops times per forward, later loops attending over the earlier loops' keys, so a layer has several attention calls and key sets; not read yet",
    'dots3_note': "not verified: no tiny model of this type builds here (AmbiguousGlobalPerLayerAttributeError: 'num_attention_heads' is a per-layer attribute and may vary a)",
    'dots3_note_text': "not verified: no tiny model of this type builds here (AmbiguousGlobalPerLayerAttributeError: 'num_attention_heads' is a per-layer attribute and may vary a)",
    'gemma3n': 'not verified: no tiny model of this type builds here (ImportError: TimmWrapperModel requires the timm library but it was not found in your environment. Yo)',
    'gemma3n_text': 'not verified: no tiny model of this type builds here (ValueError: The set of layer types producing a cache is different than the set of layer types using)',
    'gemma4': "not verified: no tiny model of this type builds here (AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute and may vary across layer)",
    'gemma4_assistant': "not verified: no tiny model of this type builds here (StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture': V)",
    'gemma4_text': "not verified: no tiny model of this type builds here (AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute and may vary across layer)",
    'gemma4_unified': "not verified: no tiny model of this type builds here (AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute and may vary across layer)",
    'gemma4_unified_assistant': "not verified: no tiny model of this type builds here (AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute and may vary across layer)",
    'gemma4_unified_text': "not verified: no tiny model of this type builds here (AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute and may vary across layer)",
    'hrm_text': 'hierarchical recurrent modules: no list of num_hidden_layers decoder layers in the base model',
    'jetmoe': "mixture of attention heads: a router picks each token's query-head experts (top_k of num_experts), so a head index at the attention function is a routed slot, not a fixed head, and the experts' own output projections reduce the attention output",
    'longcat_flash': 'each decoder layer holds two attention sublayers and two MLPs beside a shortcut MoE (num_hidden_layers = 2 x num_layers counts the sublayers), so decoder layers and attention layers are not one-to-one; not read yet',
    'mimo_v2_flash': "its sliding-window layers have twice the key/value heads of its full-attention layers (num_key_value_heads * 2 there, MiMoV2FlashAttention), so the contract's one n_kv_heads axis of last_token/keys and last_token/values cannot hold its layers (its attention sinks, s_aux in those layers, are read: last_query_attention's sinks)",
    'mllama': "multimodal (Llama-3.2-Vision): its text decoder interleaves cross-attention layers (cross_attention_layers) that attend to the image states and are skipped in a text-only forward (MllamaTextModel: no block output there), so decoder layers and residual-stream layers are not one-to-one",
    'musicgen': "not verified: no tiny model of this type builds here (ValueError: Multiple valid text configs were found in the model config: ['text_encoder', 'decoder'].)",
    'musicgen_melody': "not verified: no tiny model of this type builds here (ValueError: Multiple valid text configs were found in the model config: ['text_encoder', 'decoder'].)",
    'phi4_multimodal': 'not verified: its tiny model needs more than 6 GiB (audio/vision encoders with fixed large sizes)',
    'prophetnet': 'not verified: no tiny model of this type builds here (NotImplementedError: This model does not support the setting of `num_hidden_layers`. Please set `num)',
    'bailing_hybrid': "not verified: no tiny model of this type builds here (RuntimeError: shape '[-1, 8, 0]' is invalid for input of size 28: its linear-attention layers beside latent attention)",
    'xlnet': 'not verified: no tiny model of this type builds here (NotImplementedError: The model xlnet is one of the few models that has no sequence length limit.)',
    'xlstm': 'not verified: no tiny model of this type builds here (RuntimeError: The size of tensor a (4096) must match the size of tensor b (64) at non-singleton dime)',
    'zamba': "not verified: no tiny model of this type builds here (ValueError: There is an issue with your definition of `tie_weights_keys` for its shared attention block)",
    'zamba2': 'not verified: no tiny model of this type builds here (RuntimeError: The size of tensor a (5120) must match the size of tensor b (128) at non-singleton dimension 2)',
    'zaya': 'a fused or factored QKV projection without a Family entry (its layout is unknown, so keys and W_K cannot be sliced)',
}

def refusal_of_json(cfg: dict) -> str | None:
    """:func:`refusal` of a ``config.json`` read as a dict (the workflow's config check: no transformers
    import); a multimodal config is judged by its ``text_config`` (with the outer ``is_encoder_decoder``)."""
    from types import SimpleNamespace

    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    inner = {**cfg, **text}
    if text and "model_type" not in text:
        inner["model_type"] = cfg.get("model_type")
    ns = SimpleNamespace(**inner)
    ns.is_encoder_decoder = bool(cfg.get("is_encoder_decoder") or text.get("is_encoder_decoder"))
    outer = SimpleNamespace(model_type=cfg.get("model_type"), is_encoder_decoder=ns.is_encoder_decoder)
    outer.get_text_config = lambda: ns
    return refusal(outer)


#: Layer kinds in ``config.layer_types`` that go through the attention interface (``indexed_attention``: DeepSeek
#: Sparse Attention / Qwen4-Exp QSA, whose indexer's key selection is merged into the attention mask under
#: eager/sdpa, read there: ``CALL_EXTRAS`` ``mask``).
_ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "attention", "chunked_attention",
                                    "global", "local", "sliding", "full", "indexed_attention"})
#: Layer kinds with an attention module beside an attention-free mixer in the same block (Falcon-H1: attention
#: and Mamba-2 in parallel; Zamba: a Mamba block with a shared attention block): attention layers, found by
#: their attention module (:func:`parts`).
_HYBRID_LAYER_TYPES = frozenset({"hybrid"})
#: Layer kinds without attention: state-space (Mamba) and linear-attention / gated-delta mixers
#: (``linear_attention``, transformers' name for all of them), short convolutions (LFM2 ``conv``), blocks with
#: only an MLP or MoE (Nemotron-H ``mlp`` / ``moe``). Their layers carry the residual stream only.
_ATTENTION_FREE_LAYER_TYPES = frozenset({"linear_attention", "mamba", "mamba2", "ssm", "conv", "mlp", "moe",
                                         "recurrent"})


def _layer_kinds(cfg) -> list | None:
    """``config.layer_types`` as a list (one kind per decoder layer), or None when the config has none."""
    kinds = getattr(cfg, "layer_types", None)
    return list(kinds) if kinds else None


def _ssm_only(cfg) -> bool:
    """A config without layer kinds and without any attention-head count (Mamba checkpoints' config.json,
    RWKV): a recurrent / state-space model without attention layers."""
    return _layer_kinds(cfg) is None and not any(getattr(cfg, k, None) for k in ("num_attention_heads", "n_head",
                                                                                  "n_heads", "num_heads"))


def config_attention_layers(config) -> tuple[int, ...]:
    """0-based indices of the decoder layers that have attention, read from the config alone (no weights).

    ``config.layer_types`` decides where a config has it: the attention kinds and the hybrid kinds
    (``_ATTENTION_LAYER_TYPES``, ``_HYBRID_LAYER_TYPES``) have attention, the attention-free kinds
    (``_ATTENTION_FREE_LAYER_TYPES``: Mamba / linear attention, convolution, MLP-only blocks) have none; without
    ``layer_types`` every layer has attention, except in a config without any attention-head count (Mamba's
    config.json, RWKV: none). A loaded generic model's layers are also checked against its structure
    (:func:`parts`); :func:`attention_layers` is the model's.

    Raises:
        UnsupportedArchitectureError: a layer kind none of these sets knows (:func:`refusal` names it).
    """
    cfg = _text_config(config)
    n = int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None) or 0)
    kinds = _layer_kinds(cfg)
    if kinds is None:
        return () if _ssm_only(cfg) else tuple(range(n))
    unknown = sorted(set(kinds) - _ATTENTION_LAYER_TYPES - _HYBRID_LAYER_TYPES - _ATTENTION_FREE_LAYER_TYPES)
    if unknown:
        raise UnsupportedArchitectureError(f"model_type {getattr(cfg, 'model_type', None)!r}: layer kinds "
                                           f"{', '.join(unknown)} in config.layer_types are not known to "
                                           "llmgeom.models.architectures (attention or attention-free?)")
    return tuple(i for i, k in enumerate(kinds) if k not in _ATTENTION_FREE_LAYER_TYPES)


def refusal(config) -> str | None:
    """Why a model of this config cannot be read, or None when it can (read from the config alone: no
    weights, no model built; what the workflow's config check calls).

    Rules, in order: a type with a ``Family`` entry is read unless the entry does not describe its variant
    (``_family_refusal``: MPT's clip_qkv, Falcon's grouped or per-head layouts); a ``REFUSED`` entry; per-layer numbers of query heads (Laguna's
    ``num_attention_heads_per_layer`` when they differ); an encoder-decoder; an encoder (BERT-style config with an
    ``is_decoder`` switch: bidirectional self-attention used as a decoder); a layer kind in ``layer_types``
    that is neither attention nor a known attention-free kind (:func:`config_attention_layers`); hyper-connections
    (``hc_mult`` / ``hc_count`` > 1 parallel residual streams: hy_v4, qwen4_exp). Multi-head
    latent attention, hybrid and state-space models are read (issue 29): the residual-stream and logit measures
    on every layer, the attention measures on :func:`config_attention_layers`; so are masks that carry more than
    causality, padding and a window (DeepSeek Sparse Attention's ``indexed_attention`` layers, whose indexer
    keeps index_topk keys per query; Doge's dynamic mask): the entropy reads the mask the attention function
    receives (``CALL_EXTRAS`` ``mask``).

    Returns:
        the reason in words, or None.
    """
    cfg = _text_config(config)
    mt = getattr(cfg, "model_type", None)
    if mt in _BY_TYPE:
        return _family_refusal(cfg)
    for m in (mt, getattr(config, "model_type", None)):
        if m in REFUSED:
            return REFUSED[m]
    per_layer = getattr(cfg, "num_attention_heads_per_layer", None)
    if per_layer and len(set(per_layer)) > 1:
        return (f"per-layer numbers of query heads (num_attention_heads_per_layer: {sorted(set(per_layer))}); the HDF5 "
                "contract has one n_heads per model")
    if mt == "xlm":  # XLMWithLMHeadModel: masked (causal=False, the default) or causal language model
        if not getattr(cfg, "causal", False):
            return ("an encoder (bidirectional self-attention: XLM with causal = false, its masked-LM objective); its "
                    "LM head is not a decoder-only language model")
        return ("XLM's layers are no modules: XLMModel keeps parallel ModuleLists (attentions, layer_norm1, ffns, "
                "layer_norm2) and runs them in its own loop, so there is no block output to read the residual stream "
                "from; not read yet")
    if getattr(config, "is_encoder_decoder", False) or getattr(cfg, "is_encoder_decoder", False):
        return "an encoder-decoder model (its decoder cross-attends to an encoder); only decoder-only models are read"
    if hasattr(cfg, "is_decoder"):
        return ("an encoder (bidirectional self-attention, BERT-style) used as a decoder; its causal-LM head is "
                "not a decoder-only language model")
    unknown = sorted(set(_layer_kinds(cfg) or ()) - _ATTENTION_LAYER_TYPES - _HYBRID_LAYER_TYPES
                     - _ATTENTION_FREE_LAYER_TYPES)
    if unknown:
        return (f"layer kinds the architectures module does not know ({', '.join(unknown)} in config.layer_types): "
                "whether and how such a layer attends is not known, so its attention datasets cannot be read")
    streams = max(int(getattr(cfg, k, None) or 1) for k in ("hc_mult", "hc_count"))
    if streams > 1:
        return (f"hyper-connections ({streams} parallel residual streams, hc_mult / hc_count, mixed by learned "
                "connections around every block): between blocks each token carries [streams, d_model], not the "
                "one d_model residual vector per layer of the HDF5 contract, and no single stream is the input of the "
                "final norm")
    return None


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
    kinds = _layer_kinds(_text_config(model.config))
    mt = getattr(_text_config(model.config), "model_type", "?")
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
                    "needs a Family entry in llmgeom.models.architectures")
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


@dataclass(frozen=True)
class ArchSummary:
    """Shape facts of one model, read from its config (no weights needed).

    ``attention_type`` is "MHA" (n_kv_heads == n_heads), "MQA" (n_kv_heads == 1), "GQA", or "none" (a
    state-space model without attention layers: n_heads = n_kv_heads = head_dim = 0); ``sliding_layers`` lists
    0-based layer indices that attend within a sliding window of ``sliding_window`` tokens;
    ``attention_layers`` the 0-based indices of the layers that have attention
    (:func:`config_attention_layers`; every layer in an attention-only model). ``head_dim`` is the query/key head
    size (what q.k runs over); ``value_head_dim`` the value head size (values and attention output), the same
    except under multi-head latent attention (``latent_attention``: head_dim = qk_nope_head_dim +
    qk_rope_head_dim, value_head_dim = v_head_dim, n_kv_heads = n_heads, the heads that ``kv_b_proj``
    decompresses; :class:`LatentDims`).
    """

    family: str
    model_type: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    attention_type: str
    sliding_window: int | None
    sliding_layers: tuple[int, ...]
    max_positions: int | None
    value_head_dim: int | None = None
    latent_attention: bool = False
    attention_layers: tuple[int, ...] = ()

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["sliding_layers"] = list(self.sliding_layers)
        d["attention_layers"] = list(self.attention_layers)
        return d


def summarize(config) -> ArchSummary:
    """Summarize a transformers config into an ``ArchSummary``.

    Raises:
        UnsupportedArchitectureError: for a family not in ``FAMILIES``.
    """
    fam = family_for(config)
    cfg = _text_config(config)
    n_layers = int(getattr(cfg, "num_hidden_layers", None) or cfg.n_layer)
    d_model = int(getattr(cfg, "hidden_size", None) or cfg.n_embd)
    with_attention = config_attention_layers(config)
    lat = latent_dims(cfg)
    if not with_attention:  # a state-space model: no attention heads (Mamba-2's num_heads are SSM heads)
        n_heads = n_kv = head_dim = value_head_dim = 0
        attention_type = "none"
    else:
        n_heads = int(getattr(cfg, "num_attention_heads", None) or cfg.n_head)
        n_kv = (1 if getattr(cfg, "multi_query", False) is True
                else (getattr(cfg, "num_key_value_heads", None) or n_heads))
        head_dim = getattr(cfg, "head_dim", None) or d_model // n_heads
        value_head_dim = head_dim
        if lat is not None:  # keys and values are decompressed per query head (config.head_dim is the RoPE part)
            n_kv, head_dim, value_head_dim = n_heads, lat.qk_nope_head_dim + lat.qk_rope_head_dim, lat.v_head_dim
        attention_type = "MHA" if n_kv == n_heads else ("MQA" if n_kv == 1 else "GQA")
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        sliding = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    elif window:
        sliding = tuple(range(n_layers))
    else:
        sliding = ()
    if getattr(cfg, "model_type", None) == "gpt_neo":  # GPT-Neo: its "local" layers attend within window_size
        sliding, window = tuple(i for i, t in enumerate(cfg.attention_layers) if t == "local"), cfg.window_size
    if not sliding:
        window = None
    max_pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    return ArchSummary(
        family=fam.name,
        model_type=cfg.model_type,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(n_kv),
        head_dim=int(head_dim),
        vocab_size=int(cfg.vocab_size),
        attention_type=attention_type,
        sliding_window=int(window) if window else None,
        sliding_layers=sliding,
        max_positions=int(max_pos) if max_pos else None,
        value_head_dim=int(value_head_dim),
        latent_attention=lat is not None,
        attention_layers=tuple(with_attention),
    )


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
    Falcon-Mamba). The other blocks carry only the residual stream (issue 29)."""
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
    path = _HEAD_TRANSFORMS.get(getattr(_text_config(model.config), "model_type", None))
    return None if path is None else _get(model, path)


def unembedding(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W_U [vocab, d_unembed], bias [vocab] or None) of the output head."""
    head = model.get_output_embeddings()
    return head.weight, getattr(head, "bias", None)


def logit_multiplier(model) -> float | None:
    """The constant that multiplies the LM head's logits before the soft-cap, or None (1): Cohere's
    ``logit_scale`` (logits * logit_scale), Granite's ``logits_scaling`` (logits / logits_scaling).
    Source: the models' ``forward`` in transformers (cohere, cohere2, granite, granitemoe)."""
    cfg = _text_config(model.config)
    if getattr(cfg, "model_type", None) in _BY_TYPE:
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
    cfg = _text_config(model.config)
    return getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logits_soft_cap", None)


def _generic_attention(model, layer: int, what: str):
    """``parts(model)``'s ``what`` list entry of block ``layer``; ValueError for a block without attention."""
    p = parts(model)
    if layer not in p.attention_layers:
        raise ValueError(f"layer {layer} of this {_text_config(model.config).model_type!r} model has no attention "
                         f"(attention layers: {list(p.attention_layers)}), so it has no {what}")
    return getattr(p, what)[layer]


def kv_module(model, layer: int) -> torch.nn.Module:
    """The module whose forward output holds the keys and values of block ``layer``.

    For separate projections this is ``k_proj`` (keys); values come from
    ``v_module``. For fused layouts both come from the one fused projection.
    """
    fam = family_for(model.config)
    if fam is GENERIC:
        return _generic_attention(model, layer, "k_proj")
    blk = decoder_layers(model)[layer]
    return _get(blk, fam.fused_proj or fam.k_proj)


def v_module(model, layer: int) -> torch.nn.Module:
    """The module whose output holds the value vectors of block ``layer``."""
    fam = family_for(model.config)
    if fam is GENERIC:
        return _generic_attention(model, layer, "v_proj")
    blk = decoder_layers(model)[layer]
    return _get(blk, fam.fused_proj or fam.v_proj)


def split_fused(model, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a fused QKV projection output [..., 3*d] into q, k, v [..., n_heads*head_dim].

    Only for fused families; GPT-NeoX is interleaved per head ([q_h k_h v_h] per
    head h), GPT-2 is three contiguous blocks.
    """
    fam = family_for(model.config)
    s = summarize(model.config)
    if fam.qkv == "gpt2_conv1d":
        d = s.n_heads * s.head_dim
        return out[..., :d], out[..., d:2 * d], out[..., 2 * d:]
    if fam.qkv == "qkv_blocks":
        d, dk = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        return out[..., :d], out[..., d:d + dk], out[..., d + dk:d + 2 * dk]
    if fam.qkv == "neox_fused":
        lead = out.shape[:-1]
        x = out.reshape(*lead, s.n_heads, 3 * s.head_dim)
        q, k, v = x.split(s.head_dim, dim=-1)
        return (q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1))
    if fam.qkv == "codegen_mp":  # [groups, (q | v | k) of d/groups]; CodeGenAttention.forward
        lead = out.shape[:-1]
        q, v, k = out.reshape(*lead, CODEGEN_MP_NUM, -1).chunk(3, dim=-1)
        return (q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1))
    raise ValueError(f"family {fam.name} has separate projections; split_fused does not apply")


def v_columns(model) -> torch.Tensor | None:
    """Output columns of ``v_module(model, layer)`` that hold the value vectors, or None when the
    module's whole output is the values (separate projections).

    For fused layouts, ``out[..., v_columns(model)]`` equals ``split_fused(model, out)[2]``
    ([..., n_heads*head_dim], head-major), so an edit of the values can be written back into the fused
    output in place (interventions; Paper III sec. 4.5).
    """
    return _fused_columns(model, 2)


def k_columns(model) -> torch.Tensor | None:
    """Output columns of ``kv_module(model, layer)`` that hold the keys (fused layouts:
    ``out[..., k_columns(model)]`` equals ``split_fused(model, out)[1]``), or None for separate projections."""
    return _fused_columns(model, 1)


def _fused_columns(model, part: int) -> torch.Tensor | None:
    import torch

    fam = family_for(model.config)
    if fam.qkv == "separate":
        return None
    s = summarize(model.config)
    d = s.n_heads * s.head_dim
    if fam.qkv == "gpt2_conv1d":
        return torch.arange(part * d, (part + 1) * d)
    if fam.qkv == "qkv_blocks":
        dk = s.n_kv_heads * s.head_dim
        return torch.arange(d + (part - 1) * dk, d + part * dk)
    if fam.qkv == "neox_fused":
        h = torch.arange(s.n_heads).unsqueeze(1) * 3 * s.head_dim + part * s.head_dim
        return (h + torch.arange(s.head_dim).unsqueeze(0)).reshape(-1)
    if fam.qkv == "codegen_mp":  # group g holds [q | v | k], d/groups columns each
        w = d // CODEGEN_MP_NUM
        slot = {0: 0, 1: 2, 2: 1}[part]
        g = torch.arange(CODEGEN_MP_NUM).unsqueeze(1) * 3 * w + slot * w
        return (g + torch.arange(w).unsqueeze(0)).reshape(-1)
    raise ValueError(f"family {fam.name}: unknown qkv layout {fam.qkv!r}")


def key_value_extractors(model) -> list[tuple[torch.nn.Module, Callable, torch.nn.Module, Callable] | None]:
    """Per layer: (key_module, key_fn, value_module, value_fn), or None for a layer without attention
    (:func:`attention_layers`).

    ``key_fn(output) -> keys [..., n_kv_heads*head_dim]`` and ``value_fn`` likewise,
    applied to the forward output of the corresponding module. Keys are pre-RoPE
    and, for Gemma 3, before the per-head ``k_norm`` (i.e. input_norm(h) @ W_K).

    Raises:
        KeyProjectionNotApplicable: multi-head latent attention (keys and values are read at the attention
            interface there: ``extract.capture``).
    """
    if summarize(model.config).latent_attention:
        raise KeyProjectionNotApplicable("multi-head latent attention: keys and values are read at the attention "
                                         "interface (llmgeom.extract.capture), not from one projection's output")
    fam = family_for(model.config)
    res = []
    with_attention = set(attention_layers(model))
    for i in range(len(decoder_layers(model))):
        if i not in with_attention:
            res.append(None)
        elif fam.qkv == "separate":
            res.append((kv_module(model, i), lambda o: o, v_module(model, i), lambda o: o))
        else:
            m = kv_module(model, i)
            res.append((m, lambda o: split_fused(model, o)[1], m, lambda o: split_fused(model, o)[2]))
    return res


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
    fam = family_for(model.config)
    s = summarize(model.config)
    hd = s.head_dim
    blk = decoder_layers(model)[layer]
    if fam.qkv == "separate":
        lin = kv_module(model, layer)
        W = lin.weight.T  # [d_model, n_kv*hd]
        b = lin.bias
        return [(W[:, h * hd:(h + 1) * hd], None if b is None else b[h * hd:(h + 1) * hd]) for h in range(s.n_kv_heads)]
    lin = _get(blk, fam.fused_proj)
    if fam.qkv == "gpt2_conv1d":
        W = lin.weight  # Conv1D stores [in, out]
        b = lin.bias
        d = s.n_heads * hd
        return [(W[:, d + h * hd:d + (h + 1) * hd], b[d + h * hd:d + (h + 1) * hd]) for h in range(s.n_heads)]
    if fam.qkv == "qkv_blocks":
        W, b = lin.weight.T, lin.bias
        d = s.n_heads * hd
        return [(W[:, d + h * hd:d + (h + 1) * hd], None if b is None else b[d + h * hd:d + (h + 1) * hd])
                for h in range(s.n_kv_heads)]
    if fam.qkv == "codegen_mp":  # the key columns (k_columns), then heads of head_dim
        cols = k_columns(model).to(lin.weight.device)
        W = lin.weight.T[:, cols]
        b = None if lin.bias is None else lin.bias[cols]
        return [(W[:, h * hd:(h + 1) * hd], None if b is None else b[h * hd:(h + 1) * hd]) for h in range(s.n_heads)]
    # neox: out index = h*3*hd + [0:hd]=q, [hd:2hd]=k, [2hd:3hd]=v
    W = lin.weight.T
    b = lin.bias
    out = []
    for h in range(s.n_heads):
        lo = h * 3 * hd + hd
        out.append((W[:, lo:lo + hd], None if b is None else b[lo:lo + hd]))
    return out


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
    its input [B, T, n_heads*head_dim] is the attention output (Paper III sec. 4; issue 14 item 5)."""
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

    Source: issue 21 item 4 (the study keeps the last block's output at the final tokens only; the
    ``logits_to_keep`` idea of transformers, one block earlier)."""
    fam = family_for(model.config)
    if fam is GENERIC or fam.module_attention:  # block layouts vary (gates, parallel branches, MoE routing over
        return []  # flattened tokens, residual adds inside the attention module): no cut
    blk = decoder_layers(model)[-1]
    return [_get(blk, path) for path in (fam.o_proj, fam.mlp) if path]


def attention_scaling(config, layer: int) -> float:
    """The factor that multiplies q.k in block ``layer``, as the family applies it to the queries and
    keys that reach the attention function.

    Gemma 2/3: ``query_pre_attn_scalar ** -0.5`` (not head_dim); OPT: 1.0 (its q_proj output is
    scaled by head_dim**-0.5 before the attention function); GPT-2: head_dim**-0.5 if
    ``scale_attn_weights``, divided by (layer + 1) if ``scale_attn_by_inverse_layer_idx``;
    otherwise head_dim**-0.5.
    """
    fam = family_for(config)
    cfg = _text_config(config)
    hd = summarize(config).head_dim
    if fam.name == "gemma3":
        return float(getattr(cfg, "query_pre_attn_scalar", None) or hd) ** -0.5
    if fam.name == "opt":
        return 1.0
    if fam.name == "gpt2":
        s = hd ** -0.5 if getattr(cfg, "scale_attn_weights", True) else 1.0
        return s / (layer + 1) if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) else s
    return hd ** -0.5


def attention_softcap(config) -> float | None:
    """Attention-logit soft-capping constant c (scores -> c * tanh(scores / c)) where the family applies
    it: Gemma 2 (``attn_logit_softcapping``). Gemma 3 configs carry the key but its attention does not
    apply it (transformers >= 4.50), so None there; None for every other family."""
    cfg = _text_config(config)
    if getattr(cfg, "model_type", None) == "gemma2":
        return getattr(cfg, "attn_logit_softcapping", None)
    return None


def attention_window(config, layer: int) -> int | None:
    """The sliding window W of block ``layer`` (a query at position t sees keys t-W+1..t), or None
    for full causal attention (``summarize(config).sliding_layers``; Mistral: every layer,
    Gemma 3: the ``sliding_attention`` layers)."""
    s = summarize(config)
    return s.sliding_window if layer in s.sliding_layers else None


def _own_eager(module):
    import importlib

    return importlib.import_module(type(module).__module__).eager_attention_forward


#: The optional keywords :func:`capture_attention` hands to its ``fn`` (those named in its ``extras``), each read
#: from one attention-function call ``(attention_mask, kwargs)``:
#:
#: - ``sinks``: [n_heads] attention-sink logits, the ``s_aux`` the module passes (a learned per-head logit outside
#:   q.k that joins each query's softmax and carries no value: gpt_oss, flint, granite_swa, mimo_v2_flash's sliding
#:   layers), or None;
#: - ``mask``: the ``attention_mask`` the function receives: [B or 1, 1 or n_heads, T_q, T_k] bool (True = may
#:   attend; sdpa) or additive float (eager: 0 / ``finfo.min``; Doge's learned dynamic bias), as built by
#:   ``transformers.masking_utils`` and by the module itself (DeepSeek Sparse Attention merges its indexer's
#:   non-selected keys in, Doge its dynamic mask); None where the call passes none (sdpa with ``is_causal``), a 2-D
#:   padding mask under flash attention;
#: - ``sparse_indices``: the ``indices`` of the keys a sparse-attention module selects per query, passed instead of
#:   merging them into the mask under other implementations than eager/sdpa (DeepSeek Sparse Attention), or None;
#: - ``probs``: [B, n_heads, T, T] the attention probabilities the module itself computed (``Family.module_attention``
#:   families only, :func:`_module_attention_hooks`), else None: the caller computes them from q and k.
#:
#: A ``module_attention`` family passes None for the others (its probabilities carry its masks and biases).
CALL_EXTRAS: dict[str, Callable] = {
    "sinks": lambda mask, kwargs: kwargs.get("s_aux"),
    "mask": lambda mask, kwargs: mask,
    "sparse_indices": lambda mask, kwargs: kwargs.get("indices"),
    "probs": lambda mask, kwargs: None,
}


def _attention_interfaces(model) -> list:
    """The attention-function registries ``model``'s layers look their function up in: transformers' shared
    ``ALL_ATTENTION_FUNCTIONS``, and a modeling file's own ``AttentionInterface`` instance where it keeps one (Doge's
    ``modeling_doge.ALL_ATTENTION_FUNCTIONS``: its local entries first, then the shared global ones)."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    found = {id(ALL_ATTENTION_FUNCTIONS): ALL_ATTENTION_FUNCTIONS}
    for blk in decoder_layers(model):
        for sub in blk.modules():
            iface = getattr(sys.modules.get(type(sub).__module__), "ALL_ATTENTION_FUNCTIONS", None)
            if isinstance(iface, AttentionInterface):
                found.setdefault(id(iface), iface)
    return list(found.values())


def _ask_for_probabilities(module):
    """A forward pre-hook (``with_kwargs``) that calls ``module`` with ``output_attentions=True``, or None where its
    forward takes no such argument (then it returns its probabilities anyway: MPT)."""
    import inspect

    params = list(inspect.signature(module.forward).parameters)
    if "output_attentions" not in params:
        return None
    at = params.index("output_attentions")

    def pre(mod, args, kwargs):
        if len(args) > at:
            return args[:at] + (True,) + args[at + 1:], kwargs
        kwargs["output_attentions"] = True
        return args, kwargs

    return pre


def _module_attention_hooks(model, fn: Callable, seen: list, *, with_value: bool, extras: tuple[str, ...]) -> list:
    """The hooks of :func:`capture_attention` for a ``Family.module_attention`` model (its attention modules compute
    softmax(q.k) themselves): per attention layer, the query/key/value projections' outputs split into heads, the
    attention output at ``o_proj``'s input (a pre-hook placed first, before any final-token cut) and, when the
    attention module returns, ``fn`` with its probabilities (``probs``: the module output's second element). Returns
    the torch hook handles.

    Raises:
        UnsupportedArchitectureError: (during the forward) an attention module that returned no probabilities."""
    fam = family_for(model.config)
    s = summarize(model.config)
    blocks = decoder_layers(model)
    handles = []

    def heads(x, n):  # [B, T, n*hd] -> [B, n, T, hd]
        return x.reshape(*x.shape[:2], n, -1).transpose(1, 2)

    for i in attention_layers(model):
        blk, st = blocks[i], {}
        if fam.qkv == "separate":
            for name, path, n in (("q", fam.q_proj, s.n_heads), ("k", fam.k_proj, s.n_kv_heads),
                                  ("v", fam.v_proj, s.n_kv_heads)):
                handles.append(_get(blk, path).register_forward_hook(
                    lambda mod, args, out, st=st, name=name, n=n: st.__setitem__(name, heads(out, n))))
        else:
            def split(mod, args, out, st=st):
                q, k, v = split_fused(model, out)
                st["q"], st["k"], st["v"] = heads(q, s.n_heads), heads(k, s.n_kv_heads), heads(v, s.n_kv_heads)
            handles.append(_get(blk, fam.fused_proj).register_forward_hook(split))
        def fire(i, st):  # once both the attention output and the probabilities are there (o_proj may run inside
            if "o" not in st or "probs" not in st:  # the attention module, BLOOM, or after it, GIT)
                return
            seen.append(i)
            extra = {name: st["probs"] if name == "probs" else None for name in extras}  # CALL_EXTRAS
            qkv = (st["q"], st["k"], st["v"]) if with_value else (st["q"], st["k"])
            fn(i, *qkv, st["o"], None, None, **extra)
            st.clear()

        def z(mod, args, i=i, st=st):
            st["o"] = args[0].reshape(*args[0].shape[:2], s.n_heads, -1)
            fire(i, st)

        handles.append(_get(blk, fam.o_proj).register_forward_pre_hook(z, prepend=True))
        att = _get(blk, fam.attention)
        ask = _ask_for_probabilities(att)
        if ask is not None:
            handles.append(att.register_forward_pre_hook(ask, with_kwargs=True))

        def post(mod, args, out, i=i, st=st):
            probs = out[1] if isinstance(out, (tuple, list)) and len(out) > 1 else None
            if probs is None:
                raise UnsupportedArchitectureError(
                    f"{type(mod).__name__} (layer {i}) returned no attention probabilities with output_attentions=True;"
                    " llmgeom reads this family's attention from them (architectures.Family.module_attention)")
            st["probs"] = probs
            fire(i, st)

        handles.append(att.register_forward_hook(post))
    return handles


@contextmanager
def capture_attention(model, fn: Callable, *, with_value: bool = False, before: Callable | None = None,
                      extras: tuple[str, ...] = ()):
    """While active, every call of ``model``'s attention function also calls
    ``fn(layer, query, key, attn_output, scaling, softcap)`` (``with_value``: ``fn(layer, query, key, value,
    attn_output, scaling, softcap)``, ``value`` [B, n_kv_heads, T, value_head_dim]; ``extras``: names of
    ``CALL_EXTRAS``, each also given as that keyword: the call's attention-sink logits, attention mask, sparse
    indices, the module's own probabilities) with the tensors the model uses;
    ``before(layer, query, key, value)``, when given, runs before the attention function and may return a tensor
    of the value's shape that the function then receives instead of ``value`` (an edit of the values where no
    module outputs them: multi-head latent attention, ``extract.capture``):

    - ``query`` [B, n_heads, T, head_dim] and ``key`` [B, n_kv_heads, T, head_dim] after RoPE (and
      q_norm/k_norm, query pre-scaling where the family has them), before GQA/MQA repetition;
    - ``attn_output`` [B, T, n_heads, head_dim]: the attention-weighted sum of values (the input of
      ``o_proj_module`` once the heads are concatenated);
    - ``scaling``/``softcap``: the values the module passes to the attention function (None where it
      passes none: then ``attention_scaling``/``attention_softcap`` apply);
    - the ``extras`` keywords: as ``CALL_EXTRAS`` describes them.

    The model's attention implementation (sdpa, flash attention, eager) runs unchanged; nothing of
    size T x T is materialized here. Implemented by overriding, for the duration, the entry of the
    current implementation in ``transformers``' ``ALL_ATTENTION_FUNCTIONS`` and in a modeling file's own
    registry where it has one (:func:`_attention_interfaces`; process-wide: calls of other models pass through
    unchanged).

    ``Family.module_attention`` families (the module computes softmax(q.k) itself, bypassing the interface: BLOOM,
    MPT, XGLM, GPT-Neo, GPT-1, Falcon, GPT-NeoX-Japanese) are read by hooks on their modules instead
    (:func:`_module_attention_hooks`): ``query``/``key``/``value`` as the projections output them (no RoPE: these
    families have none, or, Falcon and GPT-NeoX-Japanese, apply it inside the module afterwards), ``attn_output``
    the output projection's input, ``scaling``/``softcap`` None, ``probs`` the module's own probabilities (with its
    ALiBi or position bias, local window and mask; the module materializes them anyway, asked with
    ``output_attentions=True`` where it returns them only then, which takes Falcon's eager branch). ``before`` does not
    apply there.

    Raises:
        UnsupportedArchitectureError: a family whose attention does not use the attention interface.
        KeyError: a name in ``extras`` that ``CALL_EXTRAS`` does not have.
        ValueError: ``before`` for a ``module_attention`` family.
    """
    getters = {name: CALL_EXTRAS[name] for name in extras}
    if family_for(model.config).module_attention:
        if before is not None:
            raise ValueError("capture_attention(before=...) edits the values at the attention interface, which "
                             f"{_text_config(model.config).model_type!r} does not call (Family.module_attention)")
        seen_m: list = []
        handles = _module_attention_hooks(model, fn, seen_m, with_value=with_value, extras=tuple(getters))
        try:
            yield seen_m
        finally:
            for h in handles:
                h.remove()
        return

    # every module of block i counts as block i's attention (the module that calls the interface may sit below
    # the one attention_modules names: e.g. an inner self-attention); a second call in one block is seen twice
    layer_of = {id(sub): i for i, blk in enumerate(decoder_layers(model)) for sub in blk.modules()}
    impl = _text_config(model.config)._attn_implementation or "eager"
    seen = []

    def wrap(inner):
        def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
            f = inner if inner is not None else _own_eager(module)
            layer = layer_of.get(id(module))
            if before is not None and layer is not None:
                new = before(layer, query, key, value)
                value = value if new is None else new
            out = f(module, query, key, value, attention_mask, *args, **kwargs)
            if layer is not None:
                seen.append(layer)
                extra = {name: get(attention_mask, kwargs) for name, get in getters.items()}
                if with_value:
                    fn(layer, query, key, value, out[0], kwargs.get("scaling"), kwargs.get("softcap"), **extra)
                else:
                    fn(layer, query, key, out[0], kwargs.get("scaling"), kwargs.get("softcap"), **extra)
            return out
        return wrapper

    saved = []  # (registry, had a local entry, that entry)
    try:
        for iface in _attention_interfaces(model):
            saved.append((iface, impl in iface._local_mapping, iface._local_mapping.get(impl)))
            iface[impl] = wrap(iface.get(impl))
        yield seen
    finally:
        for iface, had_local, prev_local in reversed(saved):
            if had_local:
                iface._local_mapping[impl] = prev_local
            else:
                del iface._local_mapping[impl]
