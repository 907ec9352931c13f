"""DVD training against independent references: sequential target forwards, slow per-anchor loops,
the decode-time drafter, and a baseline step at the shifted anchors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax.config import DrafterConfig, LossConfig, TargetConfig, TrainConfig
from carryover_jax.decode.drafting import (append_rows, draft_block_logits, fuse_rows, new_context_cache,
                                           sequential_proposals)
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params
from carryover_jax.models.target import TargetLM, init_params
from carryover_jax.train import anchors as A
from carryover_jax.train import dvd
from carryover_jax.train.losses import block_loss, target_greedy_labels
from carryover_jax.train.step import step_config

TCFG = TargetConfig(family="qwen3", vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=16, qk_norm=True)
LAYERS = (-1, 0, 2)


def _dc(kind="dflash", layout="zlab", proposals=4, draft_vocab=()):
    return DrafterConfig.for_target(TCFG, kind=kind, layout=layout, num_proposals=proposals, num_layers=1,
                                    mask_token_id=0, target_layer_ids=LAYERS, draft_vocab=draft_vocab,
                                    markov_rank=8 if kind == "markov" else None)


def _sc(dc, mode="dvd", **loss):
    return step_config(TrainConfig(loss=LossConfig(mode=mode, **loss), num_anchors=5), TCFG, dc)


def _batch(seed=0, b=2, s=24):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 32, (b, s)).astype(np.int32)
    lm = np.zeros((b, s), np.int32)
    lm[0, 3:] = 1
    lm[1, 5:18] = 1  # the loss mask ends inside the sequence: blocks running past it are cut
    return jnp.asarray(ids), jnp.asarray(lm)


# Compiled once per shape where a test calls them over many blocks or differentiates them (eager dispatch was
# most of those tests' time); tests that call them once stay eager (compiling costs more there)
sample_anchors = jax.jit(A.sample_anchors, static_argnums=2)
build_blocks = jax.jit(A.build_blocks, static_argnums=0)
verify_blocks = jax.jit(dvd.verify_blocks, static_argnums=0)
draft_proposals = jax.jit(dvd.draft_proposals, static_argnums=0)
carried_rows = jax.jit(dvd.carried_rows, static_argnums=0)
dvd_loss_and_grad = jax.jit(jax.value_and_grad(dvd.dvd_loss, has_aux=True), static_argnums=1)
block_loss_and_grad = jax.jit(jax.value_and_grad(block_loss, has_aux=True), static_argnums=1)


@jax.jit
def _logits(tp, ids):
    return TargetLM(TCFG).apply({"params": tp}, ids)[0]


@jax.jit
def _feats(tp, ids):
    taps, last = TargetLM(TCFG).apply({"params": tp}, ids, LAYERS, method=TargetLM.features)
    return jnp.concatenate(taps, -1), last


@functools.partial(jax.jit, static_argnums=(0, 1))
def _decode_time_proposals(dc, seq_len, params, frozen, feats, s_n, anchor):
    """The decode engine's proposals for one block: the row's context rows up to s_n cached, then drafted."""
    cache = new_context_cache(dc, 1, seq_len + dc.block_size)
    cache = append_rows(dc, params, cache, fuse_rows(dc, params, feats), s_n)
    z = draft_block_logits(dc, params, frozen, cache, anchor)
    return sequential_proposals(dc, params, z, anchor, None, None, sampling=False)[0]


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
    anchors, keep, nvalid = sample_anchors(jax.random.key(3), lm, 5)
    blk = build_blocks(dc, ids, lm, anchors, keep, nvalid)
    props = _planted_proposals(ids, blk, np.random.default_rng(0))
    feats = np.asarray(verify_blocks(sc, tp, ids, anchors, keep, props))
    acc = np.asarray(dvd.accept_counts(props, blk))
    ids_np, lm_np, p = np.asarray(ids), np.asarray(lm), dc.num_proposals
    seen = set()
    for i in range(ids.shape[0]):
        for n in range(5):
            if not keep[i, n]:
                continue
            s_n = int(anchors[i, n])
            seq = np.concatenate([ids_np[i, :s_n + 1], np.asarray(props[i, n])])
            # one padded length (one compile): the causal prefix does not see the padding
            padded = np.pad(seq, (0, ids.shape[1] + p - len(seq)))[None]
            ref = np.asarray(_feats(tp, jnp.asarray(padded))[0])[0, s_n + 1:len(seq)]  # the proposals' states
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
    anchors, keep, nvalid = sample_anchors(jax.random.key(4), lm, 5)
    blk = build_blocks(dc, ids, lm, anchors, keep, nvalid)
    props = np.array(_planted_proposals(ids, blk, np.random.default_rng(1)))
    props[0, 0] = np.asarray(blk.labels)[0, 0]  # block (0, 0) fully accepted (if its labels are all valid)
    props = jnp.asarray(props)
    acc = dvd.accept_counts(props, blk)
    a2, k2 = dvd.shifted_anchors(lm, anchors, keep, acc)
    rows, pos, valid = carried_rows(sc, tp, ids, anchors, keep, props, acc, a2, k2)
    ver = np.asarray(verify_blocks(sc, tp, ids, anchors, keep, props))
    rows, pos, valid, acc, p = np.asarray(rows), np.asarray(pos), np.asarray(valid), np.asarray(acc), dc.num_proposals
    for i in range(2):
        for n in range(5):
            r = p - acc[i, n]
            for j in range(p):
                want = bool(k2[i, n]) and j < r
                assert valid[i, n * p + j] == want
                if want:
                    np.testing.assert_array_equal(rows[i, n * p + j], ver[i, n, acc[i, n] + j])
                    assert pos[i, n * p + j] == int(anchors[i, n]) + acc[i, n] + 1 + j == int(a2[i, n]) + j
            if acc[i, n] == p:
                assert not valid[i, n * p:(n + 1) * p].any()
    assert (acc == p).any() and (acc < p).any()


@pytest.mark.parametrize("kind,layout,vocab", [("dflash", "zlab", ()),
                                               pytest.param("markov", "deepspec", (), marks=pytest.mark.heavy),
                                               pytest.param("markov", "zlab", tuple(range(1, 32, 2)),
                                                            marks=pytest.mark.heavy)])
def test_draft1_is_the_decode_time_drafter_and_control_is_a_baseline_step_at_shifted_anchors(kind, layout, vocab):
    dc = _dc(kind, layout, draft_vocab=vocab)
    sc = _sc(dc, mode="control")
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    ids, lm = _batch(2)
    rng = jax.random.key(5)
    feats, last = _feats(tp, ids)
    frozen = frozen_from_target(tp, TCFG)
    anchors, keep, nvalid = sample_anchors(rng, lm, 5)
    blk = build_blocks(dc, ids, lm, anchors, keep, nvalid)
    got = np.asarray(draft_proposals(sc, params, frozen, feats, blk))
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
            want = np.asarray(_decode_time_proposals(dc, s, params, frozen, feats[i:i + 1], jnp.asarray([s_n]),
                                                     jnp.asarray([ids_np[i, s_n]])))[0]
            np.testing.assert_array_equal(got[i, n], want)
            a = 0
            while a < p and s_n + 1 + a < s and lm_np[i, s_n + 1 + a] and want[a] == ids_np[i, s_n + 1 + a]:
                a += 1
            if s_n + a + 1 < s and cand[i, s_n + a + 1]:
                ref_anchors[i, n] = s_n + a + 1
    ref_keep = jnp.asarray(ref_anchors > 0)
    ref_blk = build_blocks(dc, ids, lm, jnp.asarray(ref_anchors), ref_keep, nvalid)
    batch = {"input_ids": ids, "loss_mask": lm}
    (l_dvd, m_dvd), g_dvd = dvd_loss_and_grad(params, sc, tp, batch, rng)
    (l_ref, _), g_ref = block_loss_and_grad(params, sc, tp, frozen, ids, feats, last, ref_blk)
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
        grads[mode] = jax.jit(jax.grad(lambda pr, t: dvd.dvd_loss(pr, sc, t, batch, rng)[0], argnums=(0, 1)))(params, tp)
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
    anchors, keep, nvalid = sample_anchors(rng, lm, 5)
    blk = build_blocks(dc, ids, lm, anchors, keep, nvalid)
    props = draft_proposals(sc, params, frozen, feats, blk)
    acc = dvd.accept_counts(props, blk)
    a2, k2 = dvd.shifted_anchors(lm, anchors, keep, acc)
    carried = jax.tree_util.tree_map(np.asarray, carried_rows(sc, tp, ids, anchors, keep, props, acc, a2, k2))
    blk2 = build_blocks(dc, ids, lm, a2, k2, nvalid)
    g2 = jax.jit(jax.grad(lambda pr: block_loss(pr, sc, tp, frozen, ids, feats, last, blk2, carried)[0]))(params)
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
        sc = _sc(dc, carry=carry)
        out[carry] = np.asarray(carried_rows(sc, tp, ids, anchors, keep, props, acc, a2, k2)[0])
    checked = 0
    for i in range(2):
        for n in range(5):
            a, s_n = int(acc[i, n]), int(anchors[i, n])
            if not k2[i, n] or a == p:
                continue
            checked += 1
            assert out["draft_tokens"][i, n * p] == int(props[i, n, a])  # the first rejected draft token
            seq = np.concatenate([ids[i, :s_n + 1], props[i, n]])
            # one padded length (one compile): the causal prefix does not see the padding
            logits = _logits(tp, jnp.asarray(np.pad(seq, (0, ids.shape[1] + p - len(seq)))[None]))[0]
            assert out["target_tokens"][i, n * p] == int(jnp.argmax(logits[s_n + a + 1]))
    assert checked >= 3  # the comparison really ran


# ---- a toy where the carried states reveal the answer ------------------------------------------------------
V_TOY = 32


def _pair_target(seed=0):
    """A hand-built target (one working layer) whose greedy next token is x_{p+1} = h(x_{p-1}, x_{p-2}) for a
    random table h, whatever x_p is. Residual stream: [one-hot x_p | x_{p-1} | x_{p-2} | output]; head 1
    attends to offset 1 and head 2 to offset 2 (RoPE-only scores from the q/k biases), an MLP neuron per
    pair writes e_h into the output block, which the LM head reads. So the state at a rejected position s'
    (computed on the wrong draft token) already holds the right token for s' + 1, while a small drafter
    would have to learn the V^2-entry table to draft it without carryover (V = 32: sequences of 32 tokens
    rarely close a cycle that could be copied from the context instead)."""
    v = V_TOY
    cfg = TargetConfig(family="llama", vocab_size=v, hidden_size=4 * v, intermediate_size=v * v, num_layers=2,
                       num_heads=2, num_kv_heads=2, head_dim=v, rope_theta=10.0, attention_bias=True, mlp_bias=True,
                       rms_norm_eps=1e-6)
    table = np.random.default_rng(seed).integers(0, v, (v, v))
    p = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, np.float32), init_params(cfg, jax.random.key(0)))
    p["embed_tokens"]["embedding"][:, :v] = np.eye(v)
    at = p["layers"]["0"]["self_attn"]
    half = v // 2
    theta = 10.0 ** (-np.arange(half) * 2 / v)
    scale = np.sqrt(4 * v)  # the input norm scales a one-hot by sqrt(hidden)
    for head, offset in ((0, 1), (1, 2)):
        cols = slice(head * v, (head + 1) * v)
        at["q_proj"]["bias"][cols][:half] = 8.0
        at["k_proj"]["bias"][cols][:half] = 8.0 * np.cos(theta * offset)
        at["k_proj"]["bias"][cols][half:] = 8.0 * np.sin(theta * offset)
        at["v_proj"]["kernel"][:v, cols] = np.eye(v) / scale
        at["o_proj"]["kernel"][cols, v * (head + 1):v * (head + 2)] = np.eye(v)
    mlp = p["layers"]["0"]["mlp"]
    z = np.sqrt(4 * v / 3)  # the post-attention norm of three unit entries
    for a in range(v):
        for b in range(v):
            n = a * v + b
            mlp["gate_proj"]["kernel"][v + a, n] = mlp["gate_proj"]["kernel"][2 * v + b, n] = 2.0
            mlp["gate_proj"]["bias"][n] = -3.0 * z
            mlp["down_proj"]["kernel"][n, 3 * v + table[a, b]] = 10.0
    mlp["up_proj"]["bias"][:] = 1.0
    for k in ("input_layernorm", "post_attention_layernorm"):  # layer 1 (all zeros) passes the stream through
        p["layers"]["0"][k]["weight"][:] = 1.0
    p["norm"]["weight"][:] = 1.0
    p["lm_head"]["kernel"][3 * v:, :] = np.eye(v)
    return cfg, jax.tree_util.tree_map(jnp.asarray, p), table


def _pair_data(table, rng, n, s=32, prompt=3):
    ids = np.zeros((n, s), np.int32)
    ids[:, :prompt] = rng.integers(0, V_TOY, (n, prompt))
    for t in range(prompt, s):
        ids[:, t] = table[ids[:, t - 2], ids[:, t - 3]]
    lm = np.zeros((n, s), np.int32)
    lm[:, prompt:] = 1
    return ids, lm


def test_dvd_teaches_carryover_what_carried_rows_mean():
    from carryover_jax import speculative_generate
    from carryover_jax.decode.generate import generate
    from carryover_jax.loading import Target
    from carryover_jax.train.step import init_state, make_optimizer, train_step

    tcfg, tp, table = _pair_target()
    target = Target(tcfg, tp)
    rng = np.random.default_rng(0)
    prompts = [list(map(int, r)) for r in rng.integers(0, V_TOY, (4, 3))]
    ar = generate(target, prompts, max_new_tokens=20, chat=False)
    for pr, out in zip(prompts, ar):  # the hand-built target follows its rule
        seq = list(pr)
        for _ in range(20):
            seq.append(int(table[seq[-2], seq[-3]]))
        assert list(out.token_ids) == seq[3:]

    dc = DrafterConfig.for_target(tcfg, kind="dflash", layout="zlab", num_proposals=3, num_layers=1, mask_token_id=0,
                                  target_layer_ids=(0,))
    dc = dc.replace(backbone=dc.backbone.replace(intermediate_size=4))  # too small to learn the table itself
    params0 = init_drafter_params(dc, jax.random.key(1))
    data_rng = np.random.default_rng(1)
    batches = [_pair_data(table, data_rng, 8) for _ in range(60)]  # tau 1.70 vs 1.05 (80 steps: 1.88 vs 1.07)
    taus = {}
    for mode in ("dvd", "control"):
        cfg = TrainConfig(loss=LossConfig(mode=mode), num_anchors=8, lr=1e-2, steps=len(batches), warmup_ratio=0.05)
        sc = step_config(cfg, tcfg, dc)
        opt = make_optimizer(cfg, cfg.steps)
        state = init_state(params0, opt, 0)
        step = jax.jit(train_step, static_argnums=(0, 1))
        for ids, lm in batches:
            state, m = step(sc, opt, state, tp, {"input_ids": ids, "loss_mask": lm})
        _, stats = speculative_generate(target, (dc, state.params), prompts, carryover=mode == "dvd",
                                        max_new_tokens=24, chat=False)
        taus[mode] = stats["tau"]
    assert taus["dvd"] > taus["control"] + 0.4, taus


@pytest.mark.heavy  # two minutes on 2 idle cores: four short training runs (baseline resume: test_train_loop)
def test_dvd_and_control_continue_a_baseline_and_resume_exactly(tiny_llama, tmp_path):
    import json

    from carryover_jax.config import DataConfig, DrafterSpec
    from carryover_jax.train.loop import train
    from tests.synthetic import synthetic_store

    store = synthetic_store(tmp_path / "store")

    def cfg(out, mode="baseline", **kw):
        base = dict(loss=LossConfig(mode=mode), target=str(tiny_llama.path),
                    data=DataConfig(store=str(store), max_len=32, min_loss_tokens=2),
                    drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                                        target_layer_ids=(0, 1), mask_token_id=4),
                    out_dir=str(tmp_path / out), batch_size=8, num_anchors=4, steps=6, log_every=1, save_every=2,
                    async_checkpointing=False, lr=3e-3)
        return TrainConfig(**{**base, **kw})

    def metrics(out):
        return {r["step"]: r for r in map(json.loads, (tmp_path / out / "metrics.jsonl").read_text().splitlines())}

    assert train(cfg("base", steps=4), progress=False)["finished"]
    init = str(tmp_path / "base" / "drafter")
    for mode in ("dvd", "control"):
        assert train(cfg(mode, mode, init_from=init), progress=False)["finished"]
    dvd_m, ctl_m = metrics("dvd"), metrics("control")
    # same starting drafter, same batches and anchors: draft 1 is identical at step 1
    assert dvd_m[1]["draft1/rejected_hist"] == ctl_m[1]["draft1/rejected_hist"]
    assert dvd_m[1]["draft1/tau"] == ctl_m[1]["draft1/tau"]
    assert len(dvd_m[6]["draft1/rejected_hist"]) == 4 and "off/ce_loss" in dvd_m[6] and "off/ce_loss" not in ctl_m[6]
    assert (tmp_path / "dvd" / "metrics.png").is_file()
    # killed after step 3 and resumed: every later loss as in the uninterrupted run
    part = train(cfg("dvd2", "dvd", init_from=init), progress=False, stop_at_step=3)
    assert not part["finished"]
    train(cfg("dvd2", "dvd", init_from=init), progress=False)
    again = metrics("dvd2")
    for s in range(1, 7):
        assert again[s]["loss"] == pytest.approx(dvd_m[s]["loss"], rel=1e-5, abs=1e-6), s


@pytest.mark.heavy  # the baseline step's remat / chunk equality runs in the default tier (test_train_step)
def test_dvd_step_with_remat_and_vocabulary_chunks_equals_the_plain_one():
    from carryover_jax.train.step import init_state, make_optimizer, train_step

    dc = _dc("markov", "deepspec")
    tp = init_params(TCFG, jax.random.key(0))
    ids, lm = _batch(0)
    out = []
    for remat, chunk in ((False, 0), (True, 7)):  # 7 divides none of the row counts: padding
        cfg = TrainConfig(loss=LossConfig(mode="dvd", chunk_rows=chunk), num_anchors=5, remat=remat)
        sc = step_config(cfg, TCFG, dc)
        opt = make_optimizer(cfg, 2)
        state = init_state(init_drafter_params(dc, jax.random.key(1)), opt, 0)
        out.append(jax.jit(train_step, static_argnums=(0, 1))(sc, opt, state, tp, {"input_ids": ids, "loss_mask": lm}))
    (s0, m0), (s1, m1) = out
    for k in ("loss", "draft1/tau", "off/ce_loss", "grad_norm"):
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, err_msg=k)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), s0.params, s1.params)


def test_target_labels_judge_draft1_against_the_targets_greedy_tokens(monkeypatch):
    """labels=target (source text): draft 1 is accepted against what the target itself would say at each
    position — its greedy tokens from a full forward — not against the recorded text."""
    dc = _dc()
    sc = _sc(dc, labels="target")
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    ids, lm = _batch(5)
    rng = jax.random.key(8)
    feats, last = _feats(tp, ids)
    anchors, keep, nvalid = sample_anchors(rng, lm, 5)
    blk = build_blocks(dc, ids, lm, anchors, keep, nvalid)
    greedy = np.argmax(np.asarray(_logits(tp, ids)), axis=-1)  # token for position j+1
    idx = np.clip(np.asarray(blk.label_idx) - 1, 0, ids.shape[1] - 1)
    want = np.stack([greedy[i][idx[i]] for i in range(ids.shape[0])])
    np.testing.assert_array_equal(jax.jit(target_greedy_labels, static_argnums=0)(sc, tp, last, blk), want)
    props = draft_proposals(sc, params, frozen_from_target(tp, TCFG), feats, blk)
    props = np.array(props)
    props[..., 0] = want[..., 0]  # every first proposal is the target's token, the recorded one rarely
    k = np.asarray(keep)
    acc = np.asarray(dvd.accept_counts(jnp.asarray(props), blk.replace(labels=jnp.asarray(want))))
    assert (acc * k).sum() >= k.sum() and (np.asarray(dvd.accept_counts(jnp.asarray(props), blk)) * k).sum() < k.sum()
    # inside the DVD step: the same acceptance when draft 1 proposes these tokens
    monkeypatch.setattr(dvd, "draft_proposals", lambda *a, **kw: jnp.asarray(props))
    _, m = jax.jit(dvd.dvd_loss, static_argnums=1)(params, sc, tp, {"input_ids": ids, "loss_mask": lm}, rng)
    assert float(m["draft1/accept_mean"]) == pytest.approx((acc * k).sum() / k.sum())
