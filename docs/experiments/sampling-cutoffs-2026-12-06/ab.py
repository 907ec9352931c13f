"""Top-k / top-p cuts by bisection (`sampling.process_logits`) against the sort they replace, one jitted sampling
step at SmolLM2's vocabulary, in one process: `python ab.py ROUNDS`. Shapes: an AR step at batch 64 and 1 ([B, V])
and a sampled verification of 4 tokens ([1, 4, V], `probs`). Each call is timed in ROUNDS rounds, the arms' order
rotated each round, with the new arm timed twice (the A/A); medians in ms and mean-time ratios with the project's
paired bootstrap over rounds (`eval.paired.speed_ratio`)."""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import sampling
from carryover_jax.eval.paired import speed_ratio

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
V = 49152


def sorted_cuts(logits, temperature, top_k=0, top_p=1.0):  # the form before 2026-12-06
    t = jnp.maximum(temperature, 1e-6)[..., None]
    x = logits.astype(jnp.float32) / t
    if top_k and top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if top_p < 1.0:
        srt = jnp.sort(x, axis=-1)[..., ::-1]
        cum = jnp.cumsum(jax.nn.softmax(srt, axis=-1), axis=-1)
        keep = (cum - jax.nn.softmax(srt, axis=-1)) < top_p
        cutoff = jnp.min(jnp.where(keep, srt, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x < cutoff, -jnp.inf, x)
    return x


def step(cut, shape, top_k, top_p):
    def f(key, logits, t):
        if len(shape) == 3:  # a verification's target distribution
            return jax.nn.softmax(cut(logits, t[:, None], top_k, top_p), axis=-1)
        return jax.random.categorical(key, cut(logits, t, top_k, top_p), axis=-1)
    return jax.jit(f)


calls = {}
for shape in ((64, V), (1, V), (1, 4, V)):
    logits = jax.random.normal(jax.random.key(0), shape) * 3
    t = jnp.ones(shape[:1])
    for top_k, top_p in ((0, 0.95), (50, 1.0)):
        for arm, cut in (("sort", sorted_cuts), ("bisection", sampling.process_logits)):
            f = step(cut, shape, top_k, top_p)
            calls[shape, top_k, top_p, arm] = lambda f=f, lg=logits, t=t: f(jax.random.key(1), lg, t)
        calls[shape, top_k, top_p, "bisection again"] = calls[shape, top_k, top_p, "bisection"]
for c in calls.values():
    jax.block_until_ready(c())
secs = {k: [] for k in calls}
keys = list(calls)
for r in range(rounds):
    for k in keys[r % len(keys):] + keys[: r % len(keys)]:
        a = time.perf_counter()
        jax.block_until_ready(calls[k]())
        secs[k].append(time.perf_counter() - a)
print(f"{jax.devices()[0]}, {rounds} rotated rounds, medians")
print("| shape | cut | sort ms | bisection ms | bisection / sort [95%] | A/A [95%] |")
print("|---|---|---|---|---|---|")
for shape in ((64, V), (1, V), (1, 4, V)):
    for top_k, top_p in ((0, 0.95), (50, 1.0)):
        k = (shape, top_k, top_p)
        ms = {a: 1e3 * float(np.median(secs[k + (a,)])) for a in ("sort", "bisection")}
        ratio = speed_ratio(secs[k + ("bisection",)], secs[k + ("sort",)])
        aa = speed_ratio(secs[k + ("bisection again",)], secs[k + ("bisection",)])
        fmt = lambda x: f"{x[0]:.3f} [{x[1]:.3f}, {x[2]:.3f}]"  # noqa: E731
        name = f"top-p {top_p}" if top_p < 1 else f"top-k {top_k}"
        print(f"| {list(shape)} | {name} | {ms['sort']:.1f} | {ms['bisection']:.1f} | {fmt(ratio)} | {fmt(aa)} |")
