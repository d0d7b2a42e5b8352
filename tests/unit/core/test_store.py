"""HDF5 activation store: round trip, atomic writes, and refusal of untrusted files."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime

import h5py
import numpy as np
import pytest

import llmgeom
from llmgeom.models import families
from llmgeom.extract import forward as extraction
from llmgeom.models import sources as models, tiny as testing
from llmgeom.core import store, writer
from llmgeom.core.store import CONTRACT_VERSION, StoreError, open_activations
from llmgeom.prompts.io import write_prompt_set
from llmgeom.models.loading import load_prepared

from conftest import committed_batches
from conftest import same_datasets

FIX = r"run rule extract"  # "rerun rule extract" contains it too


@pytest.fixture(autouse=True)
def _workflow_store_context():
    """These tests check what a workflow job reports (rule extract, snakemake --forcerun): the store context that
    ``run_logged`` installs in every job (test_store_without_workflow_* check the plain one)."""
    from llmgeom.pipeline import layout

    with layout.installed():
        yield

PROMPTS = [{"id": "a", "text": "The cat sat.", "meta": {"topic": "animals", "k": 1}},
           {"id": "b", "text": "xy", "meta": {"topic": "letters", "k": 2}},
           {"id": "c", "text": "Hello, world! How are you?", "meta": {"topic": "greetings", "k": 3}},
           {"id": "d", "text": "ünïcødé ok", "meta": {}},
           {"id": "e", "text": "1 2 3 4 5", "meta": {"topic": "numbers", "k": 5}}]


def _write_prompts(path, recs):
    write_prompt_set(recs, path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A prepared tiny Llama (GQA), a prompt set and two committed activation files."""
    d = tmp_path_factory.mktemp("store")
    src = testing.save_tiny_model_dir("llama", d / "src")
    prepared = d / "prepared"
    manifest = models.prepare_model("tiny-llama", {"source": "hf_local", "path": str(src), "dtype": "float32"},
                                    prepared)
    prompts = d / "mixed.jsonl"
    _write_prompts(prompts, PROMPTS)
    h5 = d / "acts" / "mixed.h5"
    extraction.extract_to_hdf5(prepared, prompts, h5, model_name="tiny-llama", dtype="float32", device="cpu",
                               batch_size=2, top_k=7, log=lambda *a: None, sample_per_prompt=30, device_map=None)
    corpus = d / "acts" / "corpus.h5"
    extraction.extract_to_hdf5(prepared, prompts, corpus, model_name="tiny-llama", dtype="float32", device="cpu",
                               batch_size=3, top_k=7, corpus=True, sample_per_prompt=4, seed=3,
                               log=lambda *a: None, device_map=None)
    return dict(dir=d, src=src, prepared=prepared, manifest=manifest, prompts=prompts, h5=h5, corpus=corpus,
                sha=hashlib.sha256(prompts.read_bytes()).hexdigest())


def _str(x):
    return x.decode() if isinstance(x, bytes) else x


def test_round_trip_datasets_and_attributes(setup):
    model, tok = load_prepared(setup["prepared"], dtype="float32", attn="eager", device="cpu")
    s = families.summarize(model.config)
    seqs = [tok(r["text"])["input_ids"] for r in PROMPTS]
    ref = extraction.extract_batch(model, seqs, attention=True, top_k=7, prompt_ids=[r["id"] for r in PROMPTS])
    n, L = len(PROMPTS), s.n_layers

    with open_activations(setup["h5"], model="tiny-llama", prompt_set_sha256=setup["sha"]) as f:
        a = store.attrs_dict(f)
        # attributes
        assert a["complete"] is True
        assert a["contract_version"] == CONTRACT_VERSION
        assert a["model"] == "tiny-llama"
        assert a["source"] == "hf_local"
        assert a["source_sha256"] == setup["manifest"]["source_sha256"]
        assert a["torch_dtype"] == "float32"
        assert a["device"] == "cpu"
        assert a["attn_implementation"] == "sdpa"  # entropies from hooked q/k (issue 13 item 2)
        assert (a["n_layers"], a["d_model"], a["d_unembed"], a["n_heads"], a["n_kv_heads"], a["head_dim"],
                a["vocab_size"]) == (2, 32, 32, 4, 2, 8, 96)
        assert a["architecture"] == s.as_dict() == setup["manifest"]["architecture"]
        assert a["prompt_set"] == "mixed"
        assert a["prompt_set_sha256"] == setup["sha"]
        assert a["top_k"] == 7 and a["seed"] == 0 and a["kind"] == "prompts" and a["sample_per_prompt"] == 0
        assert set(a["versions"]) >= {"llmgeom", "torch", "transformers", "h5py", "numpy"}
        assert a["versions"]["h5py"] == h5py.__version__
        assert datetime.fromisoformat(a["created"]).tzinfo is not None

        # datasets: names, shapes, dtypes, units/axes
        names, scales = [], []
        f.visit(lambda x: (scales if h5py.h5ds.is_scale(f[x].id) else names).append(x)
                if isinstance(f[x], h5py.Dataset) else None)
        # the named axes: one dimension scale per axis at the root, attached to every dataset that has it
        assert sorted(scales) == sorted(["prompt", "layer", "resid_layer", "d_model", "d_unembed", "value_feature",
                                         "kv_head", "head_dim", "head", "attn_feature", "rank"])
        assert [f["last_token/keys"].dims[i][0].name for i in range(4)] == ["/prompt", "/layer", "/kv_head", "/head_dim"]
        np.testing.assert_array_equal(f["resid_layer"][()], np.arange(L + 1))
        assert sorted(names) == sorted([
            "prompts/text", "prompts/meta", "prompts/n_tokens", "last_token/residual", "last_token/final_normed",
            "last_token/values", "last_token/keys", "last_token/attn_output", "attention/entropy",
            "next_token/entropy", "next_token/top_ids", "next_token/top_logits"])
        for x in names:
            ds = f[x]
            assert "units" in ds.attrs and "axes" in ds.attrs, x
            assert ds.attrs["axes"].split(",")[0] == "prompt", x
        assert f["attention/entropy"].attrs["units"] == "nats"
        assert f["next_token/entropy"].attrs["units"] == "nats"
        assert f["last_token/residual"].attrs["axes"] == "prompt,layer(0=embeddings),d_model"
        assert f["last_token/residual"].shape == (n, L + 1, 32)
        assert f["last_token/keys"].shape == (n, L, 2, 8)
        assert f["last_token/values"].shape == (n, L, 16)
        assert f["attention/entropy"].shape == (n, L, 4)
        assert f["last_token/attn_output"].shape == (n, L, 4 * 8)
        assert f["last_token/attn_output"].attrs["axes"] == "prompt,layer,n_heads*head_dim"
        assert f["next_token/top_ids"].dtype == np.int64
        assert f["prompts/n_tokens"].dtype == np.int32
        for x in ("last_token/residual", "last_token/values", "attention/entropy", "next_token/top_logits"):
            assert f[x].dtype == np.float32

        # values: prompt order of the file, equal to a direct extraction
        assert [_str(t) for t in f["prompts/text"][()]] == [r["text"] for r in PROMPTS]
        assert [json.loads(_str(m)) for m in f["prompts/meta"][()]] == [r["meta"] for r in PROMPTS]
        np.testing.assert_array_equal(f["prompts/n_tokens"][()], [len(q) for q in seqs])
        pairs = {"last_token/residual": "last_token/residual", "last_token/final_normed": "last_token/final_normed",
                 "last_token/values": "last_token/values", "last_token/keys": "last_token/keys", "attention/entropy": "attention/entropy",
                 "last_token/attn_output": "last_token/attn_output",
                 "next_token/entropy": "next_token/entropy", "next_token/top_logits": "next_token/top_logits"}
        for x, k in pairs.items():
            np.testing.assert_allclose(f[x][()], ref[k], atol=1e-5, rtol=0, err_msg=x)
        np.testing.assert_array_equal(f["next_token/top_ids"][()], ref["next_token/top_ids"])


def test_round_trip_corpus(setup):
    model, tok = load_prepared(setup["prepared"], dtype="float32", attn="sdpa", device="cpu")
    seqs = [tok(r["text"])["input_ids"] for r in PROMPTS]
    with open_activations(setup["corpus"], model="tiny-llama", prompt_set_sha256=setup["sha"]) as f:
        a = store.attrs_dict(f)
        assert a["kind"] == "corpus" and a["sample_per_prompt"] == 4 and a["seed"] == 3
        sp, spos = f["tokens/sample_prompt"][()], f["tokens/sample_position"][()]
        samples = []
        for i, q in enumerate(seqs):
            ps = spos[sp == i].tolist()
            assert len(ps) == min(4, len(q) - 1)
            assert ps == sorted(set(ps)) and all(1 <= p < len(q) for p in ps)  # BOS never sampled
            samples.append(ps)
        np.testing.assert_array_equal(sp, np.repeat(np.arange(len(seqs)), [len(x) for x in samples]))
        ref = extraction.extract_batch(model, seqs, attention=False, top_k=7, sample_positions=samples,
                                       token_stats=True)
        np.testing.assert_allclose(f["tokens/residual_sample"][()], ref["tokens/residual_sample"], atol=1e-5, rtol=0)
        for x, k in (("tokens/margin", "tokens/margin"), ("tokens/nll", "tokens/nll"), ("tokens/entropy", "tokens/entropy")):
            np.testing.assert_allclose(f[x][()], ref[k], atol=1e-5, rtol=0, err_msg=x)
            assert f[x].attrs["units"] in ("logits", "nats")
        np.testing.assert_array_equal(f["tokens/prompt"][()], ref["tokens/prompt"])
        np.testing.assert_array_equal(f["tokens/position"][()], ref["tokens/position"])
        assert len(f["tokens/margin"]) == sum(len(q) - 2 for q in seqs)
        for x in ("tokens/residual_sample", "tokens/margin", "tokens/nll", "tokens/position"):
            assert f[x].attrs["units"] and f[x].attrs["axes"], x


def test_no_partial_left_after_success_and_failure(setup, monkeypatch, tmp_path):
    assert not setup["h5"].with_name("mixed.h5.partial").exists()

    def boom(*a, **k):
        raise extraction.NonFiniteActivationError("simulated")

    monkeypatch.setattr(extraction, "extract_batch", boom)
    out = tmp_path / "fail.h5"
    with pytest.raises(extraction.NonFiniteActivationError):
        extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, model_name="tiny-llama",
                                   dtype="float32", device="cpu", log=lambda *a: None, batch_size=8, top_k=10, sample_per_prompt=30, device_map=None)
    assert not out.exists()
    assert not out.with_name("fail.h5.partial").exists()


@pytest.mark.parametrize("corpus", [False, True])
def test_write_behind_writes_the_same_file(setup, tmp_path, corpus, monkeypatch):
    """Batches written and committed on the background thread (the default on an accelerator) give the file of
    in-loop writes (the default on CPU): the same datasets, values, chunk bytes and attributes."""
    pools = []  # the writer threads started: one per write_behind=True call, none for the CPU default
    real_pool = extraction.ThreadPoolExecutor
    monkeypatch.setattr(extraction, "ThreadPoolExecutor", lambda *a, **k: pools.append(1) or real_pool(*a, **k))
    kw = dict(model_name="tiny-llama", dtype="float32", device="cpu", batch_size=2, top_k=7, corpus=corpus,
              sample_per_prompt=4, seed=3, device_map=None, log=lambda *a: None)
    seq = extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], tmp_path / "seq.h5", write_behind=False, **kw)
    behind = extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], tmp_path / "behind.h5", write_behind=True,
                                        **kw)
    same_datasets(seq, behind)
    assert len(pools) == 1
    default = extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], tmp_path / "default.h5", **kw)
    same_datasets(seq, default)
    assert len(pools) == 1  # the model is on the CPU: the default writes in the loop
    with h5py.File(behind, "r") as f:  # every batch arrived (a lost one would leave the fill value 0)
        assert np.all(f["next_token/entropy"][()] > 0) and f.attrs["complete"]


def test_write_behind_error_is_raised_and_the_partial_removed(setup, monkeypatch, tmp_path):
    """A write that fails on the writer thread (batch 1 of 5) stops the extraction with that error, and no
    file or partial is left."""
    real = writer.ActivationWriter.commit_batch

    def failing(self, j):
        if j == 1:
            raise ValueError("refusing to store non-finite values in simulated")
        return real(self, j)

    monkeypatch.setattr(writer.ActivationWriter, "commit_batch", failing)
    out = tmp_path / "w.h5"
    with pytest.raises(ValueError, match="simulated"):
        extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, model_name="tiny-llama",
                                   dtype="float32", device="cpu", batch_size=1, write_behind=True, log=lambda *a: None, top_k=10, sample_per_prompt=30, device_map=None)
    assert not out.exists() and not out.with_name("w.h5.partial").exists()


_CHILD = textwrap.dedent("""
    import pathlib, sys, time
    import llmgeom.extract.forward as E

    def slow(*a, **k):
        pathlib.Path(sys.argv[4]).write_text("started")
        time.sleep(300)

    E.extract_batch = slow
    E.extract_to_hdf5(sys.argv[1], sys.argv[2], sys.argv[3], model_name="tiny-llama", dtype="float32",
                      device="cpu", batch_size=1, top_k=10, sample_per_prompt=30, device_map=None,
                      log=lambda *a: None)
""")


def _wait_for(marker, proc, what: str, seconds: float) -> None:
    """Wait until the child process writes ``marker``; fail if it exits first or takes too long."""
    deadline = time.time() + seconds
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"child exited early: {proc.stdout.read().decode()[-2000:]}")
        if time.time() > deadline:
            pytest.fail(f"child did not {what} within {seconds} s")
        time.sleep(0.05)


def test_killed_write_leaves_only_partial(setup, tmp_path):
    out = tmp_path / "killed.h5"
    partial = tmp_path / "killed.h5.partial"
    marker = tmp_path / "started"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(setup["prepared"]), str(setup["prompts"]), str(out),
                             str(marker)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(marker, proc, "reach extraction", 60)
        assert partial.exists()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert partial.exists()
    with pytest.raises(StoreError, match=FIX):
        open_activations(out)
    with pytest.raises(StoreError, match=FIX):  # the partial itself is never trusted
        open_activations(partial)
    # a rerun replaces the stale partial and commits
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, model_name="tiny-llama", dtype="float32",
                               device="cpu", log=lambda *a: None, batch_size=8, top_k=10, sample_per_prompt=30, device_map=None)
    assert out.exists() and not partial.exists()
    open_activations(out, model="tiny-llama", prompt_set_sha256=setup["sha"]).close()


def _copy(setup, tmp_path, name="copy.h5"):
    p = tmp_path / name
    shutil.copy(setup["h5"], p)
    return p


def _set_attr(path, key, value):
    with h5py.File(path, "r+") as f:
        f.attrs[key] = value


def test_open_rejects_missing(tmp_path):
    with pytest.raises(StoreError, match=FIX) as ei:
        open_activations(tmp_path / "nope.h5")
    assert "does not exist" in str(ei.value)


def test_store_without_workflow_names_the_extraction_function(tmp_path):
    """A notebook call (no workflow context): the hint names the extraction function, no rule and no snakemake."""
    prev = store.use_context(None)
    try:
        with pytest.raises(StoreError) as ei:
            open_activations(tmp_path / "nope.h5")
    finally:
        store.use_context(prev)
    msg = str(ei.value)
    assert msg == (f"{tmp_path / 'nope.h5'} does not exist; extract it again with the same model and prompt set: "
                   f"llmgeom.extract.forward.extract_to_hdf5(model_dir, prompts_path, {str(tmp_path / 'nope.h5')!r}, "
                   "model_name=...)"), msg
    assert "rule" not in msg and "snakemake" not in msg


def test_store_in_a_workflow_job_names_the_rule_and_the_command(tmp_path):
    """Inside ``run_logged`` (every workflow job) the hint names rule extract and the forcerun command; after the
    job the previous context is back."""
    from llmgeom.pipeline.jobs import run_logged

    prev = store.use_context(None)
    try:
        with run_logged(tmp_path / "job.log"):
            with pytest.raises(StoreError) as ei:
                open_activations(tmp_path / "nope.h5")
        assert store.rerun_hint("x.h5").startswith("extract it again")  # restored on exit
    finally:
        store.use_context(prev)
    assert str(ei.value) == (f"{tmp_path / 'nope.h5'} does not exist; rerun rule extract (extract_sula for SULA "
                             f"sets) for it: snakemake --forcerun {tmp_path / 'nope.h5'} (reruns it and every "
                             "analysis that reads it)"), str(ei.value)


def test_store_source_knows_no_workflow():
    """core/store.py names no rule, no snakemake command and no path of the workflow's layout (issue 30 item 3)."""
    import inspect
    import re

    src = inspect.getsource(store)
    for pat in (r"rule extract", r"forcerun", r"snakemake", r"results/", r"resources/", r"\bactivations/"):
        assert not re.search(pat, src), pat


def test_open_rejects_truncated(setup, tmp_path):
    data = setup["h5"].read_bytes()
    p = tmp_path / "truncated.h5"
    p.write_bytes(data[:len(data) // 2])
    with pytest.raises(StoreError, match=FIX) as ei:
        open_activations(p)
    assert "not a readable HDF5 file" in str(ei.value)


def test_open_rejects_non_hdf5(tmp_path):
    p = tmp_path / "text.h5"
    p.write_text("this is not an HDF5 file\n" * 100)
    with pytest.raises(StoreError, match=FIX):
        open_activations(p)
    e = tmp_path / "empty.h5"
    e.write_bytes(b"")
    with pytest.raises(StoreError, match=FIX):
        open_activations(e)


def test_open_rejects_incomplete(setup, tmp_path):
    p = _copy(setup, tmp_path)
    _set_attr(p, "complete", False)
    with pytest.raises(StoreError, match=FIX) as ei:
        open_activations(p)
    assert "incomplete" in str(ei.value)
    with h5py.File(p, "r+") as f:
        del f.attrs["complete"]
    with pytest.raises(StoreError, match="incomplete"):
        open_activations(p)


def test_open_rejects_wrong_model(setup):
    with pytest.raises(StoreError, match=FIX) as ei:
        open_activations(setup["h5"], model="other-model")
    assert "'tiny-llama'" in str(ei.value) and "'other-model'" in str(ei.value)


def test_open_rejects_wrong_prompt_set(setup):
    with pytest.raises(StoreError, match=FIX) as ei:
        open_activations(setup["h5"], prompt_set_sha256="0" * 64)
    assert "sha256" in str(ei.value)


def test_open_rejects_wrong_contract_version(setup, tmp_path):
    p = _copy(setup, tmp_path)
    _set_attr(p, "contract_version", CONTRACT_VERSION + 1)
    with pytest.raises(StoreError, match=FIX) as ei:
        open_activations(p)
    assert "contract version" in str(ei.value)
    with h5py.File(p, "r+") as f:
        del f.attrs["contract_version"]
    with pytest.raises(StoreError, match="contract version"):
        open_activations(p)


def test_open_accepts_good_file_and_is_read_only(setup):
    f = open_activations(setup["h5"], model="tiny-llama", prompt_set_sha256=setup["sha"])
    try:
        assert f.mode == "r"
        assert f.attrs["complete"]
    finally:
        f.close()
    assert isinstance(StoreError("x"), ValueError)


def test_writer_handles_follow_a_recreated_partial(tmp_path):
    """The writer keeps each dataset's handle; when a committed batch fails its digest the partial is discarded and
    recreated, and the writes after that land in the new file (a handle kept from the closed file would raise),
    which then holds only them."""
    shapes = {"last_token/residual": ((4, 2, 3), "float32")}
    logs = []
    w = writer.ActivationWriter(tmp_path / "w.h5", {"model": "m"}, shapes, resume_key="k", n_batches=2,
                               log=logs.append)
    w.begin_batch()
    w.write("last_token/residual", np.array([0, 2]), np.ones((2, 2, 3), np.float32))
    w.commit_batch(0)
    # the rows named for batch 0 are not the ones it wrote: its digest fails, the partial is recreated empty
    assert len(w.verify_batches(lambda j: {"last_token/residual": np.array([1, 3])})) == 0
    assert any("cannot be trusted" in m for m in logs), logs
    w.begin_batch()
    w.write("last_token/residual", np.array([3, 1]), np.stack([np.full((2, 3), 3.0), np.full((2, 3), 1.0)]))
    w.commit_batch(0)
    with open_activations(w.commit(), model="m") as f:
        np.testing.assert_array_equal(f["last_token/residual"][:, 0, 0], [0.0, 1.0, 0.0, 3.0])


def test_writer_refuses_non_finite_and_abort_removes_partial(tmp_path):
    out = tmp_path / "w.h5"
    w = writer.ActivationWriter(out, {"model": "m", "architecture": {"a": 1}, "revision": None},
                               {"last_token/residual": ((3, 2, 4), "float32"), "prompts/text": ((3,), "str")})
    assert w.tmp.exists() and not out.exists()
    w.write("last_token/residual", np.array([2, 0]), np.stack([np.full((2, 4), 2.0), np.full((2, 4), 0.0)]))
    w.write("last_token/residual", slice(1, 2), np.full((1, 2, 4), 1.0))
    w.write("prompts/text", slice(None), ["x", "ÿ", "z"])
    with pytest.raises(ValueError, match="non-finite"):
        w.write("last_token/residual", [0], np.full((1, 2, 4), np.nan))
    path = w.commit()
    assert path == out and not w.tmp.exists()
    with open_activations(out, model="m") as f:
        np.testing.assert_array_equal(f["last_token/residual"][:, 0, 0], [0.0, 1.0, 2.0])
        assert [_str(t) for t in f["prompts/text"][()]] == ["x", "ÿ", "z"]
        a = store.attrs_dict(f)
        assert a["architecture"] == {"a": 1} and a["revision"] == ""
    w2 = writer.ActivationWriter(tmp_path / "v.h5", {"model": "m"}, {"next_token/entropy": ((2,), "float32")})
    w2.abort()
    assert not (tmp_path / "v.h5").exists() and not (tmp_path / "v.h5.partial").exists()


# --------------------------------------------------------------------------- silent corruption (issue 12)
# Every numeric dataset carries HDF5's per-chunk Fletcher-32 checksum; string datasets a sha256 recorded at
# commit. A copy of a real file with bytes overwritten inside the chunks of one dataset must make every
# analysis that reads that dataset raise StoreError (file, dataset, rerun command), never return a table.


@pytest.fixture(scope="module")
def sula_h5(setup):
    from llmgeom.prompts import sula

    d = setup["dir"] / "sula"
    d.mkdir()
    sets, _ = sula.build_sula_sets(testing.tiny_tokenizer(), label_pairs=[("x", "y"), ("p", "q")], label_prefix="",
                                   ks=[0, 1, 2, 4], n_per_k=5, n_per_k_controls=4, seed=0, conditions=["main"], alpha=0.9, mask="[MASK]")
    _write_prompts(d / "main.jsonl", sets["main"])
    out = d / "sula_main.h5"
    extraction.extract_to_hdf5(setup["prepared"], d / "main.jsonl", out, model_name="tiny-llama", dtype="float32",
                               device="cpu", batch_size=3, attention=False, candidates_key=sula.CANDIDATES_KEY,
                               log=lambda *a: None, top_k=10, sample_per_prompt=30, device_map=None)
    return out


def _analyses(setup, sula_h5):
    """name -> (clean file, function of a file path that runs the analysis the way its rule does)."""
    from llmgeom.analyses.attention_focusing import attention_focusing_tables
    from llmgeom.analyses.curvature import curvature_table
    from llmgeom.analyses.domain_restriction import domain_restriction_tables
    from llmgeom.analyses.fisher import fisher_tables
    from llmgeom.analyses.intrinsic_dimension import intrinsic_dimension_table
    from llmgeom.analyses.margins import margin_tables
    from llmgeom.analyses.sula import sula_tables
    from llmgeom.analyses.value_manifold import value_manifold_table
    from llmgeom.weights.unembedding import load_unembedding

    m = "tiny-llama"
    unemb = load_unembedding(setup["prepared"])
    id_kw = dict(model=m, estimators=("twonn",), n_subsamples=1, subsample_size=20, seed=0, min_points=10, mle_k=20,
                 disagreement_factor=1.5, gride_max_rank=64, gride_plateau_tol=0.1, passage_resamples=2, ci=0.95)
    id_clean = intrinsic_dimension_table(setup["corpus"], **id_kw)
    return {
        "value_manifold": (setup["h5"], lambda p: value_manifold_table({"mixed": p}, model=m, n_boot=2, seed=0, ci=0.95, layers="all")),
        "domain_restriction": (setup["h5"], lambda p: domain_restriction_tables(
            {"mixed": p, "dom": p}, model=m, mixed_set="mixed", n_quantiles=1, per_quantile=4, n_boot=2,
            log=lambda *a: None, labels=None, edges="per_set", ci=0.95, seed=0, layers="all", data_reps=0)),
        "attention_focusing": (setup["h5"], lambda p: attention_focusing_tables(
            p, model=m, **llmgeom.defaults("attention_focusing"))),
        "intrinsic_dimension": (setup["corpus"], lambda p: intrinsic_dimension_table(p, **id_kw)),
        "curvature": (setup["corpus"], lambda p: curvature_table(p, id_clean, model=m, k=5, n_points=20,
                                                                 min_points=10, id_estimator="twonn", seed=0,
                                                                 n_boot=2, ci=0.95)),
        "margins": (setup["corpus"], lambda p: margin_tables(p, model=m, n_boot=2, min_count=1, threshold=0.5, hard_core_quantile=0.05, hard_core_thresholds=(0.05, 0.1), eps_min=1e-3, eps_max=10.0, n_eps=41, fit_eps_max=0.5, fit_eta_max=0.3, ci=0.95, seed=0, hist_bins=60)),
        "fisher": (setup["corpus"], lambda p: fisher_tables(p, unemb, model=m, n_positions=8, max_tokens=16, tail_mass=1e-6, seed=0, batch=32)),
        "sula": (sula_h5, lambda p: sula_tables({"main": p}, model=m, calibration_bins=2, layers="all", n_boot=10,
                                                ci=0.95, seed=0)),
    }


def _datasets_read(fn, path, monkeypatch):
    """Names of the datasets that ``fn(path)`` reads (on a clean file: it must succeed)."""
    seen = set()
    orig = store.CheckedDataset.__getitem__

    def spy(self, args, new_dtype=None):
        seen.add(self.name.lstrip("/"))
        return orig(self, args, new_dtype=new_dtype)

    with monkeypatch.context() as mp:
        mp.setattr(store.CheckedDataset, "__getitem__", spy)
        fn(path)
    return seen


def _corrupt_chunks(path, name, n_bytes=8, seed=0):
    """Overwrite ``n_bytes`` random bytes inside EVERY stored chunk of dataset ``name`` (a different offset
    in each chunk); string datasets: inside the stored text of several records. Returns the offsets."""
    rng = np.random.default_rng(seed)
    spans = []
    with h5py.File(path, "r") as f:
        ds = f[name]
        if h5py.check_string_dtype(ds.dtype) is None:
            assert ds.fletcher32 and ds.chunks, (name, ds.chunks)
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                spans.append((info.byte_offset, info.size))
        else:
            texts = [t.encode() for t in ds.asstr()[()] if len(t.encode()) > n_bytes]
    data = bytearray(path.read_bytes())
    if not spans:  # vlen strings live in the global heap: find the records' bytes in the file
        for t in texts[:3]:
            at = data.find(t)
            assert at > 0, t
            spans.append((at, len(t)))
    offsets = []
    for start, size in spans:
        off = start + int(rng.integers(0, max(1, size - n_bytes)))
        new = bytes(b ^ 0xFF for b in data[off:off + n_bytes])  # every byte changes
        data[off:off + n_bytes] = new
        offsets.append(off)
    path.write_bytes(bytes(data))
    return offsets


ANALYSES = ["value_manifold", "domain_restriction", "attention_focusing", "intrinsic_dimension", "curvature",
            "margins", "fisher", "sula"]


@pytest.mark.parametrize("analysis", ANALYSES)
def test_corrupted_chunks_never_become_a_table(setup, sula_h5, tmp_path, monkeypatch, analysis):
    clean, fn = _analyses(setup, sula_h5)[analysis]
    fn(clean)  # the clean file gives a table
    read = _datasets_read(fn, clean, monkeypatch)
    assert read, analysis
    for name in sorted(read):
        bad = tmp_path / name.replace("/", "_") / clean.name
        bad.parent.mkdir()
        shutil.copy(clean, bad)
        offsets = _corrupt_chunks(bad, name)
        assert len(offsets) >= 1
        with pytest.raises(StoreError) as ei:
            fn(bad)
        msg = str(ei.value)
        assert str(bad) in msg and repr(name) in msg, msg
        assert f"snakemake --forcerun {bad}" in msg, msg


def test_every_dataset_kind_is_checksummed(setup, sula_h5):
    """Numeric datasets of every kind (N-D per-row chunks, 1-D, int and float) have Fletcher-32 (integer ones
    after lzf, floating-point ones uncompressed); strings carry a recorded sha256."""
    kinds = set()
    for path in (setup["h5"], setup["corpus"], sula_h5):
        with h5py.File(path, "r") as f:
            assert f.attrs["contract_version"] == CONTRACT_VERSION >= 2  # checksums since 2 (3: attn_output)
            names = []
            f.visit(lambda x: names.append(x) if isinstance(f[x], h5py.Dataset) else None)
            for x in names:
                ds = f[x]
                if h5py.check_string_dtype(ds.dtype) is not None:
                    assert len(ds.attrs["sha256"]) == 64, x
                    kinds.add("str")
                    continue
                assert ds.fletcher32 and ds.compression == ("lzf" if ds.dtype.kind in "iu" else None), (x, ds.dtype)
                pl = ds.id.get_create_plist()
                filters = [pl.get_filter(i)[0] for i in range(pl.get_nfilters())]
                assert filters[-1] == h5py.h5z.FILTER_FLETCHER32, (x, filters)  # checksum of the stored bytes
                kinds.add((ds.dtype.kind, min(ds.ndim, 2)))
    assert kinds >= {"str", ("f", 1), ("f", 2), ("i", 1), ("i", 2)}


def test_corruption_as_reported_in_the_issue(setup, tmp_path):
    """64 bytes in the data area of the value vectors (header intact): the analysis used to rewrite the table
    with pc1 = 1.0; now it names the file, the dataset and the rerun command."""
    from llmgeom.analyses.value_manifold import value_manifold_table

    bad = tmp_path / "mixed.h5"
    shutil.copy(setup["h5"], bad)
    with h5py.File(bad, "r") as f:
        info = f["last_token/values"].id.get_chunk_info(2)
    data = bytearray(bad.read_bytes())
    data[info.byte_offset:info.byte_offset + min(64, info.size)] = np.random.default_rng(1).bytes(min(64, info.size))
    bad.write_bytes(bytes(data))
    with open_activations(bad) as f:  # the header and other datasets still read fine
        assert f["next_token/entropy"][:].shape == (5,)
        f["last_token/values"][:2]  # chunks 0, 1: intact
        with pytest.raises(StoreError, match=r"dataset 'last_token/values' cannot be read"):
            f["last_token/values"][2]
        with pytest.raises(StoreError, match=r"dataset 'last_token/values' cannot be read"):
            np.asarray(f["last_token"]["values"])  # through a group and numpy as well
    with pytest.raises(StoreError, match=rf"{bad}: dataset 'last_token/values' cannot be read.*"
                                         rf"snakemake --forcerun {bad}"):
        value_manifold_table({"mixed": bad}, model="tiny-llama", n_boot=2, seed=0, ci=0.95, layers="all")


# --------------------------------------------------------------------------- labelled arrays (notebook use)


def test_notebook_opens_activations_as_labelled_xarray(setup):
    """As a notebook user would: one call gives labelled arrays whose values are the file's values."""
    import xarray as xr

    import llmgeom

    ds = llmgeom.open_labelled(setup["h5"])  # group "last_token"
    assert dict(ds.sizes) == {"prompt": 5, "resid_layer": 3, "d_model": 32, "d_unembed": 32, "layer": 2,
                              "value_feature": 16, "kv_head": 2, "head_dim": 8, "attn_feature": 32}
    assert ds["values"].dims == ("prompt", "layer", "value_feature")
    assert ds["residual"].attrs["units"] == "activation"
    with h5py.File(setup["h5"], "r") as f:
        raw_v = f["last_token/values"][()]
        raw_k = f["last_token/keys"][()]
        raw_e = f["attention/entropy"][()]
        raw_h = f["next_token/entropy"][()]
    np.testing.assert_array_equal(ds["values"].sel(layer=1, prompt=3).values, raw_v[3, 1])
    np.testing.assert_array_equal(ds["keys"].isel(kv_head=1).sel(layer=0).values, raw_k[:, 0, 1])
    np.testing.assert_array_equal(ds["residual"].sel(resid_layer=0).values.shape, (5, 32))
    # plain xarray, as the issue asks: engine h5netcdf, one group
    att = xr.open_dataset(setup["h5"], engine="h5netcdf", group="attention")
    assert att["entropy"].dims == ("prompt", "layer", "head")
    np.testing.assert_array_equal(att["entropy"].values, raw_e)
    assert float(att["entropy"].mean("head").sel(layer=1)[2]) == pytest.approx(float(raw_e[2, 1].mean()), rel=1e-6)
    # the whole file as a tree
    tree = llmgeom.open_labelled(setup["h5"], group=None)
    np.testing.assert_array_equal(tree["next_token"]["entropy"].values, raw_h)
    # corpus sets: the token-level axes
    tok = llmgeom.open_labelled(setup["corpus"], group="tokens")
    assert tok["residual_sample"].dims == ("sample", "resid_layer", "d_model")
    assert tok["nll"].dims == ("position",) and tok["nll"].attrs["units"] == "nats"
    with pytest.raises(KeyError, match="no group 'nope'"):
        llmgeom.open_labelled(setup["h5"], group="nope")


def test_labelled_view_refuses_an_untrusted_file(setup, tmp_path):
    import llmgeom

    bad = _copy(setup, tmp_path)
    _set_attr(bad, "complete", False)
    with pytest.raises(StoreError, match="incomplete"):
        llmgeom.open_labelled(bad)


# --------------------------------------------------------------------------- resumable extraction (issue 18.3)


_REAL_EXTRACT_BATCH = extraction.extract_batch
RESUME_KW = dict(model_name="tiny-llama", dtype="float32", device="cpu", batch_size=1, top_k=7, corpus=True,
                 sample_per_prompt=4, seed=3, device_map=None)


@pytest.fixture(scope="module")
def uninterrupted(setup):
    out = setup["dir"] / "resume" / "ref.h5"
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=lambda *a: None, **RESUME_KW)
    return out


def _counting(monkeypatch, stop_after=None):
    """Wrap extract_batch: record the prompt ids of every batch computed; after ``stop_after`` batches send
    this process SIGUSR1 (as SLURM's --signal=B:USR1@<s> would) while the batch is in flight."""
    seen = []
    real = _REAL_EXTRACT_BATCH

    def wrapped(*a, **k):
        seen.append(tuple(k["prompt_ids"]))
        if stop_after is not None and len(seen) == stop_after:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(*a, **k)

    monkeypatch.setattr(extraction, "extract_batch", wrapped)
    return seen


def test_extraction_registers_its_hooks_once_for_all_batches(setup, uninterrupted, tmp_path, monkeypatch):
    """extract_to_hdf5 registers the hooks once (one ``capture.hooked`` context, the package's one registration
    site) and hands that registration to every batch (issue 21: registration per batch cost ~0.75% of a batch);
    the file is the one of an uninterrupted run."""
    from llmgeom.extract import capture

    contexts, hooks_seen = [], []
    real_hooked = capture.hooked

    def hooked(model, hooks, **kw):
        contexts.append((len(hooks), kw))
        return real_hooked(model, hooks, **kw)

    def batch(*a, **k):
        hooks_seen.append(k.get("hooks"))
        return _REAL_EXTRACT_BATCH(*a, **k)

    monkeypatch.setattr(capture, "hooked", hooked)
    monkeypatch.setattr(extraction, "extract_batch", batch)
    out = extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], tmp_path / "h.h5", log=lambda *a: None,
                                     **RESUME_KW)
    assert len(hooks_seen) == len(PROMPTS) > 1  # batch_size 1
    assert len(contexts) == 1 and all(h is not None and h is hooks_seen[0] for h in hooks_seen)
    assert contexts[0][1] == {"final_token_only": False}  # a corpus set: sampled positions need the whole last block
    same_datasets(uninterrupted, out)


@pytest.mark.parametrize("write_behind", [None, True])  # in the loop (CPU's default), on the writer thread
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_interrupted_extraction_resumes_to_the_same_bytes(setup, uninterrupted, tmp_path, monkeypatch, sig,
                                                          write_behind):
    out = tmp_path / "r.h5"
    partial = tmp_path / "r.h5.partial"
    seen = []
    real = extraction.extract_batch

    def first(*a, **k):
        seen.append(tuple(k["prompt_ids"]))
        if len(seen) == 2:
            os.kill(os.getpid(), sig)  # arrives during batch 2: it finishes, is committed, then the job stops
        return real(*a, **k)

    monkeypatch.setattr(extraction, "extract_batch", first)
    with pytest.raises(extraction.ExtractionInterrupted) as ei:
        extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=lambda *a: None,
                                   write_behind=write_behind, **RESUME_KW)
    assert ei.value.exit_code == 128 + sig and ei.value.signum == sig
    assert signal.getsignal(sig) is signal.SIG_DFL  # the handler is gone again
    assert not out.exists() and partial.exists() and len(seen) == 2
    with h5py.File(partial, "r") as f:
        assert f["resume/done"][()].tolist() == [1, 1, 0, 0, 0]
    with pytest.raises(StoreError):
        open_activations(partial)
    logs = []
    again = _counting(monkeypatch)
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=logs.append, **RESUME_KW)
    ids = {r["id"] for r in PROMPTS}
    assert len(again) == 3 and set(again).isdisjoint(seen)  # only the missing rows were computed
    assert {p for b in seen + again for p in b} == ids
    assert any("resuming" in m and "2 of 5 batches" in m for m in logs), logs
    assert not partial.exists()
    same_datasets(uninterrupted, out)
    open_activations(out, model="tiny-llama").close()


@pytest.mark.parametrize("write_behind", [False, True], ids=["in-loop", "write-behind"])
@pytest.mark.parametrize("when", ["last batch", "commit"])
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_after_the_last_batch_started(setup, uninterrupted, tmp_path, monkeypatch, sig, when, write_behind):
    """A signal once the last batch has started (a scancel or SLURM's warning that lands at the end of an
    extraction), or during the commit itself. SIGTERM during the last batch (the job is ending; Snakemake removes
    a failed job's outputs): stopped with all 5 batches in the partial file, and the rerun computes nothing, only
    commits. SIGUSR1 there (the warning: time left), and either signal during the commit: the file is committed
    complete (the same bytes as an uninterrupted run, no ``.partial`` left) with a log line naming the signal; the
    process is never killed half way through the commit (SIGTERM's default action); the handler is restored. The
    same with the writer thread (``write_behind``, the default on accelerators)."""
    from llmgeom.core.writer import ActivationWriter

    out, logs = tmp_path / "r.h5", []
    n_batches = len(PROMPTS)  # batch_size 1
    if when == "last batch":
        seen = []

        def last(*a, **k):
            seen.append(1)
            if len(seen) == n_batches:
                os.kill(os.getpid(), sig)
            return _REAL_EXTRACT_BATCH(*a, **k)

        monkeypatch.setattr(extraction, "extract_batch", last)
    else:
        real_commit = ActivationWriter.commit

        def commit(self):
            os.kill(os.getpid(), sig)
            return real_commit(self)

        monkeypatch.setattr(ActivationWriter, "commit", commit)
    run = lambda: extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=logs.append,  # noqa: E731
                                             write_behind=write_behind, **RESUME_KW)
    if when == "last batch" and sig == signal.SIGTERM:
        with pytest.raises(extraction.ExtractionInterrupted, match=f"after {n_batches} of {n_batches} batches"):
            run()
        assert not out.exists() and committed_batches(tmp_path / "r.h5.partial") == n_batches
        monkeypatch.setattr(extraction, "extract_batch", _REAL_EXTRACT_BATCH)
        again = _counting(monkeypatch)
        assert run() == out and again == []  # nothing computed: verified and committed
        assert any(f"resumed; {n_batches} of {n_batches} batches were committed before, 0 computed now" in m
                   for m in logs), logs
    else:
        assert run() == out
        assert any(f"{signal.Signals(sig).name} arrived after the last batch" in m and f"all {n_batches} batches"
                   in m for m in logs), logs
    assert signal.getsignal(sig) is signal.SIG_DFL
    assert not (tmp_path / "r.h5.partial").exists()
    same_datasets(uninterrupted, out)
    open_activations(out, model="tiny-llama").close()


def test_partial_from_other_settings_or_corrupted_is_discarded(setup, uninterrupted, tmp_path, monkeypatch):
    out = tmp_path / "d.h5"
    partial = tmp_path / "d.h5.partial"
    _counting(monkeypatch, stop_after=3)
    with pytest.raises(extraction.ExtractionInterrupted):
        extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=lambda *a: None, **RESUME_KW)
    keep = tmp_path / "keep.partial"
    shutil.copy(partial, keep)
    # other settings (top_k): discarded, everything computed again
    logs = []
    seen = _counting(monkeypatch)
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=logs.append, **{**RESUME_KW, "top_k": 5})
    assert len(seen) == 5 and any("discarding" in m and "other inputs" in m for m in logs), logs
    # a committed batch whose bytes changed: discarded, and the result is still the uninterrupted file
    out.unlink()
    shutil.copy(keep, partial)
    with h5py.File(partial, "r+") as f:  # valid HDF5 (checksums of the new bytes pass), other values
        f["next_token/entropy"][:] = f["next_token/entropy"][()] + 1.0
    logs = []
    seen = _counting(monkeypatch)
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=logs.append, **RESUME_KW)
    assert len(seen) == 5 and any("discarding" in m and "sha256" in m for m in logs), logs
    same_datasets(uninterrupted, out)
    # a partial that is not an HDF5 file at all
    out.unlink()
    partial.write_bytes(b"garbage")
    logs = []
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=logs.append, **RESUME_KW)
    assert any("discarding" in m and "not a readable HDF5 file" in m for m in logs), logs
    same_datasets(uninterrupted, out)


def test_partial_written_by_other_code_is_discarded(setup, uninterrupted, tmp_path, monkeypatch):
    """The resume key holds the hash of the code that writes the file (``core.versions.source_sha256`` of
    ``extract.forward.EXTRACTION_CODE``): a partial written by other code of the same package version (here: a
    stand-in hash) is discarded with a log line and everything is extracted again, to the uninterrupted file."""
    out = tmp_path / "c.h5"
    monkeypatch.setattr(extraction, "source_sha256", lambda *subs: "other code")
    _counting(monkeypatch, stop_after=3)
    with pytest.raises(extraction.ExtractionInterrupted):
        extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=lambda *a: None, **RESUME_KW)
    monkeypatch.undo()
    logs = []
    seen = _counting(monkeypatch)
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=logs.append, **RESUME_KW)
    assert len(seen) == 5 and any("discarding" in m and "package code" in m for m in logs), logs
    same_datasets(uninterrupted, out)


def test_source_sha256_known_answer_and_the_extraction_code_it_covers(tmp_path, monkeypatch):
    """``source_sha256``: the sha256 of each ``.py`` file's path (relative to the package) and bytes, in path order;
    an edit changes it. ``EXTRACTION_CODE`` holds every module the extraction runs (its import closure)."""
    import hashlib

    from llmgeom.core import versions
    from llmgeom.pipeline import code_tracking

    (tmp_path / "core" / "sub").mkdir(parents=True)
    (tmp_path / "core" / "b.py").write_bytes(b"x = 1\n")
    (tmp_path / "core" / "sub" / "a.py").write_bytes(b"y = 2\n")
    (tmp_path / "core" / "notes.txt").write_bytes(b"not code")
    monkeypatch.setattr(versions, "PACKAGE_DIR", tmp_path)
    want = hashlib.sha256(b"\0core/b.py\0x = 1\n" + b"\0core/sub/a.py\0y = 2\n").hexdigest()
    assert versions.source_sha256("core") == want
    (tmp_path / "core" / "b.py").write_bytes(b"x = 3\n")
    assert versions.source_sha256("core") != want
    with pytest.raises(ValueError, match="llmgeom.nowhere"):
        versions.source_sha256("nowhere")
    monkeypatch.undo()
    closure = code_tracking.package_modules("extract.forward")
    assert closure and {m.split(".")[0] for m in closure} <= set(extraction.EXTRACTION_CODE), closure


_RESUME_CHILD = textwrap.dedent("""
    import json, pathlib, sys, time
    import torch
    import llmgeom.extract.forward as E

    torch.set_num_threads(int(sys.argv[6]))  # the parent's: a CPU reduction's order (last bits) follows the threads

    real, n = E.extract_batch, [0]

    def slow(*a, **k):
        n[0] += 1
        if n[0] == 3:
            pathlib.Path(sys.argv[4]).write_text("half")
            time.sleep(2)  # the signal arrives while this batch is in flight
        return real(*a, **k)

    E.extract_batch = slow
    E.extract_to_hdf5(sys.argv[1], sys.argv[2], sys.argv[3], log=print, **json.loads(sys.argv[5]))
""")


def test_subprocess_stopped_by_sigusr1_exits_non_zero_and_resumes(setup, uninterrupted, tmp_path, monkeypatch):
    import torch

    out = tmp_path / "s.h5"
    marker = tmp_path / "half"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-c", _RESUME_CHILD, str(setup["prepared"]), str(setup["prompts"]),
                             str(out), str(marker), json.dumps(RESUME_KW), str(torch.get_num_threads())], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        _wait_for(marker, proc, "reach its third batch", 120)
        os.kill(proc.pid, signal.SIGUSR1)
        text = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, text  # an uncaught ExtractionInterrupted: non-zero, after a clean close
    assert "stopped by SIGUSR1 after 3 of 5 batches" in text, text
    assert not out.exists() and (tmp_path / "s.h5.partial").exists()
    seen = _counting(monkeypatch)
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=lambda *a: None, **RESUME_KW)
    assert len(seen) == 2
    same_datasets(uninterrupted, out)


def test_no_bare_dataset_name_outside_the_store():
    """A dataset is named once: code in src/ and workflow/ outside core/store.py names it through ``store.DS``
    (derived from CONTRACT), never as a bare string literal (issue 30 item 3)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    names = sorted(store.CONTRACT, key=len, reverse=True)
    pat = re.compile(r"""(["'])(%s)\1""" % "|".join(re.escape(n) for n in names))
    files = [p for p in [*(root / "src").rglob("*.py"), *(root / "workflow").rglob("*.py"),
                         *(root / "workflow").rglob("*.smk"), *(root / "workflow").rglob("Snakefile")]
             if p != root / "src/llmgeom/core/store.py"]
    assert len(files) > 50
    bad = [f"{p.relative_to(root)}:{i}: {m.group(0)}" for p in files
           for i, line in enumerate(p.read_text().splitlines(), 1) for m in pat.finditer(line)]
    assert not bad, "bare dataset names (use llmgeom.core.store.DS):\n" + "\n".join(bad)
    assert pat.search('x = f["last_token/values"]') and not pat.search("x = f[DS.LAST_TOKEN_VALUES]")


def test_ds_constants_are_the_contract():
    assert sorted(vars(store.DS).values()) == sorted(store.CONTRACT)
    assert store.DS.LAST_TOKEN_VALUES == "last_token/values" and store.DS.ATTENTION_ENTROPY == "attention/entropy"
