#!/usr/bin/env bash
# Does a drafter learn as well from recorded features? The self-prompts A/B's control recipe (2,000 ShareGPT prompts,
# 2,400 steps from scratch, lr 1e-3, bf16) at seeds 42 and 43 on a store of the same prompts prepared with recorded
# features, scored with the control's two seeds (feature-pass store) on the same 534 rollouts. Resumable; from the
# repo root with the venv active, after ab.sh (its new1 store is the first 384 prompts of this one) and
# docs/experiments/self-prompts-2026-12-06/ab.sh + aa.sh (the control arms and the rollouts, in runs/selfab):
#   bash docs/experiments/recorded-features-2026-12-07/train_ab.sh
set -euo pipefail
here=docs/experiments/recorded-features-2026-12-07
run=runs/recab
ctl=runs/selfab
common=(--config smollm2 --dtype bfloat16 --set data.store_kv=None)
echo "$(date -u +%FT%TZ) prepare rec2k"
[ -d $run/rec2k ] || cp -r $run/new1 $run/rec2k
carryover prepare "${common[@]}" --set data.store=$run/rec2k --set data.max_prompts=2000 --quiet
for seed in 42 43; do
  out=$run/rec2k_train; [ $seed = 42 ] || out=$run/rec2k_seed$seed
  echo "$(date -u +%FT%TZ) train rec2k seed $seed"
  [ -d $out/drafter ] || carryover train "${common[@]}" --set steps=2400 --set lr=1e-3 \
    --set data.store=$run/rec2k --set data.max_prompts=2000 --set seed=$seed --set out_dir=$out
done
echo "$(date -u +%FT%TZ) eval"
[ -f $run/eval2/results.json ] || carryover eval --offline --dtype bfloat16 \
  --drafter sharegpt2k=$ctl/sharegpt2k/drafter --drafter sharegpt2k_seed43=$ctl/sharegpt2k_seed43/drafter \
  --drafter recorded=$run/rec2k_train/drafter --drafter recorded_seed43=$run/rec2k_seed43/drafter \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 400 --max-new-tokens 64 --temperatures 0 \
  --offline-batch 16 --rollouts $ctl/rollouts --out $run/eval2
r=$run/eval2/results.json
python docs/experiments/tau-levers-2026-12-03/paired.py "sharegpt2k=$r:sharegpt2k" "seed43=$r:sharegpt2k_seed43" \
  "recorded=$r:recorded" "recorded_seed43=$r:recorded_seed43" | tee $run/paired_all.txt
python $here/pooled.py $r sharegpt2k,sharegpt2k_seed43 recorded,recorded_seed43 | tee $run/pooled.txt
echo "$(date -u +%FT%TZ) done"
