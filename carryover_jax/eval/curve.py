"""τ and speedup against training time: the drafter snapshots of one training run (`snapshot_every`)
evaluated side by side as arms of one `carryover eval` (T = 0, the same prompts, AR timed in the
same run), joined with the run's own clock from `metrics.jsonl`. The rows go into the eval result
as `curve`, which the report renders as a table and `curve.png`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from carryover_jax.errors import CarryoverError
from carryover_jax.eval.report import summary_of


def snapshot_arms(run: str | Path) -> list[str]:
    """`LABEL=DIR` eval arms for every snapshot of a training run and its final drafter, by step."""
    run = Path(run)
    arms = [f"step{int(d.name.split('_')[1])}={d}" for d in sorted((run / "snapshots").glob("step_*"))
            if (d / "drafter_config.json").is_file()]
    final = run / "drafter"
    if (final / "drafter_config.json").is_file():
        cfg = json.loads((run / "train_config.json").read_text()) if (run / "train_config.json").is_file() else {}
        arms.append(f"step{_final_step(run, cfg)}={final}")
    if not arms:
        raise CarryoverError(f"{run}: no drafter snapshots (train with snapshot_every > 0) and no final drafter")
    return arms


def _final_step(run: Path, cfg: dict) -> int:
    steps = [r["step"] for r in _metrics(run)]
    return max(steps) if steps else int(cfg.get("steps", 0))


def _metrics(run: Path) -> list[dict]:
    f = run / "metrics.jsonl"
    rows = []
    if f.is_file():
        for line in f.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a half-written last line of a killed run
                continue
    return rows


def training_seconds(run: str | Path) -> dict[int, float]:
    """Step -> training seconds up to it, summed from the logged steps/s (resumes excluded: only the
    time spent stepping counts)."""
    total, last, out = 0.0, 0, {}
    for r in _metrics(Path(run)):
        if r.get("steps_per_s"):
            total += (r["step"] - last) / r["steps_per_s"]
        last = r["step"]
        out[r["step"]] = total
    return out


def offline_tau_by_step(offline: dict[str, Any]) -> dict[int, float]:
    """Step -> the exact offline τ (`carryover eval --offline`, T = 0, all datasets) of each snapshot arm."""
    cell = offline["summary"]["temperatures"].get("0", {}).get("datasets", {}).get("all", {})
    return {int(lab.removeprefix("step")): c["tau"] for lab, c in cell.items() if re.fullmatch(r"step\d+", lab)}


def curve_rows(result: dict[str, Any], run: str | Path, offline: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per snapshot arm: step, training minutes, τ and speedup over AR at T = 0 (all datasets), and
    with `offline` (an offline result on the same arms) `tau_offline` and the rollouts it was scored on."""
    secs = training_seconds(run)
    off = offline_tau_by_step(offline) if offline else {}
    n_off = sum(offline["config"]["datasets"].values()) if offline else None
    cells = summary_of(result)["temperatures"]
    t0 = cells.get("0", cells.get("0.0"))
    if t0 is None:
        raise CarryoverError("the training curve needs a T = 0 pass (--temperatures 0)")
    rows = []
    for d in result["drafters"]:
        if not re.fullmatch(r"step\d+", d["label"]):  # an arm given with --drafter besides the snapshots
            continue
        step = int(d["label"].removeprefix("step"))
        c = t0["datasets"]["all"][d["label"]]
        near = max((s for s in secs if s <= step), default=None)
        row = {"step": step, "train_minutes": round(secs[near] / 60, 2) if near is not None else None,
               "tau": c["tau"], "speedup": c["speedup"]}
        if step in off:
            row.update(tau_offline=off[step], offline_rollouts=n_off)
        rows.append(row)
    return sorted(rows, key=lambda r: r["step"])
