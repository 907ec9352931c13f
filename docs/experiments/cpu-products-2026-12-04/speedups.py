"""Per-prompt speedups (AR time / speculative time, the same tokens) of the two online evals, their geometric mean
with a 95% bootstrap interval over prompts (10,000 resamples, seed 0), and the per-prompt ratio stream / xla of AR
and speculative times.
`python speedups.py online-xla-results.json online-stream-results.json`"""
import json, sys
import numpy as np


def times(path):
    log = json.load(open(path))["log"]
    return {mode: {(r["dataset"], r["prompt"]): r["time_s"] / r["new_tokens"] for r in log if r["mode"] == mode}
            for mode in ("ar", "ce_kl")}


def gmean_ci(x):
    lx = np.log(x)
    boot = lx[np.random.default_rng(0).integers(0, len(lx), (10_000, len(lx)))].mean(1)
    lo, hi = np.exp(np.percentile(boot, [2.5, 97.5]))
    return f"{np.exp(lx.mean()):.3f} [{lo:.3f}, {hi:.3f}] (n = {len(lx)})"


runs = {p.split("-")[1]: times(p) for p in sys.argv[1:]}
for name, t in runs.items():
    keys = sorted(t["ar"])
    print(f"{name}: speedup per prompt, geometric mean {gmean_ci(np.array([t['ar'][k] / t['ce_kl'][k] for k in keys]))}")
a, b = runs["xla"], runs["stream"]
for mode in ("ar", "ce_kl"):
    keys = sorted(a[mode])
    print(f"{mode} time per token, stream / xla: {gmean_ci(np.array([b[mode][k] / a[mode][k] for k in keys]))}")
