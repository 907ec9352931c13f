"""AR generation (SmolLM2, greedy, 64 new tokens) with the cache segments read by einsum's 128-slot loop against
the CPU attention kernel (attention backend "einsum" vs "cpu"; everything else the CPU default), compiled side
by side (jit caches cleared between) and timed in alternated pairs in one process.

usage: python ab_generate.py REPS BxPROMPTxMAX_LEN[,...] [float32|bfloat16]
AA=1 compiles "cpu" for both arms (an A/A: the spread that timing alone gives)."""
import dataclasses, os, sys, time, numpy as np, jax, jax.numpy as jnp
from carryover_jax.loading import load_target
from carryover_jax.decode import autoregressive as ar
from carryover_jax.numerics import Numerics

NEW, REPS = 64, int(sys.argv[1])
dtype = sys.argv[3] if len(sys.argv) > 3 else "float32"
target = load_target("smollm2", numerics=Numerics.for_platform("cpu", dtype=dtype))
params = target.params
ARMS = {"einsum": "cpu" if os.environ.get("AA") == "1" else "einsum", "cpu": "cpu"}
cfgs = {arm: dataclasses.replace(target.cfg, numerics=target.cfg.numerics.replace(attention_backend=be))
        for arm, be in ARMS.items()}
print(target.cfg.numerics.describe())
for spec in sys.argv[2].split(","):
    b, plen, max_len = map(int, spec.split("x"))
    rng = np.random.default_rng(0)
    toks = jnp.asarray(rng.integers(100, 40000, (b, plen)), jnp.int32)
    lens = jnp.asarray(rng.integers(plen // 2, plen + 1, (b,)), jnp.int32)  # rows of different lengths
    cache, logits = ar.prefill(cfgs["einsum"], params, toks, lens, max_len=max_len)
    args = lambda: (jax.tree.map(jnp.copy, cache), logits, jax.random.key(0), jnp.zeros((b,)),
                    jnp.full((b,), NEW, jnp.int32), jnp.full((8,), -1, jnp.int32))
    comp = {}
    for be, cfg in cfgs.items():
        jax.clear_caches()
        comp[be] = ar.generate_loop.lower(cfg, params, *args(), out_size=NEW).compile()
    outs = {be: np.asarray(c(params, *args()).out) for be, c in comp.items()}
    same = float(np.mean(np.all(outs["einsum"] == outs["cpu"], axis=1)))
    t = {k: [] for k in comp}
    for r in range(REPS):
        for k in (list(comp) if r % 2 == 0 else list(comp)[::-1]):
            a = args(); jax.block_until_ready(a)
            s = time.perf_counter(); jax.block_until_ready(comp[k](params, *a).out); t[k].append(time.perf_counter() - s)
    print(f"batch {b}, prompts {plen // 2}-{plen}, max_len {max_len}: "
          + ", ".join(f"{k}: {b * NEW / np.median(v):.1f} tok/s" for k, v in t.items())
          + f"; einsum/cpu time per pair {[round(x / y, 3) for x, y in zip(t['einsum'], t['cpu'])]}"
          + f"; rows with identical tokens {same:.3f}", flush=True)
