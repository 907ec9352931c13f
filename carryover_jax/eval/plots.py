"""PNG plots of an eval result: τ per dataset per drafter, throughput vs batch, accepted-length
distributions, and (when present) the ON/OFF replay recall and re-convergence diagnostics and the attention to
carried rows (`attention.plot`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from carryover_jax.eval.report import summary_of


def write_plots(result: dict[str, Any], folder: str | Path) -> list[Path]:
    import matplotlib  # slow to import: only when plots are written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    summary = summary_of(result)
    labels = [d["label"] for d in result["drafters"]]
    temps = list(summary["temperatures"])
    written = []

    # τ per dataset per drafter (one panel per temperature; error bars = 95% CI over seeds)
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
    for ax, T in zip(axes[0], temps):
        cells = summary["temperatures"][T]["datasets"]
        names = list(cells)
        width = 0.8 / max(len(labels), 1)
        for k, lab in enumerate(labels):
            xs = [i + (k - (len(labels) - 1) / 2) * width for i in range(len(names))]
            ys = [cells[n][lab]["tau"] if lab in cells[n] else 0.0 for n in names]
            err = [(cells[n][lab].get("tau_ci") or 0.0) if lab in cells[n] else 0.0 for n in names]
            ax.bar(xs, ys, width, yerr=err if any(err) else None, label=lab, capsize=3)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("τ (accepted + 1 per round)")
        ax.set_title(f"τ per dataset, T = {T}")
        ax.legend()
    fig.tight_layout()
    written.append(_save(fig, folder / "tau.png"))

    # throughput vs batch
    tp = result.get("throughput") or []
    fig, ax = plt.subplots(figsize=(6, 4))
    if tp:
        bs = [r["batch"] for r in tp]
        ax.plot(bs, [r["ar"] for r in tp], "k--o", label="AR")
        for lab in labels:
            ax.plot(bs, [r[lab] for r in tp], "-o", label=lab)
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no throughput pass", ha="center", transform=ax.transAxes)
    ax.set_xlabel("batch")
    ax.set_ylabel("output tokens/s")
    ax.set_title("throughput (T = 0)")
    fig.tight_layout()
    written.append(_save(fig, folder / "throughput.png"))

    # distribution of accepted lengths (all datasets), per temperature
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
    for ax, T in zip(axes[0], temps):
        cell = summary["temperatures"][T]["datasets"].get("all", {})
        width = 0.8 / max(len(labels), 1)
        for k, lab in enumerate(labels):
            if lab not in cell:
                continue
            h = cell[lab]["accept_histogram"]
            n = max(sum(h), 1)
            ax.bar([a + (k - (len(labels) - 1) / 2) * width for a in range(len(h))], [c / n for c in h], width,
                   label=lab)
        ax.set_xlabel("accepted drafts per round (a)")
        ax.set_ylabel("fraction of rounds")
        ax.set_title(f"accepted lengths, T = {T}")
        ax.legend()
    fig.tight_layout()
    written.append(_save(fig, folder / "accept_lengths.png"))

    diag = result.get("diagnostics")
    if diag:
        replay, rc = diag.get("replay", {}), diag.get("reconvergence", {})
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))
        for lab, rep in replay.items():
            slots = range(1, len(rep["recall1_on"]) + 1)
            for key, style in (("recall1_on", "-o"), ("recall1_off", "--o"), ("recall16_on", "-s"),
                               ("recall16_off", "--s")):
                ys = [float("nan") if v is None else v for v in rep[key]]
                axes[0].plot(slots, ys, style, label=f"{lab} {key.replace('recall', 'R@').replace('_', ' ')}")
        axes[0].set_ylim(-0.02, 1.02)
        axes[1].set_ylim(-0.02, 1.02)
        for lab, rep in diag.get("replay_recorded", {}).items():
            c = rep["carried"]
            slots = range(1, len(c["recall1_on"]) + 1)
            for key, style in (("recall1_on", ":^"), ("recall1_off", ":v"), ("recall16_on", ":>"),
                               ("recall16_off", ":<")):
                ys = [float("nan") if v is None else v for v in c[key]]
                axes[0].plot(slots, ys, style, label=f"{lab} recorded {key.replace('recall', 'R@').replace('_', ' ')}")
        axes[0].set_xlabel("proposal slot")
        axes[0].set_ylabel("target-token recall")
        axes[0].set_title("ON/OFF replay (carried rows supplied vs withheld)")
        axes[0].legend(fontsize=7)
        for lab, r in rc.items():
            ys = [float("nan") if v is None else v for v in r["aligned_by_offset"]]
            axes[1].plot(range(1, len(ys) + 1), ys, "-o", label=f"{lab} (reappear {100 * r['reappear_rate']:.0f}%)")
        axes[1].set_xlabel("offset after the first rejected token")
        axes[1].set_ylabel("rejected token == committed token")
        axes[1].set_title("re-convergence of rejected branches")
        axes[1].legend(fontsize=7)
        fig.tight_layout()
        written.append(_save(fig, folder / "diagnostics.png"))
        if diag.get("attention"):
            from carryover_jax.eval.attention import plot as plot_attention

            plot_attention(diag["attention"], folder / "attention.png")
            written.append(folder / "attention.png")

    curve = result.get("curve")
    if curve:  # snapshots of one training run (`carryover eval --curve`)
        minutes = all(r["train_minutes"] is not None for r in curve)
        x = [r["train_minutes"] if minutes else r["step"] for r in curve]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(x, [r["tau"] for r in curve], "o-", label="τ (T = 0)")
        ax.plot(x, [r["speedup"] for r in curve], "s-", label="speedup over AR (batch 1)")
        off = [(xi, r["tau_offline"]) for xi, r in zip(x, curve) if "tau_offline" in r]
        if off:  # the exact offline τ of the same snapshots on many more rollouts
            n = next(r["offline_rollouts"] for r in curve if "tau_offline" in r)
            ax.plot(*zip(*off), "^--", label=f"τ offline ({n} rollouts, T = 0)")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        for xi, r in zip(x, curve):
            ax.annotate(f"step {r['step']}", (xi, r["tau"]), textcoords="offset points", xytext=(0, 5), fontsize=7)
        ax.set_xlabel("training minutes" if minutes else "training step")
        ax.set_title("τ and speedup against training time")
        ax.legend()
        fig.tight_layout()
        written.append(_save(fig, folder / "curve.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt  # loaded by write_plots, which calls this

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
