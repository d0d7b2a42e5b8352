"""Wind tunnel (Paper I tasks with exact posteriors; DESIGN.md sec. 3): exact posteriors against brute
force, parameter checks naming the key, prompt records, and a tiny deterministic training run."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from llmgeom.measures import bayes
from llmgeom.prompts import wind_tunnel as tasks

BIJ = {"kind": "bijection", "V": 5, "n_pairs": 4}
HMM = {"kind": "hmm", "n_states": 3, "n_obs": 4, "length": 6, "hmm_seed": 3}


# ------------------------------------------------------------------------------------------
# Exact posteriors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("V", [2, 3, 4, 5, 6])
def test_bijection_posterior_matches_enumeration_of_all_bijections(V):
    rng = np.random.default_rng(V)
    xs, ys = tasks.sample_bijection(V, V, 3, rng)
    for i in range(3):
        for t in range(V):
            shown = list(zip(xs[i, :t], ys[i, :t]))
            exact = bayes.bijection_posterior(V, shown, xs[i, t])
            brute = bayes.bijection_posterior_bruteforce(V, shown, xs[i, t])
            np.testing.assert_allclose(exact, brute, rtol=0, atol=1e-12)
            # uniform on the V - t unused outputs: entropy log2(V - t) bits
            assert np.count_nonzero(exact) == V - t
            assert bayes.bijection_entropy_bits(V, t) == pytest.approx(float(bayes.entropy_bits(brute)), abs=1e-12)
        # a query whose pair was already shown is known exactly
        known = bayes.bijection_posterior(V, list(zip(xs[i], ys[i])), xs[i, 0])
        assert known[ys[i, 0]] == 1.0 and known.sum() == 1.0


def test_bijection_entropy_known_values_and_bit_identity():
    assert bayes.bijection_entropy_bits(10, 0) == pytest.approx(3.321928094887362, abs=1e-15)
    assert bayes.bijection_entropy_bits(10, 8) == 1.0
    assert bayes.bijection_entropy_bits(20, 18) == 1.0
    h = bayes.bijection_entropy_bits(6, np.array([0, 2, 2, 5]))
    assert h[1] == h[2] and h[3] == 0.0
    with pytest.raises(ValueError):
        bayes.bijection_entropy_bits(6, 6)
    with pytest.raises(ValueError, match="consistent"):
        bayes.bijection_posterior(4, [(0, 1), (2, 1)], 3)


def test_sample_bijection_is_seeded_and_valid():
    a = tasks.sample_bijection(10, 9, 50, tasks.stream_rng(7, tasks.STREAM_TRAIN))
    b = tasks.sample_bijection(10, 9, 50, tasks.stream_rng(7, tasks.STREAM_TRAIN))
    c = tasks.sample_bijection(10, 9, 50, tasks.stream_rng(7, tasks.STREAM_PROMPTS))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])
    xs, ys = a
    assert all(len(set(r)) == 9 for r in xs) and all(len(set(r)) == 9 for r in ys)  # distinct x; pi injective


@pytest.mark.parametrize("L", [1, 3, 6])
def test_hmm_forward_matches_sum_over_all_hidden_paths(L):
    init, T, E = tasks.hmm_parameters(HMM)
    assert T.shape == (3, 3) and E.shape == (3, 4)
    _, obs = tasks.sample_hmm(init, T, E, L, 4, np.random.default_rng(L))
    fw = bayes.hmm_forward(obs, init, T, E)
    assert fw["filter"].shape == (4, L, 3) and fw["predictive"].shape == (4, L + 1, 4)
    for i in range(4):
        bf = bayes.hmm_bruteforce(obs[i], init, T, E)
        np.testing.assert_allclose(fw["filter"][i], bf["filter"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(fw["predictive"][i], bf["predictive"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(fw["predictive_bits"][i], bayes.entropy_bits(bf["predictive"]), atol=1e-12)
    # log-likelihood = log of the last normalizer chain = log sum over paths
    np.testing.assert_allclose(fw["predictive"][:, 0], np.broadcast_to(init @ E, (4, 4)), atol=1e-15)


def test_hmm_forward_known_value():
    # two states that never switch, each emitting its own symbol with probability 0.9
    T = np.eye(2)
    E = np.array([[0.9, 0.1], [0.1, 0.9]])
    fw = bayes.hmm_forward(np.array([0, 0]), [0.5, 0.5], T, E)
    # p(s = 0 | o = 0, 0) = 0.81 / (0.81 + 0.01)
    assert fw["filter"][1, 0] == pytest.approx(0.81 / 0.82, abs=1e-15)
    p0 = 0.81 / 0.82 * 0.9 + 0.01 / 0.82 * 0.1
    assert fw["predictive"][2, 0] == pytest.approx(p0, abs=1e-15)
    assert fw["predictive_bits"][0] == pytest.approx(1.0, abs=1e-15)
    assert fw["loglik_nats"] == pytest.approx(math.log(0.5 * 0.81 + 0.5 * 0.01), abs=1e-14)


# ------------------------------------------------------------------------------------------
# Parameter checks
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, key", [
    ({"kind": "bijection", "V": 1, "n_pairs": 1}, "wind_tunnel.tasks.t.V"),
    ({"kind": "bijection", "V": 5, "n_pairs": 6}, "wind_tunnel.tasks.t.n_pairs"),
    ({"kind": "bijection", "V": 5, "n_pairs": 0}, "wind_tunnel.tasks.t.n_pairs"),
    ({"kind": "bijection", "V": 5.0, "n_pairs": 2}, "wind_tunnel.tasks.t.V"),
    ({"kind": "bijection", "V": 5, "n_pairs": 2, "pairs": 3}, "wind_tunnel.tasks.t.pairs"),
    ({"kind": "markov", "V": 5}, "wind_tunnel.tasks.t.kind"),
    ({"kind": "hmm", "transition": [[0.5, 0.4], [0.0, 1.0]], "emission": [[1, 0], [0, 1]], "length": 4},
     "wind_tunnel.tasks.t.transition"),
    ({"kind": "hmm", "transition": [[1.2, -0.2], [0.0, 1.0]], "emission": [[1, 0], [0, 1]], "length": 4},
     "wind_tunnel.tasks.t.transition"),
    ({"kind": "hmm", "transition": [[0.5, 0.5], [0.5, 0.5]], "emission": [[0.5, 0.6], [0, 1]], "length": 4},
     "wind_tunnel.tasks.t.emission"),
    ({"kind": "hmm", "transition": [[0.5, 0.5], [0.5, 0.5]], "emission": [[0.5, 0.5], [0, 1]], "length": 4,
      "initial": [0.2, 0.2]}, "wind_tunnel.tasks.t.initial"),
    ({"kind": "hmm", "transition": [[0.5, 0.5], [0.5, 0.5], [1, 0]], "emission": [[1, 0], [0, 1]], "length": 4},
     "wind_tunnel.tasks.t.transition"),
    ({"kind": "hmm", "transition": [[0.5, 0.5], [0.5, 0.5]], "length": 4}, "wind_tunnel.tasks.t.emission"),
    ({"kind": "hmm", "n_states": 1, "n_obs": 3, "length": 4}, "wind_tunnel.tasks.t.n_states"),
    ({"kind": "hmm", "n_states": 3, "n_obs": 3, "length": 1}, "wind_tunnel.tasks.t.length"),
    ({"kind": "hmm", "n_states": 3, "n_obs": 3, "length": 4, "concentration": 0}, "wind_tunnel.tasks.t.concentration"),
])
def test_bad_task_settings_name_the_key(spec, key):
    with pytest.raises(ValueError) as exc:
        tasks.check_task("t", spec)
    assert str(exc.value).startswith(key), str(exc.value)


def test_check_task_normalizes():
    assert tasks.check_task("b", {"kind": "bijection", "V": 20, "n_pairs": 19}) == \
        {"kind": "bijection", "V": 20, "n_pairs": 19}
    h = tasks.check_task("h", {"kind": "hmm", "transition": np.eye(2) * 0.5 + 0.25, "emission": [[1, 0, 0], [0, 0.5, 0.5]],
                               "length": 5})
    assert (h["n_states"], h["n_obs"], h["initial"]) == (2, 3, [0.5, 0.5])
    assert tasks.check_task("h", {"kind": "hmm", "n_states": 4, "n_obs": 3, "length": 5})["hmm_seed"] == 0


def test_tasks_module_does_not_import_torch():
    code = "import sys; import llmgeom.prompts.wind_tunnel; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------
# Text layout and prompt records
# ------------------------------------------------------------------------------------------


def test_vocabulary_and_text_layout():
    voc = tasks.vocabulary({"kind": "bijection", "V": 3, "n_pairs": 2})
    assert voc == ["<pad>", "<bos>", "<eos>", "<unk>", "x0", "x1", "x2", "y0", "y1", "y2"]
    assert tasks.answer_token_ids({"kind": "bijection", "V": 3, "n_pairs": 2}) == [7, 8, 9]
    assert tasks.sequence_text(BIJ, ([3, 1], [4, 2])) == "x3 y4 x1 y2"
    assert tasks.sequence_text(BIJ, ([3, 1], [4, 2]), n_tokens=3) == "x3 y4 x1"
    assert tasks.vocabulary(HMM)[4:] == ["o0", "o1", "o2", "o3"]
    assert tasks.sequence_text(HMM, [2, 0, 1]) == "o2 o0 o1"
    assert list(tasks.query_positions(BIJ)) == [1, 3, 5, 7]
    assert tasks.sequence_length(BIJ) == 9 and tasks.sequence_length(HMM) == 7


def test_prompt_records_round_trip_and_exact_meta(tmp_path):
    from llmgeom.prompts.io import read_prompt_set, write_prompt_set

    recs = tasks.prompt_records(BIJ, n_sequences=3, cut_positions=[0, 2, 3], seed=11, name="wt_bij")
    assert len(recs) == 9
    path = tmp_path / "wt.jsonl"
    digest = write_prompt_set(recs, path)
    back, digest2 = read_prompt_set(path)
    assert back == recs and digest == digest2
    voc = tasks.vocabulary(BIJ)
    for r in back:
        m = r["meta"]
        toks = r["text"].split()
        assert len(toks) == 2 * m["t"] + 1 and toks[-1].startswith("x") and m["n_tokens"] == len(toks) + 1
        xs = [int(s[1:]) for s in toks[0::2]]
        ys = [int(s[1:]) for s in toks[1::2]]
        brute = bayes.bijection_posterior_bruteforce(5, list(zip(xs, ys)), xs[-1])
        assert m["posterior"] == pytest.approx(list(brute), abs=1e-15)
        assert m["h_exact_bits"] == math.log2(5 - m["t"]) and m["n_unused"] == 5 - m["t"]
        assert [voc[i] for i in m["candidate_token_ids"]] == [f"y{j}" for j in range(5)]
        assert voc[m["answer_token_id"]].startswith("y") and m["posterior"][m["candidate_token_ids"].index(
            m["answer_token_id"])] > 0
        assert r["id"] == f"wt_bij-s{m['sequence']:04d}-t{m['t']:02d}"
    # same seed -> same records; the prompt stream differs from the training stream of the same seed
    assert tasks.prompt_records(BIJ, n_sequences=3, cut_positions=[0, 2, 3], seed=11, name="wt_bij") == recs
    train_first = tasks.sample_batch(BIJ, 3, tasks.stream_rng(11, tasks.STREAM_TRAIN), exact=False)["ids"]
    assert recs[2]["text"] != " ".join(voc[i] for i in train_first[0, 1:8])

    hrecs = tasks.prompt_records(HMM, n_sequences=2, cut_positions=[1, 5], seed=0)
    params = tasks.hmm_parameters(HMM)
    for r in hrecs:
        m = r["meta"]
        obs = [int(s[1:]) for s in r["text"].split()]
        assert len(obs) == m["t"]
        bf = bayes.hmm_bruteforce(obs, *params)
        assert m["posterior"] == pytest.approx(list(bf["predictive"][-1]), abs=1e-12)
        assert m["state_posterior"] == pytest.approx(list(bf["filter"][-1]), abs=1e-12)
        assert m["h_exact_bits"] == pytest.approx(float(bayes.entropy_bits(bf["predictive"][-1])), abs=1e-12)
    write_prompt_set(hrecs, tmp_path / "hmm.jsonl")
    with pytest.raises(ValueError, match="cut_positions"):
        tasks.prompt_records(HMM, n_sequences=2, cut_positions=[0], seed=0)
    with pytest.raises(ValueError, match="cut_positions"):
        tasks.prompt_records(BIJ, n_sequences=2, cut_positions=[4], seed=0)


# ------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------

TINY = dict(steps=150, batch_size=32, lr=3e-3, warmup_steps=15, weight_decay=0.01, clip_norm=1.0,
            arch={"family": "llama", "n_layers": 2, "d_model": 32, "n_heads": 2}, threads=1, n_val=256,
            schedule="cosine", min_lr_ratio=0.1)
TINY_TASK = {"kind": "bijection", "V": 4, "n_pairs": 4}


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    from llmgeom.wind_tunnel.train import train_wind_tunnel

    d = tmp_path_factory.mktemp("wt")
    lines: list[str] = []
    a = train_wind_tunnel(TINY_TASK, d / "a" / "wt_tiny", seed=0, checkpoints=[50], log=lines.append, **TINY)
    b = train_wind_tunnel(TINY_TASK, d / "b" / "wt_tiny", seed=0, checkpoints=[], log=lambda s: None, **TINY)
    return a, b, lines


def test_tiny_training_run_saves_a_loadable_model_with_manifest_and_log(tiny_runs):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    res, _, lines = tiny_runs
    out = res["model_dir"]
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.model_type == "llama" and model.config.vocab_size == 12
    assert model.config.max_position_embeddings == 9
    assert tok("x3 y1 x0")["input_ids"] == [1, 7, 9, 4]
    man = json.loads((out / "manifest.json").read_text())
    assert man["source"] == "wind_tunnel" and man["dtype"] == "float32" and man["weights_path"] == "."
    assert man["revision"] is None and man["model"] == "wt_tiny" and man["step"] == 150
    assert man["task"] == TINY_TASK and man["training"]["seed"] == 0
    assert man["architecture"]["n_layers"] == 2 and man["architecture"]["d_model"] == 32
    assert man["candidate_token_ids"] == [8, 9, 10, 11]
    rows = list(csv.DictReader(open(out / "training_log.csv")))
    assert [k for k in rows[0]][:4] == ["step", "loss", "lr", "val_mae_bits"]
    assert int(rows[-1]["step"]) == 150 and float(rows[-1]["val_mae_bits"]) == pytest.approx(man["val_mae_bits"])
    loss = [float(r["loss"]) for r in rows]
    # Bayes-optimal loss: mean over t of ln(V - t) = (ln 4 + ln 3 + ln 2 + ln 1) / 4 = 0.7945 nats;
    # the initial loss is about ln(12) = 2.48 (uniform over the vocabulary)
    bayes = sum(math.log(4 - t) for t in range(4)) / 4
    assert loss[0] > 2.0 and loss[-1] < loss[0] - 1.0
    assert bayes - 0.1 < loss[-1] < bayes + 0.15
    mae = [float(r["val_mae_bits"]) for r in rows if r["val_mae_bits"]]
    assert mae[-1] < mae[0]
    assert any(l.startswith("step 150/150") and "val_mae_bits" in l for l in lines)
    # checkpoint at step 50: a full HF directory beside the model
    ck = res["checkpoints"][50]
    assert ck == out.parent / "wt_tiny-step50"
    cman = json.loads((ck / "manifest.json").read_text())
    assert cman["step"] == 50 and cman["checkpoint_of"] == "wt_tiny" and cman["model"] == "wt_tiny-step50"
    assert AutoModelForCausalLM.from_pretrained(ck).config.model_type == "llama"
    assert int(list(csv.DictReader(open(ck / "training_log.csv")))[-1]["step"]) == 50
    # the model's renormalized entropy is what the log reports
    from llmgeom.wind_tunnel.train import evaluate

    val = tasks.sample_batch(TINY_TASK, 256, tasks.stream_rng(0, tasks.STREAM_VALID))
    ev = evaluate(model, val, man["candidate_token_ids"])
    assert ev["mae_bits"] == pytest.approx(man["val_mae_bits"], abs=1e-9)
    # the trainer's global torch settings are restored
    assert torch.get_num_threads() == 1 and not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory is True


def test_training_is_deterministic(tiny_runs):
    from safetensors.numpy import load_file

    a, b, _ = tiny_runs
    wa = load_file(a["model_dir"] / "model.safetensors")
    wb = load_file(b["model_dir"] / "model.safetensors")
    assert wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert a["manifest"]["val_mae_bits"] == b["manifest"]["val_mae_bits"]


def test_gpt2_family_and_bad_training_settings(tmp_path):
    from llmgeom.wind_tunnel.train import build_config, check_arch, train_wind_tunnel

    cfg = build_config(HMM, {"family": "gpt2", "n_layers": 1, "d_model": 16, "n_heads": 2})
    assert cfg.model_type == "gpt2" and cfg.n_positions == 7 and cfg.vocab_size == 8
    with pytest.raises(ValueError, match=r"arch\.n_heads"):
        check_arch({"family": "llama", "n_layers": 1, "d_model": 30, "n_heads": 4})
    with pytest.raises(ValueError, match=r"arch\.family"):
        check_arch({"family": "mamba", "n_layers": 1, "d_model": 32, "n_heads": 4})
    kw = dict(TINY, steps=5)
    with pytest.raises(ValueError, match="checkpoints"):
        train_wind_tunnel(TINY_TASK, tmp_path / "m", seed=0, checkpoints=[6], log=lambda s: None, **kw)
    with pytest.raises(ValueError, match="wind_tunnel.tasks.bad.n_pairs"):
        train_wind_tunnel({"kind": "bijection", "V": 3, "n_pairs": 4}, tmp_path / "m", seed=0, name="bad",
                          checkpoints=[], log=lambda s: None, **kw)
    assert not (tmp_path / "m").exists()
    # a short HMM run on GPT-2 trains and saves
    res = train_wind_tunnel(HMM, tmp_path / "h", seed=1, checkpoints=[], log=lambda s: None,
                            **dict(kw, arch={"family": "gpt2", "n_layers": 1, "d_model": 16, "n_heads": 2}))
    assert res["manifest"]["architecture"]["family"] == "gpt2" and (tmp_path / "h" / "manifest.json").is_file()
