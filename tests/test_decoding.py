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


def test_nll_identity_equals_next_ids(synthetic):
    u, y, _, _ = synthetic
    nll = logsumexp(u, axis=1) - u[np.arange(len(y)), y]
    a = dec.position_stats(u[:300], np.eye(u.shape[1]), next_ids=y[:300])
    b = dec.position_stats(u[:300], np.eye(u.shape[1]), nll=nll[:300])
    np.testing.assert_allclose(a["z_next"], b["z_next"], atol=1e-5)
    assert (a["correct"] == b["correct"]).all() and (a["correct"] == (y[:300] == u[:300].argmax(1))).all()
    with pytest.raises(ValueError, match="exactly one"):
        dec.position_stats(u[:3], np.eye(u.shape[1]))


def test_histogram_log_partition_matches_exact():
    rng = np.random.default_rng(1)
    u = (rng.standard_normal((100, 5000)) * 3).astype(np.float32)
    st = dec.position_stats(u, np.eye(5000), next_ids=np.zeros(100, int))
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
    st = dec.position_stats(u, np.eye(u.shape[1]), next_ids=y)
    fit = dec.fit_margin_temperatures(st, np.arange(len(y)), edges=edges)
    np.testing.assert_allclose(fit["temperatures"], T_TRUE, rtol=0.1)
    r = dec.compare_schemes(st, passages, edges=edges, n_boot=100)
    assert r["delta_nll_adaptive_vs_single_hi"] < 0 < r["nll_t1"] - r["nll_adaptive"]
    assert r["delta_nll_adaptive_vs_single_lo"] <= r["delta_nll_adaptive_vs_single"]


@pytest.mark.parametrize("family", ["gpt2", "gemma3"])
def test_next_ids_from_nll_on_a_tiny_models_corpus_file(family, tmp_path):
    """On a real extraction (tiny model, corpus mode), logsumexp(z) - nll at the sampled positions is the logit of
    the true next token: the one read off prompts/text tokenized by the model's own tokenizer."""
    import h5py
    from llmgeom.extract import forward as extraction
    from llmgeom.models import sources as models, tiny as testing
    from llmgeom.models.loading import load_tokenizer
    from llmgeom.prompts.io import write_prompt_set
    from llmgeom.weights.unembedding import load_unembedding

    src = testing.save_tiny_model_dir(family, tmp_path / "src")
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "sigma", "omega", "tau", "rho"]
    recs = [{"id": f"p{i}", "text": " ".join(rng.choice(words, 12)), "meta": {}} for i in range(6)]
    write_prompt_set(recs, tmp_path / "corpus.jsonl")
    out = tmp_path / "corpus.h5"
    extraction.extract_to_hdf5(prepared, tmp_path / "corpus.jsonl", out, model_name="tiny", dtype="float32",
                               device="cpu", batch_size=2, corpus=True, sample_per_prompt=5, attention=False,
                               log=lambda *a: None)
    W, b, cap = load_unembedding(prepared)
    tok = load_tokenizer(prepared)
    with h5py.File(out, "r") as f:
        H = f["tokens/final_normed_sample"][:]
        sp, spos = f["tokens/sample_prompt"][:], f["tokens/sample_position"][:]
        key = dict(zip(zip(f["tokens/prompt"][:], f["tokens/position"][:]), f["tokens/nll"][:]))
        texts = [t.decode() if isinstance(t, bytes) else str(t) for t in f["prompts/text"][:]]
    ids = [tok(t, add_special_tokens=True)["input_ids"] for t in texts]
    true_next = np.array([ids[p][t + 1] for p, t in zip(sp, spos)])
    nll = np.array([key[(p, t)] for p, t in zip(sp, spos)])
    z = dec.unembed_logits(H, W, b, cap).astype(np.float64)
    z_next = dec.next_token_logit(logsumexp(z, axis=1), nll)
    recovered = np.abs(z - z_next[:, None]).argmin(axis=1)
    assert len(true_next) == 30
    np.testing.assert_array_equal(recovered, true_next)
    np.testing.assert_allclose(z_next, z[np.arange(len(z)), true_next], atol=1e-4)
