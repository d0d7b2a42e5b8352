"""Talking to one's own processes on a shared node: private directories, peer-checked Unix sockets and a
message format that cannot run code when read.

A login or compute node of a cluster runs many users' jobs, and its temporary directory is world-writable.
What a process keeps there for its own later processes (the model server's socket and authkey, a run's plan)
is safe only when nobody else can put anything in its place, so, as tmux (``tmux-<uid>``), ssh-agent and
Jupyter's runtime directory do:

- :func:`private_dir` creates a directory with mode 0700 and checks it before every use: a directory (not a
  symbolic link), owned by this user, without group or other access, under a base whose every directory up to
  ``/`` is root's or this user's, a writable-by-others one sticky (:func:`base_problems`, as OpenSSH's
  ``safe_path``): else another user could rename ours away and put theirs in its place. Anything else raises
  :class:`UnsafePath`, naming the path and what is wrong.
- :class:`PrivateDir` holds a descriptor of such a directory (checked again with ``fstat``); its files are opened,
  removed and renamed relative to it, and its socket is bound and reached at ``/proc/self/fd/<fd>/<name>``, a path
  that fits AF_UNIX's 108 bytes however deep the directory: no abstract socket name, which any user may bind first.
- :func:`write_secret` creates a secret file 0600 from its first byte (``O_CREAT | O_EXCL``), and
  :func:`read_secret` reads one only when it is this user's, 0600, and no symbolic link.
- :class:`Channel` carries length-prefixed JSON (at most :data:`MAX_MESSAGE_BYTES` a message) over a connected
  AF_UNIX stream socket. Each end checks the other's uid (``SO_PEERCRED``, Linux) before it reads a byte
  (:func:`check_peer`), and :func:`connect` gives the connect and every read a timeout until the caller has
  authenticated the peer: a listener that never accepts or never answers cannot stall a job. JSON can carry no
  code (``pickle``, which ``multiprocessing.connection`` unpickles, can); tables and arrays travel as files in the
  job's own directories.

May import: the standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from pathlib import Path

#: the largest message a :class:`Channel` accepts (a task's keyword arguments or a traceback; no data)
MAX_MESSAGE_BYTES = 16 << 20


class UnsafePath(RuntimeError):
    """A directory, file or socket peer that another user could control; never used."""


def _problems(st: os.stat_result, *, kind: str) -> list[str]:
    """What makes an lstat result unfit for a private ``kind`` ("directory" | "file") of this user."""
    out = []
    if stat.S_ISLNK(st.st_mode):
        out.append("is a symbolic link")
    elif kind == "directory" and not stat.S_ISDIR(st.st_mode):
        out.append("is not a directory")
    elif kind == "file" and not stat.S_ISREG(st.st_mode):
        out.append("is not a regular file")
    if st.st_uid != os.getuid():
        out.append(f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})")
    if st.st_mode & 0o077:
        out.append(f"has mode {stat.S_IMODE(st.st_mode):04o}: group or others have access "
                   f"(a private {kind} is {'0700' if kind == 'directory' else '0600'})")
    return out


def base_problems(base) -> list[str]:
    """What lets another user rename or replace an entry of the directory ``base``, as OpenSSH's ``safe_path``
    checks the directories above a key file: every directory on the way from ``/`` to ``base`` (``base``
    itself included), both as written (each entry, symbolic links included, ``lstat``) and as resolved
    (``realpath``), must be owned by root or by this user, and a resolved directory that group or others may
    write to must carry the sticky bit (as /tmp does: then only an entry's owner, the directory's owner and
    root can rename it). Empty when ``base`` is safe.

    Raises:
        FileNotFoundError: ``base`` (or a directory above it) does not exist.
    """
    me = os.getuid()
    base = Path(os.path.abspath(base))
    found: dict[Path, list[str]] = {}
    for p in (base, *base.parents):  # as written: a link planted on the way is another user's file
        st = os.lstat(p)
        if st.st_uid not in (0, me):
            found.setdefault(p, []).append(f"is owned by uid {st.st_uid} (neither root nor this user, uid {me})")
    real = Path(os.path.realpath(base))
    for p in (real, *real.parents):
        st = os.stat(p)
        if st.st_uid not in (0, me) and p not in found:
            found.setdefault(p, []).append(f"is owned by uid {st.st_uid} (neither root nor this user, uid {me})")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            found.setdefault(p, []).append(f"has mode {stat.S_IMODE(st.st_mode):04o}: others may write to it "
                                           f"without the sticky bit")
    return [f"{'lies in' if p == base else 'lies under'} {p}, which {' and '.join(why)} (its owner or others "
            f"could rename it and put theirs in its place)" for p, why in found.items()]


def _refuse(path, problems: list[str]):
    raise UnsafePath(f"{path} {'; '.join(problems)}. It is not used. If it is yours, remove it "
                     f"(rm -r {path}); else set LLMGEOM_MODEL_SERVER_DIR to a directory of your own "
                     f"(docs/troubleshooting.md \"model-server directory\")")


def check_private_dir(path) -> Path:
    """Raise :class:`UnsafePath` unless ``path`` is a directory of this user's that nobody else can enter or
    change, inside a base directory where nobody else can replace it (:func:`base_problems`).

    Raises:
        UnsafePath: naming the path, each problem, and the fix.
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(os.path.abspath(path))
    problems = _problems(os.lstat(path), kind="directory") + base_problems(path.parent)
    if problems:
        _refuse(path, problems)
    return path


def private_dir(path) -> Path:
    """``path``, created with mode 0700 if missing (its parents as ordinary directories), then checked
    (:func:`check_private_dir`).

    Raises:
        UnsafePath: ``path`` exists and is not private (a symbolic link, another owner, group/other access), or
            lies in a base that another user could change (:func:`base_problems`).
        OSError: it cannot be created (a base this user cannot write, a file in the way).
    """
    path = Path(os.path.abspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    problems = base_problems(path.parent)
    if problems:  # nothing is made in a base that another user could change
        _refuse(path, problems)
    try:
        os.mkdir(path, 0o700)  # the umask can only take bits away
    except FileExistsError:
        pass
    return check_private_dir(path)


class PrivateDir:
    """An open private directory (:func:`check_private_dir`, then the descriptor itself checked with ``fstat``):
    every later step names its files relative to the descriptor (``dir_fd``), so a rename of the path after the
    check cannot redirect them, and :meth:`address` names a socket in it by a path that always fits AF_UNIX's
    108 bytes (``/proc/self/fd/<fd>/<name>``: no abstract address, which anyone may bind first).
    A context manager; :meth:`close` closes the descriptor.

    Raises:
        UnsafePath: ``path`` is not private, or changed between the check and the open.
        FileNotFoundError: ``path`` does not exist.
    """

    def __init__(self, path):
        self.path = check_private_dir(path)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        problems = _problems(os.fstat(self.fd), kind="directory")
        if problems:
            self.close()
            _refuse(self.path, problems)

    def address(self, name: str) -> str:
        """The AF_UNIX path of the socket ``name`` in this directory, for this process (Linux ``/proc``)."""
        return f"/proc/self/fd/{self.fd}/{name}"

    def exists(self, name: str) -> bool:
        try:
            os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def unlink(self, name: str) -> None:
        """Remove ``name`` from this directory if it is there."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """``os.open`` of ``name`` in this directory, never through a symbolic link; a file descriptor."""
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "PrivateDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_secret(path, data: bytes, *, dir_fd: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically as a file of mode 0600 from its creation (never readable by others,
    not for a moment): ``<path>.partial`` with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then a rename. Its directory
    should be private (:func:`private_dir`); with ``dir_fd`` (:class:`PrivateDir`), ``path`` is a name in it."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def read_secret(path, *, dir_fd: int | None = None) -> bytes:
    """The contents of ``path`` when it is a regular file of this user's, mode 0600 or stricter, no link (with
    ``dir_fd``, a name in that directory).

    Raises:
        FileNotFoundError: there is none.
        UnsafePath: it exists but fails that check (it is not read).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as fh:
        problems = _problems(os.fstat(fh.fileno()), kind="file")
        if problems:
            raise UnsafePath(f"{path} {'; '.join(problems)}; it is not read")
        return fh.read()


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected AF_UNIX socket (``SO_PEERCRED``: for a client,
    the process that bound the listener; for a server, the one that connected).

    Raises:
        UnsafePath: the platform cannot tell (no ``SO_PEERCRED``): the peer is not trusted.
    """
    if not hasattr(socket, "SO_PEERCRED"):
        raise UnsafePath("this platform has no SO_PEERCRED: the peer of a Unix socket cannot be checked")
    # struct ucred {pid_t pid; uid_t uid; gid_t gid;}: pid signed, uid and gid unsigned (a uid over 2**31 stays one)
    _pid, uid, _gid = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                           struct.calcsize("iII")))
    return uid


def check_peer(sock: socket.socket, what: str) -> None:
    """Raise :class:`UnsafePath` unless the peer of ``sock`` runs as this user; call it before reading."""
    uid = peer_uid(sock)
    if uid != os.getuid():
        raise UnsafePath(f"{what} belongs to uid {uid}, not to this user (uid {os.getuid()}): refused before "
                         f"reading anything from it")


class Channel:
    """Length-prefixed JSON messages (4-byte big-endian length, UTF-8 JSON) over a connected stream socket.

    Sending and receiving may happen in two threads at once (one reader, one writer)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, obj) -> None:
        """Send one JSON-serialisable object.

        Raises:
            TypeError: ``obj`` holds something JSON cannot carry (named by ``json``); nothing is sent.
            OSError: the peer is gone.
        """
        data = json.dumps(obj).encode()
        self.sock.sendall(struct.pack(">I", len(data)) + data)

    def recv(self):
        """Receive one object.

        Raises:
            EOFError: the peer closed the connection.
            ValueError: a message over :data:`MAX_MESSAGE_BYTES` or not JSON.
        """
        (n,) = struct.unpack(">I", self._exactly(4))
        if n > MAX_MESSAGE_BYTES:
            raise ValueError(f"a message of {n} bytes: over the limit of {MAX_MESSAGE_BYTES}")
        return json.loads(self._exactly(n).decode())

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("the peer closed the connection")
            buf += chunk
        return bytes(buf)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: seconds a :func:`connect` may take, and each read on its channel until the caller lifts the limit
CONNECT_TIMEOUT_S = 30.0


def connect(address: str, timeout: float | None = CONNECT_TIMEOUT_S) -> Channel:
    """A :class:`Channel` to the AF_UNIX listener at the path ``address`` (in a private directory:
    :meth:`PrivateDir.address`), its peer checked to be this user's before anything is read. The channel's
    reads and writes time out after ``timeout`` seconds (``socket.timeout``, an ``OSError``) until the caller
    sets another (``chan.sock.settimeout``): a listener that never accepts (its backlog full: the connect fails
    at once) or never answers cannot stall the caller.

    Raises:
        OSError: nothing listens there, or it did not accept within ``timeout``.
        UnsafePath: another user's process listens there.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        check_peer(sock, f"the listener at {address!r}")
    except BaseException:
        sock.close()
        raise
    return Channel(sock)


def listen(address: str) -> socket.socket:
    """A listening AF_UNIX stream socket bound at the path ``address`` (inside a private directory:
    :meth:`PrivateDir.address`); accept connections with :func:`accept`.

    Raises:
        OSError: the address is taken (a file is there).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(address)
        sock.listen(16)
    except BaseException:
        sock.close()
        raise
    return sock


def accept(listener: socket.socket) -> Channel:
    """The next connection whose peer is this user's (:func:`check_peer` before a byte is read).

    Raises:
        UnsafePath: the connecting process is another user's (its connection is closed unread).
    """
    sock, _ = listener.accept()
    try:
        check_peer(sock, "a connecting process")
    except BaseException:
        sock.close()
        raise
    return Channel(sock)
