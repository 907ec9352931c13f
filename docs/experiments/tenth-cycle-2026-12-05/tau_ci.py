"""Held-out τ of each arm with a 95% interval over prompts: `python tau_ci.py RESULTS.json`, the offline eval's
results.json with the training prompts already split off (the README's one-liner). τ is the report's ratio of sums
(every round's accepted drafts + 1 over the rounds); the interval is the project's bootstrap
(`eval/paired.paired_bootstrap`, rounds as weights) against a constant 1, shifted back by 1."""
import json
import sys

import numpy as np

from carryover_jax.eval.paired import paired_bootstrap

log = json.load(open(sys.argv[1]))["log"]
print("| arm | rollouts | τ | 95% interval over prompts |")
print("|---|---|---|---|")
for arm in dict.fromkeys(e["mode"] for e in log):
    rows = [e for e in log if e["mode"] == arm]
    rounds = np.array([len(e["accepted"]) for e in rows], float)
    tau = np.array([sum(a + 1 for a in e["accepted"]) for e in rows], float) / rounds
    b = paired_bootstrap(tau[None], np.ones_like(tau)[None], wa=rounds[None], wb=rounds[None])
    lo, hi = (1 + d for d in b["diff_ci"])
    print(f"| {arm} | {len(rows)} | {1 + b['diff']:.4f} | [{lo:.3f}, {hi:.3f}] |")
