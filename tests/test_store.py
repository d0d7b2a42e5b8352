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

from llmgeom.models import architectures as arch
from llmgeom.extract import forward as extraction
from llmgeom.models import sources as models, tiny as testing
from llmgeom.core import store
from llmgeom.core.store import CONTRACT_VERSION, StoreError, open_activations
from llmgeom.prompts.io import write_prompt_set
from llmgeom.models.loading import load_prepared

FIX = r"run rule extract"  # "rerun rule extract" contains it too

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
                               batch_size=2, top_k=7, log=lambda *a: None)
    corpus = d / "acts" / "corpus.h5"
    extraction.extract_to_hdf5(prepared, prompts, corpus, model_name="tiny-llama", dtype="float32", device="cpu",
                               batch_size=3, top_k=7, corpus=True, sample_per_prompt=4, seed=3,
                               log=lambda *a: None)
    return dict(dir=d, src=src, prepared=prepared, manifest=manifest, prompts=prompts, h5=h5, corpus=corpus,
                sha=hashlib.sha256(prompts.read_bytes()).hexdigest())


def _str(x):
    return x.decode() if isinstance(x, bytes) else x


def test_round_trip_datasets_and_attributes(setup):
    model, tok = load_prepared(setup["prepared"], dtype="float32", attn="eager", device="cpu")
    s = arch.summarize(model.config)
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
        names = []
        f.visit(lambda x: names.append(x) if isinstance(f[x], h5py.Dataset) else None)
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
        pairs = {"last_token/residual": "residual", "last_token/final_normed": "final_normed",
                 "last_token/values": "values", "last_token/keys": "keys", "attention/entropy": "attn_entropy",
                 "last_token/attn_output": "attn_output",
                 "next_token/entropy": "next_entropy", "next_token/top_logits": "top_logits"}
        for x, k in pairs.items():
            np.testing.assert_allclose(f[x][()], ref[k], atol=1e-5, rtol=0, err_msg=x)
        np.testing.assert_array_equal(f["next_token/top_ids"][()], ref["top_ids"])


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
        np.testing.assert_allclose(f["tokens/residual_sample"][()], ref["residual_sample"], atol=1e-5, rtol=0)
        for x, k in (("tokens/margin", "margin"), ("tokens/nll", "nll"), ("tokens/entropy", "tok_entropy")):
            np.testing.assert_allclose(f[x][()], ref[k], atol=1e-5, rtol=0, err_msg=x)
            assert f[x].attrs["units"] in ("logits", "nats")
        np.testing.assert_array_equal(f["tokens/prompt"][()], ref["tok_prompt"])
        np.testing.assert_array_equal(f["tokens/position"][()], ref["tok_position"])
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
                                   dtype="float32", device="cpu", log=lambda *a: None)
    assert not out.exists()
    assert not out.with_name("fail.h5.partial").exists()


_CHILD = textwrap.dedent("""
    import pathlib, sys, time
    import llmgeom.extract.forward as E

    def slow(*a, **k):
        pathlib.Path(sys.argv[4]).write_text("started")
        time.sleep(300)

    E.extract_batch = slow
    E.extract_to_hdf5(sys.argv[1], sys.argv[2], sys.argv[3], model_name="tiny-llama", dtype="float32",
                      device="cpu", batch_size=1, log=lambda *a: None)
""")


def test_killed_write_leaves_only_partial(setup, tmp_path):
    out = tmp_path / "killed.h5"
    partial = tmp_path / "killed.h5.partial"
    marker = tmp_path / "started"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(setup["prepared"]), str(setup["prompts"]), str(out),
                             str(marker)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not marker.exists():
            if proc.poll() is not None:
                pytest.fail(f"child exited early: {proc.stdout.read().decode()[-2000:]}")
            if time.time() > deadline:
                pytest.fail("child did not reach extraction within 60 s")
            time.sleep(0.05)
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
                               device="cpu", log=lambda *a: None)
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


def test_writer_refuses_non_finite_and_abort_removes_partial(tmp_path):
    out = tmp_path / "w.h5"
    w = store.ActivationWriter(out, {"model": "m", "architecture": {"a": 1}, "revision": None},
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
    w2 = store.ActivationWriter(tmp_path / "v.h5", {"model": "m"}, {"next_token/entropy": ((2,), "float32")})
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
    sets, _ = sula.build_sula_sets(testing.tiny_tokenizer(), label_pairs=[("x", "y"), ("p", "q")], prefix="",
                                   ks=[0, 1, 2, 4], n_per_k=5, n_per_k_controls=4, seed=0, conditions=["main"])
    _write_prompts(d / "main.jsonl", sets["main"])
    out = d / "sula_main.h5"
    extraction.extract_to_hdf5(setup["prepared"], d / "main.jsonl", out, model_name="tiny-llama", dtype="float32",
                               device="cpu", batch_size=3, attention=False, candidates_key=sula.CANDIDATES_KEY,
                               log=lambda *a: None)
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
    id_kw = dict(model=m, estimators=("twonn",), n_subsamples=1, subsample_size=20, seed=0, min_points=10)
    id_clean = intrinsic_dimension_table(setup["corpus"], **id_kw)
    return {
        "value_manifold": (setup["h5"], lambda p: value_manifold_table({"mixed": p}, model=m, n_boot=2, seed=0)),
        "domain_restriction": (setup["h5"], lambda p: domain_restriction_tables(
            {"mixed": p, "dom": p}, model=m, mixed_set="mixed", n_quantiles=1, per_quantile=4, n_boot=2,
            log=lambda *a: None)),
        "attention_focusing": (setup["h5"], lambda p: attention_focusing_tables(p, model=m)),
        "intrinsic_dimension": (setup["corpus"], lambda p: intrinsic_dimension_table(p, **id_kw)),
        "curvature": (setup["corpus"], lambda p: curvature_table(p, id_clean, model=m, k=5, n_points=20,
                                                                 min_points=10)),
        "margins": (setup["corpus"], lambda p: margin_tables(p, model=m, n_boot=2, min_count=1)),
        "fisher": (setup["corpus"], lambda p: fisher_tables(p, unemb, model=m, n_positions=8, max_tokens=16)),
        "sula": (sula_h5, lambda p: sula_tables({"main": p}, model=m, n_bins=2)),
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
            assert ds.compression == "lzf" and ds.fletcher32 and ds.chunks, (name, ds.chunks)
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
    """Numeric datasets of every kind (N-D per-row chunks, 1-D, int and float) have Fletcher-32 after lzf;
    strings carry a recorded sha256."""
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
                assert ds.fletcher32 and ds.compression == "lzf", x
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
        value_manifold_table({"mixed": bad}, model="tiny-llama", n_boot=2, seed=0)
