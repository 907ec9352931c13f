"""carryover-jax: speculative-decoding drafters with Carryover Drafting, in JAX/Flax."""

from carryover_jax.config import PRESETS, TargetConfig, preset
from carryover_jax.config import DrafterConfig
from carryover_jax.decode.generate import Generation, generate, speculative_generate
from carryover_jax.errors import (
    CarryoverError, CheckpointError, ConfigError, DataError, RequestError, TrainingError,
)
from carryover_jax.loading import DraftModel, Target, init_drafter, load_drafter, load_target
from carryover_jax.models.cache import KVCache
from carryover_jax.models.target import TargetLM

__all__ = [
    "PRESETS", "TargetConfig", "preset", "Generation", "generate", "CarryoverError", "CheckpointError",
    "ConfigError", "Target", "load_target", "KVCache", "TargetLM", "DrafterConfig", "speculative_generate",
    "DraftModel", "init_drafter", "load_drafter", "DataError", "RequestError", "TrainingError",
]
__version__ = "0.1.0"
