"""Attention over a cache segment (`LiveMask`) or a per-query key range (`Prefix`) on the CPU: the kernel of
`cpu_attention.cc`, an XLA FFI custom call (`cpu_kernels` builds and registers it).

XLA CPU reads a cache segment in 128-slot chunks up to the batch's longest row (`layers._live_loop`), its small
products streaming the K/V at ~15 GB/s. The kernel reads each (row, K/V head)'s own slots once, K then V, on XLA's
intra-op threads (when the pairs are too few to keep the threads busy, as at batch 1, each pair's query rows are
split over them, each part reading the pair's slots), and computes every query's scores and sums in one order
whatever the query count: a token's attention in a verification equals its attention in an AR step bit for bit. The
attention backend "cpu" (the CPU default) uses it; on a machine where it cannot be built, "cpu" is "einsum" with a
one-line warning. Forward only: the loop it replaces served decoding alone; a `Prefix` segment (a cache-free
forward: prepare's features, training's masks) pairs it with einsum's backward (`layers._prefix_kernel`) and takes
the kernel's tiled path (`prefix_attention`: many queries a K/V head, like a matrix product; bf16 by bf16 pairs).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.models import cpu_kernels

MAX_HEAD_DIM = 512  # the kernel keeps a key row in registers: D / 16 vectors (D a multiple of 16)
SYMBOLS = {"float32": "CarryoverCpuAttention", "bfloat16": "CarryoverCpuAttentionBf16",
           "uint16": "CarryoverCpuAttentionBits",  # uint16: a bf16 cache kept as its bits
           # `prefix_attention`: q, k, v all float32 or all bf16
           "tiles_float32": "CarryoverCpuAttentionTiles", "tiles_bfloat16": "CarryoverCpuAttentionTilesBf16"}
# the names carry a version (a changed kernel gets new ones, so a cached program never calls an older kernel)
TARGETS = {dtype: f"carryover_cpu_attention_{dtype}_v3" for dtype in SYMBOLS}


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered with XLA in this process (once; a failure warns once)."""
    return cpu_kernels.register({TARGETS[d]: s for d, s in SYMBOLS.items()},
                                "numerics: attention 'cpu' reads caches with einsum")


def applies(head_dim: int, cache_dtype) -> bool:
    """Whether the kernel takes a cache of this head dim and dtype (float32, bf16, or bf16 kept as uint16 bits)."""
    return (head_dim % 16 == 0 and head_dim <= MAX_HEAD_DIM
            and jnp.dtype(cache_dtype) in (jnp.float32, jnp.bfloat16, jnp.uint16))


def live_attention(qg, k, v, limit, lower, scale: float):
    """qg [B, Hkv, G, T, D], k/v [B, Hkv, S, D] (float32, bf16 or bf16 bits as uint16), limit/lower [B, T] int
    (query t of row b sees slots lower <= s < limit; lower None = 0) -> (max [B, Hkv, G, T, 1], sum [.., 1],
    unnormalised out [.., D]) in float32, as `layers._dense_part` returns them. CPU only."""
    return _call(TARGETS[jnp.dtype(k.dtype).name], qg.astype(jnp.float32), k, v, limit, lower, scale)


def prefix_attention(qg, k, v, limit, lower, scale: float):
    """A cache-free forward's attention (`layers.Prefix`: many queries a K/V head), as `live_attention`. With queries,
    keys and values all float32 or all bf16, the kernel's tiled path: 16 queries a vector lane each against 16 keys
    at a time (bf16: products of bf16 pairs with float32 sums, AVX512-BF16's dot product where the CPU has it, and
    the probabilities rounded to bf16 before the values' product as einsum's bf16 part rounds them); otherwise
    `live_attention`. CPU only."""
    dtype = jnp.dtype(qg.dtype).name
    if not (qg.dtype == k.dtype == v.dtype and dtype in ("float32", "bfloat16")):
        return live_attention(qg, k, v, limit, lower, scale)
    return _call(TARGETS[f"tiles_{dtype}"], qg, k, v, limit, lower, scale)


def _call(target: str, qg, k, v, limit, lower, scale: float):
    if not available():
        raise RuntimeError("the CPU attention kernel is unavailable on this machine (see the warning above)")
    b, hkv, g, t, d = qg.shape
    lower = jnp.zeros(limit.shape, jnp.int32) if lower is None else lower
    outs = (jax.ShapeDtypeStruct((b, hkv, g * t), jnp.float32), jax.ShapeDtypeStruct((b, hkv, g * t), jnp.float32),
            jax.ShapeDtypeStruct((b, hkv, g * t, d), jnp.float32))
    call = jax.ffi.ffi_call(target, outs, vmap_method="sequential")
    m, s, o = call(qg.reshape(b, hkv, g * t, d), k, v, limit.astype(jnp.int32), lower.astype(jnp.int32),
                   scale=np.float32(scale))
    return m.reshape(b, hkv, g, t, 1), s.reshape(b, hkv, g, t, 1), o.reshape(b, hkv, g, t, d)
