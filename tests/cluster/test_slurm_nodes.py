"""The cluster path on a real multi-node SLURM (issue 31): one slurmctld and two compute nodes, each its own
``slurmd -N <name>`` on this machine with a GPU gres of its own type (tests/support/slurm_cluster.py ``MULTI_NODES``),
started once for this module and stopped after it.

- the tiny study with two models through profiles/slurm (filled in as a site would): each model's GPU group runs
  on a node of its own, a model with ``gpu_model`` lands on the node with that GPU type (read back per job with
  ``scontrol show job``), and the tables equal those of a local run;
- a node lost mid-extraction: its ``slurmd`` stopped while the extraction runs there, the extraction's processes
  left running (what a network partition or a hung slurmd looks like to the controller). The node goes DOWN, the
  job ends NODE_FAIL, Snakemake retries it on the other node, the retry resumes from the committed batches, the
  orphan stops without writing (it loses its output lease: llmgeom.core.lease), and the final file equals an
  uninterrupted run's in every dataset;
- the node returned (slurmd started again): later jobs use it.

Skipped, with the reason, where SLURM cannot be installed (not root, no apt-get).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

import slurm_cluster
from conftest import pin_reference_tokenizer, same_datasets, tiny_config
from conftest import committed_batches
from test_slurm_real import SITE, _start_run, _wait_for, site_profile, smk

pytestmark = [pytest.mark.slow, pytest.mark.minutes(3.5)]

N1, N2 = slurm_cluster.MULTI_NODES  # llmgeom-n1 (tesla), llmgeom-n2 (ampere)
GPU_OF = {n: t for n, t in slurm_cluster.MULTI_NODES.items()}
MODELS = ("tiny-llama", "tiny-gpt2")
#: lease timing for these runs (LLMGEOM_LEASE_TTL_S): renewed every second, a retry waits at most 3 x 6 s
LEASE_ENV = {"LLMGEOM_LEASE_TTL_S": "6"}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """A running two-node SLURM; stopped at the end, nothing left running."""
    reason = slurm_cluster.ensure_installed()
    if reason:
        pytest.skip(f"no real SLURM: {reason}")
    c = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm_nodes"), nodes=slurm_cluster.MULTI_NODES,
                                   slurmd_timeout=slurm_cluster.MULTI_SLURMD_TIMEOUT)
    c.start()
    c.env.update(LEASE_ENV)
    yield c
    for n in c.nodes:  # a node a test left down: its slurmd ends the orphaned steps when it comes back
        if f"slurmd:{n}" not in c.procs:
            c.start_slurmd(n)
    pids = dict(c.procs)
    c.stop()
    assert not [p for p in pids.values() if slurm_cluster._alive(p)]


def _study(gpu_models: dict, models=MODELS) -> dict:
    cfg = pin_reference_tokenizer(tiny_config(nulls=False))  # the cluster path, not the nulls (test_workflow.py runs those)
    cfg["models"] = {m: dict(cfg["models"][m], **({"gpu_model": gpu_models[m]} if gpu_models.get(m) else {}))
                     for m in models}
    cfg.pop("wind_tunnel", None)
    return cfg


def _gpu_jobs(slurm, before):
    return sorted((j for j in slurm.jobs() if j["JobId"] not in before and j["Partition"] == "gpu"),
                  key=lambda j: int(j["JobId"]))


def _gpu_type(job: dict) -> str | None:
    m = re.search(r"gpu:(\w+):\d+", job.get("TresPerJob", ""))
    return m[1] if m else None


# --------------------------------------------------------------------------- side by side


def test_two_models_gpu_groups_on_their_own_nodes_tables_equal_local(nodes, tmp_path):
    """tiny-llama pinned to the tesla GPU (node n1), tiny-gpt2 to the ampere one (n2): one GPU submission per
    model, each on the node with its GPU type (so on a node of its own), and every table and activation file
    equals that of a local run of the same study."""
    targets = [f"results/{m}/tables/attention_focusing.csv" for m in MODELS]
    cfg = _study({"tiny-llama": GPU_OF[N1], "tiny-gpt2": GPU_OF[N2]})
    wd, ref = tmp_path / "cluster", tmp_path / "local"
    for d in (wd, ref):
        d.mkdir()
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    smk("--cores", "2", "--configfile", str(ref / "config.yaml"), "-d", str(ref), *targets, cwd=ref, env=os.environ)
    before = {j["JobId"] for j in nodes.jobs()}
    prof = site_profile(wd / "profile", **SITE)
    smk("--profile", str(prof), "--configfile", str(wd / "config.yaml"), "-d", str(wd), *targets, cwd=wd,
        env=nodes.env)
    gpu = _gpu_jobs(nodes, before)
    assert len(gpu) == 2 and all(j["JobState"] == "COMPLETED" for j in gpu), \
        [(j["JobId"], j["JobState"], j.get("TresPerJob")) for j in gpu]
    placed = {_gpu_type(j): j["BatchHost"] for j in gpu}
    assert placed == {GPU_OF[N1]: N1, GPU_OF[N2]: N2}, placed  # gpu_model -> the node with that GPU type
    assert len(set(placed.values())) == 2  # each model's group on a node of its own
    for m in MODELS:
        same_datasets(ref / f"results/{m}/activations/mixed.h5", wd / f"results/{m}/activations/mixed.h5")
    tables = sorted(p.relative_to(ref) for p in (ref / "results").rglob("*.csv"))
    assert len(tables) >= 2 and tables == sorted(p.relative_to(wd) for p in (wd / "results").rglob("*.csv"))
    for t in tables:
        pd.testing.assert_frame_equal(pd.read_csv(wd / t), pd.read_csv(ref / t))


# --------------------------------------------------------------------------- a node lost mid-extraction

MODEL = "tiny-gpt2"
TARGET_H5 = f"results/{MODEL}/activations/mixed.h5"
N_LONG = 120  # single-prompt batches of the interrupted extraction

#: every extract_batch sleeps the seconds in $LLMGEOM_TEST_BATCH_DELAY_FILE first, read anew at each batch, so
#: that the test can slow the extraction on the node it stops (it must outlast SLURM's detection of the lost
#: node, ~30 s) and then speed up the retry
DELAY_SHIM = """\
import importlib.abc, importlib.util, os, sys, time

class _SlowBatches(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "llmgeom.extract.forward":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            batch, path = module.extract_batch, os.environ["LLMGEOM_TEST_BATCH_DELAY_FILE"]

            def slow(*args, **kwargs):
                try:
                    time.sleep(float(open(path).read() or 0))
                except (OSError, ValueError):
                    pass
                return batch(*args, **kwargs)

            module.extract_batch = slow

        spec.loader.exec_module = exec_module
        return spec

if os.environ.get("LLMGEOM_TEST_BATCH_DELAY_FILE"):
    sys.meta_path.insert(0, _SlowBatches())
"""


def _long_study() -> dict:
    cfg = _study({}, models=(MODEL,))
    cfg["prompts"]["sets"]["mixed"]["n"] = N_LONG
    cfg["models"][MODEL]["batch_size"] = 1
    return cfg


def _delay_env(wd: Path, env: dict, delay: float) -> tuple[dict, Path]:
    shim = wd / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(DELAY_SHIM)
    f = wd / "batch_delay_s"
    f.write_text(str(delay))
    return dict(env, LLMGEOM_TEST_BATCH_DELAY_FILE=str(f),
                PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))), f


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted local run of the node-loss study's extraction; its resources are copied into the cluster
    run so that the files compare byte for byte."""
    ref = tmp_path_factory.mktemp("nodes_ref")
    (ref / "config.yaml").write_text(yaml.safe_dump(_long_study()))
    smk("--cores", "2", "--configfile", str(ref / "config.yaml"), "-d", str(ref), TARGET_H5, cwd=ref, env=os.environ)
    return ref


def _alive_in(wd: Path) -> list[int]:
    """Processes whose working directory is under ``wd`` (the run's job processes and model servers)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(wd):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def test_node_lost_mid_extraction_retry_elsewhere_resumes_orphan_stops(nodes, reference, tmp_path):
    """The extraction's node loses its slurmd after some batches are committed; its processes run on. SLURM
    marks the node DOWN after SlurmdTimeout and the job NODE_FAIL; the orphan's lease heartbeat sees that, gives
    up the lease and the orphan stops at its next batch without writing (log: ``lost the lease``) while its
    processes are still alive; Snakemake retries the job (retries: 1), which runs on the other node, resumes from
    the committed batches and completes: the file equals the uninterrupted run's in every dataset."""
    wd = tmp_path
    (wd / "config.yaml").write_text(yaml.safe_dump(_long_study()))
    shutil.copytree(reference / "resources", wd / "resources")  # mtimes kept: nothing upstream reruns
    env, delay = _delay_env(wd, nodes.env, 0.5)
    prof = site_profile(wd / "profile", **SITE, retries=1)
    before = {j["JobId"] for j in nodes.jobs()}
    run = _start_run(prof, wd, env, TARGET_H5)
    partial = wd / (TARGET_H5 + ".partial")
    try:
        _wait_for(lambda: run.poll() is None and committed_batches(partial) >= 3 or run.poll() is not None,
                  timeout=300, what="committed batches")
        assert run.poll() is None, (wd / "run.log").read_text()[-3000:]
        first = [j for j in _gpu_jobs(nodes, before) if j["JobState"] == "RUNNING"]
        assert len(first) == 1, first
        lost = first[0]["BatchHost"]
        other = N2 if lost == N1 else N1
        nodes.stop_slurmd(lost)  # the node stops answering; its job's processes run on
        log = wd / "logs" / "extract" / MODEL / "mixed.log"
        _wait_for(lambda: log.is_file() and "lost the lease" in log.read_text(errors="replace"), timeout=180,
                  what="the orphan to lose its lease")
        orphan_log = log.read_text(errors="replace")
        k_orphan = committed_batches(partial)
        assert 0 < k_orphan < N_LONG and _alive_in(wd), k_orphan  # stopped, but its processes still run
        assert nodes.node_state(lost).startswith("down"), nodes.node_state(lost)
        delay.write_text("0")  # the retry runs at full speed
        assert run.wait(timeout=600) == 0, (wd / "run.log").read_text()[-4000:] + nodes.logs()
    finally:
        if run.poll() is None:
            run.kill()
    gpu = _gpu_jobs(nodes, before)
    assert [j["JobState"] for j in gpu] == ["NODE_FAIL", "COMPLETED"], [(j["JobId"], j["JobState"]) for j in gpu]
    assert [j["BatchHost"] for j in gpu] == [lost, other]
    assert re.search(rf"lost the lease on \S+mixed.h5 \(SLURM job {gpu[0]['JobId']} on node {lost}.*NODE_FAIL",
                     orphan_log), orphan_log[-3000:]
    text = log.read_text()
    resumed = re.search(r"resumed; (\d+) of (\d+) batches were committed before, (\d+) computed now", text)
    assert resumed and int(resumed[1]) == k_orphan and int(resumed[2]) == N_LONG, text[-3000:]
    assert not list((wd / "results").rglob("*.partial*")) and not list((wd / "results").rglob("*.lease*"))
    same_datasets(reference / TARGET_H5, wd / TARGET_H5)
    nodes.lost = lost  # for the next test


def test_returned_node_is_used_by_later_jobs(nodes, reference, tmp_path):
    """The node lost in the previous test gets its slurmd back (which ends the orphaned steps there): SLURM
    returns it to service (ReturnToService=2) and a later run whose model asks that node's GPU type runs there."""
    lost = getattr(nodes, "lost", None)
    if lost is None:
        pytest.skip("needs test_node_lost_mid_extraction_retry_elsewhere_resumes_orphan_stops first")
    assert nodes.node_state(lost).startswith("down")
    nodes.start_slurmd(lost)  # waits until it is idle
    cfg = _long_study()
    cfg["models"][MODEL]["gpu_model"] = GPU_OF[lost]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    shutil.copytree(reference / "resources", tmp_path / "resources")
    before = {j["JobId"] for j in nodes.jobs()}
    smk("--profile", str(site_profile(tmp_path / "profile", **SITE)), "--configfile", str(tmp_path / "config.yaml"),
        "-d", str(tmp_path), TARGET_H5, cwd=tmp_path, env=nodes.env)
    gpu = _gpu_jobs(nodes, before)
    assert [(j["JobState"], j["BatchHost"]) for j in gpu] == [("COMPLETED", lost)], gpu
