"""The jitted, sharded training step of baseline parallel drafter training.

One step: (online) frozen target forward -> features and final-normed hidden; N anchors per sequence
-> blocks with the anchor mask -> drafter -> draft logits at the proposal slots (+ teacher-forced
Markov bias) and aligned target logits -> weighted CE (+ L1) -> AdamW update of the drafter only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from carryover_jax.config import DrafterConfig, TargetConfig, TrainConfig
from carryover_jax.models.drafter import Drafter, frozen_from_target, init_drafter_params, logits_from_hidden
from carryover_jax.models.target import TargetLM
from carryover_jax.train import anchors as A
from carryover_jax.train.objectives import combine, row_terms
from carryover_jax.train.sharding import batch_sharding, replicated, shardings_from_boxed, unbox_plain

Array = jax.Array


@flax.struct.dataclass
class TrainState:
    step: Array
    params: Any  # drafter params (float32 master copy)
    opt_state: Any
    rng: Array  # raw uint32 key data: orbax saves plain arrays


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static settings of the step (hashable: a jit static argument)."""

    target: TargetConfig
    drafter: DrafterConfig
    num_anchors: int
    gamma: float
    ce_weight: float
    l1_weight: float
    remat: bool = False
    loss_chunk: int = 0  # rows per vocabulary-logits chunk (0 = all at once)


def step_config(cfg: TrainConfig, target_cfg: TargetConfig, drafter_cfg: DrafterConfig) -> StepConfig:
    ce, l1 = cfg.loss_weights
    dt = cfg.compute_dtype
    return StepConfig(
        target=target_cfg.replace(dtype=dt),
        drafter=drafter_cfg.replace(backbone=drafter_cfg.backbone.replace(dtype=dt, param_dtype="float32")),
        num_anchors=cfg.num_anchors, gamma=cfg.loss_decay_gamma, ce_weight=ce, l1_weight=l1, remat=cfg.remat,
        loss_chunk=cfg.loss_chunk_rows,
    )


def lr_schedule(cfg: TrainConfig, total_steps: int):
    """DeepSpec: linear warmup starting at lr/W on step 0, then cosine to exactly 0 at the end."""
    warm = max(1, int(cfg.warmup_ratio * total_steps))

    def sched(t):
        t = jnp.asarray(t, jnp.float32)
        warmup = cfg.lr * (t + 1) / warm
        frac = jnp.clip((t - warm) / max(total_steps - warm, 1), 0.0, 1.0)
        return jnp.where(t < warm, warmup, cfg.lr * 0.5 * (1 + jnp.cos(math.pi * frac)))

    return sched


def make_optimizer(cfg: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(lr_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )


def init_state(params, optimizer, seed: int) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                      rng=jax.random.key_data(jax.random.key(seed)))


def target_features(sc: StepConfig, target_params, input_ids):
    """Frozen target forward: concatenated taps [B, S, m·d] and final-normed hidden [B, S, d]."""
    taps, last = TargetLM(sc.target).apply({"params": target_params}, input_ids, sc.drafter.target_layer_ids,
                                           method=TargetLM.features)
    return jax.lax.stop_gradient(jnp.concatenate(taps, -1)), jax.lax.stop_gradient(last)


def loss_fn(params, sc: StepConfig, target_params, batch, rng):
    ids, lm = batch["input_ids"], batch["loss_mask"]
    b, s = ids.shape
    dc = sc.drafter
    t, p, n = dc.block_size, dc.num_proposals, sc.num_anchors
    if "features" in batch:
        feats, last = batch["features"], batch["last_hidden"]
    else:
        feats, last = target_features(sc, target_params, ids)
    anchors, keep, nvalid = A.sample_anchors(rng, lm, n)
    blk = A.build_blocks(dc, ids, lm, anchors, keep, nvalid)
    frozen = frozen_from_target(target_params, sc.target)
    h = Drafter(dc, remat=sc.remat).apply(
        {"params": params}, blk.tokens, blk.positions, frozen, feats.astype(jnp.dtype(dc.backbone.dtype)),
        jnp.broadcast_to(jnp.arange(s)[None], (b, s)), A.context_mask(blk, t, s),
        block_mask=t, return_hidden=True,  # block-diagonal: each of the N blocks sees only itself
    )
    h = h.reshape(b, n, t, -1)[:, :, A.proposal_slots(dc)].reshape(b * n * p, -1)  # one row per proposal
    # the target's next-token distribution at each proposal's prediction point (label position - 1)
    pred_at = jnp.clip(blk.label_idx - 1, 0, s - 1).reshape(b, n * p)
    th = jnp.take_along_axis(last, pred_at[..., None], axis=1).reshape(b * n * p, -1)
    labels = blk.labels.reshape(-1)
    prev = jnp.concatenate([blk.tokens.reshape(b, n, t)[:, :, :1], blk.labels[..., :-1]], axis=-1).reshape(-1)

    def terms(hc, thc, lc, pc):
        z = logits_from_hidden(hc[None], frozen)[0]
        if dc.markov_rank:  # teacher-forced transition bias from the previous ground-truth token
            z = z + Drafter(dc).apply({"params": params}, pc, method=Drafter.markov_bias)
        zt = TargetLM(sc.target).apply({"params": target_params}, thc, method=TargetLM.head)
        return row_terms(z, jax.lax.stop_gradient(zt), lc)

    rows = (h, th, labels, prev)
    r, c = b * n * p, sc.loss_chunk
    if c and r > c:
        # vocabulary-sized logits exist for one chunk of rows at a time, forward and backward
        pad = (-r) % c
        chunked = [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(-1, c, *x.shape[1:]) for x in rows]
        out = jax.lax.map(jax.checkpoint(lambda xs: terms(*xs)), tuple(chunked))
        out = [x.reshape(-1)[:r] for x in out]
    else:
        out = terms(*rows)
    loss, metrics = combine(*[x.reshape(b, n, p) for x in out], blk.eval_mask, gamma=sc.gamma,
                            ce_weight=sc.ce_weight, l1_weight=sc.l1_weight)
    metrics["anchors_per_seq"] = jnp.mean(jnp.sum(keep, axis=1).astype(jnp.float32))
    metrics["valid_anchor_ratio"] = jnp.mean(jnp.minimum(nvalid, n) / jnp.maximum(nvalid, 1))
    return loss, metrics


def train_step(sc: StepConfig, optimizer, state: TrainState, target_params, batch):
    rng, sub = jax.random.split(jax.random.wrap_key_data(state.rng))
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, sc, target_params, batch, sub)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.global_norm(grads)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=jax.random.key_data(rng)), metrics


# ---- sharded compilation ------------------------------------------------------------------------------
def target_shardings(target_cfg: TargetConfig, mesh):
    boxed = jax.eval_shape(TargetLM(target_cfg).init, jax.random.key(0), jax.ShapeDtypeStruct((1, 1), jnp.int32))
    return shardings_from_boxed(boxed["params"], mesh)


def drafter_shardings(drafter_cfg: DrafterConfig, mesh, shard: bool):
    boxed = jax.eval_shape(lambda: init_drafter_params(drafter_cfg, jax.random.key(0), boxed=True))
    if not shard:
        return replicated(unbox_plain(boxed), mesh)
    return shardings_from_boxed(boxed, mesh)


def state_shardings(state: TrainState, param_sh, mesh) -> TrainState:
    """Adam moments follow their params; counts, the step and the RNG are replicated."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    rep = NamedSharding(mesh, P())

    def opt_sh(node):
        if isinstance(node, optax.ScaleByAdamState):
            return node._replace(count=rep, mu=param_sh, nu=param_sh)
        return jax.tree_util.tree_map(lambda _: rep, node)

    opt = jax.tree_util.tree_map(opt_sh, state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
    return TrainState(step=rep, params=param_sh, opt_state=opt, rng=rep)


def compile_step(sc: StepConfig, optimizer, mesh, state_sh: TrainState, target_sh, batch_keys: dict[str, int]):
    """jax.jit with NamedShardings (the "pjit" step); the state is donated."""
    in_batch = {k: batch_sharding(mesh, nd) for k, nd in batch_keys.items()}
    fn = functools.partial(train_step, sc, optimizer)
    return jax.jit(fn, in_shardings=(state_sh, target_sh, in_batch), out_shardings=(state_sh, None),
                   donate_argnums=(0,))
