"""The embedded default, sized for the 2-core CPU: SmolLM2-135M-Instruct regenerates ShareGPT replies
(greedy), the target features of those replies are stored once at prepare time (training then runs
~2.7x faster than with online features, `carryover bench train`), and a 2-layer DFlash drafter with
Carryover proposing 7 tokens per round learns from them.

Feature layers follow the z-lab spacing for 30 layers: (1, 8, 14, 20, 27).
"""

from carryover_jax.configs import continuation_stages
from carryover_jax.config import DataConfig, DrafterSpec, TrainConfig, zlab_layer_ids

LAYERS = zlab_layer_ids(30)

CONFIG = TrainConfig(
    name="smollm2",
    target="smollm2",
    drafter=DrafterSpec(kind="dflash", layout="zlab", num_proposals=7, num_layers=2, target_layer_ids=LAYERS),
    data=DataConfig(store="runs/smollm2/data", max_prompts=256, max_new_tokens=128, max_prompt_tokens=256,
                    gen_batch_size=8, max_len=384, min_loss_tokens=14, store_features=True,
                    feature_layer_ids=LAYERS),
    features="store",
    out_dir="runs/smollm2/train",
    batch_size=4,
    num_anchors=32,
    steps=400,
    lr=6e-4,
    log_every=10,
    save_every=100,
)

# The continuation stage: from the finished baseline drafter, DVD training (Carryover) and the equal-compute
# control, each for 30% of the baseline's steps (the paper: 10 epochs, then +3), same seed so both see the
# same batches and anchors. `carryover train --config smollm2:dvd` / `--config smollm2:control`.
STAGES = continuation_stages(CONFIG, steps=120, lr=3e-4, warmup_ratio=0.05, save_every=60)
