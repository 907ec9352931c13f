"""Two arms of one or more seeds each, scored on the same rollouts by one `carryover eval --offline` run: each arm's
τ over its seeds (summed tokens over summed rounds of its drafters, per rollout), paired per rollout with the
project's bootstrap. Usage: python pooled.py results.json A_LABEL1,A_LABEL2 B_LABEL1,B_LABEL2 (B against A); an
arm given as OTHER_RESULTS.json:LABEL1,LABEL2 is read from that eval's results instead (the same rollouts, scored in
another run)."""
import json
import sys

from carryover_jax.eval.paired import paired_bootstrap


def t0_log(path):
    return [e for e in json.load(open(path))["log"] if e["temperature"] == 0]


def arm(labels):
    path, _, labels = labels.rpartition(":")
    log = t0_log(path or sys.argv[1])
    rows = [{(e["dataset"], e["prompt"]): e for e in log if e["mode"] == m} for m in labels.split(",")]
    return {k: (sum(r[k]["new_tokens"] - 1 for r in rows), sum(r[k]["rounds"] for r in rows)) for k in rows[0]}


a, b = arm(sys.argv[2]), arm(sys.argv[3])
keys = sorted(a)
assert sorted(b) == keys, "not the same rollouts"
print("| arm (both seeds) | vs | dataset | rollouts | τ arm | τ vs | τ gain [95%] | resolved |")
print("|---|---|---|---|---|---|---|---|")
for ds in sorted({d for d, _ in keys}) + ["all"]:
    ks = [k for k in keys if ds == "all" or k[0] == ds]
    ta, ra = [b[k][0] / b[k][1] for k in ks], [b[k][1] for k in ks]
    tb, rb = [a[k][0] / a[k][1] for k in ks], [a[k][1] for k in ks]
    r = paired_bootstrap(ta, tb, wa=ra, wb=rb)
    lo, hi = r["gain_pct_ci"]
    tau = lambda t, w: sum(x * y for x, y in zip(t, w)) / sum(w)  # noqa: E731
    print(f"| {sys.argv[3]} | {sys.argv[2]} | {ds} | {len(ks)} | {tau(ta, ra):.3f} | {tau(tb, rb):.3f} | "
          f"{r['gain_pct']:+.1f}% [{lo:+.1f}%, {hi:+.1f}%] | {'yes' if r['resolved'] else 'no'} |")
