"""A time limit for a test that could hang (pytest-timeout is not among the test dependencies): SIGALRM raises
:class:`Hung`, a ``BaseException``, so that code under test which turns an ``Exception`` into a fallback (the model
server's ``run_task``) cannot swallow it and a hang fails the test instead of passing it."""

import contextlib
import signal
import time


class Hung(BaseException):
    """The test ran past its time limit (it would have hung)."""


@contextlib.contextmanager
def deadline(seconds: float, what: str = "the test"):
    """Raise :class:`Hung` in the main thread when the block runs longer than ``seconds``; nests (an outer limit
    keeps counting and is restored, less the time spent inside)."""

    def fire(signum, frame):
        raise Hung(f"{what} ran past its limit of {seconds:.0f} s (it would hang)")

    t0 = time.monotonic()
    old = signal.signal(signal.SIGALRM, fire)
    outer = signal.setitimer(signal.ITIMER_REAL, seconds)[0]
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - t0), 0.001) if outer else 0)
        signal.signal(signal.SIGALRM, old)
