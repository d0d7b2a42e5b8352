"""Wind-tunnel training budget: wall time and validation entropy MAE of the default-study model.

Trains the bijection model of the default study (Paper I bijection elimination; DESIGN.md sec. 3,
"Wind tunnel") once per budget (number of optimizer steps; the cosine schedule spans each budget, so
every budget is a separate run from the same seed) and prints one line per budget: steps, wall time
(training only, excluding imports and saving) and the validation entropy MAE in bits (model entropy
renormalized over the answer symbols vs log2(V - t), on held-out sequences from the validation stream).

Usage (2-core CPU machine, ~10 minutes for the three default budgets):

    PYTHONPATH=src HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/wind_tunnel_budget.py \
        --steps 1000 2000 3000 --threads 2

``--published`` prints the settings that reproduce the published setting (Paper I: V = 20, 19 pairs,
6 layers x 192 wide x 6 heads, 100k steps, MAE about 0.007 bits) for a GPU node, without running them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

#: Default-study settings (chosen with this script; see docs/reading-the-numbers.md, "Wind tunnel").
DEFAULT_STUDY = {
    "task": {"kind": "bijection", "V": 10, "n_pairs": 9},
    "arch": {"family": "llama", "n_layers": 3, "d_model": 96, "n_heads": 4},
    "training": {"seed": 0, "batch_size": 64, "lr": 3e-3, "warmup_steps": 100, "weight_decay": 0.01,
                 "clip_norm": 1.0, "schedule": "cosine", "min_lr_ratio": 0.1, "n_val": 1024, "threads": 2},
}

#: Published setting (Paper I, bijection elimination): to run on a GPU node, not here.
PUBLISHED = {
    "task": {"kind": "bijection", "V": 20, "n_pairs": 19},
    "arch": {"family": "llama", "n_layers": 6, "d_model": 192, "n_heads": 6},
    "training": {"seed": 0, "steps": 100_000, "batch_size": 64, "lr": 1e-3, "warmup_steps": 1000,
                 "weight_decay": 0.01, "clip_norm": 1.0, "schedule": "cosine", "min_lr_ratio": 0.1,
                 "n_val": 2048, "threads": 8},
    "published_mae_bits": 0.007,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[1000, 2000, 3000])
    ap.add_argument("--threads", type=int, default=DEFAULT_STUDY["training"]["threads"])
    ap.add_argument("--batch-size", type=int, default=DEFAULT_STUDY["training"]["batch_size"])
    ap.add_argument("--lr", type=float, default=DEFAULT_STUDY["training"]["lr"])
    ap.add_argument("--warmup", type=int, default=DEFAULT_STUDY["training"]["warmup_steps"])
    ap.add_argument("--layers", type=int, default=DEFAULT_STUDY["arch"]["n_layers"])
    ap.add_argument("--d-model", type=int, default=DEFAULT_STUDY["arch"]["d_model"])
    ap.add_argument("--heads", type=int, default=DEFAULT_STUDY["arch"]["n_heads"])
    ap.add_argument("--V", type=int, default=DEFAULT_STUDY["task"]["V"])
    ap.add_argument("--n-pairs", type=int, default=DEFAULT_STUDY["task"]["n_pairs"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no per-step log lines")
    ap.add_argument("--published", action="store_true", help="print the published GPU setting and exit")
    args = ap.parse_args(argv)
    if args.published:
        print(json.dumps(PUBLISHED, indent=2))
        return 0

    from llmgeom.wind_tunnel.train import train_wind_tunnel

    task = {"kind": "bijection", "V": args.V, "n_pairs": args.n_pairs}
    arch = {"family": "llama", "n_layers": args.layers, "d_model": args.d_model, "n_heads": args.heads}
    tr = dict(DEFAULT_STUDY["training"], threads=args.threads, batch_size=args.batch_size, lr=args.lr,
              warmup_steps=args.warmup, seed=args.seed)
    print(f"task {task} arch {arch} training {tr}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as d:
        for steps in args.steps:
            out = pathlib.Path(d) / f"wt-{steps}"
            t0 = time.perf_counter()
            res = train_wind_tunnel(task, out, steps=steps, arch=arch, checkpoints=(), log=(lambda s: None) if args.quiet else
                                    (lambda s: print("  " + s, flush=True)), **tr)
            total = time.perf_counter() - t0
            m = res["manifest"]
            results.append((steps, m["wall_s"], total, m["val_mae_bits"], m["val_answer_mass"]))
            print(f"steps {steps:6d}  train {m['wall_s']:7.1f} s  (with save {total:6.1f} s)  "
                  f"val MAE {m['val_mae_bits']:.4f} bits  answer mass {m['val_answer_mass']:.4f}  "
                  f"MAE by t {[round(x, 4) for x in m['val_mae_bits_by_t']]}", flush=True)
    print("\nsteps,train_wall_s,total_wall_s,val_mae_bits,val_answer_mass")
    for r in results:
        print(",".join(str(round(x, 5)) if isinstance(x, float) else str(x) for x in r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
