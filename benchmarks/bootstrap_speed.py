"""Resamples per second of the value-manifold bootstrap: git main's ``_bootstrap_top2`` against the
batched distinct-row Gram path of :class:`llmgeom.measures.pca.ValueManifoldPCA` (issue 21 point 3).

Default sizes of the study: 150 prompts x 576 features (SmolLM2-135M residual stream / attention output),
n_boot = ``value_manifold.n_boot`` of config/config.yaml, one BLAS thread (the rule's ``threads``).
Run from the repository root: ``python benchmarks/bootstrap_speed.py [--repeats 3]``. Prints, does not assert.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from threadpoolctl import threadpool_limits

from llmgeom.measures import pca


def _old_module():
    src = subprocess.run(["git", "show", "main:src/llmgeom/measures/pca.py"], check=True, capture_output=True,
                         text=True).stdout
    path = Path(tempfile.mkdtemp()) / "pca_main.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("pca_main", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=150)
    ap.add_argument("--d", type=int, default=576)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n_boot = int(yaml.safe_load(Path("config/config.yaml").read_text())["value_manifold"]["n_boot"])
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.n, args.d)) @ rng.standard_normal((args.d, args.d)) * 0.1
    idx = np.random.default_rng(0).integers(0, args.n, size=(n_boot, args.n))
    old = _old_module()
    print(f"n = {args.n} prompts, d = {args.d} features, n_boot = {n_boot}, 1 BLAS thread, best of {args.repeats}")
    with threadpool_limits(1):
        for std in (True, False):
            rates = {}
            for name, f in (("main (_bootstrap_top2)", lambda: old._bootstrap_top2(X, idx, std)),
                            ("new (_bootstrap_shares)", lambda: pca._bootstrap_shares(X, idx, std))):
                f()
                best = min(_timed(f) for _ in range(args.repeats))
                rates[name] = n_boot / best
            a, b = rates.values()
            diff = np.nanmax(np.abs(old._bootstrap_top2(X, idx, std) - pca._bootstrap_shares(X, idx, std)))
            print(f"standardize={std!s:5}  " + "  ".join(f"{k}: {v:7.0f} resamples/s" for k, v in rates.items())
                  + f"  speed-up {b / a:.2f}x  max |diff| {diff:.1e}")


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
