"""The expected-decoding-rounds (EDR) objective (Zhao & Cai, "Training Parallel Speculative Draft Models by
Directly Minimizing Expected Decoding Rounds"): train the drafter on the number of rounds speculative
decoding takes over a whole recorded response, not on each block alone.

On a recorded sequence, a round anchored at position s (x_s committed) proposes x_{s+1}..x_{s+P}; slot k is
accepted with probability A[s, k] given slots < k were. A rejection at slot k commits the target's token
there and the next round is anchored at s + k; P accepted slots add the bonus token and the next anchor is
s + P + 1. With the occupancy ω[s] (the probability that a round is anchored at s; 1 at the first anchor of
each response span) the expected number of rounds is R = Σ_s ω[s] over anchor positions (`expected_rounds`,
a scan with a (P+1)-slot window). A[s, k] here is the teacher-forced acceptance probability of speculative
sampling at T = 1, α = Σ_v min(p_v, q_v) (`objectives.row_terms`): smooth in the drafter's params.

R depends on the acceptances of every anchor, so the gradient is exact through the chain rule:
∇R = Σ_{s,k} (∂R/∂A[s, k]) ∇A[s, k]. The step computes A at *every* anchor once without gradient,
∂R/∂A by differentiating the scan (the temporal-difference coefficients: occupancy x the value of
continuing the round over starting a new one), and then the surrogate Σ c[s, k] · A[s, k](θ) on the
N anchors the step samples anyway, each weighted by 1 / its inclusion probability (N of the K candidates:
K / N) — an unbiased estimate of ∇R with the usual N blocks carrying gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def expected_rounds(acc: Array, starts: Array) -> Array:
    """E[rounds] of one sequence. acc [S, P]: acceptance of slot k of the round anchored at s (0 past the
    response); starts [S] bool: where a round may be anchored (the anchor candidates). A round begins at
    the first anchor of each contiguous run of candidates (a response span); occupancy flowing to a
    non-candidate position ends there (the response is over)."""
    p = acc.shape[1]
    st = starts.astype(acc.dtype)
    first = st * (1.0 - jnp.pad(st[:-1], (1, 0)))

    def step(window, xs):
        a, s, f = xs
        om = (window[0] + f) * s
        alive_before = om * jnp.concatenate([jnp.ones((1,), a.dtype), jnp.cumprod(a)[:-1]])
        moves = jnp.concatenate([alive_before * (1.0 - a), om * jnp.prod(a)[None]])  # -> s+1 .. s+P+1
        return jnp.concatenate([window[1:], jnp.zeros((1,), a.dtype)]) + moves, om

    _, om = jax.lax.scan(step, jnp.zeros((p + 1,), acc.dtype), (acc, st, first))
    return jnp.sum(om)


def batch_rounds(acc: Array, starts: Array) -> Array:
    """[B, S, P], [B, S] -> E[rounds] summed over the batch."""
    return jnp.sum(jax.vmap(expected_rounds)(acc, starts))


def coefficients(acc: Array, starts: Array) -> tuple[Array, Array]:
    """(E[rounds] of the batch, ∂R/∂A [B, S, P]) at the given acceptances (no gradient to anything else)."""
    acc = jax.lax.stop_gradient(acc)
    return jax.value_and_grad(batch_rounds)(acc, starts)


def surrogate(coef_at_anchors: Array, alpha: Array, inclusion_weight: Array) -> Array:
    """Σ c · A(θ) / π over the sampled blocks: coef [B, N, P] (∂R/∂A gathered at the sampled anchors),
    alpha [B, N, P] (with gradient), inclusion_weight [B, N] (1 / inclusion probability; 0 = not kept).
    Its gradient is an unbiased estimate of ∇R."""
    return jnp.sum(jax.lax.stop_gradient(coef_at_anchors * inclusion_weight[..., None]) * alpha)
