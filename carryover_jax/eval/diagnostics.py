"""The paper's decoding diagnostics (Figures 4-6), measured while decoding greedily (T = 0).

- **ON/OFF replay at decode time** (Carryover arms): before every round's draft, the drafter's logits are computed
  twice on the same state — same weights, same anchor, same committed-context cache — once with the
  carried rows supplied (the engine's own buffer, visible rows j < rejected_count) and once withheld
  (rejected_count = 0, which is the plain drafter bit for bit). Both are compared with the target's
  tokens at the block's slots: at T = 0 the committed sequence is the AR sequence, so slot i's target
  token is AR token num_out + i. Recall@1 = argmax equals it, Recall@16 = it is among the top 16;
  per proposal slot, over rounds that do have carried rows. Markov drafters are teacher-forced (the
  previous token of slot i is the target token of slot i-1) in both arms.
- **ON/OFF replay on recorded sequences** (Carryover arms; `recorded_replay`): the training-style
  replay of `train/dvd.py` — DVD's greedy draft 1 at sampled anchors of the recorded AR outputs, the
  target's verify features at the rejected positions, then draft 2 at s + a + 1 with those carried rows
  supplied vs withheld; the same R@1/R@16 per slot against the recorded tokens.
- **Attention to carried rows** (every arm; Figure 6, `attention.py`): the block's attention probabilities over
  the context before the anchor, the carried rows and the block, averaged over heads, draft layers and the
  rounds with each carried count.
- **Re-convergence of rejected branches** (every arm): for a round that accepts a < P drafts, the
  rejected suffix is d_{a+1}..d_P; d_{a+1} lost to the correction token. For the later ones (offset
  j = 1..P-a-1) we count (i) `aligned`: d_{a+1+j} equals the committed token at the same position, and
  (ii) `reappear`: d_{a+1+j} occurs among the next P committed tokens after the correction.

The rounds are driven from the host with the engine's `prefill`/`draft_step`/`verify_step`, so the
decode itself is exactly the engine's; its output is checked against AR.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from carryover_jax.config import LossConfig, TrainConfig
from carryover_jax.decode.buckets import next_bucket
from carryover_jax.decode import drafting as D
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.generate import MAX_STOP_IDS, generate, pad_batch, plan_lengths
from carryover_jax.errors import CarryoverError
from carryover_jax.eval.attention import AttentionTally, round_attention
from carryover_jax.models.drafter import Drafter, frozen_from_target, to_target_ids
from carryover_jax.train import dvd
from carryover_jax.train.losses import batch_features, proposal_hidden
from carryover_jax.train.step import step_config

TOP_K = 16


@functools.partial(jax.jit, static_argnames=("sc", "k"))
def replay_hits(sc, target_params, draft_params, s, targets, *, k: int = TOP_K):
    """Per row and slot: (R@1 ON, R@k ON, R@1 OFF, R@k OFF, valid), all [B, P] bool."""
    cfg = sc.drafter
    frozen = frozen_from_target(target_params, sc.target)

    def logits(count):
        lg = D.draft_block_logits(cfg, draft_params, frozen, s.draft_cache, s.anchor, s.carried, count,
                                 carried_fused=True)  # the engine keeps carried rows fused
        return D.teacher_forced_logits(cfg, draft_params, lg, s.anchor, jnp.maximum(targets, 0))

    tf = jnp.maximum(targets, 0)

    def hits(lg):
        top = to_target_ids(cfg, jax.lax.top_k(lg, k)[1])
        return top[..., 0] == tf, jnp.any(top == tf[..., None], axis=-1)

    on1, onk = hits(logits(s.rejected_count))
    off1, offk = hits(logits(jnp.zeros_like(s.rejected_count)))
    valid = (targets >= 0) & ((s.rejected_count > 0) & ~s.done)[:, None]
    return on1, onk, off1, offk, valid


def _decode_with_log(target, entry, drafter, ids: list[list[int]], ref: list[list[int]], *, max_new_tokens: int,
                     max_len, stop_ids: list[int], replay: bool, attention: AttentionTally | None = None):

    dcfg, dp, tp = drafter.cfg, drafter.params, target.params
    P = dcfg.num_proposals
    n = len(ids)
    lens = [len(r) for r in ids]
    bucket, cache_len = plan_lengths(lens, [max_new_tokens + P + 1] * n, max_len, target.cfg.max_position_embeddings)
    out_size = next_bucket(max_new_tokens, minimum=1)
    sc = sp.SpecConfig(target=target.cfg, drafter=dcfg, attend_carried=entry.carryover, sampling=False,
                       carry=entry.carry)
    stops = jnp.asarray(list(stop_ids) + [-1] * (MAX_STOP_IDS - len(stop_ids)), jnp.int32)
    s = sp.prefill(sc, tp, dp, jnp.asarray(pad_batch(ids, bucket)), jnp.asarray(lens, jnp.int32),
                   jnp.full((n,), max_new_tokens, jnp.int32), jnp.zeros((n,), jnp.float32), stops,
                   jax.random.key(0), max_len=cache_len, out_size=out_size, max_rounds=out_size)
    width = out_size + 2 * P + 2
    ref_arr = np.full((n, width), -1, np.int64)
    for i, r in enumerate(ref):
        ref_arr[i, : len(r)] = r
    counts = {key: np.zeros(P, np.int64) for key in ("on1", "onk", "off1", "offk", "valid")}
    rounds_log = []  # per host iteration: (num_out before [B], active [B], proposals [B, P])
    while True:
        done, cur = jax.device_get((s.done, s.num_out))
        if done.all():
            break
        if replay:
            idx = cur[:, None] + np.arange(P)[None, :]
            targets = jnp.asarray(np.take_along_axis(ref_arr, idx, axis=1), jnp.int32)
            h = jax.device_get(replay_hits(sc, tp, dp, s, targets, k=min(TOP_K, target.cfg.vocab_size)))
            valid = h[4]
            for key, arr in zip(("on1", "onk", "off1", "offk"), h[:4]):
                counts[key] += (arr & valid).sum(0)
            counts["valid"] += valid.sum(0)
        if attention is not None:
            maps, ctx = jax.device_get(round_attention(sc, tp, dp, s, window=attention.window))
            attention.add(maps, ctx, jax.device_get(s.rejected_count), ~done)
        toks, q, s = sp.draft_step(sc, tp, dp, s)
        rounds_log.append((cur.copy(), ~done, np.asarray(jax.device_get(toks))))
        s = sp.verify_step(sc, tp, dp, s, toks, q)
    out, out_n, accepted = jax.device_get((s.out, s.num_out, s.accepted))
    outputs = [out[i, : out_n[i]].tolist() for i in range(n)]
    return outputs, counts, rounds_log, accepted


def _reconvergence(rounds_log, accepted, finals: list[list[int]], P: int) -> dict[str, Any]:
    # offsets j = 1..P-1 after the first rejected token
    aligned_hit, aligned_n = np.zeros(max(P - 1, 1), np.int64), np.zeros(max(P - 1, 1), np.int64)
    reappear_hit = reappear_n = rejections = 0
    seen_rounds = np.zeros(len(finals), np.int64)
    for cur, active, toks in rounds_log:
        for b in np.nonzero(active)[0]:
            a = int(accepted[b, seen_rounds[b]])
            seen_rounds[b] += 1
            if a >= P:
                continue
            rejections += 1
            final, base = finals[b], int(cur[b]) + a  # out index of the rejected token d_{a+1}
            window = final[base + 1: base + 1 + P]
            for j in range(1, P - a):
                tok = int(toks[b, a + j])
                if base + j < len(final):
                    aligned_n[j - 1] += 1
                    aligned_hit[j - 1] += tok == final[base + j]
                if window:
                    reappear_n += 1
                    reappear_hit += tok in window
    return {"rejections": rejections, "window": P,
            "aligned_by_offset": [None if c == 0 else float(h / c) for h, c in zip(aligned_hit, aligned_n)],
            "aligned_counts": aligned_n.tolist(),
            "reappear_rate": float(reappear_hit / reappear_n) if reappear_n else 0.0, "reappear_tokens": reappear_n}


def run_diagnostics(target, drafters, items: Sequence, *, max_new_tokens: int, max_len=None,
                    stop_token_ids=None, progress: bool = True, replay_anchors: int = 32) -> dict[str, Any]:
    """ON/OFF replay for every Carryover arm and re-convergence for every arm, on `items` at T = 0.

    Two replays: at decode time (`replay`: the engine's own states, rounds with carried rows) and
    training-style on the recorded AR outputs of the same prompts (`replay_recorded`: DVD's draft 1 at
    `replay_anchors` sampled anchors per sequence, then draft 2 with the carried rows supplied vs withheld)."""
    if not items:
        raise CarryoverError("no prompts for the diagnostics")
    ids = [list(it.ids) for it in items]
    stops = list(target.stop_token_ids if stop_token_ids is None else stop_token_ids)
    ref = [r.token_ids for r in generate(target, ids, max_new_tokens=max_new_tokens, stop_token_ids=stops,
                                         max_len=max_len, chat=False)]
    out: dict[str, Any] = {"prompts": len(items), "replay": {}, "replay_recorded": {}, "reconvergence": {},
                           "identical_to_ar": {}, "attention": {}}
    recorded = [(ids[i] + ref[i], len(ids[i])) for i in range(len(ids)) if len(ref[i]) >= 2]
    for entry, d in tqdm(drafters, desc="eval diagnostics", disable=not progress):
        P = d.cfg.num_proposals
        tally = AttentionTally(P, d.cfg.block_size)
        finals, counts, rounds_log, accepted = _decode_with_log(
            target, entry, d, ids, ref, max_new_tokens=max_new_tokens, max_len=max_len, stop_ids=stops,
            replay=entry.carryover, attention=tally)
        out["attention"][entry.label] = tally.report(entry.carryover)
        out["identical_to_ar"][entry.label] = finals == ref
        out["reconvergence"][entry.label] = _reconvergence(rounds_log, accepted, finals, P)
        if entry.carryover:
            v = counts["valid"]

            def rate(key):
                return [None if n == 0 else float(h / n) for h, n in zip(counts[key], v)]

            out["replay"][entry.label] = {
                "rounds": int(v[0]),  # rounds that had carried rows (and a target token at slot 1)
                "slot_counts": v.tolist(), "top_k": min(TOP_K, target.cfg.vocab_size),
                "recall1_on": rate("on1"), "recall1_off": rate("off1"),
                "recall16_on": rate("onk"), "recall16_off": rate("offk"),
                "recall1_on_all": float(counts["on1"].sum() / max(v.sum(), 1)),
                "recall1_off_all": float(counts["off1"].sum() / max(v.sum(), 1)),
                "recall16_on_all": float(counts["onk"].sum() / max(v.sum(), 1)),
                "recall16_off_all": float(counts["offk"].sum() / max(v.sum(), 1)),
            }
            if recorded and replay_anchors:
                out["replay_recorded"][entry.label] = recorded_replay(target, d, recorded, num_anchors=replay_anchors,
                                                                   carry=entry.carry)
    return out


# ---- training-style replay on recorded sequences (DVD training's own rollout) -----------------------
def replay_step_config(target_cfg, drafter_cfg, num_anchors: int, carry: str = "hidden"):
    """The DVD step's static settings for the target and drafter as loaded (their numerics kept)."""
    return step_config(TrainConfig(loss=LossConfig(mode="dvd", carry=carry), num_anchors=num_anchors), target_cfg, drafter_cfg,
                       numerics=target_cfg.numerics)


@functools.partial(jax.jit, static_argnames=("sc", "k"))
def recorded_replay_hits(sc, params, target_params, ids, loss_mask, rng, *, k: int = TOP_K):
    """ON/OFF replay at DVD's anchors on recorded sequences [B, S] (the target's own greedy outputs):
    `train/dvd.py::rollout` — the rollout DVD training runs, with the same `rng` use as `dvd_loss` — then
    draft 2 at s_n + a_n + 1 with the rejected positions' target features supplied (ON) vs withheld (OFF).
    Returns per-slot sums [P]: R@1 ON/OFF, R@k ON/OFF, and counts, each over (a) anchors with carried rows
    (a_n < P) and (b) all kept anchors (what `dvd_loss` logs as top1_acc@slot / off/top1_acc@slot)."""

    dc = sc.drafter
    b = ids.shape[0]
    t, p = dc.block_size, dc.num_proposals
    batch = {"input_ids": ids, "loss_mask": loss_mask}
    feats, last = batch_features(sc, target_params, batch)
    frozen = frozen_from_target(target_params, sc.target)
    r = dvd.rollout(sc, params, target_params, frozen, batch, feats, last, rng, carried=True)
    blk2 = r.blk2
    n = blk2.anchors.shape[1]

    def logits(carried):
        h = proposal_hidden(params, dc, frozen, feats, blk2, carried).reshape(b, n * p, -1)
        z = Drafter(dc).apply({"params": params}, h, frozen, method=Drafter.logits).reshape(b, n, p, -1)
        if dc.markov_rank:  # teacher-forced: the previous token is the recorded one
            prev = jnp.concatenate([blk2.tokens.reshape(b, n, t)[:, :, :1], blk2.labels[..., :-1]], axis=-1)
            z = z + Drafter(dc).apply({"params": params}, prev, method=Drafter.markov_bias)
        return z

    def hits(z):
        top = to_target_ids(dc, jax.lax.top_k(z, k)[1])
        return top[..., 0] == blk2.labels, jnp.any(top == blk2.labels[..., None], axis=-1)

    on1, onk = hits(logits(r.carried))
    off1, offk = hits(logits(None))
    every = blk2.eval_mask & r.keep2[..., None]
    carried = every & (r.accepted < p)[..., None]
    out = {}
    for name, m in (("carried", carried), ("all", every)):
        for key, x in (("on1", on1), ("onk", onk), ("off1", off1), ("offk", offk)):
            out[f"{name}/{key}"] = jnp.sum(x & m, axis=(0, 1))
        out[f"{name}/count"] = jnp.sum(m, axis=(0, 1))
    return out


def recorded_replay(target, drafter, sequences: Sequence[tuple[list[int], int]], *, num_anchors: int = 32,
                    seed: int = 0, carry: str = "hidden") -> dict[str, Any]:
    """`sequences`: (token ids, prompt length) — the generated part is what anchors and labels come from.
    Every sequence is padded to one length (one compile); one sequence per call."""

    dc = drafter.cfg
    if not dc.carryover:
        raise CarryoverError("the ON/OFF replay needs a drafter with a Carryover embedding")
    sc = replay_step_config(target.cfg, dc, num_anchors, carry)
    length = next_bucket(max(len(ids) for ids, _ in sequences) + 1)
    k = min(TOP_K, target.cfg.vocab_size)
    total: dict[str, np.ndarray] = {}
    for i, (ids, plen) in enumerate(sequences):
        row = np.zeros((1, length), np.int32)
        row[0, : len(ids)] = ids
        lm = np.zeros((1, length), np.int32)
        lm[0, plen: len(ids)] = 1
        got = jax.device_get(recorded_replay_hits(sc, drafter.params, target.params, jnp.asarray(row),
                                                  jnp.asarray(lm), jax.random.key(seed + i), k=k))
        for key, v in got.items():
            total[key] = total.get(key, 0) + np.asarray(v, np.int64)
    out: dict[str, Any] = {"sequences": len(sequences), "anchors_per_sequence": num_anchors, "top_k": k}
    for name in ("carried", "all"):
        cnt = total[f"{name}/count"]
        out[name] = {"slot_counts": cnt.tolist(), **{
            f"recall{'1' if key.endswith('1') else '16'}_{'on' if key.startswith('on') else 'off'}":
                [None if c == 0 else float(h / c) for h, c in zip(total[f"{name}/{key}"], cnt)]
            for key in ("on1", "off1", "onk", "offk")}}
    return out
