"""Speculative decoding: lossless against AR decoding, Carryover buffers, compile counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import generate, load_target
from carryover_jax.config import DrafterConfig
from carryover_jax.decode.generate import speculative_generate
from carryover_jax.models.drafter import init_drafter_params
from tests.jitted import count_splits, jit_apply


def _drafter(target, kind, layout, proposals=4, seed=0):
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout=layout, num_proposals=proposals, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0, 1), markov_rank=8 if kind == "markov" else None)
    return cfg, init_drafter_params(cfg, jax.random.key(seed))


def _prompts(seed=0, lens=(4, 13, 7, 9)):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 97, size=n).tolist() for n in lens]


@pytest.mark.parametrize("kind,layout", [("dflash", "zlab"), ("markov", "deepspec"), ("dflash", "deepspec")])
@pytest.mark.parametrize("carryover", [True, False])
def test_greedy_speculative_equals_ar(tiny_llama, kind, layout, carryover):
    target = load_target(tiny_llama.path, tokenizer=False)
    drafter = _drafter(target, kind, layout)
    prompts = _prompts()
    ref = generate(target, prompts, max_new_tokens=[17, 5, 23, 11], stop_token_ids=[])
    out, stats = speculative_generate(target, drafter, prompts, max_new_tokens=[17, 5, 23, 11], stop_token_ids=[],
                                      carryover=carryover)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    # every round commits its accepted drafts + 1 token; the first new token comes from the prefill
    committed = sum(len(r.token_ids) - 1 for r in ref)
    assert 0 < stats["rounds"] <= committed
    assert stats["tau"] == pytest.approx(committed / stats["rounds"], abs=1e-4)


def test_speculative_prefill_in_sub_batches_equals_ar(tiny_llama, monkeypatch):
    """Speculative decoding whose prefill runs in sub-batches on CPU (`numerics.sub_batched`: 2 passes of 3 prompts,
    one padded) still equals AR decoding token for token."""
    target = load_target(tiny_llama.path, tokenizer=False)
    drafter = _drafter(target, "dflash", "zlab")
    prompts = _prompts(3, lens=(4, 13, 7, 9, 16))
    ref = generate(target, prompts, max_new_tokens=15, stop_token_ids=[])
    split = count_splits(monkeypatch, 48)
    out, _ = speculative_generate(target, drafter, prompts, max_new_tokens=15, stop_token_ids=[])
    assert split == [5]
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]


def _state_after_prefill(target, drafter, prompts, max_new, P, carryover=True):
    from carryover_jax.decode import speculative as sp
    from carryover_jax.decode.generate import pad_batch

    sc = sp.SpecConfig(target=target.cfg, drafter=drafter[0], attend_carried=carryover)
    lens = [len(p) for p in prompts]
    state = sp.prefill(sc, target.params, drafter[1], jnp.asarray(pad_batch(prompts, 16)), jnp.asarray(lens, jnp.int32),
                       jnp.asarray(max_new, jnp.int32), jnp.zeros((len(prompts),)), jnp.asarray([-1] * 8, jnp.int32),
                       jax.random.key(0), max_len=96, out_size=64, max_rounds=64)
    return sc, state


def test_prefill_sizes_the_request_to_its_buffers(tiny_llama):
    """The verify chunk's cache write clamps at max_len (dynamic_update_slice: it would shift back over
    committed slots), so prefill refuses a cache some round would overrun. A random drafter is rejected
    every round, so its last round starts furthest, at prompt + max_new - 2: with exactly prompt + max_new
    + P - 1 slots (no write clamps) the rounds decode what AR decodes, one slot less is refused;
    `accepted` holds every round."""
    from carryover_jax.decode import speculative as sp
    from carryover_jax.decode.generate import pad_batch
    from carryover_jax.errors import RequestError

    target = load_target(tiny_llama.path, tokenizer=False)
    P, n, new = 4, 9, 12
    drafter = _drafter(target, "dflash", "zlab", proposals=P)
    prompt = _prompts(5, (n,))
    ref = generate(target, prompt, max_new_tokens=new, stop_token_ids=[])[0].token_ids
    sc = sp.SpecConfig(target=target.cfg, drafter=drafter[0])

    def prefill(max_len, **kw):
        return sp.prefill(sc, target.params, drafter[1], jnp.asarray(pad_batch(prompt, 16)), jnp.asarray([n]),
                          jnp.asarray([new]), jnp.zeros((1,)), jnp.asarray([-1] * 8, jnp.int32), jax.random.key(0),
                          max_len=max_len, out_size=16, **kw)

    need = n + new + P - 1
    s = sp.generate_loop(sc, target.params, drafter[1], prefill(need))
    rounds = int(s.rounds[0])
    assert np.asarray(s.out[0, : int(s.num_out[0])]).tolist() == ref
    assert rounds == new - 1  # every draft rejected: one token per round
    accepted = np.asarray(s.accepted[0])
    assert accepted.shape == (16,) and (accepted[:rounds] >= 0).all() and (accepted[rounds:] == -1).all()
    with pytest.raises(RequestError, match=f"row 0: prompt {n} \\+ max_new {new} \\+ {P} proposals - 1 needs {need} "
                                           f"cache slots, but max_len is {need - 1}"):
        prefill(need - 1)
    with pytest.raises(RequestError, match=f"max_rounds=10 cannot record {new - 1} rounds"):
        prefill(need, max_rounds=10)


def test_verify_commits_rolls_back_and_carries_exactly(tiny_qwen3):
    """Crafted proposals with per-row accepted counts 2, P and 0."""
    from carryover_jax.decode import speculative as sp
    from carryover_jax.models import drafter as D

    target = load_target(tiny_qwen3.path, tokenizer=False)
    P = 4
    drafter = _drafter(target, "dflash", "zlab", proposals=P)
    prompts = _prompts(1, (5, 8, 3))
    ar = generate(target, prompts, max_new_tokens=P + 2, stop_token_ids=[])
    sc, s = _state_after_prefill(target, drafter, prompts, [30, 30, 30], P)
    assert np.asarray(s.anchor).tolist() == [r.token_ids[0] for r in ar]
    want_a = [2, P, 0]
    props = []
    for r, a in zip(ar, want_a):
        truth = r.token_ids[1:P + 1]
        props.append([t if i < a else (t + 1) % 97 for i, t in enumerate(truth)])
    props = jnp.asarray(props, jnp.int32)
    lens0 = np.asarray(s.target_cache.lengths)
    anchor0 = np.asarray(s.anchor)  # verify_step donates the state
    s2 = sp.verify_step(sc, target.params, drafter[1], s, props, None)
    a = np.asarray(want_a)
    np.testing.assert_array_equal(np.asarray(s2.num_out), 1 + a + 1)
    for i, r in enumerate(ar):
        assert np.asarray(s2.out[i, : 2 + a[i]]).tolist() == r.token_ids[: 2 + a[i]]
    np.testing.assert_array_equal(np.asarray(s2.target_cache.lengths), lens0 + a + 1)
    np.testing.assert_array_equal(np.asarray(s2.draft_cache.lengths), lens0 + a + 1)
    np.testing.assert_array_equal(np.asarray(s2.rejected_count), P - a)
    # reference features: one cache-free forward over prompt + [anchor, proposals]
    for i, p in enumerate(prompts):
        seq = p + [int(anchor0[i])] + np.asarray(props[i]).tolist()
        _, _, taps = jit_apply(target.model)({"params": target.params}, jnp.asarray([seq]), tap_layers=(0, 1))
        feats = np.concatenate([np.asarray(t)[0] for t in taps], -1)
        verify = feats[len(p):]  # verify indices 0..P
        r = P - a[i]
        m = jit_apply(D.Drafter(drafter[0]))
        want = m({"params": drafter[1]}, jnp.asarray(verify[a[i] + 1:][None]), method=D.Drafter.fuse_carried)
        np.testing.assert_allclose(np.asarray(s2.carried[i, :r]), np.asarray(want[0]), atol=1e-5)
        # the drafter cache holds the projections of exactly the committed features (prompt + 0..a)
        committed = feats[: len(p) + a[i] + 1]
        rows = m({"params": drafter[1]}, jnp.asarray(committed[None]), method=D.Drafter.fuse)
        ks, _ = m({"params": drafter[1]}, rows, jnp.arange(len(committed))[None], method=D.Drafter.project)
        np.testing.assert_allclose(np.asarray(s2.draft_cache.k[0][i, :, : len(committed)]), np.asarray(ks[0][0]),
                                   atol=1e-5)


@pytest.mark.parametrize("carryover", [True, False])
def test_oracle_rounds_reproduce_ar_with_stops_and_limits(tiny_llama, carryover):
    """Host-driven rounds with proposals from the AR reference (with injected errors): long accepted
    prefixes, stop tokens inside accepted drafts, and length limits all commit exactly AR's tokens."""
    from carryover_jax.decode import speculative as sp

    target = load_target(tiny_llama.path, tokenizer=False)
    P = 5
    drafter = _drafter(target, "markov", "deepspec", proposals=P)
    prompts = _prompts(2, (6, 3, 11, 8))
    free = generate(target, prompts, max_new_tokens=40, stop_token_ids=[])
    stop = free[2].token_ids[12]
    max_new = [40, 9, 40, 40]
    ref = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=[stop])
    sc, s = _state_after_prefill(target, drafter, prompts, max_new, P, carryover)
    s = s.replace(stop_ids=jnp.asarray([stop] + [-1] * 7, jnp.int32))
    rng = np.random.default_rng(0)
    for _ in range(60):
        if bool(jnp.all(s.done)):
            break
        props = []
        for i, f in enumerate(free):
            n = int(s.num_out[i])
            truth = (f.token_ids + [0] * 64)[n: n + P]
            bad = rng.integers(0, P + 2)
            props.append([t if j < bad else (t + 3) % 97 for j, t in enumerate(truth)])
        _, _, s = sp.draft_step(sc, target.params, drafter[1], s)
        s = sp.verify_step(sc, target.params, drafter[1], s, jnp.asarray(props, jnp.int32), None)
    assert bool(jnp.all(s.done))
    for i, r in enumerate(ref):
        assert np.asarray(s.out[i, : int(s.num_out[i])]).tolist() == r.token_ids
    assert float(np.sum(np.asarray(s.num_out) - 1) / np.sum(np.asarray(s.rounds))) > 2.0


def test_rounds_compile_once(tiny_llama):
    """From cleared caches, two requests of one bucket compile prefill, the draft and the verify step
    exactly once each: every round of the first request reuses them (a state whose types drift between
    rounds would compile a second verify step inside the first request), and so does the second request."""
    from carryover_jax.decode import speculative as sp
    from tests.compile_counts import compiles_of, counting_compiles

    target = load_target(tiny_llama.path, tokenizer=False)
    drafter = _drafter(target, "dflash", "zlab")
    steps = {"prefill_jit": sp.prefill_jit, "_draft": sp.draft_parts, "_verify": sp.verify_step}
    after = []
    with counting_compiles() as counts:
        for seed, lens in ((3, (5, 9)), (4, (12, 2))):  # same bucket (16), different prompts
            _, stats = speculative_generate(target, drafter, _prompts(seed, lens), max_new_tokens=12,
                                            stop_token_ids=[], stepwise=True)
            assert stats["rounds"] >= 4  # several rounds per request: the reuse across rounds is exercised
            after.append({name: (f._cache_size(), compiles_of(counts, name)) for name, f in steps.items()})
    assert after[0] == after[1] == {name: (1, 1) for name in steps}


@pytest.mark.parametrize("greedy_drafts", [False, True])
def test_sampling_is_lossless(tmp_path_factory, greedy_drafts):
    """T = 1 on a tiny-vocabulary target: the distribution of the first three generated tokens from
    speculative decoding matches the exact target distribution (chi-square, fixed seed), with drafts
    sampled at T (DeepSpec) or taken by argmax (z-lab's point-mass drafts)."""
    from tests.lossless import sampled_pvalue, tiny_sampling_target

    target = tiny_sampling_target(tmp_path_factory.mktemp(f"v8{greedy_drafts}"))
    cfg = DrafterConfig.for_target(target.cfg, kind="markov", layout="deepspec", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0,), markov_rank=4)
    pvalue, stats = sampled_pvalue(target, (cfg, init_drafter_params(cfg, jax.random.key(1))),
                                   greedy_drafts=greedy_drafts)
    assert pvalue > 1e-3
    assert stats["tau"] > 1.05  # drafts are accepted often enough to exercise the acceptance path


@pytest.fixture(scope="module")
def trained_drafter(tiny_llama):
    """A Markov drafter trained for a few seconds on the tiny target's own greedy continuations."""
    from carryover_jax.config import TrainConfig
    from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

    target = load_target(tiny_llama.path, tokenizer=False)
    cfg, _ = _drafter(target, "markov", "deepspec", proposals=4)
    prompts = _prompts(11, tuple([6] * 16))
    outs = generate(target, prompts, max_new_tokens=26, stop_token_ids=[])
    ids = np.array([p + o.token_ids for p, o in zip(prompts, outs)], np.int32)
    mask = np.zeros_like(ids)
    mask[:, 6:] = 1
    tcfg = TrainConfig(num_anchors=16, steps=150, lr=1e-2, warmup_ratio=0.05)
    sc = step_config(tcfg, target.cfg, cfg)
    opt = make_optimizer(tcfg, tcfg.steps)
    state = init_state(init_drafter_params(cfg, jax.random.key(0)), opt, 0)
    step = jax.jit(train_step, static_argnums=(0, 1), donate_argnums=(2,))
    for i in range(tcfg.steps):
        rows = np.arange(8) + 8 * (i % 2)
        state, m = step(sc, opt, state, target.params, {"input_ids": ids[rows], "loss_mask": mask[rows]})
    return target, (cfg, jax.device_get(state.params)), prompts


@pytest.mark.parametrize("carryover", [True, False])
@pytest.mark.parametrize("batch", [1, 4])
def test_trained_drafter_is_lossless_and_accepts(trained_drafter, carryover, batch):
    target, drafter, train_prompts = trained_drafter
    prompts = train_prompts[:batch]  # in-distribution: the point is long accepted prefixes
    max_new = [30, 9, 24, 30][:batch]
    free = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=[])
    stop = free[0].token_ids[17]
    ref = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=[stop])
    out, stats = speculative_generate(target, drafter, prompts, max_new_tokens=max_new, stop_token_ids=[stop],
                                      carryover=carryover)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert stats["tau"] > 1.5  # the trained drafter's proposals really are accepted
