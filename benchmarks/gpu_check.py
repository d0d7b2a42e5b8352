"""GPU check (issues 7 and 13): the full extraction of real model architectures on one CUDA GPU in bfloat16,
with tokens/s, peak GPU memory and peak host RSS, against a bare ``model(input_ids, attention_mask)``
forward over the same batches; plus the multi-device path (a model split between the GPU and the CPU with
an explicit ``device_map``, compared with the single-device extraction) and the memory check
(``check_memory`` with the GPU's numbers). Issue 13 (``issue13``): extraction under sdpa with the attention
entropies from hooked queries/keys in bfloat16 against the body-only sdpa forward (tokens/s; peak GPU memory at
~1,024-token prompts), those entropies against eager ``output_attentions`` (float32 and bfloat16), flash
attention 2 when ``flash_attn`` is installed, and three extraction jobs through the model server (weight loads).

Weights: the device machine has no network and its working tree is limited to 64 MiB, so the models are
built from their real configurations (SmolLM2-135M's own config.json and tokenizer, carried from
``resources/models/smollm2-135m``; Llama-3.2-1B and Mistral-7B shapes written below, with SmolLM2's
vocabulary) with random weights, saved with ``save_pretrained`` and prepared as ``hf_local`` models.
Throughput and memory depend on the shapes and dtype, not on the weight values.

    bash benchmarks/gpu_check.sh                 # on the GPU machine (see the header of that file)
    python benchmarks/gpu_check.py --smoke       # here, on CPU: a tiny config, to check the script runs

Writes gpu_check.json and gpu_check.md to --out (default $OUT, else benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

SMOL = REPO / "resources" / "models" / "smollm2-135m"
PROMPTS = REPO / "resources" / "prompts" / "mixed.jsonl"
CORPUS = REPO / "resources" / "prompts" / "corpus.jsonl"

# Published shapes (config.json of meta-llama/Llama-3.2-1B and mistralai/Mistral-7B-v0.1), SmolLM2's vocabulary.
SHAPES = {
    "llama-3.2-1b-shape": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500000.0,
                               tie_word_embeddings=True, max_position_embeddings=8192),
    "mistral-7b-shape": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, sliding_window=4096,
                             tie_word_embeddings=False, max_position_embeddings=8192),
}


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_model_dir(name: str, cfg, tok, root: Path, device: str) -> Path:
    """Random-weight model of ``cfg`` in bf16 (float32 on CPU), saved and prepared as an hf_local model."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmgeom.models import loading, sources as models

    src = root / "src" / name
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    m.save_pretrained(src)
    tok.save_pretrained(src)
    del m
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    out = root / "prepared" / name
    models.prepare_model(name, {"source": "hf_local", "path": str(src)}, out)
    return out


def _timed_forward(model_dir: Path, prompts: Path, batch: int, dtype: str, device: str, *, attn: str = "sdpa",
                   body_only: bool = False) -> dict:
    """Tokens/s and peak GPU memory of a plain forward over length-sorted batches (second of two passes):
    the whole model (LM head included) or, with ``body_only``, the decoder body without the LM head."""
    import torch

    from llmgeom.extract.capture import pad_batch
    from llmgeom.extract.forward import tokenize_prompts
    from llmgeom.prompts.io import read_prompt_set
    from llmgeom.models import architectures as arch
    from llmgeom.models.loading import load_prepared

    model, tok = load_prepared(model_dir, dtype=dtype, attn=attn, device=device)
    recs, _ = read_prompt_set(prompts)
    seqs = tokenize_prompts(tok, [r["text"] for r in recs], [r.get("id", str(i)) for i, r in enumerate(recs)],
                            max_tokens=None, truncate=False, context=arch.summarize(model.config).max_positions)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    batches = [[seqs[i] for i in order[j:j + batch]] for j in range(0, len(seqs), batch)]
    dev = next(model.parameters()).device
    n_tok = sum(len(s) for s in seqs)
    body = arch.base_model(model) if body_only else None

    def run():
        with torch.inference_mode():
            for b in batches:
                ids, mask, pos = pad_batch(b, pad, dev)
                if body_only:
                    body(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
                else:
                    model(input_ids=ids, attention_mask=mask)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    run()  # warm-up (kernel selection, allocator)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    run()
    dt = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
    del model, body
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"tokens": n_tok, "seconds": dt, "tokens_per_s": n_tok / dt, "peak_gpu_mib": peak}


def bare_forward(model_dir: Path, prompts: Path, batch: int, dtype: str, device: str) -> dict:
    """Tokens/s and peak GPU memory of the whole model's plain sdpa forward (no hooks)."""
    return _timed_forward(model_dir, prompts, batch, dtype, device)


def full_extraction(model_dir: Path, prompts: Path, out: Path, batch: int, dtype: str, device: str,
                    corpus: bool = False, device_map=None) -> dict:
    import torch

    from llmgeom.extract.forward import extract_to_hdf5

    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    logs = []
    t = time.perf_counter()
    extract_to_hdf5(model_dir, prompts, out, model_name=model_dir.name, dtype=dtype, device=device,
                    batch_size=batch, attention=not corpus, corpus=corpus, device_map=device_map, log=logs.append, top_k=10, sample_per_prompt=30)
    dt = time.perf_counter() - t
    line = logs[-1] if logs else ""
    tps = float(line.split(" tokens/s")[0].rsplit(" ", 1)[-1]) if " tokens/s" in line else None
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
    import h5py

    with h5py.File(out, "r") as f:
        n = int(f["prompts/n_tokens"].shape[0])
    return {"log": line, "tokens_per_s_loop": tps, "seconds_with_load": dt, "peak_gpu_mib": peak,
            "h5_bytes": out.stat().st_size, "h5_bytes_per_prompt": out.stat().st_size / n}


def compare_h5(a: Path, b: Path) -> dict:
    import h5py
    import numpy as np

    out = {}
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for k in ("last_token/residual", "last_token/values", "last_token/keys", "attention/entropy",
                  "next_token/entropy", "next_token/top_logits"):
            if k in fa and k in fb:
                x, y = fa[k][:].astype(np.float64), fb[k][:].astype(np.float64)
                out[k] = float(np.max(np.abs(x - y)) / (np.max(np.abs(x)) + 1e-12))
    return out


def long_prompts(tok, path: Path, n: int, n_tokens: int) -> Path:
    """``n`` prompts of about ``n_tokens`` tokens each, cut from the mixed prompt texts (issue 13 memory target)."""
    from llmgeom.prompts.io import read_prompt_set, write_prompt_set

    recs, _ = read_prompt_set(PROMPTS)
    text = " ".join(r["text"] for r in recs)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out = []
    for i in range(n):
        lo = (i * 97) % max(len(ids) - n_tokens, 1)
        out.append({"id": f"long{i}", "text": tok.decode(ids[lo:lo + n_tokens - 1]), "meta": {}})
    write_prompt_set(out, path)
    return path


def body_forward(model_dir: Path, prompts: Path, batch: int, dtype: str, device: str, attn: str = "sdpa") -> dict:
    """Tokens/s and peak GPU memory of the decoder body alone (``model.model``: no LM head, no hooks), sdpa."""
    return _timed_forward(model_dir, prompts, batch, dtype, device, attn=attn, body_only=True)


def entropy_vs_eager(model_dir: Path, prompts: Path, dtype: str, device: str, n: int = 8) -> dict:
    """Max |entropy(hooked q/k under sdpa) - entropy(eager output_attentions)| in nats, on ``n`` prompts."""
    import numpy as np
    import torch

    from llmgeom.extract.capture import pad_batch
    from llmgeom.extract.attention import attention_row_entropy
    from llmgeom.extract.batch import extract_batch
    from llmgeom.extract.forward import tokenize_prompts
    from llmgeom.prompts.io import read_prompt_set
    from llmgeom.models.loading import load_prepared

    out = {}
    sd, tok = load_prepared(model_dir, dtype=dtype, attn="sdpa", device=device)
    recs, _ = read_prompt_set(prompts)
    seqs = tokenize_prompts(tok, [r["text"] for r in recs[:n]], [str(i) for i in range(n)], max_tokens=None,
                            truncate=False, context=None)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    got = extract_batch(sd, seqs, attention=True, top_k=10, pad_id=pad)["attention/entropy"]
    del sd
    ea, _ = load_prepared(model_dir, dtype=dtype, attn="eager", device=device)
    dev = next(ea.parameters()).device
    ids, mask, pos = pad_batch(seqs, pad, dev)
    with torch.inference_mode():
        o = ea(input_ids=ids, attention_mask=mask, position_ids=pos, output_attentions=True, use_cache=False)
    ref = np.stack([[attention_row_entropy(a[b, :, len(sq) - 1]).cpu().numpy() for a in o.attentions]
                    for b, sq in enumerate(seqs)])
    del ea, o
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    out["max_abs_diff_nats"] = float(np.abs(got - ref).max())
    out["mean_entropy_nats"] = float(ref.mean())
    return out


def server_check(model_dir: Path, prompts: Path, root: Path, dtype: str, device: str) -> dict:
    """Three extraction jobs of one model through the model server: weight loads and seconds per job."""
    import re as _re

    from llmgeom.pipeline import model_server as ms

    os.environ["LLMGEOM_MODEL_SERVER_DIR"] = str(root / "srv")
    os.environ["LLMGEOM_MODEL_SERVER"] = "1"
    load = dict(model_dir=str(model_dir), dtype=dtype, device=device, device_map=None)
    jobs = []
    try:
        for i in range(3):
            log = root / f"server-job{i}.log"
            t = time.perf_counter()
            ms.run_task("extract", dict(model_dir=str(model_dir), prompts_path=str(prompts),
                                        out_path=str(root / f"server{i}.h5"), model_name=model_dir.name, dtype=dtype,
                                        device=device, batch_size=64), load=load, log=str(log), threads=4)
            text = log.read_text()
            fwd = _re.findall(r"forward passes ([\d.]+) s of", text)
            jobs.append({"seconds": time.perf_counter() - t,
                         "weight_loads": sum(int(x) for x in _re.findall(r"weights loaded for it: (\d+)", text)),
                         "forward_s": float(fwd[0]) if fwd else None})
    finally:
        ms.stop_server(load)
    return {"jobs": jobs, "weight_loads": sum(j["weight_loads"] for j in jobs)}


def issue13(name: str, mdir: Path, tok, root: Path, dtype: str, device: str, res: dict, long_n: int, long_tokens: int):
    """Issue 13 on the GPU: sdpa extraction with hooked entropies in bf16 against the body-only forward (tokens/s
    at the prompt set's length, peak memory at ~1,024-token prompts), entropy vs eager (fp32 and bf16), flash
    attention when installed, and the model server (weight loads per model)."""
    import importlib.util

    r = {"model": name}
    r["body"] = body_forward(mdir, PROMPTS, 64, dtype, device)
    r["full"] = full_extraction(mdir, PROMPTS, root / f"{name}-i13.h5", 64, dtype, device)
    r["throughput_ratio_vs_body"] = (r["full"]["tokens_per_s_loop"] or 0) / r["body"]["tokens_per_s"]
    lp = long_prompts(tok, root / "long.jsonl", long_n, long_tokens)
    r["long_body"] = body_forward(mdir, lp, 8, dtype, device)
    r["long_full"] = full_extraction(mdir, lp, root / f"{name}-long.h5", 8, dtype, device)
    if r["long_body"]["peak_gpu_mib"]:
        r["long_peak_ratio_vs_body"] = r["long_full"]["peak_gpu_mib"] / r["long_body"]["peak_gpu_mib"]
    r["entropy_vs_eager"] = {dt: entropy_vs_eager(mdir, PROMPTS, dt, device) for dt in ("float32", dtype)}
    if importlib.util.find_spec("flash_attn") is not None and device.startswith("cuda"):
        try:
            from llmgeom.extract.forward import extract_to_hdf5

            logs = []
            extract_to_hdf5(mdir, PROMPTS, root / f"{name}-fa2.h5", model_name=name, dtype=dtype, device=device,
                            batch_size=64, attn_implementation="flash_attention_2", log=logs.append, top_k=10, sample_per_prompt=30, device_map=None)
            r["flash_attention_2"] = {"log": logs[-1], "entropy_max_abs_diff_vs_sdpa": compare_h5(
                root / f"{name}-i13.h5", root / f"{name}-fa2.h5").get("attention/entropy")}
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            r["flash_attention_2"] = f"failed: {e!r}"
    else:
        r["flash_attention_2"] = "flash_attn not installed"
    r["server"] = server_check(mdir, PROMPTS, root, dtype, device)
    res.setdefault("issue13", []).append(r)
    print(f"   issue 13: full/body tokens/s {r['throughput_ratio_vs_body']:.2f} (target >= 0.95); peak GPU at "
          f"~{long_tokens}-token prompts full/body {r.get('long_peak_ratio_vs_body')} (target <= 1.2); entropy vs eager "
          f"{r['entropy_vs_eager']}; flash: {r['flash_attention_2'] if isinstance(r['flash_attention_2'], str) else 'ok'}; "
          f"server weight loads for 3 jobs: {r['server']['weight_loads']} (target 1), seconds per job "
          f"{[round(j['seconds'], 2) for j in r['server']['jobs']]}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "benchmarks" / "results"))
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--smoke", action="store_true", help="CPU, SmolLM2's config shrunk to 2 layers: checks the script")
    ap.add_argument("--issue13-shapes", nargs="*", default=["smollm2-135m", "llama-3.2-1b-shape"],
                    help="models on which the issue-13 checks run (sdpa vs body, entropy vs eager, model server)")
    ap.add_argument("--long-tokens", type=int, default=1024)
    ap.add_argument("--long-n", type=int, default=32)
    a = ap.parse_args(argv)

    import torch
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    from llmgeom.models import loading, sources as models

    device = "cpu" if a.smoke else "cuda"
    if not a.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on the GPU machine, or use --smoke here")
    dtype = "float32" if a.smoke else "bfloat16"
    res = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
           "transformers": transformers.__version__, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
           "gpu_total_mib": torch.cuda.get_device_properties(0).total_memory / 2**20 if device == "cuda" else None,
           "dtype": dtype, "runs": []}
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}), flush=True)
    tok = AutoTokenizer.from_pretrained(SMOL)
    base = AutoConfig.from_pretrained(SMOL)
    cfgs = {"smollm2-135m": base}
    if a.smoke:
        base.num_hidden_layers = 2
        cfgs = {"smollm2-135m-2layers": base}
        a.batch, a.shapes = [16], []
        a.issue13_shapes, a.long_tokens, a.long_n = ["smollm2-135m-2layers"], 64, 4
    for name in a.shapes:
        kw = dict(SHAPES[name])
        mt = kw.pop("model_type")
        cfgs[name] = AutoConfig.for_model(mt, vocab_size=base.vocab_size, bos_token_id=base.bos_token_id,
                                          eos_token_id=base.eos_token_id, **kw)
    root = Path(tempfile.mkdtemp(prefix="llmgeom-gpu-"))
    try:
        for name, cfg in cfgs.items():
            t = time.perf_counter()
            mdir = build_model_dir(name, cfg, tok, root, device)
            info = loading.check_memory(mdir, dtype=dtype, device=device, mem_mb=10**7)
            print(f"== {name}: {info['n_params']:,} parameters, built and saved in {time.perf_counter() - t:.0f} s; "
                  f"memory check: {info}", flush=True)
            for batch in a.batch:
                r = {"model": name, "n_params": info["n_params"], "batch": batch}
                r["bare"] = bare_forward(mdir, PROMPTS, batch, dtype, device)
                r["full"] = full_extraction(mdir, PROMPTS, root / f"{name}-{batch}.h5", batch, dtype, device)
                r["ratio"] = (r["full"]["tokens_per_s_loop"] or 0) / r["bare"]["tokens_per_s"]
                r["h5_bytes_per_prompt"] = round(r["full"]["h5_bytes_per_prompt"])
                r["host_peak_rss_mib"] = rss_mib()
                res["runs"].append(r)
                print(f"   batch {batch}: bare {r['bare']['tokens_per_s']:.0f} tok/s, full {r['full']['tokens_per_s_loop']} "
                      f"tok/s (ratio {r['ratio']:.2f}), peak GPU {r['full']['peak_gpu_mib']} MiB (bare "
                      f"{r['bare']['peak_gpu_mib']}), host peak RSS {r['host_peak_rss_mib']:.0f} MiB", flush=True)
            if name in a.issue13_shapes:
                issue13(name, mdir, tok, root, dtype, device, res, a.long_n, a.long_tokens)
            if name.startswith("smollm2"):
                c = full_extraction(mdir, CORPUS, root / f"{name}-corpus.h5", a.batch[0], dtype, device, corpus=True)
                res["corpus"] = {"model": name, **c}
                print(f"   corpus: {c['log']}", flush=True)
                # multi-device path: first half of the blocks on the GPU (or CPU in the smoke run), rest on the CPU
                n = cfg.num_hidden_layers
                first = 0 if device == "cuda" else "cpu"
                dmap = {"model.embed_tokens": first, "model.rotary_emb": first,
                        **{f"model.layers.{i}": (first if i < n // 2 else "cpu") for i in range(n)},
                        "model.norm": "cpu", "lm_head": "cpu"}
                ref = root / f"{name}-fp32-single.h5"
                split = root / f"{name}-fp32-split.h5"
                full_extraction(mdir, PROMPTS, ref, 16, "float32", device)
                s = full_extraction(mdir, PROMPTS, split, 16, "float32", device, device_map=dmap)
                diffs = compare_h5(ref, split)
                res["device_map_split"] = {"model": name, "device_map": "first half of the blocks on "
                                           f"{first}, the rest and the head on cpu", "log": s["log"],
                                           "max_rel_diff_vs_single_device": diffs}
                print(f"   device_map split vs single device (float32), max relative differences: {diffs}", flush=True)
            shutil.rmtree(root / "src" / name, ignore_errors=True)
            shutil.rmtree(root / "prepared" / name, ignore_errors=True)
        # the memory check refuses a model larger than the GPU before loading anything
        huge = AutoConfig.for_model("llama", vocab_size=128256, hidden_size=16384, intermediate_size=53248,
                                    num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8)
        hdir = root / "huge-src"
        huge.save_pretrained(hdir)
        tok.save_pretrained(hdir)
        (hdir / "model.safetensors").write_bytes(b"")  # never read: the check runs before loading
        hp = root / "huge"
        hp.mkdir()
        (hp / "manifest.json").write_text(json.dumps({"model": "huge", "source": "hf_local", "weights_path": str(hdir)}))
        try:
            loading.load_prepared(hp, dtype=dtype, device=device, mem_mb=64000)
            res["memory_check"] = "NOT RAISED"
        except loading.ModelMemoryError as e:
            res["memory_check"] = str(e)
        print(f"== memory check on a 405B-shaped config: {res['memory_check']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(res, indent=2, default=str))
    lines = [f"# GPU check ({res['created']}): {res['device']}, torch {res['torch']}, transformers {res['transformers']}, "
             f"{dtype}", "", "| model | params | batch | bare tok/s | full tok/s | ratio | peak GPU MiB (full / bare) | "
             "HDF5 bytes/prompt |", "|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['model']} | {r['n_params'] / 1e6:.0f}M | {r['batch']} | {r['bare']['tokens_per_s']:.0f} | "
                     f"{r['full']['tokens_per_s_loop']} | {r['ratio']:.2f} | {r['full']['peak_gpu_mib']} / "
                     f"{r['bare']['peak_gpu_mib']} | {r['h5_bytes_per_prompt']} |")
    if "device_map_split" in res:
        lines += ["", f"device_map split: {res['device_map_split']['max_rel_diff_vs_single_device']}"]
    for r in res.get("issue13", []):
        lines += ["", f"issue 13 ({r['model']}): full/body tokens/s **{r['throughput_ratio_vs_body']:.2f}** (target >= 0.95); "
                  f"peak GPU MiB at long prompts full/body {r['long_full']['peak_gpu_mib']} / {r['long_body']['peak_gpu_mib']} "
                  f"= **{r.get('long_peak_ratio_vs_body')}** (target <= 1.2); entropy vs eager {r['entropy_vs_eager']}; "
                  f"flash attention: {r['flash_attention_2']}; model server: {r['server']['weight_loads']} weight load(s) "
                  f"for {len(r['server']['jobs'])} jobs (target 1), seconds per job "
                  f"{[round(j['seconds'], 2) for j in r['server']['jobs']]}"]
    lines += ["", f"memory check: {res.get('memory_check')}"]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
