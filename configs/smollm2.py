"""The embedded default, sized for the 2-core CPU: SmolLM2-135M-Instruct regenerates ShareGPT replies
(greedy), and a 2-layer DFlash drafter with Carryover learns from online target features.

Costs measured on the CPU are in README.md. Feature layers follow the z-lab spacing for 30 layers.
"""

from carryover_jax.config import DataConfig, DrafterSpec, TrainConfig

CONFIG = TrainConfig(
    name="smollm2",
    target="smollm2",
    drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=7, num_layers=2),
    data=DataConfig(store="runs/smollm2/data", max_prompts=512, max_new_tokens=128, max_prompt_tokens=256,
                    gen_batch_size=8, max_len=384, min_loss_tokens=14),
    out_dir="runs/smollm2/train",
    batch_size=4,
    num_anchors=32,
    steps=400,
    lr=6e-4,
    log_every=10,
    save_every=100,
)
