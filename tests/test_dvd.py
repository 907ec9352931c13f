"""DVD training against independent references: sequential target forwards, slow per-anchor loops,
the decode-time drafter, and a baseline step at the shifted anchors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax.config import DrafterConfig, TargetConfig, TrainConfig
from carryover_jax.models.drafter import (
    append_context, draft_block_logits, frozen_from_target, init_drafter_params, new_context_cache,
    sequential_proposals,
)
from carryover_jax.models.target import TargetLM, init_params
from carryover_jax.train import anchors as A
from carryover_jax.train import dvd
from carryover_jax.train.losses import block_loss
from carryover_jax.train.step import step_config

TCFG = TargetConfig(family="qwen3", vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=16, qk_norm=True)
LAYERS = (-1, 0, 2)


def _dc(kind="dflash", layout="zlab", proposals=4):
    return DrafterConfig.for_target(TCFG, kind=kind, layout=layout, num_proposals=proposals, num_layers=1,
                                    mask_token_id=0, target_layer_ids=LAYERS, markov_rank=8 if kind == "markov" else None)


def _sc(dc, mode="dvd", **kw):
    return step_config(TrainConfig(num_anchors=5, mode=mode, **kw), TCFG, dc)


def _batch(seed=0, b=2, s=24):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 32, (b, s)).astype(np.int32)
    lm = np.zeros((b, s), np.int32)
    lm[0, 3:] = 1
    lm[1, 5:18] = 1  # the loss mask ends inside the sequence: blocks running past it are cut
    return jnp.asarray(ids), jnp.asarray(lm)


def _feats(tp, ids):
    taps, last = TargetLM(TCFG).apply({"params": tp}, ids, LAYERS, method=TargetLM.features)
    return jnp.concatenate(taps, -1), last


def _planted_proposals(ids, blk, rng):
    """Proposals equal to the recorded continuation for a random prefix of each block, then wrong."""
    b, n, p = blk.labels.shape
    labels = np.asarray(blk.labels)
    acc = rng.integers(0, p + 1, (b, n))
    wrong = (labels + rng.integers(1, 31, labels.shape)) % 32
    return jnp.asarray(np.where(np.arange(p) < acc[..., None], labels, wrong).astype(np.int32))


def test_parallel_verify_and_accept_counts_match_sequential_references():
    dc = _dc()
    sc = _sc(dc)
    tp = init_params(TCFG, jax.random.key(0))
    ids, lm = _batch()
    anchors, keep, nvalid = A.sample_anchors(jax.random.key(3), lm, 5)
    blk = A.build_blocks(dc, ids, lm, anchors, keep, nvalid)
    props = _planted_proposals(ids, blk, np.random.default_rng(0))
    feats = np.asarray(dvd.verify_blocks(sc, tp, ids, anchors, keep, props))
    acc = np.asarray(dvd.accept_counts(props, blk))
    ids_np, lm_np, p = np.asarray(ids), np.asarray(lm), dc.num_proposals
    seen = set()
    for i in range(ids.shape[0]):
        for n in range(5):
            if not keep[i, n]:
                continue
            s_n = int(anchors[i, n])
            seq = np.concatenate([ids_np[i, :s_n + 1], np.asarray(props[i, n])])[None]
            ref = np.asarray(_feats(tp, jnp.asarray(seq))[0])[0, s_n:]
            np.testing.assert_allclose(feats[i, n], ref, atol=1e-4)
            a = 0  # slow acceptance: equal to the recording, inside the sequence and the loss mask
            while a < p and s_n + 1 + a < ids.shape[1] and lm_np[i, s_n + 1 + a] and \
                    int(props[i, n, a]) == ids_np[i, s_n + 1 + a]:
                a += 1
            assert acc[i, n] == a
            seen.add(a)
    assert len(seen) >= 3  # the planted prefixes exercise several accept counts


def test_carried_rows_are_the_rejected_verify_states():
    dc = _dc()
    sc = _sc(dc)
    tp = init_params(TCFG, jax.random.key(0))
    ids, lm = _batch(1)
    anchors, keep, nvalid = A.sample_anchors(jax.random.key(4), lm, 5)
    blk = A.build_blocks(dc, ids, lm, anchors, keep, nvalid)
    props = np.array(_planted_proposals(ids, blk, np.random.default_rng(1)))
    props[0, 0] = np.asarray(blk.labels)[0, 0]  # block (0, 0) fully accepted (if its labels are all valid)
    props = jnp.asarray(props)
    acc = dvd.accept_counts(props, blk)
    a2, k2 = dvd.shifted_anchors(lm, anchors, keep, acc)
    rows, pos, valid = dvd.carried_rows(sc, tp, ids, anchors, keep, props, acc, a2, k2)
    ver = np.asarray(dvd.verify_blocks(sc, tp, ids, anchors, keep, props))
    rows, pos, valid, acc, p = np.asarray(rows), np.asarray(pos), np.asarray(valid), np.asarray(acc), dc.num_proposals
    for i in range(2):
        for n in range(5):
            r = p - acc[i, n]
            for j in range(p):
                want = bool(k2[i, n]) and j < r
                assert valid[i, n * p + j] == want
                if want:
                    np.testing.assert_array_equal(rows[i, n * p + j], ver[i, n, acc[i, n] + 1 + j])
                    assert pos[i, n * p + j] == int(anchors[i, n]) + acc[i, n] + 1 + j == int(a2[i, n]) + j
            if acc[i, n] == p:
                assert not valid[i, n * p:(n + 1) * p].any()
    assert (acc == p).any() and (acc < p).any()


@pytest.mark.parametrize("kind,layout", [("dflash", "zlab"), ("markov", "deepspec")])
def test_draft1_is_the_decode_time_drafter_and_control_is_a_baseline_step_at_shifted_anchors(kind, layout):
    dc = _dc(kind, layout)
    sc = _sc(dc, mode="control")
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    ids, lm = _batch(2)
    rng = jax.random.key(5)
    feats, last = _feats(tp, ids)
    frozen = frozen_from_target(tp, TCFG)
    anchors, keep, nvalid = A.sample_anchors(rng, lm, 5)
    blk = A.build_blocks(dc, ids, lm, anchors, keep, nvalid)
    got = np.asarray(dvd.draft_proposals(sc, params, frozen, feats, blk))
    b, s = ids.shape
    p = dc.num_proposals
    ids_np, lm_np = np.asarray(ids), np.asarray(lm)
    cand = np.asarray(A.anchor_candidates(lm))
    ref_anchors = np.zeros((b, 5), np.int32)
    for i in range(b):
        for n in range(5):
            if not keep[i, n]:
                continue
            s_n = int(anchors[i, n])
            cache = new_context_cache(dc, 1, s + dc.block_size)
            cache = append_context(dc, params, cache, feats[i:i + 1], jnp.asarray([s_n]))
            anchor = jnp.asarray([ids_np[i, s_n]])
            z = draft_block_logits(dc, params, frozen, cache, anchor)
            want = np.asarray(sequential_proposals(dc, params, z, anchor, None, None, sampling=False)[0])[0]
            np.testing.assert_array_equal(got[i, n], want)
            a = 0
            while a < p and s_n + 1 + a < s and lm_np[i, s_n + 1 + a] and want[a] == ids_np[i, s_n + 1 + a]:
                a += 1
            if s_n + a + 1 < s and cand[i, s_n + a + 1]:
                ref_anchors[i, n] = s_n + a + 1
    ref_keep = jnp.asarray(ref_anchors > 0)
    ref_blk = A.build_blocks(dc, ids, lm, jnp.asarray(ref_anchors), ref_keep, nvalid)
    batch = {"input_ids": ids, "loss_mask": lm}
    (l_dvd, m_dvd), g_dvd = jax.value_and_grad(dvd.dvd_loss, has_aux=True)(params, sc, tp, batch, rng)
    (l_ref, _), g_ref = jax.value_and_grad(block_loss, has_aux=True)(params, sc, tp, frozen, ids, feats, last, ref_blk)
    np.testing.assert_allclose(float(l_dvd), float(l_ref), rtol=1e-6)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-7), g_dvd, g_ref)
    assert float(m_dvd["draft2/kept_ratio"]) > 0.5


def test_gradients_reach_carryover_through_carried_kv_and_nothing_else():
    dc = _dc()
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    ids, lm = _batch(3)
    batch = {"input_ids": ids, "loss_mask": lm}
    rng = jax.random.key(6)
    grads = {}
    for mode in ("dvd", "control"):
        sc = _sc(dc, mode=mode)
        grads[mode] = jax.grad(lambda pr, t: dvd.dvd_loss(pr, sc, t, batch, rng)[0], argnums=(0, 1))(params, tp)
    gd, gt = grads["dvd"]
    assert float(jnp.abs(gd["e_rej"]).max()) > 1e-6
    assert float(jnp.abs(gd["fc"]["kernel"]).max()) > 1e-6
    assert float(jnp.abs(gd["layers"]["0"]["self_attn"]["k_proj"]["kernel"]).max()) > 1e-6
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree_util.tree_leaves(gt))  # frozen target
    assert float(jnp.abs(grads["control"][0]["e_rej"]).max()) == 0.0  # control never sees carried rows
    # the DVD gradient is the gradient of draft 2 alone: nothing flows through draft 1 or the verification
    sc = _sc(dc)
    feats, last = _feats(tp, ids)
    frozen = frozen_from_target(tp, TCFG)
    anchors, keep, nvalid = A.sample_anchors(rng, lm, 5)
    blk = A.build_blocks(dc, ids, lm, anchors, keep, nvalid)
    props = dvd.draft_proposals(sc, params, frozen, feats, blk)
    acc = dvd.accept_counts(props, blk)
    a2, k2 = dvd.shifted_anchors(lm, anchors, keep, acc)
    carried = jax.tree_util.tree_map(np.asarray, dvd.carried_rows(sc, tp, ids, anchors, keep, props, acc, a2, k2))
    blk2 = A.build_blocks(dc, ids, lm, a2, k2, nvalid)
    g2 = jax.grad(lambda pr: block_loss(pr, sc, tp, frozen, ids, feats, last, blk2, carried)[0])(params)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-7), gd, g2)


def test_token_interfaces_embed_through_the_frozen_embedding():
    """The ablation's token rows: draft tokens at the rejected positions, or the target's greedy tokens."""
    dc = _dc()
    tp = init_params(TCFG, jax.random.key(0))
    ids, lm = _batch(4)
    anchors, keep, nvalid = A.sample_anchors(jax.random.key(7), lm, 5)
    blk = A.build_blocks(dc, ids, lm, anchors, keep, nvalid)
    props = _planted_proposals(ids, blk, np.random.default_rng(2))
    acc = dvd.accept_counts(props, blk)
    a2, k2 = dvd.shifted_anchors(lm, anchors, keep, acc)
    p = dc.num_proposals
    out = {}
    for carry in ("draft_tokens", "target_tokens"):
        sc = _sc(dc, dvd_carry=carry)
        out[carry] = np.asarray(dvd.carried_rows(sc, tp, ids, anchors, keep, props, acc, a2, k2)[0])
    tm = TargetLM(TCFG)
    for i in range(2):
        for n in range(5):
            a, s_n = int(acc[i, n]), int(anchors[i, n])
            if not k2[i, n] or a == p:
                continue
            assert out["draft_tokens"][i, n * p] == int(props[i, n, a])  # the first rejected draft token
            seq = jnp.concatenate([ids[i, :s_n + 1], props[i, n]])[None]
            logits = tm.apply({"params": tp}, seq)[0][0]
            assert out["target_tokens"][i, n * p] == int(jnp.argmax(logits[s_n + a + 1]))
