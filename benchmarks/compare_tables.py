# Usage: python benchmarks/compare_tables.py OLD/results NEW/results
"""Compare every CSV table of two default-study runs: identical bytes, same values on the common columns
(new columns added), or values that differ (listed)."""
import sys
from pathlib import Path

import numpy as np
import pandas as pd

old, new = Path(sys.argv[1]), Path(sys.argv[2])
same = added = 0
diff, missing = [], []
for f in sorted(old.rglob("*.csv")):
    rel = f.relative_to(old)
    if "benchmarks" in rel.parts:
        continue
    g = new / rel
    if not g.exists():
        missing.append(str(rel)); continue
    if f.read_bytes() == g.read_bytes():
        same += 1; continue
    a, b = pd.read_csv(f), pd.read_csv(g)
    cols = [c for c in a.columns if c in b.columns]
    gone = [c for c in a.columns if c not in b.columns]
    if len(a) != len(b):
        diff.append(f"{rel}: rows {len(a)} -> {len(b)}"); continue
    bad = []
    for c in cols:
        x, y = a[c], b[c]
        if x.dtype.kind in "fi" and y.dtype.kind in "fi":
            if not np.allclose(x.to_numpy(float), y.to_numpy(float), rtol=0, atol=0, equal_nan=True):
                bad.append(c)
        elif not x.astype(str).equals(y.astype(str)):
            bad.append(c)
    if bad or gone:
        diff.append(f"{rel}: differs in {bad[:8]}{' ...' if len(bad) > 8 else ''}; columns gone {gone}")
    else:
        added += 1
print(f"identical bytes: {same}; same values, columns added: {added}; differing: {len(diff)}; missing in new: {len(missing)}")
for d in diff:
    print("  DIFF", d)
for m in missing:
    print("  MISSING", m)
