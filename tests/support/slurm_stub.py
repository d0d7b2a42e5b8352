"""A stand-in SLURM for tests and benchmarks: stub ``sbatch``, ``sacct``, ``squeue``, ``sinfo``,
``sacctmgr``, ``sshare``, ``scontrol`` and ``scancel`` executables on ``PATH``.

``sbatch`` appends its argv to ``<state>/sbatch.jsonl`` and "runs" the job by creating the outputs of
the Snakemake jobs named in the wrapped command's ``--target-jobs`` (taken from a map that
``dry_run_jobs`` builds from ``snakemake -n``): empty files, or directories for directory outputs.
``sacct`` / ``squeue`` report every submitted job as COMPLETED. Snakemake then records its metadata
(params, input set, code, checksums) exactly as after a real run, so the resulting state is the one a
"full run" leaves for ``snakemake -n`` - without running any job's code.

Also used by benchmarks/run_benchmarks.py (20-model no-op dry run).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import sys
from pathlib import Path

_HEADER = re.compile(r"^(\s*)(?:local)?rule (\w+):\s*$")
_FIELD = re.compile(r"^\s+(\w+): (.*)$")


def dry_run_jobs(text: str) -> list[dict]:
    """Jobs of a ``snakemake -n`` printout: dicts with rule, wildcards (dict), input, output, log
    (lists), reason, resources (dict of strings), group (True for jobs listed inside a group job) and, where
    printed, benchmark, threads and priority (strings; Snakemake omits threads 1 and priority 0)."""
    jobs, cur = [], None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            cur = {"rule": m.group(2), "wildcards": {}, "input": [], "output": [], "log": [], "reason": "",
                   "resources": {}, "group": len(m.group(1)) > 0}
            jobs.append(cur)
            continue
        if cur is None:
            continue
        f = _FIELD.match(line)
        if not f or not line.startswith(" "):
            if line.strip() == "" or not line.startswith(" "):
                cur = None
            continue
        key, val = f.group(1), f.group(2)
        if key in ("input", "output", "log"):
            cur[key] = [v for v in val.split(", ") if v]
        elif key == "wildcards":
            cur["wildcards"] = dict(kv.split("=", 1) for kv in val.split(", ") if "=" in kv)
        elif key == "resources":
            cur["resources"] = dict(kv.split("=", 1) for kv in val.split(", ") if "=" in kv)
        elif key in ("reason", "benchmark", "threads", "priority"):
            cur[key] = val
    return jobs


def job_key(rule: str, wildcards: dict) -> str:
    """Key of a job as in Snakemake's ``--target-jobs`` (wildcards sorted)."""
    return rule + ":" + ",".join(f"{k}={v}" for k, v in sorted(wildcards.items()))


def outputs_map(jobs: list[dict], directory_prefixes=("resources/models/", "resources/wind_tunnel/")) -> dict:
    """``job_key`` -> [[path, is_directory], ...] for every job of a dry run: its outputs and its benchmark file
    (which Snakemake awaits from a submitted job like an output)."""
    return {job_key(j["rule"], j["wildcards"]): [[o, any(o.startswith(p) and o.rstrip("/").count("/") == 2
                                                        for p in directory_prefixes)] for o in j["output"]]
            + ([[j["benchmark"], False]] if j.get("benchmark") else [])
            for j in jobs if j["output"]}


_SBATCH = r'''#!{python}
import json, os, shlex, sys
from pathlib import Path
state = Path({state!r})
argv = sys.argv[1:]
with open(state / "sbatch.jsonl", "a") as fh:
    fh.write(json.dumps(argv) + "\n")
wrap = next((a[len("--wrap="):] for a in argv if a.startswith("--wrap=")), "")
words = shlex.split(wrap)
targets = []
if "--target-jobs" in words:
    for w in words[words.index("--target-jobs") + 1:]:
        if w.startswith("-"):
            break
        targets.append(w)
omap = json.loads((state / "outputs.json").read_text())
workdir = argv[argv.index("-D") + 1] if "-D" in argv else os.getcwd()
status = "COMPLETED"
for t in targets:
    rule, _, wc = t.partition(":")
    key = rule + ":" + ",".join(sorted(x for x in wc.split(",") if x))
    if key not in omap:
        status = "FAILED"
        with open(state / "unknown_targets.txt", "a") as fh:
            fh.write(t + "\n")
        continue
    for path, is_dir in omap[key]:
        p = Path(workdir) / path
        if is_dir:
            p.mkdir(parents=True, exist_ok=True)
            (p / "stub").write_text("stub\n")
            os.utime(p)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("")
n = sum(1 for _ in open(state / "sbatch.jsonl"))
with open(state / "jobs.txt", "a") as fh:
    fh.write(f"{{n}}|{{status}}\n")
print(n)
'''

_STATUS = r'''#!/bin/sh
# sacct / squeue stand-in: every submitted job with its final state, "<id>|<STATE>"
cat {state}/jobs.txt 2>/dev/null
exit 0
'''

_ECHO = r'''#!/bin/sh
printf '%s\n' {text}
exit 0
'''


def install(bindir: str | Path, statedir: str | Path, jobs: list[dict], account: str = "testacct") -> dict:
    """Write the stub executables into ``bindir`` and the outputs map into ``statedir``.
    Returns the environment (PATH with ``bindir`` first) to run Snakemake in."""
    bindir, statedir = Path(bindir), Path(statedir)
    bindir.mkdir(parents=True, exist_ok=True)
    statedir.mkdir(parents=True, exist_ok=True)
    (statedir / "outputs.json").write_text(json.dumps(outputs_map(jobs)))
    (statedir / "jobs.txt").write_text("")
    scripts = {
        "sbatch": _SBATCH.format(python=sys.executable, state=str(statedir)),
        "sacct": _STATUS.format(state=shlex.quote(str(statedir))),
        "squeue": _STATUS.format(state=shlex.quote(str(statedir))),
        "sinfo": _ECHO.format(text=shlex.quote("PARTITION") + " " + shlex.quote("cpu*") + " gpu"),
        "sacctmgr": _ECHO.format(text=shlex.quote(account)),
        "sshare": _ECHO.format(text=shlex.quote(account)),
        "scontrol": _ECHO.format(text=shlex.quote("MaxArraySize = 1001") + " " + shlex.quote("MinJobAge = 300 sec")),
        "scancel": _ECHO.format(text="''"),
    }
    for name, body in scripts.items():
        p = bindir / name
        p.write_text(body)
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")


def submissions(statedir: str | Path) -> list[dict]:
    """Every recorded sbatch call: argv, the target jobs' rules, and the GPU flags found."""
    out = []
    for line in (Path(statedir) / "sbatch.jsonl").read_text().splitlines():
        argv = json.loads(line)
        wrap = next((a[len("--wrap="):] for a in argv if a.startswith("--wrap=")), "")
        words = shlex.split(wrap)
        targets = []
        if "--target-jobs" in words:
            for w in words[words.index("--target-jobs") + 1:]:
                if w.startswith("-"):
                    break
                targets.append(w)
        flags = " ".join(a for a in argv if not a.startswith("--wrap="))
        out.append({"argv": argv, "targets": targets, "rules": sorted({t.split(":", 1)[0] for t in targets}),
                    "gpu_flags": re.findall(r"--gpus=\S+|--gres=\S+|--gpus-per-\S+", flags),
                    "flags": flags})
    return out
