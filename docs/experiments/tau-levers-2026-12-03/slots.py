"""Per-slot acceptance on the held-out rollouts of `carryover eval --offline` results: of all rounds, the share
that accepted at least k proposals (k = 1..P), and each slot's acceptance given the one before it was accepted.
`python slots.py results.json [more results.json ...]` -> one markdown row per (file, drafter)."""
import json, sys
from collections import defaultdict

print("| results | drafter | rollouts | rounds | τ | ≥1 accepted | ≥2 | ≥3 | slot 2 given 1 | slot 3 given 2 |")
print("|---|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    r = json.load(open(path))
    by = defaultdict(list)
    for e in r["log"]:
        by[e["mode"]].append(e)
    for mode, logs in by.items():
        acc = [a for e in logs for a in e["accepted"]]
        P = max(d["num_proposals"] for d in r["drafters"] if d["label"] == mode)
        at_least = [sum(a >= k for a in acc) / len(acc) for k in range(1, P + 1)]
        tau = sum(e["new_tokens"] - 1 for e in logs) / sum(e["rounds"] for e in logs)
        cond = [at_least[k] / at_least[k - 1] for k in range(1, P)]
        print(f"| {path} | {mode} | {len(logs)} | {len(acc)} | {tau:.3f} | "
              + " | ".join(f"{x:.3f}" for x in at_least[:3]) + " | " + " | ".join(f"{x:.3f}" for x in cond[:2]) + " |")
