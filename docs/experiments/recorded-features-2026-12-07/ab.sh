#!/usr/bin/env bash
# prepare with the feature pass against prepare with the features recorded by generation (this checkout), the
# recipe's settings, the same first N ShareGPT prompts into fresh stores, whole processes alternated
# old/new/new/old. The "old" arm is OLD, a checkout of the commit before recorded features, or without OLD this
# checkout with `--set data.feature_pass=true`. DTYPE: prepare's numerics (bfloat16, the recipe's; or float32).
# Usage, from the repo root with the venv active:
#   [OLD=/path/to/old/checkout] [DTYPE=float32] bash docs/experiments/recorded-features-2026-12-07/ab.sh [N] [RUN_DIR]
set -euo pipefail
n=${1:-384}
run=$(realpath -m "${2:-runs/recab}")
new=$(pwd)
old=${OLD:-$new}
dtype=${DTYPE:-bfloat16}
old_sets=()
[ -n "${OLD:-}" ] || old_sets=(--set data.feature_pass=true)
mkdir -p "$run"
arm() {  # arm name, checkout, store, extra settings...
  local name=$1 dir=$2 store=$3
  shift 3
  rm -rf "$store"
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$dir" && python -c "import sys; from carryover_jax.cli import main; sys.exit(main())" prepare --config smollm2 \
    --dtype "$dtype" --set "data.store=$store" --set "data.max_prompts=$n" --set data.store_kv=None "$@" --quiet)
  t1=$(date +%s.%N)
  echo "$name $(python -c "print(f'{$t1 - $t0:.1f}')") s $(date -u +%FT%TZ)" | tee -a "$run/times.txt"
}
arm old1 "$old" "$run/old1" "${old_sets[@]}"
arm new1 "$new" "$run/new1"
arm new2 "$new" "$run/new2"
arm old2 "$old" "$run/old2" "${old_sets[@]}"
