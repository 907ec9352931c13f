"""Two drafters against AR online at batch 1, T = 0, float32, in one process: `python round_ab.py DRAFTER_A DRAFTER_B
PROMPTS_PER_DATASET MAX_NEW REPEATS OUT.json`. The first N held-out prompts of each dataset (as `carryover eval`
picks them), chat template, the plain arm (no carried rows). Per prompt: one untimed call of each arm (AR, A, B),
then REPEATS rounds of the three, the order rotated each round; every speculative output must equal AR's. Prints
per dataset and over the mix: τ of each drafter, each one's speedup over AR (AR's total time over the arm's), B's
time per round over A's (what a round costs, whatever τ), each with the project's paired bootstrap over prompts,
and an A/A: A's first timing over its second."""
import json
import sys

import numpy as np

from carryover_jax.decode.generate import generate, speculative_generate
from carryover_jax.eval.paired import paired_bootstrap
from carryover_jax.eval.run import load_items
from carryover_jax.loading import load_drafter, load_target

path_a, path_b = sys.argv[1], sys.argv[2]
n, max_new, reps, out = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
target = load_target("smollm2")
num = target.cfg.numerics
drafters = {"a": load_drafter(path_a, carryover=False, numerics=num),
            "b": load_drafter(path_b, carryover=False, numerics=num)}
items, _, _ = load_items(target, ["sharegpt", "humaneval", "mtbench"], prompts_per_dataset=n, max_prompt_tokens=512,
                         system=None, heldout_per_mille=None, chat=True)


def call(arm, ids):
    if arm == "ar":
        g = generate(target, ids, max_new_tokens=max_new, chat=False)[0]
        return g.token_ids, g.stats["time_s"], None
    g, st = speculative_generate(target, drafters[arm], ids, carryover=False, max_new_tokens=max_new, chat=False)
    return g[0].token_ids, st["time_s"], st["rounds"]


arms = ["ar", "a", "b"]
rows = []
for k, it in enumerate(items):
    ids = [list(it.ids)]
    ref = call("ar", ids)[0]
    row = {"dataset": it.dataset, "prompt": it.id, "new_tokens": len(ref), "time": {a: [] for a in arms}}
    for a in arms[1:]:
        toks, _, row[f"rounds_{a}"] = call(a, ids)
        assert toks == ref, (a, it.id)
    for r in range(reps):
        for a in arms[r % 3:] + arms[:r % 3]:
            toks, t, _ = call(a, ids)
            assert toks == ref, (a, it.id)
            row["time"][a].append(t)
    rows.append(row)
    print(k + 1, len(items), row["dataset"], {a: round(float(np.mean(v)), 3) for a, v in row["time"].items()},
          flush=True)
json.dump({"drafters": [path_a, path_b], "max_new_tokens": max_new, "repeats": reps, "rows": rows}, open(out, "w"),
          indent=1)


def ci(x, w):
    """Σ w·x / Σ w over prompts with its 95% interval (x a prompt's ratio, w the denominator)."""
    x, w = np.array([x]), np.array([w])
    b = paired_bootstrap(x, np.ones_like(x), wa=w, wb=w)
    if b["gain_pct_ci"] is None:  # too few prompts for an interval
        return f"{1 + b['gain_pct'] / 100:.3f}"
    lo, hi = (1 + g / 100 for g in b["gain_pct_ci"])
    return f"{1 + b['gain_pct'] / 100:.3f} [{lo:.3f}, {hi:.3f}]"


def t(r, a):
    return float(np.mean(r["time"][a]))


print(f"\nA = {path_a}, B = {path_b}")
print("\n| dataset | prompts | τ A / B | speedup A | speedup B | B / A time a round | A/A: A's repeat 1 / 2 |")
print("|---|---|---|---|---|---|---|")
for ds in sorted({r["dataset"] for r in rows}) + ["all"]:
    rs = [r for r in rows if ds == "all" or r["dataset"] == ds]
    tau = {a: sum(r["new_tokens"] - 1 for r in rs) / sum(r[f"rounds_{a}"] for r in rs) for a in arms[1:]}
    sp = {a: ci([t(r, "ar") / t(r, a) for r in rs], [t(r, a) for r in rs]) for a in arms[1:]}
    per_round = ci([(t(r, "b") / r["rounds_b"]) / (t(r, "a") / r["rounds_a"]) for r in rs],
                   [t(r, "a") / r["rounds_a"] for r in rs])
    aa = ci([r["time"]["a"][0] / r["time"]["a"][1] for r in rs], [r["time"]["a"][1] for r in rs])
    print(f"| {ds} | {len(rs)} | {tau['a']:.3f} / {tau['b']:.3f} | {sp['a']} | {sp['b']} | {per_round} | {aa} |")
