"""Tiny random models of every supported family, built offline from configs.

Used by the tests and by the tiny workflow config (``source: hf_local``).
"""

from __future__ import annotations

from pathlib import Path

TINY = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=1024)


def tiny_config(family: str, **over):
    """A transformers config with 2 layers, d_model 32, 4 heads (GQA 2 key heads
    where the family supports it), vocab 96. ``family`` in
    gpt2, gpt_neox, llama, gemma3, mistral, phi, opt, opt_proj (OPT with
    word_embed_proj_dim 16 < hidden_size)."""
    from transformers import (
        Gemma3TextConfig,
        GPT2Config,
        GPTNeoXConfig,
        LlamaConfig,
        MistralConfig,
        OPTConfig,
        PhiConfig,
    )

    t = dict(TINY)
    if family == "gpt2":
        c = GPT2Config(vocab_size=t["vocab_size"], n_embd=32, n_layer=2, n_head=4, n_positions=1024, bos_token_id=1, eos_token_id=2,
                       resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    elif family == "gpt_neox":
        c = GPTNeoXConfig(**t, rotary_pct=0.5, hidden_dropout=0, attention_dropout=0)
    elif family == "llama":
        c = LlamaConfig(**t, num_key_value_heads=2)
    elif family == "mistral":
        c = MistralConfig(**t, num_key_value_heads=2, sliding_window=16)
    elif family == "gemma3":
        c = Gemma3TextConfig(**t, num_key_value_heads=1, head_dim=8, sliding_window=4,
                             layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=8)
    elif family == "phi":
        c = PhiConfig(**t, num_key_value_heads=4, partial_rotary_factor=0.5, resid_pdrop=0, embd_pdrop=0,
                      attention_dropout=0)
    elif family in ("opt", "opt_proj"):
        c = OPTConfig(vocab_size=t["vocab_size"], hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                      num_attention_heads=4, max_position_embeddings=1024, dropout=0, attention_dropout=0,
                      word_embed_proj_dim=16 if family == "opt_proj" else 32)
    else:
        raise ValueError(f"unknown tiny family {family!r}")
    for k, v in over.items():
        setattr(c, k, v)
    return c


FAMILIES = ("gpt2", "gpt_neox", "llama", "gemma3", "mistral", "phi", "opt", "opt_proj")


def tiny_model(family: str, seed: int = 0, attn: str = "eager"):
    """Random-init ``*ForCausalLM`` in float32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family)
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    return m.eval()


def tiny_tokenizer(vocab_size: int = 96):
    """A byte-level BPE-free character tokenizer: each character maps to an id
    (unknown -> <unk>), <bos> prepended; fast and fully offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 32 + vocab_size - 4)]
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    for i, ch in enumerate(chars):
        vocab[ch] = i + 4
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


def save_tiny_model_dir(family: str, path: str | Path, seed: int = 0) -> Path:
    """Write a tiny random model + tokenizer as a Hugging Face directory."""
    path = Path(path)
    m = tiny_model(family, seed=seed, attn="sdpa")
    m.save_pretrained(path)
    tiny_tokenizer(m.config.vocab_size).save_pretrained(path)
    return path
