"""Prompt sets as JSON Lines files: atomic, byte-deterministic writing and checked reading.

A prompt set is a list of records ``{"id": str, "text": str, "meta": {...}}``; a file holds one record per
line (keys sorted, UTF-8, ``\\n`` line ends), so the same records give the same bytes (and sha256). Both
directions refuse records without text, duplicate ids and text holding invisible format characters
(Unicode category Cf).
"""

from __future__ import annotations

import hashlib
import json
import pathlib

from llmgeom.core.io import atomic_path
from llmgeom.prompts.cleaning import format_chars


#: Meta key of a prompt's candidate next tokens (list of token ids: the SULA labels' first tokens, the
#: wind tunnel's answer symbols); extraction stores their log-probs as ``next_token/candidate_logprobs``.
CANDIDATES_KEY = "candidate_token_ids"


class PromptDataError(ValueError):
    """A prompt set cannot be built or read (missing data, bad arguments, corrupt file)."""


def _check_record(rec, where: str, ids: set) -> None:
    """Raises PromptDataError for a record that is not an object, lacks a non-empty ``text``, or repeats
    an ``id`` already in ``ids`` (which collects the ids seen)."""
    if not isinstance(rec, dict):
        raise PromptDataError(f"{where}: record is not a JSON object")
    text = rec.get("text")
    if not isinstance(text, str) or not text.strip():
        raise PromptDataError(f"{where}: record has no non-empty 'text'")
    if "\0" in text:  # HDF5's variable-length strings end at a NUL: the stored prompt would differ from this one
        raise PromptDataError(f"{where}: record {rec.get('id')!r} holds a NUL character (position {text.index(chr(0))}"
                              "); remove it, or rebuild the prompt set")
    bad = format_chars(text)
    if bad:
        raise PromptDataError(f"{where}: record {rec.get('id')!r} holds invisible format characters {bad} "
                              "(Unicode category Cf); rebuild the prompt set (llmgeom.prompts.cleaning cuts them)")
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
