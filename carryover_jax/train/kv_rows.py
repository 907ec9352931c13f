"""Every target layer's K/V of a recorded sequence as one row per token: what a response store holds with
`data.store_kv`, so that DVD's verification reads the recorded prefix instead of running the target over it.

A row is the layers in order, each layer's k then v, each head-major [Hkv_l, D_l] flattened (Gemma's layers
differ in heads and head size, so the width is a sum over layers). Keys are stored after RoPE and the k-norm,
exactly as `TargetLM.features(..., with_kv=True)` returns them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from carryover_jax.config import TargetConfig
from carryover_jax.errors import ConfigError

Array = jax.Array


def kv_width(cfg: TargetConfig) -> int:
    """Values per token of a stored K/V row."""
    return sum(2 * cfg.layer_kv_heads(i) * cfg.layer_head_dim(i) for i in range(cfg.num_layers))


def pack_kv(ks, vs) -> Array:
    """Per-layer head-major (k, v) [B, Hkv_l, S, D_l] -> rows [B, S, kv_width]."""
    parts = []
    for k, v in zip(ks, vs):
        for x in (k, v):
            b, h, s, d = x.shape
            parts.append(jnp.swapaxes(x, 1, 2).reshape(b, s, h * d))
    return jnp.concatenate(parts, axis=-1)


def unpack_kv(cfg: TargetConfig, rows: Array) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    """Rows [B, S, kv_width] -> per-layer (ks, vs), each [B, Hkv_l, S, D_l] in the target's compute dtype."""
    if rows.shape[-1] != kv_width(cfg):
        raise ConfigError(f"stored K/V rows hold {rows.shape[-1]} values per token, this target's layers need "
                          f"{kv_width(cfg)}: the store was prepared for another target")
    b, s, _ = rows.shape
    ks, vs, at = [], [], 0
    for i in range(cfg.num_layers):
        h, d = cfg.layer_kv_heads(i), cfg.layer_head_dim(i)
        for out in (ks, vs):
            out.append(jnp.swapaxes(rows[..., at:at + h * d].reshape(b, s, h, d), 1, 2).astype(cfg.dtype))
            at += h * d
    return tuple(ks), tuple(vs)
