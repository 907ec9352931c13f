"""Autoregressive decoding on the target: bucketed prefill, one-token steps, and a whole-generation
`lax.while_loop` that never returns to the host between tokens.

With `record` (feature layer ids) the prefill and the loop also keep, per token, what a response store holds
beside it (`Recorded`): the passes that generate a reply give its features, so prepare needs no second pass.

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
from carryover_jax.decode.sampling import is_stop, sample, sample_hidden
from carryover_jax.models.cache import KVCache
from carryover_jax.models import cpu_logsumexp
from carryover_jax.models.greedy_head import HeadScreen, greedy_tokens
from carryover_jax.models.target import TargetLM, head_logsumexp, new_cache

Array = jax.Array


@flax.struct.dataclass
class Recorded:
    """Per token of a recorded pass: the taps of the feature layers, concatenated [B, N, F], and the
    final-normed hidden state [B, N, d], both bfloat16 as a store keeps them, and the log-sum-exp of the
    LM head's logits at that bfloat16 state [B, N] (float32), as `train.responses.target_features` gives."""
    features: Array
    last_hidden: Array
    target_lse: Array


def recorded(cfg: TargetConfig, params, taps, normed, logits=None) -> Recorded:
    """What a store keeps of the taps and final-normed states [B, T, ...] of any pass. `logits` [B, T, V]: the
    head's logits at `normed`; where `normed` is already bfloat16 they are the logits at the stored state, so
    their log-sum-exp needs no second pass of the head."""
    last = normed.astype(jnp.bfloat16)
    if logits is not None and normed.dtype == jnp.bfloat16:
        lse = cpu_logsumexp.logsumexp(logits)
    else:
        lse = head_logsumexp(cfg, params, last)
    return Recorded(jnp.concatenate(taps, axis=-1).astype(jnp.bfloat16), last, lse)


@functools.partial(jax.jit, static_argnames=("cfg", "max_len", "record"))
def prefill(cfg: TargetConfig, params, tokens: Array, prompt_lens: Array, max_len: int, record: tuple[int, ...] = ()):
    """tokens [B, T_bucket] right-padded -> (cache with lengths = prompt_lens, logits [B, V] at the
    last prompt token of each row), and with `record` the prompt's `Recorded` [B, T_bucket, ...] third.
    A large batch runs in sub-batches on CPU (`numerics.sub_batched`)."""

    def rows(tokens, prompt_lens):
        cache = new_cache(cfg, tokens.shape[0], max_len)
        out = TargetLM(cfg).apply({"params": params}, tokens, cache=cache, logit_indices=(prompt_lens - 1)[:, None],
                                  tap_layers=record, with_hidden=bool(record))
        first = (out[1].with_lengths(prompt_lens), out[0][:, 0])
        return first + (recorded(cfg, params, out[2], out[3]),) if record else first

    return numerics.sub_batched(rows, tokens, prompt_lens, tokens_per_row=tokens.shape[1])


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def step(cfg: TargetConfig, params, cache: KVCache, tokens: Array, active: Array | None = None):
    """One AR step: tokens [B] at slot `cache.lengths` -> (logits [B, V], cache). Rows not `active`
    keep their length (their write is overwritten later)."""
    logits, new, _ = TargetLM(cfg).apply({"params": params}, tokens[:, None], cache=cache)
    if active is not None:
        new = new.with_lengths(cache.lengths + active.astype(jnp.int32))
    return logits[:, 0], new


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def greedy_step(cfg: TargetConfig, params, cache: KVCache, tokens: Array, screen: HeadScreen | None = None):
    """`step`'s greedy form: tokens [B] -> (the argmax tokens [B], cache), through the head's `screen` where given
    (`models/greedy_head.py`): the same tokens as `argmax(step(...)[0])`."""
    _, new, _, normed = TargetLM(cfg).apply({"params": params}, tokens[:, None], cache=cache, with_hidden=True,
                                            logits=False)
    return greedy_tokens(cfg, params, screen, normed[:, 0]), new


@flax.struct.dataclass
class ARState:
    cache: KVCache
    out: Array  # [B, N] generated tokens (stop token included), padded
    num_out: Array  # [B] tokens generated so far
    done: Array  # [B]
    last: Array  # [B] token to feed next
    rng: Array
    recorded: Recorded | None = None  # [B, N, ...] of the generated tokens (`record`)
    fed: Array | None = None  # [B] generated tokens fed back (and recorded) so far (`record`)


def start_state(first_logits, cache, *, rng, temperature, max_new, stop_ids, out_size: int, top_k=0, top_p=1.0,
                recorded: Recorded | None = None):
    """`recorded`: zero buffers [B, out_size, ...] to record into (None: nothing recorded)."""
    rng, sub = jax.random.split(rng)
    tok = sample(sub, first_logits, temperature, top_k, top_p)
    b = tok.shape[0]
    out = jnp.zeros((b, out_size), jnp.int32).at[:, 0].set(tok)
    num_out = jnp.ones((b,), jnp.int32)
    done = is_stop(tok, stop_ids) | (num_out >= max_new)
    fed = None if recorded is None else jnp.zeros((b,), jnp.int32)
    return ARState(cache, out, num_out, done, tok, rng, recorded, fed)


def ar_body(cfg: TargetConfig, params, s: ARState, *, temperature, max_new, stop_ids, top_k=0, top_p=1.0,
            record: tuple[int, ...] = (), screen: HeadScreen | None = None) -> ARState:
    """One step. With `record`, a row's last token is fed once more after it stops, for its features. With the
    head's `screen` (and no `record`, which keeps the logits' log-sum-exp) a step whose rows are all greedy takes
    its tokens without the float32 head (`models/greedy_head.py`)."""
    active = ~s.done
    screened = screen is not None and not record
    res = TargetLM(cfg).apply({"params": params}, s.last[:, None], cache=s.cache, tap_layers=record,
                              with_hidden=bool(record) or screened, logits=not screened)
    logits, new = res[0], res[1]
    fed = (s.fed < s.num_out) if record else active
    cache = new.with_lengths(s.cache.lengths + fed.astype(jnp.int32))
    rng, sub = jax.random.split(s.rng)
    if screened:
        tok = sample_hidden(sub, res[3][:, 0], lambda h: TargetLM(cfg).apply({"params": params}, h,
                                                                             method=TargetLM.head),
                            lambda h: greedy_tokens(cfg, params, screen, h), temperature, top_k, top_p)
    else:
        tok = sample(sub, logits[:, 0], temperature, top_k, top_p)
    idx = jnp.minimum(s.num_out, s.out.shape[1] - 1)
    write = jnp.where(active, tok, s.out[jnp.arange(tok.shape[0]), idx])
    out = s.out.at[jnp.arange(tok.shape[0]), idx].set(write)
    num_out = s.num_out + active.astype(jnp.int32)
    done = s.done | (active & (is_stop(tok, stop_ids) | (num_out >= max_new)))
    last = jnp.where(active, tok, s.last)
    kept = s.recorded
    if record:  # every row fed now was fed exactly max(s.fed) times before: one column for all of them
        at = jnp.max(s.fed)
        step = recorded(cfg, params, res[2], res[3], logits)

        def put(buf, x):
            old = jax.lax.dynamic_slice_in_dim(buf, at, 1, axis=1)
            keep = fed.reshape((-1,) + (1,) * (x.ndim - 1))
            return jax.lax.dynamic_update_slice_in_dim(buf, jnp.where(keep, x.astype(buf.dtype), old), at, axis=1)

        kept = jax.tree.map(put, s.recorded, step)
    return ARState(cache, out, num_out, done, last, rng, kept, None if s.fed is None else s.fed + fed)


@functools.partial(
    jax.jit, static_argnames=("cfg", "out_size", "top_k", "top_p", "record"), donate_argnames=("cache",)
)
def generate_loop(cfg: TargetConfig, params, cache: KVCache, first_logits: Array, rng: Array, temperature: Array,
                  max_new: Array, stop_ids: Array, *, out_size: int, top_k: int = 0, top_p: float = 1.0,
                  record: tuple[int, ...] = (), screen: HeadScreen | None = None) -> ARState:
    """All decoding after prefill in one `lax.while_loop` (no host round-trips). With `record` (feature
    layer ids) the state's `recorded` holds each generated token's features: one step more than without.
    `screen`: the head's (`Target.greedy_screen`), for the greedy steps."""
    kw = dict(temperature=temperature, max_new=max_new, stop_ids=stop_ids, top_k=top_k, top_p=top_p)
    buffers = None
    if record:
        b, d = first_logits.shape[0], cfg.hidden_size
        buffers = Recorded(jnp.zeros((b, out_size, len(record) * d), jnp.bfloat16),
                           jnp.zeros((b, out_size, d), jnp.bfloat16), jnp.zeros((b, out_size), jnp.float32))
    s0 = start_state(first_logits, cache, rng=rng, out_size=out_size, recorded=buffers, **kw)
    more = (lambda s: jnp.any(s.fed < s.num_out)) if record else (lambda s: ~jnp.all(s.done))
    return jax.lax.while_loop(more, lambda s: ar_body(cfg, params, s, record=record, screen=screen, **kw), s0)
