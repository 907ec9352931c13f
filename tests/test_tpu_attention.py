"""The TPU (Mosaic) decode attention kernel (`models/tpu_attention.py`) run on this CPU in TPU interpret
mode (HBM/VMEM/SMEM and the pipeline's DMAs simulated, the race detector on) against a slow per-query
loop and against attention_core's einsum path: the three decode shapes (AR T = 1, verification
T = P + 1, the drafter's committed context + carried rows + block), sliding windows, rows of length 0,
lengths at tile edges, GQA groups 1 / 2 / 8, head dims 64-512. Speculative == AR decoding through it:
tests/test_attention_backends.py; its lowering and compilation for TPU: tests/test_lowering.py,
tests/test_tpu_lowering.py."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpret
from jax.experimental.pallas import tpu as pltpu

from carryover_jax.errors import ConfigError
from carryover_jax.models import tpu_attention as ta
from carryover_jax.models.drafter import carried_segment_mask
from carryover_jax.models.layers import LiveMask, attention_core, resolve_backend

BK = 128  # one lane-width key tile: a 300-slot cache is 3 tiles, the last one past the buffer
S = 300


@contextlib.contextmanager
def race_checked():
    """Every TPU kernel traced inside runs in TPU interpret mode with the race detector, which must find
    nothing."""
    pltpu.reset_tpu_interpret_mode_state()
    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(detect_races=True)):
        yield
    assert tpu_interpret.races is not None and not tpu_interpret.races.races_found


def slow_reference(q, k, v, limit, lower, scale):
    """Per (row, K/V head, query row) loop in float64 over the visible slots: (out, lse); a query that sees
    nothing: (0, -inf)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, h, r, d = q.shape
    out, lse = np.zeros((b, h, r, d)), np.full((b, h, r), -np.inf)
    for bi in range(b):
        for ri in range(r):
            seen = [s for s in range(k.shape[2]) if lower[bi, ri] <= s < limit[bi, ri]]
            if not seen:
                continue
            for hi in range(h):
                sc = k[bi, hi, seen] @ q[bi, hi, ri] * scale
                m = sc.max()
                p = np.exp(sc - m)
                out[bi, hi, ri] = p @ v[bi, hi, seen] / p.sum()
                lse[bi, hi, ri] = m + np.log(p.sum())
    return out, lse


def _arrays(rng, b, h, r, d, s=S, dtype=jnp.float32):
    q, k, v = (jnp.asarray(rng.normal(size=shape), dtype) for shape in ((b, h, r, d), (b, h, s, d), (b, h, s, d)))
    return q, k, v


def _decode_masks(kind: str, t: int, window: int | None):
    """[3, T] limit / lower of one decode shape for rows of context length 0, a tile edge and past the
    last full tile: AR and verification see their chunk causally (limit = length + t + 1), the drafter's
    context (limit = length) is empty for the first row."""
    lengths = np.asarray([0, BK - t, 2 * BK + 5])
    if kind == "draft":
        limit = np.broadcast_to(lengths[:, None], (3, t))
    else:
        limit = lengths[:, None] + np.arange(1, t + 1)[None]
    slots = lengths[:, None] + np.arange(t)[None]
    lower = np.zeros_like(limit) if window is None else np.maximum(slots - (window - 1), 0)
    return np.ascontiguousarray(limit, np.int32), np.ascontiguousarray(lower, np.int32)


SHAPES = [("ar", 1, None), ("verify", 4, None), ("verify", 4, 20), ("draft", 4, None), ("draft", 4, 200)]


@pytest.mark.parametrize("d,g", [(64, 1), (128, 2), (256, 8), (512, 2)])
def test_kernel_equals_the_slow_loop(d, g):
    """Each decode shape with the GQA group folded into the query rows (R = G * T, g-major), per-row
    lengths and windows; values and lse of every row, including the rows that see no key (0, NEG_INF)."""
    rng = np.random.default_rng(d + g)
    with race_checked():
        for kind, t, window in SHAPES:
            limit, lower = _decode_masks(kind, t, window)
            rows = lambda x: np.tile(x, (1, g))  # noqa: E731
            q, k, v = _arrays(rng, 3, 2, g * t, d)
            out, lse = jax.jit(lambda q, k, v, lim, low: ta.live_attention(q, k, v, lim, low, scale=d ** -0.5,
                                                                          block_k=BK))(
                q, k, v, rows(limit), rows(lower))
            want, want_lse = slow_reference(q, k, v, rows(limit), rows(lower), d ** -0.5)
            np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=2e-5, err_msg=f"{kind} {window}")
            seen = np.isfinite(want_lse)
            np.testing.assert_allclose(np.asarray(lse)[seen], want_lse[seen], atol=2e-5, rtol=1e-5)
            assert np.all(np.asarray(lse)[~seen] <= ta.NEG_INF / 2) and np.all(np.asarray(out)[~seen] == 0)
            assert (~seen).any() == (kind == "draft"), kind  # the empty context row is covered


def test_bfloat16_cache_with_the_default_tile():
    """bf16 q/K/V (the accelerator numerics) with the head dim's own tile (`tile_sizes`: 512 slots at
    D = 128, so the whole 300-slot cache is one tile past the buffer): float32 accumulation."""
    rng = np.random.default_rng(3)
    limit, lower = _decode_masks("verify", 4, 9)
    q, k, v = _arrays(rng, 3, 2, 4, 128, dtype=jnp.bfloat16)
    assert ta.tile_sizes(128, S).block_k == 512
    with race_checked():
        out, lse = jax.jit(lambda *a: ta.live_attention(*a, scale=0.1))(q, k, v, limit, lower)
    want, want_lse = slow_reference(q, k, v, limit, lower, 0.1)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-2)
    np.testing.assert_allclose(np.asarray(lse), want_lse, atol=2e-2)


def _qkv_core(rng, b, t, h, hkv, d, s):
    q = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, hkv, s, d)), jnp.float32) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("g", [1, 8])
def test_attention_core_mosaic_equals_einsum_on_the_three_decode_shapes(g):
    """Through attention_core (the merge of segments): AR and windowed verification over the cache, and the
    drafter's three segments — committed context (`LiveMask`, the kernel), carried rows (block-diagonal,
    visible below each row's rejected count) and the block (dense) — "mosaic" == "einsum"."""
    rng = np.random.default_rng(g)
    hkv, d, p = 2, 64, 3
    t = p + 1
    with race_checked():
        for kind, tq, window in (("ar", 1, None), ("verify", t, 7)):
            limit, lower = _decode_masks(kind, tq, window)
            q, k, v = _qkv_core(rng, 3, tq, hkv * g, hkv, d, S)
            segs = [(k, v, LiveMask(jnp.asarray(limit), lower=None if window is None else jnp.asarray(lower)))]
            got, want = (jax.jit(lambda q, segs, be=be: attention_core(q, segs, 0.2, be))(q, segs)
                         for be in ("mosaic", "einsum"))
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5, err_msg=kind)
        limit, _ = _decode_masks("draft", t, None)
        q, k, v = _qkv_core(rng, 3, t, hkv * g, hkv, d, S)
        kc, vc = _qkv_core(rng, 3, t, hkv * g, hkv, d, p)[1:]
        kb, vb = _qkv_core(rng, 3, t, hkv * g, hkv, d, t)[1:]
        valid = jnp.asarray([[True, True, False], [False, False, False], [True, True, True]])
        segs = [(k, v, LiveMask(jnp.asarray(limit))), (kc, vc, carried_segment_mask(valid, t)),
                (kb, vb, jnp.ones((3, t, t), bool))]
        got, want = (jax.jit(lambda q, segs, be=be: attention_core(q, segs, 0.2, be))(q, segs)
                     for be in ("mosaic", "einsum"))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)


def test_hbm_reads_follow_the_live_length(monkeypatch):
    """The K/V tiles the (interpreted) pipeline copies from HBM, per batch row of a 1024-slot cache in
    128-slot tiles: each row's live tiles — from its window's first tile to the tile of its longest
    query's limit — and one tile for a row with none (its compute is skipped), never the whole buffer:
    14 tile copies of K instead of 32. (The index map repeats a row's last live tile, and a block index
    equal to the previous one issues no copy, in the interpreter as in the Mosaic pipeline.)"""
    copies = []
    real_get = tpu_interpret.get

    def get(*args, input_name=None, **kw):  # the interpreter's read of an input block from HBM
        if input_name == "k_ref":
            copies.append(tuple(int(x) for x in args[6])[::2])  # (batch row, key tile)
        return real_get(*args, input_name=input_name, **kw)

    monkeypatch.setattr(tpu_interpret, "get", get)
    limit = jnp.asarray(np.repeat([[0], [130], [1001], [1000]], 8, axis=1), jnp.int32)
    lower = jnp.asarray(np.repeat([[0], [0], [0], [700]], 8, axis=1), jnp.int32)
    q, k = jnp.ones((4, 1, 8, 64)), jnp.ones((4, 1, 1024, 64))
    with race_checked():
        out, _ = ta.live_attention(q, k, k, limit, lower, scale=0.1, block_k=BK)
    assert sorted(copies) == [(0, 0), (1, 0), (1, 1)] + [(2, j) for j in range(8)] + [(3, 5), (3, 6), (3, 7)]
    assert np.all(np.asarray(out[0]) == 0) and np.allclose(np.asarray(out[1:]), 1.0)


def test_tiles_the_kernel_cannot_take_are_refused_in_one_line():
    """A key block that is not a multiple of 128 lanes, or one whose VMEM overflows (head dim 512 with
    4096-slot tiles: what Mosaic rejects with CompileTimeScopedVmemOom), is refused before tracing,
    naming the size; the default tiles of head dims 64-512 fit."""
    with pytest.raises(ConfigError, match=r"^key block size 100 cannot be tiled .*multiple of 128"):
        ta.tile_sizes(128, 1024, block_k=100)
    with pytest.raises(ConfigError, match=r"^head dim 512 with key block size 4096 .* MiB of VMEM"):
        ta.tile_sizes(512, 8192, rows=4, block_k=4096)
    with pytest.raises(ConfigError, match=r"^head dim 65536 "):
        ta.tile_sizes(65536, 8192)
    for d, bk in ((64, 512), (128, 512), (256, 256), (512, 128)):
        assert ta.tile_sizes(d, 32768, rows=8 * 17) == ta.TpuTiles(block_k=bk, num_tiles=32768 // bk, block_r=136)
        # a prefill's rows (4,096 positions x G = 4) in blocks that fit VMEM, never refused
        tiles = ta.tile_sizes(d, 32768, rows=16384)
        assert tiles.block_r % ta.SUBLANES == 0 and 8 <= tiles.block_r <= 512
        assert ta.vmem_bytes(tiles.block_r, d, tiles.block_k, 2) <= ta.VMEM_BYTES
    assert ta.tile_sizes(128, 100).block_k == 128  # never longer than the buffer needs


def test_backends_refused_on_the_other_platform(monkeypatch):
    """The Mosaic kernel is refused in one line where this process runs on a GPU (and the Triton one on a
    TPU, pointing at mosaic); auto stays available on both."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(ConfigError, match="^attention backend 'mosaic' runs the TPU"):
        resolve_backend("mosaic")
    assert resolve_backend("auto") == "auto"
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with pytest.raises(ConfigError, match="'pallas' .* use 'auto', 'mosaic' or 'einsum'"):
        resolve_backend("pallas")
    assert resolve_backend("mosaic") == "mosaic"



def test_rows_past_one_block_are_split_and_padded():
    """A prefill-sized query chunk (600 folded rows: two 512-row blocks, the second padded) equals the slow
    loop, each row block reading its own live key range: causal rows of three lengths and a window."""
    rng = np.random.default_rng(7)
    t, g, d = 300, 2, 64
    tiles = ta.tile_sizes(d, 2 * S, rows=g * t, itemsize=4, block_k=BK)
    assert tiles.block_r == 512 and tiles.num_tiles == 5
    lengths = np.asarray([0, 17, S - 10])
    limit = lengths[:, None] + np.arange(1, t + 1)[None]
    lower = np.maximum(limit - 1 - 250, 0)
    rows = lambda x: np.ascontiguousarray(np.tile(x, (1, g)), np.int32)  # noqa: E731
    q, k, v = _arrays(rng, 3, 1, g * t, d, s=2 * S)
    with race_checked():
        out, lse = jax.jit(lambda *a: ta.live_attention(*a, scale=0.1, block_k=BK))(q, k, v, rows(limit), rows(lower))
    want, want_lse = slow_reference(q, k, v, rows(limit), rows(lower), 0.1)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(np.asarray(lse), want_lse, atol=2e-5, rtol=1e-5)


def test_auto_falls_back_to_einsum_where_no_tile_fits(monkeypatch):
    """Where the Mosaic kernel has no tile for a shape, "auto" (whose TPU branch is traced on every
    platform, a GPU's program too) reads the cache by einsum instead of refusing (and runs its CPU branch here,
    the "cpu" backend); "mosaic" refuses in one line."""
    monkeypatch.setattr(ta, "VMEM_BYTES", 1024)
    rng = np.random.default_rng(5)
    limit, _ = _decode_masks("verify", 4, None)
    q, k, v = _qkv_core(rng, 3, 4, 4, 2, 64, S)
    segs = [(k, v, LiveMask(jnp.asarray(limit)))]
    got, want = (jax.jit(lambda q, segs, be=be: attention_core(q, segs, 0.2, be))(q, segs) for be in ("auto", "cpu"))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(ConfigError, match="^head dim 64 with key block size"):
        jax.jit(lambda q, segs: attention_core(q, segs, 0.2, "mosaic"))(q, segs)
