"""Prepare's feature pass (configs/smollm2: 32 random 320-token sequences, `train.responses._features`) with its
causal `Prefix` attention by einsum (attention backend "einsum": the full [320, 320] scores, as before) or by the CPU
attention kernel (backend "cpu", the CPU default), in float32 and bf16; "bf16 cpu again" is "bf16 cpu" compiled a
second time (the A/A). Whole calls, the arms rotated round by round in one process; ratios of mean times with 95%
intervals over the rounds (`eval/paired.paired_bootstrap`) and the outputs' largest differences.

    python ab_features.py ROUNDS"""
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.config import zlab_layer_ids
from carryover_jax.configs import load_config
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.loading import load_target
from carryover_jax.train import responses

rounds = int(sys.argv[1])
arms, outs = {}, {}
for name in ("float32 einsum", "float32 cpu", "bf16 einsum", "bf16 cpu", "bf16 cpu again"):
    dtype, backend = ("float32" if name.startswith("float32") else "bfloat16"), name.split()[1]
    cfg = load_config("smollm2")
    cfg = cfg.replace(numerics=cfg.numerics.replace(dtype=dtype, attention_backend=backend), compute_dtype=None)
    t = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
    ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(t.cfg.num_layers))
    toks = jnp.asarray(np.random.default_rng(0).integers(10, t.cfg.vocab_size, (32, cfg.data.max_len)))
    f = jax.jit(lambda p, x, t=t, ids=ids: responses._features.__wrapped__(p, x, cfg=t.cfg, layer_ids=ids,
                                                                            kv_dtype=None))  # traced per arm
    outs[name] = jax.device_get(f(t.params, toks))
    arms[name] = lambda f=f, p=t.params, x=toks: jax.block_until_ready(f(p, x))
names = list(arms)
secs = rotated_seconds(arms, rounds, lambda r, s: print(
    f"round {r}: " + ", ".join(f"{a} {s[a][-1]:.2f} s" for a in names), flush=True))
for a, b in itertools.combinations(names, 2):
    ratio, lo, hi = speed_ratio(secs[a], secs[b])
    print(f"{b} / {a} speed {ratio:.3f} [{lo:.3f}, {hi:.3f}] over {rounds} rounds "
          f"(mean {np.mean(secs[a]):.2f} / {np.mean(secs[b]):.2f} s)")
for a, b in (("float32 cpu", "float32 einsum"), ("bf16 cpu", "bf16 einsum")):
    print(f"{a} against {b}, largest |difference| (stored dtypes):",
          {k: float(np.max(np.abs(np.asarray(outs[a][k], np.float32) - np.asarray(outs[b][k], np.float32))))
           for k in outs[a]})
