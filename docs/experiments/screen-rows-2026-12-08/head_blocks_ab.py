"""The float32 tied head's products (`products(x, e, "nk")`) at R rows: this build against another library's, calls
alternated, SmolLM2's embedding and states; outputs equal bit for bit.

    SO=LIB python head_blocks_ab.py REPEATS ROWS..."""
import ctypes, os, sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_products as cp
from carryover_jax.models.target import TargetLM
t = load_target("smollm2"); cfg, params = t.cfg, t.params
e = params["embed_tokens"]["embedding"]
assert cp.available()
lib = ctypes.cdll.LoadLibrary(os.environ["SO"])
jax.ffi.register_ffi_target("nk_before", jax.ffi.pycapsule(lib.CarryoverCpuProductsRows), platform="cpu")
ids = jnp.asarray(t.tokenizer(open("/work/main/docs/design.md").read())["input_ids"][:400])[None]
h = TargetLM(cfg).apply({"params": params}, ids, with_hidden=True)[3][0]
def before(x):
    return jax.ffi.ffi_call("nk_before", jax.ShapeDtypeStruct((x.shape[0], e.shape[0]), jnp.float32),
                            vmap_method="sequential")(x, e)
arms = {"this": jax.jit(lambda x: cp.products(x, e, "nk")), "before": jax.jit(before)}
arms["before again"] = jax.jit(arms["before"].__wrapped__)  # the A/A: the same function, compiled again
reps = int(sys.argv[1])
for r in [int(a) for a in sys.argv[2:]]:
    tt = {k: [] for k in arms}
    for rep in range(reps + 1):
        x = h[(rep * r) % (400 - r):(rep * r) % (400 - r) + r]
        outs = {}
        for k in list(arms)[rep % 3:] + list(arms)[:rep % 3]:
            t0 = time.perf_counter(); outs[k] = np.asarray(jax.block_until_ready(arms[k](x)))
            if rep: tt[k].append(time.perf_counter() - t0)
        assert np.array_equal(outs["this"], outs["before"])
    rr = np.array(tt["this"]) / np.array(tt["before"])
    aa = np.array(tt["before again"]) / np.array(tt["before"])
    print(f"rows {r}: this {np.median(tt['this'])*1e3:.2f} ms, before {np.median(tt['before'])*1e3:.2f} ms, "
          f"this/before per pair {np.median(rr):.3f} "
          f"[{np.percentile(rr, 10):.3f}-{np.percentile(rr, 90):.3f}]; bits equal; A/A {np.median(aa):.3f} "
          f"[{np.percentile(aa, 10):.3f}-{np.percentile(aa, 90):.3f}]")
