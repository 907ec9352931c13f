"""Carryover arms on recorded rollouts: the engine's rounds, replayed against the target's recorded output.

A Carryover drafter's proposals depend on the previous round's rejected verify states, which differ with
every path through a rollout, so its rounds do not follow from one teacher-forced pass (`offline.py`).
They are decoded, batched: the engine's own prefill, drafting and verify, commit and carry
(`decode/speculative.py`), with the acceptance decided by the recorded rollout y_1..y_G instead of the
target's logits (`verify_step(..., decided=(a, y))`). Every row commits exactly the rollout's tokens, so
one rollout cache serves every arm, with or without carried rows.

- T = 0: the engine's greedy proposals d_1..d_P; a = the longest prefix with d_k = y_{c+k}, the correction
  y_{c+a+1}. Greedy speculative decoding reproduces the greedy rollout (the AR output), so this is the
  engine round for round (tests/test_offline_eval.py checks it on every prompt, carried counts 0..P).
- T > 0: seeded sampling of the engine's rounds given the rollout, one draw per rollout. Unbiased because
  it samples the engine's own conditional law. In a round started at c (q_k the draft distributions with
  this round's carried rows, p_k the target's after y_{c+k−1}), the engine draws d_k ~ q_k and accepts it
  w.p. min(1, p_k(d_k)/q_k(d_k)); on the first rejection it emits a correction ~ norm(max(p_k − q_k, 0)).
  The joint law of (accepted?, emitted token v) at slot k is then min(p_k(v), q_k(v)) for an acceptance
  and max(p_k(v) − q_k(v), 0) for a rejection, summing to p_k(v) (the losslessness). So given the emitted
  token y_{c+k}:
  * slot k is accepted w.p. min(1, q_k(y)/p_k(y)) (the offline evaluator's acceptance, `offline.py`);
  * given a rejection, the rejected draft is distributed ∝ q_k(u)·(1 − min(1, p_k(u)/q_k(u))) =
    max(q_k(u) − p_k(u), 0), whatever y was; the later drafts are plain draws from their q (a Markov head
    chained from the rejected draft) — these drafts are what the next round's carried rows are made of.
  Tokens emitted after this round follow p given the committed prefix whatever was carried (again the
  losslessness), so conditioning on the whole rollout adds nothing to this round's posterior. Drawing
  the round that way, round after round, samples the engine's rounds given the rollout exactly; over
  rollouts drawn from the target (each seed one), E[draw] = the engine's E[rounds]. The τ it enters,
  Σ tokens / Σ rounds (paired.py), is a ratio of unbiased sums, like the decode eval's own τ. The draws
  are keyed by (rollout, round start), not by arm, so arms share their random numbers (an A/A reads 0).
  p_k(y) comes from the teacher-forced target pass over the rollout, and max(q − p, 0) from its hidden
  state at the rejected slot through the target's head: no extra target forward per round.
"""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import drafting as D
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.buckets import next_bucket
from carryover_jax.decode.generate import MAX_STOP_IDS, pad_batch, plan_lengths
from carryover_jax.decode.sampling import probs
from carryover_jax.errors import CarryoverError
from carryover_jax.models.drafter import frozen_from_target, to_target_probs
from carryover_jax.models.target import TargetLM


def _labels(roll, start, width: int):
    """roll [B, W] (-1 past the rollout) -> [B, width] from start [B] (y_{c+1}.. for start = c)."""
    return jax.vmap(lambda r, i: jax.lax.dynamic_slice_in_dim(r, i, width))(roll, start)


def _greedy_round(sc: sp.SpecConfig, target_params, draft_params, s, labels):
    toks, _, rng = sp.draft_parts(sc, target_params, draft_params, s)
    a = jnp.sum(jnp.cumprod(toks == labels[:, :sc.P], axis=1), axis=1).astype(jnp.int32)
    return toks, a, s.replace(rng=rng)


def _sampled_round(sc: sp.SpecConfig, target_params, draft_params, s, labels, p_label, h_prev, keys):
    """Drafts and accepted count of one round drawn given the rollout (module docstring). p_label [B, P]:
    p_k(y_{c+k}); h_prev [B, P, d]: the target's final hidden state before each slot's token."""
    dc, P = sc.drafter, sc.P
    frozen = frozen_from_target(target_params, sc.target)
    carried = (s.carried, s.rejected_count) if sc.attend_carried else (None, None)
    z = D.draft_block_logits(dc, draft_params, frozen, s.draft_cache, s.anchor, *carried, carried_fused=True)
    temp = s.temperature[:, None]
    y = jnp.maximum(labels[:, :P], 0)
    prev = jnp.concatenate([s.anchor[:, None], y[:, :-1]], axis=1)  # teacher-forced: every slot before accepted
    z_tf = z + D.markov_bias(dc, draft_params, prev) if dc.markov_rank else z
    q_tf = to_target_probs(dc, probs(z_tf, temp, sc.top_k, sc.top_p))
    q_y = jnp.take_along_axis(q_tf, y[..., None], axis=-1)[..., 0]
    alpha = jnp.where(labels[:, :P] >= 0, jnp.minimum(1.0, q_y / jnp.maximum(p_label, jnp.finfo(jnp.float32).tiny)),
                      0.0)
    k_acc, k_draw = jax.vmap(lambda k: jax.random.split(k), out_axes=1)(keys)
    u = jax.vmap(lambda k: jax.random.uniform(k, (P,)))(k_acc)
    a = jnp.sum(jnp.cumprod(u < alpha, axis=1), axis=1).astype(jnp.int32)
    # the target's distribution at the first rejected slot (a < P), for its residual max(q - p, 0)
    h_rej = jnp.take_along_axis(h_prev, jnp.minimum(a, P - 1)[:, None, None], axis=1)[:, 0]
    p_rej = probs(TargetLM(sc.target).apply({"params": target_params}, h_rej, method=TargetLM.head),
                  s.temperature, sc.top_k, sc.top_p)
    draw_keys = jax.vmap(lambda k: jax.random.split(k, P), out_axes=1)(k_draw)  # [P, B]

    def slot(prev_tok, xs):
        k, zk, lab, key = xs
        lg = zk + D.markov_bias(dc, draft_params, prev_tok[:, None])[:, 0] if dc.markov_rank else zk
        qk = to_target_probs(dc, probs(lg, s.temperature, sc.top_k, sc.top_p))
        dist = jnp.where((k == a)[:, None], jnp.maximum(qk - p_rej, 0.0), qk)
        dist = jnp.where(jnp.sum(dist, axis=-1, keepdims=True) > 1e-12, dist, qk)  # q == p: no residual mass
        draw = jax.vmap(lambda kk, d: jax.random.categorical(kk, jnp.log(d)))(key, dist).astype(jnp.int32)
        tok = jnp.where(k < a, lab, draw)
        return tok, tok

    xs = (jnp.arange(P), jnp.swapaxes(z, 0, 1), jnp.swapaxes(y, 0, 1), draw_keys)
    _, toks = jax.lax.scan(slot, s.anchor.astype(jnp.int32), xs)
    return jnp.swapaxes(toks, 0, 1), a, s


def round_inputs(sc: sp.SpecConfig, st, roll, prompt_lens, p_roll, h_roll, keys):
    """What a round started at c = num_out reads of its rollout: labels [B, P+1] = y_{c+1}..y_{c+P+1} (-1 past
    the end) and, sampling, p_k(y_{c+k}) [B, P], the target's hidden state before each slot [B, P, d], and the
    round's keys (one stream per rollout and round start)."""
    P = sc.P
    labels = _labels(roll, st.num_out, P + 1)
    if not sc.sampling:
        return labels, None, None, None
    idx = jnp.minimum(prompt_lens[:, None] + st.num_out[:, None] + jnp.arange(P)[None, :],
                      p_roll.shape[1] - 1)  # y_{c+k} sits at L + c + k - 1
    p_label = jnp.take_along_axis(p_roll, idx, axis=1)
    h_prev = jnp.take_along_axis(h_roll, (idx - 1)[..., None], axis=1)
    return labels, p_label, h_prev, jax.vmap(jax.random.fold_in)(keys, st.num_out)


@functools.partial(jax.jit, static_argnames=("sc",))
def replay_loop(sc: sp.SpecConfig, target_params, draft_params, s, roll, prompt_lens, p_roll, h_roll, keys):
    """Rounds until every row is done (`replay_setup` gives the arguments)."""

    def one(st):
        labels, p_label, h_prev, round_keys = round_inputs(sc, st, roll, prompt_lens, p_roll, h_roll, keys)
        if sc.sampling:
            toks, a, st = _sampled_round(sc, target_params, draft_params, st, labels, p_label, h_prev, round_keys)
        else:
            toks, a, st = _greedy_round(sc, target_params, draft_params, st, labels)
        y = jnp.maximum(jnp.take_along_axis(labels, a[:, None], axis=1)[:, 0], 0)
        return sp.verify_step(sc, target_params, draft_params, st, toks, None, decided=(a, y))

    return jax.lax.while_loop(lambda st: ~jnp.all(st.done), one, s)


def rollout_seed(seed: int, dataset: str, prompt: str) -> int:
    """The replay's random stream of one rollout: the same for every arm (common random numbers)."""
    return zlib.crc32(f"{seed}|{dataset}|{prompt}".encode()) & 0x7FFFFFFF


def replay_setup(target, drafter, entry, rows: list[dict], *, temperature: float, top_k: int = 0, top_p: float = 1.0,
                 p_roll=None, h_roll=None, batch: int | None = None):
    """`replay_loop`'s arguments for `rows` (`replay_rollouts`): (sc, state after the prefill, roll, prompt
    lengths, p_roll, h_roll, keys), padded to `batch` rows (padding rows are done after the prefill)."""
    dc = drafter.cfg
    P = dc.num_proposals
    n = len(rows)
    b = max(batch or n, n)
    lens = [len(r["prompt_ids"]) for r in rows] + [len(rows[0]["prompt_ids"])] * (b - n)
    news = [len(r["tokens"]) for r in rows] + [1] * (b - n)
    sampling = temperature > 0
    bucket, cache_len = plan_lengths(lens, [g + P + 1 for g in news], None, target.cfg.max_position_embeddings)
    out_size = next_bucket(max(news), minimum=1)
    roll = np.full((b, out_size + P + 2), -1, np.int32)
    for i, r in enumerate(rows):
        roll[i, : len(r["tokens"])] = r["tokens"]
    roll[n:, 0] = rows[0]["tokens"][0]
    sc = sp.SpecConfig(target=target.cfg, drafter=dc, attend_carried=entry.carryover, carry=entry.carry,
                       sampling=sampling, top_k=top_k, top_p=top_p)
    prompts = [r["prompt_ids"] for r in rows] + [rows[0]["prompt_ids"]] * (b - n)
    s = sp.prefill(sc, target.params, drafter.params, jnp.asarray(pad_batch(prompts, bucket)),
                   jnp.asarray(lens, jnp.int32), jnp.asarray(news, jnp.int32), jnp.full((b,), temperature, jnp.float32),
                   jnp.full((MAX_STOP_IDS,), -1, jnp.int32), jax.random.key(0), max_len=cache_len,
                   out_size=out_size, max_rounds=out_size)
    first = jnp.asarray(roll[:, 0])  # the prefill's token is the rollout's first, whatever the prefill drew
    s = s.replace(anchor=first, out=s.out.at[:, 0].set(first), done=s.num_out >= s.max_new)
    seeds = [rollout_seed(r["seed"], r["dataset"], r["prompt"]) for r in rows] + [0] * (b - n)
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    if sampling:
        pad = b - p_roll.shape[0]
        p_roll = jnp.pad(jnp.asarray(p_roll), ((0, pad), (0, 0)))
        h_roll = jnp.pad(jnp.asarray(h_roll), ((0, pad), (0, 0), (0, 0)))
    else:
        p_roll = h_roll = jnp.zeros((b, 1), jnp.float32)
    return sc, s, jnp.asarray(roll), jnp.asarray(lens, jnp.int32), p_roll, h_roll, keys


def replay_rollouts(target, drafter, entry, rows: list[dict], *, temperature: float, top_k: int = 0,
                    top_p: float = 1.0, p_roll=None, h_roll=None, batch: int | None = None) -> list[list[int]]:
    """Per rollout (`rows`: {"prompt_ids", "tokens", "seed", "dataset", "prompt"}), the accepted drafts of each
    round of `drafter` decoding it (`entry.carryover`: with carried rows, as `entry.carry` says), the last
    round cut to the tokens left, as the engine commits it. `batch` pads the rows to that many (one compiled
    shape per bucket); at T > 0 `p_roll` / `h_roll` are `offline.target_pass`'s over the same rows."""
    sc, *args = replay_setup(target, drafter, entry, rows, temperature=temperature, top_k=top_k, top_p=top_p,
                             p_roll=p_roll, h_roll=h_roll, batch=batch)
    s = replay_loop(sc, target.params, drafter.params, *args)
    out, num_out, rounds, accepted = jax.device_get((s.out, s.num_out, s.rounds, s.accepted))
    result = []
    for i, r in enumerate(rows):
        g = len(r["tokens"])
        if out[i, :num_out[i]].tolist() != list(r["tokens"]):  # by construction it commits the rollout
            raise CarryoverError(f"the replay of rollout {r['dataset']}/{r['prompt']} committed other tokens")
        c, cut = 1, []
        for a in accepted[i, : rounds[i]]:
            m = min(int(a) + 1, g - c)
            cut.append(m - 1)
            c += m
        result.append(cut)
    return result
