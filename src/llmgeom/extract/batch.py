"""One batch through the model: the hooks that keep only what the HDF5 contract needs, and the batch's results.

:class:`BatchHooks` registers, once per extraction, one hook per named point of the capture API
(``extract.capture`` / ``extract.hooks``) that the contract declares (``core.store.DatasetSpec.point``,
:data:`FINAL_TOKEN_POINTS`), each copying its final-token rows into a per-batch buffer. :func:`extract_batch`
runs one right-padded batch (``capture.make_batch``): the forward pass (``forward_pass``, rerun layer by layer to
name the first non-finite activation), the final-token results, the next-token results from float32 logits, and
the per-token statistics of corpus sets. ``extract.forward.extract_to_hdf5`` loops over the batches and writes
them.

Source: DESIGN.md sections 2 and 4; Paper III sec. 4 (last-token values, keys, attention entropy); LSM (token-level
margins, residual samples).
"""

from __future__ import annotations


import numpy as np
import torch

from llmgeom.core.store import DS, CONTRACT
from llmgeom.extract import capture
from llmgeom.extract.attention import (attention_row_entropy, entropy_nats, final_query_hidden_keys,
                                       final_query_mask_row, last_query_attention)
from llmgeom.extract.capture import Float32Head, rows_at
from llmgeom.models import architectures as arch
from llmgeom.models import families


class NonFiniteActivationError(FloatingPointError):
    """A NaN/inf activation or logit; the message names model, layer and prompt."""


#: hook point -> dataset of the per-layer final-token stores (keys, values, attention output), read from the
#: contract's declaration (``DatasetSpec.point``) in its order; each hook copies its final-token rows into the
#: buffer of that dataset. The residual stream (two datasets, one buffer) and the attention entropy (computed in
#: its hook) have their own hooks, at the points the contract declares for them too.
FINAL_TOKEN_POINTS = {spec.point: name for name, spec in CONTRACT.items()
                      if spec.point in ("attn.hook_k", "attn.hook_v", "attn.hook_z")}


def model_axis_sizes(s) -> dict:
    """Sizes of the contract's per-model feature axes (``core.store.DIMS``) from an ``families.summarize``
    result: value_feature = kv_head x value_head_dim (the stored values), kv_head x head_dim (the stored keys),
    attn_feature = head x value_head_dim (the attention output). value_head_dim = head_dim except under multi-head
    latent attention (v_head_dim vs qk_nope + qk_rope head dims; ``families.ArchSummary``). One home for both
    the file's shapes and the per-batch buffers."""
    vhd = s.value_head_dim or s.head_dim
    return dict(value_feature=s.n_kv_heads * vhd, kv_head=s.n_kv_heads, head_dim=s.head_dim,
                head=s.n_heads, attn_feature=s.n_heads * vhd)


class _BatchBuffers:
    """One batch's state for :class:`BatchHooks`: output buffers, gather indices, what the checks name."""

    def __init__(self, hk: "BatchHooks", batch, names: list[str], mname: str, sample_positions, locate: bool):
        dev, s = hk.device, hk.summary
        L, B = s.n_layers, len(names)
        self.names, self.mname, self.locate, self.dtype = names, mname, locate, hk.dtype
        self.valid = batch.mask.bool()
        self.T = batch.ids.shape[1]
        self.last = batch.last
        # gather index: last tokens first, then sampled positions
        gb, gt = [batch.rows], [batch.last]
        self.samp_b, self.samp_t = [], []
        if sample_positions is not None:
            for i, ps in enumerate(sample_positions):
                self.samp_b += [i] * len(ps)
                self.samp_t += list(ps)
            gb.append(torch.tensor(self.samp_b, dtype=torch.long, device=dev))
            gt.append(torch.tensor(self.samp_t, dtype=torch.long, device=dev))
        self.gb, self.gt = torch.cat(gb), torch.cat(gt)
        self.rows_all = capture.RowIndex(self.gb, self.gt, self.T)
        self.rows_last = capture.RowIndex(batch.rows, batch.last, self.T)
        # output buffers, allocated before the forward (not one small tensor per layer between its large
        # transients: that fragments the heap and raised the peak RSS to 1.3-1.75x the body's at 1,024 tokens);
        # NaN-filled, so a layer that did not run is refused by the writer
        nan = (lambda *shape: torch.full(shape, float("nan"), dtype=torch.float32, device=dev))
        # layer-major [L(+1), rows, features]: each hook gathers its rows straight into a contiguous slice
        self.resid = nan(L + 1, len(self.gb), s.d_model)  # last_token/residual, then tokens/residual_sample rows
        # final-token stores: one buffer per dataset of FINAL_TOKEN_POINTS, named by the dataset
        # (none for a state-space model; a hybrid's attention-free layers keep their NaN rows: the contract's value)
        self.stored = {name: nan(L, B, hk.features[name]) for name in FINAL_TOKEN_POINTS.values()} \
            if hk.attention_layers else {}
        self.attn_ent = nan(L, B, s.n_heads) if hk.attention and hk.attention_layers else None
        self.hidden_keys: dict = {}  # attention window -> [B, 1, T] keys the final query cannot see

    def check(self, t: torch.Tensor, where: str) -> None:
        """Raise NonFiniteActivationError at the first real token of ``t`` [B, T, d] with a non-finite value
        (``t`` [B, d]: each prompt's final token)."""
        # fast path, one reduction: a finite sum means every element is finite (a NaN/inf propagates into
        # it); a non-finite sum (also a finite overflow, or a non-finite value on padding) takes the exact test
        if bool(torch.isfinite(t.sum(dtype=torch.float32))):
            return
        bad = ~torch.isfinite(t)
        if bad.dim() == 3:
            bad = bad.any(-1) & self.valid.to(bad.device)
        else:  # [B, d] final-token rows: prompt b's row is its token last[b]
            bad = bad.any(-1)
        hits = bad.nonzero()
        if len(hits):
            bi = int(hits[0, 0])
            ti = int(hits[0, 1]) if bad.dim() == 2 else int(self.last[bi])
            raise NonFiniteActivationError(
                f"model {self.mname!r}: non-finite activation in {where}, prompt {self.names[bi]!r} token {ti} "
                f"(model dtype {self.dtype}; try dtype: float32 or bfloat16)")


class BatchHooks:
    """The hooks of :func:`extract_batch` on ``model``, registered once for many batches: ``with BatchHooks(model,
    attention=...) as hk`` around a loop of ``extract_batch(..., hooks=hk)`` calls (``extract_to_hdf5`` keeps one
    for its whole loop). The hook set, its registration and the per-layer attention window / scaling / soft-cap
    lookups are paid once per extraction instead of once per batch; each batch's buffers are set in
    ``hk.cur`` before its forward pass. The values are those of one ``extract_batch`` call per batch.

    Points hooked: ``blocks.0.hook_resid_pre`` and every block's ``hook_resid_post`` (residual stream at the
    kept rows), ``attn.hook_k`` / ``attn.hook_v`` / ``attn.hook_z`` (final token), ``attn.hook_qk`` (final-query
    attention entropy, when ``attention``) of the blocks with attention (``attention_layers``; hybrid models: the
    other blocks' rows stay NaN, the contract's value there; state-space models: no attention buffers at all).
    ``final_token_only`` (prompt sets: every stored row is a final token):
    the last block's attention output projection and MLP run at the final tokens only (``capture.hooked``);
    batches with sampled positions or per-position statistics (corpus sets) need a registration without it."""

    def __init__(self, model, *, attention: bool, final_token_only: bool = False):
        self.model, self.attention = model, bool(attention)
        self.final_token_only = bool(final_token_only)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.summary = s = families.summarize(model.config)
        L = s.n_layers
        #: the blocks with attention (``architectures.attention_layers``): the ``attn.*`` points are hooked there
        #: only (every block of an attention-only model; none of a state-space model)
        self.attention_layers = arch.attention_layers(model)
        sizes = model_axis_sizes(s)
        #: per layer, the feature axes of each final-token store's dataset (those after prompt, layer) and their size
        self.feature_shapes = {name: tuple(sizes[d] for d in CONTRACT[name].dims[2:])
                               for name in FINAL_TOKEN_POINTS.values()}
        self.features = {name: int(np.prod(shape)) for name, shape in self.feature_shapes.items()}
        if attention:  # per layer, once (not per hook call): window, and the scaling / softcap the attention
            cfg = model.config  # function applies when the module passes none
            self.windows = [families.attention_window(cfg, l) for l in range(L)]
            self.scalings = [families.attention_scaling(cfg, l) if l in self.attention_layers else None for l in range(L)]
            self.softcap = families.attention_softcap(cfg)
        self.cur: _BatchBuffers | None = None
        self.session: dict | None = None
        self._cm = None
        self.hooks = self._points()

    def _points(self) -> dict:
        """Point name -> hook, from the contract's declaration (store.DatasetSpec.point): one name per quantity."""
        P = capture.point_name
        hooks = {P("hook_resid_pre", 0): self._embeddings}
        stores = {point: self._store(name) for point, name in FINAL_TOKEN_POINTS.items()}
        for i in range(self.summary.n_layers):
            hooks[P(CONTRACT[DS.LAST_TOKEN_RESIDUAL].point, i)] = self._block_out
        for i in self.attention_layers:  # hybrid / state-space models: the blocks with attention only
            for point, fn in stores.items():
                hooks[P(point, i)] = fn
            if self.attention:
                hooks[P(CONTRACT[DS.ATTENTION_ENTROPY].point, i)] = self._entropy
        return hooks

    # each hook: nothing kept for a forward outside extract_batch while registered (no current buffers)
    def _embeddings(self, h, pt):
        c = self.cur
        if c is None:
            return
        if c.locate:
            c.check(h, "embeddings (layer 0)")
        c.rows_all.take(h, self.device, out=c.resid[0])

    def _block_out(self, h, pt):
        c = self.cur
        if c is None:
            return
        L = self.summary.n_layers
        where = f"block {pt.layer} output (residual layer {pt.layer + 1})"
        if pt.layer == L - 1 and self.final_token_only:  # the model's values only at the final tokens
            c.check(c.rows_all.take(h, self.device, out=c.resid[L]), where)
            return
        if c.locate or pt.layer == L - 1:
            c.check(h, where)
        c.rows_all.take(h, self.device, out=c.resid[pt.layer + 1])

    def _store(self, name):
        def fn(t, pt):
            c = self.cur
            if c is None:
                return
            c.rows_last.take(t, self.device, out=c.stored[name][pt.layer])
        return fn

    def _entropy(self, a, pt):
        c = self.cur
        if c is None:
            return
        dev = self.device
        if a.probs is not None:  # the module's own probabilities (families.Family.module_attention)
            dev_a = a.probs.device
            p = a.probs[torch.arange(a.probs.shape[0], device=dev_a), :, c.last.to(dev_a)]  # [B, H, T]
            c.attn_ent[pt.layer] = attention_row_entropy(p).to(dev)
            return
        window = self.windows[pt.layer]
        hk = c.hidden_keys.get(window)
        if hk is None or hk.device != a.query.device:
            hk = c.hidden_keys[window] = final_query_hidden_keys(c.last, c.valid, c.T, window, a.query.device)
        # the mask the call received: beyond the reconstructed causal / padding / window keys (hk), what the module
        # merged in (DeepSeek Sparse Attention's indexer selection, Doge's dynamic bias)
        row = final_query_mask_row(a.mask, c.last, a.key.shape[2])
        p, sink = last_query_attention(
            a.query, a.key, c.last, c.valid, softcap=a.softcap if a.softcap is not None else self.softcap,
            scaling=a.scaling if a.scaling is not None else self.scalings[pt.layer], window=window, hidden=hk,
            mask_row=row, sinks=a.sinks, with_sink=True)
        c.attn_ent[pt.layer] = attention_row_entropy(p, sink).to(dev)  # with sinks: keys plus the sink outcome

    def __enter__(self) -> "BatchHooks":
        self._cm = capture.hooked(self.model, self.hooks, final_token_only=self.final_token_only)
        self.session = self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        cm, self._cm, self.session, self.cur = self._cm, None, None, None
        return cm.__exit__(*exc)


def extract_batch(model, seqs: list[list[int]], *, attention: bool, top_k: int,
                  sample_positions: list[list[int]] | None = None, token_stats: bool = False,
                  prompt_ids: list[str] | None = None, head: Float32Head | None = None,
                  pad_id: int = 0, candidates: list[list[int]] | None = None,
                  model_name: str | None = None, locate_non_finite: bool = False,
                  hooks: BatchHooks | None = None) -> dict:
    """Run one batch and return numpy arrays per prompt (first axis = batch), keyed by HDF5 dataset name.

    The forward pass runs through the capture API (:func:`llmgeom.extract.capture.run`) with hooks on its
    named points (:class:`BatchHooks`); each hook keeps only the rows the contract needs (final tokens, sampled
    positions).

    Args:
        seqs: token ids per prompt (no padding).
        attention: compute final-query attention entropy per head, from the queries and keys that
            the model's attention function receives (point ``blocks.<l>.attn.hook_qk``): any
            attention implementation (sdpa, flash attention, eager), no [B, H, T, T] weights.
        sample_positions: per prompt, token positions whose residual stream to keep (corpus sets).
        token_stats: per-position margin / nll / entropy for positions 1..len-2 (corpus sets).
        candidates: per prompt, the same number C of token ids whose next-token log-probability
            (over the full vocabulary, float32) to return as ``next_token/candidate_logprobs`` [B, C] nats
            (SULA labels; Paper III sec. 4.3).
        hooks: an active :class:`BatchHooks` on ``model`` with the same ``attention`` (many batches, one
            registration; ``final_token_only`` only for batches without ``sample_positions`` and
            ``token_stats``); None registers this call's own (``final_token_only`` where those are absent).

    Returns:
        dataset name (``llmgeom.core.store.CONTRACT``) -> array: ``last_token/residual`` [B, L+1, d_model],
        ``last_token/final_normed`` [B, d_unembed], ``last_token/values`` [B, L, n_kv*hd], ``last_token/keys``
        [B, L, n_kv, hd], ``last_token/attn_output`` [B, L, H*hd], ``next_token/entropy`` [B] nats,
        ``next_token/top_ids`` / ``top_logits`` [B, k], ``next_token/candidate_logprobs`` [B, C] (if candidates),
        ``attention/entropy`` [B, L, H] nats (if attention); the per-layer attention arrays are NaN at the layers
        without attention (``architectures.attention_layers``) and absent for a model without any;
        ``tokens/residual_sample`` [S, L+1, d],
        ``tokens/final_normed_sample`` [S, d_unembed], ``tokens/sample_prompt`` (batch row) /
        ``tokens/sample_position`` / ``tokens/sample_next_token`` (-1 at a prompt's last token) [S] (if sample_positions); ``tokens/margin`` / ``nll`` / ``entropy`` /
        ``prompt`` (batch row) / ``position`` [P] (if token_stats).

    Non-finite activations: a non-finite value at a real token of a block's output stays non-finite in every
    later block's output (the residual stream adds to it: NaN + x, inf - inf), so only the last block's
    output and the final norm's are checked (at the final tokens where the last block runs there only: a
    non-finite value at an earlier real token reaches them where a later block's final query attends to it;
    one that no final token depends on is not reported, and nothing stored depends on it); when one fails, the batch is run again with every layer checked
    (``locate_non_finite=True``), which names the first layer and token (one check per batch instead of
    n_layers + 1 reads of the [B, T, d_model] residual stream).

    Raises:
        NonFiniteActivationError: naming the model (``model_name``, default the config's
            ``_name_or_path`` / model_type), the layer and the prompt.
        ValueError: ``hooks`` inactive, on another model, for the other ``attention`` setting, or registered
            ``final_token_only`` for a batch with sampled positions or per-position statistics.
    """
    args = dict(attention=attention, top_k=top_k, sample_positions=sample_positions, token_stats=token_stats,
                prompt_ids=prompt_ids, head=head, pad_id=pad_id, candidates=candidates, model_name=model_name,
                locate_non_finite=locate_non_finite)
    if hooks is None:  # the steps themselves, not the module's name (tests and benchmarks wrap extract_batch)
        with BatchHooks(model, attention=attention,
                        final_token_only=sample_positions is None and not token_stats) as own:
            return _batch_steps(model, seqs, hooks=own, **args)
    return _batch_steps(model, seqs, hooks=hooks, **args)


def _batch_steps(model, seqs, *, attention, top_k, sample_positions, token_stats, prompt_ids, head, pad_id,
                 candidates, model_name, locate_non_finite, hooks: BatchHooks) -> dict:
    """:func:`extract_batch` with its hooks: check them, then the steps forward, final-token results, next-token
    results, per-position statistics."""
    if hooks.session is None or hooks.model is not model or hooks.attention != bool(attention):
        raise ValueError("extract_batch: hooks must be an active BatchHooks (with BatchHooks(model, attention=...)) "
                         f"on this model with attention={bool(attention)}")
    if hooks.final_token_only and (sample_positions is not None or token_stats):
        raise ValueError("extract_batch: sampled positions and per-position statistics (corpus sets) need the whole "
                         "last block; register the hooks with BatchHooks(..., final_token_only=False)")
    mname = model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
    head = head or Float32Head(model)
    batch = capture.make_batch(model, seqs, pad_id)
    names = prompt_ids or [str(i) for i in range(len(seqs))]
    out, c = _forward(model, batch, hooks, head, names, mname, sample_positions, locate_non_finite)
    with torch.inference_mode():
        res = _final_token_results(hooks, c, out, seqs, sample_positions)
        res.update(_next_token_results(out.logits, names, mname, top_k, candidates))
        if token_stats:
            res.update(_token_stats(seqs, out.hidden, batch.ids, head, hooks.device, names, mname))
    return res


def _forward(model, batch, hooks: BatchHooks, head, names, mname, sample_positions, locate: bool):
    """Step 1 of :func:`extract_batch`: the forward pass with this batch's buffers in ``hooks.cur``; returns
    ``(capture.run's output, the buffers)``. A non-finite final-norm output runs the batch again with every layer
    checked (``locate``), which raises NonFiniteActivationError naming the first layer and token."""
    c = hooks.cur = _BatchBuffers(hooks, batch, names, mname, sample_positions, locate)
    try:
        out = capture.run(model, batch, head=head, model_name=mname, session=hooks.session)
        with torch.inference_mode():
            c.check(out.hidden[:, 0] if hooks.final_token_only else out.hidden, "final norm output")
    except NonFiniteActivationError:
        if locate:
            raise
        return _forward(model, batch, hooks, head, names, mname, sample_positions, True)
    finally:
        hooks.cur = None
    return out, c


def _final_token_results(hooks: BatchHooks, c: _BatchBuffers, out, seqs, sample_positions) -> dict:
    """Step 2: the hooked buffers as dataset arrays (batch-major): residual stream, final-token stores
    (:data:`FINAL_TOKEN_POINTS`), final norm output, attention entropy; sampled positions' rows (corpus sets)."""
    dev, B, L = hooks.device, len(seqs), hooks.summary.n_layers
    hT = out.hidden
    res: dict = {}
    R = c.resid.transpose(0, 1)  # [G, L+1, d]
    res[DS.LAST_TOKEN_RESIDUAL] = R[:B].contiguous().cpu().numpy()
    if sample_positions is not None:
        res[DS.TOKENS_RESIDUAL_SAMPLE] = R[B:].contiguous().cpu().numpy()
        res[DS.TOKENS_FINAL_NORMED_SAMPLE] = rows_at(hT, c.gb[B:], c.gt[B:], dev).cpu().numpy()
        res[DS.TOKENS_SAMPLE_PROMPT] = np.asarray(c.samp_b, dtype=np.int64)
        res[DS.TOKENS_SAMPLE_POSITION] = np.asarray(c.samp_t, dtype=np.int32)
        nxt = [seqs[i][t + 1] if t + 1 < len(seqs[i]) else -1 for i, t in zip(c.samp_b, c.samp_t)]
        res[DS.TOKENS_SAMPLE_NEXT_TOKEN] = np.asarray(nxt, dtype=np.int32)
    res[DS.LAST_TOKEN_FINAL_NORMED] = (hT[:, 0].float().to(dev) if hooks.final_token_only
                                       else c.rows_last.take(hT, dev)).cpu().numpy()
    for name, buf in c.stored.items():  # [L, B, features] -> [B, L, *the dataset's feature axes]
        res[name] = buf.transpose(0, 1).reshape((B, L) + hooks.feature_shapes[name]).contiguous().cpu().numpy()
    if c.attn_ent is not None:
        res[DS.ATTENTION_ENTROPY] = c.attn_ent.transpose(0, 1).contiguous().cpu().numpy()  # [B, L, H]
    return res


def _next_token_results(logits, names, mname, top_k: int, candidates) -> dict:
    """Step 3: next-token entropy, top-k and candidate log-probabilities from the final tokens' float32 logits
    [B, V]; NonFiniteActivationError on a non-finite logit."""
    ent = entropy_nats(logits)
    # a non-finite logit makes its row's entropy non-finite (NaN: inf - inf in the log-softmax, 0 * -inf), so the
    # check of the [B] entropies replaces a pass over the [B, V] logits (262k-token vocabularies: ~1/3 of this step)
    if not bool(torch.isfinite(ent).all()):
        bi = int((~torch.isfinite(logits)).any(-1).nonzero()[0][0])
        raise NonFiniteActivationError(f"model {mname!r}: non-finite logits (final layer, unembedding) at the "
                                       f"final token of prompt {names[bi]!r}; try dtype: float32 or bfloat16")
    res = {DS.NEXT_TOKEN_ENTROPY: ent.cpu().numpy()}
    tv, ti = logits.topk(min(top_k, logits.shape[-1]), dim=-1)
    res[DS.NEXT_TOKEN_TOP_IDS] = ti.cpu().numpy()
    res[DS.NEXT_TOKEN_TOP_LOGITS] = tv.cpu().numpy()
    if candidates is not None:
        res[DS.NEXT_TOKEN_CANDIDATE_LOGPROBS] = capture.candidate_logprobs(logits, candidates).cpu().numpy()
    return res


def _token_stats(seqs, hT, ids, head: Float32Head, dev, names, mname) -> dict:
    """Step 4 (corpus sets): top-1 minus top-2 logit, NLL of the next token and entropy (nats) at positions
    1..len-2 of every prompt, from the final norm's output ``hT`` [B, T, d] in chunks of ``head.chunk`` rows."""
    res: dict = {}
    tb, tt = [], []
    for i, sq in enumerate(seqs):
        for t in range(1, len(sq) - 1):
            tb.append(i)
            tt.append(t)
    tb_t = torch.tensor(tb, dtype=torch.long, device=dev)
    tt_t = torch.tensor(tt, dtype=torch.long, device=dev)
    margins, nlls, ents = [], [], []
    # two [chunk, V] float32 buffers for all chunks (logits, then probabilities; log-probabilities):
    # a new tensor of that size per step is a fresh mmap whose pages fault in (262k-token vocabularies)
    m = min(head.chunk, len(tb))
    zbuf = torch.empty((m, head.W.shape[0]), dtype=torch.float32, device=head.W.device)
    lbuf = torch.empty_like(zbuf)
    for j in range(0, len(tb), head.chunk):
        bb, ttt = tb_t[j:j + head.chunk], tt_t[j:j + head.chunk]
        z = head(rows_at(hT, bb, ttt, hT.device), out=zbuf[:len(bb)])  # [chunk, V] float32
        top2 = z.topk(2, dim=-1).values
        margins.append(top2[:, 0] - top2[:, 1])
        logp = torch.log_softmax(z, -1, out=lbuf[:len(bb)])
        bad_z = None
        if not bool(torch.isfinite(margins[-1]).all()):  # NaN / +inf logits: top-1 is NaN or inf
            bad_z = ~torch.isfinite(z).all(-1)
        nlls.append(-logp.gather(1, ids[bb, ttt + 1].unsqueeze(1).to(logp.device)).squeeze(1))
        p = torch.exp(logp, out=z)  # the logits are spent: their buffer takes the probabilities
        ents.append(-p.mul_(logp).sum(-1))  # in place: the same products, no third buffer
        del p, logp, z
        # any non-finite logit makes the row's margin (NaN, +inf) or entropy (-inf: 0 * -inf) non-finite,
        # so checking the [chunk] statistics replaces a test over the [chunk, V] logits
        if bad_z is not None or not bool(torch.isfinite(ents[-1]).all()):
            rows = bad_z if bad_z is not None else ~torch.isfinite(ents[-1])
            bi = int(bb[rows.to(bb.device)][0])
            raise NonFiniteActivationError(f"model {mname!r}: non-finite logits (final layer, unembedding) "
                                           f"in prompt {names[bi]!r}; try dtype: float32 or bfloat16")
    del zbuf, lbuf
    cat = (lambda xs: torch.cat([x.cpu() for x in xs]).numpy() if xs else np.zeros(0, np.float32))
    res[DS.TOKENS_MARGIN], res[DS.TOKENS_NLL], res[DS.TOKENS_ENTROPY] = cat(margins), cat(nlls), cat(ents)
    res[DS.TOKENS_PROMPT] = np.asarray(tb, dtype=np.int64)
    res[DS.TOKENS_POSITION] = np.asarray(tt, dtype=np.int32)
    return res


