#!/usr/bin/env bash
# One machine, end to end: set up the venv, generate the training responses, train the drafter.
#
#   bash launch/train_single_host.sh CONFIG [OPTIONS...]
#
# CONFIG is a config name (tiny | smollm2 | qwen3_4b) or a path to a config .py file (default: smollm2).
# OPTIONS go unchanged to both `carryover prepare` and `carryover train` (both accept --set KEY=VALUE
# and --quiet), so an override such as `--set data.max_len=512` describes the same data to both steps.
# Environment: CARRYOVER_VENV (default .venv in the repository) and the variables launch/setup.sh reads.
#
# Both steps are resumable: prepare continues an unfinished response store, train continues from the
# run's newest checkpoint, so rerunning this script after an interruption picks up where it stopped.
set -euo pipefail

# Relative config and store paths (configs/*.py use runs/...) are relative to the repository root.
cd "$(dirname "$0")/.."

CONFIG="${1:-smollm2}"
shift || true  # no arguments at all is fine: the default config

# Idempotent: returns at once when the venv already matches pyproject.toml.
bash launch/setup.sh
VENV="${CARRYOVER_VENV:-.venv}"
CARRYOVER=("$VENV/bin/carryover")

# The store must be complete before training reads it: the trainer shuffles the records it finds.
"${CARRYOVER[@]}" prepare --config "$CONFIG" "$@"
"${CARRYOVER[@]}" train --config "$CONFIG" "$@"
