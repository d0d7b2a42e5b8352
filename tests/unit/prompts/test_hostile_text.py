"""Hostile text sources: a user's corpus file (``kind: corpus`` with ``path``) that is not UTF-8, holds NUL bytes,
has a 10 MB line, is empty, or is a directory of 100,000 tiny files gets a PromptDataError naming the file, the
place and the fix, or the documented handling (docs/troubleshooting.md); nothing reaches the tokenizer that it
cannot take."""

import os
import warnings

import pytest

from llmgeom.extract.forward import tokenize_prompts
from llmgeom.models.tiny import tiny_tokenizer
from llmgeom.prompts.builders import build_prompt_set
from llmgeom.prompts.io import PromptDataError
from llmgeom.prompts.sources import MAX_WORD_CHARS
from ref_tokenizer import char_tokenizer

GOOD = "The quick brown fox jumps over the lazy dog and runs far away into the woods. "


def corpus(path, n=2, token_budget=16):
    return build_prompt_set("corpus", n=n, seed=0, token_budget=token_budget, tokenizer=char_tokenizer(), path=path)


def test_invalid_utf8_names_offset_line_bytes_and_fix(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes((GOOD * 5 + "\n").encode() * 2 + "café au lait\n".encode("latin-1"))
    offset = len((GOOD * 5 + "\n").encode()) * 2 + 3
    with pytest.raises(PromptDataError, match=rf"{p} is not UTF-8 \(byte offset {offset}\): line 3, bytes "
                                              r"b'\\xe9 au'; convert it \(iconv -f LATIN1 -t UTF-8"):
        corpus(p)


@pytest.mark.parametrize("data,line", [(b"ok text\n\x00\x01binary", 3), ("UTF-16 text".encode("utf-16"), 2)],
                         ids=["binary", "utf-16"])
def test_nul_bytes_are_refused_with_the_place_and_the_fix(tmp_path, data, line):
    p = tmp_path / "nul.txt"
    p.write_bytes(GOOD.encode() * 10 + b"\n" + data)
    nul = p.read_bytes().index(b"\0")
    with pytest.raises(PromptDataError, match=rf"holds a NUL byte \(byte offset {nul}, line {line}\).*iconv -f "
                                              r"UTF-16 -t UTF-8\) or remove the NUL bytes"):
        corpus(p)


def test_a_10_mb_line_of_words_is_an_ordinary_paragraph(tmp_path):
    """One 10 MB line (no newline) of ordinary words: cut into passages as any paragraph (about 3 s), and the
    passages tokenize (each the most words within the budget of the reference tokenizer, here the tiny character
    tokenizer, the same as the extraction's)."""
    p = tmp_path / "one_line.txt"
    line = (GOOD * (10_000_000 // len(GOOD) + 1))[:10_000_000]
    p.write_text(line)
    recs = corpus(p, n=3, token_budget=32)
    assert all(len(r["text"].split()) == r["meta"]["n_words"] and r["meta"]["n_tokens"] <= 32 for r in recs)
    tok = tiny_tokenizer()
    seqs = tokenize_prompts(tok, [r["text"] for r in recs], [r["id"] for r in recs], max_tokens=32, truncate=True,
                            context=None)
    assert all(0 < len(s) <= 32 for s in seqs)


def test_a_10_mb_word_is_skipped_with_a_warning(tmp_path):
    """A 10 MB run without whitespace (base64, minified data) is not prose: its line is skipped with a warning
    naming the count and the line; with nothing else in the file the error says why there are no passages."""
    p = tmp_path / "blob.txt"
    blob = "A" * 10_000_000
    p.write_text((GOOD * 4 + "\n") * 2 + blob + "\n" + (GOOD * 4 + "\n") * 2)
    with pytest.warns(UserWarning, match=rf"1 lines skipped, each with a 'word' of more than {MAX_WORD_CHARS} "
                                         r"characters .* at line 3"):
        recs = corpus(p, n=2)
    assert all(len(r["text"]) < 200 and "AAAA" not in r["text"] for r in recs)
    only = tmp_path / "only_blob.txt"
    only.write_text(blob)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(PromptDataError, match=r"gives only 0 passages .*1 lines were skipped for a word of over "
                                                  rf"{MAX_WORD_CHARS} characters"):
            corpus(only)


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["0 bytes", "whitespace"])
def test_an_empty_file_is_refused(tmp_path, content):
    p = tmp_path / "empty.txt"
    p.write_bytes(content)
    with pytest.raises(PromptDataError, match=rf"{p} is empty \({len(content)} bytes, no words\)"):
        corpus(p)


def test_a_directory_of_100000_tiny_files_is_refused_with_the_fix(tmp_path):
    d = tmp_path / "many"
    d.mkdir()
    for i in range(100_000):
        os.close(os.open(d / f"{i:06d}.txt", os.O_CREAT | os.O_WRONLY))
    with pytest.raises(PromptDataError, match=r"is a directory \(100,000 entries\), not a text file; give one UTF-8 "
                                              r"text file, .*sort -z \| xargs -0 cat > corpus.txt"):
        corpus(d)


def test_a_nul_in_a_prompt_file_is_refused_when_it_is_read(tmp_path):
    """A hand-edited prompt file whose text holds NUL (JSON "\\u0000"): refused when read, naming the record, not
    later inside HDF5 (whose variable-length strings cannot hold it)."""
    import json

    from llmgeom.prompts.io import read_prompt_set

    p = tmp_path / "mixed.jsonl"
    p.write_text(json.dumps({"id": "a", "text": "fine"}) + "\n" + json.dumps({"id": "b", "text": "ab\0c"}) + "\n")
    with pytest.raises(PromptDataError, match=r"record 'b' holds a NUL character \(position 2\); remove it"):
        read_prompt_set(p)
