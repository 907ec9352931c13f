"""Static configuration: frozen, hashable dataclasses (usable as `jax.jit` static arguments), one concept
a module -- `target` (what a checkpoint is), `drafter` (what a drafter is, and the spec that builds one),
`train` (data, mesh, loss and the run), `presets` (public checkpoints' shapes), `overrides` (`--set`).
The run's dtypes and kernels are `carryover_jax.numerics`; HF `config.json` conversion is
`carryover_jax.weights.hf_config`."""

from carryover_jax.config.drafter import (
    CARRY_MODULES, DRAFTER_KINDS, LAYOUTS, MASK_TOKEN_IDS, DrafterConfig, DrafterSpec, gemma_draft_backbone,
    zlab_layer_ids,
)
from carryover_jax.config.overrides import apply_overrides
from carryover_jax.config.presets import PRESETS, preset
from carryover_jax.config.target import FAMILIES, LAYER_TYPES, LEGACY_NUMERICS_FIELDS, TargetConfig
from carryover_jax.config.train import CARRY_INTERFACES, DataConfig, LossConfig, MeshConfig, TrainConfig
from carryover_jax.numerics import Numerics  # a config's numerics field (the repr of a TrainConfig names it)

__all__ = [
    "CARRY_INTERFACES", "CARRY_MODULES", "DRAFTER_KINDS", "FAMILIES", "LAYER_TYPES", "LAYOUTS",
    "LEGACY_NUMERICS_FIELDS", "MASK_TOKEN_IDS", "PRESETS",
    "DataConfig", "DrafterConfig", "DrafterSpec", "LossConfig", "MeshConfig", "Numerics", "TargetConfig", "TrainConfig",
    "apply_overrides", "gemma_draft_backbone", "preset", "zlab_layer_ids",
]
