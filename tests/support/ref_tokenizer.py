"""Reference tokenizers of the prompt-set tests (``prompts.tokenizer``; :mod:`llmgeom.prompts.tokens`), offline.

:func:`word_tokenizer`: one token per word and per run of punctuation (``tokenizers``' ``Whitespace`` pre-tokenizer,
``\\w+|[^\\w\\s]+``), no special tokens, so counts are known by hand: "The cat sat on the mat." is 7 tokens.
:func:`char_tokenizer`: the tiny study's character tokenizer (``.test/models/tiny-llama``: one token a character,
``<bos>`` prepended).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from llmgeom.prompts.tokens import ReferenceTokenizer

REPO = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def word_tokenizer_file() -> Path:
    """A ``tokenizer.json`` of the word-level tokenizer (written once per session to a temporary directory)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel(vocab={"<unk>": 0}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    path = Path(tempfile.mkdtemp(prefix="llmgeom-ref-tok-")) / "tokenizer.json"
    tk.save(str(path))
    return path


def word_tokenizer() -> ReferenceTokenizer:
    return ReferenceTokenizer(word_tokenizer_file(), "words")


def char_tokenizer() -> ReferenceTokenizer:
    return ReferenceTokenizer(REPO / ".test" / "models" / "tiny-llama" / "tokenizer.json", "tiny-llama")
