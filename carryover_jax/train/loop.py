"""`carryover train`: the training loop around the sharded step — data, checkpoints, metrics, export."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from tqdm import tqdm

from carryover_jax.config import DrafterConfig, TrainConfig
from carryover_jax.errors import CarryoverError, ConfigError
from carryover_jax.io import atomic_write_json, exclusive
from carryover_jax.loading import default_mask_token_id, load_drafter, load_target
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params, with_draft_head
from carryover_jax.train.checkpoint import Checkpointer, abstract_like
from carryover_jax.train.faults import (
    FiniteGuard, StopSignal, check_disk_space, metrics_lines_upto, prepare_out_dir, save_before_stop,
)
from carryover_jax.train.distributed import is_main, maybe_initialize
from carryover_jax.train.pipeline import make_train_iter
from carryover_jax.train.sharding import BATCH, LOGICAL_RULES, make_mesh, put_batch
from carryover_jax.train.step import (
    compile_step, drafter_shardings, init_state, lr_schedule, make_optimizer, state_shardings, step_config,
    target_shardings,
)
from carryover_jax.train.store import open_store
from carryover_jax.train.vocab import draft_vocabulary, token_counts
from carryover_jax.weights.drafter_formats import drafter_config_to_dict, save_drafter

BATCH_KEYS = ("input_ids", "loss_mask", "features", "last_hidden", "target_lse", "kv")


def build_drafter(cfg: TrainConfig, target, store=None):
    """Fresh drafter from `cfg.drafter`, or a checkpoint to continue (`cfg.init_from`), under the
    target's numerics (its params in the drafter param dtype). A draft vocabulary is chosen from the
    response store (`store`, else `cfg.data.store`)."""
    if cfg.init_from:
        d = load_drafter(cfg.init_from, carryover=cfg.drafter.carryover, carry_module=cfg.drafter.carry_module,
                         target=target)
        return d.cfg, d.params
    default = None if cfg.drafter.mask_token_id is not None else default_mask_token_id(target)
    vocab = ()
    if cfg.drafter.draft_vocab_size:
        if store is None:
            store = open_store(cfg.data.store, cfg.data.extra_stores)
        counts = token_counts(store, target.cfg.vocab_size)
        vocab, coverage = draft_vocabulary(counts, cfg.drafter.draft_vocab_size, tuple(target.stop_token_ids))
        if is_main():
            print(f"train: draft vocabulary of {len(vocab)} tokens covers {coverage:.1%} of the supervised "
                  "response tokens", file=sys.stderr)
    dcfg = DrafterConfig.for_target(target.cfg, cfg.drafter, default_mask_token_id=default, draft_vocab=vocab)
    params = init_drafter_params(dcfg, jax.random.key(cfg.seed))
    return dcfg, with_draft_head(dcfg, params, frozen_from_target(target.params, target.cfg))


def total_steps(cfg: TrainConfig, num_records: int) -> int:
    if cfg.epochs is None:
        return cfg.steps
    per_epoch = num_records // cfg.batch_size
    if per_epoch < 1:
        raise CarryoverError(f"{num_records} records cannot fill one batch of {cfg.batch_size}")
    return cfg.epochs * per_epoch


def micro_batch(cfg: TrainConfig, mesh) -> int:
    """Sequences per process of one micro-step: batch_size / grad_accum_steps (the whole batch without
    accumulation) over the processes, which must also split over the mesh's batch axes."""
    micro = cfg.batch_size // cfg.grad_accum_steps
    shards = int(np.prod([mesh.shape[a] for a in BATCH]))
    if micro % shards:
        what = f"batch_size / grad_accum_steps = {micro}" if cfg.grad_accum_steps > 1 else f"batch_size {micro}"
        raise ConfigError(f"{what} sequences do not split over the mesh's data x fsdp = {shards} devices")
    if micro % jax.process_count():
        raise CarryoverError(f"{micro} sequences per micro-step do not split over {jax.process_count()} processes")
    return micro // jax.process_count()


# an optimizer step's metrics over its micro-steps: the mean, except counts (summed) and the gradient norm
# (the last micro-step's is the accumulated gradient's)
_SUMMED, _LAST = ("supervised_tokens",), ("grad_norm",)


def window_metrics(micro: list[dict]) -> dict:
    if len(micro) == 1:
        return micro[0]
    out = {}
    for k in micro[0]:
        total = sum(m[k] for m in micro)
        out[k] = micro[-1][k] if k in _LAST else total if k in _SUMMED else total / len(micro)
    return out


def _host_metrics(m: dict) -> dict:
    out = {}
    for k, v in jax.device_get(m).items():
        v = np.asarray(v)
        out[k] = [round(float(x), 5) for x in v] if v.ndim else round(float(v), 6)
    return out


class MetricsLog:
    """metrics.jsonl, one line per logged step; on resume, lines past the restored step are dropped so
    a plot never shows the same step twice."""

    def __init__(self, path: Path, start_step: int):
        self.path = path
        if path.exists():
            keep = metrics_lines_upto(path, start_step)  # tolerates a line half-written by a killed run
            path.write_text("".join(l + "\n" for l in keep))
        self.f = path.open("a")

    def write(self, rec: dict):
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()

    def close(self):
        self.f.close()


def train(cfg: TrainConfig, *, progress: bool = True, stop_at_step: int | None = None,
          on_batch: Callable[[int, dict], None] | None = None) -> dict[str, Any]:
    """Run (or resume) training. `stop_at_step` ends the run early as if killed (after checkpointing
    at the normal interval) — used by the resume tests. `on_batch(step, batch)` sees every host batch
    before its step (the data-order tests of the controls)."""
    maybe_initialize()
    out = prepare_out_dir(cfg.out_dir)  # a read-only/unusable out_dir fails here, before any work
    # one writer per run folder (process 0 for all of a multi-host run, whose processes share it)
    with exclusive(out, "training") if is_main() else contextlib.nullcontext():
        return _train(cfg, out, progress=progress, stop_at_step=stop_at_step, on_batch=on_batch)


def _train(cfg: TrainConfig, out: Path, *, progress: bool, stop_at_step: int | None,
           on_batch: Callable[[int, dict], None] | None) -> dict[str, Any]:
    store = open_store(cfg.data.store, cfg.data.extra_stores)  # a store (all shards of a sharded one), + extras
    if len(store) == 0:
        raise CarryoverError(f"response store {cfg.data.store} has no records: run `carryover prepare` first")
    numerics = cfg.run_numerics()  # this platform's defaults under the config's choices
    if is_main():
        print(f"train: numerics: {numerics.describe()}", file=sys.stderr)
    target = load_target(cfg.target, numerics=numerics,
                         tokenizer=cfg.init_from is None and cfg.drafter.mask_token_id is None)
    dcfg, params = build_drafter(cfg, target, store)
    if cfg.features == "store":
        stored = list(store.meta.get("feature_layer_ids") or [])
        if stored != list(dcfg.target_layer_ids):
            raise CarryoverError(
                f"{cfg.data.store} stores features of target layers {stored or 'none'}, the drafter needs "
                f"{list(dcfg.target_layer_ids)}: use features=online or re-prepare with those layers"
            )
    sc = step_config(cfg, target.cfg, dcfg, numerics=numerics)
    steps = total_steps(cfg, len(store))
    optimizer = make_optimizer(cfg, steps)
    schedule = lr_schedule(cfg, steps)  # for logging
    mesh = make_mesh(cfg.mesh)
    local_micro = micro_batch(cfg, mesh)
    if is_main():
        atomic_write_json(out / "train_config.json", dataclasses.asdict(cfg))
    with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
        tsh = target_shardings(sc.target, mesh)
        target_params = jax.device_put(target.params, tsh)
        psh = drafter_shardings(sc.drafter, mesh, cfg.mesh.shard_drafter)
        state = init_state(params, optimizer, cfg.seed)
        check_disk_space(out, state)  # a full disk fails now, not at the first save
        ssh = state_shardings(state, psh, mesh)
        data_iter = make_train_iter(
            cfg.data, store, batch_size=local_micro, seed=cfg.seed, process_index=jax.process_index(),
            process_count=jax.process_count(), with_features=cfg.features == "store", with_kv=cfg.reads_stored_kv,
        )
        ckpt = Checkpointer(out / "checkpoints", save_every=cfg.save_every, keep=cfg.keep_checkpoints,
                            async_save=cfg.async_checkpointing)
        restored = ckpt.restore(abstract_like(state, ssh), data_iter)
        if restored is not None:
            state, start = restored
        else:
            state, start = jax.device_put(state, ssh), 0
        log = MetricsLog(out / "metrics.jsonl", start) if is_main() else None
        step_fn = None
        bar = tqdm(total=steps, initial=start, desc=f"train {cfg.name}", disable=not (progress and is_main()))
        t_last, s_last, tokens = time.perf_counter(), start, 0
        end = steps if stop_at_step is None else min(steps, stop_at_step)
        guard, stop, stopped_at = FiniteGuard(), StopSignal(), None
        try:
            stop.__enter__()  # SIGTERM (preemption) -> checkpoint the last finished step, return cleanly
            for step in range(start, end):
                if stop.requested():
                    stopped_at = step
                    save_before_stop(ckpt, guard, step, state, data_iter)
                    print(f"train: stopped by {stop.name} after step {step}; checkpoint saved in {ckpt.directory}; "
                          "re-run the same command to resume", file=sys.stderr)
                    break
                # the step's micro-batches (one without accumulation), read before any runs: a checkpoint
                # (only ever between steps) then holds the iterator at a window boundary
                micro = [{k: np.asarray(v) for k, v in next(data_iter).items() if k in BATCH_KEYS}
                         for _ in range(cfg.grad_accum_steps)]
                if on_batch is not None:  # the step's rows (one process: the batch without accumulation)
                    on_batch(step + 1, micro[0] if len(micro) == 1 else
                             {k: np.concatenate([b[k] for b in micro]) for k in micro[0]})
                if step_fn is None:
                    step_fn = compile_step(sc, optimizer, mesh, ssh, tsh, {k: v.ndim for k, v in micro[0].items()})
                micro_metrics = []
                for batch in micro:
                    state, m = step_fn(state, target_params, put_batch(batch, mesh))
                    micro_metrics.append(m)
                    tokens += int(batch["loss_mask"].sum()) * jax.process_count()
                metrics = window_metrics(micro_metrics)
                done = step + 1
                guard.record(done, metrics)
                if done % cfg.log_every == 0 or done == steps:
                    guard.check(ckpt.steps())
                    m = _host_metrics(metrics)
                    now = time.perf_counter()
                    m.update(step=done, lr=float(schedule(step)),
                             steps_per_s=round((done - s_last) / (now - t_last), 4),
                             loss_tokens_per_s=round(tokens / (now - t_last), 2), time=time.time())
                    t_last, s_last, tokens = now, done, 0
                    if log:
                        log.write(m)
                    extra = {"draft1_tau": f"{m['draft1/tau']:.2f}"} if "draft1/tau" in m else {}
                    bar.set_postfix(loss=f"{m['loss']:.3f}", tau=f"{m.get('tau_estimate', 0):.2f}", **extra,
                                    sps=f"{m['steps_per_s']:.2f}")
                if ckpt.manager.should_save(done):
                    guard.check(ckpt.steps())  # a non-finite state is never saved
                ckpt.save(done, state, data_iter)
                if cfg.snapshot_every and done % cfg.snapshot_every == 0 and done < steps and is_main():
                    save_drafter(dcfg, jax.device_get(state.params), out / "snapshots" / f"step_{done:06d}")
                bar.update()
            guard.check(ckpt.steps())
            finished = end == steps and stopped_at is None
            if finished and steps not in ckpt.steps():
                ckpt.save(steps, state, data_iter, force=True)
        finally:
            stop.__exit__(None, None, None)
            bar.close()
            ckpt.close()
            if log:
                log.close()
        summary = {"steps": end if stopped_at is None else stopped_at, "total_steps": steps, "finished": finished,
                   "out_dir": str(out)}
        if stopped_at is not None:
            summary["stopped_by"] = stop.name
        if finished and is_main():
            final = jax.device_get(state.params)
            export_cfg = dcfg  # the drafter as configured (not the compute dtype of this run)
            summary["drafter"] = str(save_drafter(export_cfg, final, out / "drafter"))
            atomic_write_json(out / "drafter_config.json", drafter_config_to_dict(export_cfg))
            try:
                from carryover_jax.train.plots import plot_metrics

                summary["plot"] = str(plot_metrics(out))
            except Exception as e:  # a plot must never fail a finished run
                summary["plot_error"] = str(e)
    return summary

