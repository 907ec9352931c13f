#!/usr/bin/env bash
# Does the Markov head pay at batch 1 once it biases the 8,192-token draft vocabulary instead of all 49,152 ids? The
# sampled-replies A/B's arm (2,000 ShareGPT prompts with greedy replies plus the same prompts' sampled replies, 2,400
# steps from scratch, lr 1e-3, bf16, seed 42) with drafter.kind=markov (rank 256; the Markov recipe's own loss weights,
# 0.1 CE + 0.9 L1 + KL, as in tau-levers-2026-12-03): offline τ on the same 534 rollouts, paired with that A/B's two
# DFlash drafters (whose offline eval it reads), then the two seed-42 drafters online against AR in one process (run
# that stage alone). Then the same at rank 64 (a quarter of the bias's bytes a slot). Resumable; from the repo root
# with the venv active, after docs/experiments/sampled-replies-2026-12-07/ab.sh (its stores, drafters and eval, in
# runs/sampab):
#   bash docs/experiments/markov-draft-vocab-2026-12-07/ab.sh
set -euo pipefail
run=runs/markov8k
out=$run/markov_seed42
echo "$(date -u +%FT%TZ) train, Markov head over the draft vocabulary"
[ -d $out/drafter ] || carryover train --config smollm2 --dtype bfloat16 --set data.store_kv=None \
  --set data.max_prompts=2000 --set steps=2400 --set lr=1e-3 --set data.store=runs/recab/rec2k \
  --set data.extra_stores=runs/sampab/s2k --set seed=42 --set drafter.kind=markov --set out_dir=$out
echo "$(date -u +%FT%TZ) eval"
[ -f $run/eval/results.json ] || carryover eval --offline --dtype bfloat16 --drafter markov=$out/drafter \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 400 --max-new-tokens 64 --temperatures 0 \
  --offline-batch 16 --rollouts runs/selfab/rollouts --out $run/eval
c=runs/sampab/eval/results.json
for base in sampled sampled_seed43 sampled,sampled_seed43; do
  python docs/experiments/recorded-features-2026-12-07/pooled.py $c $base $run/eval/results.json:markov
done | tee $run/paired.txt
echo "$(date -u +%FT%TZ) online, alone"
[ -f $run/round_ab.json ] || python docs/experiments/draft-vocab-16k-2026-12-07/round_ab.py \
  runs/sampab/mix_seed42/drafter $out/drafter 10 64 3 $run/round_ab.json | tee $run/round_ab.txt
out=$run/markov_r64_seed42
echo "$(date -u +%FT%TZ) train, rank 64"
[ -d $out/drafter ] || carryover train --config smollm2 --dtype bfloat16 --set data.store_kv=None \
  --set data.max_prompts=2000 --set steps=2400 --set lr=1e-3 --set data.store=runs/recab/rec2k \
  --set data.extra_stores=runs/sampab/s2k --set seed=42 --set drafter.kind=markov --set drafter.markov_rank=64 \
  --set out_dir=$out
[ -f $run/eval_r64/results.json ] || carryover eval --offline --dtype bfloat16 --drafter markov_r64=$out/drafter \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 400 --max-new-tokens 64 --temperatures 0 \
  --offline-batch 16 --rollouts runs/selfab/rollouts --out $run/eval_r64
for base in sampled,sampled_seed43 $run/eval/results.json:markov; do
  python docs/experiments/recorded-features-2026-12-07/pooled.py $c $base $run/eval_r64/results.json:markov_r64
done | tee $run/paired_r64.txt
echo "$(date -u +%FT%TZ) online, rank 64, alone"
[ -f $run/round_ab_r64.json ] || python docs/experiments/draft-vocab-16k-2026-12-07/round_ab.py \
  runs/sampab/mix_seed42/drafter $out/drafter 10 64 3 $run/round_ab_r64.json | tee $run/round_ab_r64.txt
here=docs/experiments/markov-draft-vocab-2026-12-07
python $here/calls.py $run/round_ab.json | tee $run/calls.txt
python $here/calls.py $run/round_ab_r64.json | tee $run/calls_r64.txt
python docs/experiments/tau-levers-2026-12-03/slots.py $c $run/eval/results.json $run/eval_r64/results.json \
  | tee $run/slots.txt
echo "$(date -u +%FT%TZ) done"
