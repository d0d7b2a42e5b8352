"""Extraction against the tiny model's own forward pass, for every family.

Values stored by ``extract_batch`` are compared with what the model computes
itself (hidden_states, logits, attention weights); batching with padding and the
tokenizer's padding side must not change any stored value.
"""

import copy
import json
import math

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llmgeom.models import architectures as arch
from llmgeom.models import families
from llmgeom.extract import capture
from llmgeom.extract import attention as attn_maths, batch as batch_mod, forward as extraction
from llmgeom.models import sources as models, tiny as testing
from llmgeom.extract.capture import last_positions, pad_batch
from llmgeom.extract.batch import NonFiniteActivationError, extract_batch
from llmgeom.prompts.io import write_prompt_set

FAMILIES = testing.FAMILIES
ATOL = 1e-4

SEQ3 = [1, 40, 41]
SEQ7 = [1, 10, 11, 12, 13, 14, 15]
SEQ9 = [1, 50, 60, 70, 80, 5, 6, 7, 8]

_CACHE = {}


def tiny(family):
    """Tiny eager model per family, built once per test session (hooks are always removed)."""
    if family not in _CACHE:
        m = testing.tiny_model(family, attn="eager")
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():  # non-trivial biases and norm gains
            for p in m.parameters():
                if p.dim() == 1:
                    p.add_(0.2 * torch.randn(p.shape, generator=g))
        _CACHE[family] = m
    return _CACHE[family]


def own_forward(model, seqs, **kw):
    ids, mask, pos = pad_batch(seqs, 0, "cpu")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **kw)
    return ids, mask, out


def n_hooks(model):
    """Forward (pre-)hooks on all modules, excluding the output-capturing hooks that
    transformers installs once, lazily, the first time attentions/hidden states are requested."""
    def ours(hooks):
        return sum(not getattr(fn, "__module__", "").startswith("transformers") for fn in hooks.values())
    return sum(ours(m._forward_hooks) + ours(m._forward_pre_hooks) for m in model.modules())


def unembed_input(model, family, h):
    """What the unembedding sees, from the pre-norm residual ``h``."""
    y = arch.final_norm(model)(h)
    if family == "opt_proj":
        y = model.model.decoder.project_out(y)
    return y


# --------------------------------------------------------------------------- shapes and values


@pytest.mark.parametrize("family", FAMILIES)
def test_extract_batch_shapes_and_values(family):
    m = tiny(family)
    s = families.summarize(m.config)
    L, d, hd = s.n_layers, s.d_model, s.head_dim
    seqs = [SEQ7, SEQ3, SEQ9]
    B = len(seqs)
    before = n_hooks(m)
    r = extract_batch(m, seqs, attention=True, top_k=5)
    assert n_hooks(m) == before
    d_unembed = 16 if family == "opt_proj" else 32
    assert r["last_token/residual"].shape == (B, L + 1, d)
    assert r["last_token/values"].shape == (B, L, s.n_kv_heads * hd)
    assert r["last_token/keys"].shape == (B, L, s.n_kv_heads, hd)
    assert r["last_token/final_normed"].shape == (B, d_unembed)
    assert r["attention/entropy"].shape == (B, L, s.n_heads)
    assert r["next_token/entropy"].shape == (B,)
    assert r["next_token/top_ids"].shape == r["next_token/top_logits"].shape == (B, 5)
    for k in ("last_token/residual", "last_token/values", "last_token/keys", "last_token/final_normed", "attention/entropy", "next_token/entropy", "next_token/top_logits"):
        assert r[k].dtype == np.float32, k
        assert np.isfinite(r[k]).all(), k

    ids, mask, out = own_forward(m, seqs, output_hidden_states=True)
    hs = out.hidden_states
    assert len(hs) == L + 1
    last = [len(sq) - 1 for sq in seqs]
    for b in range(B):
        t = last[b]
        np.testing.assert_allclose(r["last_token/residual"][b, 0], hs[0][b, t].numpy(), atol=1e-5, rtol=0)
        for layer in range(1, L):
            np.testing.assert_allclose(r["last_token/residual"][b, layer], hs[layer][b, t].numpy(), atol=1e-5, rtol=0)
        # last stored layer is PRE final norm; what the unembedding sees is final_normed
        pre = torch.from_numpy(r["last_token/residual"][b, L])
        with torch.no_grad():
            post = unembed_input(m, family, pre).numpy()
        np.testing.assert_allclose(post, r["last_token/final_normed"][b], atol=1e-5, rtol=0)
        # hidden_states[-1] is post-norm (post project_out for opt_proj): it equals final_normed,
        # and differs from the stored pre-norm residual[L]
        np.testing.assert_allclose(hs[L][b, t].numpy(), r["last_token/final_normed"][b], atol=1e-5, rtol=0)
        if family != "opt_proj":
            assert np.abs(r["last_token/residual"][b, L] - r["last_token/final_normed"][b]).max() > 1e-2
        else:
            assert r["last_token/residual"][b, L].shape != r["last_token/final_normed"][b].shape
        # logits: the model's own, in float32, at the last real token
        logits = out.logits[b, t].float()
        tv, ti = logits.topk(5)
        np.testing.assert_allclose(r["next_token/top_logits"][b], tv.numpy(), atol=ATOL, rtol=0)
        np.testing.assert_array_equal(r["next_token/top_ids"][b], ti.numpy())
        p = torch.softmax(logits.double(), -1)
        ent = float(-(p * p.log()).sum())
        assert r["next_token/entropy"][b] == pytest.approx(ent, abs=ATOL)
        assert 0 < r["next_token/entropy"][b] <= math.log(s.vocab_size) + 1e-5
    assert (np.diff(r["next_token/top_logits"], axis=1) <= 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_values_and_keys_are_the_projections_at_the_last_token(family):
    """values/keys equal the k/v projection outputs at the last real token (pre-RoPE)."""
    m = tiny(family)
    s = families.summarize(m.config)
    fam = families.family_for(m.config)
    seqs = [SEQ3, SEQ7]
    got = {}
    handles = []

    def hook(name):
        def fn(mod, args, out):
            got[name] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        return fn

    try:
        for i in range(s.n_layers):
            handles.append(arch.kv_module(m, i).register_forward_hook(hook(("k", i))))
            if fam.qkv == "separate":
                handles.append(arch.v_module(m, i).register_forward_hook(hook(("v", i))))
        own_forward(m, seqs)
    finally:
        for h in handles:
            h.remove()
    r = extract_batch(m, seqs, attention=False, top_k=10)
    for i in range(s.n_layers):
        if fam.qkv == "separate":
            k, v = got[("k", i)], got[("v", i)]
        else:
            k, v = (arch.qkv_part(m, got[("k", i)], p) for p in "kv")
        for b, sq in enumerate(seqs):
            t = len(sq) - 1
            np.testing.assert_allclose(r["last_token/values"][b, i], v[b, t].numpy(), atol=1e-5, rtol=0)
            np.testing.assert_allclose(r["last_token/keys"][b, i].reshape(-1), k[b, t].numpy(), atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- padding invariance


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_invariance(family):
    m = tiny(family)
    keys = ("last_token/residual", "last_token/final_normed", "last_token/values", "last_token/keys", "last_token/attn_output", "attention/entropy", "next_token/entropy", "next_token/top_logits")
    both = extract_batch(m, [SEQ3, SEQ7], attention=True, top_k=10)
    both_rev = extract_batch(m, [SEQ7, SEQ3], attention=True, top_k=10)
    alone = [extract_batch(m, [SEQ3], attention=True, top_k=10), extract_batch(m, [SEQ7], attention=True, top_k=10)]
    for b in range(2):
        for k in keys:
            np.testing.assert_allclose(both[k][b], alone[b][k][0], atol=ATOL, rtol=0, err_msg=k)
            np.testing.assert_allclose(both_rev[k][1 - b], alone[b][k][0], atol=ATOL, rtol=0, err_msg=k)
        np.testing.assert_array_equal(both["next_token/top_ids"][b], alone[b]["next_token/top_ids"][0])
    # the two prompts really differ (otherwise the test proves nothing)
    assert np.abs(alone[0]["last_token/residual"][0, -1] - alone[1]["last_token/residual"][0, -1]).max() > 1e-3


def _prompt_file(path):
    recs = [{"id": "p3", "text": "ab", "meta": {"topic": "x", "k": 1}},
            {"id": "p7", "text": "abcdefgh", "meta": {"topic": "y", "k": 2}},
            {"id": "p5", "text": "Zyx w", "meta": {"topic": "x", "k": 3}},
            {"id": "p1", "text": "q", "meta": {}}]
    write_prompt_set(recs, path)
    return recs


def _set_padding_side(model_dir, side):
    p = model_dir / "tokenizer_config.json"
    cfg = json.loads(p.read_text())
    cfg["padding_side"] = side
    p.write_text(json.dumps(cfg))


def _read_all(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visit(lambda n: out.__setitem__(n, f[n][()]) if isinstance(f[n], h5py.Dataset) else None)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_hdf5_independent_of_padding_side_and_batch_size(family, tmp_path):
    from transformers import AutoTokenizer

    src = testing.save_tiny_model_dir(family, tmp_path / "src")
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    prompts = tmp_path / "mixed.jsonl"
    recs = _prompt_file(prompts)
    runs = {}
    for side, bs, corpus in (("right", 3, False), ("left", 3, False), ("left", 1, False), ("right", 4, False),
                             ("right", 3, True), ("left", 1, True)):
        _set_padding_side(src, side)
        assert AutoTokenizer.from_pretrained(src).padding_side == side
        out = tmp_path / f"{side}_{bs}_{corpus}.h5"
        extraction.extract_to_hdf5(prepared, prompts, out, model_name="tiny", dtype="float32", device="cpu",
                                   batch_size=bs, corpus=corpus, sample_per_prompt=3, log=lambda *a: None, top_k=10, device_map=None)
        runs[(side, bs, corpus)] = _read_all(out)
    for corpus in (False, True):
        ref = runs[("right", 3, corpus)]
        assert [t.decode() if isinstance(t, bytes) else t for t in ref["prompts/text"]] == [r["text"] for r in recs]
        # <bos> + one token per character
        np.testing.assert_array_equal(ref["prompts/n_tokens"], [1 + len(r["text"]) for r in recs])
        assert ("tokens/margin" in ref) == corpus
        for key, run in runs.items():
            if key[2] != corpus:
                continue
            assert set(run) == set(ref)
            for name, v in ref.items():
                if v.dtype.kind == "f":
                    np.testing.assert_allclose(run[name], v, atol=1e-5, rtol=0, err_msg=f"{key} {name}")
                else:
                    np.testing.assert_array_equal(run[name], v, err_msg=f"{key} {name}")
    # corpus extras do not change the last-token datasets
    for name, v in runs[("right", 3, False)].items():
        if v.dtype.kind == "f":
            np.testing.assert_allclose(runs[("right", 3, True)][name], v, atol=1e-5, rtol=0, err_msg=name)


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_rows_and_entropy(family):
    m = tiny(family)
    s = families.summarize(m.config)
    seqs = [SEQ3, SEQ9, SEQ7]
    ids, mask, out = own_forward(m, seqs, output_attentions=True)
    att = out.attentions
    assert len(att) == s.n_layers
    r = extract_batch(m, seqs, attention=True, top_k=10)
    T = ids.shape[1]
    for layer, a in enumerate(att):
        assert a.shape == (len(seqs), s.n_heads, T, T)
        for b, sq in enumerate(seqs):
            n = len(sq)
            rows = a[b, :, :n, :].double()  # every real query position
            torch.testing.assert_close(rows.sum(-1), torch.ones(s.n_heads, n, dtype=torch.float64),
                                       atol=1e-5, rtol=0)
            future = torch.triu(torch.ones(n, T, dtype=torch.bool), diagonal=1)  # key > query, incl. padding
            assert rows[:, future].abs().max() == 0
            last = rows[:, n - 1, :]  # final query
            assert last[:, n:].abs().max() == 0 if n < T else True
            if layer in s.sliding_layers and n > s.sliding_window:
                # sliding window: only the last `window` keys are visible
                assert last[:, :n - s.sliding_window].abs().max() == 0
                assert (last[:, n - s.sliding_window:n] > 0).all()
            else:
                assert (last[:, :n] > 0).all()
            p = last[:, :n]
            hand = -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)  # 0 log 0 = 0
            np.testing.assert_allclose(r["attention/entropy"][b, layer], hand.numpy(), atol=ATOL, rtol=0)
            assert (r["attention/entropy"][b, layer] <= math.log(n) + 1e-5).all()


def test_attention_row_entropy_uniform_and_degenerate():
    for n in (1, 2, 7, 100):
        assert float(attn_maths.attention_row_entropy(torch.full((n,), 1.0 / n))) == pytest.approx(math.log(n), abs=1e-5)
    # 0 log 0 = 0: a one-hot row has entropy 0, zeros (masked keys) add nothing
    assert float(attn_maths.attention_row_entropy(torch.tensor([0.0, 1.0, 0.0]))) == 0.0
    p = torch.tensor([0.5, 0.25, 0.25, 0.0])
    assert float(attn_maths.attention_row_entropy(p)) == pytest.approx(1.5 * math.log(2), abs=1e-6)
    # batched rows, half precision input is upcast
    x = torch.full((3, 4), 0.25, dtype=torch.float16)
    e = attn_maths.attention_row_entropy(x)
    assert e.dtype == torch.float32 and e.shape == (3,)
    torch.testing.assert_close(e, torch.full((3,), math.log(4)))


def test_entropy_nats():
    z = torch.zeros(2, 10)
    torch.testing.assert_close(attn_maths.entropy_nats(z), torch.full((2,), math.log(10)))
    z = torch.tensor([[1e4, 0.0, 0.0]], dtype=torch.bfloat16)
    assert float(attn_maths.entropy_nats(z)[0]) == pytest.approx(0.0, abs=1e-6)


LONG = [1] + [5 + (7 * i) % 90 for i in range(40)]  # 41 tokens: longer than the tiny Gemma-3 (4) and Mistral (16) windows


def eager_entropies(model, seqs):
    """Reference: entropy of each prompt's final-query row of eager ``output_attentions`` [B, L, H]."""
    _, _, out = own_forward(model, seqs, output_attentions=True)
    return np.stack([[attn_maths.attention_row_entropy(a[b, :, len(sq) - 1]).numpy() for a in out.attentions]
                     for b, sq in enumerate(seqs)])


def sdpa_twin(family):
    """The ``tiny(family)`` weights in a model loaded with sdpa attention."""
    m = testing.tiny_model(family, attn="sdpa")
    m.load_state_dict(tiny(family).state_dict())
    assert m.config._attn_implementation == "sdpa"
    return m


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_entropy_from_hooked_queries_equals_eager(family):
    """Issue 13 item 2: entropies from hooked q/k under sdpa equal eager output_attentions (float32, 1e-5),
    with padding in the batch and a prompt longer than the sliding window."""
    seqs = [LONG, SEQ3, SEQ9]
    ref = eager_entropies(tiny(family), seqs)
    m = sdpa_twin(family)
    before = n_hooks(m)
    r = extract_batch(m, seqs, attention=True, top_k=10)
    assert n_hooks(m) == before
    np.testing.assert_allclose(r["attention/entropy"], ref, atol=1e-5, rtol=0)
    # the same path on an eager model
    np.testing.assert_allclose(extract_batch(tiny(family), seqs, attention=True, top_k=10)["attention/entropy"], ref, atol=1e-5, rtol=0)
    # heads and layers differ (the comparison is not between constants)
    assert np.ptp(ref[0]) > 1e-4


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_sliding_window_is_applied(family, monkeypatch):
    """Ignoring the window changes the long prompt's entropies, so the equality above tests it. The window reaches
    the entropy twice: the rebuilt mask (``attention_window``) and the row of the mask the model passes to its
    attention function (``final_query_mask_row``, which carries it here); either alone gives eager's entropies,
    ignoring both does not."""
    m = sdpa_twin(family)
    ref = eager_entropies(tiny(family), [LONG])
    s = families.summarize(m.config)
    assert s.sliding_layers and s.sliding_window < len(LONG)
    monkeypatch.setattr(families, "attention_window", lambda config, layer: None)
    np.testing.assert_allclose(extract_batch(m, [LONG], attention=True, top_k=10)["attention/entropy"], ref,
                               atol=1e-5, rtol=0)
    monkeypatch.setattr(batch_mod, "final_query_mask_row", lambda mask, last, T_k: None)
    wrong = extract_batch(m, [LONG], attention=True, top_k=10)["attention/entropy"]
    assert np.abs(wrong - ref)[0, list(s.sliding_layers)].max() > 1e-2
    monkeypatch.undo()  # the rebuilt window alone
    monkeypatch.setattr(batch_mod, "final_query_mask_row", lambda mask, last, T_k: None)
    np.testing.assert_allclose(extract_batch(m, [LONG], attention=True, top_k=10)["attention/entropy"], ref,
                               atol=1e-5, rtol=0)


def test_gemma3_query_pre_attn_scalar():
    """Gemma 3 scales q.k by query_pre_attn_scalar**-0.5, not head_dim**-0.5 (here 32 vs 8)."""
    torch.manual_seed(3)
    from transformers import AutoModelForCausalLM

    cfg = testing.tiny_config("gemma3", query_pre_attn_scalar=32)
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.float32).eval()
    sdpa = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa", dtype=torch.float32).eval()
    sdpa.load_state_dict(eager.state_dict())
    assert families.attention_scaling(cfg, 0) == pytest.approx(32 ** -0.5)
    seqs = [LONG, SEQ7]
    np.testing.assert_allclose(extract_batch(sdpa, seqs, attention=True, top_k=10)["attention/entropy"],
                               eager_entropies(eager, seqs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_hooks_registered_once_give_the_values_of_one_registration_per_batch(family):
    """One BatchHooks over three batches (as extract_to_hdf5 keeps it for its loop) gives, array for array and bit
    for bit, what three extract_batch calls with their own registration give; a forward outside extract_batch
    while the hooks are registered keeps nothing and fails nothing; every hook is gone on exit; a BatchHooks that
    is inactive or for the other attention setting is refused, and so are a session plus other hooks in one pass."""
    from llmgeom.extract.batch import BatchHooks

    m = tiny(family)
    batches = [[SEQ7, SEQ3], [LONG], [SEQ9, SEQ3, SEQ7]]
    alone = [extract_batch(m, b, attention=True, top_k=5) for b in batches]
    before = n_hooks(m)
    with BatchHooks(m, attention=True, final_token_only=True) as hk:  # as each call's own (no corpus positions)
        assert n_hooks(m) > before
        shared = []
        for i, b in enumerate(batches):
            shared.append(extract_batch(m, b, attention=True, top_k=5, hooks=hk))
            assert hk.cur is None
            # another batch's length: a hook that still held this batch's buffers would refuse its activations
            capture.run(m, capture.make_batch(m, batches[(i + 1) % 3]), session=hk.session)
        with pytest.raises(ValueError, match="attention=False"):
            extract_batch(m, [SEQ3], attention=False, top_k=10, hooks=hk)
        with pytest.raises(ValueError, match="not both"):  # a session's hooks and another set in one pass
            capture.run(m, capture.make_batch(m, [SEQ3]), {capture.point_name("hook_resid_post", 0): lambda t, pt: None},
                        session=hk.session)
        session = hk.session
    assert n_hooks(m) == before
    with pytest.raises(ValueError, match="active BatchHooks"):
        extract_batch(m, [SEQ3], attention=True, top_k=10, hooks=hk)
    with pytest.raises(ValueError, match="active hooked"):
        capture.run(m, capture.make_batch(m, [SEQ3]), session=session)
    for a, b in zip(alone, shared):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_row_index_gathers_what_advanced_indexing_gathers():
    """RowIndex.take (rows_at) = t[bi, ti] bit for bit: into a new tensor, into a float32 buffer, cast from bf16;
    an activation of another length or rank is refused (flat indices would pick other rows)."""
    g = torch.Generator().manual_seed(3)
    t = torch.randn(4, 6, 5, generator=g)
    bi, ti = torch.tensor([3, 0, 0, 2]), torch.tensor([5, 0, 4, 1])
    rows = capture.RowIndex(bi, ti, 6)
    assert torch.equal(rows.take(t, "cpu"), t[bi, ti])
    buf = torch.full((4, 5), float("nan"))
    assert rows.take(t, "cpu", out=buf) is buf and torch.equal(buf, t[bi, ti])
    assert torch.equal(rows.take(t.bfloat16(), "cpu", out=buf), t.bfloat16()[bi, ti].float())
    assert torch.equal(capture.rows_at(t, bi, ti, "cpu"), t[bi, ti])
    for bad in (torch.randn(4, 7, 5), torch.randn(4, 6, 2, 5)):
        with pytest.raises(ValueError, match="T=6"):
            rows.take(bad, "cpu")


def _hand_scores():
    """Hand-computable inputs of last_query_attention: B=2 prompts, H=2 query heads (queries 1 and 2) sharing H_kv=1
    key head (keys 0, 1, 2, 3), T=4, hd=1; prompt 0's final token at 3, prompt 1's at 1 (then 2 padding).
    Returns (q, k, last, key mask, p at scaling 1)."""
    q = torch.zeros(2, 2, 4, 1)
    q[:, 0, :, 0], q[:, 1, :, 0] = 1.0, 2.0
    k = torch.tensor([0.0, 1.0, 2.0, 3.0]).reshape(1, 1, 4, 1).repeat(2, 1, 1, 1)
    last = torch.tensor([3, 1])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    return q, k, last, mask, attn_maths.last_query_attention(q, k, last, mask, scaling=1.0)


def test_last_query_attention_known_answer():
    """GQA sharing, padding, window and soft-capping on hand-computed scores."""
    q, k, last, mask, p = _hand_scores()
    torch.testing.assert_close(p[0, 0], torch.softmax(torch.tensor([0.0, 1, 2, 3]), -1))
    torch.testing.assert_close(p[0, 1], torch.softmax(torch.tensor([0.0, 2, 4, 6]), -1))
    torch.testing.assert_close(p[1, 0], torch.tensor([1, math.e, 0, 0]) / (1 + math.e))
    pw = attn_maths.last_query_attention(q, k, last, mask, scaling=1.0, window=2)  # keys 2, 3 for row 0
    torch.testing.assert_close(pw[0, 0], torch.tensor([0, 0, 1, math.e]) / (1 + math.e))
    pc = attn_maths.last_query_attention(q, k, last, mask, scaling=1.0, softcap=2.0)
    torch.testing.assert_close(pc[0, 1], torch.softmax(2.0 * torch.tanh(torch.tensor([0.0, 2, 4, 6]) / 2.0), -1))
    pm = attn_maths.last_query_attention(q, k, last, mask, scaling=0.5)
    torch.testing.assert_close(pm[0, 1], p[0, 0])


def test_last_query_attention_mask_row_known_answer():
    """The final query's row of the model's own attention mask (DeepSeek Sparse Attention's indexer selection, Doge's
    dynamic bias): a float row is added to the scaled scores, a bool row hides keys where False, the reconstructed
    causal / padding mask still applies, an all-zero float row leaves p bit for bit; final_query_mask_row picks row
    ``last`` of a [B, 1 or H, T_q, T_k] mask and its first T keys."""
    q, k, last, mask, p = _hand_scores()
    # a per-head float bias [B, H, T] (Doge): head 0 of prompt 0 gets +1 on key 0, -inf-like finfo.min on key 2
    bias = torch.zeros(2, 2, 4)
    bias[0, 0, 0], bias[0, 0, 2] = 1.0, torch.finfo(torch.float32).min
    bias[1, :, 3] = 5.0  # a bias on a key the causal / padding mask hides: it stays hidden (intersection)
    pb = attn_maths.last_query_attention(q, k, last, mask, scaling=1.0, mask_row=bias)
    torch.testing.assert_close(pb[0, 0], torch.tensor([math.e, math.e, 0.0, math.e ** 3]) / (2 * math.e + math.e ** 3))
    assert torch.equal(pb[0, 1], p[0, 1]) and torch.equal(pb[1], p[1])
    # a bool row of one head [B, 1, T] (sdpa; DeepSeek Sparse Attention's selection): False hides the key in every head
    sel = torch.tensor([[True, False, True, True], [False, True, True, True]])[:, None, :]
    ps = attn_maths.last_query_attention(q, k, last, mask, scaling=1.0, mask_row=sel)
    e = torch.tensor([1.0, 0.0, math.e ** 2, math.e ** 3])  # head 0: exp of scores 0, (1 hidden), 2, 3
    torch.testing.assert_close(ps[0, 0], e / e.sum())
    e = torch.tensor([1.0, 0.0, math.e ** 4, math.e ** 6])  # head 1: exp of scores 0, (2 hidden), 4, 6
    torch.testing.assert_close(ps[0, 1], e / e.sum())
    torch.testing.assert_close(ps[1], torch.tensor([[0.0, 1.0, 0.0, 0.0]] * 2))
    # the eager additive form of the same selection (0 / finfo.min): the same probabilities
    add = torch.zeros(2, 1, 4).masked_fill(~sel, torch.finfo(torch.float32).min)
    torch.testing.assert_close(attn_maths.last_query_attention(q, k, last, mask, scaling=1.0, mask_row=add), ps)
    # an all-zero float row (an ordinary model's eager mask at its visible keys): bit for bit the same
    assert torch.equal(attn_maths.last_query_attention(q, k, last, mask, scaling=1.0, mask_row=torch.zeros(2, 1, 4)), p)
    # final_query_mask_row: row last[b] of prompt b, its first T_k keys (a longer cache mask), a broadcast batch
    full = torch.arange(2 * 2 * 4 * 5, dtype=torch.float32).reshape(2, 2, 4, 5)
    row = attn_maths.final_query_mask_row(full, last, 4)
    assert row.shape == (2, 2, 4)
    assert torch.equal(row[0], full[0, :, 3, :4]) and torch.equal(row[1], full[1, :, 1, :4])
    one = attn_maths.final_query_mask_row(full[:1, :1], last, 4)
    assert torch.equal(one, torch.stack([full[0, :1, 3, :4], full[0, :1, 1, :4]]))
    assert attn_maths.final_query_mask_row(None, last, 4) is None
    assert attn_maths.final_query_mask_row(mask.bool(), last, 4) is None  # flash attention's 2-D padding mask


def test_last_query_attention_sink_term_known_answer():
    """Attention sinks: one extra logit per head (not scaled, not masked) joins the softmax and is dropped after it;
    the entropy is that of the whole distribution, keys plus the sink outcome (docs/design-notes.md "Attention
    sinks")."""
    # B=1, H=2 heads, T=3 keys, hd=1: scores of head 0 are [0, 0, 0] (+ the padded third key of none), head 1 [0, 1, 2]
    q = torch.tensor([0.0, 1.0]).reshape(1, 2, 1, 1).expand(1, 2, 3, 1).contiguous()
    k = torch.tensor([0.0, 1.0, 2.0]).reshape(1, 1, 3, 1).expand(1, 2, 3, 1).contiguous()
    last, mask = torch.tensor([2]), torch.tensor([[1, 1, 1]])
    sinks = torch.tensor([math.log(3.0), 0.0])  # head 0: the sink weighs as much as the 3 keys together
    p, p_sink = attn_maths.last_query_attention(q, k, last, mask, scaling=2.0, sinks=sinks, with_sink=True)
    torch.testing.assert_close(p[0, 0], torch.full((3,), 1 / 6))
    torch.testing.assert_close(p_sink[0, 0], torch.tensor(0.5))
    e = torch.exp(torch.tensor([0.0, 2.0, 4.0]))  # head 1: scaled scores, sink logit 0 (exp = 1), unscaled
    torch.testing.assert_close(p[0, 1], e / (e.sum() + 1))
    torch.testing.assert_close(p_sink[0, 1], 1 / (e.sum() + 1))
    torch.testing.assert_close(p.sum(-1) + p_sink, torch.ones(1, 2))
    h = attn_maths.attention_row_entropy(p, p_sink)
    # head 0: 3 keys of 1/6 and the sink of 1/2 -> 0.5 ln 6 + 0.5 ln 2
    torch.testing.assert_close(h[0, 0], torch.tensor(0.5 * math.log(6) + 0.5 * math.log(2)))
    w = torch.cat([e, torch.ones(1)]) / (e.sum() + 1)
    torch.testing.assert_close(h[0, 1], -(w * w.log()).sum())
    # the sink is never masked: with the key mask hiding key 1, head 0 has 2 keys of 1/5 and the sink of 3/5
    p2, s2 = attn_maths.last_query_attention(q, k, last, torch.tensor([[1, 0, 1]]), scaling=2.0, sinks=sinks,
                                             with_sink=True)
    torch.testing.assert_close(p2[0, 0], torch.tensor([0.2, 0.0, 0.2]))
    torch.testing.assert_close(s2[0, 0], torch.tensor(0.6))
    # without sinks: the same probabilities as before, no sink column
    p0, none = attn_maths.last_query_attention(q, k, last, mask, scaling=2.0, with_sink=True)
    assert none is None
    assert torch.equal(p0, attn_maths.last_query_attention(q, k, last, mask, scaling=2.0))
    assert torch.equal(attn_maths.attention_row_entropy(p0, None), attn_maths.attention_row_entropy(p0))


@pytest.mark.parametrize("H_kv, rep", [(3, 3), (1, 4), (4, 2), (2, 1)])  # GQA (SmolLM2), MQA (Gemma-3), MHA
def test_last_query_attention_equals_the_repeated_keys_product_bit_for_bit(H_kv, rep):
    """The per-group products equal, bit for bit, the product over keys repeated per query head (repeat_kv) and
    the masked softmax of the scores, also where the keys arrive as a transposed view of [B, T, H_kv, hd] (as a
    Llama layer's k_proj(...).view(...).transpose(1, 2) after RoPE)."""
    g = torch.Generator().manual_seed(7)
    B, T, hd = 5, 23, 64
    H = H_kv * rep
    q = torch.randn(B, H, T, hd, generator=g)
    k_view = torch.randn(B, T, H_kv, hd, generator=g).transpose(1, 2)  # non-contiguous, as the model passes it
    last = torch.tensor([22, 3, 10, 0, 17])
    mask = (torch.arange(T)[None, :] <= last[:, None]).long()
    for k in (k_view, k_view.contiguous()):
        kr = k.repeat_interleave(rep, dim=1) if rep > 1 else k  # repeat_kv: one key head per query head
        qb = q[torch.arange(B), :, last, :]
        ref = torch.einsum("bhd,bhtd->bht", qb, kr).mul_(0.125)  # the formulation the product replaced
        ref = torch.softmax(ref.masked_fill_(attn_maths.final_query_hidden_keys(last, mask, T, None, "cpu"),
                                             float("-inf")), -1)
        assert torch.equal(attn_maths.last_query_attention(q, k, last, mask, scaling=0.125), ref)


def test_attention_outside_the_interface_is_refused():
    """GPT-2's eager 'reorder_and_upcast_attn' path bypasses the attention interface: refused, hooks removed."""
    m = testing.tiny_model("gpt2", attn="eager")
    m.config.reorder_and_upcast_attn = True
    for blk in arch.decoder_layers(m):
        blk.attn.reorder_and_upcast_attn = True
    before = n_hooks(m)
    with pytest.raises(families.UnsupportedArchitectureError, match=r"layers \[0, 1\].*sdpa"):
        extract_batch(m, [SEQ3], attention=True, top_k=10)
    assert n_hooks(m) == before
    assert extract_batch(testing.tiny_model("llama", attn="sdpa"), [SEQ3], attention=False, top_k=10)["last_token/residual"].shape == (1, 3, 32)


@pytest.mark.parametrize("family", FAMILIES)
def test_attn_output_is_the_o_proj_input(family):
    """Issue 14 item 5: last_token attn_output equals the input of o_proj/dense/out_proj/c_proj at the
    final real token, and the attention-weighted sum of values under eager weights."""
    m = sdpa_twin(family)
    s = families.summarize(m.config)
    seqs = [SEQ9, SEQ3, LONG]
    got, handles = {}, []

    def pre(i):
        def fn(mod, args):
            got[i] = args[0].detach().clone()
        return fn

    try:
        for i in range(s.n_layers):
            handles.append(arch.o_proj_module(m, i).register_forward_pre_hook(pre(i)))
        own_forward(m, seqs)
    finally:
        for h in handles:
            h.remove()
    r = extract_batch(m, seqs, attention=False, top_k=10)
    assert r["last_token/attn_output"].shape == (3, s.n_layers, s.n_heads * s.head_dim)
    for i in range(s.n_layers):
        for b, sq in enumerate(seqs):
            np.testing.assert_allclose(r["last_token/attn_output"][b, i], got[i][b, len(sq) - 1].numpy(), atol=1e-5, rtol=0)
    assert np.abs(r["last_token/attn_output"][0] - r["last_token/attn_output"][1]).max() > 1e-3


def test_last_positions_any_padding_side():
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert last_positions(right).tolist() == [2, 4, 0]
    assert last_positions(left).tolist() == [4, 4, 4]
    ids, mask, pos = pad_batch([SEQ3, SEQ7], 0, "cpu")
    assert ids.tolist()[0] == SEQ3 + [0] * 4
    assert mask.sum(1).tolist() == [3, 7]
    assert pos.tolist() == [list(range(7))] * 2


# --------------------------------------------------------------------------- final tokens only


@pytest.mark.parametrize("family", FAMILIES)
def test_final_token_only_cuts_the_last_block_and_keeps_the_values(family):
    """A prompt batch (no sampled positions) runs the last block's attention output projection and MLP on one
    row per prompt, its final token, instead of B*T rows (OPT: the projection only; its block flattens the stream
    before the MLP); every array equals the full pass's to float rounding and the top ids are the same. A
    registration with it refuses a corpus batch (sampled positions need the whole last block)."""
    from llmgeom.extract.batch import BatchHooks

    m = tiny(family)
    seqs = [SEQ7, SEQ3, SEQ9]
    mods = arch.final_token_modules(m)
    assert len(mods) == (1 if family.startswith("opt") else 2)
    seen = []
    probes = [mod.register_forward_hook(lambda mod, args, out: seen.append(tuple(out.shape[:2]))) for mod in mods]
    try:
        with BatchHooks(m, attention=True, final_token_only=False) as hk:
            full = extract_batch(m, seqs, attention=True, top_k=5, hooks=hk)
        rows_full, seen[:] = list(seen), []
        cut = extract_batch(m, seqs, attention=True, top_k=5)  # its own registration: final tokens only
    finally:
        for p in probes:
            p.remove()
    assert rows_full == [(3, 9)] * len(mods)
    assert seen == [(3, 1)] * len(mods)
    assert full.keys() == cut.keys()
    for k in full:
        if full[k].dtype.kind in "iu":
            np.testing.assert_array_equal(cut[k], full[k], err_msg=k)
        else:
            np.testing.assert_allclose(cut[k], full[k], atol=1e-5, rtol=0, err_msg=k)
    with BatchHooks(m, attention=False, final_token_only=True) as hk:
        with pytest.raises(ValueError, match="corpus sets"):
            extract_batch(m, seqs, attention=False, top_k=10, sample_positions=[[1], [1], [1]], hooks=hk)
        with pytest.raises(ValueError, match="corpus sets"):
            extract_batch(m, seqs, attention=False, top_k=10, token_stats=True, hooks=hk)


def test_extract_to_hdf5_cuts_the_last_block_for_prompt_sets_only(tmp_path, monkeypatch):
    """extract_to_hdf5 registers its hooks with final_token_only for a prompt set (every stored row a final token)
    and without it for a corpus set (sampled positions of the whole last block); both files are complete."""
    src = testing.save_tiny_model_dir("llama", tmp_path / "src")
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    prompts = tmp_path / "mixed.jsonl"
    _prompt_file(prompts)
    seen, real = [], capture.hooked

    def hooked(model, hooks, **kw):
        seen.append(kw.get("final_token_only"))
        return real(model, hooks, **kw)

    monkeypatch.setattr(capture, "hooked", hooked)
    for corpus in (False, True):
        out = tmp_path / f"{corpus}.h5"
        extraction.extract_to_hdf5(prepared, prompts, out, model_name="tiny", dtype="float32", device="cpu",
                                   batch_size=3, corpus=corpus, sample_per_prompt=3, log=lambda *a: None, top_k=10, device_map=None)
        with h5py.File(out) as f:
            assert f.attrs["complete"]
    assert seen == [True, False]


def test_capture_run_final_token_only_returns_the_final_tokens():
    """capture.run(final_token_only=True): ``hidden`` is [B, 1, d], each prompt's final normed state of the full
    pass, and the logits are the full pass's (to rounding); outside run the cut does nothing (a plain forward
    while registered gives the model's own last hidden state, also after a run of the session); a session
    registered without it is refused."""
    m = tiny("llama")
    batch = capture.make_batch(m, [SEQ7, SEQ3, SEQ9])
    full = capture.run(m, batch)
    rows = []
    probe = arch.final_token_modules(m)[-1].register_forward_hook(lambda mod, a, out: rows.append(out.shape[1]))
    try:
        cut = capture.run(m, batch, final_token_only=True)
    finally:
        probe.remove()
    assert rows == [1]  # the last block's MLP ran at the final tokens
    assert tuple(cut.hidden.shape) == (3, 1, full.hidden.shape[-1])
    np.testing.assert_allclose(cut.hidden[:, 0].numpy(), full.hidden[batch.rows, batch.last].numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(cut.logits.numpy(), full.logits.numpy(), atol=1e-5, rtol=0)
    with capture.hooked(m, {}, final_token_only=True) as st:
        for _ in range(2):  # before any run, and after one (its batch is not kept)
            with torch.no_grad():
                plain = m.model(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.pos).last_hidden_state
            np.testing.assert_array_equal(plain.numpy(), full.hidden.numpy())
            assert capture.run(m, batch, session=st).hidden.shape[1] == 1
    with capture.hooked(m, {}) as st:
        with pytest.raises(ValueError, match="final_token_only"):
            capture.run(m, batch, session=st, final_token_only=True)


def test_final_token_only_names_the_non_finite_final_token():
    """In the cut last block only the final tokens are the model's: a non-finite value at a prompt's final token
    there names the block, the prompt and that token (the row-to-token map of the final-token check); one at a
    non-final position of that block is not the model's and is not reported (nothing stored depends on it),
    where the uncut pass (a corpus batch) refuses it."""
    m = tiny("llama")
    blk = arch.decoder_layers(m)[-1]
    L = len(arch.decoder_layers(m))
    at = {}

    def poison(mod, args, out):
        o = out[0] if isinstance(out, tuple) else out
        o = o.clone()
        o[1, at["t"]] = float("nan")  # second prompt
        return (o,) + tuple(out[1:]) if isinstance(out, tuple) else o

    h = blk.register_forward_hook(poison)
    try:
        at["t"] = len(SEQ3) - 1  # its final token
        with pytest.raises(NonFiniteActivationError, match=rf"block {L - 1}.*'second' token {len(SEQ3) - 1}"):
            extract_batch(m, [SEQ7, SEQ3], attention=False, top_k=10, prompt_ids=["first", "second"])
        at["t"] = 1  # a non-final real token
        r = extract_batch(m, [SEQ7, SEQ3], attention=False, top_k=10, prompt_ids=["first", "second"])
        assert np.isfinite(r["last_token/residual"]).all()
        with pytest.raises(NonFiniteActivationError, match=rf"block {L - 1}.*'second' token 1"):
            extract_batch(m, [SEQ7, SEQ3], attention=False, top_k=10, prompt_ids=["first", "second"], token_stats=True)
    finally:
        h.remove()


# --------------------------------------------------------------------------- non-finite


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("layer", [0, 1])
def test_non_finite_names_block_and_prompt(family, layer):
    m = tiny(family)
    blk = arch.decoder_layers(m)[layer]

    def poison(mod, args, out):
        if isinstance(out, tuple):
            return (torch.full_like(out[0], float("nan")),) + tuple(out[1:])
        return torch.full_like(out, float("nan"))

    before = n_hooks(m)
    h = blk.register_forward_hook(poison)
    try:
        with_ours = n_hooks(m)
        with pytest.raises(NonFiniteActivationError) as ei:
            extract_batch(m, [SEQ7, SEQ3], attention=True, top_k=10, prompt_ids=["prompt-seven", "prompt-three"])
        assert n_hooks(m) == with_ours  # every extraction hook removed despite the error
    finally:
        h.remove()
    assert n_hooks(m) == before
    msg = str(ei.value)
    assert f"block {layer}" in msg
    assert "'prompt-seven'" in msg
    # a later clean run works and is finite
    r = extract_batch(m, [SEQ3], attention=True, top_k=10)
    assert np.isfinite(r["last_token/residual"]).all()


def test_non_finite_in_second_prompt_names_it():
    m = tiny("llama")
    blk = arch.decoder_layers(m)[0]

    def poison(mod, args, out):
        o = out[0] if isinstance(out, tuple) else out
        o = o.clone()
        o[1, 1] = float("inf")  # second prompt, a real token
        return (o,) + tuple(out[1:]) if isinstance(out, tuple) else o

    h = blk.register_forward_hook(poison)
    try:
        with pytest.raises(NonFiniteActivationError, match=r"block 0.*'second' token 1"):
            extract_batch(m, [SEQ7, SEQ3], attention=False, top_k=10, prompt_ids=["first", "second"])
    finally:
        h.remove()


# --------------------------------------------------------------------------- corpus mode


@pytest.mark.parametrize("family", FAMILIES)
def test_corpus_token_stats(family):
    m = tiny(family)
    s = families.summarize(m.config)
    seqs = [SEQ9, SEQ3, SEQ7]
    samples = [[1, 4, 8], [2], [0, 3, 6]]
    r = extract_batch(m, seqs, attention=False, top_k=10, sample_positions=samples, token_stats=True)
    ids, mask, out = own_forward(m, seqs, output_hidden_states=True)
    logits = out.logits.float()
    want_b, want_t = [], []
    for b, sq in enumerate(seqs):
        for t in range(1, len(sq) - 1):
            want_b.append(b)
            want_t.append(t)
    np.testing.assert_array_equal(r["tokens/prompt"], want_b)
    np.testing.assert_array_equal(r["tokens/position"], want_t)
    assert r["tokens/margin"].shape == r["tokens/nll"].shape == r["tokens/entropy"].shape == (len(want_b),)
    z = logits[want_b, want_t]  # [P, V]
    top2 = z.topk(2, -1).values
    np.testing.assert_allclose(r["tokens/margin"], (top2[:, 0] - top2[:, 1]).numpy(), atol=ATOL, rtol=0)
    assert (r["tokens/margin"] >= 0).all()
    targets = ids[want_b, [t + 1 for t in want_t]]
    ce = F.cross_entropy(z, targets, reduction="none")
    np.testing.assert_allclose(r["tokens/nll"], ce.numpy(), atol=ATOL, rtol=0)
    assert (r["tokens/nll"] > 0).all()
    logp = torch.log_softmax(z.double(), -1)
    np.testing.assert_allclose(r["tokens/entropy"], (-(logp.exp() * logp).sum(-1)).numpy(), atol=ATOL, rtol=0)
    # residual samples are the hidden states at the sampled positions (layers < L pre-norm hooks)
    flat = [(b, t) for b, ps in enumerate(samples) for t in ps]
    np.testing.assert_array_equal(r["tokens/sample_prompt"], [b for b, _ in flat])
    np.testing.assert_array_equal(r["tokens/sample_position"], [t for _, t in flat])
    assert r["tokens/residual_sample"].shape == (len(flat), s.n_layers + 1, s.d_model)
    hs = out.hidden_states
    for j, (b, t) in enumerate(flat):
        for layer in range(s.n_layers):
            np.testing.assert_allclose(r["tokens/residual_sample"][j, layer], hs[layer][b, t].numpy(), atol=1e-5, rtol=0)
        with torch.no_grad():
            post = unembed_input(m, family, torch.from_numpy(r["tokens/residual_sample"][j, -1]))
        # hidden_states[-1] is what the unembedding sees (after the final norm / project_out)
        np.testing.assert_allclose(post.numpy(), hs[-1][b, t].numpy(), atol=1e-5, rtol=0)
    # last-token outputs are the same as without corpus extras
    plain = extract_batch(m, seqs, attention=False, top_k=10)
    for k in ("last_token/residual", "last_token/values", "last_token/keys", "next_token/top_logits"):
        np.testing.assert_allclose(r[k], plain[k], atol=1e-6, rtol=0)


def test_corpus_token_stats_padding_invariant():
    m = tiny("mistral")
    together = extract_batch(m, [SEQ9, SEQ3], attention=False, top_k=10, sample_positions=[[2, 5], [1]], token_stats=True)
    alone = extract_batch(m, [SEQ9], attention=False, top_k=10, sample_positions=[[2, 5]], token_stats=True)
    sel = together["tokens/prompt"] == 0
    for k in ("tokens/margin", "tokens/nll", "tokens/entropy"):
        np.testing.assert_allclose(together[k][sel], alone[k], atol=ATOL, rtol=0)
    np.testing.assert_allclose(together["tokens/residual_sample"][:2], alone["tokens/residual_sample"], atol=ATOL, rtol=0)


def test_tokenize_prompts_limits():
    tok = testing.tiny_tokenizer()
    seqs = extraction.tokenize_prompts(tok, ["abc", "hello"], ["a", "b"], max_tokens=None, truncate=False,
                                       context=128)
    assert [len(x) for x in seqs] == [4, 6]
    assert seqs[0][0] == tok.bos_token_id == 1
    with pytest.raises(extraction.PromptTokenError, match="'long'.*7 tokens"):
        extraction.tokenize_prompts(tok, ["abcdef"], ["long"], max_tokens=5, truncate=False, context=128)
    cut = extraction.tokenize_prompts(tok, ["abcdef"], ["long"], max_tokens=5, truncate=True, context=128)
    assert len(cut[0]) == 5
    with pytest.raises(extraction.PromptTokenError, match="zero tokens"):
        extraction.tokenize_prompts(tok, [""], ["empty"], max_tokens=None, truncate=False, context=128)


def _prepared(name):
    """A prepared embedded model: ``$LLMGEOM_PREPARED_MODELS/<name>`` or ``<repo>/resources/models/<name>``."""
    import os
    from pathlib import Path

    for root in (os.environ.get("LLMGEOM_PREPARED_MODELS"), Path(__file__).resolve().parents[3] / "resources/models"):
        if root and (Path(root) / name / "manifest.json").is_file():
            return Path(root) / name
    return None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_embedded_models_attention_entropy_equals_eager(name):
    """The embedded SmolLM2 / Gemma-3 (float32): hooked-q/k entropies under sdpa equal eager weights within
    1e-5, with padding and, for Gemma-3, a 600-token prompt beyond its 512-token sliding window."""
    from llmgeom.models.loading import load_prepared

    d = _prepared(name)
    if d is None:
        pytest.skip(f"{name} not prepared (set LLMGEOM_PREPARED_MODELS or run the workflow's prepare_model)")
    eager, _ = load_prepared(d, dtype="float32", attn="eager", device="cpu")
    sdpa, _ = load_prepared(d, dtype="float32", attn="sdpa", device="cpu")
    s = families.summarize(eager.config)
    T = 600 if s.sliding_window else 80
    assert not s.sliding_window or T > s.sliding_window
    g = np.random.default_rng(0)
    seqs = [[2] + g.integers(100, 5000, T - 1).tolist(), [2] + g.integers(100, 5000, 20).tolist()]
    np.testing.assert_allclose(extract_batch(sdpa, seqs, attention=True, top_k=10)["attention/entropy"],
                               eager_entropies(eager, seqs), atol=1e-5, rtol=0)


def test_hook_points_buffers_and_datasets_follow_the_contract():
    """One quantity, one declared mapping (issue 30 item 3): the hook points BatchHooks registers and the buffers
    they fill are those CONTRACT declares (``DatasetSpec.point``); each dataset's values come from its point."""
    from llmgeom.core.store import CONTRACT, DS

    assert batch_mod.FINAL_TOKEN_POINTS == {"attn.hook_v": DS.LAST_TOKEN_VALUES, "attn.hook_k": DS.LAST_TOKEN_KEYS,
                                             "attn.hook_z": DS.LAST_TOKEN_ATTN_OUTPUT}
    declared = {spec.point for spec in CONTRACT.values() if spec.point}
    assert declared <= set(capture.EDITABLE + capture.ATTENTION_POINTS)
    m = tiny("llama")
    L = families.summarize(m.config).n_layers
    with batch_mod.BatchHooks(m, attention=True) as hk:
        want = {capture.point_name("hook_resid_pre", 0)} | {capture.point_name(p, l) for p in declared
                                                             for l in range(L)}
        assert set(hk.hooks) == want
        r = extract_batch(m, [SEQ7, SEQ3], attention=True, top_k=10, hooks=hk)
    # the values dataset is what the model's own attn.hook_v point gives at the final token
    got = {}
    capture.run(m, capture.make_batch(m, [SEQ7, SEQ3], 0),
                hooks={capture.point_name("attn.hook_v", l): (lambda t, pt: got.__setitem__(pt.layer, t.detach().clone()))
                       for l in range(L)})
    for l in range(L):
        np.testing.assert_allclose(r[DS.LAST_TOKEN_VALUES][0, l], got[l][0, len(SEQ7) - 1].float().numpy(), atol=ATOL)
        np.testing.assert_allclose(r[DS.LAST_TOKEN_VALUES][1, l], got[l][1, len(SEQ3) - 1].float().numpy(), atol=ATOL)
