"""B's whole call over A's, per prompt, from round_ab.py's output (`python calls.py round_ab.json`): the speedup
ratio B / A paired per prompt, with the project's bootstrap over prompts (a ratio under 1: B decodes faster)."""
import json
import sys

import numpy as np

from carryover_jax.eval.paired import paired_bootstrap

rows = json.load(open(sys.argv[1]))["rows"]
print("| dataset | prompts | B / A time a call [95%] |")
print("|---|---|---|")
for ds in sorted({r["dataset"] for r in rows}) + ["all"]:
    rs = [r for r in rows if ds == "all" or r["dataset"] == ds]
    a = np.array([np.mean(r["time"]["a"]) for r in rs])
    b = np.array([np.mean(r["time"]["b"]) for r in rs])
    x = b / a
    r = paired_bootstrap(x, np.ones_like(x), wa=a, wb=a)
    lo, hi = (1 + g / 100 for g in r["gain_pct_ci"])
    print(f"| {ds} | {len(rs)} | {1 + r['gain_pct'] / 100:.3f} [{lo:.3f}, {hi:.3f}] |")
