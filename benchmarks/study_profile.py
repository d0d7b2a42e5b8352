"""Wall-time profile of one Snakemake run of the study (issue 21): where the time went, from the run's log.

    .venv/bin/python benchmarks/study_profile.py .snakemake/log/<run>.snakemake.log [--benchmarks results/benchmarks]
        [--job-logs logs]
    .venv/bin/python benchmarks/study_profile.py --latest                 # newest log of a run with jobs

Prints, from the log alone (job start and finish times at Snakemake's 1-second resolution, each job's
``threads``, ``input`` and ``output``):

* **wall time**: first job start to last job finish (and the log's own first and last timestamp);
* **busy-core share**: sum over time of ``min(threads of the running jobs, cores)`` divided by
  ``cores x wall``, and how long 0, 1, 2, ... jobs were running;
* **per-rule share** of job-seconds (a job's wall time; with ``--benchmarks``, also the sums of the
  ``benchmark:`` files' ``s``, ``cpu_time`` and the largest ``max_rss`` per rule, read from every ``*.tsv``
  under that folder, the rule being the file's first folder below it, or its name's first part);
* **start-up** (with ``--job-logs logs``): per rule, the seconds each job spent from its process start to
  ``run_logged`` (interpreter, Snakemake's preamble, the script's imports), the first line of every job log;
* **critical path**: the chain that ends at the last job to finish, each step going back to the input's
  producer that finished last (the one the job waited for), with the idle gap where a job waited for a
  free core rather than for its inputs; and two bounds: the longest dependency chain by job durations
  (the wall time with unlimited cores) and ``sum(threads x seconds) / cores`` (the wall time with perfect
  packing). Dependencies are read from the log: job B depends on job A when one of B's inputs is one of
  A's outputs or lies inside an output directory of A.

The figures are as good as the run was quiet: on a machine shared with other work the wall times are
inflated, the shares and the critical path still tell.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from llmgeom.pipeline.derived import NULL_SUFFIX  # noqa: E402  (the twins' name: one home)

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_RULE = re.compile(r"^(?:local)?(?:checkpoint|rule) (\S+):$")
_FINISHED = (re.compile(r"^Finished jobid: (\d+)"), re.compile(r"^Finished job (\d+)\."))
_ERROR = re.compile(r"^Error in rule (\S+):")


@dataclass
class Job:
    """One job of a Snakemake run as its log describes it (times in seconds since the epoch)."""

    jobid: int
    rule: str
    start: float
    end: float | None = None
    threads: int = 1
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    wildcards: str = ""
    failed: bool = False

    @property
    def seconds(self) -> float:
        return (self.end - self.start) if self.end is not None else 0.0

    @property
    def label(self) -> str:
        return f"{self.rule}[{self.wildcards}]" if self.wildcards else self.rule


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(", ") if v.strip()]


def parse_log(path) -> dict:
    """Jobs, cores and timestamps of one ``.snakemake/log/*.snakemake.log``.

    Returns:
        ``{"jobs": {jobid: Job}, "cores": int | None, "first": float | None, "last": float | None}``;
        job times are epoch seconds (1-second resolution), jobs still running when the log ends have
        ``end`` None.

    Raises:
        ValueError: no job in the file (not a Snakemake log, or a dry run).
    """
    jobs: dict[int, Job] = {}
    cores = None
    stamp = first = last = None
    cur: Job | None = None
    for raw in Path(path).read_text(errors="replace").splitlines():
        line = raw.rstrip()
        m = _STAMP.match(line)
        if m:
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y").timestamp()
            first = stamp if first is None else first
            last = stamp
            cur = None
            continue
        if line.startswith("Provided cores:"):
            cores = int(line.split(":")[1])
            continue
        m = _RULE.match(line)
        if m and stamp is not None:
            cur = Job(jobid=-1, rule=m.group(1), start=stamp)
            continue
        if cur is not None and raw.startswith("    ") and ":" in line:
            key, _, value = line.strip().partition(": ")
            if key == "jobid":
                cur.jobid = int(value)
                jobs[cur.jobid] = cur
            elif key == "input":
                cur.inputs = _split(value)
            elif key == "output":
                cur.outputs = _split(value)
            elif key == "threads":
                cur.threads = int(value)
            elif key == "wildcards":
                cur.wildcards = value
            continue
        for pat in _FINISHED:
            m = pat.match(line)
            if m and int(m.group(1)) in jobs and stamp is not None:
                jobs[int(m.group(1))].end = stamp
        m = _ERROR.match(line)
        if m:
            cur = None
            failed = [j for j in jobs.values() if j.rule == m.group(1) and j.end is None]
            if failed:
                failed[-1].failed, failed[-1].end = True, stamp
    if not jobs:
        raise ValueError(f"{path}: no job found; is it the log of a Snakemake run (not a dry run)?")
    return {"jobs": jobs, "cores": cores, "first": first, "last": last}


def dependencies(jobs: dict[int, Job]) -> dict[int, list[int]]:
    """For each job, the jobs of this run that produced one of its inputs (exact path or inside an output
    directory)."""
    producer: dict[str, int] = {}
    for j in jobs.values():
        for o in j.outputs:
            producer[o.rstrip("/")] = j.jobid
    deps: dict[int, list[int]] = {}
    for j in jobs.values():
        found = set()
        for inp in j.inputs:
            p = inp.rstrip("/")
            while p:
                if p in producer and producer[p] != j.jobid:
                    found.add(producer[p])
                    break
                p = p.rpartition("/")[0]
        deps[j.jobid] = sorted(found)
    return deps


def busy_profile(jobs, cores: int) -> dict:
    """Busy-core share and time by number of running jobs over [first start, last finish]."""
    done = [j for j in jobs if j.end is not None]
    t0, t1 = min(j.start for j in done), max(j.end for j in done)
    edges = sorted({t0, t1, *(j.start for j in done), *(j.end for j in done)})
    busy = 0.0
    by_n: dict[int, float] = defaultdict(float)
    for a, b in zip(edges, edges[1:]):
        running = [j for j in done if j.start <= a and j.end >= b and j.end > j.start]
        busy += min(sum(j.threads for j in running), cores) * (b - a)
        by_n[len(running)] += b - a
    wall = t1 - t0
    return {"wall_s": wall, "busy_share": busy / (cores * wall) if wall > 0 else float("nan"),
            "seconds_by_running_jobs": dict(sorted(by_n.items()))}


def read_benchmarks(folder) -> dict[str, dict]:
    """Per-rule sums of Snakemake ``benchmark:`` files (``*.tsv`` under ``folder``; the rule is the first
    folder below ``folder``, or the file name up to the first ``.`` or ``-``)."""
    out: dict[str, dict] = {}
    root = Path(folder)
    for f in sorted(root.rglob("*.tsv")):
        rel = f.relative_to(root)
        rule = rel.parts[0] if len(rel.parts) > 1 else re.split(r"[.-]", rel.name)[0]
        with open(f) as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if not rows or "s" not in rows[0]:
            continue
        r = out.setdefault(rule, {"n": 0, "s": 0.0, "cpu_time": 0.0, "max_rss": 0.0})
        for row in rows:
            r["n"] += 1
            for k in ("s", "cpu_time"):
                try:
                    r[k] += float(row.get(k) or 0)
                except ValueError:
                    pass
            try:
                r["max_rss"] = max(r["max_rss"], float(row.get("max_rss") or 0))
            except ValueError:
                pass
    return out


_STARTUP = re.compile(r"^\[job\] start-up (\d+(?:\.\d+)?|nan) s ")


def read_startup(folder) -> dict[str, dict]:
    """Per-rule start-up of the jobs whose logs are under ``folder`` (the run's ``logs/``; the rule is the first
    folder below it, or the file name up to its first ``.``): the first line of a job's log that
    ``pipeline.jobs.run_logged`` writes, ``[job] start-up <s> s`` (process start to run_logged: the interpreter,
    Snakemake's script preamble, the script's imports). Returns {rule: {"n": logs with the line, "s": their sum,
    "without": logs without it}} (jobs whose work the model server runs log no start-up of their own)."""
    out: dict[str, dict] = {}
    root = Path(folder)
    for f in sorted(root.rglob("*.log")):
        rel = f.relative_to(root)
        rule = rel.parts[0] if len(rel.parts) > 1 else rel.name.split(".")[0]
        r = out.setdefault(rule, {"n": 0, "s": 0.0, "without": 0})
        with open(f, errors="replace") as fh:
            m = next((m for m in map(_STARTUP.match, fh) if m), None)
        if m and m.group(1) != "nan":
            r["n"] += 1
            r["s"] += float(m.group(1))
        else:
            r["without"] += 1
    return out


def critical_path(jobs: dict[int, Job], deps: dict[int, list[int]], slack: float = 1.0) -> dict:
    """The observed chain that set the wall time, and the dependency-only longest chain.

    The observed chain starts at the last job to finish and steps back: to the producer of one of the
    job's inputs when that producer finished within ``slack`` seconds before the job started (the job
    waited for its input: edge "input"), else to the job that finished last before it started (it
    waited for a core that job freed: edge "core"). Its durations and gaps cover the wall time.

    Returns:
        ``{"chain": [(Job, edge)], "longest": [Job], "longest_s": float}``; edge is "input", "core" or
        "start" (the first job) and names how the job was reached from its predecessor.
    """
    done = {k: j for k, j in jobs.items() if j.end is not None}
    last = max(done.values(), key=lambda j: (j.end, j.seconds))
    chain = []
    j = last
    while j is not None:
        preds = [done[d] for d in deps.get(j.jobid, []) if d in done]
        gate = max(preds, key=lambda p: p.end) if preds else None
        if gate is not None and j.start - gate.end <= slack:
            chain.append((j, "input"))
            j = gate
            continue
        # not waiting for an input: waiting for a core; the job that freed it (finished last before the start)
        before = [x for x in done.values() if x.end <= j.start + slack and x is not j and x.end > x.start - 1]
        before = [x for x in before if x.end <= j.start or x.start < j.start]
        freed = max(before, key=lambda x: (x.end, x.seconds)) if before else None
        chain.append((j, "core" if freed is not None else "start"))
        j = freed
    chain.reverse()
    # longest path by durations, dependencies only (unlimited cores)
    order = sorted(done.values(), key=lambda x: (x.end, x.start))
    best: dict[int, tuple[float, int | None]] = {}
    for x in order:
        preds = [(best[d][0], d) for d in deps.get(x.jobid, []) if d in best]
        base, via = max(preds) if preds else (0.0, None)
        best[x.jobid] = (base + x.seconds, via)
    end_id = max(best, key=lambda k: best[k][0])
    longest, k = [], end_id
    while k is not None:
        longest.append(done[k])
        k = best[k][1]
    longest.reverse()
    return {"chain": chain, "longest": longest, "longest_s": best[end_id][0]}


def is_null_job(job: "Job") -> bool:
    """A job of a null model (issue 28): its ``model`` wildcard is a random-init twin (``<model>-randinit``,
    :data:`llmgeom.pipeline.derived.NULL_SUFFIX`) or a wind-tunnel step-0 checkpoint (``<model>-step0``)."""
    m = re.search(r"(?:^|, )model=([^,]+)", job.wildcards or "")
    return bool(m) and (m.group(1).endswith(NULL_SUFFIX) or m.group(1).endswith("-step0"))


def profile(log_path, benchmarks=None, cores: int | None = None, top: int = 40, job_logs=None) -> str:
    """The whole report as text (see the module docstring); ``job_logs``: the run's ``logs/`` folder, for the
    start-up section (:func:`read_startup`)."""
    info = parse_log(log_path)
    jobs = info["jobs"]
    cores = cores or info["cores"] or 1
    done = [j for j in jobs.values() if j.end is not None]
    unfinished = [j for j in jobs.values() if j.end is None]
    busy = busy_profile(done, cores)
    deps = dependencies(jobs)
    lines = [f"log: {log_path}", f"jobs: {len(jobs)} ({len(done)} finished, "
             f"{sum(j.failed for j in done)} failed, {len(unfinished)} unfinished); cores: {cores}",
             f"wall time (first job start -> last job finish): {busy['wall_s']:.0f} s ({busy['wall_s'] / 60:.1f} min); "
             f"log span {info['last'] - info['first']:.0f} s",
             f"busy-core share: {100 * busy['busy_share']:.1f}% "
             "(sum over time of min(threads of running jobs, cores) / (cores x wall))",
             "time by number of running jobs: " + ", ".join(
                 f"{n}: {s:.0f} s ({100 * s / busy['wall_s']:.0f}%)" for n, s in busy["seconds_by_running_jobs"].items())]
    thread_s = sum(min(j.threads, cores) * j.seconds for j in done)
    lines.append(f"lower bounds: perfect packing sum(threads x s) / cores = {thread_s / cores:.0f} s; ")
    cp = critical_path(jobs, deps)
    lines[-1] += f"longest dependency chain (unlimited cores) = {cp['longest_s']:.0f} s"
    # per rule
    total = sum(j.seconds for j in done) or 1.0
    by_rule: dict[str, list[Job]] = defaultdict(list)
    for j in done:
        by_rule[j.rule].append(j)
    bench = read_benchmarks(benchmarks) if benchmarks else {}
    lines += ["", "per rule (job-seconds from the log" + (", benchmark: files" if bench else "") + "):",
              f"{'rule':28s} {'jobs':>4s} {'job-s':>7s} {'share':>6s} {'mean s':>7s} {'max s':>6s} {'threads':>7s}"
              + ("  bench s  cpu s  max_rss MB" if bench else "")]
    for rule, js in sorted(by_rule.items(), key=lambda kv: -sum(j.seconds for j in kv[1])):
        s = sum(j.seconds for j in js)
        row = (f"{rule:28s} {len(js):4d} {s:7.0f} {100 * s / total:5.1f}% {s / len(js):7.1f} "
               f"{max(j.seconds for j in js):6.0f} {max(j.threads for j in js):7d}")
        if bench:
            b = bench.get(rule)
            row += (f"  {b['s']:7.0f} {b['cpu_time']:6.0f} {b['max_rss']:11.0f}" if b else "        -      -           -")
        lines.append(row)
    lines.append(f"{'total':28s} {len(done):4d} {total:7.0f}")
    # issue 28: the share of job-seconds spent on the null models (random-init twins, step-0 checkpoints)
    nulls = [j for j in done if is_null_job(j)]
    ns = sum(j.seconds for j in nulls)
    nby: dict[str, float] = defaultdict(float)
    for j in nulls:
        nby[j.rule] += j.seconds
    lines += ["", f"null models (issue 28; jobs of <model>{NULL_SUFFIX} / <wind-tunnel model>-step0): {len(nulls)} jobs, "
              f"{ns:.0f} job-s = {100 * ns / total:.1f}% of the study's job-seconds (target: at most 35%)",
              "  by rule: " + (", ".join(f"{r} {x:.0f} s" for r, x in sorted(nby.items(), key=lambda kv: -kv[1]))
                               or "none")]
    if job_logs:
        st = read_startup(job_logs)
        n, s = sum(r["n"] for r in st.values()), sum(r["s"] for r in st.values())
        lines += ["", f"start-up (process start to run_logged: interpreter, script imports; from the first line of "
                  f"each job log under {job_logs}): {n} jobs, {s:.0f} s = {100 * s / total:.1f}% of the job-seconds, "
                  f"mean {s / max(n, 1):.2f} s; {sum(r['without'] for r in st.values())} logs without it (jobs the "
                  "model server ran, or logs of older code)",
                  "  by rule (s, jobs): " + ", ".join(f"{r} {x['s']:.0f} ({x['n']})" for r, x in
                                                      sorted(st.items(), key=lambda kv: -kv[1]["s"]) if x["n"])]
    lines += ["", "critical path (from the last job to finish back: 'input' = started when the producer of its "
              "input finished, 'core' = started when the job above freed a core):",
              f"{'start s':>7s} {'dur s':>6s} {'via':>5s}  job"]
    t0 = min(j.start for j in done)
    for j, edge in cp["chain"]:
        lines.append(f"{j.start - t0:7.0f} {j.seconds:6.0f} {edge:>5s}  {j.label}"
                     + (f" ({j.threads} threads)" if j.threads > 1 else ""))
    by = defaultdict(float)
    for j, _ in cp["chain"]:
        by[j.rule] += j.seconds
    lines.append("chain by rule: " + ", ".join(f"{r} {s:.0f} s" for r, s in sorted(by.items(), key=lambda kv: -kv[1])))
    lines += ["", "longest dependency chain by durations (what more cores could not shorten):"]
    lines.append("  " + " -> ".join(f"{j.label} {j.seconds:.0f}s" for j in cp["longest"]))
    lines += ["", f"longest jobs (top {min(top, len(done))}):"]
    for j in sorted(done, key=lambda j: -j.seconds)[:top]:
        lines.append(f"  {j.seconds:6.0f} s  start {j.start - t0:5.0f}  {j.label}"
                     + (f" ({j.threads} threads)" if j.threads > 1 else ""))
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", nargs="?", help="a .snakemake/log/*.snakemake.log file")
    ap.add_argument("--latest", action="store_true", help="the newest log under ./.snakemake/log of a run that ran jobs")
    ap.add_argument("--benchmarks", help="folder holding the rules' benchmark: *.tsv files")
    ap.add_argument("--cores", type=int, help="override the log's 'Provided cores'")
    ap.add_argument("--top", type=int, default=15, help="how many of the longest jobs to list")
    ap.add_argument("--job-logs", help="the run's logs/ folder: each job's start-up, summed per rule")
    a = ap.parse_args(argv)
    log = a.log
    if a.latest or not log:
        logs = sorted(Path(".snakemake/log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
        runs = [p for p in logs if "Select jobs to execute" in p.read_text(errors="replace")]
        if not runs:  # the report and dry runs write logs too: the newest one that ran jobs
            sys.exit("no .snakemake/log/*.snakemake.log of a run with jobs here; pass the log's path")
        log = runs[-1]
    print(profile(log, a.benchmarks, a.cores, a.top, a.job_logs))


if __name__ == "__main__":
    main()
