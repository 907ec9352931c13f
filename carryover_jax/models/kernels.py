"""Fused attention kernels (Pallas) for masks the shipped kernels cannot express.

`prefix_attention`: flash attention over one key/value segment whose mask is a per-query key range
lower[b, t] <= s < limit[b, t] (`layers.Prefix`): training's drafter context attention (block n of a
sequence sees context positions < its anchor, limit = anchor[b, t // T]), DVD verification's prefix
of the recorded sequence, causal prefixes, per-row lengths and decode's live-length cache reads. The
mask is computed inside the kernel from the two [B, T] int vectors, so neither the [T, S] mask nor the
[T, S] scores ever exist in HBM: memory is O(T + S) per head. Key tiles wholly outside a query tile's
[min lower, max limit) range are not read, in the forward and in both backward kernels.

Why not the shipped kernels (`jax.experimental.pallas.ops`): `gpu/attention.mha` and
`tpu/flash_attention` express causal + segment-id masks only (key s visible to query t iff their
segment ids are equal), and `tpu/splash_attention` takes static (host-side) masks; a data-dependent
prefix per query — nested prefixes of one context, one per block — is none of these. `gpu.attention`
also wants K/V in the query's head count and seq-major layout; here K/V stay head-major
[B, Hkv, S, D] like the KV cache, grouped-query heads read their K/V head through the index map.

The kernel is written in the GPU (Triton) Pallas style — one program per (batch, head, query tile,
key split), a `fori_loop` over key tiles with an online softmax, like `gpu/attention.py`. Compiled
(Triton) vs interpreted follows the platform the program is LOWERED for (`lax.platform_dependent`),
not the process's default backend: lowering for cuda from a CPU host gives the Triton custom call,
the CPU gets the interpreter (the tests). No branch exists for other platforms, so lowering a
`pallas` program for TPU or ROCm fails there (Mosaic and ROCm Triton are untested); where the process
itself runs on a TPU, `layers.resolve_backend` refuses `pallas` in one line before anything is traced.
Where this jax has no Pallas Triton backend (`numerics.triton_available`; deprecated in jax 0.11), only the
interpreter branch exists, `pallas` is refused for cuda in one line and `auto` reads caches with einsum
there (docs/gpu-kernel-migration.md).

Tiles follow the head dim (`tile_sizes`); when the grid (batch x heads x query tiles) is too small
to fill a GPU — decoding at batch 1 — the key range of every query tile is split over several
programs (`key_splits`, flash-decoding / split-K): each returns a partial softmax (its lse and its
normalised output) and the partials are merged with jnp outside the kernel.

Returns the normalised output and the log-sum-exp per query, so segments merge flash-style in
`attention_core`; a query with no visible key returns output 0 and lse `NEG_INF` (its segment
contributes an exact 0). Gradients: `jax.custom_vjp` with a Pallas backward (a dq kernel over key
tiles, a dk/dv kernel over the query tiles of every query head of the group that can see the key
tile), FlashAttention-2 style from the saved (merged) lse, including the lse cotangent of the merge.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from carryover_jax import numerics
from carryover_jax.errors import ConfigError

# finite, so max/exp arithmetic on masked scores never makes inf - inf = NaN; masked probabilities are
# set to exactly 0 (never exp(NEG_INF - m)), so a row that sees no key returns 0 in every path
# (einsum, xla, pallas). layers.py uses it too.
NEG_INF = -1e30

# H100 / H200 (sm_90): 64K 32-bit registers per SM (at most 255 per thread) and 228 KB shared memory
# per SM (227 KB per thread block).
_REG_FLOATS = 32 * 1024  # f32 accumulators + scores per program: 128 registers/thread at 8 warps
_SMEM_BYTES = 96 * 1024  # K and V tiles x pipeline stages: < half the SM, so two programs fit per SM
_NUM_STAGES = 2
# Split-K target: ~2 waves of programs over the 132 SMs of an H100/H200, and no split shorter than
# 4 key tiles (a program's fixed cost: its q tile load and the merge's partial write).
_TARGET_PROGRAMS = 256
_MIN_TILES_PER_SPLIT = 4


@dataclasses.dataclass(frozen=True)
class Tiles:
    block_q: int
    block_k: int
    num_warps: int
    num_stages: int = _NUM_STAGES


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def tile_sizes(head_dim: int, itemsize: int = 2) -> Tiles:
    """Query/key tile sizes for one head dim, sized for an H100/H200 program.

    Shared memory holds the K and V tiles [block_k, D] of every pipeline stage:
    2 * stages * block_k * D * itemsize <= 96 KB. Registers hold the float32 accumulator [block_q, D]
    (forward, dq) or the dk and dv accumulators [block_k, D] (dk/dv) plus the [block_q, block_k]
    scores: block_q * (D + block_k) <= 32K floats (128 registers a thread at 8 warps, half the cap:
    the rest holds the q tile, softmax statistics and addresses; a [64, 512] float32 accumulator
    alone would need all 255). Both powers of two in [16, 64] (Triton's dot needs >= 16).
    64 x 64 at D <= 128, 64 x 32 at 256, 32 x 16 at 512 (bf16); the dk/dv kernel's two [block_k, D]
    accumulators fit the same budget (2 * 16 * 512 = 16K floats at 512). 4 warps at D <= 64, else 8."""
    d = max(int(head_dim), 16)
    bk = max(16, min(64, _pow2_floor(_SMEM_BYTES // (2 * _NUM_STAGES * d * max(itemsize, 2)))))
    bq = max(16, min(64, _pow2_floor(_REG_FLOATS // (d + bk))))
    return Tiles(block_q=bq, block_k=bk, num_warps=4 if d <= 64 else 8)


def key_splits(programs: int, key_tiles: int) -> int:
    """Programs per query tile along the keys (split-K): enough to reach ~_TARGET_PROGRAMS programs,
    at most one per _MIN_TILES_PER_SPLIT key tiles; 1 when the grid already fills the GPU (training).
    A static function of the shapes (every compiled step keeps one grid)."""
    want = -(-_TARGET_PROGRAMS // max(programs, 1))
    return int(max(1, min(want, key_tiles // _MIN_TILES_PER_SPLIT)))


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


def _compiler_params(interpret: bool, tiles: Tiles):
    """Triton's compiler params: they also select the Triton lowering (jax's GPU default is Mosaic GPU,
    whose async copies take <= 256 rows, not the whole-K/V blocks used here)."""
    if interpret:
        return None
    if not numerics.triton_available():
        raise ConfigError(numerics.missing_triton("pallas"))
    from jax.experimental.pallas import triton as plgpu
    return plgpu.CompilerParams(num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def _by_platform(interpret: bool | None, build):
    """build(interpret) -> a function of arrays. interpret None: Triton where the program is lowered
    for cuda (where this jax has the Triton backend), the interpreter on CPU, and no branch (a lowering
    error) for other platforms."""
    if interpret is not None:
        return build(bool(interpret))
    interpreted = build(True)
    if not numerics.triton_available():
        return lambda *args: lax.platform_dependent(*args, cpu=interpreted)
    compiled = build(False)
    return lambda *args: lax.platform_dependent(*args, cuda=compiled, cpu=interpreted)


def _key_tiles(limit, lower, block_k: int, n_tiles: int):
    """[first, end) key tiles that a query tile with these limits/lowers can see."""
    hi = jnp.minimum(lax.div(jnp.max(limit) + (block_k - 1), block_k), n_tiles)
    lo = jnp.minimum(lax.div(jnp.maximum(jnp.min(lower), 0), block_k), hi)
    return lo, hi


def _mask(limit, lower, start, block_k: int):
    span = start + jnp.arange(block_k, dtype=jnp.int32)
    return (span[None, :] < limit[:, None]) & (span[None, :] >= lower[:, None])


# ---- forward -------------------------------------------------------------------------------------
def _fwd_kernel(limit_ref, lower_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale: float, block_k: int,
                splits: int):
    q = q_ref[...]
    limit, lower = limit_ref[...], lower_ref[...]
    bq, d = q.shape
    lo, hi = _key_tiles(limit, lower, block_k, k_ref.shape[0] // block_k)
    if splits > 1:  # this program's share of the query tile's visible key tiles
        per = lax.div(hi - lo + (splits - 1), splits)
        lo = jnp.minimum(lo + pl.program_id(3) * per, hi)
        hi = jnp.minimum(lo + per, hi)

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


def merge_partials(out, lse):
    """Split-K partials out [N, ..., D] (each normalised over its keys), lse [N, ...] -> the softmax over
    all keys: (out [..., D], lse [...]); a query no split saw stays (0, NEG_INF)."""
    m = jnp.max(lse, axis=0)
    w = jnp.where(lse > NEG_INF / 2, jnp.exp(lse - m[None]), 0.0)
    total = jnp.sum(w, axis=0)
    o = jnp.sum(w[..., None] * out, axis=0) / jnp.maximum(total, 1e-30)[..., None]
    return o, jnp.where(total > 0, m + jnp.log(jnp.maximum(total, 1e-30)), NEG_INF)


def _forward(q, k, v, limit, lower, scale, tiles: Tiles, splits: int, interpret):
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    bq, bk = tiles.block_q, tiles.block_k
    kernel = functools.partial(_fwd_kernel, scale=scale, block_k=bk, splits=splits)
    row = pl.BlockSpec((None, bq), lambda bi, hi, qi, si: (bi, qi))

    def build(interp):
        return pl.pallas_call(
            kernel,
            grid=(b, h, t // bq, splits),
            in_specs=[row, row,
                      pl.BlockSpec((None, None, bq, d), lambda bi, hi, qi, si: (bi, hi, qi, 0)),
                      pl.BlockSpec((None, None, s, d), lambda bi, hi, qi, si: (bi, hi // g, 0, 0)),
                      pl.BlockSpec((None, None, s, d), lambda bi, hi, qi, si: (bi, hi // g, 0, 0))],
            out_specs=[pl.BlockSpec((None, None, None, bq, d), lambda bi, hi, qi, si: (si, bi, hi, qi, 0)),
                       pl.BlockSpec((None, None, None, bq), lambda bi, hi, qi, si: (si, bi, hi, qi))],
            out_shape=[jax.ShapeDtypeStruct((splits, b, h, t, d), jnp.float32),
                       jax.ShapeDtypeStruct((splits, b, h, t), jnp.float32)],
            compiler_params=_compiler_params(interp, tiles),
            interpret=interp,
            name="carryover_prefix_attention_fwd",
        )

    out, lse = _by_platform(interpret, build)(limit, lower, q, k, v)
    if splits == 1:
        return out[0], lse[0]
    return merge_partials(out, lse)


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
    """One key tile of one K/V head: accumulate over the query tiles of all G query heads, skipping the
    query tiles none of whose queries can see a key of this tile (beyond a prefix's limit, below a
    window's lower bound; padded queries have limit 0)."""
    k, v = k_ref[...], v_ref[...]
    g, t = q_ref.shape[0], q_ref.shape[1]
    nq = t // block_q
    start = pl.program_id(2) * block_k

    def head(gi, carry, rows, mask):
        dk, dv = carry
        q = q_ref[gi, rows, :]
        do = do_ref[gi, rows, :]
        lse, delta = lse_ref[gi, rows], delta_ref[gi, rows]
        p = jnp.where(mask, jnp.exp(_dot_t(q, k) * scale - lse[:, None]), 0.0)
        dv = dv + _dot(p.astype(do.dtype).T, do)
        ds = p * (_dot_t(do, v) - delta[:, None]) * scale
        return dk + _dot(ds.astype(q.dtype).T, q), dv

    def tile(qi, carry):
        rows = pl.ds(qi * block_q, block_q)
        limit, lower = limit_ref[rows], lower_ref[rows]
        seen = (jnp.max(limit) > start) & (jnp.min(lower) < start + block_k)
        mask = _mask(limit, lower, start, block_k)
        return lax.cond(seen, lambda c: lax.fori_loop(0, g, lambda gi, c2: head(gi, c2, rows, mask), c),
                        lambda c: c, carry)

    zero = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, nq, tile, (zero, zero))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _backward(q, k, v, limit, lower, out, lse, do, dlse, scale, tiles: Tiles, interpret):
    b, h, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    g = h // hkv
    bq, bk = tiles.block_q, tiles.block_k
    # FlashAttention-2's D = rowsum(dO * O), minus the lse cotangent (d lse / d scores = P); rows
    # that see no key are constants (out 0, lse NEG_INF): whatever arrives for them is dropped
    seen = lse > NEG_INF / 2
    do = jnp.where(seen[..., None], do, 0).astype(q.dtype)
    delta = jnp.where(seen, jnp.sum(out * do.astype(jnp.float32), axis=-1) - dlse, 0.0)
    row = pl.BlockSpec((None, bq), lambda bi, hi, qi: (bi, qi))
    qtile = pl.BlockSpec((None, None, bq, d), lambda bi, hi, qi: (bi, hi, qi, 0))
    kfull = pl.BlockSpec((None, None, s, d), lambda bi, hi, qi: (bi, hi // g, 0, 0))
    stat = pl.BlockSpec((None, None, bq), lambda bi, hi, qi: (bi, hi, qi))

    def build_dq(interp):
        return pl.pallas_call(
            functools.partial(_dq_kernel, scale=scale, block_k=bk),
            grid=(b, h, t // bq),
            in_specs=[row, row, qtile, kfull, kfull, qtile, stat, stat],
            out_specs=qtile,
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            compiler_params=_compiler_params(interp, tiles),
            interpret=interp,
            name="carryover_prefix_attention_dq",
        )

    dq = _by_platform(interpret, build_dq)(limit, lower, q, k, v, do, lse, delta)
    # dk/dv: the G query heads of a K/V head as one [G, T, ...] block
    qg = lambda x: x.reshape(b, hkv, g, *x.shape[2:])  # noqa: E731
    qall = pl.BlockSpec((None, None, g, t, d), lambda bi, ki, si: (bi, ki, 0, 0, 0))
    sall = pl.BlockSpec((None, None, g, t), lambda bi, ki, si: (bi, ki, 0, 0))
    rall = pl.BlockSpec((None, t), lambda bi, ki, si: (bi, 0))
    ktile = pl.BlockSpec((None, None, bk, d), lambda bi, ki, si: (bi, ki, si, 0))

    def build_dkv(interp):
        return pl.pallas_call(
            functools.partial(_dkv_kernel, scale=scale, block_q=bq, block_k=bk),
            grid=(b, hkv, s // bk),
            in_specs=[rall, rall, qall, ktile, ktile, qall, sall, sall],
            out_specs=[ktile, ktile],
            out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
            compiler_params=_compiler_params(interp, tiles),
            interpret=interp,
            name="carryover_prefix_attention_dkv",
        )

    dk, dv = _by_platform(interpret, build_dkv)(limit, lower, qg(q), k, v, qg(do), qg(lse), qg(delta))
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _prefix_core(q, k, v, limit, lower, scale, tiles, splits, interpret):
    return tuple(_forward(q, k, v, limit, lower, scale, tiles, splits, interpret))


def _prefix_core_fwd(q, k, v, limit, lower, scale, tiles, splits, interpret):
    out, lse = _forward(q, k, v, limit, lower, scale, tiles, splits, interpret)
    return (out, lse), (q, k, v, limit, lower, out, lse)


def _prefix_core_bwd(scale, tiles, splits, interpret, res, cts):
    q, k, v, limit, lower, out, lse = res
    do, dlse = cts
    dq, dk, dv = _backward(q, k, v, limit, lower, out, lse, do, dlse, scale, tiles, interpret)
    return dq, dk, dv, None, None


_prefix_core.defvjp(_prefix_core_fwd, _prefix_core_bwd)


def prefix_attention(q, k, v, limit, lower=None, *, scale: float, interpret: bool | None = None,
                     block_q: int | None = None, block_k: int | None = None, splits: int | None = None):
    """q [B, H, T, D] (query head h reads K/V head h // (H / Hkv)), k/v [B, Hkv, S, D], limit/lower
    [B, T] int (query t sees keys lower <= s < limit; lower None = 0) -> (out [B, H, T, D] float32,
    lse [B, H, T] float32). Differentiable in q, k, v.

    `interpret` None: compiled where lowered for cuda, interpreted on CPU (`_by_platform`). Tiles
    None: `tile_sizes(D)` (each capped at the padded T / S); `splits` None: `key_splits` of the grid.

    Under a mesh (`jax.set_mesh`, as training sets it) the kernel runs per shard (`per_shard`)."""
    if lower is None:
        lower = jnp.zeros(limit.shape, jnp.int32)
    fn = functools.partial(_prefix_attention, scale=scale, interpret=interpret, block_q=block_q, block_k=block_k,
                           splits=splits)
    return per_shard(fn, q, k, v, limit, lower)


def per_shard(fn, q, k, v, limit, lower):
    """fn(q, k, v, limit, lower) -> (out, lse) on q/k/v [B, heads, ...], limit/lower [B, rows], out
    [B, heads, rows, D], lse [B, heads, rows]: under a mesh (`jax.set_mesh`) run per shard through
    `shard_map`, batch over "data"/"fsdp" and heads over "tensor" where they divide (a Pallas call has
    no SPMD partitioning rule: without this XLA would gather the operands onto every device)."""
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


def _prefix_attention(q, k, v, limit, lower, *, scale, interpret, block_q, block_k, splits):
    b, h, t, d = q.shape
    s = k.shape[2]
    rule = tile_sizes(d, jnp.dtype(q.dtype).itemsize)
    bq = min(block_q or rule.block_q, _pow2_at_least(t))
    bk = min(block_k or rule.block_k, _pow2_at_least(s))
    tiles = dataclasses.replace(rule, block_q=bq, block_k=bk)
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    if splits is None:
        splits = key_splits(b * h * (tp // bq), sp // bk)
    limit, lower = limit.astype(jnp.int32), lower.astype(jnp.int32)
    if tp != t:  # padded queries see nothing; their rows are cut off below
        q = jnp.pad(q, ((0, 0), (0, 0), (0, tp - t), (0, 0)))
        limit = jnp.pad(limit, ((0, 0), (0, tp - t)))
        lower = jnp.pad(lower, ((0, 0), (0, tp - t)))
    if sp != s:  # padded keys lie at s >= S >= every limit: never visible
        k = jnp.pad(k, ((0, 0), (0, 0), (0, sp - s), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, 0), (0, sp - s), (0, 0)))
    limit = jnp.minimum(limit, s)
    out, lse = _prefix_core(q, k, v, limit, lower, float(scale), tiles, int(splits), interpret)
    return out[:, :, :t], lse[:, :, :t]
