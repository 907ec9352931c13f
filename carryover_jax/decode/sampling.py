"""Logit processing and sampling, shared by AR decoding and speculative verification.

Temperature is traced per row (0 means greedy for that row); top-k and top-p are static because
they change the computation (a sort over the vocabulary), not just values. The same processing is
applied to draft and target distributions so rejection sampling stays lossless.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from carryover_jax.numerics import argmax, categorical

Array = jax.Array
_MASKED = -jnp.inf


def process_logits(logits: Array, temperature: Array, top_k: int = 0, top_p: float = 1.0) -> Array:
    """logits [..., V] -> tempered, filtered logits (masked entries -inf). temperature [...] > 0."""
    t = jnp.maximum(temperature, 1e-6)[..., None]
    x = logits.astype(jnp.float32) / t
    if top_k and top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, _MASKED, x)
    if top_p < 1.0:
        srt = jnp.sort(x, axis=-1)[..., ::-1]
        cum = jnp.cumsum(jax.nn.softmax(srt, axis=-1), axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        keep = (cum - jax.nn.softmax(srt, axis=-1)) < top_p
        cutoff = jnp.min(jnp.where(keep, srt, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x < cutoff, _MASKED, x)
    return x


def probs(logits: Array, temperature: Array, top_k: int = 0, top_p: float = 1.0) -> Array:
    """Sampling distribution; for rows with temperature 0, a one-hot at the argmax."""
    p = jax.nn.softmax(process_logits(logits, temperature, top_k, top_p), axis=-1)
    greedy = jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=p.dtype)
    return jnp.where((temperature > 0)[..., None], p, greedy)


def is_stop(tokens: Array, stop_ids: Array) -> Array:
    """tokens [...] -> bool [...]: the token is one of `stop_ids` (a fixed-size array padded with -1)."""
    return jnp.any(tokens[..., None] == stop_ids, axis=-1)


def sample(rng: Array, logits: Array, temperature: Array, top_k: int = 0, top_p: float = 1.0) -> Array:
    """logits [B, V], temperature [B] -> tokens [B] int32 (argmax where temperature == 0).

    Lowered for CPU, a batch with no sampling row skips the draw (its noise, top-k / top-p and argmax over
    the whole vocabulary; a `lax.cond`); on an accelerator the predicate would be a device-to-host copy per
    step, so both are computed there."""
    def both(rng, logits, temperature):
        drawn = categorical(rng, process_logits(logits, temperature, top_k, top_p))
        return jnp.where(temperature > 0, drawn, argmax(logits))

    def cpu(rng, logits, temperature):
        return jax.lax.cond(jnp.any(temperature > 0), both, lambda r, lg, t: argmax(lg), rng, logits, temperature)

    return jax.lax.platform_dependent(rng, logits, temperature, cpu=cpu, default=both)
