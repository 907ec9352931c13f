"""AR generation against transformers' greedy `generate`, sampling controls, and input errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import CarryoverError, generate, load_target
from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode.buckets import next_bucket, prompt_bucket
from carryover_jax.decode.generate import plan_lengths
from carryover_jax.decode.sampling import probs, sample
from tests.hf_models import hf_greedy
from tests.jitted import count_splits


def _prompts(seed=0, lens=(4, 13, 7)):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 97, size=n).tolist() for n in lens]


def test_greedy_matches_transformers_generate(tiny_model):
    target = load_target(tiny_model.path, tokenizer=False)
    prompts = _prompts()
    out = generate(target, prompts, max_new_tokens=20, stop_token_ids=[])  # one padded batch
    for p, r in zip(prompts, out):
        assert r.token_ids == hf_greedy(tiny_model.hf, p, 20, eos=None)
        assert r.stop_reason == "length"


def test_stop_tokens_and_per_row_lengths(tiny_llama):
    target = load_target(tiny_llama.path, tokenizer=False)
    prompts = _prompts(1)
    free = generate(target, prompts, max_new_tokens=24, stop_token_ids=[])
    # Stop on the 5th generated token of row 0: that row ends there (stop token included) and
    # the other rows are unaffected up to their own first occurrence of it.
    stop = free[0].token_ids[4]
    out = generate(target, prompts, max_new_tokens=[24, 3, 24], stop_token_ids=[stop])
    for i, (f, r) in enumerate(zip(free, out)):
        limit = 3 if i == 1 else 24
        ref = f.token_ids[:limit]
        if stop in ref:
            ref = ref[: ref.index(stop) + 1]
        assert r.token_ids == ref
        assert r.stop_reason == ("stop_token" if ref[-1] == stop else "length")
    assert out[0].token_ids[-1] == stop and len(out[0].token_ids) <= 5
    assert len(out[1].token_ids) <= 3
    # HF agrees on the stop behaviour for row 0
    assert out[0].token_ids == hf_greedy(tiny_llama.hf, prompts[0], 24, eos=[stop])


def test_sampling_is_seeded_and_top_k_1_is_greedy(tiny_qwen3):
    target = load_target(tiny_qwen3.path, tokenizer=False)
    prompts = _prompts(2)
    greedy = generate(target, prompts, max_new_tokens=12, stop_token_ids=[])
    a = generate(target, prompts, max_new_tokens=12, temperature=1.0, seed=7, stop_token_ids=[])
    b = generate(target, prompts, max_new_tokens=12, temperature=1.0, seed=7, stop_token_ids=[])
    c = generate(target, prompts, max_new_tokens=12, temperature=1.0, seed=8, stop_token_ids=[])
    k1 = generate(target, prompts, max_new_tokens=12, temperature=1.0, top_k=1, seed=9, stop_token_ids=[])
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    assert [r.token_ids for r in k1] == [r.token_ids for r in greedy]


def test_sampler_frequencies_follow_the_distribution():
    import jax

    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    keys = jax.random.split(jax.random.key(0), 20000)
    toks = jax.vmap(lambda k: sample(k, logits, jnp.asarray([1.0]))[0])(keys)
    freq = np.bincount(np.asarray(toks), minlength=4) / 20000
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.015)
    # top-p 0.8 keeps {0.5, 0.3} renormalised; top-k 3 drops the last
    p = np.asarray(probs(logits, jnp.asarray([1.0]), top_p=0.8))[0]
    np.testing.assert_allclose(p, [0.625, 0.375, 0, 0], atol=1e-6)
    p = np.asarray(probs(logits, jnp.asarray([1.0]), top_k=3))[0]
    np.testing.assert_allclose(p, np.array([0.5, 0.3, 0.15, 0]) / 0.95, atol=1e-6)
    p = np.asarray(probs(logits, jnp.asarray([0.0])))[0]
    np.testing.assert_allclose(p, [1, 0, 0, 0])


def _sorted_keep(x: np.ndarray, k: int, top_p: float) -> np.ndarray:
    """What top-k / top-p keep by sorting each row, in float64 numpy: the reference for `process_logits`."""
    keep = np.isfinite(x)
    for r, row in enumerate(x.astype(np.float64)):
        if k and k < row.size:
            keep[r] &= row >= np.sort(row)[::-1][k - 1]
        if top_p < 1.0:
            z = np.where(keep[r], row, -np.inf)
            p = np.exp(z - z.max())
            p /= p.sum()
            order = np.argsort(-z, kind="stable")
            before = np.cumsum(p[order]) - p[order]  # the mass of the values ranked above each
            keep[r] &= z >= z[order][before < top_p].min()
    return keep


def test_top_k_and_top_p_keep_what_a_sort_keeps():
    """`process_logits` finds its cuts by bisection over the values (no sort over the vocabulary); it keeps
    what sorting keeps: top-k the values >= the k-th largest, top-p the largest values until their mass reaches
    top_p (the first always), ties at a cut kept whole, on rows with masked (-inf) entries and k past the
    vocabulary, after a temperature, and inside jit."""
    from carryover_jax.decode.sampling import process_logits

    rng = np.random.default_rng(0)
    cut = jax.jit(process_logits, static_argnums=(2, 3))
    for trial in range(60):
        v = int(rng.integers(2, 400))
        x = (rng.normal(size=(3, v)) * rng.uniform(0.1, 8)).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x)  # ties
        if trial % 4 == 0:
            x[:, : v // 3] = -np.inf
        t = rng.uniform(0.3, 2.0, 3).astype(np.float32)
        k, top_p = int(rng.integers(1, v + 3)), float(rng.uniform(0.05, 0.99))
        for kk, pp in ((k, 1.0), (0, top_p), (k, top_p)):
            got = np.isfinite(np.asarray(cut(jnp.asarray(x), jnp.asarray(t), kk, pp)))
            np.testing.assert_array_equal(got, _sorted_keep(x / t[:, None], kk, pp), err_msg=f"{trial} {kk} {pp}")
    x = jnp.asarray([[2.0, 1.0, 1.0, 0.0, -jnp.inf]])  # masses ~0.53, 0.20, 0.20, 0.07, 0
    for k, top_p, kept in ((2, 1.0, 3), (1, 1.0, 1), (9, 1.0, 4), (0, 0.6, 3), (0, 0.5, 1), (0, 0.99, 4)):
        assert int(np.isfinite(np.asarray(process_logits(x, jnp.ones(1), k, top_p))).sum()) == kept, (k, top_p)


def test_prompt_longer_than_cache_is_one_clear_error(tiny_llama):
    target = load_target(tiny_llama.path, tokenizer=False)
    with pytest.raises(CarryoverError, match="needs .* cache slots"):
        generate(target, [list(range(3, 40))], max_new_tokens=8, max_len=32)
    with pytest.raises(CarryoverError, match="max_new_tokens"):
        generate(target, [[5, 6]], max_new_tokens=0)
    with pytest.raises(CarryoverError, match="no tokenizer"):
        generate(target, ["text needs a tokenizer"])


def test_user_cache_shorter_than_the_prompt_bucket(tiny_llama):
    """max_len between the prompt and its bucket: prefill uses the cache length."""
    target = load_target(tiny_llama.path, tokenizer=False)
    prompt = _prompts(5, (17,))
    ref = generate(target, prompt, max_new_tokens=5, stop_token_ids=[])
    out = generate(target, prompt, max_new_tokens=5, stop_token_ids=[], max_len=24)  # bucket would be 32
    assert out[0].token_ids == ref[0].token_ids


def test_prompt_buckets_between_powers_of_two(tiny_llama, monkeypatch):
    """Prompts pad to multiples of 16 below 128 tokens (of 32 below 256, ...), not to the next power of two: a
    70-token prompt prefills 80 rows, not 128, and decodes as transformers does; the cache keeps its size."""
    buckets = [prompt_bucket(n) for n in range(1, 2049)]
    assert buckets[0] == 16 and buckets == sorted(buckets)
    for n, b in enumerate(buckets, 1):
        assert n <= b <= next_bucket(n) and b - n < max(16, n / 4)
    for k in range(6, 11):  # four buckets an octave
        assert len({prompt_bucket(n) for n in range(2 ** k + 1, 2 ** (k + 1) + 1)}) == 4
    shapes = []
    prefill = ar.prefill
    monkeypatch.setattr(ar, "prefill", lambda cfg, params, tokens, *a, **k: shapes.append(tokens.shape) or
                        prefill(cfg, params, tokens, *a, **k))
    target = load_target(tiny_llama.path, tokenizer=False)
    prompts = _prompts(6, lens=(70, 66))
    out = generate(target, prompts, max_new_tokens=10, stop_token_ids=[])
    assert shapes == [(2, 80)]
    for p, r in zip(prompts, out):
        assert r.token_ids == hf_greedy(tiny_llama.hf, p, 10, eos=None)
    assert plan_lengths([70, 66], [10, 10], None, 4096) == (80, 128)


def test_a_prefill_in_sub_batches_matches_transformers(tiny_llama, monkeypatch):
    """A batch over `numerics.CPU_PASS_TOKENS` token rows prefills in sub-batches on CPU (here 5 prompts of a
    16-token bucket in 2 passes of 3 prompts, one of them padding): AR generation still equals transformers'
    greedy decoding row by row."""
    split = count_splits(monkeypatch, 48)
    target = load_target(tiny_llama.path, tokenizer=False)
    prompts = _prompts(2, lens=(4, 13, 7, 9, 16))  # a 16-token bucket: 80 rows, 2 passes of 3 prompts
    out = generate(target, prompts, max_new_tokens=12, stop_token_ids=[])
    assert split == [5]
    for p, r in zip(prompts, out):
        assert r.token_ids == hf_greedy(tiny_llama.hf, p, 12, eos=None)
