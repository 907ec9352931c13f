"""Drafter training losses and metrics (DeepSpec recipe, fp32 loss math).

W[n, i] = eval_mask * exp(-i / gamma). CE on the draft logits (Markov-corrected when present);
L1 = ||p_draft - p_target||_1 against the target's next-token distribution at the same prediction
point; KL(p_target || p_draft) against the same distribution (soft labels: with little data the
target's whole distribution says more per row than its greedy token). alpha = clamp(1 - L1/2, 0, 1)
is the teacher-forced acceptance probability, which gives the per-slot accept-rate estimate and the
expected acceptance length tau.

Split in two so the vocabulary-sized part can run in row chunks (`row_terms`, per supervised row:
only five scalars leave it) and the weighting/normalisation sees the whole batch (`combine`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.config import LossConfig
from carryover_jax.models.drafter import draft_index_table

Array = jax.Array


def position_weights(num_proposals: int, gamma: float) -> Array:
    return jnp.exp(-jnp.arange(num_proposals, dtype=jnp.float32) / gamma)


def target_probs(target_logits: Array, draft_vocab: tuple[int, ...] = ()) -> Array:
    """The target's next-token probabilities at the ids the drafter can propose: [..., V], or with a draft
    vocabulary [..., K] (still normalised over the whole vocabulary: the mass outside is what L1 adds)."""
    pt = jax.nn.softmax(target_logits.astype(jnp.float32), axis=-1)
    return jnp.take(pt, jnp.asarray(np.asarray(draft_vocab, np.int32)), axis=-1) if draft_vocab else pt


def l1_distance(logp: Array, pt_in: Array, draft_vocab: tuple[int, ...] = ()) -> Array:
    """||p_draft - p_target||_1 from the draft log-probabilities and `target_probs`; with a draft vocabulary
    the target's mass outside it counts in full, so that 1 - L1/2 stays the exact acceptance probability."""
    l1 = jnp.sum(jnp.abs(jnp.exp(logp) - pt_in), axis=-1)
    return l1 + jnp.maximum(1.0 - jnp.sum(pt_in, axis=-1), 0.0) if draft_vocab else l1


def acceptance(l1: Array) -> Array:
    """Speculative sampling's acceptance probability Σ min(p, q) = 1 - L1/2."""
    return jnp.clip(1.0 - 0.5 * l1, 0.0, 1.0)


def draft_vocab_probs(target_logits_in: Array, lse: Array) -> Array:
    """`target_probs` at a draft vocabulary from the target's logits at those ids only [..., K] and its
    log-sum-exp over the whole vocabulary [...] (what a response store keeps per token): the K columns of
    the LM head instead of all V."""
    return jnp.exp(target_logits_in.astype(jnp.float32) - lse[..., None].astype(jnp.float32))


def row_terms(draft_logits: Array, target_logits: Array, labels: Array, draft_vocab: tuple[int, ...] = ()):
    """[..., V] logits -> per-row (ce, l1, alpha, top1_correct, kl).

    With a draft vocabulary (sorted target ids) the draft logits are [..., K]: a label outside it
    has no CE (the drafter cannot propose it) and is never correct, and L1 counts the target's mass
    outside the vocabulary in full — so alpha stays the exact acceptance probability — and KL sums
    over the vocabulary only (the drafter can do nothing about the mass outside it)."""
    return prob_terms(draft_logits, target_probs(target_logits, draft_vocab), labels, draft_vocab,
                      target_logits.shape[-1])


def prob_terms(draft_logits: Array, pt_in: Array, labels: Array, draft_vocab: tuple[int, ...], vocab_size: int):
    """`row_terms` from the target's probabilities at the ids the drafter can propose (`target_probs`)."""
    z = draft_logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(z, axis=-1)
    if draft_vocab:
        idx = jnp.asarray(draft_index_table(draft_vocab, vocab_size))[labels]
        known = idx >= 0
        ce = jnp.where(known, -jnp.take_along_axis(logp, jnp.maximum(idx, 0)[..., None], axis=-1)[..., 0], 0.0)
        correct = (known & (jnp.argmax(z, -1) == idx)).astype(jnp.float32)
    else:
        ce = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
        correct = (jnp.argmax(z, -1) == labels).astype(jnp.float32)
    l1 = l1_distance(logp, pt_in, draft_vocab)
    kl = jnp.sum(jax.scipy.special.xlogy(pt_in, pt_in) - pt_in * logp, axis=-1)
    return ce, l1, acceptance(l1), correct, kl


def combine(ce: Array, l1: Array, alpha: Array, correct: Array, kl: Array, eval_mask: Array, *,
            loss: LossConfig) -> tuple[Array, dict]:
    """Per-row terms shaped [..., P] -> (loss, metrics), normalised by the batch's total weight; `loss` is
    resolved (`LossConfig.resolved`: no None weights)."""
    e = eval_mask.astype(jnp.float32)
    w = e * position_weights(e.shape[-1], loss.decay_gamma)
    wsum = jnp.maximum(jnp.sum(w), 1e-6)
    lead = tuple(range(e.ndim - 1))
    esum = jnp.maximum(jnp.sum(e, axis=lead), 1e-6)  # per slot
    metrics = {"ce_loss": jnp.sum(w * ce) / wsum, "top1_acc@slot": jnp.sum(correct * e, axis=lead) / esum,
               "l1_loss": jnp.sum(w * l1) / wsum, "kl_loss": jnp.sum(w * kl) / wsum}
    total = (loss.ce_weight * metrics["ce_loss"] + loss.l1_weight * metrics["l1_loss"]
             + loss.kl_weight * metrics["kl_loss"])
    ae = jax.lax.stop_gradient(alpha) * e
    metrics["accept_rate@slot"] = jnp.sum(ae, axis=lead) / esum
    # expected accepted length (with bonus) of each valid block, teacher forced
    blocks = e[..., 0] > 0
    tau = 1.0 + jnp.sum(jnp.cumprod(ae, axis=-1), axis=-1)
    metrics["tau_estimate"] = jnp.sum(jnp.where(blocks, tau, 0.0)) / jnp.maximum(jnp.sum(blocks), 1)
    metrics["loss"] = total
    metrics["supervised_tokens"] = jnp.sum(e)
    return total, metrics
