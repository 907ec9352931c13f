"""prepare's feature pass (32 x 320 tokens, SmolLM2, float32) without and with the stored log-sum-exp, compiled side by
side and timed in alternated pairs."""
import time, jax, jax.numpy as jnp, numpy as np
from carryover_jax.loading import load_target
from carryover_jax.numerics import Numerics
from carryover_jax.models.target import TargetLM, head_logsumexp
from carryover_jax.config import zlab_layer_ids
target = load_target("smollm2", numerics=Numerics().resolve())
cfg, params = target.cfg, target.params
layers = zlab_layer_ids(cfg.num_layers)
tokens = jnp.asarray(np.random.default_rng(0).integers(10, cfg.vocab_size, (32, 320)), jnp.int32)
def feats(params, tokens, lse):
    taps, last = TargetLM(cfg).apply({"params": params}, tokens, layers, method=TargetLM.features)
    out = [jnp.concatenate(taps, -1).astype(jnp.bfloat16), last.astype(jnp.bfloat16)]
    if lse:
        out.append(head_logsumexp(cfg, params, out[1]))
    return out
fa = jax.jit(lambda p, t: feats(p, t, False)).lower(params, tokens).compile()
fb = jax.jit(lambda p, t: feats(p, t, True)).lower(params, tokens).compile()
jax.block_until_ready(fa(params, tokens)); jax.block_until_ready(fb(params, tokens))
ta, tb = [], []
for _ in range(5):
    for f, ts in ((fa, ta), (fb, tb)):
        t = time.perf_counter(); jax.block_until_ready(f(params, tokens)); ts.append(time.perf_counter() - t)
print("without lse", [round(x, 2) for x in ta], "median", round(float(np.median(ta)), 2))
print("with lse   ", [round(x, 2) for x in tb], "median", round(float(np.median(tb)), 2))
print("pairs with/without", [round(b / a, 2) for a, b in zip(ta, tb)])
