"""The screened greedy head (`models/greedy_head.py`, `cpu_products.cc` `HeadArgmax`): the argmax of the float32 head
as the float32 kernel computes its logits, against that head's own argmax and float64 numpy, where bf16 rounding
reorders the approximate logits, at exact ties and one-ulp gaps, for non-finite rows; and greedy decoding through it
(AR and speculative, a tied target) against decoding through the full head."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import generate, load_target
from carryover_jax.config import DrafterConfig
from carryover_jax.decode import generate as G
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.models import cpu_products as cp
from carryover_jax.models import greedy_head
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.models.greedy_head import greedy_tokens, head_screen
from carryover_jax.models.target import TargetLM
from carryover_jax.numerics import Numerics, argmax

pytestmark = pytest.mark.skipif(not cp.head_argmax_available(), reason="needs the CPU kernel with avx512_bf16")


def _screened(x, e):
    e = jnp.asarray(e, jnp.float32)
    norms = jnp.sqrt(jnp.sum(e * e, axis=-1))
    return np.asarray(jax.jit(cp.head_argmax)(jnp.asarray(x, jnp.float32), e, e.astype(jnp.bfloat16), norms))


def _logits(x, e):
    return np.asarray(jax.jit(cp.products, static_argnums=2)(jnp.asarray(x), jnp.asarray(e), "nk"))


def _full(x, e):
    return np.asarray(jax.jit(lambda x, e: argmax(cp.products(x, e, "nk")))(jnp.asarray(x, jnp.float32),
                                                                           jnp.asarray(e, jnp.float32)))


@pytest.mark.parametrize("k,n", [(576, 3001), (70, 517), (16, 1)])
def test_screened_argmax_is_the_float32_heads_for_any_row_count(k, n):
    rng = np.random.default_rng(k)
    e = rng.normal(size=(n, k)).astype(np.float32) * 0.05
    for rows in (1, 3, 8, 11):
        x = rng.normal(size=(rows, k)).astype(np.float32) * 3
        got = _screened(x, e)
        assert got.tolist() == _full(x, e).tolist()
        assert got.tolist() == np.argmax(x.astype(np.float64) @ e.T.astype(np.float64), axis=1).tolist()


def test_near_ties_in_every_block_piece_and_chunk_of_the_head():
    """The kernel reads the copy's logits in pieces of 2,048 ids, threshold chunks per thread and blocks of 256: near
    ties (logits closer than the bound) planted at their edges, in the last partial block and at id 0 all become
    candidates, and the float32 logits choose among them as the full head's argmax does."""
    rng = np.random.default_rng(2)
    k, n = 64, 10_001
    e = rng.normal(size=(n, k)).astype(np.float32) * 0.05
    x = rng.normal(size=(4, k)).astype(np.float32)
    ids = [0, 255, 256, 2047, 2048, 4095, 5119, 5120, 5121, 7000, 9983, 10_000]
    for row in range(4):
        xs = x[row:row + 1]
        for i in ids:  # the same direction, scaled within ~1e-5 of each other: below the bound
            e[i] = (xs[0] / np.linalg.norm(xs[0]) * (1 + 1e-5 * rng.normal())).astype(np.float32)
        got, full = _screened(xs, e), _full(xs, e)
        assert got.tolist() == full.tolist() and full[0] in ids
    e[rng.permutation(ids)[:3]] = e[ids[-1]]  # exact ties with the last id: the first of them wins
    assert _screened(x, e).tolist() == _full(x, e).tolist()


def test_bf16_rounding_that_reorders_the_logits_by_4_does_not_move_the_token():
    """x and row 0 lie just below bf16 rounding midpoints (both round down: its approximate logit is 2^-7 under its
    float32 one, the most the rounding allows); row 1's entries round up, so its bf16 logit leads row 0's by 4 where
    its float32 logit trails by 0.5. A bound short of ~0.6 of the rounding's would drop row 0 from the candidates."""
    k = 576
    below = np.float32(1 + 2 ** -8 - 2 ** -20)  # rounds down to 1 in bf16
    above = np.float32(1 + 2 ** -8 + 2 ** -20)  # rounds up to 1 + 2^-7
    x = np.full((1, k), below, np.float32)
    e = np.stack([np.full(k, below), np.r_[np.full(k - 1, above), 0.5], np.full(k, 0.25)]).astype(np.float32)
    exact = x.astype(np.float64) @ e.T.astype(np.float64)
    approx = np.asarray(jnp.dot(jnp.asarray(x, jnp.bfloat16), jnp.asarray(e, jnp.bfloat16).T,
                                preferred_element_type=jnp.float32))
    assert exact[0, 0] - exact[0, 1] > 0.4 and approx[0, 1] - approx[0, 0] > 3.5  # the adversary is real
    assert _screened(x, e).tolist() == [0] == _full(x, e).tolist()


def test_ties_go_to_the_first_id_and_a_few_ulps_decide():
    rng = np.random.default_rng(1)
    k, n = 64, 400
    e = rng.normal(size=(n, k)).astype(np.float32) * 0.05
    x = rng.normal(size=(2, k)).astype(np.float32)
    best = int(np.argmax(x[0] @ e.T))
    e[[37, 300]] = e[best] * 1.5  # an exact tie, above every other row: the first id wins
    e[390] = e[best] * 1.5
    top = float(_logits(x, e)[0, 37])
    e[390, 0] += np.float32(np.sign(x[0, 0]) * 2 * np.spacing(np.float32(top)) / abs(x[0, 0]))  # ~2 ulps more
    assert 0 < _logits(x, e)[0, 390] - _logits(x, e)[0, 37] <= 4 * np.spacing(np.float32(top))
    full = _full(x, e)
    assert full[0] == 390 and _screened(x, e).tolist() == full.tolist()
    e[390] = e[37]
    assert _screened(x, e)[0] == 37 == _full(x, e)[0]


def test_a_non_finite_row_is_left_to_the_full_head(tiny_qwen3):
    target = load_target(tiny_qwen3.path, tokenizer=False)
    screen = head_screen(target.cfg, target.params)
    assert screen is not None
    h = np.random.default_rng(0).normal(size=(3, target.cfg.hidden_size)).astype(np.float32)
    h[1, 4] = np.inf
    e = target.params["embed_tokens"]["embedding"]
    assert np.asarray(cp.head_argmax(jnp.asarray(h), e, screen.bits, screen.norms)).tolist()[1] == -1
    full = argmax(TargetLM(target.cfg).apply({"params": target.params}, jnp.asarray(h), method=TargetLM.head))
    got = greedy_tokens(target.cfg, target.params, screen, jnp.asarray(h))
    assert np.asarray(got).tolist() == np.asarray(full).tolist()
    bad = np.asarray(e).copy()
    bad[7, 3] = np.nan  # a non-finite norm: every row is left to the full head
    bad = jnp.asarray(bad)
    assert np.asarray(cp.head_argmax(jnp.asarray(h[[0, 2]]), bad, bad.astype(jnp.bfloat16),
                                     jnp.sqrt(jnp.sum(bad * bad, axis=-1)))).tolist() == [-1, -1]


def test_the_screen_applies_to_a_float32_tied_head_only(tiny_qwen3, tiny_llama):
    assert load_target(tiny_qwen3.path, tokenizer=False, dtype="bfloat16").greedy_screen() is None
    assert load_target(tiny_llama.path, tokenizer=False).greedy_screen() is None  # an untied head
    target = load_target(tiny_qwen3.path, tokenizer=False)
    first = target.greedy_screen()
    assert first is not None and target.greedy_screen() is first  # built once
    target.params = jax.tree.map(lambda x: x * 2, target.params)  # new params: a new screen, of their head
    again = target.greedy_screen()
    assert again is not first
    assert np.array_equal(np.asarray(again.norms), 2 * np.asarray(first.norms))
    target.cfg = target.cfg.with_numerics(Numerics.for_platform("cpu", dtype="bfloat16"))
    assert target.greedy_screen() is None  # a config the screen does not serve


def _prompts(lens):
    rng = np.random.default_rng(0)
    return [rng.integers(3, 97, size=n).tolist() for n in lens]


@pytest.mark.parametrize("lens, max_rows, served", [((9,), None, {1, 4}), ((4, 13, 7), None, {3, 12}),
                                                     ((4, 13, 7), 8, {3})])
def test_greedy_decoding_through_the_screen_equals_the_full_head(tiny_qwen3, monkeypatch, lens, max_rows, served):
    """AR and speculative decoding give the same tokens with and without the screen, and speculative equals AR. The
    screen serves the AR steps (1 and 3 rows) and the verifications (4 rows at batch 1; 12 at batch 3, two passes of
    the kernel), and with `MAX_ROWS` below 12 the batch-3 verification takes the full head (the kernel's traced row
    counts show which)."""
    if max_rows is not None:
        monkeypatch.setattr(greedy_head, "MAX_ROWS", max_rows)
    target = load_target(tiny_qwen3.path, tokenizer=False)
    cfg = DrafterConfig.for_target(target.cfg, kind="dflash", layout="zlab", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0, 1))
    drafter = (cfg, init_drafter_params(cfg, jax.random.key(0)))
    prompts, new = _prompts(lens), [21, 6, 15][:len(lens)]
    rows, kernel = set(), cp.head_argmax

    def counted(x, *args):
        rows.add(x.shape[0])
        return kernel(x, *args)

    monkeypatch.setattr(cp, "head_argmax", counted)
    jax.clear_caches()  # trace the loops here, so the kernel's calls are seen
    runs = {}
    for arm in ("screen", "full"):
        if arm == "full":
            monkeypatch.setattr(G, "_screen", lambda target: None)
        ar = [g.token_ids for g in generate(target, prompts, max_new_tokens=new, stop_token_ids=[])]
        sp, _ = speculative_generate(target, drafter, prompts, max_new_tokens=new, stop_token_ids=[])
        runs[arm] = (ar, [g.token_ids for g in sp])
        if arm == "screen":
            assert rows == served
    assert runs["screen"] == runs["full"]
    assert runs["screen"][0] == runs["screen"][1]
