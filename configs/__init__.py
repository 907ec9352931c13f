"""Run configs in Python: each module defines `CONFIG`, a frozen `TrainConfig` (which nests the
`DataConfig` used by `carryover prepare`). Load one with `carryover train --config smollm2` or a path
(`--config configs/qwen3_4b.py`), and override fields with `--set key=value` (dotted for nesting).

- `tiny`: seconds-long smoke run of the whole pipeline (tests, CI).
- `smollm2`: the embedded default on this CPU (SmolLM2-135M-Instruct from PyPI, ShareGPT prompts).
- `smollm2_gpu`: the same target on one GPU with ~30x the data and the paper's 15 proposals (`--preset gpu`).
- `qwen3_4b`: the paper's Qwen3-4B settings (Table 4), for a GPU pod.
- `gemma4_12b`: the paper's Gemma 4 12B settings (DeepSpec's Gemma 4 DSpark: feature layers 5, 17, 29, 41, 46).
- `qwen3_4b_tpu`: `qwen3_4b` on Cloud TPU v5p hosts (fsdp over a host's 4 chips, sized by the TPU compiler).

Stages: `smollm2:dvd` / `smollm2:control` / `smollm2:control_compute` (and the same for `qwen3_4b`, `tiny`)
continue the baseline drafter of CONFIG with DVD training and with its two controls (no carried rows, same
data order and anchors): `control` for DVD's steps (equal steps), `control_compute` for as many steps as
DVD's training compute buys (equal compute: step times measured on this machine by a short probe the
first time the stage is loaded, kept in its out_dir's `probe.json`; `carryover_jax/train/compute_match.py`
states the rule), each into its own out_dir.

This folder is installed as `carryover_jax.configs` (pyproject.toml maps it into the package).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any, Callable

from carryover_jax.errors import ConfigError

NAMES = ("tiny", "smollm2", "smollm2_gpu", "qwen3_4b", "gemma4_12b", "qwen3_4b_tpu")


@dataclasses.dataclass(frozen=True)
class ComputeMatched:
    """A stage whose step count is measured, not written: `control` trained for as many steps as `dvd`'s
    training compute buys (`train/compute_match.py`). `resolve()` probes the two step times once and keeps
    them in `<out_dir>/probe.json`, so a resumed or repeated stage trains the same number of steps."""

    control: Any  # TrainConfig (loss.mode="control")
    dvd: Any  # TrainConfig (loss.mode="dvd")
    out_dir: str

    def resolve(self, probe: Callable | None = None, log: Callable[[str], None] | None = None):
        from carryover_jax.train.compute_match import resolve_compute_control

        return resolve_compute_control(self.control, self.dvd, self.out_dir, probe=probe, log=log)


def continuation_stages(config, **cont) -> dict:
    """STAGES for a config: DVD training and its two controls, all continuing CONFIG's own final drafter
    with the settings `cont` (steps or epochs, lr, ...), into `<out_dir>/../dvd`, `<out_dir>/../control`
    (equal steps; differs from DVD only in `loss.mode`) and `<out_dir>/../control_compute` (equal compute)."""
    root = Path(config.out_dir).parent
    stages = {mode: config.replace(name=f"{config.name}-{mode}", init_from=f"{config.out_dir}/drafter",
                                   out_dir=str(root / mode), **cont).with_loss(mode=mode) for mode in ("dvd", "control")}
    stages["control_compute"] = ComputeMatched(stages["control"], stages["dvd"], str(root / "control_compute"))
    return stages


def load_config(name_or_path: str):
    """A config module name from this package or a path to a Python file defining CONFIG; `NAME:STAGE`
    picks a later training stage the module defines in STAGES (e.g. `smollm2:dvd`, `smollm2:control`,
    `smollm2:control_compute`: DVD and its equal-steps and equal-compute controls, all continuing the
    baseline drafter). A `ComputeMatched` stage is resolved here (its step times probed once)."""
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
        picked = stages[stage]
        return picked.resolve() if isinstance(picked, ComputeMatched) else picked
    return module.CONFIG
