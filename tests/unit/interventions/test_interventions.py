"""Interventions: value-vector hooks for every family (tensor- and tuple-returning modules),
exact no-op, axis_cut leaves no projection, hooks always removed, entropy/random axes, summary."""

import numpy as np
import pandas as pd
import pytest
import torch

from llmgeom.models import architectures as arch
from llmgeom.models import families
from llmgeom.interventions import edits as iv
from llmgeom.models import tiny as testing
from llmgeom.extract.capture import pad_batch
from llmgeom.analyses.interventions import intervention_summary
from llmgeom.interventions.axes import EntropyAxis, entropy_axis, random_axis
from llmgeom.interventions.runner import intervention_conditions, intervention_experiment, length_batches, run_interventions, skip_layers

FAMILIES = testing.FAMILIES
SEQS = [[1, 10, 11, 12, 13, 14, 15], [1, 40, 41], [1, 50, 60, 70, 80, 5]]
_CACHE = {}


def tiny(family):
    if family not in _CACHE:
        _CACHE[family] = testing.tiny_model(family, attn="sdpa")
    return _CACHE[family]


def logits(model, seqs=SEQS):
    ids, mask, pos = pad_batch(seqs, 0, "cpu")
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits


def n_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def vdim(model):
    s = families.summarize(model.config)
    return (s.n_heads if families.family_for(model.config).qkv != "separate" else s.n_kv_heads) * s.head_dim


def unit(d, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(d, generator=g)
    return u / u.norm()


class _Capture:
    """Records the value vectors (after any earlier hook's edit) of one layer."""

    def __init__(self, model, layer):
        self.model, self.cols = model, arch.qkv_columns(model, "v")
        self.h = arch.v_module(model, layer).register_forward_hook(self)
        self.v = None

    def __call__(self, mod, args, out):
        o = out[0] if isinstance(out, tuple) else out
        self.v = (o if self.cols is None else o[..., self.cols]).detach().clone()

    def remove(self):
        self.h.remove()


class _TupleOut(torch.nn.Module):
    """Wraps a projection so that it returns (tensor, extra), like older transformers layers."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x), "extra"


class _Unwrap(torch.nn.Module):
    def __init__(self, tuple_mod):
        super().__init__()
        self.tuple_mod = tuple_mod

    def forward(self, x):
        out, extra = self.tuple_mod(x)
        assert extra == "extra"  # the hook passes the rest of the tuple through
        return out


def edited_values(model, layer, edits=None, positions=None):
    """(values of ``layer`` after the edits [B, T, D], logits); the capture hook is registered after the
    edit hooks, so it sees what the rest of the model sees."""
    with iv.value_edits(model, edits or {}, positions=positions):
        cap = _Capture(model, layer)
        try:
            out = logits(model)
        finally:
            cap.remove()
    return cap.v, out


@pytest.fixture
def tuple_model(monkeypatch):
    """A factory: the family's tiny model with every value module replaced by Unwrap(TupleOut(orig)), and
    architectures.v_module pointing at the tuple-returning TupleOut."""
    def make(family):
        m = testing.tiny_model(family, attn="sdpa")
        fam = families.family_for(m.config)
        path = fam.fused_proj or fam.v_proj
        parent_path, name = path.rsplit(".", 1)
        inner = {}
        for i, blk in enumerate(arch.decoder_layers(m)):
            parent = blk.get_submodule(parent_path)
            t = _TupleOut(getattr(parent, name))
            setattr(parent, name, _Unwrap(t))
            inner[i] = t
        monkeypatch.setattr(arch, "v_module", lambda model, layer: inner[layer])
        return m
    return make


@pytest.mark.parametrize("wrap", ["tensor", "tuple"])
@pytest.mark.parametrize("family", FAMILIES)
def test_noop_edit_gives_identical_logits(family, wrap, tuple_model):
    m = tiny(family) if wrap == "tensor" else tuple_model(family)
    ref = logits(m)
    before = n_hooks(m)
    L = len(arch.decoder_layers(m))
    u = unit(vdim(m))
    for edit in (iv.ValueEdit("none"), iv.ValueEdit("axis_shift", u, 0.0)):
        with iv.value_edits(m, {l: edit for l in range(L)}) as handles:
            assert len(handles) == L
            out = logits(m)
        assert torch.equal(out, ref), family
    last = torch.tensor([len(s) - 1 for s in SEQS])
    with iv.value_edits(m, {0: iv.ValueEdit("none")}, positions=last):
        assert torch.equal(logits(m), ref)
    assert n_hooks(m) == before


@pytest.mark.parametrize("wrap", ["tensor", "tuple"])
@pytest.mark.parametrize("family", FAMILIES)
def test_axis_cut_leaves_no_projection(family, wrap, tuple_model):
    m = tiny(family) if wrap == "tensor" else tuple_model(family)
    ref = logits(m)
    before = n_hooks(m)
    u = unit(vdim(m), seed=1)
    for layer in range(len(arch.decoder_layers(m))):
        v, out = edited_values(m, layer, {layer: iv.ValueEdit("axis_cut", u)})  # [B, T, D]
        proj = (v.double() @ u.double()).abs()  # every batch item and position
        # (+1e-9 absolute: padding positions of models whose pad embedding is zero have |v| ~ 0)
        assert (proj <= 1e-5 * v.double().norm(dim=-1) + 1e-9).all(), (family, layer, float(proj.max()))
        assert not torch.equal(out, ref)  # the edit changes the model
        # the unedited values do have a projection (otherwise the test proves nothing)
        v0, _ = edited_values(m, layer)
        assert (v0.double() @ u.double()).abs().max() > 1e-3
    assert n_hooks(m) == before


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "gemma3"])
def test_axis_only_shift_and_last_position(family):
    m = tiny(family)
    u = unit(vdim(m), seed=2)
    v0, _ = edited_values(m, 0)
    v, _ = edited_values(m, 0, {0: iv.ValueEdit("axis_only", u)})
    torch.testing.assert_close(v, (v0 @ u).unsqueeze(-1) * u, atol=1e-5, rtol=0)
    v, _ = edited_values(m, 0, {0: iv.ValueEdit("axis_shift", u, 0.7)})
    torch.testing.assert_close(v, v0 + 0.7 * u, atol=1e-5, rtol=0)
    # final position only: every other position unchanged, the last real token cut
    last = torch.tensor([len(s) - 1 for s in SEQS])
    v, _ = edited_values(m, 0, {0: iv.ValueEdit("axis_cut", u)}, positions=last)
    for b, t in enumerate(last.tolist()):
        assert abs(float(v[b, t] @ u)) < 1e-5 * float(v[b, t].norm())
        keep = torch.ones(v.shape[1], dtype=torch.bool)
        keep[t] = False
        torch.testing.assert_close(v[b, keep], v0[b, keep], atol=0, rtol=0)


def test_hooks_removed_when_forward_raises():
    m = tiny("llama")
    before = n_hooks(m)

    def boom(mod, args, out):
        raise RuntimeError("boom")

    h = arch.decoder_layers(m)[1].register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with iv.value_edits(m, {0: iv.ValueEdit("axis_cut", unit(vdim(m))), 1: iv.ValueEdit("none")}):
                assert n_hooks(m) == before + 3
                logits(m)
    finally:
        h.remove()
    assert n_hooks(m) == before
    # a bad layer: nothing left registered either
    with pytest.raises(IndexError):
        with iv.value_edits(m, {0: iv.ValueEdit("none"), 7: iv.ValueEdit("none")}):
            pass
    assert n_hooks(m) == before
    with pytest.raises(ValueError, match="length"):
        with iv.value_edits(m, {0: iv.ValueEdit("axis_cut", unit(5))}):
            logits(m)
    assert n_hooks(m) == before


def test_entropy_axis_sign_sigma_and_random_axis():
    rng = np.random.default_rng(0)
    n, d = 200, 12
    t = rng.standard_normal(n)
    scale = np.linspace(0.5, 3, d)
    direction = rng.standard_normal(d)
    V = 5 + np.outer(t, direction) * 3 + 0.05 * rng.standard_normal((n, d)) * scale
    h = t + 0.1 * rng.standard_normal(n)
    ax = entropy_axis(V, h, layer=3)
    assert np.linalg.norm(ax.u) == pytest.approx(1.0)
    assert ax.corr > 0.9 and ax.pc1 > 0.9 and ax.sign == "pearson(h_model_bits) >= 0"
    assert ax.sigma == pytest.approx(np.std(V @ ax.u))
    ax2 = entropy_axis(V, -h, layer=3)  # sign follows H_model
    np.testing.assert_allclose(ax2.u, -ax.u, atol=1e-12)
    assert ax2.corr == pytest.approx(ax.corr)
    for layer in range(4):
        r = random_axis(ax.u, seed=0, layer=layer)
        assert np.linalg.norm(r) == pytest.approx(1.0, abs=1e-12)
        assert abs(r @ ax.u) < 1e-12
    np.testing.assert_array_equal(random_axis(ax.u, 0, 1), random_axis(ax.u, 0, 1))
    assert not np.allclose(random_axis(ax.u, 0, 1), random_axis(ax.u, 0, 2))
    assert not np.allclose(random_axis(ax.u, 0, 1), random_axis(ax.u, 1, 1))


def test_length_batches():
    b = length_batches([3, 40, 41, 20, 21, 7, 40, 3], 2)
    assert b == [[2, 1], [6], [4, 3], [5], [0, 7]]
    assert sorted(i for x in length_batches([5] * 7, 3) for i in x) == list(range(7))
    assert [len(x) for x in length_batches([5] * 7, 3)] == [3, 3, 1]


def test_resolve_layers_and_conditions():
    from llmgeom.core.layers import select_layers

    assert select_layers(["middle", "last", -1, 0], 30) == [0, 15, 29]
    with pytest.raises(ValueError, match="interventions.layers: layer 30 is outside"):
        select_layers([30], 30, key="interventions.layers")
    with pytest.raises(ValueError, match="'top' is not a layer"):
        select_layers(["top"], 30)
    conds = intervention_conditions([15, 29], [15, 29], list(iv.EDIT_NAMES))
    assert conds[0]["condition"] == "baseline" and len(conds) == 1 + 3 * 2 * 4
    assert {c["run"] for c in conds} == {"baseline", "L15", "L29", "multi_L15+L29"}
    with pytest.raises(ValueError):
        intervention_conditions([1], None, ["cut"])


def test_experiment_and_summary_on_tiny_model(tmp_path):
    from llmgeom.extract import forward as extraction
    from llmgeom.prompts import sula
    from llmgeom.models import sources as models
    from llmgeom.prompts.io import write_prompt_set

    from transformers import AutoModelForCausalLM

    src = tmp_path / "src"  # 3 layers: single-layer runs at 1 and 2, multi-layer run at 1+2
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(testing.tiny_config("gpt_neox", num_hidden_layers=3)).save_pretrained(src)
    testing.tiny_tokenizer().save_pretrained(src)
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    sets, _ = sula.build_sula_sets(testing.tiny_tokenizer(), label_pairs=[("x", "y")], label_prefix="",
                                   conditions=("main",), ks=[0, 1, 2, 4], n_per_k=6, seed=0, n_per_k_controls=25, alpha=0.9, mask="[MASK]")
    write_prompt_set(sets["main"], tmp_path / "main.jsonl")
    extraction.extract_to_hdf5(prepared, tmp_path / "main.jsonl", tmp_path / "main.h5", model_name="tiny",
                               dtype="float32", device="cpu", attention=False, candidates_key="candidate_token_ids",
                               log=lambda *a: None, batch_size=8, top_k=10, sample_per_prompt=30, device_map=None)
    per, axes, arrays = intervention_experiment(
        prepared, tmp_path / "main.jsonl", tmp_path / "main.h5", model_name="tiny", layers=["middle", "last"],
        multi_layers=["middle", "last"], n_per_k=4, batch_size=16, dtype="float32", device="cpu", log=lambda *a: None, edits=("axis_cut", "axis_only", "axis_shift_plus", "axis_shift_minus"), shift_scale=1.0, positions="all", seed=0, device_map=None)
    assert per.condition.nunique() == 1 + 3 * 2 * 4 and (per.groupby("condition").size() == 16).all()
    base = per[per.condition == "baseline"].set_index("prompt")
    # the baseline reproduces the extraction's candidate log-probs
    with __import__("h5py").File(tmp_path / "main.h5", "r") as f:
        lp = f["next_token/candidate_logprobs"][:]
        ids = [m for m in f["prompts/text"].asstr()[:]]
    keep = [i for i, r in enumerate(sets["main"]) if r["meta"]["i"] < 4]
    np.testing.assert_allclose(base.logp_l1.to_numpy(), lp[keep, 0], atol=1e-5)
    assert len(ids) == 24
    # cut on the entropy axis at the last layer: zero projection there
    cut = per[per.condition == "L2/entropy/axis_cut"]
    assert np.abs(cut.proj_L2).max() < 1e-4 * max(1.0, np.abs(base.proj_L2).max())
    # cut at layer 1 changes what layer 2 sees; a random-axis cut leaves the entropy projection at 1 intact
    rnd = per[per.condition == "L1/random/axis_cut"].set_index("prompt")
    np.testing.assert_allclose(rnd.proj_L1, base.proj_L1, atol=1e-4)
    with pytest.raises(ValueError, match="identical"):
        entropy_axis(np.ones((5, 4)), np.arange(5.0), layer=0)
    assert (axes.random_dot_u.dropna() < 1e-10).all() and np.allclose(axes.random_norm.dropna(), 1)
    assert set(arrays) == {"u_L1", "u_L2", "random_L1", "random_L2"}
    # the usual columns (those of a not-applicable model's empty tables), and no not_applicable column here
    from llmgeom.analyses.interventions import SUMMARY_COLUMNS
    from llmgeom.interventions.runner import AXES_COLUMNS, PER_PROMPT_COLUMNS

    assert list(per.columns) == PER_PROMPT_COLUMNS + ["proj_L1", "proj_L2", "pc1_recomputed_L2"]
    assert list(axes.columns) == AXES_COLUMNS
    summ = intervention_summary(per, axes, n_boot=20, seed=0, ci=0.95)
    assert len(summ) == 25 and list(summ.columns) == SUMMARY_COLUMNS
    b = summ[summ.run == "baseline"].iloc[0]
    assert b.delta_mae_bits == 0 and b.delta_mae_bits_lo == 0
    c = summ[(summ.run == "L1") & (summ.axis == "entropy") & (summ.edit == "axis_cut")].iloc[0]
    assert c.degenerate_edited and c.axis_corr_edited == 0.0
    assert c.probe_layer_edited == 1 and c.probe_layer_final == 2
    assert set(summ.run) == {"baseline", "L1", "L2", "multi_L1+L2"}
    ok = summ.dropna(subset=["delta_mae_bits_lo"])
    assert (ok.delta_mae_bits_lo <= ok.delta_mae_bits_hi).all()
    # the summary can be recomputed from the CSV written by the rule
    per.to_csv(tmp_path / "p.csv", index=False)
    again = intervention_summary(pd.read_csv(tmp_path / "p.csv"), axes, n_boot=20, seed=0, ci=0.95)
    np.testing.assert_allclose(again.delta_mae_bits, summ.delta_mae_bits)
    # the cross-model table with a model without attention layers (one not-applicable row): the figure copes
    from llmgeom.interventions.runner import not_applicable_outputs
    from llmgeom.plots.sula import interventions_figure

    ssm = intervention_summary(*not_applicable_outputs("no attention layers")[:2], n_boot=20, seed=0, ci=0.95,
                               model="ssm")
    both = pd.concat([summ, ssm], ignore_index=True)
    assert both.not_applicable.tolist() == [np.nan] * 25 + ["no attention layers"]
    interventions_figure(both, [tmp_path / "fig.png"])
    assert (tmp_path / "fig.png").stat().st_size > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_skipping_unaffected_blocks_is_exact(family):
    """Edited conditions rerun only blocks >= the first edited layer; the numbers equal a full forward pass."""
    m = tiny(family)
    before = n_hooks(m)
    d = vdim(m)
    axes = {l: EntropyAxis(layer=l, u=unit(d, seed=l).double().numpy(), sigma=0.5, corr=0.5, pc1=0.5,
                              n_fit=10, flipped=False) for l in (0, 1)}
    rnd = {l: random_axis(axes[l].u, 0, l) for l in (0, 1)}
    conds = intervention_conditions([1], [0, 1], ["axis_cut", "axis_shift_plus"])
    cands = [[5, 6]] * len(SEQS)
    kw = dict(probe_layers=[0, 1], batch_size=3, shift_scale=1.0, log=lambda *a: None)
    fast = run_interventions(m, SEQS, cands, conds, axes, rnd, skip=True, positions="all", **kw)
    full = run_interventions(m, SEQS, cands, conds, axes, rnd, skip=False, positions="all", **kw)
    for c in conds:
        a, b = fast[c["condition"]], full[c["condition"]]
        np.testing.assert_allclose(a["logp"], b["logp"], atol=1e-6, rtol=0, err_msg=c["condition"])
        for l in (0, 1):
            np.testing.assert_allclose(a["proj"][l], b["proj"][l], atol=1e-6, rtol=0)
    # edits change the outputs (otherwise the comparison proves nothing)
    assert np.abs(fast["L1/entropy/axis_shift_plus"]["logp"] - fast["baseline"]["logp"]).max() > 1e-6
    assert n_hooks(m) == before
    assert all("forward" not in blk.__dict__ for blk in arch.decoder_layers(m))
    # last-position edits: the same exactness
    last_fast = run_interventions(m, SEQS, cands, conds[:2], axes, rnd, positions="last", skip=True, **kw)
    last_full = run_interventions(m, SEQS, cands, conds[:2], axes, rnd, positions="last", skip=False, **kw)
    for c in conds[:2]:
        np.testing.assert_allclose(last_fast[c["condition"]]["logp"], last_full[c["condition"]]["logp"], atol=1e-6)


def test_skip_layers_restores_forward_when_raising():
    m = tiny("llama")
    blk = arch.decoder_layers(m)[0]
    with pytest.raises(RuntimeError, match="inside"):
        with skip_layers(m, 2, None):
            assert "forward" in blk.__dict__
            raise RuntimeError("inside")
    assert "forward" not in blk.__dict__
    torch.testing.assert_close(logits(m), logits(m))


def test_summary_replicates_reproduce_the_intervals():
    """sula_interventions.csv: every delta_* and pc1_corr_final carries the replicates its interval is taken from,
    replicate b of every row from the same prompt resample b (issue 48 point 4). Known answer: an edit that changes
    nothing has delta 0 in every resample."""
    from replicate_checks import assert_replicates_reproduce

    from llmgeom.core.stats import parse_replicates

    rng = np.random.default_rng(5)
    P = 30
    hb = rng.uniform(0, 1, P)
    hm0 = np.clip(hb + rng.normal(0, 0.1, P), 0, 1)
    rows = []
    for cond, hm in (("baseline", hm0), ("entropy/axis_cut", np.clip(hb + rng.normal(0, 0.2, P), 0, 1)),
                     ("random/axis_cut", hm0)):
        for p in range(P):
            rows.append(dict(model="m", condition=cond, prompt=p, run="L1", layers="1", axis=cond.split("/")[0],
                             edit="axis_cut", shift_sigmas=0.0, positions="all", h_bayes_bits=hb[p],
                             h_model_bits=hm[p], label_mass=0.9, proj_L1=hm[p] + rng.normal(0, 0.3),
                             proj_L2=hm[p] + rng.normal(0, 0.3), pc1_recomputed_L2=hm[p] + rng.normal(0, 0.5)))
    s = intervention_summary(pd.DataFrame(rows), pd.DataFrame(dict(layer=[1, 2], sigma=[1.0, 1.0])), n_boot=40,
                             ci=0.9, seed=0, model="m")
    for k in ("mae_bits", "pearson_r", "axis_corr_edited", "axis_corr_final"):
        assert assert_replicates_reproduce(s, f"delta_{k}", ci=0.9, n_boot=40) == 3
    assert assert_replicates_reproduce(s, "pc1_corr_final", ci=0.9, bounds=(-1.0, 1.0), n_boot=40) == 3
    same = s[s.axis == "random"].iloc[0]  # unchanged predictions: MAE change 0 in every resample
    np.testing.assert_array_equal(parse_replicates(same.delta_mae_bits_replicates), 0.0)
    assert (same.delta_mae_bits_lo, same.delta_mae_bits_hi) == (0.0, 0.0)
    base = s[s.axis == "baseline"].iloc[0]  # the baseline against itself: 0 in every resample too
    np.testing.assert_array_equal(parse_replicates(base.delta_pearson_r_replicates), 0.0)
    assert np.ptp(parse_replicates(s[s.axis == "entropy"].iloc[0].delta_mae_bits_replicates)) > 0
