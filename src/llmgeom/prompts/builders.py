"""Builders of the model-independent prompt sets, one per kind, registered in :data:`BUILDERS`.

Kinds (see :func:`build_prompt_set`):

* ``mixed``  - candidate pool across all topics (Paper III, "Geometric Scaling of Bayesian
  Inference in LLMs", sec. 4: the per-model entropy-quintile selection happens later);
* ``domain`` - the same from a restricted set of topics (e.g. Mathematics; Paper III sec. 4);
* ``code``   - contiguous lines of stdlib source (:mod:`llmgeom.prompts.code`);
* ``corpus`` - contiguous passages of whole summaries for token-level statistics
  (LSM, "Latent Semantic Manifolds in Large Language Models"), or of a local text file.

Everything is deterministic given the arguments: inputs are sorted before any seeded
``random.Random(seed)`` draw, the global RNG is never used, and :func:`llmgeom.prompts.io.write_prompt_set`
writes sorted keys, so the same arguments give a byte-identical JSON Lines file.
"""

from __future__ import annotations

import random
import sys

from llmgeom.prompts.cleaning import cut_at_boundary
from llmgeom.prompts.code import code_pool
from llmgeom.prompts.io import PromptDataError
from llmgeom.prompts.sources import load_wiki_summaries, resolve_topics, stdlib_root, text_file_passages, wiki_topics

from llmgeom.prompts.tokens import longest_fitting


def _round_robin_wiki(
    records: list[dict], topics: list[str], n: int, rng: random.Random, max_words: int,
    min_words: int, kind: str, fits,
) -> list[dict]:
    """Stratified selection: topics in seeded random order, summaries shuffled within topic,
    one usable prompt per topic per round until n are collected."""
    by_topic: dict[str, list[dict]] = {t: [] for t in sorted(topics)}
    for r in records:
        if r["topic"] in by_topic:
            by_topic[r["topic"]].append(r)
    order = sorted(by_topic)
    rng.shuffle(order)
    queues = {}
    for t in order:
        items = list(by_topic[t])  # already sorted by title
        rng.shuffle(items)
        queues[t] = iter(items)
    chosen: list[dict] = []
    seen: set[str] = set()
    active = list(order)
    while len(chosen) < n and active:
        still = []
        for t in active:
            if len(chosen) >= n:
                still.append(t)
                continue
            for r in queues[t]:
                text = cut_at_boundary(r["text"], max_words, min_words, fits)
                if text is not None and text not in seen:
                    seen.add(text)
                    chosen.append({"text": text, "title": r["title"], "topic": r["topic"]})
                    still.append(t)
                    break
            # an exhausted topic drops out of the rotation
        active = still
    if len(chosen) < n:
        raise PromptDataError(
            f"prompt set {kind!r}: only {len(chosen)} usable summaries (topics {sorted(topics)}, at least "
            f"{min_words} words ending at a clause boundary within the token budget) but n={n} requested; "
            f"lower the config key 'n' of this prompt set (or raise 'token_budget' / lower "
            f"'min_words')"
        )
    return chosen



def _wiki_topics(kind: str, topics) -> tuple[list[dict], list[str]]:
    """The usable summaries and the dataset topics a wiki-based set draws from (all, or ``topics``)."""
    summaries = load_wiki_summaries()
    valid = wiki_topics(summaries)
    if kind == "domain":
        if not topics:
            raise PromptDataError(
                f"prompt set 'domain' needs 'topics' (e.g. ['Mathematics']); valid topics: {valid}"
            )
        return summaries, resolve_topics(topics, valid)
    return summaries, (resolve_topics(topics, valid) if topics else valid)


def _build_wiki(kind: str, *, n: int, rng: random.Random, tok, budget: int, min_words: int, topics) -> list[dict]:
    """``mixed`` / ``domain``: one summary per prompt, cut at the last clause boundary within the budget,
    round-robin over topics."""
    summaries, use_topics = _wiki_topics(kind, topics)
    chosen = _round_robin_wiki(summaries, use_topics, n, rng, budget, min_words, kind,
                               lambda text: tok.fits(text, budget))
    return [
        {
            "id": f"{kind}-{i:05d}",
            "text": c["text"],
            "meta": {"source": "wiki", "kind": kind, "title": c["title"], "topic": c["topic"],
                     "n_words": len(c["text"].split()), "n_tokens": tok.count(c["text"]), **tok.meta()},
        }
        for i, c in enumerate(chosen)
    ]


def _build_code(kind: str, *, n: int, rng: random.Random, tok, budget: int, min_words: int, topics) -> list[dict]:
    """``code``: ``n`` chunks of whole statements drawn from the stdlib pool (:func:`code_pool`)."""
    if topics:
        raise PromptDataError("prompt set 'code' takes no topics (it is built from stdlib source)")
    pool, skipped = code_pool(str(stdlib_root()), min_words, tok, budget)
    if len(pool) < n:
        raise PromptDataError(
            f"prompt set 'code': only {len(pool)} usable stdlib chunks of at least {min_words} words within "
            f"{budget} tokens ({skipped} files skipped: not UTF-8 or not tokenizable) but n={n} "
            f"requested; lower the config key 'n' of this prompt set"
        )
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    records = []
    for i, idx in enumerate(rng.sample(range(len(pool)), n)):
        text, rel, first, last = pool[idx]
        records.append({
            "id": f"{kind}-{i:05d}",
            "text": text,
            "meta": {"source": "stdlib", "kind": kind, "topic": "code", "path": rel,
                     "line_start": first, "line_end": last, "python": python,
                     "n_words": len(text.split()), "n_tokens": tok.count(text), **tok.meta()},
        })
    return records


def _build_corpus(kind: str, *, n: int, rng: random.Random, tok, budget: int, min_words: int, topics) -> list[dict]:
    """``corpus``: whole summaries in a seeded shuffle, concatenated into passages of the most words within the
    budget."""
    summaries, use_topics = _wiki_topics(kind, topics)
    pool = [r for r in summaries if r["topic"] in set(use_topics)]
    rng.shuffle(pool)
    records = []
    words: list[str] = []
    titles: list[str] = []
    tops: list[str] = []
    guess = None
    for r in pool:
        if len(records) >= n:
            break
        w = r["text"].split()
        if len(words) + len(w) <= budget and tok.fits(" ".join(words + w), budget):
            words.extend(w)  # the whole summary fits: the passage goes on with the next one
            titles.append(r["title"])
            tops.append(r["topic"])
            continue
        hi = min(len(w), budget - len(words))  # a word is at least one token: the word cap only prunes
        k = longest_fitting(hi, lambda k: tok.fits(" ".join(words + w[:k]), budget), guess)
        if k:
            words.extend(w[:k])  # the last summary is cut at the budget; its remainder is dropped
            titles.append(r["title"])
            tops.append(r["topic"])
            guess = k
        if words:
            text = " ".join(words)
            records.append({
                "id": f"{kind}-{len(records):05d}",
                "text": text,
                "meta": {"source": "wiki", "kind": kind, "titles": titles, "topics": tops,
                         "n_words": len(words), "n_tokens": tok.count(text), **tok.meta()},
            })
        words, titles, tops = [], [], []
    if len(records) < n:
        raise PromptDataError(
            f"prompt set 'corpus': the {len(pool)} summaries give only {len(records)} passages of "
            f"{budget} tokens but n={n} requested; lower the config key 'n' (or 'token_budget') "
            f"of this prompt set"
        )
    return records


#: Prompt set kind -> its builder ``f(kind, *, n, rng, tok, budget, min_words, topics) -> records``.
BUILDERS = {"mixed": _build_wiki, "domain": _build_wiki, "code": _build_code, "corpus": _build_corpus}

#: Prompt set kinds understood by :func:`build_prompt_set`.
KINDS = tuple(BUILDERS)


def build_prompt_set(
    kind: str,
    *,
    n: int,
    seed: int,
    token_budget: int,
    tokenizer,
    topics: list[str] | None = None,
    min_words: int = 8,
    path=None,
) -> list[dict]:
    """Build a model-independent prompt set, every prompt at most ``token_budget`` tokens of the reference tokenizer.

    Budget: counted in the tokens of ``tokenizer`` (config ``prompts.tokenizer``; special tokens included, as the
    extraction counts them), the same tokenizer for every set, so the sets are comparable in tokens (a words-per-token
    rule made code prompts 1.5x their budget). Prompts are cut at whole words, never inside one: the last token of
    a prompt is then the end of a word (of a clause for mixed/domain, of a statement for code), the position the
    last-token analyses read, not a fragment the tokenizer of a cut text would not produce. Whitespace-separated
    words are counted as at least one token each, which only prunes the search.

    Kinds:

    * ``"mixed"`` (Paper III, "Geometric Scaling of Bayesian Inference in LLMs", sec. 4): a
      candidate pool across ALL Wikipedia topics, stratified: round-robin over the topics in a
      seeded random order (summaries shuffled within each topic), so every topic is represented.
      Each prompt is one summary cut by :func:`cut_at_boundary` at its last clause boundary within the
      budget, with at least ``min_words`` words. ``topics``, if given, restricts the pool to those topics.
    * ``"domain"`` (Paper III sec. 4, e.g. Mathematics): the same, only from summaries whose
      topic is in ``topics`` (required).
    * ``"code"``: contiguous lines of Python standard-library source (see
      :func:`stdlib_source_files`; files in sorted path order). Each file is split with
      :mod:`tokenize` into statements; a chunk is a greedy run of whole consecutive statements
      (starting at a statement start, never continuing into a less-indented block), the longest within the
      budget, with at least ``min_words`` whitespace-separated words, so it ends at the end of a line (no
      trailing newline) after a complete statement; the first line's indentation is removed from
      every line. Chunks that are only comments/blank lines are skipped, as are files that are
      not UTF-8 or do not tokenize (counted in the error message). ``n`` chunks are drawn from
      the whole pool with a seeded sample. The pool depends on the running Python version's
      stdlib (recorded as ``meta["python"]``).
    * ``"corpus"`` (LSM, "Latent Semantic Manifolds in Large Language Models": token-level
      statistics): whole summaries (all topics, or ``topics``) in a seeded shuffle concatenated
      with single spaces into passages of the most whole words within the budget (the next word would not
      fit): each passage starts at the beginning of a summary, the last summary in a passage
      is cut at the budget and its remainder is dropped. Not cut at clauses: passages
      are contiguous full text spans. With ``path`` (corpus only), passages come from a local
      text file instead, e.g. WikiText-103 ``wiki.valid.tokens`` (see :func:`text_file_passages`).

    Wiki prompts contain no newlines (whitespace is collapsed).

    Args:
        kind: one of ``KINDS``.
        n: number of records (>= 1).
        seed: seed of the ``random.Random`` used for every draw.
        token_budget: maximum prompt length in tokens of ``tokenizer`` (>= 4).
        tokenizer: the reference tokenizer (:class:`llmgeom.prompts.tokens.ReferenceTokenizer`).
        topics: topic names (exact, or case-insensitive with ``_`` for spaces); see ``kind``.
        min_words: minimum prompt length in words (mixed/domain/code).
        path: corpus only: a local UTF-8 text file to cut passages from (LSM uses the WikiText-103
            validation split); None = the embedded Wikipedia summaries.

    Returns:
        ``n`` records ``{"id": "<kind>-<i:05d>", "text": str, "meta": {...}}``; ``meta`` has
        ``source`` ("wiki" | "stdlib" | "file"), ``kind``, ``topic`` (``"code"`` for code), ``n_words``,
        ``n_tokens`` (reference tokens, <= ``token_budget``), ``tokenizer`` and ``tokenizer_sha256``
        (:meth:`~llmgeom.prompts.tokens.ReferenceTokenizer.meta`), and ``title`` (wiki), or ``path`` /
        ``line_start`` / ``line_end`` / ``python`` (code), or ``titles`` / ``topics`` lists (corpus).

    Raises:
        PromptDataError: unknown kind; ``n < 1``; ``token_budget < 4``; ``min_words`` larger
            than the budget; topics missing (domain) or unknown (message lists the valid
            topics); topics given for code; fewer usable texts than ``n`` (message gives the
            number available and the config key to lower); missing data package.
    """
    if kind not in KINDS:
        raise PromptDataError(f"unknown prompt set kind {kind!r}; valid kinds: {list(KINDS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PromptDataError(f"prompt set {kind!r}: n must be an integer >= 1, got {n!r}")
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 4:
        raise PromptDataError(
            f"prompt set {kind!r}: token_budget must be an integer >= 4, got {token_budget!r}"
        )
    if kind != "corpus" and (not isinstance(min_words, int) or min_words < 1 or min_words > token_budget):
        raise PromptDataError(
            f"prompt set {kind!r}: min_words={min_words!r} must be an integer in 1..token_budget="
            f"{token_budget} (a word is at least one token); raise 'token_budget' or lower 'min_words'"
        )
    rng = random.Random(seed)
    if path is not None:
        if kind != "corpus":
            raise PromptDataError(f"prompt set {kind!r}: 'path' is only valid for kind corpus")
        if topics:
            raise PromptDataError("prompt set 'corpus' with 'path' takes no topics (they select Wikipedia summaries)")
        return text_file_passages(path, n=n, tokenizer=tokenizer, token_budget=token_budget, rng=rng)
    return BUILDERS[kind](kind, n=n, rng=rng, tok=tokenizer, budget=token_budget, min_words=min_words, topics=topics)
