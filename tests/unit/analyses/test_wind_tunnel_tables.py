"""Wind-tunnel tables (issue 14): known answers of the calibration and geometry functions on synthetic inputs
(no HDF5), the Table-2 rows of wind-tunnel models, the figure, and one end-to-end pass (train a tiny model in
seconds -> prompts -> extraction -> tables)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from llmgeom.analyses.wind_tunnel import (GEOMETRY_COLUMNS, SUMMARY_COLUMNS, best_geometry, entropy_bins,
                                          calibration_stats, calibration_summary, candidate_entropy, manifold_stats)


#: the bootstrap of mae_bits (schema keys wind_tunnel.n_boot / ci / seed)
BOOT = dict(n_boot=50, ci=0.9, seed=0)

# --------------------------------------------------------------------------- calibration


def test_candidate_entropy_renormalizes_over_the_candidates():
    # 4 candidates with 1/8 each: mass 1/2 on the answers, uniform after renormalizing -> 2 bits
    lp = np.log(np.full((2, 4), 0.125))
    post = np.array([[0.25] * 4, [1.0, 0.0, 0.0, 0.0]])
    c = candidate_entropy(lp, post)
    np.testing.assert_allclose(c["h_model_bits"], [2.0, 2.0])
    np.testing.assert_allclose(c["answer_mass"], [0.5, 0.5])
    np.testing.assert_allclose(c["kl_bits"], [0.0, 2.0], atol=1e-12)  # KL(delta || uniform on 4) = log2 4
    # two candidates with p = 0.3 / 0.1 over the vocabulary: renormalized 0.75 / 0.25
    c = candidate_entropy(np.log([[0.3, 0.1]]))
    h = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    np.testing.assert_allclose(c["h_model_bits"], [h])
    np.testing.assert_allclose(c["answer_mass"], [0.4])
    assert "kl_bits" not in c


@pytest.mark.parametrize("lp,post,msg", [
    (np.zeros((3, 1)), None, "C >= 2"),
    (np.array([[0.0, np.nan]]), None, "non-finite"),
    (np.zeros((2, 3)), np.full((2, 2), 0.5), "posterior shape"),
])
def test_candidate_entropy_refuses_bad_input(lp, post, msg):
    with pytest.raises(ValueError, match=msg):
        candidate_entropy(lp, post)


def test_calibration_stats_known_answers():
    he = np.array([0.0, 1.0, 2.0, 3.0])
    s = calibration_stats(he + 0.1, he)
    assert s["n"] == 4 and s["mae_bits"] == pytest.approx(0.1)
    assert s["pearson_r"] == pytest.approx(1.0) and s["spearman_rho"] == pytest.approx(1.0)
    assert s["mean_h_model_bits"] == pytest.approx(1.6) and s["mean_h_exact_bits"] == pytest.approx(1.5)
    # one position t of the bijection task: the exact entropy is constant -> correlations undefined
    s = calibration_stats([1.0, 1.2, 0.9], [1.0, 1.0, 1.0])
    assert s["mae_bits"] == pytest.approx(0.1) and math.isnan(s["pearson_r"]) and math.isnan(s["spearman_rho"])
    s = calibration_stats([], [])
    assert s["n"] == 0 and math.isnan(s["mae_bits"])
    with pytest.raises(ValueError, match="equal length"):
        calibration_stats([1.0, 2.0], [1.0])


def _per_prompt(V=5, n_seq=4, err=0.05):
    rows = []
    for i in range(n_seq):
        for t in range(V - 1):
            he = math.log2(V - t)
            rows.append(dict(id=f"s{i}-t{t}", task="bij", kind="bijection", t=t, sequence=i, h_exact_bits=he,
                             h_model_bits=he + (err if i % 2 else -err), answer_mass=0.99, kl_bits=0.01,
                             h_vocab_bits=he + 0.1))
    return pd.DataFrame(rows)


def test_calibration_summary_rows_per_t_and_overall():
    per = _per_prompt()
    s = calibration_summary(per, model="wt", step=100, **BOOT)
    assert list(s.columns) == SUMMARY_COLUMNS
    assert list(s.t) == [0, 1, 2, 3, "all"]
    np.testing.assert_allclose(s.mae_bits, 0.05)
    np.testing.assert_allclose(s.n, [4, 4, 4, 4, 16])
    assert s.pearson_r.iloc[:4].isna().all()  # constant exact entropy within a position
    assert s.pearson_r.iloc[-1] > 0.99 and s.spearman_rho.iloc[-1] > 0.9
    assert s.mean_h_exact_bits.iloc[0] == pytest.approx(math.log2(5))
    assert (s.model == "wt").all() and (s.step == 100).all() and (s.task == "bij").all()
    with pytest.raises(ValueError, match="empty"):
        calibration_summary(per.iloc[:0], model="wt", **BOOT)


def test_calibration_summary_mae_interval_over_sequences():
    from llmgeom.core.stats import bias_corrected, bootstrap_interval, derived_seed, parse_replicates
    from llmgeom.measures.margins import PassageBootstrap

    # constant per-prompt errors (|H_model - H_exact| = 0.05 bit everywhere): a zero-width interval at 0.05
    s = calibration_summary(_per_prompt(), model="wt", **BOOT)
    np.testing.assert_allclose(s[["mae_bits_lo", "mae_bits_hi", "mae_bits_bc"]], 0.05, atol=1e-15)
    assert (s.boot_unit == "sequences").all() and (s.n_boot == 50).all()
    assert all(np.allclose(parse_replicates(r), 0.05, atol=1e-15) and parse_replicates(r).size == 50
               for r in s.mae_bits_replicates)
    # errors that differ by sequence (sequence i: i / 10 bit at every t): each replicate is the mean error of the
    # drawn sequences, the same resample for every row, so the per-t rows' replicates equal the "all" row's
    per = _per_prompt(n_seq=6)
    per["h_model_bits"] = per.h_exact_bits + per.sequence / 10
    s = calibration_summary(per, model="wt", **BOOT).set_index("t")
    reps = {t: parse_replicates(r) for t, r in s.mae_bits_replicates.items()}
    for t in range(4):
        np.testing.assert_allclose(reps[t], reps["all"], rtol=1e-12)
    w = np.array(list(PassageBootstrap(per.sequence, len(per), n_boot=50, seed=derived_seed(0, "sequences"))))
    np.testing.assert_allclose(reps["all"], w @ (per.sequence / 10) / w.sum(axis=1), rtol=1e-8)
    a = s.loc["all"]
    assert a.mae_bits == pytest.approx(0.25) and a.n == 24
    # the replicates reproduce the interval and the corrected value (basic, clipped at 0)
    assert (a.mae_bits_lo, a.mae_bits_hi) == pytest.approx(
        bootstrap_interval(0.25, reps["all"], ci=0.9, method="basic", bounds=(0.0, np.inf)))
    assert a.mae_bits_bc == pytest.approx(bias_corrected(0.25, reps["all"], bounds=(0.0, np.inf)))
    assert 0 <= a.mae_bits_lo < 0.25 < a.mae_bits_hi
    # seeded: the same seed gives the same replicates, another seed others
    again = calibration_summary(per, model="wt", **BOOT).set_index("t")
    assert again.loc["all", "mae_bits_replicates"] == a.mae_bits_replicates
    other = calibration_summary(per, model="wt", **dict(BOOT, seed=1)).set_index("t")
    assert other.loc["all", "mae_bits_replicates"] != a.mae_bits_replicates
    # no sequence labels: prompts resampled independently; n_boot = 0: no interval
    s = calibration_summary(per.assign(sequence=-1), model="wt", **BOOT)
    assert (s.boot_unit == "prompts").all() and s.mae_bits_lo.notna().all()
    s = calibration_summary(per, model="wt", **dict(BOOT, n_boot=0))
    assert s.mae_bits_lo.isna().all() and (s.mae_bits_replicates == "").all() and (s.n_boot == 0).all()


def test_calibration_bins_edges_last_bin_closed_and_empty_bins_omitted():
    he = np.array([0.0, 0.4, 1.0, 2.0, 2.5])
    hm = he + np.array([0.1, -0.1, 0.0, 0.2, 0.0])
    b = entropy_bins(hm, he, h_max=2.0, n_bins=4)
    # bins [0, .5) [.5, 1) [1, 1.5) [1.5, 2]; 2.0 (closed edge) and 2.5 (above h_max) go to the last bin
    assert list(b["bin"]) == [0, 2, 3]
    assert list(b.n) == [2, 1, 2]
    np.testing.assert_allclose(b.bin_lo, [0.0, 1.0, 1.5])
    np.testing.assert_allclose(b.mean_abs_error_bits, [0.1, 0.0, 0.1])
    np.testing.assert_allclose(b.mean_h_exact_bits, [0.2, 1.0, 2.25])
    assert math.isnan(b.sd_h_model_bits.iloc[1])  # a single prompt
    for kw, msg in ((dict(h_max=2.0, n_bins=0), "n_bins"), (dict(h_max=0.0, n_bins=4), "h_max")):
        with pytest.raises(ValueError, match=msg):
            entropy_bins(hm, he, **kw)


# --------------------------------------------------------------------------- geometry


def test_manifold_stats_rank_one_manifold_ordered_by_entropy():
    rng = np.random.default_rng(0)
    he = np.linspace(0.5, 3.3, 45)  # distinct entropies (ties would leave the noise to order tied prompts)
    w = rng.normal(size=12)
    X = -np.outer(he, w) + 1e-6 * rng.normal(size=(he.size, 12))  # PC1 anti-aligned with H before the sign fix
    s = manifold_stats(X, he)
    assert s["n"] == 45 and s["n_features"] == 12
    assert s["pc1"] == pytest.approx(1.0, abs=1e-6) and s["pc12"] == pytest.approx(1.0, abs=1e-6)
    assert s["participation_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert s["rho_pc1_h_exact"] == pytest.approx(1.0) and s["abs_rho_pc1_h_exact"] == pytest.approx(1.0)


def test_manifold_stats_isotropic_noise_has_no_axis():
    rng = np.random.default_rng(1)
    he = rng.uniform(0, 3, 400)
    s = manifold_stats(rng.normal(size=(400, 4)), he)
    assert 0.25 <= s["pc1"] < 0.33 and s["participation_ratio"] > 3.8
    assert abs(s["rho_pc1_h_exact"]) < 0.15


def test_manifold_stats_constant_inputs_give_nan():
    s = manifold_stats(np.ones((6, 3)), np.arange(6.0))
    assert s["n"] == 6 and math.isnan(s["pc1"]) and math.isnan(s["rho_pc1_h_exact"])
    X = np.random.default_rng(2).normal(size=(6, 3))
    s = manifold_stats(X, np.ones(6))  # constant exact entropy: geometry defined, rho not
    assert 0 < s["pc1"] <= 1 and math.isnan(s["rho_pc1_h_exact"])
    with pytest.raises(ValueError, match="len"):
        manifold_stats(X, np.ones(5))


def test_best_geometry_picks_the_layer_with_largest_abs_rho():
    g = pd.DataFrame([dict(model="wt", representation=r, layer=l, relative_depth=(l + 1) / 3, pc1=0.1 * l,
                           abs_rho_pc1_h_exact=v)
                      for r, vals in (("values", [0.2, 0.6, 0.4]), ("attn_output", [0.9, np.nan, 0.8]))
                      for l, v in enumerate(vals)])
    b = best_geometry(g)
    assert list(zip(b.representation, b.layer, b.abs_rho_pc1_h_exact)) == [("values", 1, 0.6), ("attn_output", 0, 0.9)]
    assert best_geometry(g.assign(abs_rho_pc1_h_exact=np.nan)).empty


# --------------------------------------------------------------------------- Table 2 and the figure


def _summary_tables():
    dr = pd.DataFrame([dict(model="llm", prompt_set=p, domain=d, role=role, representation="values", standardized=True,
                            layer=1, pc12=v, pc12_lo=v - 0.1, pc12_hi=v + 0.1, delta_pc12=v - 0.5)
                       for p, d, role, v in (("mixed", "mixed", "mixed", 0.5), ("domain_mathematics", "Mathematics",
                                                                                 "restricted", 0.7))])
    ko = pd.DataFrame([dict(model=m, layer=l, head=0, orthogonality=o, baseline_gaussian=0.03,
                            baseline_random_init=0.04, gaussian_expected=0.03)
                       for m, o in (("llm", 0.07), ("wt", 0.2)) for l in range(2)])
    af = pd.DataFrame([dict(model=m, attention_type="MHA", n_sliding_layers=0, n_layers=2, sliding_window=np.nan,
                            focusing_pct=f, focusing_pct_global=f, spearman_rho=-1.0, spearman_p=0.0)
                       for m, f in (("llm", 30.0), ("wt", 60.0))])
    wt = calibration_summary(_per_prompt(), model="wt", step=3000, **BOOT)
    geo = pd.DataFrame([dict(model="wt", representation=r, layer=l, pc12=0.1 * (l + 1), abs_rho_pc1_h_exact=v)
                        for r, vals in (("values", [0.3, 0.5]), ("attn_output", [0.9, 0.7]),
                                        ("residual_stream", [0.1, 0.2, 0.15]))
                        for l, v in enumerate(vals)])
    return dr, ko, af, wt, geo


def test_table2_wind_tunnel_rows_beside_the_llms():
    from llmgeom.analyses.bayes_tables import table2, to_markdown

    dr, ko, af, wt, geo = _summary_tables()
    t_all = table2(dr, ko, af, restricted_set="domain_mathematics", wt=wt, wt_geometry=geo)
    t = t_all[t_all.source != "published"]
    assert list(t.model) == ["llm", "wt"] and list(t.source) == ["llm", "wind_tunnel"]
    llm, w = t.iloc[0], t.iloc[1]
    assert llm.pc12_mixed == pytest.approx(0.5) and math.isnan(llm.entropy_mae_bits)
    assert w.entropy_mae_bits == pytest.approx(0.05) and w.step == 3000 and w.task == "bij"
    assert w.orth_mean == pytest.approx(0.2) and w.focusing_pct == pytest.approx(60.0)
    assert math.isnan(w.pc12_mixed) and pd.isna(w.restricted_set)  # the LLM-only columns are empty
    assert w.pc12_wind_tunnel == pytest.approx(0.2)  # values at the last layer
    assert (w.abs_rho_pc1_h_exact_values, w.abs_rho_pc1_h_exact_attn_output,
            w.abs_rho_pc1_h_exact_residual_stream) == pytest.approx((0.5, 0.9, 0.2))
    pub = [c for c in t.columns if c.endswith("_published")]
    assert pub and all(w[c] == "" for c in pub)  # published LLM values are not shown beside wind-tunnel rows
    # Paper III's wind-tunnel row (issue 19): a published row with PC1 84-90%, key orthogonality, focusing
    pw = t_all[t_all.model == "wind-tunnel transformers (Paper III Table 2)"].iloc[0]
    assert pw.source == "published" and pw.pc1_wind_tunnel_published == "0.84-0.9"
    assert (pw.orth_mean_published, pw.focusing_pct_published) == ("0.09-0.12", "85-90")
    md = to_markdown(t_all, "table2")
    assert "| 0.0500 | 0.50 / 0.90 / 0.20 |" in md and "Wind-tunnel rows" in md
    assert "| 84-90 | - | - |" in md
    # without wind-tunnel models: the LLM table as before, one row
    t0 = table2(dr, ko[ko.model == "llm"], af[af.model == "llm"], restricted_set="domain_mathematics")
    assert list(t0[t0.source == "llm"].model) == ["llm"] and "entropy_mae_bits" not in t0


def test_wind_tunnel_figure_writes_png_and_pdf(tmp_path):
    from llmgeom.plots.wind_tunnel import wind_tunnel_figure

    per = _per_prompt().assign(model="wt")
    summary = calibration_summary(per, model="wt", **BOOT)
    geo = pd.DataFrame([dict(model="wt", representation=r, layer=l, relative_depth=(l + 1) / 2, pc1=0.4,
                             abs_rho_pc1_h_exact=0.8) for r in ("values", "residual_stream") for l in range(2)])
    paths = [tmp_path / "wt.png", tmp_path / "wt.pdf"]
    wind_tunnel_figure(per, summary, geo, paths)
    assert all(p.stat().st_size > 1000 for p in paths)
    with pytest.raises(ValueError, match="no wind-tunnel model"):
        wind_tunnel_figure(per, summary, geo, paths, models=["other"])


# --------------------------------------------------------------------------- end to end (seconds)


@pytest.mark.parametrize("spec,cuts", [({"kind": "bijection", "V": 4, "n_pairs": 3}, [0, 1, 2]),
                                       ({"kind": "hmm", "n_states": 2, "n_obs": 3, "length": 4}, [1, 2, 3])],
                         ids=["bijection", "hmm"])
def test_tiny_model_trained_extracted_and_tabulated(tmp_path, spec, cuts):
    """Train a tiny model (2 layers, width 32, 60 steps) on a bijection (V = 4) or HMM-filtering task, build its
    prompt set, extract it with candidate log-probs and attention, and compute the tables: every column present,
    MAE finite, the exact entropies of the prompt set."""
    pytest.importorskip("torch")
    from llmgeom.analyses.wind_tunnel import wind_tunnel_tables
    from llmgeom.extract.forward import extract_to_hdf5
    from llmgeom.prompts.io import write_prompt_set
    from llmgeom.prompts.wind_tunnel import CANDIDATES_KEY, prompt_records
    from llmgeom.wind_tunnel.train import train_wind_tunnel

    model = tmp_path / "models" / "wt"
    train_wind_tunnel(spec, model, seed=0, steps=60, batch_size=16, lr=3e-3, warmup_steps=5, weight_decay=0.0,
                      clip_norm=1.0, arch={"family": "llama", "n_layers": 2, "d_model": 32, "n_heads": 4}, threads=1, n_val=32,
                      log=lambda s: None, checkpoints=(), schedule="cosine", min_lr_ratio=0.1)
    prompts = tmp_path / "prompts.jsonl"
    records = prompt_records(spec, n_sequences=8, cut_positions=cuts, seed=0, name="task")
    write_prompt_set(records, prompts)
    h5 = tmp_path / "wt.h5"
    extract_to_hdf5(model, prompts, h5, model_name="wt", dtype="float32", device="cpu", batch_size=8, top_k=3,
                    attention=True, candidates_key=CANDIDATES_KEY, sample_per_prompt=30, device_map=None)
    t = wind_tunnel_tables(h5, model="wt", calibration_bins=4, step=60, layers="all", **BOOT)
    s = t["summary"]
    assert list(s.columns) == SUMMARY_COLUMNS and list(s.t) == [*cuts, "all"]
    assert np.isfinite(s.mae_bits).all() and (s.n.iloc[-1] == 24)
    assert ((s.mae_bits_lo <= s.mae_bits_hi) & (s.boot_unit == "sequences")).all()
    exact = [np.mean([r["meta"]["h_exact_bits"] for r in records if r["meta"]["t"] == t]) for t in cuts]
    np.testing.assert_allclose(s.mean_h_exact_bits.iloc[:3], exact, rtol=1e-6)
    if spec["kind"] == "bijection":
        np.testing.assert_allclose(exact, np.log2([4, 3, 2]))
    assert ((s.mean_answer_mass > 0) & (s.mean_answer_mass <= 1)).all()
    g = t["geometry"]
    assert list(g.columns) == GEOMETRY_COLUMNS
    reps = set(g.representation)
    assert {"values", "residual_stream"} <= reps
    assert len(g[g.representation == "residual_stream"]) == 3  # embeddings + 2 blocks
    n_cand = spec.get("V", spec.get("n_obs"))
    assert t["calibration"].n.sum() == 24 and t["calibration"].bin_hi.max() == pytest.approx(np.log2(n_cand))
    assert len(t["prompts"]) == 24


def test_manifold_stats_bootstrap_replicates_reproduce_the_interval():
    """pc1 / pc12 of the wind-tunnel geometry: replicates of the bootstrap over prompts, whose basic interval is the
    reported one (Table 2's wind-tunnel row reads the final layer's); none without n_boot."""
    from llmgeom.analyses.wind_tunnel import manifold_stats
    from llmgeom.core.stats import bootstrap_interval, parse_replicates

    rng = np.random.default_rng(0)
    h = rng.uniform(0, 3, 40)
    X = np.outer(h, rng.standard_normal(16)) + 0.1 * rng.standard_normal((40, 16))  # one direction carries h
    out = manifold_stats(X, h, n_boot=50, seed=1, ci=0.95)
    reps = parse_replicates(out["pc1_replicates"])
    assert reps.size == 50 and out["pc1"] > 0.9
    assert (out["pc1_lo"], out["pc1_hi"]) == pytest.approx(bootstrap_interval(out["pc1"], reps, ci=0.95,
                                                                              bounds=(0.0, 1.0)), abs=1e-8)
    assert out == manifold_stats(X, h, n_boot=50, seed=1, ci=0.95)  # seeded
    plain = manifold_stats(X, h)
    assert plain["pc1_replicates"] == "" and np.isnan(plain["pc1_lo"]) and plain["pc1"] == out["pc1"]
