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

#: English words per token, used to turn a token budget into a word budget
#: (``max_words = int(token_budget * WORDS_PER_TOKEN)``). A rule of thumb for BPE tokenizers on
#: English prose; the exact token count is checked against the real tokenizer at extraction time.
WORDS_PER_TOKEN = 0.75


def _round_robin_wiki(
    records: list[dict], topics: list[str], n: int, rng: random.Random, max_words: int,
    min_words: int, kind: str,
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
                text = cut_at_boundary(r["text"], max_words, min_words)
                if text is not None and text not in seen:
                    seen.add(text)
                    chosen.append({"text": text, "title": r["title"], "topic": r["topic"]})
                    still.append(t)
                    break
            # an exhausted topic drops out of the rotation
        active = still
    if len(chosen) < n:
        raise PromptDataError(
            f"prompt set {kind!r}: only {len(chosen)} usable summaries (topics {sorted(topics)}, "
            f"{min_words}..{max_words} words ending at a clause boundary) but n={n} requested; "
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


def _build_wiki(kind: str, *, n: int, rng: random.Random, max_words: int, min_words: int, topics) -> list[dict]:
    """``mixed`` / ``domain``: one summary per prompt, cut at a clause boundary, round-robin over topics."""
    summaries, use_topics = _wiki_topics(kind, topics)
    chosen = _round_robin_wiki(summaries, use_topics, n, rng, max_words, min_words, kind)
    return [
        {
            "id": f"{kind}-{i:05d}",
            "text": c["text"],
            "meta": {"source": "wiki", "kind": kind, "title": c["title"], "topic": c["topic"],
                     "n_words": len(c["text"].split())},
        }
        for i, c in enumerate(chosen)
    ]


def _build_code(kind: str, *, n: int, rng: random.Random, max_words: int, min_words: int, topics) -> list[dict]:
    """``code``: ``n`` chunks of whole statements drawn from the stdlib pool (:func:`code_pool`)."""
    if topics:
        raise PromptDataError("prompt set 'code' takes no topics (it is built from stdlib source)")
    pool, skipped = code_pool(str(stdlib_root()), max_words, min_words)
    if len(pool) < n:
        raise PromptDataError(
            f"prompt set 'code': only {len(pool)} usable stdlib chunks of {min_words}.."
            f"{max_words} words ({skipped} files skipped: not UTF-8 or not tokenizable) but n={n} "
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
                     "n_words": len(text.split())},
        })
    return records


def _build_corpus(kind: str, *, n: int, rng: random.Random, max_words: int, min_words: int, topics) -> list[dict]:
    """``corpus``: whole summaries in a seeded shuffle, concatenated into passages of ``max_words`` words."""
    summaries, use_topics = _wiki_topics(kind, topics)
    pool = [r for r in summaries if r["topic"] in set(use_topics)]
    rng.shuffle(pool)
    records = []
    words: list[str] = []
    titles: list[str] = []
    tops: list[str] = []
    for r in pool:
        if len(records) >= n:
            break
        w = r["text"].split()
        take = w[: max_words - len(words)]
        words.extend(take)
        titles.append(r["title"])
        tops.append(r["topic"])
        if len(words) >= max_words:
            records.append({
                "id": f"{kind}-{len(records):05d}",
                "text": " ".join(words),
                "meta": {"source": "wiki", "kind": kind, "titles": titles, "topics": tops,
                         "n_words": len(words)},
            })
            words, titles, tops = [], [], []
    if len(records) < n:
        raise PromptDataError(
            f"prompt set 'corpus': the {len(pool)} summaries give only {len(records)} passages of "
            f"{max_words} words but n={n} requested; lower the config key 'n' (or 'token_budget') "
            f"of this prompt set"
        )
    return records


#: Prompt set kind -> its builder ``f(kind, *, n, rng, max_words, min_words, topics) -> records``.
BUILDERS = {"mixed": _build_wiki, "domain": _build_wiki, "code": _build_code, "corpus": _build_corpus}

#: Prompt set kinds understood by :func:`build_prompt_set`.
KINDS = tuple(BUILDERS)


def build_prompt_set(
    kind: str,
    *,
    n: int,
    seed: int,
    token_budget: int,
    topics: list[str] | None = None,
    min_words: int = 8,
    path=None,
) -> list[dict]:
    """Build a model-independent prompt set.

    Word budget: ``max_words = int(token_budget * 0.75)`` because an English word is about
    1/0.75 = 1.33 BPE tokens; this is only an estimate, the tokenizer-exact length check is done
    at extraction time.

    Kinds:

    * ``"mixed"`` (Paper III, "Geometric Scaling of Bayesian Inference in LLMs", sec. 4): a
      candidate pool across ALL Wikipedia topics, stratified: round-robin over the topics in a
      seeded random order (summaries shuffled within each topic), so every topic is represented.
      Each prompt is one summary cut by :func:`cut_at_boundary` to ``min_words..max_words``
      words. ``topics``, if given, restricts the pool to those topics.
    * ``"domain"`` (Paper III sec. 4, e.g. Mathematics): the same, only from summaries whose
      topic is in ``topics`` (required).
    * ``"code"``: contiguous lines of Python standard-library source (see
      :func:`stdlib_source_files`; files in sorted path order). Each file is split with
      :mod:`tokenize` into statements; a chunk is a greedy run of whole consecutive statements
      (starting at a statement start, never continuing into a less-indented block) with
      ``min_words..max_words`` whitespace-separated words, so it ends at the end of a line (no
      trailing newline) after a complete statement; the first line's indentation is removed from
      every line. Chunks that are only comments/blank lines are skipped, as are files that are
      not UTF-8 or do not tokenize (counted in the error message). ``n`` chunks are drawn from
      the whole pool with a seeded sample. The pool depends on the running Python version's
      stdlib (recorded as ``meta["python"]``).
    * ``"corpus"`` (LSM, "Latent Semantic Manifolds in Large Language Models": token-level
      statistics): whole summaries (all topics, or ``topics``) in a seeded shuffle concatenated
      with single spaces into passages of exactly ``max_words`` words (about ``token_budget``
      tokens): each passage starts at the beginning of a summary, the last summary in a passage
      is truncated at the word budget and its remainder is dropped. Not cut at clauses: passages
      are contiguous full text spans. With ``path`` (corpus only), passages come from a local
      text file instead, e.g. WikiText-103 ``wiki.valid.tokens`` (see :func:`text_file_passages`).

    Wiki prompts contain no newlines (whitespace is collapsed).

    Args:
        kind: one of ``KINDS``.
        n: number of records (>= 1).
        seed: seed of the ``random.Random`` used for every draw.
        token_budget: approximate maximum prompt length in tokens (>= 4).
        topics: topic names (exact, or case-insensitive with ``_`` for spaces); see ``kind``.
        min_words: minimum prompt length in words (mixed/domain/code).
        path: corpus only: a local UTF-8 text file to cut passages from (LSM uses the WikiText-103
            validation split); None = the embedded Wikipedia summaries.

    Returns:
        ``n`` records ``{"id": "<kind>-<i:05d>", "text": str, "meta": {...}}``; ``meta`` has
        ``source`` ("wiki" | "stdlib"), ``kind``, ``topic`` (``"code"`` for code), ``n_words``
        and ``title`` (wiki), or ``path`` / ``line_start`` / ``line_end`` / ``python`` (code), or
        ``titles`` / ``topics`` lists (corpus).

    Raises:
        PromptDataError: unknown kind; ``n < 1``; ``token_budget < 4``; ``min_words`` larger
            than the word budget; topics missing (domain) or unknown (message lists the valid
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
    max_words = int(token_budget * WORDS_PER_TOKEN)
    if kind != "corpus" and (not isinstance(min_words, int) or min_words < 1 or min_words > max_words):
        raise PromptDataError(
            f"prompt set {kind!r}: min_words={min_words!r} must be an integer in 1..max_words="
            f"{max_words} (= int(token_budget * {WORDS_PER_TOKEN}) with token_budget="
            f"{token_budget}); raise 'token_budget' or lower 'min_words'"
        )
    rng = random.Random(seed)
    if path is not None:
        if kind != "corpus":
            raise PromptDataError(f"prompt set {kind!r}: 'path' is only valid for kind corpus")
        if topics:
            raise PromptDataError("prompt set 'corpus' with 'path' takes no topics (they select Wikipedia summaries)")
        return text_file_passages(path, n=n, max_words=max_words, rng=rng)
    return BUILDERS[kind](kind, n=n, rng=rng, max_words=max_words, min_words=min_words, topics=topics)
