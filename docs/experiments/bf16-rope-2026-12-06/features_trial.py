"""Prepare's feature pass (configs/smollm2, 32 random 320-token sequences, `train.responses._features`) in float32
and bf16: as it runs (the causal `Prefix` mask: einsum over the full [320, 320] scores), and in a trial that gives
the target's cache-free forward a `LiveMask` instead (the CPU attention kernel, forward only), not kept. Also the
head's log-sum-exp alone (`head_logsumexp` on a bf16 [32, 320, 576] last hidden state). Prints each arm's outputs'
largest difference from the kept form, then two rounds of every arm.

    python features_trial.py"""
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.config import zlab_layer_ids
from carryover_jax.configs import load_config
from carryover_jax.loading import load_target
from carryover_jax.models import layers
from carryover_jax.models import target as T
from carryover_jax.train import responses

KEPT = T.Prefix
arms = {}
for dtype in ("float32", "bfloat16"):
    cfg = load_config("smollm2")
    if dtype != "float32":
        cfg = cfg.replace(numerics=cfg.numerics.replace(dtype=dtype), compute_dtype=None)
    t = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
    ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(t.cfg.num_layers))
    toks = jnp.asarray(np.random.default_rng(0).integers(10, t.cfg.vocab_size, (32, cfg.data.max_len)))
    outs = {}
    for mask in ("Prefix", "LiveMask"):
        T.Prefix = KEPT if mask == "Prefix" else (lambda limit, lower=None: layers.LiveMask(limit, lower=lower))
        f = jax.jit(lambda p, x, t=t, ids=ids: responses._features.__wrapped__(p, x, cfg=t.cfg, layer_ids=ids,
                                                                                kv_dtype=None))  # traced per arm
        outs[mask] = jax.block_until_ready(f(t.params, toks))
        arms[f"{dtype} features, {mask}"] = lambda f=f, p=t.params, x=toks: f(p, x)
    T.Prefix = KEPT
    print(dtype, "largest |LiveMask - Prefix| (stored dtypes):",
          {k: float(np.max(np.abs(np.asarray(outs["LiveMask"][k], np.float32)
                                  - np.asarray(outs["Prefix"][k], np.float32)))) for k in outs["Prefix"]})
    h = jnp.asarray(np.random.default_rng(0).normal(size=(32, cfg.data.max_len, 576)), jnp.bfloat16)
    lse = jax.jit(lambda p, h, c=t.cfg: T.head_logsumexp(c, p, h))
    jax.block_until_ready(lse(t.params, h))
    arms[f"{dtype} head log-sum-exp alone"] = lambda f=lse, p=t.params, h=h: f(p, h)
for r in range(2):
    for name, fn in arms.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        print(f"round {r}: {name} {time.perf_counter() - start:.2f} s", flush=True)
