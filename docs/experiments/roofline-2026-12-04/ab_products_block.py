"""The few-row products kernel against an earlier build of it, in one process: SmolLM2-shaped weights of 30 layers
(q, k, v, o, gate, up, down) at 1, 4 and 8 rows, calls alternated pair by pair.

    git show 7af78e0:carryover_jax/models/cpu_products.cc > /tmp/old_products.cc
    cp carryover_jax/models/cpu_common.h /tmp/
    g++ -O3 -std=c++17 -shared -fPIC -march=native -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" \
        -I /tmp /tmp/old_products.cc -o /tmp/old.so
    OLD_SO=/tmp/old.so python ab_products_block.py float32|bfloat16 PAIRS [AA]

The earlier build is registered under its own target names; AA times it against itself (the A/A check)."""
import ctypes, os, sys, time
import numpy as np, jax, jax.numpy as jnp
from carryover_jax.models import cpu_products as cp
lib = ctypes.cdll.LoadLibrary(os.environ["OLD_SO"])
for dt, sym in (("float32", "CarryoverCpuProducts"), ("bfloat16", "CarryoverCpuProductsBf16")):
    jax.ffi.register_ffi_target(f"old_products_{dt}", jax.ffi.pycapsule(getattr(lib, sym)), platform="cpu")
assert cp.available()
dt = sys.argv[1]; pairs = int(sys.argv[2])
rng = np.random.default_rng(0)
shapes = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)] * 30
ws = [jnp.asarray(rng.normal(size=s) * 0.02, dt) for s in shapes]
def chain(target):
    def f(x, ws):
        acc = jnp.zeros((x.shape[0],), jnp.float32)
        for w in ws:
            xin = x if w.shape[0] == x.shape[1] else jnp.zeros((x.shape[0], w.shape[0]), x.dtype) + x[:, :1]
            y = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32))(xin, w)
            acc = acc + y[:, 0]
        return acc
    return jax.jit(f)
res = {}
for m in (1, 4, 8):
    x = jnp.asarray(rng.normal(size=(m, 576)), dt)
    fo = chain(f"old_products_{dt}")
    fn = chain(f"old_products_{dt}") if "AA" in sys.argv else chain(cp.TARGETS["kn", dt])
    np.testing.assert_array_equal(np.asarray(fo(x, ws)), np.asarray(fn(x, ws)))  # SmolLM2's shapes: bit for bit
    ts = {"old": [], "new": []}
    for i in range(pairs):
        for k, f in (("old", fo), ("new", fn)) if i % 2 == 0 else (("new", fn), ("old", fo)):
            t = time.perf_counter(); f(x, ws).block_until_ready(); ts[k].append(time.perf_counter() - t)
    r = np.array(ts["new"]) / np.array(ts["old"])
    print(f"{dt} rows {m}: old {np.median(ts['old'])*1e3:.2f} ms, new {np.median(ts['new'])*1e3:.2f} ms; new/old per pair median {np.median(r):.3f} (range {r.min():.3f}-{r.max():.3f}, {pairs} pairs)", flush=True)
