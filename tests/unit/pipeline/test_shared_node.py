"""The model server among other users of a shared node: a second local user (created here; the tests need root,
as CI has) attacks the servers' directory, the socket and the authkey. Every attempt is refused, nothing of theirs
runs in the job, and the job's task still runs, in its own process or through a fresh private server, with the
same values as an undisturbed run.

The attacker is a real second uid (``subprocess`` with ``user=``), running the base interpreter with only the
standard library (``-I -S``), in a shared base directory with /tmp's mode (1777), named by
LLMGEOM_MODEL_SERVER_DIR.
"""

import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from llmgeom.models import sources as models, tiny
from llmgeom.pipeline import model_server as ms, private_ipc
from llmgeom.prompts.io import write_prompt_set

from deadline import deadline

ATTACKER = "llmgeom-attacker"
#: interpreters the second user may be able to run (this one may live under root's 0700 home)
PYTHONS = (os.path.realpath(getattr(sys, "_base_executable", sys.executable)), "/usr/bin/python3", "/bin/python3")
RECS = [{"id": "a", "text": "abc", "meta": {}}, {"id": "b", "text": "hello world", "meta": {}}]


@pytest.fixture(autouse=True)
def _no_hang(request):
    """Every test here fails instead of hanging (a listener that never answers, a read without a timeout)."""
    with deadline(240, request.node.name):
        yield


@pytest.fixture(scope="module")
def attacker():
    """(uid, gid, python) of a second local user (created once with useradd when missing) and a Python 3
    interpreter that user can run."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user (CI runs as root)")
    if shutil.which("useradd") is None:
        pytest.skip("no useradd on this machine")
    try:
        pw = pwd.getpwnam(ATTACKER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
                       check=True)
        pw = pwd.getpwnam(ATTACKER)
    for python in PYTHONS:
        try:
            subprocess.run([python, "-I", "-S", "-c", "pass"], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                           cwd="/", check=True, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        return pw.pw_uid, pw.pw_gid, python
    pytest.skip(f"no Python interpreter that {ATTACKER} may run among {PYTHONS}")


def as_attacker(attacker, code: str, *, wait: bool = True, **fmt):
    """Run ``code`` (Python, standard library only) as the second user; its stdout (or the process)."""
    uid, gid, python = attacker
    cmd = [python, "-I", "-S", "-c", textwrap.dedent(code).format(**fmt)]
    kw = dict(user=uid, group=gid, extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return subprocess.Popen(cmd, **kw)
    done = subprocess.run(cmd, timeout=60, **kw)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture()
def shared(tmp_path, monkeypatch, attacker):
    """A tiny prepared model, a prompt file, and a base directory that everyone may write to (mode 1777, as
    /tmp) as LLMGEOM_MODEL_SERVER_DIR; yields (base, root, load, kwargs maker, reference output)."""
    src = tiny.save_tiny_model_dir("llama", tmp_path / "src")
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src)}, prepared)
    prompts = tmp_path / "p.jsonl"
    write_prompt_set(RECS, prompts)
    base = Path(tempfile.mkdtemp(prefix="llmgeom-shared-", dir="/tmp"))
    base.chmod(0o1777)
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(base))
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_IDLE_S", "60")
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER", "0")
    load = dict(model_dir=str(prepared), dtype="float32", device="cpu", device_map=None)

    def kw(out):
        return dict(model_dir=str(prepared), prompts_path=str(prompts), out_path=str(out), model_name="tiny",
                    dtype="float32", device="cpu", batch_size=2, top_k=10, sample_per_prompt=30, device_map=None)

    ref = tmp_path / "ref.h5"
    ms.run_task("extract", kw(ref), load=load, log=str(tmp_path / "ref.log"))
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER", "1")
    yield base, ms.servers_root(), load, kw, ref
    ms.stop_server(load)
    shutil.rmtree(base, ignore_errors=True)


def same_values(a, b):
    with h5py.File(a) as fa, h5py.File(b) as fb:
        for k in ("last_token/residual", "attention/entropy", "next_token/top_logits"):
            np.testing.assert_array_equal(fa[k][()], fb[k][()], err_msg=k)


# The issue's attack: the second user makes the servers' directory first (0777), waits for the job's server
# directory in it, moves it away, puts a directory of theirs in its place with a listener and an authkey of
# theirs, and answers the job with a pickle that would run their code. Their listener notes every connection.
ATTACK = r"""
import os, pickle, socket, time
root, base = {root!r}, {base!r}
os.mkdir(root); os.chmod(root, 0o777)
print("ready", flush=True)
t0 = time.time()
while time.time() - t0 < {seconds}:
    try:
        names = [n for n in os.listdir(root) if not n.startswith("plan-") and not n.endswith(".moved")]
    except OSError:
        names = []
    if names:
        d = os.path.join(root, names[0])
        os.rename(d, d + ".moved"); os.mkdir(d); os.chmod(d, 0o777)
        with open(os.path.join(d, "authkey"), "w") as f:
            f.write("00" * 32)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(os.path.join(d, "sock")); s.listen(4)
        s.settimeout({seconds})
        c, _ = s.accept()
        open(os.path.join(base, "attacker-was-connected"), "w").close()
        class P:
            def __reduce__(self):
                return (open, (os.path.join(base, "attacker-code-ran"), "w"))
        payload = pickle.dumps(P())
        c.sendall(len(payload).to_bytes(4, "big") + payload)
        time.sleep(2)
        break
    time.sleep(0.005)
"""


def test_the_attack_on_a_directory_made_by_another_user_is_refused(shared, attacker, tmp_path):
    base, root, load, kw, ref = shared
    proc = as_attacker(attacker, ATTACK, wait=False, root=str(root), base=str(base), seconds=20)
    assert proc.stdout.readline().strip() == "ready"
    out, log = tmp_path / "out.h5", tmp_path / "job.log"
    ms.run_task("extract", kw(out), load=load, log=str(log))
    proc.kill()
    proc.wait()
    text = log.read_text()
    assert "the model server is not used, the task runs here" in text
    assert f"{root} is owned by uid {attacker[0]}" in text and "has mode 0777" in text
    assert not (base / "attacker-was-connected").exists() and not (base / "attacker-code-ran").exists()
    assert os.listdir(root) == []  # nothing of the job's went into the attacker's directory
    same_values(out, ref)


def test_a_symbolic_link_to_another_users_directory_is_refused(shared, attacker, tmp_path):
    base, root, load, kw, ref = shared
    as_attacker(attacker, """
        import os
        os.mkdir({evil!r}); os.chmod({evil!r}, 0o777); os.symlink({evil!r}, {root!r})
    """, evil=str(base / "evil"), root=str(root))
    out, log = tmp_path / "out.h5", tmp_path / "job.log"
    ms.run_task("extract", kw(out), load=load, log=str(log))
    assert f"{root} is a symbolic link" in log.read_text()
    assert os.listdir(base / "evil") == []
    same_values(out, ref)
    assert ms.write_plan([]) is None  # no run plan goes there either


def test_another_user_can_neither_read_the_authkey_nor_reach_the_socket(shared, attacker, tmp_path):
    base, root, load, kw, ref = shared
    out = tmp_path / "out.h5"
    ms.run_task("extract", kw(out), load=load, log=str(tmp_path / "job.log"))  # a server of ours is running
    d = ms.server_dir(load)
    for p in (root, d):
        assert stat.S_IMODE(os.lstat(p).st_mode) == 0o700 and os.lstat(p).st_uid == os.getuid()
    assert stat.S_IMODE(os.lstat(d / "authkey").st_mode) == 0o600
    tries = as_attacker(attacker, """
        import os, socket
        for what, f in (("list", lambda: os.listdir({root!r})), ("read", lambda: open({key!r}).read()),
                        ("connect", lambda: (os.chdir({d!r}), socket.socket(socket.AF_UNIX).connect("sock")))):
            try:
                f(); print(what, "ok")
            except PermissionError:
                print(what, "refused")
    """, root=str(root), key=str(d / "authkey"), d=str(d))
    assert tries.split("\n") == ["list refused", "read refused", "connect refused"]
    same_values(out, ref)


def test_another_users_connection_is_refused_before_a_byte_is_read(shared, attacker, tmp_path):
    """The server's own peer check, behind the directories' modes: the test opens the way (the servers' and the
    server's directories 0711, the socket 0777) so that the second user reaches the listener, without the key and
    with a guessed one; the server closes each connection unread (not even the nonce is sent), and serves on."""
    base, root, load, kw, ref = shared
    out = tmp_path / "out.h5"
    ms.run_task("extract", kw(out), load=load, log=str(tmp_path / "job.log"))
    d = ms.server_dir(load)
    for p, mode in ((root, 0o711), (d, 0o711), (d / "sock", 0o777)):
        os.chmod(p, mode)
    try:
        said = as_attacker(attacker, """
            import json, os, socket
            os.chdir({d!r})  # "sock" relative: a long host name may make the full path too long for AF_UNIX
            for proof in (None, "00" * 32):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10); s.connect("sock")
                try:
                    if proof:
                        msg = json.dumps({{"auth": proof}}).encode(); s.sendall(len(msg).to_bytes(4, "big") + msg)
                    got = s.recv(100)
                except OSError:  # reset or broken pipe: closed by the server (a timeout would print below)
                    got = b""
                print("closed" if got == b"" else repr(got))
        """, d=str(d))
    finally:
        for p in (root, d):
            os.chmod(p, 0o700)
    assert said.split("\n") == ["closed", "closed"]  # closed at once, not even the nonce sent
    # this user's own process with a guessed key gets the nonce, and nothing after its wrong proof
    with private_ipc.PrivateDir(d) as pd, private_ipc.connect(pd.address("sock"), timeout=10) as chan:
        assert len(bytes.fromhex(chan.recv()["nonce"])) == 32
        chan.send({"auth": "00" * 32})
        with pytest.raises((EOFError, ConnectionResetError)):  # a timeout (no refusal) fails the test
            chan.recv()
    out2 = tmp_path / "out2.h5"
    ms.run_task("extract", kw(out2), load=load, log=str(tmp_path / "job2.log"))
    log = (d / "server.log").read_text()  # read after the next task: every refusal before it is logged
    assert log.count(f"refused a connection: a connecting process belongs to uid {attacker[0]}") == 2
    assert log.count("refused a connection: it did not prove the authkey") == 1
    assert "weights loaded for it: 0" in (tmp_path / "job2.log").read_text()  # the same server served on
    same_values(out2, ref)


# the second user's listener, bound in a directory of theirs: it sends a nonce as a server would, notes the job's
# proof if one comes, and answers the job's request with a success that names no output
FAKE_SERVER = r"""
import json, os, socket
def send(c, obj):
    b = json.dumps(obj).encode(); c.sendall(len(b).to_bytes(4, "big") + b)
def recv(c):
    n = int.from_bytes(c.recv(4), "big"); return json.loads(c.recv(n)) if n else None
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind({sock!r}); s.listen(4); s.settimeout(60)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(10)
try:
    send(c, {{"nonce": "00" * 32}})
    if recv(c):
        open({proof!r}, "w").close()
        recv(c); send(c, {{"ok": True, "result": "not done", "pid": os.getpid(), "loads": {{}}}})
except OSError:
    pass
"""


def test_a_listener_of_another_user_at_the_servers_socket_is_refused(shared, attacker, tmp_path):
    """The client's own peer check, behind the directories' modes: the second user's listener (bound in a
    directory of theirs) is moved by the test (root) to the socket of the job's server directory, beside an
    authkey of the job's. The job checks the listener's uid before it reads the nonce, sends nothing (no proof,
    no request), and runs its task in its own process."""
    base, root, load, kw, ref = shared
    d = ms.server_dir(load)
    private_ipc.private_dir(root)
    private_ipc.private_dir(d)
    private_ipc.write_secret(d / "authkey", ("22" * 32).encode())
    theirs = base / "theirs"
    as_attacker(attacker, "import os; os.mkdir({p!r}, 0o755)", p=str(theirs))
    proc = as_attacker(attacker, FAKE_SERVER, wait=False, sock=str(theirs / "sock"), proof=str(base / "got-a-proof"))
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.rename(theirs / "sock", d / "sock")
        out, log = tmp_path / "out.h5", tmp_path / "job.log"
        ms.run_task("extract", kw(out), load=load, log=str(log))
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "the task runs here" in text and f"belongs to uid {attacker[0]}, not to this user" in text
    assert not (base / "got-a-proof").exists()
    same_values(out, ref)


def test_a_squatted_abstract_name_costs_nothing(shared, attacker, tmp_path, monkeypatch):
    """Issue 47 point 1: a deep base (``<dir>/sock`` over AF_UNIX's 107 bytes) used to put the server at an
    abstract name computed from its directory, which the second user could bind first (the job's server then
    failed to start) or bind and never accept (the job's connect then blocked for ever). The second user binds
    that name and leaves it unaccepted, its backlog full: the socket is now a file inside the private directory,
    so the job runs through its own server, undisturbed."""
    import hashlib

    base, _, load, kw, ref = shared
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(base / ("d" * 60) / ("e" * 60)))
    d = ms.server_dir(load)
    assert len(os.fsencode(str(d / "sock"))) > 107
    names = sorted({"\0llmgeom-models-" + hashlib.sha256(os.fsencode(str(p))).hexdigest()[:40]
                    for p in (d, d.resolve())})  # the name the server used to bind
    proc = as_attacker(attacker, r"""
        import socket, time
        held = []
        for name in {names!r}:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(name); s.listen(0)
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); c.connect(name)  # backlog full
            held += [s, c]
        print("ready", flush=True)
        time.sleep(120)
    """, wait=False, names=names)
    try:
        assert proc.stdout.readline().strip() == "ready"
        out, log = tmp_path / "out.h5", tmp_path / "job.log"
        ms.run_task("extract", kw(out), load=load, log=str(log))
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "weights loaded for it: 1" in text and "the task runs here" not in text, text[-2000:]
    assert stat.S_ISSOCK(os.lstat(d / "sock").st_mode)
    same_values(out, ref)


def test_a_base_owned_by_another_user_is_not_used(shared, attacker, tmp_path, monkeypatch):
    """Issue 47 point 2: every directory on the way to the base, as written and as resolved, must be root's or this
    user's (OpenSSH's safe_path). The second user's: a base they made (sticky, 1777, as /tmp: but its owner may
    rename any entry in it); a base of this user's in a directory of theirs (they may rename the base itself); a
    symbolic link of theirs to a directory of ours, as the base or above it (they may point it elsewhere); a link
    of ours into a directory of theirs, as the base or above it. The job makes nothing there, runs its task in its
    own process and says why; write_plan writes no plan and raises nothing."""
    base, _, load, kw, ref = shared
    a = attacker[0]
    ours = base / "ours"
    ours.mkdir(mode=0o755)
    (ours / "sub").mkdir(mode=0o755)
    as_attacker(attacker, """
        import os
        os.mkdir({t!r}); os.chmod({t!r}, 0o1777); os.mkdir({above!r}, 0o755); os.mkdir({t2!r}, 0o755)
        os.symlink({ours!r}, {tlink!r})
    """, t=str(base / "theirs"), above=str(base / "above"), t2=str(base / "theirs2"), ours=str(ours),
                tlink=str(base / "tlink"))
    (base / "above" / "mine").mkdir(mode=0o755)  # ours (root may create it), in theirs
    (base / "theirs2" / "sub").mkdir(mode=0o755)  # ours, in theirs
    (base / "olink").symlink_to(base / "theirs")
    (base / "olink2").symlink_to(base / "theirs2" / "sub")
    cases = [  # (base, where the job would have made its directory, what the log says)
        (base / "theirs", base / "theirs", f"lies in {base / 'theirs'}, which is owned by uid {a}"),
        (base / "above" / "mine", base / "above" / "mine", f"lies under {base / 'above'}, which is owned by uid {a}"),
        (base / "tlink", ours, f"lies in {base / 'tlink'}, which is owned by uid {a}"),  # their link, as written
        (base / "tlink" / "sub", ours / "sub", f"lies under {base / 'tlink'}, which is owned by uid {a}"),
        (base / "olink", base / "theirs", f"lies under {base / 'theirs'}, which is owned by uid {a}"),  # resolved
        (base / "olink2", base / "theirs2" / "sub", f"lies under {base / 'theirs2'}, which is owned by uid {a}"),
    ]
    for i, (where, real, said) in enumerate(cases):
        monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(where))
        out, log = tmp_path / f"out{i}.h5", tmp_path / f"job{i}.log"
        ms.run_task("extract", kw(out), load=load, log=str(log))
        text = log.read_text()
        assert "the task runs here" in text and said in text, (where, text[-2000:])
        assert [n for n in os.listdir(real) if n.startswith("llmgeom-")] == []  # nothing of the job's made there
        monkeypatch.delenv(ms.PLAN_ENV, raising=False)
        assert ms.write_plan([]) is None and ms.PLAN_ENV not in os.environ
        same_values(out, ref)


def test_a_squatter_in_tmpdir_costs_nothing_where_the_runtime_dir_is_private(shared, attacker, tmp_path, monkeypatch):
    """Issue 46 point 5: the second user pre-creates ``$TMPDIR/llmgeom-models-<uid>`` (0777); with a private
    ``$XDG_RUNTIME_DIR`` (0700, this user's) and no LLMGEOM_MODEL_SERVER_DIR, the servers live there and the job
    runs through its server; without it, the squatted directory is refused (the task then runs in the job)."""
    base, _, load, kw, ref = shared
    squatted = base / f"llmgeom-models-{os.getuid()}"
    as_attacker(attacker, "import os; os.mkdir({p!r}); os.chmod({p!r}, 0o777)", p=str(squatted))
    xdg = tmp_path / "run-user"
    xdg.mkdir(mode=0o700)
    monkeypatch.delenv("LLMGEOM_MODEL_SERVER_DIR")
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert ms.servers_root() == xdg / f"llmgeom-models-{os.getuid()}"
    out, log = tmp_path / "out.h5", tmp_path / "job.log"
    try:
        ms.run_task("extract", kw(out), load=load, log=str(log))
    finally:
        ms.stop_server(load)
    text = log.read_text()
    assert "weights loaded for it: 1" in text and "the task runs here" not in text, text[-2000:]
    assert (ms.server_dir(load) / "server.log").is_file() and os.listdir(squatted) == []
    same_values(out, ref)
    monkeypatch.delenv("XDG_RUNTIME_DIR")  # the same squat without a runtime directory: refused, run here
    out2, log2 = tmp_path / "out2.h5", tmp_path / "job2.log"
    ms.run_task("extract", kw(out2), load=load, log=str(log2))
    assert f"{squatted} is owned by uid {attacker[0]}" in log2.read_text()
    same_values(out2, ref)


# --------------------------------------------------------------------------- the checks themselves


def test_private_dir_is_made_0700_whatever_the_umask_and_refuses_what_is_not_private(tmp_path):
    old = os.umask(0)
    try:
        d = private_ipc.private_dir(tmp_path / "a")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)
    with pytest.raises(private_ipc.UnsafePath, match=r"has mode 0755: group or others have access"):
        private_ipc.private_dir(tmp_path / "open")
    (tmp_path / "link").symlink_to(d)
    with pytest.raises(private_ipc.UnsafePath, match="is a symbolic link"):
        private_ipc.check_private_dir(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(private_ipc.UnsafePath, match="is not a directory"):
        private_ipc.check_private_dir(tmp_path / "file")
    shared_base = tmp_path / "shared"
    shared_base.mkdir()
    os.chmod(shared_base, 0o777)  # writable by all, no sticky bit: anyone could rename ours away
    with pytest.raises(private_ipc.UnsafePath, match="without the sticky bit"):
        private_ipc.private_dir(shared_base / "mine")
    os.chmod(shared_base, 0o1777)
    assert private_ipc.private_dir(shared_base / "mine") == shared_base / "mine"


def test_a_directory_owned_by_another_user_is_refused(tmp_path, attacker):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, attacker[0], attacker[1])
    with pytest.raises(private_ipc.UnsafePath, match=f"is owned by uid {attacker[0]}"):
        private_ipc.private_dir(d)


def test_a_key_owned_by_another_user_is_not_read(tmp_path, attacker):
    """An authkey of the right mode (0600) in place, but another user's: refused unread (they chose its bytes)."""
    key = tmp_path / "authkey"
    private_ipc.write_secret(key, b"00" * 32)
    assert private_ipc.read_secret(key) == b"00" * 32
    os.chown(key, attacker[0], attacker[1])
    with pytest.raises(private_ipc.UnsafePath, match=f"is owned by uid {attacker[0]}"):
        private_ipc.read_secret(key)


def test_a_secret_is_0600_from_its_creation_and_never_written_through_a_planted_link(tmp_path, monkeypatch):
    modes = []
    real_open = os.open

    def spy(path, flags, mode=0o777, **kw):
        fd = real_open(path, flags, mode, **kw)
        if flags & os.O_CREAT:
            modes.append((flags & os.O_EXCL, stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "key.partial").symlink_to(elsewhere)  # planted where the secret is first written
    old = os.umask(0)
    monkeypatch.setattr(os, "open", spy)
    try:
        private_ipc.write_secret(tmp_path / "key", b"s3cret")
    finally:
        monkeypatch.undo()
        os.umask(old)
    assert modes == [(os.O_EXCL, 0o600)]  # created exclusively with 0600: never readable by others
    assert not elsewhere.exists() and private_ipc.read_secret(tmp_path / "key") == b"s3cret"
    os.chmod(tmp_path / "key", 0o644)
    with pytest.raises(private_ipc.UnsafePath, match="has mode 0644"):
        private_ipc.read_secret(tmp_path / "key")


def test_channel_carries_json_only_and_bounds_a_message():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    b.settimeout(5)  # a reader that waited for the 16 MiB + 1 announced bytes would time out, not refuse
    ca, cb = private_ipc.Channel(a), private_ipc.Channel(b)
    ca.send({"task": "extract", "kwargs": {"n": [1, 2.5, None]}})
    assert cb.recv() == {"task": "extract", "kwargs": {"n": [1, 2.5, None]}}
    with pytest.raises(TypeError):
        ca.send({"x": object()})
    a.sendall((private_ipc.MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(ValueError, match="over the limit"):
        cb.recv()
    a.sendall((4).to_bytes(4, "big") + b"\x80\x03N.")  # a pickle of None: not JSON, never unpickled
    with pytest.raises(ValueError):
        cb.recv()
    ca.close()
    with pytest.raises(EOFError):
        cb.recv()
    cb.close()


def test_task_arguments_that_json_cannot_carry_are_refused_before_any_work(tmp_path):
    with pytest.raises(TypeError, match="must be JSON values"):
        ms.run_task("extract", {"out_path": Path("x.h5")}, load={}, log=str(tmp_path / "x.log"))


class _Creds:
    """A socket stand-in whose SO_PEERCRED answer is given (``struct ucred``: pid_t, uid_t, gid_t)."""

    def __init__(self, pid, uid, gid):
        import struct

        self.raw = struct.pack("iII", pid, uid, gid)

    def getsockopt(self, level, opt, size):
        assert (level, opt, size) == (socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return self.raw


def test_peer_credentials_read_uid_and_gid_unsigned():
    """uid_t and gid_t are unsigned: a uid over 2**31 (LDAP and container ranges reach them) is read as itself,
    not as a negative number ("3i" read 4294967294 as -2)."""
    assert private_ipc.peer_uid(_Creds(1234, 4294967294, 4294967293)) == 4294967294
    assert private_ipc.peer_uid(_Creds(-1, 2**31 + 5, 0)) == 2**31 + 5
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert private_ipc.peer_uid(a) == os.getuid()
