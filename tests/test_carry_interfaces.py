"""The paper's interface ablation end to end: the engine carries rejected draft tokens or the target's greedy
tokens (as `dvd_carry` trains them) instead of verify states — the exact rows for every carried count 0..P,
speculative == AR at T = 0, and lossless at T = 1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import generate, load_target
from carryover_jax.config import DrafterConfig
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.generate import pad_batch, speculative_generate
from carryover_jax.errors import RequestError
from carryover_jax.eval.run import parse_drafter_spec
from carryover_jax.models import drafter as D
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params
from tests.jitted import jit_apply

P = 4


def _drafter(target, kind="dflash", layout="zlab", seed=0):
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout=layout, num_proposals=P, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0, 1), markov_rank=8 if kind == "markov" else None)
    params = init_drafter_params(cfg, jax.random.key(seed))
    # a non-zero e_rej, so carried rows differ from plain embeddings and from each interface's
    params = {**params, "e_rej": jax.random.normal(jax.random.key(9), params["e_rej"].shape) * 0.5}
    return cfg, params


@pytest.mark.parametrize("carry", ["draft_tokens", pytest.param("target_tokens", marks=pytest.mark.heavy)])
def test_verify_carries_the_interface_rows_for_every_count(tiny_qwen3, carry):
    target = load_target(tiny_qwen3.path, tokenizer=False)
    cfg, params = _drafter(target)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 97, n).tolist() for n in (5, 8, 3, 6, 4)]
    want_a = [0, 1, 2, 3, P]  # carried counts P..0
    ar = generate(target, prompts, max_new_tokens=P + 2, stop_token_ids=[])
    sc = sp.SpecConfig(target=target.cfg, drafter=cfg, attend_carried=True, carry=carry)
    s = sp.prefill(sc, target.params, params, jnp.asarray(pad_batch(prompts, 16)),
                   jnp.asarray([len(p) for p in prompts], jnp.int32), jnp.full((5,), 30, jnp.int32),
                   jnp.zeros((5,)), jnp.full((8,), -1, jnp.int32), jax.random.key(0), max_len=96, out_size=64,
                   max_rounds=64)
    props = np.asarray([[t if i < a else (t + 1) % 97 for i, t in enumerate(r.token_ids[1:P + 1])]
                        for r, a in zip(ar, want_a)], np.int32)
    anchor0 = np.asarray(s.anchor)
    s2 = sp.verify_step(sc, target.params, params, s, jnp.asarray(props), None)
    np.testing.assert_array_equal(np.asarray(s2.rejected_count), P - np.asarray(want_a))
    m, frozen = jit_apply(D.Drafter(cfg)), frozen_from_target(target.params, target.cfg)
    for i, (p, a) in enumerate(zip(prompts, want_a)):
        if carry == "draft_tokens":
            toks = props[i, a:]  # the rejected d_{a+1}..d_P
        else:  # the target's greedy token after each rejected verify position (a cache-free reference forward)
            seq = p + [int(anchor0[i])] + props[i].tolist()
            logits = np.asarray(jit_apply(target.model)({"params": target.params}, jnp.asarray([seq]))[0][0])
            toks = logits[len(p) + a + 1: len(p) + P + 1].argmax(-1)
        if len(toks) == 0:
            continue
        want = m({"params": params}, jnp.asarray(toks[None], jnp.int32), frozen, method=D.Drafter.fuse_carried)
        np.testing.assert_allclose(np.asarray(s2.carried[i, : len(toks)]), np.asarray(want[0]), atol=1e-5)


@pytest.mark.parametrize("carry", [pytest.param("draft_tokens", marks=pytest.mark.heavy), "target_tokens"])
def test_token_interfaces_decode_losslessly(tiny_llama, tmp_path_factory, carry):
    target = load_target(tiny_llama.path, tokenizer=False)
    drafter = _drafter(target, "markov", "deepspec")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, n).tolist() for n in (4, 13, 7)]
    ref = generate(target, prompts, max_new_tokens=[17, 5, 23], stop_token_ids=[])
    out, _ = speculative_generate(target, drafter, prompts, max_new_tokens=[17, 5, 23], stop_token_ids=[],
                                  carryover=True, carry=carry)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]

    from tests.lossless import sampled_pvalue, tiny_sampling_target

    small = tiny_sampling_target(tmp_path_factory.mktemp(f"v8-{carry}"))
    cfg = DrafterConfig.for_target(small.cfg, kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0,))
    params = init_drafter_params(cfg, jax.random.key(1))
    params = {**params, "e_rej": jax.random.normal(jax.random.key(2), params["e_rej"].shape)}
    pvalue, stats = sampled_pvalue(small, (cfg, params), carryover=True, carry=carry)
    assert pvalue > 1e-3 and stats["tau"] > 1.05


def test_interface_choice_is_checked():
    assert parse_drafter_spec("a=/runs/x:carryover=draft_tokens").carry == "draft_tokens"
    e = parse_drafter_spec("a=/runs/carryover/drafter:carryover")
    assert (e.path, e.carryover, e.carry) == ("/runs/carryover/drafter", True, "hidden")
    assert not parse_drafter_spec("a=/runs/carryover/drafter").carryover
    with pytest.raises(Exception, match="unknown carried-row interface"):
        parse_drafter_spec("a=/x:carryover=tokens")
    cfg = DrafterConfig.for_target(_tiny_cfg(), kind="dflash", layout="zlab", num_proposals=2, num_layers=1, mask_token_id=0,
                                   target_layer_ids=(0,))
    with pytest.raises(RequestError, match="carry must be one of"):
        sp.SpecConfig(target=_tiny_cfg(), drafter=cfg, carry="rows")


def _tiny_cfg():
    from carryover_jax.config import TargetConfig

    return TargetConfig(family="llama", vocab_size=16, hidden_size=16, intermediate_size=32, num_layers=2,
                        num_heads=2, num_kv_heads=1, head_dim=8)
