#!/usr/bin/env bash
# Device check of the attention backends (issue 11), one short run on a lent GPU (~5-10 min on one H200):
# Qwen3-4B shapes, random bf16 weights, context 4096, 15 proposals. Per backend: AR step, drafting,
# verification and a round as ratios to the AR step (goal: verify / AR <= 1.3 at 4k), the training step's
# time and compiled temp memory, and a kernel check (each backend vs einsum on the device: training
# output + gradients, a live-length decode read). A backend that fails is reported, not raised.
# Writes $OUT/steps-qwen3-4b-ctx4096.{json,txt}. Usage: bash launch/device_check.sh [extra bench args]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-runs/device-check}
mkdir -p "$OUT"
"$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
PYTHONPATH=. "$PY" -c 'import sys; from carryover_jax.cli import main; sys.exit(main(sys.argv[1:]))' \
  bench steps --preset qwen3-4b --context 4096 --proposals 15 --train-len 1024 --anchors 64 \
  --backend einsum pallas cudnn --out "$OUT/steps-qwen3-4b-ctx4096.json" "$@" | tee "$OUT/steps-qwen3-4b-ctx4096.txt"
