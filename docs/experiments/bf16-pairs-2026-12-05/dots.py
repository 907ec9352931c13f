"""XLA's dots at SmolLM2's shapes (q-o [576, 576], k-v [576, 192], gate-up [576, 1536], down [1536, 576], the tied head
[49152, 576] as rows: nk) at 64, 128 and 2,048 rows, float32 and bf16 operands with float32 accumulation: GFLOP/s and
the median time of 30 calls.

    python dots.py"""
import time

import jax
import jax.numpy as jnp
import numpy as np


def rate(M, K, N, dtype, nk=False, reps=30):
    x, w = jnp.ones((M, K), dtype), jnp.ones((N, K) if nk else (K, N), dtype)
    f = jax.jit(lambda x, w: jax.lax.dot_general(x, w, (((1,), (1 if nk else 0,)), ((), ())),
                                                 preferred_element_type=jnp.float32))
    f(x, w).block_until_ready()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f(x, w).block_until_ready()
        ts.append(time.perf_counter() - t)
    t = np.median(ts)
    return 2 * M * K * N / t / 1e9, t * 1e3


for M in (64, 128, 2048):
    for K, N, nk in ((576, 1536, False), (1536, 576, False), (576, 576, False), (576, 192, False), (576, 49152, True)):
        r32, r16 = rate(M, K, N, jnp.float32, nk), rate(M, K, N, jnp.bfloat16, nk)
        print(f"M={M} K={K} N={N} nk={nk}: f32 {r32[0]:.0f} GF/s {r32[1]:.3f}ms  "
              f"bf16 {r16[0]:.0f} GF/s {r16[1]:.3f}ms  ratio {r16[0] / r32[0]:.2f}", flush=True)
