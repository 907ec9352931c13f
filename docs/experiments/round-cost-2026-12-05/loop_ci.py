"""Per-prompt ratios of `loop_probe.py`'s loops with 95% bootstrap intervals over prompts (the mean of the prompts'
ratios): `python loop_ci.py loop_probe.txt`. The while loop against the `fori_loop` of the same rounds is also the
bound on timing noise: both do the same work."""
import ast
import sys

import numpy as np

rows = [ast.literal_eval(line) for line in open(sys.argv[1]) if line.startswith("{")]
rng = np.random.default_rng(0)
print("| ratio | prompts | mean of per-prompt ratios [95%] |")
print("|---|---|---|")
for a, b in (("spec.while", "spec.fori"), ("spec.fori", "spec.reset"), ("ar.while", "ar.fori")):
    x = np.array([r[a] / r[b] for r in rows])
    boot = x[rng.integers(0, len(x), (10_000, len(x)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    print(f"| {a} / {b} | {len(x)} | {x.mean():.3f} [{lo:.3f}, {hi:.3f}] |")
