"""Features recorded by the generation that writes a store's replies (`generate(features=...)`, prepare's path)
against the feature pass over the finished sequences (`responses.target_features`, a cache-free forward) and an
independent float64 log-sum-exp: the same tokens, the same stored features, early-stopped rows included."""

import dataclasses
import types

import jax
import ml_dtypes
import numpy as np
import pytest

from carryover_jax.config import DataConfig
from carryover_jax.decode.generate import generate
from carryover_jax.models.target import init_params
from carryover_jax.numerics import Numerics
from carryover_jax.train import gen_memory as gm
from carryover_jax.train.responses import target_features
from tests.test_dvd import LAYERS, TCFG

TARGETS = {"untied": TCFG, "tied": dataclasses.replace(TCFG, tie_word_embeddings=True),
           "softcap": dataclasses.replace(TCFG, final_logit_softcapping=4.0)}
# float32: the two paths' states round to the same bfloat16 values but for a rare last-bit tie; bf16 compute:
# the prefill / decode passes and the cache-free forward round their bf16 activations differently
TOL = {"float32": 1e-2, "bfloat16": 6e-2}


def _target(name, dtype):
    cfg = TARGETS[name].with_numerics(Numerics.for_platform("cpu", dtype=dtype))
    return types.SimpleNamespace(cfg=cfg, params=init_params(cfg, jax.random.key(1)), tokenizer=None,
                                 stop_token_ids=())


def _lse64(target, last):
    """log Σ exp of the head's logits at the stored (bfloat16) state, in float64."""
    p, cfg = target.params, target.cfg
    w = np.asarray(p["embed_tokens"]["embedding"] if cfg.tie_word_embeddings else p["lm_head"]["kernel"].T,
                   np.float64)
    if cfg.tie_word_embeddings:  # the tied head runs in the hidden state's dtype
        w = w.astype(ml_dtypes.bfloat16).astype(np.float64)
    z = last.astype(np.float64) @ w.T
    if cfg.final_logit_softcapping:
        z = cfg.final_logit_softcapping * np.tanh(z / cfg.final_logit_softcapping)
    return np.log(np.sum(np.exp(z - z.max(-1, keepdims=True)), -1)) + z.max(-1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(TARGETS))
def test_generation_records_what_the_feature_pass_computes(name, dtype):
    target = _target(name, dtype)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 32, n).tolist() for n in (3, 11, 6, 17)]
    max_new = [9, 4, 16, 12]
    free = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=[])
    # row 0 stops at its first token (never fed back while decoding), row 2 part-way
    stops = [free[0].token_ids[0]] + [t for t in free[2].token_ids[2:] if t not in free[0].token_ids][:1]
    plain = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=stops)
    got = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=stops, features=LAYERS)
    assert [g.token_ids for g in got] == [g.token_ids for g in plain]
    assert len(got[0].token_ids) == 1 and got[0].stop_reason == "stop_token"
    assert any(g.stop_reason == "length" for g in got)
    seqs = [g.prompt_ids + g.token_ids for g in got]
    ref = target_features(target, seqs, LAYERS)
    d = target.cfg.hidden_size
    for g, r, seq in zip(got, ref, seqs):
        f = g.features
        assert f["features"].shape == (len(seq), len(LAYERS) * d) and f["features"].dtype == ml_dtypes.bfloat16
        assert f["last_hidden"].shape == (len(seq), d) and f["last_hidden"].dtype == ml_dtypes.bfloat16
        assert f["target_lse"].shape == (len(seq), 1) and f["target_lse"].dtype == np.float32
        for k in ("features", "last_hidden"):
            np.testing.assert_allclose(f[k].astype(np.float32), r[k].astype(np.float32), rtol=TOL[dtype],
                                       atol=TOL[dtype])
        # the log-sum-exp is that of the head at the recorded state itself, whichever pass computed it
        np.testing.assert_allclose(f["target_lse"][:, 0], _lse64(target, f["last_hidden"]), rtol=1e-5, atol=1e-5)
    assert plain[0].features is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampled_replies_record_the_states_of_the_drawn_tokens(dtype):
    """prepare at data.temperature > 0: the recording run draws the same tokens as a plain one (same seed) and its
    features are the feature pass's over the drawn sequence."""
    target = _target("untied", dtype)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 32, n).tolist() for n in (5, 13, 8)]
    kw = dict(max_new_tokens=[12, 7, 15], temperature=1.0, top_p=0.9, seed=3, stop_token_ids=[])
    plain = generate(target, prompts, **kw)
    got = generate(target, prompts, features=LAYERS, **kw)
    assert [g.token_ids for g in got] == [g.token_ids for g in plain]
    greedy = generate(target, prompts, **dict(kw, temperature=0.0))
    assert [g.token_ids for g in got] != [g.token_ids for g in greedy]  # a draw, not the greedy chain
    seqs = [g.prompt_ids + g.token_ids for g in got]
    for g, r in zip(got, target_features(target, seqs, LAYERS)):
        for k in ("features", "last_hidden"):
            np.testing.assert_allclose(g.features[k].astype(np.float32), r[k].astype(np.float32), rtol=TOL[dtype],
                                       atol=TOL[dtype])


def test_the_memory_plan_counts_the_recorded_buffers_instead_of_a_feature_pass():
    tcfg = TCFG.with_numerics(Numerics.for_platform("cpu"))
    plain = DataConfig(max_prompt_tokens=64, max_new_tokens=32)
    recorded = dataclasses.replace(plain, store_features=True, feature_layer_ids=LAYERS)
    with_kv = dataclasses.replace(recorded, store_kv="bfloat16")
    assert not gm.records_features(plain) and gm.records_features(recorded) and not gm.records_features(with_kv)
    assert not gm.records_features(dataclasses.replace(recorded, responses="source"))
    assert not gm.records_features(dataclasses.replace(recorded, feature_pass=True))
    a, b = gm.generation_bytes(plain, tcfg, 4), gm.generation_bytes(recorded, tcfg, 4)
    assert b["cache"] == a["cache"] > 0 and b["activations"] > a["activations"]
    # four rows of (64 prompt + 32 reply) tokens x (3 taps + the last state) x 64 in bf16, + the float32 lse
    assert b["activations"] - a["activations"] >= 4 * 96 * (4 * 64 * 2 + 4)
