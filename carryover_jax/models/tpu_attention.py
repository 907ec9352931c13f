"""The TPU (Mosaic Pallas) kernel of decode's cache reads: attention of T queries per row over a
head-major KV cache [B, Hkv, S, D] that reads only each row's live slots.

One segment of `layers.attention_core` with a `LiveMask`: query t of row b sees the cache slots
lower[b, t] <= s < limit[b, t]. That covers the three decode shapes: the AR step (T = 1, limit =
length + 1), verification (T = P + 1, a causal chunk: limit = length + t + 1) and the drafter's
committed context (limit = length for every query of the block); sliding-window layers add `lower`.
(The drafter's carried rows and its block are `Blockwise` segments of a few keys: einsum.)

Layout. The G query heads of a K/V head are folded into the query rows (R = G * T rows, g-major, a
reshape of the array outside the kernel: refs are never reshaped), so one program reads a K/V tile
once for all G heads. The grid is (B, Hkv, row blocks, key tiles): heads are a grid axis, never a vmap.
Decode's few rows (G * T <= 512) are one row block; a prefill's thousands of rows are split into blocks
of at most 512, so VMEM holds one block's scores, not the whole chunk's.

Cost follows the live length. Each (batch row, row block)'s [first, end) live key tiles (from min(lower)
and max(limit) over its queries) arrive as scalar prefetch (SMEM) and the K/V `index_map` clamps the
tile index into that range: past a row's last live tile the index repeats, and Pallas's pipeline
issues no copy for a block index equal to the previous one, so the HBM traffic of a row is its live
tiles (plus one tile for a row with none), not `max_len`. Compute on those steps is skipped
(`pl.when`). The grid steps themselves remain (a fraction of a microsecond each).

Returns (out, lse) for attention_core's flash-style merge: the output normalised over this
segment's keys and the log-sum-exp per query; a query that sees no key gets out 0 and lse
`NEG_INF` (an exact 0 contribution to the merge).

Compiled (Mosaic) for TPU; on a CPU host it runs in TPU interpret mode (`pltpu.InterpretParams`: HBM,
VMEM, SMEM and DMAs simulated, optionally with the race detector; `_interpret_setting`).
Forward only: decoding does not differentiate (training's masks are `Prefix`, einsum on TPU).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from carryover_jax.errors import ConfigError
from carryover_jax.models.kernels import NEG_INF, per_shard

LANES = 128  # the minor (lane) dim of a TPU vreg: key tiles are a multiple of it (the scores' lanes)
SUBLANES = 8
# What one program may hold in VMEM: v5e's default scoped VMEM limit (v6e/v7x: 32 MiB). The rule below
# is checked against the TPU compiler (tests/test_tpu_lowering.py): past it Mosaic fails with
# CompileTimeScopedVmemOom (e.g. 4096-slot tiles at head dim 512, bf16).
VMEM_BYTES = 16 * 1024 * 1024
# default key tile: block_k * D <= 64K elements (the four double-buffered K/V tiles: 1 MiB in bf16) and
# at most 512 slots, so a row's last live tile reads few dead slots
_TILE_ELEMS = 64 * 1024
_MAX_BLOCK_K = 512
_MAX_BLOCK_R = 512  # query rows per program: decode's G * T fits one block; a long prefill is split


@dataclasses.dataclass(frozen=True)
class TpuTiles:
    block_k: int  # cache slots per K/V tile (a multiple of LANES)
    num_tiles: int  # key tiles of the buffer (the last one may run past S: padded slots are masked)
    block_r: int = 0  # query rows per program: all of them (0, or the row count) or a multiple of SUBLANES


def _up(n: int, m: int) -> int:
    return -(-n // m) * m


def vmem_bytes(rows: int, head_dim: int, block_k: int, itemsize: int) -> int:
    """VMEM of one program, as Mosaic lays it out ((8, 128) tiles): the double-buffered q block, K and V
    tiles, per-row limits and float32 outputs, the float32 accumulator, running max and sum (one lane
    column each, padded to 128 lanes) and the [rows, block_k] float32 scores and probabilities."""
    r, d = _up(rows, SUBLANES), _up(head_dim, LANES)
    col = r * LANES * 4
    return (2 * (r * d * itemsize + 2 * block_k * d * itemsize + 2 * col + r * d * 4 + col)
            + r * d * 4 + 2 * col + 2 * r * _up(block_k, LANES) * 4)


def tile_sizes(head_dim: int, seq_len: int, rows: int = SUBLANES, itemsize: int = 2,
               block_k: int | None = None) -> TpuTiles:
    """Tiles of the kernel for a cache of `seq_len` slots and `rows` folded query rows. Key tile: the
    largest power-of-two multiple of LANES with block_k * D <= 64K elements, at most 512 and no longer
    than the buffer rounded up to LANES. Row block: all rows up to 512 (decode: one block, no padding),
    else 512, halved (a multiple of SUBLANES) until the program fits VMEM. An explicit `block_k` must be a
    positive multiple of LANES. Refuses, in one line naming the size, a tile that is not one or that
    overflows VMEM (`vmem_bytes`) even at the smallest row block, before anything is traced."""
    if block_k is None:
        block_k = LANES
        while block_k * 2 <= _MAX_BLOCK_K and block_k * 2 * head_dim <= _TILE_ELEMS and block_k < seq_len:
            block_k *= 2
    elif block_k < LANES or block_k % LANES:
        raise ConfigError(f"key block size {block_k} cannot be tiled by the TPU attention kernel: it needs a "
                          f"positive multiple of {LANES} (the lanes of its score tile)")
    block_r = rows if rows <= _MAX_BLOCK_R else _MAX_BLOCK_R
    while block_r > SUBLANES and vmem_bytes(block_r, head_dim, block_k, itemsize) > VMEM_BYTES:
        block_r = max(SUBLANES, _up(block_r // 2, SUBLANES))
    need = vmem_bytes(block_r, head_dim, block_k, itemsize)
    if need > VMEM_BYTES:
        raise ConfigError(f"head dim {head_dim} with key block size {block_k} ({block_r} query rows) cannot be tiled "
                          f"by the TPU attention kernel: {need / 2**20:.1f} MiB of VMEM, over "
                          f"{VMEM_BYTES // 2**20} MiB (use attention backend 'einsum')")
    return TpuTiles(block_k=block_k, num_tiles=-(-seq_len // block_k), block_r=block_r)


def fits(head_dim: int, seq_len: int, rows: int, itemsize: int) -> bool:
    """Whether `tile_sizes` finds default tiles for these sizes (attention_core's "auto" falls back to
    einsum where it does not, instead of refusing)."""
    try:
        tile_sizes(head_dim, seq_len, rows, itemsize)
    except ConfigError:
        return False
    return True


def _live_tiles(limit, lower, block_k: int, num_tiles: int):
    """Per batch row and row block (limit/lower [B, NR, block_r]): the first live key tile and how many
    there are ([B, NR] int32 each), from the queries that see any key (a query with limit <= lower does
    not pull the range down)."""
    sees = limit > lower
    hi = jnp.max(jnp.where(sees, limit, 0), axis=-1)
    lo = jnp.min(jnp.where(sees, jnp.maximum(lower, 0), jnp.iinfo(jnp.int32).max), axis=-1)
    end = jnp.clip((hi + block_k - 1) // block_k, 0, num_tiles)
    first = jnp.minimum(jnp.where(hi > 0, lo // block_k, 0), jnp.maximum(end - 1, 0))
    return first.astype(jnp.int32), jnp.maximum(end - first, 0).astype(jnp.int32)


def _kv_index(b, h, i, j, first_ref, count_ref):
    """The K/V tile of grid step j of row b's row block i: the j-th live tile, the last live one once j
    is past it (an unchanged block index: the pipeline skips the copy)."""
    return b, h, first_ref[b, i] + jnp.minimum(j, jnp.maximum(count_ref[b, i] - 1, 0)), 0


def _kernel(first_ref, count_ref, limit_ref, lower_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc,
            *, scale: float, block_k: int, seq_len: int):
    b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, NEG_INF, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @pl.when(j < count_ref[b, i])
    def _step():
        start = (first_ref[b, i] + j) * block_k
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        slots = start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        mask = (slots < limit_ref[...]) & (slots >= lower_ref[...])
        s = jnp.where(mask, s, NEG_INF)
        m_prev = m_sc[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
        corr = jnp.exp(m_prev - m_new)
        l_sc[...] = l_sc[...] * corr + jnp.sum(p, axis=1, keepdims=True)
        if seq_len % block_k:  # the last tile runs past the buffer: its padding is not data (0 * NaN)
            v = jnp.where(start + lax.broadcasted_iota(jnp.int32, v.shape, 0) < seq_len, v, jnp.zeros_like(v))
        acc_sc[...] = acc_sc[...] * corr + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        m_sc[...] = m_new

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        l = l_sc[...]
        o_ref[...] = acc_sc[...] / jnp.maximum(l, 1e-30)
        lse_ref[...] = jnp.where(l > 0, m_sc[...] + jnp.log(jnp.maximum(l, 1e-30)), NEG_INF)


def _call(first, count, limit, lower, q, k, v, *, scale: float, tiles: TpuTiles, interpret):
    b, hkv, r, d = q.shape  # r: a multiple of the row block
    s = k.shape[2]
    bk, br = tiles.block_k, tiles.block_r or r
    rows = lambda last: pl.BlockSpec((None, None, br, last), lambda bi, hi, i, j, *_: (bi, hi, i, 0))  # noqa: E731
    per_row = pl.BlockSpec((None, br, 1), lambda bi, hi, i, j, *_: (bi, i, 0))
    kv = pl.BlockSpec((None, None, bk, d), _kv_index)
    return pl.pallas_call(
        functools.partial(_kernel, scale=scale, block_k=bk, seq_len=s),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(b, hkv, r // br, tiles.num_tiles),
            in_specs=[per_row, per_row, rows(d), kv, kv],
            out_specs=[rows(d), rows(1)],
            scratch_shapes=[pltpu.VMEM((br, 1), jnp.float32), pltpu.VMEM((br, 1), jnp.float32),
                            pltpu.VMEM((br, d), jnp.float32)],
        ),
        out_shape=[jax.ShapeDtypeStruct((b, hkv, r, d), jnp.float32),
                   jax.ShapeDtypeStruct((b, hkv, r, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel",
                                                                  "arbitrary")),
        interpret=interpret,
        name="carryover_live_attention_tpu",
    )(first, count, limit, lower, q, k, v)


def _interpret_setting(interpret):
    """None: TPU interpret mode where this process runs on a CPU (the interpreter runs nowhere else),
    compiled Mosaic otherwise. Not a `platform_dependent` pair like the Triton kernel's: the
    interpreter's ordered io_callbacks in one branch break the lowering of the other on jax 0.10.2
    ("Lowering rule for `cond` returns incorrect set of output tokens"), so a program meant for a TPU
    passes False (attention_core's "auto" does). `pltpu.force_tpu_interpret_mode` overrides either."""
    if interpret is not None:
        return interpret
    return pltpu.InterpretParams() if jax.default_backend() == "cpu" else False


def live_attention(q, k, v, limit, lower=None, *, scale: float, block_k: int | None = None, interpret=None):
    """q [B, Hkv, R, D] (row r of K/V head h: a query head of h's group at one query position), k/v
    [B, Hkv, S, D], limit/lower [B, R] int (row r sees slots lower <= s < limit; lower None = 0) ->
    (out [B, Hkv, R, D] float32, lse [B, Hkv, R] float32). `interpret`: False (compiled), TPU interpret
    mode's `pltpu.InterpretParams`, or None (`_interpret_setting`).

    Under a mesh the kernel runs per shard (`kernels.per_shard`: a Mosaic call has no SPMD rule)."""
    tiles = tile_sizes(q.shape[-1], k.shape[2], q.shape[2], jnp.dtype(k.dtype).itemsize, block_k)
    if lower is None:
        lower = jnp.zeros(limit.shape, jnp.int32)
    fn = functools.partial(_live_attention, scale=float(scale), tiles=tiles, interpret=interpret)
    return per_shard(fn, q, k, v, limit, lower)


def _live_attention(q, k, v, limit, lower, *, scale, tiles: TpuTiles, interpret):
    r = q.shape[2]
    br = tiles.block_r or r
    pad = _up(r, br) - r  # padded rows see no slot (limit 0): out 0, lse NEG_INF, sliced off below
    limit = jnp.minimum(limit.astype(jnp.int32), k.shape[2])
    lower = lower.astype(jnp.int32)
    if pad:
        q = jnp.pad(q, ((0, 0), (0, 0), (0, pad), (0, 0)))
        limit, lower = (jnp.pad(x, ((0, 0), (0, pad))) for x in (limit, lower))
    b = limit.shape[0]
    first, count = _live_tiles(limit.reshape(b, -1, br), lower.reshape(b, -1, br), tiles.block_k, tiles.num_tiles)
    call = functools.partial(_call, scale=scale, tiles=tiles)
    out, lse = call(first, count, limit[..., None], lower[..., None], q, k, v, interpret=_interpret_setting(interpret))
    return out[:, :, :r], lse[:, :, :r, 0]


def live_part(qg, k, v, limit, lower, scale: float, *, interpret=None):
    """A `LiveMask` segment of attention_core: qg [B, Hkv, G, T, D], limit/lower [B, T] -> the merge's
    (lse, 0/1 mass, normalised out) [B, Hkv, G, T, ...] (w = exp(lse - max) rescales the normalised
    output by its softmax mass; a query with no visible key contributes an exact 0)."""
    b, hkv, g, t, d = qg.shape
    rep = lambda x: None if x is None else jnp.tile(x, (1, g))  # noqa: E731  [B, T] -> [B, G*T], g-major
    out, lse = live_attention(qg.reshape(b, hkv, g * t, d), k, v, rep(limit), rep(lower), scale=scale,
                              interpret=interpret)
    lse = lse.reshape(b, hkv, g, t, 1)
    seen = lse > NEG_INF / 2
    return (jnp.where(seen, lse, NEG_INF), seen.astype(jnp.float32),
            jnp.where(seen, out.reshape(b, hkv, g, t, d), 0.0))
