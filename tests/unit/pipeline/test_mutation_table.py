"""The mutation table of the protections (tests/support/mutation_check.py, docs/testing.md) matches the code:
each entry's removed code is still there exactly as often as it says and every test it names exists, so the
table cannot go stale unseen; the committed table in docs/testing.md lists every entry, all killed. The mutation
runs themselves take minutes (``.venv/bin/python tests/support/mutation_check.py``) and are not part of the suite."""

from __future__ import annotations

import shutil
from pathlib import Path

import mutation_check as mc

REPO = Path(__file__).resolve().parents[3]


def test_every_entry_matches_the_code_and_names_real_tests():
    assert [mc.stale(m) for m in mc.MUTATIONS if mc.stale(m)] == []
    names = [m.name for m in mc.MUTATIONS]
    assert len(names) == len(set(names))
    # the protections issue 47 asks to prove, each with an entry
    for need in ("dir-owner", "dir-mode", "symlink", "base-owner", "o-excl-key", "key-check", "peer-check-client",
                 "peer-check-server", "message-size", "hmac", "space-reserve", "resume-sha256"):
        assert need in names, need


def test_an_entry_whose_code_changed_is_reported_stale(tmp_path):
    m = next(m for m in mc.MUTATIONS if m.name == "hmac")
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text((REPO / m.path).read_text().replace(m.old, m.old.replace("good", "ok")))
    for t in {t.split("::")[0] for t in m.tests}:
        (tmp_path / t).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / t, tmp_path / t)
    assert "occurs 0 times" in mc.stale(m, tmp_path)
    (tmp_path / m.path).write_text((REPO / m.path).read_text())
    assert mc.stale(m, tmp_path) == ""
    gone = mc.Mutation("x", "x", m.path, m.old, m.new, (m.tests[0] + "_renamed",))
    assert "defines no test" in mc.stale(gone, tmp_path)


def test_the_committed_table_lists_every_protection_killed():
    text = (REPO / "docs" / "testing.md").read_text()
    assert mc.BEGIN in text and mc.END in text
    table = text.split(mc.BEGIN, 1)[1].split(mc.END, 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| protection")]
    assert len(rows) == len(mc.MUTATIONS)
    for m in mc.MUTATIONS:
        row = next((r for r in rows if r.startswith(f"| {m.protection} |")), None)
        assert row is not None, m.name
        assert row.rstrip().endswith("| yes |"), row
