"""`carryover pipeline`: the main job as one resumable run into one folder.

prepare (target-regenerated responses) -> baseline training -> the baseline's τ/speed curve (its snapshots
at T = 0, batch 1) -> two continuations from the same baseline drafter (the equal-compute control and
Carryover DVD) -> eval of all arms side by side -> report.

Every stage writes `<out>/<stage>/stage.json` when it finishes; a rerun skips finished stages, and a
stage that was killed resumes inside itself (prepare and training resume from their stores and
checkpoints). The stage settings are written to `<out>/pipeline.json` on the first run; a rerun with
different settings is refused instead of mixing two runs in one folder.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from carryover_jax.config import TrainConfig, apply_overrides
from carryover_jax.configs import load_config
from carryover_jax.errors import ConfigError
from carryover_jax.eval.curve import curve_rows, snapshot_arms
from carryover_jax.eval.report import render_curve
from carryover_jax.eval.run import evaluate, load_result, write_outputs
from carryover_jax.io import atomic_write_json
from carryover_jax.loading import load_target
from carryover_jax.train.loop import train
from carryover_jax.train.responses import prepare_responses

# Presets: training overrides (all stages), continuation overrides (control and dvd), eval settings.
PRESETS: dict[str, dict[str, Any]] = {
    # a newcomer's first complete report, ~15 min on 2 CPU cores (a smoke run, not a converged drafter)
    "quick": {
        "train": {"data.max_prompts": 24, "data.max_new_tokens": 48, "steps": 60, "batch_size": 4,
                  "num_anchors": 16, "save_every": 30, "log_every": 5},
        "continue": {"steps": 16, "save_every": 8},
        "eval": {"datasets": ["sharegpt", "humaneval", "mtbench"], "prompts_per_dataset": 2, "max_new_tokens": 32,
                 "max_prompt_tokens": 256, "temperatures": [0.0], "seeds": 1, "batch_sizes": [1, 2], "max_len": 512,
                 "diagnostics": True, "diagnostic_prompts": 1},
    },
    # the reference run of docs/ (~2 h on 2 CPU cores): the config as it stands (configs/smollm2.py: 2,304
    # prompts, 2,400 baseline + 360 continuation steps)
    "full": {
        "train": {},
        "continue": {},
        "eval": {"datasets": ["sharegpt", "humaneval", "mtbench"], "prompts_per_dataset": 5, "max_new_tokens": 64,
                 "temperatures": [0.0, 1.0], "seeds": 2, "batch_sizes": [1, 4], "max_len": 1024,
                 "diagnostics": True, "diagnostic_prompts": 1},
    },
}


def stage_configs(config: str, out: Path, *, preset: str, overrides: list[str] = (),
                  continue_overrides: list[str] = ()) -> dict[str, TrainConfig]:
    """The baseline, control and DVD TrainConfigs of a pipeline rooted at `out`. Continuation settings
    (steps, lr, ...) come from the config's `STAGES["dvd"]` where it defines one, else 30% of the
    baseline steps; control and DVD differ only in `mode`."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    p = PRESETS[preset]
    sets = [f"{k}={v!r}" for k, v in p["train"].items()] + list(overrides)
    base = apply_overrides(load_config(config), sets)
    base = base.replace(data=dataclasses.replace(base.data, store=str(out / "data")), out_dir=str(out / "baseline"))
    try:
        stage = load_config(f"{config}:dvd")
        cont = {"steps": stage.steps, "epochs": stage.epochs, "lr": stage.lr, "warmup_ratio": stage.warmup_ratio,
                "save_every": stage.save_every}
    except ConfigError:
        cont = {"steps": max(1, (3 * base.steps) // 10), "epochs": None}
    cfgs = {"baseline": base}
    for mode in ("control", "dvd"):
        c = base.replace(name=f"{base.name}-{mode}", mode=mode, init_from=str(out / "baseline" / "drafter"),
                         out_dir=str(out / mode), **cont)
        sets = [f"{k}={v!r}" for k, v in p["continue"].items()] + list(continue_overrides)
        cfgs[mode] = apply_overrides(c, sets)
    return cfgs


def _done(out: Path, stage: str) -> dict | None:
    f = out / stage / "stage.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _finish(out: Path, stage: str, info: dict) -> dict:
    (out / stage).mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / stage / "stage.json", info)
    return info


def run_pipeline(config: str = "smollm2", out: str | Path = "runs/pipeline", *, preset: str = "quick",
                 overrides: list[str] = (), continue_overrides: list[str] = (), eval_overrides: dict | None = None,
                 progress: bool = True, log: Callable[[str], None] | None = None,
                 stop_after: str | None = None) -> dict[str, Any]:
    """Run (or resume) every stage; returns the report dict. `stop_after` ends the run after that stage
    (tests of resumption)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfgs = stage_configs(config, out, preset=preset, overrides=list(overrides),
                         continue_overrides=list(continue_overrides))
    ev = {**PRESETS[preset]["eval"], **(eval_overrides or {})}
    plan = {"config": config, "preset": preset, "eval": ev,
            "stages": {k: dataclasses.asdict(v) for k, v in cfgs.items()}}
    plan_file = out / "pipeline.json"
    if plan_file.is_file():
        old = json.loads(plan_file.read_text())
        if old != json.loads(json.dumps(plan)):
            raise ConfigError(f"{out} holds a pipeline with other settings ({plan_file}); use another --out")
    else:
        atomic_write_json(plan_file, plan)

    def stage(name, fn):
        info = _done(out, name)
        if info is not None:
            log(f"pipeline: {name}: done earlier, skipped")
            return info
        log(f"pipeline: {name} ...")
        t0 = time.time()
        info = fn()
        info["seconds"] = round(time.time() - t0, 1)
        _finish(out, name, info)
        log(f"pipeline: {name}: done in {info['seconds']:.0f} s")
        return info

    def should_stop(name):
        return stop_after == name

    base = cfgs["baseline"]
    target = None

    def get_target():
        nonlocal target
        if target is None:
            target = load_target(base.target, numerics=base.run_numerics(prepare=True))
        return target

    def prepare():
        st = prepare_responses(base.data, get_target(), progress=progress)
        return {"records": len(st), "tokens": st.num_tokens, "store": base.data.store}

    results = {"prepare": stage("prepare", prepare)}
    if should_stop("prepare"):
        return results
    def run_train(name):
        summary = train(cfgs[name], progress=progress)
        if not summary.get("finished"):
            raise ConfigError(f"stage {name} did not finish")
        return {**summary, "final_metrics": _last_metrics(Path(cfgs[name].out_dir))}

    def run_curve():
        # the eval's prompts, T = 0, batch 1 only: each snapshot costs one decoding pass, not the full eval
        run = out / "baseline"
        if not any((run / "snapshots").glob("step_*")):  # e.g. the quick preset: a curve of one point says nothing
            return {"skipped": "the baseline wrote no snapshots (snapshot_every)", "rows": []}
        kw = {k: v for k, v in ev.items() if k not in ("temperatures", "seeds", "batch_sizes", "diagnostics",
                                                       "diagnostic_prompts")}
        result = evaluate(get_target(), snapshot_arms(run), temperatures=[0.0], seeds=1, batch_sizes=[],
                          progress=progress, log=log, **kw)
        result["curve"] = curve_rows(result, run)
        write_outputs(result, out / "curve" / "result")
        return {"folder": str(out / "curve" / "result"), "rows": result["curve"]}

    for name in ("baseline", "curve", "control", "dvd"):
        results[name] = stage(name, run_curve if name == "curve" else lambda name=name: run_train(name))
        if should_stop(name):
            return results

    def run_eval():
        arms = [f"baseline={out / 'baseline' / 'drafter'}", f"control={out / 'control' / 'drafter'}",
                f"carryover={out / 'dvd' / 'drafter'}:carryover", f"dvd-nocarry={out / 'dvd' / 'drafter'}"]
        evaluate(get_target(), arms, out=out / "eval" / "result", progress=progress, log=log, **ev)
        return {"folder": str(out / "eval" / "result")}

    results["eval"] = stage("eval", run_eval)
    if should_stop("eval"):
        return results
    results["report"] = stage("report", lambda: write_report(out, results))
    return results


def _last_metrics(run_dir: Path) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").is_file() else []
    return json.loads(lines[-1]) if lines else {}


def _curve_section(curve: dict | None) -> list[str]:
    if not curve or not curve.get("rows"):
        return []
    return ["## The baseline's τ and speed against training time", "",
            "Its snapshots decoded at T = 0, batch 1, on the eval prompts (speedup over AR timed in the same run; "
            "`curve/result/curve.png`):", "", *render_curve(curve["rows"]), ""]


def write_report(out: Path, results: dict) -> dict:
    """`<out>/report.md` and `<out>/report.json`: the eval table (control and Carryover read against the
    baseline and against each other) plus what each training stage cost and reached."""
    ev = load_result(out / "eval" / "result")
    eval_md = (out / "eval" / "result" / "report.md").read_text()
    rows = []
    for name in ("baseline", "control", "dvd"):
        r = results[name]
        m = r.get("final_metrics", {})
        cells = [f"{m[k]:.3f}" if k in m else "-" for k in ("loss", "tau_estimate", "draft1/tau", "off/tau_estimate")]
        rows.append(f"| {name} | {r.get('steps', '-')} | {r.get('seconds', 0) / 60:.1f} | " + " | ".join(cells) + " |")
    prep = results["prepare"]
    md = [
        "# carryover pipeline report", "",
        f"Data: {prep.get('records', '?')} target-regenerated conversations, {prep.get('tokens', '?')} tokens "
        f"({prep.get('seconds', 0) / 60:.1f} min). Training stages (the last logged metrics; control and dvd "
        "continue the same baseline drafter for the same steps on the same batches and anchors; they differ only "
        "in the carried rows):", "",
        "| stage | steps | minutes | loss | τ estimate (teacher forced) | draft-1 τ (greedy, DVD step) "
        "| τ estimate, carried withheld |", "|---|---|---|---|---|---|---|", *rows, "",
        "Training curves: `baseline/metrics.png`, `control/metrics.png`, `dvd/metrics.png`.", "",
        *_curve_section(results.get("curve")),
        "## Decoding (carryover eval)", "",
        "Arms: `baseline` (the starting drafter), `control` (equal-compute continuation), `carryover` (the DVD "
        "drafter decoding with carried rows), `dvd-nocarry` (the same DVD drafter with carried rows withheld: "
        "what DVD training did apart from Carryover).", "",
        eval_md,
    ]
    (out / "report.md").write_text("\n".join(md))
    report = {"stages": {k: v for k, v in results.items() if k != "report"}, "eval": ev.get("summary", {})}
    atomic_write_json(out / "report.json", report)
    return {"report": str(out / "report.md")}
