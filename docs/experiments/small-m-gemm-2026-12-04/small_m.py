"""Why verify(P + 1) costs more than an AR step at batch 1 on the CPU: the SmolLM2 LM head's matmul
[M, 576] x [576, 49152] (float32, 113 MB of weights, far past the caches) timed at M = 1, 4, 8, as one dot and as
the weights split into C column chunks (lax.map over [C, 576, 49152 / C], pre-split: the split itself not timed).
`python small_m.py` -> a markdown table (median of 30 calls after one warm call)."""
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

K, N = 576, 49152
rng = np.random.default_rng(0)
W = jnp.asarray(rng.normal(size=(K, N)), jnp.float32)


def ms(f, *a, n=30):
    jax.block_until_ready(f(*a))
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*a))
        ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))


plain = jax.jit(lambda x, w: x @ w)
split = jax.jit(lambda x, wc: lax.map(lambda wi: x @ wi, wc).transpose(1, 0, 2).reshape(x.shape[0], N))
chunks = {c: jnp.asarray(np.asarray(W).reshape(K, c, N // c).transpose(1, 0, 2).copy()) for c in (8, 32)}
print("| M | one dot ms | / M = 1 | GB/s of weights | GFLOP/s | 8 chunks ms | 32 chunks ms |")
print("|---|---|---|---|---|---|---|")
base = None
for m in (1, 4, 8):
    x = jnp.asarray(rng.normal(size=(m, K)), jnp.float32)
    t = ms(plain, x, W)
    base = base or t
    for c, wc in chunks.items():
        np.testing.assert_allclose(np.asarray(split(x, wc)), np.asarray(plain(x, W)), rtol=1e-5, atol=1e-4)
    print(f"| {m} | {t:.2f} | {t / base:.2f}x | {K * N * 4 / t / 1e6:.0f} | {2 * m * K * N / t / 1e6:.0f} | "
          f"{ms(split, x, chunks[8]):.2f} | {ms(split, x, chunks[32]):.2f} |")
