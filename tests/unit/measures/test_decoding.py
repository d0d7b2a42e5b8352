"""Margin-adaptive decoding (LSM; issue 20 item 2): the NLL identity, the histogram log-partition, ECE, and
a synthetic model whose best temperature per margin bin is known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp, softmax

from llmgeom.measures import decoding as dec

T_TRUE = np.array([1.8, 1.0, 0.6])


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(0)
    n, V = 6000, 40
    u = rng.standard_normal((n, V)) * rng.uniform(0.5, 3.0, (n, 1))
    s = np.sort(u, 1)
    m = s[:, -1] - s[:, -2]
    edges = np.quantile(m, [1 / 3, 2 / 3])
    T = T_TRUE[np.searchsorted(edges, m, side="right")]
    p = softmax(u / T[:, None], axis=1)
    y = (p.cumsum(1) > rng.uniform(size=(n, 1))).argmax(1)
    return u, y, edges, np.repeat(np.arange(200), n // 200)


def test_position_stats_known_answers(synthetic):
    """Next-token logit, top-1 / top-2, the histogram and correctness of each position, against the logits."""
    u, y, _, _ = synthetic
    st = dec.position_stats(u[:300], np.eye(u.shape[1]), next_ids=y[:300], batch=7, n_bins=2048)
    s = np.sort(u[:300], axis=1)
    np.testing.assert_allclose(st["z_next"], u[np.arange(300), y[:300]], rtol=1e-6)
    np.testing.assert_allclose(st["z_max"], s[:, -1], rtol=1e-6)
    np.testing.assert_allclose(st["margin"], s[:, -1] - s[:, -2], atol=1e-5)
    assert (st["correct"] == (y[:300] == u[:300].argmax(1))).all() and 0 < st["correct"].sum() < 300
    assert (st["hist_count"].sum(1) == u.shape[1]).all()
    for bad in (y[:2], y[:3] - 100, y[:3].astype(float)):
        with pytest.raises(ValueError, match="next_ids"):
            dec.position_stats(u[:3], np.eye(u.shape[1]), next_ids=bad, n_bins=2048)


def test_histogram_log_partition_matches_exact():
    rng = np.random.default_rng(1)
    u = (rng.standard_normal((100, 5000)) * 3).astype(np.float32)
    st = dec.position_stats(u, np.eye(5000), next_ids=np.zeros(100, int), n_bins=2048)
    for beta in (0.25, 1.0, 4.0):
        np.testing.assert_allclose(dec.log_partition(st, beta), logsumexp(beta * u.astype(np.float32), axis=1),
                                   atol=1e-3)


def test_ece_known_answers():
    conf = np.r_[np.full(50, 0.2), np.full(50, 0.8)]
    ok = np.r_[np.ones(10), np.zeros(40), np.ones(40), np.zeros(10)]
    assert dec.ece(conf, ok, n_bins=2) == pytest.approx(0.0, abs=1e-12)
    assert dec.ece(np.full(10, 0.9), np.zeros(10), n_bins=5) == pytest.approx(0.9)


def test_margin_temperatures_recover_the_true_ones(synthetic):
    u, y, edges, passages = synthetic
    st = dec.position_stats(u, np.eye(u.shape[1]), next_ids=y, n_bins=2048)
    fit = dec.fit_margin_temperatures(st, np.arange(len(y)), edges=edges, n_margin_bins=4)
    np.testing.assert_allclose(fit["temperatures"], T_TRUE, rtol=0.1)
    r = dec.compare_schemes(st, passages, edges=edges, n_boot=100, calibration_fraction=0.5, n_margin_bins=4,
                            ece_bins=10, ci=0.95)
    assert r["delta_nll_adaptive_vs_single_hi"] < 0 < r["nll_t1"] - r["nll_adaptive"]
    assert r["delta_nll_adaptive_vs_single_lo"] <= r["delta_nll_adaptive_vs_single"]


def test_sample_next_token_agrees_with_the_nll_identity(tmp_path):
    """``tokens/sample_next_token`` of a tiny model's corpus file: the token after each sampled position (-1 at a
    passage's last token), and its logit z[next] = logsumexp(z) - nll (the recovery from ``tokens/nll`` that the
    decoding analysis used before the dataset existed); the decoding table drops exactly the -1 samples."""
    from transformers import AutoTokenizer

    from llmgeom.analyses.decoding import decoding_table
    from llmgeom.core.store import open_activations
    from llmgeom.extract.forward import extract_to_hdf5
    from llmgeom.models import sources as models, tiny as testing
    from llmgeom.prompts.io import write_prompt_set
    from llmgeom.weights.unembedding import load_unembedding

    src = testing.save_tiny_model_dir("llama", tmp_path / "src")
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    texts = ["abcdefghij klmno", "pqr stuvw xyz", "Zyx w vu", "hello world again and again"] * 3
    write_prompt_set([{"id": f"c{i}", "text": t, "meta": {}} for i, t in enumerate(texts)], tmp_path / "corpus.jsonl")
    out = tmp_path / "corpus.h5"
    extract_to_hdf5(prepared, tmp_path / "corpus.jsonl", out, model_name="tiny", dtype="float32", device="cpu",
                    batch_size=3, corpus=True, attention=False, sample_per_prompt=6, log=lambda *a: None, top_k=10, device_map=None)
    tok = AutoTokenizer.from_pretrained(src)
    with open_activations(out, model="tiny") as f:
        sp, spos = f["tokens/sample_prompt"][:], f["tokens/sample_position"][:]
        nxt = f["tokens/sample_next_token"][:]
        H = f["tokens/final_normed_sample"][:]
        key = {(int(p), int(t)): float(v) for p, t, v in zip(f["tokens/prompt"][:], f["tokens/position"][:],
                                                             f["tokens/nll"][:])}
    ids = [tok(t, add_special_tokens=True)["input_ids"] for t in texts]
    want = [ids[p][t + 1] if t + 1 < len(ids[p]) else -1 for p, t in zip(sp, spos)]
    assert nxt.dtype == np.int32 and nxt.tolist() == want and (nxt == -1).any() and (nxt >= 0).sum() > 20
    W, b, _ = load_unembedding(prepared)
    z = H.astype(np.float64) @ W.T.astype(np.float64) + (0 if b is None else b)
    has = nxt >= 0
    assert all((int(p), int(t)) in key for p, t in zip(sp[has], spos[has]))
    nll = np.array([key[(int(p), int(t))] for p, t in zip(sp[has], spos[has])])
    np.testing.assert_allclose(logsumexp(z[has], axis=1) - nll, z[has, nxt[has]], atol=1e-4)
    df = decoding_table(out, (W, b, None), model="tiny", n_boot=10, n_bins=16, calibration_fraction=0.5, n_margin_bins=4, ece_bins=10, ci=0.95, seed=0)
    assert (df.n_dropped_no_nll == int((~has).sum())).all()
    assert (df.next_token_source == "tokens/sample_next_token").all()
    from replicate_checks import assert_replicates_reproduce  # issue 48 point 4: the table's replicate cells

    for d in ("delta_nll_adaptive_vs_single", "delta_ece_adaptive_vs_single"):
        assert assert_replicates_reproduce(df, d, ci=0.95, n_boot=10) == len(df) == 3


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt_neox", "phi", "opt_proj", "gpt2"])
def test_load_unembedding_reads_only_the_head(tmp_path, family):
    """The head's tensors read from the safetensors file equal those of the fully loaded model (tied and untied
    heads, an output bias, OPT's projected unembedding), and no model is loaded for them; GPT-NeoX, whose
    checkpoint key (embed_out) transformers renames at load (lm_head), is loaded whole: the same arrays."""
    import torch

    from llmgeom.models import architectures as arch, loading, sources as models, tiny as testing
    from llmgeom.weights.unembedding import load_unembedding

    src = testing.save_tiny_model_dir(family, tmp_path / "src")
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    loads = dict(loading.LOADS)
    W, b, cap = load_unembedding(prepared)
    assert (loading.LOADS == loads) == (family != "gpt_neox")  # the head was read without loading the model
    model, _ = loading.load_prepared(prepared, dtype="float32", device="cpu")
    W_ref, b_ref = arch.unembedding(model)
    assert W.dtype == np.float32 and np.array_equal(W, W_ref.detach().to(torch.float32).numpy())
    assert (b is None) == (b_ref is None) and (b is None or np.array_equal(b, b_ref.detach().numpy()))
    assert cap == arch.logit_softcap(model)


def test_compare_schemes_replicates_reproduce_the_intervals(synthetic):
    """The paired bootstrap's replicates (issue 48 point 4): the interval is the basic interval of them, and
    decoding_table's cells hold them as text."""
    from llmgeom.core.stats import bootstrap_interval, parse_replicates, replicates_text

    u, y, _edges, passages = synthetic
    V = u.shape[1]
    st = dec.position_stats(u.astype(np.float32), np.eye(V, dtype=np.float32), np.zeros(V, np.float32), None,
                            next_ids=y, n_bins=64)
    r = dec.compare_schemes(st, passages, calibration_fraction=0.5, n_margin_bins=3, ece_bins=10, n_boot=30, ci=0.9,
                            seed=0)
    for d in ("delta_nll_adaptive_vs_single", "delta_ece_adaptive_vs_single"):
        reps = r[f"{d}_replicates"]
        assert reps.shape == (30,) and np.ptp(reps) > 0
        assert bootstrap_interval(r[d], reps, ci=0.9) == (r[f"{d}_lo"], r[f"{d}_hi"])
        np.testing.assert_allclose(bootstrap_interval(r[d], parse_replicates(replicates_text(reps)), ci=0.9),
                                   (r[f"{d}_lo"], r[f"{d}_hi"]), rtol=0, atol=1e-9)
