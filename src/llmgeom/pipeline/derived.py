"""Values the rules derive from a checked config (its schema defaults filled in: ``schema.apply_defaults``; no
fallback here repeats one): model source parameters, prompt-set labels and token budgets,
the domain-restriction selections, the null models (random-init twins) and the wind-tunnel entries and cuts.

Pure Python on the config dict (imported while Snakemake builds the DAG; no heavy imports).
"""

from __future__ import annotations

from llmgeom.pipeline.schema import ConfigError


SOURCE_KEYS = ("source", "package", "gguf_file", "parts", "sha256", "bytes", "path", "repo_id", "revision")


#: The keys a prompt set may set for itself, else it takes the ``prompts`` section's (schema: no default of their own).
SET_LEVEL_KEYS = ("seed", "token_budget")


def prompt_set_params(config: dict) -> dict:
    """Prompt set -> {"seed", "token_budget"}: the set's own value, else the ``prompts`` section's; the one
    resolution of the set-level keys (``SET_LEVEL_KEYS``) for the rules that build a set and extract it."""
    p = config["prompts"]
    return {s: {k: spec.get(k, p[k]) for k in SET_LEVEL_KEYS} for s, spec in p["sets"].items()}


def reference_tokenizer(config: dict) -> dict:
    """The reference tokenizer of the prompt sets (``prompts.tokenizer``; null = the first model of ``models``):
    ``{"name", "model", "path"}``: for a model of ``models``, ``model`` is its name and ``path`` the tokenizer file
    that rule prepare_tokenizer writes (``resources/tokenizers/<model>/tokenizer.json``); else ``model`` is None
    and ``path`` the given path (a directory: its ``tokenizer.json``). Existence is checked by
    ``llmgeom.pipeline.checks.check_prompts``."""
    from llmgeom.prompts.tokens import tokenizer_file

    name = config["prompts"].get("tokenizer") or next(iter(config["models"]))
    if name in config["models"]:
        return {"name": name, "model": name, "path": f"resources/tokenizers/{name}/tokenizer.json"}
    return {"name": name, "model": None, "path": str(tokenizer_file(name))}


def model_source_params(spec: dict) -> dict:
    """Only the keys that determine the prepared model (so batch size changes don't re-prepare)."""
    return {k: spec[k] for k in SOURCE_KEYS if spec.get(k) is not None}


def prompt_set_label(spec: dict) -> str:
    """Human label of a prompt-set config entry: its topics (domain), "mixed (all topics)", "code"."""
    kind = spec.get("kind")
    if kind == "domain" or spec.get("topics"):
        return ", ".join(spec.get("topics") or [])
    if kind == "mixed":
        return "mixed (all topics)"
    return str(kind)


def resolve_domain_sets(config: dict) -> dict:
    """The domain-restriction sets of a validated config.

    Returns dict with ``mixed`` (set name), ``restricted`` (list of set names: ``restricted_sets``, or
    every set of kind domain or code when it is null, in config order), ``summary`` (the restricted set
    of Table 1/2: ``summary_set`` or the first restricted set of kind domain, else the first one) and
    ``labels`` (set -> :func:`prompt_set_label`).
    """
    dr = config["domain_restriction"]
    sets = config["prompts"]["sets"]
    restricted = dr.get("restricted_sets")
    if restricted is None:
        restricted = [s for s, v in sets.items() if v["kind"] in ("domain", "code")]
    restricted = [s for s in restricted if s != dr["mixed_set"]]
    summary = dr.get("summary_set")
    if summary is None:
        doms = [s for s in restricted if sets.get(s, {}).get("kind") == "domain"]
        summary = (doms or restricted or [None])[0]
    labels = {s: prompt_set_label(sets[s]) for s in [dr["mixed_set"], *restricted] if s in sets}
    return {"mixed": dr["mixed_set"], "restricted": list(restricted), "summary": summary, "labels": labels}


WIND_TUNNEL_SET = "wind_tunnel"  # reserved: results/{model}/activations/wind_tunnel.h5


NULL_SUFFIX = "-randinit"  # name of an LLM's random-init twin: <model>-randinit


def null_entries(config: dict) -> dict:
    """The null models of a checked config: name -> {"null_of": trained model, "kind", "seed"}.

    Every model of ``models`` gets a random-init twin ``<model>-randinit`` (kind ``random_init``: built by
    :func:`llmgeom.models.random_init.prepare_random_init` from the prepared model's config and tokenizer
    with seed ``nulls.seed``); every wind-tunnel model its step-0 checkpoint ``<model>-step0`` (kind
    ``step0``: the initialization its training started from), the null of the model and of its checkpoints.
    Empty when ``nulls.random_init`` is false.

    Raises:
        ConfigError: a configured model already has a twin's name.
    """
    nl = config["nulls"]
    if not nl["random_init"]:
        return {}
    out = {}
    for m in config["models"]:
        name = m + NULL_SUFFIX
        if name in config["models"]:
            raise ConfigError(f"models.{name}: this name is the random-init twin of models.{m} (nulls.random_init); "
                              "rename the model, or set nulls.random_init: false")
        out[name] = dict(null_of=m, kind="random_init", seed=int(nl["seed"]))
    for m in config["wind_tunnel"].get("models") or {}:
        out[f"{m}-step0"] = dict(null_of=m, kind="step0", seed=None)
    return out


def null_of_models(config: dict) -> dict:
    """trained model -> its null model (wind-tunnel checkpoints -> their model's step-0 checkpoint); see
    :func:`null_entries`."""
    nulls = null_entries(config)
    out = {e["null_of"]: n for n, e in nulls.items()}
    for name, e in wind_tunnel_entries(config).items():
        if e["checkpoint"] and e["step"] != 0 and e["base"] in out:
            out[name] = out[e["base"]]
    return out


def wind_tunnel_entries(config: dict) -> dict:
    """Every wind-tunnel model entry (final models and their checkpoints) of a checked config.

    Returns:
        name -> {"base": final model name, "step": training step (the final model: training.steps),
        "checkpoint": bool, "task": task name, plus the final model's resources (mem_mb, runtime, gpus,
        gpu_model, batch_size, threads) and dtype "float32", device_map None}; finals first, in config order, each followed by its checkpoints.
    """
    out = {}
    for name, spec in (config["wind_tunnel"].get("models") or {}).items():
        res = {k: spec.get(k) for k in ("mem_mb", "runtime", "gpus", "gpu_model", "batch_size", "threads")}
        res.update(dtype="float32", device_map=None)  # trained and analysed in float32, one device
        out[name] = dict(base=name, step=spec["training"]["steps"], checkpoint=False, task=spec["task"], **res)
        steps0 = [0] if config["nulls"]["random_init"] else []  # step 0: the null model
        for k in sorted(set(spec["checkpoints"]) | set(steps0)):
            out[f"{name}-step{k}"] = dict(base=name, step=k, checkpoint=True, task=spec["task"], **res)
    return out


def wind_tunnel_cuts(config: dict, task: str) -> list[int]:
    """The answer positions t of the prompt set of ``task`` (``wind_tunnel.prompts.cut_positions``; all =
    every answer position of the task)."""
    cuts = config["wind_tunnel"]["prompts"]["cut_positions"]
    if cuts != "all":
        return [int(t) for t in cuts]
    spec = config["wind_tunnel"]["tasks"][task]
    if spec["kind"] == "bijection":
        return list(range(spec["n_pairs"]))
    return list(range(1, spec["length"]))
