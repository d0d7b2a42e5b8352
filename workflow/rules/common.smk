import os
import re

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")  # before any h5py import in job processes

import yaml

from llmgeom.workflow.config import (
    apply_model_defaults,
    apply_wind_tunnel_defaults,
    check_config,
    check_device,
    check_models,
    check_prompt_sources,
    check_wind_tunnel,
    model_source_params,
    wind_tunnel_cuts,
    wind_tunnel_entries,
)
from llmgeom.workflow.cluster import (
    GPU_GROUP,
    GPU_RULES,
    check_gpu_config,
    check_site_profile,
    float32_mem_mb,
    gpu_job_resources,
    gpu_slot_limits,
    package_files,
    scaled_mem,
    scaled_runtime,
)

with open(workflow.source_path("../schemas/config.schema.yaml")) as _fh:
    _SCHEMA = yaml.safe_load(_fh)
apply_model_defaults(config, _SCHEMA)
check_config(config)
check_gpu_config(config)
check_models(config)  # sources exist, token budgets and layer indices fit each model (no weights read)
check_prompt_sources(config)  # Wikipedia topics, pool sizes and corpus files exist (no prompt built)
apply_wind_tunnel_defaults(config, _SCHEMA)
WT_TASKS = check_wind_tunnel(config)  # wind-tunnel tasks (V, n_pairs, stochastic matrices), models, cut positions
# CUDA devices are looked up only where the jobs run here: the main process of a local run (no --jobs/executor)
check_device(config, here=workflow.is_main_process and workflow.resource_settings.nodes is None)

MODELS = sorted(config["models"])
PROMPT_SETS = sorted(config["prompts"]["sets"])
VM_SETS = config["value_manifold"]["prompt_sets"]
ID_SET = config["intrinsic_dimension"]["prompt_set"]
CORPUS_SETS = [s for s, v in config["prompts"]["sets"].items() if v["kind"] == "corpus"]

# Wind-tunnel model entries (workflow/rules/wind_tunnel.smk): finals and checkpoints <name>-step<k>. They share the
# {model} wildcard (same analyses, same paths) but are not in MODELS: no Wikipedia, SULA or LSM extraction.
WT = wind_tunnel_entries(config)
WT_MODELS = list(WT)
WT_FINALS = [m for m, e in WT.items() if not e["checkpoint"]]
_re = lambda names: "|".join(map(re.escape, names)) or "(?!)"  # no name: a pattern that never matches (not "" = any)
LLM_RE, WT_ALL_RE, WT_FINAL_RE = _re(MODELS), _re(WT_MODELS), _re(WT_FINALS)
WT_CHECKPOINT_RE = _re([m for m in WT_MODELS if m not in WT_FINALS])


wildcard_constraints:
    model=_re(MODELS + WT_MODELS),
    promptset=_re(PROMPT_SETS),


def mcfg(wildcards, key):
    """A key of the model's entry: config["models"][model], or for a wind-tunnel entry its WT record."""
    return (config["models"].get(wildcards.model) or WT[wildcards.model])[key]


# Resources of the GPU rules (GPU_RULES in llmgeom.workflow.cluster), per model entry: `resources: **GPU_RESOURCES`
# (mem_mb and runtime grow x1.5 per retry). Every other rule declares mem_mb=scaled_mem(MB) (x1.5 per retry;
# tests/test_cluster.py checks every rule), a runtime and, if small, group "analysis" or "summary".
# Wind-tunnel entries (train_wind_tunnel, extract_wind_tunnel) take theirs from wind_tunnel.models.<name> (WT).
GPU_MODELS = {**config["models"], **WT}
GPU_RESOURCES = gpu_job_resources(GPU_MODELS)
# GPU rules also declare `group: GPU_GROUP` ("gpu_{model}"): one SLURM submission per model. Each GPU job
# holds its model's slot (gpu_slot_<i>, at most 1 at a time), so the jobs of a submission run one after
# another on the model's GPUs, in one model-server process that loads the weights once (docs/design-notes.md).
for _slot, _n in gpu_slot_limits(GPU_MODELS).items():
    workflow.register_resource(_slot, _n)


onstart:  # profiles/slurm placeholders left unfilled: refused after the DAG, before the first submission
    check_site_profile(workflow)



def model_mem(wildcards):
    """Host memory of the CPU rules that load a whole model, in float32 (scaled_mem(model_mem)): the entry's
    mem_mb, at least the float32 size when it gives params_b (llmgeom.workflow.cluster.float32_mem_mb)."""
    return float32_mem_mb(config["models"].get(wildcards.model) or WT[wildcards.model])


def code(script):
    """Package source files that workflow/scripts/<script>.py runs (the llmgeom modules it imports,
    transitively), as a named input `code=code("value_manifold")`: editing that code reruns the rule
    (README "Rerunning only what changed"); llmgeom.workflow (checks, logging) is not tracked."""
    return package_files(script=workflow.source_path(f"../scripts/{script}.py"))


# Each rule file appends its final targets here; `rule all` (Snakefile) requests them all.
TARGETS = []


def all_targets():
    return TARGETS


# Per-model tables that rule `aggregate` (summary.smk) concatenates over models into
# results/summary/{table}.csv: table -> folder under results/{model}/ and its report family.
SUMMARY_TABLES = {}


def summarize(*tables, family, folder="tables", models=None):
    """Registers per-model tables results/{model}/<folder>/<table>.csv for rule `aggregate` and requests
    their cross-model tables results/summary/<table>.csv (over `models`, default MODELS). Call it before
    summary.smk is included."""
    for t in tables:
        SUMMARY_TABLES[t] = {"folder": folder, "family": family, "models": list(models or MODELS)}
        TARGETS.append(f"results/summary/{t}.csv")


# Where `aggregate` (summary.smk) puts the cross-model tables of each family in the report; others go to "Tables".
SUMMARY_REPORT = {"bayes": {"category": "Bayesian geometry", "subcategory": "Tables"},
                  "wind_tunnel": {"category": "Wind tunnel", "subcategory": "Tables"}}


def summary_report(key):
    """report(category=summary_report("category"), ...) of rule `aggregate`, by the table's family."""
    return lambda w: SUMMARY_REPORT.get(SUMMARY_TABLES[w.table]["family"], {"category": "Tables"}).get(key)
