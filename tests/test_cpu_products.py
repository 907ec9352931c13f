"""The CPU's decode-step products kernel (`models/cpu_products.cc`) against float64 numpy, row by row bit for bit
against its own one-row calls (what makes a verified token's logits those of an AR step, at any batch size), its
gradient and vmap against XLA's dots; where the model lowers it (products of 1-8 rows, float32 ones of up to
`F32_ROWS`, CPU only); AR decoding with it against transformers' greedy decoding; and a machine that cannot build it
(one warning line, XLA's dot)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import load_target
from carryover_jax import numerics as N
from carryover_jax.errors import ConfigError
from carryover_jax.models import cpu_products as cp
from carryover_jax.models.target import TargetLM
from carryover_jax.numerics import Numerics

pytestmark = pytest.mark.skipif(not cp.available(), reason="no C++ compiler for the CPU kernel")

# K, N: tails of K % 4, N % 16, K < 4, N = 1; for e [N, K] N % 4 (rows of e read 4 at a time), N below the rows
# prefetched ahead; for float32's 9-24-row loops and w [K, N]'s tiled loop (25+ rows) N = 96 + 2 x 16 + 2 (a full
# column tile, two 16-column ones and a tail; by bf16 pairs one 32-column tile and a tail) with K over one panel (96)
# in each of its chunks; odd K (37, 3) for the pairs' last row alone
SHAPES = ((576, 192), (37, 19), (3, 16), (130, 1), (1536, 576), (64, 7), (250, 130))


def _call(x, w, layout):
    return np.asarray(jax.jit(cp.products, static_argnums=2)(x, w, layout))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_products_equal_float64_and_every_row_its_own_one_row_call(layout, dtype):
    """bf16 operands: products of the bf16 values, exact in float32, summed in float32 (XLA's bf16 dots with
    float32 accumulation compute the same sums; with avx512_bf16 two products a step, at any number of rows)."""
    rng = np.random.default_rng(0)
    for k, n in SHAPES:
        w = jnp.asarray(rng.normal(size=(k, n)), dtype)
        wl = w if layout == "kn" else jnp.asarray(w.T)
        more = {("kn", "float32"): (9, 24, 37, 64), ("nk", "float32"): (9, 16, 24),
                ("kn", "bfloat16"): (9, 24, 37, 64) if cp.bf16_pairs() else ()}.get((layout, dtype), ())
        for m in (1, 2, 4, 5, 7, 8) + more:
            x = jnp.asarray(rng.normal(size=(m, k)), dtype)
            y = _call(x, wl, layout)
            assert y.dtype == np.float32
            want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
            np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5 * np.sqrt(k))
            for i in sorted({0, 3, 4, m // 2, m - 1} & set(range(m))):  # bitwise: a row's sums never depend on
                # the row count (tiles of 4 rows: a tile's first, last and next rows, and the rows left over)
                np.testing.assert_array_equal(_call(x[i:i + 1], wl, layout), y[i:i + 1], err_msg=f"{k}x{n} m={m}")


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_gradient_and_vmap_follow_xla(layout):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 40)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(40, 24) if layout == "kn" else (24, 40)), jnp.float32)
    xla = (lambda a, b: a @ b) if layout == "kn" else (lambda a, b: a @ b.T)
    loss = lambda f: lambda a, b: jnp.sum(jnp.sin(f(a, b)))  # noqa: E731
    got = jax.grad(loss(lambda a, b: cp.products(a, b, layout)), argnums=(0, 1))(x, w)
    want = jax.grad(loss(xla), argnums=(0, 1))(x, w)
    for g, h in zip(got, want):
        np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-5)
    xs = jnp.stack([x, 2 * x])
    np.testing.assert_allclose(jax.vmap(lambda a: cp.products(a, w, layout))(xs), jax.vmap(lambda a: xla(a, w))(xs),
                               rtol=1e-5, atol=1e-4)


def _program(cfg, rows: int, platform: str = "cpu") -> str:
    model = TargetLM(cfg)
    tokens = jnp.zeros((1, rows), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]
    return jax.jit(lambda p, t: model.apply({"params": p}, t)).trace(params, tokens).lower(
        lowering_platforms=(platform,)).as_text()


def _cfg(tiny_llama, **numerics):
    return load_target(tiny_llama.path, numerics=Numerics(**numerics), tokenizer=False).cfg


def test_the_model_lowers_the_kernel_only_where_it_applies(tiny_llama):
    stream = _cfg(tiny_llama)
    assert stream.numerics.decode_products == "stream" and stream.tie_word_embeddings is False
    assert stream.num_layers == 3
    text = _program(stream, 4)  # q, k, v, o, gate, up, down a layer and the untied head
    assert text.count(cp.TARGETS["kn", "float32"]) == 7 * 3 + 1, text.count(cp.TARGETS["kn", "float32"])
    tied = stream.replace(tie_word_embeddings=True)
    for rows in (4, 5, 8):  # a tied head of 1-8 rows: a verification of up to 8 tokens at batch 1
        assert _program(tied, rows).count(cp.TARGETS["nk", "float32"]) == 1, rows
    assert _program(_cfg(tiny_llama, dtype="bfloat16"), 4).count(cp.TARGETS["kn", "bfloat16"]) == 7 * 3 + 1
    most = cp.F32_ROWS  # float32 above 8 rows: a batch's decode step
    for rows in (9, most["nk"], most["nk"] + 1, most["kn"]):
        assert _program(stream, rows).count(cp.TARGETS["kn", "float32"]) == 7 * 3 + 1, rows
        text = _program(tied, rows)
        assert text.count(cp.TARGETS["kn", "float32"]) == 7 * 3, rows
        assert text.count(cp.TARGETS["nk", "float32"]) == (rows <= most["nk"]), rows
    bf16 = _cfg(tiny_llama, dtype="bfloat16")
    bf16_most = cp.most_rows("kn", "bfloat16")  # 8, or a batch's step by avx512_bf16 pairs on a CPU without AMX
    assert bf16_most == (cp.BF16_PAIR_ROWS if cp.bf16_pairs() and "amx_bf16" not in N.cpu_flags() else 8)
    assert _program(bf16, bf16_most).count(cp.TARGETS["kn", "bfloat16"]) == 7 * 3 + 1
    for cfg, rows, platform in ((stream, most["kn"] + 1, "cpu"),  # more rows than it takes: XLA's kernel
                                (bf16, bf16_most + 1, "cpu"),  # bf16 above them: XLA's
                                (_cfg(tiny_llama, decode_products="xla"), 4, "cpu"),
                                (_cfg(tiny_llama, dtype="float16"), 4, "cpu"),  # no float16 kernel
                                (stream, 4, "cuda")):  # accelerators never lower it
        text = _program(cfg, rows, platform)
        assert not any(t in text for t in cp.TARGETS.values()), (rows, cfg.numerics, platform)


def test_ar_decoding_with_the_kernel_equals_transformers_and_xla_dots(tiny_llama):
    """Greedy AR decoding with the kernel picks transformers' greedy tokens (teacher-forced check, as in
    test_smollm2) and XLA's dots' tokens."""
    import torch

    from carryover_jax import generate

    prompts = [[5, 17, 33, 2, 61], [7, 7, 90, 41, 3, 12, 8]]
    out = {}
    for name in ("stream", "xla"):
        target = load_target(tiny_llama.path, numerics=Numerics(decode_products=name), tokenizer=False)
        out[name] = [r.token_ids for r in generate(target, prompts, max_new_tokens=16)]
    assert out["stream"] == out["xla"]
    for p, r in zip(prompts, out["stream"]):
        with torch.no_grad():
            logits = tiny_llama.hf(torch.tensor([p + r])).logits[0]
        assert r == logits[len(p) - 1:-1].argmax(-1).tolist()


def test_numerics_choice_is_checked_and_defaults_per_platform():
    assert Numerics.for_platform("cpu").decode_products == "stream"
    assert Numerics.for_platform("cuda").decode_products == "xla"
    assert Numerics.for_platform("tpu").decode_products == "xla"
    with pytest.raises(ConfigError, match="decode_products must be one of xla, stream"):
        Numerics(decode_products="fast")


def test_the_cli_refuses_an_unknown_choice_in_one_line(capsys):
    from carryover_jax.cli import main

    with pytest.raises(SystemExit) as e:
        main(["generate", "--prompt", "hi", "--decode-products", "fast"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "--decode-products: invalid choice: 'fast'" in err[-1]


def test_no_compiler_means_one_warning_and_xla_dots(tmp_path, monkeypatch, capsys, tiny_llama):
    monkeypatch.setenv("CARRYOVER_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(N, "_WARNED", set())
    cp.available.cache_clear()
    try:
        assert not cp.available() and not cp.available()
        err = capsys.readouterr().err
        assert err.count("warning: numerics: decode_products 'stream' falls back to XLA's dot") == 1, err
        assert "no-such-compiler" in err and len(err.strip().splitlines()) == 1
        assert not any(t in _program(_cfg(tiny_llama), 4) for t in cp.TARGETS.values())
        with pytest.raises(RuntimeError, match="unavailable"):
            cp.products(jnp.ones((1, 4)), jnp.ones((4, 4)))
    finally:
        monkeypatch.undo()
        cp.available.cache_clear()
    assert cp.available()  # the real build again (its custom calls were registered once, by the first build)
