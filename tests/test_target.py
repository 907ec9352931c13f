"""Target numerics against HF transformers, and the KV cache against cache-free forwards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import load_target
from carryover_jax.models.target import new_cache
from tests.hf_models import hf_forward
from tests.jitted import jit_apply

ATOL = 1e-4


def _ids(rng, b, t, vocab=97):
    return rng.integers(3, vocab, size=(b, t)).astype(np.int32)


def test_logits_and_taps_match_transformers(tiny_model):
    target = load_target(tiny_model.path, tokenizer=False)
    ids = _ids(np.random.default_rng(0), 2, 11)
    ref_logits, ref_hidden = hf_forward(tiny_model.hf, ids)
    taps_ids = (-1, 0, 1)
    logits, cache, taps = jit_apply(target.model)({"params": target.params}, jnp.asarray(ids), tap_layers=taps_ids)
    assert cache is None
    np.testing.assert_allclose(np.asarray(logits), ref_logits, atol=ATOL, rtol=1e-4)
    for lid, tap in zip(taps_ids, taps):
        np.testing.assert_allclose(np.asarray(tap), ref_hidden[lid + 1], atol=ATOL, rtol=1e-4)


def test_final_layer_tap_is_pre_norm(tiny_llama):
    target = load_target(tiny_llama.path, tokenizer=False)
    ids = _ids(np.random.default_rng(1), 1, 5)
    _, ref_hidden = hf_forward(tiny_llama.hf, ids)
    _, _, (last,) = jit_apply(target.model)({"params": target.params}, jnp.asarray(ids), tap_layers=(2,))
    # HF's last hidden state has the final norm applied; ours is the raw residual stream.
    normed = jit_apply(target.model)({"params": target.params}, last, method=lambda m, h: m.norm(h))
    np.testing.assert_allclose(np.asarray(normed), ref_hidden[-1], atol=ATOL, rtol=1e-4)


def _full(target, ids):
    return np.asarray(jit_apply(target.model)({"params": target.params}, jnp.asarray(ids))[0])


def test_prefill_then_chunks_equals_full_forward(tiny_model):
    target = load_target(tiny_model.path, tokenizer=False)
    m, p = jit_apply(target.model), {"params": target.params}
    ids = _ids(np.random.default_rng(2), 2, 14)
    full = _full(target, ids)
    cache = new_cache(target.cfg, 2, 32)
    pieces = []
    for lo, hi in [(0, 6), (6, 7), (7, 11), (11, 14)]:  # prefill, AR step, verify-sized chunks
        logits, cache, _ = m(p, jnp.asarray(ids[:, lo:hi]), cache=cache)
        pieces.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=ATOL, rtol=1e-4)
    assert np.asarray(cache.lengths).tolist() == [14, 14]


def test_rollback_then_continue_equals_fresh_run(tiny_model):
    target = load_target(tiny_model.path, tokenizer=False)
    m, p = jit_apply(target.model), {"params": target.params}
    rng = np.random.default_rng(3)
    ids = _ids(rng, 2, 8)
    rejected = _ids(rng, 2, 5)
    cont = _ids(rng, 2, 4)
    cache = new_cache(target.cfg, 2, 32)
    _, cache, _ = m(p, jnp.asarray(ids), cache=cache)
    _, cache, _ = m(p, jnp.asarray(rejected), cache=cache)  # e.g. a rejected draft block
    # keep 2 of the 5 on row 0 and none on row 1
    keep = np.array([2, 0])
    cache = cache.with_lengths(jnp.asarray(8 + keep))
    logits, cache, _ = m(p, jnp.asarray(cont), cache=cache)
    assert np.asarray(cache.lengths).tolist() == (8 + keep + 4).tolist()
    for row in range(2):
        prefix = np.concatenate([ids[row], rejected[row, : keep[row]]])
        fresh = _full(target, np.concatenate([prefix, cont[row]])[None])[0, -4:]
        np.testing.assert_allclose(np.asarray(logits)[row], fresh, atol=ATOL, rtol=1e-4)


def test_padded_batch_rows_equal_single_rows(tiny_model):
    """Right padding: each row of a padded batch gives what it gives alone."""
    from carryover_jax.decode import autoregressive as ar
    from carryover_jax.decode.generate import pad_batch

    target = load_target(tiny_model.path, tokenizer=False)
    rng = np.random.default_rng(4)
    rows = [list(_ids(rng, 1, n)[0]) for n in (3, 9, 16)]
    cache, logits = ar.prefill(target.cfg, target.params, jnp.asarray(pad_batch(rows, 16)),
                               jnp.asarray([3, 9, 16], jnp.int32), max_len=32)
    nxt = jnp.asarray([5, 6, 7], jnp.int32)
    step_logits, _ = ar.step(target.cfg, target.params, cache, nxt)
    for i, row in enumerate(rows):
        full = _full(target, np.asarray([row + [int(nxt[i])]], np.int32))[0]
        np.testing.assert_allclose(np.asarray(logits)[i], full[-2], atol=ATOL, rtol=1e-4)
        np.testing.assert_allclose(np.asarray(step_logits)[i], full[-1], atol=ATOL, rtol=1e-4)


def test_prefill_compiles_once_per_bucket(tiny_llama):
    from carryover_jax.decode import autoregressive as ar
    from carryover_jax.decode.generate import pad_batch

    from tests.compile_counts import compiles_of, counting_compiles

    target = load_target(tiny_llama.path, tokenizer=False)
    after = []
    with counting_compiles() as counts:  # from cleared caches: absolute counts
        for n in (5, 11):  # two prompts of one bucket (16)
            ids = pad_batch([list(range(3, 3 + n))], 16)
            cache, logits = ar.prefill(target.cfg, target.params, jnp.asarray(ids), jnp.asarray([n], jnp.int32),
                                       max_len=64)
            for t in (4, 5):  # a step on prefill's cache, then on the step's own output cache
                _, cache = ar.step(target.cfg, target.params, cache, jnp.asarray([t], jnp.int32))
            after.append((ar.prefill._cache_size(), ar.step._cache_size(), compiles_of(counts, "prefill"),
                          compiles_of(counts, "step")))
    assert after == [(1, 1, 1, 1)] * 2


def test_bf16_forward_close_to_float32(tiny_qwen3):
    f32 = load_target(tiny_qwen3.path, tokenizer=False)
    bf = load_target(tiny_qwen3.path, tokenizer=False, dtype="bfloat16")
    assert jax.tree_util.tree_leaves(bf.params)[0].dtype == jnp.bfloat16
    ids = jnp.asarray(_ids(np.random.default_rng(5), 1, 9))
    a = jit_apply(f32.model)({"params": f32.params}, ids)[0]
    b = jit_apply(bf.model)({"params": bf.params}, ids)[0]
    assert b.dtype == jnp.float32
    assert float(jnp.mean(jnp.argmax(a, -1) == jnp.argmax(b, -1))) > 0.7


@pytest.mark.parametrize("chunk", [8, 16, 64])
def test_live_length_chunked_attention_equals_dense(chunk):
    """A `LiveMask` segment (the cache read chunk by chunk up to the longest live row, a buffer
    that the chunk does not divide included) equals the same attention with a dense mask, merged
    with a second segment; rows with no visible slot return zeros."""
    from carryover_jax.models.layers import LiveMask, attention_core

    rng = np.random.default_rng(6)
    b, t, h, hkv, d, s = 3, 4, 6, 2, 8, 37
    q = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, hkv, s, d)), jnp.float32) for _ in range(2))
    kb, vb = (jnp.asarray(rng.standard_normal((b, hkv, t, d)), jnp.float32) for _ in range(2))
    limit = jnp.asarray([[1, 2, 3, 4], [30, 31, 32, 33], [34, 35, 36, 37]], jnp.int32)
    dense = jnp.arange(s)[None, None, :] < limit[:, :, None]
    block = jnp.ones((b, t, t), bool)
    want = attention_core(q, [(k, v, dense), (kb, vb, block)], 0.3)
    got = attention_core(q, [(k, v, LiveMask(limit, chunk)), (kb, vb, block)], 0.3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
    # cache segment only, one row with nothing live (limit 0) and one reading past max(limit) chunks
    lim0 = limit.at[0].set(0)
    got0 = attention_core(q, [(k, v, LiveMask(lim0, chunk))], 0.3)
    want0 = attention_core(q, [(k, v, jnp.arange(s)[None, None, :] < lim0[:, :, None])], 0.3)
    np.testing.assert_allclose(np.asarray(got0), np.asarray(want0), atol=1e-5, rtol=1e-5)
    assert not np.any(np.asarray(got0[0]))
