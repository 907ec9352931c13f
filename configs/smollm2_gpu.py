"""The main job on one GPU (`carryover pipeline --config smollm2_gpu --preset gpu`): SmolLM2-135M-Instruct as on
the CPU, with the data and drafter the CPU cannot afford.

- Data: ~30x the CPU default. The GPU regenerates at thousands of tokens per second, so the preset asks for
  every ShareGPT training conversation it can regenerate in its share of the wall budget (`carryover_jax/
  budget.py` sizes `data.max_prompts` from the generation rate it measures first), two user turns each
  (greedy: the recorded replies are the target's own greedy chain, what decoding verifies).
- Drafter: the paper's 15 proposals over the full 49,152-token vocabulary (on the CPU a 15-row head was
  most of a draft step; on a GPU it is one small matmul), 3 draft layers, Carryover on.
- Features online: the frozen 135M target's forward inside each step costs little next to the
  drafter's on a GPU, and it saves the feature store's disk and prepare time.
- Numerics: the platform's defaults (`carryover_jax/numerics.py`: bf16 params, activations and caches,
  fused attention kernels, float32 logits) — nothing here is GPU-specific, so the dry run on the CPU runs
  this very config at toy scale.

Steps and conversations below are placeholders the preset replaces with the plan's sizes.
"""

from carryover_jax.configs import continuation_stages
from carryover_jax.config import DataConfig, DrafterSpec, LossConfig, TrainConfig, zlab_layer_ids

LAYERS = zlab_layer_ids(30)

CONFIG = TrainConfig(
    name="smollm2-gpu",
    target="smollm2",
    drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=15, num_layers=3, target_layer_ids=LAYERS),
    data=DataConfig(store="runs/smollm2-gpu/data", max_prompts=12000, max_turns=2, max_new_tokens=192,
                    max_prompt_tokens=256, gen_batch_size=256, max_len=1024, min_loss_tokens=16),
    features="online",
    out_dir="runs/smollm2-gpu/train",
    batch_size=32,
    num_anchors=128,
    steps=1000,
    lr=1e-3,
    warmup_ratio=0.03,
    loss=LossConfig(kl_weight=1.0),
    log_every=25,
    save_every=500,
)

STAGES = continuation_stages(CONFIG, steps=200, lr=3e-4, warmup_ratio=0.05, save_every=100)
