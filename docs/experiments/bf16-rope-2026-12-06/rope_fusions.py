"""The bf16 prefill's RoPE and conversion fusions alone, at SmolLM2's shapes for a sub-batch of 8 prompts of 100
tokens (800 rows, 9 query heads, 3 K/V heads, head dim 64): each form jitted, the median of 200 calls.

    python rope_fusions.py"""
import time

import jax
import jax.numpy as jnp
import numpy as np


def median_ms(f, *args, reps=200):
    f = jax.jit(f)
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        s = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - s)
    return round(float(np.median(ts)) * 1e3, 3)


def rope(x, cos, sin, dt):
    x, cos, sin = x.astype(dt), cos[:, :, None, :].astype(dt), sin[:, :, None, :].astype(dt)
    return x * cos + jnp.concatenate([-x[..., 32:], x[..., :32]], -1) * sin


bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16)  # noqa: E731
to_kernel = lambda y: y.reshape(8, 100, 3, 3, 64).transpose(0, 2, 3, 1, 4).reshape(8, 3, 300, 64)  # noqa: E731
r = np.random.default_rng(0)
q32 = jnp.asarray(r.standard_normal((800, 576)), jnp.float32)  # the q product's float32 accumulator
k32 = jnp.asarray(r.standard_normal((800, 192)), jnp.float32)
cs = jnp.asarray(r.standard_normal((8, 100, 64)), jnp.float32)
o = jnp.asarray(r.standard_normal((8, 3, 300, 64)), jnp.float32)
den = jnp.asarray(r.random((8, 3, 300)) + 1, jnp.float32)
bf = jnp.bfloat16
forms = {
    "queries, bf16 RoPE as HF, widened for the kernel": lambda q, c, s: to_kernel(
        rope(q.astype(bf).reshape(8, 100, 9, 64), c, s, bf).astype(jnp.float32)),
    "queries, rounded first, RoPE in float32, rounded, widened": lambda q, c, s: to_kernel(
        rope(q.astype(bf).reshape(8, 100, 9, 64), c, s, jnp.float32).astype(bf).astype(jnp.float32)),
    "queries, RoPE in float32 on the accumulator, rounded once, widened": lambda q, c, s: to_kernel(
        rope(q.reshape(8, 100, 9, 64), c, s, jnp.float32).astype(bf).astype(jnp.float32)),
    "keys, bf16 RoPE as HF, to bits, head-major": lambda k, c, s: bits(
        rope(k.astype(bf).reshape(8, 100, 3, 64), c, s, bf)).transpose(0, 2, 1, 3),
    "keys, RoPE in float32 on the accumulator, rounded once, to bits, head-major": lambda k, c, s: bits(
        rope(k.reshape(8, 100, 3, 64), c, s, jnp.float32).astype(bf)).transpose(0, 2, 1, 3),
}
for name, f in forms.items():
    print(f"{name}: {median_ms(f, q32 if name.startswith('q') else k32, cs, cs)} ms")
v_bits = lambda v: bits(v.astype(bf)).reshape(8, 100, 3, 64).transpose(0, 2, 1, 3)  # noqa: E731
out_bf16 = lambda o, d: (o / d[..., None]).astype(bf).reshape(8, 3, 3, 100, 64).transpose(  # noqa: E731
    0, 3, 1, 2, 4).reshape(800, 576)
print(f"V rounded to bits, head-major: {median_ms(v_bits, k32)} ms")
print(f"attention output normalised to bf16, token-major: {median_ms(out_bf16, o, den)} ms")
