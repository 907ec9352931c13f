"""AR generation (SmolLM2, float32, greedy, 64 new tokens) with the CPU live-length loop reading 256-slot against
128-slot chunks, compiled side by side (jit caches cleared between) and alternated in one process."""
import sys, time, numpy as np, jax, jax.numpy as jnp
from carryover_jax.loading import load_target
from carryover_jax.decode import autoregressive as ar
from carryover_jax.models import layers
target = load_target("smollm2"); cfg, params = target.cfg, target.params
NEW, REPS = 64, int(sys.argv[1])
for spec in sys.argv[2].split(","):
    b, plen, max_len = map(int, spec.split("x"))
    toks = jnp.asarray(np.random.default_rng(0).integers(100, 40000, (b, plen)), jnp.int32)
    cache, logits = ar.prefill(cfg, params, toks, jnp.full((b,), plen, jnp.int32), max_len=max_len)
    args = lambda: (jax.tree.map(jnp.copy, cache), logits, jax.random.key(0), jnp.zeros((b,)), jnp.full((b,), NEW, jnp.int32), jnp.full((8,), -1, jnp.int32))
    comp = {}
    for c in (256, 128):
        layers.LiveMask.__init__.__defaults__ = (c, None)
        jax.clear_caches()
        comp[c] = ar.generate_loop.lower(cfg, params, *args(), out_size=NEW).compile()
    layers.LiveMask.__init__.__defaults__ = (256, None)
    outs = [np.asarray(c(params, *args()).out) for c in comp.values()]
    assert (outs[0] == outs[1]).all()
    t = {k: [] for k in comp}
    for r in range(REPS):
        for k in (list(comp) if r % 2 == 0 else list(comp)[::-1]):
            a = args(); jax.block_until_ready(a)
            s = time.perf_counter(); jax.block_until_ready(comp[k](params, *a).out); t[k].append(time.perf_counter() - s)
    print(f"batch {b}, prompt {plen}, max_len {max_len}: " + ", ".join(f"chunk {k}: {b*NEW/np.median(v):.1f} tok/s" for k, v in t.items())
          + "; 256/128 time per pair " + str([round(x / y, 3) for x, y in zip(t[256], t[128])]))
