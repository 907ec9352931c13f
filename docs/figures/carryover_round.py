"""Draws docs/figures/carryover-round.png: one speculative decoding round with Carryover, as the engine runs it
(`carryover_jax/decode/speculative.py`), for P = 7 proposals of which a = 3 are accepted.

    python docs/figures/carryover_round.py [--out docs/figures/carryover-round.png]

A schematic: the tokens are symbols, not a recorded round. The layout is the engine's: the verify pass runs on
[anchor, d_1..d_P] at positions t..t+P; verify index i holds the target's features at position t+i; indices 0..a
go to the drafter's context cache, indices a+1..P become the carried rows (fused, + e_rej), and carried row j sits
at position t+a+1+j, the position of the next round's block slot j.
"""

from __future__ import annotations

import argparse
from pathlib import Path

P, A = 7, 3  # proposals, accepted
GREEN, RED, BLUE, GREY, ORANGE, WHITE = "#cdebc5", "#f6c6c3", "#cfe0f7", "#e6e6e6", "#fbe0b8", "#ffffff"


def draw(out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    fig, ax = plt.subplots(figsize=(12, 5.4), dpi=110)
    ax.set_xlim(-2.6, 2 * P - 1.5)
    ax.set_ylim(-0.9, 5.7)
    ax.axis("off")

    def box(x, y, text, color, *, w=0.92, h=0.6, size=10):
        ax.add_patch(Rectangle((x - w / 2, y - h / 2), w, h, facecolor=color, edgecolor="#555555", linewidth=1))
        ax.text(x, y, text, ha="center", va="center", fontsize=size)

    def label(y, text):
        ax.text(-2.5, y, text, ha="left", va="center", fontsize=10, fontweight="bold")

    def note(x, y, text, **kw):
        ax.text(x, y, text, fontsize=8.5, va="center", **kw)

    def arrow(x0, y0, x1, y1, color="#444444"):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=11, color=color,
                                     linewidth=1, shrinkA=1, shrinkB=1))

    for i in range(A + 1 + P + 1):  # column i = position t+i
        ax.text(i, 5.45, f"t+{i}" if i else "t", ha="center", fontsize=8, color="#777777")

    # 1. draft: the block [x, MASK ...] -> proposals d_1..d_P
    label(4.9, "1  draft")
    box(0, 4.9, "x", WHITE)
    for i in range(1, P + 1):
        box(i, 4.9, f"d{i}", BLUE)
    note(P + 0.7, 4.9, "the drafter fills the block [x, MASK, ...]; it attends to its\n"
         "context cache and to the previous round's carried rows")

    # 2. verify: one target pass over [x, d_1..d_P]; the longest matching prefix is accepted, then the correction y
    label(3.7, "2  verify")
    box(0, 3.7, "x", WHITE)
    for i in range(1, P + 1):
        box(i, 3.7, f"d{i} ✓" if i <= A else f"d{i} ✗", GREEN if i <= A else RED)
        arrow(i, 4.58, i, 4.02)
    note(P + 0.7, 3.7, f"the target, one pass over {P + 1} tokens: a = {A} accepted;\n"
         f"committed: d1..d{A} and the target's correction y at t+{A + 1}")

    # 3. the pass's features: rows 0..a -> the drafter's context cache, rows a+1..P -> the carried rows
    label(2.5, "3  features")
    for i in range(P + 1):
        box(i, 2.5, f"h{i}", GREEN if i <= A else RED, h=0.55, size=9)
        arrow(i, 3.38, i, 2.8)
    note(-0.45, 1.85, f"rows 0..{A}: fused into the drafter's\ncontext cache (committed)")
    note(P + 0.7, 2.5, f"rows {A + 1}..{P}: fused + e_rej = the carried rows,\nrejected_count = {P - A}")

    # 4. the next round: block [y, MASK ...] from t+a+1; carried row j sits at the position of block slot j
    label(0.35, "4  next draft")
    base = A + 1
    for j in range(P - A):
        box(base + j, 1.05, f"c{j}", RED, h=0.42, size=8.5)
        arrow(base + j, 2.22, base + j, 1.27, color="#b03030")
    for j in range(P + 1):
        box(base + j, 0.35, "y" if j == 0 else "M", ORANGE if j == 0 else GREY, h=0.5, size=9)
    note(base + P - A - 0.4, 1.05, f"  carried rows [B, {P}, d]: row j visible iff j < {P - A}; live for one round")
    note(-0.45, 0.35, f"context cache:\npositions < t+{A + 1}")
    ax.text(P / 2 + 2.5, -0.6, "The carried rows never enter a KV cache; with Carryover off (or rejected_count = 0) "
            "the drafter is the baseline's bit for bit.", ha="center", fontsize=8.5, color="#444444")
    ax.set_title(f"One speculative decoding round with Carryover: P = {P} proposals, a = {A} accepted (schematic)",
                 fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("carryover-round.png"))
    print(draw(ap.parse_args().out))
