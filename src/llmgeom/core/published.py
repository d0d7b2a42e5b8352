"""Published values (package data ``llmgeom/data/published.yaml``) and their rendering beside our numbers.

The numbers live in the data file, never in code (DESIGN.md sec. 3, "Published values"); every entry
names its paper, where in the paper, and the model(s) it was measured on. Tables add, beside a measured
column ``x``, the text columns ``x_published`` (value or range, "" when the file has none) and
``x_published_on`` (models and source).

May import: the standard library, yaml.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

DATA_FILE = "data/published.yaml"
_FIELDS = {"quantity", "value", "range", "min", "unit", "paper", "where", "models", "reading", "note"}


class PublishedDataError(ValueError):
    """The published-values file is malformed (message names the file, entry and field)."""


def _default_path() -> Path:
    return Path(str(resources.files("llmgeom") / DATA_FILE))


@lru_cache(maxsize=4)
def load_published(path: str | None = None) -> dict[str, list[dict]]:
    """Published values by quantity.

    Args:
        path: a YAML file with ``papers`` (key -> title) and ``values`` (list of entries); default the
            package's ``llmgeom/data/published.yaml``.

    Returns:
        {quantity: [entry, ...]} (several entries for one quantity = one per model it was published for);
        each entry has exactly one of ``value`` (float), ``range`` ([lo, hi] floats) or ``min`` (float lower
        bound), plus ``unit``, ``paper`` (the title), ``paper_key``, ``where``, ``models`` (strings) and
        optionally ``reading`` / ``note``.

    Raises:
        PublishedDataError: unknown field, missing source, an entry with no number or two kinds of number,
            a paper key not listed under ``papers``, the same quantity twice for the same models, or lo > hi.
    """
    p = Path(path) if path else _default_path()
    doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    papers = doc.get("papers") or {}
    out: dict[str, list[dict]] = {}
    for i, e in enumerate(doc.get("values") or []):
        where = f"{p}: values[{i}]"
        if not isinstance(e, dict) or "quantity" not in e:
            raise PublishedDataError(f"{where}: each entry must be a mapping with a 'quantity'")
        q = str(e["quantity"])
        bad = set(e) - _FIELDS
        if bad:
            raise PublishedDataError(f"{where} ({q}): unknown field(s) {sorted(bad)}; valid: {sorted(_FIELDS)}")
        kinds = [k for k in ("value", "range", "min") if k in e]
        if len(kinds) != 1:
            raise PublishedDataError(f"{where} ({q}): needs exactly one of value / range / min, got {kinds}")
        for k in ("paper", "where", "models", "unit"):
            if not e.get(k):
                raise PublishedDataError(f"{where} ({q}): missing '{k}' (every published value names its source)")
        if e["paper"] not in papers:
            raise PublishedDataError(f"{where} ({q}): paper {e['paper']!r} is not listed under 'papers' "
                                     f"({sorted(papers)})")
        if any(o["models"] == e["models"] for o in out.get(q, [])):
            raise PublishedDataError(f"{where}: quantity {q!r} appears twice for models {e['models']!r}")
        ent = dict(e, paper=str(papers[e["paper"]]), paper_key=e["paper"])
        if "range" in e:
            lo, hi = (float(v) for v in e["range"])
            if lo > hi:
                raise PublishedDataError(f"{where} ({q}): range lo {lo} > hi {hi}")
            ent["range"] = [lo, hi]
        elif "value" in e:
            ent["value"] = float(e["value"])
        else:
            ent["min"] = float(e["min"])
        out.setdefault(q, []).append(ent)
    return out


def _num(v: float) -> str:
    return f"{v:.3g}"


def _value_text(e: dict) -> str:
    if "range" in e:
        return f"{_num(e['range'][0])}-{_num(e['range'][1])}"
    if "min" in e:
        return f"> {_num(e['min'])}"
    return _num(e["value"])


def published_text(quantity: str, *, path: str | None = None) -> str:
    """The published value of ``quantity`` as text ("0.87-1.12", "> 0.985", "0.007"); with one entry per
    model, "value (models); value (models)"; "" if the file holds none."""
    es = load_published(path).get(quantity, [])
    if len(es) == 1:
        return _value_text(es[0])
    return "; ".join(f"{_value_text(e)} ({e['models']})" for e in es)


def published_on(quantity: str, *, path: str | None = None) -> str:
    """What the published value of ``quantity`` was measured on and where it is published:
    "models (paper, where)"; "" if none."""
    es = load_published(path).get(quantity, [])
    if len(es) == 1:
        e = es[0]
        return f"{e['models']} ({e['paper']}, {e['where']})"
    return "; ".join(sorted({f"{e['paper']}, {e['where']}" for e in es}))


def add_published(df, mapping: dict[str, str], *, path: str | None = None):
    """Add ``<col>_published`` and ``<col>_published_on`` beside every measured column of ``mapping``
    (column -> quantity in the data file); a copy of ``df`` (pandas DataFrame) with the new columns placed
    right after their measured column. Columns absent from ``df`` are skipped; a quantity the file does not
    hold gives "" (we do not know the number)."""
    d = df.copy()
    for col, q in mapping.items():
        if col not in d.columns:
            continue
        pos = list(d.columns).index(col) + 1
        d.insert(pos, f"{col}_published", published_text(q, path=path))
        d.insert(pos + 1, f"{col}_published_on", published_on(q, path=path))
    return d
