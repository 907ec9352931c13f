"""Draft vocabulary (EAGLE-3): choice from the data, losses against the full-vocabulary reference,
lossless decoding at T = 0 and T = 1, a trained drafter that is accepted, native save/load, export errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import ConfigError, generate, load_target
from carryover_jax.config import DrafterConfig, TrainConfig
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params, to_target_ids, with_draft_head
from carryover_jax.train.objectives import row_terms
from carryover_jax.train.vocab import draft_vocabulary
from carryover_jax.weights.drafter_formats import export_drafter, load_drafter, save_drafter


def _drafter(target, vocab, *, proposals=4, seed=0, layer_ids=(0, 1), kind="dflash", markov_scale=None):
    """`markov_scale`: the Markov head's weights redrawn at that scale, so its bias decides many proposals."""
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout="zlab", num_proposals=proposals, num_layers=1,
                                   mask_token_id=4, target_layer_ids=layer_ids, draft_vocab=tuple(vocab),
                                   markov_rank=4 if kind == "markov" else None)
    params = init_drafter_params(cfg, jax.random.key(seed))
    if markov_scale:
        rng = np.random.default_rng(seed)
        params["markov_head"] = jax.tree.map(
            lambda x: markov_scale * rng.standard_normal(x.shape).astype(np.float32), params["markov_head"])
    return cfg, with_draft_head(cfg, params, frozen_from_target(target.params, target.cfg))


def test_vocabulary_is_the_most_frequent_tokens_plus_stops():
    counts = np.array([0, 5, 9, 9, 1, 0, 7, 2])
    vocab, cover = draft_vocabulary(counts, 4, always=(5,))
    assert vocab == (2, 3, 5, 6)  # 9, 9 (ties by id), 7, and the stop token 5 however rare
    assert cover == pytest.approx(25 / 33)
    with pytest.raises(ConfigError, match="draft_vocab_size must be in"):
        draft_vocabulary(counts, 9)


def test_config_refuses_bad_vocabularies(tiny_llama):
    target = load_target(tiny_llama.path, tokenizer=False)
    kw = dict(kind="dflash", num_proposals=3, num_layers=1, mask_token_id=4, target_layer_ids=(0,))
    with pytest.raises(ConfigError, match="strictly increasing target ids"):
        DrafterConfig.for_target(target.cfg, draft_vocab=(5, 3), **kw)
    with pytest.raises(ConfigError, match="strictly increasing target ids"):
        DrafterConfig.for_target(target.cfg, draft_vocab=(3, target.cfg.vocab_size), **kw)


def test_markov_bias_covers_the_draft_vocabulary(tiny_llama):
    """A Markov head over a draft vocabulary of K ids: W1 embeds any target id (the anchor), W2 maps to the K
    draft logits; the sequential greedy proposals are the argmaxes of backbone + bias, each slot's bias from
    the previous slot's target id, checked against a loop by hand."""
    from carryover_jax.decode.drafting import sequential_proposals

    target = load_target(tiny_llama.path, tokenizer=False)
    vocab = tuple(range(3, 97, 3))
    cfg, params = _drafter(target, vocab, kind="markov", markov_scale=1.0)
    w1 = np.asarray(params["markov_head"]["markov_w1"]["embedding"])
    w2 = np.asarray(params["markov_head"]["markov_w2"]["kernel"])
    assert w1.shape == (target.cfg.vocab_size, 4) and w2.shape == (4, len(vocab))
    rng = np.random.default_rng(3)
    z = rng.standard_normal((5, cfg.num_proposals, len(vocab))).astype(np.float32)
    anchor = np.array([0, 7, 50, 96, 12])  # any target id, inside the draft vocabulary or not
    toks = np.asarray(sequential_proposals(cfg, params, jnp.asarray(z), jnp.asarray(anchor), None, None,
                                           sampling=False)[0])
    for b in range(5):
        prev = anchor[b]
        for k in range(cfg.num_proposals):
            prev = vocab[int(np.argmax(z[b, k] + w1[prev] @ w2))]
            assert toks[b, k] == prev


def test_row_terms_equal_the_full_vocabulary_with_the_rest_masked():
    """Draft logits over K ids == full-vocabulary logits that are -inf outside them: same CE (for labels
    inside), L1, alpha and top-1; labels outside get no CE and are never correct."""
    rng = np.random.default_rng(0)
    v, vocab = 11, (1, 2, 5, 8, 9)
    z = rng.standard_normal((6, len(vocab))).astype(np.float32)
    zt = rng.standard_normal((6, v)).astype(np.float32)
    labels = np.array([2, 9, 1, 8, 3, 0])  # the last two are outside
    full = np.full((6, v), -1e30, np.float32)
    full[:, vocab] = z
    ce, l1, alpha, ok, kl = map(np.asarray, row_terms(jnp.asarray(z), jnp.asarray(zt), jnp.asarray(labels), vocab))
    ce_r, l1_r, alpha_r, ok_r, _ = map(np.asarray, row_terms(jnp.asarray(full), jnp.asarray(zt), jnp.asarray(labels)))
    np.testing.assert_allclose(ce[:4], ce_r[:4], rtol=1e-6)
    np.testing.assert_array_equal(ce[4:], 0.0)
    np.testing.assert_allclose(l1, l1_r, rtol=1e-6)
    np.testing.assert_allclose(alpha, alpha_r, rtol=1e-6)
    np.testing.assert_array_equal(ok, ok_r)
    # KL(target || draft) by hand: over the draft vocabulary only; over everything without one
    pt = np.exp(zt - zt.max(-1, keepdims=True))
    pt /= pt.sum(-1, keepdims=True)
    logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(kl, np.sum(pt[:, vocab] * (np.log(pt[:, vocab]) - logq), -1), rtol=1e-5)
    zf = rng.standard_normal((6, v)).astype(np.float32)
    logqf = zf - np.log(np.exp(zf).sum(-1, keepdims=True))
    kl_f = np.asarray(row_terms(jnp.asarray(zf), jnp.asarray(zt), jnp.asarray(labels))[4])
    np.testing.assert_allclose(kl_f, np.sum(pt * (np.log(pt) - logqf), -1), rtol=1e-5)
    assert (kl_f > 0).all()


@pytest.mark.parametrize("kind", ["dflash", "markov"])
@pytest.mark.parametrize("carryover", [True, False])
def test_greedy_with_a_draft_vocabulary_equals_ar(tiny_llama, carryover, kind):
    target = load_target(tiny_llama.path, tokenizer=False)
    vocab = list(range(3, 97, 2))  # half the tokens: many target tokens cannot be proposed
    drafter = _drafter(target, vocab, kind=kind, markov_scale=1.0 if kind == "markov" else None)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, size=n).tolist() for n in (4, 13, 7)]
    ref = generate(target, prompts, max_new_tokens=[17, 5, 23], stop_token_ids=[])
    out, _ = speculative_generate(target, drafter, prompts, max_new_tokens=[17, 5, 23], stop_token_ids=[],
                                  carryover=carryover)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]


@pytest.mark.parametrize("kind", ["dflash", "markov"])
def test_sampling_with_a_draft_vocabulary_is_lossless(tmp_path, kind):
    """T = 1, a target of 8 tokens and a drafter that can propose only 4 of them: the first three
    generated tokens follow the exact target distribution (chi-square, fixed seed). Markov: a strong bias
    over the 4 ids, drawn slot after slot."""
    from tests.lossless import sampled_pvalue, tiny_sampling_target

    target = tiny_sampling_target(tmp_path)
    drafter = _drafter(target, (0, 3, 5, 6), proposals=3, seed=1, layer_ids=(0,), kind=kind,
                       markov_scale=1.0 if kind == "markov" else None)
    pvalue, stats = sampled_pvalue(target, drafter)
    assert pvalue > 1e-3
    assert stats["tau"] > 1.05  # drafts are accepted: the acceptance path is exercised


def test_trained_drafter_with_a_draft_vocabulary_is_accepted(tiny_llama):
    """Trained on the target's own continuations with a vocabulary chosen from them: greedy decoding
    still equals AR and the drafter's proposals (mapped back to target ids) are accepted."""
    from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

    target = load_target(tiny_llama.path, tokenizer=False)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 97, size=6).tolist() for _ in range(16)]
    outs = generate(target, prompts, max_new_tokens=26, stop_token_ids=[])
    ids = np.array([p + o.token_ids for p, o in zip(prompts, outs)], np.int32)
    mask = np.zeros_like(ids)
    mask[:, 6:] = 1
    vocab, cover = draft_vocabulary(np.bincount(ids[mask == 1], minlength=target.cfg.vocab_size), 32)
    assert 0.5 < cover < 1.0  # a real subset of what the target says
    cfg, params = _drafter(target, vocab)
    tcfg = TrainConfig(num_anchors=16, steps=150, lr=1e-2, warmup_ratio=0.05)
    sc = step_config(tcfg, target.cfg, cfg)
    opt = make_optimizer(tcfg, tcfg.steps)
    state = init_state(params, opt, 0)
    step = jax.jit(train_step, static_argnums=(0, 1), donate_argnums=(2,))
    for i in range(tcfg.steps):
        rows = np.arange(8) + 8 * (i % 2)
        state, m = step(sc, opt, state, target.params, {"input_ids": ids[rows], "loss_mask": mask[rows]})
    drafter = (cfg, jax.device_get(state.params))
    ref = generate(target, prompts[:4], max_new_tokens=24, stop_token_ids=[])
    out, stats = speculative_generate(target, drafter, prompts[:4], max_new_tokens=24, stop_token_ids=[])
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert stats["tau"] > 1.5


def test_native_roundtrip_and_export_errors(tiny_llama, tmp_path):
    target = load_target(tiny_llama.path, tokenizer=False)
    cfg, params = _drafter(target, range(3, 60))
    head = np.asarray(params["lm_head"]["kernel"])
    embed = np.asarray(target.params["embed_tokens"]["embedding"])
    ref_head = embed.T if target.cfg.tie_word_embeddings else np.asarray(target.params["lm_head"]["kernel"])
    np.testing.assert_array_equal(head, ref_head[:, 3:60])  # initialised from the target head's rows
    np.testing.assert_array_equal(np.asarray(to_target_ids(cfg, jnp.asarray([0, 56]))), [3, 59])
    cfg2, params2 = load_drafter(save_drafter(cfg, params, tmp_path / "native"))
    assert cfg2 == cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, params2)
    frozen = frozen_from_target(target.params, target.cfg)
    for fmt in ("zlab", "deepspec"):
        with pytest.raises(ConfigError, match=f"the {fmt} format has no draft vocabulary"):
            export_drafter(cfg, params, tmp_path / fmt, fmt, frozen=frozen, dtype=None)
