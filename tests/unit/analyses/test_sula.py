"""SULA: exact posterior (known answers), prompt generation, label-token selection, candidate
log-probabilities in the HDF5 store, and the tables."""

import math

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from llmgeom.extract import forward as extraction
from llmgeom.prompts import sula
from llmgeom.models import sources as models, tiny as testing
from llmgeom.prompts.io import read_prompt_set, write_prompt_set
from llmgeom.analyses.sula import calibration_table, read_sula_h5, sula_tables
from llmgeom.measures.bayes import bayes_posterior, binary_entropy_bits, h_bayes_bits, model_label_entropy

# --------------------------------------------------------------------------- exact posterior


def test_k0_gives_one_bit():
    assert float(bayes_posterior(0, 0, alpha=0.9)) == 0.5
    assert float(h_bayes_bits(0, 0, alpha=0.9)) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4, 8, 20])
def test_all_agreeing_gives_closed_form(k):
    want = 1.0 / (1.0 + 9.0 ** -k)
    q = 9.0 ** -k / (1.0 + 9.0 ** -k)  # 1 - want without cancellation
    assert float(bayes_posterior(k, 0, alpha=0.9)) == pytest.approx(want, rel=1e-12)
    assert float(bayes_posterior(0, k, alpha=0.9)) == pytest.approx(q, rel=1e-9)
    h = -(want * math.log2(want) + q * math.log2(q))
    assert float(h_bayes_bits(k, 0, alpha=0.9)) == pytest.approx(h, rel=1e-9)
    assert float(h_bayes_bits(0, k, alpha=0.9)) == pytest.approx(h, rel=1e-9)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_equal_counts_give_one_bit(n):
    assert float(h_bayes_bits(n, n, alpha=0.9)) == pytest.approx(1.0, abs=1e-12)
    assert float(bayes_posterior(n, n, alpha=0.7)) == 0.5


def test_posterior_vectorized_stable_and_monotone():
    n1 = np.array([0, 1, 2, 5, 8, 400])
    n2 = np.array([0, 0, 1, 3, 0, 0])
    p = bayes_posterior(n1, n2, alpha=0.9)
    assert p.shape == (6,)
    assert np.all(np.diff(bayes_posterior(np.arange(10), 0, alpha=0.9)) > 0)
    h = h_bayes_bits(n1, n2, alpha=0.9)
    assert np.all((h >= 0) & (h <= 1)) and np.isfinite(h).all()
    assert h[-1] == pytest.approx(0.0, abs=1e-12)  # 9^-400 underflows: no NaN
    # only the difference matters
    assert float(h_bayes_bits(5, 3, alpha=0.9)) == pytest.approx(float(h_bayes_bits(2, 0, alpha=0.9)), rel=1e-12)
    # alpha = 0.5: labels carry no evidence
    assert float(h_bayes_bits(8, 0, alpha=0.5)) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        bayes_posterior(1, 0, alpha=1.0)
    with pytest.raises(ValueError):
        bayes_posterior(-1, 0, alpha=0.9)


def test_binary_entropy_and_model_renormalization():
    assert binary_entropy_bits([0.0, 0.5, 1.0]).tolist() == [0.0, 1.0, 0.0]
    p = 0.2
    assert float(binary_entropy_bits(p)) == pytest.approx(-(p * math.log2(p) + 0.8 * math.log2(0.8)))
    with pytest.raises(ValueError):
        binary_entropy_bits(1.5)
    # renormalization over the two labels ignores the rest of the vocabulary
    lp1, lp2 = np.log([0.02, 0.3]), np.log([0.02, 0.1])
    pm, hm = model_label_entropy(lp1, lp2)
    np.testing.assert_allclose(pm, [0.5, 0.75])
    np.testing.assert_allclose(hm, [1.0, float(binary_entropy_bits(0.75))], rtol=1e-12)
    pm, hm = model_label_entropy(np.array([-1.0]), np.array([-900.0]))
    assert pm[0] == 1.0 and hm[0] == pytest.approx(0.0, abs=1e-12)


# --------------------------------------------------------------------------- prompt generation

PAIRS = [{"labels": ["pim", "dop"], "token_ids": [11, 12]}, {"labels": ["bif", "wob"], "token_ids": [13, 14]}]


def test_generate_sula_structure_and_posteriors():
    sets = sula.generate_sula(PAIRS, ks=[0, 1, 2, 4, 8], n_per_k=6, n_per_k_controls=3, alpha=0.9, seed=1, mask="[MASK]", label_prefix=" ", conditions=("main", "remap", "shuffled", "ablation"))
    assert set(sets) == set(sula.CONDITIONS)
    assert len(sets["main"]) == 30 and all(len(sets[c]) == 15 for c in ("remap", "shuffled", "ablation"))
    for cond, recs in sets.items():
        ids = [r["id"] for r in recs]
        assert len(set(ids)) == len(ids)
        for r in recs:
            m = r["meta"]
            assert m["condition"] == cond and m["n_L1"] + m["n_L2"] == m["k"]
            assert r["text"].count("\n") == m["k"] and r["text"].endswith(":")
            assert m["candidate_token_ids"] == (PAIRS[1] if cond == "remap" else PAIRS[0])["token_ids"]
            assert m["labels"] == (PAIRS[1] if cond == "remap" else PAIRS[0])["labels"]
            lines = r["text"].split("\n")
            for line, e in zip(lines[:-1], m["example_labels"]):
                assert line.endswith(": " + m["labels"][e])
            if cond == "shuffled":
                assert m["h_bayes_bits"] == 1.0 and m["p_bayes"] == 0.5 and m["y"] is None
                assert m["h_counts_bits"] == pytest.approx(float(h_bayes_bits(m["n_L1"], m["n_L2"], alpha=0.9)))
            else:
                assert m["h_bayes_bits"] == pytest.approx(float(h_bayes_bits(m["n_L1"], m["n_L2"], alpha=0.9)))
                assert m["p_bayes"] == pytest.approx(float(bayes_posterior(m["n_L1"], m["n_L2"], alpha=0.9)))
            if m["k"] == 0:
                assert m["h_bayes_bits"] == 1.0
            want = 0.9 * m["p_bayes"] + 0.1 * (1 - m["p_bayes"])
            assert m["p_pred"] == pytest.approx(want)
            assert m["h_pred_bits"] >= float(binary_entropy_bits(0.9)) - 1e-12
            if cond == "ablation":
                assert all(line.startswith("[MASK]:") for line in lines)
    # controls are paired with main: same carriers / counts (remap, ablation), same carriers (shuffled)
    main = {(r["meta"]["k"], r["meta"]["i"]): r for r in sets["main"]}
    for r in sets["remap"]:
        mr = main[(r["meta"]["k"], r["meta"]["i"])]
        assert mr["text"].replace("pim", "bif").replace("dop", "wob") == r["text"]
        assert r["meta"]["h_bayes_bits"] == mr["meta"]["h_bayes_bits"]
    for r in sets["ablation"]:
        mr = main[(r["meta"]["k"], r["meta"]["i"])]
        assert r["meta"]["example_labels"] == mr["meta"]["example_labels"]
    for r in sets["shuffled"]:
        mr = main[(r["meta"]["k"], r["meta"]["i"])]
        assert [x.split(":")[0] for x in r["text"].split("\n")] == [x.split(":")[0] for x in mr["text"].split("\n")]


def test_generate_sula_labels_follow_alpha_and_are_seeded():
    sets = sula.generate_sula(PAIRS, ks=[8], n_per_k=400, conditions=("main", "shuffled"), alpha=0.9, seed=3, n_per_k_controls=25, mask="[MASK]", label_prefix=" ")
    agree = [np.mean([e == ("L1", "L2").index(r["meta"]["y"]) for e in r["meta"]["example_labels"]])
             for r in sets["main"]]
    assert np.mean(agree) == pytest.approx(0.9, abs=0.02)
    ys = [r["meta"]["y"] for r in sets["main"]]
    assert 0.4 < ys.count("L1") / len(ys) < 0.6
    sh = np.concatenate([r["meta"]["example_labels"] for r in sets["shuffled"]])
    assert np.mean(sh) == pytest.approx(0.5, abs=0.03)
    # seeded; more prompts per k keep the earlier ones unchanged
    again = sula.generate_sula(PAIRS, ks=[8], n_per_k=10, conditions=("main",), alpha=0.9, seed=3, n_per_k_controls=25, mask="[MASK]", label_prefix=" ")
    assert [r["text"] for r in again["main"]] == [r["text"] for r in sets["main"][:10]]
    other = sula.generate_sula(PAIRS, ks=[8], n_per_k=10, conditions=("main",), alpha=0.9, seed=4, n_per_k_controls=25, mask="[MASK]", label_prefix=" ")
    assert [r["text"] for r in other["main"]] != [r["text"] for r in again["main"]]


def test_generate_sula_errors():
    with pytest.raises(ValueError, match="main"):
        sula.generate_sula(PAIRS, conditions=("remap",), ks=(0, 1, 2, 4, 8), n_per_k=50, n_per_k_controls=25, alpha=0.9, seed=0, mask="[MASK]", label_prefix=" ")
    with pytest.raises(ValueError, match="label pairs"):
        sula.generate_sula(PAIRS[:1], conditions=("main", "remap"), ks=(0, 1, 2, 4, 8), n_per_k=50, n_per_k_controls=25, alpha=0.9, seed=0, mask="[MASK]", label_prefix=" ")
    with pytest.raises(ValueError, match="ks"):
        sula.generate_sula(PAIRS, ks=[-1], n_per_k=50, n_per_k_controls=25, alpha=0.9, seed=0, mask="[MASK]", label_prefix=" ", conditions=("main", "remap", "shuffled", "ablation"))


class _FakeTok:
    """Whitespace-and-colon tokenizer over a fixed vocabulary; unknown words split into characters."""

    name_or_path = "fake"

    def __init__(self, vocab):
        self.vocab = {w: i for i, w in enumerate(vocab)}

    def __call__(self, text, add_special_tokens=False):
        import re

        ids = []
        for piece in re.findall(r" ?[^ :\n]+|:|\n| ", text):
            if piece in self.vocab:
                ids.append(self.vocab[piece])
            else:
                ids.extend(1000 + ord(ch) for ch in piece)
        return {"input_ids": ids}


def test_choose_label_pairs_single_token_and_failure():
    tok = _FakeTok([" dop", " pim", " wob", " kel", " nud", "happy", "sad", "kind", " x"])
    pairs = sula.choose_label_pairs(tok, 2)
    # ("pim","dop") qualifies; ("bif","wob") does not (" bif" is not one token); ("kel","nud") is next
    assert [p["labels"] for p in pairs] == [["pim", "dop"], ["kel", "nud"]]
    assert pairs[0]["token_ids"] == [tok.vocab[" pim"], tok.vocab[" dop"]]
    with pytest.raises(sula.LabelTokenError, match=r"found 0.*' pim'|found 0.*not a single token"):
        sula.choose_label_pairs(_FakeTok(["happy"]), 1)
    with pytest.raises(sula.LabelTokenError, match="found 1"):
        sula.choose_label_pairs(tok, 2, pairs=[("pim", "dop"), ("bif", "wob")])


def test_choose_label_pairs_tiny_tokenizer_and_prefix():
    tok = testing.tiny_tokenizer()
    with pytest.raises(sula.LabelTokenError, match="sula.label_pairs"):
        sula.choose_label_pairs(tok, 2)  # a character tokenizer: " pim" is 4 tokens
    pairs = sula.choose_label_pairs(tok, 2, pairs=[("x", "y"), ("p", "q")], prefix="")
    assert [p["labels"] for p in pairs] == [["x", "y"], ["p", "q"]]


# --------------------------------------------------------------------------- extraction and tables


@pytest.fixture(scope="module")
def sula_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("sula")
    src = testing.save_tiny_model_dir("llama", d / "src")
    prepared = d / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    tok = testing.tiny_tokenizer()
    sets, pairs = sula.build_sula_sets(tok, label_pairs=[("x", "y"), ("p", "q")], label_prefix="", ks=[0, 1, 2, 4],
                                       n_per_k=5, n_per_k_controls=4, seed=0, alpha=0.9, mask="[MASK]", conditions=("main", "remap", "shuffled", "ablation"))
    paths = {}
    for cond, recs in sets.items():
        write_prompt_set(recs, d / f"{cond}.jsonl")
        paths[cond] = d / f"sula_{cond}.h5"
        extraction.extract_to_hdf5(prepared, d / f"{cond}.jsonl", paths[cond], model_name="tiny", dtype="float32",
                                   device="cpu", batch_size=3, attention=False, candidates_key=sula.CANDIDATES_KEY,
                                   log=lambda *a: None, top_k=10, sample_per_prompt=30, device_map=None)
    return dict(dir=d, prepared=prepared, sets=sets, pairs=pairs, paths=paths)


def test_candidate_logprobs_match_the_models_own_softmax(sula_run):
    from transformers import AutoModelForCausalLM

    path = sula_run["paths"]["main"]
    recs, _ = read_prompt_set(sula_run["dir"] / "main.jsonl")
    tok = testing.tiny_tokenizer()
    m = AutoModelForCausalLM.from_pretrained(sula_run["dir"] / "src", dtype=torch.float32).eval()
    with h5py.File(path, "r") as f:
        lp = f["next_token/candidate_logprobs"][:]
        ids = f["next_token/candidate_ids"][:]
        assert f["next_token/candidate_logprobs"].attrs["units"] == "log-probability (nats)"
        assert "attention/entropy" not in f
    assert lp.shape == (len(recs), 2) and lp.dtype == np.float32
    for i in (0, 7, len(recs) - 1):
        seq = tok(recs[i]["text"])["input_ids"]
        with torch.no_grad():
            logits = m(input_ids=torch.tensor([seq])).logits[0, -1].float()
        want = torch.log_softmax(logits, -1)[recs[i]["meta"]["candidate_token_ids"]].numpy()
        np.testing.assert_allclose(lp[i], want, atol=1e-5, rtol=0)
        assert ids[i].tolist() == recs[i]["meta"]["candidate_token_ids"]


def test_candidates_batch_invariant():
    m = testing.tiny_model("gemma3", attn="sdpa")
    seqs = [[1, 40, 41], [1, 10, 11, 12, 13, 14, 15]]
    both = extraction.extract_batch(m, seqs, attention=False, top_k=10, candidates=[[5, 6], [7, 8]])
    alone = extraction.extract_batch(m, seqs[1:], attention=False, top_k=10, candidates=[[7, 8]])
    np.testing.assert_allclose(both["next_token/candidate_logprobs"][1], alone["next_token/candidate_logprobs"][0], atol=1e-5)
    assert "next_token/candidate_logprobs" not in extraction.extract_batch(m, seqs, attention=False, top_k=10)


def test_bad_candidates_fail_clearly(tmp_path, sula_run):
    recs = [{"id": "a", "text": "ab:", "meta": {"candidate_token_ids": [5, 6]}},
            {"id": "b", "text": "cd:", "meta": {"candidate_token_ids": [5]}}]
    write_prompt_set(recs, tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="'b'.*candidate_token_ids"):
        extraction.extract_to_hdf5(sula_run["prepared"], tmp_path / "bad.jsonl", tmp_path / "bad.h5", model_name="tiny",
                                   dtype="float32", device="cpu", attention=False, candidates_key="candidate_token_ids",
                                   log=lambda *a: None, batch_size=8, top_k=10, sample_per_prompt=30, device_map=None)
    assert not (tmp_path / "bad.h5").exists()


def test_tables(sula_run):
    t = sula_tables(sula_run["paths"], model="tiny", calibration_bins=5, layers="all", n_boot=50, ci=0.95, seed=0)
    per = t["prompts"]
    assert len(per) == 20 + 3 * 16
    assert ((per.h_model_bits >= 0) & (per.h_model_bits <= 1)).all()
    assert ((per.label_mass > 0) & (per.label_mass <= 1)).all()
    assert (per[per.condition == "shuffled"].h_bayes_bits == 1.0).all()
    s = t["sula"]
    assert set(s.condition) == set(sula.CONDITIONS)
    for cond, g in s.groupby("condition"):
        assert set(g.k) == {"0", "1", "2", "4", "all"}
        pc = per[per.condition == cond]
        row = g[g.k == "all"].iloc[0]
        assert row.n == len(pc)
        assert row.mae_bits == pytest.approx(np.mean(np.abs(pc.h_model_bits - pc.h_bayes_bits)))
        assert row.mean_h_bayes_bits == pytest.approx(pc.h_bayes_bits.mean())
        # k = 0: H_Bayes is 1 bit for every prompt, so r is undefined
        assert np.isnan(g[g.k == "0"].pearson_r.iloc[0])
    assert s[(s.condition == "shuffled") & (s.k == "all")].pearson_r.isna().all()
    remap = s[s.condition == "remap"].labels.iloc[0]
    assert remap == "p/q" and s[s.condition == "main"].labels.iloc[0] == "x/y"
    cal = t["calibration"]
    assert cal.groupby("condition").n.sum().to_dict() == per.groupby("condition").size().to_dict()
    assert ((cal.mean_h_bayes_bits >= cal.bin_lo - 1e-12) & (cal.mean_h_bayes_bits <= cal.bin_hi + 1e-12)).all()
    geo = t["geometry"]
    assert set(geo.layer) == {0, 1} and set(geo.condition) == set(sula.CONDITIONS)
    assert (geo.rho_pc1_h_model.dropna() >= 0).all()  # sign convention
    assert geo[geo.condition == "shuffled"].rho_pc1_h_bayes.isna().all()
    assert per.pc1_last.notna().all()


def test_read_sula_h5_refuses_non_sula_file(tmp_path, sula_run):
    recs = [{"id": "a", "text": "ab"}, {"id": "b", "text": "cde"}]
    write_prompt_set(recs, tmp_path / "p.jsonl")
    extraction.extract_to_hdf5(sula_run["prepared"], tmp_path / "p.jsonl", tmp_path / "p.h5", model_name="tiny",
                               dtype="float32", device="cpu", attention=False, log=lambda *a: None, batch_size=8, top_k=10, sample_per_prompt=30, device_map=None)
    with pytest.raises(KeyError, match="extract_sula"):
        read_sula_h5(tmp_path / "p.h5")


def test_calibration_bins_known_answer():
    per = pd.DataFrame({"condition": "main", "h_bayes_bits": [0.0, 0.05, 0.5, 1.0, 1.0],
                        "h_model_bits": [0.1, 0.2, 0.4, 0.9, 0.7]})
    cal = calibration_table(per, model="m", n_bins=2)
    assert cal.n.tolist() == [2, 3]
    assert cal.mean_h_model_bits.tolist() == pytest.approx([0.15, (0.4 + 0.9 + 0.7) / 3])


# --------------------------------------------------------------------------- exact ties (issue 11, point 1)


def test_symmetric_evidence_is_bit_identical():
    h = lambda a, b: float(h_bayes_bits(a, b, alpha=0.9))  # noqa: E731
    assert h(1, 0) == h(0, 1)  # exactly: was 3.3e-16 apart
    for a, b in [(2, 0), (3, 1), (8, 0), (5, 2), (40, 0)]:
        assert h(a, b) == h(b, a) == h(a - b, 0)
        assert float(bayes_posterior(a, b, alpha=0.9)) == 1.0 - float(bayes_posterior(b, a, alpha=0.9))
    assert float(bayes_posterior(1, 0, alpha=0.9)) == pytest.approx(0.9, abs=1e-15)


def test_ties_give_average_ranks_and_constant_input_nan():
    from llmgeom.core.stats import pearson, spearman

    h = lambda a, b: float(h_bayes_bits(a, b, alpha=0.9))  # noqa: E731
    rho, _ = spearman([0, 1, 2, 3, 4], [h(1, 0), h(0, 1), h(1, 0), h(0, 1), h(2, 0)])
    assert round(rho, 4) == -0.7071
    r, p = pearson(np.arange(50.0), [h(1, 0), h(0, 1)] * 25)
    assert np.isnan(r) and np.isnan(p)


def test_official_prompt_set_has_one_h_bayes_per_abs_difference():
    sets = sula.generate_sula(PAIRS, ks=(0, 1, 2, 4, 8), n_per_k=50, n_per_k_controls=25, alpha=0.9, seed=0, mask="[MASK]", label_prefix=" ", conditions=("main", "remap", "shuffled", "ablation"))  # the defaults of the study: ks 0, 1, 2, 4, 8; 50 per k; seed 0
    for cond in ("main", "remap", "ablation"):
        meta = [r["meta"] for r in sets[cond]]
        diffs = {abs(m["n_L1"] - m["n_L2"]) for m in meta}
        assert len({m["h_bayes_bits"] for m in meta}) == len(diffs)
    main = [r["meta"] for r in sets["main"]]
    assert len({abs(m["n_L1"] - m["n_L2"]) for m in main}) == 6  # issue 11: 6 distinct values, not 11
    assert len({m["h_bayes_bits"] for m in main}) == 6


def test_k1_rows_have_undefined_correlation():
    from llmgeom.analyses.sula import sula_table

    rng = np.random.default_rng(0)
    rows = []
    for cond in sula.CONDITIONS:
        for k in (0, 1, 2):
            for i in range(20):
                n1 = int(rng.integers(0, k + 1))
                hb = 1.0 if cond == "shuffled" else float(h_bayes_bits(n1, k - n1, alpha=0.9))
                rows.append(dict(condition=cond, k=k, i=i, n_L1=n1, n_L2=k - n1, labels="pim/dop", alpha=0.9,
                                 p_bayes=float(bayes_posterior(n1, k - n1, alpha=0.9)), h_bayes_bits=hb,
                                 h_counts_bits=hb, h_pred_bits=0.5, p_model=rng.uniform(),
                                 h_model_bits=rng.uniform(), label_mass=0.5, h_vocab_bits=3.0))
    per = pd.DataFrame(rows)
    assert per[per.k == 1].groupby("condition").n_L1.nunique().min() == 2  # both (1,0) and (0,1) occur
    t = sula_table(per, model="m", n_boot=20, ci=0.95, seed=0)
    k1 = t[t.k == "1"]
    assert len(k1) == len(sula.CONDITIONS) and k1.pearson_r.isna().all() and k1.pearson_p.isna().all()
    k2 = t[(t.k == "2") & (t.condition == "main")]
    assert np.isfinite(k2.pearson_r.iloc[0])  # k = 2 has |d| in {0, 2}: defined


def test_sula_bootstrap_replicates_reproduce_the_intervals():
    """sula.csv rows carry a basic bootstrap over their prompts of mae_bits and pearson_r with the replicates it is
    taken from (issue 48 point 4). Known answers: a model that matches H_Bayes exactly has MAE 0 and r = 1 in every
    resample (interval [0, 0] / [1, 1]); constant H_Bayes (k = 0) gives NaN r and no interval; seeded."""
    from replicate_checks import assert_replicates_reproduce

    from llmgeom.analyses.sula import sula_bootstrap, sula_stats, sula_table
    from llmgeom.core.stats import parse_replicates

    rng = np.random.default_rng(4)
    k = np.repeat([0, 1, 2, 4], 30)
    hb = np.where(k == 0, 1.0, rng.uniform(0, 1, k.size))
    per = pd.DataFrame(dict(condition="main", k=k, i=np.arange(k.size), labels="a/b", alpha=0.9, h_bayes_bits=hb,
                            h_model_bits=np.clip(hb + rng.normal(0, 0.1, k.size), 0, 1), p_model=0.5, p_bayes=0.5,
                            h_pred_bits=hb, label_mass=0.9, h_vocab_bits=2.0))
    t = sula_table(per, model="m", n_boot=40, ci=0.9, seed=0)
    assert assert_replicates_reproduce(t, "mae_bits", ci=0.9, bounds=(0.0, np.inf), n_boot=40) == len(t)
    assert assert_replicates_reproduce(t[t.k != "0"], "pearson_r", ci=0.9, bounds=(-1.0, 1.0), n_boot=40) == 4
    r = t.set_index("k")
    assert r.loc["all"].mae_bits_lo < r.loc["all"].mae_bits < r.loc["all"].mae_bits_hi
    assert np.isnan(r.loc["0"].pearson_r) and np.isnan(r.loc["0"].pearson_r_lo)
    assert np.isnan(parse_replicates(r.loc["0"].pearson_r_replicates)).all()
    assert t.equals(sula_table(per, model="m", n_boot=40, ci=0.9, seed=0))
    assert not t.mae_bits_replicates.equals(sula_table(per, model="m", n_boot=40, ci=0.9, seed=1).mae_bits_replicates)
    h = rng.uniform(0, 1, 25)
    exact = sula_bootstrap(h, h, sula_stats(h, h), n_boot=30, ci=0.95, seed=0)
    assert (exact["mae_bits_lo"], exact["mae_bits_hi"]) == (0.0, 0.0)
    np.testing.assert_allclose(parse_replicates(exact["pearson_r_replicates"]), 1.0)
    assert exact["pearson_r_hi"] == pytest.approx(1.0)
    none = sula_bootstrap(h, h, sula_stats(h, h), n_boot=0, ci=0.95, seed=0)
    assert np.isnan(none["mae_bits_lo"]) and none["mae_bits_replicates"] == ""


def test_geometry_rho_replicates_known_answers():
    """PC1 scores that order the prompts exactly as H_Bayes (and against k) give rho = 1 (and -1) on every resample:
    a zero-width interval; the same seed, the same replicates; no resamples, NaN bounds."""
    from llmgeom.analyses.sula import _rho_replicates
    from llmgeom.core.stats import parse_replicates

    s = np.linspace(0.0, 1.0, 20)
    out = _rho_replicates(s, 2 * s + 1, -s, n_boot=30, ci=0.95, seed=3)
    assert np.allclose(parse_replicates(out["rho_pc1_h_bayes_replicates"]), 1.0)
    assert np.allclose(parse_replicates(out["rho_k_pc1_replicates"]), -1.0)
    assert (out["rho_pc1_h_bayes_lo"], out["rho_pc1_h_bayes_hi"]) == pytest.approx((1.0, 1.0))
    assert out == _rho_replicates(s, 2 * s + 1, -s, n_boot=30, ci=0.95, seed=3)
    rng = np.random.default_rng(0)
    noisy = _rho_replicates(s, s + rng.normal(0, 0.3, 20), -s, n_boot=50, ci=0.95, seed=3)
    assert noisy["rho_pc1_h_bayes_lo"] < noisy["rho_pc1_h_bayes_hi"] < 1.0 + 1e-12
    none = _rho_replicates(s, s, -s, n_boot=0, ci=0.95, seed=3)
    assert np.isnan(none["rho_k_pc1_lo"]) and none["rho_k_pc1_replicates"] == ""
