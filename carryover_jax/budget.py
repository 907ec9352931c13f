"""A wall-clock budget for the main job: measure the device in the run's first seconds, then size every stage.

`carryover pipeline --preset gpu` must finish on one lent GPU in a few minutes, whatever that GPU turns out
to be. So the preset does not hard-code conversations or steps: `probe_rates` times, on the preset's own
shapes, one batch of regeneration, a few steps of each training mode and one eval decode, and `plan_stages`
turns those rates into stage sizes that fit `Budget.wall_s` (compilation included, as measured). A slower
device gets fewer conversations and steps, a faster one more; the plan never assumes a rate it did not
measure. `--dry-run` prints the plan (`render_plan`) with the estimated minutes per stage.

The continuations: DVD for S steps, the equal-steps control for S steps, and the equal-compute control for
the steps `train/compute_match.py::matched_steps` gives (S x DVD step time / control step time), so that it
costs what DVD costs; its own stage measures the two step times again on the run's data, and that decides.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from carryover_jax.errors import ConfigError
from carryover_jax.train.compute_match import matched_steps


@dataclasses.dataclass(frozen=True)
class Rates:
    """What the probe measured (seconds unless said; compile times are first-call minus steady-state)."""

    gen_tokens_per_s: float  # regenerated tokens per second at the preset's generation batch
    baseline_step_s: float
    dvd_step_s: float
    control_step_s: float
    eval_token_s: float  # seconds per generated eval token, all arms and temperatures of one prompt, batch 1
    compile_s: float = 0.0  # compilation seen by the probe: charged once per stage that compiles anew

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"measured rate {f.name} must be a finite non-negative number, got {v!r}")
        for name in ("gen_tokens_per_s", "baseline_step_s", "dvd_step_s", "control_step_s", "eval_token_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"measured rate {name} must be positive, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class Budget:
    """The wall-clock budget and how it is shared. Shares are of what is left after the probe and the
    fixed costs (loading, one compile per stage)."""

    wall_s: float = 420.0
    probe_s: float = 0.0  # already spent measuring (taken off the top)
    fixed_s: float = 20.0  # loading the target, writing stores, checkpoints, the report
    prepare_share: float = 0.30
    baseline_share: float = 0.35
    continue_share: float = 0.15  # DVD + both controls
    eval_share: float = 0.20
    tokens_per_conversation: float = 200.0  # expected regenerated tokens per conversation (all turns)
    batch_size: int = 64  # training sequences per step (for epochs in the plan's notes)
    min_conversations: int = 0  # a goal: the plan says when the budget cannot buy it
    max_conversations: int | None = None  # what the prompt source holds
    eval_tokens_per_prompt: int = 128
    eval_datasets: int = 3
    min_steps: int = 1

    def __post_init__(self):
        shares = (self.prepare_share, self.baseline_share, self.continue_share, self.eval_share)
        if any(s < 0 for s in shares) or not math.isclose(sum(shares), 1.0, abs_tol=1e-6):
            raise ConfigError(f"budget shares must be >= 0 and sum to 1, got {shares}")
        if not self.wall_s > 0:
            raise ConfigError(f"the wall budget must be positive, got {self.wall_s!r}")


def plan_stages(rates: Rates, budget: Budget) -> dict[str, Any]:
    """Stage sizes that fit the budget at the measured rates, with the estimated seconds of each stage.

    Every stage that compiles is charged `rates.compile_s` once (prepare, baseline, each continuation and the
    eval), then the rest of its share buys work at the measured rate."""
    stages = ("prepare", "baseline", "continue", "eval")
    # the continuations: DVD, both controls, and the compute control's own probe of the DVD and control steps
    compiles = {"prepare": 1, "baseline": 1, "continue": 5, "eval": 1}
    left = budget.wall_s - budget.probe_s - budget.fixed_s - rates.compile_s * sum(compiles.values())
    if left <= 0:
        raise ConfigError(f"the budget of {budget.wall_s:.0f} s is spent before any work: probe {budget.probe_s:.0f} s, "
                          f"fixed {budget.fixed_s:.0f} s, compilation {rates.compile_s:.0f} s x {sum(compiles.values())}")
    share = dict(zip(stages, (budget.prepare_share, budget.baseline_share, budget.continue_share, budget.eval_share)))
    work = {k: left * share[k] for k in stages}

    conversations = int(work["prepare"] * rates.gen_tokens_per_s / budget.tokens_per_conversation)
    if budget.max_conversations is not None:
        conversations = min(conversations, budget.max_conversations)
    baseline_steps = max(budget.min_steps, int(work["baseline"] / rates.baseline_step_s))
    # DVD S steps + equal-steps control S + equal-compute control max(S, S * dvd/control) steps: DVD's cost, or
    # S control steps where a control step measured slower than a DVD one (matched_steps never goes below S)
    per_step = rates.dvd_step_s + rates.control_step_s + max(rates.dvd_step_s, rates.control_step_s)
    cont_steps = max(budget.min_steps, int(work["continue"] / per_step))
    compute_steps = matched_steps(cont_steps, rates.dvd_step_s, rates.control_step_s)
    prompt_s = rates.eval_token_s * budget.eval_tokens_per_prompt
    prompts_per_dataset = max(1, int(work["eval"] / (prompt_s * budget.eval_datasets)))

    est = {
        "prepare": rates.compile_s + conversations * budget.tokens_per_conversation / rates.gen_tokens_per_s,
        "baseline": rates.compile_s + baseline_steps * rates.baseline_step_s,
        "dvd": 3 * rates.compile_s + cont_steps * rates.dvd_step_s,  # + the compute control's probe
        "control": rates.compile_s + cont_steps * rates.control_step_s,
        "control_compute": rates.compile_s + compute_steps * rates.control_step_s,
        "eval": rates.compile_s + prompts_per_dataset * budget.eval_datasets * prompt_s,
    }
    total = budget.probe_s + budget.fixed_s + sum(est.values())
    notes = []
    if conversations < budget.min_conversations:
        notes.append(f"the budget buys {conversations:,} conversations at {rates.gen_tokens_per_s:,.0f} tokens/s, "
                     f"below the goal of {budget.min_conversations:,}")
    if conversations:
        epochs = baseline_steps * budget.batch_size / conversations
        notes.append(f"the baseline sees each conversation ~{epochs:.1f} times")
    return {
        "conversations": conversations,
        "steps": {"baseline": baseline_steps, "dvd": cont_steps, "control": cont_steps,
                  "control_compute": compute_steps},
        "eval_prompts_per_dataset": prompts_per_dataset,
        "estimated_s": {k: round(v, 1) for k, v in est.items()},
        "estimated_total_s": round(total, 1),
        "wall_s": budget.wall_s,
        "rates": dataclasses.asdict(rates),
        "notes": notes,
    }


def render_plan(plan: dict[str, Any]) -> str:
    """The plan as the table `--dry-run` prints."""
    steps = plan["steps"]
    what = {
        "prepare": f"{plan['conversations']:,} conversations",
        "baseline": f"{steps['baseline']:,} steps",
        "dvd": f"{steps['dvd']:,} steps",
        "control": f"{steps['control']:,} steps (equal steps)",
        "control_compute": f"{steps['control_compute']:,} steps (equal compute)",
        "eval": f"{plan['eval_prompts_per_dataset']} prompts per dataset",
    }
    lines = ["| stage | size | est. minutes |", "|---|---|---|"]
    for k, v in plan["estimated_s"].items():
        lines.append(f"| {k} | {what[k]} | {v / 60:.2f} |")
    lines.append(f"| total (probe and fixed costs included) | | {plan['estimated_total_s'] / 60:.2f} of "
                 f"{plan['wall_s'] / 60:.2f} |")
    lines += [f"- {n}" for n in plan["notes"]]
    return "\n".join(lines)
