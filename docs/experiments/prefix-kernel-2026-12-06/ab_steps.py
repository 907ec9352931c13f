"""Training steps (configs/smollm2 with a synthetic batch, random drafter weights, as `carryover bench roofline
--rows baseline dvd control` builds them) with `Prefix` attention by einsum (attention backend "einsum", as before)
or forward by the CPU attention kernel and backward by einsum (backend "cpu", the CPU default); "cpu again" times the
"cpu" steps a second time (the A/A). float32, every step from the same state; the calls rotated step by step in one
process; ratios of mean times with 95% intervals over the rounds (`eval/paired.paired_bootstrap`), and each mode's
loss in both backends.

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

rounds = int(sys.argv[1])
calls, losses = {}, {}
for backend in ("einsum", "cpu"):
    cfg = load_config("smollm2")
    cfg = cfg.replace(numerics=cfg.numerics.replace(attention_backend=backend))
    target = load_target(cfg.target, numerics=cfg.run_numerics())
    d = _drafter(cfg, target)
    with_kv = synthetic_batch(cfg, target, d.cfg, stored=cfg.features == "store")
    batch = {k: v for k, v in with_kv.items() if k != "kv"}
    for mode in ("baseline", "dvd", "control"):
        fn = step_call(cfg, target, d.cfg, d.params, with_kv if mode == "dvd" else batch, mode=mode, off_metrics=False)
        losses[f"{mode} {backend}"] = float(jax.block_until_ready(fn()))
        calls[f"{mode} {backend}"] = fn
        if backend == "cpu":
            calls[f"{mode} cpu again"] = fn
names = list(calls)
secs = rotated_seconds(calls, rounds, lambda r, s: print(
    f"round {r}: " + ", ".join(f"{k} {s[k][-1] * 1e3:.0f} ms" for k in names), flush=True))
for mode in ("baseline", "dvd", "control"):
    for b in ("cpu", "cpu again"):
        ratio, lo, hi = speed_ratio(secs[f"{mode} einsum"], secs[f"{mode} {b}"])
        print(f"{mode}: {b} / einsum speed {ratio:.3f} [{lo:.3f}, {hi:.3f}] (mean "
              f"{np.mean(secs[f'{mode} einsum']) * 1e3:.0f} / {np.mean(secs[f'{mode} {b}']) * 1e3:.0f} ms)")
    ratio, lo, hi = speed_ratio(secs[f"{mode} cpu"], secs[f"{mode} cpu again"])
    print(f"{mode}: A/A {ratio:.3f} [{lo:.3f}, {hi:.3f}]; loss einsum "
          f"{losses[f'{mode} einsum']:.6f}, cpu {losses[f'{mode} cpu']:.6f}")
