"""Paired τ comparison of drafters scored on the same recorded rollouts by different `carryover eval --offline`
runs (T = 0): `python paired.py NAME=results.json:label NAME=results.json:label ...`; every later arm against the
first, per dataset and over the mix, with the project's paired bootstrap (`eval/paired.paired_bootstrap`: τ as a
ratio of summed tokens to summed rounds, 95% interval over prompts). Rollouts pair on (dataset, prompt id); the
arms must cover the same ones (the same recorded rollouts give the same ids)."""
import json, sys
from carryover_jax.eval.paired import paired_bootstrap

arms = {}
for spec in sys.argv[1:]:
    name, _, rest = spec.partition("=")
    path, _, label = rest.rpartition(":")
    log = [e for e in json.load(open(path))["log"] if e["mode"] == label and e["temperature"] == 0]
    arms[name] = {(e["dataset"], e["prompt"]): e for e in log}
names = list(arms)
keys = sorted(arms[names[0]])
for n in names[1:]:
    if sorted(arms[n]) != keys:
        sys.exit(f"{n}: not the same rollouts as {names[0]}")
print("| arm | vs | dataset | rollouts | τ arm | τ vs | τ gain [95%] | resolved |")
print("|---|---|---|---|---|---|---|---|")
for n in names[1:]:
    for ds in sorted({d for d, _ in keys}) + ["all"]:
        ks = [k for k in keys if ds == "all" or k[0] == ds]
        val = lambda a: ([(arms[a][k]["new_tokens"] - 1) / arms[a][k]["rounds"] for k in ks],
                         [arms[a][k]["rounds"] for k in ks])
        (ta, ra), (tb, rb) = val(n), val(names[0])
        r = paired_bootstrap(ta, tb, wa=ra, wb=rb)
        tau = lambda t, w: sum(x * y for x, y in zip(t, w)) / sum(w)
        lo, hi = r["gain_pct_ci"]
        print(f"| {n} | {names[0]} | {ds} | {len(ks)} | {tau(ta, ra):.3f} | {tau(tb, rb):.3f} | "
              f"{r['gain_pct']:+.1f}% [{lo:+.1f}%, {hi:+.1f}%] | {'yes' if r['resolved'] else 'no'} |")
