"""The claims data file ``llmgeom/data/claims.yaml``: its location, its fields and a checked reader.

Light (yaml only), so that the workflow can read which tables the claims need while it builds the DAG; the rule
engine that decides each claim is :mod:`llmgeom.analyses.claims` (its ``RULES`` has exactly the kinds of
:data:`RULE_KINDS`; a test checks).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

DATA_FILE = "data/claims.yaml"
#: decision rules a claim may name (``rule.kind``); llmgeom.analyses.claims.RULES implements each
RULE_KINDS = ("threshold", "ci_excludes_zero_positive", "ci_excludes_zero_negative", "inside_published_range",
              "sign_of", "compare_columns", "category_in", "same_verdict_all_estimators", "group_greater",
              "interval_contains_reference", "size_trend", "size_constancy")
_FIELDS = {"id", "sentence", "paper", "section", "table", "where", "by", "value", "lo", "hi", "context",
           "published", "kind", "scope", "requires", "unlike", "rule", "note", "null_value", "null_note",
           "not_applicable", "resampling"}


class ClaimsDataError(ValueError):
    """The claims file is malformed (message names the file, the claim and the field)."""


def claims_file() -> Path:
    """Path of the package's claims file ``llmgeom/data/claims.yaml`` (an input of rule ``claims``)."""
    return Path(str(resources.files("llmgeom") / DATA_FILE))


@lru_cache(maxsize=4)
def _load(path: str) -> tuple:
    p = Path(path)
    doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    out, seen = [], set()
    for i, c in enumerate(doc.get("claims") or []):
        where = f"{p}: claims[{i}]"
        if not isinstance(c, dict) or "id" not in c:
            raise ClaimsDataError(f"{where}: each claim must be a mapping with an 'id'")
        bad = set(c) - _FIELDS
        if bad:
            raise ClaimsDataError(f"{where} ({c['id']}): unknown field(s) {sorted(bad)}; valid: {sorted(_FIELDS)}")
        for k in ("sentence", "paper", "section", "table", "value", "rule"):
            if not c.get(k):
                raise ClaimsDataError(f"{where} ({c['id']}): missing '{k}'")
        if c["id"] in seen:
            raise ClaimsDataError(f"{where}: claim id {c['id']!r} appears twice")
        seen.add(c["id"])
        kind = (c["rule"] or {}).get("kind")
        if kind not in RULE_KINDS:
            raise ClaimsDataError(f"{where} ({c['id']}): rule kind {kind!r} unknown; valid: {sorted(RULE_KINDS)}")
        if kind == "same_verdict_all_estimators" and (c["rule"].get("inner") or {}).get("kind") not in RULE_KINDS:
            raise ClaimsDataError(f"{where} ({c['id']}): same_verdict_all_estimators needs inner: {{kind: ...}} "
                                  f"with a kind of {sorted(RULE_KINDS)}")
        out.append(c)
    return tuple(out)


def load_claims(path: str | None = None) -> list[dict]:
    """The claims of ``llmgeom/data/claims.yaml`` (or ``path``), in file order.

    Returns:
        list of dicts with the fields described at the top of the file (id, sentence, paper, section, table,
        value, rule, ...).

    Raises:
        ClaimsDataError: unknown field, missing field, duplicate id, unknown rule kind.
    """
    return [dict(c) for c in _load(str(path or claims_file()))]
