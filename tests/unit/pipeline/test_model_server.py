"""The per-model server (issue 13 item 1): GPU jobs of one model hand their work to one process that
loads the weights once; results equal the in-process extraction; a failed task fails alone."""

import json
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from llmgeom.prompts.io import write_prompt_set
from llmgeom.models import sources as models, tiny as testing
from llmgeom.pipeline import model_server as ms

from conftest import committed_batches
from deadline import deadline

RECS = [{"id": "a", "text": "abc", "meta": {}}, {"id": "b", "text": "hello world", "meta": {}},
        {"id": "c", "text": "xyzzy plugh", "meta": {}}]


@pytest.fixture(autouse=True)
def _no_hang(request):
    """Every test here fails instead of hanging (a server or listener that never answers)."""
    with deadline(1200 if request.node.get_closest_marker("slow") else 240, request.node.name):
        yield


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    src = testing.save_tiny_model_dir("llama", tmp_path / "src")
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src)}, prepared)
    p1, p2 = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    write_prompt_set(RECS, p1)
    write_prompt_set(RECS[::-1][:2], p2)
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(tmp_path / "srv"))
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_IDLE_S", "60")
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER", "1")
    load = dict(model_dir=str(prepared), dtype="float32", device="cpu", device_map=None)
    yield tmp_path, prepared, (p1, p2), load
    ms.stop_server(load)


def _socket_bound(d: Path) -> bool:
    """Whether the server socket of ``d`` is there (always a file in the server's directory)."""
    return (d / "sock").exists()


def _abstract_names() -> set[str]:
    """The abstract AF_UNIX names bound on this machine (``/proc/net/unix``; shown with a leading ``@``)."""
    return {f[-1] for ln in Path("/proc/net/unix").read_text().splitlines()[1:]
            if len(f := ln.split()) >= 8 and f[-1].startswith("@")}


def _kw(prepared, prompts, out):
    return dict(model_dir=str(prepared), prompts_path=str(prompts), out_path=str(out), model_name="tiny",
                dtype="float32", device="cpu", batch_size=2, top_k=10, sample_per_prompt=30, device_map=None)


def test_two_jobs_one_weight_load_same_values(setup, monkeypatch):
    tmp, prepared, (p1, p2), load = setup
    outs = [tmp / "one.h5", tmp / "two.h5"]
    logs = [tmp / "logs" / "one.log", tmp / "logs" / "two.log"]
    from llmgeom.pipeline.jobs import process_age

    ages = []
    for p, o, lg in zip((p1, p2), outs, logs):
        ages.append(process_age())
        ms.run_task("extract", _kw(prepared, p, o), load=load, log=str(lg), threads=1)
    # the log opens with the job's start-up: the age of the client (this process) when it sent the task, not the
    # server's
    first = float(re.match(r"\[job\] start-up (\S+) s ", logs[1].read_text()).group(1))
    assert ages[1] - 0.02 <= first <= process_age() + 0.02
    assert "weights loaded for it: 1" in logs[0].read_text()
    assert "weights loaded for it: 0" in logs[1].read_text()  # the second job reused the loaded model
    assert "extract tiny two" in logs[1].read_text()  # the job's own progress lines are in its log
    # the same values as the job's own process (server off)
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER", "0")
    ref = tmp / "ref.h5"
    ms.run_task("extract", _kw(prepared, p2, ref), load=load, log=str(tmp / "logs" / "ref.log"), threads=1)
    with h5py.File(outs[1]) as a, h5py.File(ref) as b:
        for k in ("last_token/residual", "last_token/attn_output", "attention/entropy", "next_token/top_logits"):
            np.testing.assert_array_equal(a[k][()], b[k][()], err_msg=k)


def test_deep_server_directory_binds_its_socket_inside_the_directory(setup, monkeypatch):
    """A server directory whose socket path exceeds AF_UNIX's 107 bytes (a deep $TMPDIR; pytest-xdist's own tmp
    paths reached it) binds its socket inside the directory through its descriptor (``/proc/self/fd/<fd>/sock``),
    never at an abstract name (which any user could bind first: issue 47 point 1)."""
    import stat

    tmp, prepared, (p1, _), load = setup
    deep = tmp / ("d" * 60) / ("e" * 60)
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(deep))
    d = ms.server_dir(load)
    assert len(str(d / "sock")) > 107
    try:
        ms.run_task("extract", _kw(prepared, p1, tmp / "deep.h5"), load=load, log=str(tmp / "deep.log"), threads=1)
        assert "weights loaded for it: 1" in (tmp / "deep.log").read_text() and (tmp / "deep.h5").is_file()
        assert stat.S_ISSOCK(os.lstat(d / "sock").st_mode)  # a file in the private directory
        import hashlib

        old_names = {"@llmgeom-models-" + hashlib.sha256(os.fsencode(str(p))).hexdigest()[:40] for p in (d, d.resolve())}
        assert not old_names & _abstract_names()  # not at the name a deep directory used to get
        assert "the task runs here" not in (tmp / "deep.log").read_text()
    finally:
        ms.stop_server(load)


def test_failed_task_fails_alone(setup):
    tmp, prepared, (p1, _), load = setup
    with pytest.raises(ms.ModelServerTaskError, match="missing.jsonl"):
        ms.run_task("extract", _kw(prepared, tmp / "missing.jsonl", tmp / "x.h5"), load=load,
                    log=str(tmp / "bad.log"), threads=1)
    assert "Traceback" in (tmp / "bad.log").read_text() and not (tmp / "x.h5").exists()
    # the server is still there and serves the next job
    assert ms.run_task("extract", _kw(prepared, p1, tmp / "ok.h5"), load=load, log=str(tmp / "ok.log"), threads=1)
    assert (tmp / "ok.h5").is_file()
    with pytest.raises(ValueError, match="unknown model-server task 'train'"):
        ms.run_task("train", {}, load=load, log=str(tmp / "t.log"))


def test_idle_setting_is_checked(monkeypatch):
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_IDLE_S", "-3")
    with pytest.raises(ValueError, match="LLMGEOM_MODEL_SERVER_IDLE_S='-3'"):
        ms.idle_seconds()


# --------------------------------------------------------------------------- lifetime (issue 18, issue 21 point 5)


def _server_pid(load) -> int:
    import re

    text = (ms.server_dir(load) / "server.log").read_text()
    return int(re.findall(r"\[model server\] pid (\d+) serving", text)[-1])


def _wait_gone(pid, timeout=15.0) -> bool:
    import time

    t0 = time.time()
    while time.time() - t0 < timeout:
        if ms._gone(pid):
            return True
        time.sleep(0.1)
    return False


def _wait_unbound(d: Path, timeout=15.0) -> bool:
    """Whether the socket file of ``d`` goes within ``timeout`` s (the exiting server removes it; under load that
    can come a moment after its main thread shows as a zombie), waited for, not asserted at the first sight."""
    import time

    t0 = time.time()
    while time.time() - t0 < timeout:
        if not _socket_bound(d):
            return True
        time.sleep(0.1)
    return False


def dataset_bytes(ds) -> bytes:
    """A dataset's values as bytes (variable-length strings: their bytes, not the object pointers)."""
    v = ds[()]
    return b"\0".join(x if isinstance(x, bytes) else str(x).encode() for x in v.ravel()) if v.dtype == object \
        else v.tobytes()


def _cpu_seconds(pid) -> float:
    import os
    from pathlib import Path

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_server_sleeps_when_idle_and_exits_with_its_owner(setup, monkeypatch):
    """Between tasks the server uses no CPU (it blocks; it used to poll at ~5% of a core), stays while its
    owner (locally: the snakemake run) lives, however long it idles, and exits when the owner exits."""
    import subprocess
    import time

    tmp, prepared, (p1, _), load = setup
    owner = subprocess.Popen(["sleep", "300"])
    try:
        monkeypatch.setenv("LLMGEOM_MODEL_SERVER_OWNER", str(owner.pid))
        monkeypatch.setenv("LLMGEOM_MODEL_SERVER_IDLE_S", "3600")
        ms.run_task("extract", _kw(prepared, p1, tmp / "a.h5"), load=load, log=str(tmp / "a.log"), threads=1)
        pid = _server_pid(load)
        time.sleep(0.5)
        c0 = _cpu_seconds(pid)
        time.sleep(3.0)
        assert _cpu_seconds(pid) - c0 < 0.03  # asleep: at most a few clock ticks in 3 s
        assert not ms._gone(pid) and _socket_bound(ms.server_dir(load))
    finally:
        owner.kill()
        owner.wait()
    assert _wait_gone(pid), "the server outlived its owner"
    assert _wait_unbound(ms.server_dir(load)), "the server's socket outlived it"


def test_a_job_killed_mid_task_never_gets_its_output(setup, monkeypatch):
    """The job's process dies while the server runs its task (scancel, time limit): the server exits before
    the task ends, and the job's output is never written (a rerun cannot find an output Snakemake saw fail)."""
    import json
    import os
    import subprocess
    import sys
    import time

    tmp, prepared, _, load = setup
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_OWNER", str(os.getpid()))
    many = tmp / "many.jsonl"
    write_prompt_set([{"id": f"p{i}", "text": "hello world " * 8 + str(i), "meta": {}} for i in range(400)], many)
    out, log = tmp / "killed.h5", tmp / "killed.log"
    kw = dict(_kw(prepared, many, out), batch_size=1)
    code = ("import json, sys\nfrom llmgeom.pipeline import model_server as ms\n"
            f"ms.run_task('extract', json.loads(sys.argv[1]), load=json.loads(sys.argv[2]), log={str(log)!r})\n")
    job = subprocess.Popen([sys.executable, "-c", code, json.dumps(kw), json.dumps(load)])
    t0 = time.time()
    while committed_batches(Path(f"{out}.partial")) < 3 and time.time() - t0 < 120:  # in its batches
        time.sleep(0.05)
    assert job.poll() is None, "the task ended before the job could be killed; give it more prompts"
    pid = _server_pid(load)
    job.kill()
    job.wait()
    assert _wait_gone(pid), "the server went on with a dead job's task"
    time.sleep(1.0)
    assert not out.exists()
    text = (ms.server_dir(load) / "server.log").read_text()
    assert "exited; exiting" in text
    # it was stopped at a batch boundary first: the partial file keeps the committed batches for a resume
    assert "stopping the task at its next batch boundary" in text
    assert 3 <= committed_batches(Path(f"{out}.partial")) < 400


def test_a_signal_to_the_waiting_job_stops_the_task_and_the_rerun_resumes(setup, monkeypatch):
    """SIGUSR1 to the job's process (SLURM's warning before the time limit, ``--signal=USR1@<s>``) while the
    server runs its extraction: the client forwards a stop request, the server commits the batch in flight
    and stops, the job fails with the stop in its message (Snakemake retries), the server serves on, and the
    rerun computes only the missing batches: the file equals an uninterrupted run's, byte for byte."""
    import os
    import re
    import signal
    import threading
    import time

    tmp, prepared, _, load = setup
    many = tmp / "many.jsonl"
    write_prompt_set([{"id": f"p{i}", "text": "hello world " * 8 + str(i), "meta": {}} for i in range(300)], many)
    out, log = tmp / "sig.h5", tmp / "sig.log"
    kw = dict(_kw(prepared, many, out), batch_size=1)
    partial = Path(f"{out}.partial")

    def signal_when_half_way():
        t0 = time.time()
        while committed_batches(partial) < 5 and time.time() - t0 < 120:
            time.sleep(0.05)
        if committed_batches(partial) >= 5:  # never signal a process whose task already failed (no handler then)
            os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=signal_when_half_way, daemon=True).start()
    with pytest.raises(ms.ModelServerTaskError, match=r"stopped by SIGUSR1 after (\d+) of 300 batches") as e:
        ms.run_task("extract", kw, load=load, log=str(log), threads=1)
    k = int(re.search(r"after (\d+) of 300", str(e.value))[1])
    assert 0 < k < 300 and not out.exists()
    pid = _server_pid(load)
    ms.run_task("extract", kw, load=load, log=str(log), threads=1)
    assert _server_pid(load) == pid  # the same server, its model still loaded
    assert f"resumed; {k} of 300 batches were committed before, {300 - k} computed now" in log.read_text()
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER", "0")
    ref = tmp / "ref.h5"
    ms.run_task("extract", dict(kw, out_path=str(ref)), load=load, log=str(tmp / "ref.log"), threads=1)
    with h5py.File(out) as a, h5py.File(ref) as b:
        names = []
        a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert names
        for n in names:
            assert dataset_bytes(a[n]) == dataset_bytes(b[n]), n


# --------------------------------------------------------------------------- the run's plan (issue 21 point 5)


def test_pending_outputs_of_a_plan(tmp_path, monkeypatch):
    """The other planned jobs of a model are pending until their outputs are written after the plan; an output
    left by an earlier run (older than the plan) counts as pending; a model the plan does not name gives None."""
    import os
    import time

    monkeypatch.chdir(tmp_path)
    old = tmp_path / "b.h5"
    old.write_text("earlier run")
    os.utime(old, (time.time() - 100, time.time() - 100))
    path = ms.write_plan([("models/m", "logs/a.log", ["a.h5"]), ("models/m", "logs/b.log", ["b.h5", "b2.csv"]),
                          ("models/other", "logs/c.log", ["c.h5"])], tmp_path / "plan.json")
    assert os.environ[ms.PLAN_ENV] == str(path)
    plan = json.loads(path.read_text())
    out = lambda *names: [str(tmp_path / n) for n in names]
    assert ms.pending_outputs(plan, "models/m", "logs/a.log") == out("b.h5", "b2.csv")
    assert ms.pending_outputs(plan, tmp_path / "models" / "m", tmp_path / "logs" / "b.log") == out("a.h5")
    (tmp_path / "b.h5").write_text("this run")
    (tmp_path / "b2.csv").write_text("this run")
    assert ms.pending_outputs(plan, "models/m", "logs/a.log") == []
    assert ms.pending_outputs(plan, "models/other", "logs/c.log") == []
    assert ms.pending_outputs(plan, "models/unplanned", "logs/a.log") is None


def test_server_rules_are_the_rules_whose_scripts_use_the_server():
    """SERVER_RULES (the jobs a run's plan lists) are exactly the rules whose script calls run_task."""
    import re

    from llmgeom.pipeline.cluster import GPU_RULES

    repo = Path(__file__).resolve().parents[3]
    found = set()
    for smk in (repo / "workflow" / "rules").glob("*.smk"):
        for name, body in re.findall(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", smk.read_text(), re.M):
            script = re.search(r'script:\s*\n\s*"\.\./scripts/(\w+\.py)"', body)
            if script and "run_task(" in (repo / "workflow" / "scripts" / script[1]).read_text():
                found.add(name)
    assert found == set(ms.SERVER_RULES) and found <= set(GPU_RULES)


@pytest.mark.slow
def test_one_load_per_model_and_each_server_exits_after_its_models_last_job(tmp_path):
    """A local run of the tiny workflow, targeting two extractions of each model (a subset of the DAG), on one
    core (jobs one at a time, the two models interleaved): each model's weights are loaded once, and its server
    exits when the run's last job of that model is done (at the client's request, not with the run), before the
    other model's last job ends."""
    import os
    import re
    import subprocess
    import sys

    import yaml

    from conftest import tiny_config

    repo = Path(__file__).resolve().parents[3]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_config()))
    sets = ("corpus", "mixed")
    targets = [f"results/{m}/activations/{s}.h5" for m in ("tiny-llama", "tiny-gpt2") for s in sets]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LLMGEOM_MODEL_SERVER="1",
               LLMGEOM_MODEL_SERVER_DIR=str(tmp_path / "srv"), LLMGEOM_MODEL_SERVER_IDLE_S="3600")
    env.pop(ms.PLAN_ENV, None)
    env.pop("LLMGEOM_MODEL_SERVER_OWNER", None)
    r = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-d", str(tmp_path),
                        "--configfile", str(tmp_path / "config.yaml"), "--cores", "1", *targets],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-6000:]
    servers = {}
    for log in (tmp_path / "srv").glob("llmgeom-models-*/*/server.log"):
        text = log.read_text()
        model = re.search(r"serving \{'model_dir': '(?:[^']*/)?resources/models/([\w-]+)'", text)[1]
        servers[model] = (text, log.stat().st_mtime)
    assert sorted(servers) == ["tiny-gpt2", "tiny-llama"]
    last = {}
    for m, (text, _) in servers.items():
        assert "stopped after 2 tasks" in text and "exiting" not in text, text[-2000:]  # at the request, not the owner
        loads = [int(n) for s in sets
                 for n in re.findall(r"weights loaded for it: (\d+)", (tmp_path / f"logs/extract/{m}/{s}.log").read_text())]
        assert sum(loads) == 1 and len(loads) == 2, (m, loads)
        last[m] = max((tmp_path / f"results/{m}/activations/{s}.h5").stat().st_mtime for s in sets)
    first, second = sorted(last, key=last.get)
    assert servers[first][1] < last[second]  # the first model's server was gone before the other's last job ended
    assert "server asked to exit (stopped)" in "".join(
        (tmp_path / f"logs/extract/{first}/{s}.log").read_text() for s in sets)



# ----------------------------------------------------------------- reaching a server (issue 47 points 1, 2, 5)


def _own_listener(d: Path, *, accept: bool):
    """A listener of this user's at the socket of the server directory ``d`` (with an authkey beside it) that never
    serves: with ``accept`` False its backlog is full (one queued connection, ``listen(0)``), so a connect cannot
    complete; with ``accept`` True it accepts and never sends the nonce. Returns what to close."""
    import socket
    import threading

    from llmgeom.pipeline import private_ipc

    private_ipc.private_dir(ms.servers_root())
    private_ipc.private_dir(d)
    private_ipc.write_secret(d / "authkey", ("11" * 32).encode())
    pd = private_ipc.PrivateDir(d)  # the path may be too long for AF_UNIX: bound through the descriptor
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(pd.address("sock"))
    lst.listen(0)
    held = [lst, pd]
    if accept:
        threading.Thread(target=lambda: held.append(lst.accept()[0]), daemon=True).start()
    else:
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.connect(pd.address("sock"))  # the one connection listen(0) queues: the next cannot complete
        held.append(filler)
    return held


@pytest.mark.parametrize("accept", [False, True], ids=["never-accepts", "accepts-never-answers"])
def test_a_server_that_never_accepts_or_answers_costs_a_timeout_then_the_task_runs_here(setup, monkeypatch, accept):
    """A listener at the server's socket that does not accept (its backlog full) or accepts and sends no nonce:
    the job's connect and read time out (connect: at once; nonce: HANDSHAKE_TIMEOUT_S, 1 s here), and the job runs
    its task in its own process, the reason in its log, instead of blocking for ever with the directory's lock."""
    import time

    tmp, prepared, (p1, _), load = setup
    monkeypatch.setattr(ms, "HANDSHAKE_TIMEOUT_S", 1.0)
    held = _own_listener(ms.server_dir(load), accept=accept)
    try:
        t0 = time.time()
        with deadline(60, "a job facing a listener that never serves"):
            ms.run_task("extract", _kw(prepared, p1, tmp / "x.h5"), load=load, log=str(tmp / "x.log"), threads=1)
        took = time.time() - t0
    finally:
        for s in held:
            s.close()
    text = (tmp / "x.log").read_text()
    assert "the model server is not used, the task runs here" in text
    assert ("accepted but sent no nonce within 1 s" if accept else "does not accept connections") in text
    assert (tmp / "x.h5").is_file() and took < 60


def test_a_server_that_fails_to_start_leaves_the_task_to_the_job(setup, monkeypatch):
    """Any failure to start a server (here its process exits with status 3 at once) runs the task in the job's own
    process, with the reason in the job's log; never a failed job."""
    import subprocess
    import sys

    tmp, prepared, (p1, _), load = setup
    monkeypatch.setattr(ms, "_spawn", lambda pd, load: subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
    ms.run_task("extract", _kw(prepared, p1, tmp / "x.h5"), load=load, log=str(tmp / "x.log"), threads=1)
    text = (tmp / "x.log").read_text()
    assert "the task runs here: the model server exited with status 3 while starting" in text
    assert (tmp / "x.h5").is_file()


def test_a_lock_held_too_long_leaves_the_task_to_the_job(setup, monkeypatch):
    """The server directory's lock held by another process (a job of ours stuck while starting its server): the job
    waits LOCK_TIMEOUT_S (1 s here), not for ever, and runs its task itself."""
    import fcntl

    from llmgeom.pipeline import private_ipc

    tmp, prepared, (p1, _), load = setup
    monkeypatch.setattr(ms, "LOCK_TIMEOUT_S", 1.0)
    private_ipc.private_dir(ms.servers_root())
    d = private_ipc.private_dir(ms.server_dir(load))
    with open(d / "lock", "w") as lk, deadline(60, "a job waiting for a held lock"):
        fcntl.flock(lk, fcntl.LOCK_EX)
        ms.run_task("extract", _kw(prepared, p1, tmp / "x.h5"), load=load, log=str(tmp / "x.log"), threads=1)
    assert "the task runs here: " in (tmp / "x.log").read_text() and "held for over 1 s" in (tmp / "x.log").read_text()
    assert (tmp / "x.h5").is_file()


def test_a_base_that_cannot_be_made_leaves_the_task_to_the_job_and_writes_no_plan(setup, monkeypatch):
    """A base directory that cannot be created (a file in its way: root may write anywhere, so that stands for a
    base this user cannot write): run_task runs the task here and write_plan returns None; neither raises."""
    tmp, prepared, (p1, _), load = setup
    (tmp / "a-file").write_text("")
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(tmp / "a-file" / "base"))
    monkeypatch.delenv(ms.PLAN_ENV, raising=False)
    ms.run_task("extract", _kw(prepared, p1, tmp / "x.h5"), load=load, log=str(tmp / "x.log"), threads=1)
    assert "the task runs here: NotADirectoryError" in (tmp / "x.log").read_text() and (tmp / "x.h5").is_file()
    assert ms.write_plan([]) is None and ms.PLAN_ENV not in os.environ
    assert ms.stop_server(load) is False


def test_the_server_does_not_import_from_the_jobs_working_directory(setup, monkeypatch):
    """The server is started with ``python -P``: a module file in the job's working directory (here ``hmac.py``,
    which the server imports) is not on the long-lived server's ``sys.path``, so it neither runs nor shadows the
    standard library's."""
    import llmgeom

    tmp, prepared, (p1, _), load = setup
    cwd = tmp / "cwd"
    cwd.mkdir()
    marker = tmp / "planted-module-ran"
    (cwd / "hmac.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setenv("PYTHONPATH", str(Path(llmgeom.__file__).resolve().parents[1]))  # not relative to the cwd
    monkeypatch.chdir(cwd)
    ms.run_task("extract", _kw(prepared, p1, tmp / "x.h5"), load=load, log=str(tmp / "x.log"), threads=1)
    text = (tmp / "x.log").read_text()
    assert "weights loaded for it: 1" in text and "the task runs here" not in text  # it ran in the server
    assert not marker.exists()


def test_each_node_has_its_own_server_directory_on_a_shared_base(setup, monkeypatch):
    """The host name is part of the server's key and leads its directory's name (and the plan file's): a node that
    shares the base directory's file system with another never finds, uses or removes the other's socket. Two
    host names on this machine: the second starts its own server (one more weight load) and the first's socket
    stays and serves on."""
    import socket

    tmp, prepared, (p1, p2), load = setup
    monkeypatch.setattr(socket, "gethostname", lambda: "node-a")
    da = ms.server_dir(load)
    try:
        ms.run_task("extract", _kw(prepared, p1, tmp / "a.h5"), load=load, log=str(tmp / "a.log"), threads=1)
        monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
        db = ms.server_dir(load)
        assert da.name.startswith("node-a-") and db.name.startswith("node-b-") and da.parent == db.parent
        for a, b in (("node:1", "node_1"), ("n" * 70 + "a", "n" * 70 + "b")):  # the same name part, other hosts
            names = []
            for host in (a, b):
                monkeypatch.setattr(socket, "gethostname", lambda host=host: host)
                names.append(ms.server_dir(load).name)
            assert names[0] != names[1] and names[0].split("-")[0] == names[1].split("-")[0]
        monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
        assert ms.write_plan([]).name == f"plan-node-b-{os.getpid()}.json"
        ms.run_task("extract", _kw(prepared, p2, tmp / "b.h5"), load=load, log=str(tmp / "b.log"), threads=1)
        assert "weights loaded for it: 1" in (tmp / "b.log").read_text()  # its own server, not node-a's
        assert _socket_bound(da) and _socket_bound(db)
        monkeypatch.setattr(socket, "gethostname", lambda: "node-a")
        ms.run_task("extract", _kw(prepared, p2, tmp / "a2.h5"), load=load, log=str(tmp / "a2.log"), threads=1)
        assert "weights loaded for it: 0" in (tmp / "a2.log").read_text()  # node-a's server served on
    finally:
        for host in ("node-a", "node-b"):
            monkeypatch.setattr(socket, "gethostname", lambda host=host: host)
            ms.stop_server(load)
        monkeypatch.delenv(ms.PLAN_ENV, raising=False)


def test_runtime_dir_is_the_first_base_where_it_is_private(tmp_path, monkeypatch):
    """$XDG_RUNTIME_DIR is the servers' base when it is this user's and 0700 (issue 46 point 5), before $TMPDIR;
    one with group or other access, a symbolic link or a missing one is passed over; LLMGEOM_MODEL_SERVER_DIR
    overrides both."""
    xdg, tmpdir = tmp_path / "xdg", tmp_path / "tmpdir"
    xdg.mkdir(mode=0o700)
    tmpdir.mkdir()
    monkeypatch.delenv("LLMGEOM_MODEL_SERVER_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    uid = os.getuid()
    assert ms.servers_root() == xdg / f"llmgeom-models-{uid}"
    os.chmod(xdg, 0o755)
    assert ms.servers_root() == tmpdir / f"llmgeom-models-{uid}"
    os.chmod(xdg, 0o700)
    (tmp_path / "link").symlink_to(xdg)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "link"))
    assert ms.servers_root() == tmpdir / f"llmgeom-models-{uid}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert ms.servers_root() == tmpdir / f"llmgeom-models-{uid}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(tmp_path / "mine"))
    assert ms.servers_root() == tmp_path / "mine" / f"llmgeom-models-{uid}"


def test_a_busy_server_authenticates_at_once_and_a_silent_client_stalls_nobody(setup):
    """The server authenticates connections in a thread of its own: while it runs a long task, a new client gets
    its nonce at once (so the client's handshake timeout means a stuck server, never a busy one) and its task
    queues behind the running one (one weight load). A client of this user's that connects and never proves the
    key is dropped after AUTH_TIMEOUT_S, and the next job is served by the same server, not left to time out."""
    import threading
    import time

    from llmgeom.pipeline import private_ipc

    tmp, prepared, (p1, p2), load = setup
    ms.run_task("extract", _kw(prepared, p1, tmp / "first.h5"), load=load, log=str(tmp / "first.log"), threads=1)
    d = ms.server_dir(load)
    many = tmp / "many.jsonl"
    write_prompt_set([{"id": f"p{i}", "text": "hello world " * 8 + str(i), "meta": {}} for i in range(300)], many)
    long_out = tmp / "long.h5"
    errors = []

    def long_task():
        try:
            ms.run_task("extract", dict(_kw(prepared, many, long_out), batch_size=1), load=load,
                        log=str(tmp / "long.log"), threads=1)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    t = threading.Thread(target=long_task)
    t.start()
    t0 = time.time()
    while committed_batches(Path(f"{long_out}.partial")) < 3 and time.time() - t0 < 120:
        time.sleep(0.05)
    assert t.is_alive(), "the long task ended before the test could use it; give it more prompts"
    with private_ipc.PrivateDir(d) as pd:
        silent = private_ipc.connect(pd.address("sock"), timeout=5)
        t1 = time.time()
        assert len(bytes.fromhex(silent.recv()["nonce"])) == 32 and time.time() - t1 < 5  # busy, yet at once
    # `silent` never answers: the server drops it after AUTH_TIMEOUT_S; the next job is served, queued
    ms.run_task("extract", _kw(prepared, p2, tmp / "queued.h5"), load=load, log=str(tmp / "queued.log"), threads=1)
    silent.close()
    t.join(timeout=180)
    assert not errors and not t.is_alive()
    text = (tmp / "queued.log").read_text()
    assert "weights loaded for it: 0" in text and "the task runs here" not in text, text[-2000:]
    assert (d / "server.log").read_text().count("refused a connection: it did not prove the authkey") == 1


def test_the_private_directory_descriptor_is_checked_itself(tmp_path, monkeypatch):
    """PrivateDir opens the directory without following a link and checks the descriptor with fstat, so a swap
    after the path's check (simulated: the path check passes everything) is still refused."""
    from llmgeom.pipeline import private_ipc

    d = private_ipc.private_dir(tmp_path / "d")
    (tmp_path / "link").symlink_to(d)
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)
    monkeypatch.setattr(private_ipc, "check_private_dir", lambda p: Path(p))
    with pytest.raises(OSError):  # ELOOP: O_NOFOLLOW
        private_ipc.PrivateDir(tmp_path / "link")
    with pytest.raises(private_ipc.UnsafePath, match="has mode 0755"):
        private_ipc.PrivateDir(tmp_path / "open")
    with private_ipc.PrivateDir(d) as pd:
        assert pd.address("sock") == f"/proc/self/fd/{pd.fd}/sock"


def test_an_authenticated_client_that_sends_no_request_stalls_nobody(setup):
    """A client of this user's that proves the key and then sends nothing (a job stopped between its handshake
    and its request): the server drops it after AUTH_TIMEOUT_S and serves the next job, which would otherwise
    wait behind it for ever."""
    tmp, prepared, (p1, p2), load = setup
    ms.run_task("extract", _kw(prepared, p1, tmp / "first.h5"), load=load, log=str(tmp / "first.log"), threads=1)
    mute = ms._connect(ms.server_dir(load))  # authenticated, then silent
    with deadline(60, "the job behind a silent client"):
        ms.run_task("extract", _kw(prepared, p2, tmp / "next.h5"), load=load, log=str(tmp / "next.log"),
                    threads=1)
    mute.close()
    text = (tmp / "next.log").read_text()
    assert "weights loaded for it: 0" in text and "the task runs here" not in text, text[-2000:]
    assert "client went away or sent no request" in (ms.server_dir(load) / "server.log").read_text()
