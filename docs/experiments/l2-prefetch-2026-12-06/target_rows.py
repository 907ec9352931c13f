"""The target's pass over 1 row (an AR step) and over P + 1 rows (a verification's) at batch 1, inside compiled
32-step loops (SmolLM2, float32, 1,024-slot cache, 100-token prompt, the cache reset each step), all arms interleaved
rep by rep in one process (`bench.steps.rotated_seconds`); ratios of mean times with 95% intervals
(`eval.paired.speed_ratio`). Knock-out arms time the P + 1-row pass with one part cut to one row's work (wrong
results, for timing only): "head of 1 row" (the tied head over the last row alone). "1 row again": the A/A.

    python target_rows.py P REPS"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode.sampling import argmax
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.loading import load_target
from carryover_jax.models.target import TargetLM

P, REPS = int(sys.argv[1]), int(sys.argv[2])
N, L = 32, 1024
target = load_target("smollm2")
cfg, params = target.cfg, target.params
rng = np.random.default_rng(0)
tokens = np.zeros((1, 128), np.int32)
tokens[:, :100] = rng.integers(10, cfg.vocab_size, (1, 100))
lens = jnp.full((1,), 100, jnp.int32)
cache, logits = ar.prefill(cfg, params, jnp.asarray(tokens), lens, max_len=L)
tok = jnp.argmax(logits, -1).astype(jnp.int32)
drafts = jnp.asarray(rng.integers(10, cfg.vocab_size, (1, P)), jnp.int32)


def loop(rows: int):
    def body(_, c):
        cache, tok = c
        chunk = jnp.concatenate([tok[:, None], drafts], axis=1)[:, :rows]
        lg, cache, _ = TargetLM(cfg).apply({"params": params}, chunk, cache=cache.with_lengths(lens + 0))
        return cache, argmax(lg).astype(jnp.int32)[:, -1]
    f = jax.jit(lambda c: jax.lax.fori_loop(0, N, body, c))
    jax.block_until_ready(f((cache, tok)))  # traced and compiled now, under the patches in force
    return functools.partial(f, (cache, tok))


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
