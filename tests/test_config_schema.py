"""The schema is the one home of the config's defaults and documentation (issue 17, points 3 and 5).

- config/README.md is generated from the schema's descriptions and must equal the generated text;
- every package function parameter that mirrors a schema key has the schema's default, so that a notebook
  user calling the function and the workflow reading the config get the same numbers;
- every parameter named like a schema key is classified (mirrors a key, or why it does not), so that a new
  one cannot drift unnoticed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from llmgeom.pipeline.config import ConfigError, apply_defaults, config_markdown, read_schema

REPO = Path(__file__).resolve().parents[1]
SCHEMA = read_schema(REPO / "workflow/schemas/config.schema.yaml")
PACKAGE = REPO / "src" / "llmgeom"

M = "models.<name>"
WT = "wind_tunnel.models.<name>"
# module:function -> {parameter: schema key whose default it must have}
MIRRORS = {
    "analyses.curvature:curvature_table": {"id_estimator": "curvature.id_estimator", "n_points": "curvature.n_points",
                                           "min_points": "curvature.min_points"},
    "analyses.domain_restriction:domain_restriction_tables": {
        k: f"domain_restriction.{k}" for k in ("n_quantiles", "per_quantile", "edges", "n_boot", "ci", "layers")},
    "analyses.decoding:decoding_table": {k: f"decoding.{k}" for k in ("calibration_fraction", "n_margin_bins",
                                                                       "ece_bins", "n_bins", "n_boot")},
    "measures.decoding:position_stats": {"n_bins": "decoding.n_bins"},
    "measures.decoding:fit_margin_temperatures": {"n_margin_bins": "decoding.n_margin_bins"},
    "measures.decoding:compare_schemes": {k: f"decoding.{k}" for k in ("calibration_fraction", "n_margin_bins",
                                                                        "ece_bins", "n_boot")},
    "analyses.rate_distortion:rate_distortion_table": {k: f"rate_distortion.{k}" for k in (
        "n_boot", "agree_tol", "min_fit_points", "r2_min")},
    "measures.rate_distortion:n_grid": {k: f"rate_distortion.{k}" for k in ("n_min", "max_fraction", "n_points")},
    "measures.rate_distortion:distortion_curve": {k: f"rate_distortion.{k}" for k in (
        "n_min", "max_fraction", "n_points", "train_fraction", "max_iter", "init")},
    "measures.rate_distortion:fit_range": {k: f"rate_distortion.{k}" for k in ("min_fit_points", "r2_min")},
    "measures.rate_distortion:rate_distortion_exponent": {k: f"rate_distortion.{k}" for k in (
        "n_boot", "min_fit_points", "r2_min")},
    "analyses.fisher:fisher_tables": {k: f"fisher.{k}" for k in ("n_positions", "max_tokens", "tail_mass", "batch")},
    "analyses.interventions:intervention_summary": {"n_boot": "interventions.n_boot", "ci": "interventions.ci"},
    "analyses.intrinsic_dimension:id_profile_table": {"shape_tol": "intrinsic_dimension.shape_tol",
                                                      "layers": "intrinsic_dimension.profile_layers",
                                                      "peak_depth_tol": "intrinsic_dimension.peak_depth_tol"},
    "analyses.intrinsic_dimension:last_token_id_table": {
        k: f"intrinsic_dimension.{k}" for k in ("estimators", "min_points", "mle_k", "disagreement_factor",
                                                "gride_max_rank", "gride_plateau_tol")},
    "analyses.intrinsic_dimension:intrinsic_dimension_table": {
        k: f"intrinsic_dimension.{k}" for k in ("estimators", "min_points", "mle_k", "disagreement_factor",
                                                "gride_max_rank", "gride_plateau_tol")},
    "measures.intrinsic_dimension:id_estimates": {"mle_k": "intrinsic_dimension.mle_k",
                                                  "gride_max_rank": "intrinsic_dimension.gride_max_rank"},
    "analyses.margins:margin_tables": {
        k: f"margins.{k}" for k in ("threshold", "hard_core_quantile", "hard_core_thresholds", "eps_min", "eps_max",
                                    "n_eps", "fit_eps_max", "min_count", "n_boot", "ci", "hist_bins")},
    "analyses.sula:geometry_table": {"layers": "sula.layers"},
    "analyses.sula:sula_tables": {"layers": "sula.layers"},
    "analyses.value_manifold:value_manifold_table": {"ci": "value_manifold.ci", "layers": "value_manifold.layers"},
    "analyses.wind_tunnel:geometry_table": {"layers": "wind_tunnel.layers"},
    "analyses.wind_tunnel:wind_tunnel_tables": {"layers": "wind_tunnel.layers"},
    "extract.forward:extract_batch": {"top_k": "extract.top_k"},
    "extract.forward:extract_to_hdf5": {"dtype": f"{M}.dtype", "device": "extract.device",
                                        "batch_size": f"{M}.batch_size", "top_k": "extract.top_k",
                                        "sample_per_prompt": "extract.sample_per_prompt",
                                        "device_map": f"{M}.device_map"},
    "prompts.sula:generate_sula": {k: f"sula.{k}" for k in ("ks", "n_per_k", "n_per_k_controls", "alpha",
                                                                     "mask", "conditions")},
    "prompts.sula:build_sula_sets": {"label_pairs": "sula.label_pairs"},
    "interventions.runner:run_interventions": {k: f"interventions.{k}" for k in ("shift_scale", "positions",
                                                                                 "batch_size")},
    "interventions.runner:intervention_experiment": {
        **{k: f"interventions.{k}" for k in ("layers", "multi_layers", "edits", "shift_scale", "positions", "n_per_k",
                                             "batch_size")},
        "dtype": f"{M}.dtype", "device": "extract.device", "device_map": f"{M}.device_map"},
    **{f"measures.bayes:{f}": {"alpha": "sula.alpha"}
       for f in ("bayes_posterior", "h_bayes_bits", "posterior_predictive")},
    "measures.fisher:fisher_metrics": {k: f"fisher.{k}" for k in ("max_tokens", "tail_mass", "batch")},
    **{f"measures.intrinsic_dimension:{f}": {"k": "intrinsic_dimension.mle_k"} for f in ("mle_id", "mle_mg", "mle_lb")},
    "measures.margins:expressibility_gap": {k: f"margins.{k}" for k in ("eps_min", "eps_max", "n_eps", "fit_eps_max",
                                                                         "min_count", "n_boot", "ci")},
    "measures.margins:margin_summary": {"threshold": "margins.threshold",
                                        "hard_core_quantile": "margins.hard_core_quantile"},
    "measures.margins:fraction_below": {"n_boot": "margins.n_boot", "ci": "margins.ci"},
    "measures.pca:value_manifold_stats": {"ci": "value_manifold.ci"},
    "models.loading:resolve_device": {"device": "extract.device"},
    **{f"models.loading:{f}": {"dtype": f"{M}.dtype", "device": "extract.device", "device_map": f"{M}.device_map"}
       for f in ("check_memory", "load_prepared")},
    "weights.key_orthogonality:key_orthogonality_table": {"random_init": "key_orthogonality.random_init"},
    "weights.key_orthogonality:key_orthogonality_from_dir": {"dtype": f"{M}.dtype",
                                                             "random_init": "key_orthogonality.random_init"},
    "wind_tunnel.train:lr_at": {"schedule": f"{WT}.training.schedule", "min_lr_ratio": f"{WT}.training.min_lr_ratio"},
    "wind_tunnel.train:train_wind_tunnel": {"checkpoints": f"{WT}.checkpoints", "threads": f"{WT}.threads",
                                            "n_val": f"{WT}.training.n_val", "schedule": f"{WT}.training.schedule",
                                            "min_lr_ratio": f"{WT}.training.min_lr_ratio"},
}
# parameters named like a schema key that do not mirror one: why
NOT_MIRRORED = {
    **{f"{f}:ci": "95% intervals; the section has no ci key" for f in (
        "analyses.decoding:decoding_table", "measures.decoding:compare_schemes",
        "analyses.rate_distortion:rate_distortion_table", "measures.rate_distortion:rate_distortion_exponent")},
    "measures.decoding:position_stats:batch": "positions per batch of the logit computation (memory, not a result)",
    "measures.decoding:ece:n_bins": "the caller's confidence bins (decoding.ece_bins through compare_schemes)",
    "measures.decoding:fit_margin_temperatures:edges": "explicit margin-bin edges (None: equal-mass bins)",
    "measures.decoding:compare_schemes:edges": "explicit margin-bin edges (None: equal-mass bins)",
    **{f"{f}:n_bins": "calibration bins: sula.calibration_bins / wind_tunnel.calibration_bins, passed by the rule"
       for f in ("analyses.sula:calibration_table", "analyses.sula:sula_tables",
                 "analyses.wind_tunnel:calibration_bins", "analyses.wind_tunnel:wind_tunnel_tables")},
    "measures.margins:margin_histogram:n_bins": "histogram bins (margins.hist_bins through margin_tables)",
    "interventions.edits:edit_hook:positions": "a tensor of positions per batch row (None: every position)",
    "interventions.edits:value_edit_hooks:positions": "a tensor of positions per batch row (None: every position)",
    "interventions.runner:forward_probe:edits": "the edit hooks of one condition (None: the unedited model)",
    "analyses.domain_restriction:stratified_sample:edges": "explicit bin edges (None: the pool's own quantiles)",
    "analyses.domain_restriction:domain_restriction_tables:data_reps": "nulls.data_reps, passed by the rule (0: none)",
    "core.stats:bootstrap_interval:ci": "the generic bootstrap helper every analysis passes its own ci to",
    "core.store:read_finite:dtype": "a numpy dtype of the array read, not the model's dtype",
    "extract.forward:extract_to_hdf5:max_tokens": "the prompt set's token budget (fisher.max_tokens is another key)",
    "extract.forward:extract_to_hdf5:mem_mb": "the job's declared memory (None: no check before loading)",
    "interventions.edits:value_edits:positions": "a tensor of positions per batch row (None: every position)",
    "measures.curvature:local_pca_residuals:min_points": "the estimator's floor (None: k + 1 points)",
    "measures.intrinsic_dimension:twonn:min_points": "the estimator's floor; the workflow's min_points reaches it "
                                                     "through intrinsic_dimension_table",
    **{f"measures.intrinsic_dimension:{f}:min_points": "the estimator's floor (None: k + 1 points)"
       for f in ("mle_id", "mle_mg", "mle_lb")},
    **{f"measures.intrinsic_dimension:{f}:min_points": "the estimator's floor; the workflow's min_points reaches "
                                                        "it through intrinsic_dimension_table"
       for f in ("gride", "gride_scaling", "id_estimates")},
    "models.loading:check_memory:mem_mb": "the job's declared memory (None: no host-memory check)",
    "models.loading:load_prepared:mem_mb": "the job's declared memory (None: no host-memory check)",
}


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


def _leaf_names() -> set[str]:
    names = set()

    def walk(s):
        for k, sub in (s.get("properties") or {}).items():
            if isinstance(sub, dict):
                if "default" in sub and not isinstance(sub["default"], dict):
                    names.add(k)
                walk(sub)
        if isinstance(s.get("additionalProperties"), dict):
            walk(s["additionalProperties"])

    walk(SCHEMA)
    return names - {"seed"}  # every seed of the schema defaults to 0: test_seeds_default_to_zero


def _package_params():
    """(module:function, parameter, has default) for every module-level function outside llmgeom.pipeline."""
    for f in sorted(PACKAGE.rglob("*.py")):
        mod = ".".join(f.relative_to(PACKAGE).with_suffix("").parts)
        if mod.startswith("pipeline"):
            continue
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                a = node.args
                pos = a.posonlyargs + a.args
                with_default = {x.arg for x in pos[len(pos) - len(a.defaults):]}
                with_default |= {x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
                for x in pos + a.kwonlyargs:
                    yield f"{mod}:{node.name}", x.arg, x.arg in with_default


@pytest.mark.parametrize("func", sorted(MIRRORS))
def test_package_defaults_are_the_schema_defaults(func):
    mod, name = func.split(":")
    sig = inspect.signature(getattr(importlib.import_module(f"llmgeom.{mod}"), name))
    for param, key in MIRRORS[func].items():
        p = sig.parameters[param]
        node = schema_node(key)
        if p.default is inspect.Parameter.empty:
            continue  # keyword without default: the caller passes the config's value
        assert "default" in node, f"{key} has no default in the schema but {func}({param}=...) has one"
        assert _norm(p.default) == _norm(node["default"]), \
            f"{func}({param}={p.default!r}) differs from the schema default {key} = {node['default']!r}"


def test_every_parameter_named_like_a_schema_key_is_classified():
    names = _leaf_names()
    unclassified = []
    for func, param, has_default in _package_params():
        if param in names and has_default:
            if param not in MIRRORS.get(func, {}) and f"{func}:{param}" not in NOT_MIRRORED:
                unclassified.append(f"{func}({param})")
    assert not unclassified, ("parameters with a default, named like a schema key: add each to MIRRORS (then its "
                              f"default must be the schema's) or to NOT_MIRRORED with the reason: {unclassified}")
    listed = {(f, p) for f, ps in MIRRORS.items() for p in ps} | {tuple(k.rsplit(":", 1)) for k in NOT_MIRRORED}
    found = {(f, p) for f, p, _ in _package_params()}
    assert listed <= found, f"listed but not in the package (renamed?): {sorted(listed - found)}"


def test_seeds_default_to_zero():
    seeds = [k for k, _ in _rows(SCHEMA, "") if k.endswith(".seed")]
    assert len(seeds) >= 10 and all(schema_node(k).get("default", 0) == 0 for k in seeds)
    bad = []
    for func, param, has_default in _package_params():
        if param == "seed" and has_default:
            mod, name = func.split(":")
            d = inspect.signature(getattr(importlib.import_module(f"llmgeom.{mod}"), name)).parameters["seed"].default
            if d not in (0, None):
                bad.append(f"{func}(seed={d!r})")
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
                                                  "python -m llmgeom.pipeline.config --markdown > config/README.md")
    # every key, its default and its description are in it
    assert "| `intrinsic_dimension.min_points` | an integer >= 10 | `50` |" in committed
    assert "| `models.<name>.source` (required) |" in committed
    r = subprocess.run([sys.executable, "-m", "llmgeom.pipeline.config", "--markdown"], capture_output=True,
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
    expected = {k: v["default"] for k, v in schema_node(f"{WT}.training")["properties"].items()}
    assert w["training"] == dict(expected, steps=7) and expected["steps"] == 3000
    assert w["arch"]["family"] == "llama" and w["checkpoints"] == [] and "n_kv_heads" not in w["arch"]
    assert cfg["value_manifold"]["n_boot"] == 100 and cfg["wind_tunnel"]["prompts"]["cut_positions"] == "all"
    w["checkpoints"].append(3)  # defaults are copies: the schema is not changed through the config
    assert schema_node(f"{WT}.checkpoints")["default"] == []
