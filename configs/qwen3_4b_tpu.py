"""The paper's Qwen3-4B setting (configs/qwen3_4b.py) on Cloud TPU v5p: one v5p-8 host (4 chips of 95 GiB)
per fsdp group, data parallel across hosts of a slice (`launch/train_tpu_slice.sh`; data = hosts).

Sized by the TPU compiler on a CPU host, no TPU attached (`carryover bench train --memory --tpu-topology
v5p:2x2x1 --mesh fsdp=4 ...`, rows in docs/tpu/memory.jsonl): the baseline step at 4 sequences per chip
per micro-step takes 58.6 GB of a chip, the DVD step at 2 sequences 49.1 GB (2026-12-02). Attention on TPU: the Mosaic kernel for decoding,
einsum for training (models/layers.py). On N hosts divide grad_accum_steps by N. On v6e-8 hosts (8 chips
of 32 GiB): `--set mesh.fsdp=8 --set grad_accum_steps=64` (1 sequence per chip: baseline 17.1 GB, DVD 31.8 GB,
control 21.2 GB; 4 were over the HBM). On a v5e-16 slice (16 chips of 16 GiB): `--set mesh.fsdp=16 --set
grad_accum_steps=32` (the continuations too: `carryover pipeline ... --continue-set grad_accum_steps=32`)
runs the baseline and the controls (15.3 / 15.4 GB at 1 sequence per chip); DVD does not fit a v5e chip at
max_len 4096 (its temporaries alone are 17.8 GB, 2026-12-03).
"""

from carryover_jax.config import MeshConfig
from carryover_jax.configs import continuation_stages, load_config

CONFIG = load_config("qwen3_4b").replace(
    name="qwen3_4b_tpu",
    out_dir="/data/carryover/qwen3_4b_tpu/train",
    mesh=MeshConfig(data=-1, fsdp=4, tensor=1, shard_drafter=True),
    grad_accum_steps=32,  # 512 sequences = 32 micro-steps x 4 chips x 4 sequences
)

# DVD and its controls at 2 sequences per chip per micro-step (as on the GPU node; DVD's 49.1 GB measured)
STAGES = continuation_stages(CONFIG, epochs=3, grad_accum_steps=64)
