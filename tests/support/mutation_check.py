"""Every protection proven: remove one protection at a time in a scratch copy of the tree and run the tests that
claim it; a protection whose tests still pass is one that no test would miss.

    .venv/bin/python tests/support/mutation_check.py                 # all mutations, a table on stdout
    .venv/bin/python tests/support/mutation_check.py --only hmac     # the ones whose name contains "hmac"
    .venv/bin/python tests/support/mutation_check.py --write docs/testing.md   # also the table into the docs

Each entry of :data:`MUTATIONS` names a protection, the file that holds it, the exact code it removes (``old``,
which must occur exactly once: an entry that no longer matches the code fails loudly, so the table cannot go stale
silently) and what it puts there instead (``new``: the code without that one protection), and the tests that claim
it (pytest node ids). For each entry the script copies the tracked and untracked-not-ignored files of the tree
(``git ls-files -co --exclude-standard``) into a scratch directory, applies that one edit, and runs those tests
there (``PYTHONPATH=<scratch>/src``, this interpreter, ``-x -q -p no:cacheprovider``, a per-entry timeout);
"killed" = the tests failed (pytest's status 1; a collection error, which would mean the edit broke the file, or
a run past the timeout is not a kill). Before any mutation the same tests run on the unmutated copy and must pass (otherwise
a failure would prove nothing). Exit status 0 only when every mutation is killed.

The tests of the shared-node protections need root (a second local user); run this as root, as CI does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the markers between which ``--write`` puts the table (in docs/testing.md)
BEGIN, END = "<!-- mutation-table:begin -->", "<!-- mutation-table:end -->"


@dataclass(frozen=True)
class Mutation:
    """One protection removed: in ``path`` (relative to the repository), ``old`` (which occurs exactly
    ``occurrences`` times: each is replaced) becomes ``new``; ``tests`` (pytest node ids) claim the protection."""

    name: str
    protection: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    occurrences: int = 1


SN = "tests/unit/pipeline/test_shared_node.py"
MS = "tests/unit/pipeline/test_model_server.py"
FD = "tests/unit/extract/test_full_disk.py"
ST = "tests/unit/core/test_store.py"

#: the protections and the tests that claim them (see the module docstring)
MUTATIONS: tuple[Mutation, ...] = (
    # ---- full disks and durability (core/io.py, core/writer.py, pipeline/jobs.py)
    Mutation("space-reserve", "space reserve beside a partial output (released when the disk fills, so HDF5 can "
             "flush and close intact)", "src/llmgeom/core/io.py",
             "        if not self.nbytes:  # nothing to hold back: no file",
             "        if True:  # mutated: no reserve",
             (f"{FD}::test_a_full_disk_at_the_commit_keeps_every_committed_batch",)),
    Mutation("log-reserve", "room held back for the job's log (the DiskFullError reaches a log on the full disk)",
             "src/llmgeom/pipeline/jobs.py", "LOG_RESERVE = 64 << 10", "LOG_RESERVE = 0",
             (f"{FD}::test_run_logged_keeps_the_disk_full_error_when_its_log_is_full",)),
    Mutation("resume-sha256", "sha256 check of every committed batch on resume", "src/llmgeom/core/writer.py",
             """if batch_digest(items) != self.f["resume/sha256"][j].decode():""", "if False:",
             (f"{ST}::test_partial_from_other_settings_or_corrupted_is_discarded",)),
    Mutation("resume-code-hash", "the extraction's code hash in the resume key (a partial of other code is not "
             "resumed)", "src/llmgeom/extract/forward.py", "        code=source_sha256(*EXTRACTION_CODE)),",
             "        code=None),", (f"{ST}::test_partial_written_by_other_code_is_discarded",)),
    Mutation("fsync-before-rename", "the file's data flushed (fsync) before os.replace", "src/llmgeom/core/io.py",
             "    fsync_path(tmp)\n    os.replace(tmp, path)", "    os.replace(tmp, path)",
             (f"{FD}::test_the_data_reach_the_disk_before_the_rename",)),
    Mutation("server-log-unfailing", "the model server's prints never raise (a full server.log does not end the "
             "server)", "src/llmgeom/pipeline/model_server.py",
             "    sys.stdout, sys.stderr = unfailing(sys.stdout), unfailing(sys.stderr)", "    pass",
             (f"{FD}::test_model_server_survives_a_full_disk_under_its_log",)),
    # ---- shared nodes (pipeline/private_ipc.py, pipeline/model_server.py)
    Mutation('dir-owner', 'server directory owned by this user', 'src/llmgeom/pipeline/private_ipc.py',
             '    if st.st_uid != os.getuid():\n        out.append(f"is owned by uid',
             '    if False:\n        out.append(f"is owned by uid',
             (f"{SN}::test_a_directory_owned_by_another_user_is_refused", f"{SN}::test_the_attack_on_a_directory_made_by_another_user_is_refused", f"{SN}::test_a_key_owned_by_another_user_is_not_read",)),
    Mutation('dir-mode', 'server directory mode 0700 (no group/other access)', 'src/llmgeom/pipeline/private_ipc.py',
             '    if st.st_mode & 0o077:',
             '    if False:',
             (f"{SN}::test_private_dir_is_made_0700_whatever_the_umask_and_refuses_what_is_not_private",)),
    Mutation('symlink', 'server directory not a symbolic link', 'src/llmgeom/pipeline/private_ipc.py',
             '    if stat.S_ISLNK(st.st_mode):\n        out.append("is a symbolic link")\n    elif',
             '    if False:\n        pass\n    elif',
             (f"{SN}::test_a_symbolic_link_to_another_users_directory_is_refused", f"{SN}::test_private_dir_is_made_0700_whatever_the_umask_and_refuses_what_is_not_private",)),
    Mutation('base-owner', 'base directory and its ancestors owned by root or this user (both checks)', 'src/llmgeom/pipeline/private_ipc.py',
             'st.st_uid not in (0, me)',
             'False',
             (f"{SN}::test_a_base_owned_by_another_user_is_not_used",), occurrences=2),
    Mutation('base-owner-as-written', 'base owner checked on the path as written (links included)', 'src/llmgeom/pipeline/private_ipc.py',
             'for p in (base, *base.parents):',
             'for p in ():',
             (f"{SN}::test_a_base_owned_by_another_user_is_not_used",)),
    Mutation('base-owner-resolved', 'base owner checked on the resolved path', 'src/llmgeom/pipeline/private_ipc.py',
             'if st.st_uid not in (0, me) and p not in found:',
             'if False:',
             (f"{SN}::test_a_base_owned_by_another_user_is_not_used",)),
    Mutation('base-owner-ancestors-as-written', 'ancestors of the base as written', 'src/llmgeom/pipeline/private_ipc.py',
             'for p in (base, *base.parents):',
             'for p in (base,):',
             (f"{SN}::test_a_base_owned_by_another_user_is_not_used",)),
    Mutation('base-owner-ancestors-resolved', 'ancestors of the base resolved', 'src/llmgeom/pipeline/private_ipc.py',
             'for p in (real, *real.parents):',
             'for p in (real,):',
             (f"{SN}::test_a_base_owned_by_another_user_is_not_used",)),
    Mutation('base-sticky', 'a base others may write to must be sticky', 'src/llmgeom/pipeline/private_ipc.py',
             'if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:',
             'if False:',
             (f"{SN}::test_private_dir_is_made_0700_whatever_the_umask_and_refuses_what_is_not_private",)),
    Mutation('base-checked-before-mkdir', 'nothing made in an unsafe base', 'src/llmgeom/pipeline/private_ipc.py',
             '    problems = base_problems(path.parent)\n    if problems:  # nothing',
             '    problems = []\n    if problems:  # nothing',
             (f"{SN}::test_a_base_owned_by_another_user_is_not_used",)),
    Mutation('o-excl-key', 'authkey created O_EXCL (0600 from its first byte)', 'src/llmgeom/pipeline/private_ipc.py',
             'os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW',
             'os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW',
             (f"{SN}::test_a_secret_is_0600_from_its_creation_and_never_written_through_a_planted_link",)),
    Mutation('key-check', "authkey read only when this user's, 0600, no link", 'src/llmgeom/pipeline/private_ipc.py',
             '            raise UnsafePath(f"{path} {\'; \'.join(problems)}; it is not read")',
             '            pass',
             (f"{SN}::test_a_secret_is_0600_from_its_creation_and_never_written_through_a_planted_link", f"{SN}::test_a_key_owned_by_another_user_is_not_read",)),
    Mutation('peer-check-client', "peer check (SO_PEERCRED) in the client's connect", 'src/llmgeom/pipeline/private_ipc.py',
             '        check_peer(sock, f"the listener at {address!r}")',
             '        pass',
             (f"{SN}::test_a_listener_of_another_user_at_the_servers_socket_is_refused",)),
    Mutation('peer-check-server', "peer check in the server's accept", 'src/llmgeom/pipeline/private_ipc.py',
             '        check_peer(sock, "a connecting process")',
             '        pass',
             (f"{SN}::test_another_users_connection_is_refused_before_a_byte_is_read",)),
    Mutation('message-size', 'message size limit', 'src/llmgeom/pipeline/private_ipc.py',
             '        if n > MAX_MESSAGE_BYTES:\n            raise',
             '        if False:\n            raise',
             (f"{SN}::test_channel_carries_json_only_and_bounds_a_message",)),
    Mutation('hmac', 'HMAC proof of the authkey', 'src/llmgeom/pipeline/model_server.py',
             'good = isinstance(proof, str) and hmac.compare_digest(',
             'good = True or (',
             (f"{SN}::test_another_users_connection_is_refused_before_a_byte_is_read",)),
    Mutation('iii', 'peer credentials unpacked iII (uid, gid unsigned)', 'src/llmgeom/pipeline/private_ipc.py',
             'struct.unpack("iII"',
             'struct.unpack("3i"',
             (f"{SN}::test_peer_credentials_read_uid_and_gid_unsigned",)),
    Mutation('no-abstract-name', 'no abstract socket name (socket file in the private directory)', 'src/llmgeom/pipeline/private_ipc.py',
             '        return f"/proc/self/fd/{self.fd}/{name}"',
             '        return "\\0llmgeom-models-" + __import__("hashlib").sha256(os.fsencode(str(self.path))).hexdigest()[:40]',
             (f"{SN}::test_a_squatted_abstract_name_costs_nothing", f"{MS}::test_deep_server_directory_binds_its_socket_inside_the_directory",)),
    Mutation('connect-timeout', "timeout on the client's connect", 'src/llmgeom/pipeline/private_ipc.py',
             '        sock.settimeout(timeout)\n        sock.connect(address)',
             '        sock.settimeout(None)\n        sock.connect(address)',
             (f"{MS}::test_a_server_that_never_accepts_or_answers_costs_a_timeout_then_the_task_runs_here",)),
    Mutation('handshake-timeout', "timeout on the client's read of the nonce", 'src/llmgeom/pipeline/model_server.py',
             'timeout=HANDSHAKE_TIMEOUT_S)',
             'timeout=None)',
             (f"{MS}::test_a_server_that_never_accepts_or_answers_costs_a_timeout_then_the_task_runs_here",)),
    Mutation('lock-timeout', "bounded wait for the directory's lock", 'src/llmgeom/pipeline/model_server.py',
             'fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)',
             'fcntl.flock(fd, fcntl.LOCK_EX)',
             (f"{MS}::test_a_lock_held_too_long_leaves_the_task_to_the_job",)),
    Mutation('fallback-on-any-failure', 'in-process fallback on any failure to start or reach a server', 'src/llmgeom/pipeline/model_server.py',
             '    except Exception as e:\n        why =',
             '    except private_ipc.UnsafePath as e:\n        why =',
             (f"{MS}::test_a_server_that_fails_to_start_leaves_the_task_to_the_job", f"{MS}::test_a_base_that_cannot_be_made_leaves_the_task_to_the_job_and_writes_no_plan",)),
    Mutation('write-plan-oserror', 'write_plan survives a base it cannot make', 'src/llmgeom/pipeline/model_server.py',
             '        except (private_ipc.UnsafePath, OSError) as e:\n            os.environ.pop',
             '        except private_ipc.UnsafePath as e:\n            os.environ.pop',
             (f"{MS}::test_a_base_that_cannot_be_made_leaves_the_task_to_the_job_and_writes_no_plan",)),
    Mutation('python-p', 'server started with python -P (no cwd on sys.path)', 'src/llmgeom/pipeline/model_server.py',
             'sys.executable, "-P", "-m"',
             'sys.executable, "-m"',
             (f"{MS}::test_the_server_does_not_import_from_the_jobs_working_directory",)),
    Mutation('host-in-key', "host name in the server directory's name", 'src/llmgeom/pipeline/model_server.py',
             'return servers_root() / f"{host_name()}-{key}"',
             'return servers_root() / key',
             (f"{MS}::test_each_node_has_its_own_server_directory_on_a_shared_base",)),
    Mutation('host-in-key-ident', 'host name in the server key', 'src/llmgeom/pipeline/model_server.py',
             'owner_pid(), host=socket.gethostname(),',
             'owner_pid(),',
             (f"{MS}::test_each_node_has_its_own_server_directory_on_a_shared_base",)),
    Mutation('xdg-first', 'XDG_RUNTIME_DIR as the first base', 'src/llmgeom/pipeline/model_server.py',
             'or runtime_dir() or',
             'or',
             (f"{SN}::test_a_squatter_in_tmpdir_costs_nothing_where_the_runtime_dir_is_private", f"{MS}::test_runtime_dir_is_the_first_base_where_it_is_private",)),
    Mutation('server-auth-timeout', 'server drops a client that does not authenticate in time', 'src/llmgeom/pipeline/model_server.py',
             '        chan.sock.settimeout(AUTH_TIMEOUT_S)\n        chan.send({"nonce"',
             '        chan.send({"nonce"',
             (f"{MS}::test_a_busy_server_authenticates_at_once_and_a_silent_client_stalls_nobody",)),
    Mutation('server-request-timeout', 'server drops an authenticated client that sends no request', 'src/llmgeom/pipeline/model_server.py',
             '        chan.sock.settimeout(AUTH_TIMEOUT_S)  # the client sent',
             '        pass  # the client sent',
             (f"{MS}::test_an_authenticated_client_that_sends_no_request_stalls_nobody",)),
    Mutation('privatedir-o-nofollow', 'directory descriptor opened O_NOFOLLOW', 'src/llmgeom/pipeline/private_ipc.py',
             'os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC',
             'os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC',
             (f"{MS}::test_the_private_directory_descriptor_is_checked_itself",)),
    Mutation('privatedir-fstat', 'directory descriptor checked with fstat', 'src/llmgeom/pipeline/private_ipc.py',
             '        problems = _problems(os.fstat(self.fd), kind="directory")',
             '        problems = []',
             (f"{MS}::test_the_private_directory_descriptor_is_checked_itself",)),
)


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = REPO / f
        if not src.is_file():
            continue
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / f)


def stale(m: Mutation, root: Path = REPO) -> str:
    """Why entry ``m`` no longer matches the code under ``root`` ("" when it does): the code it removes occurs
    another number of times than ``m.occurrences``, or a test it names is not defined in its file."""
    n = (root / m.path).read_text().count(m.old)
    if n != m.occurrences:
        return (f"mutation {m.name!r}: the code it removes occurs {n} times in {m.path}, not {m.occurrences}: "
                "update MUTATIONS in tests/support/mutation_check.py to the current code")
    for t in m.tests:
        file, _, func = t.partition("::")
        if f"def {func.split('[')[0]}(" not in (root / file).read_text():
            return f"mutation {m.name!r}: {file} defines no test {func!r}"
    return ""


def _apply(root: Path, m: Mutation) -> None:
    why = stale(m, root)
    if why:
        raise SystemExit(why)
    p = root / m.path
    p.write_text(p.read_text().replace(m.old, m.new))


def _run_tests(root: Path, tests, timeout: float) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(root / "src"), HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    tail = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, tail[-1] if tail else ""


def run(mutations, *, timeout: float) -> list[dict]:
    """Each mutation in its own scratch copy; returns one dict per mutation (mutation, killed, rc, summary,
    seconds). Raises SystemExit when the unmutated tests fail or an entry no longer matches the code."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmgeom-mutation-") as tmp:
        base = Path(tmp) / "base"
        _copy_tree(base)
        os.chmod(tmp, 0o755)  # the second local user of the shared-node tests reads the copy
        for m in mutations:  # every entry checked against the code before any test runs
            if stale(m, base):
                raise SystemExit(stale(m, base))
        tests = sorted({t for m in mutations for t in m.tests})
        rc, summary = _run_tests(base, tests, timeout * max(1, len(mutations)))
        if rc != 0:
            raise SystemExit(f"the unmutated tests fail (rc {rc}: {summary}); a mutation would prove nothing")
        print(f"unmutated: {len(tests)} test(s) pass ({summary})", flush=True)
        for m in mutations:
            work = Path(tmp) / m.name
            shutil.copytree(base, work, symlinks=True)
            _apply(work, m)
            t0 = time.time()
            rc, summary = _run_tests(work, m.tests, timeout)
            killed = rc == 1  # tests failed; not a collection error (rc 2: the mutation broke the file) or a hang
            rows.append(dict(mutation=m, killed=killed, rc=rc, summary=summary, seconds=time.time() - t0))
            print(f"{'killed  ' if killed else 'SURVIVED'} {m.name}: {summary} ({time.time() - t0:.0f} s)", flush=True)
            shutil.rmtree(work, ignore_errors=True)
    return rows


def table(rows) -> str:
    """The markdown table: protection, the test(s) that claim it, killed."""
    lines = ["| protection | removed in | test that fails without it | killed |", "|---|---|---|---|"]
    for r in rows:
        m = r["mutation"]
        tests = "<br>".join(f"`{t.split('::', 1)[-1]}` ({Path(t.split('::')[0]).name})" for t in m.tests)
        lines.append(f"| {m.protection} | `{m.path}` | {tests} | {'yes' if r['killed'] else '**no**'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run the mutations whose name contains this")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutation's test run")
    ap.add_argument("--write", type=Path, help="put the table between the markers of this file (docs/testing.md)")
    a = ap.parse_args(argv)
    ms = [m for m in MUTATIONS if a.only in m.name]
    if not ms:
        raise SystemExit(f"no mutation matches {a.only!r}")
    rows = run(ms, timeout=a.timeout)
    tab = table(rows)
    print(tab)
    if a.write:
        text = a.write.read_text()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{a.write} has no {BEGIN} ... {END} markers for the table")
        head, rest = text.split(BEGIN, 1)
        a.write.write_text(head + BEGIN + "\n" + tab + "\n" + END + rest.split(END, 1)[1])
    return 0 if all(r["killed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
