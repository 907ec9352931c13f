"""What bounds τ at the measured acceptance rates, from `carryover eval --offline` results (T = 0):
`python limits.py results.json [metrics.jsonl ...]`.

Per (drafter, dataset): τ, the share of rounds that accept slot 1, and each later slot's acceptance given the one
before it (c2, c3). Two derived columns:
- τ with unlimited proposals: every slot after the last keeps the last slot's conditional rate (geometric tail),
  i.e. what more proposals could add at this drafter's quality;
- slot 1 for τ 1.8: the slot-1 acceptance that τ 1.8 would need with P proposals at the measured conditionals.
Each metrics.jsonl (a training run's log) adds, in a second table, its training batches' greedy top-1 rate per slot
over its last 600 steps (teacher forced: every slot scored, whatever the slots before it did) and the τ those rates
would give if the slots were independent; slot 1 there means what it means in decoding (the drafter's first
proposal is the target's greedy token), on the records it trained on."""
import json, sys
from collections import defaultdict
from statistics import mean


def row(name, ds, a1, cond, tau, n):
    P = len(cond) + 1
    chain = [1.0]
    for c in cond:
        chain.append(chain[-1] * c)            # P(slot k | slot 1) for k = 1..P
    c_last = cond[-1] if cond else 0.0
    unlimited = 1 + a1 * (sum(chain) + chain[-1] * c_last / (1 - c_last))
    need = (1.8 - 1) / sum(chain)
    print(f"| {name} | {ds} | {n} | {tau:.3f} | {a1:.3f} | " + " | ".join(f"{c:.3f}" for c in cond)
          + f" | {unlimited:.3f} | {need:.3f} |")


print("| drafter | data | rollouts | τ | slot 1 | c2 | c3 | τ, unlimited proposals | slot 1 for τ 1.8 |")
print("|---|---|---|---|---|---|---|---|---|")
train_rows = []
for path in sys.argv[1:]:
    if path.endswith(".jsonl"):
        logs = [json.loads(l) for l in open(path) if "top1_acc@slot" in l]
        last = [e for e in logs if e["step"] > logs[-1]["step"] - 600]
        top1 = [mean(e["top1_acc@slot"][k] for e in last) for k in range(len(last[0]["top1_acc@slot"]))]
        chain, tau = 1.0, 1.0
        for t in top1:
            chain *= t
            tau += chain
        train_rows.append(f"| {path} | {len(last)} | " + " | ".join(f"{t:.3f}" for t in top1) + f" | {tau:.3f} |")
        continue
    r = json.load(open(path))
    by = defaultdict(list)
    for e in r["log"]:
        if e["temperature"] == 0:
            by[e["mode"]].append(e)
    for mode, logs in by.items():
        P = max(d["num_proposals"] for d in r["drafters"] if d["label"] == mode)
        for ds in sorted({e["dataset"] for e in logs}) + ["all"]:
            sel = [e for e in logs if ds == "all" or e["dataset"] == ds]
            acc = [a for e in sel for a in e["accepted"]]
            at_least = [sum(a >= k for a in acc) / len(acc) for k in range(1, P + 1)]
            cond = [at_least[k] / at_least[k - 1] for k in range(1, P)]
            tau = sum(e["new_tokens"] - 1 for e in sel) / sum(e["rounds"] for e in sel)
            row(mode, ds, at_least[0], cond, tau, len(sel))
if train_rows:
    print("\n| training log | logged steps | top-1, slot 1 | slot 2 | slot 3 | τ if independent |")
    print("|---|---|---|---|---|---|")
    print("\n".join(train_rows))
