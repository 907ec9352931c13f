"""Per-prompt speedups (AR time / speculative time, the same tokens) of two online evals, their geometric mean with
a 95% bootstrap interval over prompts (10,000 resamples, seed 0), and the per-prompt ratio B / A of AR and of
speculative time per token.
`python speedups.py DRAFTER A-results.json B-results.json` (DRAFTER: the eval's drafter name)"""
import json, sys
import numpy as np

drafter, paths = sys.argv[1], sys.argv[2:4]


def times(path):
    log = json.load(open(path))["log"]
    return {mode: {(r["dataset"], r["prompt"]): r["time_s"] / r["new_tokens"] for r in log if r["mode"] == mode}
            for mode in ("ar", drafter)}


def gmean_ci(x):
    lx = np.log(x)
    boot = lx[np.random.default_rng(0).integers(0, len(lx), (10_000, len(lx)))].mean(1)
    lo, hi = np.exp(np.percentile(boot, [2.5, 97.5]))
    return f"{np.exp(lx.mean()):.3f} [{lo:.3f}, {hi:.3f}] (n = {len(lx)})"


a, b = (times(p) for p in paths)
for path, t in zip(paths, (a, b)):
    keys = sorted(t["ar"])
    print(f"{path}: speedup per prompt, geometric mean {gmean_ci(np.array([t['ar'][k] / t[drafter][k] for k in keys]))}")
for mode in ("ar", drafter):
    keys = sorted(a[mode])
    print(f"{mode} time per token, B / A: {gmean_ci(np.array([b[mode][k] / a[mode][k] for k in keys]))}")
