"""Every report caption renders clean (issue 11, point 7): Jinja first (as Snakemake does, with the
``snakemake`` object of a job), then docutils' HTML writer at its default report level (warnings and errors,
the messages that the HTML shows); any such system message fails."""

from __future__ import annotations

import io
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
    assert "mle_lb" in lsm and "hard_core_thresholds" in lsm and "0.87-1.12" in lsm
    assert "top 10 eigenvalues" in bayes and "mle_lb" not in bayes
    assert "results/summary/<table>.csv" in other and "docs/outputs.md" in other
    for t in (lsm, bayes, other):
        assert "bias-corrected" in t and "blocks applied / L" in t
