"""τ against training steps: the training batches' teacher-forced estimate (`tau_estimate` in metrics.jsonl, a
running median over 10 logged windows) and held-out τ (`carryover eval --offline` results, T = 0) for a
1,200-step and a 3,600-step run of the same recipe (or any runs: `--title` names the figure).
`python plot.py OUT.png [--title TEXT] RUN=metrics.jsonl ... --heldout RUN@STEP=results.json:label ...`"""
import json, statistics, sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

out, args = sys.argv[1], sys.argv[2:]
title = "Default recipe on 976 records: τ against steps"
if args[:1] == ["--title"]:
    title, args = args[1], args[2:]
split = args.index("--heldout") if "--heldout" in args else len(args)
fig, ax = plt.subplots(figsize=(7, 4.2))
colors = {}
for spec in args[:split]:
    run, _, path = spec.partition("=")
    rows = [json.loads(line) for line in open(path)]
    steps = [r["step"] for r in rows]
    tau = [statistics.median(r["tau_estimate"] for r in rows[max(0, i - 9): i + 1]) for i in range(len(rows))]
    (line,) = ax.plot(steps, tau, lw=1.2, label=f"{run}: training batches (teacher-forced estimate)")
    colors[run] = line.get_color()
for spec in args[split + 1:]:
    key, _, rest = spec.partition("=")
    run, _, step = key.partition("@")
    path, _, label = rest.rpartition(":")
    log = [e for e in json.load(open(path))["log"] if e["mode"] == label and e["temperature"] == 0]
    tau = sum(e["new_tokens"] - 1 for e in log) / sum(e["rounds"] for e in log)
    ax.scatter([int(step)], [tau], color=colors.get(run, "k"), marker="o", zorder=3)
    ax.annotate(f"{tau:.3f}", (int(step), tau), textcoords="offset points", xytext=(4, -12), fontsize=8)
ax.scatter([], [], color="k", marker="o", label="held-out τ (534 rollouts, T = 0), colour = run")
ax.set_xlabel("training step")
ax.set_ylabel("τ (tokens per round)")
ax.set_title(title)
ax.grid(alpha=0.3)
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(out, dpi=120)
print(out)
