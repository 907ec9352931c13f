"""The jitted, sharded training step: the loss of the run's mode (baseline parallel training,
`train/losses.py`; DVD or its equal-compute control, `train/dvd.py`) -> AdamW update of the drafter only.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from carryover_jax.config import DrafterConfig, TargetConfig, TrainConfig
from carryover_jax.models.drafter import init_drafter_params
from carryover_jax.models.target import TargetLM
from carryover_jax.train.dvd import dvd_loss
from carryover_jax.train.losses import baseline_loss
from carryover_jax.train.sharding import batch_sharding, replicated, shardings_from_boxed, unbox_plain
from carryover_jax.train.step_config import StepConfig, step_config  # noqa: F401  (the step's own API)

Array = jax.Array


@flax.struct.dataclass
class TrainState:
    step: Array
    params: Any  # drafter params (float32 master copy)
    opt_state: Any
    rng: Array  # raw uint32 key data: orbax saves plain arrays


def lr_schedule(cfg: TrainConfig, total_steps: int) -> optax.Schedule:
    """DeepSpec: linear warmup over W steps starting at lr/W on step 0 (step W-1 reaches lr), then
    cosine to exactly 0 at `total_steps`."""
    warm = max(1, int(cfg.warmup_ratio * total_steps))
    return optax.join_schedules(
        [optax.linear_schedule(cfg.lr / warm, cfg.lr, warm - 1),
         optax.cosine_decay_schedule(cfg.lr, max(total_steps - warm, 1))],
        boundaries=[warm],
    )


def make_optimizer(cfg: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    """AdamW after global-norm clipping; with `grad_accum_steps` = k > 1 wrapped in `optax.MultiSteps`: k
    calls (micro-steps) accumulate the mean gradient, and only the k-th clips it and updates, so Adam's
    count and the schedule (`total_steps`) advance per optimizer step."""
    opt = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(lr_schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )
    if cfg.grad_accum_steps == 1:
        return opt  # no accumulator in the state: checkpoints of runs without accumulation keep their layout
    return optax.MultiSteps(opt, every_k_schedule=cfg.grad_accum_steps).gradient_transformation()


def init_state(params, optimizer, seed: int) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                      rng=jax.random.key_data(jax.random.key(seed)))


def loss_fn(params, sc: StepConfig, target_params, batch, rng, part=(0, 1)):
    return (baseline_loss if sc.loss.mode == "baseline" else dvd_loss)(params, sc, target_params, batch, rng, part)


def train_step(sc: StepConfig, optimizer, state: TrainState, target_params, batch):
    """One optimizer step on `batch`, or with `sc.grad_accum_steps` = k > 1 one micro-step of it: `batch` is
    micro-batch `opt_state.mini_step` of the step's k. The k micro-steps of a window share the step's RNG
    draw (it advances once the window closes) and each takes its rows of draws made for the whole batch,
    so every row gets the anchors (and DVD draws) of the undivided step. `step` counts optimizer steps;
    `grad_norm` is the norm of the window's mean gradient so far (at its k-th micro-step: the one clipped)."""
    k = sc.grad_accum_steps
    micro = state.opt_state.mini_step if k > 1 else 0
    rng, sub = jax.random.split(jax.random.wrap_key_data(state.rng))
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, sc, target_params, batch, sub,
                                                                    (micro, k))
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)  # zeros until the window's last micro-step
    if k == 1:
        metrics["grad_norm"] = optax.tree.norm(grads)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                          rng=jax.random.key_data(rng)), metrics
    acc = state.opt_state.acc_grads  # MultiSteps' running mean of the window's gradients before this one
    metrics["grad_norm"] = optax.tree.norm(jax.tree.map(lambda a, g: a + (g - a) / (micro + 1), acc, grads))
    closed = micro == k - 1
    return TrainState(step=state.step + closed.astype(state.step.dtype), params=params, opt_state=opt_state,
                      rng=jnp.where(closed, jax.random.key_data(rng), state.rng)), metrics


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
    """Every params-shaped tree in the optimizer state (Adam's mu/nu, Lion's or SGD's momentum, whatever
    optimizer the state came from) is sharded like the params, leaf by leaf where the shapes agree;
    everything else (counts, the step, the RNG) is replicated."""
    rep = NamedSharding(mesh, P())
    params_def = jax.tree_util.tree_structure(state.params)
    like_params = lambda node: jax.tree_util.tree_structure(node) == params_def  # noqa: E731

    def opt_sh(node):
        if not like_params(node):
            return rep
        return jax.tree_util.tree_map(lambda x, p, sh: sh if jnp.shape(x) == jnp.shape(p) else rep,
                                      node, state.params, param_sh)

    opt = jax.tree_util.tree_map(opt_sh, state.opt_state, is_leaf=like_params)
    return TrainState(step=rep, params=param_sh, opt_state=opt, rng=rep)


def compile_step(sc: StepConfig, optimizer, mesh, state_sh: TrainState, target_sh, batch_keys: dict[str, int]):
    """jax.jit with NamedShardings (the "pjit" step); the state is donated."""
    in_batch = {k: batch_sharding(mesh, nd) for k, nd in batch_keys.items()}
    fn = functools.partial(train_step, sc, optimizer)
    return jax.jit(fn, in_shardings=(state_sh, target_sh, in_batch), out_shardings=(state_sh, None),
                   donate_argnums=(0,))
