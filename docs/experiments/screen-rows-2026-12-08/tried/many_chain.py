"""30 layers' Dense products: 7 calls a layer against grouped calls (q|k|v one call, gate|up one call, the same
separate weights), alternated; bit equality checked. Not kept: needs the CarryoverCpuProductsMany handler of
products_many.cc in the built library.  python many_chain.py REPEATS ROWS..."""
import sys, time
import numpy as np, jax, jax.numpy as jnp
from carryover_jax.models import cpu_products as cp, cpu_kernels
lib = cpu_kernels.library()
jax.ffi.register_ffi_target("many_proto", jax.ffi.pycapsule(lib.CarryoverCpuProductsMany), platform="cpu")
cp.available()
reps = int(sys.argv[1]); rows = [int(a) for a in sys.argv[2:]]
rng = np.random.default_rng(0)
shapes = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
layers = [[jnp.asarray(rng.normal(size=s) * 0.02, jnp.float32) for s in shapes] for _ in range(30)]
def many(x, ws):
    outs = tuple(jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32) for w in ws)
    return jax.ffi.ffi_call("many_proto", outs, vmap_method="sequential")(x, *ws)
def chain(x, layers, grouped):
    out = []
    for q, k, v, o, g, u, d in layers:
        if grouped:
            yq, yk, yv = many(x, (q, k, v)); yg, yu = many(x, (g, u))
        else:
            yq, yk, yv, yg, yu = (cp.products(x, w, "kn") for w in (q, k, v, g, u))
        yo = cp.products(yq, o, "kn"); yd = cp.products(yg * yu, d, "kn")
        out += [yq, yk, yv, yo, yd]
        x = x + (yk.sum() + yv.sum() + yo.sum() + yd.sum()) * 0
    return out
fs = {"split": jax.jit(lambda x, l: chain(x, l, False)), "grouped": jax.jit(lambda x, l: chain(x, l, True))}
for r in rows:
    x = jnp.asarray(rng.normal(size=(r, 576)), jnp.float32)
    a, b = (jax.block_until_ready(f(x, layers)) for f in fs.values())
    assert all(bool((p == q).all()) for p, q in zip(a, b)), "bits differ"
    t = {k: [] for k in fs}
    for i in range(reps):
        for k in (list(fs) if i % 2 else list(fs)[::-1]):
            t0 = time.perf_counter(); jax.block_until_ready(fs[k](x, layers)); t[k].append(time.perf_counter() - t0)
    rr = np.array(t["grouped"]) / np.array(t["split"])
    print(f"rows {r}: split {np.median(t['split'])*1e3:.2f} ms, grouped {np.median(t['grouped'])*1e3:.2f} ms, "
          f"grouped/split per pair {np.median(rr):.3f} (range {rr.min():.3f}-{rr.max():.3f}); bits equal")
