"""Code prompts: the standard library source cut into chunks of whole consecutive statements.

Each file (:func:`llmgeom.prompts.sources.stdlib_source_files`) is split with :mod:`tokenize` into
statements; a chunk is a greedy run of whole consecutive statements (starting at a statement start, never
continuing into a less-indented block), the longest within the token budget of the reference tokenizer
(:mod:`llmgeom.prompts.tokens`) with at least ``min_words`` whitespace-separated words, so it ends
at the end of a line after a complete statement; the first line's indentation is removed from every line.
"""

from __future__ import annotations

import functools
import io
import pathlib
import tokenize
from collections.abc import Iterator

from llmgeom.prompts.cleaning import has_format_char
from llmgeom.prompts.sources import stdlib_source_files
from llmgeom.prompts.tokens import longest_fitting


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


def _chunk_text(lines: list[str], first: int, last: int) -> str:
    """Rows ``first..last`` (1-based, inclusive) as a prompt: the first line's indentation removed from every line,
    no trailing whitespace."""
    seg = lines[first - 1:last]
    prefix = seg[0][: _indent(seg[0])]
    return "\n".join(x[len(prefix):] if x.startswith(prefix) else x for x in seg).rstrip()


def _chunk_statements(
    lines: list[str], stmts: list[tuple[int, int]], max_words: int, min_words: int, fits
) -> Iterator[tuple[int, int]]:
    """Greedy non-overlapping chunks of whole consecutive statements, as (first row, last row)
    1-based inclusive: a chunk starts at a statement start, ends at a statement end, keeps
    min_words..max_words words, stops before a statement indented less than its first one, and is the longest
    such run whose text (:func:`_chunk_text`) ``fits`` (``text -> bool``, the token budget)."""
    n_words = [0] + [len(line.split()) for line in lines]  # 1-based rows
    cum = [0]
    for c in n_words[1:]:
        cum.append(cum[-1] + c)

    def words(a: int, b: int) -> int:  # rows a..b inclusive
        return cum[b] - cum[a - 1]

    a = 0
    guess = None
    while a < len(stmts):
        row0 = stmts[a][0]
        ind0 = _indent(lines[row0 - 1])
        b = a
        while b < len(stmts):  # the candidates a..b-1: same block, within the word cap
            if b > a and _indent(lines[stmts[b][0] - 1]) < ind0:
                break
            if words(row0, stmts[b][1]) > max_words:
                break
            b += 1
        k = longest_fitting(b - a, lambda k: fits(_chunk_text(lines, row0, stmts[a + k - 1][1])), guess)
        if k:
            last = stmts[a + k - 1][1]
            seg = lines[row0 - 1:last]
            if words(row0, last) >= min_words and not all(_is_comment_or_blank(x) for x in seg):
                yield row0, last
                a += k
                guess = k
                continue
        a += 1


@functools.lru_cache(maxsize=4)
def code_pool(root: str, min_words: int, tokenizer, token_budget: int) -> tuple[tuple[tuple, ...], int]:
    """All code chunks of at least ``min_words`` words under ``root``, in sorted file order, each the longest run
    of whole statements within ``token_budget`` tokens of ``tokenizer``.

    Args:
        root: the source tree (``str``, so the result can be cached; the builders pass
            :func:`llmgeom.prompts.sources.stdlib_root`).
        min_words: fewest whitespace-separated words of a chunk.
        tokenizer, token_budget: a :class:`llmgeom.prompts.tokens.ReferenceTokenizer` and the chunk's budget in its
            tokens (a word being at least one token, at most ``token_budget`` words are tried: that only prunes).

    Returns:
        ``(pool, skipped)``: pool = tuple of ``(text, relpath, first line, last line)`` (1-based,
        inclusive; text without trailing newline, first line's indentation removed; chunks holding an
        invisible format character are left out) and the number of files skipped (not UTF-8 or not
        tokenizable). Cached (``functools.lru_cache``).
    """
    rootp = pathlib.Path(root)
    def fits(text: str) -> bool:
        return tokenizer.fits(text, token_budget)

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
        for first, last in _chunk_statements(lines, stmts, token_budget, min_words, fits):
            text = _chunk_text(lines, first, last)
            if has_format_char(text):  # e.g. a BOM or zero-width joiner in a string literal: not a prompt
                continue
            pool.append((text, rel, first, last))
    return tuple(pool), skipped
