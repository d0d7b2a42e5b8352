"""Cluster-scale helpers for the Snakemake rules: GPU-rule resources per model, memory that grows
with the retry attempt, and tracking of the package code a rule runs.

* ``GPU`` is the one declaration of the rules that need a GPU (their group, priority and model-server task;
  ``GPU_RULES`` / ``SERVER_RULES`` are its names); ``declare_gpu_rules`` applies it to the parsed workflow. The
  SLURM profile, the model server, docs/cluster.md and ``tests/cluster/test_cluster.py`` refer to it. Every other rule is
  CPU-only.
* ``gpu_job_resources(models)`` returns the ``resources:`` of a GPU rule, per model entry:
  ``gpu`` (``gpus``), ``gpu_model`` (omitted when null), ``mem_mb`` and ``runtime`` (both x1.5 per retry) and
  the model's GPU slot (``gpu_slots``: one on a cluster, one per model locally). A GPU rule writes ``resources: **GPU_RESOURCES``
  (defined in ``workflow/rules/common.smk``); its group (one SLURM submission per model) and priority
  come from ``GPU``.
* ``gpu_rule_threads(threads, local_cores)``: their ``threads``: as configured on a cluster, at most half the
  cores in a local run.
* ``apply_size_defaults(config)``: a model entry that gives ``params_b`` (parameters, billions) but not
  ``mem_mb`` / ``runtime`` gets them derived from its size and dtype (see ``size_resources``).
* The code a rule runs is tracked by ``llmgeom.pipeline.code_tracking`` (the package's import graph).
* ``check_site_profile(workflow)`` (the workflow's ``onstart``): a SLURM run is refused before the first
  submission when the profile still holds a placeholder, or a GPU job is too short for the profile's warning
  signal (``early_warnings``).

Source: DESIGN.md section 1 (model sweeps; params as rule ``params:``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

#: Snakemake group of every GPU rule: all GPU jobs of one model form one group job, i.e. one SLURM
#: submission (``group-components`` in profiles/slurm spans their unconnected parts).
GPU_GROUP = "gpu_{model}"


@dataclass(frozen=True)
class GpuRule:
    """What the workflow needs to know of one GPU rule (declared once, in :data:`GPU`).

    Attributes:
        priority: its Snakemake ``priority`` (higher first; the CPU rules' are ``PRIORITY`` in common.smk).
        server_task: the model-server task its script hands to ``model_server.run_task`` (a key of
            ``model_server.TASKS``), or None when the job runs in its own process.
        corpus_priority: the priority of its jobs on corpus prompt sets, when they differ (``extract``: corpus
            sets first, the longest analyses follow them).
    """

    priority: int
    server_task: str | None
    corpus_priority: int | None = None

    group = GPU_GROUP  # every GPU rule: one SLURM submission per model


#: The one declaration of the GPU rules: which rules, their group (:data:`GPU_GROUP`), whether the model server
#: runs them, their priority. ``declare_gpu_rules`` (end of the Snakefile) sets each rule's ``group`` and
#: ``priority`` from it and refuses a rule that asks for a GPU without being declared here (or the reverse); the
#: SLURM profile, the model server (``SERVER_RULES``), docs/cluster.md and the tests read it.
GPU = {
    "extract": GpuRule(priority=60, server_task="extract", corpus_priority=65),
    "extract_sula": GpuRule(priority=55, server_task="extract"),
    "intervene": GpuRule(priority=50, server_task="intervene"),
    # W_K of the weights the server holds: no second load of the whole model (a 7B model in float32) on a CPU node
    "key_orthogonality": GpuRule(priority=45, server_task="key_orthogonality"),
    "train_wind_tunnel": GpuRule(priority=40, server_task=None),  # one thread, minutes: before the analyses
    "extract_wind_tunnel": GpuRule(priority=35, server_task="extract"),
}
GPU_RULES = tuple(GPU)  # the names, in declaration order
SERVER_RULES = tuple(name for name, rule in GPU.items() if rule.server_task)  # jobs a run's server plan lists


def declare_gpu_rules(workflow, is_corpus) -> None:
    """Apply :data:`GPU` to the parsed workflow: each declared rule gets ``group`` :data:`GPU_GROUP` and its
    ``priority`` (``corpus_priority`` for jobs whose ``is_corpus(wildcards)`` is true). Called once, after every
    rule file is included.

    Raises:
        WorkflowError: a declared rule is not defined or does not take ``resources: **GPU_RESOURCES``, or an
            undeclared rule asks for a GPU (``gpu`` resource); the message names the rule and the fix.
    """
    defined = {rule.name: rule for rule in workflow.rules}
    missing = [name for name in GPU if name not in defined]
    undeclared = sorted(name for name, rule in defined.items()
                        if name not in GPU and "gpu" in (rule.resources or {}))
    no_gpu = [name for name in GPU if name in defined and "gpu" not in (defined[name].resources or {})]
    if missing or undeclared or no_gpu:
        raise _workflow_error(
            "the GPU rules and llmgeom.pipeline.cluster.GPU disagree: "
            + "; ".join(filter(None, [
                missing and f"declared but not defined: {', '.join(missing)}",
                undeclared and f"ask for a GPU but are not declared: {', '.join(undeclared)} (add them to GPU)",
                no_gpu and f"declared but without `resources: **GPU_RESOURCES`: {', '.join(no_gpu)}"])))
    for name, decl in GPU.items():
        rule = defined[name]
        rule.group = decl.group
        if decl.corpus_priority is None:
            rule.priority = decl.priority
        else:
            rule.priority = functools.partial(_split_priority, decl=decl, is_corpus=is_corpus)


def _split_priority(wildcards, *, decl: GpuRule, is_corpus) -> int:
    return decl.corpus_priority if is_corpus(wildcards) else decl.priority


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}  # auto: float32 on CPU (worst case)



# --------------------------------------------------------------------------- resources


def size_resources(params_b: float, dtype: str | None) -> dict:
    """Host memory (MB) and runtime (minutes) of one GPU-rule job for a model of ``params_b`` billion
    parameters: mem_mb = 4000 + 1.25 x weight bytes (weights pass through host memory while loading,
    plus tokenizer, prompts and HDF5 buffers); runtime = 20 + 30 min per billion parameters (one prompt
    set of a few hundred prompts; generous: a wall-clock limit, not an estimate)."""
    weight_mb = params_b * 1e9 * DTYPE_BYTES.get(dtype, 4) / 2**20
    return {"mem_mb": int(math.ceil((4000 + 1.25 * weight_mb) / 100.0) * 100),
            "runtime": int(math.ceil(20 + 30 * params_b))}


def apply_size_defaults(config: dict) -> dict:
    """For model entries with ``params_b`` and no explicit ``mem_mb`` / ``runtime``: derive them from
    the size (``size_resources``; a model without ``dtype`` is sized as float32, the worst case of the schema's
    ``auto``). Run before the schema defaults are filled in. Mutates ``config``."""
    for spec in (config.get("models") or {}).values():  # before validation: a config without models is refused there
        if spec.get("params_b"):
            for key, value in size_resources(float(spec["params_b"]), spec.get("dtype")).items():
                spec.setdefault(key, value)
    return config


def float32_mem_mb(spec: dict) -> int:
    """Host memory (MB) of the CPU rules that load a whole model in float32 (``common.smk``'s ``model_mem``):
    ``fisher`` (reads the unembedding that way), ``prepare_model`` (dequantizes GGUF to float32) and
    ``key_orthogonality`` (its random-initialization baseline is built in float32). Grown per retry by
    ``scaled_mem(model_mem)``.

    The entry's ``mem_mb``, raised to the float32 size ``size_resources(params_b, "float32")`` when the
    entry gives ``params_b`` (a bfloat16 entry sized from ``params_b`` holds half the float32 weights).
    Without ``params_b`` the declared ``mem_mb`` is used as given; the memory check before loading
    (``llmgeom.models.loading.check_memory``) names both numbers when it is too small.
    """
    base = int(spec["mem_mb"])
    if spec.get("params_b"):
        base = max(base, size_resources(float(spec["params_b"]), "float32")["mem_mb"])
    return base


def retry_mem_mb(mem_mb: int, attempt: int = 1, factor: float = 0.5) -> int:
    """Memory (MB; or any resource) grown by ``factor`` x the base for every retry (attempt 1 = the base):
    4000 -> 4000, 6000, 8000 on attempts 1, 2, 3 at the default factor 0.5."""
    return int(mem_mb * (1 + factor * (attempt - 1)))


def _scaled(base, factor: float, round_up: bool = False):
    def fn(wildcards, attempt):
        b = base(wildcards) if callable(base) else base
        if round_up:  # whole minutes, at least 1.5x: a 1-minute job's retry asks 2
            return int(math.ceil(b * (1 + factor * (attempt - 1))))
        return retry_mem_mb(b, attempt, factor)

    return fn


def scaled_mem(mem_mb, factor: float = 0.5):
    """``resources: mem_mb=scaled_mem(4000)`` in a rule: 4000, 6000, 8000 MB on attempts 1, 2, 3
    (``retries:`` in the SLURM profile), so a job killed for memory is resubmitted with more.
    ``mem_mb`` is a number of MB or a function of the wildcards (e.g. the model entry's ``mem_mb``).
    Every rule's mem_mb grows this way; ``tests/cluster/test_cluster.py`` checks it for every rule."""
    return _scaled(mem_mb, factor)


def scaled_runtime(minutes, factor: float = 0.5):
    """``resources: runtime=scaled_runtime(30)``: the wall-clock limit (minutes), grown like
    :func:`scaled_mem` on each retry (a job killed at its time limit is resubmitted with more), rounded up
    to whole minutes (SLURM's granularity): 30 -> 30, 45, 60 and 1 -> 1, 2, 2 on attempts 1, 2, 3."""
    return _scaled(minutes, factor, round_up=True)


def gpu_job_resources(models: dict, slots: dict | None = None) -> dict:
    """``resources:`` of a GPU rule whose jobs have a ``{model}`` wildcard, read from the model entry:
    gpu = ``gpus`` (more than 1 only with ``device_map: auto``), gpu_model (omitted when null; the SLURM
    plugin turns it into ``--gpus=<model>:<n>``), mem_mb (host memory) and runtime (minutes), both x1.5
    per retry, and the job's GPU slot (``slots``: model -> slot resource, from :func:`gpu_slots`; default one
    slot for all, as on a cluster).

    A resource that is the same for every model is a plain value, not a function of the wildcards: Snakemake
    inspects the signature of every callable resource of every job while it builds the DAG, so the no-op dry
    run of a large sweep grows with their number. With one slot (a cluster) the slot is the
    plain value 1; with several (a local run) each slot is a function that gives 1 to the jobs of its models
    and None (omitted) to the others.

    >>> res = gpu_job_resources({m: {"gpus": 1, "mem_mb": 4000, "runtime": 30} for m in "ab"})
    >>> res["gpu"], res["gpu_slot_0"], "gpu_model" in res
    (1, 1, False)
    """
    slots = gpu_slots(models, None) if slots is None else slots
    gpus = {int(spec["gpus"]) for spec in models.values()}
    kinds = {spec.get("gpu_model") for spec in models.values()}
    mems = {spec["mem_mb"] for spec in models.values()}
    times = {int(spec["runtime"]) for spec in models.values()}
    res = {
        "gpu": gpus.pop() if len(gpus) == 1 else (lambda w: int(models[w.model]["gpus"])),
        "mem_mb": scaled_mem(mems.pop() if len(mems) == 1 else (lambda w: models[w.model]["mem_mb"])),
        "runtime": scaled_runtime(times.pop() if len(times) == 1 else (lambda w: int(models[w.model]["runtime"]))),
    }
    if len(kinds) > 1:
        res["gpu_model"] = lambda w: models[w.model].get("gpu_model")
    elif kinds != {None}:
        res["gpu_model"] = kinds.pop()
    names = sorted(set(slots.values()))
    if len(names) == 1:
        res[names[0]] = 1
    else:  # one GPU job per model at a time; other slots omitted (None)
        for name in names:
            res[name] = lambda w, name=name: 1 if slots[w.model] == name else None
    return res


def gpu_rule_threads(threads: int, local_cores: int | None) -> int:
    """Threads of a GPU-rule job (``extract``, ``extract_sula``, ``intervene``, ``extract_wind_tunnel``): the
    configured ``threads`` (``extract.threads``) where the jobs are submitted to a cluster (``local_cores``
    None: each job gets its own CPUs, ``--cpus-per-task``), and in a local run on ``local_cores`` cores at most
    half of them, at least 1: the GPU jobs of a model run one after another (its GPU slot), so on a 2-core
    machine a 2-thread GPU job would leave no room for anything else and one core would idle most of the time;
    with 1 thread the two models' GPU jobs, or a GPU job and an analysis, run side by side.

    >>> gpu_rule_threads(2, 2), gpu_rule_threads(2, 16), gpu_rule_threads(4, None), gpu_rule_threads(2, 1)
    (1, 2, 4, 1)
    """
    if local_cores is None:
        return int(threads)
    return max(1, min(int(threads), int(local_cores) // 2))


#: most GPU slots of a local run (at least --cores of them): models beyond share a slot round-robin
LOCAL_GPU_SLOTS = 16


def gpu_slots(models: dict, local_cores: int | None) -> dict:
    """The slot resource that the GPU jobs of each model hold, ``{model: "gpu_slot_<i>"}``; every slot is
    registered with a limit of 1 (:func:`gpu_slot_limits`), so the GPU jobs of one model run one after
    another, in one model-server process (docs/design-notes.md "GPU economy").

    * On a cluster (``local_cores`` None) one slot for all models, ``gpu_slot_0``, scoped ``local`` in the
      submitting run (workflow/rules/common.smk): Snakemake stacks the jobs of a model's group job
      (``gpu_{model}``) in series because together they exceed the slot's limit (the submission asks the
      model's GPUs and memory once and the sum of the runtimes), while the submitting run does not count a
      local resource across submissions, so different models' submissions run side by side.
    * In a local run, a slot per model (``gpu_slot_<i>``, i = the model's index in sorted order), so
      different models' GPU jobs run side by side; beyond ``max(LOCAL_GPU_SLOTS, local_cores)`` models,
      model i takes slot i modulo that number (a local run has at most ``local_cores`` jobs running anyway;
      the slots stay few, so the DAG of a large sweep stays linear in the number of models). On one core
      (``--cores 1``, and Snakemake's default for ``-n``) one slot: no two jobs run at once anyway.

    >>> gpu_slots({"b": {}, "a": {}}, None), gpu_slots({"b": {}, "a": {}}, 2)
    ({'a': 'gpu_slot_0', 'b': 'gpu_slot_0'}, {'a': 'gpu_slot_0', 'b': 'gpu_slot_1'})
    """
    names = sorted(models)
    if local_cores is None or int(local_cores) <= 1:  # a cluster, or one core: no two jobs run at once
        n = 1
    else:
        n = max(1, min(len(names), max(LOCAL_GPU_SLOTS, int(local_cores))))
    return {m: f"gpu_slot_{i % n}" for i, m in enumerate(names)}


def gpu_slot_limits(slots: dict) -> dict:
    """{slot resource: 1} for every slot of :func:`gpu_slots`; registered as resources
    (``workflow.register_resource`` in workflow/rules/common.smk)."""
    return {name: 1 for name in sorted(set(slots.values()))}


# --------------------------------------------------------------------------- site profile

#: placeholders of profiles/slurm/config.yaml that a site fills in (docs/cluster.md)
PROFILE_PLACEHOLDERS = {
    "<account>": "your SLURM account (sacctmgr show assoc user=$USER format=account; any name where the "
                 "cluster has no accounting)",
    "<cpu-partition>": "the partition for CPU jobs (sinfo -s)",
    "<gpu-partition>": "the partition with GPUs, for the GPU rules (sinfo -s)",
}


def _resource_items(res):
    """(name, value) pairs of a profile's resource mapping (a dict, or Snakemake's ``Resources`` holding
    ``Resource`` objects, whose ``raw`` is the value as the profile gave it), or nothing for None."""
    if res is None:
        return []
    items = res.items() if hasattr(res, "items") else dict(res).items()
    return [(k, getattr(v, "raw", v)) for k, v in items]


def unfilled_placeholders(default_resources, set_resources) -> list[str]:
    """Profile settings that still hold a placeholder of :data:`PROFILE_PLACEHOLDERS`, as
    ``"default-resources: slurm_account=<account>"`` / ``"set-resources: extract: slurm_partition=..."``.

    ``default_resources`` maps resource -> value, ``set_resources`` rule -> {resource: value} (the
    profile's ``default-resources`` and ``set-resources``, as Snakemake holds them)."""
    found = []
    for k, v in _resource_items(default_resources):
        if any(p in str(v) for p in PROFILE_PLACEHOLDERS):
            found.append(f"default-resources: {k}={v}")
    for rule, res in (dict(set_resources) if set_resources else {}).items():
        for k, v in _resource_items(res):
            if any(p in str(v) for p in PROFILE_PLACEHOLDERS):
                found.append(f"set-resources: {rule}: {k}={v}")
    return found


#: seconds between two checks of job time limits by slurmctld (its PERIODIC_TIMEOUT): a job's limit and its
#: warning ``--signal=<sig>@<s>`` act at the first check after they are due, and the warning is sent once the
#: job is within ``<s>`` + this many seconds of its end (so up to 60 s early: sbatch(1), ``--signal``)
SLURM_TIMER_S = 30

#: sbatch's ``--signal`` lead time (seconds) when the option gives no ``@<s>`` (sbatch(1))
SLURM_SIGNAL_DEFAULT_S = 60

_SIGNAL = re.compile(r"--signal[= ]['\"]?(?:[RB]+:)?(\w+)(?:@(\d+))?")


def signal_lead_s(slurm_extra) -> int | None:
    """The warning lead time of a job's ``slurm_extra``: the ``<s>`` of ``--signal=[{R|B}:]<sig>[@<s>]``.

    Args:
        slurm_extra: the ``slurm_extra`` resource (sbatch options as one string), or None.

    Returns:
        Seconds before the time limit at which SLURM is asked to send the signal (60, sbatch's default,
        when no ``@<s>`` is given); None when ``slurm_extra`` asks for no signal.
    """
    m = _SIGNAL.search(str(slurm_extra or ""))
    if m is None:
        return None
    return int(m.group(2)) if m.group(2) else SLURM_SIGNAL_DEFAULT_S


def early_warnings(jobs) -> list[str]:
    """GPU jobs whose warning signal comes as soon as they start, on the first check of SLURM's timer.

    SLURM sends ``--signal=<sig>@<s>`` at the first check of its timer (every :data:`SLURM_TIMER_S`
    seconds) at which the job is within ``<s>`` + :data:`SLURM_TIMER_S` seconds of its end. A job whose
    limit is no longer than that gets the warning on the first check after it starts: the model server
    stops its extraction (or the signal ends a process that has no handler yet), the job fails, and its
    retry (runtime x1.5: 1, 2, 2 minutes for 1) is stopped the same way while it is still that short, so a
    1-minute job under ``--signal=USR1@120`` never finishes.

    Args:
        jobs: iterable of ``(name, runtime, slurm_extra)``: a job's name (rule and wildcards), its first
            attempt's ``runtime`` resource in minutes (later attempts ask more) and its ``slurm_extra``.

    Returns:
        One line per such job: its name, runtime, the lead time and the smallest runtime that leaves a
        check of the timer before the warning; empty when there is none.
    """
    out = []
    for name, runtime, extra in jobs:
        lead = signal_lead_s(extra)
        if lead is None or runtime is None or not str(runtime).isdigit():
            continue
        if int(runtime) * 60 <= lead + SLURM_TIMER_S:
            need = (lead + SLURM_TIMER_S) // 60 + 1
            out.append(f"{name}: runtime {int(runtime)} min = {int(runtime) * 60} s, warning --signal ...@{lead} "
                       f"(sent from {lead + SLURM_TIMER_S} s before the end); runtime >= {need} min, "
                       f"or a lead below {int(runtime) * 60 - SLURM_TIMER_S} s")
    return out


def _job_name(job) -> str:
    """A Snakemake job as ``rule (wildcard=value, ...)``."""
    wc = ", ".join(f"{k}={v}" for k, v in job.wildcards_dict.items())
    return f"{job.rule.name} ({wc})" if wc else job.rule.name


def _workflow_error(msg: str):
    try:
        from snakemake_interface_common.exceptions import WorkflowError
    except ImportError:  # pragma: no cover
        WorkflowError = ValueError
    return WorkflowError(msg)


def check_site_profile(workflow) -> None:
    """Refuse, before anything is submitted, a SLURM run whose profile still holds a placeholder
    (``<account>``, ``<cpu-partition>``, ``<gpu-partition>`` of profiles/slurm), or one with a GPU job that its
    warning signal would stop as soon as it starts (:func:`early_warnings`: a ``runtime`` shorter than the
    profile's ``--signal=USR1@<s>`` lead plus SLURM's 30-s timer). Called at DAG time by
    workflow/rules/common.smk (``onstart``) with Snakemake's ``workflow``; dry runs (which run no ``onstart``)
    and other executors pass.

    Raises:
        WorkflowError (snakemake's; ValueError when Snakemake's class cannot be imported): naming each
            unfilled setting and what to put there, or each too-short GPU job with the runtime it needs
            (``models.<m>.runtime``, ``wind_tunnel.models.<m>.runtime``) and the lead time that would fit.
    """
    plugin = getattr(workflow, "executor_plugin", None)
    if plugin is None or getattr(plugin, "name", None) != "slurm" or workflow.dryrun or workflow.remote_exec:
        return
    rs = workflow.resource_settings
    found = unfilled_placeholders(rs.default_resources, rs.overwrite_resources)
    if found:
        hints = "\n".join(f"  {p}: {why}" for p, why in PROFILE_PLACEHOLDERS.items())
        raise _workflow_error("the SLURM profile still holds placeholders; fill them in before the first run "
                              "(docs/cluster.md):\n" + "\n".join(f"  {f}" for f in found) + "\nwhere\n" + hints)
    dag = getattr(workflow, "dag", None)
    jobs = [j for j in (dag.needrun_jobs() if dag is not None else []) if j.rule.name in GPU_RULES]
    early = early_warnings((_job_name(j), j.resources.get("runtime"), j.resources.get("slurm_extra")) for j in jobs)
    if early:
        raise _workflow_error(
            "these GPU jobs would get the profile's warning signal as soon as they start and be stopped on "
            "every attempt (docs/cluster.md, \"Time limits and preemption\"; checked on each job's own runtime, "
            "not on the sum its model's group submission asks); raise the runtime (minutes: models.<m>.runtime, "
            "wind-tunnel entries and their checkpoints wind_tunnel.models.<m>.runtime) or lower the @<s> of "
            "slurm_extra's --signal:\n" + "\n".join(f"  {e}" for e in early))
