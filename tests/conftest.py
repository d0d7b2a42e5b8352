"""Shared test setup: everything runs offline, on CPU.

The environment variables are set at import time, before transformers or
huggingface_hub are imported by any test module (huggingface_hub reads
HF_HUB_OFFLINE once, when it is first imported).
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys
from pathlib import Path

import yaml

# the tests' support code (tiny model builders, the SLURM helpers) is imported by its module names
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

REPO = Path(__file__).resolve().parents[1]
#: The tiny end-to-end study (two tiny random models committed in .test/models/); `snakemake --directory .test`
#: runs it as it is, the workflow tests run it in a temporary directory (tiny_config).
TEST_DIR = REPO / ".test"
TEST_CONFIG = TEST_DIR / "config" / "config.yaml"


def study_config(path) -> dict:
    """A config file as the workflow reads it: loaded, then every schema default filled in (the file holds only
    what differs from the schema, e.g. no ``revision`` or size-derived ``mem_mb`` / ``runtime`` of its models)."""
    from llmgeom.pipeline.schema import apply_defaults, read_schema

    return apply_defaults(yaml.safe_load(Path(path).read_text()), read_schema())


def tiny_config(model_dirs: dict | None = None, *, nulls: bool = True) -> dict:
    """A fresh copy of .test/config/config.yaml for a run in another working directory: each model's ``path``
    made absolute (the committed .test/models/<name>), or ``model_dirs[name]`` where given. ``nulls=False``:
    without the random-init twins (issue 28), for tests of something else (the cluster path, reruns of one model)."""
    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    if not nulls:
        cfg["nulls"] = {"random_init": False}
    for name, spec in cfg["models"].items():
        spec["path"] = str((model_dirs or {}).get(name) or (TEST_DIR / spec["path"]).resolve())
    if (cfg.get("reference") or {}).get("path"):  # the committed headline reference of the tiny study
        cfg["reference"]["path"] = str((TEST_DIR / cfg["reference"]["path"]).resolve())
    return cfg


def pin_reference_tokenizer(cfg: dict) -> dict:
    """``cfg`` with ``prompts.tokenizer``, when it names a model of ``cfg["models"]``, replaced by that model's
    directory (absolute; it holds the tokenizer.json): for a test that then restricts or replaces the models, so
    its prompts are cut with the tiny study's own reference tokenizer whichever models it keeps. Returns ``cfg``."""
    name = (cfg.get("prompts") or {}).get("tokenizer")
    if name in cfg["models"]:
        cfg["prompts"]["tokenizer"] = str(Path(cfg["models"][name]["path"]).resolve())
    return cfg


def same_datasets(a, b, stored: bool = True) -> None:
    """Assert that two HDF5 files hold the same datasets: every dataset of ``a`` is in ``b`` with the same dtype,
    shape, values (bytes), stored chunk bytes and attributes; the root attributes agree except ``created``;
    ``b`` has nothing more. (Resumed vs uninterrupted extraction, tests/unit/core/test_store.py; before vs after a
    change to the extraction, benchmarks/extract_identity.py.) ``stored=False``: the stored chunk bytes are
    not compared (files written with another filter pipeline, e.g. before and after a change of compression).

    Raises:
        AssertionError: naming the first dataset (and chunk offset) that differs.
    """
    import h5py
    import numpy as np

    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        na, nb = [], []
        fa.visit(lambda x: na.append(x))
        fb.visit(lambda x: nb.append(x))
        assert sorted(na) == sorted(nb)
        for x in na:
            da, db = fa[x], fb[x]
            if isinstance(da, h5py.Group):
                continue
            assert da.dtype == db.dtype and da.shape == db.shape, x
            va, vb = da[()], db[()]
            if h5py.check_string_dtype(da.dtype) is not None:
                assert list(va) == list(vb), x
            else:
                assert va.tobytes() == vb.tobytes(), x
                if da.chunks and stored:
                    for i in range(da.id.get_num_chunks()):
                        off = da.id.get_chunk_info(i).chunk_offset
                        assert da.id.read_direct_chunk(off) == db.id.read_direct_chunk(off), (x, off)
            ka = {k: v for k, v in da.attrs.items() if k not in ("DIMENSION_LIST", "REFERENCE_LIST")}
            kb = {k: v for k, v in db.attrs.items() if k not in ("DIMENSION_LIST", "REFERENCE_LIST")}
            assert ka.keys() == kb.keys() and all(np.array_equal(ka[k], kb[k]) for k in ka), x
        ra = {k: v for k, v in fa.attrs.items() if k != "created"}
        rb = {k: v for k, v in fb.attrs.items() if k != "created"}
        assert ra.keys() == rb.keys() and all(np.array_equal(ra[k], rb[k]) for k in ra)


def committed_batches(partial) -> int:
    """Batches an extraction running elsewhere has committed to its partial file (0 while unreadable)."""
    import h5py

    try:
        with h5py.File(partial, "r", locking=False) as f:
            return int(f["resume/done"][:].sum())
    except (OSError, KeyError):
        return 0


def offline_dry_run_counts(configfile, workdir) -> dict:
    """``snakemake -n`` of ``configfile`` in ``workdir`` offline with an empty Hugging Face cache (HF_HOME under
    ``workdir``): the job count per rule from its "Job stats" table. Raises AssertionError (with the output's
    tail) when the dry run fails."""
    import subprocess
    import sys

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(Path(workdir) / "empty_hf_home"))
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
                        "--configfile", str(configfile), "--cores", "1"],
                       capture_output=True, text=True, env=env, cwd=workdir)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    stats = out.split("Job stats:")[1].split("total")[0]
    return {ln.split()[0]: int(ln.split()[1]) for ln in stats.splitlines() if len(ln.split()) == 2
            and ln.split()[1].isdigit()}


def file_minutes(item) -> float:
    """The running time on CI that the test's file declares (``pytestmark = pytest.mark.minutes(N)``), else 0."""
    m = item.get_closest_marker("minutes")
    return float(m.args[0]) if m else 0.0


def pytest_collection_modifyitems(config, items):
    """Files that declare the most minutes first (the rest keep their order after them). The README's test command
    runs the suite on two pytest-xdist workers with ``--dist loadfile --no-loadscope-reorder``: each file on one
    worker (its module fixtures, a tiny study or a SLURM cluster, are set up once), files handed out in this order,
    so that the real-SLURM tests, which mostly wait on the scheduler, overlap the CPU-bound ones
    (docs/testing.md)."""
    items.sort(key=lambda it: -file_minutes(it))  # stable: file order kept otherwise
