"""The bf16 prefill's RoPE fusions alone (as bf16-rope-2026-12-06's `rope_fusions.py`: SmolLM2's shapes for a
sub-batch of 8 prompts of 100 tokens, each form jitted, the median of 200 calls, the forms rotated over 3 rounds):
RoPE in float32 on the accumulator rounded once (2026-12-06's form) against `apply_rope`'s `exact="bfloat16"` form (the
accumulator, cos and sin rounded to bf16 values by integer ops, the sum rounded the same way); for a float32 model,
the plain form against `exact="float32"` (12-bit halves, exact products, a fixed sum).

    python rope_fusions.py"""
import time

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.models.layers import apply_rope


def median_ms(f, *args, reps=200):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(reps):
        s = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - s)
    return float(np.median(ts)) * 1e3


bf = jnp.bfloat16
to_kernel = lambda y: y.reshape(8, 100, 3, 3, 64).transpose(0, 2, 3, 1, 4).reshape(8, 3, 300, 64)  # noqa: E731
bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16)  # noqa: E731
r = np.random.default_rng(0)
q32 = jnp.asarray(r.standard_normal((800, 576)), jnp.float32)
k32 = jnp.asarray(r.standard_normal((800, 192)), jnp.float32)
pos = jnp.asarray(np.broadcast_to(np.arange(100), (8, 100)), jnp.int32)
inv = (1.0 / 100000.0 ** (np.arange(0, 64, 2) / 64)).astype(np.float32)
forms = {}
for exact in (None, "bfloat16"):
    tag = "exact bf16 products" if exact else "float32, rounded once"
    forms[f"queries, {tag}, widened for the kernel"] = (jax.jit(lambda q, p, e=exact: to_kernel(
        apply_rope(q.reshape(8, 100, 9, 64), p, inv, exact=e).astype(bf).astype(jnp.float32))), q32)
    forms[f"keys, {tag}, to bits, head-major"] = (jax.jit(lambda k, p, e=exact: bits(
        apply_rope(k.reshape(8, 100, 3, 64), p, inv, exact=e).astype(bf)).transpose(0, 2, 1, 3)), k32)
for exact in (None, "float32"):  # a float32 model: q for the kernel, k to the float32 cache
    tag = "exact float32 products" if exact else "plain"
    forms[f"float32 queries, {tag}, for the kernel"] = (jax.jit(lambda q, p, e=exact: to_kernel(
        apply_rope(q.reshape(8, 100, 9, 64), p, inv, exact=e))), q32)
    forms[f"float32 keys, {tag}, head-major"] = (jax.jit(lambda k, p, e=exact: apply_rope(
        k.reshape(8, 100, 3, 64), p, inv, exact=e).transpose(0, 2, 1, 3)), k32)
times = {name: [] for name in forms}
for _ in range(3):
    for name, (f, x) in forms.items():
        times[name].append(median_ms(f, x, pos))
for name, ts in times.items():
    print(f"{name}: {' / '.join(f'{t:.3f}' for t in ts)} ms")
