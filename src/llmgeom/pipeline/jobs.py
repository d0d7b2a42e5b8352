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


class run_logged:
    """Context manager for Snakemake scripts: tee stdout/stderr into the rule's log file,
    write the full traceback there when the job fails (then re-raise), and limit BLAS/OpenMP
    thread pools and torch's threads to the job's ``threads`` (oversubscribed OpenBLAS threads made the analyses
    ~20x slower when jobs run side by side), and install the workflow's store context
    (``llmgeom.pipeline.layout``: prompt-file checks, rerun hints naming the rule); the previous limits and
    context are restored on exit."""

    def __init__(self, path, threads: int = 1):
        self.path = path
        self.threads = max(int(threads), 1)

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
