"""The training step's static settings (`StepConfig`, a jit static argument) and how a run's `TrainConfig`
becomes them. Its own module, so the losses (`losses.py`, `dvd.py`) and the step that calls them
(`step.py`) all import it without importing each other in a circle."""

from __future__ import annotations

import dataclasses

from carryover_jax.config import DrafterConfig, LossConfig, TargetConfig, TrainConfig
from carryover_jax.errors import ConfigError
from carryover_jax.numerics import Numerics


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static settings of the step (hashable: a jit static argument): the models under the run's numerics,
    the run's loss settings as they are (`TrainConfig.step_loss`: every None resolved) and the recording's
    sampling filters, which DVD's coupled draft 1 applies (`dvd.coupled_proposals`)."""

    target: TargetConfig
    drafter: DrafterConfig
    loss: LossConfig
    num_anchors: int
    remat: bool = False
    top_k: int = 0
    top_p: float = 1.0
    grad_accum_steps: int = 1  # micro-steps per optimizer step (the step's batch is one of them: `anchors.part_rows`)


def step_config(cfg: TrainConfig, target_cfg: TargetConfig, drafter_cfg: DrafterConfig, *,
                numerics: Numerics | None = None) -> StepConfig:
    """The step's static settings; target and drafter run with `numerics` (default: the run's,
    `cfg.run_numerics()` for this process's platform; pass `Numerics.for_platform("cuda", ...)` to
    build a GPU program on a CPU). The drafter's params are the trained master copy
    (`numerics.drafter_param_dtype`, float32 unless set)."""
    if cfg.loss.mode == "dvd" and not drafter_cfg.carryover:
        raise ConfigError("loss.mode=dvd trains e_rej, but this drafter has none: set drafter.carryover=true "
                          "(or loss.mode=control for the equal-compute run without carried rows)")
    num = cfg.run_numerics() if numerics is None else numerics
    return StepConfig(target=target_cfg.with_numerics(num), drafter=drafter_cfg.with_numerics(num),
                      loss=cfg.step_loss, num_anchors=cfg.num_anchors, remat=cfg.remat,
                      top_k=cfg.data.top_k, top_p=cfg.data.top_p,
                      grad_accum_steps=cfg.grad_accum_steps)
