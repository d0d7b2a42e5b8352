"""Tiny-model tests of the architectures module: one per supported family.

Every family in ``llmgeom.models.tiny.FAMILIES`` is built from its config with random
weights (2 layers, d_model 32, 4 query heads) and checked against what the model
itself computes in a forward pass.
"""

import pytest
import torch

from llmgeom.extract import hooks
from llmgeom.models import architectures as arch
from llmgeom.models import families
from llmgeom.models import tiny as testing
from llmgeom.extract.capture import pad_batch
from model_types import key_value_extractors

FAMILIES = testing.FAMILIES

EXPECTED_KV = {"llama": 2, "mistral": 2, "gemma3": 1}
EXPECTED_TYPE = {"llama": "GQA", "mistral": "GQA", "gemma3": "MQA"}
EXPECTED_SLIDING = {"gemma3": (0,), "mistral": (0, 1)}
EXPECTED_WINDOW = {"gemma3": 4, "mistral": 16}


def _model(family):
    m = testing.tiny_model(family)
    # Non-trivial 1-d parameters (biases, norm gains): with the default init (zeros / ones)
    # a wrong bias slice or the wrong norm module would go unnoticed.
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m


@pytest.mark.parametrize("family", FAMILIES)
def test_summarize(family):
    m = testing.tiny_model(family)
    s = families.summarize(m.config)
    assert s.n_layers == 2
    assert s.d_model == 32
    assert s.n_heads == 4
    assert s.n_kv_heads == EXPECTED_KV.get(family, 4)
    assert s.attention_type == EXPECTED_TYPE.get(family, "MHA")
    assert s.head_dim == 8
    assert s.vocab_size == 96
    assert s.sliding_layers == EXPECTED_SLIDING.get(family, ())
    assert s.sliding_window == EXPECTED_WINDOW.get(family)
    assert s.max_positions == testing.TINY["max_position_embeddings"]
    d = s.as_dict()
    assert d["sliding_layers"] == list(s.sliding_layers)
    # accessors agree with the summary
    assert len(arch.decoder_layers(m)) == s.n_layers
    assert arch.final_norm(m) is not None
    W_U, _ = arch.unembedding(m)
    assert tuple(W_U.shape) == (96, 16 if family == "opt_proj" else 32)
    for layer in range(s.n_layers):
        heads = arch.w_k_heads(m, layer)
        assert len(heads) == s.n_kv_heads
        for W, b in heads:
            assert tuple(W.shape) == (32, s.head_dim)
            assert b is None or tuple(b.shape) == (s.head_dim,)


@pytest.mark.parametrize("family", FAMILIES)
def test_w_k_heads_reproduce_model_keys(family):
    """input_norm(h_in) @ W + b == the model's own keys for every layer and key head."""
    m = _model(family)
    s = families.summarize(m.config)
    fam = families.family_for(m.config)
    layers = arch.decoder_layers(m)
    ids, mask, pos = pad_batch([[1, 5, 6, 7, 8, 9, 10], [1, 20, 21]], 0, "cpu")
    h_in, k_out = {}, {}

    def pre(layer):
        def fn(mod, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            h_in[layer] = h.detach().clone()
        return fn

    def post(layer):
        def fn(mod, args, out):
            o = out[0] if isinstance(out, tuple) else out
            k_out[layer] = o.detach().clone()
        return fn

    handles = []
    try:
        for i, blk in enumerate(layers):
            handles.append(blk.register_forward_pre_hook(pre(i), with_kwargs=True))
            handles.append(arch.kv_module(m, i).register_forward_hook(post(i)))
        with torch.no_grad():
            m(input_ids=ids, attention_mask=mask, position_ids=pos)
    finally:
        for h in handles:
            h.remove()

    assert sorted(h_in) == sorted(k_out) == list(range(s.n_layers))
    for layer in range(s.n_layers):
        keys = k_out[layer]
        if fam.qkv == "separate":
            assert keys.shape[-1] == s.n_kv_heads * s.head_dim
        else:
            assert keys.shape[-1] == 3 * s.n_heads * s.head_dim
            keys = arch.qkv_part(m, keys, "k")
        with torch.no_grad():
            x = arch.input_norm(m, layer)(h_in[layer])
            heads = arch.w_k_heads(m, layer)
            assert len(heads) == s.n_kv_heads
            for h, (W, b) in enumerate(heads):
                pred = x @ W + (0 if b is None else b)
                want = keys[..., h * s.head_dim:(h + 1) * s.head_dim]
                assert pred.dtype == torch.float32
                torch.testing.assert_close(pred, want, atol=1e-5, rtol=0)
                # the keys are not trivially equal across heads
                if h > 0:
                    assert (want - keys[..., :s.head_dim]).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_qkv_parts_match_extractors(family):
    """key_value_extractors' value function is the v block of the fused projection."""
    m = _model(family)
    s = families.summarize(m.config)
    x = torch.randn(2, 3, 3 * s.n_heads * s.head_dim)
    q, k, v = (arch.qkv_part(m, x, p) for p in "qkv")
    d = s.n_heads * s.head_dim
    assert q.shape == k.shape == v.shape == (2, 3, d)
    # the three parts are a permutation of the input's features
    torch.testing.assert_close(torch.sort(torch.cat([q, k, v], -1), -1).values, torch.sort(x, -1).values)
    km, kfn, vm, vfn = key_value_extractors(m)[0]
    assert km is vm
    torch.testing.assert_close(kfn(x), k)
    torch.testing.assert_close(vfn(x), v)


def test_separate_projections_are_their_own_parts():
    m, x = testing.tiny_model("llama"), torch.zeros(1, 96)
    assert arch.qkv_columns(m, "v") is None and arch.qkv_part(m, x, "k") is x


def test_unsupported_model_type_lists_supported():
    from transformers import BertConfig

    with pytest.raises(families.UnsupportedArchitectureError) as ei:
        families.summarize(BertConfig())
    msg = str(ei.value)
    assert "'bert'" in msg
    for t in ("gpt2", "gpt_neox", "llama", "mistral", "gemma3_text", "phi", "opt"):
        assert t in msg
    assert isinstance(ei.value, ValueError)
    assert set(families.supported_model_types()) >= {"gpt2", "gpt_neox", "llama", "mistral", "gemma3_text", "phi", "opt"}


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_facts_match_what_the_model_passes(family):
    """attention_scaling / attention_softcap / attention_window agree with the model's own attention calls;
    capture_attention sees post-RoPE q [B,H,T,hd], k [B,H_kv,T,hd] and restores the interface afterwards."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    m = testing.tiny_model(family, attn="sdpa")
    s = families.summarize(m.config)
    calls = {}
    before = dict(ALL_ATTENTION_FUNCTIONS._local_mapping)
    ids, mask, pos = pad_batch([[1, 5, 6, 7, 8], [1, 9]], 0, "cpu")
    with torch.no_grad(), hooks.capture_attention(m, lambda i, q, k, o, sc, cap: calls.__setitem__(
            i, (q.shape, k.shape, o.shape, sc, cap))) as seen:
        m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    assert ALL_ATTENTION_FUNCTIONS._local_mapping == before
    assert seen == list(range(s.n_layers))
    for i, (qs, ks, os_, sc, cap) in calls.items():
        assert tuple(qs) == (2, s.n_heads, 5, s.head_dim)
        assert tuple(ks) == (2, s.n_kv_heads, 5, s.head_dim)
        assert tuple(os_) == (2, 5, s.n_heads, s.head_dim)
        assert sc == pytest.approx(families.attention_scaling(m.config, i))
        assert cap == families.attention_softcap(m.config)
        assert families.attention_window(m.config, i) == (EXPECTED_WINDOW.get(family) if i in EXPECTED_SLIDING.get(family, ())
                                                      else None)
    assert families.attention_scaling(m.config, 0) == pytest.approx(1.0 if family.startswith("opt") else s.head_dim ** -0.5)


def test_capture_attention_wraps_a_modeling_files_own_registry_and_passes_the_mask():
    """Doge looks its attention function up in its own ``AttentionInterface`` (``modeling_doge``): capture_attention
    sees every layer there and restores that registry too; ``extras=("mask",)`` passes the mask the call received,
    Doge's dynamic mask [B, n_heads, T, T] (a float bias, ``finfo.min`` at the causal keys beyond keep_window_size)."""
    from transformers import DogeConfig, DogeForCausalLM
    from transformers.models.doge import modeling_doge

    cfg = DogeConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, keep_window_size=3)
    torch.manual_seed(0)
    m = DogeForCausalLM(cfg).eval()
    before = dict(modeling_doge.ALL_ATTENTION_FUNCTIONS._local_mapping)
    masks = {}
    with torch.no_grad(), hooks.capture_attention(m, lambda i, q, k, o, sc, cap, mask: masks.__setitem__(i, mask),
                                                 extras=("mask",)) as seen:
        m(input_ids=torch.tensor([[1, 5, 6, 7, 8]]), use_cache=False)
    assert modeling_doge.ALL_ATTENTION_FUNCTIONS._local_mapping == before
    assert seen == [0, 1]
    for mask in masks.values():
        assert mask.shape == (1, 2, 5, 5) and mask.is_floating_point()
        hidden = mask[0, :, -1] == torch.finfo(mask.dtype).min
        assert (hidden.sum(-1) == 5 - 3).all()  # the final query keeps its keep_window_size = 3 top keys
        assert (mask[0, :, -1][~hidden] != 0).all()  # a learned bias where kept, not a 0 / min mask
    with pytest.raises(KeyError):
        with hooks.capture_attention(m, lambda *a, **k: None, extras=("nonsense",)):
            pass
