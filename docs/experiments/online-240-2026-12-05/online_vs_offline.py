"""τ of one drafter online (`carryover eval`, batch 1) and offline (`carryover eval --offline`, on the recorded
rollouts) over the same prompts, per dataset: `python online_vs_offline.py ONLINE.json OFFLINE.json LABEL [LABEL2]`
(LABEL2: the arm's label in the offline run, default LABEL). Each side's τ is micro-averaged as its report's is
(`eval/metrics.tau`: summed accepted + 1 over summed rounds; online a last round may run past max_new_tokens) over
the prompts the online run decoded; a third column gives the offline τ over all of the offline run's prompts of
that dataset, so a sample's own level shows apart from the decoding path."""
import json, sys
from carryover_jax.eval.metrics import tau

online, offline, label = sys.argv[1:4]
label_off = sys.argv[4] if len(sys.argv) > 4 else label


def entries(path, arm):
    return {(e["dataset"], e["prompt"]): e for e in json.load(open(path))["log"]
            if e["mode"] == arm and e["temperature"] == 0}


on, off = entries(online, label), entries(offline, label_off)
missing = sorted(set(on) - set(off))
if missing:
    sys.exit(f"{len(missing)} online prompts have no offline rollout, e.g. {missing[0]}")
print("| dataset | prompts | τ online | τ offline, same prompts | τ offline, all its prompts | same rounds |")
print("|---|---|---|---|---|---|")
for ds in sorted({d for d, _ in on}) + ["all"]:
    ks = [k for k in on if ds == "all" or k[0] == ds]
    every = [e for k, e in off.items() if (ds == "all" and k[0] != "train") or k[0] == ds]
    same = sum(on[k]["rounds"] == off[k]["rounds"] for k in ks)
    print(f"| {ds} | {len(ks)} | {tau([on[k] for k in ks]):.3f} | {tau([off[k] for k in ks]):.3f} | "
          f"{tau(every):.3f} ({len(every)}) | {same} / {len(ks)} |")
