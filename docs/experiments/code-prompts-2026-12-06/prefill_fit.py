"""How much of an online eval's speedup the prompt's prefill takes: `python prefill_fit.py RESULTS.json LABEL`.
Rebuilds the run's prompts (its own settings, the eval's `load_items`) for their token counts, fits AR's time per
prompt (median of its repeats) as a + b * prompt tokens + c * new tokens by least squares, and takes a + b * prompt
tokens as the prompt's prefill estimate, the same work for AR and the drafter. Then per dataset: the speedup as the
eval reports it (AR's total time over the arm's) and the same with the estimated prefill taken out of both, and
τ ÷ each, the AR steps a round costs. A model fitted on AR alone, not a measurement of the prefill: evals run since
(cycle 2 on) log each call's `prefill_s`, and their report's "prompt prefill left out" table measures it."""
import json
import sys

import numpy as np

from carryover_jax.eval.run import load_items
from carryover_jax.loading import load_target

path, label = sys.argv[1:3]
r = json.load(open(path))
c = r["config"]
target = load_target(r["target"])
items, _, _ = load_items(target, list(c["datasets"]), prompts_per_dataset=max(c["datasets"].values()),
                         max_prompt_tokens=c["max_prompt_tokens"], system=c["system"],
                         heldout_per_mille=c["heldout_per_mille"], chat=c["chat"])
plen = {(it.dataset, it.id): len(it.ids) for it in items}
log = [e for e in r["log"] if e["temperature"] == 0]
ar = {(e["dataset"], e["prompt"]): e for e in log if e["mode"] == "ar"}
sp = {(e["dataset"], e["prompt"]): e for e in log if e["mode"] == label}
keys = sorted(ar)
missing = [k for k in keys if k not in plen]
if missing:
    sys.exit(f"prefill_fit: {len(missing)} prompts of the run not rebuilt, e.g. {missing[0]}")
X = np.array([[1.0, plen[k], ar[k]["new_tokens"]] for k in keys])
y = np.array([ar[k]["time_s"] for k in keys])
coef, *_ = np.linalg.lstsq(X, y, rcond=None)
resid = y - X @ coef
print(f"AR time = {coef[0] * 1e3:.1f} ms + {coef[1] * 1e3:.3f} ms x prompt tokens + "
      f"{coef[2] * 1e3:.2f} ms x new tokens (R^2 {1 - resid.var() / y.var():.3f}, {len(keys)} prompts)")
print("| dataset | prompts | prompt tokens (mean) | prefill share of AR time | speedup (eval) | τ ÷ it | "
      "speedup without prefill | τ ÷ it |")
print("|---|---|---|---|---|---|---|---|")
for ds in sorted({d for d, _ in keys}) + ["all"]:
    ks = [k for k in keys if ds == "all" or k[0] == ds]
    pre = np.array([coef[0] + coef[1] * plen[k] for k in ks])
    t_ar = np.array([ar[k]["time_s"] for k in ks])
    t_sp = np.array([sp[k]["time_s"] for k in ks])
    rounds = sum(sp[k]["rounds"] for k in ks)
    tau = sum(sp[k]["new_tokens"] - 1 for k in ks) / rounds
    s_all, s_dec = t_ar.sum() / t_sp.sum(), (t_ar - pre).sum() / (t_sp - pre).sum()
    print(f"| {ds} | {len(ks)} | {np.mean([plen[k] for k in ks]):.0f} | {pre.sum() / t_ar.sum():.1%} | "
          f"{s_all:.3f}x | {tau / s_all:.3f} | {s_dec:.3f}x | {tau / s_dec:.3f} |")
