"""Decoding with a drafter: its committed-context KV cache, one drafting round's block (with the
carried rejected rows), and turning backbone logits into proposals and the draft distributions q.

The module (`models/drafter.py`) defines the params and the forward; this file holds the engine's
use of it. Context rows enter the cache once, when they are committed (`fuse_rows`, then
`append_rows`), and are never transformed by the draft layers; carried rows live for one round only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from carryover_jax.config import DrafterConfig
from carryover_jax.decode.sampling import probs, sample
from carryover_jax.models.cache import KVCache, write_chunk
from carryover_jax.models.drafter import (Drafter, cap_logits, carried_segment_mask, in_head_dtype,
                                          logits_from_hidden, proposal_slots, to_target_ids, to_target_probs)
from carryover_jax.models.layers import LiveMask, tied_logits
from carryover_jax.numerics import argmax

Array = jax.Array


def new_context_cache(cfg: DrafterConfig, batch: int, max_len: int) -> KVCache:
    bc = cfg.backbone
    return KVCache.zeros(num_layers=bc.num_layers, batch=batch, max_len=max_len,
                         num_kv_heads=bc.layer_kv_heads(0), head_dim=bc.layer_head_dim(0), dtype=bc.numerics.cache_storage)


def fuse_rows(cfg: DrafterConfig, params, features: Array) -> Array:
    """Target features [B, R, m·d] -> fused rows [B, R, d] (`fc` + `hidden_norm`)."""
    return Drafter(cfg).apply({"params": params}, features, method=Drafter.fuse)


def mark_carried(cfg: DrafterConfig, params, fused: Array) -> Array:
    """Fused rows -> carried rows (+ e_rej), so the rejected rows verification fused for the cache
    append are not fused by `fc` a second time."""
    return Drafter(cfg).apply({"params": params}, fused, method=Drafter.mark_carried)


def append_rows(cfg: DrafterConfig, params, cache: KVCache, rows: Array, count: Array) -> KVCache:
    """Project newly committed fused rows [B, R, d] (`fuse_rows`; the first `count[b]` valid) into the
    cache at slots `lengths .. lengths+R-1` (= their positions); lengths += count. Only new rows are
    projected."""
    r = rows.shape[1]
    positions = cache.lengths[:, None] + jnp.arange(r)[None, :]
    ks, vs = Drafter(cfg).apply({"params": params}, rows, positions, method=Drafter.project)
    return KVCache(
        k=tuple(write_chunk(buf, k, cache.lengths) for buf, k in zip(cache.k, ks)),
        v=tuple(write_chunk(buf, v, cache.lengths) for buf, v in zip(cache.v, vs)),
        lengths=cache.lengths + count.astype(jnp.int32),
    )


def block_tokens(cfg: DrafterConfig, anchor: Array) -> Array:
    """[anchor, MASK x (B-1)] for each row."""
    b = anchor.shape[0]
    masks = jnp.full((b, cfg.block_size - 1), cfg.mask_token_id, jnp.int32)
    return jnp.concatenate([anchor[:, None].astype(jnp.int32), masks], axis=1)


def draft_block_logits(cfg: DrafterConfig, params, frozen, cache: KVCache, anchor: Array,
                       carried: Array | None = None, rejected_count: Array | None = None, *,
                       carried_fused: bool = False):
    """One drafting round's backbone logits for the proposal slots, [B, P, V] (or [B, P, K] over the
    draft vocabulary).

    The anchor sits at position `cache.lengths` (context is strictly before it; attention reads the
    cache only up to the longest row). Carried rows j sit at `anchor_pos + j` and are visible iff
    j < rejected_count; pass `carried=None` for the plain drafter. `carried` holds target features
    [B, P, m·d], or with `carried_fused` rows already fused and marked (`mark_carried`) [B, P, d].
    Shapes never depend on the counts.
    """
    m = Drafter(cfg)
    b, t = anchor.shape[0], cfg.block_size
    anchor_pos = cache.lengths
    positions = anchor_pos[:, None] + jnp.arange(t)[None, :]
    ctx_mask = LiveMask(jnp.broadcast_to(cache.lengths[:, None], (b, t)))
    rows = ()
    if carried is not None:
        p = carried.shape[1]
        cpos = anchor_pos[:, None] + jnp.arange(p)[None, :]
        valid = jnp.arange(p)[None, :] < rejected_count[:, None]
        fused = carried if carried_fused else m.apply({"params": params}, carried, method=Drafter.fuse_carried)
        rows = ((fused, cpos, carried_segment_mask(valid, t)),)
    h = m.apply({"params": params}, block_tokens(cfg, anchor), positions, frozen,
                cached=(cache.k, cache.v, ctx_mask), rows=rows, method=Drafter.block_hidden)
    h = h[:, proposal_slots(cfg)]
    if cfg.draft_vocab:
        return m.apply({"params": params}, h, frozen, method=Drafter.logits)
    if frozen.get("head") is None:  # tied: the numerics' head forms (CPU: the few-row kernel or vocabulary-major)
        return cap_logits(tied_logits(in_head_dtype(h, frozen), frozen["embed"], cfg.numerics), frozen)
    return logits_from_hidden(h, frozen)


def markov_bias(cfg: DrafterConfig, params, prev_tokens: Array) -> Array:
    return Drafter(cfg).apply({"params": params}, prev_tokens, method=Drafter.markov_bias)


def teacher_forced_logits(cfg: DrafterConfig, params, backbone_logits: Array, anchor: Array, targets: Array):
    """Markov-corrected logits when the previous tokens are known: proposal i's previous token is
    the anchor for i = 0, else targets[:, i-1]. (Identity for DFlash.)"""
    if not cfg.markov_rank:
        return backbone_logits
    prev = jnp.concatenate([anchor[:, None], targets[:, :-1]], axis=1)
    return backbone_logits + markov_bias(cfg, params, prev)


def sequential_proposals(cfg: DrafterConfig, params, backbone_logits: Array, anchor: Array, rng: Array,
                         temperature: Array, top_k: int = 0, top_p: float = 1.0, *, sampling: bool = True):
    """Turn backbone logits [B, P, V] into proposals [B, P] and the draft distributions q [B, P, V]
    used by lossless verification. DFlash: slots are independent. Markov: sequential over slots, each
    slot's bias from the token chosen at the previous slot (the anchor for the first). With a draft
    vocabulary the logits are [B, P, K]; proposals and q come back in target ids / over the target's
    vocabulary (q is zero outside the draft vocabulary).

    `sampling=False` (static: every row greedy) takes argmaxes and returns q = None: no softmax or
    random draws over the vocabulary."""
    b, p, _ = backbone_logits.shape
    if not sampling:
        if not cfg.markov_rank:
            return to_target_ids(cfg, argmax(backbone_logits)), None, backbone_logits

        def greedy(prev, lg):  # prev: a target id; the slot's choice indexes the draft vocabulary
            lg = lg + markov_bias(cfg, params, prev[:, None])[:, 0]
            tok = to_target_ids(cfg, argmax(lg))
            return tok, (tok, lg)

        _, (toks, corrected) = jax.lax.scan(greedy, anchor.astype(jnp.int32), jnp.swapaxes(backbone_logits, 0, 1))
        return jnp.swapaxes(toks, 0, 1), None, jnp.swapaxes(corrected, 0, 1)
    keys = jax.random.split(rng, p)
    if not cfg.markov_rank:
        q = probs(backbone_logits, temperature[:, None], top_k, top_p)
        toks = jax.vmap(lambda k, lg: sample(k, lg, temperature, top_k, top_p), in_axes=(0, 1), out_axes=1)(
            keys, backbone_logits)
        return to_target_ids(cfg, toks), to_target_probs(cfg, q), backbone_logits

    def body(prev, xs):
        key, lg = xs
        lg = lg + markov_bias(cfg, params, prev[:, None])[:, 0]
        tok = to_target_ids(cfg, sample(key, lg, temperature, top_k, top_p))
        return tok, (tok, to_target_probs(cfg, probs(lg, temperature, top_k, top_p)), lg)

    _, (toks, q, corrected) = jax.lax.scan(body, anchor.astype(jnp.int32), (keys, jnp.swapaxes(backbone_logits, 0, 1)))
    sw = functools.partial(jnp.swapaxes, axis1=0, axis2=1)
    return sw(toks), sw(q), sw(corrected)
