"""Anchor sampling, block inputs, the training attention masks, labels and the eval mask.

For each sequence, N anchors are drawn uniformly without replacement from the positions p where
loss_mask[p] and loss_mask[p+1] (the anchor and its first label are assistant tokens). Block n holds
[x_anchor, MASK x (B-1)] at positions anchor..anchor+B-1; it sees context strictly before its anchor
and its own block (bidirectionally), nothing else. Proposal i (0-based) of block n is supervised
with the token at anchor + i + 1 — block slot i in the deepspec layout, slot i + 1 in the zlab layout —
and only on the contiguous valid prefix of the block (cumulative eval mask).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from carryover_jax.config import DrafterConfig

Array = jax.Array


@flax.struct.dataclass
class Blocks:
    anchors: Array  # [B, N] anchor positions (0 for unused slots)
    keep: Array  # [B, N] slot holds a real anchor
    tokens: Array  # [B, N*T] block inputs
    positions: Array  # [B, N*T]
    label_idx: Array  # [B, N, P] position of each proposal's label
    labels: Array  # [B, N, P]
    eval_mask: Array  # [B, N, P] cumulative validity
    num_valid: Array  # [B] candidate anchors available


def anchor_candidates(loss_mask: Array) -> Array:
    """[B, S] bool: p in [0, S-2] with loss_mask[p] and loss_mask[p+1]."""
    m = loss_mask.astype(bool)
    cand = m[:, :-1] & m[:, 1:]
    return jnp.pad(cand, ((0, 0), (0, 1)))


def part_rows(draw, rows: int, part=(0, 1)) -> Array:
    """`draw(n)` -> [n, ...] random values for n rows; returns the `rows` of micro-batch `part` = (index,
    count) of an optimizer step's batch of count * rows (gradient accumulation). They are drawn for the
    whole batch and sliced, so a row's draws do not depend on how its batch is split into micro-batches:
    accumulating gives every row what the undivided step would. `index` may be traced."""
    index, count = part
    if count == 1:
        return draw(rows)
    return jax.lax.dynamic_slice_in_dim(draw(count * rows), index * rows, rows)


def sample_anchors(rng: Array, loss_mask: Array, num_anchors: int, part=(0, 1)) -> tuple[Array, Array, Array]:
    """Uniform sampling without replacement via random keys: returns (anchors [B, N] ascending,
    keep [B, N], number of candidates [B]). `part`: see `part_rows`."""
    cand = anchor_candidates(loss_mask)
    b, s = cand.shape
    keys = jnp.where(cand, part_rows(lambda r: jax.random.uniform(rng, (r, s)), b, part), 2.0)
    n = min(num_anchors, s)
    _, idx = jax.lax.top_k(-keys, n)  # n smallest keys
    num_valid = jnp.sum(cand, axis=1)
    chosen_valid = jnp.arange(n)[None, :] < jnp.minimum(num_valid, n)[:, None]
    # unused slots sort after real anchors and are then zeroed
    anchors = jnp.sort(jnp.where(chosen_valid, idx, s), axis=1)
    keep = anchors < s
    anchors = jnp.where(keep, anchors, 0)
    if n < num_anchors:
        pad = num_anchors - n
        anchors = jnp.pad(anchors, ((0, 0), (0, pad)))
        keep = jnp.pad(keep, ((0, 0), (0, pad)))
    return anchors.astype(jnp.int32), keep, num_valid


def build_blocks(cfg: DrafterConfig, input_ids: Array, loss_mask: Array, anchors: Array, keep: Array,
                 num_valid: Array) -> Blocks:
    b, s = input_ids.shape
    n = anchors.shape[1]
    t, p = cfg.block_size, cfg.num_proposals
    first = jnp.where(keep, jnp.take_along_axis(input_ids, anchors, axis=1), cfg.mask_token_id)
    tokens = jnp.concatenate([first[..., None], jnp.full((b, n, t - 1), cfg.mask_token_id, jnp.int32)], -1)
    positions = anchors[..., None] + jnp.arange(t)[None, None, :]
    label_idx = anchors[..., None] + 1 + jnp.arange(p)[None, None, :]
    in_seq = label_idx < s
    safe = jnp.minimum(label_idx, s - 1).reshape(b, n * p)
    labels = jnp.take_along_axis(input_ids, safe, axis=1).reshape(b, n, p)
    lm = jnp.take_along_axis(loss_mask.astype(bool), safe, axis=1).reshape(b, n, p)
    e = in_seq & lm & keep[..., None]
    e = jnp.cumprod(e.astype(jnp.int32), axis=-1).astype(bool)
    return Blocks(anchors=anchors, keep=keep, tokens=tokens.reshape(b, n * t).astype(jnp.int32),
                  positions=positions.reshape(b, n * t).astype(jnp.int32), label_idx=label_idx,
                  labels=labels, eval_mask=e, num_valid=num_valid)


def context_limit(blocks: Blocks, block_size: int) -> Array:
    """[B, N*T] int: a block's queries see the context positions strictly before its anchor, as a
    per-query key limit (0 for unused slots); the [N*T, S] mask is never built (`layers.Prefix`; the
    fused kernel computes it)."""
    return jnp.repeat(jnp.where(blocks.keep, blocks.anchors, 0), block_size, axis=1).astype(jnp.int32)

