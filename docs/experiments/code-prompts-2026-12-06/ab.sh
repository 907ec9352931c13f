#!/usr/bin/env bash
# Does HumanEval-shaped code data lift HumanEval τ? One cycle on the ShareGPT store (arm NAME) against the same cycle
# with the code store's records joined (arm NAMEcode): same recipe, seed, 3,600 steps and schedule; then both
# drafters on the same held-out rollouts, paired per rollout. Resumable (run it again after an interruption).
# From the repo root:
#   bash ab.sh                                  both arms from scratch on the rebuilt store (online-epyc's chain:
#                                               arm c1 is that chain's first cycle)
#   STORE=runs/d18k/data INIT=runs/d27k/c10_3600/drafter OUT=runs/d27k NAME=c11 bash ab.sh
#                                               an eleventh cycle from the tenth, where its store and drafter live
set -euo pipefail
here=docs/experiments/code-prompts-2026-12-06
store=${STORE:-runs/e18k/data}
init=${INIT:-}
out=${OUT:-runs/e18k}
name=${NAME:-c1}
data=(--config smollm2 --dtype bfloat16 --set "data.store=$store" --set data.max_prompts=18432 --set data.store_kv=None)
if [ -z "$init" ]; then recipe=(--set steps=3600 --set lr=1e-3)
else recipe=(--set "init_from=$init" --set steps=3600 --set lr=3e-4); fi

echo "$(date -u +%FT%TZ) stores (each resumes; a complete one is left as it is)"
[ -f runs/code/prompts.jsonl ] || python "$here/make_prompts.py" runs/code/prompts.jsonl 4096
carryover prepare --config smollm2 --dtype bfloat16 --set data.source=runs/code/prompts.jsonl \
  --set data.store=runs/code/data --set data.max_prompts=4096 --set data.store_kv=None
carryover prepare "${data[@]}"
for arm in "$name" "${name}code"; do
  [ -d "$out/${arm}_3600/drafter" ] && continue
  echo "$(date -u +%FT%TZ) arm $arm"
  extra=()
  [ "$arm" = "$name" ] || extra=(--set data.extra_stores=runs/code/data)
  carryover train "${data[@]}" "${recipe[@]}" "${extra[@]}" --set "out_dir=$out/${arm}_3600"
done
# the code prompts the split held out (sha1, 20 per mille): an in-domain check beside HumanEval
python -c "
import json, sys
from carryover_jax.train.sources import is_heldout
for line in open('runs/code/prompts.jsonl'):
    if is_heldout(json.loads(line)['id'], 20):
        sys.stdout.write(line)" > runs/code/heldout.jsonl
echo "$(date -u +%FT%TZ) offline eval"
carryover eval --offline --dtype bfloat16 --drafter "$name=$out/${name}_3600/drafter" \
  --drafter "${name}code=$out/${name}code_3600/drafter" \
  --datasets sharegpt humaneval mtbench code=runs/code/heldout.jsonl --prompts-per-dataset 400 --max-new-tokens 64 \
  --temperatures 0 --offline-batch 16 --rollouts runs/levers/rollouts --out "$out/eval_${name}code"
python docs/experiments/tau-levers-2026-12-03/paired.py "$name=$out/eval_${name}code/results.json:$name" \
  "${name}code=$out/eval_${name}code/results.json:${name}code" | tee "$here/paired_${name}.txt"
echo "$(date -u +%FT%TZ) done"
