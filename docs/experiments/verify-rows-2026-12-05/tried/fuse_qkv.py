"""q / k / v and gate / up fused into one product each (weights concatenated in the program) against separate products,
SmolLM2 shapes, 30 layers, XLA's dots, 8 steps in a fori_loop, alternated: python fuse_qkv.py float32|bfloat16 ROWS PAIRS"""
import sys, time, jax, jax.numpy as jnp, numpy as np
L, d, f, kv = 30, 576, 1536, 192
dt = sys.argv[1]; rows = int(sys.argv[2]); reps = int(sys.argv[3])
rng = np.random.default_rng(0)
n = lambda *s: jnp.asarray(rng.normal(size=s) * 0.02, dt)
W = [dict(q=n(d, d), k=n(d, kv), v=n(d, kv), o=n(d, d), g=n(d, f), u=n(d, f), dn=n(f, d)) for _ in range(L)]
dot = lambda x, w: jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32).astype(x.dtype)
def sep(x, W):
    for w in W:
        q, k, v = dot(x, w["q"]), dot(x, w["k"]), dot(x, w["v"])
        a = dot(q + jnp.concatenate([k, v, k], -1), w["o"])
        x = x + a
        h = jax.nn.silu(dot(x, w["g"])) * dot(x, w["u"])
        x = x + dot(h, w["dn"])
    return x
def fused(x, W):
    for w in W:
        qkv = dot(x, jnp.concatenate([w["q"], w["k"], w["v"]], 1))
        q, k, v = qkv[:, :d], qkv[:, d:d + kv], qkv[:, d + kv:]
        a = dot(q + jnp.concatenate([k, v, k], -1), w["o"])
        x = x + a
        gu = dot(x, jnp.concatenate([w["g"], w["u"]], 1))
        h = jax.nn.silu(gu[:, :f]) * gu[:, f:]
        x = x + dot(h, w["dn"])
    return x
def looped(fn):  # 8 steps in a loop, as a decode loop hoists the weights' concatenation
    return jax.jit(lambda x, W: jax.lax.fori_loop(0, 8, lambda i, x: fn(x, W) * 0.5, x))
fs = {"separate": looped(sep), "fused": looped(fused)}
x = n(rows, d)
for f_ in fs.values(): f_(x, W).block_until_ready()
np.testing.assert_allclose(np.asarray(fs["separate"](x, W), np.float32), np.asarray(fs["fused"](x, W), np.float32), rtol=0.05, atol=0.05)
ts = {k: [] for k in fs}
for i in range(reps):
    for k in (list(fs) if i % 2 == 0 else list(fs)[::-1]):
        t = time.perf_counter(); fs[k](x, W).block_until_ready(); ts[k].append(time.perf_counter() - t)
fl = 8 * rows * 2 * L * (d * d * 2 + d * kv * 2 + d * f * 3)
print(dt, rows, {k: f"{np.median(v)*1e3/8:.1f} ms/step, {fl/np.median(v)/1e9:.0f} GFLOP/s" for k, v in ts.items()},
      "fused/separate per pair", round(float(np.median(np.array(ts["fused"]) / np.array(ts["separate"]))), 3))
