#!/usr/bin/env bash
# Does HumanEval-shaped code data lift HumanEval τ? One cycle from scratch on the ShareGPT store (arm c1, the
# online-epyc chain's first cycle) against the same cycle with the code store's records joined (arm c1code): same
# recipe, seed, steps and schedule; then both drafters on the same held-out rollouts, paired per rollout.
# Resumable like the chain (run it again after an interruption). From the repo root: bash ab.sh
set -euo pipefail
here=docs/experiments/code-prompts-2026-12-06
run=runs/e18k
common=(--config smollm2 --dtype bfloat16 --set "data.store=$run/data" --set data.max_prompts=18432
        --set data.store_kv=None --set steps=3600 --set lr=1e-3)
echo "$(date -u +%FT%TZ) code store (resumes; skips what it holds)"
carryover prepare --config smollm2 --dtype bfloat16 --set data.source=runs/code/prompts.jsonl \
  --set data.store=runs/code/data --set data.max_prompts=4096 --set data.store_kv=None
bash docs/experiments/online-epyc-2026-12-06/chain.sh 1 "$run"      # the ShareGPT store and arm c1
if [ ! -d "$run/c1code_3600/drafter" ]; then
  echo "$(date -u +%FT%TZ) arm c1code"
  carryover train "${common[@]}" --set data.extra_stores=runs/code/data --set "out_dir=$run/c1code_3600"
fi
# the code prompts the store's split held out (sha1 split, 20 per mille): an in-domain check beside HumanEval
python -c "
import json, sys
from carryover_jax.train.sources import is_heldout
for line in open('runs/code/prompts.jsonl'):
    if is_heldout(json.loads(line)['id'], 20):
        sys.stdout.write(line)" > runs/code/heldout.jsonl
echo "$(date -u +%FT%TZ) offline eval"
carryover eval --offline --dtype bfloat16 --drafter "c1=$run/c1_3600/drafter" \
  --drafter "c1code=$run/c1code_3600/drafter" --datasets sharegpt humaneval mtbench code=runs/code/heldout.jsonl \
  --prompts-per-dataset 400 --max-new-tokens 64 --temperatures 0 --offline-batch 16 --rollouts runs/levers/rollouts \
  --out "$run/eval_c1"
python docs/experiments/tau-levers-2026-12-03/paired.py "c1=$run/eval_c1/results.json:c1" \
  "c1code=$run/eval_c1/results.json:c1code" | tee "$here/paired.txt"
echo "$(date -u +%FT%TZ) done"
