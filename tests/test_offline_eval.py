"""`carryover eval --offline` (eval/offline.py): the expected-rounds evaluator against its references.

- T = 0: the offline round counts equal real greedy speculative decoding, round for round (the engine's
  per-round `accepted`), on every prompt, for a trained DFlash and a trained Markov drafter (random
  drafters would accept nothing and the comparison would say little), with stop tokens and length limits;
- T > 0: expected rounds equal a slow per-round loop on a toy target, whose draft distributions come from
  the engine's own drafting (prefill + `draft_block_logits` at every round start) and whose expectation is
  a backward value recursion, not the forward occupancy;
- Carryover arms (`eval/replay.py`): the engine round for round at T = 0 (carried counts 0..P); at T = 1 the
  replay's draws of a round and of whole decodes have the engine's law given its output;
- the CLI: rollouts recorded once, reused from the cache and shared by every arm; an A/B on too few prompts refused.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from carryover_jax import load_target
from carryover_jax.config import DrafterConfig, TrainConfig
from carryover_jax.decode.generate import generate, speculative_generate
from carryover_jax.eval.offline import expected_rounds, greedy_rounds, score_rollouts
from carryover_jax.eval.run import DrafterEntry
from carryover_jax.loading import DraftModel
from carryover_jax.models.drafter import init_drafter_params


def _prompts(seed, lens):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 97, size=n).tolist() for n in lens]


def _train(target, kind, prompts, steps=150):
    """A drafter trained for a few seconds on the target's own greedy continuations of `prompts`, built with
    the Carryover embedding e_rej (random, so carried rows do change its drafts)."""
    from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout="deepspec" if kind == "markov" else "zlab",
                                   num_proposals=4, num_layers=1, mask_token_id=4, target_layer_ids=(0, 1),
                                   markov_rank=8 if kind == "markov" else None, carryover=True)
    outs = generate(target, prompts, max_new_tokens=26, stop_token_ids=[])
    ids = np.array([p + o.token_ids for p, o in zip(prompts, outs)], np.int32)
    mask = np.zeros_like(ids)
    mask[:, 6:] = 1
    tcfg = TrainConfig(num_anchors=16, steps=steps, lr=1e-2, warmup_ratio=0.05)
    sc = step_config(tcfg, target.cfg, cfg)
    opt = make_optimizer(tcfg, tcfg.steps)
    state = init_state(init_drafter_params(cfg, jax.random.key(0)), opt, 0)
    step = jax.jit(train_step, static_argnums=(0, 1), donate_argnums=(2,))
    for i in range(steps):
        rows = np.arange(8) + 8 * (i % 2)
        state, _ = step(sc, opt, state, target.params, {"input_ids": ids[rows], "loss_mask": mask[rows]})
    params = jax.device_get(state.params)
    params["e_rej"] = np.random.default_rng(5).standard_normal(cfg.hidden_size).astype(np.float32)
    return DraftModel(cfg, params)


def _engine_commits(accepted, num_tokens):
    """The engine's per-round accepted counts with its last round cut to the tokens left (what it commits)."""
    c, out = 1, []
    for a in accepted:
        n = min(a + 1, num_tokens - c)
        out.append(n - 1)
        c += n
    assert c == num_tokens
    return out


@pytest.mark.parametrize("kind", ["dflash", pytest.param("markov", marks=pytest.mark.heavy)])
def test_offline_rounds_equal_greedy_speculative_decoding(tiny_llama, kind):
    """Every arm against the engine round for round at T = 0, on every prompt: the expected-rounds scorer for
    the drafter without carried rows, and the replay (`eval/replay.py`) for the same drafter with them."""
    # > 30 s (3-4 min on the loaded 2-core machine): a random drafter accepts nothing here, so a drafter is
    # trained first; most of the time is compiling its train step, the engine and the offline scorers
    target = load_target(tiny_llama.path, tokenizer=False)
    train_prompts = _prompts(11, tuple([6] * 16))
    drafter = _train(target, kind, train_prompts)
    # in-distribution prompts (long accepted prefixes) and fresh ones; limits that cut rounds; a stop token
    # (past the trained 26 tokens the accepted counts spread over 0..P: every carried count is replayed)
    prompts = train_prompts + _prompts(3, (4, 9, 13, 7))
    max_new = [30, 9, 24, 17] + [40] * 12 + [30, 12, 5, 21]
    stop = generate(target, prompts[:1], max_new_tokens=30, stop_token_ids=[])[0].token_ids[17]
    ar = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=[stop])
    rollouts = [{"dataset": "d", "prompt": str(i), "temperature": 0.0, "seed": 0, "prompt_ids": p,
                 "tokens": list(r.token_ids)} for i, (p, r) in enumerate(zip(prompts, ar))]
    arms = [(DrafterEntry("x", "-"), drafter), (DrafterEntry("c", "-", carryover=True), drafter)]
    log = score_rollouts(target, arms, rollouts, batch_size=3, progress=False)
    assert len(log) == 2 * len(prompts)
    carried_counts, cut = set(), 0
    for entry, _ in arms:
        spec, stats = speculative_generate(target, drafter, prompts, max_new_tokens=max_new, stop_token_ids=[stop],
                                           carryover=entry.carryover)
        assert [r.token_ids for r in spec] == [r.token_ids for r in ar]
        assert stats["tau"] > 1.5  # the drafter's proposals really are accepted: the comparison has content
        recs = [rec for rec in log if rec["mode"] == entry.label]
        for rec, g, r in zip(recs, spec, rollouts):
            eng = g.stats["accepted_per_round"]
            want = _engine_commits(eng, len(r["tokens"]))
            assert rec["accepted"] == want and rec["rounds"] == len(eng)
            cut += bool(want) and want[-1] != eng[-1]
            if entry.carryover:  # the carried counts the next rounds saw: P - a
                carried_counts |= {drafter.cfg.num_proposals - a for a in eng[:-1]}
    assert cut > 0  # some last round was cut by the limit or the stop token
    assert carried_counts == set(range(drafter.cfg.num_proposals + 1))  # every carried count 0..P was replayed
    by_arm = {lab: [rec["accepted"] for rec in log if rec["mode"] == lab] for lab in ("x", "c")}
    assert by_arm["x"] != by_arm["c"]  # the carried rows changed some rounds: not the plain drafter's scorer


def _pattern_counts(patterns, other):
    """Two samples of hashable outcomes -> their counts over the union of outcomes, rare ones pooled."""
    keys = sorted(set(patterns) | set(other))
    a = np.array([patterns.count(k) for k in keys], float)
    b = np.array([other.count(k) for k in keys], float)
    rare = (a + b) < 20
    return (np.append(a[~rare], a[rare].sum()), np.append(b[~rare], b[rare].sum())) if rare.any() else (a, b)


def _strong_carry_drafter(target, kind):
    """A random drafter on the vocabulary-8 target whose drafts are peaked and move with its carried rows:
    a large e_rej, and a sharp own head (DFlash, a draft vocabulary of all 8 tokens) or a strong Markov bias."""
    kw = dict(markov_rank=4) if kind == "markov" else dict(draft_vocab=tuple(range(8)))
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout="deepspec", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0,), carryover=True, **kw)
    params = init_drafter_params(cfg, jax.random.key(2))
    rng = np.random.default_rng(7)
    params["e_rej"] = 10 * rng.standard_normal(cfg.hidden_size).astype(np.float32)
    if kind == "markov":
        params["markov_head"] = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(np.float32),
                                             params["markov_head"])
        params["norm"] = jax.tree.map(lambda x: 10 * x, params["norm"])
    else:
        params["lm_head"] = jax.tree.map(lambda x: 10 * x, params["lm_head"])
    return DraftModel(cfg, params)


@pytest.mark.parametrize("kind", ["dflash", "markov"])
def test_carryover_replay_at_t1_draws_the_engines_rounds(tmp_path_factory, kind):
    """T = 1 on a vocabulary of 8: the engine's own rounds of 2,000 sampled Carryover decodings against the
    replay's draws on those same outputs (each a target sample, the engine being lossless): the same law of the
    accepted counts round by round (chi-square, two samples). DFlash: the replay without carried rows on the
    same outputs is refused by the same test, so it can see what the carried rows do."""
    from scipy.stats import chi2_contingency

    from carryover_jax.eval.offline import target_pass
    from carryover_jax.eval.replay import replay_rollouts
    from tests.lossless import PROMPT, tiny_sampling_target

    target = tiny_sampling_target(tmp_path_factory.mktemp(f"v8replay{kind}"))
    drafter = _strong_carry_drafter(target, kind)
    n, G = 2000, 7
    spec, _ = speculative_generate(target, drafter, [PROMPT] * n, max_new_tokens=G, temperature=1.0,
                                   stop_token_ids=[], seed=5, carryover=True)
    engine = [tuple(_engine_commits(g.stats["accepted_per_round"], len(g.token_ids))) for g in spec]
    rollouts = [{"dataset": "d", "prompt": str(i), "temperature": 1.0, "seed": 0, "prompt_ids": PROMPT,
                 "tokens": list(g.token_ids)} for i, g in enumerate(spec)]
    log = score_rollouts(target, [(DrafterEntry("c", "-", carryover=True), drafter)], rollouts, batch_size=1000,
                         progress=False)
    replayed = [tuple(r["accepted"]) for r in log]
    assert all(sum(a + 1 for a in p) == G - 1 for p in replayed)  # every draw commits its rollout
    a, b = _pattern_counts(engine, replayed)
    assert len(a) > 15 and chi2_contingency(np.stack([a, b]))[1] > 1e-3  # 29 patterns here
    if kind == "dflash":
        ids = np.zeros((n, 16), np.int32)
        ids[:, : len(PROMPT) + G] = [PROMPT + r["tokens"] for r in rollouts]
        _, py, last = target_pass(target.cfg, (0,), True, 0, 1.0, 1024, target.params, jnp.asarray(ids),
                                  jnp.float32(1.0))
        off = replay_rollouts(target, drafter, DrafterEntry("o", "-"), rollouts, temperature=1.0, p_roll=py,
                              h_roll=last)
        a, b = _pattern_counts(engine, [tuple(p) for p in off])
        assert chi2_contingency(np.stack([a, b]))[1] < 1e-4  # 2e-8 here


def test_replay_round_draws_the_engines_acceptance_and_rejected_draft(tmp_path_factory):
    """One round at T = 1 on a vocabulary of 8, 4,000 rows of one prompt: the engine's own (accepted count,
    first rejected draft) against the replay's draw of them given each row's emitted tokens (same law, chi-square
    two samples). The rejected draft follows max(q - p, 0): far from q here, so a draw from q would fail."""
    from scipy.stats import chi2_contingency

    from carryover_jax.decode import speculative as sp
    from carryover_jax.decode.generate import MAX_STOP_IDS
    from carryover_jax.eval import replay as R
    from carryover_jax.eval.offline import target_pass
    from tests.lossless import PROMPT, tiny_sampling_target

    target = tiny_sampling_target(tmp_path_factory.mktemp("v8round"))
    cfg = DrafterConfig.for_target(target.cfg, kind="dflash", layout="deepspec", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0,), carryover=True, draft_vocab=tuple(range(8)))
    params = init_drafter_params(cfg, jax.random.key(2))
    params["lm_head"] = jax.tree.map(lambda x: 4.0 * x, params["lm_head"])  # drafts neither flat nor one-hot
    drafter = DraftModel(cfg, params)
    tp, dp, P, n, G = target.params, drafter.params, 3, 4000, 5
    sc = sp.SpecConfig(target=target.cfg, drafter=cfg, attend_carried=True, sampling=True)
    s = sp.prefill(sc, tp, dp, jnp.asarray([PROMPT + [0] * 12] * n, jnp.int32), jnp.full((n,), len(PROMPT)),
                   jnp.full((n,), G), jnp.ones((n,), jnp.float32), jnp.full((MAX_STOP_IDS,), -1, jnp.int32),
                   jax.random.key(3), max_len=32, out_size=8, max_rounds=8)
    toks, q, s = sp.draft_step(sc, tp, dp, s)
    s = sp.generate_loop(sc, tp, dp, sp.verify_step(sc, tp, dp, s, toks, q))
    toks, q, a, out = map(np.asarray, jax.device_get((toks, q, s.accepted[:, 0], s.out[:, :G])))
    engine = [(int(x), int(t[x]) if x < P else -1) for x, t in zip(a, toks)]
    rows = [{"dataset": "d", "prompt": str(i), "seed": 0, "prompt_ids": PROMPT, "tokens": o.tolist()}
            for i, o in enumerate(out)]
    ids = np.zeros((n, 16), np.int32)
    ids[:, : len(PROMPT) + G] = [PROMPT + r["tokens"] for r in rows]
    _, py, last = target_pass(target.cfg, (0,), True, 0, 1.0, 1024, tp, jnp.asarray(ids), jnp.float32(1.0))
    rsc, rs, roll, lens, p_roll, h_roll, keys = R.replay_setup(target, drafter, DrafterEntry("c", "-", True), rows,
                                                               temperature=1.0, p_roll=py, h_roll=last)
    first_round = jax.jit(lambda st, *xs: R._sampled_round(rsc, tp, dp, st, *R.round_inputs(rsc, st, *xs)))
    rtoks, ra, _ = map(np.asarray, jax.device_get(first_round(rs, roll, lens, p_roll, h_roll, keys)))
    replayed = [(int(x), int(t[x]) if x < P else -1) for x, t in zip(ra, rtoks)]
    ea, rb = _pattern_counts(engine, replayed)
    assert len(ea) > 12 and chi2_contingency(np.stack([ea, rb]))[1] > 1e-3
    # power: rows of the commonest anchor share q; their rejected first drafts are far from a draw from q
    anchor = np.bincount(out[:, 0]).argmax()
    pick = (out[:, 0] == anchor) & (a == 0)
    rejected = np.bincount(toks[pick, 0], minlength=8) / pick.sum()
    q1 = q[np.argmax(out[:, 0] == anchor), 0]
    assert pick.sum() > 80 and 0.5 * np.abs(rejected - q1).sum() > 0.3  # 104 rows, 0.64 here


@functools.partial(jax.jit, static_argnums=0)
def _cache_free_logits(cfg, params, ids):
    from carryover_jax.models.target import TargetLM

    return TargetLM(cfg).apply({"params": params}, ids)[0]


def _slow_expected_rounds(target, drafter, prompt, tokens, T):
    """Per round start c: the engine's own drafting (prefill of prompt + y_1..y_{c-1}, anchor y_c) gives q,
    a cache-free target forward gives p; E[rounds] by the backward recursion V(c) = 1 + Σ_k P(first
    rejection at slot k) V(c + k) + P(all accepted) V(c + P + 1), V(c >= G) = 0."""
    from carryover_jax.decode import drafting as D
    from carryover_jax.decode import speculative as sp
    from carryover_jax.decode.sampling import probs
    from carryover_jax.models.drafter import frozen_from_target

    dc, params = drafter.cfg, drafter.params
    P, G, L = dc.num_proposals, len(tokens), len(prompt)
    sc = sp.SpecConfig(target=target.cfg, drafter=dc, attend_carried=False, sampling=True)
    frozen = frozen_from_target(target.params, target.cfg)
    seq = prompt + tokens
    width = 32  # every prefill padded to one shape (right padding; the prompt length says what is real)
    draft = jax.jit(D.draft_block_logits, static_argnums=0)
    padded = jnp.asarray([seq + [0] * (width - len(seq))], jnp.int32)  # causal: the padding changes nothing before it
    logits = _cache_free_logits(target.cfg, target.params, padded)[0]  # [width, V]
    p_all = np.asarray(probs(logits, jnp.full(logits.shape[:1], T)))
    acc = {}
    for c in range(1, G):
        prefix = seq[: L + c - 1]
        toks = jnp.asarray([prefix + [0] * (width - len(prefix))], jnp.int32)
        s = sp.prefill(sc, target.params, params, toks, jnp.asarray([len(prefix)]), jnp.asarray([G]),
                       jnp.asarray([T], jnp.float32), jnp.asarray([-1]), jax.random.key(0),
                       max_len=64, out_size=16, max_rounds=16)
        z = draft(dc, params, frozen, s.draft_cache, jnp.asarray([seq[L + c - 1]], jnp.int32))[0]  # [P, V]
        labels = seq[L + c: L + c + P]
        k_max = min(P, G - c)
        if dc.markov_rank:  # slot k's previous token: the anchor, then the rollout's
            prev = [seq[L + c - 1]] + labels[: k_max - 1]
            z = z[:k_max] + D.markov_bias(dc, params, jnp.asarray([prev]))[0]
        q = np.asarray(probs(z[:k_max], jnp.full((k_max,), T)))
        for k in range(1, k_max + 1):
            y = labels[k - 1]
            acc[c, k] = min(1.0, float(q[k - 1, y]) / float(p_all[L + c + k - 2, y]))
    value = {}
    for c in range(G - 1, 0, -1):
        v, alive = 1.0, 1.0
        for k in range(1, P + 1):
            if c + k > G:
                alive = 0.0
                break
            a = acc[c, k]
            v += alive * (1 - a) * value.get(c + k, 0.0)
            alive *= a
        v += alive * value.get(c + P + 1, 0.0)
        value[c] = v
    return value[1], acc


@pytest.mark.parametrize("kind", ["dflash", "markov"])
def test_expected_rounds_equal_a_slow_per_round_loop_at_t1(tmp_path_factory, kind):
    from tests.lossless import tiny_sampling_target

    target = tiny_sampling_target(tmp_path_factory.mktemp(f"v8{kind}"))
    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout="deepspec", num_proposals=3, num_layers=1,
                                   mask_token_id=4, target_layer_ids=(0,), markov_rank=4 if kind == "markov" else None)
    drafter = DraftModel(cfg, init_drafter_params(cfg, jax.random.key(1)))
    prompts = [[3, 5, 6, 1], [7, 3, 3], [1, 2, 5, 6, 7, 3]]
    T = 1.0
    rollouts = []
    for s in range(2):  # two sampled rollouts of each prompt
        outs = generate(target, prompts, max_new_tokens=[10, 7, 9], temperature=T, seed=s, stop_token_ids=[])
        rollouts += [{"dataset": "d", "prompt": str(i), "temperature": T, "seed": s, "prompt_ids": p,
                      "tokens": list(o.token_ids)} for i, (p, o) in enumerate(zip(prompts, outs))]
    log = score_rollouts(target, [(DrafterEntry("x", "-"), drafter)], rollouts, batch_size=4, progress=False)
    partial = 0
    for rec, r in zip(log, rollouts):
        want, acc = _slow_expected_rounds(target, drafter, r["prompt_ids"], r["tokens"], T)
        assert rec["rounds"] == pytest.approx(want, rel=1e-4)
        partial += sum(0.01 < a < 0.99 for a in acc.values())
        assert 1 <= rec["rounds"] <= len(r["tokens"]) - 1
    assert partial > 10  # acceptances strictly between 0 and 1: the expectation is exercised


def test_rounds_from_acceptances_by_hand():
    # G = 7 tokens, P = 2: starts c = 1..6. Greedy: from 1 accept 2 -> bonus -> start 4; from 4 accept 1 -> 6;
    # from 6 the one token left
    acc = np.array([[1, 1], [0, 0], [0, 0], [1, 0], [0, 0], [1, 0]], float)
    assert greedy_rounds(acc, 7) == [2, 1, 0]
    assert expected_rounds(acc, 7) == 3.0
    # all accepted in one round cut by the end: one round
    assert greedy_rounds(np.ones((2, 4)), 3) == [1] and expected_rounds(np.ones((2, 4)), 3) == 1.0
    # a single acceptance probability 1/2 at the first slot of start 1 (G = 3, P = 1): rounds 1 or 2
    assert expected_rounds(np.array([[0.5], [0.0]]), 3) == pytest.approx(0.5 * 1 + 0.5 * 2)
    assert expected_rounds(np.zeros((0, 3)), 1) == 0.0


def test_offline_cli_caches_rollouts_and_scores_carryover_arms(tok_target, tmp_path, capsys):
    from carryover_jax.cli import main
    from tests.test_eval import _save_drafter

    target = load_target(tok_target, tokenizer=False)
    base = _save_drafter(target, tmp_path / "base", carryover=False, seed=1)
    carry = _save_drafter(target, tmp_path / "carry", carryover=True, seed=2)
    prompts = tmp_path / "p.jsonl"
    n = 10  # paired.MIN_PROMPTS: an A/B on fewer is refused
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"w{5 + (i * 7 + j) % 60}" for j in range(4 + i))})
                               + "\n" for i in range(n)))
    cache = tmp_path / "rollouts"
    args = ["eval", "--target", str(tok_target), "--offline", "--rollouts", str(cache), "--drafter", f"a={base}",
            "--drafter", f"b={carry}", "--drafter", f"c={carry}:carryover", "--datasets", f"mine={prompts}",
            "--prompts-per-dataset", str(n), "--max-new-tokens", "10", "--temperatures", "0", "1", "--seeds", "2",
            "--quiet"]
    assert main(args + ["--out", str(tmp_path / "o1")]) == 0
    lines = (cache / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == n * 3  # every prompt at T = 0 and at 2 seeds of T = 1, shared by the 3 arms
    res = json.loads((tmp_path / "o1" / "results.json").read_text())
    assert res["offline"] and len(res["log"]) == 3 * 3 * n
    t0 = res["summary"]["temperatures"]["0"]
    assert set(t0["datasets"]["all"]) == {"a", "b", "c"} and t0["paired"]["pairs"][0]["label"] == "b"
    for T in ("0", "1"):  # the Carryover arm's replayed rounds commit every rollout's tokens
        recs = [r for r in res["log"] if r["mode"] == "c" and r["temperature"] == float(T)]
        assert len(recs) == n * (1 if T == "0" else 2)
        assert all(sum(a + 1 for a in r["accepted"]) == r["new_tokens"] - 1 for r in recs)
    md = (tmp_path / "o1" / "report.md").read_text()
    assert "# carryover eval --offline" in md and "| b vs a | **all** | 0 | 10 x 1 |" in md
    assert "carried rows ON (hidden): rounds replayed" in md
    acc = [x for r in res["log"] if r["mode"] == "a" and r["temperature"] == 0 for x in r["accepted"]]
    P = next(d["num_proposals"] for d in res["drafters"] if d["label"] == "a")
    pct = lambda k: 100 * sum(x == k for x in acc) / len(acc)
    slot1 = sum(x >= 1 for x in acc) / len(acc)  # the greedy rounds' acceptance table, counted here from the log
    assert (f"| a | {len(acc)} | {sum(acc) / len(acc):.3f} | {pct(0):.1f}% | {pct(P):.1f}% | {slot1:.3f} |") in md
    # the second run records nothing new and scores the same rollouts to the same numbers, replays included
    assert main(args + ["--out", str(tmp_path / "o2")]) == 0
    assert (cache / "rollouts.jsonl").read_text().splitlines() == lines
    res2 = json.loads((tmp_path / "o2" / "results.json").read_text())
    assert [r["rounds"] for r in res2["log"]] == [r["rounds"] for r in res["log"]]
    capsys.readouterr()
    i = args.index("--prompts-per-dataset")
    few = args[:i] + ["--prompts-per-dataset", "4"] + args[i + 2:]
    assert main(few + ["--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert err == ("carryover eval: error: 3 arms on 4 prompts per dataset x 1 dataset: 4 prompts cannot resolve a "
                   "comparison of arms: a paired 95% interval needs >= 10 prompts (carryover_jax/eval/paired.py)\n")
    assert not (tmp_path / "o3").exists()


@pytest.fixture(scope="module")
def tok_target(tiny_llama, tmp_path_factory):
    """The tiny Llama with test_eval's word-level tokenizer (`w5 w6 ...` = ids 5, 6, ...; MASK row 4)."""
    import shutil

    from tests.hf_models import add_word_tokenizer

    folder = tmp_path_factory.mktemp("offline_target") / "target"
    shutil.copytree(tiny_llama.path, folder)
    add_word_tokenizer(folder)
    return folder


def test_recorded_rollouts_are_batch_one_greedy_decoding(tiny_llama, tmp_path):
    """`record_rollouts` sorts the prompts by length into batches and fills the last batch with copies: every
    rollout still equals batch-1 greedy decoding of its own prompt, in the items' order, and the cache holds one row
    per item (none of the fill)."""
    from carryover_jax.eval.offline import RolloutCache, record_rollouts
    from carryover_jax.eval.run import Item

    target = load_target(tiny_llama.path, tokenizer=False)
    rng = np.random.default_rng(5)
    items = [Item("d", str(i), tuple(rng.integers(3, 97, size=n).tolist())) for i, n in enumerate((9, 3, 30, 5, 17))]
    rolls = record_rollouts(target, items, max_new_tokens=6, temperatures=[0.0], seeds=1, stop_token_ids=[],
                            cache=tmp_path / "r", batch_size=2, progress=False)  # batches (3, 5) (9, 17) (30, 30)
    assert [r["prompt"] for r in rolls] == [it.id for it in items]
    for it, r in zip(items, rolls):
        assert r["tokens"] == generate(target, [list(it.ids)], max_new_tokens=6, stop_token_ids=[])[0].token_ids
    assert len(RolloutCache(tmp_path / "r").rows) == len((tmp_path / "r" / "rollouts.jsonl").read_text().splitlines()) \
        == len(items)
