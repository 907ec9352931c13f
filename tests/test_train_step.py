"""Training step: anchors and masks against a slow per-block reference, learning, and sharding."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from carryover_jax.config import DrafterConfig, DrafterSpec, LossConfig, MeshConfig, TargetConfig, TrainConfig
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.models.layers import Prefix
from carryover_jax.models.target import TargetLM, init_params
from carryover_jax.train import anchors as A
from carryover_jax.train.sharding import LOGICAL_RULES, make_mesh, put_batch
from carryover_jax.train.step import (
    compile_step, drafter_shardings, init_state, lr_schedule, make_optimizer, state_shardings, step_config,
    target_shardings, train_step,
)

TCFG = TargetConfig(family="qwen3", vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=16, qk_norm=True)


def _drafter_cfg(kind="markov", layout="deepspec", proposals=4):
    return DrafterConfig.for_target(TCFG, kind=kind, layout=layout, num_proposals=proposals, num_layers=1,
                                    mask_token_id=0, target_layer_ids=(0, 2), markov_rank=8 if kind == "markov" else None)


@pytest.mark.parametrize("layout", ["zlab", "deepspec"])
def test_anchors_and_masks_match_slow_reference(layout):
    # (each block's own-block attention is block-diagonal by construction: tests/test_drafter.py
    # checks it against a dense block-diagonal mask)
    dc = _drafter_cfg("dflash", layout, proposals=3)
    rng = np.random.default_rng(0)
    b, s, n = 3, 20, 6
    ids = rng.integers(1, 32, (b, s)).astype(np.int32)
    lm = np.zeros((b, s), np.int32)
    lm[0, 4:15] = 1
    lm[1, 2:5] = 1  # 2 candidates < n: unused slots
    lm[1, 9:11] = 1
    lm[2, 17:] = 1  # blocks run off the end of the sequence
    anchors, keep, nvalid = A.sample_anchors(jax.random.key(1), jnp.asarray(lm), n)
    blk = A.build_blocks(dc, jnp.asarray(ids), jnp.asarray(lm), anchors, keep, nvalid)
    t, p = dc.block_size, dc.num_proposals
    cm = np.asarray(Prefix(A.context_limit(blk, t)).dense(s))  # the mask the step's attention applies
    anchors, keep = np.asarray(anchors), np.asarray(keep)
    for i in range(b):
        cands = [q for q in range(s - 1) if lm[i, q] and lm[i, q + 1]]
        chosen = [int(a) for a, k in zip(anchors[i], keep[i]) if k]
        assert len(chosen) == min(len(cands), n) == int(nvalid[i] if nvalid[i] < n else n)
        assert chosen == sorted(set(chosen)) and set(chosen) <= set(cands)
        for j in range(n):
            for k in range(t):
                q = j * t + k
                tok = ids[i, anchors[i, j]] if keep[i, j] and k == 0 else dc.mask_token_id
                assert blk.tokens[i, q] == tok and blk.positions[i, q] == anchors[i, j] + k
                for c in range(s):
                    assert cm[i, q, c] == (bool(keep[i, j]) and c < anchors[i, j])
            ok = True
            for pi in range(p):
                lab = anchors[i, j] + pi + 1
                ok = ok and bool(keep[i, j]) and lab < s and bool(lm[i, lab])
                assert bool(blk.eval_mask[i, j, pi]) == ok
                if ok:
                    assert blk.labels[i, j, pi] == ids[i, lab]
    # with N >= #candidates every candidate is used; sampling is uniform otherwise
    counts = np.zeros(s)
    for seed in range(300):
        a, k, _ = A.sample_anchors(jax.random.key(seed), jnp.asarray(lm[:1]), 4)
        counts[np.asarray(a)[0][np.asarray(k)[0]]] += 1
    c0 = [q for q in range(s - 1) if lm[0, q] and lm[0, q + 1]]
    freq = counts[c0] / 300
    np.testing.assert_allclose(freq, 4 / len(c0), atol=0.12)


def _counting_batch(rng, b, s, v=32):
    """Deterministic toy data: x_{t+1} = x_t + 1 (mod V); responses start at a random point."""
    start = rng.integers(0, v, (b, 1))
    ids = ((start + np.arange(s)[None]) % v).astype(np.int32)
    lm = np.zeros((b, s), np.int32)
    for i in range(b):
        lm[i, rng.integers(2, 6):] = 1
    return {"input_ids": ids, "loss_mask": lm}


@pytest.mark.parametrize("kind", [pytest.param("markov", marks=pytest.mark.heavy), "dflash"])
def test_drafter_learns_a_deterministic_toy_target(kind):
    dc = _drafter_cfg(kind, "deepspec")
    # the random toy target is not the data generator here, so supervise with CE only
    cfg = TrainConfig(drafter=DrafterSpec(kind=kind), num_anchors=8, lr=1e-2, steps=150, warmup_ratio=0.05,
                      loss=LossConfig(ce_weight=1.0, l1_weight=0.0))
    sc = step_config(cfg, TCFG, dc)
    tp = init_params(TCFG, jax.random.key(0))
    opt = make_optimizer(cfg, cfg.steps)
    state = init_state(init_drafter_params(sc.drafter, jax.random.key(1)), opt, 0)
    step = jax.jit(train_step, static_argnums=(0, 1), donate_argnums=(2,))
    rng = np.random.default_rng(0)
    hist = []
    for _ in range(cfg.steps):
        state, m = step(sc, opt, state, tp, _counting_batch(rng, 8, 24))
        hist.append(jax.device_get(m))
    first, last = hist[0], hist[-1]
    assert last["ce_loss"] < 0.5 * first["ce_loss"]
    if kind == "markov":  # a transition bias learns "next = prev + 1" outright
        assert np.min(last["top1_acc@slot"]) > 0.95
    else:
        assert last["top1_acc@slot"][0] > 0.9


@pytest.mark.parametrize("mode", [pytest.param("baseline", marks=pytest.mark.heavy), "dvd"])  # DVD runs the baseline's
# draft forward and losses too
def test_sharded_step_equals_unsharded(mode):
    assert jax.device_count() == 8
    dc = _drafter_cfg("markov", "zlab")
    cfg = TrainConfig(loss=LossConfig(mode=mode), num_anchors=6, steps=4)
    sc = step_config(cfg, TCFG, dc)
    tp = init_params(TCFG, jax.random.key(0))
    opt = make_optimizer(cfg, cfg.steps)
    params = init_drafter_params(sc.drafter, jax.random.key(1))
    rng = np.random.default_rng(1)
    batches = [_counting_batch(rng, 8, 16) for _ in range(2)]
    ref = init_state(params, opt, 7)
    step = jax.jit(train_step, static_argnums=(0, 1))
    for bt in batches:
        ref, _ = step(sc, opt, ref, tp, bt)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, shard_drafter=True))
    with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
        psh = drafter_shardings(sc.drafter, mesh, shard=True)
        st = init_state(params, opt, 7)
        ssh = state_shardings(st, psh, mesh)
        st = jax.device_put(st, ssh)
        tsh = target_shardings(sc.target, mesh)
        fn = compile_step(sc, opt, mesh, ssh, tsh, {"input_ids": 2, "loss_mask": 2})
        tps = jax.device_put(tp, tsh)
        for bt in batches:
            st, _ = fn(st, tps, put_batch(bt, mesh))
        sharded = [x.sharding.spec for x in jax.tree_util.tree_leaves(st.params)]
        assert any(any(a is not None for a in spec) for spec in sharded)  # something really is sharded
    # Adam moves a weight by up to ~lr per step whatever its gradient's size, so a gradient near 0 whose last bits
    # differ between the sharded and the single-device reduction order moves it by a visible fraction of lr (jax
    # 0.12: 2.2e-5 on one of 8192 weights after 2 steps): weights agree to 5% of lr, everything else to rtol 1e-4
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=0.05 * cfg.lr,
                                                                   rtol=1e-4), ref.params, st.params)


def test_remat_and_bf16_compute():
    """remat recomputes activations without changing the step; bf16 compute keeps float32 master params
    and stays close to the float32 loss."""
    dc = _drafter_cfg("markov", "deepspec")
    tp = init_params(TCFG, jax.random.key(0))
    batch = _counting_batch(np.random.default_rng(2), 4, 16)
    out = {}
    for name, kw in {"f32": {}, "remat": {"remat": True}, "bf16": {"compute_dtype": "bfloat16"}}.items():
        cfg = TrainConfig(num_anchors=6, steps=2, **kw)
        sc = step_config(cfg, TCFG, dc)
        opt = make_optimizer(cfg, cfg.steps)
        state = init_state(init_drafter_params(dc, jax.random.key(1)), opt, 3)
        out[name] = jax.jit(train_step, static_argnums=(0, 1))(sc, opt, state, tp, batch)
    (s32, m32), (sr, mr), (sb, mb) = out["f32"], out["remat"], out["bf16"]
    np.testing.assert_allclose(float(mr["loss"]), float(m32["loss"]), rtol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), s32.params, sr.params)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(sb.params))
    assert abs(float(mb["loss"]) - float(m32["loss"])) < 0.05 * float(m32["loss"])


def test_vocab_chunked_loss_equals_the_full_one():
    """loss_chunk_rows computes the vocabulary logits chunk by chunk (with remat) and changes nothing."""
    dc = _drafter_cfg("markov", "zlab")
    tp = init_params(TCFG, jax.random.key(0))
    batch = _counting_batch(np.random.default_rng(3), 4, 20)
    out = []
    for chunk in (0, 7):  # 7 does not divide the 4 x 6 x 4 rows: exercises the padding
        cfg = TrainConfig(loss=LossConfig(chunk_rows=chunk), num_anchors=6, steps=2)
        sc = step_config(cfg, TCFG, dc)
        opt = make_optimizer(cfg, cfg.steps)
        state = init_state(init_drafter_params(dc, jax.random.key(1)), opt, 5)
        out.append(jax.jit(train_step, static_argnums=(0, 1))(sc, opt, state, tp, batch))
    (s0, m0), (s1, m1) = out
    for k in ("loss", "ce_loss", "l1_loss", "tau_estimate", "grad_norm"):
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, err_msg=k)
    # Adam turns near-zero gradients into ~lr-sized steps, so compare at 1e-5
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), s0.params, s1.params)


def _schedule_before_optax(cfg, total_steps, t):
    """The hand-written schedule lr_schedule replaced (DeepSpec): linear warmup from lr/W at step 0 to lr,
    then cosine to exactly 0 at total_steps."""
    warm = max(1, int(cfg.warmup_ratio * total_steps))
    if t < warm:
        return cfg.lr * (t + 1) / warm
    frac = min(max((t - warm) / max(total_steps - warm, 1), 0.0), 1.0)
    return cfg.lr * 0.5 * (1 + np.cos(np.pi * frac))


@pytest.mark.parametrize("lr,warmup_ratio,total", [(6e-4, 0.04, 1000), (1e-2, 0.05, 150), (3e-4, 0.0, 10),
                                                   (1e-3, 0.5, 7), (1e-3, 0.04, 1)])
def test_lr_schedule_equals_the_deepspec_formula(lr, warmup_ratio, total):
    cfg = TrainConfig(lr=lr, warmup_ratio=warmup_ratio, steps=total)
    sched = lr_schedule(cfg, total)
    ts = np.arange(total + 3)  # and past the end
    got = np.asarray(jax.vmap(sched)(jnp.asarray(ts)))
    want = np.array([_schedule_before_optax(cfg, total, int(t)) for t in ts])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7 * lr)


def _optimizer(name, cfg):
    return {"adamw": make_optimizer(cfg, cfg.steps),
            "lion": optax.chain(optax.clip_by_global_norm(1.0), optax.lion(1e-3)),
            "sgd_momentum": optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1e-2, momentum=0.9))}[name]


@pytest.mark.parametrize("name", ["adamw", "lion", "sgd_momentum"])
def test_optimizer_state_is_sharded_like_the_params_for_any_optax_optimizer(name):
    """Every params-shaped moment follows its param's sharding (not only Adam's mu/nu); counts are
    replicated."""
    sc = step_config(TrainConfig(num_anchors=6, steps=4), TCFG, _drafter_cfg("markov", "zlab"))
    opt = _optimizer(name, TrainConfig(steps=4))
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, shard_drafter=True))
    with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
        psh = drafter_shardings(sc.drafter, mesh, shard=True)
        ssh = state_shardings(init_state(init_drafter_params(sc.drafter, jax.random.key(1)), opt, 7), psh, mesh)
    assert any(any(a is not None for a in x.spec) for x in jax.tree_util.tree_leaves(psh))
    # the moments, located by optax's own state types (independent of how state_shardings finds them)
    inner = ssh.opt_state[1]
    moments = {"adamw": lambda s: [s[0].mu, s[0].nu], "lion": lambda s: [s[0].mu],
               "sgd_momentum": lambda s: [s[0].trace]}[name](inner)
    for m in moments:
        assert jax.tree_util.tree_structure(m) == jax.tree_util.tree_structure(psh)
        assert all(a == b for a, b in zip(jax.tree_util.tree_leaves(m), jax.tree_util.tree_leaves(psh)))
    moment_ids = {id(x) for m in moments for x in jax.tree_util.tree_leaves(m)}
    others = [x for x in jax.tree_util.tree_leaves(ssh.opt_state) if id(x) not in moment_ids]
    assert all(x.spec == jax.sharding.PartitionSpec() for x in others)  # counts (SGD's trace has none)


@pytest.mark.heavy
def test_sharded_step_with_a_non_adam_optimizer_equals_unsharded():
    dc = _drafter_cfg("markov", "zlab")
    cfg = TrainConfig(num_anchors=6, steps=4)
    sc = step_config(cfg, TCFG, dc)
    opt = _optimizer("lion", cfg)
    params = init_drafter_params(sc.drafter, jax.random.key(1))
    tp = init_params(TCFG, jax.random.key(0))
    batch = _counting_batch(np.random.default_rng(4), 8, 16)
    ref, _ = jax.jit(train_step, static_argnums=(0, 1))(sc, opt, init_state(params, opt, 7), tp, batch)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, shard_drafter=True))
    with jax.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
        st = init_state(params, opt, 7)
        ssh = state_shardings(st, drafter_shardings(sc.drafter, mesh, shard=True), mesh)
        tsh = target_shardings(sc.target, mesh)
        fn = compile_step(sc, opt, mesh, ssh, tsh, {"input_ids": 2, "loss_mask": 2})
        st, _ = fn(jax.device_put(st, ssh), jax.device_put(tp, tsh), put_batch(batch, mesh))
    mu = jax.tree_util.tree_leaves(st.opt_state[1][0].mu)
    assert [x.sharding for x in mu] == [x.sharding for x in jax.tree_util.tree_leaves(st.params)]
    # Adam moves a weight by up to ~lr per step whatever its gradient's size, so a gradient near 0 whose last bits
    # differ between the sharded and the single-device reduction order moves it by a visible fraction of lr (jax
    # 0.12: 2.2e-5 on one of 8192 weights after 2 steps): weights agree to 5% of lr, everything else to rtol 1e-4
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=0.05 * cfg.lr,
                                                                   rtol=1e-4), ref.params, st.params)


def test_target_labels_are_the_targets_greedy_tokens():
    """labels="target" on the target's own greedy continuations is the data-label loss exactly; on text
    the target would not say, the two differ (the switch supervises what the target says)."""
    from carryover_jax.train.losses import baseline_loss

    dc = _drafter_cfg("dflash", "zlab")
    tp = init_params(TCFG, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    rng = np.random.default_rng(3)
    ids = rng.integers(1, TCFG.vocab_size, (2, 20)).astype(np.int32)
    forward = jax.jit(lambda p, x: TargetLM(TCFG).apply({"params": p}, x)[0])
    for t in range(8, 20):  # greedy continuation of an 8-token prompt, cache-free causal forwards over all 20
        logits = forward(tp, jnp.asarray(ids))  # slots (one program; the slots from t on are not seen at t - 1)
        ids[:, t] = np.asarray(jnp.argmax(logits[:, t - 1], -1))
    mask = np.zeros_like(ids)
    mask[:, 8:] = 1

    def loss(labels, x):
        sc = step_config(TrainConfig(loss=LossConfig(labels=labels), num_anchors=6), TCFG, dc)
        batch = {"input_ids": jnp.asarray(x), "loss_mask": jnp.asarray(mask)}
        return jax.jit(baseline_loss, static_argnums=(1,))(params, sc, tp, batch, jax.random.key(5))[1]

    data, target = loss("data", ids), loss("target", ids)
    np.testing.assert_allclose(target["ce_loss"], data["ce_loss"], rtol=1e-6)
    np.testing.assert_array_equal(target["top1_acc@slot"], data["top1_acc@slot"])
    noisy = ids.copy()
    noisy[:, 8:] = rng.integers(1, TCFG.vocab_size, (2, 12))
    assert abs(float(loss("target", noisy)["ce_loss"]) - float(loss("data", noisy)["ce_loss"])) > 1e-3


def test_kl_weight_adds_the_target_distillation_term():
    """kl_weight w adds w * KL(target || draft) to the loss: same metrics otherwise, KL > 0 for a random
    drafter, and training on KL alone (no labels) pulls the drafter towards the target's distribution."""
    from carryover_jax.train.losses import baseline_loss
    dc = _drafter_cfg("dflash", "zlab")
    tp = init_params(TCFG, jax.random.key(0))
    batch = _counting_batch(np.random.default_rng(3), 4, 16)
    params = init_drafter_params(dc, jax.random.key(1))
    loss = jax.jit(baseline_loss, static_argnums=(1,))
    (l0, m0), (l1, m1) = (loss(params, step_config(TrainConfig(loss=LossConfig(kl_weight=w), num_anchors=4), TCFG, dc),
                               tp, batch, jax.random.key(5)) for w in (0.0, 0.5))
    assert float(m0["kl_loss"]) > 0
    np.testing.assert_allclose(float(m1["ce_loss"]), float(m0["ce_loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(l1), float(l0) + 0.5 * float(m0["kl_loss"]), rtol=1e-5)

    cfg = TrainConfig(loss=LossConfig(ce_weight=0.0, kl_weight=1.0), num_anchors=4, lr=1e-2, steps=40)
    sc = step_config(cfg, TCFG, dc)
    opt = make_optimizer(cfg, cfg.steps)
    state = init_state(params, opt, 0)
    step = jax.jit(train_step, static_argnums=(0, 1), donate_argnums=(2,))
    kl = []
    for _ in range(cfg.steps):
        state, m = step(sc, opt, state, tp, batch)
        kl.append(float(m["kl_loss"]))  # of the params before the update
    assert kl[-1] < 0.5 * kl[0]
