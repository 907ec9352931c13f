#!/usr/bin/env bash
# A/B of the training objective on the embedded default: the shipped CE + KL recipe against the same recipe
# plus the expected-decoding-rounds term (`loss.objective=edr`), equal steps, same data, seed and batches;
# scored by `carryover eval --offline` (exact greedy round counts, T = 0) on every held-out rollout of
# ShareGPT's held-out split, HumanEval and MT-Bench, with paired bootstrap intervals.
# Every stage resumes (prepare's store, train's checkpoints, the rollout cache): re-run after a stop.
#   PROMPTS=1000 STEPS=1200 (default): the previous default's size. Measured on 2 CPU cores (AMD EPYC, alone on the
#   machine, 2026-12-03) up to the first eval's report: 49.9 min. Prepare 13.4 min (976 records), CE + KL training
#   12.3 min (1.69 steps/s), the EDR arm 16.5 min (1.24 steps/s), the eval 7.7 min (recording the 534 rollouts 3.4,
#   scoring both arms 4.0); the equal-compute arm (1,633 steps, 16.8 min) and the three arms' scoring (4.9 min) add
#   21.7 min (docs/experiments/teacher-lse-2026-12-03).
#   PROMPTS=2304 STEPS=2400: the shipped config's size (~2x that).
# OUT=runs/edr-ab by default; EVAL_PROMPTS per dataset (default 400: all that fit), EVAL_TOKENS (default 64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
C=.venv/bin/carryover
OUT="${OUT:-runs/edr-ab}"
PROMPTS="${PROMPTS:-1000}"
STEPS="${STEPS:-1200}"
# no stored K/V: only DVD reads them, and writing them was ~2.5 min of prepare here
common=(--config smollm2 --set "data.store=$OUT/data" --set "data.max_prompts=$PROMPTS" --set data.store_kv=None)
"$C" prepare "${common[@]}"
"$C" train "${common[@]}" --set "steps=$STEPS" --set "out_dir=$OUT/ce_kl"
"$C" train "${common[@]}" --set "steps=$STEPS" --set "out_dir=$OUT/ce_kl_edr" --set loss.objective=edr
# an eval whose results are written is not scored again (its outputs are complete or absent)
[[ -f "$OUT/eval/results.json" ]] || "$C" eval --offline --drafter "ce_kl=$OUT/ce_kl/drafter" \
  --drafter "ce_kl_edr=$OUT/ce_kl_edr/drafter" \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset "${EVAL_PROMPTS:-400}" \
  --max-new-tokens "${EVAL_TOKENS:-64}" --temperatures 0 --offline-batch 16 --rollouts "$OUT/rollouts" \
  --out "$OUT/eval"
# The equal-compute arm: CE + KL for as many steps as the EDR arm's training time buys (the pipeline's rule,
# `compute_match.matched_steps`, on the two runs' own step times: the median steps/s of their logged windows, the
# first, which holds compilation, left out; each run had the machine to itself); the same seed, so it sees the same
# batches for the steps it shares and continues the same order. Then all three arms on the same cached rollouts.
COMPUTE_STEPS="$(.venv/bin/python - "$OUT" "$STEPS" <<'PY'
import json, statistics, sys
from carryover_jax.train.compute_match import matched_steps
out, steps = sys.argv[1], int(sys.argv[2])
step_s = {a: 1 / statistics.median(json.loads(l)["steps_per_s"] for l in list(open(f"{out}/{a}/metrics.jsonl"))[1:])
          for a in ("ce_kl", "ce_kl_edr")}
print(matched_steps(steps, step_s["ce_kl_edr"], step_s["ce_kl"]))
PY
)"
echo "edr_ab: equal-compute CE + KL arm: $COMPUTE_STEPS steps"
"$C" train "${common[@]}" --set "steps=$COMPUTE_STEPS" --set "out_dir=$OUT/ce_kl_compute"
[[ -f "$OUT/eval3/results.json" ]] || "$C" eval --offline --drafter "ce_kl=$OUT/ce_kl/drafter" \
  --drafter "ce_kl_edr=$OUT/ce_kl_edr/drafter" --drafter "ce_kl_compute=$OUT/ce_kl_compute/drafter" \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset "${EVAL_PROMPTS:-400}" \
  --max-new-tokens "${EVAL_TOKENS:-64}" --temperatures 0 --offline-batch 16 --rollouts "$OUT/rollouts" \
  --out "$OUT/eval3"
