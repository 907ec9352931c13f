"""30 layers' Dense products at R rows: 7 calls a layer (q, k, v, o, gate, up, down) against 4 (qkv and gate|up
concatenated, the same bytes), alternated; median ms and per-pair ratio merged / split.

    python merge_calls.py REPEATS ROWS"""
import sys, time
import numpy as np, jax, jax.numpy as jnp
from carryover_jax.models import cpu_products as cp
reps = int(sys.argv[1]); R = int(sys.argv[2])
rng = np.random.default_rng(0)
split_shapes = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
merged_shapes = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
def mk(shapes): return [[jnp.asarray(rng.normal(size=s) * 0.02, jnp.float32) for s in shapes] for _ in range(30)]
ws = {"split": mk(split_shapes), "merged": mk(merged_shapes)}
def chain(x, layers):
    acc = jnp.zeros((x.shape[0],), jnp.float32)
    for layer in layers:
        for w in layer:
            xi = x[:, :w.shape[0]] if w.shape[0] <= x.shape[1] else jnp.tile(x, (1, 3))[:, :w.shape[0]]
            acc = acc + cp.products(xi + acc[:, None] * 0, w, "kn")[:, 0]
    return acc
f = jax.jit(chain)
x = jnp.asarray(rng.normal(size=(R, 576)), jnp.float32)
for k in ws: jax.block_until_ready(f(x, ws[k]))
t = {k: [] for k in ws}
for i in range(reps):
    for k in (list(ws) if i % 2 else list(ws)[::-1]):
        t0 = time.perf_counter(); jax.block_until_ready(f(x, ws[k])); t[k].append(time.perf_counter() - t0)
for k in ws: print(k, f"{np.median(t[k])*1e3:.2f} ms")
print("merged/split per pair", f"{np.median(np.array(t['merged'])/np.array(t['split'])):.3f}")
