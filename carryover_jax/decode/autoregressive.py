"""Autoregressive decoding on the target: bucketed prefill, one-token steps, and a whole-generation
`lax.while_loop` that never returns to the host between tokens.

Prompts are right-padded (slot = position, so each row is independent of the others' lengths);
`lengths` in the cache moves per row. Each jitted function compiles once per (batch, bucket).
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from carryover_jax import numerics
from carryover_jax.config import TargetConfig
from carryover_jax.decode.sampling import is_stop, sample
from carryover_jax.models.cache import KVCache
from carryover_jax.models.target import TargetLM, new_cache

Array = jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "max_len"))
def prefill(cfg: TargetConfig, params, tokens: Array, prompt_lens: Array, max_len: int):
    """tokens [B, T_bucket] right-padded -> (cache with lengths = prompt_lens, logits [B, V] at the
    last prompt token of each row). A large batch runs in sub-batches on CPU (`numerics.sub_batched`)."""

    def rows(tokens, prompt_lens):
        cache = new_cache(cfg, tokens.shape[0], max_len)
        logits, cache, _ = TargetLM(cfg).apply(
            {"params": params}, tokens, cache=cache, logit_indices=(prompt_lens - 1)[:, None]
        )
        return cache.with_lengths(prompt_lens), logits[:, 0]

    return numerics.sub_batched(rows, tokens, prompt_lens, tokens_per_row=tokens.shape[1])


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def step(cfg: TargetConfig, params, cache: KVCache, tokens: Array, active: Array | None = None):
    """One AR step: tokens [B] at slot `cache.lengths` -> (logits [B, V], cache). Rows not `active`
    keep their length (their write is overwritten later)."""
    logits, new, _ = TargetLM(cfg).apply({"params": params}, tokens[:, None], cache=cache)
    if active is not None:
        new = new.with_lengths(cache.lengths + active.astype(jnp.int32))
    return logits[:, 0], new


@flax.struct.dataclass
class ARState:
    cache: KVCache
    out: Array  # [B, N] generated tokens (stop token included), padded
    num_out: Array  # [B] tokens generated so far
    done: Array  # [B]
    last: Array  # [B] token to feed next
    rng: Array


def start_state(first_logits, cache, *, rng, temperature, max_new, stop_ids, out_size: int, top_k=0, top_p=1.0):
    rng, sub = jax.random.split(rng)
    tok = sample(sub, first_logits, temperature, top_k, top_p)
    b = tok.shape[0]
    out = jnp.zeros((b, out_size), jnp.int32).at[:, 0].set(tok)
    num_out = jnp.ones((b,), jnp.int32)
    done = is_stop(tok, stop_ids) | (num_out >= max_new)
    return ARState(cache, out, num_out, done, tok, rng)


def ar_body(cfg: TargetConfig, params, s: ARState, *, temperature, max_new, stop_ids, top_k=0, top_p=1.0) -> ARState:
    active = ~s.done
    logits, new, _ = TargetLM(cfg).apply({"params": params}, s.last[:, None], cache=s.cache)
    cache = new.with_lengths(s.cache.lengths + active.astype(jnp.int32))
    rng, sub = jax.random.split(s.rng)
    tok = sample(sub, logits[:, 0], temperature, top_k, top_p)
    idx = jnp.minimum(s.num_out, s.out.shape[1] - 1)
    write = jnp.where(active, tok, s.out[jnp.arange(tok.shape[0]), idx])
    out = s.out.at[jnp.arange(tok.shape[0]), idx].set(write)
    num_out = s.num_out + active.astype(jnp.int32)
    done = s.done | (active & (is_stop(tok, stop_ids) | (num_out >= max_new)))
    last = jnp.where(active, tok, s.last)
    return ARState(cache, out, num_out, done, last, rng)


@functools.partial(
    jax.jit, static_argnames=("cfg", "out_size", "top_k", "top_p"), donate_argnames=("cache",)
)
def generate_loop(cfg: TargetConfig, params, cache: KVCache, first_logits: Array, rng: Array, temperature: Array,
                  max_new: Array, stop_ids: Array, *, out_size: int, top_k: int = 0, top_p: float = 1.0) -> ARState:
    """All decoding after prefill in one `lax.while_loop` (no host round-trips)."""
    kw = dict(temperature=temperature, max_new=max_new, stop_ids=stop_ids, top_k=top_k, top_p=top_p)
    s0 = start_state(first_logits, cache, rng=rng, out_size=out_size, **kw)
    return jax.lax.while_loop(
        lambda s: ~jnp.all(s.done), lambda s: ar_body(cfg, params, s, **kw), s0
    )
