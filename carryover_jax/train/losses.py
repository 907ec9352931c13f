"""Drafter losses on training blocks (DeepSpec recipe), shared by baseline and DVD training.

Baseline: (online or stored) frozen target features and final-normed hidden; N anchors per sequence
-> blocks with the anchor mask -> drafter -> draft logits at the proposal slots (+ teacher-forced
Markov bias) and aligned target logits -> weighted CE (+ L1, + KL to the target's distribution).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from carryover_jax.config import DrafterConfig
from carryover_jax.models.drafter import Drafter, frozen_from_target, proposal_slots
from carryover_jax.models.layers import Prefix
from carryover_jax.models.target import TargetLM, head_at, head_columns
from carryover_jax.numerics import argmax
from carryover_jax.train import anchors as A
from carryover_jax.train import edr
from carryover_jax.train.objectives import (acceptance, combine, draft_vocab_probs, l1_distance, prob_terms,
                                            row_terms, target_probs)
from carryover_jax.train.step_config import StepConfig


def target_features(sc: StepConfig, target_params, input_ids):
    """Frozen target forward: concatenated taps [B, S, m·d] and final-normed hidden [B, S, d]."""
    taps, last = TargetLM(sc.target).apply({"params": target_params}, input_ids, sc.drafter.target_layer_ids,
                                           method=TargetLM.features)
    return jax.lax.stop_gradient(jnp.concatenate(taps, -1)), jax.lax.stop_gradient(last)


def chunked_rows(fn, rows: tuple, chunk: int):
    """fn over row-aligned arrays, `chunk` rows at a time when set (vocabulary-sized intermediates exist
    for one chunk at a time, forward and backward); outputs are per-row arrays."""
    r = rows[0].shape[0]
    if not chunk or r <= chunk:
        return fn(*rows)
    pad = (-r) % chunk
    chunked = [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(-1, chunk, *x.shape[1:]) for x in rows]
    out = jax.lax.map(jax.checkpoint(lambda xs: fn(*xs)), tuple(chunked))
    return jax.tree_util.tree_map(lambda x: x.reshape(-1, *x.shape[2:])[:r], out)


def proposal_hidden(params, dc: DrafterConfig, frozen, feats, blk: A.Blocks, carried=None, *, remat: bool = False):
    """The drafter over all N blocks of `blk` at once -> final-normed hidden [B, N, P, d] at the
    proposal slots. Block n sees context strictly before its anchor and only itself; `carried` =
    (rows [B, N*P, ...], positions [B, N*P], valid [B, N*P]): rows n*P .. n*P+P-1 are block n's
    (target features, or token ids for the token ablation)."""
    b, s = feats.shape[:2]
    t, n = dc.block_size, blk.anchors.shape[1]
    kw = {}
    if carried is not None:
        kw = dict(zip(("carried", "carried_positions", "carried_valid"), carried))
    h = Drafter(dc, remat=remat).apply(
        {"params": params}, blk.tokens, blk.positions, frozen, feats.astype(jnp.dtype(dc.backbone.dtype)),
        jnp.broadcast_to(jnp.arange(s)[None], (b, s)), Prefix(A.context_limit(blk, t)),
        block_mask=t, return_hidden=True, **kw,  # block-diagonal: each of the N blocks sees only itself
    )
    return h.reshape(b, n, t, -1)[:, :, proposal_slots(dc)]


def block_loss(params, sc: StepConfig, target_params, frozen, ids, feats, last, blk: A.Blocks, carried=None,
               lse=None):
    """Loss and metrics of the drafter on the blocks `blk` (baseline training, or DVD's draft 2);
    `carried` as in `proposal_hidden`, `lse` as in `block_terms`."""
    terms = block_terms(params, sc, target_params, frozen, ids, feats, last, blk, carried, lse)
    return combine(*terms, blk.eval_mask, loss=sc.loss)


def teacher(sc: StepConfig, target_params, lse):
    """fn(rows [R, d] of final-normed target hidden, their log-sum-exp [R]) -> the target's probabilities at
    the drafter's vocabulary (`objectives.target_probs`), without gradient.

    With the stored log-sum-exp (`batch_lse`, else None: the rows' values are then ignored) and a draft
    vocabulary only the head's K columns are computed (an 8,192-token vocabulary: a sixth of SmolLM2's head,
    which was over a quarter of a CPU step) — the same probabilities up to float32 rounding; otherwise the
    whole head."""
    dc = sc.drafter
    if lse is None or not dc.draft_vocab:
        return lambda h, _: jax.lax.stop_gradient(target_probs(
            TargetLM(sc.target).apply({"params": target_params}, h, method=TargetLM.head), dc.draft_vocab))
    cols = head_columns(sc.target, target_params, jnp.asarray(dc.draft_vocab, jnp.int32))
    return lambda h, lse_rows: jax.lax.stop_gradient(draft_vocab_probs(head_at(sc.target, cols, h), lse_rows))


def lse_at(lse, at):
    """The log-sum-exp [B, S] at positions `at` [B, K], flattened; zeros (unread by `teacher`) without one."""
    return jnp.zeros((at.size,), jnp.float32) if lse is None else jnp.take_along_axis(lse, at, 1).reshape(-1)


def block_terms(params, sc: StepConfig, target_params, frozen, ids, feats, last, blk: A.Blocks, carried=None,
                lse=None):
    """Per-row (ce, l1, alpha, top1, kl) [B, N, P] of the drafter on the blocks `blk` (`objectives.row_terms`);
    `lse` [B, S]: the target's log-sum-exp per position (`batch_lse`), or None."""
    b, s = ids.shape
    dc = sc.drafter
    p, n = dc.num_proposals, blk.anchors.shape[1]
    h = proposal_hidden(params, dc, frozen, feats, blk, carried, remat=sc.remat).reshape(b * n * p, -1)
    # the target's next-token distribution at each proposal's prediction point (label position - 1)
    pred_at = jnp.clip(blk.label_idx - 1, 0, s - 1).reshape(b, n * p)
    th = jnp.take_along_axis(last, pred_at[..., None], axis=1).reshape(b * n * p, -1)
    labels = blk.labels.reshape(-1)
    probs_at = teacher(sc, target_params, lse)

    def terms(hc, thc, lc, pc, tlc):
        z = draft_logits(params, dc, frozen, hc, pc)
        if sc.loss.labels == "target":  # self-distillation: the target's argmax over the whole vocabulary
            zt = jax.lax.stop_gradient(TargetLM(sc.target).apply({"params": target_params}, thc,
                                                                 method=TargetLM.head))
            return row_terms(z, zt, argmax(zt).astype(lc.dtype), dc.draft_vocab)
        return prob_terms(z, probs_at(thc, tlc), lc, dc.draft_vocab, sc.target.vocab_size)

    out = chunked_rows(terms, (h, th, labels, previous_tokens(dc, blk), lse_at(lse, pred_at)), sc.loss.chunk_rows)
    return tuple(x.reshape(b, n, p) for x in out)


def draft_logits(params, dc: DrafterConfig, frozen, h, prev):
    """Draft logits of proposal rows `h` [R, d]; the Markov drafter adds its transition bias from `prev` [R],
    the previous ground-truth token (teacher forcing)."""
    z = Drafter(dc).apply({"params": params}, h, frozen, method=Drafter.logits)
    if dc.markov_rank:
        z = z + Drafter(dc).apply({"params": params}, prev, method=Drafter.markov_bias)
    return z


def previous_tokens(dc: DrafterConfig, blk: A.Blocks) -> jax.Array:
    """[B * N * P] the token before each proposal slot: the anchor's for slot 1, else the previous label."""
    b, n, _ = blk.labels.shape
    first = blk.tokens.reshape(b, n, dc.block_size)[:, :, :1]
    return jnp.concatenate([first, blk.labels[..., :-1]], axis=-1).reshape(-1)


def target_greedy_labels(sc: StepConfig, target_params, last, blk: A.Blocks) -> jax.Array:
    """[B, N, P] the target's own greedy token at each proposal's position (labels=target), from its
    final hidden state one position earlier: what decoding would accept against."""
    b, n, p = blk.labels.shape
    pred_at = jnp.clip(blk.label_idx - 1, 0, last.shape[1] - 1).reshape(b, n * p)
    th = jnp.take_along_axis(last, pred_at[..., None], axis=1).reshape(b * n * p, -1)

    def greedy(h):
        return argmax(TargetLM(sc.target).apply({"params": target_params}, h, method=TargetLM.head))

    return chunked_rows(greedy, (th,), sc.loss.chunk_rows).reshape(b, n, p).astype(blk.labels.dtype)


def batch_features(sc: StepConfig, target_params, batch):
    if "features" in batch:
        return batch["features"], batch["last_hidden"]
    return target_features(sc, target_params, batch["input_ids"])


def batch_lse(batch):
    """[B, S] the target's log-sum-exp at each position where the batch's stored features come with it (a
    store `prepare` wrote), else None."""
    return batch["target_lse"][..., 0] if "features" in batch and "target_lse" in batch else None


def baseline_loss(params, sc: StepConfig, target_params, batch, rng, part=(0, 1)):
    """Baseline parallel training: N sampled anchors per sequence, no carried rows. `part`: the batch is
    micro-batch (index, count) of the optimizer step's (`anchors.part_rows`)."""
    target_params = jax.lax.stop_gradient(target_params)  # frozen: embedding and head included
    ids, lm = batch["input_ids"], batch["loss_mask"]
    feats, last = batch_features(sc, target_params, batch)
    anchors, keep, nvalid = A.sample_anchors(rng, lm, sc.num_anchors, part)
    blk = A.build_blocks(sc.drafter, ids, lm, anchors, keep, nvalid)
    frozen = frozen_from_target(target_params, sc.target)
    lse = batch_lse(batch)
    terms = block_terms(params, sc, target_params, frozen, ids, feats, last, blk, lse=lse)
    loss, metrics = combine(*terms, blk.eval_mask, loss=sc.loss)
    if sc.loss.objective == "edr":
        edr_loss, edr_metrics = edr_term(params, sc, target_params, frozen, ids, lm, feats, last, blk, terms[2],
                                         nvalid, lse)
        loss = loss + sc.loss.edr_weight * edr_loss
        metrics.update(edr_metrics, loss=loss)
    metrics.update(anchor_metrics(keep, nvalid, sc.num_anchors))
    return loss, metrics


def all_anchor_acceptance(params, sc: StepConfig, target_params, frozen, ids, lm, feats, last, lse=None) -> jax.Array:
    """A [B, S, P] without gradient: the teacher-forced acceptance α of every slot of a round anchored at
    every position (0 where the position is no anchor candidate or the slot has no label).

    Only candidates are computed: each row's candidate positions are moved to the front (ascending) and
    taken `num_anchors` at a time (one drafter forward per group); a group with no candidate in any row is
    skipped (`lax.cond`), so the prompt and padding cost nothing (on the default, 320-token rows with <= 128
    response tokens: 2 groups of 64 instead of 5). The target's distribution is computed once per position,
    not once per (anchor, slot): a valid slot k of the round anchored at candidate j predicts from position
    j + k, itself a candidate (every position up to the slot's label is in the response), which is candidate
    j + k of the compacted order — so a group of g anchors needs g + P - 1 target rows, not g * P. `lse` as in
    `block_terms`."""
    b, s = ids.shape
    dc = sc.drafter
    g, p = sc.num_anchors, dc.num_proposals
    groups = -(-s // g)
    width = groups * g
    cand = A.anchor_candidates(lm)
    order = jnp.argsort(~cand, axis=1, stable=True).astype(jnp.int32)  # candidates first, ascending
    count = jnp.sum(cand, axis=1)
    order = jnp.pad(order, ((0, 0), (0, width + p - 1 - s)))
    in_count = jnp.arange(width + p - 1)[None, :] < count[:, None]
    params = jax.lax.stop_gradient(params)
    probs_at = teacher(sc, target_params, lse)
    # row r of a group's target rows [B * (g + P - 1)] that slot k of anchor i reads
    reads = (jnp.arange(b)[:, None, None] * (g + p - 1) + jnp.arange(g)[None, :, None]
             + jnp.arange(p)[None, None, :]).reshape(-1)

    def group(i):
        keep = jax.lax.dynamic_slice_in_dim(in_count, i * g, g, axis=1)

        def compute(_):
            anchors = jnp.where(keep, jax.lax.dynamic_slice_in_dim(order, i * g, g, axis=1), 0)
            blk = A.build_blocks(dc, ids, lm, anchors, keep, jnp.sum(keep, axis=1))
            h = proposal_hidden(params, dc, frozen, feats, blk, remat=sc.remat).reshape(b * g * p, -1)
            at = jax.lax.dynamic_slice_in_dim(order, i * g, g + p - 1, axis=1)  # candidates i*g .. i*g+g+P-2
            th = jnp.take_along_axis(last, at[..., None], axis=1).reshape(b * (g + p - 1), -1)
            pt = chunked_rows(probs_at, (th, lse_at(lse, at)), sc.loss.chunk_rows)

            def alpha(hc, rc, pc):
                logp = jax.nn.log_softmax(draft_logits(params, dc, frozen, hc, pc).astype(jnp.float32), axis=-1)
                return acceptance(l1_distance(logp, pt[rc], dc.draft_vocab))

            a = chunked_rows(alpha, (h, reads, previous_tokens(dc, blk)), sc.loss.chunk_rows).reshape(b, g, p)
            return a * blk.eval_mask * keep[..., None]

        return jax.lax.cond(jnp.any(keep), compute, lambda _: jnp.zeros((b, g, p), jnp.float32), None)

    acc = jax.lax.map(group, jnp.arange(groups)).transpose(1, 0, 2, 3).reshape(b, width, p)  # compacted
    # back to positions: slot j of row i holds the candidate at order[i, j]; slots past a row's count drop
    dest = jnp.where(in_count[:, :width], order[:, :width], s)
    out = jnp.zeros((b, s, p), jnp.float32).at[jnp.arange(b)[:, None], dest].set(acc, mode="drop")
    return jax.lax.stop_gradient(out)


def edr_term(params, sc: StepConfig, target_params, frozen, ids, lm, feats, last, blk: A.Blocks, alpha, nvalid,
             lse=None):
    """The EDR surrogate on the sampled blocks (`train/edr.py`), normalised per anchor candidate, and its
    metrics: expected rounds per candidate and the τ they imply."""
    acc = all_anchor_acceptance(params, sc, target_params, frozen, ids, lm, feats, last, lse)
    cand = A.anchor_candidates(lm)
    rounds, coef = edr.coefficients(acc, cand)
    at = jnp.take_along_axis(coef, blk.anchors[..., None], axis=1) * blk.eval_mask
    kept = jnp.sum(blk.keep, axis=1, keepdims=True)
    weight = jnp.where(blk.keep, nvalid[:, None] / jnp.maximum(kept, 1), 0.0)
    tokens = jnp.maximum(jnp.sum(cand), 1)
    loss = edr.surrogate(at, alpha, weight) / tokens
    return loss, {"edr/rounds_per_token": rounds / tokens, "edr/tau": tokens / jnp.maximum(rounds, 1e-6),
                  "edr_loss": loss}


def anchor_metrics(keep, nvalid, n: int) -> dict:
    return {"anchors_per_seq": jnp.mean(jnp.sum(keep, axis=1).astype(jnp.float32)),
            "valid_anchor_ratio": jnp.mean(jnp.minimum(nvalid, n) / jnp.maximum(nvalid, 1))}
