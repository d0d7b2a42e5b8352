"""Issue 29: hybrid and state-space models end to end (tiny random Jamba and Mamba, extracted to HDF5).

A tiny Jamba (3 layers: Mamba, attention, Mamba; ``tests/support/model_types.py`` settings) and a tiny Mamba (no attention
at all) are prepared, extracted and read back: the file records ``attention_layers``; the per-layer attention
datasets hold NaN at the attention-free layers (absent for Mamba); a residual-stream measure (value-manifold PCA of
the residual stream) runs on every layer and the attention measures (value manifold of the values, attention
focusing, key orthogonality) on the attention layers only, saying which those are.
"""

import json

import numpy as np
import pytest

import model_types as mtypes
import llmgeom
from llmgeom.core import store, writer
from llmgeom.core.store import DS, open_activations
from llmgeom.extract import forward as extraction
from llmgeom.models import architectures as arch
from llmgeom.models import families
from llmgeom.models import sources, tiny
from llmgeom.prompts.io import write_prompt_set

PROMPTS = [{"id": str(i), "text": t, "meta": {"topic": "x"}} for i, t in enumerate(
    ["The cat sat.", "xy", "Hello, world! How are you?", "1 2 3 4 5", "abc def ghi", "On the mat.",
     "Zz", "A longer prompt than the others here."])]


def _extract(tmp_path, model_type: str):
    src = tmp_path / "src"
    m = mtypes.build(model_type, "eager" if model_type == "mamba" else "sdpa")  # Mamba: no attention to implement
    m.save_pretrained(src)
    tiny.tiny_tokenizer(m.config.vocab_size).save_pretrained(src)
    prepared = tmp_path / "prepared"
    sources.prepare_model(model_type, {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    prompts = tmp_path / "mixed.jsonl"
    write_prompt_set(PROMPTS, prompts)
    h5 = tmp_path / "acts" / "mixed.h5"
    extraction.extract_to_hdf5(prepared, prompts, h5, model_name=model_type, dtype="float32", device="cpu",
                               batch_size=3, top_k=5, log=lambda *a: None, sample_per_prompt=30, device_map=None)
    return m, h5


@pytest.fixture(scope="module")
def jamba(tmp_path_factory):
    return _extract(tmp_path_factory.mktemp("jamba"), "jamba")


def test_hybrid_file_records_its_attention_layers_and_nan_rows(jamba):
    m, h5 = jamba
    assert arch.attention_layers(m) == (1,)
    with open_activations(h5, model="jamba") as f:
        assert json.loads(f.attrs["attention_layers"]) == [1] and store.attention_layers(f) == [1]
        assert store.attention_free_layers(f) == [0, 2]
        for name in sorted(store.ATTENTION_LAYER_DATASETS):
            a = f[name][()]
            assert a.shape[:2] == (len(PROMPTS), 3), name
            assert np.isnan(a[:, [0, 2]]).all() and np.isfinite(a[:, 1]).all(), name
            # the reading helper: an attention-free layer is refused by name, all layers come back with NaN there
            with pytest.raises(store.NoAttentionLayerError, match=r"layer 0: this layer has no attention.*\[1\]"):
                store.read_finite(f, name, layer=0)
            assert np.isfinite(store.read_finite(f, name, layer=1)).all()
            assert np.isnan(store.read_finite(f, name)[:, 2]).all()
        R = store.read_finite(f, DS.LAST_TOKEN_RESIDUAL)  # every layer, finite
        assert R.shape == (len(PROMPTS), 4, 64) and np.isfinite(R).all()
        assert np.all(np.abs(R[:, 3] - R[:, 2]).max(-1) > 1e-3)  # the last (Mamba) block changes the stream
        E = f[DS.ATTENTION_ENTROPY][:, 1]  # nats, within (0, log n_tokens]
        n_tok = f[DS.PROMPTS_N_TOKENS][:]
        assert ((E > 0) & (E <= np.log(n_tok)[:, None] + 1e-5)).all()


def test_hybrid_file_residual_and_attention_measures(jamba):
    from llmgeom.analyses.attention_focusing import attention_focusing_tables
    from llmgeom.analyses.value_manifold import value_manifold_table

    m, h5 = jamba
    vm = value_manifold_table({"mixed": h5}, model="jamba", n_boot=20, seed=0, standardize=(True,), ci=0.95, layers="all")
    by = vm.groupby("representation").layer.apply(list).to_dict()
    assert by == {"residual_stream": [0, 1, 2], "values": [1], "attn_output": [1]}
    assert vm.pc1.between(0, 1).all() and (vm.pc1 > 1 / 8).all()  # PC1 share of 8 prompts: above 1/n
    detail, summary = attention_focusing_tables(h5, model="jamba", **llmgeom.defaults("attention_focusing"))
    assert sorted(set(detail.layer)) == [1] and len(detail[detail.level == "head"]) == 4
    assert summary.attention_layers[0] == "1" and np.isnan(summary.focusing_pct[0])
    with open_activations(h5, model="jamba") as f:
        want = f[DS.ATTENTION_ENTROPY][:, 1].mean()
    assert detail[detail.level == "layer"].entropy_mean.iloc[0] == pytest.approx(want, rel=1e-6)

    from llmgeom.weights.key_orthogonality import key_orthogonality_table

    ko = key_orthogonality_table(m, model_name="jamba", seed=0, random_init=True)
    assert list(zip(ko.layer, ko.kv_head)) == [(1, 0), (1, 1)]
    assert ((ko.orthogonality > 0.02) & (ko.orthogonality < 0.5)).all()


def test_writer_refuses_numbers_at_attention_free_layers(tmp_path):
    shapes = {DS.LAST_TOKEN_VALUES: ((2, 3, 4), "float32")}
    w = writer.ActivationWriter(tmp_path / "x.h5", {"n_layers": 3, "attention_layers": [1]}, shapes)
    v = np.full((2, 3, 4), np.nan, np.float32)
    v[:, 1] = 1.0
    w.write(DS.LAST_TOKEN_VALUES, np.arange(2), v)  # the contract: NaN at layers 0 and 2
    v[0, 2, 0] = 0.5
    with pytest.raises(ValueError, match=r"numbers in last_token/values at layers without attention \[0, 2\]"):
        w.write(DS.LAST_TOKEN_VALUES, np.arange(2), v)
    v[0, 2, 0], v[1, 1, 3] = np.nan, np.nan
    with pytest.raises(ValueError, match="non-finite values in last_token/values at attention layers"):
        w.write(DS.LAST_TOKEN_VALUES, np.arange(2), v)
    w.abort()


def test_state_space_model_has_no_attention_datasets(tmp_path):
    from llmgeom.analyses.attention_focusing import attention_focusing_tables
    from llmgeom.analyses.value_manifold import value_manifold_table

    m, h5 = _extract(tmp_path, "mamba")
    assert arch.attention_layers(m) == () and families.summarize(m.config).attention_type == "none"
    with open_activations(h5, model="mamba") as f:
        assert store.attention_layers(f) == [] and int(f.attrs["n_heads"]) == 0
        assert not (store.ATTENTION_LAYER_DATASETS & {n for n in store.CONTRACT if n in f})
        assert np.isfinite(store.read_finite(f, DS.LAST_TOKEN_RESIDUAL)).all()
    vm = value_manifold_table({"mixed": h5}, model="mamba", n_boot=10, seed=0, standardize=(True,), ci=0.95, layers="all")
    assert set(vm.representation) == {"residual_stream"} and list(vm.layer) == [0, 1, 2]
    detail, summary = attention_focusing_tables(h5, model="mamba", **llmgeom.defaults("attention_focusing"))  # not applicable, and says so
    assert detail.empty and len(summary) == 1 and summary.attention_type[0] == "none"
    assert summary.not_applicable[0].startswith("no attention layers") and np.isnan(summary.focusing_pct[0])
    from llmgeom.weights.key_orthogonality import key_orthogonality_table

    assert key_orthogonality_table(m, model_name="mamba", seed=0, random_init=True).empty


def test_attention_points_of_attention_free_layers_are_refused(jamba):
    from llmgeom.extract import capture

    m, _ = jamba
    assert arch.attention_modules(m)[0] is None and arch.attention_modules(m)[1] is not None
    with pytest.raises(ValueError, match=r"layer 2 of this 'jamba' model has no attention \(attention layers: \[1\]\)"):
        arch.w_k_heads(m, 2)
    with pytest.raises(KeyError, match=r"blocks.0.attn.hook_v.*attention layers of this model: \[1\]"):
        with capture.hooked(m, {"blocks.0.attn.hook_v": lambda t, pt: None}):
            pass
    # the residual stream of an attention-free block is a hook point like any other (and editable)
    seen = {}
    batch = capture.make_batch(m, [[1, 5, 6, 7]])
    capture.run(m, batch, {"blocks.0.hook_resid_post": lambda t, pt: seen.setdefault("h", t.clone()),
                           "blocks.1.attn.hook_v": lambda t, pt: seen.setdefault("v", t.clone())})
    assert seen["h"].shape == (1, 4, 64) and seen["v"].shape == (1, 4, 32)


def test_layer_names_pick_among_the_attention_layers():
    from llmgeom.core.layers import select_layers

    attn = [4, 12, 20, 28]  # Jamba-style: one attention layer in 8, offset 4, of 32
    assert select_layers(["middle", "last"], 32, among=attn) == [20, 28]
    assert select_layers("all", 32, among=attn) == attn and select_layers("first", 32, among=attn) == [4]
    assert select_layers([-4], 32, among=attn) == [28]
    with pytest.raises(ValueError, match=r"interventions.layers: layer 5 has no attention.*\[4, 12, 20, 28\]"):
        select_layers([5], 32, key="interventions.layers", among=attn)
    with pytest.raises(ValueError, match="no layers the measure can use"):
        select_layers("last", 3, among=[])
    # every layer usable: the same as without ``among`` (the attention-only models' selections are unchanged)
    for spec in ("all", "first", "middle", "last", [0, -1], ["middle", 2]):
        assert select_layers(spec, 5, among=range(5)) == select_layers(spec, 5)


def test_state_space_model_interventions_are_not_applicable(tmp_path):
    """A tiny random Mamba through rule intervene's and rule sula_interventions' functions and the claims: empty
    tables with their usual columns and the reason, an empty vectors file, one summary row that says not
    applicable, and the intervention claims "not testable here" with that reason (issue 29)."""
    import pandas as pd

    from llmgeom.analyses.claims import claims_table, load_claims
    from llmgeom.analyses.interventions import SUMMARY_COLUMNS, intervention_summary
    from llmgeom.core.io import write_table
    from llmgeom.core.not_applicable import NO_ATTENTION_LAYERS
    from llmgeom.interventions.runner import (AXES_COLUMNS, PER_PROMPT_COLUMNS, intervention_experiment,
                                              save_axes)
    from llmgeom.prompts import sula

    m = mtypes.build("mamba", "eager")
    src = tmp_path / "src"
    m.save_pretrained(src)
    tok = tiny.tiny_tokenizer(m.config.vocab_size)
    tok.save_pretrained(src)
    prepared = tmp_path / "prepared"
    sources.prepare_model("mamba", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    sets, _ = sula.build_sula_sets(tok, label_pairs=[("x", "y")], label_prefix="", conditions=("main",), ks=[0, 1, 2],
                                   n_per_k=4, seed=0, n_per_k_controls=25, alpha=0.9, mask="[MASK]")
    write_prompt_set(sets["main"], tmp_path / "main.jsonl")
    h5 = tmp_path / "main.h5"
    extraction.extract_to_hdf5(prepared, tmp_path / "main.jsonl", h5, model_name="mamba", dtype="float32",
                               device="cpu", attention=False, candidates_key="candidate_token_ids", log=lambda *a: None,
                               batch_size=8, top_k=5, sample_per_prompt=30, device_map=None)
    logged = []
    per, axes, arrays = intervention_experiment(
        prepared, tmp_path / "main.jsonl", h5, model_name="mamba", layers=["middle", "last"],
        multi_layers=["middle", "last"], edits=("axis_cut", "axis_only"), shift_scale=1.0, positions="all", n_per_k=2,
        batch_size=8, seed=0, dtype="float32", device="cpu", device_map=None, log=logged.append)
    assert per.empty and list(per.columns) == PER_PROMPT_COLUMNS + ["not_applicable"]
    assert axes.empty and list(axes.columns) == AXES_COLUMNS + ["not_applicable"]
    assert per.attrs["not_applicable"] == axes.attrs["not_applicable"] == NO_ATTENTION_LAYERS
    assert arrays == {} and any("not applicable" in x for x in logged)
    # what the rule writes and the next rule reads: header-only CSVs, an .npz without arrays
    for name, df in (("per.csv", per), ("axes.csv", axes)):
        write_table(df, tmp_path / name)
    save_axes(arrays, tmp_path / "axes.npz")
    with np.load(tmp_path / "axes.npz") as z:
        assert z.files == []
    back = pd.read_csv(tmp_path / "per.csv")
    assert back.empty and list(back.columns) == list(per.columns)
    summ = intervention_summary(back, pd.read_csv(tmp_path / "axes.csv"), n_boot=20, ci=0.95, seed=0, model="mamba")
    assert len(summ) == 1 and list(summ.columns) == SUMMARY_COLUMNS + ["not_applicable"]
    r = summ.iloc[0]
    assert (r.model, r.n, r.run, r.axis, r.edit, r.n_boot, r.not_applicable) == ("mamba", 0, "", "", "", 20,
                                                                                  NO_ATTENTION_LAYERS)
    assert np.isnan(summ.mae_bits[0]) and np.isnan(summ.delta_mae_bits_lo[0]) and np.isnan(summ.pc1_corr_final[0])
    assert intervention_summary(per, axes, n_boot=20, ci=0.95, seed=0, model="mamba").equals(summ)
    with pytest.raises(ValueError, match="pass model="):
        intervention_summary(back, axes, n_boot=20, ci=0.95, seed=0)
    # the claims that read the table: not testable here for this model, with the reason, its null the same
    write_table(summ, tmp_path / "summ.csv")
    t = pd.read_csv(tmp_path / "summ.csv")  # as the claims rule reads it: "" -> NaN
    ids = [c["id"] for c in load_claims() if c["table"] == "sula_interventions"]
    null = t.assign(model="mamba-random-init")
    card = claims_table({"sula_interventions": pd.concat([t, null], ignore_index=True)}, models=["mamba"],
                        nulls={"mamba-random-init": "mamba"})
    c = card[card.claim_id.isin(ids)]
    assert len(ids) == 3 and sorted(c.claim_id) == sorted(ids) and (c.model == "mamba").all()
    assert (c.verdict == "not testable here").all() and (c.reason == NO_ATTENTION_LAYERS).all()
    assert (c.setting == "").all() and (c.null_verdict == "not testable here").all()
    assert (c.null_reason == NO_ATTENTION_LAYERS).all() and (c.null_model == "mamba-random-init").all()
