#!/usr/bin/env bash
# Generic multi-host training launcher: start it once on every host (ssh loop, pdsh, a cluster's job
# runner, ...), with the same CONFIG and OPTIONS everywhere and these variables set per host:
#
#   COORDINATOR    host:port of process 0's coordinator service, reachable from every host
#                  (e.g. node0:12345; pick a free port; it is the same on every host)
#   NUM_PROCESSES  number of processes in the job (one per host is the usual layout: each process
#                  drives all of its host's accelerators)
#   PROCESS_ID     this host's rank, 0 .. NUM_PROCESSES-1 (rank 0 writes metrics and the final drafter)
#
#   COORDINATOR=node0:12345 NUM_PROCESSES=2 PROCESS_ID=0 bash launch/train_multihost.sh CONFIG [OPTIONS...]
#
# They become CARRYOVER_COORDINATOR / CARRYOVER_NUM_PROCESSES / CARRYOVER_PROCESS_ID, which
# carryover_jax.train.distributed passes to jax.distributed.initialize. (Under SLURM use
# launch/slurm_train.sbatch instead: JAX reads SLURM_* itself.)
#
# Before launching:
# - prepare the response store: `carryover prepare --config CONFIG` on one host, or as N independent
#   processes (one per host or per GPU, no coordinator) with `--shard I --num-shards N` each; every host
#   must then read the same, complete store (all N shards finished) — hosts shard records by position,
#   so they must agree on the record list;
# - put the store (data.store) and the run folder (out_dir) on storage every host sees at the same path:
#   checkpoints are written collectively by all processes into one directory;
# - the venv (CARRYOVER_VENV, default .venv in the repository) must exist on every host with a jax
#   build for its accelerator (launch/setup.sh installs the CPU one; CPU hosts talk over gloo).
set -euo pipefail

# Config names and relative paths in configs/*.py resolve from the repository root.
cd "$(dirname "$0")/.."

: "${COORDINATOR:?set COORDINATOR=host:port (process 0's address, same on every host)}"
: "${NUM_PROCESSES:?set NUM_PROCESSES (total processes in the job)}"
: "${PROCESS_ID:?set PROCESS_ID (this host's rank, 0..NUM_PROCESSES-1)}"
if ! [[ "$NUM_PROCESSES" =~ ^[0-9]+$ && "$PROCESS_ID" =~ ^[0-9]+$ ]] || (( PROCESS_ID >= NUM_PROCESSES )); then
  echo "train_multihost: need 0 <= PROCESS_ID < NUM_PROCESSES, got PROCESS_ID=$PROCESS_ID NUM_PROCESSES=$NUM_PROCESSES" >&2
  exit 2
fi

CONFIG="${1:?usage: train_multihost.sh CONFIG [OPTIONS...]}"
shift

export CARRYOVER_COORDINATOR="$COORDINATOR"
export CARRYOVER_NUM_PROCESSES="$NUM_PROCESSES"
export CARRYOVER_PROCESS_ID="$PROCESS_ID"

VENV="${CARRYOVER_VENV:-.venv}"
# exec: the training process gets this shell's pid, so the host's job runner signals it directly.
exec "$VENV/bin/carryover" train --config "$CONFIG" "$@"
