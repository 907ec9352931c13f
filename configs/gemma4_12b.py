"""The paper's Gemma 4 12B setting (DeepSpec's Gemma 4 DSpark configs): 5 draft layers, 15 proposals,
feature layers [5, 17, 29, 41, 46], Markov rank 256, MASK id 4, 512 anchors per response, max length
4096, global batch 512, lr 6e-4 with 4% warmup and cosine decay, 10 baseline epochs, bf16 compute. Sized for
one 8-GPU node, H200 or H100-80GB: tensor parallel over 4 GPUs, the global batch accumulated over micro-steps.

`target` must point at a local HF folder of the Gemma 4 12B checkpoint (`Gemma4ForConditionalGeneration`
or `Gemma4ForCausalLM`; the text model is loaded, nothing is downloaded). Prompts go through the
checkpoint's own chat template with no system prompt.
"""

import dataclasses

from carryover_jax.config import DrafterSpec, MeshConfig
from carryover_jax.configs import continuation_stages, load_config

_QWEN = load_config("qwen3_4b")  # the same paper recipe (Table 4); what differs for Gemma 4 12B is below
CONFIG = _QWEN.replace(
    name="gemma4_12b",
    target="/models/gemma-4-12b",
    drafter=DrafterSpec(kind="markov", layout="deepspec", num_proposals=15, num_layers=5,
                        target_layer_ids=(5, 17, 29, 41, 46), mask_token_id=4, markov_rank=256),
    data=dataclasses.replace(_QWEN.data, store="/data/carryover/gemma4_12b/responses", temperature=1.0, top_p=0.95,
                             top_k=64, gen_batch_size=32),
    out_dir="/data/carryover/gemma4_12b/train",
    loss=_QWEN.loss.replace(chunk_rows=1024),  # V = 262,144 (1.7x Qwen3's): half the rows per vocabulary chunk
    # one 8-GPU node (H200 or H100-80GB): tensor parallel over 4 GPUs, the drafter and its Adam state sharded
    # too (a replicated bf16 target and float32 drafter state were 48 GB of a data-parallel device; under
    # fsdp the temporaries grew by more than the arguments shrank), 2 data shards of 4 sequences per
    # micro-step, 64 micro-steps. On N nodes (data = 2N) divide grad_accum_steps by N
    mesh=MeshConfig(data=-1, fsdp=1, tensor=4, shard_drafter=True),
    grad_accum_steps=64,
)

# +3 epochs of DVD from the converged baseline, and the equal-compute control (same epochs, no carried rows).
# DVD's verify pass and draft 1 take memory: 2 sequences per data shard per micro-step, the controls the same.
STAGES = continuation_stages(CONFIG, epochs=3, grad_accum_steps=128)
