"""The config schema: its error messages in plain words, its defaults, and the schema as the signature of
the analyses.

Every default lives only in src/llmgeom/pipeline/config.schema.yaml. A section of the schema that feeds package
functions names them (``x-function``: ``module:function`` in the package); each of its keys is a keyword
argument without default of one of those functions, unless the key is marked ``x-workflow`` (read by the
rules themselves: which prompt set a rule reads, a job's threads). A rule passes its whole section
(``params: cfg=config["margins"]``), the job script calls :func:`call_with_config`, and a notebook user gets
the same values from :func:`defaults` (``llmgeom.defaults("margins")``). ``tests/unit/pipeline/test_config_schema.py``
checks that every key reaches its function and that no package function repeats a schema default.

Pure Python (yaml and the standard library at call time): imported while Snakemake builds the DAG.
"""

from __future__ import annotations

import copy
import functools
import inspect
from pathlib import Path

#: The workflow's config schema, package data beside this module (src/llmgeom/pipeline/config.schema.yaml), so that
#: every copy or install of the package has it. Found this one way by the package, by the rules (common.smk) and by
#: the tests.
SCHEMA_PATH = Path(__file__).resolve().with_name("config.schema.yaml")


class ConfigError(ValueError):
    """A config value that cannot work (schema or cross-key); the message names key, value and fix."""


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
               "array": "a list", "object": "a mapping (key: value)", "null": "null"}


def show_value(value, limit: int = 70) -> str:
    """A config value as JSON, cut to ``limit`` characters (error messages name the value the user gave)."""
    import json

    try:
        s = json.dumps(value, default=str, sort_keys=True)
    except (TypeError, ValueError):
        s = repr(value)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def describe_schema(s: dict) -> str:
    """Plain-English description of what a JSON-schema node accepts ("an integer >= 1", "one of a, b")."""
    if "const" in s:
        return show_value(s["const"])
    if "enum" in s:
        return "one of " + ", ".join(show_value(v) for v in s["enum"])
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
        return f"{path} = {show_value(inst)} is out of range; valid: {describe_schema(s)}{hint}"
    if v == "type":
        return f"{path} = {show_value(inst)} has the wrong type; valid: {describe_schema(s)}{hint}"
    if v in ("enum", "const", "oneOf", "anyOf"):
        return f"{path} = {show_value(inst)} is not allowed; valid: {describe_schema(s)}{hint}"
    if v == "minProperties":
        what = "at least one model, e.g. {my-model: {source: hf_hub, repo_id: EleutherAI/pythia-160m}}" \
            if path == "models" else f"at least {err.validator_value} entr{'ies' if err.validator_value > 1 else 'y'}"
        return f"{path} = {show_value(inst)} is empty; valid: a mapping with {what}"
    if v == "minItems":
        return f"{path} = {show_value(inst)} is empty; valid: {describe_schema(s)}{hint}"
    return f"{path} = {show_value(inst)}: {err.message}; valid: {describe_schema(s)}{hint}"


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
                          "defaults and valid values: src/llmgeom/pipeline/config.schema.yaml):\n  - "
                          + "\n  - ".join(msgs))


def read_schema(path=None) -> dict:
    """The config schema as a dict (``path`` default: :data:`SCHEMA_PATH`).

    Raises:
        ConfigError: the schema file is not there (a broken install).
    """
    path = Path(path or SCHEMA_PATH)
    if not path.is_file():
        raise ConfigError(f"config schema not found at {path}: it is package data of llmgeom.pipeline; reinstall the "
                          "package (bash install.sh)")
    st = path.stat()
    return copy.deepcopy(_parsed_schema(str(path.resolve()), st.st_mtime_ns, st.st_size))  # callers may mutate it


@functools.lru_cache(maxsize=4)
def _parsed_schema(path: str, mtime_ns: int, size: int) -> dict:
    """The parsed schema file, once per (path, modification time, size): an edited schema is read again."""
    import yaml

    with open(path) as fh:
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


def section_schema(section: str, schema: dict | None = None) -> dict:
    """The schema node of a section: a top-level key (``"margins"``) or a dotted path, ``<name>`` stepping into
    a per-name map (``"wind_tunnel.models.<name>.training"``).

    Raises:
        KeyError: no such section (names the valid ones).
    """
    node = schema if schema is not None else read_schema()
    for part in section.split("."):
        nxt = node.get("additionalProperties") if part == "<name>" else (node.get("properties") or {}).get(part)
        if not isinstance(nxt, dict):
            raise KeyError(f"no config section {section!r}; sections: {', '.join(node.get('properties') or ())}")
        node = nxt
    return node


def workflow_keys(node: dict) -> set[str]:
    """The keys of a section node that the rules read themselves (``x-workflow``), not passed to a function."""
    return {k for k, sub in (node.get("properties") or {}).items() if isinstance(sub, dict) and sub.get("x-workflow")}


def section_config(config: dict, section: str, schema: dict, function: str | None = None) -> dict:
    """What a rule passes to its job for a section (``params: cfg=...``): the section's values (dotted path
    without ``<name>``, e.g. ``"wind_tunnel.prompts"``) less the keys the rules read themselves (``x-workflow``),
    so that changing one of those (which prompt sets, threads) does not by itself rerun the job; with
    ``function`` (``"module:function"``, one of the section's ``x-function``), only the keys it takes, for a
    section read by two rules (``sula``: the prompt builder and the tables; ``interventions``: the GPU
    experiment and its summary), so that a key of one never reruns the other. The signature is read from the
    source (no import: this runs while the DAG is built).

    Raises:
        KeyError: no such section in the schema or the config, or ``function`` is not in its source file.
    """
    node, values = section_schema(section, schema), config
    for part in section.split("."):
        values = values[part]
    skip = workflow_keys(node)
    out = {k: v for k, v in values.items() if k not in skip}
    if function is not None:
        takes = parameter_names(function)
        out = {k: v for k, v in out.items() if k in takes}
    return out


def parameter_names(function) -> set[str]:
    """The names of the parameters a config section can fill (positional-or-keyword and keyword-only; not
    ``*args`` / ``**kwargs``) of a function: for ``"llmgeom.<module>:<function>"`` read from its source file with
    :mod:`ast` (no import of the module, so no torch while the DAG is built), for a callable from its signature.
    The one reading of "which keys does this function take" for :func:`section_config`, :func:`defaults` and
    :func:`call_with_config`.

    Raises:
        KeyError: no such module or top-level function.
    """
    if not isinstance(function, str):
        kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        return {n for n, p in inspect.signature(function).parameters.items() if p.kind not in kinds}
    import ast

    from llmgeom.pipeline.code_tracking import module_file

    mod, name = function.split(":")
    path = module_file(mod.removeprefix("llmgeom."))
    if path is None:
        raise KeyError(f"no module {mod} (x-function {function})")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
    raise KeyError(f"no function {name} in {path} (x-function {function})")


def section_functions(schema: dict | None = None) -> dict[str, list[str]]:
    """Section path -> the package functions its keys feed (``x-function``, as ``"module:function"``), for every
    schema node that names some (dotted paths, ``<name>`` for a per-name map)."""
    out: dict[str, list[str]] = {}

    def walk(node, path):
        if not isinstance(node, dict):
            return
        if node.get("x-function"):
            f = node["x-function"]
            out[path] = [f] if isinstance(f, str) else list(f)
        for k, sub in (node.get("properties") or {}).items():
            walk(sub, f"{path}.{k}" if path else k)
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}.<name>")

    walk(schema if schema is not None else read_schema(), "")
    return out


def _resolve(function):
    if isinstance(function, str):
        import importlib

        mod, name = function.split(":")
        return getattr(importlib.import_module(mod), name)
    return function


def defaults(section: str, function=None) -> dict:
    """The schema's defaults of one section as keyword arguments of its function(s): every key with a default,
    except the ones the rules read themselves (``x-workflow``); with ``function`` (the callable or
    ``"module:function"``), only the keys that function takes. What the workflow passes when the config leaves
    the section alone; a notebook uses it as ``margin_tables(h5, model="m", **llmgeom.defaults("margins"))``.

    Returns:
        {key: default} (copies: changing them does not change the schema).

    Raises:
        KeyError: no such section.
    """
    node = section_schema(section)
    skip = workflow_keys(node)
    out = {k: copy.deepcopy(sub["default"]) for k, sub in (node.get("properties") or {}).items()
           if isinstance(sub, dict) and "default" in sub and k not in skip}
    if function is not None:
        takes = parameter_names(function)
        out = {k: v for k, v in out.items() if k in takes}
    return out


def call_with_config(function, cfg: dict, /, *args, **derived):
    """``function(*args, **kwargs)`` with kwargs = the keys of the config section ``cfg`` that ``function`` takes,
    then ``derived`` (values a rule derives, e.g. a null model's bootstrap count; they override ``cfg``). How a
    job script calls its analysis with the section its rule passed (``params: cfg=config[section]``): a key that
    the function does not take is left for another function of the section or for the rules
    (``tests/unit/pipeline/test_config_schema.py`` checks that each key reaches one).

    Raises:
        TypeError: the function needs an argument that neither ``cfg`` nor ``derived`` gives (its name).
    """
    function = _resolve(function)
    takes = parameter_names(function)
    kwargs = {k: v for k, v in cfg.items() if k in takes}
    kwargs.update(derived)
    return function(*args, **kwargs)
