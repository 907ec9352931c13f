"""The paper's Qwen3-4B setting (paper Table 4, DeepSpec configs): 5 draft layers, 15 proposals,
feature layers [1, 9, 17, 25, 33], Markov rank 256, 512 anchors per response, max length 4096,
global batch 512, lr 6e-4 with 4% warmup and cosine decay, 10 baseline epochs, bf16 compute. Sized for one
8-GPU node, H200 or H100-80GB: fsdp over the 8 GPUs, the global batch accumulated over micro-steps.

`target` must point at a local HF folder of Qwen/Qwen3-4B (nothing is downloaded). For the DFlash
baseline use `--set drafter.kind=dflash` (CE only); for the z-lab layout `--set drafter.layout=zlab`.
"""

from carryover_jax.config import DataConfig, DrafterSpec, LossConfig, MeshConfig, TrainConfig
from carryover_jax.configs import continuation_stages

CONFIG = TrainConfig(
    name="qwen3_4b",
    target="/models/Qwen3-4B",
    drafter=DrafterSpec(kind="markov", layout="deepspec", num_proposals=15, num_layers=5,
                        target_layer_ids=(1, 9, 17, 25, 33), mask_token_id=151669, markov_rank=256),
    data=DataConfig(store="/data/carryover/qwen3_4b/responses", max_new_tokens=4096, max_prompt_tokens=2048,
                    temperature=0.7, top_p=0.8, gen_batch_size=64, max_len=4096, min_loss_tokens=14,
                    max_turns=8),
    out_dir="/data/carryover/qwen3_4b/train",
    batch_size=512,  # sequences per optimizer step, in grad_accum_steps micro-steps
    # one 8-GPU node (H200 or H100-80GB): 4 sequences per GPU per micro-step, 16 micro-steps. On N nodes
    # (data = N) divide grad_accum_steps by N (sizes: README, Scale-out)
    grad_accum_steps=16,
    num_anchors=512,
    steps=0,
    epochs=10,
    lr=6e-4,
    warmup_ratio=0.04,
    compute_dtype="bfloat16",
    remat=True,
    loss=LossConfig(chunk_rows=2048),  # 4 x 512 x 15 supervised rows per device: vocabulary logits 2048 rows at a time
    # fsdp over a node's 8 GPUs, the drafter and its Adam state sharded too: the replicated bf16 target (8 GB)
    # and float32 drafter state (10 GB) were a third of a data-parallel device's memory; data across nodes
    mesh=MeshConfig(data=-1, fsdp=8, tensor=1, shard_drafter=True),
    log_every=10,
    save_every=3000,
)

# The paper's Carryover stage: +3 epochs of DVD from the converged baseline, and the equal-compute control
# (the same 3 epochs without carried rows), which the paper did not run. DVD's verify pass and draft 1 take
# memory: 2 sequences per GPU per micro-step (the controls the same, so the runs differ only by carried rows).
STAGES = continuation_stages(CONFIG, epochs=3, grad_accum_steps=32)
