"""Where jax has no Pallas Triton backend (deprecated in jax 0.11, to be removed): `auto` lowered for cuda reads
the caches with the masked dense einsum, with one notice line per process; `pallas` / `cudnn` (the Triton
kernel) are refused in one line; the CPU interpreter still runs the kernel. The availability probe
(`numerics.triton_available`) is patched to say "missing"; with it saying "available" nothing changes."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import numerics
from carryover_jax.errors import ConfigError
from carryover_jax.models.kernels import prefix_attention
from carryover_jax.models.layers import LiveMask, Prefix, attention_core, resolve_backend
from carryover_jax.numerics import Numerics
from tests.lowering import TRITON_CALL, cuda_mesh, data_dependent_whiles, lower_text

B, T, H, HKV, D, S = 2, 3, 4, 2, 16, 40


@pytest.fixture
def triton(monkeypatch):
    """set(available): patch the probe; the once-per-process notices start empty."""
    monkeypatch.setattr(numerics, "_WARNED", set())
    return lambda available: monkeypatch.setattr(numerics, "triton_available", lambda: available)


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(B, HKV, S, D)), jnp.float32) for _ in range(2))
    limit = jnp.asarray([[7, 8, 9], [33, 34, 35]], jnp.int32)
    return q, k, v, limit


def _decode_and_training(backend):
    """One decode cache read (`LiveMask`) and one training-style key range (`Prefix`) through attention_core."""
    def f(q, k, v, limit):
        return attention_core(q, [(k, v, LiveMask(limit)), (k, v, Prefix(limit - 5))], 0.25, backend)
    return f


def _cuda_text(backend):
    args = _arrays()
    with jax.sharding.use_abstract_mesh(cuda_mesh()):
        traced = jax.jit(_decode_and_training(backend)).trace(*args)
    return lower_text(traced, "cuda")


def test_the_probe_reads_the_triton_modules(monkeypatch):
    numerics.triton_available.cache_clear()
    try:
        assert numerics.triton_available() == (importlib.util.find_spec("jax._src.pallas.triton") is not None)
        numerics.triton_available.cache_clear()
        monkeypatch.setattr(numerics, "TRITON_MODULES", numerics.TRITON_MODULES + ("jax._src.pallas.no_such_backend",))
        assert numerics.triton_available() is False
    finally:
        monkeypatch.undo()
        numerics.triton_available.cache_clear()


def test_auto_falls_back_to_the_dense_read_on_cuda(triton, capsys):
    triton(False)
    for _ in range(3):  # resolved at every runtime boundary of a run: one notice
        assert Numerics.for_platform("cuda").attention_backend == "auto"
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "no Pallas Triton backend" in err and "falls back to einsum" in err
    assert Numerics.for_platform("cpu").attention_backend == "cpu" and not capsys.readouterr().err
    text = _cuda_text("auto")
    assert TRITON_CALL not in text  # the masked dense read: no kernel, and no loop over the cache either
    assert "stablehlo.while" not in text and data_dependent_whiles(text) == 0
    dots = [t.count("stablehlo.dot_general") for t in (text, _cuda_text("einsum"))]
    assert dots[0] == dots[1] == 4  # scores and values of both segments, over all S slots
    assert text.count(f"tensor<{B}x{HKV}x2x{T}x{S}xf32>") >= 2  # the [B, Hkv, G, T, S] scores: the whole buffer


def test_kernel_backends_are_refused_where_triton_is_missing(triton, monkeypatch):
    triton(False)
    for name in numerics.KERNEL_BACKENDS:
        with pytest.raises(ConfigError, match=f"attention backend '{name}' runs the Pallas Triton kernel, and jax "
                                              r"\S+ has no Pallas Triton backend") as e:
            Numerics.for_platform("cuda", attention_backend=name)
        assert "\n" not in str(e.value)
    q, k, v, limit = _arrays()
    with pytest.raises(ConfigError, match="no Pallas Triton backend"):
        prefix_attention(jnp.swapaxes(q, 1, 2), k, v, limit, scale=0.25, interpret=False)
    # on CPU the kernel still runs, interpreted
    assert Numerics.for_platform("cpu", attention_backend="pallas").attention_backend == "pallas"
    np.testing.assert_allclose(np.asarray(jax.jit(_decode_and_training("pallas"))(q, k, v, limit)),
                               np.asarray(jax.jit(_decode_and_training("einsum"))(q, k, v, limit)), atol=2e-5)
    with monkeypatch.context() as m:  # a process on a GPU: refused before tracing
        m.setattr(jax, "default_backend", lambda: "gpu")
        with pytest.raises(ConfigError, match="attention backend 'pallas' runs the Pallas Triton kernel"):
            resolve_backend("pallas")
        assert resolve_backend("auto") == "auto" and resolve_backend("einsum") == "einsum"


def test_with_triton_present_nothing_changes(triton, capsys):
    if not numerics.triton_available():
        pytest.skip(f"jax {jax.__version__} has no Pallas Triton backend")
    triton(True)
    assert Numerics.for_platform("cuda").attention_backend == "auto"
    assert Numerics.for_platform("cuda", attention_backend="pallas").attention_backend == "pallas"
    assert not capsys.readouterr().err
    assert _cuda_text("auto").count(TRITON_CALL) == 2  # the cache read and the key range through the kernel
