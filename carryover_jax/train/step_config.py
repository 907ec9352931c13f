"""The training step's static settings (`StepConfig`, a jit static argument) and how a run's `TrainConfig`
becomes them. Its own module, so the losses (`losses.py`, `dvd.py`) and the step that calls them
(`step.py`) all import it without importing each other in a circle."""

from __future__ import annotations

import dataclasses

from carryover_jax.config import DrafterConfig, TargetConfig, TrainConfig
from carryover_jax.errors import ConfigError
from carryover_jax.numerics import Numerics


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
    mode: str = "baseline"  # "baseline" | "dvd" (draft-verify-draft with carried rows) | "control" (DVD without)
    carry: str = "hidden"  # what DVD's draft 2 sees at the rejected positions (train/dvd.py)
    off_metrics: bool = True  # DVD: also log draft 2 with the carried rows withheld (no gradient)
    target_labels: bool = False  # train on the target's greedy tokens instead of the recorded ones
    kl_weight: float = 0.0  # KL(target || draft) at every proposal slot, beside CE and L1
    # DVD's draft 1 on recordings sampled at this temperature (0 = greedy): the coupling of dvd.coupled_proposals,
    # with the recording's top-k / top-p
    draft1_temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    objective: str = "ce"  # "edr": + the expected-decoding-rounds surrogate (train/edr.py), weight edr_weight
    edr_weight: float = 1.0
    accum_steps: int = 1  # micro-steps per optimizer step (the step's batch is one of them: `anchors.part_rows`)


def step_config(cfg: TrainConfig, target_cfg: TargetConfig, drafter_cfg: DrafterConfig, *,
                numerics: Numerics | None = None) -> StepConfig:
    """The step's static settings; target and drafter run with `numerics` (default: the run's,
    `cfg.run_numerics()` for this process's platform; pass `Numerics.for_platform("cuda", ...)` to
    build a GPU program on a CPU). The drafter's params are the trained master copy
    (`numerics.drafter_param_dtype`, float32 unless set)."""
    ce, l1 = cfg.loss_weights
    if cfg.mode == "dvd" and not drafter_cfg.carryover:
        raise ConfigError("mode=dvd trains e_rej, but this drafter has none: set drafter.carryover=true "
                          "(or mode=control for the equal-compute run without carried rows)")
    num = cfg.run_numerics() if numerics is None else numerics
    return StepConfig(
        target=target_cfg.with_numerics(num),
        drafter=drafter_cfg.with_numerics(num),
        num_anchors=cfg.num_anchors, gamma=cfg.loss_decay_gamma, ce_weight=ce, l1_weight=l1, remat=cfg.remat,
        loss_chunk=cfg.loss_chunk_rows, mode=cfg.mode, carry=cfg.dvd_carry, off_metrics=cfg.dvd_off_metrics,
        target_labels=cfg.labels == "target", kl_weight=cfg.kl_weight,
        draft1_temperature=cfg.draft1_temperature, top_k=cfg.data.top_k, top_p=cfg.data.top_p,
        objective=cfg.objective, edr_weight=cfg.edr_weight, accum_steps=cfg.grad_accum_steps,
    )
