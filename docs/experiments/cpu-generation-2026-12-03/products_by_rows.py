"""A bare jitted chain of SmolLM2's 30 layers' weight products (float32, random weights, the layers unrolled like
the model's) at N rows: HF's separate projections (q, k, v, o, gate, up, down: 7 products a layer) against fused
q|k|v and gate|up (4 a layer), compiled side by side and alternated in one process.
`REPS=30 python products_by_rows.py 4 1 8` (rows as arguments): what N rows cost against 1 is the floor of
verify(N) / AR on this machine's XLA CPU products."""
import sys, time, jax, jax.numpy as jnp, numpy as np
L, d, f, kv = 30, 576, 1536, 192
ks = iter(jax.random.split(jax.random.key(0), 16))
n = lambda *s: jax.random.normal(next(ks), (L, *s)) * 0.02
sep0 = dict(q=n(d, d), k=n(d, kv), v=n(d, kv), o=n(d, d), g=n(d, f), u=n(d, f), dn=n(f, d))
sep = [{k: v[i] for k, v in sep0.items()} for i in range(L)]
fus = [dict(qkv=jnp.concatenate([w["q"], w["k"], w["v"]], -1), o=w["o"], gu=jnp.concatenate([w["g"], w["u"]], -1),
            dn=w["dn"]) for w in sep]
def chain_sep(x, W):
    def body(x, w):
        q, k, v = x @ w["q"], x @ w["k"], x @ w["v"]
        x = x + (q + jnp.tile(k + v, 3)) @ w["o"]
        x = x + (jax.nn.silu(x @ w["g"]) * (x @ w["u"])) @ w["dn"]
        return x, None
    for w in W: x, _ = body(x, w)
    return x
def chain_fus(x, W):
    def body(x, w):
        h = x @ w["qkv"]; q, k, v = h[:, :d], h[:, d:d+kv], h[:, d+kv:]
        x = x + (q + jnp.tile(k + v, 3)) @ w["o"]
        g = x @ w["gu"]
        x = x + (jax.nn.silu(g[:, :f]) * g[:, f:]) @ w["dn"]
        return x, None
    for w in W: x, _ = body(x, w)
    return x
REPS = int(__import__("os").environ.get("REPS", 15))
for r in [int(a) for a in sys.argv[1:]] or [1, 4, 8]:
    x = jnp.ones((r, d)) * 0.1
    progs = {}
    for name, fn, W in (("sep", chain_sep, sep), ("fused", chain_fus, fus)):
        jax.clear_caches(); progs[name] = (jax.jit(fn).lower(x, W).compile(), W)
    for p, W in progs.values(): jax.block_until_ready(p(x, W))
    ts = {k: [] for k in progs}
    for _ in range(REPS):
        for k, (p, W) in progs.items():
            t = time.perf_counter(); jax.block_until_ready(p(x, W)); ts[k].append(time.perf_counter() - t)
    m = {k: 1e3 * np.median(v) for k, v in ts.items()}
    print(r, "rows:", {k: round(v, 2) for k, v in m.items()}, "sep/fused", round(m["sep"] / m["fused"], 3),
          "pairs", np.round(np.array(ts["sep"]) / np.array(ts["fused"]), 2).tolist(), flush=True)
