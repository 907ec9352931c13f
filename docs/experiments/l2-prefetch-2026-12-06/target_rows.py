"""The target's pass over 1 row (an AR step) and over P + 1 rows (a verification's) at batch 1, inside compiled
32-step loops (SmolLM2, float32, 1,024-slot cache, 100-token prompt, the cache reset each step), all arms interleaved
rep by rep in one process (`bench.steps.rotated_seconds`); ratios of mean times with 95% intervals
(`eval.paired.speed_ratio`). Knock-out arms time the P + 1-row pass with one part cut to one row's work (wrong
results, for timing only): "head of 1 row" (the tied head over the last row alone). "1 row again": the A/A.

    python target_rows.py P REPS"""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "verify-rows-2026-12-05"))
from batch1 import looped, prefilled, setup  # noqa: E402

from carryover_jax.bench.steps import rotated_seconds  # noqa: E402
from carryover_jax.decode.sampling import argmax  # noqa: E402
from carryover_jax.eval.paired import speed_ratio  # noqa: E402
from carryover_jax.models.target import TargetLM  # noqa: E402

P, REPS = int(sys.argv[1]), int(sys.argv[2])
N, L = 32, 1024
b = setup(P)
bx = prefilled(b, L)


def loop(rows: int):
    def body(params, c):
        cache, tok = c
        chunk = jnp.concatenate([tok[:, None], bx["toks"]], axis=1)[:, :rows]
        lg, cache, _ = TargetLM(b.tcfg).apply({"params": params}, chunk, cache=cache.with_lengths(b.lens + 0))
        return cache, argmax(lg).astype(jnp.int32)[:, -1]
    f = functools.partial(looped(body, N), b.tp, (bx["cache"], bx["tok"]))
    jax.block_until_ready(f())  # traced and compiled now, under the patches in force
    return f


head = TargetLM.head
calls = {"1 row": loop(1), f"{P + 1} rows": loop(P + 1)}
TargetLM.head = lambda self, h: head(self, h[:, -1:])
calls["head of 1 row"] = loop(P + 1)
TargetLM.head = head
calls["1 row again"] = loop(1)
secs = {k: [x / N for x in v] for k, v in rotated_seconds(calls, REPS).items()}  # per step
for k in calls:
    print(f"{k}: {np.mean(secs[k]) * 1e3:.2f} ms a step")
for k in calls:
    if k != "1 row":
        x, lo, hi = speed_ratio(secs[k], secs["1 row"])  # mean time of k over one row's
        print(f"{k} / 1 row time: {x:.3f} [{lo:.3f}, {hi:.3f}]")
