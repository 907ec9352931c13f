"""bf16 on a CPU: the dots run the CPU's bf16 kernels (no float32 copy of any weight or cache), a bf16 cache
is stored as its uint16 bits and reads back the same numbers, the logits follow float32 within bf16's
rounding, and a CPU without native bf16 gets one warning line."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import load_target
from carryover_jax import numerics as N
from carryover_jax.decode import autoregressive as ar
from carryover_jax.models.target import TargetLM, new_cache
from carryover_jax.numerics import Numerics, dot_f32


def _f32_copies(hlo: str, arrays) -> list[str]:
    """The float32 arrays of a narrow weight's or cache buffer's shape that a compiled program materialises:
    instructions of its unfused computations (entry, loop bodies) whose result has that shape. (A convert
    fused into a gather or a dot's own fusion touches only what it reads and is not listed.)"""
    shapes = {",".join(map(str, x.shape)) for x in jax.tree_util.tree_leaves(arrays) if x.ndim >= 2}
    found, fused = [], False
    for line in hlo.splitlines():
        if line.startswith(("%", "ENTRY")):
            fused = line.startswith("%") and "_computation" in line.split(" ")[0]
            continue
        m = re.search(r"= f32\[([\d,]+)\]", line)
        if not fused and m and m.group(1) in shapes:
            found.append(line.strip()[:160])
    return found


def test_cpu_bf16_caches_in_bf16_bits_and_a_plain_head_unless_asked():
    bf = Numerics.for_platform("cpu", dtype="bfloat16")
    assert (bf.param_dtype, bf.dtype, bf.cache_dtype, bf.cache_bits) == ("bfloat16", "bfloat16", "bfloat16", True)
    assert bf.cache_storage == jnp.uint16 and Numerics.for_platform("cpu").cache_storage == jnp.float32
    assert Numerics.for_platform("cpu", param_dtype="bfloat16").cache_dtype == "bfloat16"
    assert Numerics.for_platform("cpu", dtype="bfloat16", cache_dtype="float32").cache_dtype == "float32"
    # without bits storage every write would convert the whole bf16 buffer: float32 then, unless asked
    assert Numerics.for_platform("cpu", dtype="bfloat16", cache_bits=False).cache_dtype == "float32"
    # and the LM head in the form XLA CPU's bf16 kernel streams fastest, unless asked
    assert (bf.lm_head, Numerics.for_platform("cpu").lm_head) == ("plain", "vocab_major")
    assert Numerics.for_platform("cpu", dtype="bfloat16", lm_head="vocab_major").lm_head == "vocab_major"
    assert Numerics.for_platform("cuda", dtype="bfloat16").cache_dtype == "bfloat16"
    assert Numerics.for_platform("tpu", param_dtype="bfloat16").cache_storage == jnp.bfloat16


@pytest.mark.parametrize("batch", [1, 4])
def test_bf16_decode_step_converts_no_weight_or_cache_to_float32(tiny_llama, batch):
    """XLA CPU has no bf16 x bf16 -> bf16 kernel, nor a one-row bf16 one: a dot of either kind converts its
    weight to float32 at every step (slower than float32 weights). Every dot of the AR step must reach the
    CPU's bf16 kernels: batch 1 is the one-row case (`numerics.dot_f32`). Nor has it a bf16 scatter: a
    write into a bf16 cache, or a while loop carrying one, converts the whole buffer; the bits storage
    must leave no float32 array of a cache buffer's shape."""
    t = load_target(tiny_llama.path, tokenizer=False, dtype="bfloat16")
    cache = new_cache(t.cfg, batch, 256).with_lengths(jnp.full((batch,), 5, jnp.int32))
    assert all(x.dtype == jnp.uint16 for x in cache.k + cache.v)
    hlo = ar.step.lower(t.cfg, t.params, cache, jnp.zeros((batch,), jnp.int32)).compile().as_text()
    assert _f32_copies(hlo, t.params) == []
    assert _f32_copies(hlo, (cache.k, cache.v)) == []


def test_bits_storage_reads_back_the_same_numbers(tiny_llama):
    """A bf16 cache stored as bits and a plain bf16 cache give bit-identical logits through prefill and
    steps (the bits are the bf16 numbers; only the storage dtype differs)."""
    bits = load_target(tiny_llama.path, tokenizer=False, dtype="bfloat16")
    plain_cfg = bits.cfg.with_numerics(bits.cfg.numerics.replace(cache_bits=False, cache_dtype="bfloat16"))
    ids = jnp.asarray(np.random.default_rng(2).integers(3, 97, size=(3, 16)), jnp.int32)
    lens = jnp.asarray([16, 9, 12], jnp.int32)
    out = []
    for cfg in (bits.cfg, plain_cfg):
        cache, logits = ar.prefill(cfg, bits.params, ids, lens, max_len=300)
        seq = [logits]
        for _ in range(3):
            logits, cache = ar.step(cfg, bits.params, cache, jnp.argmax(logits, -1).astype(jnp.int32))
            seq.append(logits)
        out.append((jnp.stack(seq), cache))
    (a, ca), (b, cb) = out
    assert ca.k[0].dtype == jnp.uint16 and cb.k[0].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    from carryover_jax.models.cache import values
    for x, y in zip(ca.k + ca.v, cb.k + cb.v):
        np.testing.assert_array_equal(np.asarray(values(x), np.float32), np.asarray(y, np.float32))


def test_one_row_dot_equals_the_plain_product():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(48, 40)), jnp.bfloat16)
    for shape in [(1, 48), (1, 1, 48), (48,), (3, 48)]:
        x = jnp.asarray(rng.normal(size=shape), jnp.bfloat16)
        dims = (((x.ndim - 1,), (0,)), ((), ()))
        got = jax.jit(lambda a, b: dot_f32(a, b, dims))(x, w)
        want = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
        assert got.dtype == jnp.float32 and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_bf16_logits_follow_float32(tiny_llama):
    """The stated tolerance: bf16 params and activations move the log-probabilities by less than 0.1 nats on
    the tiny model (bf16 keeps 8 bits of mantissa: ~0.4% per rounding, over 2 layers), and the top token
    agrees wherever float32's margin is above 0.1 nats."""
    f32 = load_target(tiny_llama.path, tokenizer=False)
    bf = load_target(tiny_llama.path, tokenizer=False, dtype="bfloat16")
    ids = jnp.asarray(np.random.default_rng(1).integers(3, 97, size=(3, 17)), jnp.int32)
    a = jax.nn.log_softmax(jax.jit(lambda p, x: TargetLM(f32.cfg).apply({"params": p}, x)[0])(f32.params, ids))
    b = jax.nn.log_softmax(jax.jit(lambda p, x: TargetLM(bf.cfg).apply({"params": p}, x)[0])(bf.params, ids))
    assert b.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(a - b))) < 0.1
    top2 = jnp.sort(a, axis=-1)[..., -2:]
    clear = (top2[..., 1] - top2[..., 0]) > 0.1
    assert bool(jnp.all(jnp.where(clear, jnp.argmax(a, -1) == jnp.argmax(b, -1), True)))


def test_a_cpu_without_native_bf16_gets_one_warning_line(monkeypatch, capsys):
    assert N.cpu_has_native_bf16("processor : 0\nflags : fpu sse avx2 avx512f avx512_bf16\n")
    assert N.cpu_has_native_bf16("Features : fp asimd bf16\n")
    assert not N.cpu_has_native_bf16("flags : fpu sse avx2 avx512f\n")
    monkeypatch.setattr(N, "cpu_has_native_bf16", lambda cpuinfo=None: False)
    monkeypatch.setattr(N, "_WARNED", set())
    Numerics.for_platform("cpu")  # float32: nothing to say
    assert capsys.readouterr().err == ""
    Numerics.for_platform("cpu", dtype="bfloat16")
    Numerics.for_platform("cpu", param_dtype="bfloat16")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no native bf16" in err[0] and "avx512_bf16" in err[0]
    Numerics.for_platform("cuda", dtype="bfloat16")  # another platform's program: no CPU question
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("tied", [True, False])
def test_a_float32_drafter_reads_a_bf16_head_without_widening_it(tied):
    """A float32 drafter on a bf16 target reads the frozen head as the target does (bf16 h x bf16 head,
    float32 sums): no call converts the [V, d] head to float32 (SmolLM2's: 28M weights). The logits
    stay within bf16's rounding of h of the float32 head's."""
    from carryover_jax.decode.drafting import draft_block_logits, new_context_cache
    from tests.drafter_fixtures import tiny_drafter, tiny_frozen

    cfg, params = tiny_drafter("dflash", "zlab")
    f32 = tiny_frozen()
    f32 = {"embed": f32["embed"], "head": None if tied else f32["head"]}
    bf = {k: None if v is None else v.astype(jnp.bfloat16) for k, v in f32.items()}
    rounded = {k: None if v is None else v.astype(jnp.float32) for k, v in bf.items()}
    cache = new_context_cache(cfg, 2, 32)
    anchor = jnp.asarray([3, 7], jnp.int32)
    call = jax.jit(lambda fr: draft_block_logits(cfg, params, fr, cache, anchor))
    assert _f32_copies(call.lower(bf).compile().as_text(), [v for v in bf.values() if v is not None]) == []
    got, want = np.asarray(call(bf)), np.asarray(call(rounded))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0.02, atol=0.02 * float(np.max(np.abs(want))))


def test_bf16_decode_loop_widens_no_embedding_to_float32(tiny_llama):
    """XLA CPU has no bf16 gather: it widens the table around it, and in a decode loop hoists the widening out
    of the loop (a float32 copy of the embedding per call). Tables are gathered as their bits instead
    (`layers.take`), which reads the same numbers, NaN for out-of-range ids as `jnp.take` gives."""
    t = load_target(tiny_llama.path, tokenizer=False, dtype="bfloat16")
    cache = new_cache(t.cfg, 2, 64).with_lengths(jnp.full((2,), 5, jnp.int32))

    def loop(params, cache, tok):
        def body(_, c):
            logits, cache = ar.step(t.cfg, params, c[0], c[1])
            return cache, jnp.argmax(logits, -1).astype(jnp.int32)
        return jax.lax.fori_loop(0, 3, body, (cache, tok))

    hlo = jax.jit(loop).lower(t.params, cache, jnp.zeros((2,), jnp.int32)).compile().as_text()
    assert _f32_copies(hlo, t.params["embed_tokens"]) == []
    from carryover_jax.models.layers import take

    table = t.params["embed_tokens"]["embedding"]
    ids = jnp.asarray([[0, 3, -1], [table.shape[0] - 1, table.shape[0], -table.shape[0] - 1]], jnp.int32)
    got, want = take(table, ids), jnp.take(table, ids, axis=0)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))  # NaN == NaN here
    cols = jnp.asarray([1, 2], jnp.int32)
    np.testing.assert_array_equal(np.asarray(take(table, cols, axis=1), np.float32),
                                  np.asarray(jnp.take(table, cols, axis=1), np.float32))


def _bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16), np.float64)


def test_bf16_values_round_to_nearest_even_as_a_convert_does():
    """`layers.bf16_values` (integer ops XLA cannot fold away) against float32 -> bf16 -> float32 converts: ties
    both ways, signs, subnormals, the largest values (rounding to inf), inf and NaN."""
    from carryover_jax.models.layers import bf16_values

    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2 ** 32, 20000, dtype=np.uint64),
                           np.arange(0x3F800000, 0x3F820000, 0x4000, dtype=np.uint64) + 0x8000,  # ties
                           np.arange(0, 0x20000, 0x7FFF, dtype=np.uint64),  # subnormals
                           [0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x80000000]]).astype(np.uint32)
    x = bits.view(np.float32)
    got = np.asarray(jax.jit(bf16_values)(jnp.asarray(x)))
    want = np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def _ulps(got, want) -> np.ndarray:
    """|got - want| in units of bf16's spacing at want (8 bits of mantissa)."""
    spacing = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 1e-30))) - 7)
    return np.abs(np.asarray(got, np.float64) - want) / spacing


def test_float32_exact_rope_is_rope_to_float32_rounding_and_differentiates_as_it():
    """`apply_rope(..., exact="float32")` (the CPU's float32 RoPE: 12-bit halves, exact products, a fixed sum) against
    a float64 RoPE of the same float32 inputs: within 2 float32 spacings; its gradient that of the plain form."""
    from carryover_jax.models.layers import apply_rope

    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(2, 7, 3, 16)) * 4, jnp.float32)
    pos = jnp.asarray(rng.integers(0, 5000, size=(2, 7)), jnp.int32)
    inv = (1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)).astype(np.float32)
    got = np.asarray(jax.jit(lambda x, p: apply_rope(x, p, inv, exact="float32"))(x, pos), np.float64)
    emb = np.asarray(pos, np.float32)[..., None] * inv
    emb = jnp.asarray(np.concatenate([emb, emb], -1))
    cos, sin = (np.asarray(f(emb), np.float64)[:, :, None] for f in (jnp.cos, jnp.sin))
    x64 = np.asarray(x, np.float64)
    want = x64 * cos + np.concatenate([-x64[..., 8:], x64[..., :8]], -1) * sin
    assert np.all(np.abs(got - want) <= 2 * np.spacing(np.abs(want).astype(np.float32)))
    r = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    g = [jax.grad(lambda x, e=e: jnp.sum(apply_rope(x, pos, inv, exact=e) * r))(x) for e in ("float32", None)]
    np.testing.assert_allclose(g[0], g[1], rtol=1e-6, atol=1e-6)


def test_cpu_bf16_rope_passes_gradients_like_float32(tiny_llama):
    """The exact-product RoPE's roundings are integer ops; differentiated as converts are, q_proj's and k_proj's
    gradients through a bf16 model's RoPE on CPU follow the float32 model's (integer ops alone: all zero)."""
    from carryover_jax.models.layers import Attention, bf16_values
    from carryover_jax.models.target import target_inv_freq

    np.testing.assert_array_equal(jax.grad(lambda x: bf16_values(x).sum())(jnp.arange(5.0) / 3), np.ones(5))
    c = load_target(tiny_llama.path, tokenizer=False, dtype="bfloat16").cfg
    p32 = load_target(tiny_llama.path, tokenizer=False).params["layers"]["0"]["self_attn"]
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(2, 9, c.hidden_size)), jnp.float32)
    pos = jnp.broadcast_to(jnp.arange(40, 49, dtype=jnp.int32), (2, 9))
    grads = {}
    for dt in (jnp.float32, jnp.bfloat16):
        attn = Attention(embed_dim=c.hidden_size, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                         head_dim=c.head_dim, inv_freq=target_inv_freq(c, 0), eps=c.rms_norm_eps, dtype=dt,
                         param_dtype=dt, products="stream")

        def loss(p, attn=attn, dt=dt):
            q = attn.apply({"params": p}, x.astype(dt), pos, method=Attention.queries)
            k, _ = attn.apply({"params": p}, x.astype(dt), pos, method=Attention.keys_values)
            return jnp.sum(q.astype(jnp.float32) ** 2) + jnp.sum(k.astype(jnp.float32) ** 2)

        g = jax.jit(jax.grad(loss))(jax.tree.map(lambda a, dt=dt: a.astype(dt), p32))
        grads[dt] = {n: np.asarray(g[n]["kernel"], np.float64).ravel() for n in ("q_proj", "k_proj")}
    for n in ("q_proj", "k_proj"):
        a, b = grads[jnp.float32][n], grads[jnp.bfloat16][n]
        assert np.linalg.norm(b) > 0 and a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.99, n


def test_cpu_bf16_rope_products_are_exact(tiny_llama):
    """On a CPU a bf16 model's q and k leave RoPE as `apply_rope`'s `exact="bfloat16"` form of the projections' float32
    accumulators, bit for bit: the accumulator, cos and sin rounded to bf16 values (as HF rounds them), so both
    products are exact in float32 and an FMA contraction (XLA CPU fuses one in some programs, not in others) cannot
    change them, then the sum rounded once; HF's form (each product rounded) differs. v is its projection rounded
    once, as in HF."""
    from carryover_jax.models.layers import Attention
    from carryover_jax.models.target import target_inv_freq

    t = load_target(tiny_llama.path, tokenizer=False, dtype="bfloat16")
    c, p = t.cfg, t.params["layers"]["0"]["self_attn"]
    assert not c.qk_norm
    attn = Attention(embed_dim=c.hidden_size, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                     head_dim=c.head_dim, inv_freq=target_inv_freq(c, 0),
                     eps=c.rms_norm_eps, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, products="stream")
    x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 9, c.hidden_size)), jnp.bfloat16)
    pos = jnp.broadcast_to(jnp.arange(40, 49, dtype=jnp.int32), (2, 9))
    q = jax.jit(lambda p, x, s: attn.apply({"params": p}, x, s, method=Attention.queries))(p, x, pos)
    k, v = jax.jit(lambda p, x, s: attn.apply({"params": p}, x, s, method=Attention.keys_values))(p, x, pos)
    assert q.dtype == k.dtype == v.dtype == jnp.bfloat16
    acc = jax.jit(lambda p, x: attn.apply({"params": p}, x, method=lambda m, x: (m.q_proj(x), m.k_proj(x))))(p, x)

    freqs = np.arange(40, 49, dtype=np.float32)[:, None] * np.asarray(target_inv_freq(c, 0), np.float32)[None]
    emb = jnp.asarray(np.concatenate([freqs, freqs], -1))
    cos, sin = (_bf16(np.asarray(f(emb)))[None, :, None] for f in (jnp.cos, jnp.sin))

    def rope(y, each_product):
        half = y.shape[-1] // 2
        rot = np.concatenate([-y[..., half:], y[..., :half]], -1)
        return _bf16(np.float32(each_product(y * cos) + each_product(rot * sin)))  # float64: exact products

    for got, y, heads in ((q, acc[0], c.num_heads), (jnp.swapaxes(k, 1, 2), acc[1], c.num_kv_heads)):
        y = _bf16(np.asarray(y, np.float32).reshape(2, 9, heads, c.head_dim))
        np.testing.assert_array_equal(np.asarray(got, np.float64), rope(y, lambda a: a))
        assert not np.array_equal(np.asarray(got, np.float64), rope(y, _bf16))  # HF's bf16 RoPE: each product rounded
    x64 = np.asarray(x, np.float64)
    want_v = (x64 @ np.asarray(p["v_proj"]["kernel"], np.float64)).reshape(2, 9, c.num_kv_heads, c.head_dim)
    assert _ulps(jnp.swapaxes(v, 1, 2), want_v).max() <= 0.5 + 1e-2
