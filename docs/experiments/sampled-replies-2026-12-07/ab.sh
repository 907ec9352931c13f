#!/usr/bin/env bash
# Do the target's sampled replies to prompts already in the store teach a drafter more? The recorded-features A/B's
# arm (2,000 ShareGPT prompts with greedy replies, 2,400 steps from scratch, lr 1e-3, bf16, seeds 42 and 43) against
# the same recipe on that store plus a store of the same 2,000 prompts with the target's sampled replies
# (temperature 0.7, top-p 0.95): twice the records at equal steps. Scored on the same 534 rollouts in one offline
# eval. Resumable; from the repo root with the venv active, after
# docs/experiments/recorded-features-2026-12-07/train_ab.sh (its greedy store and drafters, in runs/recab) and
# docs/experiments/self-prompts-2026-12-06/ab.sh + aa.sh (the rollouts, in runs/selfab):
#   bash docs/experiments/sampled-replies-2026-12-07/ab.sh
set -euo pipefail
here=docs/experiments/sampled-replies-2026-12-07
run=runs/sampab
greedy=runs/recab
common=(--config smollm2 --dtype bfloat16 --set data.store_kv=None --set data.max_prompts=2000)
echo "$(date -u +%FT%TZ) prepare sampled"
carryover prepare "${common[@]}" --set data.store=$run/s2k --set data.temperature=0.7 --set data.top_p=0.95 \
  --set data.seed=1 --quiet
for seed in 42 43; do
  out=$run/mix_seed$seed
  echo "$(date -u +%FT%TZ) train greedy + sampled, seed $seed"
  [ -d $out/drafter ] || carryover train "${common[@]}" --set steps=2400 --set lr=1e-3 \
    --set data.store=$greedy/rec2k --set data.extra_stores=$run/s2k --set seed=$seed --set out_dir=$out
done
echo "$(date -u +%FT%TZ) eval"
[ -f $run/eval/results.json ] || carryover eval --offline --dtype bfloat16 \
  --drafter greedy=$greedy/rec2k_train/drafter --drafter greedy_seed43=$greedy/rec2k_seed43/drafter \
  --drafter sampled=$run/mix_seed42/drafter --drafter sampled_seed43=$run/mix_seed43/drafter \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 400 --max-new-tokens 64 --temperatures 0 \
  --offline-batch 16 --rollouts runs/selfab/rollouts --out $run/eval
r=$run/eval/results.json
python docs/experiments/tau-levers-2026-12-03/paired.py "greedy=$r:greedy" "greedy_seed43=$r:greedy_seed43" \
  "sampled=$r:sampled" "sampled_seed43=$r:sampled_seed43" | tee $run/paired_all.txt
python docs/experiments/recorded-features-2026-12-07/pooled.py $r greedy,greedy_seed43 sampled,sampled_seed43 \
  | tee $run/pooled.txt
echo "$(date -u +%FT%TZ) done"
