"""Workflow tests: the whole DAG on a tiny config (tiny random model, a handful of prompts).

Runs Snakemake in a temporary working directory with the repository's Snakefile.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import yaml

from llmgeom import testing

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = pytest.mark.slow


def tiny_config(model_dirs: dict) -> dict:
    return {
        "models": {name: {"source": "hf_local", "path": str(p), "dtype": "float32", "batch_size": 3}
                   for name, p in model_dirs.items()},
        "prompts": {
            "seed": 0,
            "token_budget": 32,
            "sets": {
                "mixed": {"kind": "mixed", "n": 12},
                "domain_mathematics": {"kind": "domain", "topics": ["Mathematics"], "n": 12},
                "corpus": {"kind": "corpus", "n": 8, "token_budget": 48},
            },
        },
        "extract": {"sample_per_prompt": 20, "threads": 1},
        "value_manifold": {"prompt_sets": ["mixed", "domain_mathematics"], "n_boot": 5, "layers": "all"},
        "intrinsic_dimension": {"prompt_set": "corpus", "n_subsamples": 2, "subsample_size": 100,
                                "min_points": 20, "estimators": ["twonn", "mle"]},
    }


def run_smk(workdir: Path, *args, check=True):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "-d", str(workdir),
                       "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
    if check and r.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}")
    return r


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("wf")
    dirs = {"tiny-llama": testing.save_tiny_model_dir("llama", wd / "src_models" / "tiny-llama"),
            "tiny-gpt2": testing.save_tiny_model_dir("gpt2", wd / "src_models" / "tiny-gpt2")}
    cfg = tiny_config(dirs)
    (wd / "config.yaml").write_text(yaml.safe_dump(cfg))
    run_smk(wd)
    return wd, cfg


def test_every_target_exists_and_is_sane(tiny_run):
    wd, cfg = tiny_run
    for m in cfg["models"]:
        assert (wd / f"resources/models/{m}/manifest.json").is_file()
        for s in cfg["prompts"]["sets"]:
            h5 = wd / f"results/{m}/activations/{s}.h5"
            with h5py.File(h5, "r") as f:
                assert bool(f.attrs["complete"])
                assert f.attrs["model"] == m
                assert np.isfinite(f["last_token/residual"][:]).all()
        vm = pd.read_csv(wd / f"results/{m}/tables/value_manifold.csv")
        assert set(vm.prompt_set) == {"mixed", "domain_mathematics"}
        assert set(vm.representation) == {"values", "residual_stream"}
        assert {"model", "layer", "prompt_set", "n"} <= set(vm.columns)
        assert (vm.n == 12).all()
        assert ((vm.pc1 > 0) & (vm.pc1 <= vm.pc12) & (vm.pc12 <= 1 + 1e-9)).all()
        assert ((vm.pc1_lo <= vm.pc1_hi)).all()
        assert (vm.spearman_rho.dropna() >= 0).all()
        idt = pd.read_csv(wd / f"results/{m}/tables/intrinsic_dimension.csv")
        assert set(idt.estimator) == {"twonn", "mle"}
        assert idt.layer.nunique() == 3  # embeddings + 2 blocks
        assert np.isfinite(idt.id_mean).all() and (idt.id_mean > 0).all()
        assert (idt.n <= 8 * 20).all()
    summ = pd.read_csv(wd / "results/summary/value_manifold.csv")
    assert set(summ.model) == set(cfg["models"])
    for fig in ("value_manifold", "intrinsic_dimension"):
        for ext in ("png", "pdf"):
            assert (wd / f"results/figures/{fig}.{ext}").stat().st_size > 1000
    assert not list(wd.rglob("*.partial"))


def test_second_dry_run_schedules_nothing(tiny_run):
    wd, _ = tiny_run
    r = run_smk(wd, "-n")
    assert "Nothing to be done" in r.stdout + r.stderr


def test_lint_is_clean(tiny_run):
    wd, _ = tiny_run
    r = run_smk(wd, "--lint", check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Lints for" not in out, out


def test_report_is_written(tiny_run):
    wd, _ = tiny_run
    run_smk(wd, "--report", str(wd / "report.html"))
    html = (wd / "report.html").read_text(errors="replace")
    assert "intrinsic_dimension" in html and "value_manifold" in html


def test_analysis_param_change_reruns_only_that_analysis(tiny_run):
    wd, cfg = tiny_run
    cfg2 = dict(cfg, value_manifold=dict(cfg["value_manifold"], n_boot=7))
    (wd / "config2.yaml").write_text(yaml.safe_dump(cfg2))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run(SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "-d", str(wd), "--configfile",
                                    str(wd / "config2.yaml"), "-n", "--cores", "1"],
                       capture_output=True, text=True, env=env, cwd=wd)
    out = r.stdout
    assert r.returncode == 0, r.stderr
    assert "value_manifold" in out
    assert "extract" not in out.split("Job stats:")[1].split("Reasons")[0]
    assert "intrinsic_dimension  " not in out.split("Job stats:")[1].split("Reasons")[0]
