"""Scheduling of a local run (issue 21): GPU-rule threads that leave a core to other jobs, rule priorities (longest
chains first), thread pools that follow the job's threads, a benchmark file per job, and one aggregate job per family
of cross-model tables. Read from ``snakemake -n`` on empty working directories (nothing runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_stub
from llmgeom.pipeline import cluster, jobs
from test_cluster import RETRY_CONFIGS, workflow_rules

REPO = Path(__file__).resolve().parents[2]
WT_TRAINING = "train_wind_tunnel"  # its threads are wind_tunnel.models.<name>.threads (bit-identical per count)


def dry_run(tmp_path, configname, cores):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    wd = tmp_path / f"{configname}-{cores}"
    wd.mkdir()
    r = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-n", "--cores", str(cores),
                        "--configfile", str(REPO / "config" / configname), "-d", str(wd)],
                       capture_output=True, text=True, env=env, cwd=wd, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return [j for j in slurm_stub.dry_run_jobs(r.stdout) if j["rule"] != "all"]


@pytest.fixture(scope="module")
def default_jobs(tmp_path_factory):
    return dry_run(tmp_path_factory.mktemp("sched"), "config.yaml", 2)


def test_gpu_rule_threads_local_and_cluster():
    assert cluster.gpu_rule_threads(2, 2) == 1  # the development machine: two GPU jobs side by side
    assert cluster.gpu_rule_threads(2, 3) == 1
    assert cluster.gpu_rule_threads(2, 4) == 2 and cluster.gpu_rule_threads(2, 64) == 2
    assert cluster.gpu_rule_threads(3, 1) == 1  # never 0
    assert cluster.gpu_rule_threads(4, None) == 4  # submitted jobs: as configured (issue 12)


@pytest.mark.slow
def test_gpu_jobs_leave_a_core_on_two_cores(default_jobs, tmp_path):
    gpu = [j for j in default_jobs if j["rule"] in cluster.GPU_RULES and j["rule"] != WT_TRAINING]
    assert {j["rule"] for j in gpu} == set(cluster.GPU_RULES) - {WT_TRAINING}
    assert all(j.get("threads", "1") == "1" for j in gpu), [(j["rule"], j.get("threads")) for j in gpu]
    # on 4 cores half of them: extract.threads (2, the schema default)
    wide = [j for j in dry_run(tmp_path, "config.yaml", 4) if j["rule"] == "extract"]
    assert wide and all(j["threads"] == "2" for j in wide)


@pytest.mark.slow
def test_priorities_start_the_longest_chains_first(default_jobs):
    prio = {}
    for j in default_jobs:
        prio.setdefault(j["rule"], set()).add(int(j.get("priority", 0)))
    top = lambda r: max(prio[r])
    assert top("prepare_model") > top("build_prompts") > top("extract") > top("extract_sula") > top("intervene")
    assert top("intervene") > top(WT_TRAINING) > top("value_manifold") > top("margins") == 0
    # corpus extraction first: the longest analyses (intrinsic dimension, curvature, Fisher) follow it
    ext = {j["wildcards"]["promptset"]: int(j["priority"]) for j in default_jobs if j["rule"] == "extract"}
    assert ext["corpus"] > ext["mixed"] == ext["code"]
    assert {int(j.get("priority", 0)) for j in default_jobs if j["rule"].startswith(("aggregate", "figure"))} == {0}


@pytest.mark.slow
def test_every_rule_writes_a_benchmark_file(tmp_path):
    """Every job of every rule (the default study and a checkpoint sweep together schedule all of them) writes
    its own results/benchmarks/<rule>[/...].tsv (s, cpu_time, max_rss per job; benchmarks/study_profile.py)."""
    seen, paths = set(), set()
    for name in RETRY_CONFIGS:
        for j in dry_run(tmp_path, name, 2):
            bench = j.get("benchmark", "")
            rule_dir = "aggregate" if j["rule"].startswith("aggregate_") else j["rule"]
            # like the job's log: results/benchmarks/<rule>.tsv, or <rule>/<wildcards>.tsv
            assert (bench == f"results/benchmarks/{rule_dir}.tsv" or bench.startswith(f"results/benchmarks/{rule_dir}/")
                    and bench.endswith(".tsv")), (j["rule"], bench)
            assert (name, bench) not in paths, bench  # one file per job
            paths.add((name, bench))
            seen.add(j["rule"])
    rules = workflow_rules(tmp_path, REPO / "config" / "config.yaml") - {"all"}
    assert rules <= seen, sorted(rules - seen)
    assert "results/" in (REPO / ".gitignore").read_text().split()  # the benchmarks stay out of git


@pytest.mark.slow
def test_one_aggregate_job_per_family_writes_every_summary_table(default_jobs):
    agg = [j for j in default_jobs if j["rule"].startswith("aggregate")]
    fams = sorted(j["rule"].removeprefix("aggregate_") for j in agg)
    assert fams == sorted(set(fams)) and {"bayes", "lsm", "sula", "value_manifold", "wind_tunnel"} == set(fams)
    outs = [o for j in agg for o in j["output"]]
    assert len(outs) == len(set(outs)) >= 25  # 25 tables of the default study, one job each family
    assert all(o.startswith("results/summary/") and o.endswith(".csv") for o in outs)
    # every cross-model table a job reads that no other rule writes comes from exactly one aggregate job
    consumers = {i for j in default_jobs if not j["rule"].startswith("aggregate") for i in j["input"]
                 if i.startswith("results/summary/") and i.endswith(".csv")}
    others = {o for j in default_jobs if not j["rule"].startswith("aggregate") for o in j["output"]}
    assert consumers - others <= set(outs) and not set(outs) & others
    bayes = next(j for j in agg if j["rule"] == "aggregate_bayes")
    assert {"results/summary/domain_restriction.csv", "results/summary/key_orthogonality.csv"} <= set(bayes["output"])


def test_run_logged_limits_torch_and_blas_threads_to_the_job(tmp_path):
    """Thread pools follow the job's threads: torch imported before (set_num_threads) or after the job starts
    (OMP_NUM_THREADS, read when torch is imported; here in a child process), restored afterwards."""
    import torch

    before = torch.get_num_threads()
    env_before = {v: os.environ.get(v) for v in jobs.THREAD_ENV}
    with jobs.run_logged(tmp_path / "job.log", threads=1):
        assert torch.get_num_threads() == 1
        assert all(os.environ[v] == "1" for v in jobs.THREAD_ENV)
        child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                               capture_output=True, text=True, check=True)
        assert child.stdout.strip() == "1"
    assert torch.get_num_threads() == before
    assert {v: os.environ.get(v) for v in jobs.THREAD_ENV} == env_before
