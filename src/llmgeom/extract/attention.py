"""Final-query attention and entropy maths of the extraction (torch, so in the extraction layer: ``measures``
never load torch, tests/unit/pipeline/test_layout.py): the final query's attention row per head from hooked queries and keys
(any attention implementation, no [B, H, T, T] weights), its entropy, and next-token entropy.

Used by ``extract.forward`` (the ``attn.hook_qk`` hook, ``next_token/entropy``).

Source: Paper III sec. 4 (final-query attention entropy); masks as ``transformers.masking_utils`` (causal,
padding, ``sliding_window_overlay``), and the attention mask the model itself passes to its attention function
(:func:`final_query_mask_row`: sparse or dynamic masks built inside the attention module).
"""

from __future__ import annotations

import torch


def entropy_nats(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax(logits) over the last axis, computed in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def attention_row_entropy(p: torch.Tensor, sink: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy in nats of attention rows p [..., T] (0 log 0 = 0), float32.

    ``sink``: [...] the probability of the sink outcome of each row (attention sinks: rows of p then sum to
    1 - sink), whose term -sink log sink is included: the entropy of the whole distribution over the keys plus the
    sink. None: no sink (rows sum to 1). Source: docs/design-notes.md "Attention sinks"."""
    h = torch.special.entr(p.float()).sum(-1)
    return h if sink is None else h + torch.special.entr(sink.float())


def final_query_hidden_keys(last: torch.Tensor, key_mask: torch.Tensor, T: int, window: int | None,
                            device) -> torch.Tensor:
    """Keys each prompt's final query cannot see: padding, positions after it, and (``window`` W) those
    at or before ``last - W``.

    Args:
        last: [B] long, position of each prompt's final token. key_mask: [B, T] bool/0-1, real tokens.

    Returns:
        [B, 1, T] bool, True = hidden (broadcasts over the heads of ``last_query_attention``'s scores).
    """
    last = last.to(device)
    j = torch.arange(T, device=device)
    visible = key_mask.to(device).bool() & (j[None, :] <= last[:, None])
    if window:
        visible &= j[None, :] > (last[:, None] - window)
    return ~visible[:, None, :]


def final_query_mask_row(mask: torch.Tensor | None, last: torch.Tensor, T_k: int) -> torch.Tensor | None:
    """The final query's row of the attention mask a model passed to its attention function.

    Args:
        mask: the call's ``attention_mask`` (``extract.capture.AttentionCall.mask``): [B or 1, 1 or H, T_q, T_k']
            (T_k' >= T_k: a cache's mask may be longer than the keys; its first T_k columns are the keys', as
            transformers' ``sdpa_attention_forward`` / ``eager_attention_forward`` slice it), either bool (True =
            may attend: sdpa) or additive float (0 where attending, ``finfo.min`` where not: eager; or a learned
            bias, Doge's dynamic mask ``DogeAttention.prepare_dynamic_mask``); with the masks of
            ``transformers.masking_utils`` and those a model merges in before the call (DeepSeek Sparse
            Attention's indexer, ``DeepseekV32Attention.forward``: keys outside each query's index_topk). None, or
            a mask of another form (the 2-D padding mask flash attention receives, a flex ``BlockMask``): None.
        last: [B] long, position of each prompt's final token (its query row; T_q = 1: row 0).
        T_k: number of keys of the call.

    Returns:
        [B, 1 or H, T_k] (bool, or the mask's float dtype, in its units: logits added to the scaled scores), or None.
    """
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return None
    rows = last.to(mask.device) if mask.shape[2] > 1 else torch.zeros_like(last, device=mask.device)
    B = last.shape[0]
    m = mask.expand(B, *mask.shape[1:]) if mask.shape[0] == 1 else mask
    return m[torch.arange(B, device=mask.device), :, rows, :T_k]


def last_query_attention(query: torch.Tensor, key: torch.Tensor, last: torch.Tensor, key_mask: torch.Tensor, *,
                         scaling: float, softcap: float | None = None, window: int | None = None,
                         hidden: torch.Tensor | None = None, mask_row: torch.Tensor | None = None,
                         sinks: torch.Tensor | None = None,
                         with_sink: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
    """Attention probabilities of each prompt's final query over its keys, per head, float32.

    Args:
        query: [B, H, T, hd] queries as the model's attention function receives them (after RoPE).
        key: [B, H_kv, T, hd] keys likewise; H_kv divides H and query head h reads key head
            h // (H / H_kv) (GQA/MQA, as ``repeat_kv``).
        last: [B] long, position of each prompt's final token (its query row).
        key_mask: [B, T] bool/0-1, real tokens (False = padding).
        scaling: factor on q.k (``families.attention_scaling``).
        softcap: c in c * tanh(score / c) before masking (Gemma 2), or None.
        window: sliding window W (key j visible iff last - W < j <= last), or None (causal).
        hidden: the [B, 1, T] mask of :func:`final_query_hidden_keys` for these arguments, when the caller
            has it already (one per batch and window instead of one per layer).
        mask_row: [B, 1 or H, T] the final query's row of the mask the model passed to its attention function
            (:func:`final_query_mask_row`), or None: a float row (logits) is added to the scaled and soft-capped
            scores, as the attention function adds its additive mask (0 at the keys it attends to leaves them bit
            for bit; a learned bias, Doge's, shifts them); a bool row hides the keys where it is False. ``hidden``
            still applies (the keys seen are the intersection). A row of one head broadcasts over the H heads.
        sinks: [H] attention-sink logits (a learned per-head logit outside q.k, the attention function's
            ``s_aux``), or None: one extra logit column per head joins the softmax (not scaled, soft-capped or
            masked) and is dropped after it; the sink carries no value.
        with_sink: also return the sink column's probabilities.

    Returns:
        [B, H, T] float32 probabilities, zero on masked keys; rows sum to 1 (with ``sinks``: 1 - p_sink).
        With ``with_sink``: (that, [B, H] p_sink, or None without ``sinks``).

    Source: Paper III sec. 4 (final-query attention entropy); masks as ``transformers.masking_utils``
    (causal, padding, ``sliding_window_overlay``) and the model's own mask row (``mask_row``); sinks as
    transformers' gpt_oss ``eager_attention_forward`` (Xiao et al. 2023, "Efficient Streaming Language Models with
    Attention Sinks"; the gpt-oss model card).
    """
    B, H, T, hd = query.shape
    H_kv = key.shape[1]
    rep = H // H_kv
    dev = query.device
    last = last.to(dev)
    q = query[torch.arange(B, device=dev), :, last, :].float()  # [B, H, hd]
    # [B*H, 1, hd] @ [B*H, hd, T] (bmm on 3-D views: the kernel the 4-D matmul dispatches to, bit for bit, without
    # its broadcasting and reshapes): the batched product einsum("bhd,bhtd->bht") dispatches to, bit for bit
    if rep == 1:
        scores = torch.bmm(q.view(B * H, 1, hd), key.float().transpose(-1, -2).reshape(B * H, hd, T)).view(B, H, T)
    else:
        # query head h = g * rep + r reads key head g: for each r, [B*H_kv, 1, hd] @ [B*H_kv, hd, T], the same
        # one-row products as [B, H, 1, hd] @ the keys repeated per head (repeat_kv, a contiguous copy), bit for
        # bit on CPU (tests/unit/extract/test_extraction.py; not checked on CUDA, where cuBLAS picks kernels by batch count),
        # without the [B, H, T, hd] copy (a grouped [B, H_kv, rep, hd] product differs in the last bits). The
        # keys are made contiguous as the repeat made them: the model may pass a transposed view of
        # [B, T, H_kv, hd], and the product over that layout takes another kernel path (other last bits)
        kT = key.float().contiguous().transpose(-1, -2).reshape(B * H_kv, hd, T)
        qg = q.view(B, H_kv, rep, hd)
        scores = torch.stack([torch.bmm(qg[:, :, r].reshape(B * H_kv, 1, hd), kT).view(B, H_kv, T)
                              for r in range(rep)], dim=2).reshape(B, H, T)
    scores = scores.mul_(scaling)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask_row is not None:
        mask_row = mask_row.to(dev)
        scores = scores.masked_fill_(~mask_row, float("-inf")) if mask_row.dtype == torch.bool \
            else scores.add_(mask_row.float())
    if hidden is None:
        hidden = final_query_hidden_keys(last, key_mask, T, window, dev)
    scores = scores.masked_fill_(hidden, float("-inf"))
    if sinks is None:
        p = torch.softmax(scores, dim=-1)
        return (p, None) if with_sink else p
    col = sinks.detach().to(dev, torch.float32).view(1, H, 1).expand(B, H, 1)
    p = torch.softmax(torch.cat([scores, col], dim=-1), dim=-1)
    return (p[..., :T], p[..., T]) if with_sink else p[..., :T]
