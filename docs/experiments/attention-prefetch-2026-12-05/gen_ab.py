"""What the generation A/B scripts share (`ab_generate_builds.py` here, `tiled-products-2026-12-05/ab_generate.py`):
a batch of random prompts of different lengths prefilled once, fresh arguments of `autoregressive.generate_loop`
for every call, and compiled loops timed call by call in alternated order."""
import time
import jax, jax.numpy as jnp, numpy as np
from carryover_jax.decode import autoregressive as ar


def prefilled(cfg, params, b, plen, max_len, new):
    """A callable giving fresh `generate_loop` arguments (after params) for b random prompts of plen / 2 to plen
    tokens, `new` tokens each; the prefill runs once, untimed."""
    rng = np.random.default_rng(0)
    toks = jnp.asarray(rng.integers(100, 40000, (b, plen)), jnp.int32)
    lens = jnp.asarray(rng.integers(plen // 2, plen + 1, (b,)), jnp.int32)  # rows of different lengths
    cache, logits = ar.prefill(cfg, params, toks, lens, max_len=max_len)
    return lambda: (jax.tree.map(jnp.copy, cache), logits, jax.random.key(0), jnp.zeros((b,)),
                    jnp.full((b,), new, jnp.int32), jnp.full((8,), -1, jnp.int32))


def compile_loop(cfg, params, args, new):
    return ar.generate_loop.lower(cfg, params, *args(), out_size=new).compile()


def alternated(comp, params, args, reps):
    """{label: [seconds per call]}: every compiled loop once a repeat, the order reversed every other repeat."""
    t = {k: [] for k in comp}
    for r in range(reps):
        for k in (list(comp) if r % 2 == 0 else list(comp)[::-1]):
            a = args(); jax.block_until_ready(a)
            s = time.perf_counter(); jax.block_until_ready(comp[k](params, *a).out); t[k].append(time.perf_counter() - s)
    return t
