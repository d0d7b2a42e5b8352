"""Activation extraction: one batched forward pass per batch, hooks that keep only
what the HDF5 contract needs, logits recomputed in float32.

Prompts are tokenized one by one and right-padded by us (the tokenizer's own
padding side never matters); the final position of each prompt is found from
the attention mask. Position ids are passed explicitly so padding cannot shift
them. Batching with padding does not change any stored value (tests/test_extraction.py).

The pre-norm residual stream is captured with hooks on the decoder blocks
(``hidden_states[-1]`` is post-norm in most families); hooks accept block outputs
that are tensors (transformers >= 5) or tuples (older releases).

Source: DESIGN.md sections 2 and 4; Paper III sec. 4 (last-token values, keys,
attention entropy); LSM (token-level margins, residual samples).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from llmgeom.core.progress import progress
from llmgeom.core.store import ActivationWriter
from llmgeom.models import architectures as arch


class NonFiniteActivationError(FloatingPointError):
    """A NaN/inf activation or logit; the message names model, layer and prompt."""


class PromptTokenError(ValueError):
    """A prompt that cannot be extracted (zero tokens, longer than the model's context)."""


def first_tensor(x):
    """The hidden-state tensor of a module output: the output itself (recent transformers) or its first element (tuple outputs of older decoder layers; DESIGN.md sec. 4)."""
    return x[0] if isinstance(x, (tuple, list)) else x


@contextlib.contextmanager
def hooks(handles: list):
    """Remove every hook handle on exit, also when the forward pass raises."""
    try:
        yield handles
    finally:
        for h in handles:
            h.remove()
        handles.clear()


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


def entropy_nats(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax(logits) over the last axis, computed in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def attention_row_entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of attention rows p [..., T] (0 log 0 = 0), float32."""
    return torch.special.entr(p.float()).sum(-1)


def last_query_attention(query: torch.Tensor, key: torch.Tensor, last: torch.Tensor, key_mask: torch.Tensor, *,
                         scaling: float, softcap: float | None = None, window: int | None = None) -> torch.Tensor:
    """Attention probabilities of each prompt's final query over its keys, per head, float32.

    Args:
        query: [B, H, T, hd] queries as the model's attention function receives them (after RoPE).
        key: [B, H_kv, T, hd] keys likewise; H_kv divides H and query head h reads key head
            h // (H / H_kv) (GQA/MQA, as ``repeat_kv``).
        last: [B] long, position of each prompt's final token (its query row).
        key_mask: [B, T] bool/0-1, real tokens (False = padding).
        scaling: factor on q.k (``architectures.attention_scaling``).
        softcap: c in c * tanh(score / c) before masking (Gemma 2), or None.
        window: sliding window W (key j visible iff last - W < j <= last), or None (causal).

    Returns:
        [B, H, T] float32 probabilities, zero on masked keys; rows sum to 1.

    Source: Paper III sec. 4 (final-query attention entropy); masks as ``transformers.masking_utils``
    (causal, padding, ``sliding_window_overlay``).
    """
    B, H, T, _ = query.shape
    rep = H // key.shape[1]
    dev = query.device
    last = last.to(dev)
    q = query[torch.arange(B, device=dev), :, last, :].float()  # [B, H, hd]
    k = key.float()
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
    scores = torch.einsum("bhd,bhtd->bht", q, k) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    j = torch.arange(T, device=dev)
    visible = key_mask.to(dev).bool() & (j[None, :] <= last[:, None])
    if window:
        visible &= j[None, :] > (last[:, None] - window)
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


def _rows(t: torch.Tensor, bi: torch.Tensor, ti: torch.Tensor, dev) -> torch.Tensor:
    """``t[bi, ti]`` in float32 on ``dev``. With ``device_map="auto"`` the blocks of a large model sit
    on different GPUs: the index tensors follow ``t`` and the rows come back to ``dev`` (no-ops on one
    device)."""
    if bi.device != t.device:
        bi, ti = bi.to(t.device), ti.to(t.device)
    return t[bi, ti].float().to(dev)


class Float32Head:
    """The unembedding in float32 (plus Gemma soft-capping), applied in chunks."""

    def __init__(self, model, chunk: int = 256):
        W, b = arch.unembedding(model)
        self.W = W.detach().float()
        self.b = None if b is None else b.detach().float()
        self.cap = arch.logit_softcap(model)
        self.chunk = chunk

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(0, h.shape[0], self.chunk):
            z = F.linear(h[i:i + self.chunk].float().to(self.W.device), self.W, self.b)
            if self.cap:
                z = torch.tanh(z / self.cap) * self.cap
            out.append(z)
        return torch.cat(out) if out else h.new_zeros((0, self.W.shape[0]), dtype=torch.float32)


def extract_batch(model, seqs: list[list[int]], *, attention: bool, top_k: int = 10,
                  sample_positions: list[list[int]] | None = None, token_stats: bool = False,
                  prompt_ids: list[str] | None = None, head: Float32Head | None = None,
                  pad_id: int = 0, candidates: list[list[int]] | None = None,
                  model_name: str | None = None) -> dict:
    """Run one batch and return numpy arrays per prompt (first axis = batch).

    Args:
        seqs: token ids per prompt (no padding).
        attention: compute final-query attention entropy per head, from the queries and keys that
            the model's attention function receives (``architectures.capture_attention``): any
            attention implementation (sdpa, flash attention, eager), no [B, H, T, T] weights.
        sample_positions: per prompt, token positions whose residual stream to keep (corpus sets).
        token_stats: per-position margin / nll / entropy for positions 1..len-2 (corpus sets).
        candidates: per prompt, the same number C of token ids whose next-token log-probability
            (over the full vocabulary, float32) to return as ``candidate_logprobs`` [B, C] nats
            (SULA labels; Paper III sec. 4.3).

    Returns keys: residual [B, L+1, d_model], final_normed [B, d_unembed], values [B, L, n_kv*hd],
    keys [B, L, n_kv, hd], attn_output [B, L, H*hd] (the o_proj input: attention-weighted sum of values),
    next_entropy [B] nats, top_ids/top_logits [B, k], attn_entropy [B, L, H] nats (if attention); residual_sample [S, L+1, d], final_normed_sample [S, d_unembed] with
    sample_prompt/sample_position [S];
    margin/nll/tok_entropy/tok_prompt/tok_position [P] (if token_stats).

    Raises:
        NonFiniteActivationError: naming the model (``model_name``, default the config's
            ``_name_or_path`` / model_type), the layer and the prompt.
    """
    dev = next(model.parameters()).device
    mname = model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
    s = arch.summarize(model.config)
    head = head or Float32Head(model)
    ids, mask, pos = pad_batch(seqs, pad_id, dev)
    B = len(seqs)
    names = prompt_ids or [str(i) for i in range(B)]
    last = last_positions(mask)
    b_idx = torch.arange(B, device=dev)
    # gather index: last tokens first, then sampled positions
    gb, gt = [b_idx], [last]
    samp_b, samp_t = [], []
    if sample_positions is not None:
        for i, ps in enumerate(sample_positions):
            samp_b += [i] * len(ps)
            samp_t += list(ps)
        gb.append(torch.tensor(samp_b, dtype=torch.long, device=dev))
        gt.append(torch.tensor(samp_t, dtype=torch.long, device=dev))
    gb, gt = torch.cat(gb), torch.cat(gt)
    valid = mask.bool()

    resid: list[torch.Tensor | None] = [None] * (s.n_layers + 1)
    keys: list[torch.Tensor | None] = [None] * s.n_layers
    vals: list[torch.Tensor | None] = [None] * s.n_layers
    attn_out: list[torch.Tensor | None] = [None] * s.n_layers
    attn_ent: list[torch.Tensor | None] = [None] * s.n_layers

    def check(t: torch.Tensor, where: str):
        bad = ~torch.isfinite(t)
        if bad.dim() == 3:
            bad = bad.any(-1) & valid.to(bad.device)
        if bad.any():
            bi, ti = (int(x) for x in bad.nonzero()[0][:2])
            raise NonFiniteActivationError(
                f"model {mname!r}: non-finite activation in {where}, prompt {names[bi]!r} token {ti} "
                f"(model dtype {next(model.parameters()).dtype}; try dtype: float32 or bfloat16)")

    def emb_hook(mod, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        check(h, "embeddings (layer 0)")
        resid[0] = _rows(h, gb, gt, dev)

    def make_block_hook(layer):
        def fn(mod, args, out):
            h = first_tensor(out)
            check(h, f"block {layer} output (residual layer {layer + 1})")
            resid[layer + 1] = _rows(h, gb, gt, dev)
        return fn

    def on_attention(layer, q, k, o, scaling, softcap):
        o = o.reshape(*o.shape[:2], -1)  # [B, T, H*hd]: the o_proj input
        attn_out[layer] = _rows(o, b_idx, last, dev)
        if attention:
            cfg = model.config
            p = last_query_attention(
                q, k, last, valid, softcap=softcap if softcap is not None else arch.attention_softcap(cfg),
                scaling=scaling if scaling is not None else arch.attention_scaling(cfg, layer),
                window=arch.attention_window(cfg, layer))
            attn_ent[layer] = attention_row_entropy(p).to(dev)

    def make_kv_hook(layer, kfn, vfn, do_k, do_v):
        def fn(mod, args, out):
            o = first_tensor(out)
            if do_k:
                keys[layer] = _rows(kfn(o), b_idx, last, dev)
            if do_v:
                vals[layer] = _rows(vfn(o), b_idx, last, dev)
        return fn

    layers = arch.decoder_layers(model)
    handles: list = []
    with hooks(handles), torch.inference_mode(), arch.capture_attention(model, on_attention) as seen:
        handles.append(layers[0].register_forward_pre_hook(emb_hook, with_kwargs=True))
        for i, blk in enumerate(layers):
            handles.append(blk.register_forward_hook(make_block_hook(i)))
        for i, (km, kfn, vm, vfn) in enumerate(arch.key_value_extractors(model)):
            if km is vm:
                handles.append(km.register_forward_hook(make_kv_hook(i, kfn, vfn, True, True)))
            else:
                handles.append(km.register_forward_hook(make_kv_hook(i, kfn, vfn, True, False)))
                handles.append(vm.register_forward_hook(make_kv_hook(i, kfn, vfn, False, True)))
        out = arch.base_model(model)(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        if sorted(set(seen)) != list(range(s.n_layers)):
            missing = sorted(set(range(s.n_layers)) - set(seen))
            raise arch.UnsupportedArchitectureError(
                f"model {mname!r}: the attention of layers {missing} did not go through transformers' attention "
                f"interface (implementation {model.config._attn_implementation!r}), so queries, keys and the "
                "attention output cannot be read; load it with attn_implementation='sdpa'")
        hT = out.last_hidden_state
        check(hT, "final norm output")
        res: dict = {}
        R = torch.stack(resid, dim=1)  # [G, L+1, d]
        res["residual"] = R[:B].cpu().numpy()
        if sample_positions is not None:
            res["residual_sample"] = R[B:].cpu().numpy()
            res["final_normed_sample"] = _rows(hT, gb[B:], gt[B:], dev).cpu().numpy()
            res["sample_prompt"] = np.asarray(samp_b, dtype=np.int64)
            res["sample_position"] = np.asarray(samp_t, dtype=np.int32)
        h_last = _rows(hT, b_idx, last, dev)
        res["final_normed"] = h_last.cpu().numpy()
        res["values"] = torch.stack(vals, 1).cpu().numpy()
        res["attn_output"] = torch.stack(attn_out, 1).cpu().numpy()
        res["keys"] = torch.stack(keys, 1).reshape(B, s.n_layers, s.n_kv_heads, s.head_dim).cpu().numpy()
        logits = head(h_last)
        if not torch.isfinite(logits).all():
            bi = int((~torch.isfinite(logits)).any(-1).nonzero()[0][0])
            raise NonFiniteActivationError(f"model {mname!r}: non-finite logits (final layer, unembedding) at the "
                                           f"final token of prompt {names[bi]!r}; try dtype: float32 or bfloat16")
        res["next_entropy"] = entropy_nats(logits).cpu().numpy()
        k = min(top_k, logits.shape[-1])
        tv, ti = logits.topk(k, dim=-1)
        res["top_ids"] = ti.cpu().numpy()
        res["top_logits"] = tv.cpu().numpy()
        if candidates is not None:
            cand = torch.as_tensor(candidates, dtype=torch.long, device=logits.device).reshape(B, -1)
            res["candidate_logprobs"] = torch.log_softmax(logits, -1).gather(1, cand).cpu().numpy()
        if attention:
            res["attn_entropy"] = torch.stack(attn_ent, 1).cpu().numpy()  # [B, L, H]
        if token_stats:
            tb, tt = [], []
            for i, sq in enumerate(seqs):
                for t in range(1, len(sq) - 1):
                    tb.append(i)
                    tt.append(t)
            tb_t = torch.tensor(tb, dtype=torch.long, device=dev)
            tt_t = torch.tensor(tt, dtype=torch.long, device=dev)
            margins, nlls, ents = [], [], []
            for j in range(0, len(tb), head.chunk):
                bb, ttt = tb_t[j:j + head.chunk], tt_t[j:j + head.chunk]
                z = head(_rows(hT, bb, ttt, hT.device))
                if not torch.isfinite(z).all():
                    bi = int(bb[(~torch.isfinite(z)).any(-1)][0])
                    raise NonFiniteActivationError(f"model {mname!r}: non-finite logits (final layer, unembedding) "
                                                   f"in prompt {names[bi]!r}; try dtype: float32 or bfloat16")
                top2 = z.topk(2, dim=-1).values
                margins.append(top2[:, 0] - top2[:, 1])
                logp = torch.log_softmax(z, -1)
                nlls.append(-logp.gather(1, ids[bb, ttt + 1].unsqueeze(1).to(logp.device)).squeeze(1))
                ents.append(-(logp.exp() * logp).sum(-1))
            cat = (lambda xs: torch.cat([x.cpu() for x in xs]).numpy() if xs else np.zeros(0, np.float32))
            res["margin"], res["nll"], res["tok_entropy"] = cat(margins), cat(nlls), cat(ents)
            res["tok_prompt"] = np.asarray(tb, dtype=np.int64)
            res["tok_position"] = np.asarray(tt, dtype=np.int32)
    return res


def tokenize_prompts(tok, texts: list[str], ids: list[str], *, max_tokens: int | None, truncate: bool,
                     context: int | None) -> list[list[int]]:
    """Token ids per prompt (with the tokenizer's special tokens).

    Raises:
        PromptTokenError: a prompt with zero tokens, or longer than ``max_tokens`` /
            the model context when ``truncate`` is False.
    """
    out = []
    for pid, text in zip(ids, texts):
        t = tok(text, add_special_tokens=True)["input_ids"]
        n_special = len(tok("", add_special_tokens=True)["input_ids"])
        if len(t) <= n_special:
            raise PromptTokenError(f"prompt {pid!r} tokenizes to zero tokens; remove it or rebuild the prompt set")
        limit = min(x for x in (max_tokens, context) if x) if (max_tokens or context) else None
        if limit and len(t) > limit:
            if not truncate:
                raise PromptTokenError(
                    f"prompt {pid!r} has {len(t)} tokens, more than the limit {limit} "
                    f"(extract.max_tokens={max_tokens}, model context={context}); lower prompts.token_budget")
            t = t[:limit]
        out.append(t)
    return out


def extract_to_hdf5(model_dir, prompts_path, out_path, *, model_name: str, dtype: str = "auto",
                    device: str = "auto", batch_size: int = 8, top_k: int = 10, attention: bool = True,
                    corpus: bool = False, sample_per_prompt: int = 16, max_tokens: int | None = None,
                    seed: int = 0, device_map: str | None = None, candidates_key: str | None = None,
                    mem_mb: int | None = None, attn_implementation: str = "sdpa", reuse_model: bool = False,
                    log=print) -> Path:
    """Extract every dataset of the HDF5 contract for one model and one prompt set.

    The model is loaded with ``attn_implementation`` (default sdpa; "flash_attention_2" on a GPU that
    has it); attention entropies are computed from hooked queries and keys, so eager attention is
    never needed (issue 13 item 2). Corpus sets
    (``corpus=True``) add token-level margins, NLL and entropy at positions
    1..len-2 and residual-stream samples at ``sample_per_prompt`` seeded
    positions per passage (position 0 / BOS excluded). Written to
    ``<out_path>.partial`` and renamed when complete.

    ``candidates_key`` (e.g. ``"label_token_ids"`` for SULA sets) names a list of token ids in every
    prompt's meta (same length C for all prompts); their next-token log-probabilities at the final
    position are stored as ``next_token/candidate_logprobs`` [n, C] (float32, nats, over the full
    vocabulary) with the ids in ``next_token/candidate_ids`` [n, C] int64.

    ``reuse_model``: keep the loaded model in this process for the next call (``load_prepared(reuse=True)``;
    the model server). ``mem_mb`` (the job's declared memory) is checked against the model's size before loading
    (``models.check_memory``; on CUDA the GPUs' memory is checked in any case).

    Raises:
        PromptTokenError, NonFiniteActivationError, PromptDataError (via read_prompt_set);
        ValueError: a prompt without valid candidate ids when ``candidates_key`` is given;
        ModelMemoryError: the model cannot fit, before any weight is read.
    """
    from llmgeom.prompts.io import read_prompt_set
    from llmgeom.models.loading import load_prepared
    from llmgeom.models.sources import read_manifest

    t_call = time.time()
    records, sha = read_prompt_set(prompts_path)
    manifest = read_manifest(model_dir)
    model, tok = load_prepared(model_dir, dtype=dtype, attn=attn_implementation,
                               device=device, device_map=device_map, mem_mb=mem_mb, reuse=reuse_model)
    s = arch.summarize(model.config)
    texts = [r["text"] for r in records]
    pids = [r.get("id", str(i)) for i, r in enumerate(records)]
    # token_budget is a target when prompts are built; here it only truncates corpus passages
    seqs = tokenize_prompts(tok, texts, pids, max_tokens=max_tokens if corpus else None, truncate=corpus,
                            context=s.max_positions)
    n = len(seqs)
    cands = None
    if candidates_key:
        cands = [r.get("meta", {}).get(candidates_key) for r in records]
        n_c = len(cands[0]) if isinstance(cands[0], list) else 0
        for pid, c in zip(pids, cands):
            if (not isinstance(c, list) or len(c) != n_c or n_c == 0
                    or not all(isinstance(x, int) and 0 <= x < s.vocab_size for x in c)):
                raise ValueError(f"prompt {pid!r}: meta[{candidates_key!r}] must be a non-empty list of {n_c or 'C'} "
                                 f"token ids in [0, {s.vocab_size}), got {c!r}; rebuild the prompt set for this model")
    d_unembed = arch.unembedding(model)[0].shape[1]
    samples = None
    if corpus:
        samples = []
        for i, sq in enumerate(seqs):
            rng = np.random.default_rng([seed, i])
            cand = np.arange(1, len(sq))
            m = min(sample_per_prompt, len(cand))
            samples.append(sorted(rng.choice(cand, size=m, replace=False).tolist()) if m else [])
        short = [pids[i] for i, x in enumerate(samples) if len(x) < sample_per_prompt]
        if short:  # keep what there is (sampling without replacement), say so, record the count
            import warnings

            msg = (f"{model_name} {Path(prompts_path).stem}: {len(short)} of {n} passages have fewer than "
                   f"extract.sample_per_prompt={sample_per_prompt} positions after position 0 (e.g. {short[0]!r}); "
                   f"all their positions are kept: {sum(len(x) for x in samples)} samples instead of "
                   f"{n * sample_per_prompt} (attrs n_short_passages, n_samples_requested)")
            warnings.warn(msg, stacklevel=2)
            log(f"[extract] warning: {msg}")
        if not any(samples):
            raise PromptTokenError(f"{model_name} {Path(prompts_path).stem}: no corpus passage has a token after "
                                   "position 0, so there is nothing to sample; raise the prompt set's token_budget")
    L, d = s.n_layers, s.d_model
    shapes = {
        "prompts/text": ((n,), "str"), "prompts/meta": ((n,), "str"), "prompts/n_tokens": ((n,), "int32"),
        "last_token/residual": ((n, L + 1, d), "float32"),
        "last_token/final_normed": ((n, d_unembed), "float32"),
        "last_token/values": ((n, L, s.n_kv_heads * s.head_dim), "float32"),
        "last_token/keys": ((n, L, s.n_kv_heads, s.head_dim), "float32"),
        "last_token/attn_output": ((n, L, s.n_heads * s.head_dim), "float32"),
        "next_token/entropy": ((n,), "float32"),
        "next_token/top_ids": ((n, min(top_k, s.vocab_size)), "int64"),
        "next_token/top_logits": ((n, min(top_k, s.vocab_size)), "float32"),
    }
    if cands is not None:
        shapes["next_token/candidate_logprobs"] = ((n, len(cands[0])), "float32")
        shapes["next_token/candidate_ids"] = ((n, len(cands[0])), "int64")
    if attention:
        shapes["attention/entropy"] = ((n, L, s.n_heads), "float32")
    if corpus:
        n_s = sum(len(x) for x in samples)
        n_p = sum(max(len(sq) - 2, 0) for sq in seqs)
        shapes.update({"tokens/residual_sample": ((n_s, L + 1, d), "float32"),
                       "tokens/final_normed_sample": ((n_s, d_unembed), "float32"),
                       "tokens/sample_prompt": ((n_s,), "int32"), "tokens/sample_position": ((n_s,), "int32"),
                       "tokens/margin": ((n_p,), "float32"), "tokens/nll": ((n_p,), "float32"),
                       "tokens/entropy": ((n_p,), "float32"), "tokens/prompt": ((n_p,), "int32"),
                       "tokens/position": ((n_p,), "int32")})
    attrs = dict(model=model_name, source=manifest.get("source"), revision=manifest.get("revision"),
                 source_sha256=manifest.get("source_sha256"), torch_dtype=str(model.dtype).replace("torch.", ""),
                 device=str(next(model.parameters()).device),
                 attn_implementation=str(arch._text_config(model.config)._attn_implementation),
                 n_layers=L, d_model=d, d_unembed=int(d_unembed), n_heads=s.n_heads, n_kv_heads=s.n_kv_heads,
                 head_dim=s.head_dim, vocab_size=s.vocab_size, architecture=s.as_dict(),
                 prompt_set=Path(prompts_path).stem, prompt_set_sha256=sha, top_k=top_k, seed=seed,
                 sample_per_prompt=sample_per_prompt if corpus else 0, kind="corpus" if corpus else "prompts")
    if corpus:
        attrs.update(n_short_passages=len(short), n_samples_requested=n * sample_per_prompt)
    w = ActivationWriter(out_path, attrs, shapes)
    try:
        w.write("prompts/text", slice(None), texts)
        w.write("prompts/meta", slice(None), [json.dumps(r.get("meta", {}), sort_keys=True) for r in records])
        w.write("prompts/n_tokens", slice(None), np.array([len(x) for x in seqs], np.int32))
        head = Float32Head(model)
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        order = sorted(range(n), key=lambda i: -len(seqs[i]))
        tok_offsets = np.concatenate([[0], np.cumsum([max(len(sq) - 2, 0) for sq in seqs])])
        samp_offsets = np.concatenate([[0], np.cumsum([len(x) for x in samples])]) if corpus else None
        t0, n_tok, t_fwd = time.time(), 0, 0.0
        bar = progress(total=n, desc=f"extract {model_name} {Path(prompts_path).stem}", unit="prompt")
        for j in range(0, n, batch_size):
            idx = order[j:j + batch_size]
            tb = time.perf_counter()
            r = extract_batch(model, [seqs[i] for i in idx], attention=attention, top_k=top_k,
                              sample_positions=[samples[i] for i in idx] if corpus else None,
                              token_stats=corpus, prompt_ids=[pids[i] for i in idx], head=head, pad_id=pad_id,
                              candidates=[cands[i] for i in idx] if cands is not None else None,
                              model_name=model_name)
            t_fwd += time.perf_counter() - tb  # forward pass, hooks and per-token statistics on the device
            rows = np.array(idx)
            w.write("last_token/residual", rows, r["residual"])
            w.write("last_token/final_normed", rows, r["final_normed"])
            w.write("last_token/values", rows, r["values"])
            w.write("last_token/keys", rows, r["keys"])
            w.write("last_token/attn_output", rows, r["attn_output"])
            w.write("next_token/entropy", rows, r["next_entropy"])
            w.write("next_token/top_ids", rows, r["top_ids"])
            w.write("next_token/top_logits", rows, r["top_logits"])
            if cands is not None:
                w.write("next_token/candidate_logprobs", rows, r["candidate_logprobs"])
                w.write("next_token/candidate_ids", rows, np.array([cands[i] for i in idx], np.int64))
            if attention:
                w.write("attention/entropy", rows, r["attn_entropy"])
            if corpus:
                for bi, i in enumerate(idx):
                    sel = r["sample_prompt"] == bi
                    sl = slice(int(samp_offsets[i]), int(samp_offsets[i + 1]))
                    w.write("tokens/residual_sample", sl, r["residual_sample"][sel])
                    w.write("tokens/final_normed_sample", sl, r["final_normed_sample"][sel])
                    w.write("tokens/sample_prompt", sl, np.full(sel.sum(), i, np.int32))
                    w.write("tokens/sample_position", sl, r["sample_position"][sel])
                    tsel = r["tok_prompt"] == bi
                    tl = slice(int(tok_offsets[i]), int(tok_offsets[i + 1]))
                    w.write("tokens/margin", tl, r["margin"][tsel])
                    w.write("tokens/nll", tl, r["nll"][tsel])
                    w.write("tokens/entropy", tl, r["tok_entropy"][tsel])
                    w.write("tokens/prompt", tl, np.full(tsel.sum(), i, np.int32))
                    w.write("tokens/position", tl, r["tok_position"][tsel])
            n_tok += sum(len(seqs[i]) for i in idx)
            bar.update(len(idx))
            bar.set_postfix(tokens=n_tok, refresh=False)
        bar.close()
        log(f"[extract] {model_name} {Path(prompts_path).stem}: {n} prompts, {n_tok} tokens, "
            f"{n_tok / max(time.time() - t0, 1e-9):.0f} tokens/s on {attrs['device']}; "
            f"forward passes {t_fwd:.3f} s of {time.time() - t_call:.3f} s in extract_to_hdf5")
        return w.commit()
    except BaseException:
        w.abort()
        raise
