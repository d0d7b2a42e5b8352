"""The LSM study config (config/manifolds.yaml; issue 5) passes a dry run, and every model's GPU job
declares the resources it needs. Needs no weights: the DAG is built without touching the hub."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import study_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config" / "manifolds.yaml"

pytestmark = pytest.mark.slow


def _jobs(out: str) -> list[dict]:
    """Parse the rule blocks of `snakemake -n` output into dicts (rule, wildcards, resources)."""
    jobs = []
    for block in re.split(r"\n(?=\s*rule \w+:)", out):
        m = re.match(r"\s*rule (\w+):", block)
        if not m:
            continue
        job = {"rule": m.group(1)}
        for key in ("wildcards", "resources"):
            km = re.search(rf"^\s*{key}: (.*)$", block, re.M)
            if km:
                job[key] = dict(kv.split("=", 1) for kv in km.group(1).split(", ") if "=" in kv)
        jobs.append(job)
    return jobs


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("manifolds")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-s", str(REPO / "Snakefile"), "-d", str(wd),
                        "--configfile", str(CONFIG), "--cores", "4"],
                       capture_output=True, text=True, env=env, cwd=wd)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr, study_config(CONFIG)


def test_manifolds_config_lists_the_study_models(dry_run):
    _, cfg = dry_run
    assert set(cfg["models"]) == {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "opt-125m", "opt-350m",
                                  "opt-1.3b", "pythia-160m", "pythia-410m", "pythia-1.4b"}
    for name, spec in cfg["models"].items():
        assert spec["source"] == "hf_hub" and spec["revision"] and spec["dtype"] in ("float32", "bfloat16")


def test_every_extract_job_declares_gpu_and_memory(dry_run):
    out, cfg = dry_run
    jobs = _jobs(out)
    extract = [j for j in jobs if j["rule"] == "extract"]
    seen = {j["wildcards"]["model"] for j in extract}
    assert seen == set(cfg["models"]) | {f"{m}-randinit" for m in cfg["models"]}  # + each model's twin (issue 28)
    for j in extract:
        spec = cfg["models"][j["wildcards"]["model"].removesuffix("-randinit")]  # a twin: its model's resources
        assert j["resources"]["gpu"] == "1", j
        assert int(j["resources"]["mem_mb"]) == spec["mem_mb"], j
        assert int(j["resources"]["runtime"]) == spec["runtime"], j
    # the CPU rule that loads each whole model (Fisher metric) declares the model's memory too
    fisher = [j for j in jobs if j["rule"] == "fisher"]
    assert {j["wildcards"]["model"] for j in fisher} == set(cfg["models"])
    for j in fisher:
        assert int(j["resources"]["mem_mb"]) == cfg["models"][j["wildcards"]["model"]]["mem_mb"]
        assert "gpu" not in j["resources"]
    # bigger models declare at least as much memory
    size = {"gpt2": 1, "gpt2-medium": 2, "gpt2-large": 3, "gpt2-xl": 4}
    mem = [cfg["models"][m]["mem_mb"] for m in sorted(size, key=size.get)]
    assert mem == sorted(mem)


def test_lsm_targets_scheduled(dry_run):
    out, cfg = dry_run
    rules = {j["rule"] for j in _jobs(out)}
    assert {"intrinsic_dimension", "curvature", "margins", "fisher", "aggregate_lsm", "margin_vs_perplexity",
            "figure_lsm"} <= rules
