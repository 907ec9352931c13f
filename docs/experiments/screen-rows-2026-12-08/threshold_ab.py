"""HeadArgmax: this build against another library's (the kernel before its threshold passes moved into the threads'
chunks), alternated call by call at SmolLM2's states (the first 400 tokens of docs/design.md), with the bf16 copy's
products alone beside them; A/A: this build under a second name. Every arm's tokens must be the same.

    git show bc9e999:carryover_jax/models/cpu_products.cc > /tmp/before/cpu_products.cc
    cp carryover_jax/models/cpu_common.h /tmp/before/
    g++ -O3 -std=c++17 -shared -fPIC -march=native -I "$(python -c 'import jax; print(jax.ffi.include_dir())')" \
        -I /tmp/before /tmp/before/cpu_products.cc -o /tmp/before.so
    SO=/tmp/before.so python threshold_ab.py ROWS..."""
import ctypes, os, sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_products as cp, cpu_kernels
from carryover_jax.models.target import TargetLM
from carryover_jax.numerics import argmax
t = load_target("smollm2"); cfg, params = t.cfg, t.params
screen = t.greedy_screen(); e = params["embed_tokens"]["embedding"]
cp.head_argmax_available()
for name, path in (("before", os.environ["SO"]), ("again", str(cpu_kernels.build()))):
    lib = ctypes.cdll.LoadLibrary(path) if name == "before" else ctypes.CDLL(path)
    jax.ffi.register_ffi_target(f"head_{name}", jax.ffi.pycapsule(lib.CarryoverCpuHeadArgmax), platform="cpu")
def mk(target):
    def f(x):
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x.shape[0],), jnp.int32), vmap_method="sequential")
        return call(x, x.astype(jnp.bfloat16), e, screen.bits, screen.norms)
    return jax.jit(f)
arms = {"this": mk(cp.HEAD_ARGMAX[1]), "before": mk("head_before"), "again": mk("head_again"),
        "pairs": jax.jit(lambda x: cp.products(x.astype(jnp.bfloat16), screen.bits, "nk"))}
text = open("/work/main/docs/design.md").read()
ids = jnp.asarray(t.tokenizer(text)["input_ids"][:400])[None]
h = TargetLM(cfg).apply({"params": params}, ids, with_hidden=True)[3][0]
full = np.asarray(argmax(h @ e.T))
for r in [int(a) for a in sys.argv[1:]] or [1, 4, 8]:
    for f in arms.values(): jax.block_until_ready(f(h[:r]))
    times = {k: [] for k in arms}
    for rep in range(60):
        x = h[(rep * r) % 392:(rep * r) % 392 + r]
        order = list(arms)[rep % 4:] + list(arms)[:rep % 4]
        outs = {}
        for k in order:
            t0 = time.perf_counter()
            outs[k] = np.asarray(jax.block_until_ready(arms[k](x)))
            times[k].append(time.perf_counter() - t0)
        assert all((outs[k] == outs["this"]).all() for k in ("before", "again"))
    th, be, ag, pa = (np.array(times[k]) for k in ("this", "before", "again", "pairs"))
    rng = np.random.default_rng(0)
    def ci(a, b):
        rr = [np.median(a[i] / b[i]) for i in (rng.integers(0, len(a), len(a)) for _ in range(2000))]
        return np.median(a / b), np.percentile(rr, 2.5), np.percentile(rr, 97.5)
    print(f"rows {r}: this {np.median(th)*1e3:.3f} ms, before {np.median(be)*1e3:.3f} ms; this/before "
          "%.3f [%.3f, %.3f]; A/A again/this %.3f [%.3f, %.3f]; the bf16 products alone %.3f ms"
          % (*ci(th, be), *ci(ag, th), np.median(pa) * 1e3))
tok = np.concatenate([np.asarray(arms["this"](h[i:i + 8])) for i in range(0, 400, 8)])
print("tokens == float32 head argmax:", int((tok == full).sum()), "of", len(full))
