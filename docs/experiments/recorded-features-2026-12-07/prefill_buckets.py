"""A batch-1 float32 prefill of SmolLM2 at each power-of-two prompt bucket (what a padded prompt costs):
median of 5 calls after one untimed. Usage: python prefill_buckets.py"""
import time, sys, jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target
from carryover_jax.decode import autoregressive as ar
t = load_target("/root/.cache/carryover_jax/targets/smollm2")
cfg, p = t.cfg, t.params
res = {}
for T in [16, 32, 64, 128, 256]:
    toks = jnp.asarray(np.random.randint(3, 1000, (1, T)), jnp.int32)
    lens = jnp.asarray([T], jnp.int32)
    c, l = ar.prefill(cfg, p, toks, lens, max_len=512); l.block_until_ready()
    ts = []
    for _ in range(5):
        a = time.perf_counter(); c, l = ar.prefill(cfg, p, toks, lens, max_len=512); l.block_until_ready(); ts.append(time.perf_counter() - a)
    print(T, "%.1f ms" % (1000 * np.median(ts)), "%.2f ms/token" % (1000 * np.median(ts) / T), flush=True)
