"""SmolLM2-shaped tied LM heads ([49152, 576], random; two of them, read alternately) against 1-8 rows of x: the
products kernel's "nk" layout, this checkout's build ("current") against other builds and XLA's dot, calls
alternated in one process; every build must give the same outputs bit for bit.

    [HEADS=2] [XLA_ARM=0] [CHECK=0] SOS=old=/tmp/old.so python ab_head.py float32|bfloat16 PAIRS ROWS...

XLA_ARM=0 leaves XLA's dot out of the rotation; CHECK=0 skips the bit-for-bit check (builds whose sums differ).

Prints the median ms per head. Each call reads HEADS heads in turn (113 MB each in float32): 2 fit this machine's
480 MB L3 cache, 6 do not (as a decode step's 538 MB of weights do not)."""
import ctypes, os, sys, time, numpy as np, jax, jax.numpy as jnp
from carryover_jax.models import cpu_products as cp
assert cp.available()
dt = sys.argv[1]; reps = int(sys.argv[2])
sym = {"float32": "CarryoverCpuProductsRows", "bfloat16": "CarryoverCpuProductsRowsBf16"}[dt]
targets = {"current": cp.TARGETS["nk", dt]}
for spec in os.environ.get("SOS", "").split(","):
    if not spec: continue
    name, path = spec.split("=")
    lib = ctypes.cdll.LoadLibrary(path)
    jax.ffi.register_ffi_target(f"abh_{name}_{dt}", jax.ffi.pycapsule(getattr(lib, sym)), platform="cpu")
    targets[name] = f"abh_{name}_{dt}"
rng = np.random.default_rng(0)
E = [jnp.asarray(rng.normal(size=(49152, 576)) * 0.02, dt) for _ in range(int(os.environ.get("HEADS", 2)))]
for m in [int(a) for a in sys.argv[3:]]:
    x = jnp.asarray(rng.normal(size=(m, 576)), dt)
    fs = {k: jax.jit(lambda x, E, t=t: sum(jax.ffi.ffi_call(t, jax.ShapeDtypeStruct((m, 49152), jnp.float32))(x, e)[:, ::4096].sum() for e in E)) for k, t in targets.items()}
    if os.environ.get("XLA_ARM", "1") == "1":
        fs["xla"] = jax.jit(lambda x, E: sum(jax.lax.dot_general(x, e, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)[:, ::4096].sum() for e in E))
    ref = np.asarray(fs["current"](x, E))
    for k in targets if os.environ.get("CHECK", "1") == "1" else ():
        np.testing.assert_array_equal(ref, np.asarray(fs[k](x, E)), err_msg=k)
    for k, f in fs.items(): f(x, E).block_until_ready()
    ts = {k: [] for k in fs}; names = list(fs)
    for i in range(reps):
        for k in (names if i % 2 == 0 else names[::-1]):
            t = time.perf_counter(); fs[k](x, E).block_until_ready(); ts[k].append(time.perf_counter() - t)
    print(f"{dt} rows {m}: " + ", ".join(f"{k} {np.median(v)*1e3/len(E):.2f} ms" for k, v in ts.items()), flush=True)
