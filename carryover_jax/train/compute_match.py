"""The equal-compute control: the control continuation trained for as many steps as DVD's training
compute buys, by measured step time on the same machine.

Rule: steps = round(DVD steps × t_dvd / t_control), never fewer than DVD's steps, where t_dvd and
t_control are the median wall-clock times of one training step of each, measured by `probe_step_times`:
both steps compiled (an untimed first call each), then timed alternately on the same first K batches of
the run's own data order, so machine load drifts hit both alike. DVD's step is timed with
`loss.off_metrics=False`: the carried-withheld draft-2 forward is a diagnostic (no gradient), not part of
what DVD training costs. Checkpointing, logging and snapshots are outside the timed calls. With gradient
accumulation (`grad_accum_steps` = k, the same in both) the timed calls are micro-steps: either step is k of
them, so their ratio is the steps' ratio.

Why measured time and not FLOPs: the two steps differ by a frozen-target forward over N·P verify
tokens (online) and a second drafter context pass; on this CPU XLA's small-matmul efficiency differs
between them, so counted FLOPs would not say what the control could have run in DVD's time. Why a probe
and not DVD's `metrics.jsonl`: its steps/s include the diagnostic forward and checkpoint saves, and it ran
at another time than the control (a shared machine's load changes by hours).

The compute control reuses the control's seed, starting drafter, data and anchors: for the steps DVD
takes it sees exactly DVD's batches (the same grain iterator from the same seed), then the batches that
follow in that order. Its learning-rate schedule spans its own steps (warmup ratio and cosine to 0 at
its end), as any run of that length would.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np

from carryover_jax.config import TrainConfig
from carryover_jax.errors import TrainingError
from carryover_jax.io import atomic_write_json
from carryover_jax.train.loop import BATCH_KEYS, build_drafter, micro_batch
from carryover_jax.train.pipeline import make_train_iter
from carryover_jax.train.sharding import LOGICAL_RULES, make_mesh, put_batch
from carryover_jax.train.step import (compile_step, drafter_shardings, init_state, make_optimizer, state_shardings,
                                      step_config, target_shardings)
from carryover_jax.train.store import open_store

RULE = ("steps = round(DVD steps × t_dvd / t_control) (at least DVD's steps); t = median step time of each, "
        "measured alternately on the same batches on this machine, DVD without its carried-withheld diagnostic")


def matched_steps(dvd_steps: int, dvd_step_s: float, control_step_s: float) -> int:
    """The equal-compute control's step count from the two measured step times (module docstring)."""
    if dvd_steps < 1:
        raise TrainingError(f"DVD steps must be >= 1, got {dvd_steps}")
    if not (dvd_step_s > 0 and control_step_s > 0 and np.isfinite(dvd_step_s) and np.isfinite(control_step_s)):
        raise TrainingError(f"step times must be positive and finite, got DVD {dvd_step_s} s, control "
                            f"{control_step_s} s")
    return max(dvd_steps, int(round(dvd_steps * dvd_step_s / control_step_s)))


def compute_control_config(control: TrainConfig, dvd_steps: int, probe: dict, *, out_dir: str,
                           name: str | None = None) -> TrainConfig:
    """The equal-compute control: `control` (same seed, data, starting drafter, anchors) for the matched
    number of steps, into `out_dir`; checkpoints and logs keep the control's cadence."""
    steps = matched_steps(dvd_steps, probe["dvd_s"], probe["control_s"])
    return control.replace(name=name or f"{control.name}-compute", steps=steps, epochs=None, out_dir=out_dir)


def probe_step_times(dvd: TrainConfig, control: TrainConfig, *, steps: int = 6,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Median seconds per training step of `dvd` (diagnostic off) and `control`, timed alternately on the
    first `steps` batches of their (shared) data order after one untimed compile call each."""
    from carryover_jax.loading import load_target

    if steps < 1:
        raise TrainingError(f"probe steps must be >= 1, got {steps}")
    if dvd.loss.mode != "dvd" or control.loss.mode != "control":
        raise TrainingError(f"probe_step_times compares a loss.mode=dvd and a loss.mode=control config, got "
                            f"{dvd.loss.mode} and {control.loss.mode}")
    dvd = dvd.with_loss(off_metrics=False)
    store = open_store(dvd.data.store, dvd.data.extra_stores)
    numerics = dvd.run_numerics()  # as `train` runs them
    target = load_target(dvd.target, numerics=numerics,
                         tokenizer=dvd.init_from is None and dvd.drafter.mask_token_id is None)
    mesh = make_mesh(dvd.mesh)
    local = micro_batch(dvd, mesh)  # with gradient accumulation: micro-steps, k of them per step of either run
    times: dict[str, list[float]] = {"dvd": [], "control": []}
    with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
        runs, tsh = {}, None
        for name, cfg in (("dvd", dvd), ("control", control)):
            dcfg, params = build_drafter(cfg, target, store)
            sc = step_config(cfg, target.cfg, dcfg, numerics=numerics)
            tsh = tsh or target_shardings(sc.target, mesh)
            opt = make_optimizer(cfg, max(cfg.steps, 1))
            ssh = state_shardings(init_state(params, opt, cfg.seed), drafter_shardings(sc.drafter, mesh,
                                                                                       cfg.mesh.shard_drafter), mesh)
            runs[name] = [sc, opt, ssh, jax.device_put(init_state(params, opt, cfg.seed), ssh), None]
        target_params = jax.device_put(target.params, tsh)
        it = make_train_iter(dvd.data, store, batch_size=local, seed=dvd.seed, process_index=jax.process_index(),
                             process_count=jax.process_count(), with_features=dvd.features == "store",
                             with_kv=dvd.reads_stored_kv)
        batches = [{k: np.asarray(v) for k, v in next(it).items() if k in BATCH_KEYS} for _ in range(steps + 1)]
        for i, full in enumerate(batches):
            for name in ("dvd", "control"):
                batch = full if name == "dvd" else {k: v for k, v in full.items() if k != "kv"}  # as its run reads
                sc, opt, ssh, state, fn = runs[name]
                if fn is None:
                    fn = compile_step(sc, opt, mesh, ssh, tsh, {k: v.ndim for k, v in batch.items()})
                    runs[name][4] = fn
                gb = put_batch(batch, mesh)
                t0 = clock()
                state, metrics = fn(state, target_params, gb)
                jax.block_until_ready((state, metrics))
                if i > 0:  # the first call of each compiles
                    times[name].append(clock() - t0)
                runs[name][3] = state
    dvd_s, control_s = statistics.median(times["dvd"]), statistics.median(times["control"])
    return {"dvd_s": dvd_s, "control_s": control_s, "ratio": dvd_s / control_s, "steps_timed": steps,
            "dvd_times": times["dvd"], "control_times": times["control"], "rule": RULE}


def dvd_total_steps(dvd: TrainConfig) -> int:
    """DVD's step count (its `epochs` resolved against its store, as `train` does)."""
    from carryover_jax.train.loop import total_steps

    if dvd.epochs is None:
        return dvd.steps
    return total_steps(dvd, len(open_store(dvd.data.store, dvd.data.extra_stores)))


def resolve_compute_control(control: TrainConfig, dvd: TrainConfig, out_dir: str | Path, *,
                            probe: Callable | None = None, log: Callable[[str], None] | None = None) -> TrainConfig:
    """The equal-compute control's TrainConfig: the step times from `<out_dir>/probe.json` when an earlier
    call measured them, else measured now (`probe(dvd, control)`, default `probe_step_times`) and kept
    there first (with the settings they were measured for: a probe of other settings is measured again)."""
    f = Path(out_dir) / "probe.json"
    dvd_steps = dvd_total_steps(dvd)
    key = {"dvd": dataclasses.asdict(dvd.with_loss(off_metrics=False)), "control": dataclasses.asdict(control)}
    info = json.loads(f.read_text()) if f.is_file() else None
    if info is None or info.get("settings") != json.loads(json.dumps(key)):
        (log or (lambda m: print(m, file=sys.stderr)))(
            "control_compute: timing a DVD step and a control step on this machine (the equal-compute rule)")
        info = dict((probe or probe_step_times)(dvd.with_loss(off_metrics=False), control))
        info["settings"] = key
        f.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(f, info)
    cfg = compute_control_config(control, dvd_steps, info, out_dir=str(out_dir))
    (log or (lambda m: print(m, file=sys.stderr)))(
        f"control_compute: DVD step {info['dvd_s']:.3f} s, control step {info['control_s']:.3f} s -> "
        f"{cfg.steps} control steps for DVD's {dvd_steps}")
    return cfg
