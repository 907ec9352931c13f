"""carryover-jax: speculative-decoding drafters with Carryover Drafting, in JAX/Flax.

The public names below are imported on first use (module `__getattr__`), so that the PyTorch side
(`carryover_jax.export`: the exported drafters' decoding loop) and the error classes load without JAX."""

from __future__ import annotations

import importlib
from pathlib import Path as _Path

# A source checkout run without installing it (`PYTHONPATH=.`, as on a lent GPU's image): the wheel ships
# configs/ and export/ inside this package (pyproject's package-dir), the checkout has them beside it. Search
# the checkout's root too, so `carryover_jax.configs` and `carryover_jax.export` resolve the same either way.
_root = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "configs").is_dir() and (_root / "configs" / "__init__.py").is_file():
    __path__.append(str(_root))  # noqa: F821 (the package's own search path)

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
