"""pipeline.jobs: every job's log opens with its start-up (process start to run_logged), the figure that
benchmarks/study_profile.py sums per rule."""

from __future__ import annotations

import re
import subprocess
import sys


def test_the_first_log_line_is_the_seconds_since_the_process_started(tmp_path):
    log = tmp_path / "job.log"
    code = ("import time; time.sleep(0.6)\n"
            "from llmgeom.pipeline.jobs import run_logged\n"
            f"with run_logged({str(log)!r}):\n"
            "    print('work')\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)
    first, second = log.read_text().splitlines()[:2]
    m = re.fullmatch(r"\[job\] start-up (\d+\.\d\d) s \(process start to run_logged: interpreter, script imports\)",
                     first)
    assert m, first
    assert 0.6 <= float(m.group(1)) < 10.0  # the sleep is part of it; /proc's clock ticks are 0.01 s
    assert second == "work"


def test_study_profile_sums_the_start_up_lines_per_rule(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "study_profile", Path(__file__).resolve().parents[3] / "benchmarks" / "study_profile.py")
    sp = importlib.util.module_from_spec(spec)
    sys.modules["study_profile"] = sp  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(sp)
    finally:
        sys.modules.pop("study_profile", None)
    (tmp_path / "margins").mkdir()
    (tmp_path / "margins" / "a.log").write_text("[job] start-up 1.25 s (process start to run_logged: x)\nwork\n")
    (tmp_path / "margins" / "b.log").write_text("[job] start-up 0.50 s (process start to run_logged: x)\n")
    (tmp_path / "extract" / "m").mkdir(parents=True)
    (tmp_path / "extract" / "m" / "corpus.log").write_text("[model server] pid 1: task extract\n")
    st = sp.read_startup(tmp_path)
    assert st["margins"] == {"n": 2, "s": 1.75, "without": 0}
    assert st["extract"] == {"n": 0, "s": 0.0, "without": 1}
