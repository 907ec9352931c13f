"""Host-side generation API for notebooks and the CLI: prompts in, texts/ids and stats out."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from carryover_jax.decode import autoregressive as ar
from carryover_jax.decode import speculative as sp
from carryover_jax.decode.buckets import next_bucket, prompt_bucket
from carryover_jax.errors import CarryoverError, RequestError
from carryover_jax.models.drafter import check_pair

MAX_STOP_IDS = 8  # stop ids are a fixed-size traced array (padded with -1): no recompiles per set


@dataclasses.dataclass
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]  # generated ids, including the stop token when one ended the sequence
    text: str | None
    stop_reason: str  # "stop_token" | "length"
    stats: dict[str, Any]
    # with `generate(features=...)`: per token of prompt_ids + token_ids, what a response store keeps beside it
    # ("features", "last_hidden", "target_lse" [S, 1]: `autoregressive.Recorded`)
    features: dict[str, np.ndarray] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text, "token_ids": self.token_ids, "prompt_tokens": len(self.prompt_ids),
            "stop_reason": self.stop_reason, "stats": self.stats,
        }


def _compiled_count() -> int | None:
    try:  # private jax API, only used to label timings
        return ar.prefill._cache_size() + ar.generate_loop._cache_size()
    except AttributeError:
        return None


def _screen(target):
    """The target's greedy-head screen (`Target.greedy_screen`; None for a target given as another object)."""
    return target.greedy_screen() if hasattr(target, "greedy_screen") else None


def _as_list(x, n, name):
    if isinstance(x, (list, tuple, np.ndarray)):
        if len(x) != n:
            raise CarryoverError(f"{name} has {len(x)} entries for {n} prompts")
        return list(x)
    return [x] * n


def encode_prompts(target, prompts: Sequence[str | Sequence[int]], chat: bool) -> list[list[int]]:
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str) or (isinstance(p, (list, tuple)) and p and isinstance(p[0], dict)):
            ids = target.encode(p, chat=chat)
        else:
            try:
                arr = np.asarray(p) if not isinstance(p, (dict, bytes)) else None
            except Exception:  # ragged nesting, ...
                arr = None
            if arr is None or arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise RequestError(f"prompt {i} must be a string, a list of chat messages or a list of token ids, "
                                   f"got {type(p).__name__}: {str(p)[:60]}")
            ids = arr.tolist()
        if not ids:
            raise RequestError(f"prompt {i} is empty")
        out.append([int(t) for t in ids])
    return out


def pad_batch(ids: list[list[int]], bucket: int, pad_id: int = 0) -> np.ndarray:
    arr = np.full((len(ids), bucket), pad_id, np.int32)
    for i, row in enumerate(ids):
        arr[i, : len(row)] = row
    return arr


def _bad_int(x, low: int) -> bool:
    return isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < low


def check_sampling(*, top_k: int = 0, top_p: float = 1.0, temperature=0.0, max_new_tokens=1,
                   max_len: int | None = None) -> None:
    """Request settings checked before anything is loaded or compiled (the CLI calls this first)."""
    if _bad_int(top_k, 0):
        raise RequestError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    try:
        p = float(top_p)
    except (TypeError, ValueError):
        raise RequestError(f"top_p must be a number in (0, 1], got {top_p!r}") from None
    if not (np.isfinite(p) and 0.0 < p <= 1.0):
        raise RequestError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
    temps = temperature if isinstance(temperature, (list, tuple, np.ndarray)) else [temperature]
    for t in temps:
        try:
            ok = np.isfinite(float(t)) and float(t) >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise RequestError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
    news = max_new_tokens if isinstance(max_new_tokens, (list, tuple, np.ndarray)) else [max_new_tokens]
    for m in news:
        if _bad_int(m, 1):
            raise RequestError(f"max_new_tokens must be an integer >= 1, got {m!r}")
    if max_len is not None and _bad_int(max_len, 1):
        raise RequestError(f"max_len must be an integer >= 1, got {max_len!r}")


def check_context(prompt_lens: Sequence[int], max_new: Sequence[int], limit: int) -> None:
    """Refuse, before planning a cache, a request that does not fit the target's context."""
    for i, (p, m) in enumerate(zip(prompt_lens, max_new)):
        if p + m > limit:
            raise RequestError(
                f"prompt {i} has {p:,} tokens{f' + max_new_tokens {m:,}' if p <= limit else ''}, more than the "
                f"target's context of {limit:,} tokens (max_position_embeddings)"
            )


def plan_lengths(prompt_lens: Sequence[int], max_new: Sequence[int], max_len: int | None, limit: int):
    """Prompt bucket and cache length; raises one clear error if a prompt cannot fit."""
    if max_len is not None and max_len > limit:  # slots past the context hold no valid position
        raise RequestError(f"max_len {max_len:,} is longer than the target's context of {limit:,} tokens "
                           "(max_position_embeddings)")
    longest = max(prompt_lens)
    bucket = prompt_bucket(longest)
    need = max(p + m for p, m in zip(prompt_lens, max_new))
    cache_len = max_len or max(bucket, next_bucket(need))
    if cache_len > limit and max_len is None:
        cache_len = max(limit, bucket)
    for i, (p, m) in enumerate(zip(prompt_lens, max_new)):
        if p + m > cache_len:
            raise RequestError(
                f"prompt {i} has {p} tokens; with max_new_tokens={m} it needs {p + m} cache slots "
                f"but the cache holds {cache_len}{' (max_len)' if max_len else ''}"
            )
    # a user-given cache may be shorter than the prompt bucket: prefill then uses the cache length
    return min(bucket, cache_len), cache_len


def _stop_array(stops: list[int]):
    return jnp.asarray(stops + [-1] * (MAX_STOP_IDS - len(stops)), jnp.int32)


def _generation(target, prompt_ids: list[int], row, count: int, stops: list[int], stats: dict) -> Generation:
    """One row of a device output buffer -> a Generation (ids, text, why it stopped)."""
    toks = [int(t) for t in row[:count]]
    reason = "stop_token" if toks and toks[-1] in stops else "length"
    text = target.decode(toks) if getattr(target, "tokenizer", None) is not None else None
    return Generation(prompt_ids, toks, text, reason, {"new_tokens": len(toks), **stats})


def _request(target, prompts, max_new_tokens, temperature, stop_token_ids, chat):
    """Validated per-prompt request values: (prompt ids, max_new, temperatures, stop ids)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not prompts:
        raise CarryoverError("no prompts")
    ids = encode_prompts(target, prompts, chat)
    n = len(ids)
    max_new = [int(m) for m in _as_list(max_new_tokens, n, "max_new_tokens")]
    temps = [float(t) for t in _as_list(temperature, n, "temperature")]
    check_sampling(temperature=temps, max_new_tokens=max_new)
    check_context([len(r) for r in ids], max_new, target.cfg.max_position_embeddings)
    vocab = target.cfg.vocab_size
    for i, r in enumerate(ids):
        if min(r) < 0 or max(r) >= vocab:
            raise RequestError(f"prompt {i} has token id {min(r) if min(r) < 0 else max(r)} outside the "
                               f"target's vocabulary [0, {vocab})")
    stops = list(target.stop_token_ids if stop_token_ids is None else stop_token_ids)
    if len(stops) > MAX_STOP_IDS:
        raise CarryoverError(f"at most {MAX_STOP_IDS} stop token ids")
    return ids, max_new, temps, stops


def generate(
    target,
    prompts: Sequence[str | Sequence[int]],
    *,
    max_new_tokens: int | Sequence[int] = 128,
    temperature: float | Sequence[float] = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    stop_token_ids: Sequence[int] | None = None,
    seed: int = 0,
    chat: bool = True,
    max_len: int | None = None,
    features: Sequence[int] | None = None,
) -> list[Generation]:
    """Batched autoregressive generation with the target alone (the reference for speculative decoding).

    `prompts` are strings (chat-templated when the tokenizer has a template and `chat`) or token-id
    lists. Greedy when temperature is 0. Per-prompt `max_new_tokens`/`temperature` may be lists.
    `features` (layer ids, as `data.feature_layer_ids`): each Generation also carries the target's features
    of its whole sequence, taken from the passes that generated it (the same tokens; one step more).
    """
    cfg, params = target.cfg, target.params
    check_sampling(top_k=top_k, top_p=top_p, temperature=temperature, max_new_tokens=max_new_tokens, max_len=max_len)
    ids, max_new, temps, stops = _request(target, prompts, max_new_tokens, temperature, stop_token_ids, chat)
    lens = [len(r) for r in ids]
    n = len(ids)
    bucket, cache_len = plan_lengths(lens, max_new, max_len, cfg.max_position_embeddings)
    out_size = next_bucket(max(max_new), minimum=1)

    tokens = jnp.asarray(pad_batch(ids, bucket))
    compiled_before = _compiled_count()
    t0 = time.perf_counter()
    record = tuple(features or ())
    cache, first_logits, *prompt_rec = ar.prefill(cfg, params, tokens, jnp.asarray(lens, jnp.int32),
                                                  max_len=cache_len, record=record)
    jax.block_until_ready(first_logits)
    t1 = time.perf_counter()
    state = ar.generate_loop(
        cfg, params, cache, first_logits, jax.random.key(seed), jnp.asarray(temps, jnp.float32),
        jnp.asarray(max_new, jnp.int32), _stop_array(stops), out_size=out_size, top_k=top_k, top_p=top_p,
        record=record, screen=_screen(target),
    )
    out, num, recs = jax.device_get((state.out, state.num_out, (*prompt_rec, state.recorded) if record else None))
    t2 = time.perf_counter()
    total_new = int(np.sum(num))
    # Timings of a call that had to compile include XLA compile time; say so instead of hiding it.
    includes_compile = _compiled_count() != compiled_before
    gens = [_generation(target, ids[i], out[i], num[i], stops, {
        "prefill_s": round(t1 - t0, 4),
        "decode_s": round(t2 - t1, 4),
        "time_s": round(t2 - t0, 4),
        # per-sequence rate of this batched call: all rows share the wall clock
        "tokens_per_s": round(int(num[i]) / max(t2 - t0, 1e-9), 2),
        "batch_tokens_per_s": round(total_new / max(t2 - t0, 1e-9), 2),
        "batch": n,
        "includes_compile": includes_compile,
    }) for i in range(n)]
    if record:
        for i, g in enumerate(gens):  # the prompt's rows from the prefill, the reply's from the loop
            g.features = {k: np.concatenate([getattr(recs[0], k)[i, :lens[i]], getattr(recs[1], k)[i, :num[i]]])
                          for k in ("features", "last_hidden", "target_lse")}
            g.features["target_lse"] = g.features["target_lse"][:, None]
    return gens


def speculative_generate(
    target,
    drafter,
    prompts: Sequence[str | Sequence[int]],
    *,
    carryover: bool = True,
    max_new_tokens: int | Sequence[int] = 128,
    temperature: float | Sequence[float] = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    stop_token_ids: Sequence[int] | None = None,
    seed: int = 0,
    chat: bool = True,
    max_len: int | None = None,
    stepwise: bool = False,
    greedy_drafts: bool = False,
    carry: str = "hidden",
) -> tuple[list[Generation], dict[str, Any]]:
    """Speculative decoding of `prompts` with `drafter` = a `DraftModel` (load_drafter / init_drafter) or a (DrafterConfig, params) pair.

    Returns per-prompt `Generation`s and run stats: `tau` (committed tokens per verification round,
    micro-averaged), `rounds`, tokens/s and, with `stepwise=True` (a host-driven round loop instead of
    one `lax.while_loop`), the time split between drafting and verification. `greedy_drafts` drafts by
    argmax at any temperature (z-lab's reference loop), still lossless. `carryover`: the drafter attends
    to the previous round's rejected rows (`SpecConfig.attend_carried`); it needs a drafter that owns
    the Carryover embedding `e_rej` (`DrafterConfig.carryover`). `carry`: what those rows hold, as the drafter
    was trained (`loss.carry`): "hidden" (the target's verify states), "draft_tokens" or "target_tokens".
    """
    dcfg, dparams = (drafter.cfg, drafter.params) if hasattr(drafter, "cfg") else drafter
    if carryover and not dcfg.carryover:
        raise CarryoverError("this drafter has no Carryover embedding; load it with carryover=True or pass carryover=False")
    check_pair(dcfg, target.cfg)
    check_sampling(top_k=top_k, top_p=top_p, temperature=temperature, max_new_tokens=max_new_tokens, max_len=max_len)
    ids, max_new, temps, stops = _request(target, prompts, max_new_tokens, temperature, stop_token_ids, chat)
    n = len(ids)
    P = dcfg.num_proposals
    lens = [len(r) for r in ids]
    # a verify chunk writes P+1 slots past the committed length, and the drafter cache appends P+1 rows
    bucket, cache_len = plan_lengths(lens, [m + P + 1 for m in max_new], max_len, target.cfg.max_position_embeddings)
    out_size = next_bucket(max(max_new), minimum=1)
    sc = sp.SpecConfig(target=target.cfg, drafter=dcfg, attend_carried=carryover, sampling=max(temps) > 0,
                       top_k=top_k, top_p=top_p, greedy_drafts=greedy_drafts, carry=carry)
    tp = target.params
    t0 = time.perf_counter()
    state = sp.prefill(
        sc, tp, dparams, jnp.asarray(pad_batch(ids, bucket)), jnp.asarray(lens, jnp.int32),
        jnp.asarray(max_new, jnp.int32), jnp.asarray(temps, jnp.float32),
        _stop_array(stops), jax.random.key(seed),
        max_len=cache_len, out_size=out_size, max_rounds=out_size,
    )
    jax.block_until_ready(state.out)
    t1 = time.perf_counter()
    draft_s = verify_s = 0.0
    if stepwise:
        while not bool(jnp.all(state.done)):
            ta = time.perf_counter()
            toks, q, state = sp.draft_step(sc, tp, dparams, state)
            jax.block_until_ready(toks)
            tb = time.perf_counter()
            state = sp.verify_step(sc, tp, dparams, state, toks, q, screen=_screen(target))
            jax.block_until_ready(state.num_out)
            draft_s += tb - ta
            verify_s += time.perf_counter() - tb
    else:
        state = sp.generate_loop(sc, tp, dparams, state, _screen(target))
    out, num_out, rounds, accepted = jax.device_get((state.out, state.num_out, state.rounds, state.accepted))
    t2 = time.perf_counter()
    results = [_generation(target, ids[i], out[i], num_out[i], stops, {
        "rounds": int(rounds[i]), "tau": round((int(num_out[i]) - 1) / max(int(rounds[i]), 1), 4),
        "accepted_per_round": [int(a) for a in accepted[i, : rounds[i]]], "time_s": round(t2 - t0, 4),
        "tokens_per_s": round(int(num_out[i]) / max(t2 - t0, 1e-9), 2), "batch": n,
    }) for i in range(n)]
    total_tokens = int(np.sum(num_out))
    total_rounds = int(np.sum(rounds))
    stats = {
        "tau": round(float(np.sum(num_out - 1)) / max(total_rounds, 1), 4),
        "rounds": total_rounds, "new_tokens": total_tokens, "batch": n, "carryover": carryover,
        "prefill_s": round(t1 - t0, 4), "decode_s": round(t2 - t1, 4), "time_s": round(t2 - t0, 4),
        "tokens_per_s": round(total_tokens / max(t2 - t0, 1e-9), 2),
    }
    if stepwise:
        stats.update(draft_s=round(draft_s, 4), verify_s=round(verify_s, 4),
                     draft_fraction=round(draft_s / max(draft_s + verify_s, 1e-9), 4))
    return results, stats
