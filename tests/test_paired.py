"""Paired bootstrap of eval arms (eval/paired.py): coverage of a known difference on synthetic per-prompt
values (and of timings with repeats), a zero difference reads "not resolved", too few prompts give no interval,
identical rounds make a speed difference a noise bound, the per-prompt values a decode log yields, and the speed
ratio of rotated timing rounds."""

import numpy as np
import pytest

from carryover_jax.eval import metrics as M
from carryover_jax.eval.paired import MIN_PROMPTS, paired_bootstrap
from carryover_jax.eval.report import render_markdown


def _coverage(trials, make, true_diff, replicates=1000):
    hits = 0
    for k in range(trials):
        a, b = make(np.random.default_rng(1000 + k))
        r = paired_bootstrap(a, b, replicates=replicates, seed=k)
        hits += r["diff_ci"][0] <= true_diff <= r["diff_ci"][1]
    return hits / trials


def test_bootstrap_covers_a_known_difference_about_95_percent():
    delta = 0.03

    def make(rng):  # 40 prompts: prompt difficulty shared by both arms, the arm's own noise on top
        base = rng.normal(1.4, 0.1, 40)
        return base + delta + rng.normal(0, 0.05, 40), base + rng.normal(0, 0.05, 40)

    cov = _coverage(300, make, delta)
    assert 0.91 <= cov <= 0.985, cov  # 0.92 here (the plain percentile interval: 0.90)


def test_bootstrap_over_seeds_and_prompts_covers_a_known_difference():
    delta = -0.05

    def make(rng):  # 3 seeds x 30 prompts, each (seed, prompt) pass its own noise
        base = rng.normal(1.4, 0.1, (1, 30))
        return (base + delta + rng.normal(0, 0.08, (3, 30)), base + rng.normal(0, 0.08, (3, 30)))

    cov = _coverage(200, make, delta)
    assert 0.91 <= cov <= 0.985, cov  # 0.95 here


def test_zero_difference_is_not_resolved_and_a_clear_one_is():
    rng = np.random.default_rng(0)
    b = rng.normal(1.4, 0.1, 30)
    same = paired_bootstrap(b, b)
    assert same["diff"] == 0 and same["diff_ci"] == [0.0, 0.0] and not same["resolved"]
    noise = paired_bootstrap(b + rng.normal(0, 0.05, 30) - 0.0, b + rng.normal(0, 0.05, 30))
    assert noise["diff_ci"][0] < 0 < noise["diff_ci"][1] and not noise["resolved"]
    clear = paired_bootstrap(b * 1.1, b)
    assert clear["resolved"] and clear["gain_pct"] == pytest.approx(10.0)
    assert 9.9 < clear["gain_pct_ci"][0] <= clear["gain_pct_ci"][1] < 10.1
    with pytest.raises(ValueError):
        paired_bootstrap(b, b[:10])


def test_too_few_prompts_gives_no_interval_and_the_minimum_covers():
    rng = np.random.default_rng(3)
    b = rng.normal(1.4, 0.1, MIN_PROMPTS)
    two = paired_bootstrap(b[:2] * 1.5, b[:2])  # every prompt 50% better: still no 95% statement on 2 prompts
    assert two["status"] == "too few prompts" and two["diff_ci"] is None and not two["resolved"]
    assert two["gain_pct"] == pytest.approx(50.0)
    assert paired_bootstrap(b[:-1] * 1.5, b[:-1])["status"] == "too few prompts"
    assert paired_bootstrap(b * 1.5, b)["status"] == "resolved"
    delta = 0.03

    def skewed(rng):  # the minimum's justification: right-skewed per-prompt differences still covered
        base = rng.normal(1.4, 0.1, MIN_PROMPTS)
        return base + delta + rng.exponential(0.05, MIN_PROMPTS) - 0.05, base

    assert 0.91 <= _coverage(300, skewed, delta) <= 0.985  # 0.94 here (0.87 at 6 prompts, 0.91 at 8)


def test_two_stage_timing_bootstrap_carries_the_repeats_spread():
    delta = 0.02

    def make(rng):  # per-prompt speedups, 3 timing repeats each with their own noise
        base = rng.normal(1.0, 0.05, (MIN_PROMPTS, 1))
        noise = rng.normal(0, 0.06, (2, 1, MIN_PROMPTS, 3))
        return base + delta + noise[0], base + noise[1]

    cov = _coverage(300, make, delta)
    assert cov >= 0.96, cov  # 0.99 here, conservative: the prompt means hold that spread too (0.94 without)
    a, b = make(np.random.default_rng(0))
    two, one = paired_bootstrap(a, b), paired_bootstrap(a.mean(axis=2), b.mean(axis=2))
    assert two["diff"] == pytest.approx(one["diff"]) and two["repeats"] == 3
    assert two["diff_ci"][1] - two["diff_ci"][0] > one["diff_ci"][1] - one["diff_ci"][0]


def test_weighted_tau_is_the_ratio_of_sums():
    rng = np.random.default_rng(1)
    rounds_a, rounds_b = rng.integers(5, 40, (2, 12)), rng.integers(5, 40, (2, 12))
    tokens = rng.integers(40, 60, (2, 12))
    r = paired_bootstrap(tokens / rounds_a, tokens / rounds_b, wa=rounds_a, wb=rounds_b)
    assert r["diff"] == pytest.approx(tokens.sum() / rounds_a.sum() - tokens.sum() / rounds_b.sum())
    assert r["gain_pct"] == pytest.approx(100 * (rounds_b.sum() / rounds_a.sum() - 1))


def _rec(mode, ds, prompt, T, seed, new_tokens, time_s, accepted=None):
    return {"mode": mode, "dataset": ds, "prompt": prompt, "temperature": T, "seed": seed, "new_tokens": new_tokens,
            "time_s": float(np.median(time_s)), "time_s_repeats": list(time_s),
            "rounds": None if accepted is None else len(accepted), "accepted": accepted,
            "matches_ar": None if accepted is None else True}


def test_summary_holds_per_prompt_values_and_every_pair():
    log = []
    n = MIN_PROMPTS + 2
    for i in range(n):
        p = f"p{i}"
        slow = [1.2, 1.0, 1.1] if i % 3 else [0.9, 1.3, 1.0]
        log += [_rec("ar", "a" if i < n - 2 else "b", p, 0.0, 0, 12, [1.2, 1.2, 1.2]),
                _rec("base", "a" if i < n - 2 else "b", p, 0.0, 0, 12, [0.6, 0.6, 0.6],
                     [1, 1, 1, 1, 2] if i % 2 else [2, 2, 2, 1]),
                # the same rounds as base, but timed slower: noise, not a loss
                _rec("ctrl", "a" if i < n - 2 else "b", p, 0.0, 0, 12, [x / 2 for x in slow],
                     [1, 1, 1, 1, 2] if i % 2 else [2, 2, 2, 1]),
                _rec("carry", "a" if i < n - 2 else "b", p, 0.0, 0, 12, [0.4, 0.42, 0.38], [3, 3, 2])]
    drafters = [{"label": lab, "carryover": lab == "carry", "num_proposals": 3, "path": lab}
                for lab in ("base", "ctrl", "carry")]
    s = M.summarize(log, drafters)
    paired = s["temperatures"]["0"]["paired"]
    assert paired["prompts"][:2] == [["a", "p0"], ["a", "p1"]] and paired["seeds"] == [0]
    # per-prompt τ = Σ(a + 1) / rounds; speedup = AR time/token over the arm's, per timing repeat
    assert paired["values"]["base"]["tau"][0][:2] == pytest.approx([11 / 4, 11 / 5])
    assert paired["values"]["carry"]["speedup_repeats"][0][0] == pytest.approx([1.2 / 0.4, 1.2 / 0.42, 1.2 / 0.38])
    assert paired["values"]["carry"]["speedup"][0][0] == pytest.approx(np.mean([1.2 / 0.4, 1.2 / 0.42, 1.2 / 0.38]))
    pairs = {(p["label"], p["vs"]): p["datasets"] for p in paired["pairs"]}
    assert set(pairs) == {("ctrl", "base"), ("carry", "base"), ("carry", "ctrl")}
    same = pairs[("ctrl", "base")]["all"]
    assert same["tau"]["diff"] == 0 and same["tau"]["status"] == "not resolved"
    assert same["speedup"]["status"] == "timing noise" and not same["speedup"]["resolved"]
    assert same["speedup"]["noise_bound_pct"] == max(abs(v) for v in same["speedup"]["gain_pct_ci"]) > 0
    better = pairs[("carry", "ctrl")]["all"]["tau"]
    micro_ctrl = 11 * n / (4 * (n // 2) + 5 * (n // 2))  # Σ tokens / Σ rounds: the τ table's number
    assert better["diff"] == pytest.approx(11 / 3 - micro_ctrl) and better["resolved"]
    assert better["diff"] == pytest.approx(s["temperatures"]["0"]["datasets"]["all"]["carry"]["tau"]
                                           - s["temperatures"]["0"]["datasets"]["all"]["ctrl"]["tau"])
    assert pairs[("carry", "ctrl")]["all"]["speedup"]["status"] == "resolved"
    assert pairs[("carry", "ctrl")]["b"]["tau"]["status"] == "too few prompts"  # dataset b: 2 prompts
    md = render_markdown({"drafters": drafters, "log": log, "summary": s})
    assert "### Paired comparisons" in md and f"| ctrl vs base | **all** | 0 | {n} x 1 | 3 |" in md
    assert "timing-noise bound" in md and "too few prompts (< 10)" in md and "not resolved" in md
    # one timing per prompt: an interval, but never resolved
    single = [{**r, "time_s_repeats": r["time_s_repeats"][:1]} for r in log]
    sp = M.summarize(single, drafters)["temperatures"]["0"]["paired"]["pairs"][1]["datasets"]["all"]["speedup"]
    assert sp["status"] == "one timing per prompt" and sp["diff_ci"][0] > 0 and not sp["resolved"]


def test_rotated_rounds_and_their_speed_ratio():
    """`bench.steps.rotated_seconds` times every call once a round, the order rotated round by round;
    `speed_ratio` gives b's speed over a's from the two lists, with an interval that holds the true ratio of a
    known 2x (times drawn with noise) and that spans 1 for a call against itself."""
    from carryover_jax.bench.steps import rotated_seconds
    from carryover_jax.eval.paired import speed_ratio

    order, seen = [], []
    calls = {k: (lambda k=k: order.append(k)) for k in "abc"}
    secs = rotated_seconds(calls, 4, lambda r, s: seen.append((r, {k: len(v) for k, v in s.items()})))
    assert order == list("abc" "bca" "cab" "abc")
    assert seen[-1] == (3, {"a": 4, "b": 4, "c": 4}) and all(len(v) == 4 for v in secs.values())
    rng = np.random.default_rng(0)
    slow = 2.0 + rng.normal(0, 0.05, 30)
    fast = 1.0 + rng.normal(0, 0.025, 30)
    x, lo, hi = speed_ratio(slow, fast)
    assert abs(x - 2.0) < 0.05 and lo < 2.0 < hi
    x, lo, hi = speed_ratio(fast, fast[::-1])
    assert lo < 1.0 < hi
    assert speed_ratio([1.0], [2.0])[1:] == (None, None)


def test_speedup_interval_is_the_reports_speedup_over_prompts():
    """`speedup_interval` bounds the report's speedup over AR (a ratio of summed times per summed tokens): a
    constant per-prompt speedup gives a point interval; noisy prompts give the interval of a slow bootstrap loop
    over the same statistic (widened a little by the expanded percentile); the report prints it at one seed; too
    few prompts timed in both give none."""
    from carryover_jax.eval.paired import expanded_tail, speedup_interval

    rng = np.random.default_rng(3)
    n = 40
    tokens = rng.integers(8, 64, n)
    ar_t = tokens * rng.uniform(0.018, 0.022, n) + rng.uniform(0.1, 0.3, n)  # a prompt's prefill, then its tokens
    # longer replies gain more (the prefill weighs less), so only the token-weighted statistic is the table's: an
    # unweighted mean of times per token would put the interval ~0.15 lower
    arm_t = ar_t / (0.8 + 1.2 * tokens / 64 + rng.normal(0, 0.1, n))

    def log_of(arm_times):
        return [r for i in range(n) for r in (
            _rec("ar", "a", f"p{i}", 0.0, 0, int(tokens[i]), [ar_t[i]] * 2),
            _rec("m", "a", f"p{i}", 0.0, 0, int(tokens[i]), [arm_times[i]] * 2, [1, 2, 0]))]

    assert speedup_interval(log_of(ar_t / 1.5), "m", 0.0) == pytest.approx([1.5, 1.5])
    log = log_of(arm_t)
    lo, hi = speedup_interval(log, "m", 0.0)
    point = ar_t.sum() / arm_t.sum()  # equal tokens: the ratio of the summed times
    drafters = [{"label": "m", "carryover": False, "num_proposals": 3, "path": "m"}]
    cell = M.summarize(log, drafters)["temperatures"]["0"]["datasets"]["all"]["m"]
    assert cell["speedup"] == pytest.approx(point) and cell["speedup_interval"] == [lo, hi]
    slow = np.random.default_rng(7)
    ratios = []
    for _ in range(4000):
        i = slow.integers(0, n, n)
        ratios.append(ar_t[i].sum() / arm_t[i].sum())
    tail = expanded_tail(n)
    ref_lo, ref_hi = np.percentile(ratios, [tail, 100 - tail])
    assert lo < point < hi and abs(lo - ref_lo) < 0.01 and abs(hi - ref_hi) < 0.01, (lo, hi, ref_lo, ref_hi)
    md = render_markdown({"drafters": drafters, "log": log, "summary": M.summarize(log, drafters)})
    assert f"| **all** | 0 | {point:.2f}x [{lo:.2f}, {hi:.2f}] |" in md
    few = [r for r in log if r["mode"] == "ar" or int(r["prompt"][1:]) < MIN_PROMPTS - 1]
    assert speedup_interval(few, "m", 0.0) is None
