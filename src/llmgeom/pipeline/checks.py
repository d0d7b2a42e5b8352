"""Every config check that runs while Snakemake builds the DAG, before any job.

:func:`check_config_files` reads the YAML text first (duplicate keys; the Snakefile), then common.smk runs
``schema.validate_config`` -> ``schema.apply_defaults`` -> Snakemake's ``validate`` -> :func:`check_config`: one
check per section, in the schema's order (:data:`SECTION_CHECKS`: model sources and sizes, prompt names and data,
the device, each analysis's cross-key constraints, the wind tunnel), each calling the rooms below it and returning. Each problem is a
``ConfigError`` naming the key, the value and what is valid. The Wikipedia topic pool that the prompt check
counts is cached in the user's cache directory (:func:`cache_dir`).

Pure Python on the config dict: nothing heavy at import time (no torch, numpy, pandas, scipy, scikit-learn), so
that a no-op ``snakemake -n`` stays fast; ``tests/cluster/test_cluster.py`` checks that every module a rule file imports
stays light.
"""

from __future__ import annotations

from pathlib import Path

from llmgeom.pipeline.derived import WIND_TUNNEL_SET, prompt_set_params, resolve_domain_sets
from llmgeom.pipeline.schema import ConfigError, show_value


def check_config(config: dict, *, here: bool = True, root=".", dry_run: bool = False) -> dict:
    """Every check of a schema-valid config with its defaults filled in, before any job runs: one check per
    section, in the schema's order (:data:`SECTION_CHECKS`); each calls the rooms below it (``derived``,
    ``models.sources``, ``prompts``, ``core.layers``) and returns. ``here`` (the jobs run on this machine) goes to
    :func:`check_device`, ``root`` (the working directory) to :func:`check_models` and :func:`check_prompts`;
    ``dry_run`` (no job runs: ``snakemake -n``, ``--list-rules``, ``--lint``, ...; :func:`dry_run_requested`): an
    ``hf_hub`` model not in the local cache is not refused while ``HF_HUB_OFFLINE=1``.

    Returns:
        the normalized wind-tunnel task specs (:func:`check_wind_tunnel`).

    Raises:
        ConfigError: the first failing check's problems (key, value, what is valid).
        llmgeom.models.sources.ModelSourceError: a model source that cannot be read (names the fix).
    """
    import inspect

    given = {"here": here, "root": root, "dry_run": dry_run}
    out = None
    for _section, check in SECTION_CHECKS:
        params = inspect.signature(check).parameters
        out = check(config, **{k: v for k, v in given.items() if k in params})
    return out


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


def _prompt_set_named(config: dict, key: str, name: str, *, corpus: bool | None) -> None:
    """``key`` names prompt set ``name``: it must be in ``prompts.sets`` and, ``corpus`` True / False, of kind corpus
    / not of kind corpus (None: any kind).

    Raises:
        ConfigError: naming the key, the value and the fix."""
    sets = config["prompts"]["sets"]
    if name not in sets:
        raise ConfigError(f"{key} names prompt set {name!r}, which is not in prompts.sets "
                          f"({', '.join(sorted(sets))}); add it under prompts.sets or change {key}")
    if corpus is True and sets[name]["kind"] != "corpus":
        raise ConfigError(f"{key} is {name!r}; it must name a prompt set of kind corpus in prompts.sets "
                          f"(defined: {', '.join(sorted(sets))})")
    if corpus is False and sets[name]["kind"] == "corpus":
        raise ConfigError(f"{key} names {name!r}, a corpus set (no last-token or attention data); "
                          "use a set of kind mixed, domain or code")


def check_prompts(config: dict, root=".") -> None:
    """``prompts``: no set takes a reserved name (``wind_tunnel``, ``sula_*``), and the data each set is built from
    exists and is large enough (:func:`check_prompt_sources`).

    Raises:
        ConfigError: naming the key, the value and what is valid.
        llmgeom.prompts.io.PromptDataError: the Wikipedia package is missing (names the fix).
    """
    for s in config["prompts"]["sets"]:
        if s == WIND_TUNNEL_SET:
            raise ConfigError(f"prompts.sets.{s}: the name is reserved for the wind-tunnel activation files "
                              f"(results/{{model}}/activations/{s}.h5); rename the prompt set")
        if s.startswith("sula_"):
            raise ConfigError(f"prompts.sets.{s}: names starting with 'sula_' are reserved for the SULA activation "
                              "files (results/{model}/activations/sula_{condition}.h5); rename the prompt set")
    check_reference_tokenizer(config, root=root)
    check_prompt_sources(config, root=root)


def check_reference_tokenizer(config: dict, root=".") -> None:
    """``prompts.tokenizer`` names a model of ``models`` or an existing ``tokenizer.json`` (or a directory holding
    one), relative to ``root`` (the working directory): checked before any job, so a missing tokenizer stops the
    study before any model is prepared.

    Raises:
        ConfigError: naming the key, the value, the models it could name and the fix.
    """
    from llmgeom.pipeline.derived import reference_tokenizer

    ref = reference_tokenizer(config)
    if ref["model"] is not None:
        return
    p = Path(ref["path"])
    full = p if p.is_absolute() else Path(root) / p
    if not full.is_file():
        raise ConfigError(
            f"prompts.tokenizer = {show_value(ref['name'])}: not a model of models ({', '.join(config['models'])}) and "
            f"no tokenizer file {full.resolve()}; fix: name one of those models (its tokenizer.json is prepared into "
            "resources/tokenizers/<model>/) or give the path of a tokenizer.json (or of a directory holding one)")


def check_value_manifold(config: dict) -> None:
    """``value_manifold.prompt_sets`` are defined prompt sets.

    Raises:
        ConfigError: a set that ``prompts.sets`` does not define."""
    sets = config["prompts"]["sets"]
    for s in config["value_manifold"]["prompt_sets"]:
        if s not in sets:
            raise ConfigError(f"value_manifold.prompt_sets contains {s!r}, which is not in prompts.sets "
                              f"({', '.join(sorted(sets))}); add it under prompts.sets or remove it")


def check_intrinsic_dimension(config: dict) -> None:
    """``intrinsic_dimension``: its prompt set is a corpus set, and a subsample can reach ``min_points``.

    Raises:
        ConfigError: naming the key, the value and what is valid."""
    idc = config["intrinsic_dimension"]
    ids = idc["prompt_set"]
    sets = config["prompts"]["sets"]
    if ids not in sets or sets[ids]["kind"] != "corpus":
        raise ConfigError(f"intrinsic_dimension.prompt_set is {ids!r}; it must name a prompt set of kind "
                          "corpus in prompts.sets")
    if idc["subsample_size"] < idc["min_points"]:  # every subsample would be rejected by the estimator
        raise ConfigError(f"intrinsic_dimension.subsample_size = {idc['subsample_size']} is smaller than "
                          f"intrinsic_dimension.min_points = {idc['min_points']}; valid: subsample_size >= "
                          f"{idc['min_points']} (or lower min_points)")


def check_curvature(config: dict) -> None:
    """``curvature``: sizes a local PCA accepts, and its ID estimator among ``intrinsic_dimension.estimators``.

    Raises:
        ConfigError: naming the key, the value and what is valid."""
    cv = config["curvature"]
    if cv["n_points"] < cv["min_points"]:
        raise ConfigError(f"curvature.n_points = {cv['n_points']} is smaller than curvature.min_points = "
                          f"{cv['min_points']}; valid: n_points >= {cv['min_points']}")
    if cv["k"] >= cv["n_points"]:
        raise ConfigError(f"curvature.k = {cv['k']} nearest neighbours needs more points than "
                          f"curvature.n_points = {cv['n_points']}; valid: k < {cv['n_points']}")
    est = cv["id_estimator"]
    alias = {"mle": "mle_mg"}  # = llmgeom.measures.intrinsic_dimension.ESTIMATOR_ALIASES (skdim not imported at DAG time)
    if alias.get(est, est) not in {alias.get(e, e) for e in config["intrinsic_dimension"]["estimators"]}:
        raise ConfigError(f"curvature.id_estimator is {est!r} but intrinsic_dimension.estimators is "
                          f"{config['intrinsic_dimension']['estimators']}; add it there or change it")


def check_margins(config: dict) -> None:
    """``margins``: its prompt set is a corpus set and ``fit_eps_max`` lies in (eps_min, eps_max] (``fit_eta_max``, in
    (0, 1], is checked by the schema).

    Raises:
        ConfigError: naming the key, the value and what is valid."""
    _prompt_set_named(config, "margins.prompt_set", config["margins"]["prompt_set"], corpus=True)
    mg = config["margins"]
    if not (mg["eps_min"] < mg["fit_eps_max"] <= mg["eps_max"]):
        raise ConfigError(f"margins.fit_eps_max={mg['fit_eps_max']} must lie in (eps_min={mg['eps_min']}, "
                          f"eps_max={mg['eps_max']}]")


def check_fisher(config: dict) -> None:
    """``fisher.prompt_set`` is a corpus set.

    Raises:
        ConfigError: naming the key and the value."""
    _prompt_set_named(config, "fisher.prompt_set", config["fisher"]["prompt_set"], corpus=True)


def check_domain_restriction(config: dict) -> None:
    """``domain_restriction``: the mixed and restricted sets are defined sets that are not corpus sets, there is a
    restricted set, and the summary set is one of them (``derived.resolve_domain_sets``).

    Raises:
        ConfigError: naming the key, the value and what is valid."""
    r = resolve_domain_sets(config)
    for key, names in (("domain_restriction.mixed_set", [r["mixed"]]),
                       ("domain_restriction.restricted_sets", r["restricted"])):
        for s in names:
            _prompt_set_named(config, key, s, corpus=False)
    if not r["restricted"]:
        raise ConfigError("domain_restriction: no restricted prompt set (define a set of kind domain or code, "
                          "or list them in domain_restriction.restricted_sets)")
    if r["summary"] not in r["restricted"]:
        raise ConfigError(f"domain_restriction.summary_set is {r['summary']!r}; it must be one of the restricted "
                          f"sets {r['restricted']}")


def check_attention_focusing(config: dict) -> None:
    """``attention_focusing.prompt_set`` is a defined set that is not a corpus set.

    Raises:
        ConfigError: naming the key and the value."""
    _prompt_set_named(config, "attention_focusing.prompt_set", config["attention_focusing"]["prompt_set"],
                      corpus=False)


def check_gpu_config(config: dict) -> None:
    """``gpus`` > 1 needs ``device_map: auto`` (else the model would use one GPU and the others sit idle).

    Raises:
        ConfigError: naming the model, the value and the fix.
    """
    for name, spec in sorted(config["models"].items()):
        if spec["gpus"] > 1 and spec.get("device_map") != "auto":
            raise ConfigError(f"models.{name}.gpus = {spec['gpus']} needs models.{name}.device_map = auto "
                              "(without it the model runs on one GPU); valid: gpus: 1, or add device_map: auto")


#: Config keys that name layers (resolved by llmgeom.core.layers.select_layers against each model's layers).
LAYER_KEYS = ("value_manifold.layers", "domain_restriction.layers", "sula.layers", "interventions.layers",
              "interventions.multi_layers")


def check_models(config: dict, root=".", dry_run: bool = False) -> dict:
    """``models``, before any job starts: GPUs and device map (:func:`check_gpu_config`), cheap source checks, token
    budgets against each model's context and layer indices against each model's number of layers.

    Context and number of layers are read without weights (``llmgeom.models.sources.model_facts``): from
    the prepared manifest ``<root>/resources/models/<model>/manifest.json`` when present, else from the
    source's ``config.json`` or GGUF header. An ``hf_hub`` model not yet in the local cache is skipped here
    (rule ``prepare_model`` reports it with the download command), unless ``HF_HUB_OFFLINE=1`` (then it
    cannot be fetched: refused, except in a ``dry_run``). A ``config.json`` whose model type cannot be read (encoder, encoder-decoder,
    a layer that bypasses the attention interface, ...; ``llmgeom.models.families.refusal``) is refused
    here, naming the model, its model_type and why.

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

    check_gpu_config(config)
    budgets = {s: v["token_budget"] for s, v in prompt_set_params(config).items()}
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
            spec_l = config[sec].get(sub)
            if spec_l is None or spec_l == []:
                continue
            try:
                select_layers(spec_l, n_layers, key=key)
            except ValueError as e:
                layer_problems.append(f"{key} = {show_value(spec_l)}: {str(e).split(': ', 1)[1]} (model {name!r}, "
                                      f"{n_layers} layers read from {where})")
    if problems:
        raise ConfigError("token budget larger than a model's context:\n  - " + "\n  - ".join(problems))
    if layer_problems:
        raise ConfigError("layer index outside a model's layers:\n  - " + "\n  - ".join(layer_problems))
    return contexts


def cache_dir() -> Path:
    """Where llmgeom caches what it derives from installed data at DAG time: ``$LLMGEOM_CACHE_DIR``, else the
    user's cache directory (XDG: ``$XDG_CACHE_HOME/llmgeom``, default ``~/.cache/llmgeom``). Outside the working
    directory, so a config check (also a failing one) changes nothing in the study's folder."""
    import os

    if os.environ.get("LLMGEOM_CACHE_DIR"):
        return Path(os.environ["LLMGEOM_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmgeom"


def wiki_pool(cache=None) -> dict:
    """``llmgeom.prompts.sources.wiki_topic_pool()`` of the installed summaries file, cached in ``cache``
    (default ``cache_dir() / "wiki_topic_pool.json"``) keyed by the file's path, size and mtime (reading and
    counting the ~10k summaries takes ~0.2 s; the cache ~1 ms). An unwritable cache is skipped.

    Raises:
        llmgeom.prompts.io.PromptDataError: the Wikipedia package is not installed (names the fix).
    """
    import json

    from llmgeom.prompts.sources import wiki_summaries_path

    src = wiki_summaries_path()
    st = src.stat()
    key = f"{src}:{st.st_size}:{st.st_mtime_ns}"
    cache = Path(cache) if cache is not None else cache_dir() / "wiki_topic_pool.json"
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


#: Tokens a word of English prose takes at most on average in a reference tokenizer (BPE tokenizers take about 1.3):
#: the corpus pre-check's bound on the passages a pool of words gives (an upper bound, so it never refuses a set
#: that can be built; ``build_prompts`` counts them exactly).
CORPUS_TOKENS_PER_WORD = 4


def check_prompt_sources(config: dict, root=".") -> None:
    """Before any job starts: the data each prompt set is built from exists and is large enough, without
    building it (``build_prompts`` would otherwise fail inside its job after Snakemake removed the
    previous prompt file).

    Checks per set of ``prompts.sets``: a corpus ``path`` exists (relative to ``root``, the working
    directory); Wikipedia ``topics`` exist (the same matching as ``build_prompt_set``: exact, or
    case-insensitive with ``_``/``-`` as spaces); ``n`` is at most the pool of its topics: the number
    of summaries (mixed, domain) or ``words // (token_budget // CORPUS_TOKENS_PER_WORD)`` passages (corpus), an
    upper bound (the exact count needs the reference tokenizer, which may not be prepared yet: prompts that do not
    end at a clause boundary, or passages of fewer words, are found only when the set is built).

    Raises:
        ConfigError: naming the key, the value and what is valid.
        llmgeom.prompts.io.PromptDataError: the Wikipedia package is missing (names the fix).
    """
    from pathlib import Path

    from llmgeom.prompts.io import PromptDataError
    from llmgeom.prompts.sources import resolve_topics

    budgets = {s: v["token_budget"] for s, v in prompt_set_params(config).items()}
    problems, pool = [], None
    for s, spec in config["prompts"]["sets"].items():
        key = f"prompts.sets.{s}"
        if spec.get("path") is not None:
            p = Path(spec["path"])
            full = p if p.is_absolute() else Path(root) / p
            if spec["kind"] != "corpus":
                problems.append(f"{key}.path = {show_value(spec['path'])} is only valid for kind corpus (this set is "
                                f"{spec['kind']!r}); valid: remove 'path' or set kind: corpus")
            elif not full.is_file():
                problems.append(f"{key}.path = {show_value(spec['path'])}: no such file ({full.resolve()}); valid: an "
                                "existing UTF-8 text file (e.g. WikiText-103 wiki.valid.tokens), or no 'path' "
                                "(the Wikipedia summaries)")
            continue
        if spec["kind"] == "code":
            continue
        if pool is None:
            pool = wiki_pool()
        topics = list(pool)
        if spec.get("topics"):
            try:
                topics = resolve_topics(spec["topics"], pool)
            except PromptDataError:
                bad = [t for t in spec["topics"] if _unresolved(t, pool, resolve_topics)]
                problems.append(f"{key}.topics = {show_value(spec['topics'])}: {', '.join(map(repr, bad))} "
                                f"{'is not a topic' if len(bad) == 1 else 'are not topics'} of the Wikipedia "
                                f"summaries; valid topics: {', '.join(pool)}")
                continue
        n = spec["n"]
        if spec["kind"] == "corpus":
            min_words = max(1, budgets[s] // CORPUS_TOKENS_PER_WORD)
            cap = sum(pool[t]["words"] for t in topics) // min_words
            what = (f"{cap} passages of at least {min_words} words (token_budget {budgets[s]} at most "
                    f"{CORPUS_TOKENS_PER_WORD} tokens a word) from the "
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


_DEVICE = r"auto|cpu|mps|cuda(:[0-9]+)?"


def check_device(config: dict, *, here: bool = True) -> None:
    """``extract``: ``extract.device`` (used by the GPU rules extract, extract_sula, intervene) names a device that exists.

    The form is always checked; with ``here`` (the jobs run on this machine: a local run) a CUDA device is
    also looked up with ``torch.cuda.device_count()`` (torch imported only then, ~1-2 s). On a cluster
    the DAG is built on a login node without GPUs, so the workflow passes ``here=False`` there.

    Raises:
        ConfigError: naming the key, the value and the devices that exist.
    """
    import re

    dev = config["extract"]["device"]
    if not re.fullmatch(_DEVICE, str(dev)):
        raise ConfigError(f"extract.device = {show_value(dev)} is not a device; valid: \"auto\" (CUDA when present, "
                          "else CPU), \"cpu\", \"cuda\", \"cuda:<index>\" or \"mps\"")
    if not here or not dev.startswith("cuda"):
        return
    import torch

    n = torch.cuda.device_count()
    idx = int(dev.split(":")[1]) if ":" in dev else 0
    if idx >= n:
        have = ", ".join(["cpu"] + [f"cuda:{i}" for i in range(n)])
        raise ConfigError(f"extract.device = {show_value(dev)}, but this machine has "
                          f"{'no CUDA device' if n == 0 else f'{n} CUDA device' + ('s' if n > 1 else '')}; "
                          f"devices that exist: {have}; valid: one of them or \"auto\" (CUDA when present, "
                          "else CPU)")


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


def _wt_cut_range(spec: dict) -> tuple[int, int]:
    return (0, spec["n_pairs"] - 1) if spec["kind"] == "bijection" else (1, spec["length"] - 1)


def check_wind_tunnel(config: dict) -> dict:
    """``wind_tunnel``: its checks before any job runs (the last of :data:`SECTION_CHECKS`).

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
    wt = config["wind_tunnel"]
    tasks = {}
    if wt.get("tasks"):
        from llmgeom.prompts.wind_tunnel import check_task

        for name, spec in wt["tasks"].items():
            try:
                tasks[name] = check_task(name, spec)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    llm = set(config["models"])
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
            if a["family"] == "gpt2":
                raise ConfigError(f"{key}.arch.n_kv_heads: GPT-2 has no grouped-query attention; drop it or use "
                                  "family: llama")
            if a["n_heads"] % a["n_kv_heads"]:
                raise ConfigError(f"{key}.arch.n_kv_heads = {a['n_kv_heads']}: must divide arch.n_heads = "
                                  f"{a['n_heads']}")
        steps = spec["training"]["steps"]
        bad = [k for k in spec["checkpoints"] if k > steps]
        if bad:
            raise ConfigError(f"{key}.checkpoints = {spec['checkpoints']}: step {bad[0]} is beyond "
                              f"training.steps = {steps}; valid: 1..{steps}")
        for k in spec["checkpoints"]:
            ck = f"{name}-step{k}"
            if ck in entries or ck in llm:
                raise ConfigError(f"{key}.checkpoints: the checkpoint entry {ck!r} collides with another model "
                                  "name; rename one of them")
            entries.add(ck)
    cuts = wt["prompts"]["cut_positions"]
    if cuts != "all":
        for tname in sorted({m["task"] for m in models.values()}):
            lo, hi = _wt_cut_range(tasks[tname])
            bad = [t for t in cuts if not lo <= t <= hi]
            if bad:
                raise ConfigError(f"wind_tunnel.prompts.cut_positions = {cuts}: {bad[0]} is not an answer position "
                                  f"of task {tname!r}; valid: {lo}..{hi}")
    return tasks


#: The check of each config section that has one, in the schema's order of the sections (:func:`check_config`
#: runs them in turn; tests/unit/pipeline/test_config_errors.py checks the order against the schema).
SECTION_CHECKS = (
    ("models", check_models),
    ("prompts", check_prompts),
    ("extract", check_device),
    ("value_manifold", check_value_manifold),
    ("intrinsic_dimension", check_intrinsic_dimension),
    ("curvature", check_curvature),
    ("margins", check_margins),
    ("fisher", check_fisher),
    ("domain_restriction", check_domain_restriction),
    ("attention_focusing", check_attention_focusing),
    ("wind_tunnel", check_wind_tunnel),
)
