"""Speculative decoding with Carryover: jitted `draft_step` and `verify_step` over one state pytree.

Round (the paper's Carryover inference, Figure 1): the anchor (last committed token, not yet in the target
cache) sits at position L = target_cache.lengths = draft_cache.lengths.
- draft_step: block [anchor, MASK...] at L.., attending to the drafter's committed-context cache and,
  with Carryover, to the carried rows (the previous round's rejected verify features, valid iff
  j < rejected_count) -> P proposals (+ draft distributions q when sampling).
- verify_step: one target forward over [anchor, d_1..d_P] (writes P+1 cache slots, returns the tapped
  features) -> accepted count a, correction/bonus y -> commit d_1..d_a, y; target lengths L+a+1
  (rollback = moving lengths); the P+1 verify features are fused once: indices 0..a are appended to
  the drafter cache, a+1..P (+ e_rej) become the carried rows, rejected_count = P - a. Nothing
  leaves the device inside a round; `draft_step` copies no cache (only proposals, q, RNG come out).
Every shape is fixed by (batch, bucket, P): a round compiles once.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax import numerics
from carryover_jax.config import CARRY_INTERFACES, DrafterConfig, TargetConfig
from carryover_jax.decode import drafting as D
from carryover_jax.decode.sampling import is_stop, probs, sample
from carryover_jax.errors import RequestError
from carryover_jax.models.cache import KVCache
from carryover_jax.models.drafter import Drafter, frozen_from_target
from carryover_jax.models.greedy_head import greedy_tokens
from carryover_jax.models.target import TargetLM, new_cache
from carryover_jax.numerics import argmax, categorical

Array = jax.Array



@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Static (jit) settings of one speculative decoding run."""

    target: TargetConfig
    drafter: DrafterConfig
    attend_carried: bool = True  # the drafter attends to the carried rows (needs a drafter with e_rej)
    # what a carried row holds (the paper's interface ablation, as DVD trained it: `loss.carry`): the target's
    # verify "hidden" states (the method), the rejected "draft_tokens", or the target's own greedy
    # "target_tokens" at the rejected positions; tokens go through the frozen embedding instead of fc
    carry: str = "hidden"
    sampling: bool = False  # False: every row greedy, no draft distributions are materialised
    top_k: int = 0
    top_p: float = 1.0
    # z-lab's reference loop drafts greedily at any temperature; verification stays lossless because
    # q is then a point mass. Off: drafts are sampled at the target's temperature (DeepSpec).
    greedy_drafts: bool = False

    def __post_init__(self):  # the static sampling settings (per-row temperatures are checked by callers)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, numbers.Real) or not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if self.carry not in CARRY_INTERFACES:
            raise RequestError(f"carry must be one of {', '.join(CARRY_INTERFACES)}, got {self.carry!r}")

    @property
    def P(self) -> int:
        return self.drafter.num_proposals


@flax.struct.dataclass
class SpecState:
    target_cache: KVCache
    draft_cache: KVCache
    carried: Array  # [B, P, d] the last round's rejected verify features, fused and marked with e_rej
    rejected_count: Array  # [B]
    anchor: Array  # [B]
    out: Array  # [B, N + P + 1] committed tokens (first from prefill)
    num_out: Array  # [B] tokens committed to `out` so far
    done: Array  # [B]
    max_new: Array  # [B]
    temperature: Array  # [B]
    stop_ids: Array  # [n_stop] padded with -1
    rng: Array
    rounds: Array  # [B] verification rounds per row
    accepted: Array  # [B, R] accepted drafts per round (-1 = no round); R >= every row's rounds


def cache_slots(P: int, prompt_len, max_new):
    """Cache slots a row needs: its last verification starts at most at prompt + max_new - 2 (the
    anchor, the last committed token, is not in the cache) and writes P + 1 slots."""
    return prompt_len + max_new + P - 1


def _host_ints(x, name: str) -> np.ndarray:
    try:
        return np.asarray(jax.device_get(x)).astype(np.int64).reshape(-1)
    except jax.errors.TracerArrayConversionError:
        raise RequestError(f"prefill checks {name} against the cache on the host: call it outside jax.jit") from None


def check_request(sc: SpecConfig, tokens_shape, prompt_lens, max_new, *, max_len: int, out_size: int,
                  max_rounds: int | None = None) -> int:
    """Refuse, before anything compiles, a request whose writes would not fit its buffers: the cache
    writes clamp (`dynamic_update_slice`), so a verify chunk past `max_len` would overwrite earlier
    slots without a word. Returns the rounds buffer size: each round commits >= 1 token after the
    prefill's first, so a row has at most min(max_new, out_size) - 1 rounds (`max_rounds` None: out_size)."""
    b, bucket = tokens_shape
    if out_size < 1:
        raise RequestError(f"out_size must be >= 1, got {out_size}")
    if bucket > max_len:
        raise RequestError(f"the prompt bucket of {bucket} tokens is longer than the cache (max_len={max_len})")
    lens, news = _host_ints(prompt_lens, "prompt_lens"), _host_ints(max_new, "max_new")
    if lens.shape != (b,) or news.shape != (b,):
        raise RequestError(f"prompt_lens and max_new need one value per row ({b}), got {lens.size} and {news.size}")
    if lens.min() < 1 or lens.max() > bucket:
        raise RequestError(f"prompt lengths must be in [1, {bucket}] (the padded prompt), got {lens.tolist()}")
    if news.min() < 1:
        raise RequestError(f"max_new must be >= 1 per row, got {news.tolist()}")
    news = np.minimum(news, out_size)
    need = cache_slots(sc.P, lens, news)
    i = int(np.argmax(need))
    if need[i] > max_len:
        raise RequestError(
            f"row {i}: prompt {lens[i]} + max_new {news[i]} + {sc.P} proposals - 1 needs {need[i]} cache slots, "
            f"but max_len is {max_len}")
    rounds = max(int(news.max()) - 1, 1)
    if max_rounds is None:
        return max(out_size, 1)
    if max_rounds < rounds:
        raise RequestError(f"max_rounds={max_rounds} cannot record {rounds} rounds (max_new {int(news.max())}: "
                           "each round commits >= 1 token); leave it None to size it from out_size")
    return max_rounds


def prefill(sc: SpecConfig, target_params, draft_params, tokens, prompt_lens, max_new, temperature, stop_ids, rng,
            *, max_len: int, out_size: int, max_rounds: int | None = None) -> SpecState:
    """Target prefill with feature taps, first token, and the drafter's context cache for the prompt.
    The request is checked against the buffers first (`check_request`); `prefill_jit` is the jitted part."""
    rounds = check_request(sc, tokens.shape, prompt_lens, max_new, max_len=max_len, out_size=out_size,
                           max_rounds=max_rounds)
    return prefill_jit(sc, target_params, draft_params, tokens, prompt_lens, max_new, temperature, stop_ids, rng,
                       max_len=max_len, out_size=out_size, max_rounds=rounds)


@functools.partial(jax.jit, static_argnames=("sc", "max_len", "out_size", "max_rounds"))
def prefill_jit(sc: SpecConfig, target_params, draft_params, tokens, prompt_lens, max_new, temperature, stop_ids,
                rng, *, max_len: int, out_size: int, max_rounds: int) -> SpecState:
    b = tokens.shape[0]
    max_new = jnp.minimum(max_new, out_size)  # the output buffer bounds every row (callers size it)

    def target_rows(tokens, prompt_lens):
        cache = new_cache(sc.target, tokens.shape[0], max_len)
        logits, cache, taps = TargetLM(sc.target).apply(
            {"params": target_params}, tokens, cache=cache, tap_layers=sc.drafter.target_layer_ids,
            logit_indices=(prompt_lens - 1)[:, None],
        )
        return cache.with_lengths(prompt_lens), logits, taps

    cache, logits, taps = numerics.sub_batched(target_rows, tokens, prompt_lens, tokens_per_row=tokens.shape[1])
    rows = D.fuse_rows(sc.drafter, draft_params, jnp.concatenate(taps, axis=-1))
    dcache = D.append_rows(sc.drafter, draft_params, D.new_context_cache(sc.drafter, b, max_len), rows, prompt_lens)
    rng, sub = jax.random.split(rng)
    first = sample(sub, logits[:, 0], temperature, sc.top_k, sc.top_p)
    out = jnp.zeros((b, out_size + sc.P + 1), jnp.int32).at[:, 0].set(first)
    num_out = jnp.ones((b,), jnp.int32)
    return SpecState(
        target_cache=cache, draft_cache=dcache,
        carried=jnp.zeros((b, sc.P, rows.shape[-1]), rows.dtype),
        rejected_count=jnp.zeros((b,), jnp.int32), anchor=first, out=out, num_out=num_out,
        done=is_stop(first, stop_ids) | (num_out >= max_new), max_new=max_new, temperature=temperature,
        stop_ids=stop_ids, rng=rng, rounds=jnp.zeros((b,), jnp.int32),
        accepted=jnp.full((b, max_rounds), -1, jnp.int32),
    )


def _draft(sc: SpecConfig, target_params, draft_params, s: SpecState):
    """-> (proposals, q, new rng): only what drafting produces, so no state buffer is copied."""
    frozen = frozen_from_target(target_params, sc.target)
    carried = (s.carried, s.rejected_count) if sc.attend_carried else (None, None)
    logits = D.draft_block_logits(sc.drafter, draft_params, frozen, s.draft_cache, s.anchor, *carried,
                                  carried_fused=True)
    rng, sub = jax.random.split(s.rng)
    temperature = jnp.zeros_like(s.temperature) if sc.greedy_drafts else s.temperature
    toks, q, _ = D.sequential_proposals(sc.drafter, draft_params, logits, s.anchor, sub, temperature,
                                        sc.top_k, sc.top_p, sampling=sc.sampling)
    return toks, q, rng


draft_parts = jax.jit(_draft, static_argnames=("sc",))
draft_parts.__doc__ = "state -> (proposals [B, P], draft distributions [B, P, V] or None, new rng)"


def draft_step(sc: SpecConfig, target_params, draft_params, s: SpecState):
    """state -> (proposals [B, P], draft distributions [B, P, V] or None, state). The jitted part
    (`draft_parts`) returns only the proposals, q and the RNG; the caches pass through untouched."""
    toks, q, rng = draft_parts(sc, target_params, draft_params, s)
    return toks, q, s.replace(rng=rng)


def accept(sc: SpecConfig, logits, proposals, q, temperature, rng, tgt=None):
    """Accepted count a [B] and correction/bonus token y [B]. `tgt` [B, P+1]: the greedy tokens of the rows where
    the caller has them without the logits (`models/greedy_head.py`).

    Greedy: the longest prefix with d_i == argmax p_{i-1}; y = argmax p_a. Sampling: lossless
    rejection sampling (accept d_i w.p. min(1, p(d_i)/q(d_i)); on the first rejection y ~ norm(max(p-q, 0)),
    else the bonus y ~ p_P). Rows with temperature 0 inside a sampling batch reduce to greedy exactly
    because both p and q are one-hot there.
    """
    P = proposals.shape[1]
    if not sc.sampling:
        tgt = argmax(logits) if tgt is None else tgt
        a = jnp.sum(jnp.cumprod(proposals == tgt[:, :P], axis=1), axis=1).astype(jnp.int32)
        return a, jnp.take_along_axis(tgt, a[:, None], axis=1)[:, 0]
    p = probs(logits, temperature[:, None], sc.top_k, sc.top_p)  # [B, P+1, V]
    k_u, k_y = jax.random.split(rng)
    pd = jnp.take_along_axis(p[:, :P], proposals[..., None], axis=-1)[..., 0]
    qd = jnp.take_along_axis(q, proposals[..., None], axis=-1)[..., 0]
    u = jax.random.uniform(k_u, pd.shape)
    ok = u < jnp.minimum(1.0, pd / jnp.maximum(qd, 1e-10))
    a = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
    pa = jnp.take_along_axis(p, a[:, None, None], axis=1)[:, 0]
    qa = jnp.take_along_axis(q, jnp.minimum(a, P - 1)[:, None, None], axis=1)[:, 0]
    resid = jnp.where((a < P)[:, None], jnp.maximum(pa - qa, 0.0), pa)
    mass = jnp.sum(resid, axis=-1, keepdims=True)
    resid = jnp.where(mass > 1e-8, resid / jnp.maximum(mass, 1e-30), pa)
    y = categorical(k_y, jnp.where(resid > 0, jnp.log(jnp.maximum(resid, 1e-38)), -jnp.inf))
    return a, y.astype(jnp.int32)


def _verify(sc: SpecConfig, target_params, draft_params, s: SpecState, proposals, q, decided=None, screen=None):
    """`decided` = (a, y) replaces the acceptance test: a replay of a recorded sequence (eval/replay.py)
    commits its tokens through the engine's own verify, commit and carry. `screen`: the target head's
    (`Target.greedy_screen`): a greedy verification takes the rows' argmax tokens without the float32 head."""
    P = sc.P
    b = proposals.shape[0]
    active = ~s.done
    chunk = jnp.concatenate([s.anchor[:, None], proposals], axis=1)
    greedy = screen is not None and not sc.sampling
    res = TargetLM(sc.target).apply({"params": target_params}, chunk, cache=s.target_cache,
                                    tap_layers=sc.drafter.target_layer_ids, with_hidden=greedy, logits=not greedy)
    logits, tcache, taps = res[:3]
    tgt = greedy_tokens(sc.target, target_params, screen, res[3]) if greedy else None  # [B, P+1]
    rows = D.fuse_rows(sc.drafter, draft_params, jnp.concatenate(taps, axis=-1))  # [B, P+1, d], fused once
    rng, sub = jax.random.split(s.rng)
    a, y = accept(sc, logits, proposals, q, s.temperature, sub, tgt) if decided is None else decided

    # tokens committed this round: d_1..d_a, y — cut at a stop token and at max_new
    j = jnp.arange(P + 1)[None, :]
    seq = jnp.where(j < a[:, None], jnp.pad(proposals, ((0, 0), (0, 1))), y[:, None])
    n = a + 1
    stop_here = is_stop(seq, s.stop_ids) & (j < n[:, None])
    hit_stop = jnp.any(stop_here, axis=1)
    n = jnp.where(hit_stop, jnp.argmax(stop_here, axis=1) + 1, n)
    n = jnp.minimum(n, s.max_new - s.num_out)
    n = jnp.where(active, n, 0)

    def put(row, vals, start, count):
        cur = jax.lax.dynamic_slice_in_dim(row, start, P + 1)
        return jax.lax.dynamic_update_slice_in_dim(row, jnp.where(jnp.arange(P + 1) < count, vals, cur), start, 0)

    out = jax.vmap(put)(s.out, seq, s.num_out, n)
    num_out = s.num_out + n
    done = s.done | (active & (hit_stop | (num_out >= s.max_new)))

    keep = jnp.where(active, a + 1, 0)
    tcache = tcache.with_lengths(s.target_cache.lengths + keep)
    dcache = D.append_rows(sc.drafter, draft_params, s.draft_cache, rows, keep)
    if sc.attend_carried:
        idx = jnp.minimum(a[:, None] + 1 + jnp.arange(P)[None, :], P)  # the rejected verify indices
        if sc.carry == "hidden":
            carried = D.mark_carried(sc.drafter, draft_params, jnp.take_along_axis(rows, idx[..., None], axis=1))
        else:  # verify index i >= 1 holds d_i = proposals[i - 1]; the target's greedy token there is its argmax
            toks = (jnp.take_along_axis(proposals, idx - 1, axis=1) if sc.carry == "draft_tokens"
                    else jnp.take_along_axis(argmax(logits) if tgt is None else tgt, idx, axis=1)).astype(jnp.int32)
            carried = Drafter(sc.drafter).apply({"params": draft_params}, toks,
                                                frozen_from_target(target_params, sc.target),
                                                method=Drafter.fuse_carried).astype(s.carried.dtype)
    else:
        carried = s.carried
    rounds = s.rounds + active.astype(jnp.int32)
    # in bounds for every active row: prefill sized `accepted` for the most rounds a row can have
    r_idx = jnp.where(active, s.rounds, 0)
    accepted = s.accepted.at[jnp.arange(b), r_idx].set(jnp.where(active, a, s.accepted[jnp.arange(b), r_idx]))
    return s.replace(
        target_cache=tcache, draft_cache=dcache, carried=carried,
        rejected_count=jnp.where(active, P - a, 0).astype(jnp.int32),
        anchor=jnp.where(active, y, s.anchor), out=out, num_out=num_out, done=done, rng=rng, rounds=rounds,
        accepted=accepted,
    )


verify_step = jax.jit(_verify, static_argnames=("sc",), donate_argnames=("s",))
verify_step.__doc__ = "(state, proposals, q) -> state after acceptance, commit, rollback and carry"


def _round(sc, target_params, draft_params, s, screen=None):
    toks, q, rng = _draft(sc, target_params, draft_params, s)
    return _verify(sc, target_params, draft_params, s.replace(rng=rng), toks, q, screen=screen)


@functools.partial(jax.jit, static_argnames=("sc",), donate_argnames=("s",))
def generate_loop(sc: SpecConfig, target_params, draft_params, s: SpecState, screen=None) -> SpecState:
    """Rounds until every row is done, in one `lax.while_loop` (no host round-trips). `screen`: `_verify`'s."""
    return jax.lax.while_loop(lambda st: ~jnp.all(st.done),
                              lambda st: _round(sc, target_params, draft_params, st, screen), s)
