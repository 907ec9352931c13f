#!/usr/bin/env bash
# The prepared device check (issue 22): one call of <= 4 minutes on a lent H200, the first call of a lease.
#   kernel checks on the device (pallas / auto / cudnn vs einsum: values, gradients, live-length decode at
#   head dims 128/256/512); `carryover bench steps` at Qwen3-4B shapes, bf16, context 4096, 15 proposals
#   (AR step / weight-read floor, draft / verify / round / AR, baseline and DVD train step time + MFU, a
#   compressed jax.profiler trace of one round); compiled per-device memory of the data-parallel paper
#   configs with the device's compiler; then, if time remains, the fast test suite (CPU platform, -x).
# Writes $OUT/device-check.{json,md}, trace-round.tar.gz, tests.txt (carryover_jax/bench/device_check.py).
#
# On a TPU VM (pip install '.[tpu]') the same command checks the Mosaic kernel ("mosaic", "auto") against
# einsum, times round / AR with "auto", compiles the memory rows for the TPU and runs tests/test_tpu_lowering.py.
#
# Usage: bash launch/device_check.sh [--dry-run [--tpu]] [--budget-s S] [--no-tests]
#   --dry-run: every part at toy scale on this (CPU) machine, grain/gguf unimportable as on the image;
#              prints the carry set of the device call and its size. --tpu: the TPU VM's parts.
# On the device (the wheels of what the test suite needs and the image lacks travel in .whl; build them with
# `bash launch/device_check.sh --wheels`):
#   run(command="bash launch/device_check.sh", carry=[".whl"], timeout_s=240)  (parts stop starting at 180 s)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-runs/device-check}
if [ "${1:-}" = "--wheels" ]; then  # once, on a machine with a package registry (listed in .git/info/exclude)
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.whl/' >> .git/info/exclude; }
  exec "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 gguf==0.19.0
fi
if [ -d .whl ] && ! "$PY" -c 'import grain' 2>/dev/null; then  # the device image: install what travelled
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
mkdir -p "$OUT"
export PYTHONPATH=.:${PYTHONPATH:-}
for a in "$@"; do [ "$a" = "--dry-run" ] && export JAX_PLATFORMS=cpu; done
exec "$PY" -m carryover_jax.bench.device_check --out "$OUT" "$@"
