"""Held-out τ of each arm with a 95% bootstrap interval over prompts (a ratio of summed tokens over summed rounds,
as the report counts it: every round's accepted drafts + 1). `python tau_ci.py RESULTS.json [SEED]`: the offline
eval's results.json with the training prompts already split off (the README's one-liner)."""
import json
import sys

import numpy as np

log = json.load(open(sys.argv[1]))["log"]
rng = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
print("| arm | rollouts | τ | 95% interval over prompts |")
print("|---|---|---|---|")
for arm in dict.fromkeys(e["mode"] for e in log):
    rows = [e for e in log if e["mode"] == arm]
    toks = np.array([sum(a + 1 for a in e["accepted"]) for e in rows], float)
    rounds = np.array([len(e["accepted"]) for e in rows], float)
    idx = rng.integers(0, len(rows), (10_000, len(rows)))
    boot = toks[idx].sum(1) / rounds[idx].sum(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    print(f"| {arm} | {len(rows)} | {toks.sum() / rounds.sum():.4f} | [{lo:.3f}, {hi:.3f}] |")
