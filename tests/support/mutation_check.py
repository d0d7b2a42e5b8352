"""Every protection proven: remove one protection at a time in a scratch copy of the tree and run the tests that
claim it; a protection whose tests still pass is one that no test would miss.

    .venv/bin/python tests/support/mutation_check.py                 # all mutations, a table on stdout
    .venv/bin/python tests/support/mutation_check.py --only hmac     # the ones whose name contains "hmac"
    .venv/bin/python tests/support/mutation_check.py --write docs/testing.md   # also the table into the docs

Each entry of :data:`MUTATIONS` names a protection, the file that holds it, the exact code it removes (``old``,
which must occur exactly once: an entry that no longer matches the code fails loudly, so the table cannot go stale
silently) and what it puts there instead (``new``: the code without that one protection), and the tests that claim
it (pytest node ids). For each entry the script copies the tracked and untracked-not-ignored files of the tree
(``git ls-files -co --exclude-standard``) into a scratch directory, applies that one edit, and runs those tests
there (``PYTHONPATH=<scratch>/src``, this interpreter, ``-x -q -p no:cacheprovider``, a per-entry timeout);
"killed" = the tests failed. Before any mutation the same tests run on the unmutated copy and must pass (otherwise
a failure would prove nothing). Exit status 0 only when every mutation is killed.

The tests of the shared-node protections need root (a second local user); run this as root, as CI does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the markers between which ``--write`` puts the table (in docs/testing.md)
BEGIN, END = "<!-- mutation-table:begin -->", "<!-- mutation-table:end -->"


@dataclass(frozen=True)
class Mutation:
    """One protection removed: in ``path`` (relative to the repository), ``old`` (exactly once) becomes ``new``;
    ``tests`` (pytest node ids) claim the protection."""

    name: str
    protection: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


SN = "tests/unit/pipeline/test_shared_node.py"
MS = "tests/unit/pipeline/test_model_server.py"
FD = "tests/unit/extract/test_full_disk.py"
ST = "tests/unit/core/test_store.py"

#: the protections and the tests that claim them (see the module docstring)
MUTATIONS: tuple[Mutation, ...] = (
    # ---- full disks and durability (core/io.py, core/writer.py, pipeline/jobs.py)
    Mutation("space-reserve", "space reserve beside a partial output (released when the disk fills, so HDF5 can "
             "flush and close intact)", "src/llmgeom/core/io.py",
             "        if not self.nbytes:  # nothing to hold back: no file",
             "        if True:  # mutated: no reserve",
             (f"{FD}::test_a_full_disk_at_the_commit_keeps_every_committed_batch",)),
    Mutation("log-reserve", "room held back for the job's log (the DiskFullError reaches a log on the full disk)",
             "src/llmgeom/pipeline/jobs.py", "LOG_RESERVE = 64 << 10", "LOG_RESERVE = 0",
             (f"{FD}::test_run_logged_keeps_the_disk_full_error_when_its_log_is_full",)),
    Mutation("resume-sha256", "sha256 check of every committed batch on resume", "src/llmgeom/core/writer.py",
             """if batch_digest(items) != self.f["resume/sha256"][j].decode():""", "if False:",
             (f"{ST}::test_partial_from_other_settings_or_corrupted_is_discarded",)),
    Mutation("resume-code-hash", "the extraction's code hash in the resume key (a partial of other code is not "
             "resumed)", "src/llmgeom/extract/forward.py", "        code=source_sha256(*EXTRACTION_CODE)),",
             "        code=None),", (f"{ST}::test_partial_written_by_other_code_is_discarded",)),
    Mutation("fsync-before-rename", "the file's data flushed (fsync) before os.replace", "src/llmgeom/core/io.py",
             "    fsync_path(tmp)\n    os.replace(tmp, path)", "    os.replace(tmp, path)",
             (f"{FD}::test_the_data_reach_the_disk_before_the_rename",)),
    Mutation("server-log-unfailing", "the model server's prints never raise (a full server.log does not end the "
             "server)", "src/llmgeom/pipeline/model_server.py",
             "    sys.stdout, sys.stderr = unfailing(sys.stdout), unfailing(sys.stderr)", "    pass",
             (f"{FD}::test_model_server_survives_a_full_disk_under_its_log",)),
)


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = REPO / f
        if not src.is_file():
            continue
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / f)


def _apply(root: Path, m: Mutation) -> None:
    p = root / m.path
    text = p.read_text()
    n = text.count(m.old)
    if n != 1:
        raise SystemExit(f"mutation {m.name!r}: the code it removes occurs {n} times in {m.path} (must be once): "
                         "update MUTATIONS in tests/support/mutation_check.py to the current code")
    p.write_text(text.replace(m.old, m.new))


def _run_tests(root: Path, tests, timeout: float) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(root / "src"), HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    tail = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, tail[-1] if tail else ""


def run(mutations, *, timeout: float) -> list[dict]:
    """Each mutation in its own scratch copy; returns one dict per mutation (name, protection, tests, killed,
    rc, summary). Raises SystemExit when the unmutated tests fail or an entry no longer matches the code."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmgeom-mutation-") as tmp:
        base = Path(tmp) / "base"
        _copy_tree(base)
        os.chmod(tmp, 0o755)  # the second local user of the shared-node tests reads the copy
        for m in mutations:  # every entry checked against the code before any test runs
            if (base / m.path).read_text().count(m.old) != 1:
                _apply(base, m)  # raises SystemExit naming the entry
        tests = sorted({t for m in mutations for t in m.tests})
        rc, summary = _run_tests(base, tests, timeout * max(1, len(mutations)))
        if rc != 0:
            raise SystemExit(f"the unmutated tests fail (rc {rc}: {summary}); a mutation would prove nothing")
        print(f"unmutated: {len(tests)} test(s) pass ({summary})", flush=True)
        for m in mutations:
            work = Path(tmp) / m.name
            shutil.copytree(base, work, symlinks=True)
            _apply(work, m)
            t0 = time.time()
            rc, summary = _run_tests(work, m.tests, timeout)
            killed = rc != 0
            rows.append(dict(name=m.name, protection=m.protection, tests=m.tests, killed=killed, rc=rc,
                             summary=summary, seconds=time.time() - t0))
            print(f"{'killed  ' if killed else 'SURVIVED'} {m.name}: {summary} ({time.time() - t0:.0f} s)", flush=True)
            shutil.rmtree(work, ignore_errors=True)
    return rows


def table(rows) -> str:
    """The markdown table: protection, the test(s) that claim it, killed."""
    lines = ["| protection | removed in | test that fails without it | killed |", "|---|---|---|---|"]
    for r, m in zip(rows, [next(m for m in MUTATIONS if m.name == r["name"]) for r in rows]):
        tests = "<br>".join(f"`{t.split('::', 1)[-1]}` ({Path(t.split('::')[0]).name})" for t in m.tests)
        lines.append(f"| {m.protection} | `{m.path}` | {tests} | {'yes' if r['killed'] else '**no**'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run the mutations whose name contains this")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutation's test run")
    ap.add_argument("--write", type=Path, help="put the table between the markers of this file (docs/testing.md)")
    a = ap.parse_args(argv)
    ms = [m for m in MUTATIONS if a.only in m.name]
    if not ms:
        raise SystemExit(f"no mutation matches {a.only!r}")
    rows = run(ms, timeout=a.timeout)
    tab = table(rows)
    print(tab)
    if a.write:
        text = a.write.read_text()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{a.write} has no {BEGIN} ... {END} markers for the table")
        head, rest = text.split(BEGIN, 1)
        a.write.write_text(head + BEGIN + "\n" + tab + "\n" + END + rest.split(END, 1)[1])
    return 0 if all(r["killed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
