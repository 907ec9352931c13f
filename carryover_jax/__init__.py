"""carryover-jax: speculative-decoding drafters with Carryover Drafting, in JAX/Flax.

The public names below are imported on first use (module `__getattr__`), so that the PyTorch side
(`carryover_jax.export`: the exported drafters' decoding loop) and the error classes load without JAX."""

from __future__ import annotations

import importlib

_PUBLIC = {  # name -> module that defines it
    "PRESETS": "config", "TargetConfig": "config", "preset": "config", "DrafterConfig": "config",
    "Generation": "decode.generate", "generate": "decode.generate", "speculative_generate": "decode.generate",
    "CarryoverError": "errors", "CheckpointError": "errors", "ConfigError": "errors", "DataError": "errors",
    "RequestError": "errors", "TrainingError": "errors",
    "DraftModel": "loading", "Target": "loading", "init_drafter": "loading", "load_drafter": "loading",
    "load_target": "loading",
    "KVCache": "models.cache", "TargetLM": "models.target",
}

__all__ = list(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
        globals()[name] = value  # later lookups skip this function
        return value
    try:  # `carryover_jax.decode` etc. without an explicit import, as before
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
