"""Large forwards on CPU in one pass against sub-batches of ~1,024 token rows (numerics.sub_batched), compiled side
by side and alternated in one process: the AR prefill (batch 64, 128-token bucket), speculative prefill, and
prepare's stored-feature pass (32 x 320 tokens)."""
import sys, time, numpy as np, jax, jax.numpy as jnp
from carryover_jax import numerics
from carryover_jax.loading import load_target
from carryover_jax.decode import autoregressive as ar
from carryover_jax.train import responses
target = load_target("smollm2"); cfg, params = target.cfg, target.params
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
rng = np.random.default_rng(0)
toks = jnp.asarray(rng.integers(100, 40000, (64, 128)), jnp.int32)
lens = jnp.asarray(rng.integers(90, 128, (64,)), jnp.int32)
feat = jnp.asarray(rng.integers(100, 40000, (32, 320)), jnp.int32)
cases = {
    "prefill 64 x 128": (lambda: ar.prefill.lower(cfg, params, toks, lens, max_len=256).compile(),
                         lambda c: c(params, toks, lens)),
    "features 32 x 320": (lambda: responses._features.lower(params, feat, cfg=cfg, layer_ids=(1, 15, 28), kv_dtype=None).compile(),
                          lambda c: c(params, feat)),
}
settings = {"one pass": 10**9, "sub-batches": numerics.CPU_PASS_TOKENS, "512": 512, "2048": 2048}
for name, (build, call) in cases.items():
    comp = {}
    for k, mt in settings.items():
        numerics.CPU_PASS_TOKENS = mt
        jax.clear_caches()
        comp[k] = build()
    outs = [jax.tree.leaves(jax.block_until_ready(call(c))) for c in comp.values()]
    err = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) for a, b in zip(outs[0], outs[1]))
    t = {k: [] for k in comp}
    for r in range(REPS):
        for k in (list(comp) if r % 2 == 0 else list(comp)[::-1]):
            s = time.perf_counter(); jax.block_until_ready(call(comp[k])); t[k].append(time.perf_counter() - s)
    print(f"{name}: " + ", ".join(f"{k} {np.median(v):.2f} s" for k, v in t.items()) + f"; max |diff| {err:.2e}")
    for k in list(t)[1:]: print(f"  one pass / {k} per pair:", [round(a / b, 3) for a, b in zip(t["one pass"], t[k])])
