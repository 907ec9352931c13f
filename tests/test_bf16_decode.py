"""bf16 decoding (params, activations and both KV caches in bfloat16, the accelerator setting; float32
stays the CPU default, and a CPU bf16 run keeps float32 caches unless asked: here they are asked): greedy output follows float32 for a bounded number of tokens, and greedy
speculative decoding still equals AR decoding of the same bf16 target."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import generate, load_target
from carryover_jax.config import DrafterConfig
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.numerics import Numerics

MAX_NEW = [12, 5, 16, 9]
BF16 = Numerics(dtype="bfloat16", cache_dtype="bfloat16")


def _prompts(seed=0, lens=(4, 13, 7, 9)):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 97, size=n).tolist() for n in lens]


def _bf16_drafter(cfg, params):
    bc = cfg.backbone.replace(dtype="bfloat16", param_dtype="bfloat16")
    return cfg.replace(backbone=bc), jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)


def test_bf16_target_loads_caches_and_follows_float32_greedy(tiny_llama):
    f32 = load_target(tiny_llama.path, tokenizer=False)
    bf = load_target(tiny_llama.path, tokenizer=False, numerics=BF16)
    assert f32.cfg.dtype == "float32" and all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(f32.params))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(bf.params))
    from carryover_jax.models.cache import values
    from carryover_jax.models.target import new_cache
    # on CPU the bf16 cache is stored as its uint16 bits (cache_bits), read back as bf16
    assert all(k.dtype == jnp.uint16 and values(k).dtype == jnp.bfloat16 for k in new_cache(bf.cfg, 1, 8).k)
    plain = bf.cfg.with_numerics(bf.cfg.numerics.replace(cache_bits=False))
    assert all(k.dtype == jnp.bfloat16 for k in new_cache(plain, 1, 8).k)
    prompts = _prompts()
    want = generate(f32, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[])
    got = generate(bf, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[])
    # bounded agreement: bf16 rounding may flip a near-tie late in a sequence, never the first tokens
    for w, g in zip(want, got):
        assert g.token_ids[:4] == w.token_ids[:4]
    agree = np.mean([a == b for w, g in zip(want, got) for a, b in zip(w.token_ids, g.token_ids)])
    assert agree > 0.75, agree


@pytest.mark.parametrize("kind,layout,carryover", [("dflash", "zlab", True),
                                                   pytest.param("markov", "deepspec", True, marks=pytest.mark.heavy),
                                                   ("dflash", "deepspec", False)])
def test_bf16_greedy_speculative_equals_bf16_ar(tiny_llama, kind, layout, carryover):
    target = load_target(tiny_llama.path, tokenizer=False, numerics=BF16)
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout=layout, num_proposals=4, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0, 1),
                                   markov_rank=8 if kind == "markov" else None)
    drafter = _bf16_drafter(cfg, init_drafter_params(cfg, jax.random.key(0)))
    prompts = _prompts()
    ref = generate(target, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[])
    out, stats = speculative_generate(target, drafter, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[],
                                      carryover=carryover)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert stats["rounds"] > 0


@pytest.mark.parametrize("carryover", [True, False])
def test_a_bf16_drafter_beside_a_float32_target_stays_lossless(tiny_llama, carryover):
    """`drafter_dtype` bf16 (`--drafter-dtype`): the drafter computes and caches its context in bf16, the target
    stays float32, and greedy speculative decoding equals float32 AR (proposals never change what is committed)."""
    from carryover_jax.decode import drafting as D

    f32 = load_target(tiny_llama.path, tokenizer=False)
    target = load_target(tiny_llama.path, tokenizer=False, numerics=Numerics(drafter_dtype="bfloat16"))
    assert target.cfg.numerics == f32.cfg.numerics.replace(drafter_dtype="bfloat16")
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(target.params))
    cfg = DrafterConfig.for_target(target.cfg, num_proposals=4, num_layers=1, mask_token_id=4, target_layer_ids=(0, 1))
    assert cfg.backbone.dtype == "bfloat16" and cfg.backbone.numerics.cache_dtype == "bfloat16"
    assert all(k.dtype == jnp.uint16 for k in D.new_context_cache(cfg, 1, 8).k)  # bf16 bits on CPU
    assert DrafterConfig.for_target(f32.cfg, num_proposals=4, num_layers=1, mask_token_id=4).backbone.dtype == "float32"
    params = init_drafter_params(cfg, jax.random.key(0))
    prompts = _prompts(seed=3)
    ref = generate(f32, prompts, max_new_tokens=MAX_NEW, stop_token_ids=[])
    out, stats = speculative_generate(target, (cfg, params), prompts, max_new_tokens=MAX_NEW, stop_token_ids=[],
                                      carryover=carryover)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref] and stats["rounds"] > 0
