"""One writer per output, on any shared file system: a lease file beside the output.

On a multi-node cluster a node that stops answering is not a node that stopped working: its processes
may still write. An extraction writes ``<out>.partial`` in place batch by batch (the HDF5 file is opened
without HDF5's own file locking, which breaks on network file systems), so a second writer on the same
partial file (the retry of a job whose node was lost, while the orphaned first one runs on) corrupts it.
:class:`OutputLease` makes that impossible: the writer takes ``<out>.lease`` before it opens the partial
file, renews it while it runs and checks it before every batch it writes; a writer that finds a live lease
of another job waits or fails naming that job and host; a writer that lost its lease stops before it writes.

Mechanism, and why not ``flock``/``fcntl``: on NFS, Lustre and GPFS a POSIX or BSD lock may be local to a
client (Lustre without ``-o flock``, NFS mounted ``nolock``/``local_lock``), and a lock held by a node that
lost its network is either kept for ever or silently dropped by the server's lock recovery. What every
POSIX shared file system does make atomic across hosts is ``link(2)`` onto an existing name (it fails
with EEXIST) and ``rename(2)``. So (the classic NFS-safe lock protocol, as in ``open(2)``'s note on
``O_EXCL``):

- **take**: write the holder's record (job id, node, host, pid, a random token, renewal time, ttl) to a
  file of its own, ``<out>.lease.<token>``, then ``link`` it to ``<out>.lease``. The link succeeded when it
  returns 0 or, where an NFS reply was lost, when the own file's link count is 2.
- **renew** (a heartbeat thread, every ``ttl/6`` s): rewrite the record, in place, in the own file, which is
  the same inode as ``<out>.lease`` while the lease is held, so a renewal can never touch a lease that
  another writer has taken since (that is another inode); then read ``<out>.lease`` back: its token must
  still be ours.
- **expiry**: a lease whose last renewal is more than ``ttl`` s old (the holder's clock against the
  reader's: cluster clocks must agree, NTP, to much better than ``ttl``) may be taken over: ``rename`` it to
  a name of the taker's own (only one taker can rename a given file), check that what was renamed is the
  stale record that was read (else put it back), remove it, and take the lease anew.
- **check before every write** (:meth:`OutputLease.check`): the token is still ours *and* our last
  confirmed renewal is younger than ``ttl/2``. A taker needs ``ttl`` s without renewal, so a holder that
  could not renew (a hung or cut-off node) has stopped writing ``ttl/2`` s before anyone can take over, as
  long as one batch's write and commit take less than ``ttl/2`` s. The holder also gives the lease up itself
  (and stops at its next batch) when SLURM says that its job has ended (``NODE_FAIL`` after its node's
  ``slurmd`` stopped answering, while its processes run on): a retry then needs no ``ttl`` to pass.
- **dead holders**: a lease of a process on this host that no longer runs is taken over at once (a
  ``kill -9`` or a crash leaves one behind); a lease of a SLURM job that still runs (``squeue``), other than
  ours, is refused at once (:class:`LeaseHeld`); any other live lease is waited for, up to ``wait_s``.

``ttl`` and ``wait_s`` default to ``LLMGEOM_LEASE_TTL_S`` (60 s) and ``LLMGEOM_LEASE_WAIT_S`` (3 x ttl).

May import: the standard library only.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

LEASE_SUFFIX = ".lease"
TTL_ENV = "LLMGEOM_LEASE_TTL_S"
WAIT_ENV = "LLMGEOM_LEASE_WAIT_S"
DEFAULT_TTL_S = 60.0
#: the record is padded to this many bytes and rewritten with one pwrite, so a reader never sees half of it
RECORD_BYTES = 1024
#: SLURM job states whose processes may still be running (squeue %T)
SLURM_LIVE_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING",
                               "STAGE_OUT", "RESIZING"})


class LeaseHeld(RuntimeError):
    """Another writer holds a live lease on the output; the message names its job, node, host and pid."""


class LeaseLost(RuntimeError):
    """This writer no longer holds its lease (it could not renew it in time, its SLURM job ended, or another
    writer took it over after it expired); it must stop before it writes anything more."""


def lease_path(path) -> Path:
    """The lease file of output ``path``: ``<path>.lease`` (same directory, beside ``<path>.partial``)."""
    path = Path(path)
    return path.with_name(path.name + LEASE_SUFFIX)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds; unset it or give e.g. {name}=60") from None
    if v <= 0 and name == TTL_ENV:
        raise ValueError(f"{name}={raw!r} must be > 0 seconds; unset it or give e.g. {name}=60")
    return v


def _proc_start(pid: int) -> str | None:
    """The start time of process ``pid`` (``/proc/<pid>/stat`` field 22), so a reused pid is not taken for it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _host() -> str:
    return socket.gethostname()


def slurm_job_state(job_id: str | None) -> tuple[str, str] | None:
    """``(state, batch host)`` of SLURM job ``job_id`` from ``squeue`` (works without accounting while
    ``MinJobAge`` keeps ended jobs), ``("GONE", "")`` for a job SLURM no longer knows, None where it cannot be
    told (no job id, no ``squeue``, the controller not answering)."""
    if not job_id:
        return None
    try:
        r = subprocess.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T|%B"], capture_output=True, text=True,
                           timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return ("GONE", "") if "Invalid job id" in r.stderr else None
    line = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
    if not line:
        return ("GONE", "")
    state, _, host = line.partition("|")
    return state.strip(), host.strip()


def identity(token: str | None = None) -> dict:
    """The record of this process as a lease holder: SLURM job id and node (None outside SLURM), host, pid,
    the pid's start time and a random token."""
    pid = os.getpid()
    return dict(job=os.environ.get("SLURM_JOB_ID") or None, node=os.environ.get("SLURMD_NODENAME") or None,
                host=_host(), pid=pid, pid_start=_proc_start(pid), token=token or secrets.token_hex(8))


def describe(rec: dict) -> str:
    """A holder in words: ``SLURM job 12 on node n1 (host h, pid 345)`` or ``pid 345 on host h``."""
    where = f"host {rec.get('host')}, pid {rec.get('pid')}"
    if rec.get("job"):
        return f"SLURM job {rec['job']} on node {rec.get('node') or '?'} ({where})"
    return f"pid {rec.get('pid')} on host {rec.get('host')}"


def read_record(path) -> dict | None:
    """The holder's record in lease file ``path``; None when there is no such file, ``{}`` when it cannot be
    parsed (being written: rare, the record is one pwrite)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        rec = json.loads(raw.decode().strip() or "{}")
    except (UnicodeDecodeError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _encode(rec: dict) -> bytes:
    b = json.dumps(rec, sort_keys=True).encode()
    if len(b) > RECORD_BYTES:
        raise ValueError(f"lease record of {len(b)} bytes exceeds {RECORD_BYTES}: {rec}")
    return b.ljust(RECORD_BYTES)


class OutputLease:
    """The lease on one output (see the module docstring); a context manager that releases it on exit.

    Args:
        path: the output (the lease is :func:`lease_path` of it).
        ttl: seconds without renewal after which the lease may be taken over (default ``LLMGEOM_LEASE_TTL_S``
            or 60). Renewed every ``ttl/6`` s by a heartbeat thread; :meth:`check` fails once the last confirmed
            renewal is ``ttl/2`` s old.
        wait_s: how long :meth:`acquire` waits for a live lease of another writer to be released or to expire
            (default ``LLMGEOM_LEASE_WAIT_S`` or 3 x ttl; 0 = fail at once).
        log: called with one line when the lease is taken over, waited for or lost.
        job_state: ``job_state(job_id) -> (state, batch host) | None`` (default :func:`slurm_job_state`; tests
            replace it).
        clock: ``time.time`` (tests replace it).
    """

    def __init__(self, path, *, ttl: float | None = None, wait_s: float | None = None, log=print,
                 job_state: Callable = slurm_job_state, clock: Callable[[], float] = time.time):
        self.output = Path(path)
        self.path = lease_path(self.output)
        self.ttl = float(ttl) if ttl is not None else _env_float(TTL_ENV, DEFAULT_TTL_S)
        if self.ttl <= 0:
            raise ValueError(f"lease ttl must be > 0 seconds, got {self.ttl}")
        self.wait_s = float(wait_s) if wait_s is not None else _env_float(WAIT_ENV, 3 * self.ttl)
        self.log, self.job_state, self.clock = log, job_state, clock
        self.rec = identity()
        self.own = self.path.with_name(f"{self.path.name}.{self.rec['token']}")
        self.held = False
        self._confirmed = 0.0  # clock() before the last renewal that was confirmed
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._io = threading.Lock()  # renewals (heartbeat thread) and checks (writer) one at a time

    # ------------------------------------------------------------------ taking it
    def acquire(self, *, heartbeat: bool = True) -> "OutputLease":
        """Take the lease, waiting up to ``wait_s`` for a live one of another writer; start the heartbeat.

        Raises:
            LeaseHeld: a SLURM job that is still running (other than ours) holds it, or a live lease did not
                go within ``wait_s`` s; the message names the holder and what to do.
            LeaseLost: our own SLURM job has already ended (we are an orphan: nothing must be written).
            OSError: the lease cannot be written (permissions, a full or read-only file system).
        """
        mine = self.job_state(self.rec["job"]) if self.rec["job"] else None
        if self._ended(mine):
            raise LeaseLost(f"not taking the lease on {self.output}: this process's SLURM job {self.rec['job']} "
                            f"has ended ({mine[0]}{' on ' + mine[1] if mine[1] else ''}); an orphan writes nothing")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        t_end = self.clock() + self.wait_s
        said = False
        while True:
            if self._try_link():
                self.held, self._lost = True, None
                if heartbeat:
                    self._thread = threading.Thread(target=self._beat, name="llmgeom-lease", daemon=True)
                    self._thread.start()
                return self
            rec = read_record(self.path)
            if rec is None:
                continue  # released between our link and our read: try again
            if not rec:  # being written (or not ours to parse): judge it by the file's age
                rec = self._unparsed(rec)
            why = self._stale(rec)
            if why:
                if self._break(rec):
                    self.log(f"[lease] took over {self.path} from {describe(rec)}: {why}")
                continue
            holder = self.job_state(rec.get("job")) if rec.get("job") and rec.get("job") != self.rec["job"] else None
            if holder is not None and holder[0] in SLURM_LIVE_STATES:
                raise LeaseHeld(self._held_message(rec, f"that job is {holder[0]} (squeue)"))
            if self._local_alive(rec):
                raise LeaseHeld(self._held_message(rec, "that process is running on this host"))
            if self.clock() >= t_end:
                raise LeaseHeld(self._held_message(rec, f"its lease was renewed {self._age(rec):.0f} s ago and did "
                                                        f"not expire or get released within {self.wait_s:.0f} s"))
            if not said:
                self.log(f"[lease] {self.output} is leased by {describe(rec)} (renewed {self._age(rec):.0f} s ago, "
                         f"ttl {rec.get('ttl')} s): waiting up to {self.wait_s:.0f} s for it to end or expire")
                said = True
            time.sleep(min(1.0, max(self.ttl / 10, 0.05)))

    def _held_message(self, rec: dict, why: str) -> str:
        stop = (f"wait for that job to end or cancel it (scancel {rec['job']})" if rec.get("job")
                else "wait for that process to end or stop it")
        return (f"{self.output} is being written by {describe(rec)}: {why} (lease {self.path}). One writer per "
                f"output: {stop}, then rerun; remove the lease file by hand only if you know that writer is gone")

    def _write_own(self, *, create: bool) -> None:
        self.rec["renewed"], self.rec["ttl"] = self.clock(), self.ttl
        data = _encode(self.rec)
        flags = os.O_WRONLY | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.own, flags, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _try_link(self) -> bool:
        self.own.unlink(missing_ok=True)
        t = self.clock()
        self._write_own(create=True)
        try:
            os.link(self.own, self.path)
        except FileExistsError:
            self.own.unlink(missing_ok=True)
            return False
        except OSError:
            # NFS: the link may have been made although its reply was lost: the link count tells
            if os.stat(self.own).st_nlink != 2:
                self.own.unlink(missing_ok=True)
                raise
        self._confirmed = t
        return True

    def _unparsed(self, rec: dict) -> dict:
        try:
            return dict(renewed=self.path.stat().st_mtime, ttl=self.ttl, token=None)
        except FileNotFoundError:
            return dict(renewed=self.clock(), ttl=self.ttl, token=None)

    def _age(self, rec: dict) -> float:
        return self.clock() - float(rec.get("renewed") or 0.0)

    def _stale(self, rec: dict) -> str | None:
        """Why lease record ``rec`` may be taken over now, or None."""
        ttl = float(rec.get("ttl") or self.ttl)
        if self._age(rec) > ttl:
            return f"not renewed for {self._age(rec):.1f} s (ttl {ttl:g} s)"
        if rec.get("host") == _host() and rec.get("pid") and not self._local_alive(rec):
            return f"its process {rec['pid']} no longer runs on this host"
        return None

    @staticmethod
    def _local_alive(rec: dict) -> bool:
        """True when ``rec``'s holder is a process on this host that still runs (same pid and start time)."""
        if rec.get("host") != _host() or not rec.get("pid"):
            return False
        start = _proc_start(int(rec["pid"]))
        if start is None:
            return False
        try:
            if Path(f"/proc/{int(rec['pid'])}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        except (OSError, IndexError):
            return False
        return rec.get("pid_start") in (None, start)

    def _break(self, stale: dict) -> bool:
        """Remove the stale lease ``stale`` (read just before) unless someone replaced it meanwhile."""
        aside = self.path.with_name(f"{self.path.name}.broken.{self.rec['token']}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        got = read_record(aside) or {}
        if stale.get("token") is not None and got.get("token") != stale.get("token"):
            # a fresh lease was taken between our read and our rename: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            return False
        aside.unlink(missing_ok=True)
        if got.get("token"):
            self.path.with_name(f"{self.path.name}.{got['token']}").unlink(missing_ok=True)
        return True

    # ------------------------------------------------------------------ holding it
    @staticmethod
    def _ended(state) -> bool:
        return state is not None and state[0] not in SLURM_LIVE_STATES

    def renew(self) -> None:
        """Renew the lease once (the heartbeat does this every ``ttl/6`` s). Sets the lost reason instead of
        raising; :meth:`check` raises it."""
        with self._io:
            if not self.held or self._lost:
                return
            if self.rec["job"]:
                st = self.job_state(self.rec["job"])
                node = self.rec.get("node")
                if self._ended(st) or (st and node and st[1] and st[1] != node):
                    self._lost = (f"SLURM says this process's job {self.rec['job']} has ended ({st[0]}"
                                  f"{', now on ' + st[1] if st[1] and st[1] != node else ''}); this orphan stops")
                    return
            t = self.clock()
            try:
                self._write_own(create=False)
            except OSError as e:
                self._lost = f"its renewal failed ({e})"
                return
            owner = self._owner()
            if owner is not None:
                self._lost = owner
                return
            self._confirmed = t

    def _owner(self) -> str | None:
        """None while ``<out>.lease`` still holds our token, else why not."""
        try:
            rec = read_record(self.path)
        except OSError as e:
            return f"the lease file cannot be read ({e})"
        if rec is None:
            return "the lease file was removed"
        if rec.get("token") != self.rec["token"]:
            return f"it was taken over by {describe(rec)}" if rec else "the lease file holds another record"
        return None

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this writer may write now (call before every batch's write and commit).

        Raises:
            LeaseLost: not held; the heartbeat found it lost (job ended, renewal failed, taken over); the last
                confirmed renewal is older than ``ttl/2`` s; or the lease file no longer holds our token.
        """
        with self._io:
            why = None
            if not self.held:
                why = "it was never taken or was released"
            elif self._lost:
                why = self._lost
            else:
                why = self._owner()
            if why is None and self.clock() - self._confirmed > self.ttl / 2:
                why = (f"it was last renewed {self.clock() - self._confirmed:.1f} s ago, more than ttl/2 = "
                       f"{self.ttl / 2:g} s (a hung file system or an overloaded node)")
        if why:
            raise LeaseLost(f"lost the lease on {self.output} ({describe(self.rec)}): {why}; stopping without "
                            "writing (its committed batches stay in the partial file for whoever holds the lease)")

    def _beat(self) -> None:
        every = self.ttl / 6
        while not self._stop.wait(every):
            self.renew()
            if self._lost:
                self.log(f"[lease] {self.path}: lost ({self._lost}); the writer stops at its next batch")
                return

    def release(self) -> None:
        """Stop the heartbeat and remove the lease if it is still ours (never another writer's). Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with self._io:
            if self.held and self._owner() is None:
                self.path.unlink(missing_ok=True)
            self.own.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "OutputLease":
        return self.acquire() if not self.held else self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False
