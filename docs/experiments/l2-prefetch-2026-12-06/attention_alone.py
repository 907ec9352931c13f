"""30 chained calls of the cache attention kernel at a batch-1 decode step's shapes (3 K/V heads x 3 queries, D 64,
1,024-slot caches per layer, ~100 live slots), T query rows each; this checkout's per-query path ("current"), its
tiled path ("tiles", the cache-free forwards' one) and other builds (SOS=name=lib.so,...) alternated in one
process; prints median ms per 30 calls and the median per-pair ratio to "current".

    [SOS=a1=/tmp/a1/a1.so] python attention_alone.py PAIRS T..."""
import ctypes, os, sys, time
import numpy as np, jax, jax.numpy as jnp
from carryover_jax.models import cpu_attention as ca
assert ca.available()
targets = {"current": ca.TARGETS["float32"], "tiles": ca.TARGETS["tiles_float32"]}
for spec in os.environ.get("SOS", "").split(","):
    if not spec: continue
    name, path = spec.split("=")
    lib = ctypes.cdll.LoadLibrary(path)
    jax.ffi.register_ffi_target(f"at_{name}", jax.ffi.pycapsule(lib.CarryoverCpuAttention), platform="cpu")
    targets[name] = f"at_{name}"
rng = np.random.default_rng(0)
Ls = 30
ks = [jnp.asarray(rng.normal(size=(1, 3, 1024, 64)), jnp.float32) for _ in range(Ls)]
vs = [jnp.asarray(rng.normal(size=(1, 3, 1024, 64)), jnp.float32) for _ in range(Ls)]
for T in [int(a) for a in sys.argv[2:]]:
    q = jnp.asarray(rng.normal(size=(1, 3, 3 * T, 64)), jnp.float32)
    limit = jnp.asarray((100 + np.arange(1, T + 1))[None], jnp.int32)  # [B, T]: token t sees slots < 101 + t
    def chain(t):
        def f(q, ks, vs):
            acc = q
            for k, v in zip(ks, vs):
                outs = ((jax.ShapeDtypeStruct((1, 3, 3 * T), jnp.float32),) * 2
                        + (jax.ShapeDtypeStruct((1, 3, 3 * T, 64), jnp.float32),))
                m, s, o = jax.ffi.ffi_call(t, outs)(acc, k, v, limit, jnp.zeros((1, T), jnp.int32),
                                                    scale=np.float32(0.125))
                acc = acc + 1e-3 * o
            return acc
        return jax.jit(f)
    fs = {k: chain(t) for k, t in targets.items()}
    ref = np.asarray(fs["current"](q, ks, vs))
    for k, f in fs.items():
        if k != "tiles": np.testing.assert_array_equal(ref, np.asarray(f(q, ks, vs)), err_msg=k)
        else: print("tiles max diff", float(np.abs(ref - np.asarray(f(q, ks, vs))).max()))
    ts = {k: [] for k in fs}; names = list(fs)
    for i in range(int(sys.argv[1])):
        for k in (names if i % 2 == 0 else names[::-1]):
            t0 = time.perf_counter(); fs[k](q, ks, vs).block_until_ready(); ts[k].append(time.perf_counter() - t0)
    base = np.array(ts["current"])
    print(f"T {T}: " + ", ".join(f"{k} {np.median(v) * 1e3:.3f} ms ({np.median(np.array(v) / base):.3f})"
                                 for k, v in ts.items()), flush=True)
