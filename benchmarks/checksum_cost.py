"""Cost of the activation store's integrity checks (issue 12): HDF5's per-chunk Fletcher-32 filter on every
numeric dataset plus the sha256 of the string datasets, against the same layout without them.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/checksum_cost.py             # default-size files
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/checksum_cost.py --repeats 5

Files of the default study's sizes for SmolLM2-135M (30 layers, d_model 576, 9 heads, 3 KV heads of 64,
top_k 10): the ``mixed`` set (150 prompts) and the ``corpus`` set (40 passages of 128 tokens, 30 residual
samples each). Values are seeded Gaussian float32 (activations do not compress under lzf either), written
in batches of 16 rows through ``ActivationWriter`` as extraction does; "read" opens the file with
``open_activations`` (string sha256 check) and reads every dataset completely. Each variant is timed
``--repeats`` times, alternating; the minimum counts (the machine is shared). Prints a Markdown table and
writes ``benchmarks/results/checksum_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results"

L, D, H, KV, HD, TOPK = 30, 576, 9, 3, 64, 10


def shapes(kind: str) -> dict:
    if kind == "mixed":
        n = 150
        return {"prompts/text": ((n,), "str"), "prompts/meta": ((n,), "str"), "prompts/n_tokens": ((n,), "int32"),
                "last_token/residual": ((n, L + 1, D), "float32"), "last_token/final_normed": ((n, D), "float32"),
                "last_token/values": ((n, L, KV * HD), "float32"), "last_token/keys": ((n, L, KV, HD), "float32"),
                "attention/entropy": ((n, L, H), "float32"), "next_token/entropy": ((n,), "float32"),
                "next_token/top_ids": ((n, TOPK), "int64"), "next_token/top_logits": ((n, TOPK), "float32")}
    n, s, t = 40, 40 * 30, 40 * 126
    return {"prompts/text": ((n,), "str"), "prompts/meta": ((n,), "str"), "prompts/n_tokens": ((n,), "int32"),
            "last_token/residual": ((n, L + 1, D), "float32"), "last_token/final_normed": ((n, D), "float32"),
            "last_token/values": ((n, L, KV * HD), "float32"), "last_token/keys": ((n, L, KV, HD), "float32"),
            "next_token/entropy": ((n,), "float32"), "next_token/top_ids": ((n, TOPK), "int64"),
            "next_token/top_logits": ((n, TOPK), "float32"),
            "tokens/residual_sample": ((s, L + 1, D), "float32"), "tokens/final_normed_sample": ((s, D), "float32"),
            "tokens/sample_prompt": ((s,), "int32"), "tokens/sample_position": ((s,), "int32"),
            "tokens/margin": ((t,), "float32"), "tokens/nll": ((t,), "float32"), "tokens/entropy": ((t,), "float32"),
            "tokens/prompt": ((t,), "int32"), "tokens/position": ((t,), "int32")}


def data(shp: dict) -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for name, (shape, dtype) in shp.items():
        if dtype == "str":
            out[name] = [f"prompt {i}: " + "word " * 30 for i in range(shape[0])]
        elif dtype.startswith("int"):
            out[name] = rng.integers(0, 49152, size=shape).astype(dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def write(path: Path, shp: dict, arrays: dict) -> float:
    from llmgeom.core.writer import ActivationWriter

    t0 = time.perf_counter()
    w = ActivationWriter(path, {"model": "bench", "prompt_set": "bench"}, shp)
    for name, v in arrays.items():
        if isinstance(v, list):
            w.write(name, slice(None), v)
            continue
        for a in range(0, len(v), 16):  # batches of 16 rows, as extraction writes them
            w.write(name, slice(a, min(a + 16, len(v))), v[a:a + 16])
    w.commit()
    return time.perf_counter() - t0


def read(path: Path) -> float:
    import h5py

    from llmgeom.core.store import open_activations

    t0 = time.perf_counter()
    with open_activations(path) as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in names:
            f[n][()]
    return time.perf_counter() - t0


def run(repeats: int) -> dict:
    import llmgeom.core.store as store

    checked = store.chunk_layout

    def unchecked(shape, dtype):
        kw = checked(shape, dtype)
        kw.pop("fletcher32", None)
        return kw

    def no_string_hash(values):  # the sha256 of the strings, computed at commit and at open
        return ""

    variants = {"checksums (contract 2)": (checked, store.strings_sha256),
                "same chunks, no checksums": (unchecked, no_string_hash)}
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("mixed", "corpus"):
            shp = shapes(kind)
            arrays = data(shp)
            times = {v: {"write_s": [], "read_s": []} for v in variants}
            size = {}
            for _ in range(repeats):
                for v, (layout, sha) in variants.items():
                    store.chunk_layout, store.strings_sha256 = layout, sha
                    p = Path(tmp) / f"{kind}.h5"
                    times[v]["write_s"].append(write(p, shp, arrays))
                    times[v]["read_s"].append(read(p))
                    size[v] = p.stat().st_size
                    p.unlink()
            store.chunk_layout, store.strings_sha256 = checked, variants["checksums (contract 2)"][1]
            res[kind] = {v: {"write_s": min(times[v]["write_s"]), "read_s": min(times[v]["read_s"]),
                             "bytes": size[v]} for v in variants}
    return res


def markdown(res: dict) -> str:
    lines = ["| file | variant | write (s) | read all (s) | size (MB) |", "|---|---|---:|---:|---:|"]
    for kind, rows in res.items():
        base = rows["same chunks, no checksums"]
        for v, r in rows.items():
            rel = "" if r is base else (f" ({r['write_s'] / base['write_s'] - 1:+.0%}, {r['read_s'] / base['read_s'] - 1:+.0%}, "
                                        f"{r['bytes'] / base['bytes'] - 1:+.2%})")
            lines.append(f"| {kind} | {v}{rel} | {r['write_s']:.3f} | {r['read_s']:.3f} | {r['bytes'] / 1e6:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(OUT / "checksum_cost.json"))
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    res = {"load_before": os.getloadavg(), "results": run(a.repeats), "load_after": os.getloadavg()}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(markdown(res["results"]))
    print(f"load average before/after: {res['load_before'][0]:.1f} / {res['load_after'][0]:.1f}")


if __name__ == "__main__":
    main()
