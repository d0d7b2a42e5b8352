"""Activation extraction: one batched forward pass per batch through the capture API
(``extract.capture``), hooks on its named points that keep only what the HDF5 contract
(``core.store.CONTRACT``) needs, logits recomputed in float32.

Prompts are tokenized one by one and right-padded (``capture.make_batch``; the tokenizer's own
padding side never matters); the final position of each prompt is found from the attention mask.
Position ids are passed explicitly so padding cannot shift them. Batching with padding does not
change any stored value (tests/unit/extract/test_extraction.py).

The pre-norm residual stream comes from ``blocks.<l>.hook_resid_post`` (``hidden_states[-1]`` is
post-norm in most families). ``extract_to_hdf5`` is resumable: the ``.partial`` file records its
committed batches (checksummed) and a rerun with the same inputs and the same code (``EXTRACTION_CODE``)
continues from there; SIGUSR1 / SIGTERM stop it cleanly after the batch in flight (:class:`ExtractionInterrupted`; a SIGUSR1 after the last
batch started, or any signal during the commit, lets the complete file be committed). The hooks are
registered once per ``extract_to_hdf5`` call (:class:`BatchHooks`), not once per batch. One writer per output:
``extract_to_hdf5`` holds the output's lease (``llmgeom.core.lease``, ``<out>.lease``) from before it
opens the partial file until the file is committed, and checks it before every batch's write and commit.

Named steps (docs/design-notes.md): one batch is ``extract.batch.extract_batch`` (its hooks
``extract.batch.BatchHooks``, registered once per call); ``extract_to_hdf5`` = ``_load``, ``_plan``
(tokenize and order), ``space.check_space`` (the file's size estimated from the contract, against the free space:
refused before any forward pass), ``_open_output`` (lease, partial file, reserve), ``_resume``, ``_batch_loop``
(write-behind: ``_WriteBehind``), ``_commit``; a full disk on the way: ``space.disk_full`` (the partial file keeps
its committed batches). Dataset names come from ``core.store.DS``.

Source: DESIGN.md sections 2 and 4; Paper III sec. 4 (last-token values, keys,
attention entropy); LSM (token-level margins, residual samples).
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmgeom.core.lease import LeaseLost, OutputLease
from llmgeom.core.progress import progress
from llmgeom.core.io import disk_full_guard, is_disk_full
from llmgeom.core.store import DS, CONTRACT, CONTRACT_VERSION, contract_shapes, estimate_nbytes
from llmgeom.core.writer import ActivationWriter
from llmgeom.core.versions import package_versions, source_sha256
from llmgeom.extract import space
from llmgeom.extract.batch import BatchHooks, NonFiniteActivationError, extract_batch, model_axis_sizes
from llmgeom.extract.capture import Float32Head
from llmgeom.models import architectures as arch
from llmgeom.models import families


#: the subpackages whose source code is part of the resume key (``core.versions.source_sha256``): those holding
#: every module an extraction runs (the import closure of this module; tests/unit/core/test_store.py checks it)
EXTRACTION_CODE = ("core", "extract", "models", "prompts")


class PromptTokenError(ValueError):
    """A prompt that cannot be extracted (zero tokens, longer than the model's context)."""


class ExtractionInterrupted(RuntimeError):
    """The extraction stopped on SIGUSR1/SIGTERM (a SLURM warning signal before the time limit, a
    preemption) after its last committed batch; ``<out>.partial`` keeps the committed batches and a
    rerun with the same inputs resumes from there. ``exit_code`` = 128 + signal number."""

    def __init__(self, signum: int, partial, n_done: int, n_batches: int):
        self.signum, self.partial, self.exit_code = signum, partial, 128 + int(signum)
        super().__init__(f"stopped by {signal.Signals(signum).name} after {n_done} of {n_batches} batches; "
                         f"{partial} keeps them, rerun the same extraction to resume")


class _StopRequest:
    """While active (main thread only), SIGUSR1 and SIGTERM set ``signum`` instead of killing the process,
    so the batch in flight finishes and is committed; the previous handlers come back on exit."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._old = {}

    def _set(self, signum, frame):
        self.signum = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._set)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def tokenize_prompts(tok, texts: list[str], ids: list[str], *, max_tokens: int | None, truncate: bool,
                     context: int | None) -> list[list[int]]:
    """Token ids per prompt (with the tokenizer's special tokens).

    Raises:
        PromptTokenError: a prompt with zero tokens, or longer than ``max_tokens`` /
            the model context when ``truncate`` is False.
    """
    out = []
    n_special = len(tok("", add_special_tokens=True)["input_ids"])
    limit = min(x for x in (max_tokens, context) if x) if (max_tokens or context) else None
    for pid, text in zip(ids, texts):
        t = tok(text, add_special_tokens=True)["input_ids"]
        if len(t) <= n_special:
            raise PromptTokenError(f"prompt {pid!r} tokenizes to zero tokens; remove it or rebuild the prompt set")
        if limit and len(t) > limit:
            if not truncate:
                raise PromptTokenError(
                    f"prompt {pid!r} has {len(t)} tokens, more than the limit {limit} "
                    f"(token budget {max_tokens}, model context {context}); lower the set's token budget "
                    "(prompts.sets.<name>.token_budget, else prompts.token_budget)")
            t = t[:limit]
        out.append(t)
    return out


def extract_to_hdf5(model_dir, prompts_path, out_path, *, model_name: str, dtype: str, device: str, batch_size: int,
                    top_k: int, sample_per_prompt: int, device_map: str | None, attention: bool = True,
                    corpus: bool = False, max_tokens: int | None = None, seed: int = 0,
                    candidates_key: str | None = None,
                    mem_mb: int | None = None, attn_implementation: str = "sdpa", reuse_model: bool = False,
                    write_behind: bool | None = None, log=print) -> Path:
    """Extract every dataset of the HDF5 contract for one model and one prompt set.

    The model is loaded with ``attn_implementation`` (default sdpa; "flash_attention_2" on a GPU that
    has it); attention entropies are computed from hooked queries and keys, so eager attention is
    never needed. Corpus sets
    (``corpus=True``) add token-level margins, NLL and entropy at positions
    1..len-2 and residual-stream samples at ``sample_per_prompt`` seeded
    positions per passage (position 0 / BOS excluded). Written to
    ``<out_path>.partial`` and renamed when complete.

    Resumable: each batch is committed to the partial file with the sha256 of what it
    wrote; a rerun with the same inputs (prompt-set sha256, model, dtype, device, every setting here,
    batch size) verifies the committed batches and computes only the missing ones, giving the same bytes
    in every dataset as an uninterrupted run. A partial from other inputs, or one that fails its checks,
    is discarded with a log line. SIGUSR1 / SIGTERM (e.g. SLURM ``--signal=USR1@<s>``, which reaches every
    job step and so the model server's; or the server's own stop request, ``model_server._request_stop``):
    the batch in flight finishes and is committed, the partial is flushed and closed, and
    :class:`ExtractionInterrupted` is raised. Once the last batch has started: SIGTERM (the job is ending)
    still stops it, with every batch in the partial file (the rerun only verifies and commits); SIGUSR1 (SLURM's
    warning, time left) and any signal during the commit stop nothing: the file is committed as complete, with a
    log line naming the signal.

    ``candidates_key`` (``llmgeom.prompts.io.CANDIDATES_KEY`` for SULA and wind-tunnel sets) names a list of token ids in every
    prompt's meta (same length C for all prompts); their next-token log-probabilities at the final
    position are stored as ``next_token/candidate_logprobs`` [n, C] (float32, nats, over the full
    vocabulary) with the ids in ``next_token/candidate_ids`` [n, C] int64.

    ``write_behind``: True writes and commits each batch on a background thread while the next batch's forward
    pass runs (h5py releases the GIL in dataset writes); False writes it in the loop. None (default): True
    when the model runs on an accelerator (the host waits on the device meanwhile), False on CPU, where the
    forward's own threads already use the cores the writer would take (SmolLM2-135M, 2 threads on 2 cores:
    0.94x the body-only forward with the writer thread, 0.97x without). The file holds the same
    bytes either way (tests/unit/core/test_store.py).

    ``reuse_model``: keep the loaded model in this process for the next call (``load_prepared(reuse=True)``;
    the model server). ``mem_mb`` (the job's declared memory) is checked against the model's size before loading
    (``models.check_memory``; on CUDA the GPUs' memory is checked in any case).

    Raises:
        PromptTokenError, NonFiniteActivationError, PromptDataError (via read_prompt_set);
        ValueError: a prompt without valid candidate ids when ``candidates_key`` is given;
        ModelMemoryError: the model cannot fit, before any weight is read.
        DiskFullError (``core.io``, an OSError with errno ENOSPC): before any forward pass, the file's estimated
            size (``space.check_space``) does not fit on the output's file system; or the file system filled
            while the file was written: the partial file keeps the committed batches, closed intact, and a rerun
            with the same inputs resumes from them. The message names the file, the free space and the bytes
            needed (the next batch, the rest of the file).
        ExtractionInterrupted: stopped by SIGUSR1/SIGTERM (the partial file keeps the committed batches).
        LeaseHeld: another job holds a live lease on ``out_path`` (``<out_path>.lease``; it names that job and
            host), and it did not end or expire within ``LLMGEOM_LEASE_WAIT_S``.
        LeaseLost: this writer lost its lease while it ran (its SLURM job ended, e.g. NODE_FAIL; it could not
            renew the lease; another writer took it over): it stopped before writing the next batch, and the
            partial file keeps the committed batches for the lease's holder.
    """
    t_call = time.time()
    model, tok, records, sha, manifest = _load(model_dir, prompts_path, dtype=dtype, device=device,
                                               device_map=device_map, mem_mb=mem_mb,
                                               attn_implementation=attn_implementation, reuse_model=reuse_model)
    p = _plan(model, tok, records, sha, manifest, prompts_path=prompts_path, model_name=model_name,
              batch_size=batch_size, top_k=top_k, attention=attention, corpus=corpus,
              sample_per_prompt=sample_per_prompt, max_tokens=max_tokens, seed=seed, candidates_key=candidates_key,
              log=log)
    space.check_space(out_path, p)
    lease, w = _open_output(out_path, p, log)
    if write_behind is None:
        write_behind = next(model.parameters()).device.type != "cpu"
    writer = _WriteBehind(write_behind)
    stop = _StopRequest()
    try:
        done = _resume(w, p)
        # registered once for every batch; prompt sets store final tokens only: the last block's attention
        # output projection and MLP run there only (corpus sets sample positions of the whole last block)
        with stop, BatchHooks(model, attention=attention, final_token_only=not corpus) as hooks:
            stats = _batch_loop(model, tok, p, w, lease, writer, stop, hooks, done)
            # still inside the stop handler: a signal from here on (SLURM's warning, SIGUSR1, after the last
            # batch's check; or any during the commit) must not kill the process half way through the commit
            return _commit(p, w, lease, writer, stop, done, stats, t_call, log)
    except ExtractionInterrupted as e:
        log(f"[extract] {e}")
        raise
    except LeaseLost as e:
        # another writer may own the partial file now: write nothing more (no abort, which would delete it)
        writer.drain(raise_errors=False)
        if w.f.id.valid:
            w.close_partial()
        log(f"[extract] {e}")
        raise
    except (KeyboardInterrupt, SystemExit):
        writer.drain(raise_errors=False)  # a batch still being written finishes (or fails) before the file is closed
        if w.f.id.valid:
            w.close_partial()  # keep the committed batches for a resume
        raise
    except BaseException as e:
        writer.drain(raise_errors=False)
        if not is_disk_full(e):
            w.abort()
            raise
        full = space.disk_full(w, p)  # keep the committed batches
        log(f"[extract] {full}")
        raise full from e
    finally:
        writer.shutdown()
        lease.release()


def _load(model_dir, prompts_path, *, dtype, device, device_map, mem_mb, attn_implementation, reuse_model):
    """Step "load" of :func:`extract_to_hdf5`: the prompt records and their sha256, the model's manifest, the
    model and its tokenizer (``models.load_prepared``: the memory check comes before any weight is read)."""
    from llmgeom.prompts.io import read_prompt_set
    from llmgeom.models.loading import load_prepared
    from llmgeom.models.sources import read_manifest

    records, sha = read_prompt_set(prompts_path)
    manifest = read_manifest(model_dir)
    model, tok = load_prepared(model_dir, dtype=dtype, attn=attn_implementation,
                               device=device, device_map=device_map, mem_mb=mem_mb, reuse=reuse_model)
    return model, tok, records, sha, manifest


@dataclass
class _Plan:
    """What one extraction writes and in which order (step "tokenize and order" of :func:`extract_to_hdf5`):
    the prompts' tokens, candidates and sampled positions, the file's shapes and attributes, the batches
    (longest prompts first), the rows each batch writes, and the resume key."""

    model_name: str
    set_name: str
    records: list
    texts: list[str]
    pids: list[str]
    seqs: list[list[int]]
    cands: list | None
    samples: list | None
    shapes: dict
    attrs: dict
    batches: list[list[int]]
    tok_offsets: np.ndarray
    samp_offsets: np.ndarray | None
    per_prompt: list[str]
    per_sample: list[str]
    per_position: list[str]
    attention: bool
    corpus: bool
    top_k: int
    resume_key: str = ""

    def nbytes(self) -> int:
        """Estimated size of the committed file (``store.estimate_nbytes`` of its contract shapes and strings)."""
        strings = sum(len(t.encode("utf-8")) for t in self.texts) + sum(
            len(json.dumps(r.get("meta", {}), sort_keys=True).encode("utf-8")) for r in self.records)
        return estimate_nbytes(self.shapes, string_bytes=strings)

    def batch_nbytes(self, j: int) -> int:
        """Estimated bytes batch ``j`` writes (its rows of every dataset)."""
        return estimate_nbytes(self.shapes, n_rows={k: len(v) for k, v in self.rows_of(j).items()})

    def rows_of(self, j: int) -> dict:
        """Rows of every dataset that batch ``j`` writes."""
        idx = np.array(self.batches[j], dtype=np.int64)
        out = {k: idx for k in self.per_prompt}
        if self.corpus:
            srows = np.concatenate([np.arange(self.samp_offsets[i], self.samp_offsets[i + 1]) for i in idx])
            trows = np.concatenate([np.arange(self.tok_offsets[i], self.tok_offsets[i + 1]) for i in idx])
            out.update({k: srows for k in self.per_sample})
            out.update({k: trows for k in self.per_position})
        return out


def _plan(model, tok, records, sha, manifest, *, prompts_path, model_name, batch_size, top_k, attention, corpus,
          sample_per_prompt, max_tokens, seed, candidates_key, log) -> _Plan:
    """Tokenize, check the candidates, sample the corpus positions, size the file and order the batches."""
    s = families.summarize(model.config)
    texts = [r["text"] for r in records]
    pids = [r.get("id", str(i)) for i, r in enumerate(records)]
    # token_budget is a target when prompts are built; here it only truncates corpus passages
    seqs = tokenize_prompts(tok, texts, pids, max_tokens=max_tokens if corpus else None, truncate=corpus,
                            context=s.max_positions)
    n = len(seqs)
    cands = _candidates(records, pids, candidates_key, s.vocab_size) if candidates_key else None
    set_name = Path(prompts_path).stem
    samples = short = None
    if corpus:
        samples, short = _sample_positions(seqs, pids, seed=seed, sample_per_prompt=sample_per_prompt,
                                           what=f"{model_name} {set_name}", log=log)
    d_unembed = arch.unembedding(model)[0].shape[1]
    L, d = s.n_layers, s.d_model
    sizes = dict(prompt=n, layer=L, resid_layer=L + 1, d_model=d, d_unembed=int(d_unembed),
                 rank=min(top_k, s.vocab_size), **model_axis_sizes(s))
    if cands is not None:
        sizes["candidate"] = len(cands[0])
    if corpus:
        sizes["sample"] = sum(len(x) for x in samples)
        sizes["position"] = sum(max(len(sq) - 2, 0) for sq in seqs)
    with_attention = list(arch.attention_layers(model))
    shapes = contract_shapes(sizes, attention=attention, candidates=cands is not None, corpus=corpus,
                             attention_layers=bool(with_attention))
    attrs = dict(model=model_name, source=manifest.get("source"), revision=manifest.get("revision"),
                 source_sha256=manifest.get("source_sha256"), torch_dtype=str(model.dtype).replace("torch.", ""),
                 device=str(next(model.parameters()).device),
                 attn_implementation=str(families.text_config(model.config)._attn_implementation),
                 n_layers=L, d_model=d, d_unembed=int(d_unembed), n_heads=s.n_heads, n_kv_heads=s.n_kv_heads,
                 head_dim=s.head_dim, vocab_size=s.vocab_size, architecture=s.as_dict(),
                 attention_layers=with_attention,
                 prompt_set=set_name, prompt_set_sha256=sha, top_k=top_k, seed=seed,
                 sample_per_prompt=sample_per_prompt if corpus else 0, kind="corpus" if corpus else "prompts")
    if corpus:
        attrs.update(n_short_passages=len(short), n_samples_requested=n * sample_per_prompt)
    order = sorted(range(n), key=lambda i: -len(seqs[i]))
    p = _Plan(model_name=model_name, set_name=set_name, records=records, texts=texts, pids=pids, seqs=seqs,
              cands=cands, samples=samples, shapes=shapes, attrs=attrs,
              batches=[order[j:j + batch_size] for j in range(0, n, batch_size)],
              tok_offsets=np.concatenate([[0], np.cumsum([max(len(sq) - 2, 0) for sq in seqs])]).astype(np.int64),
              samp_offsets=(np.concatenate([[0], np.cumsum([len(x) for x in samples])]).astype(np.int64)
                            if corpus else None),
              per_prompt=[k for k in shapes if not k.startswith(("prompts/", "tokens/"))],
              per_sample=[k for k in shapes if k.startswith("tokens/") and CONTRACT[k].dims[0] == "sample"],
              per_position=[k for k in shapes if k.startswith("tokens/") and CONTRACT[k].dims[0] == "position"],
              attention=attention, corpus=corpus, top_k=top_k)
    # everything that determines the file's content, the code that writes it included: a partial written with the
    # same key can be resumed
    p.resume_key = hashlib.sha256(json.dumps(dict(
        attrs={k: v for k, v in attrs.items()}, shapes={k: list(v[0]) for k, v in shapes.items()},
        batch_size=batch_size, attention=attention, candidates_key=candidates_key, max_tokens=max_tokens,
        contract_version=CONTRACT_VERSION, versions={k: v for k, v in package_versions().items()
                                                     if k in ("torch", "transformers", "llmgeom")},
        code=source_sha256(*EXTRACTION_CODE)),
        sort_keys=True, default=str).encode()).hexdigest()
    return p


def _candidates(records, pids, candidates_key: str, vocab_size: int) -> list:
    """Each prompt's candidate token ids (``meta[candidates_key]``), checked: same length C > 0, ids in the
    vocabulary. Raises ValueError naming the prompt."""
    cands = [r.get("meta", {}).get(candidates_key) for r in records]
    n_c = len(cands[0]) if isinstance(cands[0], list) else 0
    for pid, c in zip(pids, cands):
        if (not isinstance(c, list) or len(c) != n_c or n_c == 0
                or not all(isinstance(x, int) and 0 <= x < vocab_size for x in c)):
            raise ValueError(f"prompt {pid!r}: meta[{candidates_key!r}] must be a non-empty list of {n_c or 'C'} "
                             f"token ids in [0, {vocab_size}), got {c!r}; rebuild the prompt set for this model")
    return cands


def _sample_positions(seqs, pids, *, seed: int, sample_per_prompt: int, what: str, log):
    """Corpus sets: per passage, ``sample_per_prompt`` positions after position 0, without replacement (seeded
    ``[seed, passage index]``); fewer where a passage is shorter (warned and logged). Returns (samples, the ids
    of the short passages). Raises PromptTokenError when no passage has a position to sample."""
    samples = []
    for i, sq in enumerate(seqs):
        rng = np.random.default_rng([seed, i])
        cand = np.arange(1, len(sq))
        m = min(sample_per_prompt, len(cand))
        samples.append(sorted(rng.choice(cand, size=m, replace=False).tolist()) if m else [])
    short = [pids[i] for i, x in enumerate(samples) if len(x) < sample_per_prompt]
    if short:  # keep what there is (sampling without replacement), say so, record the count
        import warnings

        n = len(seqs)
        msg = (f"{what}: {len(short)} of {n} passages have fewer than "
               f"extract.sample_per_prompt={sample_per_prompt} positions after position 0 (e.g. {short[0]!r}); "
               f"all their positions are kept: {sum(len(x) for x in samples)} samples instead of "
               f"{n * sample_per_prompt} (attrs n_short_passages, n_samples_requested)")
        warnings.warn(msg, stacklevel=4)
        log(f"[extract] warning: {msg}")
    if not any(samples):
        raise PromptTokenError(f"{what}: no corpus passage has a token after "
                               "position 0, so there is nothing to sample; raise the prompt set's token_budget")
    return samples, short


def _open_output(out_path, p: _Plan, log):
    """One writer per output: the lease is taken before the partial file is opened (renewed while the
    extraction runs and checked before every batch's write and commit, ``llmgeom.core.lease``); then the
    partial file, resumable with ``p.resume_key``, and its reserve (``space.reserve_bytes``). Returns (lease,
    writer)."""
    with disk_full_guard(out_path, need=p.nbytes(), what="Nothing was computed."):
        lease = OutputLease(out_path, log=log).acquire()
        try:
            w = ActivationWriter(out_path, p.attrs, p.shapes, resume_key=p.resume_key, n_batches=len(p.batches),
                                 reserve_bytes=space.reserve_bytes(p), log=log)
        except BaseException:
            lease.release()
            raise
    return lease, w


def _resume(w: ActivationWriter, p: _Plan) -> set:
    """Step "resume": verify the batches a partial file committed before (their sha256) and write the prompt
    datasets; returns the indices of the batches not to compute again."""
    done = set(w.verify_batches(p.rows_of).tolist())
    w.write(DS.PROMPTS_TEXT, slice(None), p.texts)
    w.write(DS.PROMPTS_META, slice(None), [json.dumps(r.get("meta", {}), sort_keys=True) for r in p.records])
    w.write(DS.PROMPTS_N_TOKENS, slice(None), np.array([len(x) for x in p.seqs], np.int32))
    return done


def _write_batch(w: ActivationWriter, lease, p: _Plan, j: int, idx: list[int], r: dict) -> None:
    """Write batch ``j``'s results (``extract_batch``'s dict for prompts ``idx``) and commit it; LeaseLost,
    before anything is written, when this writer no longer holds the output's lease."""
    lease.check()
    w.begin_batch()
    rows = np.array(idx)
    for k in p.per_prompt:
        if k != DS.NEXT_TOKEN_CANDIDATE_IDS:
            w.write(k, rows, r[k])
    if p.cands is not None:
        w.write(DS.NEXT_TOKEN_CANDIDATE_IDS, rows, np.array([p.cands[i] for i in idx], np.int64))
    if p.corpus:
        for bi, i in enumerate(idx):
            sel = r[DS.TOKENS_SAMPLE_PROMPT] == bi
            sl = slice(int(p.samp_offsets[i]), int(p.samp_offsets[i + 1]))
            for k in p.per_sample:
                w.write(k, sl, np.full(sel.sum(), i, np.int32) if k == DS.TOKENS_SAMPLE_PROMPT else r[k][sel])
            tsel = r[DS.TOKENS_PROMPT] == bi
            tl = slice(int(p.tok_offsets[i]), int(p.tok_offsets[i + 1]))
            for k in p.per_position:
                w.write(k, tl, np.full(tsel.sum(), i, np.int32) if k == DS.TOKENS_PROMPT else r[k][tsel])
    lease.check()
    w.commit_batch(j)


class _WriteBehind:
    """Write-behind: batch j is written and committed on one background thread while batch j + 1's forward runs
    (h5py releases the GIL in dataset writes, hashlib in sha256); at most one write is in flight, and every exit
    path waits for it before the file is closed, so the file holds the same bytes as a sequential write. Off
    (``on`` False): :meth:`submit` writes in the caller's thread."""

    def __init__(self, on: bool):
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="llmgeom-h5-writer") if on else None
        self.pending: list = []

    def submit(self, fn, *args) -> None:
        if self.pool is not None:
            self.pending.append(self.pool.submit(fn, *args))
        else:
            fn(*args)

    def drain(self, raise_errors: bool = True) -> None:
        """Wait for the write in flight; its error is raised (``raise_errors``) or dropped. A wait that is
        itself interrupted (Ctrl-C) leaves the write pending, so the handler's drain waits for it again."""
        pending = self.pending
        while pending:
            try:
                pending[0].result()
            except BaseException:
                if pending[0].done():
                    pending.pop(0)
                if raise_errors:
                    raise
            else:
                pending.pop(0)

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _stopped(w: ActivationWriter, stop: _StopRequest, p: _Plan):
    """Close the partial file with the batches committed so far and raise ExtractionInterrupted."""
    n_done = len(w.done_batches())  # before the file is closed
    raise ExtractionInterrupted(stop.signum, w.close_partial(), n_done, len(p.batches))


def _batch_loop(model, tok, p: _Plan, w, lease, writer: _WriteBehind, stop: _StopRequest, hooks: BatchHooks,
                done: set) -> dict:
    """Step "the batch loop": every batch not in ``done`` through :func:`extract_batch`, its write behind the
    next forward; a stop request (SIGUSR1/SIGTERM) between batches closes the partial file
    (:class:`ExtractionInterrupted`). Returns the counts the log line reports."""
    head = Float32Head(model)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    t0, n_tok, t_fwd, n_run = time.time(), 0, 0.0, 0
    seqs, samples, cands, pids = p.seqs, p.samples, p.cands, p.pids
    bar = progress(total=len(seqs), desc=f"extract {p.model_name} {p.set_name}", unit="prompt")
    bar.update(sum(len(p.batches[j]) for j in done))
    for j, idx in enumerate(p.batches):
        if j in done:
            continue
        if stop.signum is not None:
            writer.drain()
            _stopped(w, stop, p)
        tb = time.perf_counter()
        r = extract_batch(model, [seqs[i] for i in idx], attention=p.attention, top_k=p.top_k,
                          sample_positions=[samples[i] for i in idx] if p.corpus else None,
                          token_stats=p.corpus, prompt_ids=[pids[i] for i in idx], head=head, pad_id=pad_id,
                          candidates=[cands[i] for i in idx] if cands is not None else None,
                          model_name=p.model_name, hooks=hooks)
        t_fwd += time.perf_counter() - tb  # forward pass, hooks and per-token statistics on the device
        writer.drain()  # the previous batch's write, which ran beside this forward
        writer.submit(_write_batch, w, lease, p, j, idx, r)
        del r  # written (or owned by the writer): not held through the next batch's forward pass
        n_run += 1
        n_tok += sum(len(seqs[i]) for i in idx)
        bar.update(len(idx))
        bar.set_postfix(tokens=n_tok, refresh=False)
    writer.drain()
    bar.close()
    return dict(t0=t0, n_tok=n_tok, t_fwd=t_fwd, n_run=n_run)


def _commit(p: _Plan, w, lease, writer, stop: _StopRequest, done: set, stats: dict, t_call: float, log) -> Path:
    """Step "commit" (inside the stop handler): a SIGTERM that came during the loop keeps every batch in the
    partial file (:class:`ExtractionInterrupted`); otherwise the log lines, the lease check and the atomic
    commit of the complete file."""
    what, n_batches = f"{p.model_name} {p.set_name}", len(p.batches)
    if stop.signum == signal.SIGTERM:
        # the job is ending (scancel, preemption, the time limit) and Snakemake removes the outputs of a
        # failed job: keep every batch in the partial file, so that the rerun only verifies and commits
        _stopped(w, stop, p)
    if done:
        log(f"[extract] {what}: resumed; {len(done)} of {n_batches} batches were committed before, "
            f"{stats['n_run']} computed now")
    n_tok = stats["n_tok"]
    log(f"[extract] {what}: {len(p.seqs)} prompts, {n_tok} tokens, "
        f"{n_tok / max(time.time() - stats['t0'], 1e-9):.0f} tokens/s on {p.attrs['device']}; "
        f"forward passes {stats['t_fwd']:.3f} s of {time.time() - t_call:.3f} s in extract_to_hdf5")
    lease.check()
    out = w.commit()
    if stop.signum is not None:
        log(f"[extract] {what}: {signal.Signals(stop.signum).name} arrived after the last batch had started (or "
            f"during the commit): all {n_batches} batches were done, so the file was committed ({out}) instead of "
            "stopped")
    return out
