import os
import re
import sys

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")  # before any h5py import in job processes

from pathlib import Path

from snakemake.utils import validate

from llmgeom.core.claims_data import claims_file

from llmgeom.prompts.io import CANDIDATES_KEY  # meta key of candidate tokens (SULA labels, wind-tunnel answers)

from llmgeom.pipeline.schema import SCHEMA_PATH, apply_defaults, read_schema, section_config, validate_config
from llmgeom.pipeline.checks import check_config, dry_run_requested
from llmgeom.pipeline.derived import (
    model_source_params,
    null_entries,
    null_of_models,
    prompt_set_params,
    reference_tokenizer,
    wind_tunnel_cuts,
    wind_tunnel_entries,
)
from llmgeom.pipeline.code_tracking import package_files  # standard library only
from llmgeom.pipeline.model_server import write_plan  # standard library only (fast DAG)
from llmgeom.pipeline.cluster import (
    SERVER_RULES,
    check_site_profile,
    declare_gpu_rules,
    float32_mem_mb,
    gpu_job_resources,
    gpu_rule_threads,
    gpu_slot_limits,
    gpu_slots,
    scaled_mem,
    scaled_runtime,
)

# The config, loaded and checked once (llmgeom.pipeline.schema and .checks; tests/unit/pipeline/test_config_errors.py runs the
# same calls):
# every schema problem at once in plain words, the schema's defaults (also inside models.<name> and
# wind_tunnel.models.<name>), Snakemake's validate, then every cross-key, model, prompt-data, wind-tunnel and
# device check. CUDA devices are looked up only where the jobs run here: the main process of a local run.
SCHEMA = read_schema(SCHEMA_PATH)  # src/llmgeom/pipeline/config.schema.yaml, found one way (llmgeom.pipeline.schema)
validate_config(config, SCHEMA)
apply_defaults(config, SCHEMA)
validate(config, str(SCHEMA_PATH))
WT_TASKS = check_config(config, here=workflow.is_main_process and workflow.resource_settings.nodes is None,
                        dry_run=dry_run_requested(sys.argv, workflow.dryrun))  # prepares nothing: uncached Hub ids ok

MODELS = sorted(config["models"])

# Null models (llmgeom.pipeline.derived.null_entries): each model's random-init twin <model>-randinit
# (an entry of config["models"] like any other, with the trained model's resources; kept out of MODELS) and each
# wind-tunnel model's step-0 checkpoint <model>-step0 (a checkpoint entry of WT below). They run only the prompt
# sets and analyses that the claims read (NULL_TABLES below); the scorecard sets every verdict beside its null's.
NULLS = null_entries(config)
NULL_OF = null_of_models(config)  # trained model (and wind-tunnel checkpoint) -> its null model
LLM_NULLS = [n for n, e in NULLS.items() if e["kind"] == "random_init"]
for _n in LLM_NULLS:
    config["models"][_n] = dict(config["models"][NULLS[_n]["null_of"]], source="random_init",
                                base=NULLS[_n]["null_of"], seed=NULLS[_n]["seed"])


def section_cfg(section, function=None):
    """params.cfg of a rule: its config section less the keys the rules read themselves; with function
    ("module:function"), only the keys it takes (a section that two rules read). The job script calls its
    function with it (llmgeom.pipeline.schema.call_with_config): the schema is the only source of a default."""
    return section_config(config, section, SCHEMA, function)


def is_null(wildcards):
    """The {model} of a job is a null model (a random-init twin or a step-0 checkpoint)."""
    return wildcards.model in NULLS


def sula_prompts(wildcards, condition=None):
    """The SULA prompt file of {model} and {condition} (or ``condition``): a random-init twin reads its trained
    model's (the same tokenizer, so the same prompts, batches and candidate labels by construction; no build_sula
    job of its own)."""
    m = wildcards.model
    owner = NULLS[m]["null_of"] if m in LLM_NULLS else m
    return f"resources/prompts/sula/{owner}/{condition or wildcards.condition}.jsonl"


PROMPT_SETS = sorted(config["prompts"]["sets"])
VM_SETS = config["value_manifold"]["prompt_sets"]
ID_SET = config["intrinsic_dimension"]["prompt_set"]

# Wind-tunnel model entries (workflow/rules/wind_tunnel.smk): finals and checkpoints <name>-step<k>. They share the
# {model} wildcard (same analyses, same paths) but are not in MODELS: no Wikipedia, SULA or LSM extraction.
WT = wind_tunnel_entries(config)
WT_MODELS = list(WT)
WT_FINALS = [m for m, e in WT.items() if not e["checkpoint"]]
_re = lambda names: "|".join(map(re.escape, names)) or "(?!)"  # no name: a pattern that never matches (not "" = any)
LLM_RE, WT_ALL_RE, WT_FINAL_RE = _re(MODELS + LLM_NULLS), _re(WT_MODELS), _re(WT_FINALS)
WT_CHECKPOINT_RE = _re([m for m in WT_MODELS if m not in WT_FINALS])


wildcard_constraints:
    model=_re(MODELS + LLM_NULLS + WT_MODELS),
    promptset=_re(PROMPT_SETS),


def mcfg(wildcards, key):
    """A key of the model's entry: config["models"][model], or for a wind-tunnel entry its WT record."""
    return (config["models"].get(wildcards.model) or WT[wildcards.model])[key]


# Named param functions of the rules (one per computed param; the snakemake-workflows convention).
def get_dtype(wildcards):
    """params.dtype of the GPU rules: the model entry's dtype."""
    return mcfg(wildcards, "dtype")


def get_batch_size(wildcards):
    """params.batch_size of extract / extract_wind_tunnel: the model entry's batch_size."""
    return mcfg(wildcards, "batch_size")


def get_device_map(wildcards):
    """params.device_map of the GPU rules: the model entry's device_map."""
    return mcfg(wildcards, "device_map")


def get_sula_batch_size(wildcards):
    """params.batch_size of extract_sula: sula.batch_size, or the model's batch_size when it is null."""
    return config["sula"]["batch_size"] or mcfg(wildcards, "batch_size")


def get_source_params(wildcards):
    """params.spec of prepare_model: only the keys that determine the prepared model (a random-init twin:
    source random_init, base and seed)."""
    spec = config["models"][wildcards.model]
    if wildcards.model in NULLS:
        return {"source": "random_init", "base": spec["base"], "seed": spec["seed"]}
    return model_source_params(spec)


def get_prepare_inputs(wildcards):
    """Inputs of prepare_model: a random-init twin reads its trained model's prepared directory."""
    return {"base": f"resources/models/{NULLS[wildcards.model]['null_of']}"} if wildcards.model in NULLS else {}


def get_prompt_spec(wildcards):
    """params.spec of build_prompts: the prompt set's entry of prompts.sets."""
    return config["prompts"]["sets"][wildcards.promptset]


def get_is_corpus(wildcards):
    """params.corpus of extract: the prompt set is of kind corpus (per-token data, no attention)."""
    return config["prompts"]["sets"][wildcards.promptset]["kind"] == "corpus"


def get_attention(wildcards):
    """params.attention of extract: attention data for every set that is not a corpus set."""
    return not get_is_corpus(wildcards)


def get_token_budget(wildcards):
    """params.token_budget of build_prompts and max_tokens of extract: the set's token_budget, else
    prompts.token_budget (llmgeom.pipeline.derived.prompt_set_params)."""
    return prompt_set_params(config)[wildcards.promptset]["token_budget"]


def get_reference_tokenizer(wildcards):
    """input.tokenizer of build_prompts: the reference tokenizer's one file (prompts.tokenizer,
    llmgeom.pipeline.derived.reference_tokenizer): resources/tokenizers/<model>/tokenizer.json for a model, so
    that only a change of the tokenizer (not of the model's weights or settings) rebuilds the prompt sets."""
    return reference_tokenizer(config)["path"]


def get_reference_tokenizer_name(wildcards):
    """params.tokenizer of build_prompts: the name the prompts' meta records (the model, or the path given)."""
    return reference_tokenizer(config)["name"]


def get_set_seed(wildcards):
    """params.seed of build_prompts and extract: the set's seed, else prompts.seed."""
    return prompt_set_params(config)[wildcards.promptset]["seed"]


# Null models: what a random-init twin runs of the rules the claims read (DR: domain_restriction.smk,
# SULA_CONDITIONS: sula.smk, IV: interventions.smk; looked up when the DAG is built, after every include).
def get_dr_sets(wildcards):
    """Prompt sets of domain_restriction: the mixed set and every restricted set; a null model only the two
    that Table 1 / Table 2 and the claims read (the mixed set and the summary set)."""
    return [DR["mixed"], DR["summary"]] if is_null(wildcards) else DR_SETS


def get_dr_n_boot(wildcards):
    """n_boot of domain_restriction: nulls.n_boot for a null model (its interval is not read)."""
    return config["nulls"]["n_boot"] if is_null(wildcards) else config["domain_restriction"]["n_boot"]


def get_sula_conditions(wildcards):
    """SULA conditions of the sula rule, all of them; a null model only main, what the claims and interventions read."""
    return ["main"] if is_null(wildcards) else SULA_CONDITIONS




def get_iv_edits(wildcards):
    """edits of intervene: all configured; a null model only axis_cut (the only edit a claim reads)."""
    return [e for e in IV["edits"] if e == "axis_cut"] if is_null(wildcards) else IV["edits"]


def get_iv_n_boot(wildcards):
    """n_boot of sula_interventions: nulls.n_boot for a null model (its intervals are not read)."""
    return config["nulls"]["n_boot"] if is_null(wildcards) else IV["n_boot"]




def get_wt_model(wildcards):
    """The wind_tunnel.models entry of {model} (train_wind_tunnel's params)."""
    return config["wind_tunnel"]["models"][wildcards.model]


def get_wt_task(wildcards):
    """params.task of train_wind_tunnel: the checked task spec of the model's task."""
    return WT_TASKS[get_wt_model(wildcards)["task"]]


def get_task_spec(wildcards):
    """params.task of build_wind_tunnel_prompts: the checked spec of {task}."""
    return WT_TASKS[wildcards.task]


def get_wt_arch(wildcards):
    """params.arch of train_wind_tunnel."""
    return get_wt_model(wildcards)["arch"]


def get_wt_training(wildcards):
    """params.training of train_wind_tunnel."""
    return get_wt_model(wildcards)["training"]


def get_wt_checkpoints(wildcards):
    """params.checkpoints of train_wind_tunnel: the saved steps, sorted (with 0, the null model, when
    nulls.random_init is true)."""
    return sorted(e["step"] for e in WT.values() if e["checkpoint"] and e["base"] == wildcards.model)


def get_wt_threads(wildcards):
    """threads of train_wind_tunnel: wind_tunnel.models.<name>.threads."""
    return get_wt_model(wildcards)["threads"]


def get_wt_cuts(wildcards):
    """params.cut_positions of build_wind_tunnel_prompts: the answer positions of {task}."""
    return wind_tunnel_cuts(config, wildcards.task)


def get_wt_base(wildcards):
    """The final wind-tunnel model of an entry (itself, or the model a checkpoint entry belongs to)."""
    return WT[wildcards.model]["base"]


def get_wt_step(wildcards):
    """The training step of a wind-tunnel entry (the final model: training.steps)."""
    return WT[wildcards.model]["step"]


# threads of the GPU rules except train_wind_tunnel (wind_tunnel.models.<name>.threads: bit-identical per thread
# count): extract.threads on a cluster; in a local run (no --jobs / executor: Snakemake's own `nodes` is unset) at
# most half of --cores, so a GPU job leaves a core to the other model's GPU jobs or an analysis.
LOCAL_CORES = workflow.resource_settings.cores if workflow.resource_settings.nodes is None else None
GPU_THREADS = gpu_rule_threads(config["extract"]["threads"], LOCAL_CORES)

# Resources of the GPU rules (declared in llmgeom.pipeline.cluster.GPU), per model entry: `resources: **GPU_RESOURCES`
# (mem_mb and runtime grow x1.5 per retry). Every other rule declares mem_mb=scaled_mem(MB) (x1.5 per retry;
# tests/cluster/test_cluster.py checks every rule), a runtime and, if small, group "analysis" or "summary".
# Wind-tunnel entries (train_wind_tunnel, extract_wind_tunnel) take theirs from wind_tunnel.models.<name> (WT).
GPU_MODELS = {**config["models"], **WT}
GPU_SLOTS = gpu_slots(GPU_MODELS, LOCAL_CORES)
GPU_RESOURCES = gpu_job_resources(GPU_MODELS, GPU_SLOTS)
# The GPU jobs of a model form one SLURM submission (group cluster.GPU_GROUP) and each holds a GPU slot (limit 1):
# they run one after another in one model server that loads the weights once (docs/design-notes.md "GPU economy").
# A cluster has one slot, scoped "local" where jobs are submitted (models' submissions run side by side) and
# "global" inside an allocation; a local run counts every resource whatever its scope, so it has one per model.
for _slot, _n in gpu_slot_limits(GPU_SLOTS).items():
    workflow.register_resource(_slot, _n)


resource_scopes:
    **{_slot: "global" if workflow.remote_exec else "local" for _slot in gpu_slot_limits(GPU_SLOTS)},


# `priority:` of the CPU rules (higher first; Snakemake's scheduler picks the ready jobs with the highest sum; others
# 0): the longest chains first. Model preparation and prompts head every chain; the GPU rules' own
# priorities (corpus extraction first, then the SULA conditions and the interventions, the wind-tunnel training
# before the analyses) are declared with them in llmgeom.pipeline.cluster.GPU and set by declare_gpu_rules at the
# end of the Snakefile; the analyses fill the remaining gaps (the longest ones first).
PRIORITY = {"prepare_model": 100, "prepare_tokenizer": 100, "build_prompts": 90, "build_sula": 90, "build_wind_tunnel_prompts": 90,
            "wind_tunnel_checkpoint": 40,
            "value_manifold": 20, "domain_restriction": 20, "intrinsic_dimension": 20, "fisher": 20,
            "curvature": 15}


onstart:  # profiles/slurm placeholders left unfilled: refused after the DAG, before the first submission
    check_site_profile(workflow)
    if workflow.local_exec:  # the model-server jobs this run will run: a model's server exits after its last one
        write_plan((j.input.model, j.log[0], list(j.output)) for j in workflow.dag.needrun_jobs()
                   if j.rule.name in SERVER_RULES)



def model_mem(wildcards):
    """Host memory of the CPU rules that load a whole model, in float32 (scaled_mem(model_mem)): the entry's
    mem_mb, at least the float32 size when it gives params_b (llmgeom.pipeline.cluster.float32_mem_mb)."""
    return float32_mem_mb(config["models"].get(wildcards.model) or WT[wildcards.model])


def code(script):
    """Package source files that workflow/scripts/<script>.py runs (the llmgeom modules it imports,
    transitively), as a named input `code=code("value_manifold")`: editing that code reruns the rule
    (README "Rerunning only what changed"); llmgeom.pipeline (checks, logging) is not tracked."""
    return package_files(script=workflow.source_path(f"../scripts/{script}.py"))


# Each rule file appends its final targets here; `rule all` (Snakefile) requests them all.
TARGETS = []


def all_targets():
    return TARGETS


# Per-model tables that the rules `aggregate_<family>` (summary.smk) concatenates over models into
# results/summary/{table}.csv: table -> folder under results/{model}/ and its report family.
SUMMARY_TABLES = {}


def summarize(*tables, family, folder="tables", models=None, nulls=False):
    """Registers per-model tables results/{model}/<folder>/<table>.csv for rule `aggregate_<family>` and requests
    their cross-model tables results/summary/<table>.csv (over `models`, default MODELS). ``nulls=True``: a table
    the claims read; the null model of each of `models` (NULL_OF) runs it too and has rows of its own. Call it
    before summary.smk is included."""
    models = list(models or MODELS)
    if nulls:
        models += [n for n in dict.fromkeys(NULL_OF.get(m) for m in models) if n and n not in models]
    for t in tables:
        SUMMARY_TABLES[t] = {"folder": folder, "family": family, "models": models}
        TARGETS.append(f"results/summary/{t}.csv")


# Where `aggregate_<family>` (summary.smk) puts the cross-model tables of each family in the report; others go to "Tables".
SUMMARY_REPORT = {"bayes": {"category": "Bayesian geometry", "subcategory": "Tables"},
                  "wind_tunnel": {"category": "Wind tunnel", "subcategory": "Tables"}}


def summary_report(family, key):
    """report(category=summary_report(family, "category"), ...) of rule `aggregate_<family>`."""
    return SUMMARY_REPORT.get(family, {"category": "Tables"}).get(key)


# --- claims scorecard (rule claims, summary.smk) ---
def claims_data_input():
    """llmgeom/data/claims.yaml, relative to the working directory when the package lies below it."""
    p = claims_file().resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def produced_tables(names):
    """The cross-model tables among ``names`` that this run produces (results/summary/<table>.csv among the
    targets), as an input function's {name: path}."""
    made = set(TARGETS)
    return {t: f"results/summary/{t}.csv" for t in names if f"results/summary/{t}.csv" in made}


def claim_tables(wildcards):
    """(CLAIM_TABLES: summary.smk) The claims' tables that this run produces."""
    return produced_tables(CLAIM_TABLES)


def scaling_tables(wildcards):
    """(SCALING_TABLES: summary.smk) The cross-model tables that scaling.csv reads and this run produces (a missing
    one: NaN rows in scaling.csv, with why)."""
    return produced_tables(SCALING_TABLES)
