#!/usr/bin/env bash
# The batch-1 CPU drafter for the embedded default (SmolLM2-135M-Instruct): the recipe that reached held-out τ 1.954
# and 1.47x / 1.58x / 1.34x AR at batch 1 on held-out ShareGPT / HumanEval / MT-Bench, every 95% interval above 1.3x
# (2026-12-07, 2 AMD EPYC cores, docs/experiments/markov-draft-vocab-2026-12-07). Stages, each resumable (re-run
# after a stop and it goes on where it stopped; a finished cycle or eval is skipped):
#   1. the target's greedy replies (bf16, features recorded by the generation, no stored K/V) to every first-turn
#      ShareGPT training prompt (13,562 records) and to 2,455 HumanEval-shaped code prompts (`data.source=pycode`);
#   2. CYCLES x STEPS steps of the 2-layer drafter with the Markov head at rank 64 over the 8,192-token draft
#      vocabulary, 3 proposals, on both stores: cycle 1 from scratch at lr 1e-3, each later one from the one before
#      at 3e-4 (held-out τ by cycle there, 622 rollouts with held-out code prompts: 1.714, 1.797, 1.863, 1.914, 1.954);
#   3. held-out τ offline on every held-out ShareGPT, HumanEval and MT-Bench prompt, then the speedup over AR online
#      at batch 1 (float32 target, bf16 drafter; each speedup with its 95% interval over prompts).
# ~7 h on 2 EPYC cores from empty (prepare ~2 h, a cycle ~48 min, the evals ~30 min).
# Env: OUT (runs/cpu-drafter), PROMPTS (18432: all of ShareGPT's), CODE_PROMPTS (2455), CYCLES (5), STEPS (3600),
# OFFLINE_PROMPTS per dataset (400: every held-out one), EVAL_PROMPTS online per dataset (80), EVAL_TOKENS (64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
C=.venv/bin/carryover
OUT="${OUT:-runs/cpu-drafter}"
CYCLES="${CYCLES:-5}"
STEPS="${STEPS:-3600}"
common=(--config smollm2 --dtype bfloat16 --set data.store_kv=None)
"$C" prepare "${common[@]}" --set "data.store=$OUT/sharegpt" --set "data.max_prompts=${PROMPTS:-18432}"
"$C" prepare "${common[@]}" --set "data.store=$OUT/code" --set data.source=pycode \
  --set "data.max_prompts=${CODE_PROMPTS:-2455}"
train=("${common[@]}" --set "data.store=$OUT/sharegpt" --set "data.max_prompts=${PROMPTS:-18432}"
       --set "data.extra_stores=$OUT/code" --set drafter.kind=markov --set drafter.markov_rank=64 --set "steps=$STEPS")
prev=""
for c in $(seq 1 "$CYCLES"); do
  out="$OUT/cycle$c"
  if [[ ! -d "$out/drafter" ]]; then
    if [[ -z "$prev" ]]; then
      "$C" train "${train[@]}" --set lr=1e-3 --set "out_dir=$out"
    else
      "$C" train "${train[@]}" --set "init_from=$prev" --set lr=3e-4 --set "out_dir=$out"
    fi
  fi
  prev="$out/drafter"
done
# an eval whose results are written is not run again (its outputs are complete or absent)
[[ -f "$OUT/eval/results.json" ]] || "$C" eval --offline --dtype bfloat16 --drafter "markov=$prev" \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset "${OFFLINE_PROMPTS:-400}" \
  --max-new-tokens "${EVAL_TOKENS:-64}" --temperatures 0 --offline-batch 16 --rollouts "$OUT/rollouts" --out "$OUT/eval"
[[ -f "$OUT/online/results.json" ]] || "$C" eval --drafter "markov=$prev" --drafter-dtype bfloat16 \
  --drafter-param-dtype bfloat16 --datasets sharegpt humaneval mtbench --prompts-per-dataset "${EVAL_PROMPTS:-80}" \
  --max-new-tokens "${EVAL_TOKENS:-64}" --temperatures 0 --timing-repeats 2 --batch-sizes --out "$OUT/online"
echo "cpu_drafter: the drafter is $prev; held-out τ: $OUT/eval/report.md; speedup over AR: $OUT/online/report.md"
