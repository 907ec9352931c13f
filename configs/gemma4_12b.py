"""The paper's Gemma 4 12B setting (DeepSpec's Gemma 4 DSpark configs): 5 draft layers, 15 proposals,
feature layers [5, 17, 29, 41, 46], Markov rank 256, MASK id 4, 512 anchors per response, max length
4096, global batch 512, lr 6e-4 with 4% warmup and cosine decay, 10 baseline epochs, bf16 compute.

`target` must point at a local HF folder of the Gemma 4 12B checkpoint (`Gemma4ForConditionalGeneration`
or `Gemma4ForCausalLM`; the text model is loaded, nothing is downloaded). Prompts go through the
checkpoint's own chat template with no system prompt.
"""

from carryover_jax.config import DataConfig, DrafterSpec, MeshConfig, TrainConfig

CONFIG = TrainConfig(
    name="gemma4_12b",
    target="/models/gemma-4-12b",
    drafter=DrafterSpec(kind="markov", layout="deepspec", num_proposals=15, num_layers=5,
                        target_layer_ids=(5, 17, 29, 41, 46), mask_token_id=4, markov_rank=256),
    data=DataConfig(store="/data/carryover/gemma4_12b/responses", max_new_tokens=4096, max_prompt_tokens=2048,
                    temperature=1.0, top_p=0.95, top_k=64, gen_batch_size=32, max_len=4096, min_loss_tokens=14,
                    max_turns=8),
    out_dir="/data/carryover/gemma4_12b/train",
    batch_size=512,
    num_anchors=512,
    steps=0,
    epochs=10,
    lr=6e-4,
    warmup_ratio=0.04,
    compute_dtype="bfloat16",
    remat=True,
    loss_chunk_rows=1024,  # V = 262,144 (1.7x Qwen3's): half the rows per vocabulary chunk
    mesh=MeshConfig(data=-1, fsdp=1, tensor=1, shard_drafter=False),
    log_every=10,
    save_every=3000,
)

# +3 epochs of DVD from the converged baseline, and the equal-compute control (same epochs, no carried rows).
_CONTINUE = dict(init_from="/data/carryover/gemma4_12b/train/drafter", epochs=3)
STAGES = {
    "dvd": CONFIG.replace(name="gemma4_12b-dvd", mode="dvd", out_dir="/data/carryover/gemma4_12b/dvd", **_CONTINUE),
    "control": CONFIG.replace(name="gemma4_12b-control", mode="control", out_dir="/data/carryover/gemma4_12b/control",
                              **_CONTINUE),
}
