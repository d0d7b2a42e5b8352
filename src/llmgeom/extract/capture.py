"""One capture API: named hook points on any supported decoder-only model (TransformerLens style).

Every reading or editing of a model's internals during a forward pass goes through :func:`hooked` (extraction,
interventions, the wind tunnel's extraction), re-exported here from ``extract.hooks``, the one module where torch
hooks are registered and the attention interface is patched; this module holds the batches, the forward pass
(:func:`run`) and the float32 head.
A hook is ``fn(activation, point) -> Tensor | None`` on a named point; returning a tensor on an editable
point replaces the activation for the rest of the model (an edit, e.g. ``interventions.edits``).
Family knowledge stays in ``models.families`` (what a family is) and ``models.architectures`` (where its blocks,
projections and attention live; fused QKV layouts).

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

Hybrid and state-space models: the ``attn.*`` points exist only on the layers that have attention
(``architectures.attention_layers``); the residual-stream and global points exist on every layer.

Hooks of one point run in the order given; a hook sees the edits of the hooks before it. Hooks on
``hook_z`` / ``hook_qk`` go through ``extract.hooks.capture_attention`` (any attention implementation,
no [B, H, T, T] weights).

Multi-head latent attention (DeepSeek-V2/V3 MLA, ``families.latent_dims``; ``head_dim`` = qk_nope + qk_rope,
n_kv_heads = n_heads, values and attention output of ``value_head_dim`` = v_head_dim per head): ``hook_v`` and
``hook_k`` are read at the attention interface too, because no module outputs the per-head values or keys:
``hook_v`` = the values the attention function receives (``kv_b_proj``'s decompressed v_h, heads concatenated;
editable: an edited tensor is what the attention function then receives); ``hook_k`` (read-only there) = the keys
before RoPE, per head [k_nope_h | k_rope]: k_nope_h as the attention function
receives it (RoPE does not touch it) and k_rope the pre-RoPE part of ``kv_a_proj_with_mqa``'s output (its columns
kv_lora_rank:, shared by every head; in the projection's own coordinate order, before ``rope_interleave``'s
permutation). Families without latent attention take no extra work.

Source: DESIGN.md sections 2 and 4 (one capture API); TransformerLens ``HookPoint``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

from llmgeom.extract.hooks import (ATTENTION_POINTS, EDITABLE, GLOBAL_POINTS, AttentionCall, Batch, Hook,  # noqa: F401
                                   HookPoint, final_rows, first_tensor, hooked, point_name)
from llmgeom.models import architectures as arch
from llmgeom.models import families


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
    (tests/unit/extract/test_extraction.py)."""
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
            raise families.UnsupportedArchitectureError(
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