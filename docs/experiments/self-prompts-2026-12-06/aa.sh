#!/usr/bin/env bash
# The A/A of the A/B (after ab.sh, from the repo root): the control arm again with another seed (initialisation and
# batch order), then all three arms scored in one run on the 534 eval-set rollouts and the 192 held-out self-written
# prompts. Usage, with the venv active: bash docs/experiments/self-prompts-2026-12-06/aa.sh
set -euo pipefail
run=runs/selfab
echo "$(date -u +%FT%TZ) train sharegpt2k_seed43"
[ -d $run/sharegpt2k_seed43/drafter ] || carryover train --config smollm2 --dtype bfloat16 --set data.store_kv=None \
  --set steps=2400 --set lr=1e-3 \
  --set data.store=$run/sharegpt --set data.max_prompts=2000 --set seed=43 --set out_dir=$run/sharegpt2k_seed43
echo "$(date -u +%FT%TZ) eval"
[ -f $run/eval_aa/results.json ] || carryover eval --offline --dtype bfloat16 \
  --drafter sharegpt2k=$run/sharegpt2k/drafter --drafter mix=$run/mix/drafter \
  --drafter sharegpt2k_seed43=$run/sharegpt2k_seed43/drafter \
  --datasets sharegpt humaneval mtbench "self=$run/self_heldout.jsonl" --prompts-per-dataset 400 --max-new-tokens 64 \
  --temperatures 0 --offline-batch 16 --rollouts $run/rollouts_all --out $run/eval_aa
echo "$(date -u +%FT%TZ) done"
python docs/experiments/tau-levers-2026-12-03/paired.py "sharegpt2k=$run/eval_aa/results.json:sharegpt2k" \
  "seed43=$run/eval_aa/results.json:sharegpt2k_seed43" "mix=$run/eval_aa/results.json:mix"
