"""A single-node SLURM (munged, slurmctld, slurmd) that the tests start and stop themselves (issue 18).

Used by the session fixture ``slurm`` of tests/cluster/test_slurm_real.py, and by hand (docs/cluster.md,
"Try it on a one-node SLURM")::

    python tests/support/slurm_cluster.py up /tmp/llmgeom-slurm     # prints: export SLURM_CONF=... PATH=...
    python tests/support/slurm_cluster.py down /tmp/llmgeom-slurm
    python tests/support/slurm_cluster.py up --multi-node /tmp/llmgeom-slurm2   # two nodes (MULTI_NODES), issue 31

Everything lives in one directory: a munge key and socket, slurm.conf and gres.conf, the state and spool
directories, the daemons' logs and ``bin/srun`` (see ``SlurmCluster.__init__``). The ports are free ones chosen at start, so the cluster does not clash
with a site SLURM or a second copy. One node ``llmgeom-node`` (CPUs=2, RealMemory=20000, one GPU gres on
/dev/null: a GPU gres needs a device file, and with none the node registers as INVALID), partitions ``cpu``
(default) and ``gpu``; no accounting (``accounting_storage/none``: ``sacct`` answers nothing, so the profile
polls ``squeue``), and ``MinJobAge=3600`` so that finished jobs stay visible to ``squeue``/``scontrol``.

Multi-node (issue 31, ``SlurmCluster(root, nodes=MULTI_NODES)``, ``up --multi-node``): one slurmctld and one
``slurmd -N <name>`` per node, all on this machine (Debian's SLURM is built with multiple-slurmd support: one
``NodeName`` line per node, each with its own ``Port``, the same ``NodeHostname``); each node has one GPU gres of
its own type (``gpu:tesla:1``, ``gpu:ampere:1``, on /dev/null), both nodes in both partitions, and
``SlurmdTimeout`` :data:`MULTI_SLURMD_TIMEOUT` s, so a node whose slurmd is stopped goes DOWN within seconds.

Debian/Ubuntu's ``slurm-wlm`` and ``munge`` packages are installed with apt-get when missing and the
process runs as root; :func:`ensure_installed` says why not otherwise (the tests skip with that reason).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODE = "llmgeom-node"
#: the two compute nodes of :func:`multi_node` (issue 31): a node name -> its GPU type; both on this machine,
#: each its own ``slurmd -N <name>`` with its own port (Debian's SLURM is built with multiple-slurmd support)
MULTI_NODES = {"llmgeom-n1": "tesla", "llmgeom-n2": "ampere"}
#: SlurmdTimeout of the multi-node cluster: a node whose slurmd stops answering is DOWN (its jobs NODE_FAIL)
#: after this many seconds (SLURM's default is 300)
MULTI_SLURMD_TIMEOUT = 10
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")


def ensure_installed() -> str | None:
    """Install ``slurm-wlm munge`` with apt-get where a binary is missing.

    Returns:
        None when SLURM and munge are usable, else the reason they are not (for ``pytest.skip``).
    """
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if not missing:
        return None
    if os.geteuid() != 0:
        return f"SLURM is not installed ({', '.join(missing)} missing) and installing it needs root"
    if shutil.which("apt-get") is None:
        return f"SLURM is not installed ({', '.join(missing)} missing) and there is no apt-get to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            return f"`{' '.join(cmd)}` failed ({r.returncode}): {(r.stderr or r.stdout)[-500:]}"
    still = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    return f"after apt-get install slurm-wlm munge, still missing: {', '.join(still)}" if still else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


SLURM_CONF = """\
ClusterName=llmgeom
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
MinJobAge=3600
KillWait=30
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout={slurmd_timeout}
{node_lines}
PartitionName=cpu Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes={nodes} MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """A SLURM in ``root`` (see the module docstring): one controller and one ``slurmd`` per node of ``nodes``
    (node name -> GPU type or None; default one node :data:`NODE` with an untyped GPU), all on this machine,
    each node on a port of its own. ``slurmd_timeout``: SlurmdTimeout, seconds after which a node whose
    slurmd does not answer is marked DOWN and its jobs end as NODE_FAIL.

    ``env`` holds ``SLURM_CONF`` for the client commands (sbatch, squeue, scontrol) and for Snakemake;
    :meth:`stop` ends every daemon it started and raises ``RuntimeError`` if one is still running.
    """

    def __init__(self, root: str | os.PathLike, nodes: dict[str, str | None] | None = None, slurmd_timeout: int = 60):
        self.root = Path(root).resolve()
        self.conf = self.root / "slurm.conf"
        self.nodes = dict(nodes or {NODE: None})
        self.slurmd_timeout = int(slurmd_timeout)
        # bin/srun: the real srun with SLURM_CONF set. snakemake-executor-plugin-slurm-jobstep (0.6) drops every
        # SLURM_* variable but the job's identity before its srun inside the allocation, SLURM_CONF too, so
        # a cluster whose slurm.conf is not at the default path (/etc/slurm/slurm.conf) needs it.
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), PATH=f"{self.root / 'bin'}:{os.environ.get('PATH', '')}")
        self.procs: dict[str, int] = {}

    # ------------------------------------------------------------------ set-up
    def write_config(self) -> None:
        """Munge key, slurm.conf and gres.conf under ``root``, with free ports."""
        d = self.root
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge").chmod(0o700)
        key = d / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        host = socket.gethostname().split(".")[0]
        lines, gres = [], []
        for node, gpu in self.nodes.items():
            typed = f"gpu:{gpu}:1" if gpu else "gpu:1"
            lines.append(f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} Port={_free_port()} CPUs=2 "
                         f"RealMemory=20000 Gres={typed} State=UNKNOWN")
            gres.append(f"NodeName={node} Name=gpu{' Type=' + gpu if gpu else ''} File=/dev/null")
        self.conf.write_text(SLURM_CONF.format(d=d, host=host, ctld_port=_free_port(), node_lines="\n".join(lines),
                                               nodes=",".join(self.nodes), slurmd_timeout=self.slurmd_timeout))
        (d / "gres.conf").write_text("\n".join(gres) + "\n")
        (d / "bin").mkdir(exist_ok=True)
        shim = d / "bin" / "srun"
        shim.write_text(f"#!/bin/sh\nSLURM_CONF={self.conf} exec {shutil.which('srun') or '/usr/bin/srun'} \"$@\"\n")
        shim.chmod(0o755)

    def start(self, timeout: float = 60.0) -> "SlurmCluster":
        """Write the configuration, start munged, ``slurmctld -i`` and one slurmd per node; wait for every node
        to be idle.

        Raises:
            RuntimeError: a daemon did not start, or a node is not idle within ``timeout`` seconds
                (the message holds the daemons' log tails).
        """
        self.write_config()
        d = self.root
        self._daemon("munged", [_bin("munged"), "--force", f"--socket={d}/munge/munge.socket",
                                f"--key-file={d}/munge/munge.key", f"--pid-file={d}/munge/munged.pid",
                                f"--log-file={d}/log/munged.log", f"--seed-file={d}/munge/munged.seed"],
                     d / "munge" / "munged.pid")
        self._daemon("slurmctld", [_bin("slurmctld"), "-i", "-f", str(self.conf)], d / "slurmctld.pid")
        for node in self.nodes:
            self.start_slurmd(node, wait=False)
        self.wait_idle(timeout=timeout)
        return self

    def start_slurmd(self, node: str, wait: bool = True, timeout: float = 60.0) -> None:
        """Start node ``node``'s slurmd (again); with ``wait``, until the node is idle (ReturnToService=2 returns
        a DOWN node to service once its slurmd registers)."""
        self._daemon(f"slurmd:{node}", [_bin("slurmd"), "-N", node, "-f", str(self.conf)], self._slurmd_pidfile(node))
        if wait:
            self.wait_idle([node], timeout=timeout)

    def stop_slurmd(self, node: str) -> None:
        """Stop node ``node``'s slurmd only (SIGTERM): its job steps (slurmstepd and the job's processes) run
        on, as on a node that the controller can no longer reach."""
        _terminate(self.procs.pop(f"slurmd:{node}"))

    def wait_idle(self, nodes=None, timeout: float = 60.0) -> None:
        """Wait until every node of ``nodes`` (default all) is idle; RuntimeError with the logs after ``timeout``."""
        nodes = list(nodes or self.nodes)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if all(self.node_state(n).startswith("idle") for n in nodes):
                return
            time.sleep(0.5)
        raise RuntimeError(f"nodes {nodes} not idle after {timeout:.0f} s (states "
                           f"{[self.node_state(n) for n in nodes]})\n" + self.logs())

    def _slurmd_pidfile(self, node: str) -> Path:
        return self.root / f"slurmd-{node}.pid"

    def _daemon(self, name: str, cmd: list[str], pidfile: Path, timeout: float = 20.0) -> None:
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}\n{self.logs()}")
        t0 = time.time()
        while time.time() - t0 < timeout:
            if pidfile.is_file() and pidfile.read_text().strip():
                pid = int(pidfile.read_text().split()[0])
                if _alive(pid):
                    self.procs[name] = pid
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{name} wrote no pid file {pidfile} within {timeout:.0f} s\n{self.logs()}")

    # ------------------------------------------------------------------ use
    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """A client command (sbatch, squeue, scontrol, ...) against this cluster."""
        r = subprocess.run(list(cmd), capture_output=True, text=True, env=self.env, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr}")
        return r

    def node_state(self, node: str | None = None) -> str:
        """sinfo's state of ``node`` (default the first node): idle, mixed, allocated, down*, ..."""
        r = self.run("sinfo", "-h", "-n", node or next(iter(self.nodes)), "-o", "%T", check=False)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""

    def jobs(self) -> list[dict]:
        """Every job slurmctld still knows (MinJobAge keeps finished ones), as ``scontrol show job -o`` fields."""
        r = self.run("scontrol", "show", "job", "-o", check=False)
        out = []
        for line in r.stdout.splitlines():
            if "JobId=" not in line:
                continue
            fields = {}
            for tok in line.split():
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    fields.setdefault(k, v)
            out.append(fields)
        return out

    def restart_slurmctld(self) -> None:
        """Stop slurmctld (SIGTERM, it saves its state) and start it again from that state (no ``-c``)."""
        pid = self.procs.pop("slurmctld")
        _terminate(pid)
        self._daemon("slurmctld", [_bin("slurmctld"), "-f", str(self.conf)], self.root / "slurmctld.pid")

    def logs(self, n: int = 30) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*.log")):
            lines = f.read_text(errors="replace").splitlines()[-n:]
            out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # ------------------------------------------------------------------ tear-down
    def stop(self) -> None:
        """Cancel every job, stop slurmd, slurmctld and munged; RuntimeError when one still runs after."""
        if "slurmctld" in self.procs:
            self.run("scancel", "--full", "-u", str(os.getuid()), check=False)
        for name in [k for k in self.procs if k.startswith("slurmd:")] + ["slurmctld", "munged"]:
            pid = self.procs.pop(name, None)
            if pid is not None:
                _terminate(pid)
        left = [f"{n} (pid {p})" for n, p in self._pids_from_files().items() if _alive(p)]
        if left:
            raise RuntimeError(f"still running after stop: {', '.join(left)}")

    def _pids_from_files(self) -> dict[str, int]:
        d, out = self.root, {}
        files = [("munged", d / "munge" / "munged.pid"), ("slurmctld", d / "slurmctld.pid")]
        files += [(f"slurmd:{f.name[len('slurmd-'):-len('.pid')]}", f) for f in sorted(d.glob("slurmd-*.pid"))]
        for name, f in files:
            if f.is_file() and f.read_text().strip():
                out[name] = int(f.read_text().split()[0])
        return out

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _terminate(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM ``pid``, SIGKILL after ``timeout`` seconds, and wait until it is gone."""
    with _suppress():
        os.kill(pid, signal.SIGTERM)
    t0 = time.time()
    while _alive(pid) and time.time() - t0 < timeout:
        time.sleep(0.1)
    if _alive(pid):
        with _suppress():
            os.kill(pid, signal.SIGKILL)
        while _alive(pid) and time.time() - t0 < timeout + 5:
            time.sleep(0.1)


def _suppress():
    import contextlib

    return contextlib.suppress(ProcessLookupError)


def main(argv: list[str]) -> int:
    multi = "--multi-node" in argv
    argv = [a for a in argv if a != "--multi-node"]
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    cmd, root = argv
    c = SlurmCluster(root, nodes=MULTI_NODES if multi else None, slurmd_timeout=MULTI_SLURMD_TIMEOUT if multi else 60)
    if cmd == "up":
        reason = ensure_installed()
        if reason:
            print(reason, file=sys.stderr)
            return 1
        c.start()
        print(f"export SLURM_CONF={c.conf} PATH={c.root / 'bin'}:$PATH")
        return 0
    c.procs = c._pids_from_files()
    c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
