"""The schema is the one home of the config's defaults and documentation (issue 17 points 3 and 5, issue 30 point 1).

- config/README.md is generated from the schema's descriptions and must equal the generated text;
- every key of a section that names its functions (``x-function``) reaches one of them as a keyword argument
  without a default of its own, or is read by the rules (``x-workflow``);
- no package function repeats a schema default (a notebook user takes ``llmgeom.defaults(section)``, the
  workflow passes the config), so the two cannot drift.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from llmgeom.pipeline.config_reference import config_markdown
from llmgeom.pipeline.schema import (SCHEMA_PATH, ConfigError, apply_defaults, read_schema, section_functions,
                                     workflow_keys)

REPO = Path(__file__).resolve().parents[3]
SCHEMA = read_schema(SCHEMA_PATH)
PACKAGE = REPO / "src" / "llmgeom"

def schema_node(dotted: str) -> dict:
    """The schema node of a dotted key (``<name>`` steps into a per-name map)."""
    node = SCHEMA
    for part in dotted.split("."):
        node = node["additionalProperties"] if part == "<name>" else node["properties"][part]
    return node


def _norm(v):
    if isinstance(v, dict):
        return list(v)  # a mapping default (EDIT_NAMES) stands for its keys
    if isinstance(v, (tuple, list)):
        return [_norm(x) for x in v]
    return v


def _package_defaults():
    """(place, name, literal default) of every default in the package (llmgeom.pipeline included) and the workflow's
    scripts: a function's or method's parameter default (place ``module:function``; an expression default: its
    source text) and the fallback of a ``.get("key", default)`` call (place ``module:line``, ``get`` marks it)."""
    scripts = sorted((REPO / "workflow" / "scripts").glob("*.py"))
    for f in sorted(PACKAGE.rglob("*.py")) + scripts:
        mod = (f"workflow.scripts.{f.stem}" if f in scripts
               else ".".join(f.relative_to(PACKAGE).with_suffix("").parts))
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef):
                a = node.args
                pos = a.posonlyargs + a.args
                pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
                for x, d in pairs:
                    if d is None:
                        continue
                    try:
                        value = ast.literal_eval(d)
                    except ValueError:
                        value = ast.unparse(d)
                    yield f"{mod}:{node.name}", x.arg, value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                try:
                    value = ast.literal_eval(node.args[1])
                except ValueError:
                    continue  # a computed fallback (another key's value), not a literal copy
                yield f"{mod}:{node.lineno} get", node.args[0].value, value


SECTIONS = section_functions(SCHEMA)


def _signature(dotted: str) -> inspect.Signature:
    mod, name = dotted.split(":")
    return inspect.signature(getattr(importlib.import_module(mod), name))


def test_the_analysis_sections_name_their_functions():
    assert {"value_manifold", "intrinsic_dimension", "curvature", "margins", "fisher", "rate_distortion", "decoding",
            "domain_restriction", "key_orthogonality", "sula", "interventions", "extract", "wind_tunnel",
            "wind_tunnel.prompts", "wind_tunnel.models.<name>.training"} <= set(SECTIONS)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_schema_key_reaches_its_function_without_a_second_default(section):
    """The schema section is the signature (issue 30 point 1): each key that the rules do not read themselves
    (``x-workflow``) is a keyword argument of one of the section's functions, without a default of its own
    (the schema's is the only one); each ``x-workflow`` key is read by a rule file or the workflow's support
    (``llmgeom.pipeline``, e.g. ``derived.resolve_domain_sets``)."""
    node = schema_node(section)
    sigs = {f: _signature(f) for f in SECTIONS[section]}
    workflow_only = workflow_keys(node)
    for key in node["properties"]:
        takers = [f for f, sig in sigs.items() if key in sig.parameters]
        if key in workflow_only:
            assert not takers, f"{section}.{key} is marked x-workflow but {takers} take it"
            rules = "".join(f.read_text() for f in [*(REPO / "workflow").rglob("*.smk"),
                                                     *(PACKAGE / "pipeline").glob("*.py")])
            assert f'"{key}"' in rules, f"{section}.{key} is marked x-workflow but no rule file (or llmgeom.pipeline) reads it"
            continue
        assert takers, (f"{section}.{key} reaches none of {SECTIONS[section]}: add it to a function's signature "
                        "(keyword, no default) or mark it x-workflow with what the rules use it for")
        for f in takers:
            param = sigs[f].parameters[key]
            assert param.default is inspect.Parameter.empty, (
                f"{f}({key}={param.default!r}): the schema holds {section}.{key}'s default; drop it from the "
                "signature (notebooks: llmgeom.defaults(section))")


#: (module, name) whose default is not a copy of the schema key of the same name, with the reason.
NOT_COPIES = {
    ("pipeline.jobs", "threads"): "a job's CPU threads, not fisher.threads / decoding.threads",
    ("pipeline.model_server", "threads"): "a served task's CPU threads, not fisher.threads / decoding.threads",
    # model specs reach these from tests and notebooks unfilled: absent dtype reads as auto there (the check
    # refuses a missing one otherwise); to move to the schema with the sources module's own change
    ("models.sources", "dtype"): "check_source / prepare_model on an unfilled model spec",
}


def test_no_package_function_repeats_a_schema_default():
    """No literal default in the package (llmgeom.pipeline and the workflow's scripts included) equals the schema
    default of a key of the same name (a second copy that could drift), neither a parameter default nor the
    fallback of a ``.get(key, literal)`` (the config reaches the code with its defaults filled in: such a fallback
    never fires): the caller passes the config's value, a notebook takes ``llmgeom.defaults(section)``. None
    (meaning "not given") and the seeds of function signatures (every seed of the schema and of the package is 0:
    test_seeds_default_to_zero) are not copies; a ``.get("seed", 0)`` is."""
    names = {}
    for dotted, node in _rows(SCHEMA, ""):
        if isinstance(node, dict) and "default" in node and not isinstance(node["default"], dict):
            names.setdefault(dotted.rsplit(".", 1)[-1], []).append((dotted, _norm(node["default"])))
    copies = []
    for func, param, default in _package_defaults():
        if (param == "seed" and not func.endswith(" get")) or default is None or param not in names:
            continue
        if (func.split(":")[0], param) in NOT_COPIES:
            continue
        copies += [f"{func}({param}={default!r}) = {key}" for key, d in names[param] if _norm(default) == d]
    assert not copies, f"package defaults that copy the schema's: {copies}"


def test_defaults_are_the_schema_defaults_as_keyword_arguments():
    import llmgeom
    from llmgeom.analyses.margins import margin_tables

    d = llmgeom.defaults("margins")
    assert d["n_boot"] == schema_node("margins.n_boot")["default"] == 200 and "prompt_set" not in d
    assert set(d) == set(schema_node("margins")["properties"]) - {"prompt_set"}
    assert set(d) <= set(inspect.signature(margin_tables).parameters)
    assert set(llmgeom.defaults("intrinsic_dimension", "llmgeom.analyses.intrinsic_dimension:id_profile_table")) \
        == {"shape_tol", "profile_layers", "peak_depth_tol", "ci"}
    assert llmgeom.defaults("wind_tunnel.models.<name>.training")["steps"] == 3000
    d["hard_core_thresholds"].append(9)  # copies: the schema is not changed through them
    assert schema_node("margins.hard_core_thresholds")["default"] == [0.05, 0.1]
    with pytest.raises(KeyError, match="no config section 'margin'"):
        llmgeom.defaults("margin")
    # torch-free (a notebook's first call; the DAG reads the same module)
    r = subprocess.run([sys.executable, "-c", "import sys, llmgeom; llmgeom.defaults('margins'); "
                        "print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


def test_call_with_config_passes_the_keys_a_function_takes_and_derived_values_win():
    from llmgeom.pipeline.schema import call_with_config

    def f(x, *, a, b):
        return x, a, b

    assert call_with_config(f, {"a": 1, "b": 2, "prompt_set": "corpus"}, 0, b=3) == (0, 1, 3)
    with pytest.raises(TypeError, match="'b'"):
        call_with_config(f, {"a": 1}, 0)


def test_one_reading_of_a_function_s_parameters_from_its_source_or_its_signature():
    """``parameter_names`` reads ``"module:function"`` from the source (DAG time, no import) and a callable from its
    signature; both give the same names for every function the schema names (``*args`` / ``**kwargs`` left out)."""
    from llmgeom.pipeline.schema import _resolve, parameter_names

    for funcs in section_functions(SCHEMA).values():
        for f in funcs:
            assert parameter_names(f) == parameter_names(_resolve(f)), f

    def g(a, /, b, *rest, c, **kw):
        return a

    assert parameter_names(g) == {"a", "b", "c"}
    with pytest.raises(KeyError, match="no function nope"):
        parameter_names("llmgeom.analyses.margins:nope")


def test_seeds_default_to_zero():
    seeds = [k for k, _ in _rows(SCHEMA, "") if k.endswith(".seed")]
    assert len(seeds) >= 10 and all(schema_node(k).get("default", 0) == 0 for k in seeds)
    bad = [f"{func}(seed={d!r})" for func, param, d in _package_defaults() if param == "seed" and d not in (0, None)]
    assert not bad, bad


def _rows(schema, path):
    for k, sub in (schema.get("properties") or {}).items():
        d = f"{path}.{k}" if path else k
        yield d, sub
        yield from _rows(sub, d)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _rows(schema["additionalProperties"], f"{path}.<name>")


def test_config_readme_is_generated_from_the_schema():
    committed = (REPO / "config" / "README.md").read_text()
    assert committed == config_markdown(SCHEMA), ("config/README.md differs from the schema; regenerate it: "
                                                  "python -m llmgeom.pipeline.config_reference --markdown > config/README.md")
    # every key, its default and its description are in it
    assert "| `intrinsic_dimension.min_points` | an integer >= 10 | `50` |" in committed
    assert "| `models.<name>.source` (required) |" in committed
    r = subprocess.run([sys.executable, "-m", "llmgeom.pipeline.config_reference", "--markdown"], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 0 and r.stdout == committed, r.stderr


def test_a_key_without_description_is_refused():
    import copy

    schema = copy.deepcopy(SCHEMA)
    del schema["properties"]["fisher"]["properties"]["batch"]["description"]
    with pytest.raises(ConfigError, match=r"without a description: fisher\.batch;"):
        config_markdown(schema)


def test_apply_defaults_fills_per_name_maps_and_keeps_given_values():
    cfg = {"models": {"a": {"source": "hf_hub", "repo_id": "x/y", "batch_size": 2},
                      "b": {"source": "hf_hub", "repo_id": "x/z", "params_b": 7.0, "dtype": "bfloat16"}},
           "prompts": {"sets": {"mixed": {"kind": "mixed", "n": 3}}},
           "wind_tunnel": {"tasks": {"t": {"kind": "bijection", "V": 4, "n_pairs": 3}},
                           "models": {"w": {"task": "t", "arch": {"n_layers": 1, "d_model": 8, "n_heads": 2},
                                            "training": {"steps": 7}}}}}
    apply_defaults(cfg, SCHEMA)
    a, b, w = cfg["models"]["a"], cfg["models"]["b"], cfg["wind_tunnel"]["models"]["w"]
    assert a["batch_size"] == 2 and a["dtype"] == "auto" and a["mem_mb"] == 8000 and a["revision"] == "main"
    assert b["mem_mb"] == 20700 and b["batch_size"] == 8  # from params_b (cluster.size_resources), not 8000
    expected = {k: v["default"] for k, v in schema_node("wind_tunnel.models.<name>.training")["properties"].items()}
    assert w["training"] == dict(expected, steps=7) and expected["steps"] == 3000
    assert w["arch"]["family"] == "llama" and w["checkpoints"] == [] and "n_kv_heads" not in w["arch"]
    assert cfg["value_manifold"]["n_boot"] == 100 and cfg["wind_tunnel"]["prompts"]["cut_positions"] == "all"
    w["checkpoints"].append(3)  # defaults are copies: the schema is not changed through the config
    assert schema_node("wind_tunnel.models.<name>.checkpoints")["default"] == []


def _repeated_defaults(node, schema: dict, path: str = "") -> list[str]:
    """Dotted keys of ``node`` (a config as written) whose value equals the schema's default at that key (per-name
    maps: ``additionalProperties``). A model entry with ``params_b`` derives ``mem_mb`` / ``runtime`` from its size
    (``cluster.apply_size_defaults``), so a value there is not the static default's repeat."""
    out = []
    if not isinstance(node, dict) or not isinstance(schema, dict):
        return out
    props = schema.get("properties") or {}
    for key, value in node.items():
        sub = props.get(key, schema.get("additionalProperties"))
        if not isinstance(sub, dict):
            continue
        sized = key in ("mem_mb", "runtime") and node.get("params_b")
        if key in props and "default" in sub and value == sub["default"] and not sized:
            out.append(f"{path}{key} = {value!r}")
        else:
            out += _repeated_defaults(value, sub, f"{path}{key}.")
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "config").glob("*.yaml")))
def test_every_study_config_holds_only_what_differs_from_the_schema(name):
    """config/config.yaml and every study config (`--configfile config/<name>.yaml` replaces it: each stands alone)
    hold the models, the prompt sets and the real overrides; a value equal to its schema default is a second copy
    of it (the schema is the one home of the defaults; config/README.md lists them)."""
    import yaml

    cfg = yaml.safe_load((REPO / "config" / name).read_text())
    repeats = _repeated_defaults(cfg, SCHEMA)
    assert not repeats, f"config/{name} repeats these schema defaults (delete them): {repeats}"
    # the check sees a repeat where there is one, and not a size-derived resource
    assert _repeated_defaults({"extract": {"top_k": 10}, "models": {"m": {"dtype": "auto", "params_b": 7,
                                                                            "mem_mb": 8000}}}, SCHEMA) \
        == ["extract.top_k = 10", "models.m.dtype = 'auto'"]
