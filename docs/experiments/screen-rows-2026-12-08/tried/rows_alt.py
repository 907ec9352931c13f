"""The products kernel over SmolLM2's 30 layers' Dense shapes (random, from memory) at several row counts, calls
alternated row count by row count; median ms and the median per-pair ratio to the first row count.

    python rows_alt.py REPEATS ROWS..."""
import sys, time
import numpy as np, jax, jax.numpy as jnp
from carryover_jax.models import cpu_products as cp
rows = list(dict.fromkeys(int(a) for a in sys.argv[2:])); reps = int(sys.argv[1])
rng = np.random.default_rng(0)
shapes = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)] * 30
ws = [jnp.asarray(rng.normal(size=s) * 0.02, jnp.float32) for s in shapes]
@jax.jit
def f(x, ws):
    acc = jnp.zeros((x.shape[0],), jnp.float32)
    for w in ws:
        xi = x[:, :w.shape[0]] if w.shape[0] <= x.shape[1] else jnp.tile(x, (1, 3))[:, :w.shape[0]]
        acc = acc + cp.products(xi + acc[:, None] * 0, w, "kn")[:, 0]
    return acc
xs = {r: jnp.asarray(rng.normal(size=(r, 576)), jnp.float32) for r in rows}
for r in rows: jax.block_until_ready(f(xs[r], ws))
t = {r: [] for r in rows}
for i in range(reps):
    for r in rows[i % len(rows):] + rows[:i % len(rows)]:
        t0 = time.perf_counter(); jax.block_until_ready(f(xs[r], ws)); t[r].append(time.perf_counter() - t0)
for r in rows:
    print(f"rows {r}: {np.median(t[r])*1e3:.2f} ms, ÷ rows {rows[0]}: {np.median(np.array(t[r]) / np.array(t[rows[0]])):.3f}")
