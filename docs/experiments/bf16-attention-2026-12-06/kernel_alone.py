"""The CPU attention kernel alone at a feature pass's shapes (SmolLM2: 8 sequences of 320 tokens, 3 K/V heads x 3
query heads, head dim 64, causal): its per-query path (`live_attention`; bf16 queries widened) against its tiled
path (`prefix_attention`), float32 and bf16 inputs; 30 calls chained in one program (a pass's layers), the four
programs timed in turn, ms per call (medians over rounds) and GFLOP/s of the causal products (2 x 2 x the scores
that a query sees x 64).

    python kernel_alone.py ROUNDS"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.models import cpu_attention as ca

B, HKV, G, T, D, N = 8, 3, 3, 320, 64, 30
rounds = int(sys.argv[1])
rng = np.random.default_rng(0)
lim = jnp.broadcast_to(jnp.arange(1, T + 1, dtype=jnp.int32), (B, T))
flop = 2 * 2 * B * HKV * G * int(np.sum(np.arange(1, T + 1))) * D


def chain(fn):
    @jax.jit
    def f(q, k, v):
        def body(c, _):
            _, _, o = fn(q + c.astype(q.dtype), k, v, lim, None, D ** -0.5)
            return c + o[0, 0, 0, 0, 0] * 0, None
        return jax.lax.scan(body, jnp.float32(0), None, length=N)[0]
    return f


progs = {}
for dtype in ("float32", "bfloat16"):
    q = jnp.asarray(rng.standard_normal((B, HKV, G, T, D)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((B, HKV, T, D)), dtype) for _ in range(2))
    for name, fn in (("per-query", ca.live_attention), ("tiles", ca.prefix_attention)):
        f = chain(fn)
        jax.block_until_ready(f(q, k, v))
        progs[f"{dtype} {name}"] = lambda f=f, a=(q, k, v): jax.block_until_ready(f(*a))
ms = {name: [] for name in progs}
for r in range(rounds):
    for name, run in progs.items():
        start = time.perf_counter()
        run()
        ms[name].append((time.perf_counter() - start) / N * 1e3)
for name in progs:
    m = float(np.median(ms[name]))
    print(f"{name}: {m:.2f} ms per call, {flop / m / 1e6:.0f} GFLOP/s")
for dtype in ("float32", "bfloat16"):
    print(f"{dtype}: tiles / per-query speed {np.median(ms[f'{dtype} per-query']) / np.median(ms[f'{dtype} tiles']):.2f}x")
