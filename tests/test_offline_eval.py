"""`carryover eval --offline` (eval/offline.py): the expected-rounds evaluator against its references.

- T = 0: the offline round counts equal real greedy speculative decoding, round for round (the engine's
  per-round `accepted`), on every prompt, for a trained DFlash and a trained Markov drafter (random
  drafters would accept nothing and the comparison would say little), with stop tokens and length limits;
- T > 0: expected rounds equal a slow per-round loop on a toy target, whose draft distributions come from
  the engine's own drafting (prefill + `draft_block_logits` at every round start) and whose expectation is
  a backward value recursion, not the forward occupancy;
- the CLI: rollouts recorded once and reused from the cache, Carryover arms refused in one line.
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
    """A drafter trained for a few seconds on the target's own greedy continuations of `prompts`."""
    from carryover_jax.train.step import init_state, make_optimizer, step_config, train_step

    cfg = DrafterConfig.for_target(target.cfg, kind=kind, layout="deepspec" if kind == "markov" else "zlab",
                                   num_proposals=4, num_layers=1, mask_token_id=4, target_layer_ids=(0, 1),
                                   markov_rank=8 if kind == "markov" else None)
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
    return DraftModel(cfg, jax.device_get(state.params))


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
    # > 30 s (2-2.5 min on the loaded 2-core machine): a random drafter accepts nothing here, so a drafter is
    # trained first; most of the time is compiling its train step, the engine and the offline scorer
    target = load_target(tiny_llama.path, tokenizer=False)
    train_prompts = _prompts(11, tuple([6] * 16))
    drafter = _train(target, kind, train_prompts)
    # in-distribution prompts (long accepted prefixes) and fresh ones; limits that cut rounds; a stop token
    prompts = train_prompts[:4] + _prompts(3, (4, 9, 13, 7))
    max_new = [30, 9, 24, 17, 30, 12, 5, 21]
    stop = generate(target, prompts[:1], max_new_tokens=30, stop_token_ids=[])[0].token_ids[17]
    ar = generate(target, prompts, max_new_tokens=max_new, stop_token_ids=[stop])
    spec, stats = speculative_generate(target, drafter, prompts, max_new_tokens=max_new, stop_token_ids=[stop],
                                       carryover=False)
    assert [r.token_ids for r in spec] == [r.token_ids for r in ar]
    assert stats["tau"] > 1.5  # the drafter's proposals really are accepted: the comparison has content
    rollouts = [{"dataset": "d", "prompt": str(i), "temperature": 0.0, "seed": 0, "prompt_ids": p,
                 "tokens": list(r.token_ids)} for i, (p, r) in enumerate(zip(prompts, ar))]
    log = score_rollouts(target, [(DrafterEntry("x", "-"), drafter)], rollouts, batch_size=3, progress=False)
    assert len(log) == len(prompts)
    cut = 0
    for rec, g, r in zip(log, spec, rollouts):
        eng = g.stats["accepted_per_round"]
        want = _engine_commits(eng, len(r["tokens"]))
        assert rec["accepted"] == want and rec["rounds"] == len(eng)
        cut += bool(want) and want[-1] != eng[-1]
    assert cut > 0  # some last round was cut by the limit or the stop token


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


def test_offline_cli_caches_rollouts_and_refuses_carryover_arms(tok_target, tmp_path, capsys):
    from carryover_jax.cli import main
    from tests.test_eval import _save_drafter

    target = load_target(tok_target, tokenizer=False)
    base = _save_drafter(target, tmp_path / "base", carryover=False, seed=1)
    other = _save_drafter(target, tmp_path / "other", carryover=False, seed=2)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"w{5 + (i * 7 + j) % 60}" for j in range(4 + i))})
                               + "\n" for i in range(5)))
    cache = tmp_path / "rollouts"
    args = ["eval", "--target", str(tok_target), "--offline", "--rollouts", str(cache), "--drafter", f"a={base}",
            "--drafter", f"b={other}", "--datasets", f"mine={prompts}", "--max-new-tokens", "10",
            "--temperatures", "0", "1", "--seeds", "2", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "o1")]) == 0
    lines = (cache / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 5 * 3  # 5 prompts at T = 0 and at 2 seeds of T = 1
    res = json.loads((tmp_path / "o1" / "results.json").read_text())
    assert res["offline"] and len(res["log"]) == 2 * 15
    t0 = res["summary"]["temperatures"]["0"]
    assert set(t0["datasets"]["all"]) == {"a", "b"} and t0["paired"]["pairs"][0]["label"] == "b"
    md = (tmp_path / "o1" / "report.md").read_text()
    assert "# carryover eval --offline" in md and "| b vs a | **all** | 0 |" in md
    # the second run records nothing new and scores the same rollouts to the same numbers
    assert main(args + ["--out", str(tmp_path / "o2")]) == 0
    assert (cache / "rollouts.jsonl").read_text().splitlines() == lines
    res2 = json.loads((tmp_path / "o2" / "results.json").read_text())
    assert [r["rounds"] for r in res2["log"]] == [r["rounds"] for r in res["log"]]
    capsys.readouterr()
    assert main(args[:-4] + ["--drafter", f"c={base}:carryover", "--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("carryover eval: error: drafter c: --offline scores arms without carried rows only")
    assert err.count("\n") == 1 and not (tmp_path / "o3").exists()


@pytest.fixture(scope="module")
def tok_target(tiny_llama, tmp_path_factory):
    """The tiny Llama with test_eval's word-level tokenizer (`w5 w6 ...` = ids 5, 6, ...; MASK row 4)."""
    import shutil

    from tests.hf_models import add_word_tokenizer

    folder = tmp_path_factory.mktemp("offline_target") / "target"
    shutil.copytree(tiny_llama.path, folder)
    add_word_tokenizer(folder)
    return folder
