#!/usr/bin/env bash
# The equal-size A/B of self-written prompts, from empty stores, resumable (every stage goes on where it stopped or
# is skipped when done). Both arms: the default recipe from scratch in bf16, 2,400 steps, lr 1e-3, 2,000 records'
# worth of prompts. sharegpt2k: the first 2,000 ShareGPT prompts. mix: the first 1,000 of them (the same records) and
# the first 1,000 self-written prompts. Scored on the same 534 held-out rollouts (ShareGPT, HumanEval, MT-Bench), then
# on the last 192 self-written prompts (self-8001 to self-8192: no arm trained on them).
# Usage, from the repo root with the venv active:
#   bash docs/experiments/self-prompts-2026-12-06/ab.sh [RUN_DIR]   (default runs/selfab)
set -euo pipefail
here=docs/experiments/self-prompts-2026-12-06
run=${1:-runs/selfab}
common=(--config smollm2 --dtype bfloat16 --set data.store_kv=None)
mkdir -p runs/self
[ -f runs/self/prompts.jsonl ] || cp "$here/prompts.jsonl" runs/self/prompts.jsonl
stamp() { echo "$(date -u +%FT%TZ) $*"; }
stamp prepare
carryover prepare "${common[@]}" --set "data.store=$run/sharegpt" --set data.max_prompts=2000
carryover prepare "${common[@]}" --set data.source=runs/self/prompts.jsonl --set "data.store=$run/self" \
  --set data.max_prompts=1000
[ -d "$run/sharegpt1k" ] || python "$here/subset.py" "$run/sharegpt" "$run/sharegpt1k" 1000
train=("${common[@]}" --set steps=2400 --set lr=1e-3)
stamp train sharegpt2k
[ -d "$run/sharegpt2k/drafter" ] || carryover train "${train[@]}" --set "data.store=$run/sharegpt" \
  --set data.max_prompts=2000 --set "out_dir=$run/sharegpt2k"
stamp train mix
[ -d "$run/mix/drafter" ] || carryover train "${train[@]}" --set "data.store=$run/sharegpt1k" \
  --set data.max_prompts=1000 --set "data.extra_stores=$run/self" --set "out_dir=$run/mix"
stamp eval
[ -f "$run/eval/results.json" ] || carryover eval --offline --dtype bfloat16 \
  --drafter "sharegpt2k=$run/sharegpt2k/drafter" --drafter "mix=$run/mix/drafter" \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 400 --max-new-tokens 64 --temperatures 0 \
  --offline-batch 16 --rollouts "$run/rollouts" --out "$run/eval"
python docs/experiments/tau-levers-2026-12-03/paired.py "sharegpt2k=$run/eval/results.json:sharegpt2k" \
  "mix=$run/eval/results.json:mix" | tee "$run/paired.txt"
tail -n 192 runs/self/prompts.jsonl > "$run/self_heldout.jsonl"
[ -f "$run/eval_self/results.json" ] || carryover eval --offline --dtype bfloat16 \
  --drafter "sharegpt2k=$run/sharegpt2k/drafter" --drafter "mix=$run/mix/drafter" \
  --datasets "self=$run/self_heldout.jsonl" --prompts-per-dataset 192 --max-new-tokens 64 --temperatures 0 \
  --offline-batch 16 --rollouts "$run/rollouts_self" --out "$run/eval_self"
stamp done
