"""PNG plots of a run's metrics.jsonl (loss terms, estimated tau, per-slot accept rates; for DVD runs also
draft 1's greedy tau, draft 2 with carried rows withheld, and the rejected-count distribution)."""

from __future__ import annotations

import json
from pathlib import Path

from carryover_jax.errors import CarryoverError
from carryover_jax.train.faults import metrics_lines_upto


def plot_metrics(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib  # slow to import: only when plots are written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    # metrics_lines_upto skips a line half-written by a killed run
    recs = [json.loads(l) for l in metrics_lines_upto(path, 1 << 62)] if path.exists() else []
    if not recs:
        raise CarryoverError(f"{path} has no metrics to plot")
    fig = metrics_figure(recs)
    out = Path(out) if out else run_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def metrics_figure(recs: list[dict]):
    """The figure of `plot_metrics` for metric records (one dict per logged step)."""
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in recs]
    dvd = "draft1/tau" in recs[0]
    fig, axes = plt.subplots(1, 4 if dvd else 3, figsize=(20 if dvd else 15, 4))
    for key in ("loss", "ce_loss", "l1_loss", "kl_loss", "off/ce_loss"):
        if key in recs[0]:
            axes[0].plot(steps, [r[key] for r in recs], label=key)
    axes[0].set_title("loss" + (" (draft 2; off/ = carried rows withheld)" if dvd else ""))
    axes[0].legend()
    for key, label in (("tau_estimate", "teacher-forced estimate"), ("off/tau_estimate", "estimate, carried withheld"),
                       ("draft1/tau", "draft 1, greedy")):
        if key in recs[0]:
            axes[1].plot(steps, [r[key] for r in recs], label=label)
    axes[1].set_title("tau")
    axes[1].legend()
    # a DVD run that logged draft 2 with the carried rows withheld compares per-slot top-1 accuracy,
    # the metric logged both ways; otherwise the per-slot accept rate
    off = recs[-1].get("off/top1_acc@slot")
    key = "top1_acc@slot" if off is not None or "accept_rate@slot" not in recs[-1] else "accept_rate@slot"
    last = recs[-1][key]
    axes[2].bar(range(len(last)), last, label="carried rows supplied" if off is not None else None)
    if off is not None:
        axes[2].plot(range(len(off)), off, "k.", label="carried rows withheld")
        axes[2].legend()
    axes[2].set_title(f"{key} at step {steps[-1]}")
    axes[2].set_xlabel("proposal slot")
    if dvd:  # how many rows draft 2 gets to see: the distribution of rejected counts at draft 1
        hist = recs[-1]["draft1/rejected_hist"]
        axes[3].bar(range(len(hist)), hist)
        axes[3].set_title(f"draft 1 rejected count P - a at step {steps[-1]}")
        axes[3].set_xlabel("rejected rows carried")
    for ax in axes[:2]:
        ax.set_xlabel("step")
    fig.tight_layout()
    return fig
