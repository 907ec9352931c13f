#!/usr/bin/env bash
# prepare with the feature pass (OLD: a checkout of the commit before recorded features) against prepare with the
# features recorded by generation (this checkout), the recipe's settings, the same first N ShareGPT prompts into
# fresh stores, whole processes alternated old/new/new/old. Usage, from the repo root with the venv active:
#   OLD=/path/to/old/checkout bash docs/experiments/recorded-features-2026-12-07/ab.sh [N] [RUN_DIR]
set -euo pipefail
n=${1:-384}
run=$(realpath -m "${2:-runs/recab}")
new=$(pwd)
old=${OLD:?set OLD to a checkout of the commit before recorded features}
mkdir -p "$run"
arm() {  # arm name, checkout, store
  rm -rf "$3"
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$2" && python -c "import sys; from carryover_jax.cli import main; sys.exit(main())" prepare --config smollm2 \
    --dtype bfloat16 --set "data.store=$3" --set "data.max_prompts=$n" --set data.store_kv=None --quiet)
  t1=$(date +%s.%N)
  echo "$1 $(python -c "print(f'{$t1 - $t0:.1f}')") s $(date -u +%FT%TZ)" | tee -a "$run/times.txt"
}
arm old1 "$old" "$run/old1"
arm new1 "$new" "$run/new1"
arm new2 "$new" "$run/new2"
arm old2 "$old" "$run/old2"
