"""A seconds-long smoke run of prepare + train on the embedded target (tests override target/store)."""

from carryover_jax.configs import continuation_stages
from carryover_jax.config import DataConfig, DrafterSpec, TrainConfig

CONFIG = TrainConfig(
    name="tiny",
    target="smollm2",
    drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=4, num_layers=1),
    data=DataConfig(store="runs/tiny/data", max_prompts=8, max_new_tokens=16, max_prompt_tokens=128, gen_batch_size=4,
                    max_len=96, min_loss_tokens=4),
    out_dir="runs/tiny/train",
    batch_size=2,
    num_anchors=4,
    steps=6,
    log_every=2,
    save_every=3,
    async_checkpointing=False,
)

STAGES = continuation_stages(CONFIG, steps=4, save_every=2)
