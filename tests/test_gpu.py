"""Tests that run on an accelerator: marked `gpu`, skipped where jax has none (CI, this CPU machine).
Run them on a GPU machine with `python -m pytest -m gpu` (tests/conftest.py initialises the
accelerator next to the CPU backend; the `accelerator` fixture makes it the default device).

Small on purpose: the tiny random models of the CPU suite, compiled for the device's backend, where
the fused Pallas kernels are compiled (Triton), not interpreted, and the platform defaults are bf16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import generate, load_target
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.loading import init_drafter
from carryover_jax.models.layers import Prefix, attention_core

pytestmark = pytest.mark.gpu


def _on(x, device) -> bool:
    return all(leaf.devices() == {device} for leaf in jax.tree_util.tree_leaves(x))


@pytest.mark.parametrize("window", [None, 9])
def test_fused_kernel_matches_einsum_on_the_device(accelerator, window):
    """The compiled Pallas attention kernel (backend "pallas") against the einsum reference computed at
    full float32 precision on the same device: outputs and the gradients of a nonlinear functional,
    for a causal prefix (optionally a sliding window) over lengths that are not tile multiples."""
    rng = np.random.default_rng(0)
    b, t, h, hkv, d = 2, 45, 4, 2, 64
    q = jnp.asarray(rng.normal(size=(b, t, h, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, hkv, t, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, hkv, t, d)), jnp.float32)
    limit = jnp.broadcast_to(jnp.arange(1, t + 1)[None], (b, t)).astype(jnp.int32)
    mask = Prefix(limit, None if window is None else jnp.maximum(limit - window, 0))

    def run(backend):
        def loss(q, k, v):
            out = attention_core(q, [(k, v, mask)], d ** -0.5, backend)
            return jnp.sum(jnp.sin(out) * out), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
        return out, grads

    with jax.default_matmul_precision("highest"):
        want, gw = run("einsum")
    got, gg = run("pallas")
    assert _on((got, gg), accelerator)
    # the kernel's dots may use the device's fast float32 path (TF32): a wrong mask or merge is off by O(1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-2, rtol=2e-2)
    for a, w in zip(gg, gw):
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("carryover", [True, False])
def test_bf16_greedy_speculative_equals_ar_on_the_device(tiny_llama, accelerator, carryover):
    """The accelerator's defaults (bf16 params, activations and caches; attention "auto" = the fused
    kernels on CUDA): greedy speculative decoding emits exactly what AR decoding of the same target does."""
    target = load_target(tiny_llama.path, tokenizer=False, platform=accelerator.platform)
    assert target.cfg.numerics.dtype == "bfloat16" and _on(target.params, accelerator)
    drafter = init_drafter(target, kind="dflash", layout="zlab", num_proposals=4, num_layers=1,
                           target_layer_ids=(0, 1), mask_token_id=4, carryover=carryover)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, size=n).tolist() for n in (4, 13, 7, 9)]
    max_new = [12, 5, 16, 9]
    ref = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=[])
    out, stats = speculative_generate(target, drafter, prompts, max_new_tokens=max_new, stop_token_ids=[],
                                      carryover=carryover)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert [len(r.token_ids) for r in ref] == max_new and stats["rounds"] > 0
