"""KV cache as an explicit pytree.

Slot convention: a sequence's token at position p lives in slot p (prompts are right-padded), so
`lengths[b]` is both the write pointer and the number of valid slots of row b. Writes are always
fixed-size chunks (prompt bucket, 1 for AR, block+1 for verification); rollback is setting
`lengths`: stale slots stay in the buffer, are masked out, and are overwritten later.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


# A bf16 cache may be stored as its uint16 bits (`Numerics.cache_bits`, the CPU default): XLA CPU has no
# bf16 scatter, so a vmapped per-row write into a bf16 buffer converts the whole buffer to float32 and back
# (SmolLM2 at batch 64: ~60% of a decode step), while a uint16 write updates the written slots in place.
# Readers take `values(buf)` (bf16) or, in the CPU attention loop, widen the bits chunk by chunk.
BITS = jnp.uint16


def values(buf: Array) -> Array:
    """A cache buffer as numbers: bits storage bitcast back to bf16, anything else as it is."""
    return jax.lax.bitcast_convert_type(buf, jnp.bfloat16) if buf.dtype == BITS else buf


def storage(x: Array, like: Array) -> Array:
    """`x` in the storage dtype of buffer `like` (bits for a bits buffer)."""
    if like.dtype == BITS:
        return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), BITS)
    return x.astype(like.dtype)


def write_chunk(buf: Array, chunk: Array, start: Array) -> Array:
    """buf [B, Hkv, S, D] <- chunk [B, Hkv, T, D] at per-row slot start[b].

    `dynamic_update_slice` clamps a start past S - T, which would shift the chunk back over committed
    slots: callers size the cache so that no write clamps (`decode.speculative.check_request`,
    `decode.generate.plan_lengths`)."""

    def one(b, c, s):
        return jax.lax.dynamic_update_slice_in_dim(b, c, s, axis=1)

    return jax.vmap(one)(buf, storage(chunk, buf), start)


def chunk_mask(lengths: Array, chunk_len: int, max_len: int) -> Array:
    """[B, T, S] mask for a chunk written at `lengths`: query t sees slots <= lengths + t."""
    return jnp.arange(max_len)[None, None, :] < chunk_limit(lengths, chunk_len)[:, :, None]


def chunk_limit(lengths: Array, chunk_len: int) -> Array:
    """[B, T]: query t of a chunk written at `lengths` sees the slots below lengths + t + 1."""
    return lengths[:, None] + jnp.arange(1, chunk_len + 1)[None, :]


@flax.struct.dataclass
class KVCache:
    # per layer [B, H_kv, S, D] (head-major: attention contracts it without transposes, as Pallas
    # decode kernels read it); per-layer buffers update in place when donated
    k: tuple[Array, ...]
    v: tuple[Array, ...]
    lengths: Array  # [B] int32

    @classmethod
    def zeros(cls, *, num_layers: int, batch: int, max_len: int, num_kv_heads: int | tuple[int, ...],
              head_dim: int | tuple[int, ...], dtype=jnp.float32) -> "KVCache":
        """Zeroed buffers; `num_kv_heads` / `head_dim` are one value or one per layer."""
        per = lambda x: tuple(x) if isinstance(x, (tuple, list)) else (x,) * num_layers  # noqa: E731
        shapes = [(batch, h, max_len, d) for h, d in zip(per(num_kv_heads), per(head_dim))]
        # jnp.zeros, never jnp.empty: from jax 0.11 `empty` is uninitialised memory.
        return cls(
            k=tuple(jnp.zeros(s, dtype) for s in shapes),
            v=tuple(jnp.zeros(s, dtype) for s in shapes),
            lengths=jnp.zeros((batch,), jnp.int32),
        )

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    def with_lengths(self, lengths: Array) -> "KVCache":
        """Rollback (or commit) by moving the per-row valid length."""
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))
