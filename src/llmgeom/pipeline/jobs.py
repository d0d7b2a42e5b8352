"""Job-side support for workflow/scripts: a log file per job (full traceback on failure), thread limits, and the
workflow's store context (``llmgeom.pipeline.layout``).

Imported by workflow/scripts only.
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: with several torch jobs on few cores, busy-waiting made
# each training or forward step 10-20x slower. libgomp reads this once, so it is set here, before any
# script imports torch (scripts import this module first). A value the user exported is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


#: environment variables that size the OpenMP / BLAS thread pools of libraries loaded after they are set (torch reads
#: OMP_NUM_THREADS when it is imported); pools already loaded are limited with threadpoolctl (run_logged).
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def set_threads(n: int) -> None:
    """Limit torch's intra-op threads to the job's declared threads ``n`` (at least 1): torch.set_num_threads
    where torch is imported, and THREAD_ENV for a torch (or BLAS library) imported later in the job. Called by
    :class:`run_logged` with its ``threads``, so every job's pools follow its rule's ``threads``."""
    import sys

    n = max(int(n), 1)
    for var in THREAD_ENV:
        os.environ[var] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)


#: the line :class:`run_logged` writes first into every job's log: the seconds from the job's process start to it
#: (the interpreter, Snakemake's script preamble, the script's imports); ``benchmarks/study_profile.py`` sums it
STARTUP_LINE = "[job] start-up {seconds:.2f} s (process start to run_logged: interpreter, script imports)"


def process_age() -> float:
    """Seconds since this process started, to 0.01 s (Linux: the system's uptime, ``/proc/uptime``, less the
    process's start time after boot, ``/proc/self/stat`` field 22 in clock ticks); NaN where /proc cannot be read."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22 (starttime), after "(comm)"
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


#: bytes held back on the log's file system while a job runs (``<log>.reserve``, ``core.io.SpaceReserve``) and
#: given back when it ends, before its last lines and traceback are written: room for a DiskFullError's message
#: in the log of a job whose disk filled (a long torch traceback is ~10 kB)
LOG_RESERVE = 64 << 10


class run_logged:
    """Context manager for Snakemake scripts: tee stdout/stderr into the rule's log file,
    write the full traceback there when the job fails (then re-raise), and limit BLAS/OpenMP
    thread pools and torch's threads to the job's ``threads`` (oversubscribed OpenBLAS threads made the analyses
    ~20x slower when jobs run side by side), and install the workflow's store context
    (``llmgeom.pipeline.layout``: prompt-file checks, rerun hints naming the rule); the previous limits and
    context are restored on exit.

    A full disk that also holds the log never replaces the job's own error (a :class:`DiskFullError` naming the
    partial file, the free space, the next batch and the fix) by the log's ``OSError: [Errno 28]``: writing the
    log never raises (:class:`_LogFile`). What reaches the user:

    * stderr (Snakemake's output) always gets the job's output and, from the interpreter or Snakemake, its
      traceback, whatever happens to the log (unless stderr itself cannot be written);
    * the log gets the traceback when the room held back for it (:data:`LOG_RESERVE`, taken when the job
      starts, given back at its end) was there at the start and no other writer takes it meanwhile; lines
      that did not fit are counted in a note there, and a log left short is said on stderr.
    """

    def __init__(self, path, threads: int = 1, *, startup: float | None = None):
        """``startup``: the seconds the log's first line gives (:data:`STARTUP_LINE`); None: this process's age
        (:func:`process_age`). The model server passes its client's: the job is the client process."""
        self.path = path
        self.threads = max(int(threads), 1)
        self.startup = startup

    def __enter__(self):
        import sys
        from pathlib import Path

        from threadpoolctl import threadpool_limits

        self._env = {var: os.environ.get(var) for var in THREAD_ENV}
        self._torch_threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
        self._pools = threadpool_limits(limits=self.threads)
        set_threads(self.threads)
        from llmgeom.pipeline import layout

        self._store_context = layout.install()
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.fh = _LogFile(self.path)
        self._out, self._err = sys.stdout, sys.stderr
        sys.stdout = _Tee(self._out, self.fh)
        sys.stderr = _Tee(self._err, self.fh)
        print(STARTUP_LINE.format(seconds=process_age() if self.startup is None else float(self.startup)), flush=True)
        return self

    def __exit__(self, et, ev, tb):
        import sys
        import traceback

        sys.stdout, sys.stderr = self._out, self._err
        problem = self.fh.finish("".join(traceback.format_exception(et, ev, tb)) if et is not None else "")
        if problem:  # the log lacks part of the job's output: say so where Snakemake shows it
            err = _Tee(self._err)
            err.write(f"[llmgeom] {problem}" + ("; the job's error is in the traceback on stderr" if et is not None
                                                else "") + "\n")
            err.flush()
        self._pools.restore_original_limits()
        for var, value in self._env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        if self._torch_threads is not None:
            sys.modules["torch"].set_num_threads(self._torch_threads)
        from llmgeom.core import store

        store.use_context(self._store_context)
        return False


class _LogFile:
    """A job's log file whose writes never raise: unbuffered (what a write returned is in the file), with
    :data:`LOG_RESERVE` bytes held back beside it (``<path>.reserve``; none where not even that was free).
    The first failed write (a full disk) ends the writing; :meth:`finish` gives the reserve back, then
    appends a note of what was lost and the job's last words (its traceback)."""

    def __init__(self, path):
        from llmgeom.core.io import SpaceReserve, reserve_path

        self.path, self.error, self.lost = path, None, 0
        try:
            self.reserve = SpaceReserve(reserve_path(path), LOG_RESERVE)
        except OSError:  # too full already: the log gets what fits
            self.reserve = SpaceReserve(reserve_path(path), 0)
        try:
            self.fh = open(path, "wb", buffering=0)
        except OSError as e:
            self.fh, self.error = None, e

    def _put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.fh.write(view):]  # a short write (the disk filled), then OSError

    def write(self, s: str) -> int:
        data = s.encode("utf-8", "replace")
        if self.error is not None:
            self.lost += len(data)
            return len(s)
        try:
            self._put(data)
        except (OSError, ValueError) as e:
            self.error, self.lost = e, self.lost + len(data)
        return len(s)

    def flush(self) -> None:
        pass

    def finish(self, last: str) -> str | None:
        """Give the reserve back, write ``last`` (after a note of the bytes lost, if any) and close. Returns None
        when the log holds all of the job's output, else a sentence saying what it lacks."""
        self.reserve.release()
        before, lost_before = self.error, self.lost
        if before is not None:  # retry in the room given back: a note of the gap, then the job's last words
            self.error = None
            if self.fh is None:
                with _suppressed():
                    self.fh = open(self.path, "ab", buffering=0)
            last = (f"\n[llmgeom] {lost_before:,} bytes of this job's output could not be written to this log "
                    f"({before}); its stderr (Snakemake's output) has them\n" + last)
        if self.fh is None:
            return f"no log {self.path} could be written ({before})"
        if last:
            self.write(last)
        with _suppressed():
            self.fh.close()
        if self.error is not None:
            return f"the log {self.path} lacks {self.lost:,} bytes of this job's output, its end included ({self.error})"
        if before is not None:
            return (f"the log {self.path} lacks {lost_before:,} bytes of this job's output, written while its disk "
                    f"was full ({before}); its end is there")
        return None


def unfailing(stream):
    """``stream`` (a text stream) whose ``write`` and ``flush`` never raise: what cannot be written (a full disk, a
    closed pipe) is dropped. The model server's stdout and stderr (its ``server.log``), so that a print on a full
    disk never ends the server: its client gets the task's own error, not a closed connection."""
    return _Tee(stream)


def _suppressed():
    import contextlib

    return contextlib.suppress(OSError, ValueError)


class _Tee:
    """Writes to every stream; a stream that fails (a full disk, a closed pipe) is skipped, never raised from,
    so a job's own error is never replaced by one of its output."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            with _suppressed():
                st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            with _suppressed():
                st.flush()
