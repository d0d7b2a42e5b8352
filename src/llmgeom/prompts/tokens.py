"""The reference tokenizer that measures a prompt set's token budget (config key ``prompts.tokenizer``).

Every prompt set is cut at its ``token_budget`` counted in the tokens of ONE reference tokenizer, read from a single
``tokenizer.json`` file (the Hugging Face ``tokenizers`` format; :class:`ReferenceTokenizer`), so that the sets are
comparable with each other (code and prose at the same length in tokens, not in English words) and each file records
what measured it: the tokenizer's name and the sha256 of its ``tokenizer.json`` (``meta`` of every record,
:meth:`ReferenceTokenizer.meta`). A token count includes the special tokens the tokenizer adds (a ``<bos>``), as the
extraction counts a prompt (:func:`llmgeom.extract.forward.tokenize_prompts`).

:func:`longest_fitting` is the one search of the builders for the longest piece (whole words, whole statements) that
fits the budget.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from llmgeom.prompts.io import PromptDataError

#: The config key naming the reference tokenizer (named by every error about it).
TOKENIZER_KEY = "prompts.tokenizer"


def tokenizer_file(path) -> Path:
    """The ``tokenizer.json`` that ``path`` names: the path itself, or a directory's ``tokenizer.json`` (a prepared
    model's directory). Existence is not checked here (:class:`ReferenceTokenizer` and the config check do)."""
    p = Path(path)
    return p / "tokenizer.json" if p.is_dir() else p


class ReferenceTokenizer:
    """A ``tokenizer.json`` loaded with the ``tokenizers`` library: token counts of prompt texts.

    Attributes:
        name: what the config names (a model of ``models``, or the path given); recorded in the prompts' meta.
        path: the ``tokenizer.json`` file.
        sha256: sha256 hex digest of its bytes.
    """

    def __init__(self, path, name: str | None = None):
        """Raises PromptDataError: ``path`` is not a readable ``tokenizer.json`` (the message names
        :data:`TOKENIZER_KEY` and the fix)."""
        p = tokenizer_file(path)
        self.name = str(name if name is not None else path)
        if not p.is_file():
            raise PromptDataError(
                f"{TOKENIZER_KEY} = {self.name!r}: no tokenizer file {p}; fix: name a model of 'models' (its "
                "tokenizer is prepared into resources/tokenizers/<model>/tokenizer.json by rule prepare_tokenizer) "
                "or give the path of a tokenizer.json (or of a directory holding one)")
        data = p.read_bytes()
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise PromptDataError(f"{TOKENIZER_KEY} = {self.name!r}: {p} is not a tokenizer.json of the Hugging Face "
                                  f"tokenizers library ({exc}); fix: point it at a fast tokenizer's tokenizer.json"
                                  ) from None
        self.path = p
        self.sha256 = hashlib.sha256(data).hexdigest()

    def count(self, text: str) -> int:
        """Tokens of ``text`` with the tokenizer's special tokens (as the extraction tokenizes a prompt)."""
        return len(self._tok.encode(text).ids)

    def fits(self, text: str, budget: int) -> bool:
        """``count(text) <= budget``."""
        return self.count(text) <= budget

    def meta(self) -> dict:
        """What a prompt record's ``meta`` records about the tokenizer: ``tokenizer`` (name) and
        ``tokenizer_sha256`` (of its ``tokenizer.json``)."""
        return {"tokenizer": self.name, "tokenizer_sha256": self.sha256}


def longest_fitting(hi: int, fits: Callable[[int], bool], guess: int | None = None) -> int:
    """The largest ``k`` in ``0..hi`` with ``fits(k)``, for a ``fits`` that holds up to some k and fails after it
    (a token count that grows with the words or statements taken); 0 when ``fits(1)`` fails (``fits(0)`` is never
    called). Gallops from ``guess`` (e.g. the previous passage's length), so a run of similar pieces costs about
    two calls each; never returns a ``k`` whose ``fits(k)`` was not True (the budget holds even for a ``fits``
    that is not monotone).

    Args:
        hi: the largest candidate (>= 0).
        fits: ``k -> bool``.
        guess: where to start (clamped to ``1..hi``); None = ``hi``.
    """
    if hi < 1:
        return 0
    g = hi if guess is None else min(max(int(guess), 1), hi)
    if fits(g):
        lo, step = g, 1  # lo fits; find a failing bound above
        up = None
        while lo < hi:
            c = min(lo + step, hi)
            if fits(c):
                lo, step = c, step * 2
            else:
                up = c
                break
        if up is None:
            return lo
    else:
        up, step = g, 1  # up fails; find a fitting bound below
        lo = 0
        while True:
            c = up - step
            if c < 1:
                break
            if fits(c):
                lo = c
                break
            up, step = c, step * 2
    while up - lo > 1:  # lo fits (or 0), up fails
        mid = (lo + up) // 2
        if fits(mid):
            lo = mid
        else:
            up = mid
    return lo
