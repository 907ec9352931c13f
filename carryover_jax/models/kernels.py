"""Fused attention kernels (Pallas) for masks the shipped kernels cannot express.

`prefix_attention`: flash attention over one key/value segment whose mask is a per-query key range
lower[b, t] <= s < limit[b, t] (`layers.Prefix`): training's drafter context attention (block n of a
sequence sees context positions < its anchor, limit = anchor[b, t // T]), DVD verification's prefix
of the recorded sequence, causal prefixes and per-row lengths. The mask is computed inside the kernel
from the two [B, T] int vectors, so neither the [T, S] mask nor the [T, S] scores ever exist in HBM:
memory is O(T + S) per head. Key tiles wholly outside a query tile's [min lower, max limit) range are
not read.

Why not the shipped kernels (`jax.experimental.pallas.ops`): `gpu/attention.mha` and
`tpu/flash_attention` express causal + segment-id masks only (key s visible to query t iff their
segment ids are equal), and `tpu/splash_attention` takes static (host-side) masks; a data-dependent
prefix per query — nested prefixes of one context, one per block — is none of these. `gpu.attention`
also wants K/V in the query's head count and seq-major layout; here K/V stay head-major
[B, Hkv, S, D] like the KV cache, grouped-query heads read their K/V head through the index map.

The kernel is written in the GPU (Triton) Pallas style — one program per (batch, head, query
tile), a `fori_loop` over key tiles with an online softmax, like `gpu/attention.py` — and runs on
CPU with `interpret=True` (the tests). Returns the normalised output and the log-sum-exp per query,
so segments merge flash-style in `attention_core`; a query with no visible key returns output 0 and
lse `NEG_INF` (its segment contributes an exact 0). Gradients: `jax.custom_vjp` with a Pallas
backward (a dq kernel over key tiles, a dk/dv kernel over the query tiles of every query head of the
group), FlashAttention-2 style from the saved lse, including the lse cotangent of the merge.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

NEG_INF = -1e30  # finite, so fully masked rows give a uniform (not NaN) softmax; layers.py uses it too
BLOCK_Q = 64
BLOCK_K = 64


def _pow2_at_least(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def _dot(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _dot_t(a, b):
    """a [M, K] x b [N, K]^T -> [M, N] in float32."""
    return jnp.dot(a, b.T, preferred_element_type=jnp.float32)


def _compiler_params(interpret: bool, num_warps: int = 4, num_stages: int = 2):
    """Triton's compiler params: they also select the Triton lowering (jax's GPU default is Mosaic GPU,
    whose async copies take <= 256 rows, not the whole-K/V blocks used here)."""
    if interpret:
        return None
    from jax.experimental.pallas import triton as plgpu
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _key_tiles(limit, lower, block_k: int, n_tiles: int):
    """[first, end) key tiles that a query tile with these limits/lowers can see."""
    hi = jnp.minimum(lax.div(jnp.max(limit) + (block_k - 1), block_k), n_tiles)
    lo = jnp.minimum(lax.div(jnp.maximum(jnp.min(lower), 0), block_k), hi)
    return lo, hi


def _mask(limit, lower, start, block_k: int):
    span = start + jnp.arange(block_k, dtype=jnp.int32)
    return (span[None, :] < limit[:, None]) & (span[None, :] >= lower[:, None])


# ---- forward -------------------------------------------------------------------------------------
def _fwd_kernel(limit_ref, lower_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale: float, block_k: int):
    q = q_ref[...]
    limit, lower = limit_ref[...], lower_ref[...]
    bq, d = q.shape
    lo, hi = _key_tiles(limit, lower, block_k, k_ref.shape[0] // block_k)

    def body(j, carry):
        m, l, acc = carry
        start = j * block_k
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        mask = _mask(limit, lower, start, block_k)
        s = jnp.where(mask, _dot_t(q, k) * scale, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
        corr = jnp.exp(m - m_new)
        return m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[:, None] + _dot(p.astype(v.dtype), v)

    init = (jnp.full((bq,), NEG_INF, jnp.float32), jnp.zeros((bq,), jnp.float32), jnp.zeros((bq, d), jnp.float32))
    m, l, acc = lax.fori_loop(lo, hi, body, init)
    o_ref[...] = (acc / jnp.maximum(l, 1e-30)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(l > 0, m + jnp.log(jnp.maximum(l, 1e-30)), NEG_INF)


def _forward(q, k, v, limit, lower, scale, block_q, block_k, interpret):
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    kernel = functools.partial(_fwd_kernel, scale=scale, block_k=block_k)
    row = pl.BlockSpec((None, block_q), lambda bi, hi, qi: (bi, qi))
    return pl.pallas_call(
        kernel,
        grid=(b, h, t // block_q),
        in_specs=[row, row,
                  pl.BlockSpec((None, None, block_q, d), lambda bi, hi, qi: (bi, hi, qi, 0)),
                  pl.BlockSpec((None, None, s, d), lambda bi, hi, qi: (bi, hi // g, 0, 0)),
                  pl.BlockSpec((None, None, s, d), lambda bi, hi, qi: (bi, hi // g, 0, 0))],
        out_specs=[pl.BlockSpec((None, None, block_q, d), lambda bi, hi, qi: (bi, hi, qi, 0)),
                   pl.BlockSpec((None, None, block_q), lambda bi, hi, qi: (bi, hi, qi))],
        out_shape=[jax.ShapeDtypeStruct((b, h, t, d), jnp.float32), jax.ShapeDtypeStruct((b, h, t), jnp.float32)],
        compiler_params=_compiler_params(interpret, 4 if d <= 64 else 8),
        interpret=interpret,
        name="carryover_prefix_attention_fwd",
    )(limit, lower, q, k, v)


# ---- backward ------------------------------------------------------------------------------------
def _dq_kernel(limit_ref, lower_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, scale: float,
               block_k: int):
    q, do = q_ref[...], do_ref[...]
    limit, lower = limit_ref[...], lower_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    lo, hi = _key_tiles(limit, lower, block_k, k_ref.shape[0] // block_k)

    def body(j, dq):
        start = j * block_k
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        mask = _mask(limit, lower, start, block_k)
        p = jnp.where(mask, jnp.exp(_dot_t(q, k) * scale - lse[:, None]), 0.0)
        ds = p * (_dot_t(do, v) - delta[:, None]) * scale
        return dq + _dot(ds.astype(k.dtype), k)

    dq = lax.fori_loop(lo, hi, body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkv_kernel(limit_ref, lower_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                scale: float, block_q: int, block_k: int):
    """One key tile of one K/V head: accumulate over the query tiles of all G query heads."""
    k, v = k_ref[...], v_ref[...]
    g, t = q_ref.shape[0], q_ref.shape[1]
    nq = t // block_q
    start = pl.program_id(2) * block_k

    def body(i, carry):
        dk, dv = carry
        gi, qi = lax.div(i, nq), lax.rem(i, nq)
        rows = pl.ds(qi * block_q, block_q)
        q = q_ref[gi, rows, :]
        do = do_ref[gi, rows, :]
        lse, delta = lse_ref[gi, rows], delta_ref[gi, rows]
        mask = _mask(limit_ref[rows], lower_ref[rows], start, k.shape[0])
        p = jnp.where(mask, jnp.exp(_dot_t(q, k) * scale - lse[:, None]), 0.0)
        dv = dv + _dot(p.astype(do.dtype).T, do)
        ds = p * (_dot_t(do, v) - delta[:, None]) * scale
        return dk + _dot(ds.astype(q.dtype).T, q), dv

    zero = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, g * nq, body, (zero, zero))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _backward(q, k, v, limit, lower, out, lse, do, dlse, scale, block_q, block_k, interpret):
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    # FlashAttention-2's D = rowsum(dO * O), minus the lse cotangent (d lse / d scores = P); rows
    # that see no key are constants (out 0, lse NEG_INF): whatever arrives for them is dropped
    seen = lse > NEG_INF / 2
    do = jnp.where(seen[..., None], do, 0).astype(q.dtype)
    delta = jnp.where(seen, jnp.sum(out * do.astype(jnp.float32), axis=-1) - dlse, 0.0)
    row = pl.BlockSpec((None, block_q), lambda bi, hi, qi: (bi, qi))
    qtile = pl.BlockSpec((None, None, block_q, d), lambda bi, hi, qi: (bi, hi, qi, 0))
    kfull = pl.BlockSpec((None, None, s, d), lambda bi, hi, qi: (bi, hi // g, 0, 0))
    stat = pl.BlockSpec((None, None, block_q), lambda bi, hi, qi: (bi, hi, qi))
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, block_k=block_k),
        grid=(b, h, t // block_q),
        in_specs=[row, row, qtile, kfull, kfull, qtile, stat, stat],
        out_specs=qtile,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=_compiler_params(interpret, 4 if d <= 64 else 8),
        interpret=interpret,
        name="carryover_prefix_attention_dq",
    )(limit, lower, q, k, v, do, lse, delta)
    # dk/dv: the G query heads of a K/V head as one [G, T, ...] block
    qg = lambda x: x.reshape(b, hkv, g, *x.shape[2:])  # noqa: E731
    qall = pl.BlockSpec((None, None, g, t, d), lambda bi, ki, si: (bi, ki, 0, 0, 0))
    sall = pl.BlockSpec((None, None, g, t), lambda bi, ki, si: (bi, ki, 0, 0))
    rall = pl.BlockSpec((None, t), lambda bi, ki, si: (bi, 0))
    ktile = pl.BlockSpec((None, None, block_k, d), lambda bi, ki, si: (bi, ki, si, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale, block_q=block_q, block_k=block_k),
        grid=(b, hkv, s // block_k),
        in_specs=[rall, rall, qall, ktile, ktile, qall, sall, sall],
        out_specs=[ktile, ktile],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=_compiler_params(interpret, 4 if d <= 64 else 8),
        interpret=interpret,
        name="carryover_prefix_attention_dkv",
    )(limit, lower, qg(q), k, v, qg(do.astype(q.dtype)), qg(lse), qg(delta))
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _prefix_core(q, k, v, limit, lower, scale, block_q, block_k, interpret):
    return tuple(_forward(q, k, v, limit, lower, scale, block_q, block_k, interpret))


def _prefix_core_fwd(q, k, v, limit, lower, scale, block_q, block_k, interpret):
    out, lse = _forward(q, k, v, limit, lower, scale, block_q, block_k, interpret)
    return (out, lse), (q, k, v, limit, lower, out, lse)


def _prefix_core_bwd(scale, block_q, block_k, interpret, res, cts):
    q, k, v, limit, lower, out, lse = res
    do, dlse = cts
    dq, dk, dv = _backward(q, k, v, limit, lower, out, lse, do, dlse, scale, block_q, block_k, interpret)
    return dq, dk, dv, None, None


_prefix_core.defvjp(_prefix_core_fwd, _prefix_core_bwd)


def prefix_attention(q, k, v, limit, lower=None, *, scale: float, interpret: bool | None = None,
                     block_q: int = BLOCK_Q, block_k: int = BLOCK_K):
    """q [B, H, T, D] (query head h reads K/V head h // (H / Hkv)), k/v [B, Hkv, S, D], limit/lower
    [B, T] int (query t sees keys lower <= s < limit; lower None = 0) -> (out [B, H, T, D] float32,
    lse [B, H, T] float32). Differentiable in q, k, v. `interpret` None: True off GPU.

    Under a mesh (`jax.set_mesh`, as training sets it) the kernel runs per shard through `shard_map`:
    batch over the mesh's "data"/"fsdp" axes and K/V heads over "tensor" where they divide (a Pallas
    call has no SPMD partitioning rule; without this XLA would gather the operands onto every device)."""
    if lower is None:
        lower = jnp.zeros(limit.shape, jnp.int32)
    fn = functools.partial(_prefix_attention, scale=scale, interpret=interpret, block_q=block_q, block_k=block_k)
    mesh = jax.sharding.get_abstract_mesh()
    names = () if mesh is None or mesh.empty else tuple(mesh.axis_names)
    if not names or math.prod(mesh.axis_sizes) == 1:
        return fn(q, k, v, limit, lower)
    from jax.sharding import PartitionSpec as P

    size = dict(zip(names, mesh.axis_sizes))
    bax = tuple(a for a in ("data", "fsdp") if a in size and size[a] > 1)
    if q.shape[0] % math.prod(size[a] for a in bax):
        bax = ()
    hax = "tensor" if size.get("tensor", 1) > 1 and k.shape[1] % size["tensor"] == 0 else None
    if not bax and hax is None:
        return fn(q, k, v, limit, lower)
    bspec = bax or None
    heads, rows = P(bspec, hax, None, None), P(bspec, None)
    return jax.shard_map(fn, mesh=mesh, in_specs=(heads, heads, heads, rows, rows),
                         out_specs=(heads, P(bspec, hax, None)), check_vma=False)(q, k, v, limit, lower)


def _prefix_attention(q, k, v, limit, lower, *, scale, interpret, block_q, block_k):
    b, h, t, d = q.shape
    s = k.shape[2]
    if interpret is None:
        interpret = jax.default_backend() != "gpu"
    bq = min(block_q, _pow2_at_least(t))
    bk = min(block_k, _pow2_at_least(s))
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    limit, lower = limit.astype(jnp.int32), lower.astype(jnp.int32)
    if tp != t:  # padded queries see nothing; their rows are cut off below
        q = jnp.pad(q, ((0, 0), (0, 0), (0, tp - t), (0, 0)))
        limit = jnp.pad(limit, ((0, 0), (0, tp - t)))
        lower = jnp.pad(lower, ((0, 0), (0, tp - t)))
    if sp != s:  # padded keys lie at s >= S >= every limit: never visible
        k = jnp.pad(k, ((0, 0), (0, 0), (0, sp - s), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, 0), (0, sp - s), (0, 0)))
    limit = jnp.minimum(limit, s)
    out, lse = _prefix_core(q, k, v, limit, lower, float(scale), bq, bk, bool(interpret))
    return out[:, :, :t], lse[:, :, :t]
