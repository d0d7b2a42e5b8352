"""Job-side support for workflow/scripts: a log file per job (full traceback on failure) and thread limits.

Imported by workflow/scripts only.
"""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: with several torch jobs on few cores, busy-waiting made
# each training or forward step 10-20x slower. libgomp reads this once, so it is set here, before any
# script imports torch (scripts import this module first). A value the user exported is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def set_threads(n: int) -> None:
    """Limit torch's intra-op threads to the job's declared threads."""
    import torch

    torch.set_num_threads(max(int(n), 1))


class run_logged:
    """Context manager for Snakemake scripts: tee stdout/stderr into the rule's log file,
    write the full traceback there when the job fails (then re-raise), and limit BLAS/OpenMP
    thread pools to the job's ``threads`` (oversubscribed OpenBLAS threads made the analyses
    ~20x slower when jobs run side by side)."""

    def __init__(self, path, threads: int = 1):
        self.path = path
        self.threads = max(int(threads), 1)

    def __enter__(self):
        import sys
        from pathlib import Path

        from threadpoolctl import threadpool_limits

        self._pools = threadpool_limits(limits=self.threads)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "w")
        self._out, self._err = sys.stdout, sys.stderr
        sys.stdout = _Tee(self._out, self.fh)
        sys.stderr = _Tee(self._err, self.fh)
        return self

    def __exit__(self, et, ev, tb):
        import sys
        import traceback

        if et is not None:
            traceback.print_exception(et, ev, tb, file=self.fh)
        sys.stdout, sys.stderr = self._out, self._err
        self.fh.close()
        self._pools.restore_original_limits()
        return False


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()
