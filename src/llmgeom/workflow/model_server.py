"""One weight load per model per allocation: a per-model server process that keeps the weights
loaded while the GPU jobs of that model that run a forward pass (extract, extract_sula, extract_wind_tunnel,
intervene) hand it their work
(issue 13 item 1; design: docs/design-notes.md "GPU economy").

Each GPU job stays its own Snakemake job (its own outputs, log, retry and rerun triggers); its script
calls :func:`run_task`, which

1. finds the server for (model directory, dtype, device, device_map) on this node and allocation
   (a Unix socket under ``$LLMGEOM_MODEL_SERVER_DIR``, default ``$TMPDIR`` or /tmp, keyed also by
   ``SLURM_JOB_ID`` and ``CUDA_VISIBLE_DEVICES`` so two allocations never share one), or starts it;
2. sends the task (function name and keyword arguments, the job's log file and threads) and waits;
3. returns the task's result, or raises :class:`ModelServerTaskError` with the server-side traceback
   (also written to the job's log). A failed task also drops the server's cached model, so the retry
   loads fresh weights.

The server runs tasks one at a time with ``reuse_model=True`` (``models.loading.load_prepared(reuse=True)``),
writes each task's output to that job's log, and exits after ``LLMGEOM_MODEL_SERVER_IDLE_S`` seconds
(default 120) without a task, or with the allocation. ``LLMGEOM_MODEL_SERVER=0`` runs every task in
the job's own process instead (the behaviour before issue 13).

The client side imports only the standard library (a GPU job's process starts in well under a second).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import secrets
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
}

START_TIMEOUT_S = 300.0


class ModelServerTaskError(RuntimeError):
    """A task failed inside the model server; the message holds the server-side traceback."""


def enabled() -> bool:
    """False when ``LLMGEOM_MODEL_SERVER`` is 0/false/no/off."""
    return os.environ.get("LLMGEOM_MODEL_SERVER", "1").strip().lower() not in ("0", "false", "no", "off")


def idle_seconds() -> float:
    """``LLMGEOM_MODEL_SERVER_IDLE_S`` (default 120).

    Raises:
        ValueError: not a number > 0, naming the variable.
    """
    raw = os.environ.get("LLMGEOM_MODEL_SERVER_IDLE_S", "120")
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise ValueError(f"LLMGEOM_MODEL_SERVER_IDLE_S={raw!r} must be a number of seconds > 0")
    return v


def server_dir(load: dict) -> Path:
    """The directory of the server for ``load`` (model_dir, dtype, device, device_map) in this allocation,
    for this version of the package code (an edited source file gets a new server: no stale code)."""
    base = Path(os.environ.get("LLMGEOM_MODEL_SERVER_DIR") or os.environ.get("TMPDIR") or "/tmp")
    pkg = Path(__file__).resolve().parents[1]  # a changed package source starts a new server (new code)
    code = hashlib.sha256(repr(sorted((str(f), f.stat().st_mtime_ns) for f in pkg.rglob("*.py"))).encode()).hexdigest()
    ident = dict(load, model_dir=str(Path(load["model_dir"]).resolve()), code=code,
                 job=os.environ.get("SLURM_JOB_ID", ""), gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                 python=sys.executable, path=os.environ.get("PYTHONPATH", ""))
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return base / f"llmgeom-models-{os.getuid()}" / key


def _connect(d: Path):
    from multiprocessing.connection import Client

    sock, auth = d / "sock", d / "authkey"
    if not (sock.exists() and auth.exists()):
        return None
    try:
        return Client(str(sock), family="AF_UNIX", authkey=bytes.fromhex(auth.read_text().strip()))
    except (OSError, EOFError, ValueError):
        return None


def _start(d: Path, load: dict):
    """Connection to a running server for ``d``, starting one if needed (a file lock keeps it to one)."""
    import fcntl

    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(d / "lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        conn = _connect(d)
        if conn is not None:
            return conn
        for f in ("sock", "authkey"):
            with contextlib.suppress(FileNotFoundError):
                (d / f).unlink()
        log = open(d / "server.log", "a")
        proc = subprocess.Popen([sys.executable, "-m", "llmgeom.workflow.model_server", str(d),
                                 json.dumps(load)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=os.environ.copy())
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


def _call(task: str, kwargs: dict, reuse: bool):
    mod, fn = TASKS[task].split(":")
    f = getattr(importlib.import_module(mod), fn)
    return f(**kwargs, reuse_model=reuse)


def run_task(task: str, kwargs: dict, *, load: dict, log: str, threads: int = 1):
    """Run ``task`` ("extract" | "intervene") with ``kwargs`` on the model server for ``load``
    ({"model_dir", "dtype", "device", "device_map"}), or in this process when the server is off.

    Returns:
        the task function's return value (``extract_to_hdf5``: the output path; ``intervention_experiment``:
        (per_prompt DataFrame, axes DataFrame, arrays dict)).

    Raises:
        ModelServerTaskError: the task failed in the server (its traceback is in the message and the job log).
        ValueError: an unknown task.
    """
    if task not in TASKS:
        raise ValueError(f"unknown model-server task {task!r}; valid: {', '.join(TASKS)}")
    if not enabled():
        from llmgeom.workflow.jobs import run_logged, set_threads

        from llmgeom.models import loading

        with run_logged(log, threads=threads):
            set_threads(threads)
            before = sum(loading.LOADS.values())
            out = _call(task, kwargs, reuse=False)
            print(f"[model server off] task {task} in the job's process; weights loaded for it: "
                  f"{sum(loading.LOADS.values()) - before}", flush=True)
            return out
    d = server_dir(load)
    conn = _start(d, load)
    with conn:
        conn.send({"task": task, "kwargs": kwargs, "log": str(Path(log).resolve()), "threads": int(threads),
                   "cwd": os.getcwd()})
        reply = conn.recv()
    if not reply["ok"]:
        raise ModelServerTaskError(f"{task} failed in the model server (pid {reply.get('pid')}; log {log}):\n"
                                   f"{reply['error']}")
    return reply["result"]


def stop_server(load: dict) -> bool:
    """Ask the server for ``load`` to exit now (its model is freed); False when none is running."""
    conn = _connect(server_dir(load))
    if conn is None:
        return False
    with conn:
        conn.send({"task": "__stop__"})
        with contextlib.suppress(EOFError, OSError):
            conn.recv()
    return True


# --------------------------------------------------------------------------- server side


def serve(d: Path, load: dict, idle_s: float | None = None) -> None:
    """Serve tasks for one model from ``d`` until idle for ``idle_s`` seconds (see the module docstring)."""
    from multiprocessing.connection import Listener

    idle_s = idle_seconds() if idle_s is None else idle_s
    key = secrets.token_bytes(32)
    listener = Listener(str(d / "sock"), family="AF_UNIX", authkey=key)
    tmp = d / "authkey.partial"
    tmp.write_text(key.hex())
    tmp.chmod(0o600)
    tmp.replace(d / "authkey")
    state = {"last": time.time(), "busy": False, "tasks": 0}
    lock = threading.Lock()

    def watchdog():
        while True:
            time.sleep(min(1.0, idle_s / 4))
            with lock:
                if not state["busy"] and time.time() - state["last"] > idle_s:
                    print(f"[model server] idle for {idle_s:.0f} s after {state['tasks']} tasks; exiting", flush=True)
                    for f in ("sock", "authkey"):
                        with contextlib.suppress(FileNotFoundError):
                            (d / f).unlink()
                    os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    print(f"[model server] pid {os.getpid()} serving {load} at {d / 'sock'}", flush=True)
    from llmgeom.models import loading
    from llmgeom.workflow.jobs import run_logged, set_threads

    while True:
        try:
            conn = listener.accept()
        except Exception as e:  # a client that failed authentication or went away
            print(f"[model server] refused a connection: {e!r}", flush=True)
            continue
        with lock:
            state["busy"] = True
        try:
            req = conn.recv()
            if req.get("task") == "__stop__":
                print(f"[model server] stopped after {state['tasks']} tasks", flush=True)
                for f in ("sock", "authkey"):
                    with contextlib.suppress(FileNotFoundError):
                        (d / f).unlink()
                conn.send({"ok": True})
                conn.close()
                os._exit(0)
            t0 = time.time()
            before = sum(loading.LOADS.values())
            try:
                os.chdir(req["cwd"])
                with run_logged(req["log"], threads=req["threads"]):
                    set_threads(req["threads"])
                    print(f"[model server] pid {os.getpid()}: task {req['task']} (model kept loaded between tasks; "
                          f"LLMGEOM_MODEL_SERVER=0 runs it in the job's process)", flush=True)
                    result = _call(req["task"], req["kwargs"], reuse=True)
                    print(f"[model server] task done in {time.time() - t0:.1f} s; weights loaded for it: "
                          f"{sum(loading.LOADS.values()) - before} (this server: {dict(loading.LOADS)})", flush=True)
                reply = {"ok": True, "result": result, "pid": os.getpid(), "loads": dict(loading.LOADS)}
            except Exception:
                loading.clear_model_cache()  # the retry starts from fresh weights
                reply = {"ok": False, "error": traceback.format_exc(), "pid": os.getpid()}
            print(f"[model server] {req['task']} -> {req['log']}: {'ok' if reply['ok'] else 'FAILED'} "
                  f"({time.time() - t0:.1f} s)", flush=True)
            with contextlib.suppress(OSError):
                conn.send(reply)
        except (EOFError, OSError) as e:
            print(f"[model server] client went away: {e!r}", flush=True)
        finally:
            conn.close()
            with lock:
                state["busy"] = False
                state["tasks"] += 1
                state["last"] = time.time()


if __name__ == "__main__":  # started by run_task: python -m llmgeom.workflow.model_server <dir> <load json>
    serve(Path(sys.argv[1]), json.loads(sys.argv[2]))
