"""The target's pass over 1 row (an AR step) and over P + 1 rows (a verification's) at batch 1, inside compiled
32-step loops (SmolLM2, 1,024-slot cache, 100-token prompt, the cache reset each step, as `../../verify-rows-2026-12-05/
verify_split.py`'s `t4` arm), with one cache segment's attention as before ("previous": q transposed to the
head-major layout, the merge and the transpose back) or read and written token-major ("token-major",
`one_segment_token_major.patch`); "token-major again" is the new arms compiled a second time (the A/A). All arms
interleaved rep by rep in one process; ratios of mean times with 95% intervals over the reps
(`eval/paired.paired_bootstrap`).

    git apply one_segment_token_major.patch   # on 085b5a8
    python ab_rows.py P REPS"""
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
from carryover_jax.models import layers
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
    return jax.jit(lambda c: jax.lax.fori_loop(0, N, body, c))


whole = layers._one_cache_segment_on_cpu
calls = {}
for arm in ("previous", "token-major", "token-major again"):
    layers._one_cache_segment_on_cpu = (lambda *a: False) if arm == "previous" else whole  # read when traced
    for rows in (1, P + 1):
        f = loop(rows)
        jax.block_until_ready(f((cache, tok)))
        calls[f"{rows} rows {arm}"] = f
layers._one_cache_segment_on_cpu = whole
timed = rotated_seconds({k: functools.partial(f, (cache, tok)) for k, f in calls.items()}, REPS)
secs = {k: [x / N for x in v] for k, v in timed.items()}  # per step
for k in calls:
    print(f"{k}: {np.mean(secs[k]) * 1e3:.2f} ms a step")


for rows in (1, P + 1):
    for arm in ("token-major", "token-major again"):
        x, lo, hi = speed_ratio(secs[f"{rows} rows previous"], secs[f"{rows} rows {arm}"])
        print(f"{rows} rows: {arm} / previous speed: {x:.3f} [{lo:.3f}, {hi:.3f}]")
for arm in ("previous", "token-major", "token-major again"):
    x, lo, hi = speed_ratio(secs[f"{P + 1} rows {arm}"], secs[f"1 rows {arm}"])  # mean time of P + 1 rows over 1 row's
    print(f"{arm}: {P + 1} rows / 1 row time {x:.3f} [{lo:.3f}, {hi:.3f}]")
