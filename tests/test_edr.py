"""The EDR objective: the expected-rounds scan equals the offline evaluator's occupancy recursion (and the integer
round count at 0/1 acceptances), and the training step's gradient equals finite differences of the exact expected
rounds of the drafter's acceptances."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax.config import DrafterConfig, LossConfig, TargetConfig, TrainConfig
from carryover_jax.errors import ConfigError
from carryover_jax.eval.offline import expected_rounds as offline_rounds
from carryover_jax.eval.offline import greedy_rounds
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params
from carryover_jax.models.target import TargetLM, init_params
from carryover_jax.train import anchors as A
from carryover_jax.train import edr
from carryover_jax.train.losses import all_anchor_acceptance, baseline_loss, block_terms
from carryover_jax.train.step import step_config
from tests.jitted import jit_apply

TCFG = TargetConfig(family="qwen3", vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                    num_kv_heads=1, head_dim=16, qk_norm=True)
LAYERS = (-1, 0)


def _acc(rng, g, p, binary):
    """Per-(round start c = 1..G-1, slot) acceptances; 0 for slots past the response's last token."""
    a = (rng.random((g - 1, p)) < 0.6).astype(np.float64) if binary else rng.random((g - 1, p))
    c = np.arange(1, g)[:, None] + np.arange(1, p + 1)[None, :]
    return np.where(c <= g, a, 0.0)


@pytest.mark.parametrize("binary", [False, True])
def test_expected_rounds_scan_equals_the_occupancy_recursion(binary):
    rng = np.random.default_rng(0)
    for g, p, pad in ((9, 3, 4), (20, 4, 0), (2, 3, 3)):
        acc = _acc(rng, g, p, binary)
        # the scan's layout: anchor candidates at positions 0..G-2, then `pad` non-candidates (a prompt or padding)
        full = np.zeros((g - 1 + pad, p))
        full[: g - 1] = acc
        starts = np.arange(g - 1 + pad) < g - 1
        got = float(edr.expected_rounds(jnp.asarray(full, jnp.float32), jnp.asarray(starts)))
        np.testing.assert_allclose(got, offline_rounds(acc, g), rtol=1e-5)
        if binary:
            assert got == len(greedy_rounds(acc, g))
    # two response spans in one sequence: rounds add up, and nothing flows across the gap
    a1, a2 = _acc(rng, 7, 3, False), _acc(rng, 6, 3, False)
    full = np.concatenate([a1, np.zeros((3, 3)), a2])
    starts = np.r_[np.ones(6), np.zeros(3), np.ones(5)].astype(bool)
    got = float(edr.expected_rounds(jnp.asarray(full, jnp.float32), jnp.asarray(starts)))
    np.testing.assert_allclose(got, offline_rounds(a1, 7) + offline_rounds(a2, 6), rtol=1e-5)


def test_td_coefficients_equal_finite_differences_of_expected_rounds():
    """dR/dA from differentiating the scan (the coefficients the surrogate weights A by) vs central differences
    of the exact expected rounds (a polynomial in A: no kinks, so finite differences converge)."""
    rng = np.random.default_rng(1)
    acc = jnp.asarray(rng.random((2, 12, 3)), jnp.float32)
    starts = jnp.asarray(np.r_[np.zeros(2), np.ones(9), 0][None].repeat(2, 0).astype(bool))
    acc = acc * starts[..., None]
    _, coef = edr.coefficients(acc, starts)
    eps = 1e-2
    for b, i, k in [(0, 2, 0), (0, 5, 2), (1, 9, 1), (1, 10, 0), (0, 7, 1)]:
        e = jnp.zeros_like(acc).at[b, i, k].set(eps)
        fd = (float(edr.batch_rounds(acc + e, starts)) - float(edr.batch_rounds(acc - e, starts))) / (2 * eps)
        np.testing.assert_allclose(float(coef[b, i, k]), fd, rtol=1e-3, atol=1e-4)
    assert float(coef[0, 2, 0]) < 0  # accepting more never adds rounds


def _features(tp, ids):
    """(features, last hidden, frozen target pieces) of the tiny target on `ids`."""
    taps, last = jit_apply(TargetLM(TCFG))({"params": tp}, ids, tap_layers=LAYERS, method=TargetLM.features)
    return jnp.concatenate(taps, -1), last, frozen_from_target(tp, TCFG)


def _alpha_at_every_position(params, sc, tp, frozen, ids, lm, feats, last):
    """α [B, S, P] from one `block_terms` pass anchored at every position, masked to the anchor candidates."""
    b, s = ids.shape
    cand = A.anchor_candidates(lm)
    anchors = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    blk = A.build_blocks(sc.drafter, ids, lm, anchors, cand, jnp.sum(cand, axis=1))
    return block_terms(params, sc, tp, frozen, ids, feats, last, blk)[2] * blk.eval_mask * cand[..., None]


@pytest.mark.parametrize("kind,vocab,chunk", [("dflash", 0, 0), ("dflash", 20, 7), ("markov", 0, 5)])
def test_every_anchors_acceptance_is_computed_on_the_candidates_alone(kind, vocab, chunk):
    """`all_anchor_acceptance` (candidates compacted to the front, taken `num_anchors` at a time, empty groups
    skipped, the target's distribution once per position) equals `block_terms` anchored at every position,
    masked to the candidates: rows with their candidates in different groups, one row without any, trailing
    groups with no candidate at all; the Markov bias, a draft vocabulary and row chunks included."""
    dc = DrafterConfig.for_target(TCFG, kind=kind, layout="zlab", num_proposals=3, num_layers=1, mask_token_id=0,
                                  target_layer_ids=LAYERS, markov_rank=4 if kind == "markov" else None,
                                  draft_vocab=tuple(range(3, 3 + vocab)))
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    rng = np.random.default_rng(4)
    b, s = 3, 40
    ids = jnp.asarray(rng.integers(1, 32, (b, s)), jnp.int32)
    lm = np.zeros((b, s), np.int32)
    lm[0, 5:19] = 1
    lm[0, 25:31] = 1  # two response spans
    lm[2, 30:] = 1  # candidates only at the end of the row
    lm = jnp.asarray(lm)
    sc = step_config(TrainConfig(loss=LossConfig(objective="edr", chunk_rows=chunk), num_anchors=8), TCFG, dc)
    feats, last, frozen = _features(tp, ids)
    assert int(jnp.max(jnp.sum(A.anchor_candidates(lm), axis=1))) <= 3 * 8  # groups 4 and 5 hold no candidate

    got = jax.jit(lambda: all_anchor_acceptance(params, sc, tp, frozen, ids, lm, feats, last))()
    want = jax.jit(lambda: _alpha_at_every_position(params, sc, tp, frozen, ids, lm, feats, last))()
    assert float(jnp.sum(want > 0)) > 20  # real acceptances, not zeros on both sides
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["markov"])  # DFlash is the Markov drafter without the sequential bias
def test_edr_step_gradient_is_the_gradient_of_expected_rounds(kind):
    """The training step's EDR gradient (surrogate on the sampled blocks, every candidate sampled here) equals
    autodiff of R(A(θ)) through every anchor's acceptance, and central differences of R(θ) agree."""
    dc = DrafterConfig.for_target(TCFG, kind=kind, layout="zlab", num_proposals=3, num_layers=1, mask_token_id=0,
                                  target_layer_ids=LAYERS, markov_rank=4 if kind == "markov" else None)
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    rng = np.random.default_rng(2)
    b, s = 2, 16
    ids = jnp.asarray(rng.integers(1, 32, (b, s)), jnp.int32)
    lm = np.zeros((b, s), np.int32)
    lm[0, 4:] = 1
    lm[1, 3:12] = 1
    lm = jnp.asarray(lm)
    cfg = TrainConfig(loss=LossConfig(objective="edr", ce_weight=0.0, l1_weight=0.0), num_anchors=16)
    sc = step_config(cfg, TCFG, dc)
    batch = {"input_ids": ids, "loss_mask": lm}
    feats, last, frozen = _features(tp, ids)
    cand = A.anchor_candidates(lm)
    tokens = float(jnp.sum(cand))

    def rounds(p):  # R(A(θ)) with the acceptance of every anchor differentiable (no sampling)
        return edr.batch_rounds(_alpha_at_every_position(p, sc, tp, frozen, ids, lm, feats, last), cand)

    (_, metrics), step_grad = jax.jit(jax.value_and_grad(
        lambda p: baseline_loss(p, sc, tp, batch, jax.random.key(3)), has_aux=True))(params)
    r = jax.jit(rounds)
    exact = jax.jit(jax.grad(rounds))(params)
    for g, e in zip(jax.tree_util.tree_leaves(step_grad), jax.tree_util.tree_leaves(exact)):
        np.testing.assert_allclose(np.asarray(g) * tokens, np.asarray(e), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(float(metrics["edr/rounds_per_token"]) * tokens, float(r(params)), rtol=1e-5)
    # and against R itself: central differences along a random direction (R is piecewise smooth in θ, since
    # alpha = sum min(p, q): a coarse tolerance, small steps)
    leaves, tree = jax.tree_util.tree_flatten(params)
    direction = jax.tree_util.tree_unflatten(
        tree, [jnp.asarray(np.random.default_rng(i).standard_normal(x.shape), x.dtype) for i, x in enumerate(leaves)])
    eps = 1e-3
    shift = lambda sign: jax.tree_util.tree_map(lambda x, d: x + sign * eps * d, params, direction)  # noqa: E731
    fd = (float(r(shift(1))) - float(r(shift(-1)))) / (2 * eps)
    analytic = sum(float(jnp.vdot(g, d)) for g, d in zip(jax.tree_util.tree_leaves(exact),
                                                         jax.tree_util.tree_leaves(direction)))
    assert abs(fd) > 1e-2  # the direction moves the rounds: the comparison is not 0 == 0
    np.testing.assert_allclose(analytic, fd, rtol=0.05)


def test_edr_is_refused_where_its_rounds_do_not_hold():
    with pytest.raises(ConfigError, match="baseline-training objective"):
        TrainConfig(loss=LossConfig(objective="edr", mode="dvd"))
    with pytest.raises(ConfigError, match="objective must be"):
        TrainConfig(loss=LossConfig(objective="rounds"))
