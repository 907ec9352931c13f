#!/usr/bin/env bash
# Does a 16,384-token draft vocabulary beat the 8,192-token default? The sampled-replies A/B's arm (2,000 ShareGPT
# prompts with greedy replies plus the same prompts' sampled replies, 2,400 steps from scratch, lr 1e-3, bf16, seed
# 42) with drafter.draft_vocab_size=16384: offline τ on the same 534 rollouts, paired with that A/B's two 8,192-token
# drafters (whose offline eval it reads), the vocabularies' coverage of the rollouts, then the two seed-42 drafters
# online against AR in one process (run that stage alone). Resumable; from the repo root with the venv active, after
# docs/experiments/sampled-replies-2026-12-07/ab.sh (its stores, drafters and eval, in runs/sampab):
#   bash docs/experiments/draft-vocab-16k-2026-12-07/ab.sh
set -euo pipefail
here=docs/experiments/draft-vocab-16k-2026-12-07
run=runs/vocab16k
out=$run/v16k_seed42
echo "$(date -u +%FT%TZ) train, 16,384-token draft vocabulary"
[ -d $out/drafter ] || carryover train --config smollm2 --dtype bfloat16 --set data.store_kv=None \
  --set data.max_prompts=2000 --set steps=2400 --set lr=1e-3 --set data.store=runs/recab/rec2k \
  --set data.extra_stores=runs/sampab/s2k --set seed=42 --set drafter.draft_vocab_size=16384 --set out_dir=$out
echo "$(date -u +%FT%TZ) eval"
[ -f $run/eval/results.json ] || carryover eval --offline --dtype bfloat16 --drafter v16k=$out/drafter \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 400 --max-new-tokens 64 --temperatures 0 \
  --offline-batch 16 --rollouts runs/selfab/rollouts --out $run/eval
c=runs/sampab/eval/results.json
for base in sampled sampled_seed43 sampled,sampled_seed43; do
  python docs/experiments/recorded-features-2026-12-07/pooled.py $c $base $run/eval/results.json:v16k
done | tee $run/paired.txt
python docs/experiments/sampled-replies-2026-12-07/coverage.py v8k=runs/sampab/mix_seed42/drafter v16k=$out/drafter \
  | tee $run/coverage.txt
echo "$(date -u +%FT%TZ) online, alone"
[ -f $run/round_ab.json ] || python $here/round_ab.py runs/sampab/mix_seed42/drafter $out/drafter 10 64 3 \
  $run/round_ab.json | tee $run/round_ab.txt
echo "$(date -u +%FT%TZ) done"
