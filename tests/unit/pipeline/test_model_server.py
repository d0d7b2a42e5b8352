"""The per-model server (issue 13 item 1): GPU jobs of one model hand their work to one process that
loads the weights once; results equal the in-process extraction; a failed task fails alone."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from llmgeom.prompts.io import write_prompt_set
from llmgeom.models import sources as models, tiny as testing
from llmgeom.pipeline import model_server as ms

from conftest import committed_batches

RECS = [{"id": "a", "text": "abc", "meta": {}}, {"id": "b", "text": "hello world", "meta": {}},
        {"id": "c", "text": "xyzzy plugh", "meta": {}}]


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
    """Whether the server socket of ``d`` is there: its file, or a listener at its abstract address (a connection
    to it is accepted; an abstract name has no file to look at)."""
    import socket

    addr = ms.socket_address(d)
    if not addr.startswith("\0"):
        return Path(addr).exists()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(addr)
        except OSError:
            return False
    return True


def _kw(prepared, prompts, out):
    return dict(model_dir=str(prepared), prompts_path=str(prompts), out_path=str(out), model_name="tiny",
                dtype="float32", device="cpu", batch_size=2, top_k=10, sample_per_prompt=30, device_map=None)


def test_two_jobs_one_weight_load_same_values(setup, monkeypatch):
    tmp, prepared, (p1, p2), load = setup
    outs = [tmp / "one.h5", tmp / "two.h5"]
    logs = [tmp / "logs" / "one.log", tmp / "logs" / "two.log"]
    for p, o, lg in zip((p1, p2), outs, logs):
        ms.run_task("extract", _kw(prepared, p, o), load=load, log=str(lg), threads=1)
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


def test_deep_server_directory_serves_through_an_abstract_socket(setup, monkeypatch):
    """A server directory whose socket path exceeds AF_UNIX's 107 bytes (a deep $TMPDIR; pytest-xdist's own tmp paths
    reached it) binds the Linux abstract address of its hash instead of failing with "AF_UNIX path too long"."""
    tmp, prepared, (p1, _), load = setup
    deep = tmp / ("d" * 60) / ("e" * 60)
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(deep))
    d = ms.server_dir(load)
    assert len(str(d / "sock")) > ms._MAX_SOCKET_PATH and ms.socket_address(d).startswith("\0llmgeom-models-")
    assert ms.socket_address(Path("/tmp/srv")) == "/tmp/srv/sock"  # a short one stays a file
    try:
        ms.run_task("extract", _kw(prepared, p1, tmp / "deep.h5"), load=load, log=str(tmp / "deep.log"), threads=1)
        assert "weights loaded for it: 1" in (tmp / "deep.log").read_text() and (tmp / "deep.h5").is_file()
        assert not (d / "sock").exists() and _socket_bound(d)
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
    """Whether the socket of ``d`` goes within ``timeout`` s. An exiting server's main thread shows as a zombie
    while its other threads still hold the open files: an abstract address stays bound until the last of them
    is gone (found under load on CI), so its release is waited for, not asserted at the zombie's first sight."""
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


def test_a_new_server_waits_for_an_exiting_one_to_release_its_abstract_address():
    """An exiting server of this user's still holds its abstract address for a moment: the check before a new
    bind waits for the release (here 0.5 s) instead of letting the new bind fail."""
    import socket
    import threading
    import time

    addr = "\0llmgeom-test-release-" + str(time.time_ns())
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(addr)
    s.listen(8)
    threading.Timer(0.5, s.close).start()
    t0 = time.time()
    ms._check_address_free(addr)
    waited = time.time() - t0
    assert 0.4 < waited < ms.RELEASE_WAIT_S
    with pytest.raises(OSError):  # released: nobody listens there now
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(addr)
