"""One capture API: named hook points on any supported decoder-only model (TransformerLens style).

Every reading or editing of a model's internals during a forward pass goes through :func:`hooked`, the
one place where torch hooks are registered (extraction, interventions, the wind tunnel's extraction).
A hook is ``fn(activation, point) -> Tensor | None`` on a named point; returning a tensor on an editable
point replaces the activation for the rest of the model (an edit, e.g. ``interventions.edits``).
Family knowledge (where the blocks, projections and attention live; fused QKV layouts) stays in
``models.architectures``.

Named points (``l`` = 0-based block index; shapes for a batch of B prompts padded to T tokens):

=================================  =====================================================  ========
point                              activation                                             editable
=================================  =====================================================  ========
``blocks.{l}.hook_resid_pre``      residual stream entering block l [B, T, d_model]       yes
                                   (l = 0: the embeddings)
``blocks.{l}.hook_resid_post``     output of block l [B, T, d_model] (pre final norm)     yes
``blocks.{l}.attn.hook_k``         keys [B, T, n_kv_heads*head_dim], pre-RoPE             yes
``blocks.{l}.attn.hook_v``         values [B, T, n_kv_heads*value_head_dim]               yes
``blocks.{l}.attn.hook_z``         attention output [B, T, n_heads*value_head_dim]        no
                                   (o_proj in)
``blocks.{l}.attn.hook_qk``        :class:`AttentionCall`: post-RoPE queries and keys as   no
                                   the attention function receives them (entropy)
``ln_final.hook_normalized``       final normed state [B, T, d_unembed]                   no
``hook_logits``                    float32 logits at each prompt's final token [B, V]     no
=================================  =====================================================  ========

With ``final_token_only`` (:func:`hooked`, :func:`run`; the extraction of prompt sets) the last block's
attention output projection and MLP run at each prompt's final token only (``architectures.final_token_modules``):
``blocks.{L-1}.hook_resid_post`` then holds the model's values only at ``batch.last`` (the other positions are
not the model's) and ``ln_final.hook_normalized`` / :class:`Output` ``hidden`` are [B, 1, d_unembed], the final
tokens. Every other point, and the keys and values of the last block, are those of the full pass.

Hybrid and state-space models (issue 29): the ``attn.*`` points exist only on the layers that have attention
(``architectures.attention_layers``); the residual-stream and global points exist on every layer.

Hooks of one point run in the order given; a hook sees the edits of the hooks before it. Hooks on
``hook_z`` / ``hook_qk`` go through ``architectures.capture_attention`` (any attention implementation,
no [B, H, T, T] weights).

Multi-head latent attention (DeepSeek-V2/V3 MLA, ``architectures.latent_dims``; ``head_dim`` = qk_nope + qk_rope,
n_kv_heads = n_heads, values and attention output of ``value_head_dim`` = v_head_dim per head): ``hook_v`` and
``hook_k`` are read at the attention interface too, because no module outputs the per-head values or keys:
``hook_v`` = the values the attention function receives (``kv_b_proj``'s decompressed v_h, heads concatenated;
editable: an edited tensor is what the attention function then receives); ``hook_k`` (read-only there) = the keys
before RoPE, per head [k_nope_h | k_rope]: k_nope_h as the attention function
receives it (RoPE does not touch it) and k_rope the pre-RoPE part of ``kv_a_proj_with_mqa``'s output (its columns
kv_lora_rank:, shared by every head; in the projection's own coordinate order, before ``rope_interleave``'s
permutation). Families without latent attention take no extra work.

Source: DESIGN.md sections 2 and 4 (one capture API); issue 17 item 2; TransformerLens ``HookPoint``.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from llmgeom.models import architectures as arch

EDITABLE = ("hook_resid_pre", "hook_resid_post", "attn.hook_k", "attn.hook_v")
ATTENTION_POINTS = ("attn.hook_z", "attn.hook_qk")
GLOBAL_POINTS = ("ln_final.hook_normalized", "hook_logits")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(hook_resid_pre|hook_resid_post|attn\.hook_k|attn\.hook_v|attn\.hook_z|attn\.hook_qk)$")

Hook = Callable[[Any, "HookPoint"], "torch.Tensor | None"]


def point_name(kind: str, layer: int | None = None) -> str:
    """The name of a hook point: ``point_name("attn.hook_v", 3) == "blocks.3.attn.hook_v"``; global points
    (``ln_final.hook_normalized``, ``hook_logits``) take no layer."""
    return kind if layer is None else f"blocks.{int(layer)}.{kind}"


@dataclass
class Batch:
    """A right-padded batch: ``ids``, ``mask``, ``pos`` [B, T] long on the model's device, ``last`` [B]
    (index of each prompt's final real token) and ``rows`` = arange(B)."""

    ids: torch.Tensor
    mask: torch.Tensor
    pos: torch.Tensor
    last: torch.Tensor
    rows: torch.Tensor


@dataclass
class AttentionCall:
    """What one attention function call receives: ``query`` [B, n_heads, T, head_dim], ``key``
    [B, n_kv_heads, T, head_dim] (post-RoPE), ``scaling``/``softcap`` (None where the module passes
    none: then ``architectures.attention_scaling`` / ``attention_softcap`` apply), ``sinks`` [n_heads]
    attention-sink logits (the call's ``s_aux``: a learned per-head logit outside q.k that joins the softmax
    and carries no value), None without sinks (``extract.attention.last_query_attention``), ``mask`` the
    ``attention_mask`` the call receives: [B or 1, 1 or n_heads, T_q, T_k] bool (True = may attend) or additive
    float (logits: 0 / ``finfo.min``, or a learned bias), with what the module merged in beyond
    ``transformers.masking_utils``' causal, padding and window masks (DeepSeek Sparse Attention's indexer, Doge's
    dynamic mask), None where the call passes none (``architectures.CALL_EXTRAS``;
    ``extract.attention.final_query_mask_row``). ``probs``
    [B, n_heads, T, T]: the attention probabilities the attention module computed itself, for the families that
    bypass the attention interface (``architectures.Family.module_attention``: their query and key are then as
    projected, before any RoPE inside the module), else None: the final query's row is computed from query and key."""

    query: torch.Tensor
    key: torch.Tensor
    scaling: float | None
    softcap: float | None
    sinks: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    probs: torch.Tensor | None = None


@dataclass
class HookPoint:
    """The point a hook runs on: ``name``, ``layer`` (None for global points), the :class:`Batch` (None
    outside :func:`run`) and ``raw``, the module's own output (tensor or tuple) where there is one, set only while the
    hooks of the point run (a hook that keeps it must keep its own reference)."""

    name: str
    layer: int | None
    batch: Batch | None = None
    raw: Any = field(default=None, repr=False)


def first_tensor(x):
    """The hidden-state tensor of a module output: the output itself (recent transformers) or its first
    element (tuple outputs of older decoder layers; DESIGN.md sec. 4)."""
    return x[0] if isinstance(x, (tuple, list)) else x


def _replace_first(out, new):
    if isinstance(out, list):
        return [new, *out[1:]]
    if isinstance(out, tuple):
        return (new,) + tuple(out[1:])
    return new


def pad_batch(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad token id lists: (input_ids [B,T] long, attention_mask [B,T] long, position_ids [B,T] long)."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, :len(s)] = 1
    pos = torch.arange(T).unsqueeze(0).expand(len(seqs), T).contiguous()
    return ids.to(device), mask.to(device), pos.to(device)


def last_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each row [B], from the mask (any padding side)."""
    T = attention_mask.shape[1]
    ar = torch.arange(T, device=attention_mask.device)
    return (attention_mask.bool() * (ar + 1)).argmax(dim=1)


def make_batch(model, seqs: list[list[int]], pad_id: int = 0) -> Batch:
    """Right-pad ``seqs`` (token ids, no padding) for ``model``: explicit position ids, so padding
    cannot shift them; ``last`` from the mask. Padding never changes a stored value
    (tests/test_extraction.py)."""
    dev = next(model.parameters()).device
    ids, mask, pos = pad_batch(seqs, pad_id, dev)
    return Batch(ids, mask, pos, last_positions(mask), torch.arange(len(seqs), device=dev))


class Float32Head:
    """The unembedding in float32 (plus Cohere/Granite logit scaling and Gemma soft-capping), applied in chunks of ``chunk`` rows:
    ``head(h [N, d_unembed]) -> logits [N, vocab]`` float32.

    The float32 weight is the model's own tensor when the model runs in float32 (``Tensor.float`` copies
    nothing), else one copy per head (one per ``extract_to_hdf5`` call), never one per batch.
    ``out`` (a float32 [N, vocab] tensor on the weight's device, e.g. a buffer reused across the chunks of
    the per-position statistics) receives the logits instead of a new tensor; the values are the same.
    """

    def __init__(self, model, chunk: int = 256):
        W, b = arch.unembedding(model)
        self.W = W.detach().float()
        self.b = None if b is None else b.detach().float()
        self.cap = arch.logit_softcap(model)
        self.mult = arch.logit_multiplier(model)  # Cohere / Granite logit scaling (None: 1)
        self.chunk = chunk

    def __call__(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is not None:
            for i in range(0, h.shape[0], self.chunk):
                x = h[i:i + self.chunk].float().to(self.W.device)
                z = out[i:i + x.shape[0]]
                if self.b is None:  # the kernels of F.linear (mm / addmm), written into ``out``
                    torch.mm(x, self.W.t(), out=z)
                else:
                    torch.addmm(self.b, x, self.W.t(), out=z)
                if self.mult is not None:
                    z.mul_(self.mult)
                if self.cap:
                    z.div_(self.cap).tanh_().mul_(self.cap)
            return out
        parts = []
        for i in range(0, h.shape[0], self.chunk):
            z = F.linear(h[i:i + self.chunk].float().to(self.W.device), self.W, self.b)
            if self.mult is not None:
                z = z * self.mult
            if self.cap:
                z = torch.tanh(z / self.cap) * self.cap
            parts.append(z)
        if not parts:
            return h.new_zeros((0, self.W.shape[0]), dtype=torch.float32)
        return parts[0] if len(parts) == 1 else torch.cat(parts)  # one chunk: no copy


def candidate_logprobs(logits: torch.Tensor, candidates) -> torch.Tensor:
    """Log-probabilities (nats, over the full vocabulary) of candidate tokens.

    Args:
        logits: [B, V] float32 next-token logits at the final position.
        candidates: [B, C] token ids (nested lists or a tensor), the same C for every prompt.

    Returns:
        [B, C] float32 log-probabilities.

    Source: Paper III sec. 4.3 (SULA label probabilities).
    """
    cand = torch.as_tensor(candidates, dtype=torch.long, device=logits.device).reshape(logits.shape[0], -1)
    return torch.log_softmax(logits, -1).gather(1, cand)


def _as_list(h) -> list:
    return list(h) if isinstance(h, (list, tuple)) else [h]


def _parse(name: str, n_layers: int) -> tuple[str, int | None]:
    if name in GLOBAL_POINTS:
        return name, None
    m = _BLOCK.match(name)
    if not m:
        raise KeyError(f"unknown hook point {name!r}; valid: blocks.<l>.{{{', '.join(EDITABLE + ATTENTION_POINTS)}}}, "
                       f"{', '.join(GLOBAL_POINTS)} (llmgeom.extract.capture)")
    layer = int(m.group(1))
    if not 0 <= layer < n_layers:
        raise IndexError(f"hook point {name!r}: layer {layer} outside the model's {n_layers} layers")
    return m.group(2), layer


def _module_hook(model, kind: str, layer: int, fns: list, state: dict, blocks: list, fused: bool):
    """(module, torch hook, is_pre_hook): a forward hook (pre-hook for resid_pre) that runs ``fns`` on the
    named activation; ``blocks`` = ``architectures.decoder_layers(model)``, ``fused``: a fused QKV layout."""
    pt = HookPoint(point_name(kind, layer), layer)

    def run_fns(act):
        pt.batch = state.get("batch")
        changed = None
        try:
            for fn in fns:
                new = fn(act, pt)
                if new is not None:
                    if kind not in EDITABLE:
                        raise ValueError(f"hook point {pt.name!r} is read-only; a hook returned a tensor")
                    act = changed = new
        finally:
            pt.raw = None  # the module output lives only while the hooks run (else every hooked layer's stays to the end)
        return changed

    if kind == "hook_resid_pre":
        def pre(mod, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            pt.raw = h
            new = run_fns(h)
            if new is None:
                return None
            if args:
                return (new, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": new}
        return blocks[layer], pre, True

    def post(mod, args, out):
        pt.raw = out
        o = first_tensor(out)
        if kind == "hook_resid_post" or not fused:
            new = run_fns(o)
            return None if new is None else _replace_first(out, new)
        idx = 1 if kind == "attn.hook_k" else 2
        new = run_fns(arch.split_fused(model, o)[idx])
        if new is None:
            return None
        cols = (arch.k_columns(model) if idx == 1 else arch.v_columns(model)).to(o.device)
        o2 = o.clone()
        o2[..., cols] = new.to(o2.dtype)
        return _replace_first(out, o2)

    if kind == "hook_resid_post":
        mod = blocks[layer]
    elif kind == "attn.hook_k":
        mod = arch.kv_module(model, layer)
    else:
        mod = arch.v_module(model, layer)
    return mod, post, False


def _keep_k_rope(store: dict, layer: int, lat):
    """Forward hook on ``kv_a_proj_with_mqa`` (multi-head latent attention, :class:`architectures.LatentDims`):
    keeps its pre-RoPE k_rope columns [B, T, qk_rope_head_dim] (output columns kv_lora_rank:) in ``store[layer]``
    until the layer's attention call reads them."""
    r = lat.kv_lora_rank

    def keep(mod, args, out):
        store[layer] = first_tensor(out)[..., r:r + lat.qk_rope_head_dim]
    return keep


def final_rows(t: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Each prompt's final-token row of a [B, T, F] activation: [B, F], on ``t``'s device and in its dtype (the
    model's; :meth:`RowIndex.take` gives float32 copies for storing)."""
    dev = t.device
    return t[batch.rows.to(dev), batch.last.to(dev)]


def _final_token_cut(state: dict):
    """Forward pre-hook for the modules of ``architectures.final_token_modules``: while :func:`run` has set a
    batch, the module's input [B, T, F] becomes [B, 1, F], each prompt's row at ``batch.last``; outside
    :func:`run`, or for an input passed by keyword, nothing changes."""
    def cut(mod, args):
        b = state.get("batch")
        if b is None or not args:
            return None
        return (final_rows(args[0], b).unsqueeze(1), *args[1:])
    return cut


@contextlib.contextmanager
def hooked(model, hooks: Mapping[str, Hook | Sequence[Hook]], *, final_token_only: bool = False):
    """Context manager: run ``hooks`` (point name -> hook or list of hooks) during ``model``'s forward
    passes. The one hook-registration site of the package; every handle is removed on exit, also when
    the body raises.

    ``final_token_only``: in each :func:`run` the last block's attention output projection and MLP see
    each prompt's final token only (module docstring); for passes whose outputs are read at the final
    tokens only (prompt sets; not corpus sets, whose sampled positions need the whole last block). The values
    there are the full pass's up to float rounding (a matrix product over B rows instead of B*T takes
    other kernels: ~1e-6 relative in float32).

    Yields:
        a dict: ``"handles"`` (the torch hook handles: one per module point, and the final-token cut's), ``"batch"`` (set by
        :func:`run`), ``"attention_seen"`` (layers whose attention went through the attention
        interface in the current :func:`run`, when ``hook_z``/``hook_qk`` points are hooked), ``"model"``,
        ``"active"`` (False once the context has exited), ``"final_token_only"``.

    Raises:
        KeyError: an unknown point name, or an ``attn.*`` point of a layer without attention (hybrid and
            state-space models: ``architectures.attention_layers``). IndexError: a layer outside the model.
    """
    blocks = arch.decoder_layers(model)
    fused = arch.family_for(model.config).qkv != "separate"
    lat = arch.latent_dims(model.config)  # multi-head latent attention: keys and values at the interface
    parsed = [(name, *_parse(name, len(blocks)), _as_list(fns)) for name, fns in hooks.items()]
    attn_kinds = [(name, layer) for name, kind, layer, _ in parsed if kind.startswith("attn.")]
    if attn_kinds:
        with_attention = set(arch.attention_layers(model))
        bad = [name for name, layer in attn_kinds if layer not in with_attention]
        if bad:
            raise KeyError(f"hook points {bad}: these layers have no attention (attention layers of this model: "
                           f"{sorted(with_attention)}; architectures.attention_layers)")
    state: dict = {"handles": [], "batch": None, "attention_seen": [], "global": {}, "model": model, "active": True,
                   "final_token_only": bool(final_token_only)}
    attn: dict[int, dict[str, list]] = {}
    k_rope: dict[int, torch.Tensor] = {}  # latent attention: layer -> pre-RoPE k_rope [B, T, qk_rope_head_dim]
    try:
        if final_token_only:
            cut = _final_token_cut(state)
            state["handles"] += [m.register_forward_pre_hook(cut) for m in arch.final_token_modules(model)]
        for name, kind, layer, fns in parsed:
            if kind in GLOBAL_POINTS:
                state["global"][kind] = fns
            elif kind in ATTENTION_POINTS or (lat is not None and kind in ("attn.hook_k", "attn.hook_v")):
                attn.setdefault(layer, {})[kind] = fns
                if lat is not None and kind == "attn.hook_k":  # the pre-RoPE k_rope columns of kv_a_proj_with_mqa
                    state["handles"].append(arch.kv_module(model, layer).register_forward_hook(
                        _keep_k_rope(k_rope, layer, lat)))
            else:
                mod, fn, pre = _module_hook(model, kind, layer, fns, state, blocks, fused)
                state["handles"].append(mod.register_forward_pre_hook(fn, with_kwargs=True) if pre
                                        else mod.register_forward_hook(fn))
        with contextlib.ExitStack() as st:
            if attn:
                kinds = ATTENTION_POINTS + (("attn.hook_k", "attn.hook_v") if lat is not None else ())
                points = {l: {kd: HookPoint(point_name(kd, l), l) for kd in kinds} for l in attn}
                # differential attention (Family.z_from_o_proj): hook_z is o_proj's input, read by a pre-hook placed
                # before the final-token cut's (the attention function's outputs are the two halves' A V)
                z_at_o_proj = arch.family_for(model.config).z_from_o_proj
                for l in (attn if z_at_o_proj else ()):
                    def z_pre(mod, args, l=l):
                        pt = points[l]["attn.hook_z"]
                        pt.batch = state["batch"]
                        for fn in attn[l].get("attn.hook_z", ()):
                            fn(args[0], pt)
                    state["handles"].append(arch.o_proj_module(model, l).register_forward_pre_hook(z_pre, prepend=True))

                def on_attention(layer, q, k, o, scaling, softcap, sinks=None, mask=None, sparse_indices=None,
                                 probs=None):
                    if layer not in attn:
                        return
                    pts, fns = points[layer], attn[layer]
                    pts["attn.hook_z"].batch = pts["attn.hook_qk"].batch = state["batch"]
                    for fn in () if z_at_o_proj else fns.get("attn.hook_z", ()):
                        fn(o.reshape(*o.shape[:2], -1), pts["attn.hook_z"])  # [B, T, H*hd]: the o_proj input
                    if fns.get("attn.hook_qk") and sparse_indices is not None:
                        raise arch.UnsupportedArchitectureError(
                            f"layer {layer}: the attention call selects its keys by sparse indices outside the "
                            f"attention mask (implementation {model.config._attn_implementation!r}), so the keys "
                            "each query sees cannot be read at hook_qk; load it with attn_implementation='sdpa'")
                    for fn in fns.get("attn.hook_qk", ()):
                        fn(AttentionCall(q, k, scaling, softcap, sinks, mask, probs), pts["attn.hook_qk"])

                def latent_kv(layer, q, k, v):  # latent attention: the keys and values before the attention call
                    fns = attn.get(layer, {})
                    if "attn.hook_k" not in fns and "attn.hook_v" not in fns:
                        return None
                    B, H, T = v.shape[:3]
                    pts = points[layer]
                    if "attn.hook_k" in fns:  # [k_nope_h | pre-RoPE k_rope] per head -> [B, T, H*qk_hd]
                        pt = pts["attn.hook_k"]
                        pt.batch = state["batch"]
                        kr = k_rope.pop(layer).unsqueeze(1).expand(-1, H, -1, -1).to(k.dtype)
                        pre = torch.cat([k[..., :lat.qk_nope_head_dim], kr], dim=-1).transpose(1, 2).reshape(B, T, -1)
                        for fn in fns["attn.hook_k"]:
                            if fn(pre, pt) is not None:
                                raise ValueError(f"hook point {pt.name!r} is read-only under multi-head latent "
                                                 "attention (its keys exist only inside the attention module); a hook "
                                                 "returned a tensor")
                    if "attn.hook_v" not in fns:
                        return None
                    pt = pts["attn.hook_v"]
                    pt.batch = state["batch"]
                    act = v.transpose(1, 2).reshape(B, T, -1)  # [B, H, T, v_hd] -> [B, T, H*v_hd]
                    changed = None
                    for fn in fns["attn.hook_v"]:
                        new = fn(act, pt)
                        if new is not None:
                            act = changed = new
                    return None if changed is None else changed.reshape(B, T, H, -1).transpose(1, 2).to(v.dtype)

                state["attention_seen"] = st.enter_context(arch.capture_attention(
                    model, on_attention, before=latent_kv if lat is not None else None,
                    extras=("sinks", "mask", "sparse_indices", "probs")))
                state["attention_layers"] = sorted(attn)
            yield state
    finally:
        state["active"] = False
        for h in state["handles"]:
            h.remove()
        state["handles"].clear()


@dataclass
class Output:
    """What :func:`run` returns: ``hidden`` the final normed state [B, T, d_unembed], the unembedding's input (after
    ``architectures.head_transform`` where a family has one; model dtype; [B, 1,
    d_unembed], the final tokens, with ``final_token_only``), ``logits`` float32 [B, V] at each prompt's final
    token (None when not asked), ``batch``."""

    hidden: torch.Tensor
    logits: torch.Tensor | None
    batch: Batch


def run(model, batch: Batch, hooks: Mapping[str, Hook | Sequence[Hook]] | None = None, *,
        head: Float32Head | None = None, logits: bool = True, model_name: str | None = None,
        session: dict | None = None, final_token_only: bool = False) -> Output:
    """One forward pass of the decoder stack (no LM head on all positions, no KV cache) with ``hooks``.

    The final normed state comes from the base model's output; logits are computed in float32 only at
    the final positions (``head``, default :class:`Float32Head`). ``session``: the state of an active
    :func:`hooked` context on ``model`` (hooks registered once for many batches; ``hooks`` must then be None,
    and ``final_token_only`` is the session's). ``final_token_only``: the last block runs its attention output
    projection and MLP at the final tokens only, and ``hidden`` is [B, 1, d_unembed] (:func:`hooked`).

    Raises:
        UnsupportedArchitectureError: ``hook_z``/``hook_qk`` were hooked but a layer's attention did not
            go through transformers' attention interface (names the fix: sdpa).
        ValueError: both ``hooks`` and ``session`` given, or ``session`` inactive or of another model.
    """
    if session is not None and hooks:
        raise ValueError("capture.run: pass hooks or an active hooked() session, not both")
    if session is not None and not (session.get("active") and session.get("model") is model):
        raise ValueError("capture.run: session must be the state of an active hooked() context on this model "
                         "(its with-block has ended, or it hooks another model)")
    if session is not None and final_token_only and not session.get("final_token_only"):
        raise ValueError("capture.run: final_token_only=True with a session registered without it; pass it to "
                         "hooked(..., final_token_only=True)")
    ctx = (contextlib.nullcontext(session) if session is not None
           else hooked(model, hooks or {}, final_token_only=final_token_only))
    with torch.inference_mode(), ctx as st:
        st["batch"] = batch
        st["attention_seen"].clear()  # this pass's layers (a session's list is reused for every batch)
        try:
            out = arch.base_model(model)(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.pos,
                                         use_cache=False)
        finally:  # a later forward of the session outside run sees no batch (the final-token cut stays off)
            st["batch"] = None
        want = st.get("attention_layers")
        if want is not None and not set(want) <= set(st["attention_seen"]):
            missing = sorted(set(want) - set(st["attention_seen"]))
            mname = model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
            raise arch.UnsupportedArchitectureError(
                f"model {mname!r}: the attention of layers {missing} did not go through transformers' attention "
                f"interface (implementation {model.config._attn_implementation!r}), so queries, keys and the "
                "attention output cannot be read; load it with attn_implementation='sdpa'")
        hT = out.last_hidden_state
        if st.get("final_token_only"):  # only the final tokens are the model's: keep those
            hT = final_rows(hT, batch).unsqueeze(1)
        ht = arch.head_transform(model)
        if ht is not None:  # a prediction head between the final norm and the unembedding (ModernBERT-decoder)
            hT = ht(hT)
        g = st["global"]
        for fn in g.get("ln_final.hook_normalized", ()):
            fn(hT, HookPoint("ln_final.hook_normalized", None, batch))
        z = None
        if logits:
            z = (head or Float32Head(model))(hT[:, 0] if st.get("final_token_only") else final_rows(hT, batch))
            for fn in g.get("hook_logits", ()):
                fn(z, HookPoint("hook_logits", None, batch))
    return Output(hT, z, batch)


class RowIndex:
    """Rows (prompt ``bi[i]``, position ``ti[i]``) of [B, T, F] activations, as flat indices into the [B*T, F]
    view, built once per device (with ``device_map="auto"`` the blocks of a large model sit on different GPUs)
    and reused by every hook of a batch (one gather per call, no index arithmetic per layer).

    Args:
        bi, ti: [n] long tensors (any device); T: the batch's padded length."""

    def __init__(self, bi: torch.Tensor, ti: torch.Tensor, T: int):
        self.bi, self.ti, self.T = bi, ti, int(T)
        self._flat: dict = {}

    def flat(self, device) -> torch.Tensor:
        """[n] long on ``device``: ``bi * T + ti``."""
        f = self._flat.get(device)
        if f is None:
            f = self._flat[device] = self.bi.to(device) * self.T + self.ti.to(device)
        return f

    def take(self, t: torch.Tensor, dev, out: torch.Tensor | None = None) -> torch.Tensor:
        """``t[bi, ti]`` of a [B, T, F] ``t``, float32 on ``dev`` ([n, F]); ``out``: a float32 [n, F] buffer on
        ``dev`` that receives them (no temporary where ``t`` is float32 on ``dev``), returned. The same values
        as advanced indexing (a gather).

        Raises:
            ValueError: ``t`` is not [B, T, F] with this index's T."""
        if t.dim() != 3 or t.shape[1] != self.T:
            raise ValueError(f"RowIndex built for [B, T={self.T}, F] activations, got shape {tuple(t.shape)}")
        x = t.reshape(-1, t.shape[-1])
        flat = self.flat(t.device)
        if out is None:
            return x.index_select(0, flat).float().to(dev)
        if x.dtype == out.dtype and x.device == out.device:
            return torch.index_select(x, 0, flat, out=out)
        return out.copy_(x.index_select(0, flat))


def rows_at(t: torch.Tensor, bi: torch.Tensor, ti: torch.Tensor, dev, out: torch.Tensor | None = None) -> torch.Tensor:
    """``t[bi, ti]`` in float32 on ``dev`` (one row per (prompt, position) pair) of a [B, T, F] ``t``; the index
    tensors follow ``t`` and the rows come back to ``dev`` (no-ops on one device). ``out``: a float32 [n, F]
    buffer on ``dev`` that receives the rows, returned. :meth:`RowIndex.take` for one set of rows read from many
    activations."""
    return RowIndex(bi, ti, t.shape[1]).take(t, dev, out=out)
