"""`carryover pipeline`: the main job as one resumable run into one folder.

prepare (target-regenerated responses) -> baseline training -> the baseline's τ/speed curve (its snapshots
at T = 0, batch 1, decoded on the eval prompts, and their exact offline τ on many more rollouts) -> three
continuations from the same baseline drafter (Carryover DVD and its two controls without carried rows:
`control` for DVD's steps, `control_compute` for as many steps as DVD's training compute buys, measured on
this machine; `train/compute_match.py`) -> eval of all arms side by side -> report. The full preset is the
Carryover A/B instead (`_run_ab`): the same three continuations from several baseline snapshots, every arm scored
offline on shared rollouts, and Carryover's gain against each start's strength (`eval/strength.py`).

Every stage writes `<out>/<stage>/stage.json` when it finishes; a rerun skips finished stages, and a
stage that was killed resumes inside itself (prepare and training resume from their stores and
checkpoints). The stage settings are written to `<out>/pipeline.json` on the first run; a rerun with
different settings is refused instead of mixing two runs in one folder.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from carryover_jax.config import DrafterConfig, TrainConfig, apply_overrides
from carryover_jax.configs import ComputeMatched, load_config
from carryover_jax.errors import ConfigError
from carryover_jax.eval.curve import curve_rows, snapshot_arms
from carryover_jax.eval.offline import evaluate_offline
from carryover_jax.eval.report import render_curve
from carryover_jax.eval.run import evaluate, load_result, write_outputs
from carryover_jax.eval.paired import check_resolvable
from carryover_jax.eval.settings import check_settings
from carryover_jax.eval.strength import arm_label, plot_strength, render_strength, strength_rows
from carryover_jax.io import atomic_write_json
from carryover_jax.loading import load_target, target_config
from carryover_jax.train.loop import train
from carryover_jax.train.responses import prepare_responses
from carryover_jax.weights.hf import read_config
from carryover_jax.weights.registry import resolve_target

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
        "curve_offline": {"prompts_per_dataset": 4},
    },
    # the Carryover A/B (launch/carryover_ab.sh): one baseline with snapshots, then DVD and its controls continued
    # from several of them (`starts`: baseline steps, the final one first, so the main A/B finishes first), every
    # arm scored offline (exact greedy τ, eval/offline.py) on the same rollouts of every held-out prompt that fits
    # (290 ShareGPT + 164 HumanEval + 80 MT-Bench first turns = 534), Carryover's gain against each start's τ
    # (eval/strength.py). No decoded eval: speed comes from `carryover eval` (timed, interleaved) on its drafters.
    # Sized for <= 2.5 h on 2 CPU cores from an empty store; the stage times are in its report.
    "full": {
        "train": {"data.max_prompts": 1536, "steps": 1200, "snapshot_every": 300},
        "continue": {"steps": 120, "save_every": 60},
        "starts": [1200, 300, 600],
        "eval": {"datasets": ["sharegpt", "humaneval", "mtbench"], "prompts_per_dataset": 400, "max_new_tokens": 64,
                 "temperatures": [0.0], "seeds": 1, "batch_size": 16},
    },
    # the main job on one lent GPU (`--config smollm2_gpu`, launch/gpu_experiment.sh) inside a wall budget:
    # conversations, steps and eval prompts are not written here but planned from the rates the run measures
    # in its first seconds (carryover_jax/budget.py; `--dry-run` prints the plan); `train`/`continue` settings
    # the user passes still win over the plan's
    "gpu": {
        "train": {},
        "continue": {},
        "eval": {"datasets": ["sharegpt", "humaneval", "mtbench"], "prompts_per_dataset": 10, "max_new_tokens": 128,
                 "max_prompt_tokens": 256, "temperatures": [0.0, 1.0], "seeds": 2, "batch_sizes": [1, 8, 32],
                 "max_len": 1024, "diagnostics": True, "diagnostic_prompts": 2},
        "budget": {"wall_s": 420.0, "min_conversations": 10_000},
    },
}


def stage_configs(config: str, out: Path, *, preset: str, overrides: list[str] = (),
                  continue_overrides: list[str] = (), starts: list[int] | None = None) -> dict[str, TrainConfig]:
    """The baseline, control and DVD TrainConfigs of a pipeline rooted at `out`, and the equal-compute
    control (`ComputeMatched`: its steps are measured when the stage runs). Continuation settings (steps,
    lr, ...) come from the config's `STAGES["dvd"]` where it defines one, else 30% of the baseline steps;
    control and DVD differ only in `loss.mode`. A baseline trained with `loss.objective=edr` is continued with
    the block objective (EDR's rounds assume no carried rows, so DVD cannot train with it, and the control
    follows DVD). An A/B preset (one with `starts`; `starts` replaces its list) continues the trio from each start,
    into `from_<step>/<mode>`."""
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
        c = base.replace(name=f"{base.name}-{mode}", init_from=str(out / "baseline" / "drafter"),
                         out_dir=str(out / mode), **cont).with_loss(mode=mode, objective="ce")
        sets = [f"{k}={v!r}" for k, v in p["continue"].items()] + list(continue_overrides)
        cfgs[mode] = apply_overrides(c, sets)
    cfgs["control_compute"] = ComputeMatched(cfgs["control"], cfgs["dvd"], str(out / "control_compute"))
    if "starts" in p:  # the A/B: the same trio continued from each start
        trio = {m: cfgs.pop(m) for m in ("control", "dvd", "control_compute")}
        for step in check_starts(p["starts"] if starts is None else starts, base):
            src = start_drafter(out, step, base)
            for mode in ("control", "dvd"):
                cfgs[f"from_{step}/{mode}"] = trio[mode].replace(
                    name=f"{trio[mode].name}-from{step}", init_from=str(src), out_dir=str(out / f"from_{step}" / mode))
            cfgs[f"from_{step}/control_compute"] = ComputeMatched(
                cfgs[f"from_{step}/control"], cfgs[f"from_{step}/dvd"], str(out / f"from_{step}" / "control_compute"))
    return cfgs


def check_starts(starts: list[int], base: TrainConfig) -> list[int]:
    """The A/B's starting points: baseline steps the baseline leaves a drafter at (a snapshot every
    `snapshot_every` steps, the final drafter at `steps`); anything else is refused before the first stage."""
    if not starts or len(set(starts)) != len(starts):
        raise ConfigError(f"the A/B's starts must be distinct baseline steps, got {starts!r}")
    for s in starts:
        final = s == base.steps and not base.epochs
        if not isinstance(s, int) or isinstance(s, bool) or s < 1 or not (final or (
                base.snapshot_every and s % base.snapshot_every == 0 and s < base.steps)):
            raise ConfigError(f"A/B start {s!r}: the baseline leaves a drafter only at its final step ({base.steps}) "
                              f"and every snapshot_every={base.snapshot_every} steps before it")
    return list(starts)


def start_drafter(out: Path, step: int, base: TrainConfig) -> Path:
    """The baseline drafter at `step`: its final drafter or a snapshot."""
    return out / "baseline" / "drafter" if step == base.steps else out / "baseline" / "snapshots" / f"step_{step:06d}"


# the keywords the pipeline's stages give evaluate / evaluate_offline themselves (not eval settings)
PIPELINE_OWNED = {"target", "drafters", "out", "progress", "log", "rollouts"}


# ---- budgeted presets: measure, plan, then size the stages ---------------------------------------------
EVAL_ARMS = 5  # baseline, control-steps, control-compute, carryover, dvd-nocarry (run_eval)


def eval_passes(ev: dict) -> float:
    """Decoding passes the eval makes over each prompt: every arm and AR at each temperature (seeds at T > 0)
    and once more per throughput batch size, each of them timed `timing_repeats` times (eval/run.py), and the
    diagnostics' logged decode (once)."""
    from carryover_jax.eval.paired import TIMING_REPEATS  # run_eval's default

    temps = sum(1 if t == 0 else ev.get("seeds", 1) for t in ev.get("temperatures", [0.0]))
    timed = (EVAL_ARMS + 1) * (temps + len(ev.get("batch_sizes", []))) * ev.get("timing_repeats", TIMING_REPEATS)
    return timed + (EVAL_ARMS if ev.get("diagnostics") else 0)


def budget_plan(config: str, out: Path, *, preset: str, overrides: list[str], continue_overrides: list[str],
                ev: dict, wall_s: float | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The stage plan of a budgeted preset: `<out>/budget.json` when the run folder has one (a resumed run keeps
    its sizes), else the rates measured now on this device (`bench/probe.py`) planned into the budget."""
    from carryover_jax.bench.probe import probe_rates
    from carryover_jax.budget import Budget, plan_stages, render_plan

    f = out / "budget.json"
    if f.is_file():
        plan = json.loads(f.read_text())
        log("pipeline: budget plan from " + str(f))
        log(render_plan(plan))
        return plan
    spec = PRESETS[preset]["budget"]
    base = stage_configs(config, out, preset=preset, overrides=overrides, continue_overrides=continue_overrides)
    base = base["baseline"]
    log("pipeline: measuring this device's rates for the budget plan ...")
    target = load_target(base.target, numerics=base.run_numerics(prepare=True))
    rates, probe_s = probe_rates(base, target, eval_passes=eval_passes(ev))
    d = base.data
    budget = Budget(wall_s=float(wall_s if wall_s is not None else spec["wall_s"]), probe_s=probe_s,
                    # regenerated replies stop at their EOS: ~60% of the token cap per turn
                    tokens_per_conversation=0.6 * d.max_turns * d.max_new_tokens, batch_size=base.batch_size,
                    min_conversations=spec.get("min_conversations", 0), max_conversations=d.max_prompts,
                    eval_tokens_per_prompt=ev["max_new_tokens"], eval_datasets=len(ev["datasets"]))
    plan = plan_stages(rates, budget)
    plan["measured_on"] = {"probe_s": round(probe_s, 1)}
    atomic_write_json(f, plan)
    log(render_plan(plan))
    return plan


def planned_overrides(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan as stage overrides (the equal-compute control's steps are measured by its own stage)."""
    return {"train": [f"data.max_prompts={max(1, plan['conversations'])}", f"steps={plan['steps']['baseline']}",
                      "epochs=None"],
            "continue": [f"steps={plan['steps']['dvd']}", "epochs=None"],
            "eval": {"prompts_per_dataset": plan["eval_prompts_per_dataset"]}}


def _done(out: Path, stage: str) -> dict | None:
    f = out / stage / "stage.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _finish(out: Path, stage: str, info: dict) -> dict:
    (out / stage).mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / stage / "stage.json", info)
    return info


def run_pipeline(config: str = "smollm2", out: str | Path = "runs/pipeline", *, preset: str = "quick",
                 overrides: list[str] = (), continue_overrides: list[str] = (), eval_overrides: dict | None = None,
                 curve_overrides: dict | None = None, progress: bool = True,
                 log: Callable[[str], None] | None = None, stop_after: str | None = None,
                 budget_s: float | None = None, dry_run: bool = False,
                 starts: list[int] | None = None) -> dict[str, Any]:
    """Run (or resume) every stage; returns the report dict. `stop_after` ends the run after that stage
    (tests of resumption). A preset with a budget (`gpu`) first plans its stages from measured rates
    (`budget_plan`; `budget_s` replaces its wall budget); `dry_run` returns that plan and runs nothing."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    ev = {**PRESETS[preset]["eval"], **(eval_overrides or {})}
    if "budget" in PRESETS[preset]:
        planned = budget_plan(config, out, preset=preset, overrides=list(overrides),
                              continue_overrides=list(continue_overrides), ev=ev, wall_s=budget_s, log=log)
        if dry_run:
            return {"plan": planned}
        sized = planned_overrides(planned)
        overrides = sized["train"] + list(overrides)
        continue_overrides = sized["continue"] + list(continue_overrides)
        ev = {**ev, **sized["eval"], **(eval_overrides or {})}
    elif dry_run:
        raise ConfigError(f"--dry-run prints a budget plan: preset {preset!r} has no budget (try --preset gpu)")
    ab = "starts" in PRESETS[preset]
    if starts is not None and not ab:
        raise ConfigError(f"--starts: preset {preset!r} is not an A/B (the full preset is)")
    starts = list(PRESETS[preset]["starts"] if starts is None else starts) if ab else []
    cfgs = stage_configs(config, out, preset=preset, overrides=list(overrides),
                         continue_overrides=list(continue_overrides), starts=starts or None)
    co = {**PRESETS[preset].get("curve_offline", {}), **(curve_overrides or {})}
    # refused now, not when the stage that needs them comes after prepare's or the trainings' hours
    # the A/B's eval is the offline one; the other presets' is the decoded, timed one
    check_settings(ev, set(inspect.signature(evaluate_offline if ab else evaluate).parameters) - PIPELINE_OWNED,
                   what="--eval-set")
    if ab:  # an A/B that could resolve nothing: refused before prepare, not after the trainings' hours
        check_resolvable(ev.get("prompts_per_dataset", 100) * len(ev.get("datasets", ())),
                         "pipeline A/B: prompts_per_dataset x datasets")
    check_settings(co, set(inspect.signature(evaluate_offline).parameters) - PIPELINE_OWNED - {"temperatures", "seeds"},
                   what="curve_offline")  # the curve is scored at T = 0, one pass
    check_drafter_fits(cfgs["baseline"])
    plan = {"config": config, "preset": preset, "eval": ev, "curve_offline": co,
            "stages": {k: dataclasses.asdict(v) for k, v in cfgs.items()}}
    plan_file = out / "pipeline.json"
    if plan_file.is_file():
        old = json.loads(plan_file.read_text())
        if not same_plan(old, json.loads(json.dumps(plan))):
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
        arms = snapshot_arms(run)
        # the exact offline τ of every snapshot on many more rollouts (recorded once, `<out>/rollouts`)
        accepted = inspect.signature(evaluate_offline).parameters
        okw = {k: v for k, v in {**kw, **co}.items() if k in accepted}  # eval settings that apply, then its own
        offline = evaluate_offline(get_target(), arms, temperatures=[0.0], seeds=1, rollouts=out / "rollouts",
                                   out=out / "curve" / "offline", progress=progress, log=log, **okw)
        result = evaluate(get_target(), arms, temperatures=[0.0], seeds=1, batch_sizes=[],
                          progress=progress, log=log, **kw)
        result["curve"] = curve_rows(result, run, offline=offline)
        write_outputs(result, out / "curve" / "result")
        n = sum(offline["config"]["datasets"].values())
        return {"folder": str(out / "curve" / "result"), "offline_folder": str(out / "curve" / "offline"),
                "offline_rollouts": n, "rows": result["curve"]}

    def run_control_compute(name="control_compute"):
        cfg = cfgs[name].resolve(log=log)  # the step times: probed once, kept in probe.json
        summary = train(cfg, progress=progress)
        if not summary.get("finished"):
            raise ConfigError(f"stage {name} did not finish")
        probe = json.loads((Path(cfg.out_dir) / "probe.json").read_text())
        return {**summary, "final_metrics": _last_metrics(Path(cfg.out_dir)),
                "probe": {k: probe[k] for k in ("dvd_s", "control_s", "ratio", "steps_timed", "rule")}}

    if ab:
        return _run_ab(out, cfgs, ev, results, stage=stage, run_train=run_train, run_compute=run_control_compute,
                       get_target=get_target, starts=starts, progress=progress, log=log,
                       stop_after=stop_after)
    for name in ("baseline", "curve", "control", "dvd", "control_compute"):
        fn = {"curve": run_curve, "control_compute": run_control_compute}.get(name, lambda name=name: run_train(name))
        results[name] = stage(name, fn)
        if should_stop(name):
            return results

    def run_eval():
        arms = [f"baseline={out / 'baseline' / 'drafter'}", f"control-steps={out / 'control' / 'drafter'}",
                f"control-compute={out / 'control_compute' / 'drafter'}",
                f"carryover={out / 'dvd' / 'drafter'}:carryover", f"dvd-nocarry={out / 'dvd' / 'drafter'}"]
        evaluate(get_target(), arms, out=out / "eval" / "result", progress=progress, log=log, **ev)
        return {"folder": str(out / "eval" / "result")}

    results["eval"] = stage("eval", run_eval)
    if should_stop("eval"):
        return results
    results["report"] = stage("report", lambda: write_report(out, results))
    return results


def same_plan(old: Any, new: Any) -> bool:
    """Whether a rerun's plan is the folder's: equal, except that a settings field added to the library since the
    folder was started may appear unset (None) in the new plan only (so an upgrade does not strand a resumable run)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return (all(k in new and same_plan(v, new[k]) for k, v in old.items())
                and all(v is None for k, v in new.items() if k not in old))
    return old == new


def ab_arms(out: Path, starts: list[int], base: TrainConfig) -> list[str]:
    """The A/B's offline arms, `ARM@STEP` per start, Carryover last within each start (so every pair the offline
    eval compares reads Carryover against the others)."""
    arms = []
    for s in starts:
        f = out / f"from_{s}"
        arms += [f"{arm_label('baseline', s)}={start_drafter(out, s, base)}",
                 f"{arm_label('control-steps', s)}={f / 'control' / 'drafter'}",
                 f"{arm_label('control-compute', s)}={f / 'control_compute' / 'drafter'}",
                 f"{arm_label('dvd-nocarry', s)}={f / 'dvd' / 'drafter'}",
                 f"{arm_label('carryover', s)}={f / 'dvd' / 'drafter'}:carryover"]
    return arms


def _run_ab(out: Path, cfgs: dict, ev: dict, results: dict, *, stage, run_train, run_compute, get_target,
            starts: list[int], progress: bool, log, stop_after: str | None) -> dict[str, Any]:
    """The A/B's stages after prepare: the baseline, each start's trio (control, DVD, equal-compute control), the
    offline scores of every arm on shared rollouts, the gain-against-strength table and PNG, the report."""
    base = cfgs["baseline"]
    results["baseline"] = stage("baseline", lambda: run_train("baseline"))
    if stop_after == "baseline":
        return results
    for s in starts:
        for mode in ("control", "dvd", "control_compute"):
            name = f"from_{s}/{mode}"
            results[name] = stage(name, (lambda n=name: run_compute(n)) if mode == "control_compute"
                                  else (lambda n=name: run_train(n)))
            if stop_after == name:
                return results

    def run_offline():
        res = evaluate_offline(get_target(), ab_arms(out, starts, base), rollouts=out / "rollouts",
                               out=out / "offline", progress=progress, log=log, min_prompts=True, **ev)
        return {"folder": str(out / "offline"), "rollouts": sum(res["config"]["datasets"].values()),
                "datasets": res["config"]["datasets"]}

    results["offline"] = stage("offline", run_offline)
    if stop_after == "offline":
        return results

    def run_strength():
        summary = load_result(out / "offline")["summary"]
        temps = [float(t) for t in summary["temperatures"]]
        rows = {f"{t:g}": strength_rows(summary, starts, temperature=t) for t in temps}
        for t in temps:
            plot_strength(rows[f"{t:g}"], out / "strength" / f"strength-T{t:g}.png", temperature=t)
        atomic_write_json(out / "strength" / "strength.json", rows)
        return {"folder": str(out / "strength"), "rows": rows}

    results["strength"] = stage("strength", run_strength)
    results["report"] = stage("report", lambda: write_ab_report(out, results, starts))
    return results


def write_ab_report(out: Path, results: dict, starts: list[int]) -> dict:
    """`<out>/report.md` and `<out>/report.json` of the A/B: what each stage cost, the equal-compute rule as
    measured per start, Carryover's gain against each start's strength, and the offline eval's own report."""
    prep = results["prepare"]
    rows = [f"| prepare | - | {prep.get('seconds', 0) / 60:.1f} | {prep.get('records', '?')} conversations, "
            f"{prep.get('tokens', '?')} tokens |"]
    for name, r in results.items():
        if name in ("prepare", "report", "strength", "offline") or not isinstance(r, dict):
            continue
        m = r.get("final_metrics", {})
        note = ", ".join(f"{k} {m[k]:.3f}" for k in ("tau_estimate", "draft1/tau", "off/tau_estimate") if k in m)
        if r.get("probe"):
            p = r["probe"]
            note += (f"; DVD step {p['dvd_s']:.2f} s vs control {p['control_s']:.2f} s (x{p['ratio']:.2f}, medians of "
                     f"{p['steps_timed']} alternating steps)")
        rows.append(f"| {name} | {r.get('steps', '-')} | {r.get('seconds', 0) / 60:.1f} | {note} |")
    off = results.get("offline", {})
    rows.append(f"| offline eval | - | {off.get('seconds', 0) / 60:.1f} | {off.get('rollouts', '?')} rollouts "
                f"({', '.join(f'{k} {v}' for k, v in off.get('datasets', {}).items())}), every arm |")
    total = sum(r.get("seconds", 0) for r in results.values() if isinstance(r, dict))
    strength = results.get("strength", {}).get("rows", {})
    md = ["# Carryover A/B report", "",
          "One baseline drafter trained with snapshots; from each start (a baseline step), DVD training (Carryover) "
          "and its two controls continue the same drafter on the same batches and anchors: `control-steps` for "
          "DVD's steps without carried rows, `control-compute` for as many steps as DVD's measured training time "
          "buys. `dvd-nocarry` is the DVD drafter decoding with its carried rows withheld. Every arm is scored by "
          "the exact offline evaluator on the same rollouts (`offline/`).", "",
          "| stage | steps | minutes | notes |", "|---|---|---|---|", *rows, "",
          f"Total: {total / 60:.1f} min.", ""]
    for t, trows in strength.items():
        md += ["## Carryover's gain against the strength of its start", "", *render_strength(trows, temperature=float(t)),
               "", f"![gain against strength](strength/strength-T{t}.png)", ""]
    md += ["## Offline scores", "", (out / "offline" / "report.md").read_text()]
    (out / "report.md").write_text("\n".join(md))
    atomic_write_json(out / "report.json", {"stages": {k: v for k, v in results.items() if k != "report"},
                                            "starts": starts, "strength": strength})
    return {"report": str(out / "report.md")}


def check_drafter_fits(cfg: TrainConfig) -> None:
    """The fresh drafter of `cfg` built against its target's config alone (no weights, no tokenizer), so a spec
    the target cannot take (a feature layer past its depth, ...) is one error before the stages start. The MASK
    row stands in when the spec leaves it to the target's tokenizer; the baseline's own build checks that one."""
    if cfg.init_from:
        return
    folder = resolve_target(cfg.target)
    DrafterConfig.for_target(target_config(folder, read_config(folder)), cfg.drafter, default_mask_token_id=0)


def _last_metrics(run_dir: Path) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").is_file() else []
    return json.loads(lines[-1]) if lines else {}


def _curve_section(curve: dict | None) -> list[str]:
    if not curve or not curve.get("rows"):
        return []
    n = curve.get("offline_rollouts")
    off = (f" The offline τ is the exact greedy τ of the same snapshots on {n} held-out rollouts of the target "
           "(`carryover eval --offline`, `curve/offline/`)." if n else "")
    return ["## The baseline's τ and speed against training time", "",
            "Its snapshots decoded at T = 0, batch 1, on the eval prompts (speedup over AR timed in the same run; "
            f"`curve/result/curve.png`).{off}", "", *render_curve(curve["rows"]), ""]


def write_report(out: Path, results: dict) -> dict:
    """`<out>/report.md` and `<out>/report.json`: the eval table (control and Carryover read against the
    baseline and against each other) plus what each training stage cost and reached."""
    ev = load_result(out / "eval" / "result")
    eval_md = (out / "eval" / "result" / "report.md").read_text()
    rows = []
    names = {"baseline": "baseline", "control": "control (equal steps)", "control_compute": "control (equal compute)",
             "dvd": "dvd (Carryover)"}
    for name in ("baseline", "control", "control_compute", "dvd"):
        r = results.get(name)
        if r is None:
            continue
        m = r.get("final_metrics", {})
        cells = [f"{m[k]:.3f}" if k in m else "-" for k in ("loss", "tau_estimate", "draft1/tau", "off/tau_estimate")]
        rows.append(f"| {names[name]} | {r.get('steps', '-')} | {r.get('seconds', 0) / 60:.1f} | "
                    + " | ".join(cells) + " |")
    probe = results.get("control_compute", {}).get("probe")
    rule = ([f"The equal-compute control's steps: {probe['rule']}. Measured here: a DVD step {probe['dvd_s']:.2f} s, "
             f"a control step {probe['control_s']:.2f} s (x{probe['ratio']:.2f}, medians of {probe['steps_timed']} "
             "alternating steps), so the control trains "
             f"{results['control_compute'].get('steps', '?')} steps for DVD's {results['dvd'].get('steps', '?')}; "
             "it sees DVD's batches for the steps they share, then the ones that follow in the same order.", ""]
            if probe else [])
    prep = results["prepare"]
    md = [
        "# carryover pipeline report", "",
        f"Data: {prep.get('records', '?')} target-regenerated conversations, {prep.get('tokens', '?')} tokens "
        f"({prep.get('seconds', 0) / 60:.1f} min). Training stages (the last logged metrics; the controls and dvd "
        "continue the same baseline drafter on the same batches and anchors; the equal-steps control differs from "
        "dvd only in the carried rows, the equal-compute control also in its step count):", "",
        "| stage | steps | minutes | loss | τ estimate (teacher forced) | draft-1 τ (greedy, DVD step) "
        "| τ estimate, carried withheld |", "|---|---|---|---|---|---|---|", *rows, "", *rule,
        "Training curves: `baseline/metrics.png`, `control/metrics.png`, `control_compute/metrics.png`, "
        "`dvd/metrics.png`.", "",
        *_curve_section(results.get("curve")),
        "## Decoding (carryover eval)", "",
        "Arms: `baseline` (the starting drafter), `control-steps` (the continuation without carried rows for DVD's "
        "steps), `control-compute` (the same for as many steps as DVD's training time buys), `carryover` (the DVD "
        "drafter decoding with carried rows), `dvd-nocarry` (the same DVD drafter with carried rows withheld: "
        "what DVD training did apart from Carryover). Read Carryover against both controls in the paired "
        "comparisons.", "",
        eval_md,
    ]
    (out / "report.md").write_text("\n".join(md))
    report = {"stages": {k: v for k, v in results.items() if k != "report"}, "eval": ev.get("summary", {})}
    atomic_write_json(out / "report.json", report)
    return {"report": str(out / "report.md")}
