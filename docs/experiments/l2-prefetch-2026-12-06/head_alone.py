"""A tied head's products kernel alone in this process: SmolLM2-shaped heads ([49152, 576], random, 4 read in turn),
M rows of x, median ms a head and the stream rate.

    python head_alone.py float32|bfloat16 M CALLS"""
import sys, time, numpy as np, jax, jax.numpy as jnp
from carryover_jax.models import cpu_products as cp
assert cp.available()
dt = sys.argv[1]; m = int(sys.argv[2]); reps = int(sys.argv[3])
t = cp.TARGETS["nk", dt]
rng = np.random.default_rng(0)
E = [jnp.asarray(rng.normal(size=(49152, 576)) * 0.02, dt) for _ in range(4)]
x = jnp.asarray(rng.normal(size=(m, 576)), dt)
call = jax.ffi.ffi_call(t, jax.ShapeDtypeStruct((m, 49152), jnp.float32))
f = jax.jit(lambda x, E: sum(call(x, e)[:, ::4096].sum() for e in E))
f(x, E).block_until_ready()
ts = []
for _ in range(reps):
    t0 = time.perf_counter(); f(x, E).block_until_ready(); ts.append(time.perf_counter() - t0)
b = 49152 * 576 * (2 if dt == "bfloat16" else 4)
print(f"{dt} rows {m}: {np.median(ts) / 4 * 1e3:.2f} ms a head, {b / (np.median(ts) / 4) / 1e9:.1f} GB/s")
