"""The products kernel on SmolLM2's 30 layers' Dense weights (q, k, v, o, gate, up, down; random, 425 MB in float32),
chained in one jitted program per build, this checkout's build ("current") against other builds of
`cpu_products.cc`, calls alternated in one process; every build must give the same outputs bit for bit.

    [LAYERS=30] SOS=old=/tmp/old.so python ab_products_chain.py float32|bfloat16 PAIRS ROWS...

LAYERS: distinct layers' weights (a divisor of 30), read in turn 30 layers in all: 1 keeps them in L3 (14 MB in
float32), the arithmetic's own rate. SOS: name=library pairs, comma-separated (build a library as `ab_loop.py`'s
docstring shows). Prints the median ms per chain and, in parentheses, the median per-pair ratio to "current"."""
import ctypes, os, sys, time
import numpy as np, jax, jax.numpy as jnp
from carryover_jax.models import cpu_products as cp
assert cp.available()
dt = sys.argv[1]; pairs = int(sys.argv[2]); rows = [int(a) for a in sys.argv[3:]]
sym = {"float32": "CarryoverCpuProducts", "bfloat16": "CarryoverCpuProductsBf16"}[dt]
targets = {"current": cp.TARGETS["kn", dt]}
for spec in os.environ.get("SOS", "").split(","):
    if not spec: continue
    name, path = spec.split("=")
    lib = ctypes.cdll.LoadLibrary(path)
    jax.ffi.register_ffi_target(f"ab_{name}_{dt}", jax.ffi.pycapsule(getattr(lib, sym)), platform="cpu")
    targets[name] = f"ab_{name}_{dt}"
rng = np.random.default_rng(0)
layers = int(os.environ.get("LAYERS", 30))  # distinct layers, read in turn 30 times in all (LAYERS=1: hot in L3)
shapes = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)] * layers
ws = [jnp.asarray(rng.normal(size=s) * 0.02, dt) for s in shapes] * (30 // layers)
def chain(target):
    def f(x, ws):
        acc = jnp.zeros((x.shape[0],), jnp.float32)
        for w in ws:
            xin = x if w.shape[0] == x.shape[1] else jnp.zeros((x.shape[0], w.shape[0]), x.dtype) + x[:, :1]
            y = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32))(xin, w)
            acc = acc + y[:, 0]
        return acc
    return jax.jit(f)
for m in rows:
    x = jnp.asarray(rng.normal(size=(m, 576)), dt)
    fs = {k: chain(t) for k, t in targets.items()}
    ref = np.asarray(fs["current"](x, ws))
    for k, f in fs.items():
        np.testing.assert_array_equal(ref, np.asarray(f(x, ws)), err_msg=k)
    ts = {k: [] for k in fs}
    names = list(fs)
    for i in range(pairs):
        for k in (names if i % 2 == 0 else names[::-1]):
            t = time.perf_counter(); fs[k](x, ws).block_until_ready(); ts[k].append(time.perf_counter() - t)
    base = np.array(ts["current"])
    print(f"{dt} rows {m}: " + ", ".join(f"{k} {np.median(v)*1e3:.2f} ms ({np.median(np.array(v)/base):.3f})" for k, v in ts.items()), flush=True)
