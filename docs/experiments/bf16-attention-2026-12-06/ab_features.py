"""Prepare's feature pass (configs/smollm2: 32 random 320-token sequences, `train.responses._features`, in its
passes of 8 sequences) in float32 and in bf16, its attention by the CPU kernel's per-query path (`live_attention`;
bf16 queries widened to float32: as before) or by its tiled path (`cpu_attention.prefix_attention`, new); "bf16
tiles again" is the bf16 tiled arm compiled a second time (the A/A). Whole calls, the arms rotated round by round
in one process; ratios of mean times with 95% intervals over the rounds (`eval/paired.paired_bootstrap`) and the
outputs' largest differences.

    python ab_features.py ROUNDS [ARM ...]   (default: every arm)"""
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
from carryover_jax.models import cpu_attention
from carryover_jax.train import responses

rounds = int(sys.argv[1])
tiles = cpu_attention.prefix_attention
arms, outs = {}, {}
for name in sys.argv[2:] or ("float32 per-query", "float32 tiles", "bf16 per-query", "bf16 tiles", "bf16 tiles again"):
    cfg = load_config("smollm2")
    if name.startswith("bf16"):
        cfg = cfg.replace(numerics=cfg.numerics.replace(dtype="bfloat16"), compute_dtype=None)
    t = load_target(cfg.target, numerics=cfg.run_numerics(prepare=True))
    ids = tuple(cfg.data.feature_layer_ids or cfg.drafter.target_layer_ids or zlab_layer_ids(t.cfg.num_layers))
    toks = jnp.asarray(np.random.default_rng(0).integers(10, t.cfg.vocab_size, (32, cfg.data.max_len)))
    # read when the arm is traced (its first call, below)
    cpu_attention.prefix_attention = cpu_attention.live_attention if "per-query" in name else tiles
    f = jax.jit(lambda p, x, t=t, ids=ids: responses._features.__wrapped__(p, x, cfg=t.cfg, layer_ids=ids,
                                                                            kv_dtype=None))
    outs[name] = jax.device_get(f(t.params, toks))
    arms[name] = lambda f=f, p=t.params, x=toks: jax.block_until_ready(f(p, x))
cpu_attention.prefix_attention = tiles
names = list(arms)
secs = rotated_seconds(arms, rounds, lambda r, s: print(
    f"round {r}: " + ", ".join(f"{a} {s[a][-1]:.2f} s" for a in names), flush=True))
for a, b in itertools.combinations(names, 2):
    ratio, lo, hi = speed_ratio(secs[a], secs[b])
    print(f"{b} / {a} speed {ratio:.3f} [{lo:.3f}, {hi:.3f}] over {rounds} rounds "
          f"(mean {np.mean(secs[a]):.2f} / {np.mean(secs[b]):.2f} s)")
for a, b in (("float32 tiles", "float32 per-query"), ("bf16 tiles", "bf16 per-query"),
             ("bf16 tiles", "bf16 tiles again")):
    if a not in outs or b not in outs:
        continue
    print(f"{a} against {b}, largest |difference| (stored dtypes):",
          {k: float(np.max(np.abs(np.asarray(outs[a][k], np.float32) - np.asarray(outs[b][k], np.float32))))
           for k in outs[a]})
