"""The eval's settings and their bounds: one table for `carryover eval`'s options and for the settings the
pipeline hands `evaluate` / `evaluate_offline` (a preset's, `--eval-set`'s), so a bad value is refused when the
pipeline starts, not when its eval stage comes after hours of training."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from carryover_jax import bounds as B
from carryover_jax.decode.generate import check_sampling
from carryover_jax.errors import ConfigError
from carryover_jax.eval.datasets import parse_dataset_spec

BOUNDS: dict[str, B.Bound] = {
    "prompts_per_dataset": B.count(),
    "max_prompt_tokens": B.size(),
    "max_new_tokens": B.size(),
    "seeds": B.size(),
    "max_len": B.size(),
    "timing_repeats": B.size(),
    "diagnostic_prompts": B.count(),
    "heldout_per_mille": B.count(0, 1000),
    "mask_token_id": B.count(0),
    "batch_size": B.size(),  # evaluate_offline: rollouts recorded and scored per batch (--offline-batch)
    "batch_sizes": B.size(),  # each of the throughput pass's batch sizes
}
LISTS = ("batch_sizes", "temperatures", "datasets")
OPTIONAL = ("max_len", "heldout_per_mille", "mask_token_id")  # None: the default the eval picks
SWITCHES = ("chat", "diagnostics", "plots")


def check_settings(settings: Mapping[str, Any], accepted: Iterable[str], what: str = "eval") -> None:
    """Every key one `accepted` keyword and every value within its bound, else one `ConfigError` naming it."""
    accepted = set(accepted)
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise ConfigError(f"{what}: unknown setting {', '.join(unknown)} (known: {', '.join(sorted(accepted))})")
    for key, v in settings.items():
        if v is None and key in OPTIONAL:
            continue
        if key in LISTS and not isinstance(v, (list, tuple)):
            raise ConfigError(f"{what} {key} must be a list, got {v!r}")
        if key in BOUNDS:
            for x in v if key in LISTS else [v]:
                B.check(f"{what} {key}", x, BOUNDS[key])
        elif key in SWITCHES and not isinstance(v, bool):
            raise ConfigError(f"{what} {key} must be True or False, got {v!r}")
    temps = list(settings.get("temperatures", ()))
    if "temperatures" in settings and not temps:
        raise ConfigError(f"{what} temperatures must name at least one temperature")
    check_sampling(temperature=temps, top_k=settings.get("top_k", 0), top_p=settings.get("top_p", 1.0))
    if len(set(temps)) != len(temps):
        raise ConfigError(f"{what} temperatures has duplicates: {temps}")
    for spec in settings.get("datasets", ()):
        if not isinstance(spec, str):
            raise ConfigError(f"{what} datasets must hold names or paths, got {spec!r}")
        parse_dataset_spec(spec)
