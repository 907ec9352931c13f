"""The CPU's logsumexp kernel (`models/cpu_logsumexp.cc`) against float64 numpy and `jax.nn.logsumexp` (values,
infinities, NaN, gradient, vmap), every row bit for bit against its own one-row call; where it is lowered (float32
lowered for CPU: prepare's stored teacher log-sum-exp); and a machine that cannot build it (one warning line,
XLA's ops)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import numerics as N
from carryover_jax.models import cpu_logsumexp as cl
from carryover_jax.models.target import head_logsumexp, init_params
from tests.test_dvd import TCFG

pytestmark = pytest.mark.skipif(not cl.available(), reason="no C++ compiler for the CPU kernel")

KERNEL = jax.jit(cl.kernel_logsumexp)


def _float64(x):
    z = np.asarray(x, np.float64)
    m = z.max(-1, keepdims=True)
    return (np.log(np.exp(z - m).sum(-1, keepdims=True)) + m)[..., 0]


@pytest.mark.parametrize("v", [1, 15, 16, 17, 64, 100, 1000, 49152 + 7])
def test_kernel_equals_float64_and_every_row_its_own_call(v):
    """V below, at and past one vector (16 lanes) and one block of four, with a tail; rows of any scale."""
    rng = np.random.default_rng(v)
    x = jnp.asarray(rng.normal(size=(5, v)) * np.array([[0.1], [1.0], [10.0], [100.0], [1000.0]]), jnp.float32)
    y = np.asarray(KERNEL(x))
    assert y.shape == (5,) and y.dtype == np.float32
    np.testing.assert_allclose(y, _float64(x), rtol=2e-6, atol=2e-6)
    for i in range(5):  # bitwise: the row count never changes a row's result
        np.testing.assert_array_equal(np.asarray(KERNEL(x[i:i + 1])), y[i:i + 1])
    x3 = x.reshape(5, 1, v)  # leading axes of any rank
    np.testing.assert_array_equal(np.asarray(KERNEL(x3)), y.reshape(5, 1))


def test_infinities_and_nan_follow_jax():
    inf, nan = np.inf, np.nan
    x = np.zeros((8, 40), np.float32)
    x[0] = -inf  # every value -inf: -inf
    x[1, 3] = inf  # +inf: +inf
    x[2, 5] = nan  # NaN: NaN
    x[3, 7] = -inf  # one -inf among finite values: exp gives 0
    x[4] = 88.0  # exp(88) overflows float32: only x - max is exponentiated
    x[5] = -1e30
    x[6, 39] = nan  # NaN in the tail
    x[7, 2], x[7, 9] = inf, nan  # +inf and NaN: NaN
    got, want = np.asarray(KERNEL(jnp.asarray(x))), np.asarray(jax.nn.logsumexp(jnp.asarray(x), axis=-1))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_gradient_and_vmap_follow_jax():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 4, 50)), jnp.float32)
    loss = lambda f: lambda a: jnp.sum(jnp.sin(f(a)))  # noqa: E731
    np.testing.assert_allclose(jax.grad(loss(cl.logsumexp))(x), jax.grad(loss(lambda a: jax.nn.logsumexp(a, -1)))(x),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(cl.logsumexp)(x), jax.nn.logsumexp(x, -1), rtol=1e-6)


def _program(dtype=jnp.float32, platform="cpu") -> str:
    x = jnp.zeros((4, 100), dtype)
    # a new function each time: jit keeps one trace per function, and availability is read at trace time
    return jax.jit(lambda a: cl.logsumexp(a)).trace(x).lower(lowering_platforms=(platform,)).as_text()


def test_the_kernel_is_lowered_only_where_it_applies():
    assert _program().count(cl.TARGET) == 1
    assert cl.TARGET not in _program(platform="cuda")
    assert cl.TARGET not in _program(jnp.bfloat16)  # float32 only: other dtypes keep XLA's ops
    tp = init_params(TCFG, jax.random.key(0))
    h = jnp.zeros((2, 3, TCFG.hidden_size), jnp.bfloat16)
    text = jax.jit(lambda p, h: head_logsumexp(TCFG, p, h)).trace(tp, h).lower(lowering_platforms=("cpu",)).as_text()
    assert text.count(cl.TARGET) == 1  # prepare's stored log-sum-exp (its values: tests/test_target_lse.py)


def test_no_compiler_means_one_warning_and_xla(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CARRYOVER_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(N, "_WARNED", set())
    cl.available.cache_clear()
    try:
        assert not cl.available() and not cl.available()
        err = capsys.readouterr().err
        assert err.count("logsumexp falls back to XLA's ops") == 1, err
        assert "no-such-compiler" in err and len(err.strip().splitlines()) == 1
        assert cl.TARGET not in _program()
        x = jnp.asarray(np.random.default_rng(2).normal(size=(3, 30)), jnp.float32)
        np.testing.assert_allclose(jax.jit(lambda a: cl.logsumexp(a))(x), _float64(x), rtol=1e-6)
        with pytest.raises(RuntimeError, match="unavailable"):
            cl.kernel_logsumexp(x)
    finally:
        monkeypatch.undo()
        cl.available.cache_clear()
    assert cl.available()
