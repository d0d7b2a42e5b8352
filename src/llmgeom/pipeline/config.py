"""The workflow's one config loader: schema check in plain words, defaults, and every check that runs
while Snakemake builds the DAG (called once, from workflow/rules/common.smk).

Order (common.smk; ``tests/test_config_errors.py`` runs the same calls): :func:`validate_config` (every
schema problem at once, in plain words) -> :func:`apply_defaults` (the schema's defaults, also inside the
per-name maps ``models.<name>`` and ``wind_tunnel.models.<name>`` that Snakemake's ``validate`` does not fill)
-> Snakemake's ``validate`` -> :func:`check_config` (cross-key, model, prompt-data, wind-tunnel and device
checks). :func:`check_config_files` checks the YAML text first (Snakefile). Every problem is a
:class:`ConfigError` naming the key, the value and what is valid. Defaults live only in
workflow/schemas/config.schema.yaml; config/README.md is generated from it (``python -m
llmgeom.pipeline.config --markdown > config/README.md``).

Pure Python on the config dict: this module imports nothing heavy at import time (no torch, numpy,
pandas, scipy, scikit-learn), so that a no-op ``snakemake -n`` stays fast (issue 7: <= 3 s on 20 models);
``tests/test_cluster.py`` checks that every module a rule file imports stays light.
"""

from __future__ import annotations

import copy
from pathlib import Path

#: The workflow's config schema (workflow/schemas/config.schema.yaml in the source tree).
SCHEMA_PATH = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"

SOURCE_KEYS = ("source", "package", "gguf_file", "path", "repo_id", "revision")


class ConfigError(ValueError):
    """A config value that cannot work (schema or cross-key); the message names key, value and fix."""


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
               "array": "a list", "object": "a mapping (key: value)", "null": "null"}


def _show(value, limit: int = 70) -> str:
    import json

    try:
        s = json.dumps(value, default=str, sort_keys=True)
    except (TypeError, ValueError):
        s = repr(value)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def describe_schema(s: dict) -> str:
    """Plain-English description of what a JSON-schema node accepts ("an integer >= 1", "one of a, b")."""
    if "const" in s:
        return _show(s["const"])
    if "enum" in s:
        return "one of " + ", ".join(_show(v) for v in s["enum"])
    for comb in ("oneOf", "anyOf"):
        if comb in s:
            return ", or ".join(describe_schema(x) for x in s[comb])
    types = s.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    words = " or ".join(_TYPE_WORDS.get(t, t) for t in types) or "a value"
    bounds = []
    for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in s:
            bounds.append(f"{op} {s[key]}")
    if bounds:
        words += " " + " and ".join(bounds)
    if "array" in types and isinstance(s.get("items"), dict):
        words += " of " + describe_schema(s["items"]).replace("an integer", "integers").replace(
            "a string", "strings").replace("a number", "numbers")
    if "minItems" in s:
        words += f" (at least {s['minItems']} item{'s' if s['minItems'] != 1 else ''})"
    if "minProperties" in s:
        words += f" with at least {s['minProperties']} entr{'ies' if s['minProperties'] != 1 else 'y'}"
    return words


def _key_path(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _schema_error_message(err) -> str:
    import difflib

    path, v, s, inst = _key_path(err.absolute_path), err.validator, err.schema, err.instance
    hint = f" ({s['description']})" if isinstance(s, dict) and s.get("description") else ""
    if "propertyNames" in err.schema_path:
        return (f"{path}: the name {inst!r} is not allowed; valid names match {s.get('pattern')} "
                "(letters, digits and, after the first character, . _ -)")
    if v == "additionalProperties" and isinstance(inst, dict):
        known = sorted(s.get("properties", {}))
        unknown = sorted(k for k in inst if k not in s.get("properties", {}))
        msgs = []
        for k in unknown:
            close = difflib.get_close_matches(str(k), known, n=1)
            msgs.append(f"{_key_path([*err.absolute_path, k])}: unknown key {k!r}"
                        + (f" (did you mean {close[0]!r}?)" if close else "")
                        + f"; valid keys{' of ' + path if err.absolute_path else ''}: {', '.join(known)}")
        return "\n  - ".join(msgs)
    if v == "required":
        missing = [k for k in err.validator_value if not (isinstance(inst, dict) and k in inst)]
        props = s.get("properties", {}) if isinstance(s, dict) else {}
        why = ""
        if "then" in err.schema_path and isinstance(inst, dict) and "source" in inst:
            why = f" (needed for source {inst['source']})"
        descs = "; ".join(f"{k}: {props[k]['description']}" for k in missing
                          if isinstance(props.get(k), dict) and props[k].get("description"))
        where = "the config" if not err.absolute_path else path
        return (f"{where} is missing the required key{'s' if len(missing) > 1 else ''} "
                f"{', '.join(repr(k) for k in missing)}{why}" + (f" ({descs})" if descs else ""))
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{path} = {_show(inst)} is out of range; valid: {describe_schema(s)}{hint}"
    if v == "type":
        return f"{path} = {_show(inst)} has the wrong type; valid: {describe_schema(s)}{hint}"
    if v in ("enum", "const", "oneOf", "anyOf"):
        return f"{path} = {_show(inst)} is not allowed; valid: {describe_schema(s)}{hint}"
    if v == "minProperties":
        what = "at least one model, e.g. {my-model: {source: hf_hub, repo_id: EleutherAI/pythia-160m}}" \
            if path == "models" else f"at least {err.validator_value} entr{'ies' if err.validator_value > 1 else 'y'}"
        return f"{path} = {_show(inst)} is empty; valid: a mapping with {what}"
    if v == "minItems":
        return f"{path} = {_show(inst)} is empty; valid: {describe_schema(s)}{hint}"
    return f"{path} = {_show(inst)}: {err.message}; valid: {describe_schema(s)}{hint}"


def validate_config(config: dict, schema: dict) -> None:
    """Check ``config`` against the JSON schema and report EVERY problem in plain words.

    Runs before Snakemake's own ``validate`` (whose jsonschema messages print the whole schema).
    Each line names the key (dotted path), the value given and what would be valid; unknown keys
    get a "did you mean" suggestion.

    Raises:
        ConfigError: listing all problems, one per line.
    """
    from jsonschema.validators import validator_for

    cls = validator_for(schema)
    errors = sorted(cls(schema).iter_errors(config), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    msgs: list[str] = []
    for e in errors:
        m = _schema_error_message(e)
        if m not in msgs:
            msgs.append(m)
    if msgs:
        raise ConfigError(f"invalid config ({len(msgs)} problem{'s' if len(msgs) > 1 else ''}; all keys, "
                          "defaults and valid values: workflow/schemas/config.schema.yaml):\n  - "
                          + "\n  - ".join(msgs))




def read_schema(path=None) -> dict:
    """The config schema as a dict (``path`` default: :data:`SCHEMA_PATH`)."""
    import yaml

    with open(path or SCHEMA_PATH) as fh:
        return yaml.safe_load(fh)


def apply_defaults(config: dict, schema: dict) -> dict:
    """Fill in every default of the schema, also inside per-name maps (``models.<name>``,
    ``wind_tunnel.models.<name>``, their ``arch`` / ``training``) that Snakemake's ``validate`` does not
    descend into. A model entry with ``params_b`` first gets ``mem_mb`` / ``runtime`` from its size
    (``llmgeom.pipeline.cluster.apply_size_defaults``) unless given. Mutates and returns ``config``."""
    from llmgeom.pipeline.cluster import apply_size_defaults

    apply_size_defaults(config)
    _fill(config, schema)
    return config


def _fill(node, schema: dict) -> None:
    if not isinstance(node, dict) or not isinstance(schema, dict):
        return
    for key, sub in (schema.get("properties") or {}).items():
        if key not in node and isinstance(sub, dict) and "default" in sub:
            node[key] = copy.deepcopy(sub["default"])
        if key in node:
            _fill(node[key], sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in node.items():
            if key not in (schema.get("properties") or {}):
                _fill(value, extra)


def check_config(config: dict, *, here: bool = True, root=".", dry_run: bool = False) -> dict:
    """Every check of a schema-valid config with its defaults filled in, before any job runs.

    In order: :func:`check_cross_keys`, :func:`check_gpu_config`, :func:`check_models`,
    :func:`check_prompt_sources`, :func:`check_wind_tunnel`, :func:`check_device` (``here``: the jobs run
    on this machine), :func:`check_lsm_config`, :func:`check_bayes_config`. ``dry_run`` (no job runs:
    ``snakemake -n``, ``--list-rules``, ``--lint``, ...; :func:`dry_run_requested`): an ``hf_hub`` model not in
    the local cache is not refused while ``HF_HUB_OFFLINE=1``.

    Returns:
        the normalized wind-tunnel task specs (:func:`check_wind_tunnel`).

    Raises:
        ConfigError: the first failing check's problems (key, value, what is valid).
        llmgeom.models.sources.ModelSourceError: a model source that cannot be read (names the fix).
    """
    check_cross_keys(config)
    check_gpu_config(config)
    check_models(config, root=root, dry_run=dry_run)  # sources exist, token budgets and layer indices fit (no weights read)
    check_prompt_sources(config, root=root)  # Wikipedia topics, pool sizes and corpus files (no prompt built)
    tasks = check_wind_tunnel(config)
    check_device(config, here=here)
    check_lsm_config(config)
    check_bayes_config(config)
    return tasks

#: Snakemake options under which no job runs (the DAG is only shown, listed, linted or reported).
NO_JOB_OPTIONS = ("--dry-run", "--dryrun", "--just-print", "--list-rules", "--list", "-l", "--list-target-rules",
                  "--lt", "--lint", "--dag", "--rulegraph", "--filegraph", "--d3dag", "--summary", "-S",
                  "--detailed-summary", "-D", "--report", "--unlock", "--cleanup-metadata", "--list-changes", "--lc",
                  "--list-untracked", "--lu", "--containerize", "--print-compilation")


def dry_run_requested(argv, executor_says: bool = False) -> bool:
    """True when this Snakemake invocation runs no job: a dry run (``-n`` / ``--dry-run``, also in a short-flag
    cluster such as ``-np``) or one of ``NO_JOB_OPTIONS`` (listing, lint, DAG, report), read from the command line
    (Snakemake 9 sets ``workflow.dryrun``, ``executor_says``, only after the Snakefile is parsed, when the config
    has already been checked)."""
    if executor_says:
        return True
    for a in argv:
        if a.split("=")[0] in NO_JOB_OPTIONS or a.startswith("--list"):
            return True
        if a.startswith("-") and not a.startswith("--") and a[1:].isalpha() and "n" in a[1:]:
            return True
    return False


def check_cross_keys(config: dict) -> None:
    """Cross-key checks that JSON schema cannot express.

    Raises:
        ConfigError: an analysis names a prompt set that is not defined, the
            intrinsic-dimension set is not a corpus set, a prompt set uses a reserved name
            (``wind_tunnel``, ``sula_*``), or sizes that no estimator accepts.
    """
    sets = config["prompts"]["sets"]
    for s in sets:
        if s == WIND_TUNNEL_SET:
            raise ConfigError(f"prompts.sets.{s}: the name is reserved for the wind-tunnel activation files "
                              f"(results/{{model}}/activations/{s}.h5); rename the prompt set")
        if s.startswith("sula_"):
            raise ConfigError(f"prompts.sets.{s}: names starting with 'sula_' are reserved for the SULA activation "
                              "files (results/{model}/activations/sula_{condition}.h5); rename the prompt set")
    for s in config["value_manifold"]["prompt_sets"]:
        if s not in sets:
            raise ConfigError(f"value_manifold.prompt_sets contains {s!r}, which is not in prompts.sets "
                              f"({', '.join(sorted(sets))}); add it under prompts.sets or remove it")
    ids = config["intrinsic_dimension"]["prompt_set"]
    if ids not in sets or sets[ids]["kind"] != "corpus":
        raise ConfigError(f"intrinsic_dimension.prompt_set is {ids!r}; it must name a prompt set of kind "
                          "corpus in prompts.sets")
    # sizes that can never work: every subsample / point set would be rejected by the estimator
    idc = config["intrinsic_dimension"]
    if idc["subsample_size"] < idc["min_points"]:
        raise ConfigError(f"intrinsic_dimension.subsample_size = {idc['subsample_size']} is smaller than "
                          f"intrinsic_dimension.min_points = {idc['min_points']}; valid: subsample_size >= "
                          f"{idc['min_points']} (or lower min_points)")
    cv = config.get("curvature")
    if cv and cv.get("n_points") is not None and cv.get("min_points") is not None:
        if cv["n_points"] < cv["min_points"]:
            raise ConfigError(f"curvature.n_points = {cv['n_points']} is smaller than curvature.min_points = "
                              f"{cv['min_points']}; valid: n_points >= {cv['min_points']}")
        if cv.get("k") is not None and cv["k"] >= cv["n_points"]:
            raise ConfigError(f"curvature.k = {cv['k']} nearest neighbours needs more points than "
                              f"curvature.n_points = {cv['n_points']}; valid: k < {cv['n_points']}")


def check_lsm_config(config: dict) -> None:
    """Cross-key checks for the LSM sections of the config.

    Raises:
        ConfigError: ``margins.prompt_set`` / ``fisher.prompt_set`` not a corpus prompt set;
            ``curvature.id_estimator`` not among ``intrinsic_dimension.estimators``;
            ``margins.fit_eps_max`` outside [eps_min, eps_max].
    """
    sets = config["prompts"]["sets"]
    for sec in ("margins", "fisher"):
        ps = config[sec]["prompt_set"]
        if ps not in sets or sets[ps]["kind"] != "corpus":
            raise ConfigError(f"{sec}.prompt_set is {ps!r}; it must name a prompt set of kind corpus in "
                                 f"prompts.sets (defined: {', '.join(sorted(sets))})")
    est = config["curvature"]["id_estimator"]
    alias = {"mle": "mle_mg"}  # = llmgeom.measures.intrinsic_dimension.ESTIMATOR_ALIASES (skdim not imported at DAG time)
    if alias.get(est, est) not in {alias.get(e, e) for e in config["intrinsic_dimension"]["estimators"]}:
        raise ConfigError(f"curvature.id_estimator is {est!r} but intrinsic_dimension.estimators is "
                             f"{config['intrinsic_dimension']['estimators']}; add it there or change it")
    mg = config["margins"]
    if not (mg["eps_min"] < mg["fit_eps_max"] <= mg["eps_max"]):
        raise ConfigError(f"margins.fit_eps_max={mg['fit_eps_max']} must lie in (eps_min={mg['eps_min']}, "
                             f"eps_max={mg['eps_max']}]")


def check_bayes_config(config: dict) -> None:
    """Cross-key checks of the Bayesian-geometry sections that JSON schema cannot express.

    Raises:
        ConfigError: a named prompt set is missing from ``prompts.sets`` or is
            a corpus set; no restricted set; ``summary_set`` not among the restricted sets.
    """
    sets = config["prompts"]["sets"]
    r = resolve_domain_sets(config)
    named = {"domain_restriction.mixed_set": [r["mixed"]],
             "domain_restriction.restricted_sets": r["restricted"],
             "attention_focusing.prompt_set": [config["attention_focusing"]["prompt_set"]]}
    for key, names in named.items():
        for s in names:
            if s not in sets:
                raise ConfigError(f"{key} names prompt set {s!r}, which is not in prompts.sets "
                                  f"({', '.join(sorted(sets))}); add it under prompts.sets or change {key}")
            if sets[s]["kind"] == "corpus":
                raise ConfigError(f"{key} names {s!r}, a corpus set (no last-token or attention data); "
                                  "use a set of kind mixed, domain or code")
    if not r["restricted"]:
        raise ConfigError("domain_restriction: no restricted prompt set (define a set of kind domain or code, "
                          "or list them in domain_restriction.restricted_sets)")
    if r["summary"] not in r["restricted"]:
        raise ConfigError(f"domain_restriction.summary_set is {r['summary']!r}; it must be one of the restricted "
                          f"sets {r['restricted']}")


def check_gpu_config(config: dict) -> None:
    """``gpus`` > 1 needs ``device_map: auto`` (else the model would use one GPU and the others sit idle).

    Raises:
        ConfigError: naming the model, the value and the fix.
    """
    for name, spec in sorted(config.get("models", {}).items()):
        if int(spec.get("gpus") or 1) > 1 and spec.get("device_map") != "auto":
            raise ConfigError(f"models.{name}.gpus = {spec['gpus']} needs models.{name}.device_map = auto "
                              "(without it the model runs on one GPU); valid: gpus: 1, or add device_map: auto")


def token_budgets(config: dict) -> dict:
    """Prompt set -> its token budget (the set's own ``token_budget`` or ``prompts.token_budget``)."""
    default = config["prompts"].get("token_budget", 48)
    return {s: spec.get("token_budget", default) for s, spec in config["prompts"]["sets"].items()}


#: Config keys that name layers (resolved by llmgeom.core.layers.select_layers against each model's layers).
LAYER_KEYS = ("value_manifold.layers", "domain_restriction.layers", "sula.layers", "interventions.layers",
              "interventions.multi_layers")


def check_models(config: dict, root=".", dry_run: bool = False) -> dict:
    """Before any job starts: cheap source checks, token budgets against each model's context and layer
    indices against each model's number of layers.

    Context and number of layers are read without weights (``llmgeom.models.sources.model_facts``): from
    the prepared manifest ``<root>/resources/models/<model>/manifest.json`` when present, else from the
    source's ``config.json`` or GGUF header. An ``hf_hub`` model not yet in the local cache is skipped here
    (rule ``prepare_model`` reports it with the download command), unless ``HF_HUB_OFFLINE=1`` (then it
    cannot be fetched: refused, except in a ``dry_run``). A ``config.json`` whose model type cannot be read (encoder, encoder-decoder,
    a layer that bypasses the attention interface, ...; ``llmgeom.models.architectures.refusal``) is refused
    here, naming the model, its model_type and why (issue 29 item 3).

    Returns:
        model -> context length (None where unknown).

    Raises:
        ConfigError: a prompt set's token budget exceeds a model's context (names the key, the value,
            the model and the largest valid value); a layer index in one of ``LAYER_KEYS`` outside a
            model's layers (names the key, the value, the model and the valid range).
        llmgeom.models.sources.ModelSourceError: a missing GGUF package / file, an ``hf_local`` path that is not
            a Hugging Face directory with weights, an uncached ``hf_hub`` id while offline, an unreadable model
            type (message names the fix).
    """
    from pathlib import Path

    from llmgeom.core.layers import select_layers
    from llmgeom.models.sources import model_facts

    budgets = token_budgets(config)
    contexts, problems, layer_problems = {}, [], []
    for name, spec in sorted(config["models"].items()):
        facts = model_facts(name, spec, prepared_dir=Path(root) / "resources" / "models" / name,
                            offline_uncached_ok=dry_run)
        ctx, where = facts["context"], facts["where"]
        contexts[name] = ctx
        for s, b in sorted(budgets.items()):
            if ctx and b > ctx:
                key = (f"prompts.sets.{s}.token_budget" if "token_budget" in config["prompts"]["sets"][s]
                       else "prompts.token_budget")
                problems.append(f"{key} = {b} (prompt set {s!r}) is larger than the context of model {name!r} "
                                f"({ctx} tokens, read from {where}); valid: at most {ctx} for this model")
        n_layers = facts["n_layers"]
        if not n_layers:
            continue
        for key in LAYER_KEYS:
            sec, sub = key.split(".")
            spec_l = (config.get(sec) or {}).get(sub)
            if spec_l is None or spec_l == []:
                continue
            try:
                select_layers(spec_l, n_layers, key=key)
            except ValueError as e:
                layer_problems.append(f"{key} = {_show(spec_l)}: {str(e).split(': ', 1)[1]} (model {name!r}, "
                                      f"{n_layers} layers read from {where})")
    if problems:
        raise ConfigError("token budget larger than a model's context:\n  - " + "\n  - ".join(problems))
    if layer_problems:
        raise ConfigError("layer index outside a model's layers:\n  - " + "\n  - ".join(layer_problems))
    return contexts


# --- prompt data sources (Wikipedia topics and pool sizes, corpus files) ---

WIKI_POOL_CACHE = ".snakemake/llmgeom/wiki_topic_pool.json"


def wiki_pool(root=".") -> dict:
    """``llmgeom.prompts.sources.wiki_topic_pool()`` of the installed summaries file, cached in
    ``<root>/.snakemake/llmgeom/wiki_topic_pool.json`` keyed by the file's path, size and mtime (reading
    and counting the ~10k summaries takes ~0.2 s; the cache ~1 ms). An unwritable cache is skipped.

    Raises:
        llmgeom.prompts.io.PromptDataError: the Wikipedia package is not installed (names the fix).
    """
    import json
    from pathlib import Path

    from llmgeom.prompts.sources import wiki_summaries_path

    src = wiki_summaries_path()
    st = src.stat()
    key = f"{src}:{st.st_size}:{st.st_mtime_ns}"
    cache = Path(root) / WIKI_POOL_CACHE
    try:
        data = json.loads(cache.read_text())
        if data.get("key") == key:
            return data["pool"]
    except (OSError, ValueError, AttributeError):
        pass
    from llmgeom.prompts.sources import wiki_topic_pool

    pool = wiki_topic_pool()
    try:
        from llmgeom.core.io import write_text

        write_text(json.dumps({"key": key, "pool": pool}), cache)
    except OSError:
        pass
    return pool


def check_prompt_sources(config: dict, root=".") -> None:
    """Before any job starts: the data each prompt set is built from exists and is large enough, without
    building it (``build_prompts`` would otherwise fail inside its job after Snakemake removed the
    previous prompt file).

    Checks per set of ``prompts.sets``: a corpus ``path`` exists (relative to ``root``, the working
    directory); Wikipedia ``topics`` exist (the same matching as ``build_prompt_set``: exact, or
    case-insensitive with ``_``/``-`` as spaces); ``n`` is at most the pool of its topics: the number
    of summaries (mixed, domain) or ``words // max_words`` passages (corpus), an upper bound (prompts that
    do not end at a clause boundary are found only when the set is built).

    Raises:
        ConfigError: naming the key, the value and what is valid.
        llmgeom.prompts.io.PromptDataError: the Wikipedia package is missing (names the fix).
    """
    from pathlib import Path

    from llmgeom.prompts.builders import WORDS_PER_TOKEN
    from llmgeom.prompts.io import PromptDataError
    from llmgeom.prompts.sources import resolve_topics

    budgets = token_budgets(config)
    problems, pool = [], None
    for s, spec in config["prompts"]["sets"].items():
        key = f"prompts.sets.{s}"
        if spec.get("path") is not None:
            p = Path(spec["path"])
            full = p if p.is_absolute() else Path(root) / p
            if spec["kind"] != "corpus":
                problems.append(f"{key}.path = {_show(spec['path'])} is only valid for kind corpus (this set is "
                                f"{spec['kind']!r}); valid: remove 'path' or set kind: corpus")
            elif not full.is_file():
                problems.append(f"{key}.path = {_show(spec['path'])}: no such file ({full.resolve()}); valid: an "
                                "existing UTF-8 text file (e.g. WikiText-103 wiki.valid.tokens), or no 'path' "
                                "(the Wikipedia summaries)")
            continue
        if spec["kind"] == "code":
            continue
        if pool is None:
            pool = wiki_pool(root)
        topics = list(pool)
        if spec.get("topics"):
            try:
                topics = resolve_topics(spec["topics"], pool)
            except PromptDataError:
                bad = [t for t in spec["topics"] if _unresolved(t, pool, resolve_topics)]
                problems.append(f"{key}.topics = {_show(spec['topics'])}: {', '.join(map(repr, bad))} "
                                f"{'is not a topic' if len(bad) == 1 else 'are not topics'} of the Wikipedia "
                                f"summaries; valid topics: {', '.join(pool)}")
                continue
        n = spec["n"]
        if spec["kind"] == "corpus":
            max_words = int(budgets[s] * WORDS_PER_TOKEN)
            cap = sum(pool[t]["words"] for t in topics) // max(1, max_words)
            what = (f"{cap} passages of {max_words} words (token_budget {budgets[s]}) from the "
                    f"{sum(pool[t]['summaries'] for t in topics)} summaries of {_topic_words(topics, pool)}")
        else:
            cap = sum(pool[t]["summaries"] for t in topics)
            what = f"{cap} Wikipedia summaries in {_topic_words(topics, pool)}"
        if n > cap:
            problems.append(f"{key}.n = {n} is larger than the pool: at most {what}; valid: n <= {cap} "
                            "(or more topics)")
    if problems:
        raise ConfigError("prompt set that cannot be built:\n  - " + "\n  - ".join(problems))


def _unresolved(t, pool, resolve_topics) -> bool:
    try:
        resolve_topics([t], pool)
        return False
    except ValueError:
        return True


def _topic_words(topics, pool) -> str:
    return "all topics" if len(topics) == len(pool) else "topic " + ", ".join(map(repr, topics))


# --- device ---

_DEVICE = r"auto|cpu|mps|cuda(:[0-9]+)?"


def check_device(config: dict, *, here: bool = True) -> None:
    """``extract.device`` (used by the GPU rules extract, extract_sula, intervene) names a device that exists.

    The form is always checked; with ``here`` (the jobs run on this machine: a local run) a CUDA device is
    also looked up with ``torch.cuda.device_count()`` (torch imported only then, ~1-2 s). On a cluster
    the DAG is built on a login node without GPUs, so the workflow passes ``here=False`` there.

    Raises:
        ConfigError: naming the key, the value and the devices that exist.
    """
    import re

    dev = (config.get("extract") or {}).get("device", "auto")
    if not re.fullmatch(_DEVICE, str(dev)):
        raise ConfigError(f"extract.device = {_show(dev)} is not a device; valid: \"auto\" (CUDA when present, "
                          "else CPU), \"cpu\", \"cuda\", \"cuda:<index>\" or \"mps\"")
    if not here or not dev.startswith("cuda"):
        return
    import torch

    n = torch.cuda.device_count()
    idx = int(dev.split(":")[1]) if ":" in dev else 0
    if idx >= n:
        have = ", ".join(["cpu"] + [f"cuda:{i}" for i in range(n)])
        raise ConfigError(f"extract.device = {_show(dev)}, but this machine has "
                          f"{'no CUDA device' if n == 0 else f'{n} CUDA device' + ('s' if n > 1 else '')}; "
                          f"devices that exist: {have}; valid: one of them or \"auto\" (CUDA when present, "
                          "else CPU)")


# --- config files: duplicate keys and YAML syntax, with line numbers ---


def check_config_files(paths) -> None:
    """Check the text of config YAML files before (or besides) Snakemake's own load, which reports only
    "not valid JSON or YAML" and lets a repeated key silently win.

    Raises:
        ConfigError: a YAML syntax error (file, line, column and the problem; a tab used for
            indentation is named as such), or a key that appears twice in one mapping (file, the key's
            dotted path and both line numbers).
    """
    import yaml
    from pathlib import Path

    problems = []
    for path in paths:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # Snakemake reports a missing or unreadable file itself
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as e:
            m = e.problem_mark
            line = text.splitlines()[m.line] if m is not None and m.line < len(text.splitlines()) else ""
            tab = line.find("\t")
            if tab >= 0:
                problems.append(f"{path}, line {m.line + 1}, column {tab + 1}: a tab character; YAML indents "
                                "with spaces only: replace the tab by spaces")
            else:
                where = f", line {m.line + 1}, column {m.column + 1}" if m is not None else ""
                problems.append(f"{path}{where}: not valid YAML: {e.problem}"
                                + (f" ({e.context})" if e.context else ""))
            continue
        except yaml.YAMLError as e:
            problems.append(f"{path}: not valid YAML: {e}")
            continue
        if node is not None:
            problems += [f"{path}: {p}" for p in _duplicate_keys(node, [])]
    if problems:
        raise ConfigError("config file problem:\n  - " + "\n  - ".join(problems))


def _duplicate_keys(node, path) -> list[str]:
    import yaml

    out = []
    if isinstance(node, yaml.MappingNode):
        first = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key is not None and key != "<<":
                if key in first:
                    dotted = ".".join(map(str, path + [key]))
                    out.append(f"key {dotted!r} appears twice (line {first[key] + 1} and line "
                               f"{k.start_mark.line + 1}); YAML keeps only the last one silently: remove or "
                               "rename one of them")
                else:
                    first[key] = k.start_mark.line
            out += _duplicate_keys(v, path + [key if key is not None else "?"])
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out += _duplicate_keys(v, path[:-1] + [f"{path[-1]}[{i}]"] if path else [f"[{i}]"])
    return out


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


# --- wind tunnel (llmgeom.wind_tunnel; README "Wind tunnel") ---

WIND_TUNNEL_SET = "wind_tunnel"  # reserved: results/{model}/activations/wind_tunnel.h5


def _wt_cut_range(spec: dict) -> tuple[int, int]:
    return (0, spec["n_pairs"] - 1) if spec["kind"] == "bijection" else (1, spec["length"] - 1)


def check_wind_tunnel(config: dict) -> dict:
    """Checks of the ``wind_tunnel`` section before any job runs (part of :func:`check_config`).

    Task values go through :func:`llmgeom.prompts.wind_tunnel.check_task` (numpy only): V < 2, n_pairs < 1 or
    > V, bad HMM sizes, a transition / emission / initial that is not stochastic. Models: a task that is not
    defined, n_heads not dividing d_model, n_kv_heads not dividing n_heads (or given for gpt2), checkpoints
    beyond ``training.steps``, names that collide with ``models`` or with another entry's checkpoints; the
    prompts' ``cut_positions`` must lie in every used task's answer positions.

    Returns:
        the normalized task specs (name -> spec).

    Raises:
        ConfigError: naming the key (``wind_tunnel.tasks.<name>.V`` ...), the value and what is valid.
    """
    wt = config.get("wind_tunnel") or {}
    tasks = {}
    if wt.get("tasks"):
        from llmgeom.prompts.wind_tunnel import check_task

        for name, spec in wt["tasks"].items():
            try:
                tasks[name] = check_task(name, spec)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    llm = set(config.get("models", {}))
    models = wt.get("models") or {}
    entries = set(models)
    for name, spec in models.items():
        key = f"wind_tunnel.models.{name}"
        if name in llm:
            raise ConfigError(f"{key}: the name is also a key of models; wind-tunnel and LLM model names must differ")
        if spec["task"] not in tasks:
            raise ConfigError(f"{key}.task = {spec['task']!r}: not a key of wind_tunnel.tasks "
                              f"(defined: {', '.join(sorted(tasks)) or 'none'})")
        a = spec["arch"]
        if a["d_model"] % a["n_heads"]:
            raise ConfigError(f"{key}.arch.n_heads = {a['n_heads']}: must divide arch.d_model = {a['d_model']}")
        if "n_kv_heads" in a:
            if a.get("family", "llama") == "gpt2":
                raise ConfigError(f"{key}.arch.n_kv_heads: GPT-2 has no grouped-query attention; drop it or use "
                                  "family: llama")
            if a["n_heads"] % a["n_kv_heads"]:
                raise ConfigError(f"{key}.arch.n_kv_heads = {a['n_kv_heads']}: must divide arch.n_heads = "
                                  f"{a['n_heads']}")
        steps = spec["training"]["steps"]
        bad = [k for k in spec.get("checkpoints", []) if k > steps]
        if bad:
            raise ConfigError(f"{key}.checkpoints = {spec['checkpoints']}: step {bad[0]} is beyond "
                              f"training.steps = {steps}; valid: 1..{steps}")
        for k in spec.get("checkpoints", []):
            ck = f"{name}-step{k}"
            if ck in entries or ck in llm:
                raise ConfigError(f"{key}.checkpoints: the checkpoint entry {ck!r} collides with another model "
                                  "name; rename one of them")
            entries.add(ck)
    cuts = (wt.get("prompts") or {}).get("cut_positions", "all")
    if cuts != "all":
        for tname in sorted({m["task"] for m in models.values()}):
            lo, hi = _wt_cut_range(tasks[tname])
            bad = [t for t in cuts if not lo <= t <= hi]
            if bad:
                raise ConfigError(f"wind_tunnel.prompts.cut_positions = {cuts}: {bad[0]} is not an answer position "
                                  f"of task {tname!r}; valid: {lo}..{hi}")
    return tasks


NULL_SUFFIX = "-randinit"  # name of an LLM's random-init twin: <model>-randinit


def null_entries(config: dict) -> dict:
    """The null models of a checked config (issue 28): name -> {"null_of": trained model, "kind", "seed"}.

    Every model of ``models`` gets a random-init twin ``<model>-randinit`` (kind ``random_init``: built by
    :func:`llmgeom.models.random_init.prepare_random_init` from the prepared model's config and tokenizer
    with seed ``nulls.seed``); every wind-tunnel model its step-0 checkpoint ``<model>-step0`` (kind
    ``step0``: the initialization its training started from), the null of the model and of its checkpoints.
    Empty when ``nulls.random_init`` is false.

    Raises:
        ConfigError: a configured model already has a twin's name.
    """
    nl = config.get("nulls") or {}
    if not nl.get("random_init", True):
        return {}
    out = {}
    for m in config.get("models") or {}:
        name = m + NULL_SUFFIX
        if name in config["models"]:
            raise ConfigError(f"models.{name}: this name is the random-init twin of models.{m} (nulls.random_init); "
                              "rename the model, or set nulls.random_init: false")
        out[name] = dict(null_of=m, kind="random_init", seed=int(nl.get("seed", 0)))
    for m in ((config.get("wind_tunnel") or {}).get("models") or {}):
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
    for name, spec in ((config.get("wind_tunnel") or {}).get("models") or {}).items():
        res = {k: spec.get(k) for k in ("mem_mb", "runtime", "gpus", "gpu_model", "batch_size", "threads")}
        res.update(dtype="float32", device_map=None)  # trained and analysed in float32, one device
        out[name] = dict(base=name, step=spec["training"]["steps"], checkpoint=False, task=spec["task"], **res)
        steps0 = [0] if (config.get("nulls") or {}).get("random_init", True) else []  # the null (issue 28)
        for k in sorted(set(spec.get("checkpoints", [])) | set(steps0)):
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


# --- config/README.md, generated from the schema's descriptions ---


def _md(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _rows(schema: dict, path: str):
    for key, sub in (schema.get("properties") or {}).items():
        dotted = f"{path}.{key}" if path else key
        yield dotted, sub
        if isinstance(sub, dict):
            yield from _rows(sub, dotted)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("properties"):
        yield from _rows(extra, f"{path}.<name>")


def config_markdown(schema: dict) -> str:
    """config/README.md: every key of the schema (dotted path, ``<name>`` for a user-chosen name), what it
    accepts (:func:`describe_schema`), its default and its description; one table per top-level section.

    Raises:
        ConfigError: a key without a description (every key documents itself in the schema).
    """
    import json

    missing = [k for k, sub in _rows(schema, "") if not (isinstance(sub, dict) and sub.get("description"))]
    if missing:
        raise ConfigError(f"schema keys without a description: {', '.join(missing)}; add a description: to each "
                          "in workflow/schemas/config.schema.yaml")
    out = ["# Configuration reference", "",
           "<!-- Generated from workflow/schemas/config.schema.yaml by `python -m llmgeom.pipeline.config "
           "--markdown > config/README.md`; do not edit by hand (tests/test_config_schema.py compares). -->", "",
           _md(schema.get("description", "")), "",
           "Every default below is filled in before the workflow runs; a key you do not set takes it. Required "
           "top-level keys: " + ", ".join(f"`{k}`" for k in schema.get("required", [])) + ". `<name>` stands for a "
           "name you choose (a model, a prompt set, a task).", ""]
    for top, sub in (schema.get("properties") or {}).items():
        out += [f"## `{top}`", "", _md(sub.get("description", "")), ""]
        rows = list(_rows(sub, top))
        if rows:
            out += ["| key | valid | default | description |", "|---|---|---|---|"]
            for dotted, node in rows:
                default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
                req = " (required)" if dotted.rsplit(".", 1)[-1] in _parent(schema, dotted).get("required", []) else ""
                out.append(f"| `{dotted}`{req} | {_md(describe_schema(node))} | {default} | {_md(node['description'])} |")
            out.append("")
    return "\n".join(out)


def _parent(schema: dict, dotted: str) -> dict:
    node = schema
    for part in dotted.split(".")[:-1]:
        node = node["additionalProperties"] if part == "<name>" else node["properties"][part]
    return node


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m llmgeom.pipeline.config --markdown > config/README.md")
    print(config_markdown(read_schema()), end="")
