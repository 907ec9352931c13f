"""Per-prompt ratios of `loop_probe.py`'s loops with 95% intervals over prompts: `python loop_ci.py loop_probe.txt`.
The mean of the prompts' ratios, with the project's bootstrap (`eval/paired.paired_bootstrap`) against a constant 1.
The while loop against the `fori_loop` of the same rounds is also the bound on timing noise: both do the same work."""
import ast
import sys

import numpy as np

from carryover_jax.eval.paired import paired_bootstrap

rows = [ast.literal_eval(line) for line in open(sys.argv[1]) if line.startswith("{")]
print("| ratio | prompts | mean of per-prompt ratios [95%] |")
print("|---|---|---|")
for a, b in (("spec.while", "spec.fori"), ("spec.fori", "spec.reset"), ("ar.while", "ar.fori")):
    x = np.array([r[a] / r[b] for r in rows])
    c = paired_bootstrap(x, np.ones_like(x))
    lo, hi = (1 + d for d in c["diff_ci"])
    print(f"| {a} / {b} | {len(x)} | {1 + c['diff']:.3f} [{lo:.3f}, {hi:.3f}] |")
