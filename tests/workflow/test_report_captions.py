"""Every report caption renders clean (issue 11, point 7): Jinja first (as Snakemake does, with the
``snakemake`` object of a job), then docutils' HTML writer at its default report level (warnings and errors,
the messages that the HTML shows); any such system message fails."""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

import jinja2
import pytest
from docutils.core import publish_parts

REPORT = Path(__file__).resolve().parents[2] / "workflow" / "report"
CAPTIONS = sorted(REPORT.glob("*.rst"))


class _Dummy:
    """Any attribute / item is a printable dummy value (a wildcard, param or config entry that exists)."""

    def __getattr__(self, name):
        return _Dummy()

    def __getitem__(self, key):
        return _Dummy()

    def __iter__(self):
        return iter(())

    def __str__(self):
        return "dummy_value"


def _snakemake_objects():
    from snakemake.iocontainers import Namedlist

    # as Snakemake builds it for a job whose rule has no wildcards (e.g. an aggregate): a missing
    # attribute renders empty, which is what broke ``{{ snakemake.wildcards.table }}`` in a literal
    empty = type("S", (), {"wildcards": Namedlist(), "params": Namedlist(), "input": Namedlist(["in.csv"]),
                           "output": Namedlist(["results/summary/table.csv"]), "config": {}, "rule": "r"})()
    out = {"job without wildcards": empty, "dummy values": _Dummy()}
    for fam in ("bayes", "lsm", "sula", "wind_tunnel"):  # the branches of summary_table.rst (params.family of the rules aggregate_<family>)
        out[f"family {fam}"] = type("S", (), {"wildcards": Namedlist(fromdict={"table": "margins"}),
                                              "params": Namedlist(fromdict={"family": fam}),
                                              "output": Namedlist(["results/summary/margins.csv"]),
                                              "input": Namedlist(), "config": {}, "rule": "aggregate"})()
    return out


CONTEXTS = ["job without wildcards", "dummy values", "family bayes", "family lsm", "family sula",
            "family wind_tunnel"]


warnings.filterwarnings("ignore", message=".*writer_name.*", category=PendingDeprecationWarning)


def _render(text: str, snakemake) -> str:
    # Snakemake appends link targets to every caption before rendering
    text += "\n\n.. _Workflow: javascript:show_panel('workflow')\n.. _Statistics: javascript:show_panel('statistics')\n"
    return jinja2.Environment().from_string(text).render(snakemake=snakemake, categories={}, files=[])


@pytest.mark.parametrize("path", CAPTIONS, ids=[p.name for p in CAPTIONS])
@pytest.mark.parametrize("context", CONTEXTS)
def test_caption_renders_without_docutils_messages(path, context):
    html_text = _render(path.read_text(encoding="utf-8"), _snakemake_objects()[context])
    stream = io.StringIO()
    parts = publish_parts(html_text, writer_name="html",
                          settings_overrides={"warning_stream": stream, "report_level": 2, "halt_level": 5})
    assert stream.getvalue() == "", f"{path.name}: {stream.getvalue()}"
    assert "system-message" not in parts["body"] and "problematic" not in parts["body"]


def test_the_test_catches_the_known_faults():
    bad = ["MAE |H_model - H_Bayes| in bits.", "Table ``{{ snakemake.wildcards.table }}`` here."]
    for text in bad:
        stream = io.StringIO()
        publish_parts(_render(text, _snakemake_objects()["job without wildcards"]), writer_name="html",
                      settings_overrides={"warning_stream": stream, "report_level": 2, "halt_level": 5})
        assert stream.getvalue(), text


def test_every_table_caption_states_the_depth_convention():
    for name in ("bayes_tables.rst", "summary_table.rst", "margin_vs_perplexity_table.rst", "value_manifold.rst",
                 "intrinsic_dimension.rst", "checkpoint_trajectory.rst"):
        text = " ".join((REPORT / name).read_text().split())
        assert "blocks applied / L" in text, name
    for p in CAPTIONS:
        text = " ".join(p.read_text().split())
        # every bootstrap interval is a basic one except the expressibility-gap slope's (said so)
        assert "percentile-bootstrap" not in text or p.name == "expressibility_gap.rst", p.name


def test_summary_caption_branches_name_the_new_columns():
    ctx = _snakemake_objects()
    text = (REPORT / "summary_table.rst").read_text()
    lsm = " ".join(_render(text, ctx["family lsm"]).split())
    bayes = " ".join(_render(text, ctx["family bayes"]).split())
    other = " ".join(_render(text, ctx["family sula"]).split())
    assert "mle_lb" in lsm and "hard_core_thresholds" in lsm and "published.csv" in lsm
    assert "top 10 eigenvalues" in bayes and "mle_lb" not in bayes
    assert "results/summary/<table>.csv" in other and "docs/outputs.md" in other
    for t in (lsm, bayes, other):
        assert "bias-corrected" in t and "blocks applied / L" in t


# --- no typed-in numbers (issue 48) ------------------------------------------------------------------------------
# A number from a paper or a run in a caption or a table legend goes stale the day the data file or the run changes.
# Captions cannot read a run's tables (Snakemake renders them with the job's params and config only): they name the
# table and column holding the value. What may appear as a decimal or a percent: section numbers, model names, and
# the settings and conventions listed here (each checked against its home below).

#: a percent (also the end of a range, 1-3%), or a decimal not inside a name (Llama-3.2-1B) or a longer number
TYPED_NUMBER = re.compile(r"(?<![\w.])\d*\.?\d+\s?%|(?<![\w.\-])\d*\.\d+(?![\w.])")
#: settings and conventions: pattern -> why it is allowed
ALLOWED = {
    r"\bsecs?\.\s+\d+(?:\.\d+)*(?:(?:\s*[/,-]\s*|\s+and\s+)\d+(?:\.\d+)*)*": "a paper's section number",
    r"95%\s+(?:basic|paired|CIs?\b)": "the interval coverage (schema default of every ci key: checked below)",
    r"Pr\(m\s+<\s+0\.5\)": "margins.threshold (schema default, checked below)",
    r"default\s+0\.05\s+and\s+0\.1\s+logits": "margins.hard_core_thresholds (schema default, checked below)",
    r"5%\s+margin\s+quantile": "margins.hard_core_quantile (schema default, checked below)",
    r"5/25/50/75/95%\s+quantiles": "measures.margins.QUANTILES (checked below)",
    r"p\s+<\s+0\.05": "the conventional significance level the scaling rules name",
    r"(?:relative\s+depth|(?:last\s+block|final\s+layer)\s+is)\s+1\.0": "the depth convention (blocks applied / L)",
}


def _typed_numbers(text: str) -> list[str]:
    t = " ".join(text.split())
    for pat in ALLOWED:
        t = re.sub(pat, " ", t)
    return [t[max(0, m.start() - 30):m.end() + 10] for m in TYPED_NUMBER.finditer(t)]


def _legend_strings() -> list[str]:
    """String literals of analyses/bayes_tables.py that are not docstrings (the Table 1 / 2 legends and notes; the
    random-init note's numbers come from published.yaml and the table at run time)."""
    import ast

    from llmgeom.analyses import bayes_tables

    tree = ast.parse(Path(bayes_tables.__file__).read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


@pytest.mark.parametrize("path", CAPTIONS, ids=[p.name for p in CAPTIONS])
def test_caption_types_no_paper_or_run_number(path):
    assert _typed_numbers(path.read_text(encoding="utf-8")) == [], path.name


def test_bayes_table_legends_type_no_paper_or_run_number():
    bad = [h for s in _legend_strings() for h in _typed_numbers(s)]
    assert bad == []


def test_the_typed_number_check_catches_the_old_texts_and_its_settings_are_the_defaults():
    old = ["Published random-init baselines of 0.35-0.45 cannot be reproduced",
           "0.033 at d_model = 576", "SmolLM2: 0.068", "slopes 0.87-1.12 with R^2 > 0.985", "ID 1-3% of d_model",
           'what tests "about 5% of positions"']
    assert [t for t in old if not _typed_numbers(t)] == []
    assert _typed_numbers("Paper III sec. 4.5-4.6, Llama-3.2-1B, 95% basic-bootstrap CI, Pr(m < 0.5)") == []
    from llmgeom.measures.margins import QUANTILES
    from llmgeom.pipeline.schema import read_schema

    sections = read_schema()["properties"]
    mg = {k: v["default"] for k, v in sections["margins"]["properties"].items()}
    assert (mg["threshold"], mg["hard_core_thresholds"], mg["hard_core_quantile"]) == (0.5, [0.05, 0.1], 0.05)
    assert QUANTILES == (0.05, 0.25, 0.50, 0.75, 0.95)
    cis = {name: sec["properties"]["ci"]["default"] for name, sec in sections.items()
           if "ci" in sec.get("properties", {})}
    assert len(cis) >= 4 and set(cis.values()) == {0.95}, cis
