"""Cleaning raw source text for prompts: invisible format characters, emptied formula slots, clause cutting.

No prompt may hold an invisible format character (Unicode category Cf) or an emptied formula slot
of a Wikipedia extract; a summary is cut before its first broken sentence (:func:`clean_extract`), never
patched. :func:`cut_at_boundary` ends a prompt at a sentence or clause boundary so that the model's next
token is a natural continuation (Paper III, "Geometric Scaling of Bayesian Inference in LLMs", sec. 4).

Pure string functions (stdlib only).
"""

from __future__ import annotations

import re
import unicodedata

#: Characters after which a wiki prompt may end (each must be followed by whitespace in the text).
BOUNDARY_CHARS = (".", ";", ",", ":")
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


#: Signs of an emptied formula slot in a Wikipedia extract (the API drops <math> content and leaves its
#: surroundings): punctuation right after whitespace ("such that ."), empty brackets, or a run of spaces
#: right after a clause mark ("operator,  is"). Invisible format characters (Unicode category Cf, e.g. the
#: U+2060 word joiners around a removed formula) are checked separately.
_EMPTY_SLOT = re.compile(r"\s[.,;:!?](?=\s|$)|[(\[]\s*[)\]]|[,;:]\s{2,}")


def format_chars(text: str) -> list[str]:
    """The invisible format characters (Unicode general category Cf) in ``text``, as sorted distinct code
    points ``"U+XXXX"`` (empty list: none)."""
    return sorted({f"U+{ord(ch):04X}" for ch in text if unicodedata.category(ch) == "Cf"})


def has_format_char(text: str) -> bool:
    """True if ``text`` holds an invisible format character (Unicode general category Cf). ASCII has none; other
    text is checked once per distinct character, so a 10 MB line of a corpus file takes a fraction of a second."""
    return not text.isascii() and any(unicodedata.category(ch) == "Cf" for ch in set(text))


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
    """Cut a raw summary before its first broken sentence (no prompt may hold Cf characters or
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


def cut_at_boundary(text: str, max_words: int, min_words: int, fits=None) -> str | None:
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
        fits: optional ``prefix -> bool``, the budget in tokens (:meth:`llmgeom.prompts.tokens.ReferenceTokenizer.fits`):
            the longest qualifying prefix for which it holds.

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
            prefix = " ".join(words[:i])
            if fits is None or fits(prefix):
                return prefix
    return None

