"""The products alone: a bare jitted chain of SmolLM2's 30 layers' projections and MLP (float32, random weights,
HF's separate q, k, v, o, gate, up, down) plus the tied head, at 1 and N rows, with XLA's dots and with the
few-row kernel (`cpu_products.products`), all four programs compiled side by side and their calls alternated.
`python chain_products.py REPS [ROWS ...]` (default 20 alternated calls, rows 4 and 8)."""
import sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.models import cpu_products as cp

L, d, f, kv, V = 30, 576, 1536, 192, 49152
ks = iter(jax.random.split(jax.random.key(0), 7 * L + 1))
n = lambda *s: jax.random.normal(next(ks), s) * 0.02  # noqa: E731
W = [dict(q=n(d, d), k=n(d, kv), v=n(d, kv), o=n(d, d), g=n(d, f), u=n(d, f), dn=n(f, d)) for _ in range(L)]
E = n(V, d)
FORMS = {"xla": (lambda x, w: x @ w, lambda x, e: x @ e.T),
         "kernel": (lambda x, w: cp.products(x, w, "kn"),
                    lambda x, e: cp.products(x, e, "nk") if x.shape[0] <= cp.MAX_ROWS["nk"] else x @ e.T)}


def chain(mm, head):
    def fn(x, W, E):
        for w in W:
            q, k, v = mm(x, w["q"]), mm(x, w["k"]), mm(x, w["v"])
            x = x + mm(q + jnp.tile(k + v, 3), w["o"])
            x = x + mm(jax.nn.silu(mm(x, w["g"])) * mm(x, w["u"]), w["dn"])
        return head(x, E)
    return fn


REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
for rows in [int(r) for r in sys.argv[2:]] or [4, 8]:
    progs = {}
    for name, (mm, head) in FORMS.items():
        for r in (1, rows):
            x = jnp.ones((r, d)) * 0.1
            jax.clear_caches()
            progs[name, r] = (jax.jit(chain(mm, head)).lower(x, W, E).compile(), x)
    ts = {k: [] for k in progs}
    for _ in range(REPS):
        for k, (p, x) in progs.items():
            t = time.perf_counter(); jax.block_until_ready(p(x, W, E)); ts[k].append(time.perf_counter() - t)
    m = {k: 1e3 * float(np.median(v)) for k, v in ts.items()}
    print(f"{rows} rows, {REPS} alternated calls, median ms: " + ", ".join(f"{a} {r} row(s) {v:.2f}" for (a, r), v in m.items()))
    print(f"  {rows} rows / XLA's 1 row: xla {m['xla', rows] / m['xla', 1]:.3f}, kernel {m['kernel', rows] / m['xla', 1]:.3f};"
          f" kernel 1 row / XLA's 1 row {m['kernel', 1] / m['xla', 1]:.3f}")
