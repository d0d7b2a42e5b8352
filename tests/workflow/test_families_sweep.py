"""Issue 29 item 5: the family sweep (config/families.yaml) end to end on tiny random models of its model types.

Each model of config/families.yaml is replaced by a tiny random model of its ``model_type`` (``tests/support/model_types.py``:
hidden 64, 3 layers, 4 query / 2 key heads), saved as a plain Hugging Face directory with the tiny character
tokenizer of .test/models/tiny-llama, and the workflow runs extraction and the analyses that read each kind of
quantity on all of them: the residual stream (intrinsic dimension), the last-token values (value manifold), the
attention probabilities (attention focusing) and W_K (key orthogonality). The tables must have one row per layer
(or per layer and kv head) with finite values. The sweep's own dry run (Hub ids, no weights) is
tests/unit/models/test_model_types.py::test_families_sweep_dry_run_plans_every_model.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import model_types as mtypes
from conftest import REPO, TEST_DIR, pin_reference_tokenizer, tiny_config

pytestmark = pytest.mark.minutes(5)

#: config/families.yaml model -> its model_type (the comment beside each entry there)
FAMILY_TYPES = {"pythia-160m": "gpt_neox", "gpt2": "gpt2", "bloom-560m": "bloom", "opt-125m": "opt", "llama-3.2-1b": "llama",
                "qwen3-0.6b": "qwen3", "gemma-3-270m": "gemma3_text", "olmo-2-1b": "olmo2", "smollm3-3b": "smollm3",
                "phi-3-mini": "phi3", "olmoe-1b-7b": "olmoe", "stablelm-2-1.6b": "stablelm", "jamba-tiny-dev": "jamba",
                "mamba-130m": "mamba", "deepseek-v2-lite": "deepseek_v2"}
TABLES = ("intrinsic_dimension", "value_manifold", "attention_focusing", "key_orthogonality")


def test_every_family_of_the_sweep_is_listed_here():
    sweep = yaml.safe_load((REPO / "config/families.yaml").read_text())["models"]
    assert set(sweep) == set(FAMILY_TYPES), "add the new model of config/families.yaml to FAMILY_TYPES"
    for name, mt in FAMILY_TYPES.items():
        assert f"# {mt}" in next(ln for ln in (REPO / "config/families.yaml").read_text().splitlines()
                                  if ln.strip().startswith(f"{name}:")), name


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("families")
    dirs = {}
    for name, mt in FAMILY_TYPES.items():
        d = work / "models" / name
        mtypes.build(mt, "eager", context=1024).save_pretrained(d)  # prompts of ~150 characters
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TEST_DIR / "models" / "tiny-llama" / f, d / f)
        dirs[name] = d
    cfg = pin_reference_tokenizer(tiny_config(nulls=False))
    cfg["models"] = {n: {"source": "hf_local", "path": str(d), "dtype": "float32", "batch_size": 3}
                     for n, d in dirs.items()}
    cfg["value_manifold"]["prompt_sets"] = ["mixed"]  # one set per kind of measure is enough here
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    targets = [f"results/{m}/tables/{t}.csv" for m in dirs for t in TABLES]
    r = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work),
                        "--configfile", str(work / "config.yaml"), "--cores", "2", *targets],
                       capture_output=True, text=True, cwd=work)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return work


@pytest.mark.parametrize("name", sorted(FAMILY_TYPES))
def test_tiny_family_sweep_runs_every_kind_of_measure(sweep_run, name):
    """Residual-stream measures on every layer; the attention measures on the model's attention layers (all,
    one of three for the Jamba hybrid, none for Mamba: then the table says so); key orthogonality measured, or
    "not applicable" with the reason for latent attention (no W_K)."""
    from transformers import AutoConfig

    from llmgeom.models import families

    s = families.summarize(AutoConfig.from_pretrained(sweep_run / "models" / name))
    A = set(s.attention_layers)
    assert A == ({1} if name == "jamba-tiny-dev" else set() if name == "mamba-130m" else {0, 1, 2})
    t = {k: pd.read_csv(sweep_run / f"results/{name}/tables/{k}.csv") for k in TABLES}
    ids = t["intrinsic_dimension"]
    assert sorted(set(ids.layer)) == list(range(4))  # embeddings + 3 blocks: the residual stream of every layer
    assert ids.id_mean.notna().all()
    vm = t["value_manifold"]
    res = vm[vm.representation == "residual_stream"]
    assert set(res.layer) == {0, 1, 2} and res.pc1.between(0, 1).all()
    vals = vm[vm.representation == "values"]
    assert set(vals.layer) == A and vals.pc1.between(0, 1).all()
    af = pd.read_csv(sweep_run / f"results/{name}/tables/attention_focusing_summary.csv")
    detail = t["attention_focusing"]
    assert set(detail.layer) == A and (detail.entropy_mean > 0).all()
    if not A:
        assert af.not_applicable.str.contains("no attention layers").all()
    ko = t["key_orthogonality"]
    assert len(ko) == len(A) * s.n_kv_heads
    if name == "deepseek-v2-lite":
        assert ko.orthogonality.isna().all() and ko.not_applicable.str.contains("not applicable").all()
    elif A:
        assert ko.orthogonality.notna().all() and ko.not_applicable.isna().all()  # "" is read back as NaN
