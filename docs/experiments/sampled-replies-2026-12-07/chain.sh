#!/usr/bin/env bash
# The code chain rebuilt with a sampled store beside its greedy ShareGPT and code stores, then scored: resumable at
# every stage (rerun it after an interruption). From the repo root with the venv active:
#   bash docs/experiments/sampled-replies-2026-12-07/chain.sh
# ~6 h of 2 EPYC cores from empty stores: the greedy ShareGPT store (~1.5 h), the 4,096-prompt code store (~0.5 h),
# the sampled ShareGPT store (~1.5 h), four 3,600-step cycles (~3 h); then the evals (~25 min, run them alone).
set -euo pipefail
chain=docs/experiments/online-epyc-2026-12-06/chain.sh
bash $chain 0 runs/e18k
[ -f runs/code/prompts.jsonl ] || python docs/experiments/code-prompts-2026-12-06/make_prompts.py runs/code/prompts.jsonl 4096
carryover prepare --config smollm2 --dtype bfloat16 --set data.source=runs/code/prompts.jsonl \
  --set data.store=runs/code/data --set data.max_prompts=4096 --set data.store_kv=None
carryover prepare --config smollm2 --dtype bfloat16 --set data.store=runs/e18k/sampled --set data.max_prompts=18432 \
  --set data.store_kv=None --set data.temperature=0.7 --set data.top_p=0.95 --set data.seed=1
EXTRA="runs/code/data runs/e18k/sampled" ARM=codesamp bash $chain 4 runs/e18k
d=runs/e18k/c4codesamp_3600/drafter
[ -f runs/e18k/eval_c4codesamp/results.json ] || carryover eval --offline --dtype bfloat16 --drafter c4codesamp=$d \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 400 --max-new-tokens 64 --temperatures 0 \
  --offline-batch 16 --out runs/e18k/eval_c4codesamp
[ -f runs/e18k/online_c4codesamp/results.json ] || carryover eval --drafter c4codesamp=$d \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 64 --max-new-tokens 64 --temperatures 0 \
  --timing-repeats 2 --batch-sizes --out runs/e18k/online_c4codesamp
