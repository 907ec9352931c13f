#!/usr/bin/env bash
# Training on a multi-host Cloud TPU VM slice (e.g. v5p-16, v6e-16, v5e-32): run the SAME command on every
# worker of the slice; jax.distributed.initialize() finds the coordinator and this worker's rank in the TPU
# VM's metadata (CARRYOVER_TPU_SLICE=1 asks carryover_jax.train.distributed for that), and each worker's
# process drives its own chips.
#
#   gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all \
#     --command "cd carryover-jax && bash launch/train_tpu_slice.sh CONFIG [OPTIONS...]"
#
# Before launching (every worker): the repository at the same path, a venv with the TPU build
# (`python -m venv .venv && .venv/bin/pip install -e '.[tpu]'`, or CARRYOVER_VENV), and the response store
# (data.store) and run folder (out_dir) on storage every worker sees at the same path (a GCS FUSE mount or
# a shared disk): checkpoints are written collectively into one directory. The config's mesh must cover the
# slice's chips (configs/*_tpu.py: data=-1 takes the rest). On one worker (v5e-8, v6e-8, v5p-8) plain
# `carryover train --config CONFIG` needs none of this.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="${1:?usage: train_tpu_slice.sh CONFIG [OPTIONS...]}"
shift
VENV="${CARRYOVER_VENV:-.venv}"
if [ ! -x "$VENV/bin/carryover" ]; then
  echo "train_tpu_slice: no $VENV/bin/carryover (pip install -e '.[tpu]' into $VENV)" >&2
  exit 2
fi
export CARRYOVER_TPU_SLICE=1
exec "$VENV/bin/carryover" train --config "$CONFIG" "$@"
