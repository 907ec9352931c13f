"""The CPU's attention kernel (`models/cpu_attention.cc`), its per-query path (decode's cache reads) and its tiled
path (a cache-free forward's `Prefix` segments, float32 and bf16), against a float64 loop over each query's slots,
every query bit for bit against its own one-query call (what makes a verified token's attention that of an AR
step), attention backend "cpu" against "einsum" with the segments merged and its gradients; where it is lowered
(cache segments lowered for CPU, head dims it takes); and a machine that cannot build it (one warning line, einsum)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import numerics as N
from carryover_jax.models import cpu_attention as ca
from carryover_jax.models import cpu_kernels
from carryover_jax.models.cache import BITS
from carryover_jax.models.layers import NEG_INF, Blockwise, LiveMask, Prefix, _dense_part, attention_core
from carryover_jax.numerics import Numerics

pytestmark = pytest.mark.skipif(not ca.available(), reason="no C++ compiler for the CPU kernel")


def _reference(q, k, v, limit, lower, scale):
    """float64, one query at a time over exactly its slots: (max, sum, unnormalised out)."""
    q, k, v = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (q, k, v))
    b, hkv, g, t, d = q.shape
    m, s, o = np.full((b, hkv, g, t, 1), NEG_INF), np.zeros((b, hkv, g, t, 1)), np.zeros((b, hkv, g, t, d))
    for i, h, j, u in np.ndindex(b, hkv, g, t):
        lo, hi = max(int(lower[i, u]), 0), min(int(limit[i, u]), k.shape[2])
        if lo >= hi:
            continue
        sc = k[i, h, lo:hi] @ q[i, h, j, u] * scale
        m[i, h, j, u] = sc.max()
        p = np.exp(sc - sc.max())
        s[i, h, j, u], o[i, h, j, u] = p.sum(), p @ v[i, h, lo:hi]
    return m, s, o


def _case(rng, b, hkv, g, t, s, d, dtype, window=None):
    qg = jnp.asarray(rng.normal(size=(b, hkv, g, t, d)), jnp.float32)
    k, v = (jnp.asarray(2 * rng.normal(size=(b, hkv, s, d)), jnp.float32) for _ in range(2))
    if dtype == "bits":
        k, v = (jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), BITS) for x in (k, v))
    elif dtype == "bfloat16":
        k, v = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
    start = rng.integers(0, s, size=(b, 1))
    start[0] = 0  # a row whose first query sees one slot
    limit = np.asarray(start + 1 + np.arange(t)[None], np.int32)
    if b > 1:
        limit[-1] = s + 3  # past the buffer: clipped to it
    if b > 2:
        limit[1] = 0  # a row that sees nothing
    lower = None if window is None else np.maximum(limit - window, 0).astype(np.int32)
    return qg, k, v, limit, lower


def _call(qg, k, v, limit, lower, scale=0.3):
    f = jax.jit(lambda *a: ca.live_attention(*a, scale))
    return tuple(np.asarray(x) for x in f(qg, k, v, jnp.asarray(limit), None if lower is None else jnp.asarray(lower)))


def _values(x):
    return jax.lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == BITS else x


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "bits"])
@pytest.mark.parametrize("d", [16, 48, 64, 128, 256])
def test_kernel_equals_float64_and_every_query_its_own_call(d, dtype):
    """Head dims with an unrolled path (16, 64, 128, 256) and the run-time one (48); slots in 16-slot blocks with
    tails; a row past the buffer, a row that sees nothing, sliding windows; fewer (row, K/V head) pairs than a few per
    thread (batch 1 with 1 or 3 K/V heads), whose query rows the kernel splits over the threads. The softmax
    statistics and the normalised output against float64 (bf16 caches: the bf16 values, widened exactly)."""
    rng = np.random.default_rng(d)
    for shape, window in (((3, 2, 3, 1, 37), None), ((3, 1, 2, 5, 70), None), ((2, 2, 4, 8, 50), 6),
                          ((1, 3, 3, 4, 90), None), ((1, 1, 4, 3, 40), 5)):
        qg, k, v, limit, lower = _case(rng, *shape, d, dtype, window)
        m, s, o = _call(qg, k, v, limit, lower)
        want_m, want_s, want_o = _reference(qg, _values(k), _values(v), limit,
                                            np.zeros_like(limit) if lower is None else lower, 0.3)
        seen = want_s > 0
        assert np.array_equal(s > 0, seen)
        np.testing.assert_array_equal(m[~seen], np.float32(NEG_INF))
        np.testing.assert_array_equal(o[~seen[..., 0]], 0.0)
        np.testing.assert_allclose(m, want_m, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(m + np.log(np.maximum(s, 1e-30)), want_m + np.log(np.maximum(want_s, 1e-30)),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(o / np.maximum(s, 1e-30), want_o / np.maximum(want_s, 1e-30), rtol=2e-5, atol=2e-5)
        for u in range(qg.shape[3]):  # bitwise: the query count never changes a query's attention
            one = _call(qg[:, :, :, u:u + 1], k, v, limit[:, u:u + 1], None if lower is None else lower[:, u:u + 1])
            for a, b in zip(one, (m, s, o)):
                np.testing.assert_array_equal(a[:, :, :, 0], b[:, :, :, u], err_msg=f"{shape} query {u}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d", [16, 48, 64, 128])
def test_tiled_path_equals_float64_and_every_query_alone(d, dtype):
    """The tiled path (`prefix_attention`: a cache-free forward's attention, q, k and v all float32 or all bf16):
    tiles of 16 queries with a partial one, slot ranges from odd slots and past the last 16-key block of the buffer,
    rows that see nothing, one (row, K/V head) pair whose queries the kernel splits into parts. Against float64 on
    the inputs' values: the statistics to float32 rounding; the output to float32 rounding, in bf16 to the rounding
    of each probability to bf16 (as einsum's bf16 part rounds it: tighter against that part than the float32
    probabilities' output is). Each query's result bit for bit that of a call with only its own query."""
    rng = np.random.default_rng(d)
    for b, hkv, g, t, s in ((3, 2, 3, 13, 45), (1, 1, 2, 150, 161)):
        qg = jnp.asarray(rng.normal(size=(b, hkv, g, t, d)), dtype)
        k, v = (jnp.asarray(2 * rng.normal(size=(b, hkv, s, d)), dtype) for _ in range(2))
        limit = np.minimum(rng.integers(1, s + 4, size=(b, t)), s + 3).astype(np.int32)  # some past the buffer
        lower = (rng.integers(0, 7, size=(b, t)) * (rng.random((b, t)) < 0.5)).astype(np.int32)
        limit[0, :3] = lower[0, :3]  # rows that see nothing
        f = jax.jit(lambda *a: ca.prefix_attention(*a, 0.3))
        text = f.lower(qg, k, v, jnp.asarray(limit), jnp.asarray(lower)).as_text()
        assert ca.TARGETS[f"tiles_{dtype}"] in text
        m, sm, o = (np.asarray(x) for x in f(qg, k, v, jnp.asarray(limit), jnp.asarray(lower)))
        want_m, want_s, want_o = _reference(qg, k, v, limit, lower, 0.3)
        seen = want_s > 0
        assert np.array_equal(sm > 0, seen)
        np.testing.assert_array_equal(m[~seen], np.float32(NEG_INF))
        np.testing.assert_array_equal(o[~seen[..., 0]], 0.0)
        np.testing.assert_allclose(m, want_m, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sm, want_s, rtol=1e-5, atol=1e-5)
        out, want = o / np.maximum(sm, 1e-30), want_o / np.maximum(want_s, 1e-30)
        if dtype == "float32":
            np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
        else:
            np.testing.assert_allclose(out, want, atol=0.03)  # |v| ~ 2: probabilities to bf16, 2^-9 each
            m5 = Prefix(jnp.asarray(limit), jnp.asarray(lower)).dense(s)[:, None, None]
            _, es, eo = _dense_part(qg, k, v, m5, 0.3)  # einsum's bf16 part: probabilities rounded to bf16 too
            e16 = np.asarray(eo / jnp.maximum(es, 1e-30))
            _, es32, eo32 = _dense_part(*(x.astype(jnp.float32) for x in (qg, k, v)), m5, 0.3)
            e32 = np.asarray(eo32 / jnp.maximum(es32, 1e-30))
            assert np.max(np.abs(out - e16)) < 0.2 * np.max(np.abs(e32 - e16)), d
        for u in (0, 5, t - 1):  # bitwise: other queries never change a query's attention
            one = f(qg[:, :, :, u:u + 1], k, v, jnp.asarray(limit[:, u:u + 1]), jnp.asarray(lower[:, u:u + 1]))
            for a, x in zip(one, (m, sm, o)):
                np.testing.assert_array_equal(np.asarray(a)[:, :, :, 0], x[:, :, :, u], err_msg=f"query {u}")


def test_backend_cpu_equals_einsum_with_segments_merged_and_vmap():
    """A cache segment (the kernel) merged with a block-diagonal segment (einsum) as the drafter attends
    [cache ; carried ; block]; rows that see nothing return 0; vmap calls the kernel per example."""
    rng = np.random.default_rng(3)
    b, t, h, hkv, d, s = 3, 4, 6, 2, 32, 45
    q = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, hkv, s, d)), jnp.float32) for _ in range(2))
    kb, vb = (jnp.asarray(rng.normal(size=(b, hkv, t, d)), jnp.float32) for _ in range(2))
    limit = jnp.asarray([[10] * t, [0] * t, [45] * t], jnp.int32)
    valid = jnp.asarray(rng.random((b, t)) < 0.5).at[1].set(False)  # row 1 sees no key in either segment

    def run(backend, q):
        segs = [(k, v, LiveMask(limit=limit)), (kb, vb, Blockwise(1, key_valid=valid))]
        return attention_core(q, segs, 0.2, backend)

    got, want = (np.asarray(jax.jit(run, static_argnums=0)(be, q)) for be in ("cpu", "einsum"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1], 0.0)
    qs = jnp.stack([q, -q])
    np.testing.assert_allclose(jax.vmap(lambda x: run("cpu", x))(qs), jax.vmap(lambda x: run("einsum", x))(qs),
                               rtol=1e-5, atol=1e-6)


def test_prefix_segments_run_the_kernel_forward_and_einsums_backward():
    """A `Prefix` segment under "cpu" (a causal cache-free forward, training's context masks): the kernel's forward
    and einsum's gradients, equal to einsum's own to float32 rounding, with rows that see nothing and a lower bound."""
    rng = np.random.default_rng(5)
    b, t, h, hkv, d, s = 3, 6, 4, 2, 16, 20
    q = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(b, hkv, s, d)), jnp.float32) for _ in range(2))
    causal = jnp.broadcast_to(jnp.arange(1, t + 1, dtype=jnp.int32), (b, t))
    masks = [Prefix(causal), Prefix(jnp.asarray([[20] * t, [0] * t, [3, 3, 0, 9, 9, 20]], jnp.int32),
                                    lower=jnp.asarray([[0] * t, [0] * t, [1, 2, 0, 0, 5, 11]], jnp.int32))]

    def loss(backend, q, k, v, mask):
        out = attention_core(q, [(k, v, mask)], 0.3, backend)
        return jnp.sum(out * jnp.sin(jnp.arange(out.size, dtype=jnp.float32).reshape(out.shape))), out

    for mask in masks:
        (_, got), g_got = jax.jit(jax.value_and_grad(lambda *a: loss("cpu", *a, mask), (0, 1, 2), has_aux=True))(
            q, k, v)
        (_, want), g_want = jax.jit(jax.value_and_grad(lambda *a: loss("einsum", *a, mask), (0, 1, 2),
                                                       has_aux=True))(q, k, v)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
        for a, w in zip(g_got, g_want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got)[1], 0.0)  # row 1 sees no key
    text = jax.jit(lambda q, k, v: loss("cpu", q, k, v, masks[0])[1]).lower(q, k, v).as_text()
    assert ca.TARGETS["tiles_float32"] in text
    q16, k16, v16 = (x.astype(jnp.bfloat16) for x in (q, k, v))  # bf16: the kernel's pairs path
    for mask in masks:
        got = jax.jit(lambda *a: attention_core(*a[:1], [(*a[1:], mask)], 0.3, "cpu"))(q16, k16, v16)
        want = jax.jit(lambda *a: attention_core(*a[:1], [(*a[1:], mask)], 0.3, "einsum"))(q16, k16, v16)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=2 ** -7)
        grads = [jax.jit(jax.grad(lambda *a: jnp.sum(attention_core(*a[:1], [(*a[1:], mask)], 0.3, be)
                                                     .astype(jnp.float32) ** 2), (0, 1, 2)))(q16, k16, v16)
                 for be in ("cpu", "einsum")]
        for a, w in zip(*grads):  # einsum's backward at the same inputs, its cotangents from either forward
            a, w = np.asarray(a, np.float32), np.asarray(w, np.float32)
            np.testing.assert_allclose(a, w, atol=0.02 * np.abs(w).max())
    text = jax.jit(lambda q, k, v: attention_core(q, [(k, v, masks[0])], 0.3, "cpu")).lower(q16, k16, v16).as_text()
    assert ca.TARGETS["tiles_bfloat16"] in text and ca.TARGETS["tiles_float32"] not in text


def _program(backend, d, platform="cpu", dtype=jnp.float32) -> str:
    q = jnp.zeros((1, 2, 4, d), dtype)
    k = jnp.zeros((1, 2, 64, d), dtype)
    limit = jnp.full((1, 2), 5, jnp.int32)
    f = jax.jit(lambda q, k, lim: attention_core(q, [(k, k, LiveMask(limit=lim))], 0.1, backend))
    return f.trace(q, k, limit).lower(lowering_platforms=(platform,)).as_text()


def test_the_kernel_is_lowered_only_where_it_applies():
    assert Numerics.for_platform("cpu").attention_backend == "cpu"
    assert Numerics.for_platform("cuda").attention_backend == "auto"
    assert _program("cpu", 64).count(ca.TARGETS["float32"]) == 1
    assert _program("auto", 64).count(ca.TARGETS["float32"]) == 1  # auto's CPU branch
    assert _program("cpu", 64, dtype=jnp.bfloat16).count(ca.TARGETS["bfloat16"]) == 1
    for backend, d, platform in (("einsum", 64, "cpu"), ("cpu", 24, "cpu"),  # a head dim it does not take
                                 ("cpu", 64, "cuda"), ("auto", 64, "cuda")):
        text = _program(backend, d, platform)
        assert not any(t in text for t in ca.TARGETS.values()), (backend, d, platform)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tied,block_len", [(False, 4), (True, 8)])
def test_ar_steps_and_verification_agree_bit_for_bit(tiny_llama, dtype, tied, block_len):
    """The tiny model's logits for a block of 4 (untied head) or 8 tokens (tied head: a verification at P = 7)
    equal, row by row and bit for bit, those of one-token AR steps over the same cache (the kernel's and the
    products kernel's per-row orders together), in float32 and in bf16 (params, activations, caches as bits):
    what makes greedy speculative decoding commit AR's tokens."""
    from carryover_jax import load_target
    from carryover_jax.decode import autoregressive as ar
    from carryover_jax.models.target import TargetLM

    target = load_target(tiny_llama.path, tokenizer=False, numerics=Numerics(dtype=dtype))
    cfg, params = target.cfg, target.params
    if tied:
        cfg = cfg.replace(tie_word_embeddings=True)
        params = {k: v for k, v in params.items() if k != "lm_head"}
    assert cfg.numerics.attention_backend == "cpu" and cfg.numerics.cache == jnp.dtype(dtype)
    prompt = jnp.asarray([[5, 17, 33, 2, 61, 9, 4, 70]], jnp.int32)
    cache, logits = ar.prefill(cfg, params, prompt, jnp.asarray([8]), max_len=64)
    block = jnp.asarray([[11, 12, 13, 14, 3, 40, 6, 27][:block_len]], jnp.int32)
    step_text = ar.step.lower(cfg, params, cache, block[:, 0]).as_text()
    assert any(t in step_text for t in ca.TARGETS.values())  # the cache is read by the kernel, not einsum's loop
    rows, c = [], cache
    for i in range(block_len):
        lg, c = ar.step(cfg, params, jax.tree.map(jnp.copy, c), block[:, i])
        rows.append(np.asarray(lg))
    many = jax.jit(lambda p, c, x: TargetLM(cfg).apply({"params": p}, x, cache=c)[0])(params, cache, block)
    np.testing.assert_array_equal(np.asarray(many)[0], np.concatenate(rows))


def test_no_compiler_means_one_warning_and_einsum(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CARRYOVER_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(N, "_WARNED", set())
    ca.available.cache_clear()
    try:
        assert not ca.available() and not ca.available()
        err = capsys.readouterr().err
        assert err.count("warning: numerics: attention 'cpu' reads caches with einsum") == 1, err
        assert "no-such-compiler" in err and len(err.strip().splitlines()) == 1
        assert not any(t in _program("cpu", 64) for t in ca.TARGETS.values())
        with pytest.raises(RuntimeError, match="unavailable"):
            ca.live_attention(jnp.zeros((1, 1, 1, 1, 16)), jnp.zeros((1, 1, 4, 16)), jnp.zeros((1, 1, 4, 16)),
                              jnp.ones((1, 1), jnp.int32), None, 1.0)
        monkeypatch.setenv("CARRYOVER_CPU_KERNELS", "0")
        ca.available.cache_clear()
        assert not ca.available() and capsys.readouterr().err == ""  # turned off: no warning
    finally:
        monkeypatch.undo()
        ca.available.cache_clear()
    assert ca.available() and cpu_kernels.build().exists()
