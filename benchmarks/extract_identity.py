"""Does a change to the extraction keep every stored byte? Writes a fixed set of activation files, or
compares two such sets dataset by dataset (values, stored chunk bytes, attributes; ``tests/conftest.py``
``same_datasets``). Run ``write`` before the change (e.g. on a checkout of main) and after it, with the
same thread count, then ``compare``:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/extract_identity.py write /tmp/ref
    ... change the code ...
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/extract_identity.py write /tmp/new
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/extract_identity.py compare /tmp/ref /tmp/new

The set (CPU, float32): SmolLM2-135M on the first ``--n-prompts`` ``mixed`` prompts (attention entropy,
batch 16) and the same prompts with candidate token ids (the SULA path), SmolLM2-135M and (when prepared)
Gemma-3-270M on the first ``--n-passages`` corpus passages (per-position statistics, residual samples), and
Gemma-3-270M on the ``mixed`` prompts (attention entropy over sliding-window and global layers).
Models and prompts come from ``resources/`` (copy them from a workflow run). Not a test: it needs the
prepared models; the resumed-vs-uninterrupted identity is tested in tests/unit/core/test_store.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _subset(src: Path, dst: Path, n: int, candidates: bool = False) -> Path:
    from llmgeom.prompts.io import CANDIDATES_KEY, write_prompt_set

    recs = [json.loads(x) for x in src.read_text().splitlines()[:n]]
    if candidates:
        for i, r in enumerate(recs):
            r.setdefault("meta", {})[CANDIDATES_KEY] = [(17 * i + 3 * j) % 1000 + 1 for j in range(4)]
    write_prompt_set(recs, dst)
    return dst


def write(out: Path, a) -> list[Path]:
    """Write the set of files into ``out``; returns their paths."""
    import torch

    from llmgeom.extract.forward import extract_to_hdf5
    from llmgeom.prompts.io import CANDIDATES_KEY

    torch.set_num_threads(a.threads)
    out.mkdir(parents=True, exist_ok=True)
    res, prompts = REPO / "resources", REPO / "resources" / "prompts"
    mixed = _subset(prompts / "mixed.jsonl", out / "mixed.jsonl", a.n_prompts)
    cand = _subset(prompts / "mixed.jsonl", out / "cand.jsonl", a.n_prompts, candidates=True)
    corpus = _subset(prompts / "corpus.jsonl", out / "corpus.jsonl", a.n_passages)
    smol, gemma = res / "models" / "smollm2-135m", res / "models" / "gemma3-270m"
    jobs = [("smol-mixed", smol, mixed, {}), ("smol-cand", smol, cand, dict(candidates_key=CANDIDATES_KEY)),
            ("smol-corpus", smol, corpus, dict(corpus=True, sample_per_prompt=30, max_tokens=128, batch_size=4))]
    if gemma.is_dir():  # sliding-window and global layers (final-query attention in two groups), MQA
        jobs.append(("gemma-mixed", gemma, mixed, {}))
        jobs.append(("gemma-corpus", gemma, corpus, dict(corpus=True, sample_per_prompt=30, max_tokens=128,
                                                         batch_size=4)))
    paths = []
    for name, model, p, kw in jobs:
        kw = {"batch_size": 16, "top_k": 10, "sample_per_prompt": 30, "device_map": None, **kw}
        h5 = out / f"{name}.h5"
        h5.unlink(missing_ok=True)
        extract_to_hdf5(model, p, h5, model_name=name.split("-")[0], dtype="float32", device="cpu",
                        attention=not kw.get("corpus"), reuse_model=True, log=print, **kw)
        paths.append(h5)
    return paths


def compare(ref: Path, new: Path, stored: bool = True) -> int:
    """Compare every ``*.h5`` of ``ref`` with its namesake in ``new``; returns the number that differ.
    ``stored=False`` (``--values-only``): values, dtypes, shapes and attributes, not the stored chunk bytes
    (across a change of the datasets' filters)."""
    sys.path.insert(0, str(REPO / "tests" / "support"))
    from conftest import same_datasets

    bad = 0
    files = sorted(ref.glob("*.h5"))
    if not files:
        raise SystemExit(f"no .h5 files in {ref}; run `extract_identity.py write {ref}` first")
    for f in files:
        try:
            same_datasets(f, new / f.name, stored=stored)
            print(f"same datasets: {f.name}")
        except AssertionError as e:
            bad += 1
            print(f"DIFFERENT: {f.name}: {e!r}")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["write", "compare"])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompts", type=int, default=48)
    ap.add_argument("--n-passages", type=int, default=8)
    ap.add_argument("--values-only", action="store_true", help="compare: not the stored chunk bytes (another filter "
                    "pipeline, e.g. lzf on floating-point datasets before 2026-12-01's session 4)")
    a = ap.parse_args(argv)
    if a.action == "write":
        write(a.dirs[0], a)
    else:
        if len(a.dirs) != 2:
            ap.error("compare takes two directories: REF NEW")
        sys.exit(1 if compare(*a.dirs, stored=not a.values_only) else 0)


if __name__ == "__main__":
    main()
