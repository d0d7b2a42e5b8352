"""Published values (package data ``llmgeom/data/published.yaml``) and their rendering beside our numbers.

The numbers live in the data file, never in code (DESIGN.md sec. 3, "Published values"); every entry
names its paper, where in the paper, and the model(s) it was measured on. Tables add, beside a measured
column ``x``, the text columns ``x_published`` (value or range of the entry published for the same model and
prompt-set kind; "" when there is none) and ``x_published_on`` (source), and the published models as rows of
their own (``source`` = "published").

Every entry says what kind of source it is (``source_kind``): ``paper`` (the paper's text,
arXiv version in ``where``), ``official_code`` (the official code's committed output: repository, file,
commit date in ``source``), ``secondary`` (a secondary source quoting the paper), ``replication`` (an
independent replication) or ``other_study`` (another study of another model). Verdicts decide on the paper's
tier (paper, else secondary; official code only where neither exists: :func:`comparison_entries`); the other
kinds are shown beside it (:func:`entries_by_kind`, ``add_published(also=...)``), never folded into its range.

May import: the standard library, yaml, pandas (inside the functions that build tables).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

DATA_FILE = "data/published.yaml"
_FIELDS = {"quantity", "value", "range", "min", "unit", "paper", "where", "models", "model", "kind", "source_kind",
           "source", "layer", "reading", "note"}
_KINDS = ("mixed", "restricted")
#: the kinds of source an entry can have, in the order tables show them
SOURCE_KINDS = ("paper", "official_code", "secondary", "replication", "other_study")
#: the kinds that are the paper's own numbers (derived ``secondary`` is False for them)
PRIMARY_KINDS = ("paper", "official_code")
#: the tiers :func:`comparison_entries` decides on, first non-empty one wins: the paper's values (its text, or
#: a secondary source quoting it), else the official code's committed output. Replications and other studies
#: never decide a verdict.
DECIDING_TIERS = (("paper", "secondary"), ("official_code",))
_KIND_LABEL = {"paper": "paper", "official_code": "official code", "secondary": "secondary source",
               "replication": "independent replication", "other_study": "other study"}


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
        ``kind`` ("mixed" / "restricted" prompt set when the value belongs to one; else ""), ``source_kind``
        (one of :data:`SOURCE_KINDS`), ``source`` (str, "" for a paper entry: who quotes it / the repository,
        file and commit date / the replication or study), ``secondary`` (bool, derived: True unless
        source_kind is paper or official_code; kept for readers of the old field), ``layer`` (int or None:
        the layer a per-layer value belongs to) and optionally ``reading`` / ``note``.

    Raises:
        PublishedDataError: unknown field (the old ``secondary: true`` included: use ``source_kind``), missing
            source, a missing or unknown ``source_kind`` (the message names the entry and the allowed kinds), a
            ``paper`` entry whose ``where`` names no arXiv version, a non-paper entry without ``source``, an
            entry with no number or two kinds of number, a paper key not listed under ``papers``, the same
            quantity twice for the same models, source kind and layer, lo > hi, or a ``kind`` other than
            mixed / restricted.
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
            hint = " ('secondary' is now source_kind: secondary)" if "secondary" in bad else ""
            raise PublishedDataError(f"{where} ({q}): unknown field(s) {sorted(bad)}{hint}; valid: {sorted(_FIELDS)}")
        sk = e.get("source_kind")
        if sk not in SOURCE_KINDS:
            what = "missing 'source_kind'" if sk is None else f"unknown source_kind {sk!r}"
            raise PublishedDataError(f"{where} ({q}, models {e.get('models')!r}): {what}; allowed kinds: "
                                     f"{list(SOURCE_KINDS)}")
        kinds = [k for k in ("value", "range", "min") if k in e]
        if len(kinds) != 1:
            raise PublishedDataError(f"{where} ({q}): needs exactly one of value / range / min, got {kinds}")
        for k in ("paper", "where", "models", "unit"):
            if not e.get(k):
                raise PublishedDataError(f"{where} ({q}): missing '{k}' (every published value names its source)")
        if e["paper"] not in papers:
            raise PublishedDataError(f"{where} ({q}): paper {e['paper']!r} is not listed under 'papers' "
                                     f"({sorted(papers)})")
        layer = None if e.get("layer") is None else int(e["layer"])
        if any(o["models"] == e["models"] and o["source_kind"] == sk and o["layer"] == layer
               for o in out.get(q, [])):
            raise PublishedDataError(f"{where}: quantity {q!r} appears twice for models {e['models']!r} "
                                     f"(source_kind {sk}, layer {layer})")
        if e.get("kind") and e["kind"] not in _KINDS:
            raise PublishedDataError(f"{where} ({q}): kind {e['kind']!r} must be one of {list(_KINDS)}")
        if sk != "paper" and not e.get("source"):
            raise PublishedDataError(f"{where} ({q}): source_kind {sk} needs a 'source' (who quotes it / repository, "
                                     "file and commit date / the replication or study)")
        if sk == "paper" and "arxiv" not in str(e["where"]).lower():
            raise PublishedDataError(f"{where} ({q}): source_kind paper needs the arXiv version in 'where'")
        ent = dict(e, paper=str(papers[e["paper"]]), paper_key=e["paper"], model=str(e.get("model") or ""),
                   kind=str(e.get("kind") or ""), source_kind=sk, source=str(e.get("source") or ""),
                   secondary=sk not in PRIMARY_KINDS, layer=layer)
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


_MODEL_FIELDS = {"n_params", "d_model", "n_layers", "source"}


@lru_cache(maxsize=4)
def load_published_models(path: str | None = None) -> dict[str, dict]:
    """Size facts of the papers' models (the ``models`` section of the data file): the scaling study's
    x axis for the published series.

    Args:
        path: the data file; default the package's ``llmgeom/data/published.yaml``.

    Returns:
        {model_key(name): {"model": name, "n_params": float (total parameters), "d_model": int or None,
        "n_layers": int or None, "source": str (where the numbers come from)}}; {} without a section.

    Raises:
        PublishedDataError: an entry that is not a mapping, an unknown field, or no n_params / source.
    """
    p = Path(path) if path else _default_path()
    out = {}
    for name, e in ((yaml.safe_load(p.read_text(encoding="utf-8")) or {}).get("models") or {}).items():
        where = f"{p}: models.{name}"
        if not isinstance(e, dict) or set(e) - _MODEL_FIELDS or not e.get("n_params") or not e.get("source"):
            raise PublishedDataError(f"{where}: needs n_params and source (fields: {sorted(_MODEL_FIELDS)}), got {e!r}")
        out[model_key(name)] = {"model": str(name), "n_params": float(e["n_params"]),
                                "d_model": int(e["d_model"]) if e.get("d_model") else None,
                                "n_layers": int(e["n_layers"]) if e.get("n_layers") else None,
                                "source": str(e["source"])}
    return out


def load_papers(path: str | None = None) -> dict[str, str]:
    """The ``papers`` of the data file: key (e.g. "paper3", as in claims.yaml) -> title and authors."""
    p = Path(path) if path else _default_path()
    return {str(k): str(v) for k, v in ((yaml.safe_load(p.read_text(encoding="utf-8")) or {}).get("papers")
                                        or {}).items()}


def _num(v: float) -> str:
    return f"{v:.3g}"


_VALUE_TAG = {"secondary": " (secondary)", "replication": " (replication)", "other_study": " (other study)"}


def value_text(e: dict) -> str:
    """An entry's number as text: "0.87-1.12" (range), "> 0.985" (min) or "0.007" (value), with " (secondary)",
    " (replication)" or " (other study)" appended by ``source_kind`` (nothing for paper and official_code: the
    official code's values are told apart by their column / :func:`source_text`)."""
    if "range" in e:
        s = f"{_num(e['range'][0])}-{_num(e['range'][1])}"
    elif "min" in e:
        s = f"> {_num(e['min'])}"
    else:
        s = _num(e["value"])
    return s + _VALUE_TAG.get(_kind(e), "")


def _kind(e: dict) -> str:
    return e.get("source_kind") or ("secondary" if e.get("secondary") else "paper")


def source_text(e: dict) -> str:
    """Where an entry is published, with its kind: "paper, where" for the paper's text; "paper, where;
    official code: repository, file, commit date" / "; secondary source: ..." / "; independent replication: ..."
    / "; other study: ..." for the other kinds (``source`` after the kind's label)."""
    s = f"{e['paper']}, {e['where']}"
    k = _kind(e)
    return s if k == "paper" else s + f"; {_KIND_LABEL[k]}: {e.get('source') or ''}"


def _shown(quantity: str, path: str | None) -> list[dict]:
    tier = deciding_kinds(quantity, path=path)
    return [e for e in load_published(path).get(quantity, []) if e["source_kind"] in tier]


def published_text(quantity: str, *, path: str | None = None) -> str:
    """The published value of ``quantity`` as text ("0.87-1.12", "> 0.985", "0.007"); with one entry per
    model, "value (models); value (models)"; "" if the file holds none. Only the quantity's deciding tier
    (:func:`deciding_kinds`: the paper's values, else the official code's), as ``*_published`` columns show
    it; the other kinds: :func:`entries_by_kind`."""
    es = _shown(quantity, path)
    if len(es) == 1:
        return value_text(es[0])
    return "; ".join(f"{value_text(e)} ({e['models']})" for e in es)


def published_on(quantity: str, *, path: str | None = None) -> str:
    """What the published value of ``quantity`` (:func:`published_text`) was measured on and where it is
    published: "models (paper, where[; kind: source])"; "" if none."""
    es = _shown(quantity, path)
    if len(es) == 1:
        e = es[0]
        return f"{e['models']} ({source_text(e)})"
    return "; ".join(sorted({source_text(e) for e in es}))


def model_key(name) -> str:
    """Normalized model name for matching ours to a published one: lower case, letters and digits only
    ("Pythia-410M" and "pythia-410m" -> "pythia410m")."""
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


def matching_entries(quantity: str, model, kind: str | None = None, *, path: str | None = None,
                     source_kinds=None) -> list[dict]:
    """Entries of ``quantity`` published for ``model`` (by :func:`model_key`) and, when both name one, the same
    prompt-set ``kind`` (mixed / restricted). An entry without a ``model`` (a range over several models, e.g.
    LSM's six transformers) matches no row: it is compared, not attached. ``source_kinds`` (an
    iterable of :data:`SOURCE_KINDS`; None = all) keeps only entries of those kinds; file order otherwise."""
    out = []
    for e in load_published(path).get(quantity, []):
        if not e["model"] or model_key(e["model"]) != model_key(model):
            continue
        if kind and e["kind"] and kind != e["kind"]:
            continue
        if source_kinds is not None and e["source_kind"] not in source_kinds:
            continue
        out.append(e)
    return out


def deciding_kinds(quantity: str, *, path: str | None = None) -> tuple[str, ...]:
    """The source kinds whose entries of ``quantity`` decide verdicts and fill ``*_published``: the first tier
    of :data:`DECIDING_TIERS` that the file holds any entry of (("paper", "secondary"), else
    ("official_code",)); () when the quantity has only replication / other_study entries or none. Chosen per
    quantity over all its models, so an official-code number for one model never replaces or widens the
    paper's numbers for the others."""
    have = {e["source_kind"] for e in load_published(path).get(quantity, [])}
    for tier in DECIDING_TIERS:
        if have & set(tier):
            return tier
    return ()


def entries_by_kind(quantity: str, model=None, kind: str | None = None, *,
                    path: str | None = None) -> dict[str, list[dict]]:
    """The entries of ``quantity`` grouped by ``source_kind``, to show the paper's and the official code's
    values side by side.

    Args:
        quantity: a quantity of the data file.
        model: our model's name (matched by :func:`model_key`, as :func:`matching_entries`); None: every entry
            of the quantity, whatever model it names (including ranges over several models).
        kind: prompt-set kind ("mixed" / "restricted"): keeps entries of that kind or of none; None: all.

    Returns:
        {source_kind: [entry, ...]} with only the kinds present, in :data:`SOURCE_KINDS` order (paper,
        official_code, secondary, replication, other_study); {} when none. E.g. ("paper3_table1_pc12",
        "pythia-410m", "mixed") -> {"paper": [0.997 entry], "official_code": [0.277 entry]}.
    """
    if model is None:
        es = [e for e in load_published(path).get(quantity, []) if not kind or e["kind"] in ("", kind)]
    else:
        es = matching_entries(quantity, model, kind, path=path)
    return {k: [e for e in es if e["source_kind"] == k] for k in SOURCE_KINDS
            if any(e["source_kind"] == k for e in es)}


def comparison_entries(quantity: str, model, kind: str | None = None, *,
                       path: str | None = None) -> tuple[list[dict], bool]:
    """The entries to compare a measurement of ``model`` with (the range of ``inside_published_range``):
    ``(entries, same_model)``.

    Only entries of the quantity's deciding tier (:func:`deciding_kinds`): the paper's values (source_kind
    paper, or a secondary source quoting the paper) when the file holds any for the quantity, else the official
    code's committed output (e.g. Paper I's wind-tunnel README, Cheng et al.'s json). Within that tier: the
    entries published for ``model`` (:func:`matching_entries`; same_model True) when there are any; else the
    per-model entries of the other published models (same_model False: a comparison across models); else the
    entries that name no model (a range over several models, e.g. LSM's six transformers). ``kind``
    (mixed / restricted) keeps only entries of that kind or of none.

    Decided explicitly: official-code entries of a quantity the paper also gives (e.g.
    Pythia-410M PC1+PC2 0.277 beside Table 1's 0.997), replications and other studies (e.g. Brett 2026's own
    Qwen3.5-4B-Base row) never enter the range, so adding them changes no existing verdict; show them with
    :func:`entries_by_kind`. ``[]`` when the tier has no entry."""
    tier = deciding_kinds(quantity, path=path)
    own = matching_entries(quantity, model, kind, path=path, source_kinds=tier)
    if own:
        return own, True
    es = [e for e in load_published(path).get(quantity, [])
          if e["source_kind"] in tier and (not kind or e["kind"] in ("", kind))]
    named = [e for e in es if e["model"]]
    return (named or es), False


def _row_label(e: dict) -> str:
    return e["model"] or e["models"]


def add_published(df, mapping: dict[str, str], *, path: str | None = None, model_col: str = "model",
                  kind_col: str | None = None, rows: bool = False, also=()):
    """Published values beside and below our rows (matched by model and prompt-set kind,
    and by source kind).

    Args:
        df: pandas DataFrame of measured rows with a ``model_col`` column.
        mapping: measured column -> quantity of the data file; columns absent from ``df`` are skipped.
        model_col: the column naming the model of a row.
        kind_col: a column holding "mixed" / "restricted" per row (e.g. Table 1's ``role``), matched against
            an entry's ``kind``; None: the quantity itself is kind-specific (e.g. pc12_restricted).
        rows: also append the published models as rows of their own (``source`` = "published", the model's
            published name in ``model_col``, the entry's kind in ``kind_col``, the published number in the
            measured column when it is a single value, its text in ``<col>_published``).
        also: further source kinds (of :data:`SOURCE_KINDS`, e.g. ("official_code",)) shown side by side with
            the deciding tier: per kind ``k`` the columns ``<col>_<k>`` (value text) and ``<col>_<k>_on``
            (source) after ``<col>_published_on``; with ``rows``, their entries as published rows of their own
            and a ``source_kind`` column (the entry's kind on published rows, "" on measured rows).

    Returns:
        a copy of ``df`` with ``<col>_published`` (value text of the entries of the quantity's deciding tier,
        :func:`deciding_kinds`, published for the row's model and kind; "" when none: a value is never attached
        by quantity alone, and an official-code value never stands in for the paper's) and
        ``<col>_published_on`` (paper, where; kind and source, :func:`source_text`) right after each measured
        column; a ``source`` column ("measured" unless ``df`` already has one); with ``rows``, one appended row
        per published model (and kind, and source kind), each published value once, ``secondary`` (True where
        any value of the row is not the paper's or the official code's own, i.e. the derived flag) and
        ``published_source`` (the row's sources, " | "-separated). Without ``also`` the output is what it was
        before source kinds existed.

    Raises:
        ValueError: a kind in ``also`` that is not one of :data:`SOURCE_KINDS`.
    """
    import pandas as pd

    also = tuple(also)
    bad = [k for k in also if k not in SOURCE_KINDS]
    if bad:
        raise ValueError(f"add_published(also=...): unknown source kind(s) {bad}; allowed: {list(SOURCE_KINDS)}")
    d = df.copy()
    if "source" not in d.columns:
        d["source"] = "measured"
    cols = [c for c in mapping if c in d.columns]
    for col in cols:
        q = mapping[col]
        tier = deciding_kinds(q, path=path)
        pos = list(d.columns).index(col) + 1
        for j, (suffix, kinds) in enumerate([("published", tier)] + [(k, (k,)) for k in also]):
            hits = [matching_entries(q, r[model_col], r[kind_col] if kind_col else None, path=path,
                                     source_kinds=kinds) for _, r in d.iterrows()]
            d.insert(pos + 2 * j, f"{col}_{suffix}", ["; ".join(value_text(e) for e in h) for h in hits])
            d.insert(pos + 2 * j + 1, f"{col}_{suffix}_on", ["; ".join(source_text(e) for e in h) for h in hits])
    if not rows:
        return d
    pub: dict[tuple, dict] = {}
    for col in cols:
        shown = set(deciding_kinds(mapping[col], path=path)) | set(also)
        for e in load_published(path).get(mapping[col], []):
            if e["source_kind"] not in shown:
                continue
            key = (_row_label(e), e["kind"] if kind_col else "", e["source_kind"] if also else "")
            r = pub.setdefault(key, {model_col: key[0], "source": "published", "secondary": False,
                                     **({kind_col: key[1] or None} if kind_col else {}),
                                     **({"source_kind": e["source_kind"]} if also else {})})
            if "value" in e:
                r[col] = e["value"]
            r[f"{col}_published"] = value_text(e)
            r[f"{col}_published_on"] = f"{e['models']} ({source_text(e)})"
            r["secondary"] = r["secondary"] or e["secondary"]
            r["published_source"] = " | ".join(dict.fromkeys(filter(None, [r.get("published_source"),
                                                                            source_text(e)])))
    if "secondary" not in d.columns:
        d["secondary"] = False
    if also and "source_kind" not in d.columns:
        d["source_kind"] = ""
    out = pd.concat([d, pd.DataFrame(list(pub.values()), columns=None)], ignore_index=True)
    for col in cols:
        for c in [f"{col}_published", f"{col}_published_on"] + [f"{col}_{k}{t}" for k in also for t in ("", "_on")]:
            out[c] = out[c].fillna("")
    return out


def published_table(*, path: str | None = None):
    """Every entry of the data file as one row (pandas DataFrame): quantity, model, kind, models, layer (None
    unless per-layer), value, lo, hi (range; ``min`` entries: lo = min, hi NaN), text (as shown in the tables),
    unit, paper, where, source_kind (:data:`SOURCE_KINDS`), secondary (derived: source_kind not paper /
    official_code), source, reading, note. Written as ``results/summary/published.csv`` so that every entry
    reaches a table."""
    import pandas as pd

    recs = []
    for q, es in load_published(path).items():
        for e in es:
            lo, hi = (e["range"] if "range" in e else (e.get("min", float("nan")), float("nan")))
            recs.append(dict(quantity=q, model=e["model"], kind=e["kind"], models=e["models"], layer=e["layer"],
                             value=e.get("value", float("nan")), lo=lo, hi=hi, text=value_text(e), unit=e["unit"],
                             paper=e["paper"], where=e["where"], source_kind=e["source_kind"],
                             secondary=e["secondary"], source=e["source"], reading=str(e.get("reading") or ""),
                             note=str(e.get("note") or "")))
    return pd.DataFrame(recs)
