#!/usr/bin/env bash
# The Carryover A/B on the embedded default, as one resumable run (`carryover pipeline --preset full`):
# target-regenerated data (1,536 ShareGPT conversations) -> a baseline drafter (1,200 steps, a snapshot every
# 300) -> from its steps 1,200, 300 and 600: DVD training (Carryover) and its equal-steps and equal-compute
# controls (120 continuation steps; the equal-compute control's steps measured on this machine) -> every arm,
# plus the DVD drafter with carried rows withheld, scored by the exact offline evaluator on the same 534 held-out
# rollouts (ShareGPT's held-out split, HumanEval, MT-Bench first turns; T = 0) -> Carryover's paired gain
# against each start's τ (table + PNG) -> report.md. Re-running resumes: finished stages are skipped, a killed
# stage resumes from its store, checkpoints or rollout cache.
# Stage times on 2 CPU cores: in the run's report.md and docs/experiments/carryover-ab-*/README.md.
# Extra arguments go to `carryover pipeline`, e.g. --out DIR, --eval-set temperatures=[0.0,1.0].
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
.venv/bin/carryover pipeline --config smollm2 --preset full --out "${OUT:-runs/carryover-ab}" "$@"
