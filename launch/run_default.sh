#!/usr/bin/env bash
# The main job on the embedded default (SmolLM2-135M-Instruct from PyPI, ShareGPT prompts), on a fresh
# machine: set up, regenerate training responses, train the drafter, then decode with it (AR vs
# speculative baseline vs speculative Carryover, same prompts, one run). Every stage resumes where it
# stopped if the script is run again. Extra arguments are config overrides, e.g. --set steps=100.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
BIN=.venv/bin
RUN="${CARRYOVER_RUN:-runs/smollm2}"
"$BIN/carryover" prepare --config smollm2 --set "data.store=$RUN/data" "$@"
"$BIN/carryover" train --config smollm2 --set "data.store=$RUN/data" --set "out_dir=$RUN/train" "$@"
"$BIN/carryover" bench decode --target smollm2 --drafter "$RUN/train/drafter" --out "$RUN/bench_decode.json"
echo "drafter: $RUN/train/drafter   metrics plot: $RUN/train/metrics.png   decode results: $RUN/bench_decode.json"
