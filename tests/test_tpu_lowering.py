"""Compiled for TPU on this CPU host: the TPU compiler itself (libtpu, the `.[tpu]` extra) compiles against a
compile-only topology (`jax.experimental.topologies.get_topology_desc`), no TPU attached. This runs Mosaic's
layout passes on the attention kernel — which lowering alone does not (tests/test_lowering.py) — and XLA's
TPU buffer assignment on whole programs. Skipped, naming why, where libtpu is not installed."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax.models import tpu_attention as ta


@pytest.fixture(autouse=True)
def _no_persistent_cache():
    """Executables for compile-only devices cannot be read back from the suite's persistent XLA cache (a
    warning per compile): compile them without it."""
    old = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    yield
    jax.config.update("jax_enable_compilation_cache", old)


@functools.lru_cache(maxsize=None)
def _topology(name: str):
    from jax.experimental import topologies

    try:
        return topologies.get_topology_desc(platform="tpu", topology_name=name)
    except RuntimeError as e:  # jax: "JAX TPU support not installed; cannot generate TPU topology"
        pytest.skip(f"no TPU compiler here (pip install '.[tpu]' for libtpu): {e}")


def on_chip(chip: str):
    """A one-chip mesh of a compile-only v5e / v6e topology and a function giving abstract args its sharding."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    topo = _topology({"v5e": "v5e:2x2", "v6e": "v6e:2x2"}[chip])
    sh = NamedSharding(Mesh(np.asarray(topo.devices[:1]), ("data",)), P())
    return lambda tree: jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree)


def _kernel_args(rows, d, s, dtype=jnp.bfloat16, b=2, hkv=2):
    return [jax.ShapeDtypeStruct((b, hkv, rows, d), dtype), jax.ShapeDtypeStruct((b, hkv, s, d), dtype),
            jax.ShapeDtypeStruct((b, hkv, s, d), dtype), jax.ShapeDtypeStruct((b, rows), jnp.int32),
            jax.ShapeDtypeStruct((b, rows), jnp.int32)]


# (chip, head dim, folded query rows, dtype): every head dim on v5e in the accelerator dtype at AR's 8 rows
# (G = 8, T = 1), verification's 128 rows (G = 8, T = 16) at the largest head dim in both dtypes, v6e's layout,
# and a 4,096-token prefill's 16,384 rows (G = 4) in row blocks
_KERNEL_CASES = [("v5e", d, 8, jnp.bfloat16) for d in (64, 128, 256, 512)] + [
    ("v5e", 512, 128, jnp.bfloat16), ("v5e", 512, 128, jnp.float32), ("v6e", 128, 8, jnp.bfloat16),
    ("v6e", 512, 128, jnp.bfloat16), ("v5e", 128, 16384, jnp.bfloat16), ("v5e", 512, 16384, jnp.float32)]


def test_the_kernel_compiles_for_tpu_at_every_head_dim():
    """Head dims 64-512 with their default tiles, over a cache that the tile does not divide."""
    fn = jax.jit(lambda q, k, v, lim, low: ta.live_attention(q, k, v, lim, low, scale=0.1, interpret=False))
    for chip, d, rows, dtype in _KERNEL_CASES:
        compiled = fn.trace(*on_chip(chip)(_kernel_args(rows, d, 4100, dtype))).lower().compile()
        assert "tpu_custom_call" in compiled.as_text(), (chip, d, rows, dtype)


def test_the_vmem_rule_agrees_with_the_compiler():
    """The largest tile `tile_sizes` accepts at head dim 512 compiles; the next one, which it refuses, is
    what the compiler rejects for VMEM (so the one-line refusal replaces a compiler error, not a run)."""
    place = on_chip("v5e")
    ok = ta.tile_sizes(512, 8192, rows=8, block_k=2048)
    with pytest.raises(Exception, match="head dim 512 with key block size 4096"):
        ta.tile_sizes(512, 8192, rows=8, block_k=4096)

    def run(tiles):
        def f(q, k, v, lim, low):
            first, count = ta._live_tiles(lim[:, None], low[:, None], tiles.block_k, tiles.num_tiles)
            return ta._call(first, count, lim[..., None], low[..., None], q, k, v, scale=0.1, tiles=tiles,
                            interpret=False)
        return jax.jit(f).trace(*place(_kernel_args(8, 512, 8192))).lower().compile()

    run(ok)
    with pytest.raises(Exception, match="vmem|VMEM"):
        run(ta.TpuTiles(block_k=4096, num_tiles=2))


def test_decode_programs_compile_for_tpu():
    """The AR step and verification of a Qwen3-shaped target (head dim 128, "auto" in the TPU numerics)
    compile for a v5e chip with one Mosaic call per layer in the optimised program."""
    from carryover_jax.config import PRESETS
    from carryover_jax.decode import autoregressive as ar
    from carryover_jax.models.target import TargetLM, abstract_params
    from carryover_jax.numerics import Numerics

    tc = PRESETS["qwen3-4b"].replace(num_layers=2, hidden_size=256, intermediate_size=512, num_heads=8,
                                     num_kv_heads=2, head_dim=128, vocab_size=512
                                     ).with_numerics(Numerics.platform_default("tpu"))
    place = on_chip("v5e")
    tp = abstract_params(tc)
    cache, _ = jax.eval_shape(functools.partial(ar.prefill, tc, max_len=1024), tp, jnp.zeros((2, 16), jnp.int32),
                              jnp.full((2,), 16, jnp.int32))

    def chunk(params, cache, tokens):
        return TargetLM(tc).apply({"params": params}, tokens, cache=cache)[:2]

    for t in (1, 4):
        tok = jax.ShapeDtypeStruct((2, t), jnp.int32)
        compiled = jax.jit(chunk).trace(*place((tp, cache, tok))).lower().compile()
        assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == tc.num_layers, t
        assert compiled.memory_analysis() is not None
