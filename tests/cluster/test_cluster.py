"""Cluster scale (issue 7): the SLURM profile on every config, a site profile named `slurm`, GPU flags
on the GPU rules only (a stub sbatch records what the SLURM executor plugin submits), the GPU-rule
resources per model, and the memory check that fails before a model is loaded.

The GPU rules are listed once, in ``llmgeom.pipeline.cluster.GPU_RULES``; the tests cover whichever of them the
workflow defines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import slurm_stub
from llmgeom.pipeline import cluster, code_tracking
from llmgeom.models import sources as models, tiny as testing
from llmgeom.models.loading import MEMORY_OVERHEAD_MB, ModelMemoryError, check_memory, count_parameters, load_prepared

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
CONFIGS = sorted(p.name for p in (REPO / "config").glob("*.yaml"))
PLACEHOLDERS = {"<account>": "testacct", "<cpu-partition>": "cpu", "<gpu-partition>": "gpu"}


def missing_part_packages(configname: str) -> list[str]:
    """The split-GGUF part packages of a config that are not installed (config/scaling.yaml's Qwen parts come with
    ``bash install.sh --scaling`` only; its DAG refuses to build without them, naming the pip line)."""
    import importlib.util

    specs = yaml.safe_load((REPO / "config" / configname).read_text())["models"].values()
    return [p for spec in specs if spec.get("source") == "split_gguf" for p in models.part_packages(spec["parts"])
            if importlib.util.find_spec(p) is None]


def smk(*args, cwd, env=None, check=True, timeout=900, offline=True):
    """Run snakemake; ``offline``: with HF_HUB_OFFLINE=1 (a real run then refuses Hub ids not in the cache at
    config time, issue 29; dry runs plan them)."""
    flag = "1" if offline else "0"
    env = dict(env or os.environ, HF_HUB_OFFLINE=flag, TRANSFORMERS_OFFLINE=flag)
    r = subprocess.run(SNAKEMAKE + ["-s", str(REPO / "Snakefile"), *args], capture_output=True, text=True,
                       env=env, cwd=cwd, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(map(str, args))} failed:\n{r.stdout[-5000:]}\n{r.stderr[-8000:]}")
    return r


def workflow_rules(cwd, configfile) -> set[str]:
    r = smk("--list-rules", "--configfile", str(configfile), "-d", str(cwd), cwd=cwd)
    # one rule a line, unindented, followed by its docstring in parentheses (continued on indented lines)
    return {m.group(1) for m in re.finditer(r"^(\w+)(?: \(|$)", r.stdout, flags=re.M)}


def site_profile(dest: Path) -> Path:
    """profiles/slurm with the placeholders filled in, as a site would (docs/cluster.md)."""
    dest.mkdir(parents=True, exist_ok=True)
    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    for k, v in PLACEHOLDERS.items():
        text = text.replace(k, v)
    (dest / "config.yaml").write_text(text)
    return dest


# --------------------------------------------------------------------------- profile and dry runs


def test_slurm_profile_declares_what_the_issue_asks():
    prof = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert prof["executor"] == "slurm"
    assert prof["jobs"] >= 1 and prof["latency-wait"] >= 30 and prof["retries"] >= 1
    assert prof["rerun-incomplete"] is True
    dr = prof["default-resources"]
    assert dr["slurm_account"] == "<account>" and dr["slurm_partition"] == "<cpu-partition>"
    # issue 18: status from squeue (sacct hangs the run where there is no accounting), a warning signal
    # before the time limit for a resumable extraction
    assert prof["slurm-status-command"] == "squeue"
    assert re.fullmatch(r"'--signal=USR1@\d+'", dr["slurm_extra"]), dr["slurm_extra"]
    # every GPU rule gets the GPU partition; no CPU rule is listed
    assert set(prof["set-resources"]) <= set(cluster.GPU_RULES)
    for rule in cluster.GPU_RULES:
        assert prof["set-resources"][rule]["slurm_partition"] == "<gpu-partition>"
    # the workflow profile (applied on top of every profile) must not override cluster settings
    wf = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert not set(wf) & {"executor", "jobs", "latency-wait", "default-resources", "set-resources", "retries"}
    # nor cap threads: Snakemake applies `cores` to submitted jobs too (issue 12: --cpus-per-task=2 for every job)
    assert not set(wf) & {"cores", "max-threads", "set-threads"}
    assert not set(prof) & {"cores", "max-threads"}


@pytest.mark.slow
@pytest.mark.parametrize("configname", CONFIGS)
def test_dry_run_with_slurm_profile(configname, tmp_path):
    """`snakemake -n --profile profiles/slurm` on every config: GPU-rule jobs ask for the GPU partition and
    a GPU, every other job for the CPU partition and none."""
    if missing_part_packages(configname):
        pytest.skip(f"{configname} needs its split-GGUF part packages (bash install.sh --scaling); missing: "
                    f"{', '.join(missing_part_packages(configname)[:3])} ...")
    r = smk("-n", "--profile", str(REPO / "profiles" / "slurm"), "--configfile", str(REPO / "config" / configname),
            "-d", str(tmp_path), cwd=tmp_path)
    out = r.stdout + r.stderr
    assert "Using profiles" in out and "This was a dry-run" in out, out[-3000:]
    jobs = slurm_stub.dry_run_jobs(r.stdout)
    assert jobs
    gpu_seen = set()
    for j in jobs:
        res = j["resources"]
        if j["rule"] == "all":
            continue
        if j["rule"] in cluster.GPU_RULES:
            gpu_seen.add(j["rule"])
            assert res.get("slurm_partition") == "<gpu-partition>", j
            assert int(res["gpu"]) >= 1 and int(res["mem_mb"]) >= 256 and int(res["runtime"]) >= 1, j
        else:
            assert res.get("slurm_partition") == "<cpu-partition>", j
            assert "gpu" not in res and "gpu_model" not in res, j
        assert res.get("slurm_account") == "<account>", j
    assert "extract" in gpu_seen
    steps = [m for m in yaml.safe_load((REPO / "config" / configname).read_text())["models"].values()
             if re.fullmatch(r"step\d+", str(m.get("revision", "")))]
    if len(steps) >= 2:  # a checkpoint sweep: the trajectory over training is a target
        assert "checkpoint_trajectory" in {j["rule"] for j in jobs}


@pytest.mark.slow
def test_site_profile_named_slurm(tmp_path):
    """A profile named `slurm` in ~/.config/snakemake/ (here $XDG_CONFIG_HOME) works unchanged with
    `snakemake --profile slurm`; the workflow profile profiles/default is applied on top."""
    xdg = tmp_path / "xdg"
    site_profile(xdg / "snakemake" / "slurm")
    wd = tmp_path / "wd"
    wd.mkdir()
    env = dict(os.environ, XDG_CONFIG_HOME=str(xdg))
    r = smk("-n", "--profile", "slurm", "--configfile", str(REPO / "config" / "config.yaml"), "-d", str(wd),
            cwd=wd, env=env)
    out = r.stdout + r.stderr
    assert "Using profiles slurm and workflow specific profile" in out, out[-2000:]
    ext = [j for j in slurm_stub.dry_run_jobs(r.stdout) if j["rule"] == "extract"]
    assert ext and all(j["resources"]["slurm_partition"] == "gpu" and j["resources"]["gpu"] == "1" for j in ext)
    assert all(j["resources"]["slurm_account"] == "testacct" for j in ext)


# --------------------------------------------------------------------------- stub sbatch


@pytest.fixture(scope="module")
def stub_cluster_run(tmp_path_factory):
    """The tiny workflow (two tiny models, one with a gpu_model) submitted through the SLURM executor
    plugin to a stub sbatch that records its arguments and creates the jobs' outputs."""
    from conftest import tiny_config

    wd = tmp_path_factory.mktemp("slurm")
    cfg = tiny_config()
    cfg["models"]["tiny-llama"]["gpu_model"] = "h100"
    cfg["models"]["tiny-gpt2"]["mem_mb"] = 3000
    cfg["extract"]["threads"] = 4  # more than the 2 cores the development machine has (issue 12)
    cfg.setdefault("fisher", {})["threads"] = 3
    (wd / "config.yaml").write_text(yaml.safe_dump(cfg))
    prof = site_profile(wd / "profile")
    base = ["--configfile", str(wd / "config.yaml"), "-d", str(wd)]
    dry = smk("-n", *base, cwd=wd)
    jobs = slurm_stub.dry_run_jobs(dry.stdout)
    env = slurm_stub.install(wd / "bin", wd / "state", jobs)
    run = smk("--profile", str(prof), "--slurm-init-seconds-before-status-checks", "1", *base, cwd=wd, env=env,
              check=False)
    return wd, cfg, jobs, run, slurm_stub.submissions(wd / "state")


@pytest.mark.slow
def test_stub_sbatch_gpu_flags_only_on_gpu_rules(stub_cluster_run):
    wd, cfg, jobs, run, subs = stub_cluster_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    assert not (wd / "state" / "unknown_targets.txt").exists()
    submitted = {t for s in subs for t in s["targets"]}
    expected = {slurm_stub.job_key(j["rule"], j["wildcards"]) for j in jobs if j["rule"] != "all"}
    norm = {t.split(":")[0] + ":" + ",".join(sorted(x for x in t.split(":", 1)[1].split(",") if x)) for t in submitted}
    assert norm == expected  # every job went through sbatch exactly as planned
    defined = {j["rule"] for j in jobs}
    gpu_rules = set(cluster.GPU_RULES) & defined
    assert "extract" in gpu_rules
    seen_gpu = set()
    per_model = {}
    for s in subs:
        gpu = set(s["rules"]) & gpu_rules
        if gpu:
            seen_gpu |= gpu
            assert set(s["rules"]) <= gpu_rules, s["rules"]  # GPU jobs are never grouped with CPU jobs
            models_in = {_wildcards(t)["model"] for t in s["targets"]}
            assert len(models_in) == 1, s["targets"]  # one model per submission
            model = models_in.pop()
            per_model[model] = per_model.get(model, 0) + 1
            # a random-init twin (issue 28) asks for its trained model's GPU
            want = "--gpus=h100:1" if model in ("tiny-llama", "tiny-llama-randinit") else "--gpus=1"
            assert s["gpu_flags"] == [want], s["flags"]
            assert " -p gpu" in s["flags"] and " -A testacct" in s["flags"]
            mem = int(re.search(r"--mem (\d+)", s["flags"]).group(1))
            # wind-tunnel entries (issue 14): the resources of wind_tunnel.models.<name> (checkpoints: <name>-step<k>)
            spec = (cfg["models"].get(model.removesuffix("-randinit"))
                    or cfg["wind_tunnel"]["models"][re.sub(r"-step\d+$", "", model)])
            assert mem == spec.get("mem_mb", 8000)  # the jobs run one after another: max, not sum
            assert _runtime(s) == sum(int(j["resources"]["runtime"]) for j in jobs if j["rule"] in gpu_rules
                                      and j["wildcards"].get("model") == model)  # covers all of its jobs
        else:
            assert s["gpu_flags"] == [], (s["rules"], s["flags"])
            assert " -p cpu" in s["flags"], s["flags"]
    assert seen_gpu == gpu_rules  # extraction and intervention jobs (whichever exist) all got a GPU
    wt = [e for m, spec in cfg.get("wind_tunnel", {}).get("models", {}).items()
          for e in [m] + [f"{m}-step{k}" for k in spec.get("checkpoints", [])]]  # wind-tunnel entries (issue 14)
    twins = [f"{m}-randinit" for m in cfg["models"]] + [f"{m}-step0" for m in cfg.get("wind_tunnel", {}).get(
        "models", {})]  # the null models (issue 28)
    assert per_model == {m: 1 for m in [*cfg["models"], *twins, *wt]}  # one GPU submission per model (issue 13)
    # small CPU jobs were bundled: at least one submission holds several analysis jobs
    assert max(len(s["targets"]) for s in subs if not set(s["rules"]) & gpu_rules) > 1


def _cpus(s) -> int:
    return int(re.search(r"--cpus-per-task[= ](\d+)", s["flags"]).group(1))


@pytest.mark.slow
def test_stub_sbatch_cpus_per_task_are_the_rules_threads(stub_cluster_run):
    """Issue 12: no `cores` from the workflow profile caps the threads of submitted jobs: a GPU rule gets
    extract.threads, an analysis rule fisher.threads (in its group job: at least that), single-threaded
    rules 1."""
    wd, cfg, jobs, run, subs = stub_cluster_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    ext = [s for s in subs if "extract" in s["rules"]]  # a model's GPU submission (its jobs run one after another)
    assert ext and all(_cpus(s) == 4 for s in ext), [s["flags"] for s in ext]
    fisher = [s for s in subs if "fisher" in s["rules"]]
    assert fisher and all(_cpus(s) >= 3 for s in fisher), [(s["rules"], s["flags"]) for s in fisher]
    single = [s for s in subs if s["rules"] == ["prepare_model"]]
    assert single and all(_cpus(s) == 1 for s in single), [s["flags"] for s in single]


def _wildcards(target: str) -> dict:
    return dict(kv.split("=", 1) for kv in target.split(":", 1)[1].split(",") if kv)


def _runtime(sub) -> int:
    """Minutes asked by an sbatch call (-t / --time)."""
    m = re.search(r"(?:^| )(?:-t|--time)[ =](\d+)", sub["flags"])
    return int(m.group(1))


@pytest.mark.slow
def test_paper3_one_gpu_submission_per_model(tmp_path):
    """Issue 13: on the paper3 config every model's GPU jobs (5 extractions, 4 SULA conditions, the
    interventions, the key orthogonality of its weights) are one sbatch call with the model's GPU flags and memory and the sum of the runtimes
    (the jobs are stacked in series by the model's GPU slot, whatever the cores)."""
    from conftest import study_config

    cfg = study_config(REPO / "config" / "paper3.yaml")
    wd = tmp_path / "wd"
    wd.mkdir()
    base = ["--configfile", str(REPO / "config" / "paper3.yaml"), "-d", str(wd)]
    jobs = slurm_stub.dry_run_jobs(smk("-n", *base, cwd=wd).stdout)
    env = slurm_stub.install(wd / "bin", wd / "state", jobs)
    # online: the stub runs no job, and offline the config check refuses the uncached Hub ids (issue 29 item 3)
    run = smk("--profile", str(site_profile(tmp_path / "profile")), "--slurm-init-seconds-before-status-checks", "1",
              *base, cwd=wd, env=env, check=False, offline=False)
    assert run.returncode == 0, run.stderr[-4000:]
    gpu_rules = set(cluster.GPU_RULES)
    gpu_subs = [s for s in slurm_stub.submissions(wd / "state") if set(s["rules"]) & gpu_rules]
    by_model = {}
    for s in gpu_subs:
        models_in = {_wildcards(t)["model"] for t in s["targets"]}
        assert len(models_in) == 1 and set(s["rules"]) <= gpu_rules, s["targets"]
        by_model.setdefault(models_in.pop(), []).append(s)
    assert sorted(by_model) == sorted(list(cfg["models"]) + [f"{m}-randinit" for m in cfg["models"]])  # + twins
    # the submitting run does not count the GPU slot across submissions (resource scope "local"): another model's
    # GPU submission goes out while the first one still runs (before Snakemake sees any GPU job finish)
    log = run.stderr.splitlines()
    first_done = next(i for i, line in enumerate(log) if re.match(rf"Finished jobid: \d+ \(Rule: ({'|'.join(gpu_rules)})\)", line))
    assert sum("/group_gpu_" in line and "has been submitted" in line for line in log[:first_done]) >= 2
    for m, subs in by_model.items():
        assert len(subs) == 1, (m, [s["targets"] for s in subs])
        twin = m.endswith("-randinit")
        s, spec = subs[0], cfg["models"][m.removesuffix("-randinit")]  # a twin: its trained model's resources
        mine = [j for j in jobs if j["rule"] in gpu_rules and j["wildcards"].get("model") == m]
        n = 6 if twin else 11  # 5 prompt sets + 4 SULA conditions + interventions + key orthogonality; a twin: mixed,
        assert len(s["targets"]) == len(mine) == n  # summary set, corpus, SULA main, interventions, keys (the claims')
        # an LLM entry: no wind-tunnel rules
        assert set(s["rules"]) == {"extract", "extract_sula", "intervene", "key_orthogonality"}
        g = spec.get("gpus", 1)
        assert s["gpu_flags"] == [f"--gpus={spec['gpu_model']}:{g}" if spec.get("gpu_model") else f"--gpus={g}"]
        assert " -p gpu" in s["flags"]
        assert int(re.search(r"--mem (\d+)", s["flags"]).group(1)) == spec["mem_mb"]
        assert _runtime(s) == n * spec["runtime"]


@pytest.mark.slow
def test_after_stub_cluster_run_nothing_to_do(stub_cluster_run):
    wd, *_ = stub_cluster_run
    for _ in range(2):
        r = smk("-n", "--configfile", str(wd / "config.yaml"), "-d", str(wd), cwd=wd)
        assert "Nothing to be done" in r.stdout + r.stderr, r.stdout[-3000:]


def test_unfilled_placeholders_are_named(tmp_path):
    """Issue 18 point 4: every profile setting that still holds <account>, <cpu-partition> or <gpu-partition>
    is named (check_site_profile refuses the run with these lines before anything is submitted)."""
    prof = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    found = cluster.unfilled_placeholders(prof["default-resources"], prof["set-resources"])
    assert "default-resources: slurm_account=<account>" in found
    assert "default-resources: slurm_partition=<cpu-partition>" in found
    assert {f"set-resources: {r}: slurm_partition=<gpu-partition>" for r in prof["set-resources"]} <= set(found)
    filled = yaml.safe_load((site_profile(tmp_path) / "config.yaml").read_text())
    assert cluster.unfilled_placeholders(filled["default-resources"], filled["set-resources"]) == []


def test_warning_lead_against_the_runtime():
    """Issue 18: a GPU job whose limit is within the warning's lead time plus SLURM's 30-s timer gets the
    warning at once (check_site_profile refuses it); the profile's lead and sbatch's default are read back."""
    prof = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    lead = cluster.signal_lead_s(prof["default-resources"]["slurm_extra"])
    assert lead == 120
    assert cluster.signal_lead_s("--qos=high --signal=B:USR1@300") == 300
    assert cluster.signal_lead_s("--signal USR1") == 60 and cluster.signal_lead_s("--qos=high") is None
    assert cluster.signal_lead_s(None) is None
    jobs = [("a", 1, "'--signal=USR1@120'"), ("b", 2, "--signal=USR1@120"), ("c", 3, "--signal=USR1@120"),
            ("d", 1, "--signal=USR1@1"), ("e", 1, "--signal=USR1@30"), ("f", 1, None), ("g", 60, "--signal=USR1@120")]
    early = cluster.early_warnings(jobs)
    # 60 and 120 s <= 120 + 30; 180 s is not; @1: 60 > 31; @30: 60 <= 60
    assert [e.split(":")[0] for e in early] == ["a", "b", "e"], early
    assert early[0] == ("a: runtime 1 min = 60 s, warning --signal ...@120 (sent from 150 s before the end); "
                        "runtime >= 3 min, or a lead below 30 s")


# --------------------------------------------------------------------------- resources and memory


def test_gpu_job_resources_per_model():
    models_cfg = {"a": {"gpus": 2, "gpu_model": "a100", "mem_mb": 10000, "runtime": 90},
                  "b": {"gpus": 1, "gpu_model": None, "mem_mb": 4000, "runtime": 30}}
    res = cluster.gpu_job_resources(models_cfg)

    class W:
        def __init__(self, model):
            self.model = model

    assert res["gpu"](W("a")) == 2 and res["gpu_model"](W("a")) == "a100"
    assert res["gpu_model"](W("b")) is None  # omitted by Snakemake: plain --gpus=1
    assert [res["mem_mb"](W("b"), a) for a in (1, 2, 3)] == [4000, 6000, 8000]
    assert [res["runtime"](W("a"), a) for a in (1, 2)] == [90, 135]
    # on a cluster one GPU slot for all models, a plain value (no function evaluated per job)
    assert res["gpu_slot_0"] == 1 and not any(k.startswith("gpu_slot_") and k != "gpu_slot_0" for k in res)
    assert cluster.gpu_slot_limits(cluster.gpu_slots(models_cfg, None)) == {"gpu_slot_0": 1}
    # locally each job holds its own model's GPU slot (1 at a time), and no other (None: omitted by Snakemake)
    local = cluster.gpu_job_resources(models_cfg, cluster.gpu_slots(models_cfg, 2))
    assert cluster.gpu_slot_limits(cluster.gpu_slots(models_cfg, 2)) == {"gpu_slot_0": 1, "gpu_slot_1": 1}
    assert local["gpu_slot_0"](W("a")) == 1 and local["gpu_slot_0"](W("b")) is None
    assert local["gpu_slot_1"](W("b")) == 1 and local["gpu_slot_1"](W("a")) is None
    # resources that are the same for every model are plain values; gpu_model omitted when null for all
    same = cluster.gpu_job_resources({m: {"gpus": 1, "gpu_model": None, "mem_mb": 4000, "runtime": 30} for m in "ab"})
    assert same["gpu"] == 1 and "gpu_model" not in same and same["mem_mb"](W("a"), 2) == 6000
    assert [cluster.scaled_mem(2000)(W("a"), a) for a in (1, 2)] == [2000, 3000]
    assert [cluster.scaled_mem(lambda w: models_cfg[w.model]["mem_mb"])(W("a"), a) for a in (1, 3)] == [10000, 20000]
    assert [cluster.scaled_runtime(30)(W("a"), a) for a in (1, 2)] == [30, 45]
    assert [cluster.scaled_runtime(1)(W("a"), a) for a in (1, 2, 3)] == [1, 2, 2]  # whole minutes, rounded up


def test_gpu_slots_stay_few_for_large_local_sweeps():
    """Issue 21 point 6: the slots of a local run are at most max(LOCAL_GPU_SLOTS, cores), so the callables per
    GPU job (and the no-op dry run) grow linearly with the number of models; a model keeps one slot."""
    many = {f"m{i:03d}": {} for i in range(500)}
    slots = cluster.gpu_slots(many, 2)
    assert len(set(slots.values())) == cluster.LOCAL_GPU_SLOTS
    assert slots["m000"] == slots[f"m{cluster.LOCAL_GPU_SLOTS:03d}"] == "gpu_slot_0" != slots["m001"]
    assert len(set(cluster.gpu_slots(many, 64).values())) == 64
    assert set(cluster.gpu_slots(many, None).values()) == {"gpu_slot_0"}
    assert cluster.gpu_slots({"only": {}}, 8) == {"only": "gpu_slot_0"}
    assert set(cluster.gpu_slots(many, 1).values()) == {"gpu_slot_0"}  # one core: one job at a time anyway


# the default study and a checkpoint sweep: together they schedule every rule of the workflow
RETRY_CONFIGS = ("config.yaml", "pythia_checkpoints.yaml")


@pytest.mark.slow
def test_every_rule_grows_memory_with_the_retry_attempt(tmp_path):
    """Every rule declares mem_mb=scaled_mem(...) (GPU rules: GPU_RESOURCES): a job resubmitted by the
    profile's ``retries`` (attempt 2) asks for 1.5x the memory of attempt 1, and the GPU rules for 1.5x
    the runtime. Read from ``snakemake -n --attempt N`` on empty directories, so a new rule that declares
    a plain number (or nothing: Snakemake's default) fails here; every rule of ``--list-rules`` is seen."""
    seen = set()
    for name in RETRY_CONFIGS:
        jobs = {}
        for attempt in (1, 2):
            r = smk("-n", "--configfile", str(REPO / "config" / name), "-d", str(tmp_path / name), "--cores", "1",
                    "--attempt", str(attempt), cwd=tmp_path)
            jobs[attempt] = {slurm_stub.job_key(j["rule"], j["wildcards"]): j for j in slurm_stub.dry_run_jobs(r.stdout)
                             if j["rule"] != "all"}
        assert jobs[1] and jobs[1].keys() == jobs[2].keys(), name
        for key, first in jobs[1].items():
            again = jobs[2][key]["resources"]
            m1, m2 = int(first["resources"]["mem_mb"]), int(again["mem_mb"])
            assert m2 == int(m1 * 1.5), f"{name}: {key} mem_mb {m1} -> {m2} on attempt 2; declare mem_mb=scaled_mem(...)"
            if first["rule"] in cluster.GPU_RULES:
                t1, t2 = int(first["resources"]["runtime"]), int(again["runtime"])
                assert t2 == -(-t1 * 3 // 2), f"{name}: {key} runtime {t1} -> {t2} on attempt 2 (1.5x, whole minutes up)"
            seen.add(first["rule"])
    rules = workflow_rules(tmp_path, REPO / "config" / "config.yaml") - {"all"}
    assert len(rules) >= 20 and rules <= seen, sorted(rules - seen)


def test_size_defaults_scale_with_parameters_and_dtype():
    cfg = {"models": {"small": {"params_b": 0.135, "dtype": "float32"},
                      "big": {"params_b": 7.2, "dtype": "bfloat16"},
                      "fixed": {"params_b": 7.2, "mem_mb": 5000}}}
    cluster.apply_size_defaults(cfg)
    m = cfg["models"]
    assert m["small"]["mem_mb"] < m["big"]["mem_mb"] and m["small"]["runtime"] < m["big"]["runtime"]
    assert m["big"]["mem_mb"] >= 7.2e9 * 2 / 2**20  # at least the bf16 weights
    assert m["fixed"]["mem_mb"] == 5000  # an explicit value wins


def test_float32_loading_rules_are_sized_for_float32():
    """Issue 12, point 5: `fisher` (and `prepare_model`) load the model in float32 on the CPU; a bf16 entry sized
    from params_b declares memory for bf16 weights, too small for that."""
    cfg = {"models": {"m": {"source": "hf_hub", "repo_id": "x/y", "dtype": "bfloat16", "params_b": 7.0},
                      "big": {"source": "hf_hub", "repo_id": "x/y", "dtype": "bfloat16", "params_b": 7.0,
                              "mem_mb": 64000},
                      "plain": {"source": "hf_hub", "repo_id": "x/y", "dtype": "bfloat16", "mem_mb": 9000}}}
    cluster.apply_size_defaults(cfg)
    m = cfg["models"]["m"]
    assert m["mem_mb"] == cluster.size_resources(7.0, "bfloat16")["mem_mb"] == 20700  # 4000 + 1.25 x 13,351 MiB of bf16 weights
    f32 = cluster.size_resources(7.0, "float32")["mem_mb"]
    assert f32 == 37400  # 4000 + 1.25 x 26,703 MiB of float32 weights
    assert cluster.float32_mem_mb(m) == f32
    assert cluster.float32_mem_mb(cfg["models"]["big"]) == 64000  # a larger declaration is kept
    assert cluster.float32_mem_mb(cfg["models"]["plain"]) == 9000  # no size known: as declared (check_memory guards it)


def test_gpus_without_device_map_is_a_config_error():
    from llmgeom.pipeline.checks import check_gpu_config
    from llmgeom.pipeline.schema import ConfigError

    check_gpu_config({"models": {"m": {"gpus": 2, "device_map": "auto"}}})
    with pytest.raises(ConfigError, match="device_map"):
        check_gpu_config({"models": {"m": {"gpus": 2, "device_map": None}}})


def test_memory_check_fails_before_loading_with_the_numbers(tmp_path, monkeypatch):
    d = tmp_path / "m"
    testing.save_tiny_model_dir("llama", tmp_path / "src")
    models.prepare_model("tiny", {"source": "hf_local", "path": str(tmp_path / "src")}, d)
    import transformers

    def boom(*a, **k):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    n = count_parameters(transformers.AutoConfig.from_pretrained(tmp_path / "src"))
    with pytest.raises(ModelMemoryError) as e:
        load_prepared(d, dtype="float32", device="cpu", mem_mb=MEMORY_OVERHEAD_MB - 1)
    msg = str(e.value)
    assert f"{n:,} parameters x 4 bytes (float32)" in msg
    assert f"mem_mb={MEMORY_OVERHEAD_MB - 1}" in msg and "raise models.m.mem_mb" in msg


def test_memory_estimate_matches_the_loaded_model(tmp_path):
    testing.save_tiny_model_dir("gpt2", tmp_path / "src")
    models.prepare_model("tiny", {"source": "hf_local", "path": str(tmp_path / "src")}, tmp_path / "m")
    info = check_memory(tmp_path / "m", dtype="float32", device="cpu", mem_mb=100000)
    model, _ = load_prepared(tmp_path / "m", dtype="float32", device="cpu")
    assert info["n_params"] == sum(p.numel() for p in model.parameters())
    half = check_memory(tmp_path / "m", dtype="bfloat16", device="cpu", mem_mb=100000)
    assert half["bytes_per_param"] * 2 == info["bytes_per_param"] == 4 and half["n_params"] == info["n_params"]


# --------------------------------------------------------------------------- code tracking helper


def test_package_files_follow_imports_transitively():
    mods = code_tracking.package_modules("analyses.value_manifold")
    assert {"analyses.value_manifold", "measures.pca", "core.store", "core.stats"} <= set(mods)
    assert not any(m.startswith("workflow.") for m in mods)
    files = code_tracking.package_files("extract.forward", cwd=REPO)
    assert "src/llmgeom/extract/forward.py" in files and "src/llmgeom/models/architectures.py" in files
    assert all(Path(REPO / f).is_file() for f in files)
    outside = Path(code_tracking.PACKAGE_DIR.anchor) / "nonexistent-workdir"
    assert all(Path(f).is_absolute() for f in code_tracking.package_files("extract.forward", cwd=outside))
    with pytest.raises(ValueError, match="no module llmgeom.nosuch"):
        code_tracking.package_modules("nosuch")
    # a script's imports are followed the same way
    script = code_tracking.package_files(script=REPO / "workflow/scripts/value_manifold.py", cwd=REPO)
    assert "src/llmgeom/analyses/value_manifold.py" in script and "src/llmgeom/measures/pca.py" in script


# --------------------------------------------------------------------------- fast DAG


HEAVY = ("torch", "transformers", "pandas", "scipy", "sklearn", "skdim", "matplotlib", "h5py")


def test_modules_imported_while_building_the_dag_stay_light():
    """The no-op dry run must stay fast (<= 3 s on 20 models, benchmarks/): the package modules the
    Snakefile and rule files import may not pull in torch, pandas, scipy, scikit-learn or matplotlib
    (each costs 0.5-2.5 s). Config checks live in llmgeom.pipeline.schema / .checks / .derived for this reason."""
    mods = set()
    for f in [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]:
        mods |= set(re.findall(r"^\s*from (llmgeom(?:\.\w+)*) import", f.read_text(), re.M))
        mods |= set(re.findall(r"^\s*import (llmgeom(?:\.\w+)*)", f.read_text(), re.M))
    assert {"llmgeom.pipeline.schema", "llmgeom.pipeline.checks", "llmgeom.pipeline.derived",
            "llmgeom.pipeline.cluster"} <= mods
    code = ("import sys\n" + "".join(f"import {m}\n" for m in sorted(mods))
            + "import llmgeom.models.sources\n"  # check_models (pipeline.checks) imports it while the DAG is built
            + f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", f"heavy modules imported at DAG time: {r.stdout.strip()} (via {sorted(mods)})"


# --------------------------------------------------------------------------- checkpoint sweeps


def test_checkpoint_steps_and_trajectory_table():
    import pandas as pd

    from llmgeom.pipeline import sweeps

    models_cfg = {"p-0": {"repo_id": "E/p", "revision": "step0"}, "p-1k": {"repo_id": "E/p", "revision": "step1000"},
                  "other": {"repo_id": "E/q", "revision": "main"}}
    steps = sweeps.checkpoint_steps(models_cfg)
    assert steps == {"p-0": 0, "p-1k": 1000}
    series = sweeps.checkpoint_series(models_cfg, steps)
    t2 = pd.DataFrame({"model": ["p-1k", "p-0", "other"], "pc12": [0.5, 0.9, 0.1], "family": ["x", "x", "y"],
                       "flag": [True, False, True]})
    idp = pd.DataFrame({"model": ["p-0", "p-0", "p-1k"], "id_mean": [4.0, 6.0, 8.0]})
    from llmgeom.analyses.checkpoint_trajectory import trajectory_table

    df = trajectory_table({"table2": t2, "id_profile": idp}, steps, series)
    assert set(df.model) == {"p-0", "p-1k"} and set(df.metric) == {"pc12", "id_mean"}  # numeric, not bool/str
    pc = df[df.metric == "pc12"]
    assert list(pc.step) == [0, 1000] and list(pc.value) == [0.9, 0.5]
    ids = df[df.metric == "id_mean"].set_index("model")
    assert ids.loc["p-0", "value"] == 5.0 and ids.loc["p-0", "n_rows"] == 2


def test_pythia_sweep_config_is_a_checkpoint_series():
    from llmgeom.pipeline import sweeps

    cfg = yaml.safe_load((REPO / "config" / "pythia_checkpoints.yaml").read_text())
    steps = sweeps.checkpoint_steps(cfg["models"])
    assert len(steps) == len(cfg["models"]) >= 5 and 0 in steps.values() and 143000 in steps.values()
    assert len({m["repo_id"] for m in cfg["models"].values()}) == 1
    assert sorted(steps, key=steps.get) == sorted(steps)  # names sort in training order


def test_gpu_rules_are_declared_once_and_applied():
    """cluster.GPU is the one declaration: declare_gpu_rules sets each GPU rule's group and priority from it,
    splits extract's priority on corpus sets, and refuses a rule that asks for a GPU without being declared (or
    a declared rule that is missing or has no GPU resources), naming the rule."""
    from types import SimpleNamespace as NS

    from snakemake_interface_common.exceptions import WorkflowError

    def wf(extra=(), drop=(), strip=()):
        rules = [NS(name=n, resources={} if n in strip else {"gpu": 1, "_cores": 1}, group=None, priority=0)
                 for n in cluster.GPU if n not in drop]
        rules += [NS(name="value_manifold", resources={"_cores": 1}, group="analysis", priority=20)]
        rules += [NS(name=n, resources={"gpu": 1}, group=None, priority=0) for n in extra]
        return NS(rules=rules), {r.name: r for r in rules}

    workflow, by_name = wf()
    cluster.declare_gpu_rules(workflow, is_corpus=lambda w: w.promptset == "corpus")
    for name, decl in cluster.GPU.items():
        assert by_name[name].group == "gpu_{model}"
        if name != "extract":
            assert by_name[name].priority == decl.priority
    assert by_name["extract"].priority(NS(promptset="corpus")) == 65
    assert by_name["extract"].priority(NS(promptset="mixed")) == 60
    assert (by_name["value_manifold"].group, by_name["value_manifold"].priority) == ("analysis", 20)
    assert set(cluster.SERVER_RULES) == {n for n, d in cluster.GPU.items() if d.server_task}
    from llmgeom.pipeline import model_server

    assert {d.server_task for d in cluster.GPU.values()} - {None} <= set(model_server.TASKS)
    for kwargs, words in [({"extra": ["my_gpu_rule"]}, "not declared: my_gpu_rule"),
                          ({"drop": ["intervene"]}, "declared but not defined: intervene"),
                          ({"strip": ["extract_sula"]}, "without `resources: **GPU_RESOURCES`: extract_sula")]:
        with pytest.raises(WorkflowError, match=re.escape(words)):
            cluster.declare_gpu_rules(wf(**kwargs)[0], is_corpus=lambda w: False)
