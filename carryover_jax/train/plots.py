"""PNG plots of a run's metrics.jsonl (loss terms, estimated tau, per-slot accept rates)."""

from __future__ import annotations

import json
from pathlib import Path


def plot_metrics(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    recs = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
    if not recs:
        from carryover_jax.errors import CarryoverError

        raise CarryoverError(f"{path} has no metrics to plot")
    steps = [r["step"] for r in recs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for key in ("loss", "ce_loss", "l1_loss"):
        if key in recs[0]:
            axes[0].plot(steps, [r[key] for r in recs], label=key)
    axes[0].set_title("loss")
    axes[0].legend()
    if "tau_estimate" in recs[0]:
        axes[1].plot(steps, [r["tau_estimate"] for r in recs])
    axes[1].set_title("estimated tau (teacher forced)")
    key = "accept_rate@slot" if "accept_rate@slot" in recs[0] else "top1_acc@slot"
    last = recs[-1][key]
    axes[2].bar(range(len(last)), last)
    axes[2].set_title(f"{key} at step {steps[-1]}")
    axes[2].set_xlabel("proposal slot")
    for ax in axes[:2]:
        ax.set_xlabel("step")
    fig.tight_layout()
    out = Path(out) if out else run_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
