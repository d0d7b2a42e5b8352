"""GPU economy (issue 13 item 1): prints its figures with their targets and writes them to
``benchmarks/results/gpu_economy.json`` / ``.md``. Not a timed test.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gpu_economy.py                     # all parts
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gpu_economy.py submissions loads share

* ``submissions``: GPU submissions per model on ``config/paper3.yaml`` through the stub ``sbatch`` of
  tests/support/slurm_stub.py (the SLURM executor plugin submits, the stub records, nothing runs); with the GPU
  flags, memory and runtime of each. Target: 1 per model (before issue 13: 10).
* ``loads``: weight loads per model on a small local run of every GPU job (extractions, SULA conditions,
  interventions) of the tiny workflow config (tests/workflow/test_workflow.py, two tiny random models), counted
  from the job logs. Target: 1 per model. ``--compare`` adds the same run with ``LLMGEOM_MODEL_SERVER=0``.
* ``share``: share of the extraction stage's wall time spent in forward passes (``extract_batch``:
  forward pass, hooks, per-token statistics), on a small real model (``--model-dir``, default the
  workflow's prepared SmolLM2-135M; skipped when absent) extracting ``--share-sets`` prompt sets of the
  default study through the workflow; stage wall time = the sum of the extract jobs' wall times as Snakemake
  records them (start to end of each job: process start, imports, weight load, tokenization, HDF5).
  Target >= 80%. On this 2-core CPU machine the forward passes of a 135M model dominate less than on a GPU
  node, where loading is the cost that the model server removes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "tests" / "support"))

from llmgeom.pipeline.cluster import SERVER_RULES  # noqa: E402

GPU_RULES = tuple(r for r in SERVER_RULES if r != "extract_wind_tunnel")  # the LLM rules the model server runs


def _smk(args, cwd, env=None):
    env = dict(env or os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), *args],
                          capture_output=True, text=True, env=env, cwd=cwd)


# --------------------------------------------------------------------------- submissions


def bench_submissions(a) -> dict:
    import slurm_stub

    cfg = yaml.safe_load(Path(a.config).read_text())
    tmp = Path(tempfile.mkdtemp(prefix="llmgeom-gpu-econ-"))
    try:
        wd = tmp / "wd"
        wd.mkdir()
        base = ["--configfile", str(a.config), "-d", str(wd)]
        dry = _smk(["-n", *base], wd)
        if dry.returncode:
            raise RuntimeError(dry.stderr[-3000:])
        jobs = slurm_stub.dry_run_jobs(dry.stdout)
        prof = tmp / "profile"
        prof.mkdir()
        text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
        for k, v in {"<account>": "testacct", "<cpu-partition>": "cpu", "<gpu-partition>": "gpu"}.items():
            text = text.replace(k, v)
        (prof / "config.yaml").write_text(text)
        env = slurm_stub.install(wd / "bin", wd / "state", jobs)
        t = time.perf_counter()
        run = _smk(["--profile", str(prof), "--slurm-init-seconds-before-status-checks", "1", *base], wd, env)
        if run.returncode:
            raise RuntimeError(run.stderr[-3000:])
        subs = slurm_stub.submissions(wd / "state")
        rows = {}
        for m in cfg["models"]:
            mine = [s for s in subs if set(s["rules"]) & set(GPU_RULES)
                    and any(f"model={m}" in t.split(":", 1)[1].split(",") for t in s["targets"])]
            n_jobs = sum(1 for j in jobs if j["rule"] in GPU_RULES and j["wildcards"].get("model") == m)
            rows[m] = {"gpu_jobs": n_jobs, "gpu_submissions": len(mine),
                       "gpu_flags": [s["gpu_flags"] for s in mine],
                       "mem_mb": [int(re.search(r"--mem (\d+)", s["flags"]).group(1)) for s in mine],
                       "runtime_min": [int(re.search(r"(?:^| )(?:-t|--time)[ =](\d+)", s["flags"]).group(1)) for s in mine],
                       "config_mem_mb": cfg["models"][m].get("mem_mb"), "config_runtime_min": cfg["models"][m].get("runtime")}
        return {"config": str(Path(a.config).relative_to(REPO)) if Path(a.config).is_relative_to(REPO) else a.config,
                "models": rows, "n_submissions_total": len(subs), "stub_run_s": time.perf_counter() - t}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- local runs


def _job_times(wd: Path) -> dict:
    """{output path: (rule, start, end)} from Snakemake's metadata."""
    out = {}
    for f in (wd / ".snakemake" / "metadata").rglob("*"):
        if not f.is_file():
            continue
        try:
            name = base64.urlsafe_b64decode(f.name.encode()).decode()
            d = json.loads(f.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if d.get("starttime") and d.get("endtime"):
            out[name] = (d.get("rule"), float(d["starttime"]), float(d["endtime"]))
    return out


def _logs(wd: Path, model: str) -> list[Path]:
    return sorted([*(wd / "logs" / "extract" / model).glob("*.log"), *(wd / "logs" / "extract_sula" / model).glob("*.log"),
                   *((wd / "logs" / "intervene").glob(f"{model}.log"))])


def _local_run(cfg: dict, targets_fn, wd: Path, server: bool, idle_s: int = 120) -> dict:
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, LLMGEOM_MODEL_SERVER="1" if server else "0", LLMGEOM_MODEL_SERVER_IDLE_S=str(idle_s),
               LLMGEOM_MODEL_SERVER_DIR=str(wd / "srv"), LLMGEOM_PROGRESS_LOG_S="3600")
    targets = [t for m in cfg["models"] for t in targets_fn(m)]
    t = time.perf_counter()
    r = _smk(["-d", str(wd), "--configfile", str(wd / "config.yaml"), "--cores", "2", *targets], wd, env)
    wall = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"local run failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    times = _job_times(wd)
    res = {"server": server, "wall_s": wall, "models": {}}
    for m in cfg["models"]:
        loads, fwd, n_jobs = 0, 0.0, 0
        for lg in _logs(wd, m):
            text = lg.read_text()
            n_jobs += 1
            loads += sum(int(x) for x in re.findall(r"weights loaded for it: (\d+)", text))
            fwd += sum(float(x) for x in re.findall(r"forward passes ([\d.]+) s of", text))
        ext = [(s, e) for p, (rule, s, e) in times.items() if rule in ("extract", "extract_sula") and f"results/{m}/" in p]
        job_s = sum(e - s for s, e in ext)
        res["models"][m] = {"gpu_jobs": n_jobs, "weight_loads": loads, "extract_jobs": len(ext),
                            "extract_job_wall_s": job_s, "forward_s": fwd,
                            "forward_share": fwd / job_s if job_s else None}
    return res


def _stop_servers(wd: Path):
    from llmgeom.pipeline import model_server

    for d in (wd / "srv").glob("*/*"):
        conn = model_server._connect(d)
        if conn is not None:
            with conn:
                conn.send({"task": "__stop__"})


def bench_loads(a) -> dict:
    from conftest import tiny_config

    from llmgeom.models import tiny

    tmp = Path(tempfile.mkdtemp(prefix="llmgeom-loads-"))
    try:
        dirs = {"tiny-llama": tiny.save_tiny_model_dir("llama", tmp / "src" / "tiny-llama"),
                "tiny-gpt2": tiny.save_tiny_model_dir("gpt2", tmp / "src" / "tiny-gpt2")}
        cfg = tiny_config(dirs)
        conds = ["main", "shuffled", "remap", "no_evidence"]
        from llmgeom.pipeline.schema import read_schema

        schema = read_schema()
        try:
            conds = schema["properties"]["sula"]["properties"]["conditions"]["default"]
        except KeyError:
            pass

        def targets(m):
            return ([f"results/{m}/activations/{s}.h5" for s in cfg["prompts"]["sets"]]
                    + [f"results/{m}/activations/sula_{c}.h5" for c in conds]
                    + [f"results/{m}/interventions/sula_interventions_per_prompt.csv"])

        out = {"config": ".test/config/config.yaml via tests/conftest.py tiny_config (2 tiny random models)", "sula_conditions": conds}
        runs = [True, False] if a.compare else [True]
        for server in runs:
            wd = tmp / ("server" if server else "no_server")
            try:
                out["with_server" if server else "without_server"] = _local_run(cfg, targets, wd, server, idle_s=30)
            finally:
                _stop_servers(wd)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_share(a) -> dict:
    md = Path(a.model_dir)
    if not (md / "config.json").is_file():
        return {"skipped": f"{md} is not a prepared model directory (run the workflow's prepare_model first)"}
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    name = md.name
    cfg = {"models": {name: {"source": "hf_local", "path": str(md.resolve()), "dtype": "float32",
                             "batch_size": a.batch, "mem_mb": 6000, "runtime": 60}},
           "prompts": {"seed": 0, "token_budget": base["prompts"]["token_budget"],
                       "sets": {s: base["prompts"]["sets"][s] for s in [*a.share_sets, "corpus"]}},
           "extract": {"threads": 2}}  # the corpus set is declared (config checks) but not extracted
    cfg["value_manifold"] = {"prompt_sets": [s for s in a.share_sets if base["prompts"]["sets"][s]["kind"] != "corpus"][:1]}
    cfg["intrinsic_dimension"] = {"prompt_set": "corpus"}
    tmp = Path(tempfile.mkdtemp(prefix="llmgeom-share-"))
    try:
        out = {"model": name, "prompt_sets": a.share_sets, "batch": a.batch, "dtype": "float32"}
        for server in ([True, False] if a.compare else [True]):
            wd = tmp / ("server" if server else "no_server")
            try:
                out["with_server" if server else "without_server"] = _local_run(
                    cfg, lambda m: [f"results/{m}/activations/{s}.h5" for s in a.share_sets], wd, server, idle_s=30)
            finally:
                _stop_servers(wd)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- report


def markdown(res: dict) -> str:
    lines = [f"# GPU economy (issue 13; {res['created']})", ""]
    s = res.get("submissions")
    if s:
        lines += [f"## GPU submissions per model on {s['config']} (stub sbatch)", "",
                  "| model | GPU jobs | GPU submissions (target 1) | GPU flags | --mem MB | runtime min (per-job config) |",
                  "|---|---|---|---|---|---|"]
        for m, r in s["models"].items():
            lines.append(f"| {m} | {r['gpu_jobs']} | **{r['gpu_submissions']}** | {r['gpu_flags']} | {r['mem_mb']} | "
                         f"{r['runtime_min']} ({r['config_runtime_min']}) |")
        lines += ["", f"All submissions: {s['n_submissions_total']}.", ""]
    for key, title in (("loads", "Weight loads per model (tiny workflow, every GPU job)"),
                       ("share", "Forward-pass share of the extraction jobs' wall time")):
        r = res.get(key)
        if not r:
            continue
        lines += [f"## {title}", ""]
        if "skipped" in r:
            lines += [f"Skipped: {r['skipped']}", ""]
            continue
        lines += ["| run | model | GPU jobs | weight loads (target 1) | extract jobs | job wall s | forward s | "
                  "forward share (target >= 0.80) |", "|---|---|---|---|---|---|---|---|"]
        for run in ("with_server", "without_server"):
            if run not in r:
                continue
            for m, v in r[run]["models"].items():
                share = f"{v['forward_share']:.2f}" if v["forward_share"] is not None else "-"
                lines.append(f"| {run.replace('_', ' ')} | {m} | {v['gpu_jobs']} | **{v['weight_loads']}** | "
                             f"{v['extract_jobs']} | {v['extract_job_wall_s']:.1f} | {v['forward_s']:.2f} | **{share}** |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", default=["submissions", "loads", "share"])
    ap.add_argument("--config", default=str(REPO / "config" / "paper3.yaml"))
    ap.add_argument("--model-dir", default=str(REPO / "resources" / "models" / "smollm2-135m"))
    ap.add_argument("--share-sets", nargs="+", default=["mixed", "domain_mathematics", "code"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--compare", action="store_true", help="also run with LLMGEOM_MODEL_SERVER=0")
    ap.add_argument("--out", default=str(OUT / "gpu_economy.json"))
    a = ap.parse_args(argv)
    res = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    out = Path(a.out)
    if out.is_file():
        try:
            res.update({k: v for k, v in json.loads(out.read_text()).items() if k in ("submissions", "loads", "share")})
        except ValueError:
            pass
    for part in a.parts:
        print(f"== {part}", flush=True)
        res[part] = {"submissions": bench_submissions, "loads": bench_loads, "share": bench_share}[part](a)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    md = markdown(res)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)
    print(f"written: {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
