"""Compare the tables of two study runs byte for byte (issue 30: a refactor keeps every table's bytes).

Usage: python benchmarks/compare_tables.py RESULTS_A RESULTS_B
Prints the number of CSV files in each, the identical ones, and each file that differs or exists in one run only;
exits 1 when any differs.
"""
from __future__ import annotations

import filecmp
import sys
from pathlib import Path


def main(a: str, b: str) -> int:
    ra, rb = Path(a), Path(b)
    fa = {p.relative_to(ra) for p in ra.rglob("*.csv")}
    fb = {p.relative_to(rb) for p in rb.rglob("*.csv")}
    common = sorted(fa & fb)
    differ = [p for p in common if not filecmp.cmp(ra / p, rb / p, shallow=False)]
    print(f"{len(fa)} CSV files in {ra}, {len(fb)} in {rb}; {len(common) - len(differ)} byte-identical")
    for p in differ:
        print(f"  differs: {p}")
    for p in sorted(fa - fb):
        print(f"  only in {ra}: {p}")
    for p in sorted(fb - fa):
        print(f"  only in {rb}: {p}")
    return 1 if differ or fa != fb else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
