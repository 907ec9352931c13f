"""A float32 tied head's products at 16-24 rows: the products kernel (`products(x, e, "nk")`, blocked) against XLA's
dot, which took them above 16 rows before; calls alternated, SmolLM2's embedding and states.

    python head_kernel_vs_xla.py REPEATS ROWS..."""
import sys, time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target
from carryover_jax.models import cpu_products as cp
from carryover_jax.models.target import TargetLM
t = load_target("smollm2"); cfg, params = t.cfg, t.params
e = params["embed_tokens"]["embedding"]
ids = jnp.asarray(t.tokenizer(open("/work/main/docs/design.md").read())["input_ids"][:400])[None]
h = TargetLM(cfg).apply({"params": params}, ids, with_hidden=True)[3][0]
arms = {"kernel": jax.jit(lambda x: cp.products(x, e, "nk")),
        "xla": jax.jit(lambda x: jnp.dot(x, e.T, preferred_element_type=jnp.float32))}
arms["xla again"] = jax.jit(arms["xla"].__wrapped__)  # the A/A: the same function, compiled again
for r in [int(a) for a in sys.argv[2:]]:
    tt = {k: [] for k in arms}
    for rep in range(int(sys.argv[1]) + 1):
        x = h[(rep * r) % (400 - r):(rep * r) % (400 - r) + r]
        for k in list(arms)[rep % 3:] + list(arms)[:rep % 3]:
            t0 = time.perf_counter(); jax.block_until_ready(arms[k](x))
            if rep: tt[k].append(time.perf_counter() - t0)
    rr = np.array(tt["kernel"]) / np.array(tt["xla"])
    aa = np.array(tt["xla again"]) / np.array(tt["xla"])
    print(f"rows {r}: kernel {np.median(tt['kernel'])*1e3:.2f} ms, xla {np.median(tt['xla'])*1e3:.2f} ms, "
          f"kernel/xla {np.median(rr):.3f} [{np.percentile(rr, 10):.3f}-{np.percentile(rr, 90):.3f}]; "
          f"A/A {np.median(aa):.3f} "
          f"[{np.percentile(aa, 10):.3f}-{np.percentile(aa, 90):.3f}]")
