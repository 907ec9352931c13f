"""SmolLM2's 30 layers' Dense products (q, k, v, o, gate, up, down: 210 weights, random) in bf16, chained in one jitted
program, x [M, K] against each w, by XLA's dot and by builds of `cpu_products.cc` (each registered under its own
name; each build's sums within float32 rounding of XLA's, and it says whether they equal the first build's bit for
bit), calls alternated.

    python chain_bf16.py M REPS BUILD.so...

Prints ms per chain and GFLOP/s per arm."""
import ctypes
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

M, reps, sos = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
sh = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
rng = np.random.default_rng(0)
W = [jnp.asarray(rng.normal(size=s), jnp.bfloat16) for _ in range(30) for s in sh]
X = {k: jnp.asarray(rng.normal(size=(M, k)), jnp.bfloat16) for k in (576, 1536)}
dot = lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32)  # noqa: E731
fs = {"xla": jax.jit(lambda X, W: sum(dot(X[w.shape[0]], w)[:, :8].sum() for w in W))}
for i, so in enumerate(sos):
    lib = ctypes.cdll.LoadLibrary(so)
    name = f"var{i}"
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(lib.CarryoverCpuProductsBf16), platform="cpu")

    def call(x, w, name=name):
        return jax.ffi.ffi_call(name, jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32))(x, w)
    fs[so.split("/")[-1]] = jax.jit(lambda X, W, call=call: sum(call(X[w.shape[0]], w)[:, :8].sum() for w in W))
outs = {k: np.asarray(f(X, W)) for k, f in fs.items()}
for k in list(fs)[1:]:
    np.testing.assert_allclose(outs[k], outs["xla"], rtol=1e-3, atol=1e-2)
same = {k: bool(np.array_equal(outs[k], outs[list(fs)[1]])) for k in list(fs)[2:]}
flops = sum(2 * M * k * n for k, n in sh) * 30
ts = {k: [] for k in fs}
for r in range(reps):
    for k, f in (list(fs.items()) if r % 2 == 0 else list(fs.items())[::-1]):
        t0 = time.perf_counter()
        f(X, W).block_until_ready()
        ts[k].append(time.perf_counter() - t0)
print(f"M={M}: " + ", ".join(f"{k} {np.median(v)*1e3:.1f} ms ({flops/np.median(v)/1e9:.0f} GFLOP/s)"
                             for k, v in ts.items()) + (f"; bitwise equal to the first build: {same}" if same else ""))
