"""A bf16 drafter beside the float32 target (`--drafter-dtype bfloat16 --drafter-param-dtype bfloat16`) against the
float32 drafter, online at batch 1, T = 0, in one process: `python drafter_dtype_ab.py DRAFTER PROMPTS_PER_DATASET
MAX_NEW REPEATS OUT.json`. The first N held-out prompts of each dataset (as `carryover eval` picks them), chat
template, the plain arm (no carried rows). Per prompt: one untimed call of each arm (AR, float32 drafter, bf16
drafter), then REPEATS rounds of the three, the order rotated each round. Every speculative output must equal AR's.
Prints per dataset and over the mix: τ of each drafter, each drafter's speedup over AR (AR's total time over the
arm's), bf16's time over float32's, each with the project's paired bootstrap over prompts, and an A/A: the float32
drafter's first timing over its second."""
import json
import sys

import numpy as np

from carryover_jax.decode.generate import generate, speculative_generate
from carryover_jax.eval.paired import paired_bootstrap
from carryover_jax.eval.run import load_items
from carryover_jax.loading import load_drafter, load_target

path, n, max_new, reps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
target = load_target("smollm2")
num = target.cfg.numerics
drafters = {"f32": load_drafter(path, carryover=False, numerics=num),
            "bf16": load_drafter(path, carryover=False, numerics=num.replace(drafter_dtype="bfloat16",
                                                                             drafter_param_dtype="bfloat16"))}
items, _, _ = load_items(target, ["sharegpt", "humaneval", "mtbench"], prompts_per_dataset=n, max_prompt_tokens=512,
                         system=None, heldout_per_mille=None, chat=True)


def call(arm, ids):
    if arm == "ar":
        g = generate(target, ids, max_new_tokens=max_new, chat=False)[0]
        return g.token_ids, g.stats["time_s"], None
    g, st = speculative_generate(target, drafters[arm], ids, carryover=False, max_new_tokens=max_new, chat=False)
    return g[0].token_ids, st["time_s"], st["rounds"]


arms = ["ar", "f32", "bf16"]
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
json.dump({"drafter": path, "max_new_tokens": max_new, "repeats": reps, "rows": rows}, open(out, "w"), indent=1)


def ci(x, w):
    """Σ w·x / Σ w over prompts with its 95% interval (x a prompt's time ratio, w the denominator's time)."""
    x, w = np.array([x]), np.array([w])
    b = paired_bootstrap(x, np.ones_like(x), wa=w, wb=w)
    if b["gain_pct_ci"] is None:  # too few prompts for an interval
        return f"{1 + b['gain_pct'] / 100:.3f}"
    lo, hi = (1 + g / 100 for g in b["gain_pct_ci"])
    return f"{1 + b['gain_pct'] / 100:.3f} [{lo:.3f}, {hi:.3f}]"


def ratio(num_arm, den_arm, rs):
    """Σ num / Σ den over prompts, a prompt's repeats averaged."""
    t = lambda r, a: float(np.mean(r["time"][a]))  # noqa: E731
    return ci([t(r, num_arm) / t(r, den_arm) for r in rs], [t(r, den_arm) for r in rs])


print("\n| dataset | prompts | τ float32 / bf16 drafter | speedup, float32 drafter | speedup, bf16 drafter | "
      "bf16 / float32 time | A/A: float32 repeat 1 / 2 |")
print("|---|---|---|---|---|---|---|")
for ds in sorted({r["dataset"] for r in rows}) + ["all"]:
    rs = [r for r in rows if ds == "all" or r["dataset"] == ds]
    tau = {a: sum(r["new_tokens"] - 1 for r in rs) / sum(r[f"rounds_{a}"] for r in rs) for a in arms[1:]}
    aa = ci([r["time"]["f32"][0] / r["time"]["f32"][1] for r in rs], [r["time"]["f32"][1] for r in rs])
    print(f"| {ds} | {len(rs)} | {tau['f32']:.3f} / {tau['bf16']:.3f} | {ratio('ar', 'f32', rs)} | "
          f"{ratio('ar', 'bf16', rs)} | {ratio('bf16', 'f32', rs)} | {aa} |")
