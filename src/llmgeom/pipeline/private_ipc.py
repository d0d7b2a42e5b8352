"""Talking to one's own processes on a shared node: private directories, peer-checked Unix sockets and a
message format that cannot run code when read.

A login or compute node of a cluster runs many users' jobs, and its temporary directory is world-writable.
What a process keeps there for its own later processes (the model server's socket and authkey, a run's plan)
is safe only when nobody else can put anything in its place, so, as tmux (``tmux-<uid>``), ssh-agent and
Jupyter's runtime directory do:

- :func:`private_dir` creates a directory with mode 0700 and checks it before every use: a directory (not a
  symbolic link), owned by this user, without group or other access; a base directory that others may write
  to must carry the sticky bit (as /tmp does), or another user could rename ours away and put theirs in its
  place. Anything else raises :class:`UnsafePath`, naming the path and what is wrong.
- :func:`write_secret` creates a secret file 0600 from its first byte (``O_CREAT | O_EXCL``), and
  :func:`read_secret` reads one only when it is this user's, 0600, and no symbolic link.
- :class:`Channel` carries length-prefixed JSON over a connected AF_UNIX stream socket. Each end checks the
  other's uid (``SO_PEERCRED``, Linux) before it reads a byte (:func:`check_peer`): a listener that another user
  bound at the address (an abstract address has no file permissions at all) is refused before its reply is
  read. JSON can carry no code (``pickle``, which ``multiprocessing.connection`` unpickles, can); tables and
  arrays travel as files in the job's own directories.

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


def check_private_dir(path) -> Path:
    """Raise :class:`UnsafePath` unless ``path`` is a directory of this user's that nobody else can enter or
    change, inside a base directory where nobody else can replace it.

    Raises:
        UnsafePath: naming the path, each problem, and the fix.
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    problems = _problems(os.lstat(path), kind="directory")
    base = os.stat(path.parent)  # following links: /tmp may itself be one
    if base.st_mode & 0o022 and not base.st_mode & stat.S_ISVTX:
        problems.append(f"lies in {path.parent}, which others may write to without the sticky bit (they could "
                        f"replace it)")
    if problems:
        raise UnsafePath(f"{path} {'; '.join(problems)}. It is not used. If it is yours, remove it "
                         f"(rm -r {path}); else set LLMGEOM_MODEL_SERVER_DIR to a directory of your own "
                         f"(docs/troubleshooting.md \"model-server directory\")")
    return path


def private_dir(path) -> Path:
    """``path``, created with mode 0700 if missing (its parents as ordinary directories), then checked
    (:func:`check_private_dir`).

    Raises:
        UnsafePath: ``path`` exists and is not private (a symbolic link, another owner, group/other access).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)  # the umask can only take bits away
    except FileExistsError:
        pass
    return check_private_dir(path)


def write_secret(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically as a file of mode 0600 from its creation (never readable by others,
    not for a moment): ``<path>.partial`` with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then a rename. Its directory
    should be private (:func:`private_dir`)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def read_secret(path) -> bytes:
    """The contents of ``path`` when it is a regular file of this user's, mode 0600 or stricter, no link.

    Raises:
        FileNotFoundError: there is none.
        UnsafePath: it exists but fails that check (it is not read).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
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
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
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


def connect(address: str) -> Channel:
    """A :class:`Channel` to the AF_UNIX listener at ``address`` (a path, or ``"\\0name"`` abstract), its peer
    checked to be this user's before anything is read.

    Raises:
        OSError: nothing listens there.
        UnsafePath: another user's process listens there.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
        check_peer(sock, f"the listener at {address!r}")
    except BaseException:
        sock.close()
        raise
    return Channel(sock)


def listen(address: str) -> socket.socket:
    """A listening AF_UNIX stream socket bound at ``address`` (a path inside a private directory, or an abstract
    name); accept connections with :func:`accept`.

    Raises:
        OSError: the address is taken (another listener, possibly another user's, at an abstract name).
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
