"""Benchmarks for issue 7 (not a timed test): prints its figures and writes them to
``benchmarks/results/benchmarks.json`` and ``benchmarks/results/benchmarks.md``.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/run_benchmarks.py            # all
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/run_benchmarks.py extraction dryrun id
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/run_benchmarks.py extraction --model qwen2.5-coder-1.5b \
        --config config/scaling.yaml --long-n 2     # any prepared model by name

* ``extraction``: the full extraction (``extract_to_hdf5``: residual stream, values, keys, attention
  entropy, logit statistics, HDF5 write) against a bare ``model(input_ids, attention_mask)`` forward and the
  decoder body alone (no LM head; the tighter reference) over the same batches (same prompts, tokenization,
  length-sorted order, padding, batch size), in tokens/s. Throughput: one process, the model loaded once
  (the cache the model server's extraction uses), ``--rounds`` rounds of bare / body / full in rotating
  order after a warm-up, torch threads fixed (``--threads``); the medians of the per-round ratios count,
  with the load average per round. Peak RSS: each variant in a fresh process (``--repeats``, alternating).
  Default: SmolLM2-135M prepared by the workflow (resources/models/smollm2-135m), CPU, float32, its study batch (16, its config entry),
  the ``mixed`` prompt set (~38 tokens). Targets (issue 21 item 4): full >= 0.95x the body-only tokens/s;
  peak private (anonymous) memory <= 1.2x the body's, at the default and at ``--long-n`` prompts of
  ``--long-tokens`` tokens (batch ``--long-batch``), with the peak RSS beside it (the RSS also counts the weight
  file's pages that a full-vocabulary head maps: shared page cache, not an allocation);
  the corpus rate of ``--corpus-model-dir`` (Gemma-3-270M: the 262k-token unembedding). After the rounds,
  where a full pass goes (forward with the hooks' gathers, float32 head, final-query attention entropy,
  statistics, HDF5 writes, setup and commit; ms per pass and share of the body-only pass), so that a
  slowdown shows up where it happens.
* ``dryrun``: ``snakemake -n`` wall time on an N-model config (the default study's analyses, N tiny
  random models; ``--n-models 20 100 500`` runs each size in turn, issue 21 point 6) after a full run. The "full run" goes through the SLURM executor plugin to the stub
  sbatch of tests/support/slurm_stub.py, which creates every job's outputs without running its code; Snakemake
  records metadata exactly as after a real run, and a no-op ``-n`` reads only that (DAG, mtimes,
  metadata), never the outputs' contents. Target: <= 3 s at 20 models, < 30 s at 500 (issue 21).
  ``--profile-dryrun`` also runs the last size's no-op dry run under cProfile and prints the top functions
  (by cumulative and by own time).
* ``growth``: ``extract_to_hdf5`` wall time against the number of prompts (``--growth-prompts``, default
  100, 1,000, 10,000 short prompts of 4-12 words) on the tiny random Llama of ``llmgeom.models.tiny``
  (CPU, float32, batch 16, ``--threads``), in seconds, prompts/s and HDF5 bytes (issue 21 point 6):
  what grows faster than linearly shows up as a falling prompts/s.
* ``id``: TwoNN and MLE intrinsic-dimension time against the number of points (d = 576, SmolLM2's width;
  points on a 10-dimensional curved manifold plus noise), one thread.

The load average is recorded before and after each part: the development machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gib = None
    import torch

    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib,
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --------------------------------------------------------------------------- extraction (child side)


def _batches(model_dir, prompts, batch):
    """Token id batches exactly as extract_to_hdf5 forms them."""
    from llmgeom.models import architectures as arch
    from llmgeom.extract.forward import tokenize_prompts
    from llmgeom.prompts.io import read_prompt_set
    from transformers import AutoConfig, AutoTokenizer

    from llmgeom.models.loading import resolve_weights_path as _weights_path

    wp = _weights_path(Path(model_dir))
    tok = AutoTokenizer.from_pretrained(wp)
    s = arch.summarize(AutoConfig.from_pretrained(wp))
    records, _ = read_prompt_set(prompts)
    seqs = tokenize_prompts(tok, [r["text"] for r in records], [r.get("id", str(i)) for i, r in enumerate(records)],
                            max_tokens=None, truncate=False, context=s.max_positions)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    return [[seqs[i] for i in order[j:j + batch]] for j in range(0, len(seqs), batch)], pad_id, len(seqs)


def child(args) -> dict:
    """One fresh process: ``args.variant`` (bare / body / full) over the benchmark's batches, ``args.passes``
    times; its peak RSS (the reason for a fresh process) and the fastest pass's tokens/s."""
    import torch

    torch.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    anon = _AnonPeak()  # private memory: the RSS less the pages mapped from files (the weights' safetensors)
    from llmgeom.models import loading as models
    from llmgeom.extract.forward import extract_to_hdf5

    batches, pad_id, n = _batches(args.model_dir, args.prompts, args.batch)
    n_tok = sum(len(s) for b in batches for s in b)
    res = {"variant": args.variant, "n_prompts": n, "n_tokens": n_tok, "rss_before_load_mib": rss0 / 1024}
    t = time.perf_counter()
    model, _ = models.load_prepared(args.model_dir, dtype=args.dtype, attn="sdpa", device="cpu", reuse=True)
    res["load_s"] = time.perf_counter() - t
    out = Path(args.out)
    logs, passes = [], []
    for _ in range(args.passes):
        t = time.perf_counter()
        if args.variant == "full":  # the whole call: tokenization, forwards, statistics, HDF5 (model cached)
            extract_to_hdf5(args.model_dir, args.prompts, out, model_name="bench", dtype=args.dtype, device="cpu",
                            batch_size=args.batch, attention=not args.corpus, corpus=args.corpus,
                            reuse_model=True, log=logs.append, top_k=10, sample_per_prompt=30, device_map=None)
        else:
            _forward_pass(model, batches, pad_id, body=args.variant == "body")
        passes.append(time.perf_counter() - t)
        if args.variant == "full":
            res["h5_bytes"] = out.stat().st_size
            out.unlink()
    res["pass_seconds"] = passes
    res["seconds"] = min(passes)
    if args.variant == "full":
        res["log"] = logs[-1] if logs else ""
        res["h5_bytes_per_prompt"] = res["h5_bytes"] / n
    res["tokens_per_s"] = n_tok / res["seconds"]
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["peak_anon_mib"], res["file_mib_at_end"] = anon.stop()
    return res


class _AnonPeak:
    """Peak anonymous (private) resident memory of this process, sampled every 5 ms from /proc/self/status
    (``RssAnon``), and the file-backed part at the end (``RssFile``: pages of mapped files, e.g. the
    safetensors weights that transformers maps; clean page cache, shared with other processes that map them).
    The peak RSS counts both: a forward that reads every weight (the unembedding of a 262k-token vocabulary)
    maps more of the file than one that reads the decoder body only, with no more private memory."""

    def __init__(self):
        import threading

        self._stop, self._t = threading.Event(), None
        self.peak = self._read()["RssAnon"]
        if self.peak == self.peak:  # NaN without /proc (macOS): nothing to sample
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()

    @staticmethod
    def _read() -> dict:
        try:
            with open("/proc/self/status") as f:
                got = {k: int(v.split()[0]) / 1024 for k, _, v in (ln.partition(":") for ln in f)
                       if k in ("RssAnon", "RssFile")}
        except OSError:
            got = {}
        return {k: got.get(k, float("nan")) for k in ("RssAnon", "RssFile")}

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._read()["RssAnon"])

    def stop(self) -> tuple[float, float]:
        """(peak private MiB, file-backed MiB now); NaN where /proc/self/status is missing."""
        self._stop.set()
        if self._t is not None:
            self._t.join()
        now = self._read()
        return max(self.peak, now["RssAnon"]) if self._t is not None else float("nan"), now["RssFile"]


def _forward_pass(model, batches, pad_id, *, body: bool, use_cache: bool | None = None, head=None) -> None:
    """The reference: ``model(input_ids, attention_mask)`` (bare, full-vocabulary logits at every position)
    or the decoder body alone (``body``: no LM head) over ``batches``, sdpa, no hooks. ``use_cache``: None
    calls the model as a user would (transformers builds a KV cache, the config's ``use_cache``); False
    builds none, as the extraction's own forward (``capture.run``), the stricter reference. ``head`` (a
    ``Float32Head``, with ``body``): also the least the HDF5 contract asks at the final token, the float32 logits
    over the full vocabulary, their entropy and top-10 (``next_token/*``), so that the vocabulary's own cost
    (Gemma-3: 262,144 tokens, 4% of the FLOPs of a 40-token prompt) is in the reference too."""
    import torch

    from llmgeom.extract.attention import entropy_nats
    from llmgeom.extract.capture import last_positions, pad_batch
    from llmgeom.models import architectures as arch

    fwd = arch.base_model(model) if body else model
    with torch.inference_mode():
        for b in batches:
            ids, mask, _ = pad_batch(b, pad_id, "cpu")
            out = fwd(input_ids=ids, attention_mask=mask, **({} if use_cache is None else {"use_cache": use_cache}))
            if head is not None:
                z = head(out.last_hidden_state[torch.arange(len(b)), last_positions(mask)])
                entropy_nats(z), z.topk(10, dim=-1)


def child_pairs(args) -> dict:
    """Throughput, one process: the model loaded once (``load_prepared(reuse=True)``, the cache the model
    server's extraction uses), then ``args.rounds`` rounds of bare, body and full over the same batches,
    the order rotating each round (so no variant always runs first after a pause), torch threads fixed.
    Per round: the ratio full / body and full / bare of tokens/s (the variants of one round ran within
    seconds of each other, under the same load); the medians count."""
    import gc

    import torch

    torch.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    from llmgeom.models import loading as models
    from llmgeom.extract.forward import extract_to_hdf5

    batches, pad_id, n = _batches(args.model_dir, args.prompts, args.batch)
    n_tok = sum(len(s) for b in batches for s in b)
    model, _ = models.load_prepared(args.model_dir, dtype=args.dtype, attn="sdpa", device="cpu", reuse=True)
    out = Path(args.out)

    def full():
        out.unlink(missing_ok=True)  # as in the workflow, where Snakemake removes a job's outputs before it runs
        extract_to_hdf5(args.model_dir, args.prompts, out, model_name="bench", dtype=args.dtype, device="cpu",
                        batch_size=args.batch, attention=True, reuse_model=True, log=lambda *x: None, top_k=10, sample_per_prompt=30, device_map=None)

    from llmgeom.extract.capture import Float32Head

    head = Float32Head(model)
    run = {"bare": lambda: _forward_pass(model, batches, pad_id, body=False),
           "body": lambda: _forward_pass(model, batches, pad_id, body=True),
           "body_head": lambda: _forward_pass(model, batches, pad_id, body=True, use_cache=False, head=head),
           "body_nocache": lambda: _forward_pass(model, batches, pad_id, body=True, use_cache=False), "full": full}
    names = list(run)
    for v in names:  # warm-up (first-touch of buffers, lazy imports), not counted
        run[v]()
    secs = {v: [] for v in names}
    cpu = {v: [] for v in names}
    loads = [load()[0]]
    for r in range(args.rounds):
        for v in names[r % len(names):] + names[:r % len(names)]:
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            run[v]()
            secs[v].append(time.perf_counter() - t)
            cpu[v].append(time.process_time() - c)
        loads.append(load()[0])
    h5_bytes = out.stat().st_size
    out.unlink()
    costs = _extraction_costs(full, passes=max(3, args.rounds // 4))
    return {"n_prompts": n, "n_tokens": n_tok, "seconds": secs, "cpu_seconds": cpu, "load_per_round": loads,
            "h5_bytes": h5_bytes, "costs_ms_per_pass": costs,
            "ratio_vs_body_per_round": [b / f for b, f in zip(secs["body"], secs["full"])],
            "ratio_vs_bare_per_round": [b / f for b, f in zip(secs["bare"], secs["full"])],
            "ratio_vs_body_nocache_per_round": [b / f for b, f in zip(secs["body_nocache"], secs["full"])],
            "ratio_vs_body_head_per_round": [b / f for b, f in zip(secs["body_head"], secs["full"])],
            # CPU time of all the process's threads (the writer's too): the work, less sensitive to other load
            "cpu_ratio_vs_body_per_round": [b / f for b, f in zip(cpu["body"], cpu["full"])]}


def _extraction_costs(full, passes: int) -> dict:
    """Where ``full()`` (one ``extract_to_hdf5`` pass) spends its time, ms per pass (median of ``passes`` passes
    run after the timed rounds): the package's functions timed by wrapping their module names in this process
    (as the tests' shims do); the wrappers add ~1 us per call. Keys: ``pass`` (the whole call); ``forward``
    (``capture.run`` without the head and the final-query attention: the decoder's forward with the other hooks,
    the gathers of the residual stream, keys, values and attention outputs, the hidden-key masks); ``head``
    (``Float32Head`` inside ``capture.run``: the final tokens); ``attention_entropy`` (``last_query_attention`` +
    ``attention_row_entropy``, in the attention hook); ``statistics`` (``extract_batch`` outside ``capture.run``:
    the batch and its buffers, the final-norm check, next-token entropy, top-k, copies to numpy; for corpus sets
    also the per-position head and statistics); ``hdf5`` (``ActivationWriter.write`` + ``commit_batch``, the
    ``prompts/*`` writes before the loop included: non-finite check, Fletcher-32, per-batch sha256, flush);
    ``setup_commit`` (the rest: prompt file, tokenization, file creation, the resume check, hook registration,
    final commit and rename)."""
    import collections

    import llmgeom.core.writer as writer
    import llmgeom.extract.batch as batch_mod
    import llmgeom.extract.capture as capture
    import llmgeom.extract.forward as fwd

    acc: dict = collections.defaultdict(float)
    restore = []
    in_run = [0]  # depth of capture.run calls: the head counts as "head" only there (corpus statistics call it too)

    def wrap(owner, name, key):
        orig = getattr(owner, name)

        def timed(*args, **kw):
            t = time.perf_counter()
            in_run[0] += key == "run"
            try:
                return orig(*args, **kw)
            finally:
                in_run[0] -= key == "run"
                if key != "head" or in_run[0]:
                    acc[key] += time.perf_counter() - t
        setattr(owner, name, timed)
        restore.append((owner, name, orig))

    for owner, name, key in ((fwd, "extract_batch", "extract_batch"), (capture, "run", "run"),
                             (capture.Float32Head, "__call__", "head"), (batch_mod, "last_query_attention", "lqa"),
                             (batch_mod, "attention_row_entropy", "entr"), (writer.ActivationWriter, "write", "write"),
                             (writer.ActivationWriter, "commit_batch", "commit_batch")):
        wrap(owner, name, key)
    per: dict = collections.defaultdict(list)
    try:
        for _ in range(passes):
            acc.clear()
            t = time.perf_counter()
            full()
            acc["pass"] = time.perf_counter() - t
            parts = {"pass": acc["pass"], "head": acc["head"], "attention_entropy": acc["lqa"] + acc["entr"],
                     "forward": acc["run"] - acc["head"] - acc["lqa"] - acc["entr"],
                     "statistics": acc["extract_batch"] - acc["run"], "hdf5": acc["write"] + acc["commit_batch"]}
            parts["setup_commit"] = acc["pass"] - acc["extract_batch"] - parts["hdf5"]
            for k, v in parts.items():
                per[k].append(v * 1e3)
    finally:
        for owner, name, orig in restore:
            setattr(owner, name, orig)
    return {k: statistics.median(v) for k, v in per.items()}


def _child_cmd(a, variant, prompts, batch, out, passes=None, corpus=False, model_dir=None) -> list:
    cmd = [sys.executable, __file__, "_child", "--variant", variant, "--model-dir", model_dir or a.model_dir,
           "--prompts", str(prompts), "--batch", str(batch), "--threads", str(a.threads), "--dtype", a.dtype,
           "--passes", str(a.passes if passes is None else passes), "--rounds", str(a.rounds), "--out", str(out)]
    return cmd + (["--corpus"] if corpus else [])


def _run_child(cmd, env) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _rounds(a, prompts, batch: int, tmp: Path, env: dict, tag: str = "") -> dict:
    """``a.repeats`` rounds of the bare / full / body variants, each in a fresh process (peak RSS), alternating."""
    runs = {"bare": [], "full": [], "body": []}
    for r in range(a.repeats):
        for variant in ("bare", "full", "body"):
            res = _run_child(_child_cmd(a, variant, prompts, batch, tmp / f"{tag}{variant}{r}.h5"), env)
            runs[variant].append(res)
            print(f"  [{tag}{variant} #{r + 1}] {res['tokens_per_s']:.0f} tokens/s, peak RSS {res['peak_rss_mib']:.0f} MiB"
                  f" (private {res['peak_anon_mib']:.0f}, mapped files {res['file_mib_at_end']:.0f} at the end),"
                  f" load avg {load()[0]}", flush=True)
    return runs


def bench_extraction(a) -> dict:
    """Throughput from :func:`child_pairs` (one process, rotating variants, median of the per-round ratios);
    peak RSS from fresh processes (:func:`_rounds`) at the default and the long prompts; the corpus rate."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    tmp = Path(tempfile.mkdtemp(prefix="llmgeom-bench-"))
    before = load()
    long = None
    try:
        pairs = _run_child(_child_cmd(a, "pairs", a.prompts, a.batch, tmp / "pairs.h5"), env)
        tps = {v: statistics.median(pairs["n_tokens"] / x for x in s) for v, s in pairs["seconds"].items()}
        for v in ("bare", "body", "body_nocache", "body_head", "full"):
            print(f"  [in-process {v}] median {tps[v]:.0f} tokens/s over {a.rounds} rounds", flush=True)
        print(f"  [in-process] full / body per round: {', '.join(f'{x:.3f}' for x in pairs['ratio_vs_body_per_round'])}"
              f" (median {statistics.median(pairs['ratio_vs_body_per_round']):.3f}); CPU time body / full per round: "
              f"{', '.join(f'{x:.3f}' for x in pairs['cpu_ratio_vs_body_per_round'])}; load average per round "
              f"{pairs['load_per_round']}", flush=True)
        print(f"  [in-process] full / body without a KV cache per round: "
              f"{', '.join(f'{x:.3f}' for x in pairs['ratio_vs_body_nocache_per_round'])} "
              f"(median {statistics.median(pairs['ratio_vs_body_nocache_per_round']):.3f})", flush=True)
        print(f"  [in-process] full / (body without a KV cache + the final-token float32 head, entropy, top-10) per "
              f"round: {', '.join(f'{x:.3f}' for x in pairs['ratio_vs_body_head_per_round'])} "
              f"(median {statistics.median(pairs['ratio_vs_body_head_per_round']):.3f})", flush=True)
        c = pairs["costs_ms_per_pass"]
        body_ms = 1e3 * statistics.median(pairs["seconds"]["body"])
        print("  [in-process] where a full pass goes, ms (share of the body-only pass, "
              f"{body_ms:.0f} ms): " + ", ".join(f"{k} {v:.0f} ({100 * v / body_ms:.1f}%)" for k, v in c.items()),
              flush=True)
        runs = _rounds(a, a.prompts, a.batch, tmp, env)
        if a.long_n:  # peak memory at long prompts (issue 21 item 4: <= 1.2x the body's at ~1,024 tokens)
            sys.path.insert(0, str(REPO / "benchmarks"))
            import gpu_check
            from transformers import AutoTokenizer

            from llmgeom.models.loading import resolve_weights_path

            gpu_check.PROMPTS = Path(a.prompts)
            lp = gpu_check.long_prompts(AutoTokenizer.from_pretrained(resolve_weights_path(Path(a.model_dir))),
                                        tmp / "long.jsonl", a.long_n, a.long_tokens)
            lr = _rounds(a, lp, a.long_batch, tmp, env, tag="long-")
            lm = {v: {k: statistics.median(r[k] for r in rs) for k in ("tokens_per_s", "peak_rss_mib", "peak_anon_mib")}
                  for v, rs in lr.items()}
            long = {"n_prompts": a.long_n, "tokens": a.long_tokens, "batch": a.long_batch, "median": lm,
                    "throughput_ratio_vs_body": lm["full"]["tokens_per_s"] / lm["body"]["tokens_per_s"],
                    "rss_ratio_vs_body": lm["full"]["peak_rss_mib"] / lm["body"]["peak_rss_mib"],
                    "anon_ratio_vs_body": lm["full"]["peak_anon_mib"] / lm["body"]["peak_anon_mib"],
                    "rss_ratio_vs_body_per_round": [f["peak_rss_mib"] / b["peak_rss_mib"]
                                                    for f, b in zip(lr["full"], lr["body"])]}
        corpus = None
        if a.corpus_prompts and Path(a.corpus_prompts).is_file():
            try:
                corpus = _run_child(_child_cmd(a, "full", a.corpus_prompts, a.corpus_batch or a.batch, tmp / "corpus.h5",
                                               passes=1, corpus=True, model_dir=a.corpus_model_dir), env)
                corpus["model_dir"] = a.corpus_model_dir or a.model_dir
            except RuntimeError as e:
                print(f"  [corpus] failed: {e}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in ("tokens_per_s", "peak_rss_mib", "seconds",
                                                                "peak_anon_mib", "file_mib_at_end")}
           for v, rs in runs.items()}
    out = {
        "model_dir": a.model_dir, "prompts": a.prompts, "batch": a.batch, "threads": a.threads, "dtype": a.dtype,
        "repeats": a.repeats, "passes": a.passes, "rounds": a.rounds, "n_prompts": pairs["n_prompts"],
        "n_tokens": pairs["n_tokens"], "tokens_per_prompt": pairs["n_tokens"] / pairs["n_prompts"],
        "bare_tokens_per_s": tps["bare"], "full_tokens_per_s": tps["full"], "body_tokens_per_s": tps["body"],
        "throughput_ratio": statistics.median(pairs["ratio_vs_bare_per_round"]),
        "throughput_ratio_per_pair": pairs["ratio_vs_bare_per_round"],
        "throughput_ratio_vs_body": statistics.median(pairs["ratio_vs_body_per_round"]),
        "throughput_ratio_vs_body_per_pair": pairs["ratio_vs_body_per_round"],
        "body_nocache_tokens_per_s": tps["body_nocache"],
        "throughput_ratio_vs_body_nocache": statistics.median(pairs["ratio_vs_body_nocache_per_round"]),
        "body_head_tokens_per_s": tps["body_head"],
        "throughput_ratio_vs_body_head": statistics.median(pairs["ratio_vs_body_head_per_round"]),
        "throughput_ratio_vs_body_head_per_pair": pairs["ratio_vs_body_head_per_round"],
        "cpu_ratio_vs_body": statistics.median(pairs["cpu_ratio_vs_body_per_round"]),
        "costs_ms_per_pass": pairs["costs_ms_per_pass"],
        "body_ms_per_pass": 1e3 * statistics.median(pairs["seconds"]["body"]),
        "load_per_round": pairs["load_per_round"],
        "bare_peak_rss_mib": med["bare"]["peak_rss_mib"], "full_peak_rss_mib": med["full"]["peak_rss_mib"],
        "rss_ratio": med["full"]["peak_rss_mib"] / med["bare"]["peak_rss_mib"],
        "rss_before_load_mib": runs["full"][0]["rss_before_load_mib"], "body_peak_rss_mib": med["body"]["peak_rss_mib"],
        "rss_ratio_vs_body": med["full"]["peak_rss_mib"] / med["body"]["peak_rss_mib"],
        "peak_anon_mib": {v: med[v]["peak_anon_mib"] for v in med},
        "file_mib_at_end": {v: med[v]["file_mib_at_end"] for v in med},
        "anon_ratio_vs_body": med["full"]["peak_anon_mib"] / med["body"]["peak_anon_mib"],
        "h5_bytes_per_prompt": pairs["h5_bytes"] / pairs["n_prompts"],
        "extract_log": runs["full"][-1].get("log", ""),
        "corpus": None if corpus is None else {k: corpus[k] for k in ("model_dir", "n_prompts", "n_tokens", "tokens_per_s",
                                                                       "peak_rss_mib", "h5_bytes_per_prompt")},
        "long": long,
        "load_before": before, "load_after": load(), "pairs": pairs, "runs": runs,
    }
    return out


# --------------------------------------------------------------------------- dry run on 20 models


def bench_dryrun_sizes(a) -> dict:
    """:func:`bench_dryrun` for each of ``a.n_models``; one result per size, in order."""
    rows = []
    for i, n in enumerate(a.n_models):
        rows.append(bench_dryrun(a, n, profile=a.profile_dryrun and i == len(a.n_models) - 1))
        r = rows[-1]
        print(f"  {n} models, {r['n_jobs']} jobs: no-op dry run {r['noop_dry_run_median_s']:.2f} s (median), "
              f"first dry run {r['dry_run_before_full_run_s']:.1f} s, stub full run {r['stub_full_run_s']:.0f} s", flush=True)
    return {"sizes": rows}


def bench_dryrun(a, n_models: int, profile: bool = False) -> dict:
    sys.path.insert(0, str(REPO / "tests" / "support"))
    import yaml

    import slurm_stub
    from llmgeom.models import tiny as testing

    tmp = Path(tempfile.mkdtemp(prefix="llmgeom-dryrun-"))
    keep = bool(os.environ.get("LLMGEOM_BENCH_KEEP"))
    try:
        src = testing.save_tiny_model_dir("llama", tmp / "src_models" / "tiny-llama")
        cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
        cfg["models"] = {f"model-{i:02d}": {"source": "hf_local", "path": str(src), "dtype": "float32",
                                             "batch_size": 8} for i in range(n_models)}
        wd = tmp / "wd"
        wd.mkdir()
        (wd / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        base = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(wd),
                "--configfile", str(wd / "config.yaml")]
        t = time.perf_counter()
        dry = subprocess.run(base + ["-n"], capture_output=True, text=True, env=env, cwd=wd)
        first_dry = time.perf_counter() - t
        jobs = slurm_stub.dry_run_jobs(dry.stdout)
        prof = wd / "profile"
        prof.mkdir()
        text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
        for k, v in {"<account>": "testacct", "<cpu-partition>": "cpu", "<gpu-partition>": "gpu"}.items():
            text = text.replace(k, v)
        (prof / "config.yaml").write_text(text)
        senv = slurm_stub.install(wd / "bin", wd / "state", jobs)
        t = time.perf_counter()
        run = subprocess.run(base + ["--profile", str(prof), "--slurm-init-seconds-before-status-checks", "1"],
                             capture_output=True, text=True, env=dict(senv, HF_HUB_OFFLINE="1"), cwd=wd)
        stub_s = time.perf_counter() - t
        if run.returncode != 0:
            raise RuntimeError(f"stub cluster run failed:\n{run.stderr[-4000:]}")
        before = load()
        times, nothing = [], []
        for _ in range(a.dry_repeats):
            t = time.perf_counter()
            r = subprocess.run(base + ["-n"], capture_output=True, text=True, env=env, cwd=wd)
            times.append(time.perf_counter() - t)
            nothing.append("Nothing to be done" in r.stdout + r.stderr)
            if not nothing[-1]:
                print(r.stdout[-3000:], flush=True)
        top = None
        if profile:
            pstats_file = tmp / "dryrun.pstats"
            subprocess.run([sys.executable, "-m", "cProfile", "-o", str(pstats_file), "-m", "snakemake"] + base[3:]
                           + ["-n"], capture_output=True, text=True, env=env, cwd=wd)
            import io
            import pstats

            buf = io.StringIO()
            stats = pstats.Stats(str(pstats_file), stream=buf)
            stats.sort_stats("cumulative").print_stats(30)
            stats.sort_stats("tottime").print_stats(20)  # where the time is spent, not only who calls it
            top = buf.getvalue()
            print(top, flush=True)
        return {"n_models": n_models, "cprofile_top": top, "n_jobs": len(jobs), "dry_run_before_full_run_s": first_dry,
                "stub_full_run_s": stub_s, "noop_dry_run_s": times, "noop_dry_run_median_s": statistics.median(times),
                "nothing_to_be_done": all(nothing), "load_before": before, "load_after": load()}
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- extraction vs number of prompts


def bench_growth(a) -> dict:
    """``extract_to_hdf5`` time against the number of short prompts on the tiny random Llama (issue 21)."""
    import numpy as np
    import torch

    from llmgeom.extract.forward import extract_to_hdf5
    from llmgeom.models import tiny
    from llmgeom.models.sources import prepare_model
    from llmgeom.prompts.io import write_prompt_set

    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp(prefix="llmgeom-growth-"))
    rows = []
    before = load()
    try:
        src = tiny.save_tiny_model_dir("llama", tmp / "src")
        prepared = tmp / "prepared"
        prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
        words = ["the", "model", "reads", "a", "short", "prompt", "about", "cats", "and", "numbers", "seven", "blue"]
        rng = np.random.default_rng(0)
        for n in a.growth_prompts:
            recs = [{"id": f"p{i:05d}", "text": " ".join(rng.choice(words, size=int(rng.integers(4, 13))))}
                    for i in range(n)]
            prompts = tmp / f"p{n}.jsonl"
            write_prompt_set(recs, prompts)
            out = tmp / f"p{n}.h5"
            t = time.perf_counter()
            c = time.process_time()
            extract_to_hdf5(prepared, prompts, out, model_name="tiny", dtype="float32", device="cpu",
                            batch_size=16, log=lambda *x: None, top_k=10, sample_per_prompt=30, device_map=None)
            dt, cpu = time.perf_counter() - t, time.process_time() - c
            rows.append({"n_prompts": n, "seconds": dt, "cpu_seconds": cpu, "prompts_per_s": n / dt,
                         "h5_bytes": out.stat().st_size})
            print(f"  {n:6d} prompts: {dt:7.2f} s wall, {cpu:7.2f} s CPU, {n / dt:7.0f} prompts/s, "
                  f"{out.stat().st_size / 1e6:.1f} MB (load {load()[0]})", flush=True)
            out.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"model": "llmgeom.models.tiny llama", "threads": a.threads, "batch": 16, "rows": rows,
            "load_before": before, "load_after": load()}


# --------------------------------------------------------------------------- intrinsic dimension


def bench_id(a) -> dict:
    import numpy as np
    from threadpoolctl import threadpool_limits

    from llmgeom.measures.intrinsic_dimension import mle_id, twonn

    rows = []
    before = load()
    with threadpool_limits(1):
        for n in a.id_points:
            rng = np.random.default_rng(0)
            z = rng.normal(size=(n, 10))
            X = np.concatenate([z, np.sin(z), z ** 2], axis=1) @ rng.normal(size=(30, 576))
            X = (X + 0.01 * rng.normal(size=X.shape)).astype(np.float32)
            for name, fn in (("twonn", lambda X: twonn(X)), ("mle", lambda X: mle_id(X, k=20))):
                t = time.perf_counter()
                r = fn(X)
                dt = time.perf_counter() - t
                est = r.get("id") if isinstance(r, dict) else r
                rows.append({"estimator": name, "n_points": n, "seconds": dt,
                             "estimate": float(est) if est is not None else None})
                print(f"  {name:6s} n={n:6d}: {dt:7.2f} s (ID {rows[-1]['estimate']})", flush=True)
    return {"d": 576, "intrinsic_dim_generating": 10, "threads": 1, "rows": rows, "load_before": before,
            "load_after": load()}


# --------------------------------------------------------------------------- report


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [f"# llmgeom benchmarks ({res['created']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, torch {m['torch']}"
             f"{', ' + m['cuda'] if m['cuda'] else ', no GPU'}; host {m['host']}.", ""]
    e = res.get("extraction")
    if e:
        lines += [f"## Extraction vs bare forward ({Path(e['model_dir']).name}, CPU {e['dtype']}, batch {e['batch']}, "
                  f"{e['threads']} threads, {e['n_prompts']} prompts, {e['tokens_per_prompt']:.1f} tokens/prompt)", "",
                  "| | tokens/s (one process, median of %d rotating rounds) | peak RSS MiB (fresh process) |"
                  % e.get("rounds", e["repeats"]), "|---|---|---|",
                  f"| bare `model(input_ids, attention_mask)` | {e['bare_tokens_per_s']:.0f} | {e['bare_peak_rss_mib']:.0f} |",
                  f"| full extraction (`extract_to_hdf5`) | {e['full_tokens_per_s']:.0f} | {e['full_peak_rss_mib']:.0f} |",
                  f"| ratio full / bare | {e['throughput_ratio']:.2f}x | {e['rss_ratio']:.2f}x |",
                  f"| body only, `model.model(input_ids, attention_mask)` (no LM head) | {e['body_tokens_per_s']:.0f} | {e['body_peak_rss_mib']:.0f} |",
                  f"| ratio full / body | **{e['throughput_ratio_vs_body']:.2f}x** (target >= 0.95) | {e['rss_ratio_vs_body']:.2f}x |",
                  *([f"| private (anonymous) memory, peak MiB: bare / full / body | | "
                     f"{e['peak_anon_mib']['bare']:.0f} / {e['peak_anon_mib']['full']:.0f} / {e['peak_anon_mib']['body']:.0f}"
                     f" (full / body **{e['anon_ratio_vs_body']:.2f}x**, target <= 1.2: the memory measure) |",
                     f"| mapped from the weight files at the end, MiB: bare / full / body | | "
                     f"{e['file_mib_at_end']['bare']:.0f} / {e['file_mib_at_end']['full']:.0f} / "
                     f"{e['file_mib_at_end']['body']:.0f} |"] if "anon_ratio_vs_body" in e else []),
                  *([f"| body only, `use_cache=False` (as the extraction's own forward) | {e['body_nocache_tokens_per_s']:.0f} | |",
                     f"| ratio full / body without a KV cache | {e['throughput_ratio_vs_body_nocache']:.2f}x | |"]
                    if "throughput_ratio_vs_body_nocache" in e else []),
                  *([f"| body without a KV cache + the final-token float32 head (logits over the vocabulary, entropy, "
                     f"top-10: the least the contract's `next_token/*` asks) | {e['body_head_tokens_per_s']:.0f} | |",
                     f"| ratio full / (body + final-token head) | **{e['throughput_ratio_vs_body_head']:.2f}x** "
                     f"(per round {', '.join(f'{x:.2f}' for x in e['throughput_ratio_vs_body_head_per_pair'])}) | |"]
                    if "throughput_ratio_vs_body_head" in e else []),
                  "", "The bare forward computes full-vocabulary logits at every position; the extraction computes them "
                  "(in float32) only at the final token (corpus sets: at every scored position, in chunks), so the "
                  "body-only forward is the tighter reference.",
                  "", f"Ratios are medians of per-round ratios (full / bare per round: "
                  f"{', '.join(f'{x:.2f}' for x in e['throughput_ratio_per_pair'])}); load average per round "
                  f"{e.get('load_per_round')}. "
                  f"RSS before loading the model: {e['rss_before_load_mib']:.0f} MiB. "
                  f"HDF5: {e['h5_bytes_per_prompt']:.0f} bytes per prompt"
                  + (f"; corpus set ({e['corpus']['n_prompts']} passages, {e['corpus']['n_tokens']} tokens): "
                     f"{e['corpus']['h5_bytes_per_prompt']:.0f} bytes per passage, {e['corpus']['tokens_per_s']:.0f} tokens/s"
                     if e.get("corpus") else "") + ".",
                  f"Per round full / body: {', '.join(f'{x:.2f}' for x in e.get('throughput_ratio_vs_body_per_pair', []))}"
                  + (f"; CPU time body / full (all threads, less sensitive to other load): median "
                     f"{e['cpu_ratio_vs_body']:.3f}" if "cpu_ratio_vs_body" in e else "") + "."]
        if e.get("costs_ms_per_pass"):
            c, body_ms = e["costs_ms_per_pass"], e["body_ms_per_pass"]
            lines += ["", f"Where a full pass goes (ms per pass, median of {max(3, e['rounds'] // 4)} passes after the "
                      f"rounds; share of the body-only pass, {body_ms:.0f} ms): "
                      + ", ".join(f"{k.replace('_', ' ')} {v:.0f} ({100 * v / body_ms:.1f}%)" for k, v in c.items())
                      + ". The forward includes the hooks' gathers; the head, the final-query attention entropy, "
                      "the statistics and the HDF5 writes are work the body-only forward does not do."]
        if e.get("long"):
            lg = e["long"]
            lines += ["", f"Long prompts ({lg['n_prompts']} x ~{lg['tokens']} tokens, batch {lg['batch']}): peak private memory "
                      f"full / body **{lg.get('anon_ratio_vs_body', float('nan')):.2f}x** (target <= 1.2), peak RSS full / body "
                      f"{lg['rss_ratio_vs_body']:.2f}x (with the weight file's page cache; per round "
                      f"{', '.join(f'{x:.2f}' for x in lg['rss_ratio_vs_body_per_round'])}), tokens/s full / body "
                      f"{lg['throughput_ratio_vs_body']:.2f}x; medians {lg['median']}."]
        if e.get("corpus"):
            c = e["corpus"]
            lines += ["", f"Corpus extraction ({Path(c['model_dir']).name}, per-position margin / NLL / entropy over the "
                      f"full vocabulary): {c['tokens_per_s']:.0f} tokens/s, peak RSS {c['peak_rss_mib']:.0f} MiB."]
        lines += [f"Load average before/after: {e['load_before']} / {e['load_after']}.", ""]
    dr = res.get("dryrun")
    for d in (dr.get("sizes", [dr]) if dr else []):  # older results: one size, no "sizes"
        lines += [f"## No-op `snakemake -n` on {d['n_models']} models ({d['n_jobs']} jobs) after a full run", "",
                  f"Median {d['noop_dry_run_median_s']:.2f} s over {len(d['noop_dry_run_s'])} runs "
                  f"({', '.join(f'{x:.2f}' for x in d['noop_dry_run_s'])} s; target <= 3 s at 20 models, < 30 s at 500); "
                  f"nothing scheduled: {d['nothing_to_be_done']}. First dry run (empty directory): "
                  f"{d['dry_run_before_full_run_s']:.1f} s; stub cluster full run: {d['stub_full_run_s']:.0f} s. "
                  f"Load average before/after: {d['load_before']} / {d['load_after']}.", ""]
    g = res.get("growth")
    if g:
        lines += [f"## Extraction time vs number of prompts ({g['model']}, CPU float32, batch {g['batch']}, "
                  f"{g['threads']} threads)", "", "| prompts | wall s | CPU s | prompts/s | HDF5 MB |", "|---|---|---|---|---|"]
        lines += [f"| {r['n_prompts']} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} | {r['prompts_per_s']:.0f} | "
                  f"{r['h5_bytes'] / 1e6:.1f} |" for r in g["rows"]]
        lines += ["", f"Load average before/after: {g['load_before']} / {g['load_after']}.", ""]
    i = res.get("id")
    if i:
        lines += ["## Intrinsic dimension time vs number of points (d = 576, 1 thread)", "",
                  "| n points | TwoNN s (estimate) | MLE k=20 s (estimate) |", "|---|---|---|"]
        by = {}
        for r in i["rows"]:
            by.setdefault(r["n_points"], {})[r["estimator"]] = r
        for n, v in sorted(by.items()):
            cells = [f"{v[e]['seconds']:.2f} ({v[e]['estimate']:.1f})" if e in v else "-" for e in ("twonn", "mle")]
            lines.append(f"| {n} | {cells[0]} | {cells[1]} |")
        lines += ["", "Points: a 10-dimensional curved manifold (z, sin z, z^2 mapped linearly to 576 dimensions) "
                  "plus 1% noise, float32; both estimators recover about 10."]
        lines += ["", f"Load average before/after: {i['load_before']} / {i['load_after']}.", ""]
    return "\n".join(lines)


def _resolve_model(a) -> None:
    """``--model NAME``: the model directory and output file of a named prepared model (in place); the batch size
    (unless ``--batch``) is the one the study runs for the model (``--model``, else the name of ``--model-dir``):
    its entry's ``batch_size`` in ``--config``, else the schema's default."""
    import yaml

    from llmgeom.pipeline.schema import apply_defaults, read_schema, section_schema

    if a.model:
        a.model_dir = str(REPO / "resources" / "models" / a.model)
        if not (Path(a.model_dir) / "manifest.json").is_file():
            raise SystemExit(f"{a.model_dir} is not a prepared model: run `snakemake --configfile {a.config} "
                             f"--cores 2 resources/models/{a.model}` first")
        a.out = a.out or str(OUT / f"benchmarks-{a.model}.json")
    if a.batch is None:
        cfg = apply_defaults(yaml.safe_load(Path(a.config).read_text()) or {}, read_schema())
        entry = (cfg.get("models") or {}).get(a.model or Path(a.model_dir).name)
        a.batch = entry["batch_size"] if entry else section_schema("models.<name>.batch_size")["default"]
    a.out = a.out or str(OUT / "benchmarks.json")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", default=["extraction", "dryrun", "id", "growth"])
    ap.add_argument("--model", default=None, help="a prepared model by name: resources/models/<MODEL> (e.g. "
                    "qwen2.5-coder-1.5b after the scaling study's prepare_model); its batch size is the entry's "
                    "batch_size in --config unless --batch is given; results go to benchmarks-<MODEL>.json")
    ap.add_argument("--config", default=str(REPO / "config" / "config.yaml"),
                    help="with --model: the config holding its entry (config/scaling.yaml for the Qwen models)")
    ap.add_argument("--model-dir", default=str(REPO / "resources" / "models" / "smollm2-135m"))
    ap.add_argument("--prompts", default=str(REPO / "resources" / "prompts" / "mixed.jsonl"))
    ap.add_argument("--corpus-prompts", default=str(REPO / "resources" / "prompts" / "corpus.jsonl"))
    ap.add_argument("--batch", type=int, default=None, help="prompts per forward pass (default: the batch the study "
                    "runs for the model, its --config entry's batch_size, else the schema's default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=5, help="throughput: rounds of bare / body / full in one process "
                    "(rotating order); the median of the per-round ratios counts")
    ap.add_argument("--repeats", type=int, default=1, help="peak RSS: fresh processes per variant (alternating)")
    ap.add_argument("--passes", type=int, default=1, help="passes per fresh process (the fastest gives its tokens/s)")
    ap.add_argument("--long-n", type=int, default=8, help="long prompts for the peak-memory rounds (0: skip)")
    ap.add_argument("--long-tokens", type=int, default=1016)
    ap.add_argument("--long-batch", type=int, default=4)
    ap.add_argument("--corpus-model-dir", default=None, help="model of the corpus-rate run (default --model-dir; "
                    "e.g. Gemma-3-270M, whose 262k-token unembedding dominates it)")
    ap.add_argument("--corpus-batch", type=int, default=None)
    ap.add_argument("--n-models", type=int, nargs="+", default=[20])
    ap.add_argument("--profile-dryrun", action="store_true", help="cProfile the last size's no-op dry run")
    ap.add_argument("--growth-prompts", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--dry-repeats", type=int, default=3)
    ap.add_argument("--id-points", type=int, nargs="+", default=[500, 1000, 2000, 4000, 8000])
    ap.add_argument("--out", default=None, help="default benchmarks/results/benchmarks.json (with --model: "
                    "benchmarks-<MODEL>.json)")
    # child process
    ap.add_argument("--variant", choices=["bare", "full", "body", "pairs"])
    ap.add_argument("--corpus", action="store_true")
    a = ap.parse_args(argv)
    _resolve_model(a)
    if a.parts and a.parts[0] == "_child":
        a.out = a.out
        print(json.dumps(child_pairs(a) if a.variant == "pairs" else child(a)))
        return
    res = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine()}
    out = Path(a.out)
    if out.is_file():  # keep the parts not rerun now
        try:
            prev = json.loads(out.read_text())
            res.update({k: v for k, v in prev.items() if k in ("extraction", "dryrun", "id", "growth")})
        except ValueError:
            pass
    for part in a.parts:
        print(f"== {part} (load average {load()})", flush=True)
        res[part] = {"extraction": bench_extraction, "dryrun": bench_dryrun_sizes, "id": bench_id,
                     "growth": bench_growth}[part](a)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    md = markdown(res)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)
    print(f"written: {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
