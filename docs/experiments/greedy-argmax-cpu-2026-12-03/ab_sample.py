"""AR generation (SmolLM2, float32, greedy), the sampling step before (jnp.argmax, the draw always computed) and
after (numerics.argmax, the draw skipped when no row samples), compiled side by side, alternated in one process."""
import sys, time, numpy as np, jax, jax.numpy as jnp
from carryover_jax.loading import load_target
from carryover_jax.decode import autoregressive as ar, sampling
target = load_target("smollm2"); cfg, params = target.cfg, target.params
NEW, PLEN, REPS = 64, 100, int(sys.argv[1]) if len(sys.argv) > 1 else 5
new_sample = sampling.sample
def old_sample(rng, logits, temperature, top_k=0, top_p=1.0):
    greedy = jnp.argmax(logits, axis=-1)
    drawn = jax.random.categorical(rng, sampling.process_logits(logits, temperature, top_k, top_p), axis=-1)
    return jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)
for b in [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "64,1").split(",")]:
    toks = jnp.asarray(np.random.default_rng(0).integers(100, 40000, (b, PLEN)), jnp.int32)
    cache, logits = ar.prefill(cfg, params, toks, jnp.full((b,), PLEN, jnp.int32), max_len=1024)
    args = lambda: (jax.tree.map(jnp.copy, cache), logits, jax.random.key(0), jnp.zeros((b,)), jnp.full((b,), NEW, jnp.int32), jnp.full((8,), -1, jnp.int32))
    comp = {}
    for name, fn in (("before", old_sample), ("after", new_sample)):
        ar.sample = fn
        jax.clear_caches()
        comp[name] = ar.generate_loop.lower(cfg, params, *args(), out_size=NEW).compile()
    ar.sample = new_sample
    outs = [np.asarray(c(params, *args()).out) for c in comp.values()]
    assert (outs[0] == outs[1]).all()
    t = {k: [] for k in comp}
    for r in range(REPS):
        for k in (list(comp) if r % 2 == 0 else list(comp)[::-1]):
            a = args(); jax.block_until_ready(a)
            s = time.perf_counter(); jax.block_until_ready(comp[k](params, *a).out); t[k].append(time.perf_counter() - s)
    for k in comp: print(f"batch {b}: {k} {b*NEW/np.median(t[k]):.1f} tok/s (median of {REPS})")
    print(f"  after / before speed per pair: {[round(x/y,3) for x, y in zip(t['before'], t['after'])]}")
