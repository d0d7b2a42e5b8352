"""Family facts and config-time policy of decoder-only transformers, read from a config alone (torch-free).

What the workflow's config check at DAG time imports (no torch, no model built): the ``Family`` table (what
transformers' seams cannot tell about a family: a fused or Conv1D QKV layout, a pre-scaled query, a soft-cap,
attention computed inside the module: ``Family.module_attention``), with each entry's reason; which model types are
refused and why (:func:`refusal`, ``REFUSED``); which layers have attention (:func:`config_attention_layers`: hybrid
and state-space models); the shape facts of a model (:func:`summarize`, :class:`ArchSummary`: heads, GQA/MQA,
head_dim, sliding windows, multi-head latent attention's :class:`LatentDims`); the attention scaling, soft-cap and
window of a layer; the attention implementation a family is loaded with.

Any other decoder-only causal LM is read through transformers' own seams (the *generic* path, :data:`GENERIC`):
``models.architectures`` finds its parts on the loaded model, ``extract.hooks`` reads its attention at the
attention interface. Multi-head latent attention (DeepSeek-V2/V3 MLA, ``kv_lora_rank``) is read on the generic path
too; its keys have no W_K (:func:`no_key_projection`: key orthogonality does not apply). Masks that carry more than
causality, padding and a window (DeepSeek Sparse Attention's indexer selection, Doge's dynamic mask) are read as the
attention function receives them. ``tests/unit/models/test_model_types.py`` builds a tiny random model of every installed
causal-LM type, checks the capture against the model's own outputs and writes the coverage table
``docs/models.md``.

Source: DESIGN.md section 1 (one home for family knowledge).
"""

from __future__ import annotations

from dataclasses import dataclass


class UnsupportedArchitectureError(ValueError):
    """A model family that llmgeom.models.families does not describe."""


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
    cfg = text_config(config)
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
    attention interface (BLOOM, MPT, XGLM, GPT-Neo, GPT-1, Falcon, GPT-NeoX-Japanese): ``extract.hooks``
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
    stream (so an output for fewer positions broadcasts there; ``architectures.final_token_modules``), else None.
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
           reason="the studies' own families: explicit paths keep the last block's final-token cut"),
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

#: The generic path: every part found on the model itself (``architectures.parts``); ``qkv`` "separate" (k_proj/v_proj
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
    return getattr(text_config(config), "model_type", None) in FP16_OVERFLOW_MODEL_TYPES or \
        getattr(config, "model_type", None) in FP16_OVERFLOW_MODEL_TYPES


def supported_model_types() -> list[str]:
    """Sorted list of the ``config.model_type`` values with a ``Family`` entry (the generic path reads any
    other type that :func:`refusal` does not refuse)."""
    return sorted(_BY_TYPE)



def text_config(config):
    """The text config of ``config``: ``get_text_config()`` where it has one (multimodal wrappers), else itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def family_for(config) -> Family:
    """Return the ``Family`` for a transformers config: its entry, else :data:`GENERIC`.

    Raises:
        UnsupportedArchitectureError: a model type that cannot be read (:func:`refusal`), naming the
            model_type and why.
    """
    cfg = text_config(config)
    mt = getattr(cfg, "model_type", None)
    why = refusal(config)
    if why:
        raise UnsupportedArchitectureError(
            f"model_type {mt!r} is not supported by llmgeom.models.families: {why}. Every causal-LM type and its "
            f"verdict: docs/models.md; Family entries (supported: {', '.join(supported_model_types())}), and the "
            "generic path's types there. To read it, add a Family entry in src/llmgeom/models/families.py "
            "(and its tiny-model settings in tests/support/model_types.py)")
    return _BY_TYPE.get(mt, GENERIC)


def attention_implementation(config, requested: str) -> str:
    """The attention implementation to load a model of ``config`` with: ``requested`` (the workflow's sdpa, or flash
    attention on a GPU), or "eager" for a model without attention layers (Mamba, Mamba-2, Falcon-Mamba:
    :func:`config_attention_layers` is empty; transformers refuses sdpa there and no attention function runs) and
    for a family whose modules compute the attention themselves (``Family.module_attention``: the implementation
    does not change their softmax; BLOOM refuses sdpa; Falcon returns its probabilities on its eager branch only)."""
    if not config_attention_layers(config):
        return "eager"
    fam = _BY_TYPE.get(getattr(text_config(config), "model_type", None))
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
#: tests/unit/models/test_model_types.py, found; the rules of :func:`refusal` cover whole classes of types).
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
#: eager/sdpa, read there: ``extract.hooks.CALL_EXTRAS`` ``mask``).
_ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "attention", "chunked_attention",
                                    "global", "local", "sliding", "full", "indexed_attention"})
#: Layer kinds with an attention module beside an attention-free mixer in the same block (Falcon-H1: attention
#: and Mamba-2 in parallel; Zamba: a Mamba block with a shared attention block): attention layers, found by
#: their attention module (``architectures.parts``).
_HYBRID_LAYER_TYPES = frozenset({"hybrid"})
#: Layer kinds without attention: state-space (Mamba) and linear-attention / gated-delta mixers
#: (``linear_attention``, transformers' name for all of them), short convolutions (LFM2 ``conv``), blocks with
#: only an MLP or MoE (Nemotron-H ``mlp`` / ``moe``). Their layers carry the residual stream only.
_ATTENTION_FREE_LAYER_TYPES = frozenset({"linear_attention", "mamba", "mamba2", "ssm", "conv", "mlp", "moe",
                                         "recurrent"})


def layer_kinds(cfg) -> list | None:
    """``config.layer_types`` as a list (one kind per decoder layer), or None when the config has none."""
    kinds = getattr(cfg, "layer_types", None)
    return list(kinds) if kinds else None


def _ssm_only(cfg) -> bool:
    """A config without layer kinds and without any attention-head count (Mamba checkpoints' config.json,
    RWKV): a recurrent / state-space model without attention layers."""
    return layer_kinds(cfg) is None and not any(getattr(cfg, k, None) for k in ("num_attention_heads", "n_head",
                                                                                  "n_heads", "num_heads"))


def config_attention_layers(config) -> tuple[int, ...]:
    """0-based indices of the decoder layers that have attention, read from the config alone (no weights).

    ``config.layer_types`` decides where a config has it: the attention kinds and the hybrid kinds
    (``_ATTENTION_LAYER_TYPES``, ``_HYBRID_LAYER_TYPES``) have attention, the attention-free kinds
    (``_ATTENTION_FREE_LAYER_TYPES``: Mamba / linear attention, convolution, MLP-only blocks) have none; without
    ``layer_types`` every layer has attention, except in a config without any attention-head count (Mamba's
    config.json, RWKV: none). A loaded generic model's layers are also checked against its structure
    (``architectures.parts``); ``architectures.attention_layers`` is the model's.

    Raises:
        UnsupportedArchitectureError: a layer kind none of these sets knows (:func:`refusal` names it).
    """
    cfg = text_config(config)
    n = int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None) or 0)
    kinds = layer_kinds(cfg)
    if kinds is None:
        return () if _ssm_only(cfg) else tuple(range(n))
    unknown = sorted(set(kinds) - _ATTENTION_LAYER_TYPES - _HYBRID_LAYER_TYPES - _ATTENTION_FREE_LAYER_TYPES)
    if unknown:
        raise UnsupportedArchitectureError(f"model_type {getattr(cfg, 'model_type', None)!r}: layer kinds "
                                           f"{', '.join(unknown)} in config.layer_types are not known to "
                                           "llmgeom.models.families (attention or attention-free?)")
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
    latent attention, hybrid and state-space models are read: the residual-stream and logit measures
    on every layer, the attention measures on :func:`config_attention_layers`; so are masks that carry more than
    causality, padding and a window (DeepSeek Sparse Attention's ``indexed_attention`` layers, whose indexer
    keeps index_topk keys per query; Doge's dynamic mask): the entropy reads the mask the attention function
    receives (``extract.hooks.CALL_EXTRAS`` ``mask``).

    Returns:
        the reason in words, or None.
    """
    cfg = text_config(config)
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
    unknown = sorted(set(layer_kinds(cfg) or ()) - _ATTENTION_LAYER_TYPES - _HYBRID_LAYER_TYPES
                     - _ATTENTION_FREE_LAYER_TYPES)
    if unknown:
        return (f"layer kinds llmgeom.models.families does not know ({', '.join(unknown)} in config.layer_types): "
                "whether and how such a layer attends is not known, so its attention datasets cannot be read")
    streams = max(int(getattr(cfg, k, None) or 1) for k in ("hc_mult", "hc_count"))
    if streams > 1:
        return (f"hyper-connections ({streams} parallel residual streams, hc_mult / hc_count, mixed by learned "
                "connections around every block): between blocks each token carries [streams, d_model], not the "
                "one d_model residual vector per layer of the HDF5 contract, and no single stream is the input of the "
                "final norm")
    return None


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
    cfg = text_config(config)
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


def attention_scaling(config, layer: int) -> float:
    """The factor that multiplies q.k in block ``layer``, as the family applies it to the queries and
    keys that reach the attention function.

    Gemma 2/3: ``query_pre_attn_scalar ** -0.5`` (not head_dim); OPT: 1.0 (its q_proj output is
    scaled by head_dim**-0.5 before the attention function); GPT-2: head_dim**-0.5 if
    ``scale_attn_weights``, divided by (layer + 1) if ``scale_attn_by_inverse_layer_idx``;
    otherwise head_dim**-0.5.
    """
    fam = family_for(config)
    cfg = text_config(config)
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
    cfg = text_config(config)
    if getattr(cfg, "model_type", None) == "gemma2":
        return getattr(cfg, "attn_logit_softcapping", None)
    return None


def attention_window(config, layer: int) -> int | None:
    """The sliding window W of block ``layer`` (a query at position t sees keys t-W+1..t), or None
    for full causal attention (``summarize(config).sliding_layers``; Mistral: every layer,
    Gemma 3: the ``sliding_attention`` layers)."""
    s = summarize(config)
    return s.sliding_window if layer in s.sliding_layers else None
