"""A generation's two parts at batch 64, alternated in one process: the prefill of 64 random 100-token prompts and
32 AR decode steps after it (a `fori_loop` of `autoregressive.step`, as the decode loop runs them), for float32, bf16
with XLA's dots and bf16 with the products kernel's avx512_bf16 pairs (arms as in `ab_pairs.py`, bf16-pairs-again
the A/A).

    python step_ab.py ROUNDS [ARM ...]

Prints per arm the median prefill and step times, then per pair of arms the ratio of their mean times (the second
arm's speed over the first's) with its 95% interval over the rounds (`eval/paired.paired_bootstrap`)."""

import itertools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import autoregressive as ar
from carryover_jax.eval.paired import paired_bootstrap
from carryover_jax.loading import load_target
from carryover_jax.numerics import argmax
from ab_pairs import ARMS

BATCH, PROMPT, MAX_LEN, STEPS = 64, 100, 256, 32


def main(rounds: int, arms: list[str]) -> None:
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(10, 49000, (BATCH, PROMPT)), jnp.int32)
    lens = jnp.full((BATCH,), PROMPT, jnp.int32)
    calls = {}
    for arm in arms:
        target = load_target("smollm2", numerics=ARMS[arm])
        cfg, params = target.cfg, target.params

        @jax.jit
        def loop(params, cache, tok, cfg=cfg):
            def body(_, c):
                logits, cache = ar.step(cfg, params, c[0], c[1])
                return cache, argmax(logits).astype(jnp.int32)
            return jax.lax.fori_loop(0, STEPS, body, (cache, tok))

        def prefill(cfg=cfg, params=params):
            cache, logits = ar.prefill(cfg, params, ids, lens, max_len=MAX_LEN)
            return jax.block_until_ready((cache, argmax(logits).astype(jnp.int32)))

        def steps(state, params=params, loop=loop):
            return jax.block_until_ready(loop(params, *state))

        calls[arm] = (prefill, steps)
        steps(prefill())  # compile and warm up
    secs = {a: {"prefill": [], "step": []} for a in arms}
    for r in range(rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            prefill, steps = calls[arm]
            t = time.perf_counter()
            state = prefill()
            t1 = time.perf_counter()
            steps(state)
            secs[arm]["prefill"].append(t1 - t)
            secs[arm]["step"].append((time.perf_counter() - t1) / STEPS)
    for arm in arms:
        print(f"{arm}: prefill {np.median(secs[arm]['prefill']) * 1e3:.0f} ms, AR step "
              f"{np.median(secs[arm]['step']) * 1e3:.1f} ms (medians of {rounds})")
    for part in ("prefill", "step"):
        for a, b in itertools.combinations(arms, 2):
            cmp = paired_bootstrap(secs[a][part], secs[b][part], min_prompts=2)
            lo, hi = (1 + g / 100 for g in cmp["gain_pct_ci"])
            print(f"{part}: {b} / {a} speed {1 + cmp['gain_pct'] / 100:.3f} [{lo:.3f}, {hi:.3f}]")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:] or list(ARMS))
