"""Issue 29: every causal-LM model type of the installed transformers, checked and tabled (docs/models.md).

Per type (``tests/support/model_types.py``): a tiny random model is built and its capture compared with the model's
own outputs (residual stream, values, keys, W_K, logits, attention entropy and output, padding invariance),
unless ``families.refusal`` refuses the type up front. The table test renders ``docs/models.md`` from
the same rows and fails when the committed file differs (regenerate with ``LLMGEOM_WRITE_MODELS_MD=1``).
"""

import os
from pathlib import Path

import pandas as pd
import pytest

import model_types as mtypes

DOC = Path(__file__).resolve().parents[3] / "docs" / "models.md"
TYPES = mtypes.causal_lm_types()


@pytest.mark.parametrize("model_type", TYPES)
def test_model_type_is_captured_exactly_or_refused(model_type):
    row = mtypes.verify(model_type)
    assert row.verdict in ("captured", "refused"), (
        f"{model_type}: {row.verdict}: {row.why}. Either make the capture exact (generic path or a Family entry), "
        "add the tiny-config settings it needs to tests/support/model_types.py TYPE_SETTINGS, or refuse it with its reason "
        "in llmgeom.models.architectures.REFUSED")


def test_refusal_is_what_the_family_table_says():
    from types import SimpleNamespace as NS

    from llmgeom.models import families

    for mt in families.supported_model_types():  # a Family entry is never refused
        assert mt not in families.REFUSED
    assert "bert" not in families.supported_model_types()
    from transformers import BertConfig, LlamaConfig

    assert families.refusal(LlamaConfig()) is None
    from transformers import BloomConfig, MambaConfig

    # the implementation a model is loaded with: the workflow's, or eager where the attention is the module's own
    # (BLOOM refuses sdpa) or there is none (Mamba)
    assert [families.attention_implementation(c(), "sdpa") for c in (LlamaConfig, BloomConfig, MambaConfig)] == \
        ["sdpa", "eager", "eager"]
    assert "encoder" in families.refusal(BertConfig())
    assert families.refusal_of_json({"model_type": "bart", "is_encoder_decoder": True}).startswith("an encoder-decoder")
    assert "encoder" in families.refusal_of_json({"model_type": "bert", "is_decoder": False})
    assert families.refusal_of_json({"model_type": "olmo2"}) is None
    assert families.refusal_of_json({"model_type": "deepseek_v3", "kv_lora_rank": 512}) is None  # read (MLA)
    # sparse attention (DeepSeek Sparse Attention) is read: the entropy reads the mask the attention function
    # receives; hyper-connections (parallel residual streams) are refused, naming them
    assert families.refusal_of_json({"model_type": "deepseek_v32", "kv_lora_rank": 512,
                                 "layer_types": ["indexed_attention"]}) is None
    assert families.config_attention_layers(NS(num_hidden_layers=2, model_type="x",
                                           layer_types=["linear_attention", "indexed_attention"])) == (1,)
    assert families.refusal_of_json({"model_type": "hy_v4", "kv_lora_rank": 512, "hc_mult": 4}).startswith(
        "hyper-connections (4 parallel residual streams")
    assert families.refusal_of_json({"model_type": "x", "hc_count": 1}) is None
    assert families.refusal_of_json({"model_type": "laguna", "num_attention_heads_per_layer": [48, 64]}).startswith(
        "per-layer numbers of query heads")
    assert families.refusal_of_json({"model_type": "laguna", "num_attention_heads_per_layer": [48, 48]}) is None
    # hybrids and state-space models are read (issue 29); a layer kind nobody knows is refused, naming it
    assert families.refusal_of_json({"model_type": "x", "layer_types": ["full_attention", "linear_attention"]}) is None
    assert families.refusal_of_json({"model_type": "mamba", "layer_types": ["linear_attention"] * 2}) is None
    assert "hybrid_sliding" in families.refusal_of_json({"model_type": "x", "layer_types": ["hybrid_sliding"]})

    assert families.config_attention_layers(NS(num_hidden_layers=4, model_type="x",
                                           layer_types=["linear_attention", "full_attention", "mlp", "hybrid"])) == (1, 3)
    assert families.config_attention_layers(NS(num_hidden_layers=3, model_type="llama", num_attention_heads=4)) == (0, 1, 2)
    assert families.config_attention_layers(NS(num_hidden_layers=3, model_type="mamba", state_size=16)) == ()  # no heads


#: refusal reasons (their openings) of the types that are not decoder-only text models that build here: encoders and
#: encoder-decoders, multimodal models whose text model does not run alone, types no tiny model of which builds
NOT_DECODER_TEXT = ("an encoder", "multimodal", "not verified")


def coverage(rows) -> tuple[int, int]:
    """(captured, decoder-only text types that build as tiny models): the issue-29 target's ratio."""
    counted = [r for r in rows if r.verdict == "captured" or not r.why.startswith(NOT_DECODER_TEXT)]
    return sum(r.verdict == "captured" for r in counted), len(counted)


def render(rows) -> str:
    """docs/models.md from the verdict rows."""
    import transformers

    n = {v: sum(r.verdict == v for r in rows) for v in ("captured", "refused")}
    got, of = coverage(rows)
    lines = [
        "# Model types: what llmgeom reads",
        "",
        f"Generated by `tests/unit/models/test_model_types.py` on transformers {transformers.__version__} "
        f"({len(rows)} causal-LM model types; {n['captured']} captured exactly, {n['refused']} refused). Do not edit:",
        "regenerate with `LLMGEOM_WRITE_MODELS_MD=1 HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q "
        "tests/unit/models/test_model_types.py`; the test fails when this table and the code disagree.",
        "",
        f"**Decoder-only text types that build as tiny models: {got} of {of} captured exactly ({100 * got / of:.1f}%).** "
        "Not counted: encoders and encoder-decoders, multimodal models whose text model does not run alone, and types",
        "no tiny model of which builds here (refusals that start \"an encoder\", \"multimodal\", \"not verified\").",
        "",
        "*captured*: a tiny random model (hidden 64, 3 layers, 4 query / 2 key heads) of the type matches its own",
        "outputs in every stored quantity (residual stream per block vs `output_hidden_states`, final normed state,",
        "values vs the KV cache, pre-RoPE keys at position 0 vs the cache, W_K vs the basis-vector reference, top",
        "logits, attention entropy and output vs eager probabilities, one prompt alone vs in a padded batch).",
        "Hybrid and state-space models (Mamba, Jamba, Nemotron-H, Qwen3-Next, ...): the residual stream, final normed",
        "state and logits on every layer; values, keys, W_K, attention entropy and output on the layers with attention,",
        "NaN in the file at the others (absent without any attention layer; docs/design-notes.md, issue 29). *what",
        "runs* names those layers: the residual-stream and logit measures run on every layer, the attention measures",
        "(value manifold, attention focusing, key orthogonality, SULA value geometry, domain restriction, value",
        "interventions) on the attention layers.",
        "*refused*: the workflow's config check refuses a model of this type before any job, with the reason below",
        "(`llmgeom.models.families.refusal`).",
        "",
        "| model_type | verdict | what runs | how / why not |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| `{r.model_type}` | {r.verdict} | {r.runs} | {r.why.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def test_models_md_matches_the_code():
    rows = [mtypes.verify(t) for t in TYPES]
    text = render(rows)
    if os.environ.get("LLMGEOM_WRITE_MODELS_MD") == "1":
        DOC.write_text(text)
    assert DOC.is_file(), "docs/models.md missing: run with LLMGEOM_WRITE_MODELS_MD=1"
    old = DOC.read_text().splitlines()
    new = text.splitlines()
    diff = [f"- {a}\n+ {b}" for a, b in zip(old, new) if a != b][:5]
    assert old == new, ("docs/models.md disagrees with the code (rerun with LLMGEOM_WRITE_MODELS_MD=1):\n"
                        + "\n".join(diff))
    captured = [r for r in rows if r.verdict == "captured"]
    assert {"llama", "gpt2", "gpt_neox", "opt", "phi", "qwen2", "gemma3_text", "olmo2", "mixtral"} <= \
        {r.model_type for r in captured}
    got, of = coverage(rows)
    assert got >= 0.9 * of, f"{got} of {of} decoder-only text types captured: under the 90% of issue 29"


def test_key_orthogonality_runs_on_generic_types():
    """W_K of generic types comes from their k_proj (and the random-init baseline from their own init rule)."""
    import numpy as np

    from llmgeom.models import architectures as arch
    from llmgeom.models import families
    from llmgeom.weights.key_orthogonality import key_orthogonality_table

    m = mtypes.build("olmo2", "sdpa")
    assert families.family_for(m.config) is families.GENERIC
    df = key_orthogonality_table(m, model_name="olmo2", seed=0, random_init=True)
    assert list(zip(df.layer, df.kv_head)) == [(l, h) for l in range(3) for h in range(2)]
    assert (df.n_query_heads_sharing == 2).all() and (df.attention_type == "GQA").all()
    for col in ("orthogonality", "baseline_random_init", "baseline_gaussian"):
        assert np.isfinite(df[col]).all() and ((df[col] > 0.02) & (df[col] < 0.3)).all()
    # the orthogonality of layer 0 head 1 is that of the k_proj rows 16..31 (pre-k_norm W_K)
    from llmgeom.measures.orthogonality import orthogonality

    W = arch.parts(m).k_proj[0].weight.T[:, 16:32]
    assert df.orthogonality[1] == orthogonality(W)


def test_latent_attention_shapes_read_only_points_and_key_orthogonality_not_applicable(tmp_path):
    """Multi-head latent attention (deepseek_v3, tiny: 4 heads, qk_nope 16 + qk_rope 8 = 24 key coordinates, 12 value
    coordinates): the stored shapes follow the contract's axes (values n_heads*v_head_dim, keys [n_heads, 24]); the
    key coordinates 16: are the pre-RoPE k_rope of kv_a_proj_with_mqa, the same for every head; hook_k is read-only,
    hook_v editable (the attention function receives the edit);
    key orthogonality rows say "not applicable" with the reason, and the claim on it is not testable here."""
    import numpy as np
    import torch
    import yaml

    from llmgeom.analyses.bayes_tables import table2
    from llmgeom.analyses.claims import claims_table
    from llmgeom.core.store import CONTRACT, contract_shapes
    from llmgeom.extract import batch, capture
    from llmgeom.models import architectures as arch
    from llmgeom.models import families
    from llmgeom.weights.key_orthogonality import key_orthogonality_table

    m = mtypes.build("deepseek_v3", "sdpa")
    s = families.summarize(m.config)
    assert (s.latent_attention, s.n_heads, s.n_kv_heads, s.head_dim, s.value_head_dim) == (True, 4, 4, 24, 12)
    shapes = contract_shapes(dict(batch.model_axis_sizes(s), prompt=2, layer=3, resid_layer=4, d_model=64,
                                  d_unembed=64, rank=3), attention=True, candidates=False, corpus=False)
    res = batch.extract_batch(m, mtypes.SEQS, attention=True, top_k=3)
    for name in ("last_token/values", "last_token/keys", "last_token/attn_output"):
        assert res[name].shape == (2,) + shapes[name][0][1:] and np.isfinite(res[name]).all(), name
    assert res["last_token/values"].shape == (2, 3, 48) and res["last_token/keys"].shape == (2, 3, 4, 24)
    K = res["last_token/keys"]
    assert np.array_equal(K[:, :, :1, 16:].repeat(4, axis=2), K[:, :, :, 16:])  # k_rope shared by the heads
    assert not np.allclose(K[:, :, 0, :16], K[:, :, 1, :16])  # k_nope per head
    # k_rope: pre-RoPE columns kv_lora_rank: of kv_a_proj_with_mqa at the final token of prompt 0 (layer 0)
    with torch.no_grad():
        hs = m(input_ids=torch.tensor([mtypes.SEQS[0]]), output_hidden_states=True).hidden_states[0]
        x = arch.input_norm(m, 0)(hs)[0, -1]
        want = arch.kv_module(m, 0)(x)[32:40]
    assert np.allclose(K[0, 0, 0, 16:], want.numpy(), atol=1e-5)
    b = capture.make_batch(m, mtypes.SEQS)
    with pytest.raises(ValueError, match="read-only under multi-head latent attention"):
        capture.run(m, b, {"blocks.0.attn.hook_k": lambda k, pt: k * 0})
    # hook_v is editable: the edited values are what the attention function receives (zero values: zero output),
    # and the edit changes the model's output; without an edit the values are the stored ones
    z, seen = {}, {}
    capture.run(m, b, {"blocks.1.attn.hook_v": [lambda v, pt: seen.setdefault(1, v.clone()),
                                                 lambda v, pt: torch.zeros_like(v)],
                       "blocks.1.attn.hook_z": lambda o, pt: z.setdefault(1, o.clone())})
    assert z[1].shape == (2, 7, 48) and float(z[1].abs().max()) == 0.0
    assert np.allclose(seen[1][[0, 1], [6, 2]].numpy(), res["last_token/values"][:, 1], atol=1e-6)
    plain = capture.run(m, b).logits
    edited = capture.run(m, b, {"blocks.1.attn.hook_v": lambda v, pt: torch.zeros_like(v)}).logits
    assert float((plain - edited).abs().max()) > 1e-3
    assert CONTRACT["last_token/values"].point == "attn.hook_v"
    ko = key_orthogonality_table(m, model_name="ds", seed=0, random_init=True)
    assert len(ko) == 3 * 4 and ko.orthogonality.isna().all()
    assert ko.not_applicable.str.startswith("key orthogonality not applicable: multi-head latent attention").all()
    ok = key_orthogonality_table(mtypes.build("olmo2", "sdpa"), model_name="ok", seed=0, random_init=True)
    assert (ok.not_applicable == "").all() and list(ok.columns) == list(ko.columns)
    # table2 carries the reason; the claim on key orthogonality is not testable for that model, decided for the other
    both = pd.concat([ko, ok])
    both.to_csv(tmp_path / "ko.csv", index=False)
    t2 = table2(pd.DataFrame(columns=["model", "prompt_set", "role", "representation", "standardized", "layer"]),
                pd.read_csv(tmp_path / "ko.csv"), pd.DataFrame(columns=["model"]), restricted_set="x")
    t2 = t2[t2.source == "llm"].set_index("model")
    assert t2.loc["ds", "orth_not_applicable"] == ko.not_applicable[0] and t2.loc["ok", "orth_not_applicable"] == ""
    card = claims_table({"table2": t2.reset_index()}, models=["ds", "ok"])
    c = card[card.claim_id == "keys_more_orthogonal_than_random_init"].set_index("model")
    assert c.loc["ds", "verdict"] == "not testable here" and c.loc["ds", "reason"] == ko.not_applicable[0]
    assert c.loc["ok", "verdict"] in ("supported", "not supported")


def test_latent_attention_extracts_to_a_complete_activation_file(tmp_path):
    """extract_to_hdf5 on a prepared tiny deepseek_v3 (prompt set and corpus set): complete files whose keys, values
    and attention output have the latent-attention shapes, and whose root attributes say so."""
    import json

    import h5py

    from llmgeom.extract import forward
    from llmgeom.models import sources, tiny
    from llmgeom.prompts.io import write_prompt_set

    src = tmp_path / "src"
    m = mtypes.build("deepseek_v3", "sdpa")
    m.save_pretrained(src)
    tiny.tiny_tokenizer(m.config.vocab_size).save_pretrained(src)
    prepared = tmp_path / "prepared"
    sources.prepare_model("ds", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    prompts = tmp_path / "mixed.jsonl"
    write_prompt_set([{"id": "a", "text": "abcdefgh", "meta": {}}, {"id": "b", "text": "xyz", "meta": {}}], prompts)
    for corpus in (False, True):
        out = tmp_path / f"{corpus}.h5"
        forward.extract_to_hdf5(prepared, prompts, out, model_name="ds", dtype="float32", device="cpu", batch_size=2,
                                corpus=corpus, sample_per_prompt=2, log=lambda *a: None, top_k=10, device_map=None)
        with h5py.File(out) as f:
            assert f.attrs["complete"] and f.attrs["head_dim"] == 24 and f.attrs["n_kv_heads"] == 4
            a = json.loads(f.attrs["architecture"])
            assert a["latent_attention"] and a["value_head_dim"] == 12
            assert f["last_token/values"].shape == (2, 3, 48) and f["last_token/keys"].shape == (2, 3, 4, 24)
            assert f["last_token/attn_output"].shape == (2, 3, 48)


def test_codegen_fused_groups_split_as_codegen_does_and_a_value_edit_reaches_the_attention():
    """CodeGen's qkv_proj: 4 model-parallel groups of [q | v | k] (CodeGenAttention.forward: ``view(..., 4, -1)`` then
    ``split(local_dim)`` into query, value, key); the Family's columns are those, and an edit of hook_v is written
    back into the fused output (zero values: zero attention output)."""
    import torch

    from llmgeom.extract import capture
    from llmgeom.models import architectures as arch

    m = mtypes.build("codegen", "sdpa")
    out = torch.randn(2, 3, 192)
    q, k, v = (arch.qkv_part(m, out, p) for p in "qkv")
    g = out.view(2, 3, 4, 48)  # 4 groups of 3 x 16 (d_model 64 / 4)
    assert torch.equal(q, g[..., :16].reshape(2, 3, 64)) and torch.equal(v, g[..., 16:32].reshape(2, 3, 64))
    assert torch.equal(k, g[..., 32:].reshape(2, 3, 64))
    cols = torch.cat([arch.qkv_columns(m, p) for p in "qkv"])
    assert torch.equal(cols.sort().values, torch.arange(192))
    z = {}
    capture.run(m, capture.make_batch(m, mtypes.SEQS), {"blocks.0.attn.hook_v": lambda t, pt: torch.zeros_like(t),
                                                        "blocks.0.attn.hook_z": lambda o, pt: z.setdefault(0, o.clone())})
    assert z[0].shape == (2, 7, 64) and float(z[0].abs().max()) == 0.0


def test_families_sweep_dry_run_plans_every_model(tmp_path):
    """config/families.yaml (one small Hub model per family, issue 29 item 5) plans every model offline with an
    empty Hugging Face cache (a dry run prepares nothing, so uncached ids are not refused there)."""
    import yaml
    from conftest import offline_dry_run_counts

    repo = Path(__file__).resolve().parents[3]
    counts = offline_dry_run_counts(repo / "config/families.yaml", tmp_path)
    cfg = yaml.safe_load((repo / "config/families.yaml").read_text())
    assert len(cfg["models"]) == 15
    # every model and its random-init twin (issue 28); the twins extract these three sets too (mixed, the summary
    # domain set, the corpus)
    assert counts["prepare_model"] == 2 * len(cfg["models"])
    assert counts["extract"] == 2 * len(cfg["models"]) * len(cfg["prompts"]["sets"])
