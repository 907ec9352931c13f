"""Parallel draft–verify–draft (DVD) training: the drafter learns what carried rows mean.

For every sequence, N anchors s_n are sampled as in baseline training; then, for all anchors at once:

1. draft 1 (no gradient): the drafter proposes d_1..d_P at every anchor exactly as when decoding —
   greedy, the Markov head sequential over slots, no carried rows;
2. verify (frozen target, no gradient): one target pass over the N blocks [d_1..d_P] at positions
   s_n+1..s_n+P, each attending causally to itself (`Blockwise(causal=True)`) and to the recorded
   sequence's K/V up to and including its anchor. (Decoding verifies [x_{s_n}, d_1..d_P]; the anchor's
   row there attends to the recorded prefix and is the recorded token at its own position, so its K/V
   are the recorded sequence's at s_n, and its state is never carried: the P rows give the same states.)
   The recorded K/V come from the store (`data.store_kv`, `train/kv_rows.py`) or from a target pass
   over the recorded sequences. a_n = the longest prefix of proposals equal to the recorded
   continuation (the recorded response is the target's own greedy output, so this is T=0 acceptance);
   padding and the loss mask end a block;
3. draft 2 (trained): anchors s_n + a_n + 1 with the loss of baseline training; carried = block n's
   verify states of the rejected proposals d_{a_n+1}..d_P (count P - a_n, padded to P, masked by count), seen
   only by the shifted block n. `mode="control"` withholds them: the equal-compute control, which is
   a baseline step at the shifted anchors.

`carry` picks what draft 2 receives at the rejected positions (the paper's interface ablation):
target hidden states (the method), the rejected draft tokens, or the target's own greedy tokens there,
both embedded through the frozen target embedding.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from carryover_jax.decode.drafting import sequential_proposals
from carryover_jax.decode.sampling import probs
from carryover_jax.models.drafter import Drafter, frozen_from_target, to_target_probs
from carryover_jax.models.layers import Blockwise, Prefix
from carryover_jax.models.target import TargetLM
from carryover_jax.numerics import argmax
from carryover_jax.train import anchors as A
from carryover_jax.train.kv_rows import unpack_kv
from carryover_jax.train.losses import (anchor_metrics, batch_features, batch_lse, block_loss, chunked_rows,
                                       proposal_hidden, target_greedy_labels)
from carryover_jax.train.step_config import StepConfig

Array = jax.Array


def draft_proposals(sc: StepConfig, params, frozen, feats: Array, blk: A.Blocks) -> Array:
    """Draft 1: greedy proposals [B, N, P] of every block, no carried rows, no gradient."""
    dc = sc.drafter
    params = jax.lax.stop_gradient(params)
    b = feats.shape[0]
    t, p, n = dc.block_size, dc.num_proposals, blk.anchors.shape[1]
    h = proposal_hidden(params, dc, frozen, feats, blk).reshape(b * n, p, -1)
    anchor_tok = blk.tokens.reshape(b * n, t)[:, 0]

    def propose(hc, ac):
        z = Drafter(dc).apply({"params": params}, hc, frozen, method=Drafter.logits)
        return sequential_proposals(dc, params, z, ac, None, None, sampling=False)[0]

    rows_per_chunk = max(1, sc.loss.chunk_rows // p) if sc.loss.chunk_rows else 0
    toks = chunked_rows(propose, (h, anchor_tok), rows_per_chunk)
    return jax.lax.stop_gradient(toks).reshape(b, n, p)


def coupled_proposals(sc: StepConfig, params, target_params, frozen, feats: Array, last: Array, blk: A.Blocks,
                      rng: Array, part=(0, 1)) -> Array:
    """Draft 1 on a recording sampled at temperature T > 0: proposals [B, N, P] drawn from the maximal
    coupling of the drafter's distribution q with the recorded token x ~ p (both processed as decoding
    processes them: temperature, top-k, top-p). Slot i proposes x with probability min(1, q(x)/p(x)), else
    a token from the residual (q - p)+. Then

    - d_i = x_i exactly when speculative sampling would accept d_i (P = sum min(p, q), its acceptance), so
      `accept_counts` against the recording counts what rejection sampling accepts, not fewer;
    - given a rejection, the recorded x_i is distributed as (p - q)+ (the correction rejection sampling
      draws), so the shifted anchor's context — the recorded prefix — is what decoding would have committed;
    - every d_i is marginally a draw from q: the rejected tokens (and their verify states, the carried rows)
      are distributed as when decoding.

    Markov drafters are sequential over slots, each slot's bias from the previous proposal (= the recorded
    token on every slot that can still be accepted). No gradient."""
    dc = sc.drafter
    params = jax.lax.stop_gradient(params)
    b, s = feats.shape[:2]
    t, p, n = dc.block_size, dc.num_proposals, blk.anchors.shape[1]
    temp, top_k, top_p = sc.loss.dvd_temperature, sc.top_k, sc.top_p
    h = proposal_hidden(params, dc, frozen, feats, blk).reshape(b * n, p, -1)
    pred_at = jnp.clip(blk.label_idx - 1, 0, s - 1).reshape(b, n * p)
    th = jnp.take_along_axis(last, pred_at[..., None], axis=1).reshape(b * n, p, -1)
    x = blk.labels.reshape(b * n, p)
    anchor_tok = blk.tokens.reshape(b * n, t)[:, 0]
    keys = A.part_rows(lambda r: jax.random.key_data(jax.random.split(rng, r)), b * n, part)  # row-major: b, n
    tm, drafter = TargetLM(sc.target), Drafter(dc)

    def draw(hc, thc, xc, ac, kc):
        z = drafter.apply({"params": params}, hc, frozen, method=Drafter.logits)  # [r, P, K]
        pt = probs(tm.apply({"params": target_params}, thc, method=TargetLM.head), jnp.float32(temp), top_k, top_p)

        def slot(prev, xs):
            zi, pi, xi, ki = xs  # [r, K], [r, V], [r], [r] keys
            if dc.markov_rank:
                zi = zi + drafter.apply({"params": params}, prev[:, None], method=Drafter.markov_bias)[:, 0]
            qi = to_target_probs(dc, probs(zi, jnp.float32(temp), top_k, top_p))
            px, qx = (jnp.take_along_axis(d, xi[:, None], axis=-1)[:, 0] for d in (pi, qi))
            ka, kr = jax.vmap(lambda k: jax.random.split(jax.random.wrap_key_data(k)))(ki).T
            u = jax.vmap(jax.random.uniform)(ka)
            hit = u * px < qx  # accept x with probability min(1, q(x) / p(x))
            resid = jnp.maximum(qi - pi, 0.0)
            other = jax.vmap(jax.random.categorical)(kr, jnp.log(resid))  # never drawn where hit is certain
            d = jnp.where(hit | (jnp.sum(resid, -1) <= 0), xi, other).astype(jnp.int32)
            return d, d

        slot_keys = jax.vmap(lambda k: jax.random.key_data(jax.random.split(jax.random.wrap_key_data(k), p)))(kc)
        sw = lambda a: jnp.swapaxes(a, 0, 1)  # noqa: E731  slots first for the scan
        _, d = jax.lax.scan(slot, ac.astype(jnp.int32), (sw(z), sw(pt), sw(xc), sw(slot_keys)))
        return sw(d)

    rows_per_chunk = max(1, sc.loss.chunk_rows // p) if sc.loss.chunk_rows else 0
    toks = chunked_rows(draw, (h, th, x, anchor_tok, keys), rows_per_chunk)
    return jax.lax.stop_gradient(toks).reshape(b, n, p)


def accept_counts(proposals: Array, blk: A.Blocks) -> Array:
    """a_n [B, N]: the longest prefix of proposals equal to the block's labels (the recorded
    continuation; with labels=target the target's greedy tokens), within its valid labels (eval mask)."""
    hit = (proposals == blk.labels) & blk.eval_mask
    return jnp.sum(jnp.cumprod(hit.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def recorded_kv(sc: StepConfig, target_params, ids: Array):
    """Every target layer's (k, v) over the recorded sequences: the prefix verification attends to."""
    _, _, ks, vs = TargetLM(sc.target).apply({"params": target_params}, ids, sc.drafter.target_layer_ids,
                                             method=TargetLM.features, with_kv=True)
    return ks, vs


def verify_blocks(sc: StepConfig, target_params, ids: Array, anchors: Array, keep: Array, proposals: Array,
                  *, with_hidden: bool = False, kv=None):
    """The frozen target over all N blocks of proposals [d_1..d_P] at positions s_n+1..s_n+P, each block
    causal in itself and seeing the recorded sequence up to its anchor (`kv`: its per-layer K/V, computed
    here when not given). Returns the concatenated taps [B, N, P, m·d] (and the final-normed hidden
    [B, N, P, d] with `with_hidden`): index i is the state of d_{i+1}."""
    b = ids.shape[0]
    n, p = proposals.shape[1:]
    kv = recorded_kv(sc, target_params, ids) if kv is None else kv
    positions = (anchors[..., None] + 1 + jnp.arange(p)).reshape(b, n * p)
    # block n sees the recorded sequence through its anchor: a per-query key limit (never a [N*P, S] mask in
    # the fused attention backends)
    prefix = Prefix(jnp.repeat(jnp.where(keep, anchors + 1, 0), p, axis=1).astype(jnp.int32))
    taps, last = TargetLM(sc.target).apply({"params": target_params}, proposals.reshape(b, n * p), positions, kv,
                                           prefix, Blockwise(n, causal=True), sc.drafter.target_layer_ids,
                                           method=TargetLM.with_context)
    feats = jax.lax.stop_gradient(jnp.concatenate(taps, axis=-1).reshape(b, n, p, -1))
    if not with_hidden:
        return feats
    return feats, jax.lax.stop_gradient(last.reshape(b, n, p, -1))


def shifted_anchors(lm: Array, anchors: Array, keep: Array, accepted: Array) -> tuple[Array, Array]:
    """s_n + a_n + 1, kept where it is itself a valid anchor (it and its first label in the loss mask)."""
    s = lm.shape[1]
    shifted = anchors + accepted + 1
    ok = keep & (shifted < s) & jnp.take_along_axis(A.anchor_candidates(lm), jnp.minimum(shifted, s - 1), axis=1)
    return jnp.where(ok, shifted, 0).astype(jnp.int32), ok


def carried_rows(sc: StepConfig, target_params, ids, anchors, keep, proposals, accepted, anchors2, keep2, *,
                 kv=None):
    """Draft 2's carried rows: rows [B, N*P, ...], positions [B, N*P], valid [B, N*P]. Row j of block n
    is the verify state of proposal d_{a_n + 1 + j} (position s'_n + j), valid iff j < P - a_n. `kv`: the
    recorded sequences' per-layer K/V when already computed."""
    b, n, p = proposals.shape
    j = jnp.arange(p)
    idx = jnp.minimum(accepted[..., None] + j, p - 1)  # proposal index [B, N, P]
    valid = (j < p - accepted[..., None]) & keep2[..., None]
    positions = anchors2[..., None] + j
    if sc.loss.carry == "draft_tokens":
        rows = jnp.take_along_axis(proposals, idx, axis=-1)
    elif sc.loss.carry == "target_tokens":  # the target's greedy token from each rejected state
        _, last = verify_blocks(sc, target_params, ids, anchors, keep, proposals, with_hidden=True, kv=kv)
        hid = jnp.take_along_axis(last, idx[..., None], axis=2)
        rows = argmax(TargetLM(sc.target).apply({"params": target_params}, hid, method=TargetLM.head))
        rows = rows.astype(jnp.int32)
    else:
        feats = verify_blocks(sc, target_params, ids, anchors, keep, proposals, kv=kv)
        rows = jnp.take_along_axis(feats, idx[..., None], axis=2)
    flat = lambda x: x.reshape(b, n * p, *x.shape[3:])  # noqa: E731
    return flat(rows), flat(positions).astype(jnp.int32), flat(valid)


class Rollout(NamedTuple):
    """One draft–verify–draft rollout at N sampled anchors per sequence (see the module docstring)."""

    blk1: A.Blocks  # draft 1's blocks at the sampled anchors
    accepted: Array  # a_n [B, N]
    blk2: A.Blocks  # draft 2's blocks at the shifted anchors s_n + a_n + 1
    keep2: Array  # [B, N] whether the shifted anchor is itself a valid anchor
    carried: tuple | None  # draft 2's carried rows (rows, positions, valid), None without them
    keep: Array  # [B, N] kept sampled anchors
    nvalid: Array  # [B] valid anchor candidates per sequence


def rollout(sc: StepConfig, params, target_params, frozen, batch, feats, last, rng, *, carried: bool,
            kv=None, part=(0, 1)) -> Rollout:
    """Draft 1 -> verify -> shifted anchors and (with `carried`) the rejected rows, all anchors at once.
    The one rollout that DVD training (`dvd_loss`) and the decoding diagnostics' replay on recorded
    sequences (`eval/diagnostics.py`) both run. `kv`: the recorded sequences' K/V if already computed;
    `part`: the batch is micro-batch (index, count) of the optimizer step's (`anchors.part_rows`)."""
    ids, lm = batch["input_ids"], batch["loss_mask"]
    dc = sc.drafter
    anchors, keep, nvalid = A.sample_anchors(rng, lm, sc.num_anchors, part)
    blk1 = A.build_blocks(dc, ids, lm, anchors, keep, nvalid)
    if sc.loss.labels == "target":  # draft 1 is accepted as in decoding: against the target's greedy tokens
        blk1 = blk1.replace(labels=target_greedy_labels(sc, target_params, last, blk1))
    if sc.loss.dvd_temperature > 0:  # a sampled recording: draft 1 as speculative sampling would accept it
        proposals = coupled_proposals(sc, params, target_params, frozen, feats, last, blk1, jax.random.fold_in(rng, 1),
                                      part)
    else:
        proposals = draft_proposals(sc, params, frozen, feats, blk1)
    accepted = accept_counts(proposals, blk1)
    anchors2, keep2 = shifted_anchors(lm, anchors, keep, accepted)
    blk2 = A.build_blocks(dc, ids, lm, anchors2, keep2, nvalid)
    rows = None
    if carried:
        rows = carried_rows(sc, target_params, ids, anchors, keep, proposals, accepted, anchors2, keep2, kv=kv)
    return Rollout(blk1, accepted, blk2, keep2, rows, keep, nvalid)


def dvd_loss(params, sc: StepConfig, target_params, batch, rng, part=(0, 1)):
    target_params = jax.lax.stop_gradient(target_params)  # frozen: embedding and head included
    ids = batch["input_ids"]
    dc, n = sc.drafter, sc.num_anchors
    kv = None
    if sc.loss.mode == "dvd" and "features" not in batch:  # one target pass gives the features and the K/V
        taps, last, *kv = TargetLM(sc.target).apply({"params": target_params}, ids, dc.target_layer_ids,
                                                    method=TargetLM.features, with_kv=True)
        feats, last = jax.lax.stop_gradient(jnp.concatenate(taps, -1)), jax.lax.stop_gradient(last)
    else:
        feats, last = batch_features(sc, target_params, batch)
        if sc.loss.mode == "dvd" and "kv" in batch:  # the store's K/V: no target pass over the recorded sequences
            kv = unpack_kv(sc.target, batch["kv"])
    frozen = frozen_from_target(target_params, sc.target)
    r = rollout(sc, params, target_params, frozen, batch, feats, last, rng, carried=sc.loss.mode == "dvd", kv=kv,
                part=part)
    lse = batch_lse(batch)
    loss, metrics = block_loss(params, sc, target_params, frozen, ids, feats, last, r.blk2, r.carried, lse)
    if sc.loss.mode == "dvd" and sc.loss.off_metrics:  # the same draft 2 with the carried rows withheld
        _, off = block_loss(jax.lax.stop_gradient(params), sc, target_params, frozen, ids, feats, last, r.blk2,
                            lse=lse)
        metrics.update({f"off/{k}": v for k, v in off.items() if k in ("ce_loss", "tau_estimate", "top1_acc@slot")})
    metrics.update(anchor_metrics(r.keep, r.nvalid, n))
    metrics.update(draft1_metrics(r.accepted, r.keep, r.keep2, dc.num_proposals))
    return loss, metrics


def draft1_metrics(accepted: Array, keep: Array, keep2: Array, p: int) -> dict:
    """Draft 1's greedy acceptance at the sampled anchors: mean a_n, tau = mean(a_n + 1), and the
    distribution of rejected counts P - a_n over kept anchors (index r = count r)."""
    k = keep.astype(jnp.float32)
    nk = jnp.maximum(jnp.sum(k), 1.0)
    hist = jnp.sum(jax.nn.one_hot(p - accepted, p + 1) * k[..., None], axis=(0, 1)) / nk
    return {"draft1/accept_mean": jnp.sum(accepted * k) / nk, "draft1/tau": 1.0 + jnp.sum(accepted * k) / nk,
            "draft1/rejected_hist": hist, "draft2/kept_ratio": jnp.sum(keep2) / nk}
