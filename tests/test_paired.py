"""Paired bootstrap of eval arms (eval/paired.py): coverage of a known difference on synthetic per-prompt
values, a zero difference reads "not resolved", and the per-prompt values a decode log yields."""

import numpy as np
import pytest

from carryover_jax.eval import metrics as M
from carryover_jax.eval.paired import paired_bootstrap
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


def _rec(mode, ds, prompt, T, seed, new_tokens, time_s, accepted=None):
    return {"mode": mode, "dataset": ds, "prompt": prompt, "temperature": T, "seed": seed, "new_tokens": new_tokens,
            "time_s": time_s, "rounds": None if accepted is None else len(accepted), "accepted": accepted,
            "matches_ar": None if accepted is None else True}


def test_summary_holds_per_prompt_values_and_every_pair():
    log = []
    for i in range(6):
        p = f"p{i}"
        log += [_rec("ar", "a", p, 0.0, 0, 12, 1.2),
                _rec("base", "a", p, 0.0, 0, 12, 0.6, [1, 1, 1, 1, 2] if i % 2 else [2, 2, 2, 1]),
                _rec("ctrl", "a", p, 0.0, 0, 12, 0.6, [1, 1, 1, 1, 2] if i % 2 else [2, 2, 2, 1]),
                _rec("carry", "a", p, 0.0, 0, 12, 0.4, [3, 3, 2])]
    drafters = [{"label": lab, "carryover": lab == "carry", "num_proposals": 3, "path": lab}
                for lab in ("base", "ctrl", "carry")]
    s = M.summarize(log, drafters)
    paired = s["temperatures"]["0"]["paired"]
    assert paired["prompts"][:2] == [["a", "p0"], ["a", "p1"]] and paired["seeds"] == [0]
    # per-prompt τ = Σ(a + 1) / rounds and speedup = AR time/token over the arm's
    assert paired["values"]["base"]["tau"][0][:2] == pytest.approx([11 / 4, 11 / 5])
    assert paired["values"]["carry"]["speedup"][0][0] == pytest.approx((1.2 / 12) / (0.4 / 12))
    pairs = {(p["label"], p["vs"]): p["datasets"] for p in paired["pairs"]}
    assert set(pairs) == {("ctrl", "base"), ("carry", "base"), ("carry", "ctrl")}
    same = pairs[("ctrl", "base")]["all"]["tau"]
    assert same["diff"] == 0 and not same["resolved"]
    better = pairs[("carry", "ctrl")]["a"]["tau"]
    mean_ctrl = np.mean([11 / 4, 11 / 5] * 3)
    assert better["diff"] == pytest.approx(11 / 3 - mean_ctrl) and better["resolved"]
    assert better["gain_pct"] == pytest.approx(100 * (11 / 3 / mean_ctrl - 1))
    md = render_markdown({"drafters": drafters, "log": log, "summary": s})
    assert "### Paired comparisons" in md and "| ctrl vs base | **all** | 0 | 6 x 1 |" in md
    assert "not resolved" in md
