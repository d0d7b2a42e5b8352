"""Rerun only what changed (issue 7), as workflow tests on the tiny config.

After a full run (one tiny model, run for real): two consecutive ``snakemake -n`` schedule nothing;
changing an analysis parameter schedules only that analysis and what depends on it (never extraction);
adding a model schedules only its jobs and the cross-model aggregates; editing package code reruns the
rules that use it (and touching it without a change reruns nothing). Every rule that runs a script
importing ``llmgeom`` lists that code as an input (``code=code(<script>)``).

The run uses a copy of the package (PYTHONPATH), so that the code-change test edits the copy, never the
source tree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import slurm_stub
from llmgeom.pipeline import cluster, code_tracking

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
NEVER_ON_ANALYSIS_CHANGE = {"prepare_model", "build_prompts", "build_sula", *cluster.GPU_RULES}

pytestmark = [pytest.mark.slow, pytest.mark.minutes(2)]

# (config section, key, new value, the rule that reads it); every rule must be in the tiny workflow
ANALYSIS_CHANGES = [
    ("value_manifold", "n_boot", 7, "value_manifold"),
    ("intrinsic_dimension", "n_subsamples", 3, "intrinsic_dimension"),
    ("margins", "threshold", 0.25, "margins"),
    ("domain_restriction", "n_boot", 11, "domain_restriction"),
    ("interventions", "n_boot", 13, "sula_interventions"),
]


class Workdir:
    def __init__(self, path: Path, pkg_src: Path):
        self.path, self.pkg_src = path, pkg_src

    def env(self):
        return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(self.pkg_src))

    def smk(self, *args, config="config.yaml", check=True):
        cmd = SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "-d", str(self.path), "--configfile",
                           str(self.path / config), "--cores", "2", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env(), cwd=self.path, timeout=1800)
        if check and r.returncode != 0:
            raise AssertionError(f"snakemake {' '.join(args)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}")
        return r

    def planned(self, *args, config="config.yaml") -> list[dict]:
        """Jobs that `snakemake -n` would run (rule `all` left out)."""
        r = self.smk("-n", *args, config=config)
        if "Nothing to be done" in r.stdout + r.stderr:
            return []
        return [j for j in slurm_stub.dry_run_jobs(r.stdout) if j["rule"] != "all"]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    from conftest import tiny_config

    base = tmp_path_factory.mktemp("rerun")
    pkg_src = base / "pkgcopy"
    shutil.copytree(REPO / "src" / "llmgeom", pkg_src / "llmgeom", ignore=shutil.ignore_patterns("__pycache__"))
    cfg_two = tiny_config()
    cfg = dict(cfg_two, models={"tiny-llama": cfg_two["models"]["tiny-llama"]})
    wd = Workdir(base / "wd", pkg_src)
    wd.path.mkdir()
    (wd.path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (wd.path / "config_two_models.yaml").write_text(yaml.safe_dump(cfg_two))
    fresh = wd.planned()  # the whole DAG, before anything ran
    wd.smk()
    return wd, cfg, fresh


def test_two_consecutive_dry_runs_schedule_nothing(full_run):
    wd, *_ = full_run
    assert wd.planned() == []
    assert wd.planned() == []


def _descendants(wd: Workdir, rule: str) -> set[str]:
    """Rules of the jobs that `--forcerun rule` would run: the rule and everything downstream of it."""
    return {j["rule"] for j in wd.planned("--forcerun", rule)}


@pytest.mark.parametrize("section,key,value,rule", ANALYSIS_CHANGES, ids=[c[0] for c in ANALYSIS_CHANGES])
def test_analysis_parameter_change_schedules_only_that_analysis(full_run, section, key, value, rule):
    wd, cfg, _ = full_run
    assert rule in {j["rule"] for j in _fresh_jobs(full_run)}, (
        f"rule {rule} is not in the tiny workflow: renamed? update ANALYSIS_CHANGES")
    changed = dict(cfg, **{section: dict(cfg.get(section, {}), **{key: value})})
    (wd.path / f"changed_{section}.yaml").write_text(yaml.safe_dump(changed))
    jobs = wd.planned(config=f"changed_{section}.yaml")
    rules = {j["rule"] for j in jobs}
    assert rule in rules, rules
    assert not rules & NEVER_ON_ANALYSIS_CHANGE, rules
    assert rules <= _descendants(wd, rule), rules - _descendants(wd, rule)
    direct = [j for j in jobs if j["rule"] == rule]
    assert all("params" in j["reason"].lower() for j in direct), [j["reason"] for j in direct]


def _fresh_jobs(full_run):
    return full_run[2]


def test_adding_a_model_schedules_only_its_jobs_and_the_aggregates(full_run):
    wd, cfg, _ = full_run
    jobs = wd.planned(config="config_two_models.yaml")
    assert jobs
    new_model_rules = set()
    for j in jobs:
        m = j["wildcards"].get("model")
        if m is not None:
            assert m in ("tiny-gpt2", "tiny-gpt2-randinit"), (j["rule"], j["wildcards"], j["reason"])  # + its twin
            new_model_rules.add(j["rule"])
            continue
        # no model wildcard: only cross-model tables, figures and provenance (all outputs under results/)
        assert j["rule"] not in NEVER_ON_ANALYSIS_CHANGE, j
        assert all(o.startswith(("results/summary/", "results/figures/", "results/provenance", "results/index.html"))
                   for o in j["output"]), j
    assert "extract" in new_model_rules and "prepare_model" in new_model_rules
    # every per-model job of the existing model is left alone
    assert not [j for j in jobs if j["wildcards"].get("model") == "tiny-llama"]


def test_package_code_change_reruns_the_rules_that_use_it(full_run):
    wd, *_ = full_run
    target = wd.pkg_src / "llmgeom" / "measures" / "pca.py"
    # touching without a change: checksums match, nothing reruns
    os.utime(target)
    assert wd.planned() == []
    original = target.read_text()
    try:
        target.write_text(original + "\n# changed by tests/workflow/test_rerun.py\n")
        jobs = wd.planned()
        rules = {j["rule"] for j in jobs}
        assert "value_manifold" in rules, rules
        # neither extraction imports the PCA (extract.py is the script of extract and extract_sula)
        assert not rules & {"extract", "extract_sula", "prepare_model", "build_prompts"}, rules
        for j in jobs:  # each job reruns because of the edited file, or of an input that will be remade
            assert "pca.py" in j["reason"] or "updated by another job" in j["reason"], (j["rule"], j["reason"])
            if "pca.py" in j["reason"]:
                assert "measures.pca" in code_tracking.package_modules(*_script_imports(j["rule"])), j["rule"]
    finally:
        target.write_text(original)


# --------------------------------------------------------------------------- code inputs cover the scripts


def _rule_scripts() -> dict[str, Path]:
    """rule name -> its script, read from workflow/rules/*.smk."""
    out = {}
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"\n(?=rule \w+:)", smk.read_text()):
            m = re.match(r"rule (\w+):", block)
            s = re.search(r"\n    script:\n\s+\"([^\"]+)\"", block)
            if m and s:
                out[m.group(1)] = (smk.parent / s.group(1)).resolve()
    return out


def _script_imports(rule: str) -> list[str]:
    script = _rule_scripts().get(rule)
    if script is None:
        return []
    return [m for m in code_tracking.module_imports(str(script)) if m not in code_tracking.UNTRACKED_MODULES]


def test_every_rule_lists_the_package_code_its_script_runs(full_run):
    """Rules declare `code=code(<script>)` (docs/configuration.md, "Rerunning only what changed")."""
    _, _, fresh = full_run
    missing = {}
    for j in fresh:
        needed = set(code_tracking.package_modules(*_script_imports(j["rule"]))) if _script_imports(j["rule"]) else set()
        listed = {".".join(Path(f).with_suffix("").parts[Path(f).parts.index("llmgeom") + 1:])
                  for f in j["input"] if f.endswith(".py") and "llmgeom" in Path(f).parts}
        if needed - listed:
            missing[j["rule"]] = sorted(needed - listed)
    assert not missing, f"rules whose code=code(...) misses the package modules their scripts import: {missing}"
