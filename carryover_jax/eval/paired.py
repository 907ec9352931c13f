"""Paired comparisons of eval arms: per-prompt values and a paired bootstrap interval (numpy, no JAX).

Every arm decodes the same prompts (and at T > 0 the same seeds), so the comparison of two arms is a
comparison of paired per-prompt values. For arms A vs B on one dataset (or the mix) at one temperature,
with per-prompt values x[s, i] (seed s, prompt i; one seed at T = 0):

- difference = mean over (s, i) of xA − xB;
- relative gain = mean xA / mean xB − 1, in percent;
- 95% interval: percentile bootstrap of both statistics, resampling prompts with replacement (the
  same prompts for both arms: that is the pairing). At T > 0 a prompt's value is its mean over the
  seeds, so the seed-to-seed variation is inside every resampled unit; resampling the seeds again
  within each prompt would count that variation twice (tried on the 3-seed case of tests/test_paired.py: 200 of 200
  intervals covered, not ~95%). With a single prompt the seeds are the resampled unit;
- the percentiles are the "expanded" ones (Hesterberg 2015): α/2 = Φ(−√(n/(n−1)) · t_{0.975}(n−1)) instead
  of 2.5%, which corrects most of the plain percentile interval's narrowness at a few dozen prompts (the synthetic
  case of tests/test_paired.py, 40 prompts, 300 trials: coverage 0.90 without it, 0.92 with it);
- "resolved" iff the interval of the difference excludes 0.

Per-prompt τ is that prompt's Σ(a + 1) / rounds; per-prompt speedup is the AR time per token of the
prompt (same seed) over the arm's. The bootstrap is seeded, so a result is reproducible from the log.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from carryover_jax.eval.stats import t_quantile_975

REPLICATES = 4000


def per_prompt_values(log: list[dict], label: str, T: float, prompts: Sequence[tuple[str, str]],
                      seeds: Sequence[int]) -> dict[str, list[list[float | None]]]:
    """{"tau": [[seed][prompt]], "speedup": [[seed][prompt]]} for arm `label` at temperature T;
    `prompts` are (dataset, prompt id) pairs. None where the arm (or AR) has no record."""
    by_key = {(r["mode"], r["dataset"], r["prompt"], r["seed"]): r for r in log if r["temperature"] == T}
    taus, speeds = [], []
    for s in seeds:
        trow, srow = [], []
        for ds, pid in prompts:
            r, ar = by_key.get((label, ds, pid, s)), by_key.get(("ar", ds, pid, s))
            if r is None or not r.get("accepted"):
                trow.append(None)
                srow.append(None)
                continue
            trow.append(sum(a + 1 for a in r["accepted"]) / len(r["accepted"]))
            ok = ar is not None and r["time_s"] > 0 and ar["new_tokens"] > 0 and r["new_tokens"] > 0
            srow.append((ar["time_s"] / ar["new_tokens"]) / (r["time_s"] / r["new_tokens"]) if ok else None)
        taus.append(trow)
        speeds.append(srow)
    return {"tau": taus, "speedup": speeds}


def expanded_tail(n: int) -> float:
    """The lower percentile (in %) of the expanded 95% percentile interval for n resampled units."""

    z = math.sqrt(n / (n - 1)) * t_quantile_975(n - 1)
    return 100.0 * 0.5 * (1.0 + math.erf(-z / math.sqrt(2.0)))


def paired_bootstrap(a, b, *, replicates: int = REPLICATES, seed: int = 0) -> dict[str, Any]:
    """Paired comparison of per-prompt values a, b ([prompts] or [seeds, prompts], same shape, no
    missing values): mean difference, relative gain (%), their 95% bootstrap intervals, `resolved`."""
    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired values need the same non-empty shape, got {a.shape} and {b.shape}")
    s, n = a.shape
    ua, ub = (a.mean(axis=0), b.mean(axis=0)) if n > 1 else (a[:, 0], b[:, 0])  # the resampled units
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ua), size=(replicates, len(ua)))
    ma, mb = ua[idx].mean(axis=1), ub[idx].mean(axis=1)
    diff, gain = ma - mb, 100.0 * (ma / mb - 1.0)
    lo = expanded_tail(len(ua)) if len(ua) > 1 else 2.5
    q = [lo, 100.0 - lo]
    d_lo, d_hi = np.percentile(diff, q)
    g_lo, g_hi = np.percentile(gain, q)
    mean_b = float(b.mean())
    return {"diff": float(a.mean() - mean_b), "diff_ci": [float(d_lo), float(d_hi)],
            "gain_pct": float(100.0 * (a.mean() / mean_b - 1.0)), "gain_pct_ci": [float(g_lo), float(g_hi)],
            "resolved": bool(d_lo > 0 or d_hi < 0), "prompts": n, "seeds": s}


def _complete(x, y):
    """Keep the prompts where both arms have a value for every seed."""
    x, y = np.array(x, dtype=object), np.array(y, dtype=object)
    ok = np.array([all(v is not None for v in x[:, i]) and all(v is not None for v in y[:, i])
                   for i in range(x.shape[1])], bool)
    return x[:, ok].astype(np.float64), y[:, ok].astype(np.float64)


def paired_comparisons(log: list[dict], labels: Sequence[str], T: float, datasets: Sequence[str]) -> dict[str, Any]:
    """Per-prompt values of every arm and every pair (later arm vs earlier arm) per dataset and over
    the mix ("all") at temperature T: {"prompts": [[ds, id], ...], "seeds": [...], "values": {label:
    {"tau", "speedup"}}, "pairs": [{"label", "vs", "datasets": {ds: {"tau": {...}, "speedup": {...}}}}]}."""
    recs = [r for r in log if r["temperature"] == T]
    seeds = sorted({r["seed"] for r in recs})
    prompts = list(dict.fromkeys((r["dataset"], r["prompt"]) for r in recs if r["mode"] == "ar"))
    values = {lab: per_prompt_values(log, lab, T, prompts, seeds) for lab in labels}
    pairs = []
    for j, la in enumerate(labels):
        for lb in labels[:j]:
            cell = {}
            for ds in list(datasets) + ["all"]:
                cols = [i for i, (d, _) in enumerate(prompts) if ds == "all" or d == ds]
                if not cols:
                    continue
                out = {}
                for metric in ("tau", "speedup"):
                    va = [[row[i] for i in cols] for row in values[la][metric]]
                    vb = [[row[i] for i in cols] for row in values[lb][metric]]
                    x, y = _complete(va, vb)
                    out[metric] = paired_bootstrap(x, y) if x.shape[1] >= 2 else None
                cell[ds] = out
            pairs.append({"label": la, "vs": lb, "datasets": cell})
    return {"prompts": [list(p) for p in prompts], "seeds": seeds, "values": values, "pairs": pairs}
