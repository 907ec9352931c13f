"""Carryover's gain against the strength of the drafter it starts from.

The A/B (`carryover pipeline --preset full`) continues several snapshots of one baseline, each with DVD training
and its two controls, and scores every arm offline on the same rollouts. Arms are labelled `ARM@STEP` (STEP: the
baseline step the continuation started from). Here each start becomes one row: the starting drafter's τ and
Carryover's paired τ gain over the equal-steps control, the equal-compute control, the same DVD drafter with its
carried rows withheld, and the starting drafter itself; then a table and a PNG with the paper's pairs beside ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

# Arms of one start, in the order they are scored (offline eval labels ARM@STEP).
ARMS = ("baseline", "control-steps", "control-compute", "dvd-nocarry", "carryover")
# What Carryover is read against, and the column names of the table.
AGAINST = {"control-steps": "vs equal-steps control", "control-compute": "vs equal-compute control",
           "dvd-nocarry": "vs DVD, carried rows withheld", "baseline": "vs its starting drafter"}

# The paper's Table 1 (Qwen3-4B, DFlash, 15 proposals, H200): (dataset, T, baseline τ, Carryover τ gain %), the rows
# the paper's text gives in full. Plotted for reference only: another target, drafter size and proposal count.
PAPER_TABLE1 = (
    ("HumanEval", 0.0, 4.89, 9.0), ("Math", 0.0, 5.96, 9.2), ("MT-Bench", 0.0, 3.45, 9.1), ("QA", 0.0, 3.03, 7.7),
    ("HumanEval", 1.0, 4.22, 7.4), ("Math", 1.0, 5.31, 6.1), ("MT-Bench", 1.0, 2.98, 6.5), ("QA", 1.0, 2.61, 8.9),
)


def arm_label(arm: str, start: int) -> str:
    return f"{arm}@{start}"


def _pair(pairs: list[dict], a: str, b: str) -> tuple[dict | None, float]:
    """The comparison of a against b (sign +1), or b against a read backwards (sign -1)."""
    for p in pairs:
        if p["label"] == a and p["vs"] == b:
            return p, 1.0
        if p["label"] == b and p["vs"] == a:
            return p, -1.0
    return None, 1.0


def _signed(cmp: dict | None, sign: float) -> dict | None:
    """A paired comparison's τ gain in % of the reference arm, its interval and verdict, as `a` against `b`.
    Read backwards (b against a) the ratio inverts: gain' = 100 / (1 + g/100) - 100, interval ends swapped."""
    if cmp is None:
        return None
    g, ci = cmp["gain_pct"], cmp.get("gain_pct_ci")
    if sign < 0:
        flip = lambda x: 100.0 / (1.0 + x / 100.0) - 100.0  # noqa: E731
        g, ci = flip(g), None if ci is None else [flip(ci[1]), flip(ci[0])]
    return {"gain_pct": g, "gain_pct_ci": ci, "resolved": bool(cmp.get("resolved")), "status": cmp.get("status"),
            "prompts": cmp.get("prompts")}


def strength_rows(summary: dict[str, Any], starts: Sequence[int], *, temperature: float = 0.0,
                  dataset: str = "all") -> list[dict[str, Any]]:
    """One row per start (in increasing starting τ): the start's step, its drafter's τ, every arm's τ, and
    Carryover's paired gain against each arm of AGAINST. `summary`: an offline result's `summary`."""
    t = summary["temperatures"].get(f"{float(temperature):g}")
    if t is None:
        raise ValueError(f"no offline scores at T = {temperature:g}")
    cells, pairs = t["datasets"].get(dataset, {}), t["paired"]["pairs"]
    rows = []
    for s in starts:
        lab = {a: arm_label(a, s) for a in ARMS}
        if lab["baseline"] not in cells or lab["carryover"] not in cells:
            continue
        row = {"start_step": int(s), "tau": {a: cells[lab[a]]["tau"] for a in ARMS if lab[a] in cells},
               "rollouts": cells[lab["carryover"]]["rollouts"], "gain": {}}
        row["baseline_tau"] = row["tau"]["baseline"]
        for other in AGAINST:
            p, sign = _pair(pairs, lab["carryover"], lab[other])
            row["gain"][other] = _signed(p and p["datasets"].get(dataset, {}).get("tau"), sign)
        rows.append(row)
    return sorted(rows, key=lambda r: r["baseline_tau"])


def _cell(g: dict | None) -> str:
    if g is None:
        return "-"
    if g.get("gain_pct_ci") is None:
        return f"{g['gain_pct']:+.1f}% ({g.get('status') or 'no interval'})"
    lo, hi = g["gain_pct_ci"]
    return f"{g['gain_pct']:+.1f}% [{lo:+.1f}%, {hi:+.1f}%]" + (", resolved" if g["resolved"] else "")


def render_strength(rows: list[dict[str, Any]], *, temperature: float = 0.0) -> list[str]:
    """The gain-against-strength table as Markdown lines."""
    head = ["start (baseline step)", "rollouts", "starting τ", "Carryover τ"] + list(AGAINST.values())
    lines = [f"Carryover's τ gain (paired, 95%) by the strength of the drafter it continues, T = {temperature:g}:", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['start_step']} | {r['rollouts']} | {r['baseline_tau']:.3f} | {r['tau']['carryover']:.3f} | "
                     + " | ".join(_cell(r["gain"].get(o)) for o in AGAINST) + " |")
    return lines


def plot_strength(rows: list[dict[str, Any]], path: str | Path, *, temperature: float = 0.0) -> Path:
    """Carryover's gain over each control against the starting drafter's τ (ours, with 95% intervals), and the
    paper's Table 1 pairs (Carryover vs its baseline) on the same axes, marked as the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    styles = {"control-steps": ("o", "C0"), "control-compute": ("s", "C1"), "dvd-nocarry": ("^", "C2"),
              "baseline": ("D", "C3")}
    for k, (i, other) in enumerate(styles.items()):
        pts = [(r["baseline_tau"], r["gain"][i]) for r in rows if r["gain"].get(i)]
        if not pts:
            continue
        x = [p[0] + 0.004 * (k - 1.5) for p in pts]  # side by side at the same start
        y = [g["gain_pct"] for _, g in pts]
        lo = [g["gain_pct"] - (g["gain_pct_ci"] or [g["gain_pct"]] * 2)[0] for _, g in pts]
        hi = [(g["gain_pct_ci"] or [g["gain_pct"]] * 2)[1] - g["gain_pct"] for _, g in pts]
        ax.errorbar(x, y, yerr=[lo, hi], fmt=other[0] + "-", color=other[1], capsize=3, ms=5,
                    label=f"ours: Carryover {AGAINST[i]}")
    paper = [p for p in PAPER_TABLE1 if p[1] == temperature] or list(PAPER_TABLE1)
    ax.scatter([p[2] for p in paper], [p[3] for p in paper], marker="x", color="0.35", zorder=3,
               label="paper's Table 1 (Qwen3-4B DFlash, 15 proposals): vs its baseline")
    for name, _, tau, gain in paper:
        ax.annotate(name, (tau, gain), textcoords="offset points", xytext=(4, 3), fontsize=7, color="0.35")
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_xscale("log")
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    ax.xaxis.set_major_locator(FixedLocator([1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 6.0]))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("starting drafter's τ (log scale)")
    ax.set_ylabel("Carryover τ gain, % (95% interval)")
    ax.set_title(f"Carryover's gain against the baseline's strength, T = {temperature:g}")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
