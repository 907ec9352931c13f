"""DVD on a recording sampled at T > 0: draft 1's accepted counts (`dvd.coupled_proposals`, the maximal
coupling with the recorded tokens) follow the distribution real speculative sampling gives with the same
drafter on the same prefixes — the engine's first round, run as decoding runs it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chi2_contingency

from carryover_jax.config import DrafterConfig, LossConfig, TargetConfig, TrainConfig
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.sampling import sample
from carryover_jax.models.drafter import frozen_from_target, init_drafter_params
from carryover_jax.models.target import TargetLM, init_params
from carryover_jax.train import anchors as A
from carryover_jax.train import dvd
from carryover_jax.train.step import step_config

V, P, T = 32, 3, 0.8
TCFG = TargetConfig(family="qwen3", vocab_size=V, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True)
LAYERS = (-1, 0)
PROMPT = [3, 9, 4, 17, 5]
N = 2000


def _models(kind):
    """`markov-vocab`: the Markov drafter over a draft vocabulary of 28 of the 32 ids."""
    tp = init_params(TCFG, jax.random.key(1))  # random: rounds end at every depth (a peaked target rejects all)
    vocab = tuple(range(4, V)) if kind == "markov-vocab" else ()
    kind = kind.removesuffix("-vocab")
    dc = DrafterConfig.for_target(TCFG, kind=kind, layout="zlab", num_proposals=P, num_layers=1, mask_token_id=0,
                                  target_layer_ids=LAYERS, markov_rank=8 if kind == "markov" else None,
                                  draft_vocab=vocab)
    return tp, dc, init_drafter_params(dc, jax.random.key(2))


@jax.jit
def _next_logits(tp, ids):
    return TargetLM(TCFG).apply({"params": tp}, ids)[0][:, -1]


def _recordings(tp, rng_key, n):
    """n continuations of PROMPT sampled from the target at T: [t0, x_1..x_P] each."""
    ids = jnp.asarray(np.tile(PROMPT, (n, 1)), jnp.int32)
    for k in jax.random.split(rng_key, P + 1):
        ids = jnp.concatenate([ids, sample(k, _next_logits(tp, ids), jnp.full((n,), T))[:, None]], axis=1)
    return ids


@functools.partial(jax.jit, static_argnums=1)
def _dvd_accepts(tp, dc, params, ids):
    sc = step_config(TrainConfig(loss=LossConfig(mode="dvd", dvd_temperature=T), num_anchors=1), TCFG, dc)
    n, s = ids.shape
    taps, last = TargetLM(TCFG).apply({"params": tp}, ids, LAYERS, method=TargetLM.features)
    lm = jnp.zeros((n, s), jnp.int32).at[:, len(PROMPT):].set(1)  # t0 and x_1..x_P are generated
    anchors = jnp.full((n, 1), len(PROMPT), jnp.int32)  # t0: the anchor of the engine's first round
    blk = A.build_blocks(dc, ids, lm, anchors, jnp.ones((n, 1), bool), jnp.ones((n,), jnp.int32))
    frozen = frozen_from_target(tp, TCFG)
    props = dvd.coupled_proposals(sc, params, tp, frozen, jnp.concatenate(taps, -1), last, blk, jax.random.key(5))
    return dvd.accept_counts(props, blk)[:, 0]


def _engine_accepts(tp, dc, params, n):
    """Round 1 of speculative sampling from PROMPT (prefill samples t0, then one draft + verify)."""
    sc = sp.SpecConfig(target=TCFG, drafter=dc, attend_carried=False, sampling=True)
    s = sp.prefill(sc, tp, params, jnp.asarray(np.tile(PROMPT, (n, 1)), jnp.int32),
                   jnp.full((n,), len(PROMPT), jnp.int32), jnp.full((n,), 2 * P + 2, jnp.int32),
                   jnp.full((n,), T, jnp.float32), jnp.full((8,), -1, jnp.int32), jax.random.key(7),
                   max_len=32, out_size=16, max_rounds=16)
    toks, q, s = sp.draft_step(sc, tp, params, s)
    s = sp.verify_step(sc, tp, params, s, toks, q)
    return np.asarray(s.accepted)[:, 0]


@pytest.mark.parametrize("kind", ["dflash", "markov", "markov-vocab"])
def test_coupled_draft1_accepts_what_speculative_sampling_accepts(kind):
    tp, dc, params = _models(kind)
    got = np.asarray(_dvd_accepts(tp, dc, params, _recordings(tp, jax.random.key(3), N)))
    ref = _engine_accepts(tp, dc, params, N)
    hist = np.stack([np.bincount(got, minlength=P + 1), np.bincount(ref, minlength=P + 1)])
    # not a vacuous comparison: rounds reject and accept at every depth
    assert (hist > 30).all(), hist
    assert chi2_contingency(hist).pvalue > 1e-3, hist
    assert abs(got.mean() - ref.mean()) < 4 * np.sqrt(got.var() / N + ref.var() / N)
