"""A batch-64 prefill (64 random 100-token prompts, `autoregressive.prefill`, max_len 256) with RoPE on CPU in
float32 rounded once (`Attention._rope`, "bf16") against bf16 RoPE as HF computes it ("bf16-hf-rope", the
previous code: the projection rounded to bf16, each RoPE op rounding), and float32; "bf16-again" is "bf16"
compiled a second time (the A/A). Whole calls, arms compiled side by side in one process, their order rotated
round by round; ratios of mean times with 95% intervals over the rounds (`eval/paired.paired_bootstrap`).

    python ab_prefill.py ROUNDS"""
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.bench.steps import rotated_seconds
from carryover_jax.decode import autoregressive as ar
from carryover_jax.eval.paired import speed_ratio
from carryover_jax.loading import load_target
from carryover_jax.models import layers
from carryover_jax.numerics import Numerics

rounds = int(sys.argv[1])
rng = np.random.default_rng(0)
ids = jnp.asarray(rng.integers(10, 49000, (64, 100)), jnp.int32)
lens = jnp.full((64,), 100, jnp.int32)
new_rope = layers.Attention._rope


def hf_rope(self, x, positions):
    return layers.apply_rope(x.astype(self.dtype), positions, np.asarray(self.inv_freq, np.float32))


arms, outs = {}, {}
for name, numerics, rope in (("float32", Numerics(), new_rope), ("bf16-hf-rope", Numerics(dtype="bfloat16"), hf_rope),
                             ("bf16", Numerics(dtype="bfloat16"), new_rope),
                             ("bf16-again", Numerics(dtype="bfloat16"), new_rope)):
    t = load_target("smollm2", numerics=numerics)
    layers.Attention._rope = rope  # read when the arm's function is traced, just below
    # a new function per arm around the unjitted prefill: a jitted one caches its trace by (cfg, shapes)
    fn = jax.jit(lambda p, i, n, cfg=t.cfg: ar.prefill.__wrapped__(cfg, p, i, n, max_len=256))
    outs[name] = jax.block_until_ready(fn(t.params, ids, lens))
    arms[name] = lambda fn=fn, p=t.params: jax.block_until_ready(fn(p, ids, lens))
layers.Attention._rope = new_rope
names = list(arms)
secs = rotated_seconds(arms, rounds, lambda r, s: print(
    f"round {r}: " + ", ".join(f"{a} {s[a][-1] * 1e3:.0f} ms" for a in names), flush=True))
for a, b in itertools.combinations(names, 2):
    ratio, lo, hi = speed_ratio(secs[a], secs[b])
    print(f"{b} / {a} speed {ratio:.3f} [{lo:.3f}, {hi:.3f}] over {rounds} rounds "
          f"(mean {np.mean(secs[a]) * 1e3:.0f} / {np.mean(secs[b]) * 1e3:.0f} ms)")
logits = {a: np.asarray(o[1], np.float32) for a, o in outs.items()}  # prefill -> (cache, last-token logits)
keys = {a: np.asarray(jax.tree.leaves(o[0])[0]) for a, o in outs.items()}  # layer 0's K cache (as bits in bf16)
print(f"K cache entries bf16 and bf16-hf-rope write differently: {np.mean(keys['bf16'] != keys['bf16-hf-rope']):.1%}")
for a in ("bf16-hf-rope", "bf16"):
    print(f"{a}: last-token logits' max |diff| from float32 {np.max(np.abs(logits[a] - logits['float32'])):.4g}")
