#!/usr/bin/env bash
# The default recipe's data and cycles rebuilt from an empty store, resumable: run it again after an interruption
# and every stage goes on where it stopped (prepare skips the prompts its store holds; training resumes from its
# newest checkpoint; a finished cycle is skipped). Usage: bash chain.sh CYCLES [RUN_DIR]   (from the repo root)
# CODE=runs/code/data bash chain.sh CYCLES: every cycle also trains on that store (code-prompts-2026-12-06), its
# cycles named cNcode_3600. EXTRA="STORE ..." ARM=NAME: these stores instead, the cycles named cN${ARM}_3600.
# SETS="KEY=VALUE ...": more training settings on every cycle (e.g. drafter.kind=markov), with ARM to name the cycles.
set -euo pipefail
cycles=${1:?usage: chain.sh CYCLES [RUN_DIR]}
run=${2:-runs/e18k}
common=(--config smollm2 --dtype bfloat16 --set "data.store=$run/data" --set data.max_prompts=18432
        --set data.store_kv=None)
train=("${common[@]}")
arm=""
if [ -n "${CODE:-}" ]; then train+=(--set "data.extra_stores=$CODE"); arm=${ARM:-code}; fi
if [ -n "${EXTRA:-}" ]; then
  list=$(printf "'%s', " $EXTRA)
  train+=(--set "data.extra_stores=[${list%, }]"); arm=${ARM:?EXTRA needs ARM}
fi
for kv in ${SETS:-}; do train+=(--set "$kv"); done
if [ -n "${SETS:-}" ] && [ -z "${ARM:-}" ]; then echo "SETS needs ARM (the cycles' name)" >&2; exit 2; fi
echo "$(date -u +%FT%TZ) prepare"
carryover prepare "${common[@]}"
prev=""
for c in $(seq 1 "$cycles"); do
  out="$run/c${c}${arm}_3600"
  if [ -d "$out/drafter" ]; then prev="$out/drafter"; continue; fi
  echo "$(date -u +%FT%TZ) cycle $c"
  if [ -z "$prev" ]; then
    carryover train "${train[@]}" --set steps=3600 --set lr=1e-3 --set "out_dir=$out"
  else
    carryover train "${train[@]}" --set "init_from=$prev" --set steps=3600 --set lr=3e-4 --set "out_dir=$out"
  fi
  prev="$out/drafter"
done
echo "$(date -u +%FT%TZ) done"
