"""Prepare's feature pass (configs/smollm2: 32 random 320-token sequences, `train.responses._features`, in its
passes of 8 sequences), float32 and bf16, its one-segment causal attention by the CPU kernel's tiled path in the
head-major layout (q transposed to [B, Hkv, G, T, D] before the kernel, the output merged and transposed back after
it, as `622a2b3` ran it) or whole in the model's token-major layout (`layers._prefix_cpu_whole`: the kernel reads q
and writes its results as [B, T, Hkv, G, ...], no transposes; new); "... again" arms are the token-major arms
compiled a second time (the A/As). Whole calls, the arms rotated round by round in one process; ratios of mean times
with 95% intervals over the rounds (`eval/paired.paired_bootstrap`) and the outputs' largest differences.

    git apply token_major.patch   # on 622a2b3
    python ab_layout.py ROUNDS"""
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
from carryover_jax.models import layers
from carryover_jax.train import responses

rounds = int(sys.argv[1])
whole = layers._whole_prefix
arms, outs = {}, {}
for name in ("float32 head-major", "float32 token-major", "bf16 head-major", "bf16 token-major",
             "float32 token-major again", "bf16 token-major again"):
    cfg = load_config("smollm2")
    if name.startswith("bf16"):
        cfg = cfg.replace(numerics=cfg.numerics.replace(dtype="bfloat16"), compute_dtype=None)
    t = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
    ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(t.cfg.num_layers))
    toks = jnp.asarray(np.random.default_rng(0).integers(10, t.cfg.vocab_size, (32, cfg.data.max_len)))
    layers._whole_prefix = (lambda *a: False) if "head-major" in name else whole  # read when the arm is traced
    f = jax.jit(lambda p, x, t=t, ids=ids: responses._features.__wrapped__(p, x, cfg=t.cfg, layer_ids=ids,
                                                                            kv_dtype=None))
    outs[name] = jax.device_get(f(t.params, toks))
    arms[name] = lambda f=f, p=t.params, x=toks: jax.block_until_ready(f(p, x))
layers._whole_prefix = whole
names = list(arms)
secs = rotated_seconds(arms, rounds, lambda r, s: print(
    f"round {r}: " + ", ".join(f"{a} {s[a][-1]:.2f} s" for a in names), flush=True))
for a, b in itertools.combinations(names, 2):
    ratio, lo, hi = speed_ratio(secs[a], secs[b])
    print(f"{b} / {a} speed {ratio:.3f} [{lo:.3f}, {hi:.3f}] over {rounds} rounds "
          f"(mean {np.mean(secs[a]):.2f} / {np.mean(secs[b]):.2f} s)")
for a, b in (("float32 token-major", "float32 head-major"), ("bf16 token-major", "bf16 head-major")):
    print(f"{a} against {b}, largest |difference| (stored dtypes):",
          {k: float(np.max(np.abs(np.asarray(outs[a][k], np.float32) - np.asarray(outs[b][k], np.float32))))
           for k in outs[a]})
