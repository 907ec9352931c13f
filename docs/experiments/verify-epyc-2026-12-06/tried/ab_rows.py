"""The target's pass over 1 row (an AR step) and over P + 1 rows (a verification's) at batch 1, inside compiled
32-step loops (SmolLM2, 1,024-slot cache, 100-token prompt, the cache reset each step, as `../../verify-rows-2026-12-05/
verify_split.py`'s `t4` arm), with one cache segment's attention as before ("previous": q transposed to the
head-major layout, the merge and the transpose back) or read and written token-major ("token-major",
`one_segment_token_major.patch`); "token-major again" is the new arms compiled a second time (the A/A). All arms
interleaved rep by rep in one process; ratios of mean times with 95% intervals over the reps
(`eval/paired.paired_bootstrap`).

    git apply one_segment_token_major.patch   # on 085b5a8
    python ab_rows.py P REPS"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode.sampling import argmax
from carryover_jax.eval.paired import paired_bootstrap
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
secs = {k: [] for k in calls}
for r in range(REPS):
    names = list(calls)
    for k in names[r % len(names):] + names[:r % len(names)]:
        start = time.perf_counter()
        jax.block_until_ready(calls[k]((cache, tok)))
        secs[k].append((time.perf_counter() - start) / N)
for k in calls:
    print(f"{k}: {np.mean(secs[k]) * 1e3:.2f} ms a step")


def ratio(a, b, what):
    cmp = paired_bootstrap(secs[a], secs[b], min_prompts=2)  # gain: mean time of a over b's, minus 1
    lo, hi = (1 + g / 100 for g in cmp["gain_pct_ci"])
    print(f"{what}: {1 + cmp['gain_pct'] / 100:.3f} [{lo:.3f}, {hi:.3f}]")


for rows in (1, P + 1):
    for arm in ("token-major", "token-major again"):
        ratio(f"{rows} rows previous", f"{rows} rows {arm}", f"{rows} rows: {arm} / previous speed")
for arm in ("previous", "token-major", "token-major again"):
    cmp = paired_bootstrap(secs[f"1 rows {arm}"], secs[f"{P + 1} rows {arm}"], min_prompts=2)
    lo, hi = (1 / (1 + g / 100) for g in cmp["gain_pct_ci"][::-1])
    print(f"{arm}: {P + 1} rows / 1 row time {1 / (1 + cmp['gain_pct'] / 100):.3f} [{lo:.3f}, {hi:.3f}]")
