"""Prompt buckets between powers of two (`decode.buckets.prompt_bucket`) against the power-of-two bucket they
replaced, for AR and speculative decoding, online at batch 1, T = 0, float32, in one process:
`python bucket_ab.py DRAFTER PROMPTS_PER_DATASET MAX_NEW REPEATS OUT.json`. The first N held-out prompts of each
dataset (as `carryover eval` picks them), chat template, the plain arm (no carried rows). Per prompt: one untimed call
of each arm (AR and the drafter, each with the old and the new bucket), then REPEATS rounds of the four, the order
rotated each round; every output must equal AR's with the old bucket. Prints per dataset and over the mix: each
decoder's time with the new bucket over the old one (prefill and whole call), the drafter's speedup over AR with
either bucket, each with the project's paired bootstrap over prompts, and an A/A (AR old, timing 1 over 2)."""
import json
import sys

import numpy as np

from carryover_jax.decode import generate as gen
from carryover_jax.decode.buckets import next_bucket, prompt_bucket
from carryover_jax.eval.paired import paired_bootstrap
from carryover_jax.eval.run import load_items
from carryover_jax.loading import load_drafter, load_target

path, n, max_new, reps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
target = load_target("smollm2")
drafter = load_drafter(path, carryover=False, numerics=target.cfg.numerics)
items, _, _ = load_items(target, ["sharegpt", "humaneval", "mtbench"], prompts_per_dataset=n, max_prompt_tokens=512,
                         system=None, heldout_per_mille=None, chat=True)
BUCKETS = {"old": next_bucket, "new": prompt_bucket}


def call(arm, ids):
    kind, bucket = arm.split("_")
    gen.prompt_bucket = BUCKETS[bucket]  # what plan_lengths pads a prompt to
    if kind == "ar":
        g = gen.generate(target, ids, max_new_tokens=max_new, chat=False)[0]
        return g.token_ids, g.stats["time_s"], g.stats["prefill_s"]
    g, st = gen.speculative_generate(target, drafter, ids, carryover=False, max_new_tokens=max_new, chat=False)
    return g[0].token_ids, st["time_s"], st["prefill_s"]


arms = ["ar_old", "ar_new", "sp_old", "sp_new"]
rows = []
for k, it in enumerate(items):
    ids = [list(it.ids)]
    ref = call("ar_old", ids)[0]
    row = {"dataset": it.dataset, "prompt": it.id, "prompt_tokens": len(it.ids), "new_tokens": len(ref),
           "time": {a: [] for a in arms}, "prefill": {a: [] for a in arms}}
    for a in arms[1:]:
        assert call(a, ids)[0] == ref, (a, it.id)
    for r in range(reps):
        for a in arms[r % 4:] + arms[:r % 4]:
            toks, t, p = call(a, ids)
            assert toks == ref, (a, it.id)
            row["time"][a].append(t)
            row["prefill"][a].append(p)
    rows.append(row)
    print(k + 1, len(items), row["dataset"], row["prompt_tokens"],
          {a: round(float(np.mean(v)), 3) for a, v in row["time"].items()}, flush=True)
json.dump({"drafter": path, "max_new_tokens": max_new, "repeats": reps, "rows": rows}, open(out, "w"), indent=1)


def ci(x, w):
    """Σ w·x / Σ w over prompts with its 95% interval (x a prompt's ratio, w the denominator)."""
    x, w = np.array([x]), np.array([w])
    b = paired_bootstrap(x, np.ones_like(x), wa=w, wb=w)
    lo, hi = (1 + g / 100 for g in b["gain_pct_ci"])
    return f"{1 + b['gain_pct'] / 100:.3f} [{lo:.3f}, {hi:.3f}]"


def ratio(rs, key, num, den):
    m = lambda r, a: float(np.mean(r[key][a]))  # noqa: E731
    return ci([m(r, num) / m(r, den) for r in rs], [m(r, den) for r in rs])


print(f"\ndrafter {path}, {max_new} new tokens, {reps} timings an arm")
print("\n| dataset | prompts | prompt tokens (median) | AR prefill new / old | AR time new / old | speculative time "
      "new / old | speedup, old bucket | speedup, new bucket | A/A: AR old 1 / 2 |")
print("|---|---|---|---|---|---|---|---|---|")
for ds in sorted({r["dataset"] for r in rows}) + ["all"]:
    rs = [r for r in rows if ds == "all" or r["dataset"] == ds]
    aa = ci([r["time"]["ar_old"][0] / r["time"]["ar_old"][1] for r in rs], [r["time"]["ar_old"][1] for r in rs])
    print(f"| {ds} | {len(rs)} | {int(np.median([r['prompt_tokens'] for r in rs]))} | "
          f"{ratio(rs, 'prefill', 'ar_new', 'ar_old')} | {ratio(rs, 'time', 'ar_new', 'ar_old')} | "
          f"{ratio(rs, 'time', 'sp_new', 'sp_old')} | {ratio(rs, 'time', 'ar_old', 'sp_old')} | "
          f"{ratio(rs, 'time', 'ar_new', 'sp_new')} | {aa} |")
