"""`carryover bench train`: training steps/s with online vs stored target features (same config,
same synthetic records, one run), or (`--mode dvd`) DVD, control and EDR-objective step times against baseline
steps on the same batch; and a per-device memory estimate for a paper-size config.

Timings exclude the first step (compilation). The memory estimate uses `jax.eval_shape` for every
parameter and optimizer tensor (nothing is allocated) plus the dominant activations: the drafter's
training attention scores, B_local x heads x (N*T) x (S + T) float32 per layer (the block part is
block-diagonal), and the draft + aligned target logits over the full vocabulary.

`--memory` (`compiled_memory`, `memory_rows`): per-device bytes of the paper configs' compiled step, every
stage (baseline, DVD, control), from XLA's memory analysis of the program `carryover train` builds for a
GPU (the run's numerics resolved for cuda; its mesh, micro-batch and accumulation), per attention backend.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.config import DrafterConfig, TargetConfig, TrainConfig, preset
from carryover_jax.errors import ConfigError
from carryover_jax.loading import load_target
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.models.target import abstract_params
from carryover_jax.train.kv_rows import kv_width
from carryover_jax.train.responses import target_features
from carryover_jax.train.sharding import LOGICAL_RULES, make_mesh, mesh_sizes
from carryover_jax.train.step import (compile_step, drafter_shardings, init_state, make_optimizer, state_shardings,
                                      step_config, target_shardings, train_step)
from carryover_jax.train.store import ResponseStore


def _synthetic_store(path: Path, target, cfg: TrainConfig, layer_ids, *, records: int, features: bool):
    rng = np.random.default_rng(0)
    s = cfg.data.max_len
    seqs = [rng.integers(10, target.cfg.vocab_size, s).astype(np.int32).tolist() for _ in range(records)]
    masks = [np.r_[np.zeros(s // 4, np.uint8), np.ones(s - s // 4, np.uint8)] for _ in range(records)]
    kv = cfg.data.store_kv if features else None
    kw = dict(feature_dim=len(layer_ids) * target.cfg.hidden_size, hidden=target.cfg.hidden_size) if features else {}
    if kv:
        kw.update(kv_dim=kv_width(target.cfg), kv_dtype=kv)
    st = ResponseStore.create_or_open(path, meta={"feature_layer_ids": list(layer_ids) if features else []},
                                      target_lse=features, **kw)
    recs = []
    for i, (ids, m) in enumerate(zip(seqs, masks)):
        r = {"id": str(i), "input_ids": ids, "loss_mask": m}
        if features:
            r.update(target_features(target, [ids], tuple(layer_ids), kv_dtype=kv)[0])
        recs.append(r)
    st.append(recs)
    st.commit()
    return path


def run(cfg: TrainConfig, *, steps: int = 6, progress: bool = True) -> dict[str, Any]:
    from carryover_jax.train.loop import build_drafter, train  # grain: not needed by the memory table
    target = load_target(cfg.target, numerics=cfg.run_numerics())
    dcfg, _ = build_drafter(cfg, target)
    records = cfg.batch_size * (steps + 1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="carryover-bench-train-") as tmp:
        tmp = Path(tmp)
        for mode in ("online", "store"):
            store = _synthetic_store(tmp / f"data-{mode}", target, cfg, dcfg.target_layer_ids, records=records,
                                     features=mode == "store")
            run_cfg = cfg.replace(
                data=dataclasses.replace(cfg.data, store=str(store), min_loss_tokens=2), features=mode, steps=steps,
                epochs=None, out_dir=str(tmp / f"run-{mode}"), log_every=1, save_every=10 ** 9,
                async_checkpointing=False, drafter=dataclasses.replace(cfg.drafter, mask_token_id=dcfg.mask_token_id,
                                                                       target_layer_ids=dcfg.target_layer_ids),
            )
            train(run_cfg, progress=progress)
            recs = [json.loads(l) for l in (Path(run_cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
            sps = float(np.median([r["steps_per_s"] for r in recs[1:]]))  # step 1 includes compilation
            rows.append({"features": mode, "steps_per_s": round(sps, 3),
                         "tokens_per_s": round(sps * cfg.batch_size * cfg.data.max_len, 1)})
    rows[1]["speedup_vs_online"] = round(rows[1]["steps_per_s"] / rows[0]["steps_per_s"], 3)
    return {"benchmark": "train", "config": cfg.name, "batch_size": cfg.batch_size, "max_len": cfg.data.max_len,
            "num_anchors": cfg.num_anchors, "rows": rows}


def synthetic_batch(cfg: TrainConfig, target, dcfg: DrafterConfig, *, stored: bool) -> dict[str, jax.Array]:
    """One batch of the config's shape: random tokens, the loss mask on the last three quarters; with `stored`,
    the target's features and log-sum-exp of it too (what a response store holds), and its K/V rows ("kv")
    where the config stores them (`data.store_kv`)."""
    rng = np.random.default_rng(0)
    b, s = cfg.batch_size, cfg.data.max_len
    ids = rng.integers(10, target.cfg.vocab_size, (b, s)).astype(np.int32)
    lm = np.zeros((b, s), np.int32)
    lm[:, s // 4:] = 1
    batch = {"input_ids": ids, "loss_mask": lm}
    if stored:
        outs = target_features(target, ids.tolist(), tuple(dcfg.target_layer_ids), kv_dtype=cfg.data.store_kv)
        batch.update({k: np.stack([o[k] for o in outs]) for k in outs[0]})
    return {k: jnp.asarray(v) for k, v in batch.items()}


_step = jax.jit(train_step, static_argnums=(0, 1))


def step_call(cfg: TrainConfig, target, dcfg: DrafterConfig, params, batch, **loss):
    """A zero-argument call of one jitted training step (`cfg` with these `loss` fields) from the same initial
    state every time; it returns the step's loss."""
    c = cfg.with_loss(**loss)
    sc = step_config(c, target.cfg, dcfg)
    opt = make_optimizer(c, 10)
    state = init_state(params, opt, 0)
    return lambda: _step(sc, opt, state, target.params, batch)[1]["loss"]


def interleaved_ms(calls: dict[str, Any], steps: int) -> dict[str, float]:
    """Median ms of each zero-argument call: each compiled first, then timed in turn, call by call
    (`steps.rotated_seconds`: a slow phase of a shared machine hits all of them alike)."""
    for fn in calls.values():
        jax.block_until_ready(fn())
    return {k: 1e3 * float(np.median(v)) for k, v in rotated_seconds(calls, steps).items()}


def run_dvd(cfg: TrainConfig, *, steps: int = 6) -> dict[str, Any]:
    """Step time of DVD training, of its control and of baseline training with the EDR objective
    (`loss.objective=edr`) against baseline steps on the same batch (stored and online features),
    interleaved call by call in one process; medians in ms. With `data.store_kv`, DVD both with the stored
    K/V and with them recomputed (a target pass over the recorded sequences, as without). With a draft
    vocabulary, the baseline and EDR steps also as from a store without the target's log-sum-exp (the whole
    LM head at every supervised row)."""
    from carryover_jax.train.loop import build_drafter
    target = load_target(cfg.target, numerics=cfg.run_numerics())
    dcfg, params = build_drafter(cfg, target)
    b, s = cfg.batch_size, cfg.data.max_len
    with_kv = synthetic_batch(cfg, target, dcfg, stored=True)
    stored = {k: v for k, v in with_kv.items() if k != "kv"}
    online = {k: stored[k] for k in ("input_ids", "loss_mask")}
    arms = {"baseline (stored features)": ("baseline", stored), "baseline (online features)": ("baseline", online),
            "baseline + edr objective": ("baseline", stored), "dvd": ("dvd", stored), "control": ("control", stored)}
    if "kv" in with_kv:
        arms["dvd (stored K/V)"] = ("dvd", with_kv)
    if "target_lse" in stored and dcfg.draft_vocab:  # as from a store without it: the LM head over every id
        whole = {k: v for k, v in stored.items() if k != "target_lse"}
        arms.update({"baseline (stored features, whole head)": ("baseline", whole),
                     "baseline + edr objective (whole head)": ("baseline", whole)})
    calls = {name: step_call(cfg, target, dcfg, params, batch, mode=mode, objective="edr" if "edr" in name else "ce")
             for name, (mode, batch) in arms.items()}
    ms = interleaved_ms(calls, steps)
    base = ms["baseline (stored features)"]
    rows = [{"step": k, "ms": round(v, 1), "x_baseline_stored": round(v / base, 2),
             "x_baseline_online": round(v / ms["baseline (online features)"], 2),
             "x_control": round(v / ms["control"], 2)} for k, v in ms.items()]
    return {"benchmark": "train-dvd", "config": cfg.name, "batch_size": b, "max_len": s, "num_anchors": cfg.num_anchors,
            "num_proposals": dcfg.num_proposals, "rows": rows}


def _bytes(tree) -> int:
    return int(sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def memory_estimate(cfg: TrainConfig, target_cfg: TargetConfig, dcfg: DrafterConfig, *, devices: int,
                    dvd: bool = False) -> dict:
    """Per-device bytes for one training (micro-)step of `cfg` (a DVD step with `dvd`) on `devices` devices
    (data parallel unless the mesh shards), from abstract shapes only."""
    numerics = cfg.run_numerics("cuda")  # a GPU pod's program
    tparams = abstract_params(target_cfg.with_numerics(numerics))
    dparams = jax.eval_shape(lambda: init_drafter_params(dcfg, jax.random.key(0)))
    opt = jax.eval_shape(make_optimizer(cfg, 10).init, dparams)
    model_shards = max(1, cfg.mesh.fsdp * cfg.mesh.tensor)
    local_b = max(1, cfg.batch_size // cfg.grad_accum_steps // devices)
    s, n, t = cfg.data.max_len, cfg.num_anchors, dcfg.block_size
    act_dt = jnp.dtype(numerics.dtype).itemsize
    # float32 scores of one layer (remat keeps one live): context [N*T, S] + block-diagonal [N*T, T]
    attn = local_b * dcfg.backbone.num_heads * (n * t) * (s + t) * 4
    feats = local_b * s * (len(dcfg.target_layer_ids) + 1) * target_cfg.hidden_size * act_dt
    rows = local_b * n * dcfg.num_proposals
    if cfg.loss.chunk_rows:
        rows = min(rows, cfg.loss.chunk_rows)
    logits = 2 * rows * target_cfg.vocab_size * 4  # draft + aligned target, float32
    out = {
        "devices": devices, "local_batch": local_b,
        "target_params_gb": _bytes(tparams) / model_shards / 1e9,
        "drafter_params_gb": _bytes(dparams) / (model_shards if cfg.mesh.shard_drafter else 1) / 1e9,
        "optimizer_gb": _bytes(opt) / (model_shards if cfg.mesh.shard_drafter else 1) / 1e9,
        "grads_gb": _bytes(dparams) / 1e9,
        "features_gb": feats / 1e9, "attention_scores_per_layer_gb": attn / 1e9, "logits_gb": logits / 1e9,
    }
    if dvd:
        # DVD adds, without gradients: every target layer's prefix K/V of the recorded sequence, the verify
        # attention of one target layer over the N blocks of P (prefix [N P, S] + block-causal scores), the
        # verify taps of all blocks, and draft 1's vocabulary logits (chunked like the loss)
        tkv = target_cfg.num_layers * 2 * local_b * s * target_cfg.num_kv_heads * target_cfg.head_dim * act_dt
        nv = n * dcfg.num_proposals
        out["dvd_prefix_kv_gb"] = tkv / 1e9
        out["dvd_verify_scores_gb"] = local_b * target_cfg.num_heads * nv * (s + dcfg.num_proposals) * 4 / 1e9
        out["dvd_verify_features_gb"] = local_b * nv * len(dcfg.target_layer_ids) * target_cfg.hidden_size * act_dt / 1e9
        out["dvd_draft1_logits_gb"] = rows * target_cfg.vocab_size * 4 / 1e9
    out["total_gb"] = sum(v for k, v in out.items() if k.endswith("_gb"))
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()}


def compiled_memory(cfg: TrainConfig, target_cfg: TargetConfig, dcfg: DrafterConfig, *, devices: int,
                    backend: str = "einsum", device_list=None, platform: str = "cuda") -> dict:
    """Per-device bytes of one training step of `cfg` (its mode, mesh, batch, remat, dtypes) with the
    attention backend `backend`, from XLA's memory analysis of the compiled step on abstract inputs
    (nothing is allocated): `jit(step).lower(...).compile().memory_analysis()`.

    With at least `devices` local devices (a pod, or CPU with XLA_FLAGS=--xla_force_host_platform_device_count=N)
    the sharded step over the mesh is compiled. Otherwise a pure data-parallel mesh compiles one device's
    program (the local batch; what the all-reduce of the gradients adds is one gradient-sized buffer), and
    any other mesh falls back to `memory_estimate` (eval_shape). With `grad_accum_steps` the step compiled
    is one micro-step (batch_size / grad_accum_steps sequences, MultiSteps' accumulator in the state).
    Compiled on a platform other than the target one (CPU for GPU), the numbers are that platform's buffer
    assignment for the same program, a proxy: the Pallas kernel runs in interpret mode there (it keeps its
    tiles, not [T, S] buffers), and XLA CPU computes bf16 dots in float32 (float32 copies of their operands).

    `platform` "tpu" with `device_list` the devices of a compile-only TPU topology
    (`tpu_topology_devices`): the TPU program, compiled by the TPU compiler on this host, no TPU attached
    (its own buffer assignment, not a proxy)."""
    data, fsdp, tensor = mesh_sizes(cfg.mesh, devices)
    run_cfg = cfg.replace(features="online")
    # the program a GPU pod (or, with compile-only TPU devices, a TPU slice) builds: the run's numerics
    # resolved for that platform, whatever this host is. For cuda "auto" is lowered as its cuda branch (the
    # kernel): lowered for the CPU, platform_dependent would take einsum
    numerics = run_cfg.run_numerics(platform)
    if platform == "cuda":
        numerics = numerics.replace(attention_backend="pallas" if backend == "auto" else backend)
    else:  # lowered for the devices' own platform: "auto" takes that platform's branch
        numerics = numerics.replace(attention_backend=backend)
    sc = step_config(run_cfg, target_cfg, dcfg, numerics=numerics)
    opt = make_optimizer(run_cfg, 10)
    tparams = abstract_params(sc.target)
    state = jax.eval_shape(lambda: init_state(init_drafter_params(sc.drafter, jax.random.key(0)), opt, 0))
    s = cfg.data.max_len
    micro = cfg.batch_size // cfg.grad_accum_steps  # what one compiled (micro-)step sees
    if micro % (data * fsdp):
        raise ConfigError(f"batch_size / grad_accum_steps = {micro} sequences do not split over the mesh's data x "
                          f"fsdp = {data * fsdp} devices")
    base = {"devices": devices, "mesh": {"data": data, "fsdp": fsdp, "tensor": tensor}, "backend": backend,
            "global_batch": cfg.batch_size, "grad_accum_steps": cfg.grad_accum_steps, "micro_batch": micro,
            "micro_batch_per_shard": micro // (data * fsdp), "max_len": s, "num_anchors": cfg.num_anchors,
            "mode": cfg.loss.mode, "remat": cfg.remat, "loss_chunk_rows": cfg.loss.chunk_rows}
    pool = list(jax.devices() if device_list is None else device_list)
    if len(pool) >= devices:
        b = micro
        batch = {k: jax.ShapeDtypeStruct((b, s), jnp.int32) for k in ("input_ids", "loss_mask")}
        mesh = make_mesh(cfg.mesh, pool[:devices])
        with nn.logical_axis_rules(LOGICAL_RULES):  # (outside set_mesh: compile-only devices run nothing)
            psh = drafter_shardings(sc.drafter, mesh, cfg.mesh.shard_drafter)
            fn = compile_step(sc, opt, mesh, state_shardings(state, psh, mesh), target_shardings(sc.target, mesh),
                              {"input_ids": 2, "loss_mask": 2})
        with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
            try:
                ma = fn.lower(state, tparams, batch).compile().memory_analysis()
            except jax.errors.JaxRuntimeError as e:  # the TPU compiler checks its buffers against the chip's HBM
                over = re.search(r"RESOURCE_EXHAUSTED: .*?temporaries \(([\d.]+)G\) exceeds available HBM "
                                 r"\(([\d.]+)G\)", str(e))
                if over is None:
                    raise
                gib = lambda x: round(float(x) * 2 ** 30 / 1e9, 3)  # noqa: E731  (XLA's "G" is GiB)
                return {**base, "method": f"compiled: out of HBM on {devices} devices (temporaries alone)",
                        "platform": f"{pool[0].platform}: {pool[0].device_kind}", "temp_gb": gib(over[1]),
                        "total_gb": gib(over[1]), "hbm_available_gb": gib(over[2]),
                        "compiler": str(e).splitlines()[0][:300]}
        method = f"compiled: the sharded step over {devices} devices"
    elif fsdp == 1 and tensor == 1:
        b = max(1, micro // devices)
        batch = {k: jax.ShapeDtypeStruct((b, s), jnp.int32) for k in ("input_ids", "loss_mask")}
        fn = jax.jit(functools.partial(train_step, sc, opt), donate_argnums=(0,))
        ma = fn.lower(state, tparams, batch).compile().memory_analysis()
        method = f"compiled: one device's program (local batch {b}; data parallel)"
    else:
        est = memory_estimate(cfg, target_cfg, dcfg, devices=devices, dvd=cfg.loss.mode != "baseline")
        return {**base, "method": "estimate (eval_shape; compile needs the devices)", "total_gb": est["total_gb"],
                "estimate": est}
    if ma is None:
        est = memory_estimate(cfg, target_cfg, dcfg, devices=devices, dvd=cfg.loss.mode != "baseline")
        return {**base, "method": "estimate (this platform has no memory analysis)", "total_gb": est["total_gb"],
                "estimate": est}
    gb = lambda n: round(n / 1e9, 3)  # noqa: E731
    arg, out, tmp = ma.argument_size_in_bytes, ma.output_size_in_bytes, ma.temp_size_in_bytes
    alias = getattr(ma, "alias_size_in_bytes", 0)
    where = jax.default_backend() if device_list is None else f"{pool[0].platform}: {pool[0].device_kind}, compile-only"
    return {**base, "method": method, "platform": where, "arguments_gb": gb(arg),
            "outputs_gb": gb(out), "temp_gb": gb(tmp), "aliased_gb": gb(alias),
            "total_gb": gb(arg + out + tmp - alias)}


# per-device memory an 8-GPU node leaves a training step: an H200 has 141 GB, an H100-80GB 80 GB, less what the
# CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers and allocator fragmentation take
NODE_LIMITS_GB = {"h200": 120, "h100": 72}
# the stages whose compiled step differs: control_compute runs control's step (only its step count differs)
MEMORY_STAGES = ("baseline", "dvd", "control")


# HBM per chip of the TPU generations a compile-only topology may name (device kind -> GB; the chips have
# 16 / 95 / 32 GiB)
TPU_HBM_GB = {k: round(v * 2 ** 30 / 1e9, 2) for k, v in {"TPU v5 lite": 16, "TPU v5": 95, "TPU v6 lite": 32}.items()}


def tpu_topology_devices(name: str) -> list:
    """The compile-only devices of a TPU slice topology ("v5p:2x2x1", "v6e:2x4", "v5e:4x4"): the TPU
    compiler (libtpu) compiles for them on this host, no TPU attached."""
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
    except Exception as e:  # noqa: BLE001 - no libtpu, or a name it does not know: one line either way
        raise ConfigError(f"TPU topology {name!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__} "
                          "(the TPU compiler comes with pip install '.[tpu]')") from None


def memory_rows(entries, *, devices: int, backends=("auto",), progress: bool = True, device_list=None,
                platform: str = "cuda"):
    """`compiled_memory` of each (config name, stage, TrainConfig, TargetConfig) in `entries` for each backend,
    one row at a time (a compile takes minutes: rows are yielded as they finish). TPU rows say whether the
    step fits the chip's HBM instead of a GPU node's."""
    for name, stage, cfg, tcfg in entries:
        dcfg = DrafterConfig.for_target(tcfg, cfg.drafter)
        for bk in backends:
            if progress:
                print(f"compiling the {name} {stage} step ({bk}) ...", file=sys.stderr, flush=True)
            row = {"config": name, "stage": stage, **compiled_memory(cfg, tcfg, dcfg, devices=devices, backend=bk,
                                                                      device_list=device_list, platform=platform)}
            if platform == "tpu" and device_list:
                hbm = TPU_HBM_GB.get(device_list[0].device_kind)
                fits = False if "hbm_available_gb" in row else None if hbm is None else row["total_gb"] <= hbm
                row.update({"hbm_gb": hbm, "fits_hbm": fits})
            else:
                row.update({f"fits_{node}": row["total_gb"] <= limit for node, limit in NODE_LIMITS_GB.items()})
            yield row


def stage_entries(names, stages=MEMORY_STAGES, overrides=()):
    """(name, stage, config, preset target) of each paper config's stages, `overrides` (`--set`) applied."""
    from carryover_jax.config import apply_overrides
    from carryover_jax.configs import load_config

    out = []
    for name in names:
        tcfg = preset(_PRESET_OF.get(name, name))
        for stage in stages:
            cfg = load_config(name if stage == "baseline" else f"{name}:{stage}")
            out.append((name, stage, apply_overrides(cfg, list(overrides)), tcfg))
    return out


_PRESET_OF = {"qwen3_4b": "qwen3-4b", "qwen3_8b": "qwen3-8b", "gemma4_12b": "gemma4-12b"}


def memory_json(row: dict) -> str:
    """One row as one line of JSON (`bench train --memory --json`): config, stage, devices, mesh, backend,
    per_device_gb, micro_batch (sequences per data x fsdp shard per micro-step), accum, fits_h200, fits_h100,
    then the rest of the row (micro_batch_global: sequences per micro-step)."""
    m = row["mesh"]
    head = {"config": row["config"], "stage": row.get("stage", row["mode"]), "devices": row["devices"],
            "mesh": f"data={m['data']},fsdp={m['fsdp']},tensor={m['tensor']}", "backend": row["backend"],
            "per_device_gb": row["total_gb"], "micro_batch": row["micro_batch_per_shard"],
            "accum": row["grad_accum_steps"], **{k: row[k] for k in ("fits_h200", "fits_h100") if k in row},
            "micro_batch_global": row["micro_batch"]}
    renamed = ("mesh", "total_gb", "micro_batch", "micro_batch_per_shard", "grad_accum_steps", "estimate")
    return json.dumps({**head, **{k: v for k, v in row.items() if k not in head and k not in renamed}})


def format_memory(result: dict) -> str:
    lines = [f"per-device memory of one training (micro-)step, {result['devices']} devices"]
    for r in result["rows"]:
        m = r["mesh"]
        extra = (f"  (args {r['arguments_gb']}, temp {r['temp_gb']}, out {r['outputs_gb']}, aliased {r['aliased_gb']})"
                 if "temp_gb" in r else "")
        fits = ", ".join(node for node in NODE_LIMITS_GB if r.get(f"fits_{node}")) or "-"
        lines.append(f"{r['config']:12s} {r.get('stage', r['mode']):8s} mesh data={m['data']} fsdp={m['fsdp']} "
                     f"tensor={m['tensor']}  micro {r['micro_batch_per_shard']:g} x accum {r['grad_accum_steps']}  "
                     f"{r['backend']:7s} {r['total_gb']:8.2f} GB  fits: {fits}{extra}  [{r['method']}]")
    return "\n".join(lines)
