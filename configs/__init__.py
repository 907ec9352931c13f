"""Run configs in Python: each module defines `CONFIG`, a frozen `TrainConfig` (which nests the
`DataConfig` used by `carryover prepare`). Load one with `carryover train --config smollm2` or a path
(`--config configs/qwen3_4b.py`), and override fields with `--set key=value` (dotted for nesting).

- `tiny`: seconds-long smoke run of the whole pipeline (tests, CI).
- `smollm2`: the embedded default on this CPU (SmolLM2-135M-Instruct from PyPI, ShareGPT prompts).
- `qwen3_4b`: the paper's Qwen3-4B settings (Table 4), for a GPU pod.
- `gemma4_12b`: the paper's Gemma 4 12B settings (DeepSpec's Gemma 4 DSpark: feature layers 5, 17, 29, 41, 46).

Stages: `smollm2:dvd` / `smollm2:control` (and the same for `qwen3_4b`, `tiny`) continue the baseline
drafter of CONFIG with DVD training and with its equal-compute control (same steps, data order and
anchors, no carried rows), each into its own out_dir.

This folder is installed as `carryover_jax.configs` (pyproject.toml maps it into the package).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from carryover_jax.errors import ConfigError

NAMES = ("tiny", "smollm2", "qwen3_4b", "gemma4_12b")


def continuation_stages(config, **cont) -> dict:
    """STAGES for a config: DVD training and its equal-compute control, both continuing CONFIG's own
    final drafter with the settings `cont` (steps or epochs, lr, ...), into `<out_dir>/../dvd` and
    `<out_dir>/../control`; the two differ only in `mode`."""
    root = Path(config.out_dir).parent
    return {mode: config.replace(name=f"{config.name}-{mode}", mode=mode, init_from=f"{config.out_dir}/drafter",
                                 out_dir=str(root / mode), **cont) for mode in ("dvd", "control")}


def load_config(name_or_path: str):
    """A config module name from this package or a path to a Python file defining CONFIG; `NAME:STAGE`
    picks a later training stage the module defines in STAGES (e.g. `smollm2:dvd`, `smollm2:control`:
    DVD and its equal-compute control, both continuing the baseline drafter)."""
    name_or_path, _, stage = name_or_path.partition(":")
    path = Path(name_or_path)
    if name_or_path in NAMES:
        path = Path(__file__).with_name(f"{name_or_path}.py")
    elif not path.is_file():
        raise ConfigError(f"no such config: {name_or_path!r} (known: {', '.join(NAMES)}, or a .py path)")
    spec = importlib.util.spec_from_file_location(f"carryover_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ConfigError(f"config {path} failed to load: {e}") from None
    if not hasattr(module, "CONFIG"):
        raise ConfigError(f"config {path} defines no CONFIG")
    if stage:
        stages = getattr(module, "STAGES", {})
        if stage not in stages:
            raise ConfigError(f"config {path} has no stage {stage!r} (stages: {', '.join(stages) or 'none'})")
        return stages[stage]
    return module.CONFIG
