"""Interrupted runs lose nothing; two runs give identical tables (issue 6, points 5 and 7).

Two independent working directories run the same tiny config (one tiny random Llama, CPU):

* run A: uninterrupted;
* run B: SIGKILL of the whole Snakemake process group while an ``extract`` job is writing its
  ``.h5.partial``, then ``snakemake --unlock`` and a plain rerun (the default profile has
  ``rerun-incomplete``).

Both build every table whose values depend on a seed: prompt sampling (``build_prompts``, SULA
prompts, the entropy-stratified domain selection), bootstraps (value manifold, margins, interventions),
subsamples (intrinsic dimension, curvature), random control axes (interventions) and the random-init
baseline (key orthogonality). Every CSV of B must equal A's exactly, and so must every HDF5 dataset.
The targets are the per-model tables (figures, cross-model concatenations and the report add jobs,
not randomness; the full DAG is covered by tests/workflow/test_workflow.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import yaml

from llmgeom.models import tiny as testing

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
M = "tiny-llama"

pytestmark = [pytest.mark.slow, pytest.mark.minutes(1.5)]

# one table per kind of seeded randomness (each extra job costs ~5-10 s per run on 2 CPU cores)
TARGETS = [f"results/{M}/tables/{t}.csv" for t in
           ("value_manifold",        # bootstrap CIs over prompts
            "intrinsic_dimension",   # random subsamples
            "margins",               # bootstrap CI of beta
            "domain_restriction",    # entropy-stratified prompt selection + bootstrap
            "key_orthogonality")     # Gaussian and random-init baselines
           ] + [f"results/{M}/interventions/sula_interventions.csv"]  # SULA prompts, random control axes


def config(model_dir: Path) -> dict:
    return {
        "models": {M: {"source": "hf_local", "path": str(model_dir), "dtype": "float32", "batch_size": 1}},
        "nulls": {"random_init": False},  # reproducibility of the model's own tables (the twins: test_workflow.py)
        "prompts": {"seed": 0, "token_budget": 160, "sets": {  # characters of the tiny tokenizer
            "mixed": {"kind": "mixed", "n": 60},  # batch_size 1: the extraction lasts long enough to be killed
            "domain_mathematics": {"kind": "domain", "topics": ["Mathematics"], "n": 12},
            "corpus": {"kind": "corpus", "n": 8, "token_budget": 240}}},
        "extract": {"sample_per_prompt": 20, "threads": 1},
        "value_manifold": {"prompt_sets": ["mixed", "domain_mathematics"], "n_boot": 5},
        "intrinsic_dimension": {"n_subsamples": 2, "subsample_size": 100, "min_points": 20,
                                "estimators": ["twonn", "mle"]},
        "margins": {"n_boot": 20},
        "domain_restriction": {"per_quantile": 3, "n_boot": 5},
        "sula": {"label_prefix": "", "label_pairs": [["X", "Y"], ["P", "Q"]], "ks": [0, 1, 2], "n_per_k": 4,
                 "conditions": ["main"]},
        "interventions": {"layers": ["last"], "n_per_k": 3, "n_boot": 5},
    }


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def _cmd(wd: Path, *args):
    return SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "-d", str(wd), "--configfile", str(wd / "config.yaml"),
                        "--cores", "2", *args]


def run(wd: Path, *args):
    r = subprocess.run(_cmd(wd, *args), capture_output=True, text=True, env=_env(), cwd=wd)
    if r.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return r


def _setup(wd: Path, model_dir: Path):
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "config.yaml").write_text(yaml.safe_dump(config(model_dir)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("repro")
    model_dir = testing.save_tiny_model_dir("llama", base / "src" / M)
    a, b = base / "run_a", base / "run_b"
    _setup(a, model_dir)
    _setup(b, model_dir)
    t0 = time.time()
    run(a, *TARGETS)
    t_a = time.time() - t0

    # run B: kill the whole process group (Snakemake and its job processes) during an extraction
    log = open(base / "run_b_killed.log", "wb")  # a file, not a pipe: a full pipe would stall Snakemake
    proc = subprocess.Popen(_cmd(b, *TARGETS), stdout=log, stderr=subprocess.STDOUT, env=_env(),
                            cwd=b, start_new_session=True)
    acts = b / "results" / M / "activations"
    killed_during, deadline = None, time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        partial = sorted(acts.glob("*.h5.partial")) if acts.is_dir() else []
        if partial:
            os.killpg(proc.pid, signal.SIGKILL)
            killed_during = partial[0]
            break
        time.sleep(0.01)
    proc.wait(timeout=60)
    log.close()
    out = (base / "run_b_killed.log").read_text(errors="replace")
    state = {"killed_during": killed_during, "returncode": proc.returncode, "output": out,
             "final_after_kill": sorted(p.name for p in acts.glob("*.h5")) if acts.is_dir() else [],
             "partials_after_kill": sorted(p.name for p in acts.glob("*.partial")) if acts.is_dir() else []}
    time.sleep(0.5)  # let the killed processes disappear
    run(b, "--unlock")
    t0 = time.time()
    state["rerun"] = run(b, *TARGETS)
    state["times"] = (t_a, time.time() - t0)
    return a, b, state


_DRY: dict = {}


def _dry_run_stats(runs) -> set[str]:
    """Rules that `snakemake -n results/provenance.json` schedules in run B (once per module)."""
    if "stats" not in _DRY:
        _, b, _ = runs
        r = run(b, "-n", "results/provenance.json")
        block = (r.stdout + r.stderr).split("Job stats:")[1].split("total")[0]
        _DRY["stats"] = {ln.split()[0] for ln in block.splitlines() if len(ln.split()) == 2
                         and ln.split()[1].isdigit()}
    return _DRY["stats"]


def _tables(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted((root / "results").rglob("*.csv"))}


def test_killed_extraction_left_only_a_partial(runs):
    _, _, st = runs
    assert st["killed_during"] is not None, "no extraction was caught running; output:\n" + st["output"][-3000:]
    assert st["returncode"] == -signal.SIGKILL
    victim = st["killed_during"].name[: -len(".partial")]
    assert victim not in st["final_after_kill"]  # nothing trusted under the final name
    assert st["killed_during"].name in st["partials_after_kill"]


def test_rerun_completes_and_leaves_no_partials(runs):
    _, b, st = runs
    for t in TARGETS:
        assert (b / t).is_file(), t
    assert not list(b.rglob("*.partial"))
    victim = b / "results" / M / "activations" / st["killed_during"].name[: -len(".partial")]
    with h5py.File(victim, "r") as f:
        assert bool(f.attrs["complete"])
    # nothing of the requested targets left to do afterwards
    stats = _dry_run_stats(runs)
    for rule in ("prepare_model", "build_prompts", "extract", "build_sula", "extract_sula", "value_manifold",
                 "intrinsic_dimension", "margins", "domain_restriction", "key_orthogonality", "intervene",
                 "sula_interventions"):
        assert rule not in stats, (rule, stats)


def test_interrupted_run_tables_equal_uninterrupted(runs):
    a, b, _ = runs
    ta, tb = _tables(a), _tables(b)
    assert set(ta) == set(tb) and len(ta) >= len(TARGETS)
    for name in ta:
        pd.testing.assert_frame_equal(pd.read_csv(ta[name]), pd.read_csv(tb[name]), check_exact=True,
                                      obj=name)


def test_two_runs_identical_activations_and_prompts(runs):
    """Prompt files are byte-identical and every HDF5 dataset is identical (extraction and prompt
    sampling are deterministic), so the tables above agree for the right reason."""
    a, b, _ = runs
    pa = sorted(p.relative_to(a) for p in (a / "resources" / "prompts").rglob("*.jsonl"))
    assert pa and pa == sorted(p.relative_to(b) for p in (b / "resources" / "prompts").rglob("*.jsonl"))
    for rel in pa:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    ha = sorted(p.relative_to(a) for p in (a / "results").rglob("*.h5"))
    assert ha == sorted(p.relative_to(b) for p in (b / "results").rglob("*.h5"))
    for rel in ha:
        with h5py.File(a / rel, "r") as fa, h5py.File(b / rel, "r") as fb:
            names = []
            fa.visit(lambda n: names.append(n) if isinstance(fa[n], h5py.Dataset) else None)
            for n in names:
                x, y = fa[n][()], fb[n][()]
                assert np.array_equal(x, y), f"{rel}:{n}"
            assert fa.attrs["prompt_set_sha256"] == fb.attrs["prompt_set_sha256"]


def test_seeded_tables_are_not_trivially_equal(runs):
    """The compared tables do contain seeded random quantities (bootstrap CIs, subsample spreads,
    random-init baselines), so equality above is a real check."""
    a, _, _ = runs
    vm = pd.read_csv(a / f"results/{M}/tables/value_manifold.csv")
    assert (vm.pc1_hi > vm.pc1_lo).any()
    ko = pd.read_csv(a / f"results/{M}/tables/key_orthogonality.csv")
    assert ko.baseline_random_init.notna().all()
    idt = pd.read_csv(a / f"results/{M}/tables/intrinsic_dimension.csv")
    assert (idt.id_std > 0).any()


def test_provenance_records_versions_revisions_and_hashes(runs):
    """What the ``provenance`` rule writes (results/provenance.json / .md, in the report), collected
    on run A; equal between the runs apart from the time stamp."""
    from llmgeom.pipeline import provenance

    a, b, _ = runs
    recs = []
    for wd in (a, b):
        cfg = yaml.safe_load((wd / "config.yaml").read_text())
        rec = provenance.collect(cfg, models=[M], prompt_sets=sorted(cfg["prompts"]["sets"]), root=wd,
                                 workflow_dir=REPO)
        recs.append(rec)
    rec = recs[0]
    for pkg in ("torch", "transformers", "numpy", "h5py", "llmgeom", "snakemake", "python"):
        assert rec["packages"][pkg], pkg
    m = rec["models"][M]
    assert m["source"] == "hf_local" and m["source_sha256"] and m["model_type"] == "llama"
    assert set(m["extractions"]) >= {"mixed", "corpus", "sula_main"}
    assert m["extractions"]["mixed"]["versions"]["torch"]
    assert len(rec["config_sha256"]) == 64
    assert set(rec["prompt_sets"]) >= {"mixed", "corpus", "domain_mathematics", f"sula/{M}/main"}
    assert not rec["mismatches"]
    strip = [{k: v for k, v in r.items() if k != "created"} for r in recs]
    for r in strip:  # paths differ between the two working directories
        for e in r["prompt_sets"].values():
            e.pop("path")
    assert json.dumps(strip[0], sort_keys=True, default=str) == json.dumps(strip[1], sort_keys=True, default=str)
    md = provenance.to_markdown(rec)
    assert rec["config_sha256"] in md and rec["prompt_sets"]["mixed"]["sha256"] in md


def test_provenance_rule_runs_last_and_is_in_the_report(runs):
    """The provenance rule is part of the default target, takes every other final output as input
    (so it is written last) and registers its files in the report."""
    stats = _dry_run_stats(runs)
    assert "provenance" in stats and "figure_value_manifold" in stats and {"aggregate_value_manifold", "aggregate_lsm", "claims"} <= set(stats)
    smk = (REPO / "workflow/rules/provenance.smk").read_text()
    assert 'report("results/provenance.json"' in smk and 'report("results/provenance.md"' in smk
    assert 'include: "workflow/rules/provenance.smk"' in (REPO / "Snakefile").read_text()
