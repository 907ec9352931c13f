"""One process of the multi-host test (tests/test_multihost.py): `python tests/multihost_worker.py spec.json`.

The parent sets the environment before this starts — JAX_PLATFORMS=cpu, XLA_FLAGS with this process's
CPU device count and, for the multi-process runs, CARRYOVER_COORDINATOR / CARRYOVER_NUM_PROCESSES /
CARRYOVER_PROCESS_ID — because JAX reads them when its backend first starts. Nothing here touches a JAX
device before `train()`, whose first act is `jax.distributed.initialize` (it must precede any backend use).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import jax

    # Cross-process collectives on CPU: gloo over TCP, bootstrapped through the coordinator's key-value
    # store. It is jax 0.10's default; set explicitly so a changed default cannot silently drop the
    # collectives (a CPU client without them fails the first cross-process all-reduce).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")

    from carryover_jax.config import DataConfig, DrafterSpec, TrainConfig
    from carryover_jax.train.loop import train

    cfg = TrainConfig(
        target=spec["target"],
        drafter=DrafterSpec(kind="markov", layout="deepspec", num_proposals=3, num_layers=1,
                            target_layer_ids=(0, 1), mask_token_id=4, markov_rank=4),
        data=DataConfig(store=spec["store"], max_len=spec["max_len"], min_loss_tokens=2),
        out_dir=spec["out_dir"], batch_size=spec["batch_size"], num_anchors=spec["num_anchors"],
        steps=spec["steps"], log_every=1, save_every=100, keep_checkpoints=2, async_checkpointing=False,
        lr=3e-3, eps=spec.get("eps", 1e-8),
    )
    summary = train(cfg, progress=False)
    summary.update(process_index=jax.process_index(), process_count=jax.process_count(),
                   global_devices=jax.device_count(), local_devices=jax.local_device_count())
    rank = os.environ.get("CARRYOVER_PROCESS_ID", "0")
    (Path(spec["out_dir"]) / f"summary-{rank}.json").write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
