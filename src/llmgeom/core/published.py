"""Published values (package data ``llmgeom/data/published.yaml``) and their rendering beside our numbers.

The numbers live in the data file, never in code (DESIGN.md sec. 3, "Published values"); every entry
names its paper, where in the paper, and the model(s) it was measured on. Tables add, beside a measured
column ``x``, the text columns ``x_published`` (value or range of the entry published for the same model and
prompt-set kind; "" when there is none) and ``x_published_on`` (source), and the published models as rows of
their own (``source`` = "published"; issue 19).

May import: the standard library, yaml, pandas (inside the functions that build tables).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

DATA_FILE = "data/published.yaml"
_FIELDS = {"quantity", "value", "range", "min", "unit", "paper", "where", "models", "model", "kind", "secondary",
           "source", "reading", "note"}
_KINDS = ("mixed", "restricted")


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
        bound), plus ``unit``, ``paper`` (the title), ``paper_key``, ``where``, ``models`` (strings),
        ``model`` (the model's short name when the value belongs to one model, e.g. "Pythia-410M"; else ""),
        ``kind`` ("mixed" / "restricted" prompt set when the value belongs to one; else ""), ``secondary``
        (True: found only in a secondary source, named in ``source``) and optionally ``reading`` / ``note``.

    Raises:
        PublishedDataError: unknown field, missing source, an entry with no number or two kinds of number,
            a paper key not listed under ``papers``, the same quantity twice for the same models, lo > hi, a
            ``kind`` other than mixed / restricted, or ``secondary: true`` without a ``source``.
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
        if e.get("kind") and e["kind"] not in _KINDS:
            raise PublishedDataError(f"{where} ({q}): kind {e['kind']!r} must be one of {list(_KINDS)}")
        if e.get("secondary") and not e.get("source"):
            raise PublishedDataError(f"{where} ({q}): secondary: true needs a 'source' (where the number was found)")
        ent = dict(e, paper=str(papers[e["paper"]]), paper_key=e["paper"], model=str(e.get("model") or ""),
                   kind=str(e.get("kind") or ""), secondary=bool(e.get("secondary", False)))
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


def load_papers(path: str | None = None) -> dict[str, str]:
    """The ``papers`` of the data file: key (e.g. "paper3", as in claims.yaml) -> title and authors."""
    p = Path(path) if path else _default_path()
    return {str(k): str(v) for k, v in ((yaml.safe_load(p.read_text(encoding="utf-8")) or {}).get("papers")
                                        or {}).items()}


def _num(v: float) -> str:
    return f"{v:.3g}"


def value_text(e: dict) -> str:
    """An entry's number as text: "0.87-1.12" (range), "> 0.985" (min) or "0.007" (value); "(secondary)"
    appended for an entry found only in a secondary source."""
    if "range" in e:
        s = f"{_num(e['range'][0])}-{_num(e['range'][1])}"
    elif "min" in e:
        s = f"> {_num(e['min'])}"
    else:
        s = _num(e["value"])
    return s + " (secondary)" if e.get("secondary") else s


def source_text(e: dict) -> str:
    """Where an entry is published: "paper, where", plus "; secondary source: ..." for a secondary entry."""
    s = f"{e['paper']}, {e['where']}"
    return s + f"; secondary source: {e['source']}" if e.get("secondary") else s


def published_text(quantity: str, *, path: str | None = None) -> str:
    """The published value of ``quantity`` as text ("0.87-1.12", "> 0.985", "0.007"); with one entry per
    model, "value (models); value (models)"; "" if the file holds none."""
    es = load_published(path).get(quantity, [])
    if len(es) == 1:
        return value_text(es[0])
    return "; ".join(f"{value_text(e)} ({e['models']})" for e in es)


def published_on(quantity: str, *, path: str | None = None) -> str:
    """What the published value of ``quantity`` was measured on and where it is published:
    "models (paper, where)"; "" if none."""
    es = load_published(path).get(quantity, [])
    if len(es) == 1:
        e = es[0]
        return f"{e['models']} ({source_text(e)})"
    return "; ".join(sorted({source_text(e) for e in es}))


def model_key(name) -> str:
    """Normalized model name for matching ours to a published one: lower case, letters and digits only
    ("Pythia-410M" and "pythia-410m" -> "pythia410m")."""
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def matching_entries(quantity: str, model, kind: str | None = None, *, path: str | None = None) -> list[dict]:
    """Entries of ``quantity`` published for ``model`` (by :func:`model_key`) and, when both name one, the same
    prompt-set ``kind`` (mixed / restricted). An entry without a ``model`` (a range over several models, e.g.
    LSM's six transformers) matches no row: it is compared, not attached (issue 19)."""
    out = []
    for e in load_published(path).get(quantity, []):
        if not e["model"] or model_key(e["model"]) != model_key(model):
            continue
        if kind and e["kind"] and kind != e["kind"]:
            continue
        out.append(e)
    return out


def comparison_entries(quantity: str, model, kind: str | None = None, *,
                       path: str | None = None) -> tuple[list[dict], bool]:
    """The entries to compare a measurement of ``model`` with: ``(entries, same_model)``.

    The entries published for ``model`` (:func:`matching_entries`; same_model True) when the file has any;
    else the per-model entries of the other published models (same_model False: a comparison across models);
    else the entries that name no model (a range over several models, e.g. LSM's six transformers). ``kind``
    (mixed / restricted) keeps only entries of that kind or of none. ``[]`` when the file has no entry."""
    own = matching_entries(quantity, model, kind, path=path)
    if own:
        return own, True
    es = [e for e in load_published(path).get(quantity, []) if not kind or e["kind"] in ("", kind)]
    named = [e for e in es if e["model"]]
    return (named or es), False


def _row_label(e: dict) -> str:
    return e["model"] or e["models"]


def add_published(df, mapping: dict[str, str], *, path: str | None = None, model_col: str = "model",
                  kind_col: str | None = None, rows: bool = False):
    """Published values beside and below our rows (issue 19: matched by model and prompt-set kind).

    Args:
        df: pandas DataFrame of measured rows with a ``model_col`` column.
        mapping: measured column -> quantity of the data file; columns absent from ``df`` are skipped.
        model_col: the column naming the model of a row.
        kind_col: a column holding "mixed" / "restricted" per row (e.g. Table 1's ``role``), matched against
            an entry's ``kind``; None: the quantity itself is kind-specific (e.g. pc12_restricted).
        rows: also append the published models as rows of their own (``source`` = "published", the model's
            published name in ``model_col``, the entry's kind in ``kind_col``, the published number in the
            measured column when it is a single value, its text in ``<col>_published``).

    Returns:
        a copy of ``df`` with ``<col>_published`` (value text of the entry published for the row's model and
        kind, "" when none: a value is never attached by quantity alone) and ``<col>_published_on`` (paper,
        where; secondary source) right after each measured column; a ``source`` column ("measured" unless
        ``df`` already has one); with ``rows``, one appended row per published model (and kind), each published
        value once, ``secondary`` (True where any value of the row is from a secondary source) and
        ``published_source`` (the row's sources, " | "-separated).
    """
    import pandas as pd

    d = df.copy()
    if "source" not in d.columns:
        d["source"] = "measured"
    cols = [c for c in mapping if c in d.columns]
    for col in cols:
        q = mapping[col]
        hits = [matching_entries(q, r[model_col], r[kind_col] if kind_col else None, path=path)
                for _, r in d.iterrows()]
        pos = list(d.columns).index(col) + 1
        d.insert(pos, f"{col}_published", ["; ".join(value_text(e) for e in h) for h in hits])
        d.insert(pos + 1, f"{col}_published_on", ["; ".join(source_text(e) for e in h) for h in hits])
    if not rows:
        return d
    pub: dict[tuple, dict] = {}
    for col in cols:
        for e in load_published(path).get(mapping[col], []):
            key = (_row_label(e), e["kind"] if kind_col else "")
            r = pub.setdefault(key, {model_col: key[0], "source": "published", "secondary": False,
                                     **({kind_col: key[1] or None} if kind_col else {})})
            if "value" in e:
                r[col] = e["value"]
            r[f"{col}_published"] = value_text(e)
            r[f"{col}_published_on"] = f"{e['models']} ({source_text(e)})"
            r["secondary"] = r["secondary"] or e["secondary"]
            r["published_source"] = " | ".join(dict.fromkeys(filter(None, [r.get("published_source"),
                                                                            source_text(e)])))
    if "secondary" not in d.columns:
        d["secondary"] = False
    out = pd.concat([d, pd.DataFrame(list(pub.values()), columns=None)], ignore_index=True)
    for col in cols:
        for c in (f"{col}_published", f"{col}_published_on"):
            out[c] = out[c].fillna("")
    return out


def published_table(*, path: str | None = None):
    """Every entry of the data file as one row (pandas DataFrame): quantity, model, kind, models, value, lo, hi
    (range; ``min`` entries: lo = min, hi NaN), text (as shown in the tables), unit, paper, where, secondary,
    source, reading, note. Written as ``results/summary/published.csv`` so that every entry reaches a table."""
    import pandas as pd

    recs = []
    for q, es in load_published(path).items():
        for e in es:
            lo, hi = (e["range"] if "range" in e else (e.get("min", float("nan")), float("nan")))
            recs.append(dict(quantity=q, model=e["model"], kind=e["kind"], models=e["models"],
                             value=e.get("value", float("nan")), lo=lo, hi=hi, text=value_text(e), unit=e["unit"],
                             paper=e["paper"], where=e["where"], secondary=e["secondary"],
                             source=str(e.get("source") or ""), reading=str(e.get("reading") or ""),
                             note=str(e.get("note") or "")))
    return pd.DataFrame(recs)
