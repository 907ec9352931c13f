"""Speedup over AR at batch 1 of one arm of a `carryover eval` run (T = 0), per dataset and over the mix, with a
95% interval: `python speedup_ci.py results.json LABEL`. A prompt's speedup is AR's time per token over the arm's,
timing repeat r against repeat r (they ran interleaved). Two statistics, each with the project's paired bootstrap
over prompts (`eval/paired.paired_bootstrap`) against a constant 1.0:
- the report's: AR's total time over the arm's total time (`eval/metrics.speedup`; at T = 0 both make the same
  tokens), i.e. the prompts' speedups weighted by the arm's time (a prompt's timing repeats averaged);
- the mean of the prompts' speedups, resampling prompts and then each chosen prompt's repeats.
An A/A column bounds the timing noise: AR's repeat 1 over its repeat 2, per prompt, by the same bootstrap."""
import json, sys
import numpy as np
from carryover_jax.eval.paired import paired_bootstrap, per_prompt_values

path, label = sys.argv[1:3]
r = json.load(open(path))
log = [e for e in r["log"] if e["temperature"] == 0]
prompts = [tuple(p) for p in r["summary"]["temperatures"]["0"]["paired"]["prompts"]]
reps = per_prompt_values(log, label, 0.0, prompts, [0])["speedup_repeats"][0]
ar = {(e["dataset"], e["prompt"]): e["time_s_repeats"] for e in log if e["mode"] == "ar"}
spec = {(e["dataset"], e["prompt"]): np.mean(e["time_s_repeats"]) for e in log if e["mode"] == label}
print("| dataset | prompts | total-time speedup [95%] | mean per-prompt speedup [95%] | prompts ≥ 1.3x | "
      "AR repeat 1 / repeat 2 [95%] |")
print("|---|---|---|---|---|---|")
for ds in sorted({d for d, _ in prompts}) + ["all"]:
    idx = [i for i, (d, _) in enumerate(prompts) if ds == "all" or d == ds]
    x = np.array([reps[i] for i in idx])                                   # [prompts, repeats]
    b = paired_bootstrap(x[None], np.ones_like(x)[None])
    w = np.array([[spec[prompts[i]] for i in idx]])
    t = paired_bootstrap(x.mean(axis=1)[None], np.ones((1, len(idx))), wa=w, wb=w)
    tot, (tlo, thi) = 1 + t["gain_pct"] / 100, (1 + g / 100 for g in t["gain_pct_ci"])
    aa = np.array([[ar[prompts[i]][0] / ar[prompts[i]][1]] for i in idx])
    c = paired_bootstrap(aa[None], np.ones_like(aa)[None])
    lo, hi = (1 + g / 100 for g in b["gain_pct_ci"])
    alo, ahi = (1 + g / 100 for g in c["gain_pct_ci"])
    print(f"| {ds} | {len(idx)} | {tot:.3f}x [{tlo:.3f}, {thi:.3f}] | {x.mean():.3f}x [{lo:.3f}, {hi:.3f}] | "
          f"{(x.mean(axis=1) >= 1.3).sum()} | "
          f"{aa.mean():.3f} [{alo:.3f}, {ahi:.3f}] |")
