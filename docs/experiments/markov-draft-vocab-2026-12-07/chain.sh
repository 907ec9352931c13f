#!/usr/bin/env bash
# The code chain (online-epyc's chain.sh with the code store, as in code-prompts-2026-12-06) with the Markov head at
# rank 64 over the 8,192-token draft vocabulary, then scored as the DFlash code chain's cycle 4 was: offline on the
# held-out ShareGPT, HumanEval, MT-Bench and code prompts (paired by rollout with code-prompts' committed c4code
# results), online on 64 prompts a set with the drafter in float32 and in bf16 (run those stages alone). Resumable at
# every stage; from the repo root with the venv active:
#   bash docs/experiments/markov-draft-vocab-2026-12-07/chain.sh
# ~4 h of 2 EPYC cores after the greedy ShareGPT and code stores (~2 h from empty): four 3,600-step cycles, the evals.
set -euo pipefail
[ -f runs/code/prompts.jsonl ] || \
  python docs/experiments/code-prompts-2026-12-06/make_prompts.py runs/code/prompts.jsonl 4096
carryover prepare --config smollm2 --dtype bfloat16 --set data.source=runs/code/prompts.jsonl \
  --set data.store=runs/code/data --set data.max_prompts=4096 --set data.store_kv=None --quiet
CODE=runs/code/data ARM=codemk SETS="drafter.kind=markov drafter.markov_rank=64" \
  bash docs/experiments/online-epyc-2026-12-06/chain.sh 4 runs/e18k
d=runs/e18k/c4codemk_3600/drafter
python -c "
import json, sys
from carryover_jax.train.sources import is_heldout
for line in open('runs/code/prompts.jsonl'):
    if is_heldout(json.loads(line)['id'], 20):
        sys.stdout.write(line)" > runs/code/heldout.jsonl
[ -f runs/e18k/eval_c4codemk/results.json ] || carryover eval --offline --dtype bfloat16 --drafter c4codemk=$d \
  --datasets sharegpt humaneval mtbench code=runs/code/heldout.jsonl --prompts-per-dataset 400 --max-new-tokens 64 \
  --temperatures 0 --offline-batch 16 --rollouts runs/levers/rollouts --out runs/e18k/eval_c4codemk
python docs/experiments/recorded-features-2026-12-07/pooled.py runs/e18k/eval_c4codemk/results.json \
  docs/experiments/code-prompts-2026-12-06/results_c4code.json:c4code c4codemk | tee runs/e18k/paired_c4codemk.txt
[ -f runs/e18k/online_c4codemk/results.json ] || carryover eval --drafter c4codemk=$d \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 64 --max-new-tokens 64 --temperatures 0 \
  --timing-repeats 2 --batch-sizes --out runs/e18k/online_c4codemk
[ -f runs/e18k/online_c4codemk_bf16/results.json ] || carryover eval --drafter c4codemk=$d \
  --drafter-dtype bfloat16 --drafter-param-dtype bfloat16 \
  --datasets sharegpt humaneval mtbench --prompts-per-dataset 64 --max-new-tokens 64 --temperatures 0 \
  --timing-repeats 2 --batch-sizes --out runs/e18k/online_c4codemk_bf16
echo "$(date -u +%FT%TZ) done"
