"""Training steps (configs/smollm2 with a synthetic batch, random drafter weights, as `carryover bench roofline
--rows baseline dvd control` builds them, float32) with the `Prefix` attention's forward by the CPU kernel's
per-query path (`live_attention`, as before) or its tiled path (`prefix_attention`, new); backward by einsum in
both; "tiles again" times the tiled steps a second time (the A/A). Every step from the same state; the calls rotated
step by step in one process; ratios of mean times with 95% intervals over the rounds (`eval/paired.paired_bootstrap`),
and each mode's loss in both arms.

    python ab_steps.py ROUNDS"""
import sys

import jax
import numpy as np

from carryover_jax.bench.roofline import _drafter
from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.bench.train import step_call, synthetic_batch
from carryover_jax.configs import load_config
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_attention

rounds = int(sys.argv[1])
tiles = cpu_attention.prefix_attention
calls, losses = {}, {}
for arm in ("per-query", "tiles"):
    cpu_attention.prefix_attention = cpu_attention.live_attention if arm == "per-query" else tiles  # read when traced
    cfg = load_config("smollm2")
    target = load_target(cfg.target, numerics=cfg.run_numerics())
    d = _drafter(cfg, target)
    with_kv = synthetic_batch(cfg, target, d.cfg, stored=cfg.features == "store")
    batch = {k: v for k, v in with_kv.items() if k != "kv"}
    for mode in ("baseline", "dvd", "control"):
        fn = step_call(cfg, target, d.cfg, d.params, with_kv if mode == "dvd" else batch, mode=mode, off_metrics=False)
        losses[f"{mode} {arm}"] = float(jax.block_until_ready(fn()))
        calls[f"{mode} {arm}"] = fn
        if arm == "tiles":
            calls[f"{mode} tiles again"] = fn
cpu_attention.prefix_attention = tiles
names = list(calls)
secs = rotated_seconds(calls, rounds, lambda r, s: print(
    f"round {r}: " + ", ".join(f"{k} {s[k][-1] * 1e3:.0f} ms" for k in names), flush=True))
for mode in ("baseline", "dvd", "control"):
    for b in ("tiles", "tiles again"):
        ratio, lo, hi = speed_ratio(secs[f"{mode} per-query"], secs[f"{mode} {b}"])
        print(f"{mode}: {b} / per-query speed {ratio:.3f} [{lo:.3f}, {hi:.3f}] (mean "
              f"{np.mean(secs[f'{mode} per-query']) * 1e3:.0f} / {np.mean(secs[f'{mode} {b}']) * 1e3:.0f} ms)")
    ratio, lo, hi = speed_ratio(secs[f"{mode} tiles"], secs[f"{mode} tiles again"])
    print(f"{mode}: A/A {ratio:.3f} [{lo:.3f}, {hi:.3f}]; loss per-query "
          f"{losses[f'{mode} per-query']:.6f}, tiles {losses[f'{mode} tiles']:.6f}")
