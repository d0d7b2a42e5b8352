"""One weight load per model per allocation: a per-model server process that keeps the weights
loaded while the GPU jobs of that model that run a forward pass (extract, extract_sula, extract_wind_tunnel,
intervene) hand it their work
(design: docs/design-notes.md "GPU economy").

Each GPU job stays its own Snakemake job (its own outputs, log, retry and rerun triggers); its script
calls :func:`run_task`, which

1. finds the server for (model directory, dtype, device, device_map) on this node and allocation
   (a Unix socket in ``<base>/llmgeom-models-<uid>/<host>-<key>``, base ``$LLMGEOM_MODEL_SERVER_DIR``, else a
   private ``$XDG_RUNTIME_DIR``, else ``$TMPDIR`` or /tmp (:func:`servers_root`); the key also holds the host
   name, ``SLURM_JOB_ID`` and ``CUDA_VISIBLE_DEVICES``, so two nodes or two allocations never share one), or
   starts it (``python -P -m llmgeom.pipeline.model_server``: the job's working directory is not on its
   ``sys.path``);
2. sends the task (function name and keyword arguments, the job's log file and threads) and waits;
3. returns the task's result, or raises :class:`ModelServerTaskError` with the server-side traceback
   (also written to the job's log). A failed task also drops the server's cached model, so the retry
   loads fresh weights.

The server runs tasks one at a time with ``reuse_model=True`` (``models.loading.load_prepared(reuse=True)``)
and writes each task's output to that job's log. Its lifetime follows the jobs that may still need it:
in a local run, the run's plan (:func:`write_plan`, called by the workflow's
``onstart`` with the jobs of :data:`SERVER_RULES` in the DAG) lists every job of each model that this run will
run; after a task, the client asks the server to exit (:func:`stop_server`) once every other planned job of
its model has written its outputs (:func:`pending_outputs`), so a finished model's weights leave memory while
the run goes on, and the weights are still loaded once per model per study. Without a plan (``--nohooks``, a
task run outside Snakemake) and as a safety net, it exits as soon as its *owner* exits, the outermost
``snakemake`` process among the job's ancestors (see :func:`owner_pid`). Inside a SLURM allocation it runs as its own job step
(:func:`srun_prefix`) and ends with the allocation, so no server outlives it. A job killed while its task
runs (scancel, time limit) takes the task with it: the server stops it at its next batch boundary (an
extraction keeps its committed batches for the retry) and exits before the task can write that job's
output, so a later rerun never finds an output of a job that Snakemake saw fail. Stop signals:
SLURM's warning ``--signal=USR1@<s>`` reaches the server's step, where the running extraction's handler
commits the batch in flight and stops (between tasks the server ignores SIGUSR1); the waiting client
forwards SIGUSR1/SIGTERM as a stop request over its connection (:func:`_forward_stop`) and fails with the
task's ``ExtractionInterrupted``, so Snakemake retries and the retry resumes. It sleeps between tasks (blocking ``accept`` and a watchdog blocked in ``select`` on
the owner's pidfd; no polling), and exits after ``LLMGEOM_MODEL_SERVER_IDLE_S`` seconds (default 3600)
without a task as a safety net. ``LLMGEOM_MODEL_SERVER=0`` runs every task in the job's own process instead.

**Among other users** (a shared login or compute node; design: docs/design-notes.md "GPU economy", *On a shared
node*). The servers' directory ``llmgeom-models-<uid>`` and each server's directory are created 0700 and checked
before every use (:func:`llmgeom.pipeline.private_ipc.private_dir`: a directory, not a symbolic link, owned by this
user, no group or other access, under a base whose every directory up to ``/``, as written and as resolved, is
root's or this user's, one that others may write to sticky, as /tmp: OpenSSH's ``safe_path``); nothing is created
in a base that fails. Every later step works through a descriptor of the server's directory
(:class:`llmgeom.pipeline.private_ipc.PrivateDir`): the socket is bound and reached inside it at
``/proc/self/fd/<fd>/sock`` however deep the directory (never at an abstract name, which another user could bind
first), the authkey is created 0600 from its first byte (``O_CREAT | O_EXCL``) and read only when it is this
user's and 0600. Both ends check the other's uid (``SO_PEERCRED``) before they read a byte, the client proves the
authkey by an HMAC of the server's nonce, and nothing that crosses the socket can run code when read:
length-prefixed JSON messages of at most 16 MiB (task name, keyword arguments, paths, the traceback of a failure),
the task's tables and arrays written as files by the task itself (CSV, ``.npz``, HDF5: the job's own outputs).
The client's connect and its read of the nonce time out (:data:`HANDSHAKE_TIMEOUT_S`), as does its wait for the
directory's lock (:data:`LOCK_TIMEOUT_S`); the server authenticates every connection at once in a thread of its
own (a busy server is never taken for a stuck one) and drops a client that does not prove the key or send its
request within :data:`AUTH_TIMEOUT_S`. Only the wait for a task's reply has no limit (the task takes its time;
the job's own limits bound it). Whatever fails a check (:class:`llmgeom.pipeline.private_ipc.UnsafePath`), and any
other failure to start or reach a server (a base that cannot be made, a server that exits while starting, a
listener that does not accept or answer, a lock held too long), is never waited on: the job says why in its log
and runs its task in its own process.

The client side imports only the standard library (a GPU job's process starts in well under a second).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib
import json
import os
import queue
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

#: task name -> "module:function" run by the server (keyword arguments from the job)
TASKS = {
    "extract": "llmgeom.extract.forward:extract_to_hdf5",
    "intervene": "llmgeom.interventions.runner:intervention_experiment",
    "key_orthogonality": "llmgeom.weights.key_orthogonality:key_orthogonality_from_dir",
}
#: task name -> "module:function" that writes a task's return value to the job's output files, ``writer(result,
#: **outputs)``, in the process that ran it: tables and arrays never cross the server's socket (JSON only)
TASK_WRITERS = {"intervene": "llmgeom.interventions.runner:write_intervention_outputs",
                "key_orthogonality": "llmgeom.weights.key_orthogonality:write_key_orthogonality"}

START_TIMEOUT_S = 300.0

#: the rules whose jobs hand their work to the model server (their scripts call :func:`run_task`): declared with
#: the other GPU rules in :data:`llmgeom.pipeline.cluster.GPU` (``server_task``)
from llmgeom.pipeline import private_ipc  # noqa: E402  (standard library only)
from llmgeom.pipeline.cluster import SERVER_RULES  # noqa: E402  (standard library only)
from llmgeom.pipeline.schema import call_with_config  # noqa: E402  (standard library only)

#: environment variable naming the run's plan file (:func:`write_plan`), inherited by the run's jobs
PLAN_ENV = "LLMGEOM_MODEL_SERVER_PLAN"


class ModelServerTaskError(RuntimeError):
    """A task failed inside the model server; the message holds the server-side traceback."""


def enabled() -> bool:
    """False when ``LLMGEOM_MODEL_SERVER`` is 0/false/no/off."""
    return os.environ.get("LLMGEOM_MODEL_SERVER", "1").strip().lower() not in ("0", "false", "no", "off")


def idle_seconds() -> float:
    """``LLMGEOM_MODEL_SERVER_IDLE_S`` (default 3600: a safety net; the server exits with its owner).

    Raises:
        ValueError: not a number > 0, naming the variable.
    """
    raw = os.environ.get("LLMGEOM_MODEL_SERVER_IDLE_S", "3600")
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise ValueError(f"LLMGEOM_MODEL_SERVER_IDLE_S={raw!r} must be a number of seconds > 0")
    return v


def _ancestors(pid: int):
    """(pid, argv) of ``pid`` and its ancestors, nearest first (Linux /proc)."""
    while pid > 1:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        yield pid, [a.decode(errors="replace") for a in argv if a]
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after the command name in parentheses


def _is_snakemake(argv: list[str]) -> bool:
    return any(a == "snakemake" or a.endswith("/snakemake") for a in argv[:3])


def owner_pid() -> int:
    """The process whose exit ends the model server: ``LLMGEOM_MODEL_SERVER_OWNER`` (a pid) when set, else
    the outermost ``snakemake`` process among this process's ancestors (locally the run; on SLURM the
    ``snakemake`` that runs the jobs of the allocation: the submitting one is on another host and no
    ancestor), else this process itself (a task run outside Snakemake, e.g. from a test).

    Raises:
        ValueError: ``LLMGEOM_MODEL_SERVER_OWNER`` is not a pid of a running process.
    """
    raw = os.environ.get("LLMGEOM_MODEL_SERVER_OWNER")
    if raw:
        if not raw.strip().isdigit():
            raise ValueError(f"LLMGEOM_MODEL_SERVER_OWNER={raw!r} must be a process id (a whole number)")
        return int(raw)
    found = [pid for pid, argv in _ancestors(os.getpid()) if _is_snakemake(argv)]
    return found[-1] if found else os.getpid()


def srun_prefix() -> list[str]:
    """Inside a SLURM allocation (``SLURM_JOB_ID`` set, ``srun`` on PATH; ``LLMGEOM_MODEL_SERVER_SRUN=0``
    turns it off): the ``srun`` command that starts the server as its own job step, sharing the
    allocation's CPUs, memory and GPUs (``--overlap``). A GPU job runs in a job step of its own
    (snakemake-executor-plugin-slurm-jobstep: ``srun -n1 ... snakemake --execute``), and SLURM ends every
    process of a step with the step, so a server started inside it would serve one job only; its own step
    lives until the allocation ends, when SLURM ends it (no server outlives its allocation). Else ``[]``.
    """
    if not os.environ.get("SLURM_JOB_ID") or os.environ.get("LLMGEOM_MODEL_SERVER_SRUN", "1").strip().lower() in (
            "0", "false", "no", "off"):
        return []
    import shutil

    srun = shutil.which("srun")
    if srun is None:
        return []
    return [srun, "--overlap", f"--jobid={os.environ['SLURM_JOB_ID']}", "-N1", "-n1", "--mem=0",
            f"--cpus-per-task={os.environ.get('SLURM_CPUS_ON_NODE', '1')}", "--job-name=llmgeom-model-server",
            "--quiet"]


def runtime_dir() -> Path | None:
    """``$XDG_RUNTIME_DIR`` where it is usable as the servers' base: an existing directory (no symbolic link) of
    this user's with no group or other access (systemd-logind's ``/run/user/<uid>``, 0700), under a base nobody
    else can change (:func:`llmgeom.pipeline.private_ipc.base_problems`); else None."""
    raw = os.environ.get("XDG_RUNTIME_DIR")
    if not raw or not os.path.isabs(raw):
        return None
    try:  # the check of every private directory of the server (one home: private_ipc)
        return private_ipc.check_private_dir(raw)
    except (private_ipc.UnsafePath, OSError):
        return None


def servers_root() -> Path:
    """The directory of this user's model servers and run plans, ``<base>/llmgeom-models-<uid>``, with base
    ``$LLMGEOM_MODEL_SERVER_DIR`` when set, else ``$XDG_RUNTIME_DIR`` where it is this user's and 0700
    (:func:`runtime_dir`: a per-user directory nobody else can write to, so a squatter in the shared temporary
    directory costs nothing), else ``$TMPDIR``, else /tmp; an absolute path. Created and checked private (0700,
    this user's, no link, in a base nobody else can change) before each use, by
    :func:`llmgeom.pipeline.private_ipc.private_dir`."""
    base = os.environ.get("LLMGEOM_MODEL_SERVER_DIR") or runtime_dir() or os.environ.get("TMPDIR") or "/tmp"
    return Path(os.path.abspath(base)) / f"llmgeom-models-{os.getuid()}"


def host_name() -> str:
    """This node's host name, as a file name part (characters other than letters, digits, ``.``, ``_`` and ``-``
    replaced by ``_``; at most 64): part of every server's directory name and of the run's plan file name, so that
    nodes sharing a file system for the base never use or remove each other's sockets."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def server_dir(load: dict) -> Path:
    """The directory of the server for ``load`` (model_dir, dtype, device, device_map) on this node (its host name
    leads the name) in this allocation, for this version of the package code (an edited source file gets a new
    server: no stale code)."""
    pkg = Path(__file__).resolve().parents[1]  # a changed package source starts a new server (new code)
    code = hashlib.sha256(repr(sorted((str(f), f.stat().st_mtime_ns) for f in pkg.rglob("*.py"))).encode()).hexdigest()
    ident = dict(load, model_dir=str(Path(load["model_dir"]).resolve()), code=code,
                 owner="allocation" if srun_prefix() else owner_pid(), host=socket.gethostname(),
                 job=os.environ.get("SLURM_JOB_ID", ""), gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                 python=sys.executable, path=os.environ.get("PYTHONPATH", ""))
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return servers_root() / f"{host_name()}-{key}"


#: the server's socket and authkey, in its directory (:class:`llmgeom.pipeline.private_ipc.PrivateDir`)
SOCKET, AUTHKEY = "sock", "authkey"


class ServerUnavailable(RuntimeError):
    """A server of this user's that cannot be used now (it does not accept, does not answer within the timeout,
    or its directory's lock is held too long); the job runs its task in its own process."""


#: seconds a client waits for the server's nonce once connected (the server authenticates every connection at
#: once, in a thread of its own, whatever task it runs)
HANDSHAKE_TIMEOUT_S = 30.0


def _connect(d: Path):
    """An authenticated channel to the running server of ``d``, or None when none runs there (no directory,
    no authkey, no socket, nothing listening on it, or a server that closed on us).

    The directory is opened and checked to be this user's and private (every file named relative to its
    descriptor), the authkey too, the socket is reached inside it (``/proc/self/fd/<fd>/sock``: never an
    abstract name), the listener's uid is checked before its nonce is read, and the client proves the key by
    the HMAC-SHA256 of that nonce (the key itself never crosses the socket). The connect and the nonce's read
    time out after :data:`HANDSHAKE_TIMEOUT_S`; the returned channel has no timeout (a task takes its time).

    Raises:
        private_ipc.UnsafePath: the directory, the authkey or the listener is not this user's own.
        ServerUnavailable: a listener that does not accept (backlog full) or does not answer in time.
    """
    if not os.path.lexists(d):
        return None
    with private_ipc.PrivateDir(d) as pd:
        try:
            key = bytes.fromhex(private_ipc.read_secret(AUTHKEY, dir_fd=pd.fd).decode())
        except FileNotFoundError:
            return None
        except ValueError:  # half a key: a server still writing it (write_secret renames it whole, so only a stale one)
            return None
        if not pd.exists(SOCKET):
            return None
        try:
            chan = private_ipc.connect(pd.address(SOCKET), timeout=HANDSHAKE_TIMEOUT_S)
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # a stale socket file: its server is gone
        except OSError as e:  # EAGAIN (its backlog is full), a timeout: it is there but does not accept
            raise ServerUnavailable(f"the model server at {d / SOCKET} does not accept connections ({e!r})") from None
    try:
        hello = chan.recv()
        chan.send({"auth": hmac.new(key, bytes.fromhex(hello["nonce"]), "sha256").hexdigest()})
    except TimeoutError:
        chan.close()
        raise ServerUnavailable(f"the model server at {d / SOCKET} accepted but sent no nonce within "
                                f"{HANDSHAKE_TIMEOUT_S:.0f} s") from None
    except (EOFError, OSError, ValueError, KeyError, TypeError):
        chan.close()
        return None
    chan.sock.settimeout(None)
    return chan


#: seconds a client waits for the lock of a server's directory (held while another job starts that server)
LOCK_TIMEOUT_S = START_TIMEOUT_S + 60.0


def _lock(pd, timeout: float | None = None) -> int:
    """The exclusive lock of the server directory ``pd`` (file ``lock``), a descriptor; waits at most ``timeout``
    seconds (default :data:`LOCK_TIMEOUT_S`).

    Raises:
        ServerUnavailable: still held after ``timeout`` seconds.
    """
    import fcntl

    timeout = LOCK_TIMEOUT_S if timeout is None else timeout
    fd = pd.open("lock", os.O_RDWR | os.O_CREAT)
    t0 = time.time()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.time() - t0 > timeout:
                os.close(fd)
                raise ServerUnavailable(f"{pd.path / 'lock'} held for over {timeout:.0f} s by another job") from None
            time.sleep(0.1)


def _start(d: Path, load: dict):
    """Connection to a running server for ``d``, starting one if needed (a file lock keeps it to one).

    Raises:
        private_ipc.UnsafePath: the servers' directory, ``d`` or a listener at its address is not this user's.
        ServerUnavailable: a server that does not accept or answer, or a lock held too long.
        RuntimeError: the server exited while starting, or did not start within ``START_TIMEOUT_S``.
        OSError: a directory cannot be made (a base this user cannot write).
    """
    private_ipc.private_dir(servers_root())
    private_ipc.private_dir(d)
    with private_ipc.PrivateDir(d) as pd:
        lk = _lock(pd)
        try:
            conn = _connect(d)
            if conn is not None:
                return conn
            _remove_socket(pd)
            proc = _spawn(pd, load)
            t0 = time.time()
            while time.time() - t0 < START_TIMEOUT_S:
                conn = _connect(d)
                if conn is not None:
                    return conn
                if proc.poll() is not None:
                    raise RuntimeError(f"the model server exited with status {proc.returncode} while starting; "
                                       f"see {d / 'server.log'} (or set LLMGEOM_MODEL_SERVER=0)")
                time.sleep(0.1)
            proc.kill()
            raise RuntimeError(f"the model server did not start within {START_TIMEOUT_S:.0f} s; see {d / 'server.log'}")
        finally:
            os.close(lk)


def _spawn(pd, load: dict) -> subprocess.Popen:
    """Start the server process of the directory ``pd`` (its own job step inside a SLURM allocation,
    :func:`srun_prefix`), with ``python -P``: the job's working directory is not put on the long-lived server's
    ``sys.path`` (a module file there would shadow the standard library's or the package's)."""
    log = os.fdopen(pd.open("server.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a")
    prefix, env = srun_prefix(), os.environ.copy()
    if prefix:  # SLURM keeps only allocation-level settings for the new step (as the jobstep plugin does)
        env = {k: v for k, v in env.items() if not (k.startswith(("SRUN_", "SBATCH_")) or (
            k.startswith("SLURM_") and k not in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF", "SLURM_CLUSTER_NAME")))}
    owner = "" if prefix else str(owner_pid())
    with log:
        return subprocess.Popen([*prefix, sys.executable, "-P", "-m", "llmgeom.pipeline.model_server", str(pd.path),
                                 json.dumps(load), owner], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)


def _function(name: str):
    mod, fn = name.split(":")
    return getattr(importlib.import_module(mod), fn)


def _call(task: str, kwargs: dict, outputs: dict, reuse: bool):
    """Run ``task``; with a writer (:data:`TASK_WRITERS`) its result goes to the files ``outputs`` and those
    paths are returned, else the task's own return value."""
    kwargs = dict(kwargs)
    result = call_with_config(_function(TASKS[task]), kwargs.pop("cfg", {}), **kwargs, reuse_model=reuse)
    if task not in TASK_WRITERS:
        return result
    _function(TASK_WRITERS[task])(result, **outputs)
    return dict(outputs)


def _output_files(req: dict) -> list[str]:
    """The files the task of a request writes: ``out_path`` among its keyword arguments, and its ``outputs``."""
    out = [req.get("kwargs", {}).get("out_path")] + list((req.get("outputs") or {}).values())
    return [str(o) for o in out if o]


def _run_here(task: str, kwargs: dict, outputs: dict, log: str, threads: int, why: str):
    """Run ``task`` in this process (the server is off, or refused: ``why``, written to the job's log)."""
    from llmgeom.pipeline.jobs import run_logged

    from llmgeom.models import loading

    with run_logged(log, threads=threads):  # sets the job's torch / BLAS threads
        print(f"[model server off] {why}", flush=True)
        before = sum(loading.LOADS.values())
        out = _call(task, kwargs, outputs, reuse=False)
        print(f"[model server off] task {task} in the job's process; weights loaded for it: "
              f"{sum(loading.LOADS.values()) - before}", flush=True)
        return out


def run_task(task: str, kwargs: dict, *, load: dict, log: str, threads: int = 1, outputs: dict | None = None):
    """Run ``task`` ("extract" | "intervene") with ``kwargs`` on the model server for ``load``
    ({"model_dir", "dtype", "device", "device_map"}), or in this process when the server is off or when its
    directory or socket fails the checks of :mod:`llmgeom.pipeline.private_ipc` (the reason goes to the job's
    log and to stderr; nothing of the refused path is used).

    ``outputs`` (name -> path): the files that the task's writer (:data:`TASK_WRITERS`) writes its result to,
    in the process that ran it ("intervene": per_prompt_path, axes_path, vectors_path).

    Returns:
        the task function's return value, as JSON gives it back (``extract_to_hdf5``: the output path); for a
        task with a writer, ``outputs``.

    Raises:
        ModelServerTaskError: the task failed in the server (its traceback is in the message and the job log).
        ValueError: an unknown task.
        TypeError: ``kwargs`` hold a value that JSON cannot carry (the server takes JSON only).
    """
    if task not in TASKS:
        raise ValueError(f"unknown model-server task {task!r}; valid: {', '.join(TASKS)}")
    try:
        json.dumps([kwargs, outputs])
    except TypeError as e:
        raise TypeError(f"the keyword arguments of model-server task {task!r} must be JSON values: {e}") from None
    if not enabled():
        return _run_here(task, kwargs, outputs or {}, log, threads, "LLMGEOM_MODEL_SERVER=0")
    from llmgeom.pipeline.jobs import process_age

    request = {"task": task, "kwargs": kwargs, "outputs": outputs or {}, "log": str(Path(log).resolve()),
               "threads": int(threads), "cwd": os.getcwd(), "pid": os.getpid(),
               "startup_s": process_age()}  # the job's own start-up, the first line the server writes to its log
    try:  # any failure to start or reach a server (nothing of the task sent yet): the task runs here
        conn = _start(server_dir(load), load)
        try:
            conn.send(request)
        except BaseException:
            conn.close()
            raise
    except Exception as e:
        why = e if isinstance(e, (private_ipc.UnsafePath, RuntimeError)) else f"{type(e).__name__}: {e}"
        print(f"[model server] not used: {why}", file=sys.stderr, flush=True)
        return _run_here(task, kwargs, outputs or {}, log, threads,
                         f"the model server is not used, the task runs here: {why}")
    with conn:
        with _forward_stop(conn):
            try:
                reply = conn.recv()  # no timeout: the task takes its time (the job's own limits bound it)
            except EOFError:
                raise ModelServerTaskError(f"{task}: the model server closed the connection before it replied "
                                           f"(it exited: see {server_dir(load) / 'server.log'}; log {log})") from None
    if not reply["ok"]:
        raise ModelServerTaskError(f"{task} failed in the model server (pid {reply.get('pid')}; log {log}):\n"
                                   f"{reply['error']}")
    _stop_when_last(load, log)
    return reply["result"]


#: signals a waiting client forwards to its task in the server (SLURM's ``--signal=USR1@<s>`` warning before the
#: time limit; SIGTERM from scancel, preemption or the time limit itself)
STOP_SIGNALS = ("SIGUSR1", "SIGTERM")


@contextlib.contextmanager
def _forward_stop(conn):
    """While the client waits for its reply: SIGUSR1/SIGTERM ask the server to stop the task at its next
    batch boundary (``__stop_task__`` on the task's connection) instead of killing the client; the client
    then gets the task's failure as its reply and exits non-zero (Snakemake retries; the retry resumes).
    Only in the main thread (where Python runs signal handlers)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame):
        print(f"[model server client] {signal.Signals(signum).name}: asking the server to stop the task",
              file=sys.stderr, flush=True)
        with contextlib.suppress(OSError, ValueError):
            conn.send({"task": "__stop_task__", "signal": int(signum)})

    old = {sig: signal.signal(getattr(signal, sig), forward) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(getattr(signal, sig), h)


def stop_server(load: dict) -> bool:
    """Ask the server for ``load`` to exit now (its model is freed); False when none is running (or its
    directory is not this user's private one: then it is not ours to stop)."""
    try:
        conn = _connect(server_dir(load))
    except (private_ipc.UnsafePath, ServerUnavailable, OSError):
        return False
    if conn is None:
        return False
    with conn:
        with contextlib.suppress(EOFError, OSError, ValueError):
            conn.sock.settimeout(STOP_TIMEOUT_S)
            conn.send({"task": "__stop__"})
            conn.recv()
    return True


#: seconds :func:`stop_server` waits for the server's acknowledgement (it comes once a running task has ended)
STOP_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- the run's plan (local runs)


def write_plan(jobs, path: str | os.PathLike | None = None) -> Path | None:
    """Write the plan of a local run: for each model directory, the model-server jobs this run will run, and
    point :data:`PLAN_ENV` at it (the run's jobs inherit the variable). Called by the workflow's ``onstart``
    (workflow/rules/common.smk) with the jobs of :data:`SERVER_RULES` in the DAG, so a run that targets a
    subset plans only that subset.

    Args:
        jobs: iterable of (model_dir, log, outputs): the job's ``model`` input, its log file (which identifies
            the job to :func:`pending_outputs`) and its output files; relative paths are taken from the
            current directory (the run's working directory).
        path: where to write the plan (JSON); default ``plan-<host>-<pid>.json`` in the servers' directory
            (private: :func:`llmgeom.pipeline.private_ipc.private_dir`; the host name as in :func:`host_name`).

    Returns:
        the plan file's path; None when the servers' directory fails its check or cannot be made or written
        (said on stderr; the run's tasks then run in their own processes, see :func:`run_task`, and need no
        plan).
    """
    plan = {"created": time.time(), "models": {}}
    for model_dir, log, outputs in jobs:
        plan["models"].setdefault(str(Path(model_dir).resolve()), []).append(
            {"log": str(Path(log).resolve()), "outputs": [str(Path(o).resolve()) for o in outputs]})
    if path is None:
        try:
            root = private_ipc.private_dir(servers_root())
            path = root / f"plan-{host_name()}-{os.getpid()}.json"
            tmp = path.with_name(path.name + ".partial")
            tmp.write_text(json.dumps(plan))
            tmp.replace(path)
        except (private_ipc.UnsafePath, OSError) as e:
            os.environ.pop(PLAN_ENV, None)
            print(f"[model server] no run plan written: {e}", file=sys.stderr, flush=True)
            return None
        os.environ[PLAN_ENV] = str(path)
        return path
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(plan))
    tmp.replace(path)
    os.environ[PLAN_ENV] = str(path)
    return path


def pending_outputs(plan: dict, model_dir: str | os.PathLike, log: str | os.PathLike) -> list[str] | None:
    """Outputs of the planned jobs of ``model_dir`` other than the job of ``log`` that this run has not yet
    written: missing, or older than the plan (an output of an earlier run that this run redoes). None when the
    plan has no job of that model (then nothing is decided from it)."""
    entries = plan["models"].get(str(Path(model_dir).resolve()))
    if entries is None:
        return None
    me = str(Path(log).resolve())
    left = []
    for e in entries:
        if e["log"] == me:
            continue
        for o in e["outputs"]:
            try:
                if os.stat(o).st_mtime >= plan["created"]:
                    continue
            except OSError:
                pass
            left.append(o)
    return left


def _stop_when_last(load: dict, log: str) -> bool:
    """After a task of a local run: stop the model's server when the run's plan (:data:`PLAN_ENV`) has no other
    job of the model left to run (:func:`pending_outputs`); noted in the job's log. Inside a SLURM allocation
    the server ends with the allocation (nothing done here). True when it asked the server to exit."""
    path = os.environ.get(PLAN_ENV)
    if not path or srun_prefix() or os.environ.get("SLURM_JOB_ID"):
        return False
    try:
        plan = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    left = pending_outputs(plan, load["model_dir"], log)
    if left is None or left:
        return False
    stopped = stop_server(load)
    with contextlib.suppress(OSError), open(log, "a") as f:
        print(f"[model server client] the run's last job of {load['model_dir']}: server asked to exit "
              f"({'stopped' if stopped else 'none running'})", file=f)
    return stopped


# --------------------------------------------------------------------------- server side


def _pidfd(pid: int):
    """A pidfd of ``pid`` (readable once it exits), or None where the kernel has none or it is gone."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


#: seconds a task stopped because its client went away may take to commit its batch in flight and end
STOP_GRACE_S = 60.0


def _request_stop(why: str) -> bool:
    """Ask the task running in the server's main thread to stop at its next batch boundary: SIGUSR1 to this
    process where the task handles it (``extract_to_hdf5``: the batch in flight is committed, the partial
    file closed, ``ExtractionInterrupted`` raised). False where the task does not (it would kill the server)."""
    import signal

    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, signal.SIG_IGN, None):
        return False
    print(f"[model server] {why}: stopping the task at its next batch boundary", flush=True)
    os.kill(os.getpid(), signal.SIGUSR1)
    return True


def _stop_on_request(conn, done: threading.Event) -> None:
    """During a task: read the task's connection; a ``__stop_task__`` from the client (it got SIGUSR1/SIGTERM,
    see :func:`_forward_stop`) stops the task. Ends when the client closes the connection."""
    with contextlib.suppress(EOFError, OSError, ValueError):
        while not done.is_set():
            msg = conn.recv()
            if isinstance(msg, dict) and msg.get("task") == "__stop_task__" and not done.is_set():
                _request_stop(f"the client asked (signal {msg.get('signal')})")


def _exit_when_gone(pid: int, what: str, d: "private_ipc.PrivateDir", done: threading.Event | None = None) -> None:
    """Block until ``pid`` exits or ``done`` is set (the task it waits for has ended); exit the server when
    ``pid`` went first: at once when idle (``done`` None), and for a task after asking it to stop
    (:func:`_request_stop`) and giving it ``STOP_GRACE_S`` to commit and end (the main loop then sees the
    client gone and writes no output for it). Blocks in ``select`` on a pidfd (a 1 s liveness check where
    there is none)."""
    import select

    fd = _pidfd(pid)
    try:
        while not (done is not None and done.is_set()):
            if fd is None:
                if _gone(pid):
                    break
                time.sleep(1.0)
            elif select.select([fd], [], [], None if done is None else 1.0)[0]:
                break
        else:
            return
        if done is not None and done.is_set():  # the task ended (its reply is on the way): nothing to abandon
            return
    finally:
        if fd is not None:
            os.close(fd)
    if done is not None and _request_stop(f"{what} (pid {pid}) exited") and done.wait(STOP_GRACE_S):
        return  # the task ended: the main loop writes no output for the gone client
    print(f"[model server] {what} (pid {pid}) exited; exiting", flush=True)
    _remove_socket(d)
    os._exit(0 if done is None else 1)


def _gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _remove_socket(d: "private_ipc.PrivateDir") -> None:
    """Remove the socket and the authkey from the server directory ``d`` (by its descriptor)."""
    for f in (SOCKET, AUTHKEY):
        d.unlink(f)


#: seconds a connecting client has to answer the nonce, and to send its request once dequeued
AUTH_TIMEOUT_S = 10.0


def _accept(listener, key: bytes):
    """The next connection of this user's whose HMAC of a fresh nonce proves the authkey, else None (refused
    and closed: another user's process before a byte is read, a wrong or missing key before any request is
    read, no answer within ``AUTH_TIMEOUT_S``; noted in the server's log)."""
    try:
        chan = private_ipc.accept(listener)
    except (private_ipc.UnsafePath, OSError) as e:
        print(f"[model server] refused a connection: {e}", flush=True)
        return None
    nonce = secrets.token_bytes(32)
    try:
        chan.sock.settimeout(AUTH_TIMEOUT_S)
        chan.send({"nonce": nonce.hex()})
        msg = chan.recv()
        chan.sock.settimeout(None)
        proof = msg.get("auth") if isinstance(msg, dict) else None
        good = isinstance(proof, str) and hmac.compare_digest(proof, hmac.new(key, nonce, "sha256").hexdigest())
    except (EOFError, OSError, ValueError) as e:
        good, proof = False, repr(e)
    if not good:
        print("[model server] refused a connection: it did not prove the authkey", flush=True)
        chan.close()
        return None
    return chan


def _acceptor(listener, key: bytes, ready: "queue.Queue", activity: threading.Event) -> None:
    """The server's accepting thread: authenticates each connection at once (:func:`_accept`), whatever task the
    main thread runs, and queues it for the main thread; so a client's connect and nonce never wait for a task
    (their timeouts mean a server that is stuck, not one that is busy)."""
    while True:
        chan = _accept(listener, key)
        if chan is not None:
            activity.set()  # a queued connection is no idle time
            ready.put(chan)


def _watchdogs(d: "private_ipc.PrivateDir", idle_s: float, owner: int | None, state: dict):
    """Start the idle watchdog (exit after ``idle_s`` s without a task) and, with ``owner``, the thread that
    exits with it; returns (activity, busy): set ``activity`` on every task start and end, ``busy`` during one."""
    activity, busy = threading.Event(), threading.Event()

    def idle_watchdog():
        while True:
            if activity.wait(None if busy.is_set() else idle_s):  # blocks: no polling
                activity.clear()
                continue
            if not busy.is_set():
                print(f"[model server] idle for {idle_s:.0f} s after {state['tasks']} tasks; exiting", flush=True)
                _remove_socket(d)
                os._exit(0)

    threading.Thread(target=idle_watchdog, daemon=True).start()
    if owner is not None:
        threading.Thread(target=_exit_when_gone, args=(owner, "the owner", d), daemon=True).start()
    return activity, busy


def _abandon_if_gone(req: dict, d: "private_ipc.PrivateDir") -> None:
    """Exit the server, removing the task's outputs, when the client of ``req`` has exited: a job Snakemake saw
    fail never gets an output."""
    if not (req.get("pid") and _gone(int(req["pid"]))):
        return
    for out in _output_files(req):
        with contextlib.suppress(FileNotFoundError):
            Path(out).unlink()
    print(f"[model server] the client of {req['log']} (pid {req['pid']}) exited; its outputs removed; exiting",
          flush=True)
    _remove_socket(d)
    os._exit(1)


def _run_request(req: dict, d: "private_ipc.PrivateDir") -> dict:
    """Run the task of ``req`` in this process with the job's log, threads and working directory; the reply."""
    from llmgeom.models import loading
    from llmgeom.pipeline.jobs import run_logged, set_threads

    t0 = time.time()
    before = sum(loading.LOADS.values())
    try:
        if req.get("task") not in TASKS:
            raise ValueError(f"unknown model-server task {req.get('task')!r}")
        os.chdir(req["cwd"])
        with run_logged(req["log"], threads=req["threads"], startup=req.get("startup_s", float("nan"))):
            set_threads(req["threads"])
            print(f"[model server] pid {os.getpid()}: task {req['task']} (model kept loaded between tasks; "
                  f"LLMGEOM_MODEL_SERVER=0 runs it in the job's process)", flush=True)
            result = _call(req["task"], req["kwargs"], req.get("outputs") or {}, reuse=True)
            _abandon_if_gone(req, d)  # died before the end: no output for it
            print(f"[model server] task done in {time.time() - t0:.1f} s; weights loaded for it: "
                  f"{sum(loading.LOADS.values()) - before} (this server: {dict(loading.LOADS)})", flush=True)
        reply = {"ok": True, "result": _jsonable(result), "pid": os.getpid(), "loads": dict(loading.LOADS)}
    except Exception as e:
        loading.clear_model_cache()  # the retry starts from fresh weights
        reply = {"ok": False, "error": traceback.format_exc(), "pid": os.getpid(),
                 "exit_code": getattr(e, "exit_code", None)}  # ExtractionInterrupted: 128 + signal
    print(f"[model server] {req.get('task')} -> {req.get('log')}: {'ok' if reply['ok'] else 'FAILED'} "
          f"({time.time() - t0:.1f} s)", flush=True)
    return reply


def _jsonable(result):
    """A task's return value as JSON carries it: paths as strings (tables and arrays never: they are files)."""
    if isinstance(result, os.PathLike):
        return os.fspath(result)
    if isinstance(result, dict):
        return {str(k): _jsonable(v) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return [_jsonable(v) for v in result]
    return result


def _serve_connection(chan, d: "private_ipc.PrivateDir", state: dict) -> None:
    """One authenticated connection: a ``__stop__`` request, or one task with its stop requests and reply."""
    done = threading.Event()
    try:
        chan.sock.settimeout(AUTH_TIMEOUT_S)  # the client sent its request right after the handshake
        req = chan.recv()
        chan.sock.settimeout(None)
        if not isinstance(req, dict):
            raise ValueError(f"a request that is no JSON object: {req!r:.80}")
        if req.get("task") == "__stop__":
            print(f"[model server] stopped after {state['tasks']} tasks", flush=True)
            _remove_socket(d)
            chan.send({"ok": True})
            chan.close()
            os._exit(0)
        if req.get("pid"):  # the job's process: if it dies mid-task, its output is never written
            threading.Thread(target=_exit_when_gone, args=(int(req["pid"]), f"the client of {req.get('log')}", d,
                                                           done), daemon=True).start()
        reader = threading.Thread(target=_stop_on_request, args=(chan, done), daemon=True)
        reader.start()
        reply = _run_request(req, d)
        if req.get("pid") and _gone(int(req["pid"])):  # stopped because its client went away (_exit_when_gone)
            print(f"[model server] the client of {req['log']} (pid {req['pid']}) exited; exiting", flush=True)
            _remove_socket(d)
            os._exit(1)
        done.set()  # before the reply: a client that exits once it has it is no abandoned task
        with contextlib.suppress(OSError):
            chan.send(reply)
        reader.join(timeout=5.0)  # the client closes the connection once it has the reply
    except (EOFError, OSError, ValueError) as e:
        print(f"[model server] client went away or sent no request: {e!r}", flush=True)
    finally:
        done.set()


def serve(d: Path, load: dict, idle_s: float | None = None, owner: int | None = None) -> None:
    """Serve tasks for one model from the directory ``d`` until ``owner`` (a pid; default: none) exits, a
    ``__stop__`` request, or ``idle_s`` seconds without a task (see the module docstring). A task whose client
    (the job's process) exits before it ends is abandoned: the server exits without writing its output.
    The socket is bound inside ``d`` through its descriptor (``/proc/self/fd/<fd>/sock``), never at an
    abstract name; connections are authenticated by a thread of their own and their tasks run one at a time.

    Raises:
        private_ipc.UnsafePath: ``d`` is not a private directory of this user's (nothing is bound or written).
        OSError: the socket address is taken (a file is there).
    """
    import signal

    idle_s = idle_seconds() if idle_s is None else idle_s
    # SLURM's warning (--signal=USR1@<s>, to every step) stops an extraction at a batch boundary (its own
    # handler, while it runs); between tasks or during one without a stop point it must not kill the server
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    pd = private_ipc.PrivateDir(d)  # held for the server's life: every file named relative to it
    key = secrets.token_bytes(32)
    listener = private_ipc.listen(pd.address(SOCKET))
    private_ipc.write_secret(AUTHKEY, key.hex().encode(), dir_fd=pd.fd)
    state = {"tasks": 0}
    activity, busy = _watchdogs(pd, idle_s, owner, state)
    ready = queue.Queue()
    threading.Thread(target=_acceptor, args=(listener, key, ready, activity), daemon=True).start()
    print(f"[model server] pid {os.getpid()} serving {load} at {str(pd.path / SOCKET)!r} (owner pid {owner})",
          flush=True)
    while True:
        chan = ready.get()
        busy.set()
        activity.set()
        try:
            _serve_connection(chan, pd, state)
        finally:
            chan.close()
            state["tasks"] += 1
            busy.clear()
            activity.set()


if __name__ == "__main__":  # started by run_task: python -P -m llmgeom.pipeline.model_server <dir> <load> <owner>
    from llmgeom.pipeline.jobs import unfailing

    # a print on a full disk (server.log) loses its line, never the server: the client gets the task's own error
    sys.stdout, sys.stderr = unfailing(sys.stdout), unfailing(sys.stderr)
    serve(Path(sys.argv[1]), json.loads(sys.argv[2]), owner=int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None)
