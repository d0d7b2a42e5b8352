"""One writer per output (issue 31): the output lease of llmgeom.core.lease, without SLURM (job states are
given by a stand-in for ``squeue``), and in the extraction (a second writer refused naming the holder; a writer
that lost its lease stops before it writes; the holder of the lease resumes to the bytes of an uninterrupted run).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import h5py
import pytest

from conftest import same_datasets
from llmgeom.core import lease as L
from llmgeom.extract import forward as extraction
from test_store import RESUME_KW, setup, uninterrupted  # noqa: F401  (module fixtures reused)


class Clock:
    """A settable ``time.time``."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def states(**jobs):
    """A stand-in for :func:`llmgeom.core.lease.slurm_job_state`: job id -> (state, batch host)."""
    return lambda job: jobs.get(str(job)) if job else None


def as_job(monkeypatch, job, node):
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURMD_NODENAME", node)


def elsewhere(lease: L.OutputLease, host="node-b.example") -> L.OutputLease:
    """The lease as if its holder ran on another host (so this host's process table says nothing about it)."""
    lease.rec["host"] = host
    return lease


def test_lease_file_names_the_holder_and_is_removed_on_release(tmp_path, monkeypatch):
    as_job(monkeypatch, "101", "n1")
    out = tmp_path / "x.h5"
    with L.OutputLease(out, ttl=30, job_state=states(**{"101": ("RUNNING", "n1")})) as a:
        rec = L.read_record(out.with_name("x.h5.lease"))
        assert rec["job"] == "101" and rec["node"] == "n1" and rec["pid"] and rec["token"] == a.rec["token"]
        assert rec["ttl"] == 30
        a.check()
    assert not list(tmp_path.iterdir())  # the lease and the holder's own file are gone


def test_second_writer_of_a_running_job_is_refused_naming_job_and_host(tmp_path, monkeypatch):
    out = tmp_path / "x.h5"
    as_job(monkeypatch, "101", "n1")
    a = elsewhere(L.OutputLease(out, ttl=30, job_state=states())).acquire(heartbeat=False)
    as_job(monkeypatch, "202", "n2")
    b = L.OutputLease(out, ttl=30, wait_s=60, job_state=states(**{"101": ("RUNNING", "n1"), "202": ("RUNNING", "n2")}))
    t0 = time.time()
    with pytest.raises(L.LeaseHeld) as e:
        b.acquire()
    assert time.time() - t0 < 5  # a running job's lease is refused at once, not waited for
    msg = str(e.value)
    assert "SLURM job 101 on node n1" in msg and "host node-b.example" in msg and "scancel 101" in msg, msg
    a.check()  # the holder is unaffected
    a.release()


def test_second_local_writer_is_refused_while_the_first_process_runs(tmp_path):
    out = tmp_path / "x.h5"
    with L.OutputLease(out, ttl=30, job_state=states()):
        with pytest.raises(L.LeaseHeld, match=r"pid \d+ on host .*that process is running on this host"):
            L.OutputLease(out, ttl=30, wait_s=30, job_state=states()).acquire()


def test_live_lease_is_waited_for_then_refused(tmp_path, monkeypatch):
    """A lease renewed recently by a job SLURM no longer runs (NODE_FAIL: its processes may still be writing) is
    waited for up to wait_s, then refused with the holder named."""
    out = tmp_path / "x.h5"
    as_job(monkeypatch, "101", "n1")
    elsewhere(L.OutputLease(out, ttl=30, job_state=states())).acquire(heartbeat=False)
    as_job(monkeypatch, "202", "n2")
    logs = []
    b = L.OutputLease(out, ttl=30, wait_s=0.5, log=logs.append,
                      job_state=states(**{"101": ("NODE_FAIL", "n1"), "202": ("RUNNING", "n2")}))
    with pytest.raises(L.LeaseHeld, match=r"SLURM job 101 on node n1 .*did not expire or get released within 0 s"):
        b.acquire()
    assert any("waiting up to" in m for m in logs), logs


def test_waiting_writer_gets_the_lease_once_it_is_released(tmp_path, monkeypatch):
    out = tmp_path / "x.h5"
    as_job(monkeypatch, "101", "n1")
    a = elsewhere(L.OutputLease(out, ttl=30, job_state=states())).acquire(heartbeat=False)
    as_job(monkeypatch, "202", "n2")
    threading.Timer(0.5, a.release).start()
    b = L.OutputLease(out, ttl=30, wait_s=20, log=lambda m: None,
                      job_state=states(**{"101": ("NODE_FAIL", "n1"), "202": ("RUNNING", "n2")})).acquire()
    b.check()
    b.release()


def test_expired_lease_is_taken_over_and_the_old_holder_stops(tmp_path):
    out = tmp_path / "x.h5"
    clock = Clock()
    a = elsewhere(L.OutputLease(out, ttl=10, clock=clock, job_state=states())).acquire(heartbeat=False)
    b = L.OutputLease(out, ttl=10, wait_s=0, clock=clock, job_state=states())
    clock.t += 5
    with pytest.raises(L.LeaseHeld):  # 5 s old, ttl 10: live
        b.acquire()
    clock.t += 6
    logs = []
    b.log = logs.append
    b.acquire(heartbeat=False)
    assert any("took over" in m and "not renewed for 11.0 s" in m for m in logs), logs
    with pytest.raises(L.LeaseLost, match="taken over by pid"):
        a.check()
    a.release()  # never removes the new holder's lease
    b.check()
    assert L.read_record(L.lease_path(out))["token"] == b.rec["token"]
    b.release()
    assert not list(tmp_path.iterdir())


def test_lease_of_a_dead_local_process_is_taken_over_at_once(tmp_path):
    out = tmp_path / "x.h5"
    code = ("import sys; from llmgeom.core.lease import OutputLease; "
            f"OutputLease({str(out)!r}, ttl=600, job_state=lambda j: None).acquire(heartbeat=False)")
    subprocess.run([sys.executable, "-c", code], check=True)  # exits holding the lease (as a kill -9 would)
    assert L.lease_path(out).exists()
    logs = []
    with L.OutputLease(out, ttl=600, wait_s=0, log=logs.append, job_state=states()):
        pass
    assert any("no longer runs on this host" in m for m in logs), logs


def test_writer_that_cannot_renew_stops(tmp_path):
    """No confirmed renewal for more than ttl/2 (a hung file system): check refuses, although nobody has taken
    the lease yet (a taker needs ttl)."""
    clock = Clock()
    a = L.OutputLease(tmp_path / "x.h5", ttl=10, clock=clock, job_state=states()).acquire(heartbeat=False)
    clock.t += 4
    a.check()
    clock.t += 2
    with pytest.raises(L.LeaseLost, match=r"last renewed 6.0 s ago, more than ttl/2 = 5 s"):
        a.check()
    a.release()


def test_renewal_keeps_the_lease_and_a_failed_renewal_loses_it(tmp_path):
    clock = Clock()
    out = tmp_path / "x.h5"
    a = L.OutputLease(out, ttl=10, clock=clock, job_state=states()).acquire(heartbeat=False)
    for _ in range(5):
        clock.t += 4
        a.renew()
        a.check()
    assert L.read_record(L.lease_path(out))["renewed"] == clock.t
    a.own.unlink()  # e.g. removed by someone who broke the lease: the renewal cannot write it
    a.renew()
    with pytest.raises(L.LeaseLost, match="renewal failed"):
        a.check()
    a.release()


def test_heartbeat_renews_and_gives_up_when_the_job_ends(tmp_path, monkeypatch):
    """The heartbeat thread renews every ttl/6; once SLURM says the holder's own job ended (NODE_FAIL, its node
    lost while it runs on), it stops renewing and the next check stops the writer."""
    as_job(monkeypatch, "101", "n1")
    jobs = {"101": ("RUNNING", "n1")}
    logs = []
    a = L.OutputLease(tmp_path / "x.h5", ttl=0.6, log=logs.append, job_state=lambda j: jobs.get(j)).acquire()
    time.sleep(1.0)  # > ttl/2: only the heartbeat's renewals keep it
    a.check()
    jobs["101"] = ("NODE_FAIL", "n1")
    time.sleep(0.5)
    with pytest.raises(L.LeaseLost, match=r"job 101 has ended \(NODE_FAIL\); this orphan stops"):
        a.check()
    assert any("lost" in m for m in logs), logs
    a.release()
    assert not L.lease_path(tmp_path / "x.h5").exists()  # released: a retry need not wait for the ttl


def test_orphan_takes_no_lease(tmp_path, monkeypatch):
    as_job(monkeypatch, "101", "n1")
    with pytest.raises(L.LeaseLost, match="SLURM job 101 has ended .NODE_FAIL"):
        L.OutputLease(tmp_path / "x.h5", job_state=states(**{"101": ("NODE_FAIL", "n1")})).acquire()
    assert not list(tmp_path.iterdir())


def test_bad_ttl_setting_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(L.TTL_ENV, "soon")
    with pytest.raises(ValueError, match="LLMGEOM_LEASE_TTL_S='soon' is not a number"):
        L.OutputLease(tmp_path / "x.h5")


# --------------------------------------------------------------------------- in the extraction


def test_extraction_refuses_a_second_writer_naming_the_holder(setup, tmp_path, monkeypatch):  # noqa: F811
    out = tmp_path / "r.h5"
    monkeypatch.setenv(L.WAIT_ENV, "0")
    with L.OutputLease(out, job_state=states()):
        with pytest.raises(L.LeaseHeld, match=r"r.h5 is being written by pid \d+ on host"):
            extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=lambda *a: None, **RESUME_KW)
    assert not out.exists() and not (tmp_path / "r.h5.partial").exists()


@pytest.mark.parametrize("write_behind", [False, True], ids=["in-loop", "write-behind"])
def test_extraction_that_lost_its_lease_stops_before_writing_and_the_holder_resumes(
        setup, uninterrupted, tmp_path, monkeypatch, write_behind):  # noqa: F811
    """The lease taken over after batch 2 (its heartbeat stalled past the ttl): the writer stops before it
    writes batch 3 (2 batches committed, no row of batch 3 written), keeps the partial file, removes no lease of
    the new holder; a rerun (the new holder) resumes to the bytes of an uninterrupted run."""
    out = tmp_path / "r.h5"
    partial = tmp_path / "r.h5.partial"
    seen = []
    real = extraction.extract_batch
    thief = {}

    def batch(*a, **k):
        seen.append(tuple(k["prompt_ids"]))
        if len(seen) == 3:  # batches 1 and 2 are committed (in the loop) or batch 2 is being written (behind)
            L.lease_path(out).unlink()  # as if broken by a taker after its heartbeat had stalled past the ttl
            thief["lease"] = L.OutputLease(out, job_state=states(), log=lambda m: None)
            thief["lease"].acquire(heartbeat=False)
        return real(*a, **k)

    monkeypatch.setattr(extraction, "extract_batch", batch)
    logs = []
    # (behind: batch 2's commit may check between the unlink and the new holder's link)
    with pytest.raises(L.LeaseLost, match="taken over by pid|the lease file was removed"):
        extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=logs.append,
                                   write_behind=write_behind, **RESUME_KW)
    assert not out.exists() and partial.exists()
    with h5py.File(partial, "r") as f:
        done = f["resume/done"][()].tolist()
    k = sum(done)  # in the loop: batches 1-2; behind: batch 2 may have been in flight and is then not committed
    assert done == [1] * k + [0] * (5 - k) and k in ((1, 2) if write_behind else (2,)), done
    assert L.read_record(L.lease_path(out))["token"] == thief["lease"].rec["token"]  # the new holder's lease stays
    thief["lease"].release()
    monkeypatch.setattr(extraction, "extract_batch", real)
    logs = []
    extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=logs.append, **RESUME_KW)
    assert any(f"resumed; {k} of 5 batches" in m for m in logs), logs
    same_datasets(uninterrupted, out)
    assert not list(tmp_path.glob("*.lease*")) and not partial.exists()
