"""The whole batch-1 decode in bf16 (target params, activations and KV caches; the drafter's params and compute)
against float32, online, T = 0, in one process: `python target_dtype_ab.py DRAFTER PROMPTS_PER_DATASET MAX_NEW
REPEATS OUT.json`. The first N held-out prompts of each dataset (as `carryover eval` picks them), chat template, the
plain arm (no carried rows). Four arms: AR and speculative decoding under each numerics. Per prompt: one untimed call
of each arm, then REPEATS rounds of the four, the order rotated each round. Each speculative output must equal AR's
under the same numerics (the two numerics' greedy chains may differ: their shared tokens are counted). Prints per
dataset and over the mix: τ under each, each numerics' speedup over its own AR, bf16's AR and speculative times over
float32's, bf16 speculative over float32 AR (what a user of the float32 default gains), each with the project's paired
bootstrap over prompts, and an A/A: float32 AR's first timing over its second."""
import json
import sys

import numpy as np

from carryover_jax.decode.generate import generate, speculative_generate
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.eval.run import load_items
from carryover_jax.loading import load_drafter, load_target

path, n, max_new, reps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
targets = {"f32": load_target("smollm2"), "bf16": load_target("smollm2", dtype="bfloat16")}
drafters = {"f32": load_drafter(path, carryover=False, numerics=targets["f32"].cfg.numerics),
            "bf16": load_drafter(path, carryover=False,
                                 numerics=targets["bf16"].cfg.numerics.replace(drafter_param_dtype="bfloat16"))}
items, _, _ = load_items(targets["f32"], ["sharegpt", "humaneval", "mtbench"], prompts_per_dataset=n,
                         max_prompt_tokens=512, system=None, heldout_per_mille=None, chat=True)
arms = ["ar_f32", "sp_f32", "ar_bf16", "sp_bf16"]


def call(arm, ids):
    kind, num = arm.split("_")
    if kind == "ar":
        g = generate(targets[num], ids, max_new_tokens=max_new, chat=False)[0]
        return g.token_ids, g.stats["time_s"], None
    g, st = speculative_generate(targets[num], drafters[num], ids, carryover=False, max_new_tokens=max_new,
                                 chat=False)
    return g[0].token_ids, st["time_s"], st["rounds"]


rows = []
for k, it in enumerate(items):
    ids = [list(it.ids)]
    row = {"dataset": it.dataset, "prompt": it.id, "time": {a: [] for a in arms}}
    ref = {num: call(f"ar_{num}", ids)[0] for num in ("f32", "bf16")}
    for num in ("f32", "bf16"):
        toks, _, row[f"rounds_{num}"] = call(f"sp_{num}", ids)
        assert toks == ref[num], (num, it.id)
        row[f"new_tokens_{num}"] = len(ref[num])
    row["shared_prefix"] = next((i for i, (a, b) in enumerate(zip(ref["f32"], ref["bf16"])) if a != b),
                                min(len(ref["f32"]), len(ref["bf16"])))
    for r in range(reps):
        for a in arms[r % 4:] + arms[:r % 4]:
            toks, t, _ = call(a, ids)
            assert toks == ref[a.split("_")[1]], (a, it.id)
            row["time"][a].append(t)
    rows.append(row)
    print(k + 1, len(items), row["dataset"], {a: round(float(np.mean(v)), 3) for a, v in row["time"].items()},
          flush=True)
with open(out, "w") as f:
    json.dump({"drafter": path, "max_new_tokens": max_new, "repeats": reps, "rows": rows}, f, indent=1)


def ratio(num_arm, den_arm, rs, t=lambda r, a: float(np.mean(r["time"][a]))):
    """Σ num / Σ den over prompts (a prompt's repeats averaged) with its 95% interval over prompts."""
    return fmt(*speed_ratio([t(r, num_arm) for r in rs], [t(r, den_arm) for r in rs]))


def fmt(r, lo, hi):
    return f"{r:.3f}" if lo is None else f"{r:.3f} [{lo:.3f}, {hi:.3f}]"


print("\n| dataset | prompts | τ float32 / bf16 | shared greedy prefix | speedup float32 | speedup bf16 | "
      "AR bf16 ÷ float32 time | speculative bf16 ÷ float32 time | float32 AR ÷ bf16 speculative | A/A |")
print("|---|---|---|---|---|---|---|---|---|---|")
for ds in sorted({r["dataset"] for r in rows}) + ["all"]:
    rs = [r for r in rows if ds == "all" or r["dataset"] == ds]
    tau = {m: sum(r[f"new_tokens_{m}"] - 1 for r in rs) / sum(r[f"rounds_{m}"] for r in rs) for m in ("f32", "bf16")}
    shared = np.mean([r["shared_prefix"] / r["new_tokens_f32"] for r in rs])
    aa = fmt(*speed_ratio([r["time"]["ar_f32"][0] for r in rs], [r["time"]["ar_f32"][1] for r in rs]))
    print(f"| {ds} | {len(rs)} | {tau['f32']:.3f} / {tau['bf16']:.3f} | {shared:.0%} | "
          f"{ratio('ar_f32', 'sp_f32', rs)} | {ratio('ar_bf16', 'sp_bf16', rs)} | {ratio('ar_bf16', 'ar_f32', rs)} | "
          f"{ratio('sp_bf16', 'sp_f32', rs)} | {ratio('ar_f32', 'sp_bf16', rs)} | {aa} |")
