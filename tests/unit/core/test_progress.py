"""Progress reports (issue 13 item 3): done/total, rate and ETA as whole lines in a log file."""

import io
import re

import pytest

from llmgeom.core.progress import progress


def test_log_file_gets_whole_lines_with_count_rate_and_eta(monkeypatch):
    monkeypatch.setenv("LLMGEOM_PROGRESS_LOG_S", "0")
    buf = io.StringIO()  # not a TTY, like a SLURM / Snakemake job log
    with progress(total=4, desc="extract m mixed", unit="prompt", stream=buf) as bar:
        for _ in range(4):
            bar.update(1)
    text = buf.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) >= 4 and all(line.startswith("extract m mixed") for line in lines)
    assert "4/4" in lines[-1] and "2/4" in text
    assert re.search(r"prompt/s", text)  # rate
    assert re.search(r"<\d\d:\d\d", lines[1])  # ETA


def test_interval_limits_the_lines(monkeypatch):
    monkeypatch.setenv("LLMGEOM_PROGRESS_LOG_S", "3600")
    buf = io.StringIO()
    with progress(total=1000, desc="boot", stream=buf) as bar:
        for _ in range(1000):
            bar.update(1)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and "1000/1000" in lines[-1]  # the start and the final line only


def test_off_and_bad_interval(monkeypatch):
    monkeypatch.setenv("LLMGEOM_PROGRESS", "0")
    buf = io.StringIO()
    with progress(total=3, stream=buf) as bar:
        bar.update(3)
    assert buf.getvalue() == ""
    monkeypatch.delenv("LLMGEOM_PROGRESS")
    monkeypatch.setenv("LLMGEOM_PROGRESS_LOG_S", "soon")
    with pytest.raises(ValueError, match="LLMGEOM_PROGRESS_LOG_S='soon'"):
        progress(total=3, stream=io.StringIO())
