"""The target's per-token log-sum-exp that a response store keeps: prepare's value against an independent float64
computation, and training from it (the LM head's draft-vocabulary columns alone) against training from the whole
head: the same loss, metrics and gradients in baseline (CE + KL), EDR and DVD steps, for a tied head, an untied
one and a soft-capped one."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from carryover_jax.config import DrafterConfig, LossConfig, TrainConfig
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.models.target import init_params
from carryover_jax.train import dvd, losses
from carryover_jax.train.responses import target_features
from carryover_jax.train.step import step_config
from carryover_jax.train.store import ResponseStore
from tests.test_dvd import LAYERS, TCFG, _batch

VOCAB = tuple(range(3, 23))  # a draft vocabulary of 20 of the 32 ids
TARGETS = {"untied": TCFG, "tied": dataclasses.replace(TCFG, tie_word_embeddings=True),
           "softcap": dataclasses.replace(TCFG, final_logit_softcapping=4.0)}


def _stored(tcfg, tp, seed=0):
    ids, lm = _batch(seed)
    outs = target_features(types.SimpleNamespace(params=tp, cfg=tcfg), np.asarray(ids).tolist(), LAYERS)
    return {"input_ids": ids, "loss_mask": lm, **{k: jnp.asarray(np.stack([o[k] for o in outs])) for k in outs[0]}}


@pytest.mark.parametrize("name", list(TARGETS))
def test_the_stored_logsumexp_is_that_of_the_heads_logits_at_the_stored_hidden_state(name):
    tcfg = TARGETS[name]
    tp = init_params(tcfg, jax.random.key(0))
    batch = _stored(tcfg, tp)
    last = np.asarray(batch["last_hidden"]).astype(np.float64)  # bf16 as stored
    w = tp["embed_tokens"]["embedding"].T if tcfg.tie_word_embeddings else tp["lm_head"]["kernel"]
    if tcfg.tie_word_embeddings:  # the tied head runs in the hidden state's dtype (`lm_head_logits`)
        w = np.asarray(w).astype(ml_dtypes.bfloat16)
    z = last @ np.asarray(w).astype(np.float64)
    cap = tcfg.final_logit_softcapping
    if cap:
        z = cap * np.tanh(z / cap)
    want = np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)
    assert batch["target_lse"].shape == (*last.shape[:2], 1) and batch["target_lse"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(batch["target_lse"])[..., 0], want, rtol=1e-5, atol=1e-5)


def _dc(tcfg):  # a draft vocabulary: DFlash only (the Markov head maps the whole vocabulary)
    return DrafterConfig.for_target(tcfg, kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                                    mask_token_id=0, target_layer_ids=LAYERS, draft_vocab=VOCAB)


@pytest.mark.parametrize("name,mode,objective,chunk", [
    ("untied", "baseline", "ce", 0), ("tied", "baseline", "ce", 7), ("softcap", "baseline", "ce", 3),
    ("untied", "baseline", "edr", 5), ("tied", "dvd", "ce", 0), ("softcap", "control", "ce", 0)])
def test_training_from_the_stored_logsumexp_equals_the_full_head(name, mode, objective, chunk, monkeypatch):
    tcfg = TARGETS[name]
    dc = _dc(tcfg)
    cfg = TrainConfig(loss=LossConfig(mode=mode, objective=objective, kl_weight=1.0, l1_weight=0.5, chunk_rows=chunk),
                      num_anchors=5)
    sc = step_config(cfg, tcfg, dc)
    tp = init_params(tcfg, jax.random.key(0))
    params = init_drafter_params(dc, jax.random.key(1))
    with_lse = _stored(tcfg, tp)
    without = {k: v for k, v in with_lse.items() if k != "target_lse"}
    calls = _count_head_at(monkeypatch)
    loss_fn = losses.baseline_loss if mode == "baseline" else dvd.dvd_loss
    run = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, sc, tp, b, jax.random.key(3)), has_aux=True))
    (l_fast, m_fast), g_fast = run(params, with_lse)
    assert calls and all(k == len(VOCAB) for k in calls)  # the draft-vocabulary columns ran, and only they
    calls.clear()
    (l_full, m_full), g_full = run(params, without)
    assert not calls  # without the stored value: the whole head
    assert abs(float(m_full["kl_loss"])) > 1e-3  # a real distribution to match, not 0 == 0
    np.testing.assert_allclose(float(l_fast), float(l_full), rtol=1e-5)
    assert m_fast.keys() == m_full.keys()
    for k in m_full:
        np.testing.assert_allclose(np.asarray(m_fast[k]), np.asarray(m_full[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6), g_fast, g_full)


def _count_head_at(monkeypatch):
    """The widths (K) of every `head_at` call traced from now on."""
    calls, real = [], losses.head_at
    monkeypatch.setattr(losses, "head_at", lambda cfg, cols, h: calls.append(cols.shape[0 if cfg.tie_word_embeddings
                                                                                      else 1]) or real(cfg, cols, h))
    return calls


def test_self_distilled_labels_and_the_full_vocabulary_keep_the_full_head(monkeypatch):
    tp = init_params(TCFG, jax.random.key(0))
    batch = _stored(TCFG, tp)
    calls = _count_head_at(monkeypatch)
    for dc, labels in ((_dc(TCFG), "target"), (dataclasses.replace(_dc(TCFG), draft_vocab=()), "data")):
        sc = step_config(TrainConfig(loss=LossConfig(labels=labels), num_anchors=5), TCFG, dc)
        params = init_drafter_params(dc, jax.random.key(1))
        jax.make_jaxpr(lambda p: losses.baseline_loss(p, sc, tp, batch, jax.random.key(3)))(params)
    assert not calls


def test_a_store_keeps_the_layout_it_was_created_with(tmp_path):
    """A store written before the log-sum-exp existed reopens for appending without it (training then computes
    the full head); a new one holds it and hands it out with the features."""
    tp = init_params(TCFG, jax.random.key(0))
    d = TCFG.hidden_size
    out = target_features(types.SimpleNamespace(params=tp, cfg=TCFG), [[5, 6, 7, 8]], LAYERS)[0]
    kw = dict(feature_dim=len(LAYERS) * d, hidden=d, meta={"x": 1})
    old = ResponseStore.create_or_open(tmp_path / "old", **kw)
    old.append([{"id": "a", "input_ids": [5, 6, 7, 8], "loss_mask": [0, 1, 1, 1],
                 **{k: v for k, v in out.items() if k != "target_lse"}}])
    old.commit()
    again = ResponseStore.create_or_open(tmp_path / "old", target_lse=True, **kw)
    assert not again.has("target_lse") and "target_lse" not in again.get(0)
    new = ResponseStore.create_or_open(tmp_path / "new", target_lse=True, **kw)
    new.append([{"id": "a", "input_ids": [5, 6, 7, 8], "loss_mask": [0, 1, 1, 1], **out}])
    new.commit()
    rec = ResponseStore.open(tmp_path / "new").get(0)
    np.testing.assert_array_equal(rec["target_lse"], out["target_lse"])
    assert "target_lse" not in ResponseStore.open(tmp_path / "new").get(0, features=False)


def test_the_feature_forward_in_passes_equals_one_pass(monkeypatch):
    """Prepare's feature forward runs in passes of `FEATURE_PASS_TOKENS` token rows on CPU (5 sequences in passes of
    2: the last pass padded): every stored output equals the one-pass forward's to float32 rounding, and only the
    passes' program loops over them."""
    from carryover_jax.train import responses

    tp = init_params(TCFG, jax.random.key(1))
    ids = jnp.asarray(np.random.default_rng(4).integers(1, 32, (5, 24)), jnp.int32)
    outs, texts = [], []
    for tokens in (10 ** 9, 2 * 24):
        monkeypatch.setattr(responses, "FEATURE_PASS_TOKENS", tokens)  # read when traced: a new jit per setting
        f = jax.jit(lambda p, x: responses._features.__wrapped__(p, x, cfg=TCFG, layer_ids=LAYERS, kv_dtype="float32"))
        outs.append(jax.device_get(f(tp, ids)))
        texts.append(f.lower(tp, ids).compile().as_text())
    whole, passes = outs
    assert set(whole) == set(passes) == {"features", "last_hidden", "target_lse", "kv"}
    for k in whole:
        assert whole[k].shape == passes[k].shape and whole[k].shape[:2] == (5, 24), k
        np.testing.assert_allclose(np.asarray(passes[k], np.float32), np.asarray(whole[k], np.float32),
                                   rtol=1e-2 if whole[k].dtype == jnp.bfloat16 else 1e-5, atol=1e-5, err_msg=k)
    assert " while(" not in texts[0].split("ENTRY")[1] and " while(" in texts[1].split("ENTRY")[1]
