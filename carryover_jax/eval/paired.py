"""Paired comparisons of eval arms: per-prompt values and a paired bootstrap interval (numpy, no JAX).

Every arm decodes the same prompts (and at T > 0 the same seeds), so the comparison of two arms is a
comparison of paired per-prompt values. For arms A vs B on one dataset (or the mix) at one temperature,
with per-prompt values x[s, i] (seed s, prompt i; one seed at T = 0):

- τ is the reported τ itself, micro-averaged: Σ tokens / Σ rounds over the (s, i) — a per-prompt τ
  weighted by its rounds — so Δτ is the difference of the τ table's numbers (at T = 0 exactly). A ratio of
  sums has no Jensen bias from per-prompt ratios: rounds that are themselves estimates (the offline
  evaluator's expected or sampled rounds, eval/offline.py) enter linearly;
- speedup: per prompt, the mean over its timing repeats of (AR time per token / the arm's), AR and the
  arms timed interleaved, repeat r of every mode back to back (`run.py`), so a slow spell of the
  machine hits the AR call and the arm's call it is divided by alike; the statistic is the mean over prompts;
- difference A − B and relative gain A / B − 1 (%), with a 95% interval: percentile bootstrap resampling
  prompts with replacement (the same prompts for both arms: that is the pairing). At T > 0 a prompt's
  value pools its seeds, so the seed-to-seed variation is inside every resampled unit; resampling the
  seeds again within each prompt would count that variation twice (tried on the 3-seed case of
  tests/test_paired.py: 200 of 200 intervals covered, not ~95%). Timings are resampled in two stages:
  the prompts, then each chosen prompt's repeats (the same repeat indices for both arms, as they were
  timed together), so the interval carries the within-prompt timing spread even where few prompts
  could not show it (conservative: that spread is also inside the prompt means);
- the percentiles are the "expanded" ones (Hesterberg 2015): α/2 = Φ(−√(n/(n−1)) · t_{0.975}(n−1)) instead
  of 2.5%, which corrects most of the plain percentile interval's narrowness at a few dozen prompts (the
  synthetic case of tests/test_paired.py, 40 prompts, 300 trials: coverage 0.90 without it, 0.92 with it).

What a comparison may claim (`status`):
- "too few prompts" below MIN_PROMPTS prompts: no interval. Below 6 no distribution-free 95% statement
  exists at all — even if all n paired differences share a sign, a symmetric null gives that chance
  2^(1−n) > 0.05 (with 2 prompts the bootstrap has three possible means); from 6 to 9 the expanded
  bootstrap still undercovers skewed per-prompt differences (coverage 0.87 at 6, 0.91 at 8 on the skewed
  case of tests/test_paired.py; 0.93–0.95 from 10 on, normal or skewed);
- "resolved" iff the interval of the difference excludes 0, else "not resolved";
- speedup only: "one timing per prompt" with a single timing repeat (the interval is shown, but a
  prompt's timing spread is unknown, so nothing is resolved), and "timing noise" when the two arms
  accepted the same drafts in every round of every prompt: their rounds are the same work, so a speed
  difference is the machine's noise, reported as a bound (± the larger end of the gain interval).

The bootstrap is seeded, so a result is reproducible from the log.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from carryover_jax.errors import CarryoverError
from carryover_jax.eval.stats import t_quantile_975

REPLICATES = 4000
MIN_PROMPTS = 10  # the fewest prompts a comparison is resolved on (module docstring)
MIN_TIMING_REPEATS = 2  # timings per prompt and mode before a speedup comparison may be resolved
TIMING_REPEATS = 3  # the eval's default timings per prompt and mode (run.py)
_CHUNK = 500  # bootstrap replicates at a time (bounds the two-stage index array)


def check_resolvable(prompts: int, what: str) -> None:
    """One-line refusal of a comparison that cannot resolve anything (fewer than MIN_PROMPTS prompts)."""
    if prompts < MIN_PROMPTS:
        raise CarryoverError(f"{what}: {prompts} prompt{'s' * (prompts != 1)} cannot resolve a comparison of arms: "
                             f"a paired 95% interval needs >= {MIN_PROMPTS} prompts (carryover_jax/eval/paired.py)")


def _timings(r: dict) -> list[float]:
    return [float(t) for t in r.get("time_s_repeats") or [r["time_s"]]]


def per_prompt_values(log: list[dict], label: str, T: float, prompts: Sequence[tuple[str, str]],
                      seeds: Sequence[int]) -> dict[str, list]:
    """Arm `label` at temperature T, each [seed][prompt] (None where the arm or AR has no record):
    "tau" (Σ(a + 1) / rounds), "rounds", "speedup" (mean over the timing repeats) and "speedup_repeats"
    (one value per repeat: AR time per token over the arm's, repeat r of each). `prompts`: (dataset, id)."""
    by_key = {(r["mode"], r["dataset"], r["prompt"], r["seed"]): r for r in log if r["temperature"] == T}
    out: dict[str, list] = {"tau": [], "rounds": [], "speedup": [], "speedup_repeats": []}
    for s in seeds:
        rows: dict[str, list] = {k: [] for k in out}
        for ds, pid in prompts:
            r, ar = by_key.get((label, ds, pid, s)), by_key.get(("ar", ds, pid, s))
            if r is None or not r.get("accepted"):
                for k in rows:
                    rows[k].append(None)
                continue
            rows["tau"].append(sum(a + 1 for a in r["accepted"]) / len(r["accepted"]))
            rows["rounds"].append(len(r["accepted"]))
            reps = None
            if ar is not None and ar["new_tokens"] > 0 and r["new_tokens"] > 0:
                ta, tr = _timings(ar), _timings(r)
                if len(ta) == len(tr) and min(tr) > 0:
                    reps = [(x / ar["new_tokens"]) / (y / r["new_tokens"]) for x, y in zip(ta, tr)]
            rows["speedup_repeats"].append(reps)
            rows["speedup"].append(None if reps is None else float(np.mean(reps)))
        for k in out:
            out[k].append(rows[k])
    return out


def expanded_tail(n: int) -> float:
    """The lower percentile (in %) of the expanded 95% percentile interval for n resampled units."""

    z = math.sqrt(n / (n - 1)) * t_quantile_975(n - 1)
    return 100.0 * 0.5 * (1.0 + math.erf(-z / math.sqrt(2.0)))


def _shape3(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x.reshape((1, -1, 1)) if x.ndim == 1 else x[..., None] if x.ndim == 2 else x


def paired_bootstrap(a, b, *, wa=None, wb=None, replicates: int = REPLICATES, seed: int = 0,
                     min_prompts: int = MIN_PROMPTS) -> dict[str, Any]:
    """Paired comparison of per-prompt values a, b: [prompts], [seeds, prompts] or [seeds, prompts, repeats]
    (same shape, no missing values). The statistic of an arm is its mean, or with weights wa / wb
    ([seeds, prompts]) the weighted mean Σ w·x / Σ w (τ: weights = rounds, a ratio of sums). Returns the
    difference, the relative gain (%), their 95% intervals (None below `min_prompts` prompts), `status` and
    `resolved` (module docstring)."""
    a, b = _shape3(a), _shape3(b)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired values need the same non-empty shape, got {a.shape} and {b.shape}")
    s, n, reps = a.shape
    weighted = wa is not None
    if weighted:
        if reps != 1:
            raise ValueError("weighted values have no repeats")
        wa, wb = np.asarray(wa, np.float64).reshape(s, n), np.asarray(wb, np.float64).reshape(s, n)
    else:
        wa = wb = np.ones((s, n))
    # per-prompt numerator and denominator, pooled over the seeds (mean over the repeats)
    na, nb = (wa * a.mean(axis=2)).sum(axis=0), (wb * b.mean(axis=2)).sum(axis=0)
    da, db = wa.sum(axis=0), wb.sum(axis=0)
    mean_a, mean_b = na.sum() / da.sum(), nb.sum() / db.sum()
    out: dict[str, Any] = {"diff": float(mean_a - mean_b), "gain_pct": float(100.0 * (mean_a / mean_b - 1.0)),
                           "diff_ci": None, "gain_pct_ci": None, "resolved": False, "status": "too few prompts",
                           "prompts": n, "seeds": s, "repeats": reps}
    if n < max(min_prompts, 2):
        return out
    rng = np.random.default_rng(seed)
    diff, gain = [], []
    for start in range(0, replicates, _CHUNK):
        m = min(_CHUNK, replicates - start)
        idx = rng.integers(0, n, size=(m, n))
        if reps > 1:  # second stage: each chosen prompt's repeats, per seed, the same indices for both arms
            ridx = rng.integers(0, reps, size=(m, s, n, reps))
            cols = idx[:, None, :, None]
            seeds_ = np.arange(s)[None, :, None, None]
            ua = a[seeds_, cols, ridx].mean(axis=3).sum(axis=1)  # [m, n]: resampled prompt numerators
            ub = b[seeds_, cols, ridx].mean(axis=3).sum(axis=1)
            ma, mb = ua.sum(axis=1) / da[idx].sum(axis=1), ub.sum(axis=1) / db[idx].sum(axis=1)
        else:
            ma, mb = na[idx].sum(axis=1) / da[idx].sum(axis=1), nb[idx].sum(axis=1) / db[idx].sum(axis=1)
        diff.append(ma - mb)
        gain.append(100.0 * (ma / mb - 1.0))
    diff, gain = np.concatenate(diff), np.concatenate(gain)
    lo = expanded_tail(n)
    q = [lo, 100.0 - lo]
    d_lo, d_hi = np.percentile(diff, q)
    g_lo, g_hi = np.percentile(gain, q)
    resolved = bool(d_lo > 0 or d_hi < 0)
    out.update(diff_ci=[float(d_lo), float(d_hi)], gain_pct_ci=[float(g_lo), float(g_hi)], resolved=resolved,
               status="resolved" if resolved else "not resolved")
    return out


def speed_ratio(secs_a, secs_b) -> tuple[float, float | None, float | None]:
    """How many times as fast b ran as a: the mean of a's times over the mean of b's, with its 95% interval by the
    paired bootstrap over the rounds (times of the same rounds, as `bench.steps.rotated_seconds` gives them;
    None below 2 rounds)."""
    cmp = paired_bootstrap(secs_a, secs_b, min_prompts=2)
    lo, hi = (None, None) if cmp["gain_pct_ci"] is None else (1 + g / 100 for g in cmp["gain_pct_ci"])
    return 1 + cmp["gain_pct"] / 100, lo, hi


def speedup_interval(log: list[dict], label: str, T: float, dataset: str | None = None) -> list[float] | None:
    """The 95% interval of the report's speedup of arm `label` over AR at temperature T (`metrics.speedup`: AR's
    time per token over the arm's, each a ratio of sums) on `dataset` (None: the mix), over the prompts timed in
    both: `paired_bootstrap` of the two arms' times per token weighted by their tokens, whose means are those ratios
    of sums, so its gain is the speedup − 1. With several seeds a prompt pools them (the table shows their mean ±
    instead). None below MIN_PROMPTS such prompts."""
    recs = [r for r in log if r["temperature"] == T and dataset in (None, r["dataset"])]
    by_key = {(r["mode"], r["dataset"], r["prompt"], r["seed"]): r for r in recs}
    prompts = list(dict.fromkeys((r["dataset"], r["prompt"]) for r in recs if r["mode"] == label))
    if len(prompts) < MIN_PROMPTS:
        return None
    cols: list[list[list]] = [[], [], [], []]  # [AR, arm] time per token and tokens, each [seed][prompt]
    for s in sorted({r["seed"] for r in recs}):
        row: list[list] = [[], [], [], []]
        for ds, pid in prompts:
            pair = by_key.get(("ar", ds, pid, s)), by_key.get((label, ds, pid, s))
            ok = all(r is not None and r["new_tokens"] > 0 and r["time_s"] > 0 for r in pair)
            for k, r in enumerate(pair):
                row[2 * k].append(r["time_s"] / r["new_tokens"] if ok else None)
                row[2 * k + 1].append(r["new_tokens"] if ok else None)
        for col, values in zip(cols, row):
            col.append(values)
    t_ar, n_ar, t_arm, n_arm = _complete(*cols)
    if t_ar.shape[1] < MIN_PROMPTS:
        return None
    ci = paired_bootstrap(t_ar, t_arm, wa=n_ar, wb=n_arm)["gain_pct_ci"]
    return None if ci is None else [1 + g / 100 for g in ci]


def _complete(*arrays):
    """Keep the prompts where every array has a value for every seed: float arrays [seeds, prompts(, ...)]."""
    n = len(arrays[0][0])
    ok = [i for i in range(n) if all(row[i] is not None for x in arrays for row in x)]
    return [np.array([[row[i] for i in ok] for row in x], np.float64) for x in arrays]


def _same_rounds(log: list[dict], la: str, lb: str, T: float, cells: set[tuple[str, str]]) -> bool:
    """Arms la and lb accepted the same drafts in every round of every (prompt, seed) of `cells`."""
    acc = {(r["mode"], r["dataset"], r["prompt"], r["seed"]): r.get("accepted") for r in log if r["temperature"] == T}
    keys = [(ds, p, s) for (m, ds, p, s) in acc if m == la and (ds, p) in cells]
    return bool(keys) and all(acc[(la, *k)] == acc.get((lb, *k)) for k in keys)


def compare_speedup(va: list, vb: list, same_rounds: bool) -> dict[str, Any] | None:
    """The speedup comparison of two arms from their per-repeat values [seed][prompt][repeat], with the claim
    the timings allow (module docstring); None when fewer than 2 prompts have timings for both."""
    x, y = _complete(va, vb)
    if x.shape[1] < 2:
        return None
    r = paired_bootstrap(x, y)
    if r["diff_ci"] is None:
        return r
    if same_rounds:
        r.update(resolved=False, status="timing noise", noise_bound_pct=float(max(abs(v) for v in r["gain_pct_ci"])))
    elif r["repeats"] < MIN_TIMING_REPEATS:
        r.update(resolved=False, status="one timing per prompt")
    return r


def compare_tau(ta: list, tb: list, ra: list, rb: list) -> dict[str, Any] | None:
    """The τ comparison (micro: per-prompt τ weighted by its rounds) from [seed][prompt] τ and rounds."""
    x, y, wx, wy = _complete(ta, tb, ra, rb)
    return paired_bootstrap(x, y, wa=wx, wb=wy) if x.shape[1] >= 2 else None


def paired_comparisons(log: list[dict], labels: Sequence[str], T: float, datasets: Sequence[str]) -> dict[str, Any]:
    """Per-prompt values of every arm and every pair (later arm vs earlier arm) per dataset and over
    the mix ("all") at temperature T: {"prompts": [[ds, id], ...], "seeds": [...], "values": {label:
    {"tau", "rounds", "speedup", "speedup_repeats"}}, "pairs": [{"label", "vs", "datasets": {ds: {"tau":
    {...}, "speedup": {...}}}}]}."""
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

                def pick(lab, key):
                    return [[row[i] for i in cols] for row in values[lab][key]]

                same = _same_rounds(log, la, lb, T, {prompts[i] for i in cols})
                cell[ds] = {
                    "tau": compare_tau(pick(la, "tau"), pick(lb, "tau"), pick(la, "rounds"), pick(lb, "rounds")),
                    "speedup": compare_speedup(pick(la, "speedup_repeats"), pick(lb, "speedup_repeats"), same)}
            pairs.append({"label": la, "vs": lb, "datasets": cell})
    return {"prompts": [list(p) for p in prompts], "seeds": seeds, "values": values, "pairs": pairs}
