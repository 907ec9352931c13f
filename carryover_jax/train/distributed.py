"""Multi-host start-up: `jax.distributed.initialize` from the environment.

Explicit variables win: CARRYOVER_COORDINATOR (host:port), CARRYOVER_NUM_PROCESSES, CARRYOVER_PROCESS_ID
(the generic launcher sets them). Under SLURM (SLURM_JOB_ID with more than one task) JAX's own cluster
detection reads SLURM_* itself; on a multi-host TPU VM slice (CARRYOVER_TPU_SLICE=1, set by
launch/train_tpu_slice.sh) it reads the TPU VM's metadata. A single process needs nothing. Each host then reads its own slice of
the data (`jax.process_index()` of `jax.process_count()`).
"""

from __future__ import annotations

import os

import jax

_initialized = False


def maybe_initialize() -> bool:
    """Initialise the JAX distributed runtime when the environment describes a multi-process job."""
    global _initialized
    if _initialized:
        return True
    env = os.environ
    if "CARRYOVER_COORDINATOR" in env:
        jax.distributed.initialize(
            coordinator_address=env["CARRYOVER_COORDINATOR"],
            num_processes=int(env["CARRYOVER_NUM_PROCESSES"]),
            process_id=int(env["CARRYOVER_PROCESS_ID"]),
        )
    elif int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in env:
        kw = {}
        # JAX's SLURM detection gives each process only the GPU numbered SLURM_LOCALID; with one task
        # per node (our sbatch script) the process must own all of the node's GPUs.
        gpus = (env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_GPUS_PER_NODE") or "").split(":")[-1]
        if env.get("SLURM_NTASKS_PER_NODE", "1") == "1" and gpus.isdigit():
            kw["local_device_ids"] = list(range(int(gpus)))
        jax.distributed.initialize(**kw)
    elif env.get("CARRYOVER_TPU_SLICE") == "1":  # every worker of the slice: coordinator and ranks auto-detected
        jax.distributed.initialize()
    else:
        return False
    _initialized = True
    return True


def is_main() -> bool:
    return jax.process_index() == 0
